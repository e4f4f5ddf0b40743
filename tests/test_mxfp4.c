/* MXFP4 dequantization (src/quant/mxfp4): gpt-oss expert tensors as transformers dequantizes them.
 *
 * Bit for bit against tests/fixtures/mxfp4/mxfp4_ref.safetensors (make_mxfp4_fixture.py:
 * transformers 5.25's convert_moe_packed_tensors on the CPU, fp32 and its default bf16, the function
 * its from_pretrained(Mxfp4Config(dequantize=True)) path uses; the script checks that path too):
 * every scale byte 0..255 with every code in both nibbles, random bytes and scales (extremes
 * included), and a gpt-oss layer's gate_up_proj / down_proj quantized from random weights; in the
 * row-major (checkpoint, [out, in]) layout, transposed ([E, in, out], transformers' parameters) and
 * in bf16. Independently of the fixture: the e2m1 table from the E2M1 bit layout, every (code,
 * scale) value against the C library's ldexpf (exact; +-inf past FLT_MAX, never NaN), the nibble
 * order and layout on hand-made bytes, the dequantized down_proj within the quantizer's error of the
 * weight it came from (the orientation), the checkpoint-shape parser, refusals of bad sizes and
 * shapes with a message and nothing written, and the same bytes for 1, 2 and 3 threads.
 * Quantization (megatrain's own, for --base-dtype mxfp4 from fp32 values): every scale and code
 * against a straightforward reference (the scale exponent by search, the nearest finite grid point
 * by scanning, ties to the even code) on random blocks of magnitudes 2^-140 .. 2^100, the grid
 * itself, every midpoint, negative values and -0, all-zero blocks, amax at a power of two and just
 * past 6, FLT_MAX and subnormals; refusals of NaN / inf; values from MXFP4 requantize to the same
 * values, with the same bytes for 1, 2 and 3 threads. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "quant/mxfp4.h"
#include "util/fixture_io.h"
#include "util/testutil.h"

static mt_safetensors *ref;

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* a fixture tensor of dtype dt, copied out (the mapping may be unaligned); shape into t_out */
static void *fx_copy(const char *name, mt_dtype dt, const mt_st_tensor **t_out) {
    const mt_st_tensor *t = mt_safetensors_find(ref, name);
    if (!t) fail_msg("fixture tensor %s missing (regenerate: make_mxfp4_fixture.py)", name);
    assert_int_equal(t->dtype, dt);
    void *p = malloc(t->nbytes ? t->nbytes : 1);
    memcpy(p, t->data, t->nbytes);
    if (t_out) *t_out = t;
    return p;
}

/* The table is E2M1 as the spec defines it: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0,
 * exponent 0 subnormal (0.5 m); and transformers' FP4_VALUES (from the fixture), -0 included. */
static void test_table(void **state) {
    (void)state;
    for (int c = 0; c < 16; c++) {
        int s = c >> 3, e = (c >> 1) & 3, m = c & 1;
        double v = e == 0 ? 0.5 * m : ldexp(1.0 + 0.5 * m, e - 1);
        float want = (float)(s ? -v : v);
        assert_true(bits(mt_mxfp4_e2m1[c]) == bits(want));
    }
    float *tf = fx_copy("e2m1", MT_F32, NULL);
    assert_true(mt_test_same_elems("e2m1 (transformers FP4_VALUES)", mt_mxfp4_e2m1, tf, 16, 4));
    free(tf);
    assert_int_equal(MT_MXFP4_BLOCK, 32);
    assert_int_equal(mt_mxfp4_bytes(3, 64), 96);
    assert_int_equal(mt_mxfp4_scales(3, 64), 6);
}

/* Every (code, scale): the exact product e2m1 * 2^(s - 127) (ldexpf rounds only on overflow, to
 * inf), so s = 255 is 2^128, not the spec's NaN; subnormal results at s = 0, 1. */
