/* gpt-oss's experts on the CPU: weights fused as the checkpoint stores them, [E, in, out] (each
 * expert's rows compute x @ W[e] + b[e], the transpose of matmul's nn.Linear layout), one sgemm per
 * expert over its grouped rows. An expert with no rows is skipped: its gradient is untouched. */
#include <cblas.h>
#include <string.h>

#include "cpu_ops.h"

/* out (rows, M) = inp (rows, K) @ weight[e] (K, M) + bias[e] (M), expert by expert. */
void mt_cpu_moe_matmul_io_forward(float *out, const float *inp, const float *weight,
                                  const float *bias, const int32_t *offsets, int E, int K, int M) {
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], m = offsets[e + 1] - r0;
        if (m == 0) continue;
        float *o = out + (size_t)r0 * M;
        float beta = 0.0f;
        if (bias) { /* out starts as the bias rows; sgemm adds onto them */
            for (int r = 0; r < m; r++) memcpy(o + (size_t)r * M, bias + (size_t)e * M, (size_t)M * sizeof(float));
            beta = 1.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, M, K, 1.0f, inp + (size_t)r0 * K, K,
                    weight + (size_t)e * K * M, M, beta, o, M);
    }
}

/* dinp (rows, K) = (or +=) dout @ weight[e]^T; dweight[e] (K, M) += inp^T @ dout; dbias[e] +=
 * column sums of dout (rows in order: deterministic). */
void mt_cpu_moe_matmul_io_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                   const float *inp, const float *weight, const int32_t *offsets,
                                   int E, int K, int M, int accumulate) {
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], m = offsets[e + 1] - r0;
        if (m == 0) continue;
        const float *dO = dout + (size_t)r0 * M, *X = inp + (size_t)r0 * K;
        if (dinp)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, K, M, 1.0f, dO, M,
                        weight + (size_t)e * K * M, M, accumulate ? 1.0f : 0.0f, dinp + (size_t)r0 * K, K);
        if (dweight)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, M, m, 1.0f, X, K, dO, M, 1.0f,
                        dweight + (size_t)e * K * M, M);
        if (dbias) {
            float *db = dbias + (size_t)e * M;
            for (int r = 0; r < m; r++)
                for (int j = 0; j < M; j++) db[j] += dO[(size_t)r * M + j];
        }
    }
}
