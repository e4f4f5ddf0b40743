/* The CUDA backend's Gated DeltaNet ops (bf16 storage) against the fp32 CPU reference backend, op
 * by op, forward and backward. Exits 77 (ctest: skipped) when no CUDA device is usable.
 * `test_cuda_gated_delta --bench` instead times the chunked gated delta rule, forward + backward,
 * at the Qwen3.6-35B-A3B layer shape (Hk 16, Hv 32, Dk = Dv = 128) for B = 1 and T = 4096, 32768,
 * 131072 and for B = 16, T = 4096, and prints the TFLOP/s of mt_gated_delta_flops.
 *
 * Inputs are drawn in fp32, rounded to bf16 (g and beta, fp32 in the ops, are not), and the CPU is
 * fed the rounded values, so the comparison measures the op. Tolerances, |gpu - cpu| <= atol +
 * rtol*|cpu| with atol relative to `scale` = the RMS of the reference tensor:
 *   bf16 outputs (one rounding to bf16 = 2^-9 relative):           atol 1e-2*scale, rtol 2e-2
 *   fp32 outputs from the same bf16 inputs (summation order only):  atol 1e-4*scale, rtol 1e-3
 *   the gated delta rule, every output (out, dq, dk, dv in bf16; chunk_states, dg, dbeta in fp32):
 *     the bf16 bound, atol 1e-2*scale, rtol 2e-2: its products run on TF32 tensor cores (2^-11
 *     relative an operand, 2^-9 on the bf16 outputs' own rounding), through up to 5 chunks of
 *     state; and the tensor metric max|err|/max|ref| <= 1e-2.
 * Outputs written (=) are poisoned first (bf16 NaN, fp32 NaN) so an unwritten element fails;
 * outputs accumulated (+=) are pre-filled and the fill is part of the reference. The weight
 * gradients and the gated delta backward are run twice and must give the same bits. A NULL weight
 * gradient (conv weight, norm weight, A_log, dt_bias: frozen) is skipped and leaves the data
 * gradients bit for bit those of the full call.
 * Cases: documents packed in rows (starts inside a chunk and on a chunk boundary), T not a multiple
 * of 64 and T < 64, Hv = 2*Hk, Dk = Dv = 128, Dv > 32 not a multiple of 32, a small odd case
 * (Dk 13, Dv 7), correlated keys (an ill-conditioned triangular solve, as in trained models) at
 * the tiny fixtures' heads and at Qwen3.5's, and ranges of 1 and 2 chunks forced
 * (MT_GATED_DELTA_RANGE) so that the state and its gradient cross range boundaries. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "util/dev_buffers.h"
#include "util/host_buffers.h"
#include "util/testutil.h"

#define BF_ATOL 1e-2
#define BF_RTOL 2e-2
#define F32_ATOL 1e-4
#define F32_RTOL 1e-3
#define GD_ATOL 1e-2
#define GD_RTOL 2e-2
#define GD_TENSOR 1e-2

static mt_backend *cpu, *gpu;

/* ---------------- checks (the buffers: util/dev_buffers.h) ---------------- */

/* The gated delta rule's outputs: the bf16 bound and the tensor metric. */
static int check_gd(const char *what, const void *d, int is_bf, const float *ref, size_t n) {
    float *g = is_bf ? mt_test_down_bf(gpu, d, n) : mt_test_down_f32(gpu, d, n);
    int ok = mt_test_check_rms(what, g, ref, n, GD_ATOL, GD_RTOL);
    double t = mt_max_rel_err(g, ref, n);
    fprintf(stderr, "%-40s max|err|/max|ref| %.3g (tol %.0e)%s\n", what, t, GD_TENSOR,
            t <= GD_TENSOR ? "" : "  FAIL");
    free(g);
    return ok && t <= GD_TENSOR;
}
static void gfree(void *p) { gpu->free(gpu, p); }
/* Two device tensors of n bf16 (or fp32 with elem 4) hold the same bits. */
static int same_dev(const char *what, const void *d1, const void *d2, size_t n, size_t elem) {
    void *h1 = malloc(n * elem), *h2 = malloc(n * elem);
    gpu->download(gpu, h1, d1, n * elem);
    gpu->download(gpu, h2, d2, n * elem);
    int ok = memcmp(h1, h2, n * elem) == 0;
    fprintf(stderr, "%-40s %s\n", what, ok ? "the same bits as the full call" : "DIFFERS  FAIL");
    free(h1), free(h2);
    return ok;
}

/* doc_start (B*T) from each row's list of starts (ending with T); NULL for none. */
static int32_t *docs_from(const int starts[][6], int B, int T) {
    if (!starts) return NULL;
    int32_t *ds = malloc((size_t)B * T * sizeof *ds);
    for (int b = 0; b < B; b++)
        for (int d = 0; d < 6 && starts[b][d] < T; d++)
            for (int t = starts[b][d]; t < T && (d == 5 || t < starts[b][d + 1]); t++)
                ds[(size_t)b * T + t] = starts[b][d];
    return ds;
}

/* ---------------- the ops are there ---------------- */

static void test_ops_present(void **state) {
    assert_non_null(gpu->causal_conv1d_forward);
    assert_non_null(gpu->causal_conv1d_backward);
    assert_non_null(gpu->l2norm_forward);
    assert_non_null(gpu->l2norm_backward);
    assert_non_null(gpu->gdn_gates_forward);
    assert_non_null(gpu->gdn_gates_backward);
    assert_non_null(gpu->gated_delta_forward);
    assert_non_null(gpu->gated_delta_backward);
    assert_non_null(gpu->gated_rmsnorm_forward);
    assert_non_null(gpu->gated_rmsnorm_backward);
}

/* ---------------- causal conv1d ---------------- */

/* t0 > 0: the call is positions t0.. of longer rows (a span), doc_start then holds the row's
 * positions: a row's first document began before the call (0), the others at t0 + their start. */