static void test_values(void **state) {
    (void)state;
    int n_inf = 0, n_sub = 0;
    for (int s = 0; s < 256; s++) {
        for (int c = 0; c < 16; c++) {
            float got = mt_mxfp4_value((uint8_t)c, (uint8_t)s);
            float want = ldexpf(mt_mxfp4_e2m1[c], s - 127);
            if (bits(got) != bits(want))
                fail_msg("code %d scale %d: got %a, want %a", c, s, (double)got, (double)want);
            assert_false(isnan(got));
            double exact = ldexp((double)mt_mxfp4_e2m1[c], s - 127);
            if (fabs(exact) > FLT_MAX) {
                assert_true(isinf(got));
                n_inf++;
            } else {
                assert_true((double)got == exact);
            }
            if (got != 0 && fabsf(got) < FLT_MIN) n_sub++;
        }
    }
    /* inf where |P| 2^(s-127) >= 2^128: s = 253 with |P| >= 4 (2 magnitudes), 254 with |P| >= 2 (4),
     * 255 with |P| >= 1 (6); both signs */
    assert_int_equal(n_inf, 2 * (2 + 4 + 6));
    assert_true(n_sub > 0);
    assert_true(bits(mt_mxfp4_value(1, 255)) == bits(0x1p127f));   /* 0.5 * 2^128 */
    assert_true(bits(mt_mxfp4_value(8, 255)) == 0x80000000u);      /* -0 stays -0 */
    assert_true(bits(mt_mxfp4_value(1, 0)) == 0x00200000u);        /* 2^-128 */
    assert_true(bits(mt_mxfp4_value(15, 127)) == bits(-6.0f));
}

/* Hand-made bytes: the low nibble is the even element; row-major and transposed layouts. */
static void test_layout(void **state) {
    (void)state;
    /* 2 matrices of 2 rows x 64 columns: 8 blocks */
    enum { M = 2, R = 2, C = 64, G = C / 32 };
    uint8_t blocks[M * R * G * 16], scales[M * R * G];
    for (int b = 0; b < M * R * G; b++) {
        scales[b] = (uint8_t)(120 + b);
        for (int j = 0; j < 16; j++) blocks[b * 16 + j] = (uint8_t)((j & 15) | ((15 - j) << 4));
    }
    float rm[M * R * C], tr[M * C * R];
    assert_int_equal(mt_mxfp4_dequantize(blocks, scales, M * R, C, rm), MT_OK);
    assert_int_equal(mt_mxfp4_dequantize_transposed(blocks, scales, M, R, C, tr), MT_OK);
    for (int m = 0; m < M; m++)
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) {
                int b = (m * R + r) * G + c / 32, j = (c % 32) / 2;
                int code = c % 2 == 0 ? (j & 15) : 15 - j;
                float want = ldexpf(mt_mxfp4_e2m1[code], scales[b] - 127);
                assert_true(bits(rm[(m * R + r) * C + c]) == bits(want));
                assert_true(bits(tr[(m * C + c) * R + r]) == bits(want));
            }
    /* element 0 of the first block is code 0 (low nibble of 0xf0), element 1 code 15 */
    assert_true(rm[0] == 0.0f && rm[1] == ldexpf(-6.0f, 120 - 127));
}

/* transformers' convert_moe_packed_tensors, bit for bit: X.deq is [E, C, R] (transposed),
 * X.deq_bf16 the same in bf16; the row-major results are compared through the transpose. */
