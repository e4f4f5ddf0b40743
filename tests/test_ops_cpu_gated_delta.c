/* The Gated DeltaNet's CPU ops against double-precision references.
 *
 * The core (gated_delta_forward / _backward, chunked) against a plain token-by-token recurrence in
 * double written here, forward and reverse-mode backward:
 *  - forward: max |err| <= 1e-5 * max |ref| (tensor-relative, fp32 vs double);
 *  - the double recurrence's backward vs central finite differences (h = 1e-5) of
 *    sum(out * R) in double: tensor-relative 1e-6;
 *  - the chunked fp32 backward vs the recurrence's backward: tensor-relative 1e-4.
 * Cases: T < 64, T = 64, T = 150 (three chunks, the last ragged), B = 2, Hv = 2*Hk, Dk != Dv, rows
 * packing documents (starts inside a chunk and on a chunk boundary), g near 0, moderate and
 * strongly negative. Outputs are poisoned with NaN first; a second call gives the same bits. A row
 * packing documents equals the documents run as rows of their own (tensor-relative 1e-5).
 * The other ops (causal conv1d + SiLU, per-head L2 norm, gated RMSNorm, the decay/beta maps):
 * forward vs the direct formula in double (atol 1e-6, rtol 1e-5), backward vs central differences
 * of the double formula (h = 1e-4, 1e-6 for the L2 norm's short row; atol 1e-5, rtol 1e-4),
 * weight gradients accumulating. A NULL weight gradient (conv weight, norm weight, A_log, dt_bias:
 * frozen) is skipped and leaves the other gradients bit for bit those of the full call, at the
 * small sizes and at sizes that run the threaded paths.
 * transformers' torch_chunk_gated_delta_rule (tests/fixtures/gated_delta, make_gated_delta_fixture.py):
 * out and the gradients of sum(out * R), tensor-relative 1e-5.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "util/cpu_op_tol.h"
#include "util/fixture_io.h"
#include "util/host_buffers.h"
#include "util/testutil.h"

#define GD_FWD_TOL 1e-5
#define GD_BWD_TOL 1e-4
#define GD_FD_TOL 1e-6
#define GD_FD_H 1e-5
#define FIXTURE_TOL 1e-5

static mt_backend *be;

/* Each row of D unit length (the op's q and k come L2-normalised). */
static void normalise_rows(float *x, size_t rows, int D) {
    for (size_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int d = 0; d < D; d++) ss += (double)x[r * D + d] * x[r * D + d];
        for (int d = 0; d < D; d++) x[r * D + d] = (float)(x[r * D + d] / sqrt(ss));
    }
}

/* max |got - ref| <= tol * max |ref|, printed with the percent of tolerance used. */
static int check_rel(const char *what, const float *got, const float *ref, size_t n, double tol) {
    double mx = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs((double)ref[i]) > mx) mx = fabs((double)ref[i]);
    return mt_allclose(what, got, ref, n, tol * (mx > 0 ? mx : 1), 0);
}
static int check_rel_d(const char *what, const float *got, const double *ref, size_t n,
                       double tol) {
    float *r = mt_test_to_float(ref, n);
    int ok = check_rel(what, got, r, n, tol);
    free(r);
    return ok;
}

/* ---------------- the gated delta rule, token by token, in double ---------------- */

typedef struct {
    int B, T, Hk, Hv, Dk, Dv;
    double scale;
    const int32_t *ds;
    double *q, *k, *v, *g, *beta, *R; /* inputs; R the loss weights (= dout) */
    double *out;
} gd_ref;

static int resets(const gd_ref *c, int b, int t) {
    return t == 0 || (c->ds && c->ds[(size_t)b * c->T + t] == t);
}

/* out; when dq is not NULL also the gradients of sum(out * R) (all written). */
static void gd_ref_run(gd_ref *c, double *dq, double *dk, double *dv, double *dg, double *dbeta) {
    int T = c->T, Hk = c->Hk, Hv = c->Hv, Dk = c->Dk, Dv = c->Dv, rep = Hv / Hk;
    size_t SS = (size_t)Dk * Dv;
    double *Sd = mt_test_dnew((size_t)T * SS), *delta = mt_test_dnew((size_t)T * Dv), *S = mt_test_dnew(SS);
    double *dS = mt_test_dnew(SS), *kv = mt_test_dnew(Dv);
    if (dq) {
        memset(dq, 0, (size_t)c->B * T * Hk * Dk * sizeof(double));
        memset(dk, 0, (size_t)c->B * T * Hk * Dk * sizeof(double));
    }
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < Hv; h++) {
            int kh = h / rep;
            memset(S, 0, SS * sizeof(double));
            for (int t = 0; t < T; t++) {
                size_t n = (size_t)b * T + t;
                const double *k = c->k + (n * Hk + kh) * Dk, *q = c->q + (n * Hk + kh) * Dk;
                const double *v = c->v + (n * Hv + h) * Dv;
                double e = exp(c->g[n * Hv + h]), bt = c->beta[n * Hv + h];
                if (resets(c, b, t)) memset(S, 0, SS * sizeof(double));
                for (size_t i = 0; i < SS; i++) S[i] *= e;
                memcpy(Sd + t * SS, S, SS * sizeof(double));
                for (int j = 0; j < Dv; j++) {
                    double s = 0;
                    for (int i = 0; i < Dk; i++) s += S[i * Dv + j] * k[i];
                    delta[(size_t)t * Dv + j] = bt * (v[j] - s);
                }
                for (int i = 0; i < Dk; i++)
                    for (int j = 0; j < Dv; j++) S[i * Dv + j] += k[i] * delta[(size_t)t * Dv + j];
                double *o = c->out + (n * Hv + h) * Dv;
                for (int j = 0; j < Dv; j++) {
                    double s = 0;
                    for (int i = 0; i < Dk; i++) s += S[i * Dv + j] * q[i] * c->scale;
                    o[j] = s;
                }
            }
            if (!dq) continue;
            memset(dS, 0, SS * sizeof(double));
            for (int t = T - 1; t >= 0; t--) {
                size_t n = (size_t)b * T + t;
                const double *k = c->k + (n * Hk + kh) * Dk, *q = c->q + (n * Hk + kh) * Dk;
                const double *v = c->v + (n * Hv + h) * Dv, *R = c->R + (n * Hv + h) * Dv;
                const double *Sdt = Sd + t * SS, *dl = delta + (size_t)t * Dv;
                double e = exp(c->g[n * Hv + h]), bt = c->beta[n * Hv + h];
                double *dqt = dq + (n * Hk + kh) * Dk, *dkt = dk + (n * Hk + kh) * Dk;
                /* o = S_t^T (scale q), S_t = Sd + k delta^T */
                for (int i = 0; i < Dk; i++) {
                    double s = 0;
                    for (int j = 0; j < Dv; j++) s += (Sdt[i * Dv + j] + k[i] * dl[j]) * R[j];
                    dqt[i] += c->scale * s;
                    for (int j = 0; j < Dv; j++) dS[i * Dv + j] += c->scale * q[i] * R[j];
                }
                /* delta = beta (v - Sd^T k) */
                double db = 0;
                for (int j = 0; j < Dv; j++) {
                    double dd = 0, kvj = 0;
                    for (int i = 0; i < Dk; i++) dd += dS[i * Dv + j] * k[i];
                    for (int i = 0; i < Dk; i++) kvj += Sdt[i * Dv + j] * k[i];
                    kv[j] = -bt * dd; /* d(Sd^T k) */
                    dv[(n * Hv + h) * Dv + j] = bt * dd;
                    db += (v[j] - kvj) * dd;
                }
                dbeta[n * Hv + h] = db;
                for (int i = 0; i < Dk; i++) {
                    double s = 0;
                    for (int j = 0; j < Dv; j++) s += dS[i * Dv + j] * dl[j] + Sdt[i * Dv + j] * kv[j];
                    dkt[i] += s;
                }
                double dgt = 0;
                for (int i = 0; i < Dk; i++)
                    for (int j = 0; j < Dv; j++) {
                        dS[i * Dv + j] += k[i] * kv[j]; /* dS' = dS + k d(kv)^T */
                        dgt += Sdt[i * Dv + j] * dS[i * Dv + j];
                    }
                dg[n * Hv + h] = dgt;
                for (size_t i = 0; i < SS; i++) dS[i] = resets(c, b, t) ? 0 : e * dS[i];
            }
        }
    free(Sd), free(delta), free(S), free(dS), free(kv);
}