static void conv_case(int B, int T, int C, int K, const int starts[][6], uint64_t seed, int t0) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[128];
    size_t n = (size_t)B * T * C, nw = (size_t)C * K;
    float *x = mt_test_randn_bf(&rng, n, 1.0f), *w = mt_test_randn_bf(&rng, nw, 0.5f),
          *dy = mt_test_randn_bf(&rng, n, 1.0f);
    float *fill = mt_test_randn(&rng, nw, 1.0f);
    int32_t *ds = docs_from(starts, B, T);
    for (size_t i = 0; ds && t0 > 0 && i < (size_t)B * T; i++)
        if (ds[i] > 0) ds[i] += t0;
    int32_t *d_ds = ds ? mt_test_up_raw(gpu, ds, (size_t)B * T * sizeof(int32_t)) : NULL;
    void *d_x = mt_test_up_bf(gpu, x, n), *d_w = mt_test_up_bf(gpu, w, nw), *d_dy = mt_test_up_bf(gpu, dy, n);
    float *out = mt_test_fnew(n), *dx = mt_test_fnew(n), *dw = mt_test_copyf(fill, nw);
    cpu->causal_conv1d_forward(cpu, out, x, w, ds, B, T, C, K, t0);
    mt_test_nan_fill(dx, n);
    cpu->causal_conv1d_backward(cpu, dx, dw, dy, x, w, ds, B, T, C, K, t0);
    void *d_out = mt_test_poison_bf(gpu, n), *d_dx = mt_test_poison_bf(gpu, n);
    float *d_dw = mt_test_up_raw(gpu, fill, nw * sizeof(float));
    gpu->causal_conv1d_forward(gpu, d_out, d_x, d_w, d_ds, B, T, C, K, t0);
    gpu->causal_conv1d_backward(gpu, d_dx, d_dw, d_dy, d_x, d_w, d_ds, B, T, C, K, t0);
    char tag[32];
    snprintf(tag, sizeof tag, "%s t0=%d", ds ? " docs" : "", t0);
    snprintf(what, sizeof what, "conv1d_fwd B=%d T=%d C=%d K=%d%s", B, T, C, K, tag);
    assert_true(mt_test_check_bf(gpu, what, d_out, out, n, BF_ATOL, BF_RTOL));
    snprintf(what, sizeof what, "conv1d_bwd dinp B=%d T=%d C=%d%s", B, T, C, tag);
    assert_true(mt_test_check_bf(gpu, what, d_dx, dx, n, BF_ATOL, BF_RTOL));
    snprintf(what, sizeof what, "conv1d_bwd dweight (+=) B=%d T=%d C=%d%s", B, T, C, tag);
    assert_true(mt_test_check_f32(gpu, what, d_dw, dw, nw, F32_ATOL, F32_RTOL));
    float *g1 = mt_test_down_f32(gpu, d_dw, nw);
    gpu->upload(gpu, d_dw, fill, nw * sizeof(float));
    gpu->causal_conv1d_backward(gpu, d_dx, d_dw, d_dy, d_x, d_w, d_ds, B, T, C, K, t0);
    float *g2 = mt_test_down_f32(gpu, d_dw, nw);
    assert_true(mt_test_same_bits(what, g1, g2, nw * sizeof(float)));
    free(g1), free(g2);
    void *d_dx2 = mt_test_poison_bf(gpu, n); /* dweight NULL (a frozen conv) */
    gpu->causal_conv1d_backward(gpu, d_dx2, NULL, d_dy, d_x, d_w, d_ds, B, T, C, K, t0);
    snprintf(what, sizeof what, "conv1d_bwd dinp, dweight NULL B=%d T=%d C=%d%s", B, T, C, tag);
    assert_true(same_dev(what, d_dx2, d_dx, n, sizeof(mt_bf16)));
    gfree(d_dx2);
    free(x), free(w), free(dy), free(fill), free(ds), free(out), free(dx), free(dw);
    gfree(d_x), gfree(d_w), gfree(d_dy), gfree(d_out), gfree(d_dx), gfree(d_dw);
    if (d_ds) gfree(d_ds);
}

static void test_causal_conv1d(void **state) {
    static const int docs[2][6] = {{0, 2, 40, 41, 77, 77}, {0, 77, 77, 77, 77, 77}};
    conv_case(2, 77, 200, 4, NULL, 31, 0);
    conv_case(2, 77, 200, 4, docs, 32, 0);
    conv_case(1, 300, 1024, 4, NULL, 33, 0); /* several parts */
    conv_case(1, 9, 5, 3, NULL, 34, 0);
    conv_case(2, 77, 200, 4, docs, 35, 100); /* a span: documents begun before it */
    conv_case(1, 77, 200, 4, NULL, 36, 3);
}

/* ---------------- l2norm ---------------- */

static void l2_case(int R, int D, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[128];
    size_t n = (size_t)R * D;
    float *x = mt_test_randn_bf(&rng, n, 1.0f), *dy = mt_test_randn_bf(&rng, n, 1.0f);
    float *y = mt_test_fnew(n), *rinv = mt_test_fnew(R), *dx = mt_test_fnew(n);
    cpu->l2norm_forward(cpu, y, rinv, x, R, D, 1e-6f);
    cpu->l2norm_backward(cpu, dx, dy, x, rinv, R, D);
    void *d_x = mt_test_up_bf(gpu, x, n), *d_dy = mt_test_up_bf(gpu, dy, n), *d_y = mt_test_poison_bf(gpu, n),
         *d_dx = mt_test_poison_bf(gpu, n);
    float *d_rinv = mt_test_poison_f32(gpu, R);
    gpu->l2norm_forward(gpu, d_y, d_rinv, d_x, R, D, 1e-6f);
    gpu->l2norm_backward(gpu, d_dx, d_dy, d_x, d_rinv, R, D);
    snprintf(what, sizeof what, "l2norm_fwd R=%d D=%d", R, D);
    assert_true(mt_test_check_bf(gpu, what, d_y, y, n, BF_ATOL, BF_RTOL));
    snprintf(what, sizeof what, "l2norm_fwd rinv R=%d D=%d", R, D);
    assert_true(mt_test_check_f32(gpu, what, d_rinv, rinv, R, F32_ATOL, F32_RTOL));
    snprintf(what, sizeof what, "l2norm_bwd R=%d D=%d", R, D);
    assert_true(mt_test_check_bf(gpu, what, d_dx, dx, n, BF_ATOL, BF_RTOL));
    free(x), free(dy), free(y), free(rinv), free(dx);
    gfree(d_x), gfree(d_dy), gfree(d_y), gfree(d_dx), gfree(d_rinv);
}

