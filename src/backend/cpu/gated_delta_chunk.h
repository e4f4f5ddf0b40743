/* One chunk of the gated delta rule in the WY/UT form, shared by gated_delta.c (forward) and
 * gated_delta_backward.c (the backward recomputes each chunk from its saved incoming state).
 *
 * For one (row b, value head) and the L <= 64 tokens of a chunk starting at c0, with G_i the
 * cumulative sum of g from the chunk's start (in double) and S0 the state entering the chunk:
 *   f_i   = token i's document started before c0 (it reads S0), fe_i = f_i exp(G_i)
 *   Dm_ij = exp(G_i - G_j) when j <= i in the same document, else 0
 *   KD    = strict lower part of (K K^T) o Dm,  A = diag(beta) KD,  Tm = (I + A)^-1
 *   R     = diag(beta) (V - diag(fe) K S0),  U = Tm R       (U: the values written to the state)
 *   O     = diag(fe) Q S0 + P U,  P = (Q K^T) o Dm              (Q already scaled)
 *   S_out = eL S0 + K^T diag(lam) U, lam_j = exp(G_last - G_j) when j is in the last token's
 *           document, eL = f_last exp(G_last)
 * which is the token recurrence S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T
 * with S zeroed at each document start (an inner document start splits the masks above).
 * Everything here is double (the inputs converted on load): Tm's entries grow when keys are
 * correlated (I + A is ill-conditioned), and fp32 chunk algebra then loses digits the fp32
 * interface keeps; the CPU backend is the reference, so it pays the dgemm.
 */
#ifndef MT_CPU_GATED_DELTA_CHUNK_H
#define MT_CPU_GATED_DELTA_CHUNK_H

#include <stdint.h>

#include "../backend.h"

#define MT_GD_CHUNK MT_GATED_DELTA_CHUNK

typedef struct {
    int L, Dk, Dv;
    double *Qs, *Kc, *Vc;         /* (L, Dk), (L, Dk), (L, Dv): contiguous copies, Q scaled */
    double *beta, *fe, *lam;      /* (L) */
    int32_t *ds;                  /* (L) document start of each token relative to the call's first
                                     (0 without documents; < 0: begun before the call) */
    double *G;                    /* (L) cumulative g from the chunk's start */
    double eL;
    double *Dm, *KD, *P, *Tm;     /* (L, L) */
    double *X, *R, *U;            /* (L, Dv): X = K S0 */
} mt_gd_chunk;

/* Allocates the scratch of one chunk (freed by mt_gd_chunk_free). */
void mt_gd_chunk_alloc(mt_gd_chunk *c, int Dk, int Dv);
void mt_gd_chunk_free(mt_gd_chunk *c);

/* Copies the chunk's tokens [c0, c0+L) of row b (value head vh, key head kh) and computes the
 * decay masks; doc_start may be NULL. The call's tokens are positions t0.. of their rows
 * (mt_gated_delta_span): ds holds document starts relative to t0, negative for one begun before.
 * Fatal on a doc_start that is not a run of documents. */
void mt_gd_chunk_load(mt_gd_chunk *c, const float *q, const float *k, const float *v,
                      const float *g, const float *beta, const int32_t *doc_start, int b, int c0,
                      int L, int kh, int vh, int T, int Hk, int Hv, float scale, int t0);

/* KD, P, Tm, X, R and U from the loaded chunk and its incoming state S0 (Dk, Dv). */
void mt_gd_chunk_solve(mt_gd_chunk *c, const double *S0);

#endif
