/* The fp32 CPU ops against plain double-precision references: embedding, RMSNorm, matmul, RoPE,
 * SwiGLU, add, and the backend's memory calls. (Attention and the LM head have their own files.)
 *
 * from_bf16 (exact widening) and optim_update (the optimizer state's own update on its arenas)
 * are compared bit for bit.
 *
 * Forward: fp32 op vs the double reference, atol 1e-6 rtol 1e-5.
 * Backward: fp32 op vs central finite differences (h = 1e-4, in double, error ~1e-9) of the double
 * reference for the scalar sum(out * Rw), Rw random; atol 1e-5 rtol 1e-4. Outputs written (=) are
 * poisoned with NaN first; outputs accumulated (+=) are pre-filled and the fill is added to the
 * reference. The odd sizes and the "large" cases reach the parallel paths and the block seams.
 * A NULL weight gradient (a frozen weight) is skipped: dinp is bit for bit the full call's.
 * matmul_forward_add against matmul_forward + add (1e-6 relative; BLAS may sum beta*C in another
 * place) and the double reference; scale bit for bit against the fp32 product.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "optim/state.h"
#include "util/cpu_op_tol.h"
#include "util/host_buffers.h"
#include "util/testutil.h"

static mt_backend *be;

/* Gradient of loss(ctx) with respect to the n doubles at x, by central differences. */
static double dot(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ---------------- memory ---------------- */

static void test_memory(void **state) {
    size_t n = 1000;
    float *p = be->alloc(be, n * sizeof(float));
    assert_true(((uintptr_t)p & 63) == 0);
    float *host = mt_test_fnew(n), *back = mt_test_fnew(n);
    for (size_t i = 0; i < n; i++) host[i] = (float)i;
    be->upload(be, p, host, n * sizeof(float));
    be->sync(be);
    be->download(be, back, p, n * sizeof(float));
    assert_memory_equal(host, back, n * sizeof(float));
    be->zero(be, p, n * sizeof(float));
    be->download(be, back, p, n * sizeof(float));
    for (size_t i = 0; i < n; i++) assert_true(back[i] == 0.0f);
    /* the copy streams: H2D then D2H, ordered by events */
    float *hbuf = be->host_alloc(be, n * sizeof(float));
    mt_event *ev = be->event_create(be);
    for (size_t i = 0; i < n; i++) host[i] = (float)(2 * i);
    be->copy_async(be, MT_STREAM_H2D, p, host, n * sizeof(float));
    be->event_record(be, ev, MT_STREAM_H2D);
    be->stream_wait(be, MT_STREAM_D2H, ev);
    be->copy_async(be, MT_STREAM_D2H, hbuf, p, n * sizeof(float));
    be->sync(be);
    assert_memory_equal(host, hbuf, n * sizeof(float));
    be->event_destroy(be, ev);
    be->host_free(be, hbuf);
    be->free(be, p);
    assert_string_equal(be->name, "cpu");
    assert_int_equal(be->dtype, MT_F32);
    free(host);
    free(back);
}

/* ---------------- embedding ---------------- */

typedef struct {
    const int32_t *ids;
    double *table, *Rw;
    int N, C;
} emb_ctx;

static double emb_loss(void *p) {
    emb_ctx *c = p;
    double s = 0;
    for (int n = 0; n < c->N; n++)
        s += dot(c->table + (size_t)c->ids[n] * c->C, c->Rw + (size_t)n * c->C, c->C);
    return s;
}

static void check_embedding(int N, int C, int V, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    int32_t *ids = malloc(N * sizeof *ids);
    for (int n = 0; n < N; n++) ids[n] = (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)V);
    ids[N - 1] = ids[0]; /* at least one repeat */
    float *table = mt_test_randn(&rng, (size_t)V * C, 1), *out = mt_test_fnew((size_t)N * C);
    float *ref = mt_test_fnew((size_t)N * C);
    for (int n = 0; n < N; n++) memcpy(ref + (size_t)n * C, table + (size_t)ids[n] * C, C * 4);
    mt_test_nan_fill(out, (size_t)N * C);
    be->embedding_forward(be, out, ids, table, N, C);
    assert_memory_equal(out, ref, (size_t)N * C * sizeof(float)); /* a copy: exact */

    float *Rw = mt_test_randn(&rng, (size_t)N * C, 1), *prefill = mt_test_randn(&rng, (size_t)V * C, 1);
    emb_ctx c = {ids, mt_test_to_double(table, (size_t)V * C), mt_test_to_double(Rw, (size_t)N * C), N, C};
    float *g = mt_test_fd_grad(emb_loss, &c, c.table, (size_t)V * C, FD_H);
    float *dtable = mt_test_copyf(prefill, (size_t)V * C);
    be->embedding_backward(be, dtable, Rw, ids, N, C);
    float *want = mt_test_plus(prefill, g, 1, (size_t)V * C);
    assert_true(mt_allclose("embedding_backward dtable (+=)", dtable, want, (size_t)V * C, BWD_ATOL,
                            BWD_RTOL));
    be->embedding_backward(be, dtable, Rw, ids, N, C);
    float *want2 = mt_test_plus(prefill, g, 2, (size_t)V * C);
    assert_true(mt_allclose("embedding_backward twice", dtable, want2, (size_t)V * C, BWD_ATOL,
                            BWD_RTOL));
    free(ids), free(table), free(out), free(ref), free(Rw), free(prefill), free(c.table);
    free(c.Rw), free(g), free(dtable), free(want), free(want2);
}