static void test_l2norm(void **state) {
    l2_case(300, 128, 41);
    l2_case(37, 13, 42);
}

/* ---------------- gdn gates ---------------- */

static void gates_case(int N, int H, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[128];
    size_t n = (size_t)N * H;
    float *a = mt_test_randn_bf(&rng, n, 2.0f), *b = mt_test_randn_bf(&rng, n, 2.0f);
    float *A = mt_test_randn_bf(&rng, H, 1.0f), *dt = mt_test_randn_bf(&rng, H, 1.0f);
    a[0] = 25.0f; /* past softplus's threshold */
    float *dg = mt_test_randn(&rng, n, 1.0f), *db_in = mt_test_randn(&rng, n, 1.0f);
    float *fillA = mt_test_randn(&rng, H, 1.0f), *fillT = mt_test_randn(&rng, H, 1.0f);
    float *g = mt_test_fnew(n), *beta = mt_test_fnew(n), *da = mt_test_fnew(n), *db = mt_test_fnew(n);
    float *dA = mt_test_copyf(fillA, H), *ddt = mt_test_copyf(fillT, H);
    cpu->gdn_gates_forward(cpu, g, beta, a, b, A, dt, N, H);
    cpu->gdn_gates_backward(cpu, da, db, dA, ddt, dg, db_in, a, b, A, dt, N, H);
    void *d_a = mt_test_up_bf(gpu, a, n), *d_b = mt_test_up_bf(gpu, b, n), *d_A = mt_test_up_bf(gpu, A, H),
         *d_dt = mt_test_up_bf(gpu, dt, H);
    float *d_dg = mt_test_up_raw(gpu, dg, n * sizeof(float)),
          *d_dbi = mt_test_up_raw(gpu, db_in, n * sizeof(float));
    float *d_g = mt_test_poison_f32(gpu, n), *d_beta = mt_test_poison_f32(gpu, n);
    void *d_da = mt_test_poison_bf(gpu, n), *d_db = mt_test_poison_bf(gpu, n);
    float *d_dA = mt_test_up_raw(gpu, fillA, H * sizeof(float)),
          *d_ddt = mt_test_up_raw(gpu, fillT, H * sizeof(float));
    gpu->gdn_gates_forward(gpu, d_g, d_beta, d_a, d_b, d_A, d_dt, N, H);
    gpu->gdn_gates_backward(gpu, d_da, d_db, d_dA, d_ddt, d_dg, d_dbi, d_a, d_b, d_A, d_dt, N, H);
    snprintf(what, sizeof what, "gdn_gates g N=%d H=%d", N, H);
    assert_true(mt_test_check_f32(gpu, what, d_g, g, n, F32_ATOL, F32_RTOL));
    snprintf(what, sizeof what, "gdn_gates beta N=%d H=%d", N, H);
    assert_true(mt_test_check_f32(gpu, what, d_beta, beta, n, F32_ATOL, F32_RTOL));
    snprintf(what, sizeof what, "gdn_gates da N=%d H=%d", N, H);
    assert_true(mt_test_check_bf(gpu, what, d_da, da, n, BF_ATOL, BF_RTOL));
    snprintf(what, sizeof what, "gdn_gates db N=%d H=%d", N, H);
    assert_true(mt_test_check_bf(gpu, what, d_db, db, n, BF_ATOL, BF_RTOL));
    snprintf(what, sizeof what, "gdn_gates dA_log (+=) N=%d H=%d", N, H);
    assert_true(mt_test_check_f32(gpu, what, d_dA, dA, H, F32_ATOL, F32_RTOL));
    snprintf(what, sizeof what, "gdn_gates ddt_bias (+=) N=%d H=%d", N, H);
    assert_true(mt_test_check_f32(gpu, what, d_ddt, ddt, H, F32_ATOL, F32_RTOL));
    float *g1 = mt_test_down_f32(gpu, d_dA, H), *t1 = mt_test_down_f32(gpu, d_ddt, H);
    gpu->upload(gpu, d_dA, fillA, H * sizeof(float));
    gpu->upload(gpu, d_ddt, fillT, H * sizeof(float));
    gpu->gdn_gates_backward(gpu, d_da, d_db, d_dA, d_ddt, d_dg, d_dbi, d_a, d_b, d_A, d_dt, N, H);
    float *g2 = mt_test_down_f32(gpu, d_dA, H), *t2 = mt_test_down_f32(gpu, d_ddt, H);
    assert_true(mt_test_same_bits("gdn_gates dA_log", g1, g2, H * sizeof(float)));
    assert_true(mt_test_same_bits("gdn_gates ddt_bias", t1, t2, H * sizeof(float)));
    free(g1), free(g2), free(t1), free(t2);
    /* dA_log NULL, ddt_bias NULL, both: da, db and the other sum the same bits; the NULL one's
     * buffer untouched */
    void *d_da2 = mt_test_poison_bf(gpu, n), *d_db2 = mt_test_poison_bf(gpu, n);
    float *d_dA2 = mt_test_up_raw(gpu, fillA, H * sizeof(float)),
          *d_ddt2 = mt_test_up_raw(gpu, fillT, H * sizeof(float));
    for (int mode = 0; mode < 3; mode++) {
        gpu->upload(gpu, d_dA2, fillA, H * sizeof(float));
        gpu->upload(gpu, d_ddt2, fillT, H * sizeof(float));
        gpu->gdn_gates_backward(gpu, d_da2, d_db2, mode == 1 ? d_dA2 : NULL,
                                mode == 0 ? d_ddt2 : NULL, d_dg, d_dbi, d_a, d_b, d_A, d_dt, N, H);
        const char *null = mode == 0 ? "dA_log" : mode == 1 ? "ddt_bias" : "both";
        snprintf(what, sizeof what, "gdn_gates da, %s NULL", null);
        assert_true(same_dev(what, d_da2, d_da, n, sizeof(mt_bf16)));
        snprintf(what, sizeof what, "gdn_gates db, %s NULL", null);
        assert_true(same_dev(what, d_db2, d_db, n, sizeof(mt_bf16)));
        /* the sum given: the full call's bits (d_dA, d_ddt hold it from the fill); the NULL one:
         * its fill */
        float *hA = mt_test_down_f32(gpu, d_dA2, H), *hT = mt_test_down_f32(gpu, d_ddt2, H);
        float *fullA = mt_test_down_f32(gpu, d_dA, H), *fullT = mt_test_down_f32(gpu, d_ddt, H);
        assert_memory_equal(hA, mode == 1 ? fullA : fillA, H * sizeof(float));
        assert_memory_equal(hT, mode == 0 ? fullT : fillT, H * sizeof(float));
        free(hA), free(hT), free(fullA), free(fullT);
    }
    gfree(d_da2), gfree(d_db2), gfree(d_dA2), gfree(d_ddt2);
    free(a), free(b), free(A), free(dt), free(dg), free(db_in), free(fillA), free(fillT);
    free(g), free(beta), free(da), free(db), free(dA), free(ddt);
    gfree(d_a), gfree(d_b), gfree(d_A), gfree(d_dt), gfree(d_dg), gfree(d_dbi), gfree(d_g);
    gfree(d_beta), gfree(d_da), gfree(d_db), gfree(d_dA), gfree(d_ddt);
}

