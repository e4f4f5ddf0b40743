/* 8-bit dynamic quantization maps for the Adam moments (Dettmers et al., "8-bit Optimizers via
 * Block-wise Quantization", 2022; the dynamic tree of Dettmers 2015).
 *
 * Dynamic tree quantization, as the paper defines it: after the sign bit, a run of E zero bits
 * gives the exponent (base 10: magnitude 10^-E, E = 0..6), the first one bit ends the run, and the
 * bits after it are a linear fraction over [0.1, 1]: F bits split [0.1, 1] into 2^F equal
 * intervals and the code is the middle of one. The signed map (exp_avg) has F = 6 - E, so
 * 2^6 + ... + 2^0 = 127 magnitudes of each sign; the unsigned map (exp_avg_sq >= 0) spends the
 * sign bit as one more fraction bit, F = 7 - E, 254 magnitudes. Both add exact 0 and 1 (the
 * block's absmax element is stored exactly when positive): 256 codes. Spacing, and so the
 * worst error (half a spacing, times the block scale), is 0.9 * 10^-E / 2^F inside decade E.
 *
 * A byte's value is code[byte], the codes sorted ascending. Quantization is to the nearest code:
 * the largest k with x >= thr[k] (thr[k] the fp32 midpoint of code[k-1] and code[k]). The kernels
 * find it with one table read: x's top 16 bits name a bf16 cell (|x| clamped to [2^-24, 1]: no
 * threshold lies below or above), which holds at most one threshold (checked when the maps are
 * built); the cell's entry is the code of the cell's end nearer zero and the low 16 bits of that
 * threshold, and one integer comparison with x's low 16 bits moves the code by one or not. */
#ifndef MT_OPTIM_QMAP_H
#define MT_OPTIM_QMAP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Host and device: src/backend/cuda/optim.cu runs these same definitions on the GPU. */
#ifndef MT_HD
#ifdef __CUDACC__
#define MT_HD __host__ __device__
#else
#define MT_HD
#endif
#endif

/* bf16 cells of |x| with an entry: [2^-24, 1], 3073 of each sign */
#define MT_QMAP_CELL_LO 0x3380u
#define MT_QMAP_CELL_HI 0x3f80u
#define MT_QMAP_CELLS (MT_QMAP_CELL_HI - MT_QMAP_CELL_LO + 1)
#define MT_QMAP_NO_THR 0x10000u /* a cell without threshold: beyond every low half */

typedef struct {
    float code[256];  /* ascending */
    float thr[257];   /* thr[0] = -inf, thr[k] = f32((code[k-1] + code[k]) / 2), thr[256] = NaN */
    /* [sign * MT_QMAP_CELLS + cell]: code | (low 16 bits of the cell's threshold, or
     * MT_QMAP_NO_THR) << 8 */
    uint32_t cell[2 * MT_QMAP_CELLS];
    /* [x's top 16 bits]: cell[mt_qmap_cell_index(x)], the clamp and sign folded into the index
     * (the vector kernels: 7 vector operations fewer per lookup, for 256 KB) */
    uint32_t cell_by_top[1 << 16];
    int is_signed;
} mt_qmap;

const mt_qmap *mt_qmap_signed(void);   /* exp_avg */
const mt_qmap *mt_qmap_unsigned(void); /* exp_avg_sq */

/* Reference: nearest code by binary search over thr (NaN -> 0). */
uint8_t mt_qmap_nearest(const mt_qmap *q, float x);

/* The kernels' quantization (== mt_qmap_nearest for every non-NaN float, tested; a NaN gets
 * a deterministic code). Above zero the cell's threshold is the one above its code (x >= it:
 * one code up), below zero the one below (x < it, i.e. more low bits: one code down). */
MT_HD static inline uint32_t mt_qmap_cell_index(uint32_t u) {
    uint32_t a = (u >> 16) & 0x7fffu;
    a = a < MT_QMAP_CELL_LO ? MT_QMAP_CELL_LO : a > MT_QMAP_CELL_HI ? MT_QMAP_CELL_HI : a;
    return a - MT_QMAP_CELL_LO + (u >> 31) * MT_QMAP_CELLS;
}

MT_HD static inline uint8_t mt_qmap_quantize(const mt_qmap *q, float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t e = q->cell[mt_qmap_cell_index(u)];
    uint32_t k = e & 0xffu, t = e >> 8, low = u & 0xffffu;
    if (u >> 31) k -= low > t;
    else k += low >= t;
    return (uint8_t)k;
}

/* Scalar block helpers (tests, conversions): scale = max |x| as the kernels compute it (on the
 * bits: order-free, a NaN wins), codes = nearest of x / scale (x / 1 when the block is zero). */
float mt_qmap_quantize_block(const mt_qmap *q, const float *x, size_t n, uint8_t *codes);
void mt_qmap_dequantize_block(const mt_qmap *q, const uint8_t *codes, float scale, size_t n,
                              float *x);

#endif