static void check_case(const char *name) {
    char key[96];
    const mt_st_tensor *tb, *ts, *td;
    snprintf(key, sizeof key, "%s.blocks", name);
    uint8_t *blocks = fx_copy(key, MT_U8, &tb);
    snprintf(key, sizeof key, "%s.scales", name);
    uint8_t *scales = fx_copy(key, MT_U8, &ts);
    snprintf(key, sizeof key, "%s.deq", name);
    float *deq = fx_copy(key, MT_F32, &td);
    snprintf(key, sizeof key, "%s.deq_bf16", name);
    mt_bf16 *deq16 = fx_copy(key, MT_BF16, NULL);
    int64_t M, R, C;
    assert_int_equal(mt_mxfp4_shape(tb->shape, tb->ndim, ts->shape, ts->ndim, &M, &R, &C), MT_OK);
    assert_int_equal(td->ndim, 3);
    assert_true(td->shape[0] == M && td->shape[1] == C && td->shape[2] == R);
    assert_true((size_t)tb->numel == mt_mxfp4_bytes(M * R, C));
    assert_true((size_t)ts->numel == mt_mxfp4_scales(M * R, C));
    size_t n = (size_t)(M * R * C);
    float *tr = malloc(n * 4), *rm = malloc(n * 4), *want = malloc(n * 4);
    mt_bf16 *rm16 = malloc(n * 2), *want16 = malloc(n * 2);
    assert_int_equal(mt_mxfp4_dequantize_transposed(blocks, scales, M, R, C, tr), MT_OK);
    assert_int_equal(mt_mxfp4_dequantize(blocks, scales, M * R, C, rm), MT_OK);
    assert_int_equal(mt_mxfp4_dequantize_bf16(blocks, scales, M * R, C, rm16), MT_OK);
    for (int64_t m = 0; m < M; m++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) {
                want[(m * R + r) * C + c] = deq[(m * C + c) * R + r];
                want16[(m * R + r) * C + c] = deq16[(m * C + c) * R + r];
            }
    char what[128];
    snprintf(what, sizeof what, "%s transposed", name);
    assert_true(mt_test_same_elems(what, tr, deq, n, 4));
    snprintf(what, sizeof what, "%s row-major", name);
    assert_true(mt_test_same_elems(what, rm, want, n, 4));
    snprintf(what, sizeof what, "%s bf16", name);
    assert_true(mt_test_same_elems(what, rm16, want16, n, 2));
    free(blocks), free(scales), free(deq), free(deq16), free(tr), free(rm), free(want), free(rm16),
        free(want16);
}

static void test_transformers(void **state) {
    (void)state;
    const char *cases[] = {"mx.all", "mx.random", "mx.gate_up_proj", "mx.down_proj"};
    for (int k = 0; k < 4; k++) check_case(cases[k]);
}

/* mx.down_proj came from the weight mx.down_proj.w [E, out, in] by the spec's rule: the row-major
 * result is within 2 X of it everywhere (half the widest e2m1 gap, or the saturation at 6 X), which
 * a wrong orientation or nibble order would break; and it is the closest to w of all 16 codes in
 * most places. */
static void test_weight(void **state) {
    (void)state;
    const mt_st_tensor *tb, *ts, *tw;
    uint8_t *blocks = fx_copy("mx.down_proj.blocks", MT_U8, &tb);
    uint8_t *scales = fx_copy("mx.down_proj.scales", MT_U8, &ts);
    float *w = fx_copy("mx.down_proj.w", MT_F32, &tw);
    int64_t M, R, C;
    assert_int_equal(mt_mxfp4_shape(tb->shape, tb->ndim, ts->shape, ts->ndim, &M, &R, &C), MT_OK);
    size_t n = (size_t)(M * R * C);
    assert_int_equal((size_t)tw->numel, n);
    float *d = malloc(n * 4);
    assert_int_equal(mt_mxfp4_dequantize(blocks, scales, M * R, C, d), MT_OK);
    double worst = 0, amax = 0;
    for (size_t i = 0; i < n; i++) {
        float X = ldexpf(1.0f, scales[i / 32] - 127);
        assert_true(fabsf(d[i] - w[i]) <= 2 * X);
        worst = fmax(worst, fabs(d[i] - w[i])), amax = fmax(amax, fabs(w[i]));
    }
    fprintf(stderr, "mx.down_proj vs its weight: max|deq - w| / max|w| = %.3f\n", worst / amax);
    free(blocks), free(scales), free(w), free(d);
}

