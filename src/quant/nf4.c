/* NF4 quantization and dequantization (nf4.h says what bitsandbytes does and why this matches). */
#include "quant/nf4.h"

#include <string.h>

#include "core/error.h"

const float mt_nf4_code[16] = MT_NF4_CODE_INIT;
const float mt_nf4_mid[15] = MT_NF4_MID_INIT;
const float mt_nf4_tree[15] = MT_NF4_TREE_INIT;

/* blocks below this stay on the calling thread (a thread team costs more than they do) */
#define NF4_PARALLEL_MIN_BLOCKS 1024

static inline uint32_t abs_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u & 0x7fffffffu;
}

/* One block: its absmax, and 0, or 1 when it holds a NaN or an infinity (abs bits >= inf's). */
static int quantize_block(const float *x, uint8_t *codes, float *absmax, mt_nf4_rule rule) {
    /* max |x| as the largest abs bit pattern: exact for finite values, and a NaN cannot hide */
    uint32_t m = 0;
    for (int i = 0; i < MT_NF4_BLOCK; i++) {
        uint32_t a = abs_bits(x[i]);
        m = a > m ? a : m;
    }
    if (m >= 0x7f800000u) return 1;
    float am;
    memcpy(&am, &m, 4);
    *absmax = am;
    /* bnb: the reciprocal (of the clamped absmax on the CPU), then one product a value, not a
     * division */
    float inv = 1.0f / (rule == MT_NF4_BNB_CUDA || am > MT_NF4_ABSMAX_FLOOR ? am
                                                                              : MT_NF4_ABSMAX_FLOOR);
    const float *thr = rule == MT_NF4_BNB_CUDA ? mt_nf4_tree : mt_nf4_mid;
    /* mt_nf4_code_of for the whole block, thresholds outside so that the inner loop vectorizes */
    float sc[MT_NF4_BLOCK];
    uint8_t q[MT_NF4_BLOCK];
    for (int i = 0; i < MT_NF4_BLOCK; i++) sc[i] = x[i] * inv, q[i] = 0;
    for (int t = 0; t < 15; t++) {
        float th = thr[t];
        for (int i = 0; i < MT_NF4_BLOCK; i++) q[i] += sc[i] > th;
    }
    for (int j = 0; j < MT_NF4_BLOCK / 2; j++) codes[j] = (uint8_t)(q[2 * j] << 4 | q[2 * j + 1]);
    return 0;
}

int mt_nf4_quantize_rule(const float *x, int64_t n, uint8_t *codes, float *absmax,
                         mt_nf4_rule rule) {
    MT_CHECK(n >= 0 && n % MT_NF4_BLOCK == 0, "nf4: %lld values, not a multiple of %d",
             (long long)n, MT_NF4_BLOCK);
    MT_CHECK(rule == MT_NF4_BNB_CPU || rule == MT_NF4_BNB_CUDA, "nf4: rule %d", (int)rule);
    int64_t nb = n / MT_NF4_BLOCK, bad = nb; /* the first block refused (min: any order agrees) */
#pragma omp parallel for schedule(static) reduction(min : bad) if (nb >= NF4_PARALLEL_MIN_BLOCKS)
    for (int64_t b = 0; b < nb; b++) {
        if (quantize_block(x + b * MT_NF4_BLOCK, codes + b * (MT_NF4_BLOCK / 2), absmax + b,
                           rule) &&
            b < bad)
            bad = b;
    }
    if (bad == nb) return MT_OK;
    int64_t i = bad * MT_NF4_BLOCK;
    while (abs_bits(x[i]) < 0x7f800000u) i++;
    return mt_error_set("nf4 quantization: element %lld is %s", (long long)i,
                        abs_bits(x[i]) > 0x7f800000u ? "NaN" : "infinite");
}

int mt_nf4_quantize(const float *x, int64_t n, uint8_t *codes, float *absmax) {
    return mt_nf4_quantize_rule(x, n, codes, absmax, MT_NF4_BNB_CPU);
}

void mt_nf4_dequantize(const uint8_t *codes, const float *absmax, int64_t n, float *out) {
    MT_CHECK(n >= 0 && n % MT_NF4_BLOCK == 0, "nf4: %lld values, not a multiple of %d",
             (long long)n, MT_NF4_BLOCK);
    int64_t nb = n / MT_NF4_BLOCK;
#pragma omp parallel for schedule(static) if (nb >= NF4_PARALLEL_MIN_BLOCKS)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *c = codes + b * (MT_NF4_BLOCK / 2);
        float *o = out + b * MT_NF4_BLOCK, s = absmax[b];
        for (int j = 0; j < MT_NF4_BLOCK / 2; j++) {
            o[2 * j] = mt_nf4_code[c[j] >> 4] * s;
            o[2 * j + 1] = mt_nf4_code[c[j] & 15] * s;
        }
    }
}

void mt_nf4_dequantize_bf16(const uint8_t *codes, const float *absmax, int64_t n, mt_bf16 *out) {
    MT_CHECK(n >= 0 && n % MT_NF4_BLOCK == 0, "nf4: %lld values, not a multiple of %d",
             (long long)n, MT_NF4_BLOCK);
    int64_t nb = n / MT_NF4_BLOCK;
#pragma omp parallel for schedule(static) if (nb >= NF4_PARALLEL_MIN_BLOCKS)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *c = codes + b * (MT_NF4_BLOCK / 2);
        mt_bf16 *o = out + b * MT_NF4_BLOCK;
        float s = absmax[b];
        for (int j = 0; j < MT_NF4_BLOCK / 2; j++) {
            o[2 * j] = mt_f32_to_bf16(mt_nf4_code[c[j] >> 4] * s);
            o[2 * j + 1] = mt_f32_to_bf16(mt_nf4_code[c[j] & 15] * s);
        }
    }
}
