/* The gated delta rule's chunked backward: chunks in reverse, each recomputed from its saved
 * incoming state (gated_delta_chunk.h), the state's gradient dS carried from chunk to chunk.
 * With dO the chunk's output gradient and dSn the gradient of its outgoing state:
 *   dU  = P^T dO + diag(lam) K dSn          dR = Tm^T dU          dV = diag(beta) dR
 *   dA  = -strict_lower(dR U^T)             dP = dO U^T (masked by Dm)
 *   dX  = -diag(beta fe) dR                 (X = K S0)
 *   dQ  = diag(fe) dO S0^T + (dP o Dm) K
 *   dK  = (dP o Dm)^T Q + (M + M^T) K + dX S0^T + diag(lam) U dSn^T,  M = diag(beta) dA o Dm
 *   dbeta_i = (V_i - fe_i X_i) . dR_i + sum_j dA_ij KD_ij
 *   dS0 = eL dSn + Q^T diag(fe) dO + K^T dX
 * and dG (the gradient of the cumulative decays) collects every exp(.)'s derivative; dg is its
 * reverse cumulative sum within the chunk. dq and dk sum over the value heads sharing a key head,
 * so one task owns one (row, key head) and walks its value heads: no races, fixed sum order.
 * All in double as the chunk (gated_delta_chunk.h says why): the saved fp32 state and dout are
 * widened on load, dS is carried in double, and only the gradients written out are rounded.
 */
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "../../core/error.h"
#include "cpu_ops.h"
#include "gated_delta_chunk.h"

typedef struct {
    double *dO, *dU, *dR, *dX, *Z;  /* (L, Dv) */
    double *dA, *dP;                /* (L, L) */
    double *W1, *W3, *dQs, *dKc;    /* (L, Dk) */
    double *dSn, *dS0, *S0;         /* (Dk, Dv): S0 the saved state, widened */
    double *dG;                     /* (L) */
} gd_grads;

static void grads_alloc(gd_grads *w, int Dk, int Dv) {
    const size_t L = MT_GD_CHUNK, f = sizeof(double);
    w->dO = mt_aligned_alloc(L * Dv * f), w->dU = mt_aligned_alloc(L * Dv * f);
    w->dR = mt_aligned_alloc(L * Dv * f), w->dX = mt_aligned_alloc(L * Dv * f);
    w->Z = mt_aligned_alloc(L * Dv * f);
    w->dA = mt_aligned_alloc(L * L * f), w->dP = mt_aligned_alloc(L * L * f);
    w->W1 = mt_aligned_alloc(L * Dk * f), w->W3 = mt_aligned_alloc(L * Dk * f);
    w->dQs = mt_aligned_alloc(L * Dk * f), w->dKc = mt_aligned_alloc(L * Dk * f);
    w->dSn = mt_aligned_alloc((size_t)Dk * Dv * f), w->dS0 = mt_aligned_alloc((size_t)Dk * Dv * f);
    w->S0 = mt_aligned_alloc((size_t)Dk * Dv * f);
    w->dG = mt_aligned_alloc(L * f);
}

static void grads_free(gd_grads *w) {
    free(w->dO), free(w->dU), free(w->dR), free(w->dX), free(w->Z), free(w->dA), free(w->dP);
    free(w->W1), free(w->W3), free(w->dQs), free(w->dKc), free(w->dSn), free(w->dS0), free(w->S0);
    free(w->dG);
}

