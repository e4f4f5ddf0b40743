/* MXFP4: the OCP Microscaling 4-bit format as the gpt-oss checkpoints store their MoE experts,
 * dequantized bit for bit as transformers 5.25 does (integrations/mxfp4.py,
 * _convert_moe_packed_tensors, the loader's Mxfp4Dequantize path; tests/test_mxfp4.c).
 *
 * Format (OCP Microscaling Formats (MX) Specification v1.0, MXFP4): blocks of k = 32 elements
 * share one scale X; element i is X * P_i.
 *  - P_i is FP4 E2M1: 1 sign bit, 2 exponent bits (bias 1), 1 mantissa bit; exponent 0 is the
 *    subnormal 0.5 * m. No infinities, no NaN. The 16 codes, low 3 bits the magnitude, bit 3 the
 *    sign: 0..7 = +0, 0.5, 1, 1.5, 2, 3, 4, 6; 8..15 = -0, -0.5, -1, -1.5, -2, -3, -4, -6
 *    (mt_mxfp4_e2m1, transformers' FP4_VALUES).
 *  - X is E8M0: an unsigned 8-bit biased exponent, X = 2^(s - 127), s = 0..254 (2^-127 ..
 *    2^127); no sign, no mantissa, no zero. The spec makes s = 255 NaN (the whole block NaN).
 *    transformers does not: it computes torch.ldexp(P, s - 127), so s = 255 is 2^128 like any
 *    other exponent (0.5 * 2^128 = 2^127 finite, |P| >= 1 overflows to inf, +-0 stays +-0), and
 *    these functions do the same. No code / scale pair gives NaN.
 * Every value P * 2^(s-127) is exact in fp32 (P has at most 2 significant bits; the smallest
 * non-zero one, 0.5 * 2^-127 = 2^-128, is an fp32 subnormal, and fp32 has subnormals to 2^-149)
 * unless it exceeds FLT_MAX, which rounds to +-inf (|P| * 2^(s-127) >= 2^128: s = 253 with |P| >= 4,
 * 254 with |P| >= 2, 255 with |P| >= 1). The bf16 result is the fp32 one's top 16 bits (also exact: bf16 has
 * fp32's exponent range and P needs 1 mantissa bit), as transformers' dtype=torch.bfloat16 (its
 * default) gives.
 *
 * Layout (the checkpoint's `<proj>_blocks` U8 [..., R, G, 16] and `<proj>_scales` U8 [..., R, G]):
 * a matrix of R rows and C = 32 G columns, row-major, one scale a row's block of 32 columns:
 * element (r, c) is code nibble (c % 2 == 0 ? low : high) of byte blocks[r][c / 32][(c % 32) / 2]
 * (the LOW nibble first: transformers' sub[:, 0::2] = lut[blk & 0x0F], sub[:, 1::2] = lut[blk >> 4]),
 * times 2^(scales[r][c / 32] - 127). The leading dimensions (gpt-oss: E experts) are just more rows.
 * In gpt-oss, R is the output dimension and C the input: `mlp.experts.gate_up_proj_blocks`
 * [E, 2 F, H / 32, 16] (rows gate and up interleaved: row 2 j is gate j, row 2 j + 1 up j) and
 * `mlp.experts.down_proj_blocks` [E, H, F / 32, 16], i.e. [out, in] as an nn.Linear weight.
 * transformers then transposes each matrix (out.transpose(1, 2)) into its parameter layout
 * [E, in, out] (GptOssExperts.gate_up_proj [E, H, 2F], down_proj [E, F, H], used as x @ W):
 * mt_mxfp4_dequantize_transposed writes that layout.
 *
 * Quantization (megatrain's own; a LoRA base from a bf16 or fp32 checkpoint or a random init,
 * --base-dtype mxfp4): a block's scale is the smallest power of two X = 2^e with amax <= 6 X (amax
 * the block's largest |x|), i.e. e = ceil(log2(amax / 6)) computed exactly (frexp, no rounding),
 * at least -127, e8m0's smallest (an all-zero block, or one with amax <= 6 * 2^-127: s = 0; e is
 * at most 126 as amax <= FLT_MAX). Then every x / X lies in [-6, 6] (no element saturates; the OCP
 * spec's floor(log2 amax) - 2 would clip amax / X in (6, 8) to 6) and is rounded to the nearest
 * of {0, 0.5, 1, 1.5, 2, 3, 4, 6}, ties to the even code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1,
 * 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), with x's sign (a negative x that rounds to 0 is code 8,
 * -0). So dequantize(quantize(x)) is the grid point X * P nearest x; the one exception is where
 * that point is 4 * 2^126 = 2^128, past FLT_MAX (|x| >= 3.5 * 2^126, about 3e38): such x takes
 * the largest finite one, 3 * 2^126. x / X is exact in fp32 (X a power of two) but for results
 * below 2^-126, which are far below the first midpoint 0.25 and round to 0 either way. A
 * non-finite value is refused (MT_ERR naming its index). Values that came from MXFP4 (a dequantized
 * checkpoint) quantize back to the same values: X is never above their block's scale, and the
 * e2m1 grid doubled or quadrupled up to amax is within the grid. */
