/* FP8 e4m3 block quantization and dequantization (fp8.h has the format). */
#include "quant/fp8.h"

#include "core/error.h"

/* blocks below this stay on the calling thread */
#define FP8_PARALLEL_MIN_BLOCKS 512

static inline uint32_t abs_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u & 0x7fffffffu;
}

/* One block; 1 when it holds a NaN or an infinity. */
static int quantize_block(const float *x, uint8_t *q, float *scale) {
    uint32_t m = 0; /* max |x| as the largest abs bit pattern: exact, and a NaN cannot hide */
    for (int i = 0; i < MT_FP8_BLOCK; i++) {
        uint32_t a = abs_bits(x[i]);
        m = a > m ? a : m;
    }
    if (m >= 0x7f800000u) return 1;
    float amax;
    memcpy(&amax, &m, 4);
    float s = amax / MT_FP8_E4M3_MAX;
    if (s == 0.0f) s = 1.0f; /* all zero, or amax / 448 underflowed: every value rounds to 0 */
    *scale = s;
    /* a division, as torch's x / scale (a reciprocal product could differ in the last bit and
     * move a value across an e4m3 rounding boundary) */
    for (int i = 0; i < MT_FP8_BLOCK; i++) q[i] = mt_fp8_e4m3_from_f32(x[i] / s);
    return 0;
}

int mt_fp8_quantize(const float *x, int64_t n, uint8_t *q, float *scales) {
    MT_CHECK(n >= 0 && n % MT_FP8_BLOCK == 0, "fp8: %lld values, not a multiple of %d",
             (long long)n, MT_FP8_BLOCK);
    int64_t nb = n / MT_FP8_BLOCK, bad = nb; /* the first block refused */
#pragma omp parallel for schedule(static) reduction(min : bad) if (nb >= FP8_PARALLEL_MIN_BLOCKS)
    for (int64_t b = 0; b < nb; b++) {
        if (quantize_block(x + b * MT_FP8_BLOCK, q + b * MT_FP8_BLOCK, scales + b) && b < bad)
            bad = b;
    }
    if (bad == nb) return MT_OK;
    int64_t i = bad * MT_FP8_BLOCK;
    while (abs_bits(x[i]) < 0x7f800000u) i++;
    return mt_error_set("fp8 quantization: element %lld is %s", (long long)i,
                        abs_bits(x[i]) > 0x7f800000u ? "NaN" : "infinite");
}

void mt_fp8_dequantize(const uint8_t *q, const float *scales, int64_t n, float *out) {
    MT_CHECK(n >= 0 && n % MT_FP8_BLOCK == 0, "fp8: %lld values, not a multiple of %d",
             (long long)n, MT_FP8_BLOCK);
    int64_t nb = n / MT_FP8_BLOCK;
#pragma omp parallel for schedule(static) if (nb >= FP8_PARALLEL_MIN_BLOCKS)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *c = q + b * MT_FP8_BLOCK;
        float *o = out + b * MT_FP8_BLOCK, s = scales[b];
        for (int i = 0; i < MT_FP8_BLOCK; i++) o[i] = mt_fp8_e4m3_to_f32(c[i]) * s;
    }
}

void mt_fp8_dequantize_bf16(const uint8_t *q, const float *scales, int64_t n, mt_bf16 *out) {
    MT_CHECK(n >= 0 && n % MT_FP8_BLOCK == 0, "fp8: %lld values, not a multiple of %d",
             (long long)n, MT_FP8_BLOCK);
    int64_t nb = n / MT_FP8_BLOCK;
#pragma omp parallel for schedule(static) if (nb >= FP8_PARALLEL_MIN_BLOCKS)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *c = q + b * MT_FP8_BLOCK;
        mt_bf16 *o = out + b * MT_FP8_BLOCK;
        float s = scales[b];
        for (int i = 0; i < MT_FP8_BLOCK; i++) o[i] = mt_f32_to_bf16(mt_fp8_e4m3_to_f32(c[i]) * s);
    }
}