static void test_gdn_gates(void **state) {
    gates_case(333, 32, 51);
    gates_case(1000, 3, 52);
}

/* ---------------- gated rmsnorm ---------------- */

static void grms_case(int R, int C, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[128];
    size_t n = (size_t)R * C;
    float *x = mt_test_randn_bf(&rng, n, 1.0f), *z = mt_test_randn_bf(&rng, n, 2.0f),
          *w = mt_test_randn_bf(&rng, C, 1.0f);
    float *dy = mt_test_randn_bf(&rng, n, 1.0f), *fill = mt_test_randn(&rng, C, 1.0f);
    float *y = mt_test_fnew(n), *rstd = mt_test_fnew(R), *dx = mt_test_fnew(n), *dz = mt_test_fnew(n),
          *dw = mt_test_copyf(fill, C);
    cpu->gated_rmsnorm_forward(cpu, y, rstd, x, z, w, R, C, 1e-6f);
    cpu->gated_rmsnorm_backward(cpu, dx, dz, dw, dy, x, z, w, rstd, R, C);
    void *d_x = mt_test_up_bf(gpu, x, n), *d_z = mt_test_up_bf(gpu, z, n), *d_w = mt_test_up_bf(gpu, w, C),
         *d_dy = mt_test_up_bf(gpu, dy, n);
    void *d_y = mt_test_poison_bf(gpu, n), *d_dx = mt_test_poison_bf(gpu, n),
         *d_dz = mt_test_poison_bf(gpu, n);
    float *d_rstd = mt_test_poison_f32(gpu, R), *d_dw = mt_test_up_raw(gpu, fill, C * sizeof(float));
    gpu->gated_rmsnorm_forward(gpu, d_y, d_rstd, d_x, d_z, d_w, R, C, 1e-6f);
    gpu->gated_rmsnorm_backward(gpu, d_dx, d_dz, d_dw, d_dy, d_x, d_z, d_w, d_rstd, R, C);
    snprintf(what, sizeof what, "gated_rmsnorm_fwd R=%d C=%d", R, C);
    assert_true(mt_test_check_bf(gpu, what, d_y, y, n, BF_ATOL, BF_RTOL));
    snprintf(what, sizeof what, "gated_rmsnorm_fwd rstd R=%d C=%d", R, C);
    assert_true(mt_test_check_f32(gpu, what, d_rstd, rstd, R, F32_ATOL, F32_RTOL));
    snprintf(what, sizeof what, "gated_rmsnorm_bwd dinp R=%d C=%d", R, C);
    assert_true(mt_test_check_bf(gpu, what, d_dx, dx, n, BF_ATOL, BF_RTOL));
    snprintf(what, sizeof what, "gated_rmsnorm_bwd dgate R=%d C=%d", R, C);
    assert_true(mt_test_check_bf(gpu, what, d_dz, dz, n, BF_ATOL, BF_RTOL));
    snprintf(what, sizeof what, "gated_rmsnorm_bwd dweight (+=) R=%d C=%d", R, C);
    assert_true(mt_test_check_f32(gpu, what, d_dw, dw, C, F32_ATOL, F32_RTOL));
    float *g1 = mt_test_down_f32(gpu, d_dw, C);
    gpu->upload(gpu, d_dw, fill, C * sizeof(float));
    gpu->gated_rmsnorm_backward(gpu, d_dx, d_dz, d_dw, d_dy, d_x, d_z, d_w, d_rstd, R, C);
    float *g2 = mt_test_down_f32(gpu, d_dw, C);
    assert_true(mt_test_same_bits(what, g1, g2, C * sizeof(float)));
    free(g1), free(g2);
    /* dweight NULL (a frozen norm) */
    void *d_dx2 = mt_test_poison_bf(gpu, n), *d_dz2 = mt_test_poison_bf(gpu, n);
    gpu->gated_rmsnorm_backward(gpu, d_dx2, d_dz2, NULL, d_dy, d_x, d_z, d_w, d_rstd, R, C);
    snprintf(what, sizeof what, "gated_rmsnorm_bwd dinp, dweight NULL R=%d C=%d", R, C);
    assert_true(same_dev(what, d_dx2, d_dx, n, sizeof(mt_bf16)));
    snprintf(what, sizeof what, "gated_rmsnorm_bwd dgate, dweight NULL R=%d C=%d", R, C);
    assert_true(same_dev(what, d_dz2, d_dz, n, sizeof(mt_bf16)));
    gfree(d_dx2), gfree(d_dz2);
    free(x), free(z), free(w), free(dy), free(fill), free(y), free(rstd), free(dx), free(dz), free(dw);
    gfree(d_x), gfree(d_z), gfree(d_w), gfree(d_dy), gfree(d_y), gfree(d_dx), gfree(d_dz);
    gfree(d_rstd), gfree(d_dw);
}

static void test_gated_rmsnorm(void **state) {
    grms_case(300, 128, 61);
    grms_case(1000, 20, 62);
}

/* ---------------- the gated delta rule ---------------- */

