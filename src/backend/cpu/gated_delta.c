/* The gated delta rule (Gated DeltaNet's core), chunked forward; the chunk algebra is in
 * gated_delta_chunk.h. One task per (row, value head) scans its chunks in order, keeping the state
 * in double (rounded to fp32 only where chunk_states saves it); every product is a dgemm
 * (single-threaded inside our OpenMP region, as attention.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "../../core/error.h"
#include "cpu_ops.h"
#include "gated_delta_chunk.h"

void mt_gd_chunk_alloc(mt_gd_chunk *c, int Dk, int Dv) {
    const size_t L = MT_GD_CHUNK, f = sizeof(double);
    memset(c, 0, sizeof *c);
    c->Dk = Dk, c->Dv = Dv;
    c->Qs = mt_aligned_alloc(L * Dk * f), c->Kc = mt_aligned_alloc(L * Dk * f);
    c->Vc = mt_aligned_alloc(L * Dv * f);
    c->beta = mt_aligned_alloc(L * f), c->fe = mt_aligned_alloc(L * f);
    c->lam = mt_aligned_alloc(L * f);
    c->ds = mt_aligned_alloc(L * sizeof(int32_t));
    c->G = mt_aligned_alloc(L * f);
    c->Dm = mt_aligned_alloc(L * L * f), c->KD = mt_aligned_alloc(L * L * f);
    c->P = mt_aligned_alloc(L * L * f), c->Tm = mt_aligned_alloc(L * L * f);
    c->X = mt_aligned_alloc(L * Dv * f), c->R = mt_aligned_alloc(L * Dv * f);
    c->U = mt_aligned_alloc(L * Dv * f);
}

void mt_gd_chunk_free(mt_gd_chunk *c) {
    free(c->Qs), free(c->Kc), free(c->Vc), free(c->beta), free(c->fe), free(c->lam), free(c->ds);
    free(c->G), free(c->Dm), free(c->KD), free(c->P), free(c->Tm), free(c->X), free(c->R);
    free(c->U);
}

void mt_gd_chunk_load(mt_gd_chunk *c, const float *q, const float *k, const float *v,
                      const float *g, const float *beta, const int32_t *doc_start, int b, int c0,
                      int L, int kh, int vh, int T, int Hk, int Hv, float scale, int t0) {
    int Dk = c->Dk, Dv = c->Dv;
    c->L = L;
    for (int i = 0; i < L; i++) {
        size_t n = (size_t)b * T + c0 + i;
        const float *qi = q + (n * Hk + kh) * Dk, *ki = k + (n * Hk + kh) * Dk;
        const float *vi = v + (n * Hv + vh) * Dv;
        for (int d = 0; d < Dk; d++) {
            c->Qs[(size_t)i * Dk + d] = (double)qi[d] * scale;
            c->Kc[(size_t)i * Dk + d] = ki[d];
        }
        for (int d = 0; d < Dv; d++) c->Vc[(size_t)i * Dv + d] = vi[d];
        c->beta[i] = beta[n * Hv + vh];
        c->G[i] = (i ? c->G[i - 1] : 0.0) + (double)g[n * Hv + vh];
        /* s: the document start in the row; ds relative to the call (< 0: begun before it) */
        int t = c0 + i, s = doc_start ? doc_start[n] : 0;
        /* documents are runs: a token starts one (s == t0 + t) or continues the previous token's */
        MT_CHECK(s >= 0 && s <= t0 + t &&
                     (s == t0 + t || t == 0 || !doc_start || doc_start[n - 1] == s),
                 "gated_delta: doc_start[%d*T+%d] = %d is not a run of documents", b, t, s);
        c->ds[i] = s - t0;
    }
    double Gl = c->G[L - 1];
    for (int i = 0; i < L; i++) {
        c->fe[i] = c->ds[i] < c0 ? exp(c->G[i]) : 0.0;
        c->lam[i] = c->ds[i] == c->ds[L - 1] ? exp(Gl - c->G[i]) : 0.0;
        double *row = c->Dm + (size_t)i * L;
        for (int j = 0; j < L; j++)
            row[j] = j <= i && c->ds[j] == c->ds[i] ? exp(c->G[i] - c->G[j]) : 0.0;
    }
    c->eL = c->ds[L - 1] < c0 ? exp(Gl) : 0.0;
}

