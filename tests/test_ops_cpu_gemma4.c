/* Gemma 4's own CPU ops against plain double-precision references:
 *  - rmsnorm_* with weight NULL (the v-norm: no weight): forward against the double formula, the
 *    backward against the exact double gradient, (=) and (+=); and bit for bit the weighted op with
 *    a weight of ones (the same arithmetic, a multiply by 1 dropped);
 *  - softcap: x = cap * tanh(x / cap) against the double formula, values past the cap included;
 *  - scale_by: out = x * s[0] exactly, in place too;
 *  - lm_head_loss_softcap: losses against the double reference (logits capped first), dinp and
 *    dweight against the exact double gradient loss_scale * (softmax(l) - onehot) * (1 - (l/cap)^2)
 *    with l = cap * tanh(z / cap) and against central finite differences of the double loss (small
 *    shape); chunk seams (a ragged last chunk), ignored targets (loss 0, zero dinp rows), dweight
 *    NULL (dinp bit for bit), and cap 0 bit for bit the plain lm_head_loss;
 *  - moe_expert_scale_*: the gates times per_expert_scale[idx] exactly, the backward's d_w exactly
 *    and d_scale (+=) against a double sum over each expert's assignments, NULL skipped.
 * Tolerances as tests/test_ops_cpu.c: forward atol 1e-6 rtol 1e-5, backward atol 1e-5 rtol 1e-4. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "util/cpu_op_tol.h"
#include "util/host_buffers.h"
#include "util/testutil.h"

static mt_backend *be;

static void check_rmsnorm_unweighted(int R, int C, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    size_t n = (size_t)R * C;
    float *x = mt_test_randn(&rng, n, 2), *dy = mt_test_randn(&rng, n, 1), *ones = mt_test_fnew(C);
    for (int c = 0; c < C; c++) ones[c] = 1.0f;
    const float eps = 1e-6f;
    float *ref = mt_test_fnew(n), *rdx = mt_test_fnew(n);
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)r * C, *dyr = dy + (size_t)r * C;
        double ss = 0, dot = 0;
        for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c], dot += (double)dyr[c] * xr[c];
        double s = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++) {
            ref[(size_t)r * C + c] = (float)(xr[c] * s);
            rdx[(size_t)r * C + c] = (float)(s * dyr[c] - xr[c] * s * s * s * dot / C);
        }
    }
    float *y = mt_test_fnew(n), *y1 = mt_test_fnew(n), *rstd = mt_test_fnew(R), *rstd1 = mt_test_fnew(R),
          *dx = mt_test_fnew(n), *dx1 = mt_test_fnew(n);
    float *dw = calloc((size_t)C, sizeof(float));
    mt_test_nan_fill(y, n), mt_test_nan_fill(dx, n);
    be->rmsnorm_forward(be, y, rstd, x, NULL, R, C, eps, 0);
    assert_true(mt_allclose("rmsnorm unweighted forward", y, ref, n, FWD_ATOL, FWD_RTOL));
    be->rmsnorm_forward(be, y1, rstd1, x, ones, R, C, eps, 0);
    assert_memory_equal(y, y1, n * sizeof(float)); /* the weighted op with w = 1 */
    assert_memory_equal(rstd, rstd1, (size_t)R * sizeof(float));
    be->rmsnorm_backward(be, dx, NULL, dy, x, NULL, rstd, R, C, 0, 0);
    assert_true(mt_allclose("rmsnorm unweighted backward", dx, rdx, n, BWD_ATOL, BWD_RTOL));
    be->rmsnorm_backward(be, dx1, dw, dy, x, ones, rstd, R, C, 0, 0);
    assert_memory_equal(dx, dx1, n * sizeof(float));
    /* accumulate: dx += the same again; dweight ignored with weight NULL */
    float *twice = mt_test_fnew(n);
    for (size_t i = 0; i < n; i++) twice[i] = dx[i] + dx[i];
    be->rmsnorm_backward(be, dx, dw, dy, x, NULL, rstd, R, C, 1, 0);
    assert_memory_equal(dx, twice, n * sizeof(float));
    free(x), free(dy), free(ones), free(ref), free(rdx), free(y), free(y1), free(rstd), free(rstd1);
    free(dx), free(dx1), free(dw), free(twice);
}

static void test_rmsnorm_unweighted(void **state) {
    (void)state;
    check_rmsnorm_unweighted(1, 8, 1);
    check_rmsnorm_unweighted(37, 16, 2);
    check_rmsnorm_unweighted(2048, 32, 3); /* past the parallel threshold */
}

