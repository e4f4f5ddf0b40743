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
 * the largest k with x >= thr[k] (thr[k] the fp32 midpoint of code[k-1] and code[k]), found from
 * a 64K-entry table over x's top 16 bits (a bf16 cell holds at most one threshold, checked when
 * the maps are built) and one comparison. */
#ifndef MT_OPTIM_QMAP_H
#define MT_OPTIM_QMAP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    float code[256];       /* ascending */
    float thr[257];        /* thr[0] = -inf, thr[k] = f32((code[k-1] + code[k]) / 2), thr[256] = NaN */
    uint8_t lut[65536 + 4];/* lut[bits >> 16] = nearest code of the bf16-truncated value; +4 pad:
                            * vector paths read it 32 bits at a time */
    int is_signed;
} mt_qmap;

const mt_qmap *mt_qmap_signed(void);   /* exp_avg */
const mt_qmap *mt_qmap_unsigned(void); /* exp_avg_sq */

/* Reference: nearest code by binary search over thr (NaN -> 0). */
uint8_t mt_qmap_nearest(const mt_qmap *q, float x);

/* The kernels' quantization (== mt_qmap_nearest for every non-NaN float, tested; a NaN gets
 * a deterministic code): the code of x's bf16
 * truncation t, moved by one when x is past the next threshold away from t (x >= t for x >= +0,
 * x <= t below). */
static inline uint8_t mt_qmap_quantize(const mt_qmap *q, float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    int k = q->lut[u >> 16];
    if (u >> 31) k -= x < q->thr[k];
    else k += x >= q->thr[k + 1];
    return (uint8_t)k;
}

/* Scalar block helpers (tests, conversions): scale = max |x| as the kernels compute it (on the
 * bits: order-free, a NaN wins), codes = nearest of x / scale (x / 1 when the block is zero). */
float mt_qmap_quantize_block(const mt_qmap *q, const float *x, size_t n, uint8_t *codes);
void mt_qmap_dequantize_block(const mt_qmap *q, const uint8_t *codes, float scale, size_t n,
                              float *x);

#endif
