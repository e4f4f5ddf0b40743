/* The Gated DeltaNet's per-token decay and write strength, as transformers' Qwen3_5GatedDeltaNet:
 *   g = -exp(A_log) * softplus(a + dt_bias),  beta = sigmoid(b)   (fp32, (N, H))
 * softplus as torch's (beta 1, threshold 20: x itself above 20). */
#include <math.h>

#include "cpu_ops.h"

static inline double softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }
static inline double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* g, beta (N, H) fp32; a, b (N, H); A_log, dt_bias (H). */
void mt_cpu_gdn_gates_forward(float *g, float *beta, const float *a, const float *b,
                              const float *A_log, const float *dt_bias, int N, int H) {
#pragma omp parallel for schedule(static) if ((size_t)N * H > 16384)
    for (long i = 0; i < (long)N * H; i++) {
        int h = (int)(i % H);
        g[i] = (float)(-exp((double)A_log[h]) * softplus((double)a[i] + dt_bias[h]));
        beta[i] = (float)sigmoid((double)b[i]);
    }
}

/* da = dg * -exp(A_log) * sigmoid(a + dt_bias), db = dbeta * beta (1 - beta) (written);
 * dA_log[h] += sum_n dg * g, ddt_bias[h] += sum_n da (summed in double, one task per head).
 * dA_log or ddt_bias NULL (frozen): that sum is skipped; da and db are the same bits. */
void mt_cpu_gdn_gates_backward(float *da, float *db, float *dA_log, float *ddt_bias,
                               const float *dg, const float *dbeta, const float *a, const float *b,
                               const float *A_log, const float *dt_bias, int N, int H) {
#pragma omp parallel for schedule(static) if ((size_t)N * H > 16384)
    for (int h = 0; h < H; h++) {
        double eA = exp((double)A_log[h]), sA = 0.0, sdt = 0.0;
        for (int n = 0; n < N; n++) {
            size_t i = (size_t)n * H + h;
            double x = (double)a[i] + dt_bias[h];
            double dai = dg[i] * -eA * sigmoid(x);
            da[i] = (float)dai;
            if (dA_log) sA += dg[i] * (-eA * softplus(x));
            sdt += dai;
            double s = sigmoid((double)b[i]);
            db[i] = (float)(dbeta[i] * s * (1.0 - s));
        }
        if (dA_log) dA_log[h] += (float)sA;
        if (ddt_bias) ddt_bias[h] += (float)sdt;
    }
}
