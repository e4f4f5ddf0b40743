/* gpt-oss's own CPU ops against plain double-precision references:
 *  - the clamped SwiGLU (swiglu_clamped_*): forward against the formula in double, backward against
 *    central finite differences of it (h = 1e-4) away from the clamps, and exactly 0 where a clamp
 *    acts (gate above limit, up outside [-limit, limit]); the bounds themselves pass the gradient;
 *  - the [E, in, out] experts with biases (moe_matmul_io_*): every expert's rows against a naive
 *    double product, the weight and bias gradients accumulating (+=), dinp written or accumulated,
 *    an expert with no rows untouched.
 * Tolerances as tests/test_ops_cpu.c: forward atol 1e-6 rtol 1e-5, backward atol 1e-5 rtol 1e-4. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "util/cpu_op_tol.h"
#include "util/host_buffers.h"
#include "util/testutil.h"

static mt_backend *be;

/* (up + 1) * gate * sigmoid(alpha * gate) after the clamps, in double. */
static double clamped_glu(double g, double u, double alpha, double limit) {
    g = g > limit ? limit : g;
    u = u > limit ? limit : u < -limit ? -limit : u;
    return (u + 1) * g / (1 + exp(-alpha * g));
}

static void check_swiglu_clamped(int R, int F, float alpha, float limit, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    size_t n = (size_t)R * F;
    float *gu = mt_test_fnew(2 * n), *dout = mt_test_fnew(n);
    mt_test_fill_uniform(&rng, gu, 2 * n, -2 * limit, 2 * limit); /* about half of them clamped */
    mt_test_fill_normal(&rng, dout, n, 1);
    /* keep finite differences off the kinks, except the bounds themselves, set exactly */
    for (size_t i = 0; i < 2 * n; i++)
        if (fabsf(fabsf(gu[i]) - limit) < 1e-2f) gu[i] = gu[i] > 0 ? limit + 0.5f : -limit - 0.5f;
    gu[0] = limit, gu[1] = -limit; /* at the bounds: gradient passes */
    if (n > 1) gu[2] = limit, gu[3] = limit;
    float *ref = mt_test_fnew(n), *rg = mt_test_fnew(2 * n);
    int clamped = 0;
    for (size_t i = 0; i < n; i++) {
        double g = gu[2 * i], u = gu[2 * i + 1], d = dout[i];
        ref[i] = (float)clamped_glu(g, u, alpha, limit);
        /* at a bound (exactly limit) the gradient is the inner side's (torch.clamp passes it) */
        double gp = g == limit ? g : g + FD_H, gm = g - FD_H, gs = g == limit ? FD_H : 2 * FD_H;
        double up = fabs(u) == limit ? u - (u > 0 ? 0 : -FD_H) : u + FD_H;
        double um = fabs(u) == limit ? u - (u > 0 ? FD_H : 0) : u - FD_H;
        rg[2 * i] = g > limit ? 0.0f
                              : (float)(d * (clamped_glu(gp, u, alpha, limit) - clamped_glu(gm, u, alpha, limit)) / gs);
        rg[2 * i + 1] = fabs(u) > limit ? 0.0f
                                        : (float)(d * (clamped_glu(g, up, alpha, limit) - clamped_glu(g, um, alpha, limit)) / (up - um));
        clamped += (g > limit) + (fabs(u) > limit);
    }
    float *out = mt_test_fnew(n), *dg = mt_test_fnew(2 * n);
    mt_test_nan_fill(out, n), mt_test_nan_fill(dg, 2 * n);
    be->swiglu_clamped_forward(be, out, gu, R, F, alpha, limit);
    fprintf(stderr, "swiglu_clamped R=%d F=%d alpha %g limit %g: %d of %zu values clamped\n", R, F,
            (double)alpha, (double)limit, clamped, 2 * n);
    assert_true(mt_allclose("swiglu_clamped_forward", out, ref, n, FWD_ATOL, FWD_RTOL));
    be->swiglu_clamped_backward(be, dg, dout, gu, R, F, alpha, limit);
    assert_true(mt_allclose("swiglu_clamped_backward", dg, rg, 2 * n, BWD_ATOL, BWD_RTOL));
    for (size_t i = 0; i < n; i++) { /* clamped: exactly zero, not merely small */
        if (gu[2 * i] > limit) assert_true(dg[2 * i] == 0.0f);
        if (fabsf(gu[2 * i + 1]) > limit) assert_true(dg[2 * i + 1] == 0.0f);
    }
    assert_true(clamped > 0);
    free(gu), free(dout), free(ref), free(rg), free(out), free(dg);
}

static void test_swiglu_clamped(void **state) {
    check_swiglu_clamped(3, 4, 1.702f, 4.0f, 1);
    check_swiglu_clamped(37, 8, 1.702f, 7.0f, 2);
    check_swiglu_clamped(300, 128, 1.0f, 3.0f, 3); /* parallel path */
}

