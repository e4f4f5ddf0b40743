/* Causal grouped-query attention, exact (not online) softmax, every product by sgemm, with the
 * options of backend.h's mt_attention_opts: a scale, a window of W keys (the current one
 * included), and per-head sinks (an extra logit in every row's denominator, whose value is zero).
 *
 * Layout: q (N, H, D), k and v (N, G, D), token-major, so the (T, D) block of one (b, h) is a
 * strided matrix with leading dimension H*D (or G*D) and needs no copy. Work is cut into tiles of
 * MT_CPU_ATTN_TILE query rows; a tile of rows [t0, t1) only needs keys [lo, t1) where lo is the
 * smallest doc_start of its rows, so the causal upper triangle and earlier documents are skipped,
 * not computed and masked. Scratch: (tile, T) floats per thread. BLAS calls run inside OpenMP
 * regions, where OpenBLAS (OpenMP build) runs them single-threaded: parallelism is ours.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "../../core/error.h"
#include "cpu_math.h"
#include "cpu_ops.h"

#define TILE MT_CPU_ATTN_TILE

/* First key token that query t of row b may see: its document's start, and with a window W no
 * earlier than t - W + 1. */
static inline int first_key(const int32_t *doc_start, int window, int b, int T, int t) {
    int s = 0;
    if (doc_start) {
        s = doc_start[(size_t)b * T + t];
        MT_CHECK(s >= 0 && s <= t, "attention: doc_start[%d*T+%d] = %d must lie in [0, t]", b, t, s);
    }
    if (window > 0 && t - window + 1 > s) s = t - window + 1;
    return s;
}

/* Smallest first key over the query rows [t0, t1). */
static int tile_lo(const int32_t *doc_start, int window, int b, int T, int t0, int t1) {
    int lo = t0;
    for (int t = t0; t < t1; t++) {
        int s = first_key(doc_start, window, b, T, t);
        if (s < lo) lo = s;
    }
    return lo;
}

/* S (nq, nk), row-major with ld nk, = scale * Q[t0:t1] K[lo:t1]^T for one (b, h). */
static void scores(float *S, const float *q, const float *k, int b, int h, int g, int t0, int nq,
                   int lo, int nk, int T, int H, int G, int D, float scale) {
    const float *Q = q + ((size_t)b * T + t0) * H * D + (size_t)h * D;
    const float *K = k + ((size_t)b * T + lo) * G * D + (size_t)g * D;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, scale, Q, H * D, K, G * D, 0.0f,
                S, nk);
}

/* out (N, H, D), lse (B, H, T) (the sink's logit in it when there are sinks). */
void mt_cpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                              const float *v, const int32_t *doc_start, int B, int T, int H, int G,
                              int D, float scale, int window, const float *sinks) {
    MT_CHECK(G > 0 && H % G == 0, "attention: H=%d is not a multiple of G=%d", H, G);
    MT_CHECK(window >= 0, "attention: window %d must be >= 0", window);
    if (B <= 0 || T <= 0 || H <= 0) return;
    int rep = H / G, ntiles = (T + TILE - 1) / TILE;
    if (scale == 0) scale = 1.0f / sqrtf((float)D);
    long ntasks = (long)B * H * ntiles;
#pragma omp parallel
    {
        float *S = mt_aligned_alloc((size_t)TILE * T * sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < ntasks; task++) {
            /* the last tiles are the widest: hand them out first */
            int tile = ntiles - 1 - (int)(task / ((long)B * H));
            int b = (int)(task % ((long)B * H)) / H, h = (int)(task % H), g = h / rep;
            int t0 = tile * TILE, t1 = t0 + TILE < T ? t0 + TILE : T, nq = t1 - t0;
            int lo = tile_lo(doc_start, window, b, T, t0, t1), nk = t1 - lo;
            scores(S, q, k, b, h, g, t0, nq, lo, nk, T, H, G, D, scale);
            for (int i = 0; i < nq; i++) {
                int t = t0 + i, s0 = first_key(doc_start, window, b, T, t) - lo, s1 = t - lo; /* keys [s0, s1] */
                float *row = S + (size_t)i * nk;
                float mx = sinks ? sinks[h] : -INFINITY; /* the sink is one more logit of the row */
#pragma omp simd reduction(max : mx)
                for (int j = s0; j <= s1; j++) mx = row[j] > mx ? row[j] : mx;
                float sum = sinks ? mt_cpu_expf(sinks[h] - mx) : 0.0f;
#pragma omp simd reduction(+ : sum)
                for (int j = s0; j <= s1; j++) {
                    float e = mt_cpu_expf(row[j] - mx);
                    row[j] = e;
                    sum += e;
                }
                float inv = 1.0f / sum;
                for (int j = 0; j < s0; j++) row[j] = 0.0f;
#pragma omp simd
                for (int j = s0; j <= s1; j++) row[j] *= inv;
                for (int j = s1 + 1; j < nk; j++) row[j] = 0.0f;
                lse[((size_t)b * H + h) * T + t] = mx + logf(sum);
            }
            const float *V = v + ((size_t)b * T + lo) * G * D + (size_t)g * D;
            float *O = out + ((size_t)b * T + t0) * H * D + (size_t)h * D;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, 1.0f, S, nk, V,
                        G * D, 0.0f, O, H * D);
        }
        free(S);
    }
}