static double dot(const double *a, const double *b, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* One chunk of (b, vh) at c0, already loaded and solved in c against S0. Adds its dq, dk rows,
 * writes its dv, dg, dbeta rows and leaves dS0 (the incoming state's gradient) in w->dS0. */
static void chunk_backward(mt_gd_chunk *c, gd_grads *w, const double *S0, const float *dout,
                           float *dq, float *dk, float *dv, float *dg, float *dbeta, int b, int c0,
                           int kh, int vh, int T, int Hk, int Hv, float scale) {
    int L = c->L, Dk = c->Dk, Dv = c->Dv;
    size_t n0 = (size_t)b * T + c0;
    for (int i = 0; i < L; i++) {
        const float *doi = dout + ((n0 + i) * Hv + vh) * Dv;
        for (int d = 0; d < Dv; d++) w->dO[(size_t)i * Dv + d] = doi[d];
        w->dG[i] = 0.0;
    }
    /* dU = P^T dO + diag(lam) K dSn;  dR = Tm^T dU */
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, L, Dv, L, 1.0, c->P, L, w->dO, Dv, 0.0,
                w->dU, Dv);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, Dv, Dk, 1.0, c->Kc, Dk, w->dSn, Dv,
                0.0, w->Z, Dv);
    for (int i = 0; i < L; i++)
        for (int d = 0; d < Dv; d++) w->dU[(size_t)i * Dv + d] += c->lam[i] * w->Z[(size_t)i * Dv + d];
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, L, Dv, L, 1.0, c->Tm, L, w->dU, Dv, 0.0,
                w->dR, Dv);
    /* dA = -dR U^T (strict lower), dP = dO U^T (lower) */
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, L, Dv, -1.0, w->dR, Dv, c->U, Dv, 0.0,
                w->dA, L);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, L, Dv, 1.0, w->dO, Dv, c->U, Dv, 0.0,
                w->dP, L);
    for (int i = 0; i < L; i++) {
        double db = 0.0;
        for (int j = 0; j < i; j++) {
            size_t ij = (size_t)i * L + j;
            /* d/dG of P_ij = QK_ij Dm_ij and A_ij = beta_i KD_ij: +at G_i, -at G_j */
            double wij = w->dP[ij] * c->P[ij] + w->dA[ij] * c->beta[i] * c->KD[ij];
            w->dG[i] += wij, w->dG[j] -= wij;
            db += w->dA[ij] * c->KD[ij];
        }
        /* dbeta through R = diag(beta)(V - diag(fe) X) */
        for (int d = 0; d < Dv; d++) {
            size_t id = (size_t)i * Dv + d;
            db += (c->Vc[id] - c->fe[i] * c->X[id]) * w->dR[id];
        }
        dbeta[(n0 + i) * Hv + vh] = (float)db;
        /* dP o Dm (lower incl. the diagonal); dA -> M = diag(beta) dA o Dm, mirrored: M + M^T */
        for (int j = 0; j < L; j++) {
            size_t ij = (size_t)i * L + j;
            w->dP[ij] = j <= i ? w->dP[ij] * c->Dm[ij] : 0.0;
            if (j < i) w->dA[ij] *= c->beta[i] * c->Dm[ij];
        }
    }
    for (int i = 0; i < L; i++) {
        w->dA[(size_t)i * L + i] = 0.0;
        for (int j = 0; j < i; j++) w->dA[(size_t)j * L + i] = w->dA[(size_t)i * L + j];
    }
    /* dQ = diag(fe) dO S0^T + (dP o Dm) K; the inter-chunk read's dG_i = fe_i Q_i . (S0 dO_i) */
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, Dk, Dv, 1.0, w->dO, Dv, S0, Dv, 0.0,
                w->W1, Dk);
    for (int i = 0; i < L; i++) {
        const double *W1i = w->W1 + (size_t)i * Dk;
        w->dG[i] += c->fe[i] * dot(c->Qs + (size_t)i * Dk, W1i, Dk);
        for (int d = 0; d < Dk; d++) w->dQs[(size_t)i * Dk + d] = c->fe[i] * W1i[d];
    }
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, Dk, L, 1.0, w->dP, L, c->Kc, Dk, 1.0,
                w->dQs, Dk);
    /* dX = -diag(beta fe) dR, its dG_i = X_i . dX_i; dV = diag(beta) dR */
    for (int i = 0; i < L; i++) {
        float *dvi = dv + ((n0 + i) * Hv + vh) * Dv;
        for (int d = 0; d < Dv; d++) {
            size_t id = (size_t)i * Dv + d;
            w->dX[id] = -c->beta[i] * c->fe[i] * w->dR[id];
            dvi[d] = (float)(c->beta[i] * w->dR[id]);
        }
        w->dG[i] += dot(c->X + (size_t)i * Dv, w->dX + (size_t)i * Dv, Dv);
    }
    /* dK = dX S0^T + diag(lam) U dSn^T + (dP o Dm)^T Q + (M + M^T) K; lam's dG from K_j . (dSn U_j) */
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, Dk, Dv, 1.0, w->dX, Dv, S0, Dv, 0.0,
                w->dKc, Dk);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, Dk, Dv, 1.0, c->U, Dv, w->dSn, Dv, 0.0,
                w->W3, Dk);
    for (int j = 0; j < L; j++) {
        const double *W3j = w->W3 + (size_t)j * Dk;
        double t = c->lam[j] * dot(c->Kc + (size_t)j * Dk, W3j, Dk);
        w->dG[L - 1] += t, w->dG[j] -= t;
        for (int d = 0; d < Dk; d++) w->dKc[(size_t)j * Dk + d] += c->lam[j] * W3j[d];
    }
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, L, Dk, L, 1.0, w->dP, L, c->Qs, Dk, 1.0,
                w->dKc, Dk);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, Dk, L, 1.0, w->dA, L, c->Kc, Dk, 1.0,
                w->dKc, Dk);
    /* dS0 = eL dSn + Q^T diag(fe) dO + K^T dX; eL's dG at the last token */
    size_t SS = (size_t)Dk * Dv;
    w->dG[L - 1] += c->eL * dot(S0, w->dSn, (int)SS);
    for (size_t e = 0; e < SS; e++) w->dS0[e] = c->eL * w->dSn[e];
    for (int i = 0; i < L; i++)
        for (int d = 0; d < Dv; d++) w->Z[(size_t)i * Dv + d] = c->fe[i] * w->dO[(size_t)i * Dv + d];
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Dk, Dv, L, 1.0, c->Qs, Dk, w->Z, Dv, 1.0,
                w->dS0, Dv);
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Dk, Dv, L, 1.0, c->Kc, Dk, w->dX, Dv, 1.0,
                w->dS0, Dv);
    /* dg_m = sum over i >= m of dG_i; dq, dk add into the key head's rows */
    double acc = 0.0;
    for (int i = L - 1; i >= 0; i--) {
        acc += w->dG[i];
        dg[(n0 + i) * Hv + vh] = (float)acc;
    }
    for (int i = 0; i < L; i++) {
        float *dqi = dq + ((n0 + i) * Hk + kh) * Dk, *dki = dk + ((n0 + i) * Hk + kh) * Dk;
        for (int d = 0; d < Dk; d++) {
            dqi[d] += (float)(scale * w->dQs[(size_t)i * Dk + d]);
            dki[d] += (float)w->dKc[(size_t)i * Dk + d];
        }
    }
}