void mt_gd_chunk_solve(mt_gd_chunk *c, const double *S0) {
    int L = c->L, Dk = c->Dk, Dv = c->Dv;
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, L, Dk, 1.0, c->Kc, Dk, c->Kc, Dk, 0.0,
                c->KD, L);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, L, Dk, 1.0, c->Qs, Dk, c->Kc, Dk, 0.0,
                c->P, L);
    for (int i = 0; i < L; i++)
        for (int j = 0; j < L; j++) {
            size_t ij = (size_t)i * L + j;
            c->P[ij] *= c->Dm[ij];
            c->KD[ij] = j < i ? c->KD[ij] * c->Dm[ij] : 0.0;
        }
    /* Tm = (I + A)^-1 by forward substitution, A_im = beta_i KD_im (unit lower triangular) */
    for (int i = 0; i < L; i++) {
        double *Ti = c->Tm + (size_t)i * L;
        const double *KDi = c->KD + (size_t)i * L;
        for (int j = 0; j < i; j++) {
            double s = 0.0;
            for (int m = j; m < i; m++) s += KDi[m] * c->Tm[(size_t)m * L + j];
            Ti[j] = -c->beta[i] * s;
        }
        Ti[i] = 1.0;
        for (int j = i + 1; j < L; j++) Ti[j] = 0.0;
    }
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, Dv, Dk, 1.0, c->Kc, Dk, S0, Dv, 0.0,
                c->X, Dv);
    for (int i = 0; i < L; i++)
        for (int d = 0; d < Dv; d++) {
            size_t id = (size_t)i * Dv + d;
            c->R[id] = c->beta[i] * (c->Vc[id] - c->fe[i] * c->X[id]);
        }
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, Dv, L, 1.0, c->Tm, L, c->R, Dv, 0.0,
                c->U, Dv);
}

void mt_cpu_gated_delta_forward(float *out, float *chunk_states, const float *q, const float *k,
                                const float *v, const float *g, const float *beta,
                                const int32_t *doc_start, int B, int T, int Hk, int Hv, int Dk,
                                int Dv, float scale, const mt_gated_delta_span *span) {
    MT_CHECK(Hk > 0 && Hv % Hk == 0, "gated_delta: Hv=%d is not a multiple of Hk=%d", Hv, Hk);
    if (B <= 0 || T <= 0) return;
    int rep = Hv / Hk, nc = (T + MT_GD_CHUNK - 1) / MT_GD_CHUNK;
    size_t SS = (size_t)Dk * Dv;
#pragma omp parallel
    {
        mt_gd_chunk c;
        mt_gd_chunk_alloc(&c, Dk, Dv);
        double *S = mt_aligned_alloc(SS * sizeof(double));
        double *Y = mt_aligned_alloc((size_t)MT_GD_CHUNK * Dv * sizeof(double));
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < B * Hv; task++) {
            int b = task / Hv, vh = task % Hv, kh = vh / rep;
            const float *S_in = span && span->state_in ? span->state_in + (size_t)task * SS : NULL;
            for (size_t e = 0; e < SS; e++) S[e] = S_in ? S_in[e] : 0.0;
            for (int ci = 0; ci < nc; ci++) {
                int c0 = ci * MT_GD_CHUNK, L = T - c0 < MT_GD_CHUNK ? T - c0 : MT_GD_CHUNK;
                float *Ssave = chunk_states + (((size_t)b * Hv + vh) * nc + ci) * SS;
                for (size_t e = 0; e < SS; e++) Ssave[e] = (float)S[e];
                mt_gd_chunk_load(&c, q, k, v, g, beta, doc_start, b, c0, L, kh, vh, T, Hk, Hv,
                                 scale, span ? span->t0 : 0);
                mt_gd_chunk_solve(&c, S);
                /* O = diag(fe) Q S0 + P U */
                cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, Dv, Dk, 1.0, c.Qs, Dk, S,
                            Dv, 0.0, Y, Dv);
                for (int i = 0; i < L; i++)
                    for (int d = 0; d < Dv; d++) Y[(size_t)i * Dv + d] *= c.fe[i];
                cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, Dv, L, 1.0, c.P, L, c.U,
                            Dv, 1.0, Y, Dv);
                float *O = out + (((size_t)b * T + c0) * Hv + vh) * Dv;
                for (int i = 0; i < L; i++)
                    for (int d = 0; d < Dv; d++) O[(size_t)i * Hv * Dv + d] = (float)Y[(size_t)i * Dv + d];
                /* S = eL S + K^T diag(lam) U (K's rows scaled in place: the chunk is done with K) */
                for (size_t e = 0; e < SS; e++) S[e] *= c.eL;
                for (int i = 0; i < L; i++)
                    for (int d = 0; d < Dk; d++) c.Kc[(size_t)i * Dk + d] *= c.lam[i];
                cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Dk, Dv, L, 1.0, c.Kc, Dk, c.U,
                            Dv, 1.0, S, Dv);
            }
            if (span && span->state_out)
                for (size_t e = 0; e < SS; e++)
                    span->state_out[(size_t)task * SS + e] = (float)S[e];
        }
        free(S), free(Y);
        mt_gd_chunk_free(&c);
    }
}
