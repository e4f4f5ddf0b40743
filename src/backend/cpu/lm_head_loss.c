/* The LM head fused with cross-entropy, chunked over rows so that (N, V) logits never exist. */
#include <math.h>
#include <stdlib.h>

#include <cblas.h>

#include "../../core/error.h"
#include "cpu_math.h"
#include "cpu_ops.h"

/* A chunk's logits stay under this many floats (256 MB) even for very large V. */
#define LM_HEAD_MAX_CHUNK_FLOATS ((size_t)1 << 26)

static int chunk_rows(int V) {
    size_t rows = V > 0 ? LM_HEAD_MAX_CHUNK_FLOATS / (size_t)V : MT_CPU_LM_HEAD_CHUNK;
    int chunk = rows < MT_CPU_LM_HEAD_CHUNK ? (int)rows : MT_CPU_LM_HEAD_CHUNK;
    return chunk < 16 ? 16 : chunk;
}

int mt_cpu_lm_head_chunk_rows(int N, int V) {
    int chunk = chunk_rows(V);
    return chunk < N ? chunk : N;
}

void mt_cpu_lm_head_loss(float *losses, float *dinp, float *dweight, const float *inp,
                         const float *weight, const int32_t *targets, int N, int C, int V,
                         float loss_scale) {
    mt_cpu_lm_head_loss_chunked(losses, dinp, dweight, inp, weight, targets, N, C, V, loss_scale,
                                chunk_rows(V));
}

void mt_cpu_lm_head_loss_softcap(float *losses, float *dinp, float *dweight, const float *inp,
                                 const float *weight, const int32_t *targets, int N, int C, int V,
                                 float loss_scale, float cap) {
    mt_cpu_lm_head_loss_softcap_chunked(losses, dinp, dweight, inp, weight, targets, N, C, V,
                                        loss_scale, cap, chunk_rows(V));
}

/* One soft-capped row (Gemma 4): l = cap * tanh(z / cap) in place, its loss; with want_grad the row
 * becomes dz = dl * (1 - (l / cap)^2), dl = loss_scale * (softmax(l) - onehot), the softmax taken
 * from l itself (no stored exponentials: the last pass needs l). */
static float capped_row(float *row, int tgt, int V, float cap, float loss_scale, int want_grad) {
#pragma omp simd
    for (int j = 0; j < V; j++) row[j] = cap * tanhf(row[j] / cap);
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < V; j++) mx = row[j] > mx ? row[j] : mx;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; j++) sum += mt_cpu_expf(row[j] - mx);
    float lse = mx + (float)log(sum), xt = tgt >= 0 ? row[tgt] : 0.0f;
    if (want_grad) {
        float k = tgt >= 0 ? (float)(loss_scale / sum) : 0.0f, lt = xt;
#pragma omp simd
        for (int j = 0; j < V; j++) {
            float t = row[j] / cap;
            row[j] = k * mt_cpu_expf(row[j] - mx) * (1.0f - t * t);
        }
        if (tgt >= 0) row[tgt] -= loss_scale * (1.0f - (lt / cap) * (lt / cap));
    }
    return tgt >= 0 ? lse - xt : 0.0f;
}

/* Per chunk of nc rows (inp (N, C), weight (V, C), targets (N), losses (N)):
 *   logits (nc, V) = inp_chunk @ weight^T                         sgemm
 *   losses = logsumexp - logit[target]; in place, logits become
 *   dlogits = loss_scale * (softmax - onehot), 0 rows where ignored
 *   dinp_chunk (nc, C) = dlogits @ weight                          sgemm (=)
 *   dweight (V, C) += dlogits^T @ inp_chunk                        sgemm (beta 1; none when
 *                                                                  dweight is NULL: a frozen head)
 * The sgemms run outside any parallel region, so OpenBLAS threads them itself. */
void mt_cpu_lm_head_loss_chunked(float *losses, float *dinp, float *dweight, const float *inp,
                                 const float *weight, const int32_t *targets, int N, int C, int V,
                                 float loss_scale, int chunk) {
    mt_cpu_lm_head_loss_softcap_chunked(losses, dinp, dweight, inp, weight, targets, N, C, V,
                                        loss_scale, 0.0f, chunk);
}

/* cap 0: no soft-cap (the plain path above, unchanged); cap > 0: capped_row's. */
void mt_cpu_lm_head_loss_softcap_chunked(float *losses, float *dinp, float *dweight,
                                         const float *inp, const float *weight,
                                         const int32_t *targets, int N, int C, int V,
                                         float loss_scale, float cap, int chunk) {
    MT_CHECK(chunk > 0 && V > 0, "lm_head_loss: chunk=%d V=%d", chunk, V);
    MT_CHECK(cap >= 0, "lm_head_loss: soft-cap %g", cap);
    if (N <= 0) return;
    int nrows = chunk < N ? chunk : N;
    float *logits = mt_aligned_alloc((size_t)nrows * V * sizeof(float));
    for (int n0 = 0; n0 < N; n0 += chunk) {
        int nc = N - n0 < chunk ? N - n0 : chunk;
        const float *x = inp + (size_t)n0 * C;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nc, V, C, 1.0f, x, C, weight, C, 0.0f,
                    logits, V);
#pragma omp parallel for schedule(static) if ((size_t)nc * V > 32768)
        for (int i = 0; i < nc; i++) {
            float *row = logits + (size_t)i * V;
            int tgt = targets[n0 + i];
            MT_CHECK(tgt < V, "lm_head_loss: target %d of row %d is >= V=%d", tgt, n0 + i, V);
            if (cap > 0) {
                losses[n0 + i] = capped_row(row, tgt, V, cap, loss_scale, dinp != NULL);
                continue;
            }
            float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
            for (int j = 0; j < V; j++) mx = row[j] > mx ? row[j] : mx;
            double sum = 0.0; /* V terms: keep the sum exact enough for any vocabulary */
            float xt = tgt >= 0 ? row[tgt] : 0.0f;
            if (dinp) {
#pragma omp simd reduction(+ : sum)
                for (int j = 0; j < V; j++) {
                    float e = mt_cpu_expf(row[j] - mx);
                    row[j] = e;
                    sum += e;
                }
            } else {
#pragma omp simd reduction(+ : sum)
                for (int j = 0; j < V; j++) sum += mt_cpu_expf(row[j] - mx);
            }
            float lse = mx + (float)log(sum);
            losses[n0 + i] = tgt >= 0 ? lse - xt : 0.0f;
            if (dinp) {
                float k = tgt >= 0 ? (float)(loss_scale / sum) : 0.0f;
#pragma omp simd
                for (int j = 0; j < V; j++) row[j] *= k;
                if (tgt >= 0) row[tgt] -= loss_scale;
            }
        }
        if (!dinp) continue;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nc, C, V, 1.0f, logits, V, weight, C,
                    0.0f, dinp + (size_t)n0 * C, C);
        if (dweight)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, nc, 1.0f, logits, V, x, C,
                        1.0f, dweight, C);
    }
    free(logits);
}
