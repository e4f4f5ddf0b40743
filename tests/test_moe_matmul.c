/* The experts' GEMMs op (backend.h's moe_matmul_forward / moe_matmul_backward) on the CPU
 * backend: bit for bit the per-expert be->matmul_forward / matmul_backward loop moe.c ran before
 * the op existed (the same calls), and within fp32 rounding (1e-5 relative of max) of a naive
 * double-precision product; an expert without rows keeps its gradient untouched; the weight
 * stride is honoured (experts' weights spaced wider than M x K); dinp's accumulate flag adds; a
 * NULL dweight (frozen experts) leaves dinp bit for bit the full call's.
 * (tests/gpu/test_cuda_moe.c compares the CUDA backend's grouped mode with its loop.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/moe_gemm_choice.h"
#include "core/error.h"
#include "util/testutil.h"

enum { E = 5, K = 7, M = 6, PAD = 3, STRIDE = M * K + PAD };
/* rows per expert 3, 0, 5, 1, 4: expert 1 has none */
static const int32_t OFF[E + 1] = {0, 3, 3, 8, 9, 13};
#define R 13

static mt_backend *cpu;

static float *normal(mt_test_rng *r, size_t n) {
    float *x = malloc(n * sizeof(float));
    mt_test_fill_normal(r, x, n, 1.0f);
    return x;
}
static float *copy(const float *x, size_t n) {
    float *y = malloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static void test_forward(void **state) {
    mt_test_rng r;
    mt_test_rng_seed(&r, 11);
    float *inp = normal(&r, (size_t)R * K), *w = normal(&r, (size_t)E * STRIDE);
    float *out = normal(&r, (size_t)R * M), *loop = normal(&r, (size_t)R * M);
    cpu->moe_matmul_forward(cpu, out, inp, w, STRIDE, OFF, OFF, E, K, M);
    for (int e = 0; e < E; e++) /* moe.c's loop before the op */
        if (OFF[e + 1] > OFF[e])
            cpu->matmul_forward(cpu, loop + (size_t)OFF[e] * M, inp + (size_t)OFF[e] * K,
                                w + (size_t)e * STRIDE, NULL, OFF[e + 1] - OFF[e], K, M);
    assert_memory_equal(out, loop, (size_t)R * M * sizeof(float));
    float ref[R * M];
    for (int e = 0; e < E; e++)
        for (int i = OFF[e]; i < OFF[e + 1]; i++)
            for (int m = 0; m < M; m++) {
                double a = 0;
                for (int k = 0; k < K; k++)
                    a += (double)inp[i * K + k] * w[(size_t)e * STRIDE + m * K + k];
                ref[i * M + m] = (float)a;
            }
    assert_true(mt_check_rel("moe_matmul_forward vs naive", out, ref, (size_t)R * M, 1e-5));
    free(inp), free(w), free(out), free(loop);
}

static void check_backward(int accumulate) {
    mt_test_rng r;
    mt_test_rng_seed(&r, 23 + (uint64_t)accumulate);
    float *inp = normal(&r, (size_t)R * K), *w = normal(&r, (size_t)E * STRIDE);
    float *dout = normal(&r, (size_t)R * M);
    float *dinp0 = normal(&r, (size_t)R * K), *dw0 = normal(&r, (size_t)E * STRIDE);
    float *dinp = copy(dinp0, (size_t)R * K), *dw = copy(dw0, (size_t)E * STRIDE);
    float *ldinp = copy(dinp0, (size_t)R * K), *ldw = copy(dw0, (size_t)E * STRIDE);
    cpu->moe_matmul_backward(cpu, dinp, dw, dout, inp, w, STRIDE, OFF, OFF, E, K, M, accumulate);
    for (int e = 0; e < E; e++)
        if (OFF[e + 1] > OFF[e])
            cpu->matmul_backward(cpu, ldinp + (size_t)OFF[e] * K, ldw + (size_t)e * STRIDE, NULL,
                                 dout + (size_t)OFF[e] * M, inp + (size_t)OFF[e] * K,
                                 w + (size_t)e * STRIDE, OFF[e + 1] - OFF[e], K, M, accumulate);
    assert_memory_equal(dinp, ldinp, (size_t)R * K * sizeof(float));
    assert_memory_equal(dw, ldw, (size_t)E * STRIDE * sizeof(float));
    /* expert 1 (no rows) and the padding between experts: untouched */
    assert_memory_equal(dw + STRIDE, dw0 + STRIDE, STRIDE * sizeof(float));
    for (int e = 0; e < E; e++)
        assert_memory_equal(dw + (size_t)e * STRIDE + M * K, dw0 + (size_t)e * STRIDE + M * K,
                            PAD * sizeof(float));
    float rdinp[R * K], rdw[E * STRIDE];
    memcpy(rdw, dw0, sizeof rdw);
    for (int e = 0; e < E; e++) {
        const float *we = w + (size_t)e * STRIDE;
        for (int i = OFF[e]; i < OFF[e + 1]; i++)
            for (int k = 0; k < K; k++) {
                double a = accumulate ? dinp0[i * K + k] : 0;
                for (int m = 0; m < M; m++) a += (double)dout[i * M + m] * we[m * K + k];
                rdinp[i * K + k] = (float)a;
            }
        for (int m = 0; m < M; m++)
            for (int k = 0; k < K; k++) {
                double a = dw0[(size_t)e * STRIDE + m * K + k];
                for (int i = OFF[e]; i < OFF[e + 1]; i++)
                    a += (double)dout[i * M + m] * inp[i * K + k];
                rdw[(size_t)e * STRIDE + m * K + k] = (float)a;
            }
    }
    assert_true(mt_check_rel("moe_matmul_backward dinp vs naive", dinp, rdinp, (size_t)R * K,
                             1e-5));
    assert_true(mt_check_rel("moe_matmul_backward dweight vs naive", dw, rdw, (size_t)E * STRIDE,
                             1e-5));
    /* dinp or dweight alone (NULL skips it), as the bench and moe.c's callers may ask */
    float *dw_only = copy(dw0, (size_t)E * STRIDE), *dinp_only = copy(dinp0, (size_t)R * K);
    cpu->moe_matmul_backward(cpu, NULL, dw_only, dout, inp, w, STRIDE, OFF, OFF, E, K, M, 0);
    cpu->moe_matmul_backward(cpu, dinp_only, NULL, dout, inp, w, STRIDE, OFF, OFF, E, K, M,
                             accumulate);
    assert_memory_equal(dw_only, dw, (size_t)E * STRIDE * sizeof(float));
    assert_memory_equal(dinp_only, dinp, (size_t)R * K * sizeof(float));
    /* both NULL (frozen experts, no data gradient wanted): nothing is touched */
    cpu->moe_matmul_backward(cpu, NULL, NULL, dout, inp, w, STRIDE, OFF, OFF, E, K, M, accumulate);
    void *ps[] = {inp, w, dout, dinp0, dw0, dinp, dw, ldinp, ldw, dw_only, dinp_only};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) free(ps[i]);
}

