/* LoRA on the CUDA backend (bf16 compute), against the CPU and against itself:
 *  - the CUDA run of MT_TEST_LORA_STEPS AdamW steps of rank-4 adapters on a frozen bf16 base (the
 *    lora_llama base's shape and qwen3_5_moe's: attention, Gated DeltaNet, experts + shared expert)
 *    follows the CPU's fp32 run: loss within 2e-2 and gradient norm within 5e-2 relative each step,
 *    the adapters after the steps within 5e-2 relative L2 (bf16 rounding of activations and
 *    weights; the bounds of test_cuda_model's whole-model checks) — or, where it is larger, twice
 *    what NUDGES CPU runs on the base nudged by 4 bf16 steps move from the CPU run (the envelope,
 *    measured first). The adapters after 3 AdamW steps move that much on rounding alone (Adam's
 *    first steps move each element by about lr whatever its gradient's size: an element near 0
 *    flips; on the H100, session 14: lora_llama 5.2e-2, qwen3_5_moe 3.1e-2). The loss and norm
 *    envelopes must stay under their fixed bounds, else the case is too chaotic to test: qwen3_5_moe
 *    is drawn at scale 0.05 because at the 0.3 the llama case uses, the nudged CPU runs' step-1
 *    norm spans 8.6..20.1 against 29.7 unnudged (routing flips), which is where session 13's "7.58
 *    against 29.65" came from; at 0.05 the loss moves 4e-4 and the norm 5.6e-3;
 *  - a quantized base (nf4, fp8, and mxfp4 on gpt-oss) on CUDA equals, bit for bit, the CUDA run
 *    on a bf16 base holding the quantization's round trip: the dequantization kernel writes
 *    round-to-nearest bf16 of the fp32 product (mxfp4: the exact value, transposed into [E, in,
 *    out]), which is what setting the round trip's fp32 values into a bf16 base stores; streamed
 *    from pinned host memory, and with a GPU tier.
 * Exits 77 (skipped) without a usable CUDA device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "util/lora_run.h"
#include "util/nudge.h"
#include "util/testutil.h"

static mt_backend *gpu;

typedef struct {
    mt_param_table t;
    mt_lora_table lt;
    float *w;
    int32_t ids[MT_TEST_LORA_B * MT_TEST_LORA_T], tg[MT_TEST_LORA_B * MT_TEST_LORA_T];
} lora_model;

#define NUDGES 3

static void model_init(lora_model *m, const char *config, float init_scale, const char *targets) {
    char *path = mt_fixture_path(config);
    mt_config cfg;
    if (mt_config_load(&cfg, path) != MT_OK) fail_msg("%s: %s", path, mt_error_message());
    free(path);
    mt_param_table_init(&m->t, &cfg);
    mt_lora_opts lo = {.rank = 4, .targets = targets};
    assert_int_equal(mt_lora_table_init(&m->lt, &m->t, &lo), MT_OK);
    m->t.cfg.lora_rank = m->lt.rank;
    m->t.cfg.lora_experts = m->lt.parameters[0] != '\0'; /* as train sets it */
    m->w = mt_aligned_alloc((size_t)m->t.total * sizeof(float));
    mt_param_init(&m->t, m->w, init_scale, 3);
    for (int i = 0; i < MT_TEST_LORA_B * MT_TEST_LORA_T; i++)
        m->ids[i] = (i * 31 + 7) % m->t.cfg.V, m->tg[i] = (i * 17 + 3) % m->t.cfg.V;
}

static void model_free(lora_model *m) {
    free(m->w);
    mt_lora_table_free(&m->lt);
    mt_param_table_free(&m->t);
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return sqrt(num / (den > 0 ? den : 1));
}

static double rel(double a, double b) { return fabs(a - b) / fabs(b); }

/* The largest relative move of the CPU run's per-step loss and norm, and of its adapters, over NUDGES
 * runs on the base nudged by 4 bf16 steps: how chaotic the case is, whatever the backend. */
static void nudged_envelope(lora_model *m, mt_backend *cpu, const mt_test_lora_result *c, double *loss_env,
                            double *norm_env, double *w_env) {
    *loss_env = *norm_env = *w_env = 0;
    for (int k = 0; k < NUDGES; k++) {
        float *p = mt_test_nudged(&m->t, m->w, 91 + (uint64_t)k, 4.0 / 512);
        mt_test_lora_result n = mt_test_lora_run(cpu, &m->t, &m->lt, p, MT_BASE_BF16, 0, m->ids, m->tg, NULL);
        for (int s = 0; s < MT_TEST_LORA_STEPS; s++) {
            *loss_env = fmax(*loss_env, rel(n.loss[s], c->loss[s]));
            *norm_env = fmax(*norm_env, rel(n.norm[s], c->norm[s]));
        }
        *w_env = fmax(*w_env, rel_l2(n.adapters, c->adapters, (size_t)m->lt.total));
        free(n.adapters), free(p);
    }
}