static void test_shape(void **state) {
    (void)state;
    int64_t M = -1, R = -1, C = -1;
    /* gpt-oss-20b gate_up_proj: [32, 5760, 90, 16] / [32, 5760, 90] */
    const int64_t b4[4] = {32, 5760, 90, 16}, s3[3] = {32, 5760, 90};
    assert_int_equal(mt_mxfp4_shape(b4, 4, s3, 3, &M, &R, &C), MT_OK);
    assert_true(M == 32 && R == 5760 && C == 2880);
    const int64_t b3[3] = {7, 2, 16}, s2[2] = {7, 2};
    assert_int_equal(mt_mxfp4_shape(b3, 3, s2, 2, &M, &R, &C), MT_OK); /* one matrix */
    assert_true(M == 1 && R == 7 && C == 64);
    const int64_t b5[5] = {2, 3, 4, 1, 16}, s4[4] = {2, 3, 4, 1};
    assert_int_equal(mt_mxfp4_shape(b5, 5, s4, 4, &M, &R, &C), MT_OK);
    assert_true(M == 6 && R == 4 && C == 32);
    const int64_t bz[4] = {0, 4, 1, 16}, sz[3] = {0, 4, 1};
    assert_int_equal(mt_mxfp4_shape(bz, 4, sz, 3, &M, &R, &C), MT_OK);
    assert_true(M == 0 && R == 4 && C == 32);

    struct {
        int64_t b[5];
        int nb;
        int64_t s[4];
        int ns;
        const char *needle;
    } bad[] = {
        {{4, 2, 15}, 3, {4, 2}, 2, "last dimension is 15"},
        {{4, 2, 32}, 3, {4, 2}, 2, "last dimension is 32"},
        {{2, 16}, 2, {2}, 1, "2 dimensions"},
        {{3, 4, 2, 16}, 4, {3, 4, 2, 1}, 4, "scales have 4 dimensions"},
        {{3, 4, 2, 16}, 4, {3, 4}, 2, "scales have 2 dimensions"},
        {{3, 4, 2, 16}, 4, {3, 5, 2}, 3, "scales dimension 1 is 5"},
        {{3, 4, 2, 16}, 4, {3, 4, 3}, 3, "scales dimension 2 is 3"},
        {{3, -4, 2, 16}, 4, {3, -4, 2}, 3, "negative"},
        {{INT64_MAX / 2, 4, 2, 16}, 4, {INT64_MAX / 2, 4, 2}, 3, "overflow"},
        {{4, INT64_MAX / 4, 16}, 3, {4, INT64_MAX / 4}, 2, "overflow"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        M = R = C = -7;
        mt_error_clear();
        assert_int_equal(mt_mxfp4_shape(bad[k].b, bad[k].nb, bad[k].s, bad[k].ns, &M, &R, &C),
                         MT_ERR);
        const char *msg = mt_error_message();
        fprintf(stderr, "refused: %s\n", msg);
        if (!strstr(msg, bad[k].needle)) fail_msg("case %zu: '%s' lacks '%s'", k, msg, bad[k].needle);
        assert_true(M == -7 && R == -7 && C == -7);
    }
}

/* Bad sizes: MT_ERR with a message, nothing written; empty sizes are fine. */
static void test_refusals(void **state) {
    (void)state;
    uint8_t blocks[64] = {0x21}, scales[4] = {127, 127, 127, 127};
    float out[128];
    mt_bf16 out16[128];
    struct {
        int64_t mats, rows, cols;
        const char *needle;
    } bad[] = {
        {1, 2, 48, "not a multiple of the 32-element block"},
        {1, 1, 31, "31 columns"},
        {1, 1, -32, "negative"},
        {1, -1, 32, "negative"},
        {-1, 1, 32, "negative"},
        {1, INT64_MAX / 32, 64, "overflow"},
        {3, INT64_MAX / 64, 32, "overflow"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        for (int f = 0; f < 3; f++) {
            if (f < 2 && bad[k].mats != 1) continue; /* mats exists only for the transposed form */
            for (int i = 0; i < 128; i++) out[i] = 42.0f, out16[i] = 0x4242;
            mt_error_clear();
            int rc = f == 0   ? mt_mxfp4_dequantize(blocks, scales, bad[k].rows, bad[k].cols, out)
                     : f == 1 ? mt_mxfp4_dequantize_bf16(blocks, scales, bad[k].rows, bad[k].cols,
                                                         out16)
                              : mt_mxfp4_dequantize_transposed(blocks, scales, bad[k].mats,
                                                               bad[k].rows, bad[k].cols, out);
            assert_int_equal(rc, MT_ERR);
            const char *msg = mt_error_message();
            if (!strstr(msg, bad[k].needle))
                fail_msg("case %zu form %d: '%s' lacks '%s'", k, f, msg, bad[k].needle);
            if (f == 0) fprintf(stderr, "refused: %s\n", msg);
            for (int i = 0; i < 128; i++) assert_true(out[i] == 42.0f && out16[i] == 0x4242);
        }
    }
    /* empty: nothing to do, nothing read or written */
    assert_int_equal(mt_mxfp4_dequantize(NULL, NULL, 0, 64, NULL), MT_OK);
    assert_int_equal(mt_mxfp4_dequantize(NULL, NULL, 5, 0, NULL), MT_OK);
    assert_int_equal(mt_mxfp4_dequantize_bf16(NULL, NULL, 0, 32, NULL), MT_OK);
    assert_int_equal(mt_mxfp4_dequantize_transposed(NULL, NULL, 0, 4, 32, NULL), MT_OK);
    assert_int_equal(mt_mxfp4_dequantize_transposed(NULL, NULL, 2, 0, 32, NULL), MT_OK);
    /* a valid call after the refusals */
    assert_int_equal(mt_mxfp4_dequantize(blocks, scales, 2, 64, out), MT_OK);
    assert_true(out[0] == 0.5f && out[1] == 1.0f && out[2] == 0.0f);
}

/* Large enough to run threaded: the same bytes for 1, 2 and 3 threads, in every form. */
static void test_threads(void **state) {
    (void)state;
    const int64_t M = 3, R = 96, C = 32 * 40; /* 11520 blocks */
    size_t n = (size_t)(M * R * C);
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 4404);
    uint8_t *blocks = malloc(n / 2), *scales = malloc(n / 32);
    for (size_t i = 0; i < n / 2; i++) blocks[i] = (uint8_t)mt_test_rng_u64(&rng);
    for (size_t i = 0; i < n / 32; i++) scales[i] = (uint8_t)mt_test_rng_u64(&rng);
    float *rm[3], *tr[3];
    mt_bf16 *h[3];
    int saved = omp_get_max_threads();
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        rm[t] = malloc(n * 4), tr[t] = malloc(n * 4), h[t] = malloc(n * 2);
        assert_int_equal(mt_mxfp4_dequantize(blocks, scales, M * R, C, rm[t]), MT_OK);
        assert_int_equal(mt_mxfp4_dequantize_transposed(blocks, scales, M, R, C, tr[t]), MT_OK);
        assert_int_equal(mt_mxfp4_dequantize_bf16(blocks, scales, M * R, C, h[t]), MT_OK);
    }
    omp_set_num_threads(saved);
    for (int t = 1; t < 3; t++) {
        assert_memory_equal(rm[0], rm[t], n * 4);
        assert_memory_equal(tr[0], tr[t], n * 4);
        assert_memory_equal(h[0], h[t], n * 2);
    }
    /* the three forms agree: transposed is the transpose, bf16 the top half */
    for (int64_t m = 0; m < M; m++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) {
                float v = rm[0][(m * R + r) * C + c];
                assert_true(bits(v) == bits(tr[0][(m * C + c) * R + r]));
                assert_true(h[0][(m * R + r) * C + c] == (mt_bf16)(bits(v) >> 16));
            }
    for (int t = 0; t < 3; t++) free(rm[t]), free(tr[t]), free(h[t]);
    free(blocks), free(scales);
}

