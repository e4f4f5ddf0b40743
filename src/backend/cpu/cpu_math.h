/* Small math helpers of the CPU ops, written so that `omp simd` loops vectorize them at -O2. */
#ifndef MT_CPU_MATH_H
#define MT_CPU_MATH_H

#include <stdint.h>

typedef union {
    float f;
    uint32_t u;
} mt_cpu_fbits;

/* c ? a : b by bit masks: -O2 does not if-convert chained float ternaries, which would keep the
 * loop scalar. */
static inline float mt_cpu_select(int c, float a, float b) {
    mt_cpu_fbits A = {a}, B = {b}, R;
    uint32_t m = 0u - (uint32_t)c;
    R.u = (A.u & m) | (B.u & ~m);
    return R.f;
}

/* exp(x) in fp32 without a libm call (libm's expf is a call per element: a fifth of attention's
 * time). Cephes' range reduction and polynomial, within 1 ulp of exp over [-87, 88] (measured);
 * x < -87.3 gives 0, x > 88 gives exp(88), NaN stays NaN. Meant for softmax arguments (<= 0). */
static inline float mt_cpu_expf(float x) {
    float xc = mt_cpu_select(x < -87.3f, -87.3f, x);
    xc = mt_cpu_select(xc > 88.0f, 88.0f, xc);
    /* n = round(xc / ln 2) by the 1.5 * 2^23 trick: n lands in fz's low mantissa bits */
    float fz = xc * 1.44269504088896341f + 12582912.0f;
    float n = fz - 12582912.0f;
    float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    mt_cpu_fbits z = {fz}, s;
    s.u = (z.u - 0x4B400000u + 127u) << 23; /* 2^n */
    return mt_cpu_select(x < -87.3f, 0.0f, y * s.f);
}

#endif