static double gd_loss(void *p) {
    gd_ref *c = p;
    gd_ref_run(c, NULL, NULL, NULL, NULL, NULL);
    double s = 0;
    for (size_t i = 0; i < (size_t)c->B * c->T * c->Hv * c->Dv; i++) s += c->out[i] * c->R[i];
    return s;
}

typedef enum { G_NEAR_ZERO, G_MODERATE, G_STRONG } g_regime;

/* doc starts of row b from a list of starts (ending with T), or NULL. */
static int32_t *docs_from(const int starts[][6], int B, int T) {
    if (!starts) return NULL;
    int32_t *ds = malloc((size_t)B * T * sizeof *ds);
    for (int b = 0; b < B; b++)
        for (int d = 0; starts[b][d] < T; d++)
            for (int t = starts[b][d]; t < T && (d == 5 || t < starts[b][d + 1]); t++)
                ds[(size_t)b * T + t] = starts[b][d];
    return ds;
}

static void check_gated_delta(int B, int T, int Hk, int Hv, int Dk, int Dv, g_regime gr,
                              const int starts[][6], int fd, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    size_t nk = (size_t)B * T * Hk * Dk, nv = (size_t)B * T * Hv * Dv, ng = (size_t)B * T * Hv;
    int nc = (T + MT_GATED_DELTA_CHUNK - 1) / MT_GATED_DELTA_CHUNK;
    float *q = mt_test_randn(&rng, nk, 1), *k = mt_test_randn(&rng, nk, 1), *v = mt_test_randn(&rng, nv, 1);
    float *R = mt_test_randn(&rng, nv, 1), *g = mt_test_randn(&rng, ng, 1),
          *beta = mt_test_randn(&rng, ng, 1);
    normalise_rows(q, nk / Dk, Dk), normalise_rows(k, nk / Dk, Dk);
    for (size_t i = 0; i < ng; i++) {
        beta[i] = 1.0f / (1.0f + expf(-beta[i]));
        float sp = log1pf(expf(g[i])); /* softplus: > 0 */
        g[i] = gr == G_NEAR_ZERO ? -1e-3f * sp : gr == G_MODERATE ? -sp : -5.0f - 5.0f * sp;
    }
    int32_t *ds = docs_from(starts, B, T);
    float scale = 1.0f / sqrtf((float)Dk);
    gd_ref c = {B, T, Hk, Hv, Dk, Dv, scale, ds, mt_test_to_double(q, nk), mt_test_to_double(k, nk),
                mt_test_to_double(v, nv), mt_test_to_double(g, ng), mt_test_to_double(beta, ng),
                mt_test_to_double(R, nv), mt_test_dnew(nv)};
    double *rq = mt_test_dnew(nk), *rk = mt_test_dnew(nk), *rv = mt_test_dnew(nv), *rg = mt_test_dnew(ng),
           *rb = mt_test_dnew(ng);
    gd_ref_run(&c, rq, rk, rv, rg, rb);
    fprintf(stderr, "gated_delta B=%d T=%d Hk=%d Hv=%d Dk=%d Dv=%d g %s%s\n", B, T, Hk, Hv, Dk, Dv,
            gr == G_NEAR_ZERO ? "near 0" : gr == G_MODERATE ? "moderate" : "strongly negative",
            ds ? " (packed documents)" : "");

    float *out = mt_test_fnew(nv), *st = mt_test_fnew((size_t)B * Hv * nc * Dk * Dv);
    mt_test_nan_fill(out, nv), mt_test_nan_fill(st, (size_t)B * Hv * nc * Dk * Dv);
    be->gated_delta_forward(be, out, st, q, k, v, g, beta, ds, B, T, Hk, Hv, Dk, Dv, scale, NULL);
    assert_true(check_rel_d("gated_delta_forward out", out, c.out, nv, GD_FWD_TOL));

    if (fd) { /* the reference's backward against its own central differences */
        double *fq = mt_test_fd_grad_d(gd_loss, &c, c.q, nk, GD_FD_H);
        double *fk = mt_test_fd_grad_d(gd_loss, &c, c.k, nk, GD_FD_H);
        double *fv = mt_test_fd_grad_d(gd_loss, &c, c.v, nv, GD_FD_H);
        double *fg = mt_test_fd_grad_d(gd_loss, &c, c.g, ng, GD_FD_H);
        double *fb = mt_test_fd_grad_d(gd_loss, &c, c.beta, ng, GD_FD_H);
        float *a = mt_test_to_float(rq, nk), *bb = mt_test_to_float(rk, nk), *cc = mt_test_to_float(rv, nv);
        float *d = mt_test_to_float(rg, ng), *e = mt_test_to_float(rb, ng);
        assert_true(check_rel_d("recurrence dq vs finite differences", a, fq, nk, GD_FD_TOL));
        assert_true(check_rel_d("recurrence dk vs finite differences", bb, fk, nk, GD_FD_TOL));
        assert_true(check_rel_d("recurrence dv vs finite differences", cc, fv, nv, GD_FD_TOL));
        assert_true(check_rel_d("recurrence dg vs finite differences", d, fg, ng, GD_FD_TOL));
        assert_true(check_rel_d("recurrence dbeta vs finite differences", e, fb, ng, GD_FD_TOL));
        free(fq), free(fk), free(fv), free(fg), free(fb), free(a), free(bb), free(cc), free(d);
        free(e);
    }

    float *dq = mt_test_fnew(nk), *dk = mt_test_fnew(nk), *dv = mt_test_fnew(nv), *dg = mt_test_fnew(ng),
          *db = mt_test_fnew(ng);
    mt_test_nan_fill(dq, nk), mt_test_nan_fill(dk, nk), mt_test_nan_fill(dv, nv);
    mt_test_nan_fill(dg, ng), mt_test_nan_fill(db, ng);
    be->gated_delta_backward(be, dq, dk, dv, dg, db, R, st, q, k, v, g, beta, ds, B, T, Hk, Hv, Dk,
                             Dv, scale, NULL);
    assert_true(check_rel_d("gated_delta_backward dq", dq, rq, nk, GD_BWD_TOL));
    assert_true(check_rel_d("gated_delta_backward dk", dk, rk, nk, GD_BWD_TOL));
    assert_true(check_rel_d("gated_delta_backward dv", dv, rv, nv, GD_BWD_TOL));
    assert_true(check_rel_d("gated_delta_backward dg", dg, rg, ng, GD_BWD_TOL));
    assert_true(check_rel_d("gated_delta_backward dbeta", db, rb, ng, GD_BWD_TOL));

    /* written, not accumulated: a second call gives the same bits */
    float *dq2 = mt_test_fnew(nk), *dg2 = mt_test_fnew(ng);
    memcpy(dq2, dq, nk * sizeof(float)), memcpy(dg2, dg, ng * sizeof(float));
    be->gated_delta_backward(be, dq, dk, dv, dg, db, R, st, q, k, v, g, beta, ds, B, T, Hk, Hv, Dk,
                             Dv, scale, NULL);
    assert_memory_equal(dq, dq2, nk * sizeof(float));
    assert_memory_equal(dg, dg2, ng * sizeof(float));

    free(q), free(k), free(v), free(R), free(g), free(beta), free(ds), free(c.q), free(c.k);
    free(c.v), free(c.g), free(c.beta), free(c.R), free(c.out), free(rq), free(rk), free(rv);
    free(rg), free(rb), free(out), free(st), free(dq), free(dk), free(dv), free(dg), free(db);
    free(dq2), free(dg2);
}

