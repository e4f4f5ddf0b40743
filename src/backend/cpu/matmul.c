/* Linear layers, PyTorch's layout: out = inp @ weight^T + bias, weight (M, K). All BLAS. */
#include <cblas.h>
#include <string.h>

#include "cpu_ops.h"

/* out (R, M) = inp (R, K) @ weight (M, K)^T (+ bias (M)). With a bias, out starts as the bias rows
 * and sgemm adds onto it (beta 1), so the bias costs one write pass and no extra read. */
void mt_cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                           int R, int K, int M) {
    if (R <= 0 || M <= 0) return;
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static) if ((size_t)R * M > 65536)
        for (int r = 0; r < R; r++) memcpy(out + (size_t)r * M, bias, (size_t)M * sizeof(float));
        beta = 1.0f;
    } else if (K <= 0) {
        memset(out, 0, (size_t)R * M * sizeof(float)); /* sgemm may skip C entirely when K = 0 */
        return;
    }
    if (K <= 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, M, K, 1.0f, inp, K, weight, K, beta,
                out, M);
}

void mt_cpu_matmul_forward_add(float *out, const float *inp, const float *weight, int R, int K,
                               int M) {
    if (R <= 0 || M <= 0 || K <= 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, M, K, 1.0f, inp, K, weight, K, 1.0f,
                out, M);
}

/* dinp (R, K) = (or +=) dout (R, M) @ weight (M, K); dweight (M, K) += dout^T @ inp;
 * dbias (M) += column sums of dout. NULL outputs are skipped. */
void mt_cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int R, int K, int M,
                            int accumulate) {
    if (R <= 0) return;
    if (dinp && K > 0) {
        if (M > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, K, M, 1.0f, dout, M, weight,
                        K, accumulate ? 1.0f : 0.0f, dinp, K);
        else if (!accumulate)
            memset(dinp, 0, (size_t)R * K * sizeof(float));
    }
    if (dweight && M > 0 && K > 0)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, K, R, 1.0f, dout, M, inp, K, 1.0f,
                    dweight, K);
    if (dbias) {
        /* threads own column blocks (of 64: whole cache lines) and walk the rows in order */
        int nblocks = (M + 63) / 64;
#pragma omp parallel for schedule(static) if ((size_t)R * M > 65536)
        for (int cb = 0; cb < nblocks; cb++) {
            int m0 = cb * 64, m1 = m0 + 64 < M ? m0 + 64 : M;
            float acc[64] = {0};
            for (int r = 0; r < R; r++) {
                const float *row = dout + (size_t)r * M;
#pragma omp simd
                for (int m = m0; m < m1; m++) acc[m - m0] += row[m];
            }
            for (int m = m0; m < m1; m++) dbias[m] += acc[m - m0];
        }
    }
}
