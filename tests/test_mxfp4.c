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
 * shapes with a message and nothing written, and the same bytes for 1, 2 and 3 threads. */
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

static int setup(void **state) {
    return mt_test_fixture_st_open(state, &ref, "mxfp4/mxfp4_ref.safetensors", "test_mxfp4");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),    cmocka_unit_test(test_values),
        cmocka_unit_test(test_layout),   cmocka_unit_test(test_transformers),
        cmocka_unit_test(test_weight),   cmocka_unit_test(test_shape),
        cmocka_unit_test(test_refusals), cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, setup, mt_test_fixture_st_teardown);
}