typedef struct {
    size_t nk, nv, ng, ns;
    float *q, *k, *v, *g, *beta, *dout;
    int32_t *ds;
    void *d_q, *d_k, *d_v, *d_dout;
    float *d_g, *d_beta;
    int32_t *d_ds;
} gd_inputs;

/* q, k unit rows (then bf16), v, dout normal (bf16), beta = sigmoid, g = -softplus * gscale.
 * kcorr > 0 makes the keys of a head correlated, as a trained model's are (each key leans on one
 * direction a head by kcorr against unit noise): I + A is then ill-conditioned and Tm's entries
 * grow, the case the split TF32 products are for. */
static void gd_make(gd_inputs *in, int B, int T, int Hk, int Hv, int Dk, int Dv, float gscale,
                    float kcorr, const int starts[][6], uint64_t seed, int with_cpu_copy) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    int nc = (T + MT_GATED_DELTA_CHUNK - 1) / MT_GATED_DELTA_CHUNK;
    in->nk = (size_t)B * T * Hk * Dk, in->nv = (size_t)B * T * Hv * Dv, in->ng = (size_t)B * T * Hv;
    in->ns = (size_t)B * Hv * nc * Dk * Dv;
    in->q = mt_test_randn(&rng, in->nk, 1.0f), in->k = mt_test_randn(&rng, in->nk, 1.0f);
    if (kcorr > 0) {
        float *dir = mt_test_randn(&rng, (size_t)Hk * Dk, 1.0f);
        for (size_t r = 0; r < in->nk / Dk; r++)
            for (int d = 0; d < Dk; d++) in->k[r * Dk + d] += kcorr * dir[r % Hk * Dk + d];
        free(dir);
    }
    for (int t = 0; t < 2; t++) {
        float *x = t ? in->k : in->q;
        for (size_t r = 0; r < in->nk / Dk; r++) {
            double ss = 0;
            for (int d = 0; d < Dk; d++) ss += (double)x[r * Dk + d] * x[r * Dk + d];
            for (int d = 0; d < Dk; d++)
                x[r * Dk + d] = mt_bf16_to_f32(mt_f32_to_bf16((float)(x[r * Dk + d] / sqrt(ss))));
        }
    }
    in->v = mt_test_randn_bf(&rng, in->nv, 1.0f), in->dout = mt_test_randn_bf(&rng, in->nv, 1.0f);
    in->g = mt_test_randn(&rng, in->ng, 1.0f), in->beta = mt_test_randn(&rng, in->ng, 1.0f);
    for (size_t i = 0; i < in->ng; i++) {
        in->beta[i] = 1.0f / (1.0f + expf(-in->beta[i]));
        in->g[i] = -gscale * log1pf(expf(in->g[i]));
    }
    in->ds = docs_from(starts, B, T);
    in->d_q = mt_test_up_bf(gpu, in->q, in->nk), in->d_k = mt_test_up_bf(gpu, in->k, in->nk);
    in->d_v = mt_test_up_bf(gpu, in->v, in->nv);
    in->d_dout = mt_test_up_bf(gpu, in->dout, in->nv);
    in->d_g = mt_test_up_raw(gpu, in->g, in->ng * sizeof(float));
    in->d_beta = mt_test_up_raw(gpu, in->beta, in->ng * sizeof(float));
    in->d_ds = in->ds ? mt_test_up_raw(gpu, in->ds, (size_t)B * T * sizeof(int32_t)) : NULL;
    if (!with_cpu_copy) free(in->q), free(in->k), free(in->v), free(in->dout), free(in->g),
        free(in->beta), in->q = in->k = in->v = in->dout = in->g = in->beta = NULL;
}

static void gd_free(gd_inputs *in) {
    free(in->q), free(in->k), free(in->v), free(in->dout), free(in->g), free(in->beta), free(in->ds);
    gfree(in->d_q), gfree(in->d_k), gfree(in->d_v), gfree(in->d_dout), gfree(in->d_g);
    gfree(in->d_beta);
    if (in->d_ds) gfree(in->d_ds);
}

/* The GPU's out and gradients (device) against the CPU's (host), each within check_gd's bounds;
 * names them with tag. Returns 1 when all pass. */
typedef struct {
    const void *out, *dq, *dk, *dv;
    const float *dg, *db;
} gd_results;

static int check_gd_results(const char *tag, const gd_inputs *in, gd_results gpu_r, const float *out,
                            const float *dq, const float *dk, const float *dv, const float *dg,
                            const float *db) {
    const struct {
        const char *name;
        const void *d;
        int is_bf;
        const float *ref;
        size_t n;
    } t[] = {{"gd_fwd out", gpu_r.out, 1, out, in->nv}, {"gd_bwd dq", gpu_r.dq, 1, dq, in->nk},
             {"gd_bwd dk", gpu_r.dk, 1, dk, in->nk},   {"gd_bwd dv", gpu_r.dv, 1, dv, in->nv},
             {"gd_bwd dg", gpu_r.dg, 0, dg, in->ng},   {"gd_bwd dbeta", gpu_r.db, 0, db, in->ng}};
    int ok = 1;
    char what[200];
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        snprintf(what, sizeof what, "%s %s", t[i].name, tag);
        ok &= check_gd(what, t[i].d, t[i].is_bf, t[i].ref, t[i].n);
    }
    return ok;
}

