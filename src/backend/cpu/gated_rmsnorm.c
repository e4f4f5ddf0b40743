/* The Gated DeltaNet's output norm, as transformers' Qwen3_5RMSNormGated: an RMSNorm over each
 * head's Dv with a plain weight (w * x, not (1 + w) * x), then times silu(gate):
 *   y = w * x * rstd * silu(z),  rstd = 1/sqrt(mean(x^2) + eps). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "../../core/error.h"
#include "cpu_ops.h"

#define GRMS_PAR_MIN 16384 /* elements below which one thread is faster */

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* out, inp, gate (R, C); weight (C); rstd (R) fp32. */
void mt_cpu_gated_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *gate,
                                  const float *weight, int R, int C, float eps) {
#pragma omp parallel for schedule(static) if ((size_t)R * C > GRMS_PAR_MIN)
    for (int r = 0; r < R; r++) {
        const float *x = inp + (size_t)r * C, *z = gate + (size_t)r * C;
        double ss = 0.0; /* in double: see mt_cpu_ops' note on row sums */
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        float s = 1.0f / sqrtf((float)ss / (float)C + eps);
        rstd[r] = s;
        for (int c = 0; c < C; c++) out[(size_t)r * C + c] = weight[c] * (x[c] * s) * (z[c] * sigmoidf(z[c]));
    }
}

/* With n = x s and a = silu(z): dz = dy w n silu'(z); dn = dy w a, dx = s dn - x s^3/C sum(dn x);
 * dw += sum_r dy n a (per-thread partials added in thread order: the same bits every run).
 * dweight NULL (a frozen norm): no partials, no reduction; dx and dz are the same bits. */
void mt_cpu_gated_rmsnorm_backward(float *dinp, float *dgate, float *dweight, const float *dout,
                                   const float *inp, const float *gate, const float *weight,
                                   const float *rstd, int R, int C) {
    int nt = (size_t)R * C > GRMS_PAR_MIN ? omp_get_max_threads() : 1;
    float *part = dweight ? mt_aligned_alloc((size_t)nt * C * sizeof(float)) : NULL;
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        float *dw = part ? part + (size_t)tid * C : NULL;
        if (dw)
            for (int c = 0; c < C; c++) dw[c] = 0.0f;
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++) {
            const float *x = inp + (size_t)r * C, *z = gate + (size_t)r * C, *dy = dout + (size_t)r * C;
            float *dx = dinp + (size_t)r * C, *dz = dgate + (size_t)r * C;
            float s = rstd[r];
            double dot = 0.0;
            for (int c = 0; c < C; c++) {
                float sg = sigmoidf(z[c]), a = z[c] * sg, n = x[c] * s;
                float dn = dy[c] * weight[c] * a;
                dz[c] = dy[c] * weight[c] * n * sg * (1.0f + z[c] * (1.0f - sg));
                if (dw) dw[c] += dy[c] * n * a;
                dx[c] = dn; /* finished below */
                dot += (double)dn * x[c];
            }
            float k = (float)dot * s * s * s / (float)C;
            for (int c = 0; c < C; c++) dx[c] = s * dx[c] - k * x[c];
        }
        if (dw) {
#pragma omp for schedule(static)
            for (int c = 0; c < C; c++) {
                float acc = dweight[c];
                for (int t = 0; t < nth; t++) acc += part[(size_t)t * C + c];
                dweight[c] = acc;
            }
        }
    }
    free(part);
}
