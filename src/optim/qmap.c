/* The two dynamic quantization maps, built once from their definition (qmap.h). */
#include "qmap.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "core/error.h"

static mt_qmap map_signed, map_unsigned;
static pthread_once_t maps_once = PTHREAD_ONCE_INIT;

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

uint8_t mt_qmap_nearest(const mt_qmap *q, float x) {
    int lo = 0; /* invariant: x >= thr[lo] (thr[0] = -inf; false only for NaN, which stays 0) */
    for (int step = 128; step >= 1; step /= 2)
        if (x >= q->thr[lo + step]) lo += step;
    return (uint8_t)lo;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void build(mt_qmap *q, int is_signed) {
    /* 10^-E as exact-as-possible doubles (no pow: the same bits on every libm) */
    static const double decade[7] = {1.0, 0.1, 0.01, 0.001, 1e-4, 1e-5, 1e-6};
    float c[256];
    int n = 0;
    for (int e = 0; e < 7; e++) {
        int items = 1 << ((is_signed ? 6 : 7) - e);
        for (int j = 0; j < items; j++) {
            double mid = 0.1 + 0.9 * (j + 0.5) / items;
            float val = (float)(decade[e] * mid);
            c[n++] = val;
            if (is_signed) c[n++] = -val;
        }
    }
    c[n++] = 0.0f;
    c[n++] = 1.0f;
    MT_CHECK(n == 256, "quantization map has %d codes", n);
    qsort(c, 256, sizeof(float), cmp_float);
    for (int k = 0; k < 256; k++) {
        if (k) MT_CHECK(c[k] > c[k - 1], "quantization map not strictly ascending at %d", k);
        q->code[k] = c[k];
    }
    q->thr[0] = -INFINITY;
    q->thr[256] = NAN; /* no code above 255: x >= thr[256] is false even for +inf */
    for (int k = 1; k < 256; k++) q->thr[k] = (float)(((double)c[k - 1] + c[k]) * 0.5);
    q->is_signed = is_signed;
    /* The cell table. A cell [t, t + ulp) of bits hh << 16 .. | 0xffff (mirrored below zero) must
     * hold at most one threshold: the nearest codes of its two ends differ by <= 1. */
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t a = MT_QMAP_CELL_LO; a <= MT_QMAP_CELL_HI; a++) {
            uint32_t hh = sign << 15 | a;
            float t = bits_f32(hh << 16), far = bits_f32(hh << 16 | 0xffffu);
            int k = mt_qmap_nearest(q, t), kf = mt_qmap_nearest(q, far);
            MT_CHECK(abs(k - kf) <= 1, "quantization map: bf16 cell %04x spans codes %d..%d", hh,
                     k, kf);
            int j = sign ? k : k + 1; /* the threshold next to k, away from zero */
            uint32_t low = MT_QMAP_NO_THR;
            if (j >= 1 && j <= 255) {
                uint32_t tb;
                memcpy(&tb, &q->thr[j], 4);
                if (tb >> 16 == hh) low = tb & 0xffffu;
            }
            MT_CHECK((low != MT_QMAP_NO_THR) == (k != kf), "quantization map: cell %04x", hh);
            q->cell[sign * MT_QMAP_CELLS + a - MT_QMAP_CELL_LO] = (uint32_t)k | low << 8;
        }
    for (uint32_t top = 0; top < 1u << 16; top++)
        q->cell_by_top[top] = q->cell[mt_qmap_cell_index(top << 16)];
    /* the clamped ends: no threshold below 2^-24 (down to 0) or above 1 (up to inf) */
    float lo_end = bits_f32(MT_QMAP_CELL_LO << 16 | 0xffffu);
    MT_CHECK(mt_qmap_nearest(q, 0.0f) == mt_qmap_nearest(q, lo_end) &&
                 mt_qmap_nearest(q, INFINITY) == mt_qmap_nearest(q, 1.0f) &&
                 mt_qmap_nearest(q, -INFINITY) == mt_qmap_nearest(q, -1.0f),
             "quantization map: a threshold outside [2^-24, 1]");
}

static void build_maps(void) {
    build(&map_signed, 1);
    build(&map_unsigned, 0);
}

const mt_qmap *mt_qmap_signed(void) {
    pthread_once(&maps_once, build_maps);
    return &map_signed;
}

const mt_qmap *mt_qmap_unsigned(void) {
    pthread_once(&maps_once, build_maps);
    return &map_unsigned;
}

float mt_qmap_quantize_block(const mt_qmap *q, const float *x, size_t n, uint8_t *codes) {
    uint32_t amax = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        u &= 0x7fffffffu;
        if (u > amax) amax = u;
    }
    float scale = bits_f32(amax), div = amax ? scale : 1.0f;
    for (size_t i = 0; i < n; i++) codes[i] = mt_qmap_quantize(q, x[i] / div);
    return scale;
}

void mt_qmap_dequantize_block(const mt_qmap *q, const uint8_t *codes, float scale, size_t n,
                              float *x) {
    for (size_t i = 0; i < n; i++) x[i] = q->code[codes[i]] * scale;
}
