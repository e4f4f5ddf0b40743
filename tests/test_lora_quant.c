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
#include "util/lora_run.h"
#include "util/testutil.h"

#define B_ROWS MT_TEST_LORA_B
#define T_LEN MT_TEST_LORA_T
#define STEPS MT_TEST_LORA_STEPS

static mt_config fixture_config(const char *rel) {
    char *path = mt_fixture_path(rel);
    mt_config cfg;
    if (mt_config_load(&cfg, path) != MT_OK) fail_msg("%s: %s", path, mt_error_message());
    free(path);
    return cfg;
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
    int quantized, kept;
    float *ref = mt_test_quant_reference(&t, w, f, gpu_layers, &quantized, &kept);
    assert_true(quantized > 0 && kept > 0);
    int N = B_ROWS * T_LEN;
    int32_t *ids = malloc((size_t)N * sizeof(int32_t)), *tg = malloc((size_t)N * sizeof(int32_t));
    for (int i = 0; i < N; i++) ids[i] = (i * 31 + 7) % t.cfg.V, tg[i] = (i * 17 + 3) % t.cfg.V;
    float *back = mt_aligned_alloc((size_t)t.total * sizeof(float));
    mt_backend *be = mt_backend_cpu_create();
    mt_test_lora_result q = mt_test_lora_run(be, &t, &lt, w, f, gpu_layers, ids, tg, back);
    mt_test_lora_result r = mt_test_lora_run(be, &t, &lt, ref, MT_BASE_BF16, gpu_layers, ids, tg, NULL);
    for (int s = 0; s < STEPS; s++) {
        if (q.loss[s] != r.loss[s] || q.norm[s] != r.norm[s])
            fail_msg("%s %s step %d: loss %.9g vs %.9g, norm %.9g vs %.9g", config, mt_base_format_name(f),
                     s + 1, q.loss[s], r.loss[s], q.norm[s], r.norm[s]);
    }
    assert_memory_equal(q.adapters, r.adapters, (size_t)lt.total * sizeof(float));
    /* the quantization moved the loss, or the test would prove nothing */
    mt_test_lora_result plain = mt_test_lora_run(be, &t, &lt, w, MT_BASE_BF16, gpu_layers, ids, tg, NULL);
    be->destroy(be);
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