static void gd_case(int B, int T, int Hk, int Hv, int Dk, int Dv, float gscale, float kcorr,
                    const int starts[][6], uint64_t seed) {
    gd_inputs in;
    gd_make(&in, B, T, Hk, Hv, Dk, Dv, gscale, kcorr, starts, seed, 1);
    float scale = 1.0f / sqrtf((float)Dk);
    char what[200], tag[128];
    const char *range = getenv("MT_GATED_DELTA_RANGE"), *prec = getenv("MT_GATED_DELTA_TF32");
    snprintf(tag, sizeof tag, "B=%d T=%d Hk=%d Hv=%d Dk=%d Dv=%d%s%s%s%s%s%s", B, T, Hk, Hv, Dk, Dv,
             in.ds ? " docs" : "", kcorr > 0 ? " correlated keys" : "",
             range ? " ranges of " : "", range ? range : "", prec ? " TF32 mode " : "",
             prec ? prec : "");
    float *out = mt_test_fnew(in.nv), *cs = mt_test_fnew(in.ns), *dq = mt_test_fnew(in.nk),
          *dk = mt_test_fnew(in.nk);
    float *dv = mt_test_fnew(in.nv), *dg = mt_test_fnew(in.ng), *db = mt_test_fnew(in.ng);
    cpu->gated_delta_forward(cpu, out, cs, in.q, in.k, in.v, in.g, in.beta, in.ds, B, T, Hk, Hv,
                             Dk, Dv, scale, NULL);
    cpu->gated_delta_backward(cpu, dq, dk, dv, dg, db, in.dout, cs, in.q, in.k, in.v, in.g, in.beta,
                              in.ds, B, T, Hk, Hv, Dk, Dv, scale, NULL);
    void *d_out = mt_test_poison_bf(gpu, in.nv), *d_dq = mt_test_poison_bf(gpu, in.nk),
         *d_dk = mt_test_poison_bf(gpu, in.nk);
    void *d_dv = mt_test_poison_bf(gpu, in.nv);
    float *d_cs = mt_test_poison_f32(gpu, in.ns), *d_dg = mt_test_poison_f32(gpu, in.ng),
          *d_db = mt_test_poison_f32(gpu, in.ng);
    gpu->gated_delta_forward(gpu, d_out, d_cs, in.d_q, in.d_k, in.d_v, in.d_g, in.d_beta, in.d_ds,
                             B, T, Hk, Hv, Dk, Dv, scale, NULL);
    gpu->gated_delta_backward(gpu, d_dq, d_dk, d_dv, d_dg, d_db, in.d_dout, d_cs, in.d_q, in.d_k,
                              in.d_v, in.d_g, in.d_beta, in.d_ds, B, T, Hk, Hv, Dk, Dv, scale,
                              NULL);
    snprintf(what, sizeof what, "gd_fwd chunk_states %s", tag);
    int ok = check_gd(what, d_cs, 0, cs, in.ns);
    gd_results r = {d_out, d_dq, d_dk, d_dv, d_dg, d_db};
    ok &= check_gd_results(tag, &in, r, out, dq, dk, dv, dg, db);
    /* the backward again: the same bits */
    float *q1 = mt_test_down_bf(gpu, d_dq, in.nk), *g1 = mt_test_down_f32(gpu, d_dg, in.ng);
    gpu->gated_delta_backward(gpu, d_dq, d_dk, d_dv, d_dg, d_db, in.d_dout, d_cs, in.d_q, in.d_k,
                              in.d_v, in.d_g, in.d_beta, in.d_ds, B, T, Hk, Hv, Dk, Dv, scale,
                              NULL);
    float *q2 = mt_test_down_bf(gpu, d_dq, in.nk), *g2 = mt_test_down_f32(gpu, d_dg, in.ng);
    snprintf(what, sizeof what, "gd_bwd dq, dg %s", tag);
    ok &= mt_test_same_bits(what, q1, q2, in.nk * sizeof(float)) &&
          mt_test_same_bits(what, g1, g2, in.ng * sizeof(float));
    free(q1), free(q2), free(g1), free(g2);
    free(out), free(cs), free(dq), free(dk), free(dv), free(dg), free(db);
    gfree(d_out), gfree(d_dq), gfree(d_dk), gfree(d_dv), gfree(d_cs), gfree(d_dg), gfree(d_db);
    gd_free(&in);
    assert_true(ok);
}

static void test_gated_delta(void **state) {
    /* row 0: documents starting inside a chunk and on a chunk boundary (64); row 1 one document */
    static const int docs[2][6] = {{0, 37, 64, 100, 101, 150}, {0, 150, 150, 150, 150, 150}};
    /* the 300-token row of the correlated case: documents at 37, 64 and 200 */
    static const int docs300[1][6] = {{0, 37, 64, 200, 300, 300}};
    static const int docs_odd[1][6] = {{0, 5, 66, 70, 70, 70}};
    gd_case(2, 150, 2, 4, 128, 128, 1.0f, 0, docs, 71);  /* Qwen3.5's head sizes, Hv = 2 Hk */
    gd_case(1, 300, 1, 2, 128, 128, 0.02f, 0, NULL, 72); /* slow decay: state through 5 chunks */
    gd_case(1, 17, 1, 2, 32, 48, 1.0f, 0, NULL, 73);     /* T < 64; Dv 48: a partial column block */
    gd_case(1, 70, 1, 1, 13, 7, 1.0f, 0, docs_odd, 74);  /* small odd */
    gd_case(2, 64, 2, 2, 64, 64, 5.0f, 0, NULL, 75);     /* strong decay, T = one chunk */
    gd_case(2, 200, 2, 4, 32, 16, 0.1f, 0.5f, NULL, 76); /* the tiny models' heads, keys correlated */
    gd_case(1, 300, 2, 4, 128, 128, 0.1f, 0.5f, docs300, 77);
    /* long inputs run in ranges of chunks, the state and its gradient carried between them: force
       ranges of 1 and 2 chunks (5 chunks: 2 + 2 + 1) */
    setenv("MT_GATED_DELTA_RANGE", "2", 1);
    gd_case(1, 300, 1, 2, 128, 128, 0.02f, 0, NULL, 72);
    gd_case(2, 150, 2, 4, 128, 128, 1.0f, 0, docs, 71);
    setenv("MT_GATED_DELTA_RANGE", "1", 1);
    gd_case(2, 150, 2, 4, 128, 128, 1.0f, 0, docs, 71);
    gd_case(1, 70, 1, 1, 13, 7, 1.0f, 0, docs_odd, 74);
    unsetenv("MT_GATED_DELTA_RANGE");
}

/* One row of T tokens run as two spans, [0, S) and [S, T), as the tiled layer runs a long row
 * (mt_gated_delta_span, model/mixer_deltanet.c): the first span's forward hands its final state
 * to the second, whose doc_start positions are the row's (t0 = S); the backward runs the second
 * span first and hands the gradient of that state back. Against the CPU op over the whole row,
 * the same bounds as gd_case's. */
