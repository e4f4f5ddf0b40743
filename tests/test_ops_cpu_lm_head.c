/* The fp32 CPU fused LM head + cross-entropy against a plain double-precision reference.
 *
 * losses: atol 1e-6 rtol 1e-5 against the double reference.
 * dinp, dweight: atol 1e-5 rtol 1e-4 against central finite differences (h = 1e-4, double) of
 * loss_scale * sum(losses) of the double reference (small shapes), or against the exact double
 * gradient loss_scale * (softmax - onehot) (the large shape). N is not a multiple of the chunk, so
 * the last chunk is ragged; ignored targets (< 0) must give loss 0 and exactly zero dinp rows.
 * dweight NULL (a frozen head): dinp bit for bit the full call's.
 */
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

/* ---------------- the double reference ---------------- */

typedef struct {
    double *x, *w, *losses, *dlogits; /* dlogits (N, V): the exact gradient of the logits */
    const int32_t *targets;
    int N, C, V;
    double scale;
} lm_ctx;

static void lm_ref(lm_ctx *c) {
    double *z = mt_test_dnew(c->V);
    for (int n = 0; n < c->N; n++) {
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < c->V; j++) {
            double s = 0;
            for (int i = 0; i < c->C; i++)
                s += c->x[(size_t)n * c->C + i] * c->w[(size_t)j * c->C + i];
            z[j] = s;
            if (s > mx) mx = s;
        }
        for (int j = 0; j < c->V; j++) sum += exp(z[j] - mx);
        double lse = mx + log(sum);
        int t = c->targets[n];
        c->losses[n] = t < 0 ? 0 : lse - z[t];
        for (int j = 0; j < c->V; j++)
            c->dlogits[(size_t)n * c->V + j] =
                t < 0 ? 0 : c->scale * (exp(z[j] - lse) - (j == t ? 1 : 0));
    }
    free(z);
}
static double lm_loss(void *p) {
    lm_ctx *c = p;
    lm_ref(c);
    double s = 0;
    for (int n = 0; n < c->N; n++) s += c->losses[n];
    return c->scale * s;
}

/* chunk > 0: the typed function with that chunk; chunk == 0: the backend entry (default chunk). */
static void lm_call(float *losses, float *dinp, float *dweight, const float *x, const float *w,
                    const int32_t *t, int N, int C, int V, float scale, int chunk) {
    if (chunk > 0)
        mt_cpu_lm_head_loss_chunked(losses, dinp, dweight, x, w, t, N, C, V, scale, chunk);
    else
        be->lm_head_loss(be, losses, dinp, dweight, x, w, t, N, C, V, scale);
}