static void test_backward(void **state) { check_backward(0); }
static void test_backward_accumulate(void **state) { check_backward(1); }

/* MT_MOE_GEMM's values and auto's rule (moe_gemm_choice.h): grouped below 512 rows an expert,
 * the loop from there; the named modes whatever the rows; a bad value refused. */
static void test_gemm_choice(void **state) {
    (void)state;
    mt_moe_gemm_mode m = MT_MOE_GEMM_LOOP;
    assert_int_equal(mt_moe_gemm_mode_parse(NULL, &m), 1), assert_int_equal(m, MT_MOE_GEMM_AUTO);
    m = MT_MOE_GEMM_LOOP;
    assert_int_equal(mt_moe_gemm_mode_parse("", &m), 1), assert_int_equal(m, MT_MOE_GEMM_AUTO);
    assert_int_equal(mt_moe_gemm_mode_parse("loop", &m), 1), assert_int_equal(m, MT_MOE_GEMM_LOOP);
    assert_int_equal(mt_moe_gemm_mode_parse("grouped", &m), 1);
    assert_int_equal(m, MT_MOE_GEMM_GROUPED);
    assert_int_equal(mt_moe_gemm_mode_parse("auto", &m), 1), assert_int_equal(m, MT_MOE_GEMM_AUTO);
    assert_int_equal(mt_moe_gemm_mode_parse("Grouped", &m), 0);
    assert_int_equal(m, MT_MOE_GEMM_AUTO); /* untouched */
    assert_string_equal(mt_moe_gemm_mode_name(MT_MOE_GEMM_GROUPED), "grouped");
    assert_int_equal(mt_moe_gemm_grouped_below(MT_MOE_GEMM_LOOP), 0);
    assert_int_equal(mt_moe_gemm_grouped_below(MT_MOE_GEMM_AUTO), 512);
    /* Qwen3-30B-A3B's layer (E 128, top-8): 4096 tokens = 256 rows an expert, 16384 = 1024 */
    assert_int_equal(mt_moe_gemm_use_grouped(MT_MOE_GEMM_AUTO, 4096 * 8, 128), 1);
    assert_int_equal(mt_moe_gemm_use_grouped(MT_MOE_GEMM_AUTO, 16384 * 8, 128), 0);
    assert_int_equal(mt_moe_gemm_use_grouped(MT_MOE_GEMM_AUTO, 512 * 128 - 1, 128), 1);
    assert_int_equal(mt_moe_gemm_use_grouped(MT_MOE_GEMM_AUTO, 512 * 128, 128), 0);
    assert_int_equal(mt_moe_gemm_use_grouped(MT_MOE_GEMM_AUTO, (int64_t)65536 * 8, 128), 0);
    assert_int_equal(mt_moe_gemm_use_grouped(MT_MOE_GEMM_LOOP, 1, 128), 0);
    assert_int_equal(mt_moe_gemm_use_grouped(MT_MOE_GEMM_GROUPED, (int64_t)1 << 30, 8), 1);
}

int main(void) {
    cpu = mt_backend_cpu_create();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward),
        cmocka_unit_test(test_backward),
        cmocka_unit_test(test_backward_accumulate),
        cmocka_unit_test(test_gemm_choice),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cpu->destroy(cpu);
    return rc;
}
