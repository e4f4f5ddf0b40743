/* The fp32 CPU attention against a plain double-precision reference.
 *
 * Forward (out and lse): atol 1e-6 rtol 1e-5 against the double reference.
 * Backward (dq, dk, dv): atol 1e-5 rtol 1e-4 against central finite differences (h = 1e-4, double)
 * of the double forward for the scalar sum(out * dout). Outputs are poisoned with NaN first.
 * Shapes cover G = 1, 1 < G < H and G = H, D = 4/8/16, T from 5 to 140 (three query tiles of 64),
 * and rows packing one to three documents through doc_start. Packed documents must equal the same
 * documents run one by one.
 * The options (mt_attention_opts): a window of W keys (the current one included; W 1, inside a
 * tile, across tiles, and with documents), per-head sinks (an extra logit in each row's
 * denominator) with their gradient against finite differences of the double reference, and a
 * custom scale, alone and together, to the same bounds.
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
    double *q, *k, *v, *dout, *out, *lse;
    const int32_t *doc_start;
    int B, T, H, G, D;
    double scale;  /* 0: 1/sqrt(D) */
    int window;    /* 0: none */
    double *sinks; /* (H) or NULL */
} attn_ctx;

/* Written from the definition: key s visible to query t iff doc_start <= s <= t and s > t - W;
 * p_s = exp(score_s) / (sum_visible exp(score) + exp(sink_h)). */
static void attn_ref(attn_ctx *c) {
    int B = c->B, T = c->T, H = c->H, G = c->G, D = c->D, rep = H / G;
    double scale = c->scale != 0 ? c->scale : 1.0 / sqrt((double)D);
    double *p = mt_test_dnew(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                int s0 = c->doc_start ? c->doc_start[b * T + t] : 0;
                if (c->window > 0 && t - c->window + 1 > s0) s0 = t - c->window + 1;
                const double *qv = c->q + ((size_t)(b * T + t) * H + h) * D;
                double mx = c->sinks ? c->sinks[h] : -INFINITY;
                for (int s = s0; s <= t; s++) {
                    const double *kv = c->k + ((size_t)(b * T + s) * G + h / rep) * D;
                    double dot = 0;
                    for (int d = 0; d < D; d++) dot += qv[d] * kv[d];
                    p[s] = dot * scale;
                    if (p[s] > mx) mx = p[s];
                }
                double sum = c->sinks ? exp(c->sinks[h] - mx) : 0;
                for (int s = s0; s <= t; s++) sum += (p[s] = exp(p[s] - mx));
                c->lse[((size_t)b * H + h) * T + t] = mx + log(sum);
                double *o = c->out + ((size_t)(b * T + t) * H + h) * D;
                for (int d = 0; d < D; d++) o[d] = 0;
                for (int s = s0; s <= t; s++) {
                    const double *vv = c->v + ((size_t)(b * T + s) * G + h / rep) * D;
                    for (int d = 0; d < D; d++) o[d] += p[s] / sum * vv[d];
                }
            }
    free(p);
}

static double attn_loss(void *p) {
    attn_ctx *c = p;
    attn_ref(c);
    size_t n = (size_t)c->B * c->T * c->H * c->D;
    double s = 0;
    for (size_t i = 0; i < n; i++) s += c->out[i] * c->dout[i];
    return s;
}

/* doc_start for rows split at random into 1..3 documents (NULL when docs == 0). */
static int32_t *make_docs(mt_test_rng *rng, int B, int T, int docs) {
    if (!docs) return NULL;
    int32_t *ds = malloc((size_t)B * T * sizeof *ds);
    for (int b = 0; b < B; b++) {
        int ndocs = 1 + (int)(mt_test_rng_u64(rng) % 3), start = 0;
        for (int t = 0; t < T; t++) {
            /* a new document begins here with probability (ndocs-1)/T */
            if (t > 0 && (int)(mt_test_rng_u64(rng) % (uint64_t)T) < ndocs - 1) start = t;
            ds[b * T + t] = start;
        }
    }
    return ds;
}

/* The op under the options (scale 0: the default; window 0: none; sinks: with per-head sinks;
 * all defaults pass opts NULL) against the double reference. */