/* ---- quantization (mxfp4.h): against a straightforward reference ---- */

static const double grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

/* The scale exponent by search: the smallest e >= -127 with amax <= 6 * 2^e (in double). */
static int ref_exponent(const float *x, int64_t stride) {
    double amax = 0;
    for (int j = 0; j < 32; j++) amax = fmax(amax, fabs((double)x[j * stride]));
    int e = -127;
    while (amax > 6.0 * ldexp(1.0, e)) e++;
    return e;
}

/* x's code at scale 2^e: the grid point g * 2^e nearest |x| among the finite ones, a tie to the
 * even code; x's sign bit on top. */
static uint8_t ref_code(float x, int e) {
    double v = fabs((double)x), best = INFINITY;
    int c = 0;
    for (int k = 0; k < 8; k++) {
        double g = ldexp(grid[k], e);
        if (g > FLT_MAX) continue;
        double d = fabs(v - g);
        if (d < best || (d == best && k % 2 == 0)) best = d, c = k;
    }
    return (uint8_t)(c | (signbit(x) ? 8 : 0));
}

/* in [M, C, R] (the table's [E, in, out]) quantized by mt_mxfp4_quantize_transposed: every scale
 * and code byte the reference's, the round trip each x's nearest grid value; returns the blocks */
static void check_quantize(const float *in, int64_t M, int64_t R, int64_t C, const char *what) {
    int64_t G = C / 32, nb = M * R * G;
    uint8_t *blocks = malloc((size_t)nb * 16), *scales = malloc((size_t)nb);
    float *back = malloc((size_t)(M * R * C) * sizeof(float));
    assert_int_equal(mt_mxfp4_quantize_transposed(in, M, R, C, blocks, scales), MT_OK);
    assert_int_equal(mt_mxfp4_dequantize_transposed(blocks, scales, M, R, C, back), MT_OK);
    int64_t bad = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t g = 0; g < G; g++) {
                int64_t b = (m * R + r) * G + g;
                const float *x = in + (m * C + 32 * g) * R + r; /* x[j * R]: element (r, 32 g + j) */
                int e = ref_exponent(x, R);
                if (scales[b] != (uint8_t)(e + 127) && bad++ < 5)
                    fprintf(stderr, "%s: block (%lld, %lld, %lld): scale %d, reference %d\n", what, (long long)m,
                            (long long)r, (long long)g, scales[b], e + 127);
                for (int j = 0; j < 32; j++) {
                    float xj = x[j * R];
                    uint8_t got = (uint8_t)(blocks[b * 16 + j / 2] >> (j % 2 ? 4 : 0) & 15u), want = ref_code(xj, e);
                    /* the round trip: the reference's grid point, in the table's layout */
                    float rt = back[(m * C + 32 * g + j) * R + r];
                    float wv = (float)ldexp(grid[want & 7], e) * (want & 8 ? -1.0f : 1.0f);
                    if ((got != want || bits(rt) != bits(wv)) && bad++ < 5)
                        fprintf(stderr, "%s: element (%lld, %lld, %lld): x %a -> code %d (%a), reference %d (%a)\n",
                                what, (long long)m, (long long)r, (long long)(32 * g + j), (double)xj, got,
                                (double)rt, want, (double)wv);
                }
            }
    if (bad) fail_msg("%s: %lld mismatches against the reference quantizer", what, (long long)bad);
    printf("  quantize %s: %lld blocks, scales and codes the reference's\n", what, (long long)nb);
    free(blocks), free(scales), free(back);
}

