/* What the LoRA engine tests share (test_lora_quant, tests/gpu/test_cuda_lora): a few LoRA steps
 * through the engine, and the quantized base's reference (its round trip in a plain arena). */
#ifndef MT_TEST_LORA_RUN_H
#define MT_TEST_LORA_RUN_H

#include "backend/backend.h"
#include "engine/engine.h"
#include "engine/quant_base.h"
#include "model/lora.h"

#define MT_TEST_LORA_B 2
#define MT_TEST_LORA_T 12
#define MT_TEST_LORA_STEPS 3

typedef struct {
    double loss[MT_TEST_LORA_STEPS], norm[MT_TEST_LORA_STEPS];
    float *adapters; /* lt->total, after the steps (free) */
} mt_test_lora_result;

/* x (n, a multiple of 128) -> its round trip through format f (fp8 or nf4). */
void mt_test_quant_round_trip(mt_base_format f, float *x, int64_t n);

/* The engine's checkpoint_every for the runs below (0: every layer's input kept; 2: sparse). */
extern int mt_test_lora_checkpoint_every;

/* MT_TEST_LORA_STEPS AdamW steps of lt's adapters (lora_B set non-zero, deterministic) on the base
 * `weights` (fp32 arena) in format f with gpu_layers tier layers, on backend be, the rows ids/tg
 * (MT_TEST_LORA_B x MT_TEST_LORA_T); readback (t->total, or NULL): the weights the engine holds. */
mt_test_lora_result mt_test_lora_run(mt_backend *be, const mt_param_table *t, const mt_lora_table *lt,
                                     const float *weights, mt_base_format f, int gpu_layers,
                                     const int32_t *ids, const int32_t *tg, float *readback);

/* The same, the engine created without weights and then given them by load(e, load_ctx) (through
 * its state io and quantized base), which must return MT_OK. */
typedef int (*mt_test_lora_load)(mt_engine *e, void *load_ctx);
mt_test_lora_result mt_test_lora_run_loaded(mt_backend *be, const mt_param_table *t, const mt_lora_table *lt,
                                            mt_test_lora_load load, void *load_ctx, mt_base_format f,
                                            int gpu_layers, const int32_t *ids, const int32_t *tg,
                                            float *readback);

/* A copy of w whose tensors a quantized base of format f from layer `first` quantizes hold their
 * round trip (fp8, nf4: each over its numel rounded up to 128; mxfp4: quant/mxfp4.h's quantizer,
 * blocks of 32 inputs of gpt-oss's [E, in, out] experts); *quantized, *kept count the tensors. */
float *mt_test_quant_reference(const mt_param_table *t, const float *w, mt_base_format f, int first,
                               int *quantized, int *kept);

#endif
