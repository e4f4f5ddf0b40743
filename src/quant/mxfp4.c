/* MXFP4 dequantization (mxfp4.h has the format, the layout and what transformers does). */
#include "quant/mxfp4.h"

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
