/* Per-head L2 normalisation of the Gated DeltaNet's q and k, as transformers' l2norm (and
 * flash-linear-attention's): y = x * rsqrt(sum(x^2) + eps) over each row of D. */
#include <math.h>

#include "cpu_ops.h"

#define L2_PAR_MIN 16384 /* elements below which one thread is faster */

/* out, inp (R, D); rinv (R) fp32, kept for the backward. */
void mt_cpu_l2norm_forward(float *out, float *rinv, const float *inp, int R, int D, float eps) {
#pragma omp parallel for schedule(static) if ((size_t)R * D > L2_PAR_MIN)
    for (int r = 0; r < R; r++) {
        const float *x = inp + (size_t)r * D;
        double ss = 0.0; /* in double: see mt_cpu_ops' note on row sums */
#pragma omp simd reduction(+ : ss)
        for (int d = 0; d < D; d++) ss += (double)x[d] * x[d];
        float s = 1.0f / sqrtf((float)ss + eps);
        rinv[r] = s;
        for (int d = 0; d < D; d++) out[(size_t)r * D + d] = x[d] * s;
    }
}

/* dx = s dy - x s^3 (x . dy), s = rinv (written). */
void mt_cpu_l2norm_backward(float *dinp, const float *dout, const float *inp, const float *rinv,
                            int R, int D) {
#pragma omp parallel for schedule(static) if ((size_t)R * D > L2_PAR_MIN)
    for (int r = 0; r < R; r++) {
        const float *x = inp + (size_t)r * D, *dy = dout + (size_t)r * D;
        float s = rinv[r];
        double dot = 0.0;
#pragma omp simd reduction(+ : dot)
        for (int d = 0; d < D; d++) dot += (double)x[d] * dy[d];
        float k = (float)dot * s * s * s;
        for (int d = 0; d < D; d++) dinp[(size_t)r * D + d] = s * dy[d] - k * x[d];
    }
}