/* Per tile: P = exp(S - lse) recomputed, dP = dO V^T, dS = P * (dP - rowsum(dO * O)),
 * dV += P^T dO, dK += scale * dS^T Q, dQ = scale * dS K.
 * dK and dV of kv head g collect from all rep query heads and all tiles, so one task owns one
 * (b, g) and walks its heads and tiles in order: no races, deterministic sums. The cost is that
 * only B*G tasks exist (fine on CPU: B*G is rarely below the core count of a CI machine). */
void mt_cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                               const float *lse, const float *q, const float *k, const float *v,
                               const int32_t *doc_start, int B, int T, int H, int G, int D,
                               float scale, int window, const float *sinks, float *dsinks) {
    MT_CHECK(G > 0 && H % G == 0, "attention: H=%d is not a multiple of G=%d", H, G);
    MT_CHECK(window >= 0, "attention: window %d must be >= 0", window);
    if (B <= 0 || T <= 0 || H <= 0) return;
    int rep = H / G, ntiles = (T + TILE - 1) / TILE;
    if (scale == 0) scale = 1.0f / sqrtf((float)D);
    int ntasks = B * G;
    /* the sinks' gradient, -sum over queries of p_sink * rowsum(dO * O): per (b, h) first (each
     * task owns its b's heads), then summed over b in order (deterministic) */
    double *dsink_bh = sinks && dsinks ? mt_aligned_alloc((size_t)B * H * sizeof(double)) : NULL;
#pragma omp parallel
    {
        float *P = mt_aligned_alloc((size_t)TILE * T * sizeof(float));
        float *dP = mt_aligned_alloc((size_t)TILE * T * sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < ntasks; task++) {
            int b = task / G, g = task % G;
            float *dK = dk + (size_t)b * T * G * D + (size_t)g * D;
            float *dV = dv + (size_t)b * T * G * D + (size_t)g * D;
            for (int t = 0; t < T; t++) {
                memset(dK + (size_t)t * G * D, 0, (size_t)D * sizeof(float));
                memset(dV + (size_t)t * G * D, 0, (size_t)D * sizeof(float));
            }
            for (int h = g * rep; h < (g + 1) * rep; h++) {
                double dsink_h = 0;
                for (int tile = 0; tile < ntiles; tile++) {
                    int t0 = tile * TILE, t1 = t0 + TILE < T ? t0 + TILE : T, nq = t1 - t0;
                    int lo = tile_lo(doc_start, window, b, T, t0, t1), nk = t1 - lo;
                    size_t qoff = ((size_t)b * T + t0) * H * D + (size_t)h * D;
                    size_t koff = (size_t)lo * G * D;
                    const float *dO = dout + qoff, *O = out + qoff, *Q = q + qoff;
                    const float *K = k + (size_t)b * T * G * D + (size_t)g * D + koff;
                    const float *V = v + (size_t)b * T * G * D + (size_t)g * D + koff;
                    scores(P, q, k, b, h, g, t0, nq, lo, nk, T, H, G, D, scale);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, 1.0f, dO, H * D,
                                V, G * D, 0.0f, dP, nk);
                    for (int i = 0; i < nq; i++) {
                        int t = t0 + i, s0 = first_key(doc_start, window, b, T, t) - lo, s1 = t - lo;
                        float l = lse[((size_t)b * H + h) * T + t];
                        float di = 0.0f;
                        const float *dOi = dO + (size_t)i * H * D, *Oi = O + (size_t)i * H * D;
#pragma omp simd reduction(+ : di)
                        for (int d = 0; d < D; d++) di += dOi[d] * Oi[d];
                        if (dsink_bh) dsink_h -= (double)mt_cpu_expf(sinks[h] - l) * di;
                        float *p = P + (size_t)i * nk, *ds = dP + (size_t)i * nk;
                        for (int j = 0; j < s0; j++) p[j] = ds[j] = 0.0f;
#pragma omp simd
                        for (int j = s0; j <= s1; j++) {
                            float e = mt_cpu_expf(p[j] - l);
                            p[j] = e;
                            ds[j] = e * (ds[j] - di);
                        }
                        for (int j = s1 + 1; j < nk; j++) p[j] = ds[j] = 0.0f;
                    }
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, nq, 1.0f, P, nk, dO,
                                H * D, 1.0f, dV + koff, G * D);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, nq, scale, dP, nk,
                                Q, H * D, 1.0f, dK + koff, G * D);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, scale, dP, nk,
                                K, G * D, 0.0f, dq + qoff, H * D);
                }
                if (dsink_bh) dsink_bh[(size_t)b * H + h] = dsink_h;
            }
        }
        free(P);
        free(dP);
    }
    if (dsink_bh) {
        for (int h = 0; h < H; h++) {
            double sum = 0;
            for (int b = 0; b < B; b++) sum += dsink_bh[(size_t)b * H + h];
            dsinks[h] += (float)sum;
        }
        free(dsink_bh);
    }
}
