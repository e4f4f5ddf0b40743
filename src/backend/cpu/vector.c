/* fp32 vector helpers the engine uses on gradients: sum of squares (for the global norm) and the
 * conversions into the compute dtype (fp32 here: a copy, or bf16 widened). */
#include <omp.h>
#include <string.h>

#include "../../core/dtype.h"
#include "cpu_ops.h"

#define SUMSQ_MAX_THREADS 256

/* out[0] += sum x[i]^2, in double. Each thread sums a fixed static slice and the partials are added
 * in thread order, so the result has the same bits on every run with the same thread count. */
void mt_cpu_sumsq(float *out, const float *x, size_t n) {
    double part[SUMSQ_MAX_THREADS] = {0};
    int nt = n > 65536 ? omp_get_max_threads() : 1;
    if (nt > SUMSQ_MAX_THREADS) nt = SUMSQ_MAX_THREADS;
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        size_t lo = n * tid / nth, hi = n * (tid + 1) / nth;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (size_t i = lo; i < hi; i++) s += (double)x[i] * x[i];
        part[tid] = s;
    }
    double s = 0.0;
    for (int t = 0; t < nt; t++) s += part[t];
    out[0] = (float)((double)out[0] + s);
}

void mt_cpu_from_f32(float *dst, const float *src, size_t n) {
    if (n && dst != src) memcpy(dst, src, n * sizeof(float));
}

void mt_cpu_from_bf16(float *dst, const uint16_t *src, size_t n) {
    mt_convert_bf16_to_f32(dst, src, n);
}