static void test_softcap_scale_by(void **state) {
    (void)state;
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 4);
    const size_t n = 70000; /* past the parallel threshold */
    const float cap = 2.5f;
    float *x = mt_test_randn(&rng, n, 4), *ref = mt_test_fnew(n), *y = mt_test_fnew(n);
    x[0] = 0, x[1] = 1e4f, x[2] = -1e4f; /* saturated both ways */
    for (size_t i = 0; i < n; i++) ref[i] = (float)(cap * tanh((double)x[i] / cap));
    memcpy(y, x, n * sizeof(float));
    be->softcap(be, y, cap, n);
    assert_true(mt_allclose("softcap", y, ref, n, FWD_ATOL, FWD_RTOL));
    assert_true(y[1] == cap && y[2] == -cap && y[0] == 0);
    const float s = 0.8419989f;
    float *out = mt_test_fnew(n);
    be->scale_by(be, out, x, &s, n);
    for (size_t i = 0; i < n; i++) ref[i] = x[i] * s;
    assert_memory_equal(out, ref, n * sizeof(float));
    be->scale_by(be, x, x, &s, n); /* in place */
    assert_memory_equal(x, ref, n * sizeof(float));
    free(x), free(ref), free(y), free(out);
}

/* The double reference of the soft-capped head: loss_scale * sum of the per-row losses, and its exact
 * gradients. */
typedef struct {
    const float *inp, *w;
    const int32_t *tgt;
    int N, C, V;
    float scale, cap;
} head_case;

static double head_loss(const head_case *h, const double *inp, const double *w, double *losses,
                        double *dinp, double *dw) {
    int N = h->N, C = h->C, V = h->V;
    double total = 0, *l = malloc((size_t)V * sizeof(double));
    if (dinp) memset(dinp, 0, (size_t)N * C * sizeof(double));
    if (dw) memset(dw, 0, (size_t)V * C * sizeof(double));
    for (int n = 0; n < N; n++) {
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) {
            double z = 0;
            for (int c = 0; c < C; c++) z += inp[(size_t)n * C + c] * w[(size_t)v * C + c];
            l[v] = h->cap * tanh(z / h->cap);
            mx = fmax(mx, l[v]);
        }
        for (int v = 0; v < V; v++) sum += exp(l[v] - mx);
        int t = h->tgt[n];
        double loss = t >= 0 ? mx + log(sum) - l[t] : 0;
        if (losses) losses[n] = loss;
        total += loss;
        if (!dinp || t < 0) continue;
        for (int v = 0; v < V; v++) {
            double g = h->scale * (exp(l[v] - mx) / sum - (v == t)) * (1 - (l[v] / h->cap) * (l[v] / h->cap));
            for (int c = 0; c < C; c++) {
                dinp[(size_t)n * C + c] += g * w[(size_t)v * C + c];
                dw[(size_t)v * C + c] += g * inp[(size_t)n * C + c];
            }
        }
    }
    free(l);
    return h->scale * total;
}

