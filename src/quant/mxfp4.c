/* MXFP4 dequantization (mxfp4.h has the format, the layout and what transformers does). */
#include "quant/mxfp4.h"

#include <math.h>

#include "core/error.h"

const float mt_mxfp4_e2m1[16] = MT_MXFP4_E2M1_INIT;

/* blocks (of 32 values) below this stay on the calling thread */
#define MXFP4_PARALLEL_MIN_BLOCKS 2048

/* The 16 values of one block's codes: e2m1 times 2^(scale - 127), exactly mt_mxfp4_value. */
static inline void block_table(uint8_t scale, float t[16]) {
    for (int c = 0; c < 16; c++) t[c] = mt_mxfp4_value((uint8_t)c, scale);
}

/* rows, cols (and mats) acceptable: non-negative, cols a multiple of 32, the count within int64. */
static int check_sizes(const char *fn, int64_t mats, int64_t rows, int64_t cols) {
    if (mats < 0 || rows < 0 || cols < 0)
        return mt_error_set("%s: negative size (%lld matrices of %lld x %lld)", fn, (long long)mats,
                            (long long)rows, (long long)cols);
    if (cols % MT_MXFP4_BLOCK != 0)
        return mt_error_set("%s: %lld columns, not a multiple of the %d-element block", fn,
                            (long long)cols, MT_MXFP4_BLOCK);
    int64_t n;
    if (__builtin_mul_overflow(mats, rows, &n) || __builtin_mul_overflow(n, cols, &n))
        return mt_error_set("%s: %lld x %lld x %lld elements overflow int64", fn, (long long)mats,
                            (long long)rows, (long long)cols);
    return MT_OK;
}

int mt_mxfp4_shape(const int64_t *blocks_shape, int blocks_ndim, const int64_t *scales_shape,
                   int scales_ndim, int64_t *mats, int64_t *rows, int64_t *cols) {
    if (blocks_ndim < 3)
        return mt_error_set("mxfp4: blocks have %d dimensions, want [..., rows, groups, 16]",
                            blocks_ndim);
    if (blocks_shape[blocks_ndim - 1] != MT_MXFP4_BLOCK_BYTES)
        return mt_error_set("mxfp4: blocks' last dimension is %lld, want %d (32 codes, two a byte)",
                            (long long)blocks_shape[blocks_ndim - 1], MT_MXFP4_BLOCK_BYTES);
    if (scales_ndim != blocks_ndim - 1)
        return mt_error_set("mxfp4: scales have %d dimensions, want %d (the blocks' shape without "
                            "its last)",
                            scales_ndim, blocks_ndim - 1);
    int64_t m = 1;
    for (int i = 0; i < scales_ndim; i++) {
        if (scales_shape[i] != blocks_shape[i])
            return mt_error_set("mxfp4: scales dimension %d is %lld, blocks have %lld", i,
                                (long long)scales_shape[i], (long long)blocks_shape[i]);
        if (blocks_shape[i] < 0)
            return mt_error_set("mxfp4: dimension %d is negative (%lld)", i,
                                (long long)blocks_shape[i]);
        if (i < scales_ndim - 2 && __builtin_mul_overflow(m, blocks_shape[i], &m))
            return mt_error_set("mxfp4: the matrix count overflows int64");
    }
    int64_t r = blocks_shape[blocks_ndim - 3], c;
    if (__builtin_mul_overflow(blocks_shape[blocks_ndim - 2], (int64_t)MT_MXFP4_BLOCK, &c))
        return mt_error_set("mxfp4: %lld groups of 32 overflow int64",
                            (long long)blocks_shape[blocks_ndim - 2]);
    MT_TRY(check_sizes("mxfp4", m, r, c));
    *mats = m, *rows = r, *cols = c;
    return MT_OK;
}

int mt_mxfp4_dequantize(const uint8_t *blocks, const uint8_t *scales, int64_t rows, int64_t cols,
                        float *out) {
    MT_TRY(check_sizes("mxfp4 dequantize", 1, rows, cols));
    int64_t nb = rows * (cols / MT_MXFP4_BLOCK);
#pragma omp parallel for schedule(static) if (nb >= MXFP4_PARALLEL_MIN_BLOCKS)
    for (int64_t b = 0; b < nb; b++) {
        float t[16];
        block_table(scales[b], t);
        const uint8_t *q = blocks + b * MT_MXFP4_BLOCK_BYTES;
        float *o = out + b * MT_MXFP4_BLOCK;
        for (int j = 0; j < MT_MXFP4_BLOCK_BYTES; j++) {
            o[2 * j] = t[q[j] & 15u];   /* low nibble: the even element */
            o[2 * j + 1] = t[q[j] >> 4]; /* high nibble: the odd one */
        }
    }
    return MT_OK;
}

int mt_mxfp4_dequantize_bf16(const uint8_t *blocks, const uint8_t *scales, int64_t rows,
                             int64_t cols, mt_bf16 *out) {
    MT_TRY(check_sizes("mxfp4 dequantize", 1, rows, cols));
    int64_t nb = rows * (cols / MT_MXFP4_BLOCK);
#pragma omp parallel for schedule(static) if (nb >= MXFP4_PARALLEL_MIN_BLOCKS)
    for (int64_t b = 0; b < nb; b++) {
        float t[16];
        mt_bf16 h[16];
        block_table(scales[b], t);
        for (int c = 0; c < 16; c++) h[c] = mt_f32_to_bf16(t[c]); /* exact: no rounding happens */
        const uint8_t *q = blocks + b * MT_MXFP4_BLOCK_BYTES;
        mt_bf16 *o = out + b * MT_MXFP4_BLOCK;
        for (int j = 0; j < MT_MXFP4_BLOCK_BYTES; j++) {
            o[2 * j] = h[q[j] & 15u];
            o[2 * j + 1] = h[q[j] >> 4];
        }
    }
    return MT_OK;
}

