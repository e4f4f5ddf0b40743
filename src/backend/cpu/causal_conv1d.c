/* The Gated DeltaNet's short convolution: causal, depthwise (one K-tap filter per channel), then
 * SiLU, as transformers' causal_conv1d_fn with activation "silu" and no bias:
 *   out[t, c] = silu(sum_j w[c, j] * x[t - (K-1) + j, c]),  taps before the token's document start
 * (or its row's start) read zero, so packed documents never see each other. A call over positions
 * t0.. of longer rows (a span of model/mixer_deltanet.c) reads nothing before its first token. */
#include <math.h>
#include <stdlib.h>

#include "../../core/error.h"
#include "cpu_ops.h"

#define CONV_CH_BLOCK 64 /* channels per task of the backward */

/* First token of row b of the call that its token t may read: its document's start, or the
 * call's first token (position t0 of the row) when the document began before it. */
static inline int first_src(const int32_t *doc_start, int b, int T, int t, int t0) {
    if (!doc_start) return 0;
    int s = doc_start[(size_t)b * T + t];
    MT_CHECK(s >= 0 && s <= t0 + t, "causal_conv1d: doc_start[%d*T+%d] = %d must lie in [0, %d]",
             b, t, s, t0 + t);
    return s > t0 ? s - t0 : 0;
}

/* The pre-activation of token t (row b), channel c. */
static inline float conv_at(const float *inp, const float *weight, int lo, int b, int t, int c,
                            int T, int C, int K) {
    const float *w = weight + (size_t)c * K;
    float acc = 0.0f;
    for (int j = 0; j < K; j++) {
        int s = t - (K - 1) + j;
        if (s >= lo) acc += w[j] * inp[((size_t)b * T + s) * C + c];
    }
    return acc;
}

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* out, inp (B*T, C); weight (C, K). */
void mt_cpu_causal_conv1d_forward(float *out, const float *inp, const float *weight,
                                  const int32_t *doc_start, int B, int T, int C, int K, int t0) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)B * T; n++) {
        int b = (int)(n / T), t = (int)(n % T), lo = first_src(doc_start, b, T, t, t0);
        for (int c = 0; c < C; c++) {
            float p = conv_at(inp, weight, lo, b, t, c, T, C, K);
            out[(size_t)n * C + c] = p * sigmoidf(p);
        }
    }
}

/* dpre = dout * silu'(pre) (recomputed); dinp[s] = sum over the K tokens t >= s of the same
 * document that read s of dpre[t] * w[s - t + K-1] (written); dweight[c, j] += sum_t dpre[t, c] *
 * x[t - (K-1) + j, c]. One task owns a block of channels: no races, fixed sum order. dweight
 * NULL (a frozen conv): its sums are skipped; dinp is the same bits. */
void mt_cpu_causal_conv1d_backward(float *dinp, float *dweight, const float *dout,
                                   const float *inp, const float *weight, const int32_t *doc_start,
                                   int B, int T, int C, int K, int t0) {
    size_t N = (size_t)B * T;
    float *dpre = mt_aligned_alloc((N ? N : 1) * C * sizeof(float));
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)N; n++) {
        int b = (int)(n / T), t = (int)(n % T), lo = first_src(doc_start, b, T, t, t0);
        for (int c = 0; c < C; c++) {
            float p = conv_at(inp, weight, lo, b, t, c, T, C, K), sg = sigmoidf(p);
            dpre[(size_t)n * C + c] = dout[(size_t)n * C + c] * sg * (1.0f + p * (1.0f - sg));
        }
    }
    int nblk = (C + CONV_CH_BLOCK - 1) / CONV_CH_BLOCK;
#pragma omp parallel for schedule(dynamic, 1)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * CONV_CH_BLOCK, c1 = c0 + CONV_CH_BLOCK < C ? c0 + CONV_CH_BLOCK : C;
        double dw[CONV_CH_BLOCK * 8];
        double *dwp = NULL;
        if (dweight) {
            dwp = K <= 8 ? dw : malloc((size_t)CONV_CH_BLOCK * K * sizeof(double));
            for (int e = 0; e < (c1 - c0) * K; e++) dwp[e] = 0.0;
        }
        for (int b = 0; b < B; b++)
            for (int s = 0; s < T; s++) {
                size_t ns = (size_t)b * T + s;
                for (int c = c0; c < c1; c++) dinp[ns * C + c] = 0.0f;
                /* the tokens t = s .. s+K-1 that read s: same row, and s not before t's start */
                for (int t = s; t < T && t < s + K; t++) {
                    if (first_src(doc_start, b, T, t, t0) > s) break; /* a later document */
                    int j = s - t + K - 1;
                    size_t nt = (size_t)b * T + t;
                    for (int c = c0; c < c1; c++) {
                        float d = dpre[nt * C + c];
                        dinp[ns * C + c] += d * weight[(size_t)c * K + j];
                        if (dwp) dwp[(size_t)(c - c0) * K + j] += (double)d * inp[ns * C + c];
                    }
                }
            }
        if (dwp)
            for (int c = c0; c < c1; c++)
                for (int j = 0; j < K; j++)
                    dweight[(size_t)c * K + j] += (float)dwp[(size_t)(c - c0) * K + j];
        if (dwp != dw) free(dwp); /* free(NULL) when dweight is NULL */
    }
    free(dpre);
}
