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
    /* The table and its one-step correction: every bf16 cell [t, t + ulp) (mirrored below 0)
     * must hold at most one threshold, i.e. its two ends' nearest codes differ by <= 1. */
    for (uint32_t h = 0; h < 65536; h++) {
        float t = bits_f32(h << 16), far = bits_f32((h << 16) | 0xffffu);
        int a = mt_qmap_nearest(q, t), b = mt_qmap_nearest(q, far);
        q->lut[h] = (uint8_t)a;
        if (!isnan(t) && !isnan(far))
            MT_CHECK(abs(a - b) <= 1, "quantization map: bf16 cell %04x spans codes %d..%d", h, a, b);
    }
    memset(q->lut + 65536, 0, 4);
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