static void check_lm_head(int N, int C, int V, int chunk, float scale, int fd, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    size_t nx = (size_t)N * C, nw = (size_t)V * C;
    float *x = mt_test_randn(&rng, nx, 1), *w = mt_test_randn(&rng, nw, 0.5f);
    int32_t *tg = malloc(N * sizeof *tg);
    for (int n = 0; n < N; n++) {
        uint64_t r = mt_test_rng_u64(&rng);
        tg[n] = r % 5 == 0 ? -100 : (int32_t)((r >> 8) % (uint64_t)V); /* ~20% ignored */
    }
    tg[0] = V - 1, tg[N - 1] = -1;
    lm_ctx c = {mt_test_to_double(x, nx), mt_test_to_double(w, nw), mt_test_dnew(N),
                mt_test_dnew((size_t)N * V), tg, N, C, V, scale};
    lm_ref(&c);
    float *ref_loss = mt_test_fnew(N);
    for (int n = 0; n < N; n++) ref_loss[n] = (float)c.losses[n];
    fprintf(stderr, "lm_head N=%d C=%d V=%d chunk=%d loss_scale=%g\n", N, C, V, chunk, scale);

    /* gradients */
    float *gx, *gw;
    if (fd) {
        gx = mt_test_fd_grad(lm_loss, &c, c.x, nx, FD_H);
        gw = mt_test_fd_grad(lm_loss, &c, c.w, nw, FD_H);
    } else { /* dinp = dlogits @ W, dW = dlogits^T @ X, in double */
        gx = mt_test_fnew(nx), gw = mt_test_fnew(nw);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < C; i++) {
                double s = 0;
                for (int j = 0; j < V; j++) s += c.dlogits[(size_t)n * V + j] * c.w[(size_t)j * C + i];
                gx[(size_t)n * C + i] = (float)s;
            }
        for (int j = 0; j < V; j++)
            for (int i = 0; i < C; i++) {
                double s = 0;
                for (int n = 0; n < N; n++) s += c.dlogits[(size_t)n * V + j] * c.x[(size_t)n * C + i];
                gw[(size_t)j * C + i] = (float)s;
            }
    }

    float *losses = mt_test_fnew(N), *dx = mt_test_fnew(nx), *pre_w = mt_test_randn(&rng, nw, 1),
          *dw = mt_test_copyf(pre_w, nw);
    mt_test_nan_fill(losses, N), mt_test_nan_fill(dx, nx);
    lm_call(losses, dx, dw, x, w, tg, N, C, V, scale, chunk);
    float *want_w = mt_test_plus(pre_w, gw, 1, nw);
    assert_true(mt_allclose("lm_head losses", losses, ref_loss, N, FWD_ATOL, FWD_RTOL));
    assert_true(mt_allclose("lm_head dinp (=)", dx, gx, nx, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("lm_head dweight (+=)", dw, want_w, nw, BWD_ATOL, BWD_RTOL));
    for (int n = 0; n < N; n++) {
        if (tg[n] >= 0) continue;
        assert_true(losses[n] == 0.0f);
        for (int i = 0; i < C; i++) assert_true(dx[(size_t)n * C + i] == 0.0f);
    }

    /* again: dinp written (same values), dweight accumulated */
    mt_test_nan_fill(dx, nx);
    lm_call(losses, dx, dw, x, w, tg, N, C, V, scale, chunk);
    float *want_w2 = mt_test_plus(pre_w, gw, 2, nw);
    assert_true(mt_allclose("lm_head dinp second call", dx, gx, nx, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("lm_head dweight twice", dw, want_w2, nw, BWD_ATOL, BWD_RTOL));

    /* losses only: dweight must stay as it is */
    float *dw_before = mt_test_copyf(dw, nw);
    mt_test_nan_fill(losses, N);
    lm_call(losses, NULL, dw, x, w, tg, N, C, V, scale, chunk);
    assert_true(mt_allclose("lm_head losses (no backward)", losses, ref_loss, N, FWD_ATOL, FWD_RTOL));
    assert_memory_equal(dw, dw_before, nw * sizeof(float));

    /* dinp without dweight (a frozen head): the same bits as with it */
    float *dx_full = mt_test_copyf(dx, nx); /* the second call's dinp, dweight given */
    mt_test_nan_fill(dx, nx);
    lm_call(losses, dx, NULL, x, w, tg, N, C, V, scale, chunk);
    assert_true(mt_allclose("lm_head dinp (dweight NULL)", dx, gx, nx, BWD_ATOL, BWD_RTOL));
    assert_memory_equal(dx, dx_full, nx * sizeof(float));
    free(dx_full);

    free(x), free(w), free(tg), free(c.x), free(c.w), free(c.losses), free(c.dlogits);
    free(ref_loss), free(gx), free(gw), free(losses), free(dx), free(pre_w), free(dw);
    free(want_w), free(want_w2), free(dw_before);
}

static void test_lm_head_chunks(void **state) {
    check_lm_head(37, 24, 37, 16, 1.0f, 1, 1);        /* chunks of 16, 16, 5 */
    check_lm_head(37, 24, 37, 0, 1.0f / 29, 1, 2);    /* the backend entry: one chunk */
    check_lm_head(5, 8, 11, 1, 3.0f, 1, 3);           /* chunk of one row; loss_scale 3 */
}

static void test_lm_head_large(void **state) {
    /* above the parallel threshold, two chunks (256 + 44) through the backend entry */
    check_lm_head(300, 16, 600, 0, 1.0f / 300, 0, 4);
}

/* loss_scale scales the gradients and nothing else. */
static void test_lm_head_loss_scale(void **state) {
    enum { N = 9, C = 8, V = 13 };
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 5);
    float *x = mt_test_randn(&rng, N * C, 1), *w = mt_test_randn(&rng, V * C, 1);
    int32_t tg[N] = {0, 3, -1, 12, 5, 5, -7, 1, 2};
    float l1[N], l2[N], dx1[N * C], dx2[N * C], dw1[V * C] = {0}, dw2[V * C] = {0};
    be->lm_head_loss(be, l1, dx1, dw1, x, w, tg, N, C, V, 1.0f);
    be->lm_head_loss(be, l2, dx2, dw2, x, w, tg, N, C, V, 0.25f);
    assert_memory_equal(l1, l2, sizeof l1);
    for (int i = 0; i < N * C; i++) dx1[i] *= 0.25f; /* a power of two: exact */
    for (int i = 0; i < V * C; i++) dw1[i] *= 0.25f;
    assert_true(mt_allclose("loss_scale 0.25: dinp", dx2, dx1, N * C, FWD_ATOL, FWD_RTOL));
    assert_true(mt_allclose("loss_scale 0.25: dweight", dw2, dw1, V * C, FWD_ATOL, FWD_RTOL));
    free(x), free(w);
}

int main(void) {
    be = mt_backend_cpu_create();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lm_head_chunks),
        cmocka_unit_test(test_lm_head_large),
        cmocka_unit_test(test_lm_head_loss_scale),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    be->destroy(be);
    return rc;
}