static void test_gated_delta_shapes(void **state) {
    check_gated_delta(1, 20, 1, 1, 8, 8, G_MODERATE, NULL, 1, 1);  /* T < 64 */
    check_gated_delta(1, 64, 2, 2, 8, 8, G_MODERATE, NULL, 0, 2);  /* T = 64 */
    check_gated_delta(2, 150, 1, 2, 8, 12, G_MODERATE, NULL, 0, 3); /* chunks, ragged, grouped */
    check_gated_delta(1, 70, 2, 4, 6, 4, G_MODERATE, NULL, 1, 4);   /* Dk > Dv, two chunks */
}

static void test_gated_delta_decays(void **state) {
    check_gated_delta(1, 150, 1, 2, 8, 6, G_NEAR_ZERO, NULL, 0, 5);
    check_gated_delta(1, 150, 1, 2, 8, 6, G_STRONG, NULL, 0, 6);
    check_gated_delta(1, 70, 1, 1, 4, 6, G_NEAR_ZERO, NULL, 1, 7);
    check_gated_delta(1, 70, 1, 1, 4, 6, G_STRONG, NULL, 1, 8);
}

static void test_gated_delta_documents(void **state) {
    /* resets inside chunks (30, 100, 140, 3) and on chunk boundaries (64, 128); a one-token doc */
    static const int s150[2][6] = {{0, 30, 64, 100, 150, 150}, {0, 3, 4, 128, 140, 150}};
    check_gated_delta(2, 150, 2, 4, 6, 10, G_MODERATE, s150, 0, 9);
    check_gated_delta(2, 150, 1, 2, 6, 10, G_NEAR_ZERO, s150, 0, 10);
    check_gated_delta(2, 150, 1, 2, 6, 10, G_STRONG, s150, 0, 11);
    static const int s80[1][6] = {{0, 17, 64, 80, 80, 80}};
    check_gated_delta(1, 80, 1, 2, 4, 6, G_MODERATE, s80, 1, 12);
}

/* The delta rule's out, dq, dk, dv, dg, dbeta of two runs of the same problem, each within
 * GD_FWD_TOL (nk, nv, ng elements of the key, value and gate tensors). */
static int same_op_results(const char *label, float *const got[6], float *const want[6], size_t nk,
                           size_t nv, size_t ng) {
    static const char *names[6] = {"out", "dq", "dk", "dv", "dg", "dbeta"};
    const size_t n[6] = {nv, nk, nk, nv, ng, ng};
    int ok = 1;
    char what[96];
    for (int i = 0; i < 6; i++) {
        snprintf(what, sizeof what, "%s: %s", label, names[i]);
        ok &= check_rel(what, got[i], want[i], n[i], GD_FWD_TOL);
    }
    return ok;
}

/* A row packing documents (starts 0, 30, 64, 100 of T 150) equals the documents run one at a time
 * as rows of their own (fla's cu_seqlens semantics), forward and backward. */