static void gd_span_case(int T, int S, int Hk, int Hv, int Dk, int Dv, float gscale, float kcorr,
                         const int starts[][6], uint64_t seed) {
    gd_inputs in;
    gd_make(&in, 1, T, Hk, Hv, Dk, Dv, gscale, kcorr, starts, seed, 1);
    float scale = 1.0f / sqrtf((float)Dk);
    char tag[128];
    snprintf(tag, sizeof tag, "T=%d as spans of %d + %d, Hk=%d Hv=%d Dk=%d Dv=%d%s", T, S, T - S,
             Hk, Hv, Dk, Dv, in.ds ? " docs" : "");
    float *out = mt_test_fnew(in.nv), *cs = mt_test_fnew(in.ns), *dq = mt_test_fnew(in.nk),
          *dk = mt_test_fnew(in.nk);
    float *dv = mt_test_fnew(in.nv), *dg = mt_test_fnew(in.ng), *db = mt_test_fnew(in.ng);
    cpu->gated_delta_forward(cpu, out, cs, in.q, in.k, in.v, in.g, in.beta, in.ds, 1, T, Hk, Hv,
                             Dk, Dv, scale, NULL);
    cpu->gated_delta_backward(cpu, dq, dk, dv, dg, db, in.dout, cs, in.q, in.k, in.v, in.g, in.beta,
                              in.ds, 1, T, Hk, Hv, Dk, Dv, scale, NULL);
    void *d_out = mt_test_poison_bf(gpu, in.nv), *d_dq = mt_test_poison_bf(gpu, in.nk),
         *d_dk = mt_test_poison_bf(gpu, in.nk);
    void *d_dv = mt_test_poison_bf(gpu, in.nv);
    float *d_dg = mt_test_poison_f32(gpu, in.ng), *d_db = mt_test_poison_f32(gpu, in.ng);
    size_t SS = (size_t)Hv * Dk * Dv;
    float *d_cs[2] = {mt_test_poison_f32(gpu, in.ns), mt_test_poison_f32(gpu, in.ns)};
    float *d_state = mt_test_poison_f32(gpu, SS), *d_dstate = mt_test_poison_f32(gpu, SS);
    const int t0[2] = {0, S}, n[2] = {S, T - S};
    size_t kb = (size_t)Hk * Dk * sizeof(mt_bf16), vb = (size_t)Hv * Dv * sizeof(mt_bf16);
#define AT(p, row_bytes, s) ((void *)((char *)(p) + (size_t)t0[s] * (row_bytes)))
    for (int s = 0; s < 2; s++) {
        mt_gated_delta_span sp = {t0[s], s ? d_state : NULL, s ? NULL : d_state, NULL, NULL};
        gpu->gated_delta_forward(gpu, AT(d_out, vb, s), d_cs[s], AT(in.d_q, kb, s),
                                 AT(in.d_k, kb, s), AT(in.d_v, vb, s), in.d_g + t0[s] * Hv,
                                 in.d_beta + t0[s] * Hv, in.d_ds ? in.d_ds + t0[s] : NULL, 1, n[s],
                                 Hk, Hv, Dk, Dv, scale, &sp);
    }
    for (int s = 1; s >= 0; s--) {
        mt_gated_delta_span sp = {t0[s], NULL, NULL, s ? NULL : d_dstate, s ? d_dstate : NULL};
        gpu->gated_delta_backward(gpu, AT(d_dq, kb, s), AT(d_dk, kb, s), AT(d_dv, vb, s),
                                  d_dg + t0[s] * Hv, d_db + t0[s] * Hv, AT(in.d_dout, vb, s),
                                  d_cs[s], AT(in.d_q, kb, s), AT(in.d_k, kb, s), AT(in.d_v, vb, s),
                                  in.d_g + t0[s] * Hv, in.d_beta + t0[s] * Hv,
                                  in.d_ds ? in.d_ds + t0[s] : NULL, 1, n[s], Hk, Hv, Dk, Dv, scale,
                                  &sp);
    }
#undef AT
    gd_results r = {d_out, d_dq, d_dk, d_dv, d_dg, d_db};
    int ok = check_gd_results(tag, &in, r, out, dq, dk, dv, dg, db);
    free(out), free(cs), free(dq), free(dk), free(dv), free(dg), free(db);
    gfree(d_out), gfree(d_dq), gfree(d_dk), gfree(d_dv), gfree(d_dg), gfree(d_db);
    gfree(d_cs[0]), gfree(d_cs[1]), gfree(d_state), gfree(d_dstate);
    gd_free(&in);
    assert_true(ok);
}

static void test_gated_delta_spans(void **state) {
    (void)state;
    /* documents at 37, 64 and 200; and one starting at the second span's first token (100) */
    static const int docs300[1][6] = {{0, 37, 64, 200, 300, 300}};
    static const int docs_at_span[1][6] = {{0, 37, 100, 200, 300, 300}};
    gd_span_case(300, 128, 2, 4, 128, 128, 0.1f, 0.5f, docs300, 81); /* on a chunk boundary */
    gd_span_case(300, 100, 2, 4, 128, 128, 0.02f, 0, NULL, 82);      /* inside a chunk */
    gd_span_case(300, 100, 2, 4, 128, 128, 1.0f, 0, docs_at_span, 83);
    setenv("MT_GATED_DELTA_RANGE", "1", 1); /* the spans' own ranges carry the state too */
    gd_span_case(300, 200, 1, 2, 32, 48, 0.1f, 0, docs300, 84);
    unsetenv("MT_GATED_DELTA_RANGE");
}

/* The same cases with split TF32 only where Tm or W meets a product (MT_GATED_DELTA_TF32=tm,
 * gated_delta_chunk.cuh), the rest plain TF32: the same bounds as the default's. */
static void test_gated_delta_split_tm(void **state) {
    setenv("MT_GATED_DELTA_TF32", "tm", 1);
    test_gated_delta(state);
    unsetenv("MT_GATED_DELTA_TF32");
}

/* The batched-GEMM chunk backward (MT_GATED_DELTA_BWD=gemm, gated_delta_gemm.cu): every case
 * above, ranges and spans included, against the CPU within the same bounds; and in tm mode. */
static void test_gated_delta_gemm_backward(void **state) {
    setenv("MT_GATED_DELTA_BWD", "gemm", 1);
    test_gated_delta(state);
    test_gated_delta_spans(state);
    setenv("MT_GATED_DELTA_TF32", "tm", 1);
    test_gated_delta(state);
    unsetenv("MT_GATED_DELTA_TF32");
    unsetenv("MT_GATED_DELTA_BWD");
}