static void test_embedding(void **state) {
    check_embedding(13, 24, 5, 1);   /* many repeats */
    check_embedding(700, 150, 11, 2); /* parallel path, column blocks with a ragged last one */
}

/* ---------------- RMSNorm ---------------- */

typedef struct {
    double *x, *w, *Rw, *out, *rstd;
    int R, C;
    double eps, offset; /* offset 1: the (1 + w) norm */
} rms_ctx;

static void rms_ref(rms_ctx *c) {
    for (int r = 0; r < c->R; r++) {
        const double *x = c->x + (size_t)r * c->C;
        double ms = dot(x, x, c->C) / c->C;
        double s = 1.0 / sqrt(ms + c->eps);
        c->rstd[r] = s;
        for (int i = 0; i < c->C; i++) c->out[(size_t)r * c->C + i] = x[i] * s * (c->w[i] + c->offset);
    }
}
static double rms_loss(void *p) {
    rms_ctx *c = p;
    rms_ref(c);
    return dot(c->out, c->Rw, (size_t)c->R * c->C);
}

static void check_rmsnorm(int R, int C, float eps, uint64_t seed, float offset) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    size_t n = (size_t)R * C;
    float *x = mt_test_randn(&rng, n, 1), *w = mt_test_randn(&rng, C, 1), *Rw = mt_test_randn(&rng, n, 1);
    x[0] = 1e-3f; /* a small element and (below) a small row */
    if (R > 2)
        for (int i = 0; i < C; i++) x[(size_t)2 * C + i] *= 0.05f;
    rms_ctx c = {mt_test_to_double(x, n), mt_test_to_double(w, C), mt_test_to_double(Rw, n), mt_test_dnew(n),
                 mt_test_dnew(R), R, C, eps, offset};
    rms_ref(&c);
    float *out = mt_test_fnew(n), *rstd = mt_test_fnew(R);
    mt_test_nan_fill(out, n), mt_test_nan_fill(rstd, R);
    be->rmsnorm_forward(be, out, rstd, x, w, R, C, eps, offset);
    float *ref_out = mt_test_to_float(c.out, n), *ref_rstd = mt_test_to_float(c.rstd, R);
    assert_true(mt_allclose("rmsnorm_forward out", out, ref_out, n, FWD_ATOL, FWD_RTOL));
    assert_true(mt_allclose("rmsnorm_forward rstd", rstd, ref_rstd, R, FWD_ATOL, FWD_RTOL));

    float *gx = mt_test_fd_grad(rms_loss, &c, c.x, n, FD_H),
          *gw = mt_test_fd_grad(rms_loss, &c, c.w, C, FD_H);
    float *dx = mt_test_fnew(n), *pre_w = mt_test_randn(&rng, C, 1), *dw = mt_test_copyf(pre_w, C);
    mt_test_nan_fill(dx, n);
    be->rmsnorm_backward(be, dx, dw, Rw, x, w, rstd, R, C, 0, offset);
    float *want_w = mt_test_plus(pre_w, gw, 1, C);
    assert_true(mt_allclose("rmsnorm_backward dinp (=)", dx, gx, n, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("rmsnorm_backward dweight (+=)", dw, want_w, C, BWD_ATOL, BWD_RTOL));

    float *pre_x = mt_test_randn(&rng, n, 1);
    memcpy(dx, pre_x, n * 4);
    be->rmsnorm_backward(be, dx, dw, Rw, x, w, rstd, R, C, 1, offset);
    float *want_x = mt_test_plus(pre_x, gx, 1, n), *want_w2 = mt_test_plus(pre_w, gw, 2, C);
    assert_true(mt_allclose("rmsnorm_backward dinp (+=)", dx, want_x, n, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("rmsnorm_backward dweight twice", dw, want_w2, C, BWD_ATOL, BWD_RTOL));

    /* dinp NULL: only dweight */
    be->rmsnorm_backward(be, NULL, dw, Rw, x, w, rstd, R, C, 0, offset);
    float *want_w3 = mt_test_plus(pre_w, gw, 3, C);
    assert_true(mt_allclose("rmsnorm_backward dinp NULL", dw, want_w3, C, BWD_ATOL, BWD_RTOL));

    /* dweight NULL (a frozen norm): dinp the same bits as with dweight, = and += */
    for (int acc = 0; acc <= 1; acc++) {
        float *full = mt_test_copyf(pre_x, n), *frozen = mt_test_copyf(pre_x, n),
              *dw_any = mt_test_copyf(pre_w, C);
        be->rmsnorm_backward(be, full, dw_any, Rw, x, w, rstd, R, C, acc, offset);
        be->rmsnorm_backward(be, frozen, NULL, Rw, x, w, rstd, R, C, acc, offset);
        assert_memory_equal(frozen, full, n * sizeof(float));
        free(full), free(frozen), free(dw_any);
    }

    free(x), free(w), free(Rw), free(c.x), free(c.w), free(c.Rw), free(c.out), free(c.rstd);
    free(out), free(rstd), free(ref_out), free(ref_rstd), free(gx), free(gw), free(dx);
    free(pre_w), free(dw), free(want_w), free(pre_x), free(want_x), free(want_w2), free(want_w3);
}

static void test_rmsnorm(void **state) {
    check_rmsnorm(7, 24, 1e-5f, 3, 0.0f);
    check_rmsnorm(7, 24, 0.5f, 4, 0.0f); /* an eps that matters */
    check_rmsnorm(1, 5, 1e-6f, 5, 0.0f);
    check_rmsnorm(33, 520, 1e-6f, 6, 0.0f); /* above the parallel threshold: per-thread dweight partials */
    check_rmsnorm(7, 24, 1e-6f, 13, 1.0f);  /* qwen3_5's (1 + w) */
    check_rmsnorm(33, 520, 1e-6f, 14, 1.0f);
}

/* ---------------- matmul ---------------- */

typedef struct {
    double *x, *w, *bias, *Rw, *out;
    int R, K, M;
} mm_ctx;

static void mm_ref(mm_ctx *c) {
    for (int r = 0; r < c->R; r++)
        for (int m = 0; m < c->M; m++)
            c->out[(size_t)r * c->M + m] =
                dot(c->x + (size_t)r * c->K, c->w + (size_t)m * c->K, c->K) +
                (c->bias ? c->bias[m] : 0);
}
static double mm_loss(void *p) {
    mm_ctx *c = p;
    mm_ref(c);
    return dot(c->out, c->Rw, (size_t)c->R * c->M);
}

/* The forward against the double reference: |got - ref| <= FWD_ATOL + FWD_RTOL |ref|, or, where
 * the sum cancels, within the deterministic bound of fp32 summation, (K + 1) u (sum_k |x_k w_k| +
 * |b|) with u = 2^-24. The relative bound alone failed on CI (2026-12-05): one of 79430 elements of
 * the 611 x 20 x 130 case, -0.00754213 against -0.00754094 (1.19e-6 > 1.08e-6), a near-zero sum of
 * 21 O(1) terms, whose rounding no fp32 sgemm can avoid; a wrong product or a missing term is far
 * outside either bound. */
static int mm_forward_close(const char *what, const float *got, const mm_ctx *c) {
    int bad = 0;
    double worst = 0;
    for (int r = 0; r < c->R; r++)
        for (int m = 0; m < c->M; m++) {
            size_t i = (size_t)r * c->M + m;
            double mag = c->bias ? fabs(c->bias[m]) : 0;
            for (int k = 0; k < c->K; k++) mag += fabs(c->x[(size_t)r * c->K + k] * c->w[(size_t)m * c->K + k]);
            double ref = c->out[i], err = fabs((double)got[i] - ref);
            double tol = fmax(FWD_ATOL + FWD_RTOL * fabs(ref), (c->K + 1) * 0x1p-24 * mag);
            if (err / tol > worst) worst = err / tol;
            if (!(err <= tol)) {
                if (bad < 5) fprintf(stderr, "  %s[%zu]: got %.9g ref %.9g err %.3g tol %.3g\n", what, i, got[i], ref, err, tol);
                bad++;
            }
        }
    fprintf(stderr, "%-40s n=%-6d worst %.1f%% of tol%s\n", what, c->R * c->M, 100 * worst, bad ? "  FAIL" : "");
    return bad == 0;
}

/* fd = 0: large shapes, checked against the exact double gradients with atol 1e-4, because a
 * dweight entry sums R = 611 products of O(1) and is O(25): fp32 rounding alone reaches ~1e-5. */
static void check_matmul(int R, int K, int M, int with_bias, int fd, uint64_t seed) {
    double BATOL = fd ? BWD_ATOL : 1e-4;
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    size_t nx = (size_t)R * K, nw = (size_t)M * K, no = (size_t)R * M;
    float *x = mt_test_randn(&rng, nx, 1), *w = mt_test_randn(&rng, nw, 1), *b = mt_test_randn(&rng, M, 1);
    float *Rw = mt_test_randn(&rng, no, 1);
    mm_ctx c = {mt_test_to_double(x, nx), mt_test_to_double(w, nw),
                with_bias ? mt_test_to_double(b, M) : NULL, mt_test_to_double(Rw, no),
                mt_test_dnew(no), R, K, M};
    mm_ref(&c);
    float *out = mt_test_fnew(no), *ref = mt_test_to_float(c.out, no);
    mt_test_nan_fill(out, no);
    be->matmul_forward(be, out, x, w, with_bias ? b : NULL, R, K, M);
    assert_true(mm_forward_close(with_bias ? "matmul_forward (bias)" : "matmul_forward", out, &c));

    /* gradients: finite differences for small shapes, the exact double formulas for large ones */
    float *gx, *gw, *gb = mt_test_fnew(M);
    if (fd) {
        gx = mt_test_fd_grad(mm_loss, &c, c.x, nx, FD_H);
        gw = mt_test_fd_grad(mm_loss, &c, c.w, nw, FD_H);
    } else {
        double *ax = mt_test_dnew(nx), *aw = mt_test_dnew(nw);
        for (int r = 0; r < R; r++)
            for (int k = 0; k < K; k++) {
                double s = 0;
                for (int m = 0; m < M; m++) s += c.Rw[(size_t)r * M + m] * c.w[(size_t)m * K + k];
                ax[(size_t)r * K + k] = s;
            }
        for (int m = 0; m < M; m++)
            for (int k = 0; k < K; k++) {
                double s = 0;
                for (int r = 0; r < R; r++) s += c.Rw[(size_t)r * M + m] * c.x[(size_t)r * K + k];
                aw[(size_t)m * K + k] = s;
            }
        gx = mt_test_to_float(ax, nx), gw = mt_test_to_float(aw, nw);
        free(ax), free(aw);
    }
    for (int m = 0; m < M; m++) {
        double s = 0;
        for (int r = 0; r < R; r++) s += c.Rw[(size_t)r * M + m];
        gb[m] = (float)s;
    }
    float *dx = mt_test_fnew(nx), *pre_w = mt_test_randn(&rng, nw, 1), *pre_b = mt_test_randn(&rng, M, 1);
    float *dw = mt_test_copyf(pre_w, nw), *db = mt_test_copyf(pre_b, M);
    mt_test_nan_fill(dx, nx);
    be->matmul_backward(be, dx, dw, db, Rw, x, w, R, K, M, 0);
    float *want_w = mt_test_plus(pre_w, gw, 1, nw), *want_b = mt_test_plus(pre_b, gb, 1, M);
    assert_true(mt_allclose("matmul_backward dinp (=)", dx, gx, nx, BATOL, BWD_RTOL));
    assert_true(mt_allclose("matmul_backward dweight (+=)", dw, want_w, nw, BATOL, BWD_RTOL));
    assert_true(mt_allclose("matmul_backward dbias (+=)", db, want_b, M, BATOL, BWD_RTOL));

    float *pre_x = mt_test_randn(&rng, nx, 1);
    memcpy(dx, pre_x, nx * 4);
    be->matmul_backward(be, dx, dw, db, Rw, x, w, R, K, M, 1);
    float *want_x = mt_test_plus(pre_x, gx, 1, nx), *want_w2 = mt_test_plus(pre_w, gw, 2, nw);
    float *want_b2 = mt_test_plus(pre_b, gb, 2, M);
    assert_true(mt_allclose("matmul_backward dinp (+=)", dx, want_x, nx, BATOL, BWD_RTOL));
    assert_true(mt_allclose("matmul_backward dweight twice", dw, want_w2, nw, BATOL, BWD_RTOL));
    assert_true(mt_allclose("matmul_backward dbias twice", db, want_b2, M, BATOL, BWD_RTOL));

    /* NULL outputs are skipped: only dinp, then only dbias */
    mt_test_nan_fill(dx, nx);
    float *dw_before = mt_test_copyf(dw, nw);
    be->matmul_backward(be, dx, NULL, NULL, Rw, x, w, R, K, M, 0);
    assert_true(mt_allclose("matmul_backward dinp only", dx, gx, nx, BATOL, BWD_RTOL));
    be->matmul_backward(be, NULL, NULL, db, Rw, x, w, R, K, M, 0);
    float *want_b3 = mt_test_plus(pre_b, gb, 3, M);
    assert_true(mt_allclose("matmul_backward dbias only", db, want_b3, M, BATOL, BWD_RTOL));
    assert_memory_equal(dw, dw_before, nw * sizeof(float)); /* dweight untouched */

    free(x), free(w), free(b), free(Rw), free(c.x), free(c.w), free(c.bias), free(c.Rw);
    free(c.out), free(out), free(ref), free(gx), free(gw), free(gb), free(dx), free(pre_w);
    free(pre_b), free(dw), free(db), free(want_w), free(want_b), free(pre_x), free(want_x);
    free(want_w2), free(want_b2), free(want_b3), free(dw_before);
}

static void test_matmul(void **state) {
    check_matmul(7, 24, 13, 0, 1, 6);
    check_matmul(7, 24, 13, 1, 1, 7);
    check_matmul(1, 3, 1, 1, 1, 8);
    check_matmul(611, 20, 130, 1, 0, 9); /* parallel bias rows and dbias column blocks */
}

/* out += inp @ weight^T: against matmul_forward + add (the same fp32 product, then one fp32 add;
 * sgemm with beta 1 may add out inside its K blocks: 1e-6 relative) and the double reference. */
static void check_matmul_forward_add(int R, int K, int M, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    size_t nx = (size_t)R * K, nw = (size_t)M * K, no = (size_t)R * M;
    float *x = mt_test_randn(&rng, nx, 1), *w = mt_test_randn(&rng, nw, 1),
          *base = mt_test_randn(&rng, no, 3);
    float *prod = mt_test_fnew(no), *sum = mt_test_fnew(no), *out = mt_test_copyf(base, no),
          *ref = mt_test_fnew(no);
    be->matmul_forward(be, prod, x, w, NULL, R, K, M);
    be->add(be, sum, base, prod, no);
    be->matmul_forward_add(be, out, x, w, R, K, M);
    for (int r = 0; r < R; r++)
        for (int m = 0; m < M; m++) {
            double a = base[(size_t)r * M + m];
            for (int k = 0; k < K; k++) a += (double)x[(size_t)r * K + k] * w[(size_t)m * K + k];
            ref[(size_t)r * M + m] = (float)a;
        }
    assert_true(mt_check_rel("matmul_forward_add vs forward + add", out, sum, no, 1e-6));
    assert_true(mt_allclose("matmul_forward_add vs double", out, ref, no, FWD_ATOL * K, FWD_RTOL));
    /* R, M or K zero: out untouched */
    memcpy(out, base, no * sizeof(float));
    be->matmul_forward_add(be, out, x, w, R, 0, M);
    be->matmul_forward_add(be, out, x, w, 0, K, M);
    assert_memory_equal(out, base, no * sizeof(float));
    free(x), free(w), free(base), free(prod), free(sum), free(out), free(ref);
}

static void test_matmul_forward_add(void **state) {
    check_matmul_forward_add(7, 24, 13, 60);
    check_matmul_forward_add(1, 3, 1, 61);
    check_matmul_forward_add(300, 16, 40, 62); /* a LoRA rank as K */
    check_matmul_forward_add(64, 700, 8, 63);  /* K past a BLAS K block */
}

/* x *= s in fp32: the same bits as the fp32 product, in place, over the serial and parallel
 * paths; s = 0 and s = 1 included. */
static void test_scale(void **state) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 64);
    const size_t sizes[] = {0, 1, 1001, 200003};
    const float ss[] = {0.5f, -3.7f, 0.0f, 1.0f, 1.0f / 3.0f};
    for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++)
        for (size_t k = 0; k < sizeof ss / sizeof ss[0]; k++) {
            size_t n = sizes[t];
            float *x = mt_test_randn(&rng, n, 2), *want = mt_test_fnew(n);
            for (size_t i = 0; i < n; i++) want[i] = x[i] * ss[k];
            be->scale(be, x, ss[k], n);
            if (n) assert_memory_equal(x, want, n * sizeof(float));
            free(x), free(want);
        }
}

