#include "dtype.h"

#include <math.h>

size_t mt_dtype_size(mt_dtype t) {
    switch (t) {
    case MT_F32: return 4;
    case MT_BF16: return 2;
    case MT_F16: return 2;
    case MT_I32: return 4;
    case MT_I64: return 8;
    case MT_U16: return 2;
    case MT_U8: return 1;
    }
    return 0;
}

static const char *const dtype_names[] = {"F32", "BF16", "F16", "I32", "I64", "U16", "U8"};

const char *mt_dtype_name(mt_dtype t) {
    if ((unsigned)t < sizeof dtype_names / sizeof dtype_names[0]) return dtype_names[t];
    return "?";
}

int mt_dtype_parse(const char *name, mt_dtype *out) {
    for (unsigned i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++) {
        if (strcmp(name, dtype_names[i]) == 0) {
            *out = (mt_dtype)i;
            return 0;
        }
    }
    return -1;
}

float mt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: value = man * 2^-24 */
            float f = (float)man * 5.9604644775390625e-8f;
            memcpy(&u, &f, 4);
            u |= sign;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; overflow to inf; NaN preserved. */
uint16_t mt_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return sign | 0x7e00u;
    if (abs >= 0x477ff000u) return sign | 0x7c00u; /* rounds to >= 65520: inf */
    if (abs < 0x38800000u) {                        /* below the smallest normal half */
        float a;
        memcpy(&a, &abs, 4);
        /* subnormal half step is 2^-24; rint() rounds to nearest even in the default mode */
        return sign | (uint16_t)rintf(a * 16777216.0f);
    }
    uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
    return sign | (uint16_t)((rounded - 0x38000000u) >> 13);
}

#define PARALLEL_MIN 65536

void mt_convert_bf16_to_f32(float *dst, const mt_bf16 *src, size_t n) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = mt_bf16_to_f32(src[i]);
}

void mt_convert_f32_to_bf16(mt_bf16 *dst, const float *src, size_t n) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = mt_f32_to_bf16(src[i]);
}

void mt_convert_f16_to_f32(float *dst, const uint16_t *src, size_t n) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = mt_f16_to_f32(src[i]);
}

void mt_convert_f32_to_f16(uint16_t *dst, const float *src, size_t n) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = mt_f32_to_f16(src[i]);
}