/* Random weights, each block drawn at its own magnitude (2^-140 .. 2^100, subnormal blocks and
 * ones clamped at s = 0 included), in the table's transposed layout; then values on every grid
 * point and every midpoint (the ties), negative ones, zeros of both signs. */
static void test_quantize(void **state) {
    (void)state;
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 2807);
    const int64_t M = 3, R = 40, C = 96, n = M * R * C;
    float *x = malloc((size_t)n * sizeof(float));
    for (int64_t m = 0; m < M; m++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t g = 0; g < C / 32; g++) {
                int k = (int)(mt_test_rng_u64(&rng) % 241) - 140;
                for (int j = 0; j < 32; j++)
                    x[(m * C + 32 * g + j) * R + r] = ldexpf(mt_test_rng_normal(&rng), k);
            }
    check_quantize(x, M, R, C, "random");
    /* large enough for the threaded loop (>= 2048 blocks), R not a multiple of 16 */
    const int64_t M2 = 2, R2 = 170, C2 = 256, n2 = M2 * R2 * C2;
    float *x2 = malloc((size_t)n2 * sizeof(float));
    for (int64_t i = 0; i < n2; i++) x2[i] = ldexpf(mt_test_rng_normal(&rng), (int)(i % 7) - 3);
    check_quantize(x2, M2, R2, C2, "random, threaded");
    free(x2);
    /* one matrix (R = 1: the layouts agree), block by block: hand-made cases */
    static const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    static const uint8_t tie_code[] = {0, 2, 2, 4, 4, 6, 6}; /* 0, 1, 1, 2, 2, 4, 4: the even codes */
    float b[32 * 8];
    uint8_t blocks[16 * 8], scales[8];
    memset(b, 0, sizeof b);
    for (int j = 0; j < 8; j++) b[j] = (float)grid[j], b[8 + j] = -(float)grid[j]; /* block 0: the grid, amax 6 */
    for (int j = 0; j < 7; j++) b[32 + j] = ties[j], b[32 + 8 + j] = -ties[j];     /* block 1: ties, amax 6 */
    b[32 + 31] = 6.0f;
    /* block 2: all zero; block 3: -0.0 everywhere */
    for (int j = 0; j < 32; j++) b[96 + j] = -0.0f;
    b[128] = 4.0f, b[129] = 1.0f;          /* block 4: amax 4, a power of two: X = 1, code 6 */
    b[160] = 8.0f, b[161] = -0.5f;         /* block 5: amax 8: X = 2, -0.5 / 2 = -0.25 -> -0 */
    b[192] = 0.125f, b[193] = 0.0078125f;  /* block 6: amax 2^-3: X = 2^-5 (6 / 32 >= 1 / 8) */
    b[224] = 6.0001f, b[225] = 0.5f;       /* block 7: just past 6: X = 2 */
    check_quantize(b, 1, 1, 32 * 8, "hand-made");
    assert_int_equal(mt_mxfp4_quantize_transposed(b, 1, 1, 32 * 8, blocks, scales), MT_OK);
    static const uint8_t want_scale[8] = {127, 127, 0, 0, 127, 128, 122, 128};
    assert_memory_equal(scales, want_scale, 8);
    for (int j = 0; j < 8; j++) { /* the grid maps to itself, code j; negative: j | 8 */
        assert_int_equal(blocks[j / 2] >> (j % 2 ? 4 : 0) & 15, j);
        assert_int_equal(blocks[4 + j / 2] >> (j % 2 ? 4 : 0) & 15, j | 8);
    }
    for (int j = 0; j < 7; j++) {
        assert_int_equal(blocks[16 + j / 2] >> (j % 2 ? 4 : 0) & 15, tie_code[j]);
        assert_int_equal(blocks[16 + (8 + j) / 2] >> ((8 + j) % 2 ? 4 : 0) & 15, tie_code[j] | 8);
    }
    for (int j = 0; j < 16; j++) assert_int_equal(blocks[32 + j], 0x00);  /* zeros: +0 */
    for (int j = 0; j < 16; j++) assert_int_equal(blocks[48 + j], 0x88);  /* -0.0: -0, sign kept */
    assert_int_equal(blocks[64], 6 | 2 << 4);   /* 4 -> code 6, 1 -> code 2 */
    assert_int_equal(blocks[80], 6 | 8 << 4);   /* 8 / 2 = 4 -> 6; -0.25 -> -0 (tie to even) */
    assert_int_equal(blocks[96], 6 | 0 << 4);   /* 2^-3 / 2^-5 = 4; 2^-7 / 2^-5 = 0.25 -> 0 */
    assert_int_equal(blocks[112], 5);           /* 6.0001 / 2 = 3.00005 -> 3, code 5; 0.25 -> 0 */
    /* the range's ends: FLT_MAX (4 * 2^126 = 2^128 overflows: 3 * 2^126 instead), tiny values */
    float e[64] = {FLT_MAX, -FLT_MAX, 3.5f * 0x1p126f, 3.25f * 0x1p126f, 1.0f};
    e[32] = 0x1p-149f, e[33] = -0x1p-140f, e[34] = 6 * 0x1p-127f, e[35] = 0x1p-128f;
    check_quantize(e, 1, 1, 64, "extremes");
    assert_int_equal(mt_mxfp4_quantize_transposed(e, 1, 1, 64, blocks, scales), MT_OK);
    assert_int_equal(scales[0], 253);
    assert_int_equal(blocks[0], 5 | 13 << 4); /* +-3 * 2^126 */
    assert_int_equal(scales[1], 0);
    assert_int_equal(blocks[16 + 1], 7 | 1 << 4); /* 6 * 2^-127: 6; 2^-128 = 0.5 * 2^-127: 0.5 */
    float back[64];
    assert_int_equal(mt_mxfp4_dequantize_transposed(blocks, scales, 1, 1, 64, back), MT_OK);
    assert_true(back[0] == 3 * 0x1p126f && isfinite(back[1]) && back[34] == 6 * 0x1p-127f && back[35] == 0x1p-128f);
    /* non-finite values are refused, naming the element */
    e[5] = NAN;
    assert_int_equal(mt_mxfp4_quantize_transposed(e, 1, 1, 64, blocks, scales), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "element 5 is nan"));
    e[5] = 0, e[40] = -INFINITY;
    assert_int_equal(mt_mxfp4_quantize_transposed(e, 1, 1, 64, blocks, scales), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "element 40 is -inf"));
    assert_int_equal(mt_mxfp4_quantize_transposed(e, 1, 1, 48, blocks, scales), MT_ERR); /* 48 % 32 */
    free(x);
}