/* ---------------- RoPE ---------------- */

typedef struct {
    double *x, *Rw, *out, *cs, *sn; /* cs, sn (N, rd/2): cos and sin of the fp32 angle */
    int N, nh, D, rd;               /* rd < D: partial RoPE, dims rd.. pass through */
} rope_ctx;

static void rope_ref(rope_ctx *c) {
    int half = c->rd / 2;
    for (int n = 0; n < c->N; n++)
        for (int h = 0; h < c->nh; h++) {
            for (int i = c->rd; i < c->D; i++) {
                size_t a = ((size_t)n * c->nh + h) * c->D + i;
                c->out[a] = c->x[a];
            }
            for (int i = 0; i < half; i++) {
                size_t a = ((size_t)n * c->nh + h) * c->D + i, b = a + half;
                double cs = c->cs[(size_t)n * half + i], sn = c->sn[(size_t)n * half + i];
                c->out[a] = c->x[a] * cs - c->x[b] * sn;
                c->out[b] = c->x[b] * cs + c->x[a] * sn;
            }
        }
}
static double rope_loss(void *p) {
    rope_ctx *c = p;
    rope_ref(c);
    return dot(c->out, c->Rw, (size_t)c->N * c->nh * c->D);
}

static void check_rope(int N, int nh, int D, int rd, int max_pos, int fd, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    int half = rd / 2;
    size_t n = (size_t)N * nh * D;
    int32_t *pos = malloc(N * sizeof *pos);
    for (int i = 0; i < N; i++) pos[i] = (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)max_pos);
    float *inv_freq = mt_test_fnew(half);
    for (int i = 0; i < half; i++) /* as transformers: 1 / theta^(2i/rd) in fp32 */
        inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)rd);
    float *x = mt_test_randn(&rng, n, 1), *Rw = mt_test_randn(&rng, n, 1);
    rope_ctx c = {mt_test_to_double(x, n), mt_test_to_double(Rw, n), mt_test_dnew(n),
                  mt_test_dnew((size_t)N * half), mt_test_dnew((size_t)N * half), N, nh, D, rd};
    for (int t = 0; t < N; t++)
        for (int i = 0; i < half; i++) {
            float angle = (float)pos[t] * inv_freq[i]; /* the fp32 angle of the contract */
            c.cs[(size_t)t * half + i] = cos((double)angle);
            c.sn[(size_t)t * half + i] = sin((double)angle);
        }
    rope_ref(&c);
    float *y = mt_test_copyf(x, n), *ref = mt_test_to_float(c.out, n);
    be->rope_forward(be, y, pos, inv_freq, N, nh, D, rd);
    assert_true(mt_allclose("rope_forward", y, ref, n, FWD_ATOL, FWD_RTOL));

    float *g;
    if (fd) {
        g = mt_test_fd_grad(rope_loss, &c, c.x, n, FD_H);
    } else { /* the transpose of the rotation, in double */
        double *a = mt_test_dnew(n);
        double *save = c.x;
        c.x = c.Rw;
        for (size_t i = 0; i < (size_t)N * half; i++) c.sn[i] = -c.sn[i];
        rope_ref(&c);
        memcpy(a, c.out, n * sizeof(double));
        c.x = save;
        g = mt_test_to_float(a, n);
        free(a);
    }
    float *dx = mt_test_copyf(Rw, n);
    be->rope_backward(be, dx, pos, inv_freq, N, nh, D, rd);
    assert_true(mt_allclose("rope_backward", dx, g, n, BWD_ATOL, BWD_RTOL));
    free(pos), free(inv_freq), free(x), free(Rw), free(c.x), free(c.Rw), free(c.out), free(c.cs);
    free(c.sn), free(y), free(ref), free(g), free(dx);
}