static void test_gated_delta_packed_equals_separate(void **state) {
    enum { T = 150, Hk = 1, Hv = 2, Dk = 6, Dv = 5 };
    static const int starts[1][6] = {{0, 30, 64, 100, T, T}};
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 13);
    size_t nk = (size_t)T * Hk * Dk, nv = (size_t)T * Hv * Dv, ng = (size_t)T * Hv;
    float *q = mt_test_randn(&rng, nk, 1), *k = mt_test_randn(&rng, nk, 1), *v = mt_test_randn(&rng, nv, 1);
    float *R = mt_test_randn(&rng, nv, 1), *g = mt_test_randn(&rng, ng, 0.3f),
          *beta = mt_test_randn(&rng, ng, 1);
    normalise_rows(q, nk / Dk, Dk), normalise_rows(k, nk / Dk, Dk);
    for (size_t i = 0; i < ng; i++) g[i] = -fabsf(g[i]), beta[i] = 1.0f / (1.0f + expf(-beta[i]));
    int32_t *ds = docs_from(starts, 1, T);
    float scale = 1.0f / sqrtf((float)Dk);
    float *out = mt_test_fnew(nv), *cs = mt_test_fnew((size_t)Hv * 3 * Dk * Dv), *dq = mt_test_fnew(nk),
          *dk = mt_test_fnew(nk);
    float *dv = mt_test_fnew(nv), *dg = mt_test_fnew(ng), *db = mt_test_fnew(ng);
    be->gated_delta_forward(be, out, cs, q, k, v, g, beta, ds, 1, T, Hk, Hv, Dk, Dv, scale, NULL);
    be->gated_delta_backward(be, dq, dk, dv, dg, db, R, cs, q, k, v, g, beta, ds, 1, T, Hk, Hv, Dk,
                             Dv, scale, NULL);
    float *eo = mt_test_fnew(nv), *edq = mt_test_fnew(nk), *edk = mt_test_fnew(nk), *edv = mt_test_fnew(nv),
          *edg = mt_test_fnew(ng);
    float *edb = mt_test_fnew(ng), *scs = mt_test_fnew((size_t)Hv * 3 * Dk * Dv);
    for (int d = 0; starts[0][d] < T; d++) {
        int t0 = starts[0][d], len = starts[0][d + 1] - t0;
        size_t ok = (size_t)t0 * Hk * Dk, ov = (size_t)t0 * Hv * Dv, og = (size_t)t0 * Hv;
        be->gated_delta_forward(be, eo + ov, scs, q + ok, k + ok, v + ov, g + og, beta + og, NULL,
                                1, len, Hk, Hv, Dk, Dv, scale, NULL);
        be->gated_delta_backward(be, edq + ok, edk + ok, edv + ov, edg + og, edb + og, R + ov, scs,
                                 q + ok, k + ok, v + ov, g + og, beta + og, NULL, 1, len, Hk, Hv,
                                 Dk, Dv, scale, NULL);
    }
    float *got[6] = {out, dq, dk, dv, dg, db}, *want[6] = {eo, edq, edk, edv, edg, edb};
    assert_true(same_op_results("packed vs separate", got, want, nk, nv, ng));
    free(q), free(k), free(v), free(R), free(g), free(beta), free(ds), free(out), free(cs), free(dq);
    free(dk), free(dv), free(dg), free(db), free(eo), free(edq), free(edk), free(edv), free(edg);
    free(edb), free(scs);
}

/* A row run as spans [0, S) and [S, T) (mt_gated_delta_span: the second at t0 = S from the state
 * the first left, the backward handing the state's gradient back) equals the whole row, forward
 * and backward, with documents inside each span and one starting at S; the spans cut a chunk
 * (S = 100) and fall on one (S = 128). The state crosses in fp32 (the op keeps it in double
 * within a call): GD_FWD_TOL. The conv's spans: the second span's window over rows [S - 3, T)
 * at t0 = S - 3 gives the whole row's outputs and input gradients from S on. */
static void test_gated_delta_spans_equal_whole(void **state) {
    enum { T = 150, Hk = 1, Hv = 2, Dk = 6, Dv = 5 };
    static const int starts[2][1][6] = {{{0, 30, 100, 120, T, T}}, {{0, 30, 64, 140, T, T}}};
    const int cut[2] = {100, 128};
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 14);
    size_t nk = (size_t)T * Hk * Dk, nv = (size_t)T * Hv * Dv, ng = (size_t)T * Hv;
    size_t SS = (size_t)Hv * Dk * Dv;
    float *q = mt_test_randn(&rng, nk, 1), *k = mt_test_randn(&rng, nk, 1), *v = mt_test_randn(&rng, nv, 1);
    float *R = mt_test_randn(&rng, nv, 1), *g = mt_test_randn(&rng, ng, 0.1f),
          *beta = mt_test_randn(&rng, ng, 1);
    normalise_rows(q, nk / Dk, Dk), normalise_rows(k, nk / Dk, Dk);
    for (size_t i = 0; i < ng; i++) g[i] = -fabsf(g[i]), beta[i] = 1.0f / (1.0f + expf(-beta[i]));
    float scale = 1.0f / sqrtf((float)Dk);
    for (int c = 0; c < 2; c++) {
        int32_t *ds = docs_from(starts[c], 1, T);
        float *out = mt_test_fnew(nv), *cs = mt_test_fnew(3 * SS), *dq = mt_test_fnew(nk),
              *dk = mt_test_fnew(nk), *dv = mt_test_fnew(nv), *dg = mt_test_fnew(ng), *db = mt_test_fnew(ng);
        be->gated_delta_forward(be, out, cs, q, k, v, g, beta, ds, 1, T, Hk, Hv, Dk, Dv, scale, NULL);
        be->gated_delta_backward(be, dq, dk, dv, dg, db, R, cs, q, k, v, g, beta, ds, 1, T, Hk, Hv,
                                 Dk, Dv, scale, NULL);
        float *so = mt_test_fnew(nv), *sdq = mt_test_fnew(nk), *sdk = mt_test_fnew(nk),
              *sdv = mt_test_fnew(nv), *sdg = mt_test_fnew(ng), *sdb = mt_test_fnew(ng);
        float *scs[2] = {mt_test_fnew(3 * SS), mt_test_fnew(3 * SS)};
        float *S = mt_test_fnew(SS), *dS = mt_test_fnew(SS);
        const int t0[2] = {0, cut[c]}, n[2] = {cut[c], T - cut[c]};
        for (int s = 0; s < 2; s++) {
            size_t ok = (size_t)t0[s] * Hk * Dk, ov = (size_t)t0[s] * Hv * Dv, og = (size_t)t0[s] * Hv;
            mt_gated_delta_span sp = {t0[s], s ? S : NULL, s ? NULL : S, NULL, NULL};
            be->gated_delta_forward(be, so + ov, scs[s], q + ok, k + ok, v + ov, g + og, beta + og,
                                    ds + t0[s], 1, n[s], Hk, Hv, Dk, Dv, scale, &sp);
        }
        for (int s = 1; s >= 0; s--) {
            size_t ok = (size_t)t0[s] * Hk * Dk, ov = (size_t)t0[s] * Hv * Dv, og = (size_t)t0[s] * Hv;
            mt_gated_delta_span sp = {t0[s], NULL, NULL, s ? NULL : dS, s ? dS : NULL};
            be->gated_delta_backward(be, sdq + ok, sdk + ok, sdv + ov, sdg + og, sdb + og, R + ov,
                                     scs[s], q + ok, k + ok, v + ov, g + og, beta + og, ds + t0[s],
                                     1, n[s], Hk, Hv, Dk, Dv, scale, &sp);
        }
        float *got[6] = {so, sdq, sdk, sdv, sdg, sdb}, *want[6] = {out, dq, dk, dv, dg, db};
        assert_true(same_op_results("spans vs whole", got, want, nk, nv, ng));
        /* the conv over the same documents, channels Dk */
        enum { C = 7, K = 4 };
        float *x = mt_test_randn(&rng, (size_t)T * C, 1), *w = mt_test_randn(&rng, (size_t)C * K, 0.5f),
              *dy = mt_test_randn(&rng, (size_t)T * C, 1);
        float *y = mt_test_fnew((size_t)T * C), *dx = mt_test_fnew((size_t)T * C),
              *dw = calloc((size_t)C * K, sizeof(float)); /* += */
        be->causal_conv1d_forward(be, y, x, w, ds, 1, T, C, K, 0);
        for (int e = 0; e < T; e++) /* the gradient only from S on, as the span's own outputs */
            for (int ch = 0; ch < C; ch++) if (e < cut[c]) dy[e * C + ch] = 0;
        be->causal_conv1d_backward(be, dx, dw, dy, x, w, ds, 1, T, C, K, 0);
        int w0 = cut[c] - (K - 1), m = T - w0;
        float *sy = mt_test_fnew((size_t)m * C), *sdx = mt_test_fnew((size_t)m * C),
              *sdw = calloc((size_t)C * K, sizeof(float));
        be->causal_conv1d_forward(be, sy, x + w0 * C, w, ds + w0, 1, m, C, K, w0);
        be->causal_conv1d_backward(be, sdx, sdw, dy + w0 * C, x + w0 * C, w, ds + w0, 1, m, C, K, w0);
        assert_true(check_rel("conv span vs whole: out", sy + (K - 1) * C, y + cut[c] * C,
                              (size_t)(T - cut[c]) * C, 1e-6));
        assert_true(check_rel("conv span vs whole: dinp", sdx, dx + w0 * C, (size_t)m * C, 1e-6));
        assert_true(check_rel("conv span vs whole: dweight", sdw, dw, (size_t)C * K, 1e-6));
        free(x), free(w), free(dy), free(y), free(dx), free(dw), free(sy), free(sdx), free(sdw);
        free(ds), free(out), free(cs), free(dq), free(dk), free(dv), free(dg), free(db), free(so);
        free(sdq), free(sdk), free(sdv), free(sdg), free(sdb), free(scs[0]), free(scs[1]), free(S);
        free(dS);
    }
    free(q), free(k), free(v), free(R), free(g), free(beta);
}

