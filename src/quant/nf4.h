/* NF4: bitsandbytes' 4-bit NormalFloat (QLoRA, Dettmers et al. 2023), bit for bit as
 * bitsandbytes.functional.quantize_4bit(quant_type="nf4", blocksize=64) (bnb 0.50).
 *
 * Layout of n values (n a multiple of 64):
 *  - absmax[n / 64] fp32: block b = elements [64 b, 64 b + 64), absmax[b] = max |x| of the block;
 *  - codes[n / 2] bytes: byte j holds element 2j in its high nibble and 2j + 1 in its low nibble
 *    (bnb's packing: (q[0::2] << 4) | q[1::2]); a nibble indexes mt_nf4_code.
 * Quantization: s = x * inv in fp32, then q = the number of thresholds strictly below s (a value on a
 * threshold takes the lower code). bitsandbytes has two rules that differ by one fp32 value at 4
 * of the 15 thresholds (and for absmax < 1e-38); both are here:
 *  - MT_NF4_BNB_CPU (the default; what bnb computes on the CPU, checked against bnb itself):
 *    inv = 1 / max(absmax, 1e-38f) (bnb: A * (1.0 / absmax.clamp(min=1e-38))), thresholds the fp32
 *    midpoints (code[i] + code[i+1]) / 2 (torch.bucketize). An all-zero block is code 7 (0.0).
 *  - MT_NF4_BNB_CUDA (bnb's CUDA kernel, kQuantizeBlockwise + dQuantizeNF4): inv = 1 / absmax,
 *    thresholds the float literals of dQuantizeNF4's tree ("x > t" tests), which nvcc rounds from
 *    decimal straight to fp32: one ulp off the fp32 midpoints at thresholds 0, 8, 12 and 14 (the
 *    decimals sit just beside exact fp32 ties), so s = -0x1.b239bp-1, 0x1.ec90c6p-4, 0x1.00da08p-1
 *    and 0x1.b913b4p-1 get code 1, 8, 13, 15 there against 0, 9, 12, 14 on the CPU. An all-zero
 *    block is 0 * inf = NaN there, every test false: code 0 (-1.0), dequantizing to -0.0.
 * Dequantization (either rule): code value * absmax in fp32, as bnb does; the bf16 variant rounds
 * that product once (to nearest even).
 *
 * bnb's double quantization (compress_statistics) is not implemented: bnb's own result is not a
 * function of the input alone. Its offset is torch's fp32 absmax.mean(), summed in an order that
 * depends on the CPU's vector width and torch's thread count, and its 8-bit step differs between
 * bnb's CPU (a 65536-cell lookup table, not the nearest code) and its CUDA kernel (a binary
 * search), so no fixed algorithm here can match "bnb" bit for bit (tests/fixtures/README.md). */
#ifndef MT_QUANT_NF4_H
#define MT_QUANT_NF4_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_NF4_BLOCK 64

/* bnb's NF4 table (functional.get_4bit_type("nf4")) as fp32, ascending; index = code. Hex so that
 * no decimal-to-float rounding can differ; also the CUDA kernel's table (dequant.cu). */
#define MT_NF4_CODE_INIT                                                                       \
    {-0x1p+0f,        -0x1.647362p-1f, -0x1.0cd66p-1f,  -0x1.94654p-2f,  -0x1.23449ap-2f,     \
     -0x1.7a6a7ep-3f, -0x1.74f0e2p-4f, 0.0f,            0x1.45f5fep-4f,  0x1.4995c6p-3f,      \
     0x1.f809bap-3f,  0x1.5a0674p-2f,  0x1.c3497p-2f,   0x1.200f56p-1f,  0x1.722766p-1f,      \
     0x1p+0f}
/* fp32 (code[i] + code[i+1]) / 2: bnb's CPU thresholds (its torch.bucketize bounds). */
#define MT_NF4_MID_INIT                                                                        \
    {-0x1.b239b0p-1f, -0x1.38a4e0p-1f, -0x1.d70900p-2f, -0x1.5bd4ecp-2f, -0x1.e079d8p-3f,     \
     -0x1.1a7178p-3f, -0x1.74f0e2p-5f, 0x1.45f5fep-5f,  0x1.ec90c4p-4f,  0x1.a0cfc0p-3f,      \
     0x1.2b05a8p-2f,  0x1.8ea7f2p-2f,  0x1.00da08p-1f,  0x1.491b5ep-1f,  0x1.b913b4p-1f}
/* bnb's CUDA tree (csrc/kernels.cu dQuantizeNF4), its literals as nvcc rounds them, ascending. */
#define MT_NF4_TREE_INIT                                                                       \
    {-0x1.b239b2p-1f, -0x1.38a4e0p-1f, -0x1.d70900p-2f, -0x1.5bd4ecp-2f, -0x1.e079d8p-3f,     \
     -0x1.1a7178p-3f, -0x1.74f0e2p-5f, 0x1.45f5fep-5f,  0x1.ec90c6p-4f,  0x1.a0cfc0p-3f,      \
     0x1.2b05a8p-2f,  0x1.8ea7f2p-2f,  0x1.00da06p-1f,  0x1.491b5ep-1f,  0x1.b913b2p-1f}
/* bnb's clamp on absmax before the reciprocal (the fp32 nearest 1e-38, a subnormal) */
#define MT_NF4_ABSMAX_FLOOR 0x1.b38fb8p-127f

extern const float mt_nf4_code[16];
extern const float mt_nf4_mid[15];  /* MT_NF4_MID_INIT */
extern const float mt_nf4_tree[15]; /* MT_NF4_TREE_INIT */

typedef enum { MT_NF4_BNB_CPU = 0, MT_NF4_BNB_CUDA = 1 } mt_nf4_rule;

/* Bytes of codes for n values (n / 2), and absmax entries (n / 64). */
static inline size_t mt_nf4_bytes(int64_t n) { return (size_t)n / 2; }
static inline size_t mt_nf4_blocks(int64_t n) { return (size_t)n / MT_NF4_BLOCK; }

/* The code of one already-scaled value s: the count of thresholds thr[15] below s (NaN: 0). */
static inline uint8_t mt_nf4_code_of(float s, const float *thr) {
    uint8_t q = 0;
    for (int i = 0; i < 15; i++) q += s > thr[i];
    return q;
}

/* Quantizes x[n] (n a multiple of 64, else a fatal error) into codes[n / 2] and absmax[n / 64]
 * under MT_NF4_BNB_CPU, threaded (OpenMP) for large n; every block is independent, so the result
 * does not depend on the thread count. A NaN or infinity is refused: MT_ERR naming the first such element (codes and
 * absmax then hold garbage for the caller to drop); MT_OK otherwise. */
int mt_nf4_quantize(const float *x, int64_t n, uint8_t *codes, float *absmax);
/* The same under either of bnb's rules (mt_nf4_quantize is MT_NF4_BNB_CPU). */
int mt_nf4_quantize_rule(const float *x, int64_t n, uint8_t *codes, float *absmax,
                         mt_nf4_rule rule);

/* out[n] (fp32 / bf16) = mt_nf4_code[nibble] * absmax[block] (the fp32 product; bf16: rounded once
 * to nearest even). Threaded for large n. */
void mt_nf4_dequantize(const uint8_t *codes, const float *absmax, int64_t n, float *out);
void mt_nf4_dequantize_bf16(const uint8_t *codes, const float *absmax, int64_t n, mt_bf16 *out);

#ifdef __cplusplus
}
#endif

#endif