static void test_rope(void **state) {
    check_rope(5, 3, 16, 16, 4096, 1, 10);
    check_rope(7, 1, 8, 8, 100000, 1, 11); /* long-context positions: large fp32 angles */
    check_rope(300, 8, 16, 16, 32768, 0, 12); /* parallel path */
    check_rope(5, 3, 16, 4, 4096, 1, 13);     /* partial RoPE (qwen3_5: a quarter of the head) */
    check_rope(300, 8, 32, 8, 32768, 0, 14);
}

/* ---------------- SwiGLU and add ---------------- */

static double silu(double g) { return g / (1 + exp(-g)); }

static void check_swiglu(size_t n, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    float *gate = mt_test_fnew(n), *up = mt_test_randn(&rng, n, 1), *Rw = mt_test_randn(&rng, n, 1);
    mt_test_fill_uniform(&rng, gate, n, -12, 12);
    gate[0] = -40, gate[1 % n] = 40, gate[2 % n] = 0; /* saturated ends and the centre */
    float *out = mt_test_fnew(n), *ref = mt_test_fnew(n), *gg = mt_test_fnew(n), *gu = mt_test_fnew(n);
    for (size_t i = 0; i < n; i++) {
        double g = gate[i], u = up[i], r = Rw[i];
        ref[i] = (float)(silu(g) * u);
        /* the scalar sum(out * Rw) depends on gate[i] and up[i] only through element i */
        gg[i] = (float)(r * u * (silu(g + FD_H) - silu(g - FD_H)) / (2 * FD_H));
        gu[i] = (float)(r * silu(g) * ((u + FD_H) - (u - FD_H)) / (2 * FD_H));
    }
    mt_test_nan_fill(out, n);
    be->swiglu_forward(be, out, gate, up, n);
    assert_true(mt_allclose("swiglu_forward", out, ref, n, FWD_ATOL, FWD_RTOL));
    float *dg = mt_test_fnew(n), *du = mt_test_fnew(n);
    mt_test_nan_fill(dg, n), mt_test_nan_fill(du, n);
    be->swiglu_backward(be, dg, du, Rw, gate, up, n);
    assert_true(mt_allclose("swiglu_backward dgate", dg, gg, n, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("swiglu_backward dup", du, gu, n, BWD_ATOL, BWD_RTOL));

    /* add, out aliasing a */
    float *sum = mt_test_fnew(n);
    for (size_t i = 0; i < n; i++) sum[i] = (float)((double)up[i] + (double)Rw[i]);
    mt_test_nan_fill(out, n);
    be->add(be, out, up, Rw, n);
    assert_memory_equal(out, sum, n * sizeof(float)); /* one fp32 rounding: exact */
    be->add(be, up, up, Rw, n);
    assert_memory_equal(up, sum, n * sizeof(float));
    free(gate), free(up), free(Rw), free(out), free(ref), free(gg), free(gu), free(dg), free(du);
    free(sum);
}

/* ---------------- sigmoid gates, column split and join ---------------- */

typedef struct {
    double *x, *g, *Rw;
    int R, C, Cg;
} gate_ctx;

static double gate_loss(void *p) { /* sum(x * sigmoid(g) * Rw) in double */
    gate_ctx *c = p;
    double s = 0;
    for (int r = 0; r < c->R; r++)
        for (int i = 0; i < c->C; i++) {
            size_t k = (size_t)r * c->C + i;
            double g = c->g[(size_t)r * c->Cg + (c->Cg == 1 ? 0 : i)];
            s += c->x[k] / (1.0 + exp(-g)) * c->Rw[k];
        }
    return s;
}

static void check_sigmoid_gate(int R, int C, int Cg, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    size_t n = (size_t)R * C, ng = (size_t)R * Cg;
    float *x = mt_test_randn(&rng, n, 1), *g = mt_test_randn(&rng, ng, 3), *Rw = mt_test_randn(&rng, n, 1);
    g[0] = -30.0f; /* a saturated gate */
    gate_ctx c = {mt_test_to_double(x, n), mt_test_to_double(g, ng), mt_test_to_double(Rw, n), R, C, Cg};
    float *ref = mt_test_fnew(n), *out = mt_test_fnew(n);
    for (int r = 0; r < R; r++)
        for (int i = 0; i < C; i++) {
            size_t k = (size_t)r * C + i;
            ref[k] = (float)(c.x[k] / (1.0 + exp(-c.g[(size_t)r * Cg + (Cg == 1 ? 0 : i)])));
        }
    mt_test_nan_fill(out, n);
    be->sigmoid_gate_forward(be, out, x, g, R, C, Cg);
    assert_true(mt_allclose("sigmoid_gate_forward", out, ref, n, FWD_ATOL, FWD_RTOL));
    float *gx = mt_test_fd_grad(gate_loss, &c, c.x, n, FD_H),
          *gg = mt_test_fd_grad(gate_loss, &c, c.g, ng, FD_H);
    float *dx = mt_test_fnew(n), *dg = mt_test_fnew(ng);
    mt_test_nan_fill(dx, n), mt_test_nan_fill(dg, ng);
    be->sigmoid_gate_backward(be, dx, dg, Rw, x, g, R, C, Cg);
    assert_true(mt_allclose("sigmoid_gate_backward dx", dx, gx, n, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("sigmoid_gate_backward dg", dg, gg, ng, BWD_ATOL, BWD_RTOL));
    float *dout = mt_test_copyf(Rw, n); /* dx aliasing dout */
    be->sigmoid_gate_backward(be, dout, dg, dout, x, g, R, C, Cg);
    assert_memory_equal(dout, dx, n * sizeof(float));
    free(x), free(g), free(Rw), free(c.x), free(c.g), free(c.Rw), free(ref), free(out), free(gx);
    free(gg), free(dx), free(dg), free(dout);
}

static void test_sigmoid_gate_split(void **state) {
    check_sigmoid_gate(6, 16, 16, 21); /* the gated attention's: one gate an element */
    check_sigmoid_gate(7, 24, 1, 22);  /* the shared expert's: one gate a token */
    check_sigmoid_gate(300, 130, 130, 23); /* the parallel path */
    /* split then join gives back the rows; the halves are the rows' column ranges */
    int R = 5, wa = 3, wb = 7;
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 24);
    float *in = mt_test_randn(&rng, (size_t)R * (wa + wb), 1), *a = mt_test_fnew((size_t)R * wa);
    float *b = mt_test_fnew((size_t)R * wb), *back = mt_test_fnew((size_t)R * (wa + wb));
    be->cols_split(be, a, b, in, R, wa, wb);
    for (int r = 0; r < R; r++) {
        assert_memory_equal(a + r * wa, in + r * (wa + wb), wa * sizeof(float));
        assert_memory_equal(b + r * wb, in + r * (wa + wb) + wa, wb * sizeof(float));
    }
    mt_test_nan_fill(back, (size_t)R * (wa + wb));
    be->cols_join(be, back, a, b, R, wa, wb);
    assert_memory_equal(back, in, (size_t)R * (wa + wb) * sizeof(float));
    free(in), free(a), free(b), free(back);
}

static void test_swiglu_add(void **state) {
    check_swiglu(3, 13);
    check_swiglu(1001, 14);
    check_swiglu(100003, 15); /* parallel path */
}

/* sumsq accumulates (+=) in double; from_f32 is a copy on the fp32 backend. */
static void test_sumsq_from_f32(void **state) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 16);
    size_t sizes[] = {0, 1, 37, 200003}; /* the last one runs threaded */
    for (int k = 0; k < 4; k++) {
        size_t n = sizes[k];
        float *x = mt_test_randn(&rng, n, 1), *y = mt_test_fnew(n);
        double ref = 0.5;
        for (size_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
        float got = 0.5f, want = (float)ref;
        be->sumsq(be, &got, x, n);
        assert_true(mt_allclose("sumsq (+=)", &got, &want, 1, FWD_ATOL, FWD_RTOL));
        mt_test_nan_fill(y, n);
        be->from_f32(be, y, x, n);
        if (n) assert_memory_equal(y, x, n * sizeof(float));
        free(x), free(y);
    }
}