#ifndef MT_QUANT_MXFP4_H
#define MT_QUANT_MXFP4_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_MXFP4_BLOCK 32      /* elements a scale */
#define MT_MXFP4_BLOCK_BYTES 16 /* bytes of codes a block (the blocks tensor's last dimension) */
#define MT_MXFP4_SCALE_BIAS 127

/* E2M1 code -> value, transformers' FP4_VALUES; exact decimals. */
#define MT_MXFP4_E2M1_INIT \
    {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f}
extern const float mt_mxfp4_e2m1[16];

/* One value: e2m1 code (0..15) times 2^(scale - 127), exact, +-inf on overflow (see above). */
static inline float mt_mxfp4_value(uint8_t code, uint8_t scale) {
    float p = mt_mxfp4_e2m1[code & 15u], x;
    if (scale == 0) {
        /* 2^-127 is an fp32 subnormal; the product stays exact (p * 2^-127 needs 2 bits at 2^-128) */
        uint32_t u = 0x00400000u;
        memcpy(&x, &u, 4);
        return p * x;
    }
    /* s = 1..254: 2^(s-127) is a normal float; s = 255 is 2^127 * 2 (2^128 has no float) */
    uint32_t u = (uint32_t)(scale == 255 ? 254 : scale) << 23;
    memcpy(&x, &u, 4);
    return scale == 255 ? (p * x) * 2.0f : p * x;
}

/* Codes bytes and scales of a rows x cols matrix (cols a multiple of 32). */
static inline size_t mt_mxfp4_bytes(int64_t rows, int64_t cols) { return (size_t)(rows * (cols / 2)); }
static inline size_t mt_mxfp4_scales(int64_t rows, int64_t cols) {
    return (size_t)(rows * (cols / MT_MXFP4_BLOCK));
}

/* The matrix shape of a checkpoint pair: blocks [d0, .., dk, R, G, 16] and scales [d0, .., dk, R, G]
 * (k >= -1: no leading dimension is fine; the blocks tensor has at least 3 dimensions) give
 * *mats = d0 * .. * dk (1 without), *rows = R, *cols = 32 G. MT_ERR naming the mismatch otherwise
 * (blocks' last dimension not 16, scales not blocks' shape without it, fewer than 3 dimensions, a
 * negative dimension, or an element count past int64). */
int mt_mxfp4_shape(const int64_t *blocks_shape, int blocks_ndim, const int64_t *scales_shape,
                   int scales_ndim, int64_t *mats, int64_t *rows, int64_t *cols);

/* out[rows * cols] fp32, row-major: the checkpoint's own layout (element (r, c) above; gpt-oss:
 * [out, in]). rows counts every row of the tensor (gpt-oss: E * R). cols a multiple of 32 and
 * both >= 0, else MT_ERR with a message and nothing written. blocks holds rows * cols / 2 bytes,
 * scales rows * cols / 32. Threaded (OpenMP) for large inputs; the same bits for any thread count. */
int mt_mxfp4_dequantize(const uint8_t *blocks, const uint8_t *scales, int64_t rows, int64_t cols,
                        float *out);
/* The same rounded to bf16 (exact: the fp32 value's top half). */
int mt_mxfp4_dequantize_bf16(const uint8_t *blocks, const uint8_t *scales, int64_t rows,
                             int64_t cols, mt_bf16 *out);
/* mats matrices of rows x cols each, every one written transposed: out[m][c][r] = element (r, c)
 * of matrix m, i.e. [mats, cols, rows] - transformers' convert_moe_packed_tensors result and the
 * GptOssExperts parameter layout [E, in, out]. MT_ERR as above (mats >= 0 too). */
int mt_mxfp4_dequantize_transposed(const uint8_t *blocks, const uint8_t *scales, int64_t mats,
                                   int64_t rows, int64_t cols, float *out);

/* One block's 32 values, x[j * stride] for j = 0..31, quantized as above: codes[16] (element 2j in
 * byte j's low nibble, 2j + 1 in its high one) and the e8m0 scale returned. The values must be
 * finite (mt_mxfp4_quantize_transposed checks). */
uint8_t mt_mxfp4_quantize_block(const float *x, int64_t stride, uint8_t codes[MT_MXFP4_BLOCK_BYTES]);

/* The inverse of mt_mxfp4_dequantize_transposed's layout: in [mats, cols, rows] (gpt-oss's
 * parameter layout [E, in, out]) -> blocks and scales of mats row-major rows x cols matrices
 * (the checkpoint's [E, out, in / 32, 16] and [E, out, in / 32]), each block 32 columns of a row.
 * MT_ERR (nothing promised written) for bad sizes as above or a non-finite input (its index). */
int mt_mxfp4_quantize_transposed(const float *in, int64_t mats, int64_t rows, int64_t cols,
                                 uint8_t *blocks, uint8_t *scales);

#ifdef __cplusplus
}
#endif

#endif
