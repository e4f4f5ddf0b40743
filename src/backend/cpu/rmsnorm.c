/* RMSNorm as transformers' LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * w, in fp32; with w_offset
 * 1, qwen3_5's x * rsqrt(...) * (1 + w) (the same in fp32: the offset joins w before the product);
 * with weight NULL, Gemma 4's weightless norm x * rsqrt(...) (its v_norm). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "../../core/error.h"
#include "cpu_ops.h"

#define RMS_PAR_MIN 16384 /* elements below which one thread is faster */

/* out (R, C), rstd (R), inp (R, C), weight (C) or NULL. */
void mt_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int R,
                            int C, float eps, float w_offset) {
#pragma omp parallel for schedule(static) if ((size_t)R * C > RMS_PAR_MIN)
    for (int r = 0; r < R; r++) {
        const float *x = inp + (size_t)r * C;
        float *y = out + (size_t)r * C;
        double ss = 0.0; /* in double: see mt_cpu_ops' note on row sums */
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        float s = 1.0f / sqrtf((float)ss / (float)C + eps);
        rstd[r] = s;
        if (!weight) {
#pragma omp simd
            for (int c = 0; c < C; c++) y[c] = x[c] * s;
            continue;
        }
#pragma omp simd
        for (int c = 0; c < C; c++) y[c] = (x[c] * s) * (weight[c] + w_offset);
    }
}

/* With y = x * s * w and s = (mean(x^2) + eps)^-1/2:
 *   dx = s * (dy * w) - x * s^3 / C * sum_c(dy * w * x),   dw += sum_r dy * x * s.
 * weight NULL: w = 1 and no dw (unweighted_backward).
 * dweight sums over rows, so each thread sums its rows into its own (C) partial, and the partials
 * are added in thread order afterwards: no races, and the same bits on every run. dinp or dweight
 * NULL is skipped (dweight NULL: a frozen norm; no partials, and dinp is the same bits). */
static void unweighted_backward(float *dinp, const float *dout, const float *inp, const float *rstd,
                                int R, int C, int accumulate) {
    if (!dinp) return;
#pragma omp parallel for schedule(static) if ((size_t)R * C > RMS_PAR_MIN)
    for (int r = 0; r < R; r++) {
        const float *x = inp + (size_t)r * C, *dy = dout + (size_t)r * C;
        float *dx = dinp + (size_t)r * C;
        float s = rstd[r];
        double dot = 0.0;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < C; c++) dot += (double)dy[c] * x[c];
        float k = (float)dot * s * s * s / (float)C;
        if (accumulate) {
#pragma omp simd
            for (int c = 0; c < C; c++) dx[c] += s * dy[c] - k * x[c];
        } else {
#pragma omp simd
            for (int c = 0; c < C; c++) dx[c] = s * dy[c] - k * x[c];
        }
    }
}

void mt_cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int R, int C, int accumulate,
                             float w_offset) {
    if (!weight) {
        unweighted_backward(dinp, dout, inp, rstd, R, C, accumulate);
        return;
    }
    int nt = (size_t)R * C > RMS_PAR_MIN ? omp_get_max_threads() : 1;
    float *part = dweight ? mt_aligned_alloc((size_t)nt * C * sizeof(float)) : NULL;
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        float *dw = part ? part + (size_t)tid * C : NULL;
        if (dw)
            for (int c = 0; c < C; c++) dw[c] = 0.0f;
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++) {
            const float *x = inp + (size_t)r * C, *dy = dout + (size_t)r * C;
            float s = rstd[r];
            double dot = 0.0;
#pragma omp simd reduction(+ : dot)
            for (int c = 0; c < C; c++) dot += (double)(dy[c] * (weight[c] + w_offset)) * x[c];
            if (dinp) {
                float *dx = dinp + (size_t)r * C;
                float k = (float)dot * s * s * s / (float)C;
                if (accumulate) {
#pragma omp simd
                    for (int c = 0; c < C; c++) dx[c] += s * dy[c] * (weight[c] + w_offset) - k * x[c];
                } else {
#pragma omp simd
                    for (int c = 0; c < C; c++) dx[c] = s * dy[c] * (weight[c] + w_offset) - k * x[c];
                }
            }
            if (dw) {
#pragma omp simd
                for (int c = 0; c < C; c++) dw[c] += dy[c] * x[c] * s;
            }
        }
        /* implicit barrier of the omp for: every partial is complete */
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