/* The count per chunk by hand (gated_delta_flops.c's formula): L = 64 and 6, Dk = 8, Dv = 4. */
static void test_gated_delta_flops(void **state) {
    double f, b;
    mt_gated_delta_flops(2, 70, 3, 8, 4, &f, &b);
    /* L = 64: fwd 4*4096*8 + 4*4096*4 + 6*64*32 + 64*4095/3 = 131072 + 65536 + 12288 + 87360;
     * bwd 10*4096*8 + 10*4096*4 + 14*64*32 + 87360 = 327680 + 163840 + 28672 + 87360.
     * L = 6:  fwd 4*36*8 + 4*36*4 + 6*6*32 + 6*35/3 = 1152 + 576 + 1152 + 70;
     *         bwd 10*36*8 + 10*36*4 + 14*6*32 + 70 = 2880 + 1440 + 2688 + 70. */
    double f64 = 296256, b64 = 607552, f6 = 2950, b6 = 7078;
    assert_true(f == 6 * (f64 + f6));
    assert_true(b == 6 * (b64 + b6));
}

/* ---------------- transformers' torch_chunk_gated_delta_rule ---------------- */

static void test_gated_delta_transformers(void **state) {
    char *path = mt_fixture_path("gated_delta/reference.safetensors");
    mt_safetensors *st;
    if (mt_safetensors_open_file(&st, path) != MT_OK) fail_msg("%s", mt_error_message());
    const mt_st_tensor *tv = mt_safetensors_find(st, "v"), *tk = mt_safetensors_find(st, "k");
    assert_non_null(tv), assert_non_null(tk);
    assert_int_equal(tv->ndim, 4), assert_int_equal(tk->ndim, 4);
    int B = (int)tk->shape[0], T = (int)tk->shape[1], Hk = (int)tk->shape[2], Dk = (int)tk->shape[3];
    int Hv = (int)tv->shape[2], Dv = (int)tv->shape[3], nc = (T + MT_GATED_DELTA_CHUNK - 1) / MT_GATED_DELTA_CHUNK;
    size_t nk = (size_t)B * T * Hk * Dk, nv = (size_t)B * T * Hv * Dv, ng = (size_t)B * T * Hv;
    float *q = mt_test_st_f32(st, "q", nk), *k = mt_test_st_f32(st, "k", nk), *v = mt_test_st_f32(st, "v", nv);
    float *g = mt_test_st_f32(st, "g", ng), *beta = mt_test_st_f32(st, "beta", ng);
    float *R = mt_test_st_f32(st, "R", nv), *ref_out = mt_test_st_f32(st, "out", nv);
    float *rq = mt_test_st_f32(st, "dq", nk), *rk = mt_test_st_f32(st, "dk", nk);
    float *rv = mt_test_st_f32(st, "dv", nv), *rg = mt_test_st_f32(st, "dg", ng);
    float *rb = mt_test_st_f32(st, "dbeta", ng);
    fprintf(stderr, "transformers fixture B=%d T=%d Hk=%d Hv=%d Dk=%d Dv=%d\n", B, T, Hk, Hv, Dk, Dv);
    float scale = 1.0f / sqrtf((float)Dk);
    float *out = mt_test_fnew(nv), *cs = mt_test_fnew((size_t)B * Hv * nc * Dk * Dv);
    float *dq = mt_test_fnew(nk), *dk = mt_test_fnew(nk), *dv = mt_test_fnew(nv), *dg = mt_test_fnew(ng),
          *db = mt_test_fnew(ng);
    be->gated_delta_forward(be, out, cs, q, k, v, g, beta, NULL, B, T, Hk, Hv, Dk, Dv, scale, NULL);
    be->gated_delta_backward(be, dq, dk, dv, dg, db, R, cs, q, k, v, g, beta, NULL, B, T, Hk, Hv,
                             Dk, Dv, scale, NULL);
    assert_true(check_rel("transformers out", out, ref_out, nv, FIXTURE_TOL));
    assert_true(check_rel("transformers dq", dq, rq, nk, FIXTURE_TOL));
    assert_true(check_rel("transformers dk", dk, rk, nk, FIXTURE_TOL));
    assert_true(check_rel("transformers dv", dv, rv, nv, FIXTURE_TOL));
    assert_true(check_rel("transformers dg", dg, rg, ng, FIXTURE_TOL));
    assert_true(check_rel("transformers dbeta", db, rb, ng, FIXTURE_TOL));
    free(q), free(k), free(v), free(g), free(beta), free(R), free(ref_out), free(rq), free(rk);
    free(rv), free(rg), free(rb), free(out), free(cs), free(dq), free(dk), free(dv), free(dg);
    free(db), free(path);
    mt_safetensors_close(st);
}

/* ---------------- causal depthwise conv1d + SiLU ---------------- */