/* Values that came from MXFP4 quantize back to the same values (mxfp4.h): random codes and scales
 * (finite products), dequantized, quantized, dequantized again; and threaded, the same bytes. */
static void test_requantize(void **state) {
    (void)state;
    const int64_t M = 4, R = 72, C = 32 * 30; /* 8640 blocks: threaded */
    size_t n = (size_t)(M * R * C);
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 2808);
    uint8_t *blocks = malloc(n / 2), *scales = malloc(n / 32), *b2 = malloc(n / 2), *s2 = malloc(n / 32);
    for (size_t i = 0; i < n / 2; i++) blocks[i] = (uint8_t)mt_test_rng_u64(&rng);
    for (size_t i = 0; i < n / 32; i++) scales[i] = (uint8_t)(mt_test_rng_u64(&rng) % 253); /* <= 2^125 */
    float *x = malloc(n * 4), *y = malloc(n * 4);
    assert_int_equal(mt_mxfp4_dequantize_transposed(blocks, scales, M, R, C, x), MT_OK);
    int saved = omp_get_max_threads();
    for (int t = 1; t <= 3; t++) {
        omp_set_num_threads(t);
        uint8_t *b3 = malloc(n / 2), *s3 = malloc(n / 32);
        assert_int_equal(mt_mxfp4_quantize_transposed(x, M, R, C, b3, s3), MT_OK);
        if (t == 1) memcpy(b2, b3, n / 2), memcpy(s2, s3, n / 32);
        assert_memory_equal(b2, b3, n / 2);
        assert_memory_equal(s2, s3, n / 32);
        free(b3), free(s3);
    }
    omp_set_num_threads(saved);
    assert_int_equal(mt_mxfp4_dequantize_transposed(b2, s2, M, R, C, y), MT_OK);
    assert_memory_equal(x, y, n * 4);
    size_t other = 0; /* the bytes may differ (a smaller scale where the block's top codes are small) */
    for (size_t i = 0; i < n / 32; i++) other += s2[i] != scales[i];
    printf("  requantized %zu blocks: the same values (%zu with a smaller scale than the source's)\n", n / 32,
           other);
    free(blocks), free(scales), free(b2), free(s2), free(x), free(y);
}

static int setup(void **state) {
    return mt_test_fixture_st_open(state, &ref, "mxfp4/mxfp4_ref.safetensors", "test_mxfp4");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),    cmocka_unit_test(test_values),
        cmocka_unit_test(test_layout),   cmocka_unit_test(test_transformers),
        cmocka_unit_test(test_weight),   cmocka_unit_test(test_shape),
        cmocka_unit_test(test_refusals), cmocka_unit_test(test_threads),
        cmocka_unit_test(test_quantize), cmocka_unit_test(test_requantize),
    };
    return cmocka_run_group_tests(tests, setup, mt_test_fixture_st_teardown);
}