/* from_bf16 widens exactly: every bf16 bit pattern (NaNs, infinities, subnormals, -0) becomes
 * the fp32 with the same top 16 bits and zero low bits; the odd length runs threaded. */
static void test_from_bf16(void **state) {
    assert_non_null(be->from_bf16);
    size_t n = 3 * 65536 + 7;
    mt_bf16 *x = malloc(n * sizeof *x);
    uint32_t *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) x[i] = (mt_bf16)(i * 40503u); /* a bijection per 65536 */
    mt_test_nan_fill((float *)y, n);
    be->from_bf16(be, y, x, n);
    for (size_t i = 0; i < n; i++)
        if (y[i] != (uint32_t)x[i] << 16) fail_msg("from_bf16: %04x -> %08x", x[i], y[i]);
    free(x);
    free(y);
}

/* optim_update on host arenas is the state's own update: twin states, one stepped through
 * mt_optim_state_update, one through the op on its mt_optim_state_arenas, end byte for byte
 * equal in every checkpoint tensor and the upload arena, for each format and gradient dtype,
 * over a group at a nonzero offset that ends in a partial block. */
static void check_optim_update(mt_state_format f, mt_dtype grad_dtype) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 17 + (uint64_t)f * 2 + (uint64_t)grad_dtype);
    size_t n = 5 * 256 + 77, off = 256, gn = n - off;
    /* the cpu backend computes in fp32: full's upload copy is fp32 there */
    mt_optim_alloc al = {.upload_dtype = f == MT_STATE_FULL ? MT_F32 : MT_BF16};
    mt_optim_state *a = mt_optim_state_create(f, n, 99, &al);
    mt_optim_state *b = mt_optim_state_create(f, n, 99, &al);
    mt_optim_state_set_index_base(a, 3 * 256);
    mt_optim_state_set_index_base(b, 3 * 256);
    float *w = mt_test_randn(&rng, n, 0.05f), *g = mt_test_fnew(gn);
    mt_bf16 *gh = malloc(gn * sizeof *gh);
    mt_optim_state_set_weights(a, 0, w, n);
    mt_optim_state_set_weights(b, 0, w, n);
    float *w0 = mt_test_fnew(n), *w1 = mt_test_fnew(n);
    mt_optim_state_get_weights(b, 0, w0, n); /* tight: w rounded to bf16 */
    mt_optim_arenas ar = mt_optim_state_arenas(b);
    for (int64_t step = 1; step <= 4; step++) {
        mt_test_fill_normal(&rng, g, gn, 0.02f);
        for (size_t i = 0; i < gn; i++) gh[i] = mt_f32_to_bf16(g[i]);
        const void *grad = grad_dtype == MT_BF16 ? (const void *)gh : g;
        mt_optim_step st = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                            .weight_decay = 0.1, .step = step, .grad_scale = 0.5f};
        assert_int_equal(mt_optim_state_update(a, &st, off, gn, grad, grad_dtype, 0), MT_OK);
        be->optim_update(be, &ar, &st, off, gn, grad, grad_dtype);
    }
    mt_optim_tensor ta[MT_OPTIM_MAX_TENSORS], tb[MT_OPTIM_MAX_TENSORS];
    int nt = mt_optim_state_tensors(a, ta);
    assert_int_equal(mt_optim_state_tensors(b, tb), nt);
    for (int k = 0; k < nt; k++) assert_memory_equal(ta[k].data, tb[k].data, ta[k].bytes);
    size_t ub = n * mt_dtype_size(mt_optim_state_upload_dtype(a));
    assert_memory_equal(mt_optim_state_upload(a), mt_optim_state_upload(b), ub);
    /* the steps moved the weights (the comparison is not of two untouched states) */
    mt_optim_state_get_weights(b, 0, w1, n);
    assert_memory_equal(w1, w0, off * sizeof(float));
    assert_memory_not_equal(w1 + off, w0 + off, gn * sizeof(float));
    free(w), free(w0), free(w1), free(g), free(gh);
    mt_optim_state_free(a);
    mt_optim_state_free(b);
}

static void test_optim_update(void **state) {
    assert_non_null(be->optim_update);
    for (int f = MT_STATE_FULL; f <= MT_STATE_TIGHT; f++) {
        check_optim_update((mt_state_format)f, MT_F32);
        check_optim_update((mt_state_format)f, MT_BF16);
    }
}

int main(void) {
    be = mt_backend_cpu_create();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory),  cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rmsnorm), cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_forward_add), cmocka_unit_test(test_scale),
        cmocka_unit_test(test_rope),    cmocka_unit_test(test_swiglu_add),
        cmocka_unit_test(test_sigmoid_gate_split),
        cmocka_unit_test(test_sumsq_from_f32), cmocka_unit_test(test_from_bf16),
        cmocka_unit_test(test_optim_update),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    be->destroy(be);
    return rc;
}
