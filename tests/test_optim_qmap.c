/* 8-bit dynamic quantization maps (src/optim/qmap.h): the maps are the paper's definition, the
 * kernels' table quantization is exactly the nearest code, and blockwise quantize/dequantize
 * errors stay within half the code spacing times the block scale. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/qmap.h"
#include "util/testutil.h"

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- the maps are dynamic tree quantization ---- */

static void check_map(const mt_qmap *q, int is_signed) {
    assert_int_equal(q->is_signed, is_signed);
    for (int k = 1; k < 256; k++) assert_true(q->code[k] > q->code[k - 1]);
    assert_true(q->code[255] == 1.0f);
    if (is_signed) {
        assert_true(q->code[127] == 0.0f);
        for (int k = 0; k < 127; k++) assert_true(q->code[k] == -q->code[254 - k]);
    } else {
        assert_true(q->code[0] == 0.0f);
    }
    /* decade E (magnitudes in (10^-(E+1), 10^-E)) holds 2^F codes, F = 6 - E signed, 7 - E
     * unsigned, at the middles of 2^F equal parts of [0.1, 1] * 10^-E */
    for (int e = 0; e < 7; e++) {
        double hi = pow(10.0, -e), lo = hi / 10;
        int want = 1 << ((is_signed ? 6 : 7) - e), got = 0;
        for (int k = 0; k < 256; k++) {
            double c = q->code[k];
            if (c > lo && c < hi) {
                got++;
                double j = ((c / hi - 0.1) / 0.9) * want - 0.5; /* the part's index */
                assert_true(fabs(j - nearbyint(j)) < 1e-4);
            }
        }
        if (got != want) printf("decade 10^-%d: %d codes, want %d\n", e, got, want);
        assert_int_equal(got, want);
    }
    /* thresholds: the midpoints, thr[0] = -inf, thr[256] never passed */
    assert_true(isinf(q->thr[0]) && q->thr[0] < 0);
    assert_true(isnan(q->thr[256]));
    for (int k = 1; k < 256; k++)
        assert_true(q->thr[k] > q->code[k - 1] && q->thr[k] < q->code[k]);
}

static void test_maps_definition(void **state) {
    (void)state;
    check_map(mt_qmap_signed(), 1);
    check_map(mt_qmap_unsigned(), 0);
}

/* ---- the table path == nearest, for every bf16 cell's ends and random floats ---- */

static int nearest_ok(const mt_qmap *q, float x, int k) {
    /* no neighbour closer, but within the fp32 rounding of the midpoint (the thresholds are
     * fp32 midpoints of fp32 codes: exact ties like 2^-6 between two codes may go either way) */
    double e = fabs((double)q->code[k] - x), slack = 1e-7 * fabs((double)x);
    if (k > 0 && fabs((double)q->code[k - 1] - x) < e - slack) return 0;
    if (k < 255 && fabs((double)q->code[k + 1] - x) < e - slack) return 0;
    return 1;
}

static void test_table_is_nearest(void **state) {
    (void)state;
    mt_test_rng r;
    mt_test_rng_seed(&r, 5);
    const mt_qmap *maps[2] = {mt_qmap_signed(), mt_qmap_unsigned()};
    size_t checked = 0;
    for (int mi = 0; mi < 2; mi++) {
        const mt_qmap *q = maps[mi];
        for (uint32_t h = 0; h < 65536; h++) {
            /* the AVX2 kernel's table, by a value's top 16 bits */
            assert_int_equal(q->cell_by_top[h], q->cell[mt_qmap_cell_index(h << 16)]);
            const uint32_t lows[] = {0, 1, 0x7fff, 0x8000, 0xfffe, 0xffff,
                                     (uint32_t)mt_test_rng_u64(&r) & 0xffff};
            for (int j = 0; j < 7; j++) {
                float x = from_bits(h << 16 | lows[j]);
                if (isnan(x)) continue; /* a NaN gets some code (deterministic), not "nearest" */
                int a = mt_qmap_quantize(q, x), b = mt_qmap_nearest(q, x);
                if (a != b) printf("x %a (%08x): table %d, nearest %d\n", x, h << 16 | lows[j], a, b);
                assert_int_equal(a, b);
                checked++;
            }
        }
        /* around every threshold: the threshold itself and its float neighbours */
        for (int k = 1; k < 256; k++) {
            float t = q->thr[k];
            const float xs[] = {t, nextafterf(t, -INFINITY), nextafterf(t, INFINITY)};
            for (int j = 0; j < 3; j++) {
                assert_int_equal(mt_qmap_quantize(q, xs[j]), mt_qmap_nearest(q, xs[j]));
                assert_int_equal(mt_qmap_nearest(q, xs[j]), xs[j] >= t ? k : k - 1);
            }
        }
        /* the nearest code, in [-1, 1] (signed) or [0, 1] */
        for (int j = 0; j < 200000; j++) {
            float x = mt_test_rng_uniform(&r);
            if (j % 3 == 0) x = ldexpf(x, -(j % 25)); /* small magnitudes too */
            if (q->is_signed && j % 2) x = -x;
            int k = mt_qmap_quantize(q, x);
            if (!nearest_ok(q, x, k)) printf("x %.9g -> code %d (%.9g) is not the nearest\n", x, k, q->code[k]);
            assert_true(nearest_ok(q, x, k));
        }
    }
    /* specials: +-0 -> the zero code, +-1, beyond, inf and NaN stay in range */
    const mt_qmap *s = maps[0], *u = maps[1];
    assert_int_equal(mt_qmap_quantize(s, 0.0f), 127);
    assert_int_equal(mt_qmap_quantize(s, -0.0f), 127);
    assert_int_equal(mt_qmap_quantize(s, 1.0f), 255);
    assert_int_equal(mt_qmap_quantize(s, -1.0f), 0);
    assert_int_equal(mt_qmap_quantize(s, INFINITY), 255);
    assert_int_equal(mt_qmap_quantize(s, -INFINITY), 0);
    assert_int_equal(mt_qmap_quantize(u, 0.0f), 0);
    assert_int_equal(mt_qmap_quantize(u, 1.0f), 255);
    assert_int_equal(mt_qmap_quantize(u, INFINITY), 255);
    printf("%zu values: table quantization == nearest code\n", checked);
}

