/* What the LoRA engine tests share (test_lora_quant, tests/gpu/test_cuda_lora). */
#include "util/lora_run.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "quant/fp8.h"
#include "quant/mxfp4.h"
#include "quant/nf4.h"
#include "util/cmocka_includes.h"

/* x (n, a multiple of 128) -> its round trip through format f. */
void mt_test_quant_round_trip(mt_base_format f, float *x, int64_t n) {
    uint8_t *codes = malloc((size_t)n);
    float *scales = malloc((size_t)(n / 64) * sizeof(float));
    if (f == MT_BASE_NF4) {
        mt_nf4_quantize(x, n, codes, scales);
        mt_nf4_dequantize(codes, scales, n, x);
    } else {
        mt_fp8_quantize(x, n, codes, scales);
        mt_fp8_dequantize(codes, scales, n, x);
    }
    free(codes);
    free(scales);
}

int mt_test_lora_checkpoint_every = 0;

static mt_test_lora_result run(mt_backend *be, const mt_param_table *t, const mt_lora_table *lt, const float *weights,
                               mt_test_lora_load load, void *load_ctx, mt_base_format f, int gpu_layers,
                               const int32_t *ids, const int32_t *tg, float *readback) {
    mt_engine_opts o = {.batch = MT_TEST_LORA_B, .micro_batch = 1, .T = MT_TEST_LORA_T, .n_slots = 2, .opt_threads = 1,
                        .lora = lt, .base_format = f, .gpu_layers = gpu_layers, .seed = 9,
                        .checkpoint_every = mt_test_lora_checkpoint_every};
    mt_engine *e = mt_engine_create(t, be, &o, weights);
    if (load && load(e, load_ctx) != MT_OK) fail_msg("loading the base: %s", mt_error_message());
    mt_adamw_hparams hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    mt_test_lora_result r;
    /* B non-zero: the first step's lora_A gradient too */
    float *init = malloc((size_t)lt->total * sizeof(float));
    mt_lora_init(lt, init, 9);
    for (int i = 0; i < lt->n_params; i++)
        if (lt->params[i].is_b)
            for (int64_t j = 0; j < lt->params[i].numel; j++)
                init[lt->params[i].offset + j] = 0.01f * (float)((j * 7 + i) % 13 - 6);
    mt_lora_state_set(mt_engine_lora(e), init, NULL, NULL);
    free(init);
    for (int s = 0; s < MT_TEST_LORA_STEPS; s++) {
        mt_step_result res;
        mt_engine_step(e, ids, tg, &hp, s + 1, 1.0, &res);
        assert_false(res.skipped);
        r.loss[s] = res.loss;
        r.norm[s] = res.grad_norm;
    }
    mt_engine_finish(e);
    r.adapters = malloc((size_t)lt->total * sizeof(float));
    mt_lora_state_get(mt_engine_lora(e), r.adapters, NULL, NULL);
    if (readback) mt_engine_get_weights(e, readback);
    if (f != MT_BASE_BF16) { /* the host state: the embed and head groups alone */
        double want = (double)(t->embed_size + t->head_size) * mt_dtype_size(be->dtype);
        assert_true(fabs(mt_engine_host_state_bytes(e) - want) < 1);
    }
    mt_engine_destroy(e);
    return r;
}

mt_test_lora_result mt_test_lora_run(mt_backend *be, const mt_param_table *t, const mt_lora_table *lt, const float *weights,
                                     mt_base_format f, int gpu_layers, const int32_t *ids, const int32_t *tg,
                                     float *readback) {
    return run(be, t, lt, weights, NULL, NULL, f, gpu_layers, ids, tg, readback);
}

mt_test_lora_result mt_test_lora_run_loaded(mt_backend *be, const mt_param_table *t, const mt_lora_table *lt,
                                            mt_test_lora_load load, void *load_ctx, mt_base_format f,
                                            int gpu_layers, const int32_t *ids, const int32_t *tg,
                                            float *readback) {
    return run(be, t, lt, NULL, load, load_ctx, f, gpu_layers, ids, tg, readback);
}


float *mt_test_quant_reference(const mt_param_table *t, const float *w, mt_base_format f, int first,
                               int *quantized, int *kept) {
    float *ref = mt_aligned_alloc((size_t)t->total * sizeof(float));
    memcpy(ref, w, (size_t)t->total * sizeof(float));
    *quantized = *kept = 0;
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        if (p->layer < first || p->layer >= t->cfg.L) continue;
        if (!mt_quant_base_quantizes(f, p)) {
            (*kept)++;
            continue;
        }
        if (f == MT_BASE_MXFP4) { /* [E, in, out], blocks of 32 inputs; no padding */
            int64_t E = p->shape[0], in = p->shape[1], out = p->shape[2];
            uint8_t *blocks = malloc(mt_mxfp4_bytes(E * out, in)), *scales = malloc(mt_mxfp4_scales(E * out, in));
            assert_int_equal(mt_mxfp4_quantize_transposed(w + p->offset, E, out, in, blocks, scales), MT_OK);
            assert_int_equal(mt_mxfp4_dequantize_transposed(blocks, scales, E, out, in, ref + p->offset), MT_OK);
            free(blocks), free(scales);
            (*quantized)++;
            continue;
        }
        int64_t n = (p->numel + 127) / 128 * 128;
        float *x = calloc((size_t)n, sizeof(float));
        memcpy(x, w + p->offset, (size_t)p->numel * sizeof(float));
        mt_test_quant_round_trip(f, x, n);
        memcpy(ref + p->offset, x, (size_t)p->numel * sizeof(float));
        free(x);
        (*quantized)++;
    }
    return ref;
}
