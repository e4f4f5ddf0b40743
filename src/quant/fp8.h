/* FP8 e4m3 with fine-grained scales (DeepSeek-V3's 1x128 tiles of a row-major weight).
 *
 * The element format is OCP FP8 E4M3FN (torch.float8_e4m3fn): sign, 4 exponent bits (bias 7),
 * 3 mantissa bits; no infinities; 0x7f / 0xff are NaN, so the largest value is 0x7e = 448;
 * exponent 0 holds the subnormals m * 2^-9. Conversion from fp32 rounds to nearest even and
 * saturates to +-448 (infinities too); NaN becomes 0x7f or 0xff by its sign: bit for bit torch's
 * x.clamp(-448, 448).to(torch.float8_e4m3fn) (tests/test_quant.c, every value and random ones).
 *
 * Layout of n values (n a multiple of 128): q[n] bytes, scales[n / 128] fp32; block b is
 * elements [128 b, 128 b + 128), so a block is a row's slice of 128 columns when the row length
 * is a multiple of 128. scale = amax / 448 in fp32 (amax = max |x| of the block), 1 where that is
 * 0 (an all-zero block, or one so small that amax / 448 underflows); q = e4m3(x / scale), an fp32
 * division. Dequantization: e4m3 value * scale in fp32; the bf16 variant rounds it once. */
#ifndef MT_QUANT_FP8_H
#define MT_QUANT_FP8_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/dtype.h"

/* Host and device: src/backend/cuda/dequant.cu decodes with these same definitions. */
#ifndef MT_HD
#ifdef __CUDACC__
#define MT_HD __host__ __device__
#else
#define MT_HD
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define MT_FP8_BLOCK 128
#define MT_FP8_E4M3_MAX 448.0f

/* e4m3 -> fp32, exact. NaN as torch makes it (0x7ff00000 with the sign). */
static inline MT_HD float mt_fp8_e4m3_to_f32(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (b >> 3) & 15u, m = b & 7u, u;
    if ((b & 0x7fu) == 0x7fu) {
        u = sign | 0x7ff00000u;
    } else if (e == 0) { /* subnormal: m * 2^-9, exact in fp32 */
        float v = (float)m * 0x1p-9f;
        memcpy(&u, &v, 4);
        u |= sign;
    } else {
        u = sign | (e + 120u) << 23 | m << 20; /* rebias 7 -> 127 */
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* fp32 -> e4m3, round to nearest even, saturating to +-448. */
static inline MT_HD uint8_t mt_fp8_e4m3_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint8_t sign = (uint8_t)(u >> 24 & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7fu; /* NaN */
    if (a >= 0x43e00000u) return sign | 0x7eu; /* >= 448, infinity included */
    if (a < 0x3c800000u) {
        /* below 2^-6, the subnormal range: adding 2^14 (whose fp32 ulp is 2^-9, the subnormal
         * step) rounds to nearest even in the fp32 add; the low bits are then m (8 = 2^-6, the
         * smallest normal, encodes as 0x08 as it should) */
        float v, big = 16384.0f;
        memcpy(&v, &a, 4);
        v += big;
        uint32_t w, wb;
        memcpy(&w, &v, 4);
        memcpy(&wb, &big, 4);
        return sign | (uint8_t)(w - wb);
    }
    /* normal: rebias the exponent and round the 23-bit mantissa to 3 bits, nearest even (a carry
     * into the exponent is the right result; 448's neighbourhood stays below 0x7f by the test
     * above) */
    a += ((uint32_t)(7 - 127) << 23) + 0x7ffffu + ((a >> 20) & 1u);
    return sign | (uint8_t)(a >> 20);
}

/* Quantizes x[n] (n a multiple of 128, else a fatal error) into q[n] and scales[n / 128],
 * threaded (OpenMP) for large n, the same bits for any thread count. A NaN or infinity is refused:
 * MT_ERR naming the first such element (q and scales then hold garbage); MT_OK otherwise. */
int mt_fp8_quantize(const float *x, int64_t n, uint8_t *q, float *scales);

/* out[n] = e4m3 value * scales[block] (fp32; bf16: rounded once to nearest even). Threaded. */
void mt_fp8_dequantize(const uint8_t *q, const float *scales, int64_t n, float *out);
void mt_fp8_dequantize_bf16(const uint8_t *q, const float *scales, int64_t n, mt_bf16 *out);

#ifdef __cplusplus
}
#endif

#endif