static void against_cpu(const char *config, const char *targets, float init_scale, double loss_tol,
                        double w_tol) {
    lora_model m;
    model_init(&m, config, init_scale, targets);
    mt_backend *cpu = mt_backend_cpu_create();
    mt_test_lora_result c = mt_test_lora_run(cpu, &m.t, &m.lt, m.w, MT_BASE_BF16, 0, m.ids, m.tg, NULL);
    double le, ne, we;
    nudged_envelope(&m, cpu, &c, &le, &ne, &we);
    printf("  %s (init %.2f): nudged CPU runs move loss %.2e, norm %.2e, adapters %.2e\n", config, init_scale, le,
           ne, we);
    if (!(le < loss_tol && ne < 2.5 * loss_tol))
        fail_msg("%s: the case is too chaotic to test (its nudged loss or norm envelope reaches a bound)", config);
    double loss_bound = fmax(loss_tol, 2 * le), norm_bound = fmax(2.5 * loss_tol, 2 * ne);
    w_tol = fmax(w_tol, 2 * we);
    mt_test_lora_result g = mt_test_lora_run(gpu, &m.t, &m.lt, m.w, MT_BASE_BF16, 0, m.ids, m.tg, NULL);
    for (int s = 0; s < MT_TEST_LORA_STEPS; s++) {
        double el = rel(g.loss[s], c.loss[s]), en = rel(g.norm[s], c.norm[s]);
        printf("  %s step %d: loss %.6f / cpu %.6f (%.2e, tol %.1e), norm %.6f / %.6f (%.2e, tol %.1e)\n", config,
               s + 1, g.loss[s], c.loss[s], el, loss_bound, g.norm[s], c.norm[s], en, norm_bound);
        assert_true(el <= loss_bound && en <= norm_bound);
    }
    double d = rel_l2(g.adapters, c.adapters, (size_t)m.lt.total);
    printf("  %s adapters after %d steps: rel L2 %.2e (tol %.2e)\n", config, MT_TEST_LORA_STEPS, d, w_tol);
    assert_true(d <= w_tol);
    free(c.adapters), free(g.adapters);
    cpu->destroy(cpu);
    model_free(&m);
}

static void quantized_bit_for_bit(const char *config, const char *targets, mt_base_format f, int tier) {
    lora_model m;
    model_init(&m, config, 0.3f, targets);
    int quantized, kept;
    float *ref = mt_test_quant_reference(&m.t, m.w, f, tier, &quantized, &kept);
    mt_test_lora_result q = mt_test_lora_run(gpu, &m.t, &m.lt, m.w, f, tier, m.ids, m.tg, NULL);
    mt_test_lora_result r = mt_test_lora_run(gpu, &m.t, &m.lt, ref, MT_BASE_BF16, tier, m.ids, m.tg, NULL);
    for (int s = 0; s < MT_TEST_LORA_STEPS; s++)
        if (q.loss[s] != r.loss[s] || q.norm[s] != r.norm[s])
            fail_msg("%s %s: step %d loss %.9g vs %.9g, norm %.9g vs %.9g", config, mt_base_format_name(f), s + 1,
                     q.loss[s], r.loss[s], q.norm[s], r.norm[s]);
    assert_memory_equal(q.adapters, r.adapters, (size_t)m.lt.total * sizeof(float));
    printf("  %s %s (tier %d): %d steps bit for bit with the round trip's bf16 base\n", config,
           mt_base_format_name(f), tier, MT_TEST_LORA_STEPS);
    free(q.adapters), free(r.adapters), free(ref);
    model_free(&m);
}

static void test_llama(void **state) { against_cpu("lora_llama/base/config.json", NULL, 0.3f, 2e-2, 5e-2); }
static void test_qwen3_5_moe(void **state) {
    against_cpu("qwen3_5_moe/config.json", NULL, 0.05f, 2e-2, 5e-2);
}
/* gpt-oss with adapters on the attention and on the experts' fused gate_up and down (PEFT's
 * target_parameters), at the MoE case's scale */
#define GPT_OSS_EXPERTS "q_proj,k_proj,v_proj,o_proj,gate_up_proj,down_proj"
static void test_gpt_oss_experts(void **state) {
    against_cpu("gpt_oss_tiny/config.json", GPT_OSS_EXPERTS, 0.05f, 2e-2, 5e-2);
}

static void test_quantized(void **state) {
    quantized_bit_for_bit("lora_llama/base/config.json", NULL, MT_BASE_NF4, 0);
    quantized_bit_for_bit("lora_llama/base/config.json", NULL, MT_BASE_FP8, 0);
    quantized_bit_for_bit("lora_llama/base/config.json", NULL, MT_BASE_NF4, 1);
    quantized_bit_for_bit("qwen3_5_moe/config.json", NULL, MT_BASE_NF4, 0);
    quantized_bit_for_bit("gpt_oss_mxfp4/config.json", NULL, MT_BASE_MXFP4, 0); /* the experts in MXFP4 */
    quantized_bit_for_bit("gpt_oss_mxfp4/config.json", NULL, MT_BASE_MXFP4, 1);
    quantized_bit_for_bit("gpt_oss_mxfp4/config.json", GPT_OSS_EXPERTS, MT_BASE_MXFP4, 0);
}

int main(void) {
    if (!mt_backend_cuda_available()) {
        fprintf(stderr, "test_cuda_lora: no usable CUDA device, skipped\n");
        return 77;
    }
    gpu = mt_backend_cuda_create(0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_qwen3_5_moe),
        cmocka_unit_test(test_gpt_oss_experts),
        cmocka_unit_test(test_quantized),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    gpu->destroy(gpu);
    return failed ? 1 : 0;
}