/* ---- blockwise error bounds ---- */

/* Half the gap of the two codes that bracket y (y in [code[0], code[255]]): the largest error
 * of the nearest code. */
static double half_gap(const mt_qmap *q, double y) {
    int k = 0;
    while (k < 254 && q->code[k + 1] < y) k++;
    return 0.5 * ((double)q->code[k + 1] - q->code[k]);
}

typedef struct {
    const char *name;
    double worst_frac; /* the largest error / bound seen */
} block_stats;

static void check_block(const mt_qmap *q, const float *x, size_t n, block_stats *st) {
    uint8_t codes[256];
    float back[256];
    float scale = mt_qmap_quantize_block(q, x, n, codes);
    double amax = 0;
    for (size_t i = 0; i < n; i++) amax = fmax(amax, fabs((double)x[i]));
    assert_true(scale == (float)amax); /* the scale is the block's absmax, exactly */
    mt_qmap_dequantize_block(q, codes, scale, n, back);
    for (size_t i = 0; i < n; i++) {
        /* stated bound: half the code spacing at x/scale, times the scale; plus the two fp32
         * roundings (x / scale and code * scale), 2^-23 of the scale */
        double y = scale ? (double)x[i] / scale : 0.0;
        double bound = scale * (half_gap(q, y) + 0x1p-23);
        double err = fabs((double)back[i] - x[i]);
        if (!(err <= bound))
            printf("%s: x[%zu] = %.9g -> %.9g, err %.3g > bound %.3g (scale %.3g)\n", st->name, i,
                   x[i], back[i], err, bound, scale);
        assert_true(err <= bound);
        if (bound > 0 && err / bound > st->worst_frac) st->worst_frac = err / bound;
    }
    /* the largest positive element is stored exactly (code 1.0) */
    for (size_t i = 0; i < n; i++)
        if ((double)x[i] == amax && amax > 0) assert_true(back[i] == x[i]);
}

static void test_block_error_bounds(void **state) {
    (void)state;
    mt_test_rng r;
    mt_test_rng_seed(&r, 11);
    const mt_qmap *maps[2] = {mt_qmap_signed(), mt_qmap_unsigned()};
    float x[256];
    for (int mi = 0; mi < 2; mi++) {
        const mt_qmap *q = maps[mi];
        block_stats st = {mi ? "unsigned" : "signed", 0};
        for (int b = 0; b < 4000; b++) {
            size_t n = b % 5 == 0 ? 1 + (size_t)(mt_test_rng_u64(&r) % 256) : 256;
            float scale = ldexpf(1.0f, (int)(mt_test_rng_u64(&r) % 120) - 80);
            for (size_t i = 0; i < n; i++) {
                float z = mt_test_rng_normal(&r);
                if (b % 4 == 1) z = z * z * z * z * z; /* heavy tails: most values tiny */
                if (b % 4 == 2) z = expf(-12.0f * mt_test_rng_uniform(&r)); /* log-uniform */
                x[i] = z * scale;
                if (!q->is_signed) x[i] = fabsf(x[i]);
            }
            if (b % 50 == 3) memset(x, 0, sizeof x); /* a zero block stays zero */
            if (b % 50 == 4) { memset(x, 0, sizeof x); x[n / 2] = q->is_signed ? -3.0f : 3.0f; }
            check_block(q, x, n, &st);
        }
        printf("%s map: every element within its bound; worst %.1f%% of the bound\n", st.name,
               100 * st.worst_frac);
        /* the bound is tight: some element uses most of it */
        assert_true(st.worst_frac > 0.9);
    }
    /* the worst spacing, stated: in the top decade [0.1, 1] half a spacing is 0.9 / 2^(F+1):
     * signed 0.9/128 (~0.7% of the scale), unsigned 0.9/256 */
    assert_true(half_gap(maps[0], 0.5) <= 0.9 / 128 + 1e-7);
    assert_true(half_gap(maps[1], 0.5) <= 0.9 / 256 + 1e-7);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_maps_definition),
        cmocka_unit_test(test_table_is_nearest),
        cmocka_unit_test(test_block_error_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