int mt_mxfp4_dequantize_transposed(const uint8_t *blocks, const uint8_t *scales, int64_t mats,
                                   int64_t rows, int64_t cols, float *out) {
    MT_TRY(check_sizes("mxfp4 dequantize_transposed", mats, rows, cols));
    int64_t groups = cols / MT_MXFP4_BLOCK, nb = mats * rows * groups;
    /* one task per (matrix, group of 32 columns): it writes those 32 rows of the transposed
     * matrix, every element of them, so tasks never share an output element */
#pragma omp parallel for schedule(static) if (nb >= MXFP4_PARALLEL_MIN_BLOCKS)
    for (int64_t mg = 0; mg < mats * groups; mg++) {
        int64_t m = mg / groups, g = mg % groups;
        float *o = out + m * cols * rows + g * MT_MXFP4_BLOCK * rows; /* [m][32 g][0] */
        for (int64_t r = 0; r < rows; r++) {
            int64_t b = (m * rows + r) * groups + g;
            float t[16];
            block_table(scales[b], t);
            const uint8_t *q = blocks + b * MT_MXFP4_BLOCK_BYTES;
            for (int j = 0; j < MT_MXFP4_BLOCK_BYTES; j++) {
                o[(2 * j) * rows + r] = t[q[j] & 15u];
                o[(2 * j + 1) * rows + r] = t[q[j] >> 4];
            }
        }
    }
    return MT_OK;
}

/* ---- quantization (mxfp4.h) ---- */

/* |v| in [0, 6] -> its e2m1 magnitude code 0..7: the nearest grid value, ties to the even code.
 * The midpoints between codes i and i + 1; a value on one takes i + 1 when i is odd. */
static inline uint8_t e2m1_round(float v) {
    static const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    uint8_t c = 0;
    for (int i = 0; i < 7; i++) c += (uint8_t)(i & 1 ? v >= mid[i] : v > mid[i]);
    return c;
}

uint8_t mt_mxfp4_quantize_block(const float *x, int64_t stride, uint8_t codes[MT_MXFP4_BLOCK_BYTES]) {
    float amax = 0.0f;
    for (int j = 0; j < MT_MXFP4_BLOCK; j++) amax = fmaxf(amax, fabsf(x[j * stride]));
    /* the smallest e with amax <= 6 * 2^e: amax = m 2^k, m in [0.5, 1), and 6 * 2^(k-3) = 0.75 * 2^k */
    int e = -MT_MXFP4_SCALE_BIAS;
    if (amax > 0.0f) {
        int k;
        float m = frexpf(amax, &k);
        e = m <= 0.75f ? k - 3 : k - 2;
        if (e < -MT_MXFP4_SCALE_BIAS) e = -MT_MXFP4_SCALE_BIAS; /* amax <= 6 * 2^-127 */
    }
    /* 1 / X: 2^-e, e in [-127, 126] (amax <= FLT_MAX < 6 * 2^126); ldexpf is exact here */
    float inv = ldexpf(1.0f, -e);
    for (int j = 0; j < MT_MXFP4_BLOCK_BYTES; j++) {
        uint8_t q[2];
        for (int h = 0; h < 2; h++) {
            float v = x[(2 * j + h) * stride];
            uint8_t c = e2m1_round(fabsf(v) * inv);
            if (e == 126 && c > 5) c = 5; /* 4 * 2^126 = 2^128 is past FLT_MAX: 3 * 2^126 */
            q[h] = (uint8_t)(c | (signbit(v) ? 8u : 0u));
        }
        codes[j] = (uint8_t)(q[0] | q[1] << 4);
    }
    return (uint8_t)(e + MT_MXFP4_SCALE_BIAS);
}

int mt_mxfp4_quantize_transposed(const float *in, int64_t mats, int64_t rows, int64_t cols,
                                 uint8_t *blocks, uint8_t *scales) {
    MT_TRY(check_sizes("mxfp4 quantize", mats, rows, cols));
    int64_t n = mats * rows * cols, first_bad = n;
    /* the first non-finite element, over threads (a gpt-oss-120b expert tensor is 2.1 G values:
     * one thread took seconds a tensor, minutes a random init) */
#pragma omp parallel for schedule(static) reduction(min : first_bad) if (n >= (1 << 20))
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(in[i]) && i < first_bad) first_bad = i;
    if (first_bad < n)
        return mt_error_set("mxfp4 quantize: element %lld is %g (MXFP4 holds finite values)",
                            (long long)first_bad, (double)in[first_bad]);
    int64_t groups = cols / MT_MXFP4_BLOCK, nb = mats * rows * groups;
    /* block b = (m, r, g): the 32 values in[m][32 g + j][r], j = 0..31, `rows` apart. Visited in
     * (m, g, r) order, r fastest: neighbouring iterations read neighbouring floats of the same 32
     * rows, so each cache line serves 16 blocks (in (m, r, g) order each block's 32 reads were 32
     * lines touched once) */
#pragma omp parallel for schedule(static) if (nb >= MXFP4_PARALLEL_MIN_BLOCKS)
    for (int64_t i = 0; i < nb; i++) {
        int64_t m = i / (groups * rows), g = i / rows % groups, r = i % rows;
        int64_t b = (m * rows + r) * groups + g;
        const float *x = in + m * cols * rows + g * MT_MXFP4_BLOCK * rows + r;
        scales[b] = mt_mxfp4_quantize_block(x, rows, blocks + b * MT_MXFP4_BLOCK_BYTES);
    }
    return MT_OK;
}
