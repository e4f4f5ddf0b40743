/* LoRA on a quantized frozen base (engine/quant_base.h, --base-dtype fp8|nf4) is LoRA on the base
 * whose quantized tensors hold their quantization's round trip: on the CPU backend (fp32) the
 * engine dequantizes each layer into its slot before its GEMMs, so the two runs compute with the
 * same floats and must agree bit for bit: every step's loss and gradient norm, and the adapters
 * after the steps. The round trip is made here with quant/nf4.h and quant/fp8.h over each tensor's
 * numel rounded up to 128 (zeros past it), as quant_base.h says. Also: the state io gives the
 * dequantized values back; the GPU tier's layers (bf16, in the training state) and the embed and
 * head groups are not quantized; the engine's host state holds only the embed and head groups;
 * what the plan counts for the blobs is mt_quant_base_bytes. Models: the lora_llama base (dense,
 * GQA) and qwen3_5_moe (Gated DeltaNet and gated attention, experts and a shared expert:
 * the experts quantized, the router and the shared expert's gate kept). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/quant_base.h"
#include "model/lora.h"
#include "quant/fp8.h"
#include "quant/nf4.h"
#include "util/testutil.h"

#define B_ROWS 2
#define T_LEN 12
#define STEPS 3

static mt_config fixture_config(const char *rel) {
    char *path = mt_fixture_path(rel);
    mt_config cfg;
    if (mt_config_load(&cfg, path) != MT_OK) fail_msg("%s: %s", path, mt_error_message());
    free(path);
    return cfg;
}

/* x (n, a multiple of 128) -> its round trip through format f. */
static void round_trip(mt_base_format f, float *x, int64_t n) {
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

typedef struct {
    double loss[STEPS], norm[STEPS];
    float *adapters;
} run_result;

static run_result run(const mt_param_table *t, const mt_lora_table *lt, const float *weights,
                      mt_base_format f, int gpu_layers, const int32_t *ids, const int32_t *tg,
                      float *readback) {
    mt_backend *be = mt_backend_cpu_create();
    mt_engine_opts o = {.batch = B_ROWS, .micro_batch = 1, .T = T_LEN, .n_slots = 2, .opt_threads = 1,
                        .lora = lt, .base_format = f, .gpu_layers = gpu_layers, .seed = 9};
    mt_engine *e = mt_engine_create(t, be, &o, weights);
    mt_adamw_hparams hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    run_result r;
    /* B non-zero: the first step's lora_A gradient too */
    float *init = malloc((size_t)lt->total * sizeof(float));
    mt_lora_init(lt, init, 9);
    for (int i = 0; i < lt->n_params; i++)
        if (lt->params[i].is_b)
            for (int64_t j = 0; j < lt->params[i].numel; j++)
                init[lt->params[i].offset + j] = 0.01f * (float)((j * 7 + i) % 13 - 6);
    mt_lora_state_set(mt_engine_lora(e), init, NULL, NULL);
    free(init);
    for (int s = 0; s < STEPS; s++) {
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
        double want = (double)(t->embed_size + t->head_size) * sizeof(float);
        assert_true(fabs(mt_engine_host_state_bytes(e) - want) < 1);
    }
    mt_engine_destroy(e);
    be->destroy(be);
    return r;
}

static void check_model(const char *config, mt_base_format f, int gpu_layers) {
    mt_config cfg = fixture_config(config);
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    mt_lora_table lt;
    mt_lora_opts lo = {.rank = 4};
    assert_int_equal(mt_lora_table_init(&lt, &t, &lo), MT_OK);
    t.cfg.lora_rank = lt.rank;
    float *w = mt_aligned_alloc((size_t)t.total * sizeof(float));
    mt_param_init(&t, w, 0.3f, 3);
    /* the reference base: each quantized tensor of a streamed layer replaced by its round trip */
    float *ref = mt_aligned_alloc((size_t)t.total * sizeof(float));
    memcpy(ref, w, (size_t)t.total * sizeof(float));
    int quantized = 0, kept = 0;
    for (int i = 0; i < t.n_params; i++) {
        const mt_param *p = &t.params[i];
        if (p->layer < gpu_layers || p->layer >= t.cfg.L) continue;
        if (!mt_quant_base_quantizes(p)) {
            kept++;
            continue;
        }
        int64_t n = (p->numel + 127) / 128 * 128;
        float *x = calloc((size_t)n, sizeof(float));
        memcpy(x, w + p->offset, (size_t)p->numel * sizeof(float));
        round_trip(f, x, n);
        memcpy(ref + p->offset, x, (size_t)p->numel * sizeof(float));
        free(x);
        quantized++;
    }
    assert_true(quantized > 0 && kept > 0);
    int N = B_ROWS * T_LEN;
    int32_t *ids = malloc((size_t)N * sizeof(int32_t)), *tg = malloc((size_t)N * sizeof(int32_t));
    for (int i = 0; i < N; i++) ids[i] = (i * 31 + 7) % t.cfg.V, tg[i] = (i * 17 + 3) % t.cfg.V;
    float *back = mt_aligned_alloc((size_t)t.total * sizeof(float));
    run_result q = run(&t, &lt, w, f, gpu_layers, ids, tg, back);
    run_result r = run(&t, &lt, ref, MT_BASE_BF16, gpu_layers, ids, tg, NULL);
    for (int s = 0; s < STEPS; s++) {
        if (q.loss[s] != r.loss[s] || q.norm[s] != r.norm[s])
            fail_msg("%s %s step %d: loss %.9g vs %.9g, norm %.9g vs %.9g", config, mt_base_format_name(f),
                     s + 1, q.loss[s], r.loss[s], q.norm[s], r.norm[s]);
    }
    assert_memory_equal(q.adapters, r.adapters, (size_t)lt.total * sizeof(float));
    /* the quantization moved the loss, or the test would prove nothing */
    run_result plain = run(&t, &lt, w, MT_BASE_BF16, gpu_layers, ids, tg, NULL);
    assert_true(plain.loss[0] != q.loss[0]);
    for (int i = 0; i < t.n_params; i++) /* io: the dequantized values, the rest as set */
        assert_memory_equal(back + t.params[i].offset, ref + t.params[i].offset,
                            (size_t)t.params[i].numel * sizeof(float));
    mt_engine_opts o = {.batch = B_ROWS, .micro_batch = 1, .T = T_LEN, .n_slots = 2, .lora = &lt,
                        .base_format = f, .gpu_layers = gpu_layers};
    mt_engine_plan plan;
    mt_engine_plan_of(&t, MT_F32, &o, &plan);
    assert_true(plan.base_quant == mt_quant_base_bytes(&t, f, gpu_layers, NULL) && plan.base_quant > 0);
    printf("  %s %s (tier %d): %d tensors quantized, %d kept; %d steps bit for bit; loss %.6f (bf16 "
           "base %.6f); blobs %.0f bytes\n", config, mt_base_format_name(f), gpu_layers, quantized, kept,
           STEPS, q.loss[0], plain.loss[0], plan.base_quant);
    free(q.adapters), free(r.adapters), free(plain.adapters);
    free(ids), free(tg), free(w), free(ref), free(back);
    mt_lora_table_free(&lt);
    mt_param_table_free(&t);
}

static void test_llama(void **state) {
    check_model("lora_llama/base/config.json", MT_BASE_NF4, 0);
    check_model("lora_llama/base/config.json", MT_BASE_FP8, 0);
    check_model("lora_llama/base/config.json", MT_BASE_NF4, 1); /* layer 0 in the GPU tier */
}

static void test_qwen3_5_moe(void **state) {
    check_model("qwen3_5_moe/config.json", MT_BASE_NF4, 0);
    check_model("qwen3_5_moe/config.json", MT_BASE_FP8, 0);
}

static void test_parse(void **state) {
    mt_base_format f;
    assert_int_equal(mt_base_format_parse("nf4", &f), MT_OK);
    assert_int_equal(f, MT_BASE_NF4);
    assert_int_equal(mt_base_format_parse("int4", &f), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "expected bf16, fp8 or nf4"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_qwen3_5_moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