void mt_cpu_gated_delta_backward(float *dq, float *dk, float *dv, float *dg, float *dbeta,
                                 const float *dout, const float *chunk_states, const float *q,
                                 const float *k, const float *v, const float *g, const float *beta,
                                 const int32_t *doc_start, int B, int T, int Hk, int Hv, int Dk,
                                 int Dv, float scale, const mt_gated_delta_span *span) {
    MT_CHECK(Hk > 0 && Hv % Hk == 0, "gated_delta: Hv=%d is not a multiple of Hk=%d", Hv, Hk);
    MT_CHECK(!span || !span->dstate_in || span->dstate_in != span->dstate_out,
             "gated_delta_backward: dstate_in aliases dstate_out");
    if (B <= 0 || T <= 0) return;
    int rep = Hv / Hk, nc = (T + MT_GD_CHUNK - 1) / MT_GD_CHUNK;
    size_t SS = (size_t)Dk * Dv;
#pragma omp parallel
    {
        mt_gd_chunk c;
        gd_grads w;
        mt_gd_chunk_alloc(&c, Dk, Dv);
        grads_alloc(&w, Dk, Dv);
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < B * Hk; task++) {
            int b = task / Hk, kh = task % Hk;
            for (int t = 0; t < T; t++) {
                size_t r = (((size_t)b * T + t) * Hk + kh) * Dk;
                memset(dq + r, 0, (size_t)Dk * sizeof(float));
                memset(dk + r, 0, (size_t)Dk * sizeof(float));
            }
            for (int vh = kh * rep; vh < (kh + 1) * rep; vh++) {
                size_t so = ((size_t)b * Hv + vh) * SS; /* this (row, head)'s state in span's */
                const float *dS_out = span && span->dstate_out ? span->dstate_out + so : NULL;
                for (size_t e = 0; e < SS; e++) w.dSn[e] = dS_out ? dS_out[e] : 0.0;
                for (int ci = nc - 1; ci >= 0; ci--) {
                    int c0 = ci * MT_GD_CHUNK, L = T - c0 < MT_GD_CHUNK ? T - c0 : MT_GD_CHUNK;
                    const float *S0 = chunk_states + (((size_t)b * Hv + vh) * nc + ci) * SS;
                    for (size_t e = 0; e < SS; e++) w.S0[e] = S0[e];
                    mt_gd_chunk_load(&c, q, k, v, g, beta, doc_start, b, c0, L, kh, vh, T, Hk, Hv,
                                     scale, span ? span->t0 : 0);
                    mt_gd_chunk_solve(&c, w.S0);
                    chunk_backward(&c, &w, w.S0, dout, dq, dk, dv, dg, dbeta, b, c0, kh, vh, T, Hk, Hv,
                                   scale);
                    double *t = w.dSn;
                    w.dSn = w.dS0, w.dS0 = t;
                }
                if (span && span->dstate_in) /* dSn: the gradient of the state entering chunk 0 */
                    for (size_t e = 0; e < SS; e++) span->dstate_in[so + e] = (float)w.dSn[e];
            }
        }
        grads_free(&w);
        mt_gd_chunk_free(&c);
    }
}