/* ---------------- timing ---------------- */

static void bench_one(int B, int T, int Hk, int Hv, int Dk, int Dv, int iters, int seed) {
    float scale = 1.0f / sqrtf((float)Dk);
    mt_event *e0 = gpu->event_create(gpu), *e1 = gpu->event_create(gpu), *e2 = gpu->event_create(gpu);
    gd_inputs in;
    gd_make(&in, B, T, Hk, Hv, Dk, Dv, 1.0f, 0, NULL, seed, 0);
    void *d_out = gpu->alloc(gpu, in.nv * 2), *d_dq = gpu->alloc(gpu, in.nk * 2);
    void *d_dk = gpu->alloc(gpu, in.nk * 2), *d_dv = gpu->alloc(gpu, in.nv * 2);
    float *d_cs = gpu->alloc(gpu, in.ns * 4), *d_dg = gpu->alloc(gpu, in.ng * 4);
    float *d_db = gpu->alloc(gpu, in.ng * 4);
    double fwd_ms = 0, bwd_ms = 0;
    for (int it = 0; it <= iters; it++) {
        gpu->event_record(gpu, e0, MT_STREAM_COMPUTE);
        gpu->gated_delta_forward(gpu, d_out, d_cs, in.d_q, in.d_k, in.d_v, in.d_g, in.d_beta, NULL,
                                 B, T, Hk, Hv, Dk, Dv, scale, NULL);
        gpu->event_record(gpu, e1, MT_STREAM_COMPUTE);
        gpu->gated_delta_backward(gpu, d_dq, d_dk, d_dv, d_dg, d_db, in.d_dout, d_cs, in.d_q,
                                  in.d_k, in.d_v, in.d_g, in.d_beta, NULL, B, T, Hk, Hv, Dk, Dv,
                                  scale, NULL);
        gpu->event_record(gpu, e2, MT_STREAM_COMPUTE);
        gpu->event_sync(gpu, e2);
        if (it) {
            fwd_ms += gpu->event_elapsed_ms(gpu, e0, e1) / iters;
            bwd_ms += gpu->event_elapsed_ms(gpu, e1, e2) / iters;
        }
    }
    double ff, fb;
    mt_gated_delta_flops(B, T, Hv, Dk, Dv, &ff, &fb);
    printf("B=%-2d T=%-7d forward %8.3f ms %6.1f TFLOP/s | backward %8.3f ms %6.1f TFLOP/s | "
           "forward + backward %8.3f ms %6.1f TFLOP/s\n",
           B, T, fwd_ms, ff / fwd_ms * 1e-9, bwd_ms, fb / bwd_ms * 1e-9, fwd_ms + bwd_ms,
           (ff + fb) / (fwd_ms + bwd_ms) * 1e-9);
    fflush(stdout);
    gfree(d_out), gfree(d_dq), gfree(d_dk), gfree(d_dv), gfree(d_cs), gfree(d_dg), gfree(d_db);
    gd_free(&in);
    gpu->event_destroy(gpu, e0), gpu->event_destroy(gpu, e1), gpu->event_destroy(gpu, e2);
}

/* The Qwen3.6-35B-A3B layer at B = 1 (the peers' shape) and at the training batch 16 x 4096; with
 * the split TF32 products (the default), split only through Tm and W, and plain TF32. */
/* The Qwen3.6-35B-A3B layer's shape at 4k, 32k and 128k tokens and 16 x 4096: the default
 * precision with the fused chunk backward, then with the batched-GEMM one (MT_GATED_DELTA_BWD=gemm,
 * gated_delta_gemm.cu); `--bench all` adds the other precision modes of each. */
static int bench(int all) {
    const int Hk = 16, Hv = 32, Dk = 128, Dv = 128, iters = 3;
    const int Ts[3] = {4096, 32768, 131072};
    static const char *modes[3] = {"split", "tm", "1"};
    static const char *names[3] = {"split TF32 (fp32 GEMMs), the default",
                                   "split TF32 (fp32 GEMMs) where Tm or W meets a product",
                                   "plain TF32"};
    static const char *bwds[2] = {"fused", "gemm"};
    for (int mode = 0; mode < (all ? 3 : 1); mode++)
        for (int bw = 0; bw < 2; bw++) {
            setenv("MT_GATED_DELTA_TF32", modes[mode], 1);
            setenv("MT_GATED_DELTA_BWD", bwds[bw], 1);
            printf("gated_delta bench (%s, %s backward): Hk=%d Hv=%d Dk=%d Dv=%d, chunk %d, %d timed "
                   "runs each (after one warm-up)\n", names[mode], bwds[bw], Hk, Hv, Dk, Dv,
                   MT_GATED_DELTA_CHUNK, iters);
            for (int ti = 0; ti < 3; ti++) bench_one(1, Ts[ti], Hk, Hv, Dk, Dv, iters, 90 + ti);
            bench_one(16, 4096, Hk, Hv, Dk, Dv, iters, 95);
            fflush(stdout);
        }
    unsetenv("MT_GATED_DELTA_TF32");
    unsetenv("MT_GATED_DELTA_BWD");
    return 0;
}

int main(int argc, char **argv) {
    if (!mt_backend_cuda_available()) {
        fprintf(stderr, "test_cuda_gated_delta: no usable CUDA device, skipped\n");
        return 77;
    }
    cpu = mt_backend_cpu_create();
    gpu = mt_backend_cuda_create(0);
    int failed;
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        failed = bench(argc > 2 && strcmp(argv[2], "all") == 0);
    } else {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_ops_present), cmocka_unit_test(test_causal_conv1d),
            cmocka_unit_test(test_l2norm),      cmocka_unit_test(test_gdn_gates),
            cmocka_unit_test(test_gated_rmsnorm), cmocka_unit_test(test_gated_delta),
            cmocka_unit_test(test_gated_delta_split_tm), cmocka_unit_test(test_gated_delta_spans),
            cmocka_unit_test(test_gated_delta_gemm_backward),
        };
        failed = cmocka_run_group_tests(tests, NULL, NULL);
    }
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    return failed ? 1 : 0;
}