typedef struct {
    double *x, *w, *R, *out;
    const int32_t *ds;
    int B, T, C, K;
} conv_ref;

static double silu(double x) { return x / (1.0 + exp(-x)); }

static void conv_ref_run(conv_ref *c) {
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t < c->T; t++) {
            int lo = c->ds ? c->ds[b * c->T + t] : 0;
            for (int ch = 0; ch < c->C; ch++) {
                double p = 0;
                for (int j = 0; j < c->K; j++) {
                    int s = t - (c->K - 1) + j;
                    if (s >= lo) p += c->w[ch * c->K + j] * c->x[((size_t)b * c->T + s) * c->C + ch];
                }
                c->out[((size_t)b * c->T + t) * c->C + ch] = silu(p);
            }
        }
}

static double conv_loss(void *p) {
    conv_ref *c = p;
    conv_ref_run(c);
    double s = 0;
    for (size_t i = 0; i < (size_t)c->B * c->T * c->C; i++) s += c->out[i] * c->R[i];
    return s;
}

static void check_conv(int B, int T, int C, int K, const int starts[][6], uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    size_t n = (size_t)B * T * C, nw = (size_t)C * K;
    float *x = mt_test_randn(&rng, n, 1), *w = mt_test_randn(&rng, nw, 0.5f), *R = mt_test_randn(&rng, n, 1);
    int32_t *ds = docs_from(starts, B, T);
    conv_ref c = {mt_test_to_double(x, n), mt_test_to_double(w, nw), mt_test_to_double(R, n), mt_test_dnew(n),
                  ds, B, T, C, K};
    conv_ref_run(&c);
    float *out = mt_test_fnew(n), *ref = mt_test_to_float(c.out, n);
    mt_test_nan_fill(out, n);
    be->causal_conv1d_forward(be, out, x, w, ds, B, T, C, K, 0);
    fprintf(stderr, "causal_conv1d B=%d T=%d C=%d K=%d%s\n", B, T, C, K, ds ? " (documents)" : "");
    assert_true(mt_allclose("causal_conv1d_forward", out, ref, n, FWD_ATOL, FWD_RTOL));
    float *gx = mt_test_fd_grad(conv_loss, &c, c.x, n, FD_H),
          *gw = mt_test_fd_grad(conv_loss, &c, c.w, nw, FD_H);
    float *dx = mt_test_fnew(n), *dw = mt_test_fnew(nw);
    mt_test_nan_fill(dx, n);
    for (size_t i = 0; i < nw; i++) dw[i] = 1.0f; /* accumulates: 1 + gradient */
    for (size_t i = 0; i < nw; i++) gw[i] += 1.0f;
    be->causal_conv1d_backward(be, dx, dw, R, x, w, ds, B, T, C, K, 0);
    assert_true(mt_allclose("causal_conv1d_backward dinp", dx, gx, n, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("causal_conv1d_backward dweight (+= 1)", dw, gw, nw, BWD_ATOL, BWD_RTOL));
    float *dx_frozen = mt_test_fnew(n); /* dweight NULL: dinp the same bits */
    mt_test_nan_fill(dx_frozen, n);
    be->causal_conv1d_backward(be, dx_frozen, NULL, R, x, w, ds, B, T, C, K, 0);
    assert_memory_equal(dx_frozen, dx, n * sizeof(float));
    free(dx_frozen);
    free(x), free(w), free(R), free(ds), free(c.x), free(c.w), free(c.R), free(c.out), free(out);
    free(ref), free(gx), free(gw), free(dx), free(dw);
}

static void test_causal_conv1d(void **state) {
    check_conv(2, 9, 5, 4, NULL, 20);
    check_conv(1, 3, 70, 4, NULL, 21); /* T < K; two channel blocks */
    static const int s[2][6] = {{0, 2, 3, 7, 12, 12}, {0, 12, 12, 12, 12, 12}};
    check_conv(2, 12, 6, 4, s, 22);
    check_conv(1, 10, 3, 2, NULL, 23);
}

/* ---------------- per-head L2 norm ---------------- */

typedef struct {
    double *x, *R, *out;
    int Rows, D;
    double eps;
} l2_ref;

static double l2_loss(void *p) {
    l2_ref *c = p;
    double s = 0;
    for (int r = 0; r < c->Rows; r++) {
        double ss = 0;
        for (int d = 0; d < c->D; d++) ss += c->x[r * c->D + d] * c->x[r * c->D + d];
        for (int d = 0; d < c->D; d++) {
            c->out[r * c->D + d] = c->x[r * c->D + d] / sqrt(ss + c->eps);
            s += c->out[r * c->D + d] * c->R[r * c->D + d];
        }
    }
    return s;
}

static void test_l2norm(void **state) {
    enum { Rows = 12, D = 16 };
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 30);
    float *x = mt_test_randn(&rng, Rows * D, 1), *R = mt_test_randn(&rng, Rows * D, 1);
    for (int d = 0; d < D; d++) x[3 * D + d] *= 1e-3f; /* a short row: eps matters */
    l2_ref c = {mt_test_to_double(x, Rows * D), mt_test_to_double(R, Rows * D), mt_test_dnew(Rows * D), Rows,
                D, 1e-6};
    l2_loss(&c);
    float *out = mt_test_fnew(Rows * D), *rinv = mt_test_fnew(Rows), *ref = mt_test_to_float(c.out, Rows * D);
    mt_test_nan_fill(out, Rows * D);
    be->l2norm_forward(be, out, rinv, x, Rows, D, 1e-6f);
    assert_true(mt_allclose("l2norm_forward", out, ref, Rows * D, FWD_ATOL, FWD_RTOL));
    /* h 1e-6 here: the short row's |x| ~ 4e-3 is too curved for FD_H */
    double *gxd = mt_test_fd_grad_d(l2_loss, &c, c.x, Rows * D, 1e-6);
    float *gx = mt_test_to_float(gxd, Rows * D), *dx = mt_test_fnew(Rows * D);
    free(gxd);
    mt_test_nan_fill(dx, Rows * D);
    be->l2norm_backward(be, dx, R, x, rinv, Rows, D);
    assert_true(mt_allclose("l2norm_backward", dx, gx, Rows * D, BWD_ATOL, BWD_RTOL));
    free(x), free(R), free(c.x), free(c.R), free(c.out), free(out), free(rinv), free(ref);
    free(gx), free(dx);
}

/* ---------------- gated RMSNorm ---------------- */

typedef struct {
    double *x, *z, *w, *R, *out;
    int Rows, C;
    double eps;
} grms_ref;