static void check_attention_opts(int B, int T, int H, int G, int D, int docs, uint64_t seed,
                                 float scale, int window, int sinks) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * G * D, nl = (size_t)B * H * T;
    float *q = mt_test_randn(&rng, nq, 1), *k = mt_test_randn(&rng, nk, 1), *v = mt_test_randn(&rng, nk, 1);
    float *dout = mt_test_randn(&rng, nq, 1);
    int32_t *ds = make_docs(&rng, B, T, docs);
    float *sk = sinks ? mt_test_randn(&rng, (size_t)H, 1.5f) : NULL; /* a sizeable share of each row */
    attn_ctx c = {mt_test_to_double(q, nq), mt_test_to_double(k, nk), mt_test_to_double(v, nk),
                  mt_test_to_double(dout, nq), mt_test_dnew(nq), mt_test_dnew(nl), ds, B, T, H, G, D, scale,
                  window, sk ? mt_test_to_double(sk, (size_t)H) : NULL};
    attn_ref(&c);
    float *dsk = mt_test_fnew((size_t)H);
    for (int h = 0; h < H; h++) dsk[h] = 0.25f; /* the sinks' gradient accumulates onto this */
    mt_attention_opts o = {scale, window, sk, sk ? dsk : NULL};
    const mt_attention_opts *opts = scale == 0 && window == 0 && !sinks ? NULL : &o;
    float *out = mt_test_fnew(nq), *lse = mt_test_fnew(nl);
    mt_test_nan_fill(out, nq), mt_test_nan_fill(lse, nl);
    be->attention_forward(be, out, lse, q, k, v, ds, B, T, H, G, D, opts);
    float *ref_out = mt_test_to_float(c.out, nq), *ref_lse = mt_test_to_float(c.lse, nl);
    fprintf(stderr, "attention B=%d T=%d H=%d G=%d D=%d%s scale %g window %d%s\n", B, T, H, G, D,
            docs ? " (packed documents)" : "", (double)scale, window, sinks ? " sinks" : "");
    assert_true(mt_allclose("attention_forward out", out, ref_out, nq, FWD_ATOL, FWD_RTOL));
    assert_true(mt_allclose("attention_forward lse", lse, ref_lse, nl, FWD_ATOL, FWD_RTOL));

    /* an input of batch row b changes only row b's outputs: difference one row at a time */
    float *gq = mt_test_fnew(nq), *gk = mt_test_fnew(nk), *gv = mt_test_fnew(nk);
    size_t rq = (size_t)T * H * D, rk = (size_t)T * G * D;
    for (int b = 0; b < B; b++) {
        attn_ctx cb = {c.q + b * rq, c.k + b * rk, c.v + b * rk, c.dout + b * rq, c.out, c.lse,
                       ds ? ds + (size_t)b * T : NULL, 1, T, H, G, D, scale, window, c.sinks};
        float *g1 = mt_test_fd_grad(attn_loss, &cb, cb.q, rq, FD_H),
              *g2 = mt_test_fd_grad(attn_loss, &cb, cb.k, rk, FD_H);
        float *g3 = mt_test_fd_grad(attn_loss, &cb, cb.v, rk, FD_H);
        memcpy(gq + b * rq, g1, rq * sizeof(float));
        memcpy(gk + b * rk, g2, rk * sizeof(float));
        memcpy(gv + b * rk, g3, rk * sizeof(float));
        free(g1), free(g2), free(g3);
    }
    float *dq = mt_test_fnew(nq), *dk = mt_test_fnew(nk), *dv = mt_test_fnew(nk);
    mt_test_nan_fill(dq, nq), mt_test_nan_fill(dk, nk), mt_test_nan_fill(dv, nk);
    be->attention_backward(be, dq, dk, dv, dout, out, lse, q, k, v, ds, B, T, H, G, D, opts);
    assert_true(mt_allclose("attention_backward dq", dq, gq, nq, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("attention_backward dk", dk, gk, nk, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("attention_backward dv", dv, gv, nk, BWD_ATOL, BWD_RTOL));
    if (sinks) { /* the whole batch's loss against each sink, onto the 0.25 already there */
        float *gs = mt_test_fd_grad(attn_loss, &c, c.sinks, (size_t)H, FD_H);
        for (int h = 0; h < H; h++) gs[h] += 0.25f;
        assert_true(mt_allclose("attention_backward dsinks", dsk, gs, (size_t)H, BWD_ATOL, BWD_RTOL));
        free(gs);
    }

    /* written, not accumulated: a second call gives the same bits (the sinks' gradient adds) */
    float *dq2 = mt_test_fnew(nq);
    memcpy(dq2, dq, nq * sizeof(float));
    be->attention_backward(be, dq, dk, dv, dout, out, lse, q, k, v, ds, B, T, H, G, D, opts);
    assert_memory_equal(dq, dq2, nq * sizeof(float));
    free(sk), free(dsk), free(c.sinks);

    free(q), free(k), free(v), free(dout), free(ds), free(c.q), free(c.k), free(c.v), free(c.dout);
    free(c.out), free(c.lse), free(out), free(lse), free(ref_out), free(ref_lse), free(gq);
    free(gk), free(gv), free(dq), free(dk), free(dv), free(dq2);
}

static void check_attention(int B, int T, int H, int G, int D, int docs, uint64_t seed) {
    check_attention_opts(B, T, H, G, D, docs, seed, 0, 0, 0);
}

/* gpt-oss's options: windows (1 key; inside a tile; wider than a tile with three tiles), sinks,
 * a custom scale, with GQA and packed documents. */
static void test_attention_options(void **state) {
    check_attention_opts(2, 17, 4, 2, 8, 0, 11, 0, 5, 0);    /* window alone */
    check_attention_opts(1, 9, 2, 1, 8, 0, 12, 0, 1, 0);     /* W = 1: each query sees itself */
    check_attention_opts(2, 17, 4, 2, 8, 0, 13, 0, 0, 1);    /* sinks alone */
    check_attention_opts(2, 17, 4, 2, 8, 0, 14, 0.2f, 0, 0); /* scale alone */
    check_attention_opts(2, 23, 4, 2, 16, 1, 15, 0.3f, 6, 1); /* all three, packed documents */
    check_attention_opts(1, 140, 2, 1, 4, 0, 16, 0, 70, 1);  /* a window across tiles of 64 */
    check_attention_opts(1, 140, 2, 2, 4, 1, 17, 0, 9, 1);   /* windows and documents, 3 tiles */
}

static void test_attention_gqa(void **state) {
    check_attention(2, 5, 4, 2, 8, 0, 1);
    check_attention(1, 33, 4, 1, 16, 0, 2); /* G = 1 (multi-query) */
    check_attention(2, 17, 4, 4, 8, 0, 3);  /* G = H */
    check_attention(1, 1, 2, 1, 8, 0, 4);   /* one token */
}

static void test_attention_docs(void **state) {
    check_attention(2, 17, 4, 4, 8, 1, 5);
    check_attention(3, 33, 4, 2, 16, 1, 6);
    check_attention(1, 140, 2, 1, 4, 1, 7); /* three tiles, tiles starting inside a document */
    check_attention(1, 130, 2, 2, 4, 0, 8);
}

/* Gathers rows [t0, t0+len) of row b of x (B*T, w) into y (len, w). */
static void gather(float *y, const float *x, int b, int T, int t0, int len, int w) {
    memcpy(y, x + ((size_t)b * T + t0) * w, (size_t)len * w * sizeof(float));
}

/* Rows packing two or three documents equal the documents run one at a time. */
static void test_attention_packed_equals_separate(void **state) {
    enum { B = 2, T = 33, H = 4, G = 2, D = 8 };
    static const int starts[B][4] = {{0, 7, 19, T}, {0, 20, T, -1}};
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 9);
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * G * D, nl = (size_t)B * H * T;
    float *q = mt_test_randn(&rng, nq, 1), *k = mt_test_randn(&rng, nk, 1), *v = mt_test_randn(&rng, nk, 1);
    float *dout = mt_test_randn(&rng, nq, 1);
    int32_t ds[B * T];
    for (int b = 0; b < B; b++)
        for (int d = 0; starts[b][d] < T; d++)
            for (int t = starts[b][d]; t < starts[b][d + 1]; t++) ds[b * T + t] = starts[b][d];
    float *out = mt_test_fnew(nq), *lse = mt_test_fnew(nl), *dq = mt_test_fnew(nq), *dk = mt_test_fnew(nk),
          *dv = mt_test_fnew(nk);
    mt_test_nan_fill(out, nq), mt_test_nan_fill(lse, nl), mt_test_nan_fill(dq, nq);
    mt_test_nan_fill(dk, nk), mt_test_nan_fill(dv, nk);
    be->attention_forward(be, out, lse, q, k, v, ds, B, T, H, G, D, NULL);
    be->attention_backward(be, dq, dk, dv, dout, out, lse, q, k, v, ds, B, T, H, G, D, NULL);

    float *eo = mt_test_fnew(nq), *el = mt_test_fnew(nl), *edq = mt_test_fnew(nq), *edk = mt_test_fnew(nk),
          *edv = mt_test_fnew(nk);
    for (int b = 0; b < B; b++)
        for (int d = 0; starts[b][d] < T; d++) {
            int t0 = starts[b][d], len = starts[b][d + 1] - t0;
            float *sq = mt_test_fnew((size_t)len * H * D), *sk = mt_test_fnew((size_t)len * G * D);
            float *sv = mt_test_fnew((size_t)len * G * D), *sdo = mt_test_fnew((size_t)len * H * D);
            float *so = mt_test_fnew((size_t)len * H * D), *sl = mt_test_fnew((size_t)H * len);
            float *sdq = mt_test_fnew((size_t)len * H * D), *sdk = mt_test_fnew((size_t)len * G * D);
            float *sdv = mt_test_fnew((size_t)len * G * D);
            gather(sq, q, b, T, t0, len, H * D), gather(sk, k, b, T, t0, len, G * D);
            gather(sv, v, b, T, t0, len, G * D), gather(sdo, dout, b, T, t0, len, H * D);
            be->attention_forward(be, so, sl, sq, sk, sv, NULL, 1, len, H, G, D, NULL);
            be->attention_backward(be, sdq, sdk, sdv, sdo, so, sl, sq, sk, sv, NULL, 1, len, H, G,
                                   D, NULL);
            memcpy(eo + ((size_t)b * T + t0) * H * D, so, (size_t)len * H * D * sizeof(float));
            memcpy(edq + ((size_t)b * T + t0) * H * D, sdq, (size_t)len * H * D * sizeof(float));
            memcpy(edk + ((size_t)b * T + t0) * G * D, sdk, (size_t)len * G * D * sizeof(float));
            memcpy(edv + ((size_t)b * T + t0) * G * D, sdv, (size_t)len * G * D * sizeof(float));
            for (int h = 0; h < H; h++)
                memcpy(el + ((size_t)b * H + h) * T + t0, sl + (size_t)h * len,
                       (size_t)len * sizeof(float));
            free(sq), free(sk), free(sv), free(sdo), free(so), free(sl), free(sdq), free(sdk);
            free(sdv);
        }
    assert_true(mt_allclose("packed vs separate: out", out, eo, nq, FWD_ATOL, FWD_RTOL));
    assert_true(mt_allclose("packed vs separate: lse", lse, el, nl, FWD_ATOL, FWD_RTOL));
    assert_true(mt_allclose("packed vs separate: dq", dq, edq, nq, FWD_ATOL, FWD_RTOL));
    assert_true(mt_allclose("packed vs separate: dk", dk, edk, nk, FWD_ATOL, FWD_RTOL));
    assert_true(mt_allclose("packed vs separate: dv", dv, edv, nk, FWD_ATOL, FWD_RTOL));
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    free(eo), free(el), free(edq), free(edk), free(edv);
}

int main(void) {
    be = mt_backend_cpu_create();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_gqa),
        cmocka_unit_test(test_attention_docs),
        cmocka_unit_test(test_attention_packed_equals_separate),
        cmocka_unit_test(test_attention_options),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    be->destroy(be);
    return rc;
}