/* Experts over grouped rows: sizes[e] rows each (0 allowed). */
static void check_moe_io(int E, const int *sizes, int K, int M, int accumulate, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    int32_t off[16];
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + sizes[e];
    int rows = off[E];
    size_t nw = (size_t)E * K * M, nb = (size_t)E * M;
    float *x = mt_test_fnew((size_t)rows * K), *w = mt_test_fnew(nw), *b = mt_test_fnew(nb),
          *dout = mt_test_fnew((size_t)rows * M);
    mt_test_fill_normal(&rng, x, (size_t)rows * K, 1);
    mt_test_fill_normal(&rng, w, nw, 1);
    mt_test_fill_normal(&rng, b, nb, 1);
    mt_test_fill_normal(&rng, dout, (size_t)rows * M, 1);
    float *ref = mt_test_fnew((size_t)rows * M), *rdx = mt_test_fnew((size_t)rows * K);
    float *rdw = mt_test_fnew(nw), *rdb = mt_test_fnew(nb), *dx0 = mt_test_fnew((size_t)rows * K);
    mt_test_fill_normal(&rng, dx0, (size_t)rows * K, 1);
    for (size_t i = 0; i < nw; i++) rdw[i] = 0.5f; /* the gradients accumulate onto this */
    for (size_t i = 0; i < nb; i++) rdb[i] = 0.5f;
    for (int e = 0; e < E; e++)
        for (int r = off[e]; r < off[e + 1]; r++) {
            for (int j = 0; j < M; j++) {
                double s = b[(size_t)e * M + j];
                for (int i = 0; i < K; i++) s += (double)x[(size_t)r * K + i] * w[((size_t)e * K + i) * M + j];
                ref[(size_t)r * M + j] = (float)s;
            }
            for (int i = 0; i < K; i++) {
                double s = accumulate ? dx0[(size_t)r * K + i] : 0;
                for (int j = 0; j < M; j++) s += (double)dout[(size_t)r * M + j] * w[((size_t)e * K + i) * M + j];
                rdx[(size_t)r * K + i] = (float)s;
            }
        }
    for (int e = 0; e < E; e++)
        for (int i = 0; i < K; i++)
            for (int j = 0; j < M; j++) {
                double s = 0;
                for (int r = off[e]; r < off[e + 1]; r++) s += (double)x[(size_t)r * K + i] * dout[(size_t)r * M + j];
                if (off[e + 1] > off[e]) rdw[((size_t)e * K + i) * M + j] += (float)s;
            }
    for (int e = 0; e < E; e++)
        for (int j = 0; j < M; j++) {
            double s = 0;
            for (int r = off[e]; r < off[e + 1]; r++) s += dout[(size_t)r * M + j];
            if (off[e + 1] > off[e]) rdb[(size_t)e * M + j] += (float)s;
        }
    float *out = mt_test_fnew((size_t)rows * M), *dx = mt_test_fnew((size_t)rows * K), *dw = mt_test_fnew(nw),
          *db = mt_test_fnew(nb);
    mt_test_nan_fill(out, (size_t)rows * M);
    if (accumulate) memcpy(dx, dx0, (size_t)rows * K * sizeof(float));
    else mt_test_nan_fill(dx, (size_t)rows * K);
    for (size_t i = 0; i < nw; i++) dw[i] = 0.5f;
    for (size_t i = 0; i < nb; i++) db[i] = 0.5f;
    be->moe_matmul_io_forward(be, out, x, w, b, off, off, E, K, M);
    fprintf(stderr, "moe_matmul_io E=%d K=%d M=%d rows %d accumulate %d\n", E, K, M, rows, accumulate);
    assert_true(mt_allclose("moe_matmul_io_forward", out, ref, (size_t)rows * M, FWD_ATOL, FWD_RTOL));
    be->moe_matmul_io_backward(be, dx, dw, db, dout, x, w, off, off, E, K, M, accumulate);
    assert_true(mt_allclose("moe_matmul_io_backward dinp", dx, rdx, (size_t)rows * K, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("moe_matmul_io_backward dweight", dw, rdw, nw, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("moe_matmul_io_backward dbias", db, rdb, nb, BWD_ATOL, BWD_RTOL));
    for (int e = 0; e < E; e++) /* no rows: untouched, bit for bit */
        if (sizes[e] == 0)
            for (size_t i = 0; i < (size_t)K * M; i++) assert_true(dw[(size_t)e * K * M + i] == 0.5f);
    free(x), free(w), free(b), free(dout), free(ref), free(rdx), free(rdw), free(rdb), free(dx0);
    free(out), free(dx), free(dw), free(db);
}

static void test_moe_matmul_io(void **state) {
    static const int a[] = {3, 0, 5, 1}, c[] = {17, 9, 0};
    check_moe_io(4, a, 8, 16, 0, 4);  /* gate_up shape: C -> 2 Fe, an empty expert */
    check_moe_io(4, a, 16, 8, 1, 5);  /* down: Fe -> C, accumulating dinp */
    check_moe_io(3, c, 32, 12, 0, 6);
}

int main(void) {
    be = mt_backend_cpu_create();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_swiglu_clamped),
        cmocka_unit_test(test_moe_matmul_io),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    be->destroy(be);
    return rc;
}