static double grms_loss(void *p) {
    grms_ref *c = p;
    double s = 0;
    for (int r = 0; r < c->Rows; r++) {
        double ss = 0;
        for (int i = 0; i < c->C; i++) ss += c->x[r * c->C + i] * c->x[r * c->C + i];
        double rs = 1.0 / sqrt(ss / c->C + c->eps);
        for (int i = 0; i < c->C; i++) {
            size_t e = (size_t)r * c->C + i;
            c->out[e] = c->w[i] * c->x[e] * rs * silu(c->z[e]);
            s += c->out[e] * c->R[e];
        }
    }
    return s;
}

static void test_gated_rmsnorm(void **state) {
    enum { Rows = 10, C = 12 };
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 40);
    float *x = mt_test_randn(&rng, Rows * C, 1), *z = mt_test_randn(&rng, Rows * C, 2),
          *w = mt_test_randn(&rng, C, 1);
    float *R = mt_test_randn(&rng, Rows * C, 1);
    grms_ref c = {mt_test_to_double(x, Rows * C), mt_test_to_double(z, Rows * C), mt_test_to_double(w, C),
                  mt_test_to_double(R, Rows * C), mt_test_dnew(Rows * C), Rows, C, 1e-6};
    grms_loss(&c);
    float *out = mt_test_fnew(Rows * C), *rstd = mt_test_fnew(Rows), *ref = mt_test_to_float(c.out, Rows * C);
    mt_test_nan_fill(out, Rows * C);
    be->gated_rmsnorm_forward(be, out, rstd, x, z, w, Rows, C, 1e-6f);
    assert_true(mt_allclose("gated_rmsnorm_forward", out, ref, Rows * C, FWD_ATOL, FWD_RTOL));
    float *gx = mt_test_fd_grad(grms_loss, &c, c.x, Rows * C, FD_H),
          *gz = mt_test_fd_grad(grms_loss, &c, c.z, Rows * C, FD_H);
    float *gw = mt_test_fd_grad(grms_loss, &c, c.w, C, FD_H);
    float *dx = mt_test_fnew(Rows * C), *dz = mt_test_fnew(Rows * C), *dw = mt_test_fnew(C);
    mt_test_nan_fill(dx, Rows * C), mt_test_nan_fill(dz, Rows * C);
    for (int i = 0; i < C; i++) dw[i] = 0.5f, gw[i] += 0.5f; /* accumulates */
    be->gated_rmsnorm_backward(be, dx, dz, dw, R, x, z, w, rstd, Rows, C);
    assert_true(mt_allclose("gated_rmsnorm_backward dinp", dx, gx, Rows * C, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("gated_rmsnorm_backward dgate", dz, gz, Rows * C, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("gated_rmsnorm_backward dweight (+= 0.5)", dw, gw, C, BWD_ATOL, BWD_RTOL));
    float *dx2 = mt_test_fnew(Rows * C), *dz2 = mt_test_fnew(Rows * C); /* dweight NULL: the same bits */
    mt_test_nan_fill(dx2, Rows * C), mt_test_nan_fill(dz2, Rows * C);
    be->gated_rmsnorm_backward(be, dx2, dz2, NULL, R, x, z, w, rstd, Rows, C);
    assert_memory_equal(dx2, dx, Rows * C * sizeof(float));
    assert_memory_equal(dz2, dz, Rows * C * sizeof(float));
    free(dx2), free(dz2);
    free(x), free(z), free(w), free(R), free(c.x), free(c.z), free(c.w), free(c.R), free(c.out);
    free(out), free(rstd), free(ref), free(gx), free(gz), free(gw), free(dx), free(dz), free(dw);
}

/* ---------------- the decay and beta maps ---------------- */

typedef struct {
    double *a, *b, *A, *dt, *Rg, *Rb, *g, *beta;
    int N, H;
} gates_ref;

static double gates_loss(void *p) {
    gates_ref *c = p;
    double s = 0;
    for (int n = 0; n < c->N; n++)
        for (int h = 0; h < c->H; h++) {
            size_t i = (size_t)n * c->H + h;
            double x = c->a[i] + c->dt[h];
            c->g[i] = -exp(c->A[h]) * (x > 20 ? x : log1p(exp(x)));
            c->beta[i] = 1.0 / (1.0 + exp(-c->b[i]));
            s += c->g[i] * c->Rg[i] + c->beta[i] * c->Rb[i];
        }
    return s;
}

static void test_gdn_gates(void **state) {
    enum { N = 9, H = 4 };
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 50);
    float *a = mt_test_randn(&rng, N * H, 2), *b = mt_test_randn(&rng, N * H, 2),
          *A = mt_test_randn(&rng, H, 1);
    float *dt = mt_test_randn(&rng, H, 1), *Rg = mt_test_randn(&rng, N * H, 1),
          *Rb = mt_test_randn(&rng, N * H, 1);
    a[5] = 25.0f; /* softplus above its threshold: the identity */
    gates_ref c = {mt_test_to_double(a, N * H), mt_test_to_double(b, N * H), mt_test_to_double(A, H),
                   mt_test_to_double(dt, H), mt_test_to_double(Rg, N * H), mt_test_to_double(Rb, N * H),
                   mt_test_dnew(N * H), mt_test_dnew(N * H), N, H};
    gates_loss(&c);
    float *g = mt_test_fnew(N * H), *beta = mt_test_fnew(N * H);
    float *rg = mt_test_to_float(c.g, N * H), *rb = mt_test_to_float(c.beta, N * H);
    mt_test_nan_fill(g, N * H), mt_test_nan_fill(beta, N * H);
    be->gdn_gates_forward(be, g, beta, a, b, A, dt, N, H);
    assert_true(mt_allclose("gdn_gates_forward g", g, rg, N * H, FWD_ATOL, FWD_RTOL));
    assert_true(mt_allclose("gdn_gates_forward beta", beta, rb, N * H, FWD_ATOL, FWD_RTOL));
    float *ga = mt_test_fd_grad(gates_loss, &c, c.a, N * H, FD_H),
          *gb = mt_test_fd_grad(gates_loss, &c, c.b, N * H, FD_H);
    float *gA = mt_test_fd_grad(gates_loss, &c, c.A, H, FD_H),
          *gdt = mt_test_fd_grad(gates_loss, &c, c.dt, H, FD_H);
    float *da = mt_test_fnew(N * H), *db = mt_test_fnew(N * H), *dA = mt_test_fnew(H), *ddt = mt_test_fnew(H);
    mt_test_nan_fill(da, N * H), mt_test_nan_fill(db, N * H);
    for (int h = 0; h < H; h++) dA[h] = 2.0f, ddt[h] = -1.0f, gA[h] += 2.0f, gdt[h] -= 1.0f;
    be->gdn_gates_backward(be, da, db, dA, ddt, Rg, Rb, a, b, A, dt, N, H);
    assert_true(mt_allclose("gdn_gates_backward da", da, ga, N * H, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("gdn_gates_backward db", db, gb, N * H, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("gdn_gates_backward dA_log (+= 2)", dA, gA, H, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("gdn_gates_backward ddt_bias (+= -1)", ddt, gdt, H, BWD_ATOL, BWD_RTOL));
    /* dA_log, ddt_bias or both NULL: da, db and the other sum the same bits */
    float *da2 = mt_test_fnew(N * H), *db2 = mt_test_fnew(N * H), *dA2 = mt_test_fnew(H),
          *ddt2 = mt_test_fnew(H);
    for (int mode = 0; mode < 3; mode++) {
        mt_test_nan_fill(da2, N * H), mt_test_nan_fill(db2, N * H);
        for (int h = 0; h < H; h++) dA2[h] = 2.0f, ddt2[h] = -1.0f;
        be->gdn_gates_backward(be, da2, db2, mode == 1 ? dA2 : NULL, mode == 0 ? ddt2 : NULL, Rg,
                               Rb, a, b, A, dt, N, H);
        assert_memory_equal(da2, da, N * H * sizeof(float));
        assert_memory_equal(db2, db, N * H * sizeof(float));
        if (mode == 0) assert_memory_equal(ddt2, ddt, H * sizeof(float));
        if (mode == 1) assert_memory_equal(dA2, dA, H * sizeof(float));
        for (int h = 0; h < H; h++) { /* the NULL one's buffer: untouched */
            if (mode != 1) assert_true(dA2[h] == 2.0f);
            if (mode != 0) assert_true(ddt2[h] == -1.0f);
        }
    }
    free(da2), free(db2), free(dA2), free(ddt2);
    free(a), free(b), free(A), free(dt), free(Rg), free(Rb), free(c.a), free(c.b), free(c.A);
    free(c.dt), free(c.Rg), free(c.Rb), free(c.g), free(c.beta), free(g), free(beta), free(rg);
    free(rb), free(ga), free(gb), free(gA), free(gdt), free(da), free(db), free(dA), free(ddt);
}

/* ---------------- frozen weights at threaded sizes ---------------- */

/* The full call and the one with NULL weight gradients, compared bit for bit, at sizes past the
 * ops' parallel thresholds (per-thread partials in the norm, many channel blocks in the conv). */
static void test_frozen_weights_large(void **state) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 70);
    { /* conv: 3 channel blocks, packed documents */
        enum { B = 2, T = 70, C = 150, K = 4 };
        static const int st[2][6] = {{0, 5, 33, 70, 70, 70}, {0, 64, 70, 70, 70, 70}};
        size_t n = (size_t)B * T * C;
        float *x = mt_test_randn(&rng, n, 1), *w = mt_test_randn(&rng, C * K, 0.5f),
              *R = mt_test_randn(&rng, n, 1);
        float *dw = mt_test_fnew(C * K), *dx = mt_test_fnew(n), *dx2 = mt_test_fnew(n);
        int32_t *ds = docs_from(st, B, T);
        for (int i = 0; i < C * K; i++) dw[i] = 0.0f;
        mt_test_nan_fill(dx, n), mt_test_nan_fill(dx2, n);
        be->causal_conv1d_backward(be, dx, dw, R, x, w, ds, B, T, C, K, 0);
        be->causal_conv1d_backward(be, dx2, NULL, R, x, w, ds, B, T, C, K, 0);
        assert_memory_equal(dx2, dx, n * sizeof(float));
        free(x), free(w), free(R), free(dw), free(dx), free(dx2), free(ds);
    }
    { /* gated RMSNorm: 38400 elements, threaded with partials */
        enum { Rows = 300, C = 128 };
        size_t n = (size_t)Rows * C;
        float *x = mt_test_randn(&rng, n, 1), *z = mt_test_randn(&rng, n, 2), *w = mt_test_randn(&rng, C, 1);
        float *R = mt_test_randn(&rng, n, 1), *y = mt_test_fnew(n), *rstd = mt_test_fnew(Rows),
              *dw = mt_test_fnew(C);
        float *dx = mt_test_fnew(n), *dz = mt_test_fnew(n), *dx2 = mt_test_fnew(n), *dz2 = mt_test_fnew(n);
        be->gated_rmsnorm_forward(be, y, rstd, x, z, w, Rows, C, 1e-6f);
        for (int i = 0; i < C; i++) dw[i] = 0.0f;
        be->gated_rmsnorm_backward(be, dx, dz, dw, R, x, z, w, rstd, Rows, C);
        be->gated_rmsnorm_backward(be, dx2, dz2, NULL, R, x, z, w, rstd, Rows, C);
        assert_memory_equal(dx2, dx, n * sizeof(float));
        assert_memory_equal(dz2, dz, n * sizeof(float));
        free(x), free(z), free(w), free(R), free(y), free(rstd), free(dw), free(dx), free(dz);
        free(dx2), free(dz2);
    }
    { /* gates: 40000 elements, threaded */
        enum { N = 5000, H = 8 };
        size_t n = (size_t)N * H;
        float *a = mt_test_randn(&rng, n, 2), *b = mt_test_randn(&rng, n, 2), *A = mt_test_randn(&rng, H, 1);
        float *dt = mt_test_randn(&rng, H, 1), *Rg = mt_test_randn(&rng, n, 1),
              *Rb = mt_test_randn(&rng, n, 1);
        float *da = mt_test_fnew(n), *db = mt_test_fnew(n), *da2 = mt_test_fnew(n), *db2 = mt_test_fnew(n),
              dA[H], ddt[H];
        for (int h = 0; h < H; h++) dA[h] = 0.0f, ddt[h] = 0.0f;
        be->gdn_gates_backward(be, da, db, dA, ddt, Rg, Rb, a, b, A, dt, N, H);
        be->gdn_gates_backward(be, da2, db2, NULL, NULL, Rg, Rb, a, b, A, dt, N, H);
        assert_memory_equal(da2, da, n * sizeof(float));
        assert_memory_equal(db2, db, n * sizeof(float));
        free(a), free(b), free(A), free(dt), free(Rg), free(Rb), free(da), free(db), free(da2);
        free(db2);
    }
}

int main(void) {
    be = mt_backend_cpu_create();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gated_delta_shapes),
        cmocka_unit_test(test_gated_delta_decays),
        cmocka_unit_test(test_gated_delta_documents),
        cmocka_unit_test(test_gated_delta_packed_equals_separate),
        cmocka_unit_test(test_gated_delta_spans_equal_whole),
        cmocka_unit_test(test_gated_delta_flops),
        cmocka_unit_test(test_gated_delta_transformers),
        cmocka_unit_test(test_causal_conv1d),
        cmocka_unit_test(test_l2norm),
        cmocka_unit_test(test_gated_rmsnorm),
        cmocka_unit_test(test_gdn_gates),
        cmocka_unit_test(test_frozen_weights_large),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    be->destroy(be);
    return rc;
}