static void check_head(int N, int C, int V, int chunk, float cap, int fd, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    float *inp = mt_test_randn(&rng, (size_t)N * C, 1), *w = mt_test_randn(&rng, (size_t)V * C, 1.5f);
    int32_t *tgt = malloc((size_t)N * sizeof(int32_t));
    for (int n = 0; n < N; n++) tgt[n] = n % 5 == 3 ? -100 : (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)V);
    head_case h = {inp, w, tgt, N, C, V, 0.37f, cap};
    double *di = malloc((size_t)N * C * sizeof(double)), *dwv = malloc((size_t)V * C * sizeof(double));
    for (size_t i = 0; i < (size_t)N * C; i++) di[i] = inp[i];
    for (size_t i = 0; i < (size_t)V * C; i++) dwv[i] = w[i];
    double *rl = malloc((size_t)N * sizeof(double)), *rdi = malloc((size_t)N * C * sizeof(double));
    double *rdw = malloc((size_t)V * C * sizeof(double));
    head_loss(&h, di, dwv, rl, rdi, rdw);
    float *ref_l = mt_test_to_float(rl, N), *ref_di = mt_test_to_float(rdi, (size_t)N * C),
          *ref_dw = mt_test_to_float(rdw, (size_t)V * C);
    float *losses = mt_test_fnew(N), *dinp = mt_test_fnew((size_t)N * C),
          *dw = calloc((size_t)V * C, sizeof(float));
    mt_test_nan_fill(losses, N), mt_test_nan_fill(dinp, (size_t)N * C);
    mt_cpu_lm_head_loss_softcap_chunked(losses, dinp, dw, inp, w, tgt, N, C, V, h.scale, cap, chunk);
    assert_true(mt_allclose("softcap head losses", losses, ref_l, N, FWD_ATOL, FWD_RTOL));
    assert_true(mt_allclose("softcap head dinp", dinp, ref_di, (size_t)N * C, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("softcap head dweight", dw, ref_dw, (size_t)V * C, BWD_ATOL, BWD_RTOL));
    for (int n = 0; n < N; n++)
        if (tgt[n] < 0) {
            assert_true(losses[n] == 0);
            for (int c = 0; c < C; c++) assert_true(dinp[(size_t)n * C + c] == 0);
        }
    if (fd) { /* the exact gradient above against central differences of the double loss */
        float *fdi = mt_test_fnew((size_t)N * C);
        for (size_t i = 0; i < (size_t)N * C; i++) {
            double save = di[i];
            di[i] = save + FD_H;
            double lp = head_loss(&h, di, dwv, NULL, NULL, NULL);
            di[i] = save - FD_H;
            double lm = head_loss(&h, di, dwv, NULL, NULL, NULL);
            di[i] = save;
            fdi[i] = (float)((lp - lm) / (2 * FD_H));
        }
        assert_true(mt_allclose("softcap head dinp vs finite differences", dinp, fdi, (size_t)N * C,
                                BWD_ATOL, BWD_RTOL));
        free(fdi);
    }
    /* the backend's op (its own chunk), dweight NULL: the same dinp bits */
    float *l2 = mt_test_fnew(N), *d2 = mt_test_fnew((size_t)N * C);
    be->lm_head_loss_softcap(be, l2, d2, NULL, inp, w, tgt, N, C, V, h.scale, cap);
    float *l3 = mt_test_fnew(N), *d3 = mt_test_fnew((size_t)N * C);
    mt_cpu_lm_head_loss_softcap(l3, d3, dw, inp, w, tgt, N, C, V, h.scale, cap);
    assert_memory_equal(d2, d3, (size_t)N * C * sizeof(float));
    assert_memory_equal(l2, l3, (size_t)N * sizeof(float));
    /* cap 0 is the plain op, bit for bit */
    mt_cpu_lm_head_loss_softcap_chunked(l2, d2, NULL, inp, w, tgt, N, C, V, h.scale, 0.0f, chunk);
    mt_cpu_lm_head_loss_chunked(l3, d3, NULL, inp, w, tgt, N, C, V, h.scale, chunk);
    assert_memory_equal(d2, d3, (size_t)N * C * sizeof(float));
    assert_memory_equal(l2, l3, (size_t)N * sizeof(float));
    free(inp), free(w), free(tgt), free(di), free(dwv), free(rl), free(rdi), free(rdw), free(ref_l);
    free(ref_di), free(ref_dw), free(losses), free(dinp), free(dw), free(l2), free(d2), free(l3), free(d3);
}

static void test_lm_head_loss_softcap(void **state) {
    (void)state;
    check_head(7, 5, 11, 3, 2.0f, 1, 5);      /* ragged chunks, finite differences */
    check_head(300, 16, 97, 256, 30.0f, 0, 6); /* Gemma 4's cap: barely bends */
    check_head(50, 8, 64, 16, 0.5f, 0, 7);     /* saturated */
}

static void test_moe_expert_scale(void **state) {
    (void)state;
    enum { n = 37, k = 3, E = 5 };
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 8);
    float w[n * k], d_out[n * k], scale[E], got[n * k], d_w[n * k], d_scale[E], want_ds[E];
    int32_t idx[n * k];
    mt_test_fill_normal(&rng, w, n * k, 1);
    mt_test_fill_normal(&rng, d_out, n * k, 1);
    mt_test_fill_normal(&rng, scale, E, 1);
    for (int a = 0; a < n * k; a++) idx[a] = (int32_t)(mt_test_rng_u64(&rng) % E);
    be->moe_expert_scale_forward(be, got, w, idx, scale, n, k);
    for (int a = 0; a < n * k; a++) assert_true(got[a] == w[a] * scale[idx[a]]);
    double acc[E] = {0};
    for (int e = 0; e < E; e++) d_scale[e] = 0.5f, acc[e] = 0.5;
    for (int a = 0; a < n * k; a++) acc[idx[a]] += (double)d_out[a] * w[a];
    for (int e = 0; e < E; e++) want_ds[e] = (float)acc[e];
    be->moe_expert_scale_backward(be, d_w, d_scale, d_out, w, idx, scale, n, k);
    for (int a = 0; a < n * k; a++) assert_true(d_w[a] == d_out[a] * scale[idx[a]]);
    assert_true(mt_allclose("per_expert_scale gradient", d_scale, want_ds, E, BWD_ATOL, BWD_RTOL));
    float d_w2[n * k];
    be->moe_expert_scale_backward(be, d_w2, NULL, d_out, w, idx, scale, n, k); /* frozen: skipped */
    assert_memory_equal(d_w2, d_w, sizeof d_w);
}

int main(void) {
    be = mt_backend_cpu_create();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm_unweighted),
        cmocka_unit_test(test_softcap_scale_by),
        cmocka_unit_test(test_lm_head_loss_softcap),
        cmocka_unit_test(test_moe_expert_scale),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    be->destroy(be);
    return rc;
}
