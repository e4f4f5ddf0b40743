/* The frozen base's quantization formats (src/quant): NF4 as bitsandbytes and FP8 e4m3 as torch.
 *
 * Bit for bit against tests/fixtures/quant/quant_ref.safetensors (make_quant_fixture.py:
 * bitsandbytes' quantize_4bit / dequantize_4bit on the CPU, torch.float8_e4m3fn): codes, absmax,
 * scales and dequantized values (fp32, and bf16 rounded once). Independently of the fixture: the
 * tables and the tie rule, nearest-code and error bounds on random data (NF4: |x - deq| <= absmax *
 * half the widest gap between neighbouring codes; FP8: 2^-4 relative in e4m3's normal range, half
 * the subnormal step below it), re-quantizing a dequantized tensor gives it back, edge blocks
 * (zeros, signed zeros, one huge value, absmax / 448 underflowing), NaN and infinity refused with
 * the first bad element named, the same bytes for 1, 2 and 3 threads, and the CPU backend's
 * dequant ops equal to the functions. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "quant/fp8.h"
#include "quant/nf4.h"
#include "util/fixture_io.h"
#include "util/testutil.h"

static mt_safetensors *ref;

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* a fixture tensor of dtype dt; *n its element count */
static const void *fx(const char *name, mt_dtype dt, int64_t *n) {
    const mt_st_tensor *t = mt_safetensors_find(ref, name);
    if (!t) fail_msg("fixture tensor %s missing (regenerate: make_quant_fixture.py)", name);
    assert_int_equal(t->dtype, dt);
    *n = t->numel;
    return t->data;
}
/* a fixture tensor copied out (the mapping may be unaligned) */
static void *fx_copy(const char *name, mt_dtype dt, int64_t *n) {
    const void *d = fx(name, dt, n);
    size_t bytes = (size_t)*n * mt_dtype_size(dt);
    void *p = malloc(bytes ? bytes : 1);
    memcpy(p, d, bytes);
    return p;
}

/* ---------------- NF4 ---------------- */

static float nf4_half_gap(void) {
    float g = 0;
    for (int i = 0; i < 15; i++) g = fmaxf(g, (mt_nf4_code[i + 1] - mt_nf4_code[i]) / 2);
    return g;
}

/* The table is bnb's (its decimal literals), ascending; the CPU thresholds are the fp32 midpoints,
 * the CUDA ones the tree's float literals as a C compiler rounds them (as nvcc does: its PTX holds
 * the same bits), one ulp apart at thresholds 0, 8, 12, 14 alone; a value on a threshold takes the
 * lower code, one ulp above the upper. */
static void test_nf4_tables(void **state) {
    (void)state;
    static const double bnb[16] = {-1.0, -0.6961928009986877, -0.5250730514526367,
                                   -0.39491748809814453, -0.28444138169288635,
                                   -0.18477343022823334, -0.09105003625154495, 0.0,
                                   0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                                   0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                                   0.7229568362236023, 1.0};
    static const float tree[15] = {-0.8480964004993439f, -0.6106329262256622f,
                                   -0.4599952697753906f, -0.33967943489551544f,
                                   -0.23460740596055984f, -0.13791173323988914f,
                                   -0.045525018125772476f, 0.03979014977812767f,
                                   0.1202552504837513f, 0.2035212516784668f, 0.2920137718319893f,
                                   0.3893125355243683f, 0.5016634166240692f, 0.6427869200706482f,
                                   0.8614784181118011f};
    for (int i = 0; i < 16; i++) assert_true(bits(mt_nf4_code[i]) == bits((float)bnb[i]));
    for (int i = 0; i < 15; i++) {
        float m = mt_nf4_mid[i], t = mt_nf4_tree[i];
        assert_true(mt_nf4_code[i] < mt_nf4_code[i + 1]);
        assert_true(bits(m) == bits((mt_nf4_code[i] + mt_nf4_code[i + 1]) / 2));
        assert_true(bits(t) == bits(tree[i]));
        int off = i == 0 || i == 8 || i == 12 || i == 14;
        assert_true(off ? (t == nextafterf(m, -2.0f) || t == nextafterf(m, 2.0f)) : t == m);
        const float *thr[2] = {mt_nf4_mid, mt_nf4_tree};
        for (int r = 0; r < 2; r++) {
            float v = thr[r][i];
            assert_int_equal(mt_nf4_code_of(v, thr[r]), i);
            assert_int_equal(mt_nf4_code_of(nextafterf(v, 2.0f), thr[r]), i + 1);
            assert_int_equal(mt_nf4_code_of(nextafterf(v, -2.0f), thr[r]), i);
        }
    }
    /* the 4 values the two rules decide apart */
    static const float apart[4] = {-0x1.b239bp-1f, 0x1.ec90c6p-4f, 0x1.00da08p-1f, 0x1.b913b4p-1f};
    static const int cpu_code[4] = {0, 9, 12, 14}, cuda_code[4] = {1, 8, 13, 15};
    for (int k = 0; k < 4; k++) {
        assert_int_equal(mt_nf4_code_of(apart[k], mt_nf4_mid), cpu_code[k]);
        assert_int_equal(mt_nf4_code_of(apart[k], mt_nf4_tree), cuda_code[k]);
    }
    for (int k = 0; k < 16; k++) {
        assert_int_equal(mt_nf4_code_of(mt_nf4_code[k], mt_nf4_mid), k);
        assert_int_equal(mt_nf4_code_of(mt_nf4_code[k], mt_nf4_tree), k);
    }
    assert_int_equal(mt_nf4_code_of(-0.0f, mt_nf4_mid), 7);
    assert_int_equal(mt_nf4_code_of(1.0000001f, mt_nf4_mid), 15);
    assert_int_equal(mt_nf4_code_of(-5.0f, mt_nf4_mid), 0);
    assert_int_equal(mt_nf4_code_of(NAN, mt_nf4_tree), 0); /* the CUDA rule's all-zero block */
    assert_int_equal(mt_nf4_bytes(128), 64);
    assert_int_equal(mt_nf4_blocks(128), 2);
}

/* x drawn from a few distributions; every block's codes are the nearest to x / absmax, the error
 * stays in the bound, bf16 is the fp32 result rounded once, and quantizing the dequantized tensor
 * gives the same codes and absmax back. */
static void nf4_roundtrip(int64_t n, int dist, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    float *x = malloc(n * sizeof(float)), *deq = malloc(n * sizeof(float));
    uint8_t *c = malloc(n / 2), *c2 = malloc(n / 2);
    float *am = malloc(n / 64 * sizeof(float)), *am2 = malloc(n / 64 * sizeof(float));
    mt_bf16 *dh = malloc(n * sizeof(mt_bf16));
    if (dist == 0) mt_test_fill_normal(&rng, x, n, 0.02f);
    else if (dist == 1) mt_test_fill_uniform(&rng, x, n, -3.0f, 3.0f);
    else mt_test_fill_grad(&rng, x, n); /* mixed magnitudes, zeros, tiny values */
    assert_int_equal(mt_nf4_quantize(x, n, c, am), MT_OK);
    mt_nf4_dequantize(c, am, n, deq);
    mt_nf4_dequantize_bf16(c, am, n, dh);
    float hg = nf4_half_gap();
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        float a = am[i / 64];
        uint8_t q = i % 2 ? c[i / 2] & 15 : c[i / 2] >> 4;
        assert_true(bits(deq[i]) == bits(mt_nf4_code[q] * a));
        assert_true(dh[i] == mt_f32_to_bf16(deq[i]));
        double err = fabs((double)x[i] - deq[i]);
        if (a > 0) worst = fmax(worst, err / a);
        if (!(err <= (double)a * hg * (1 + 1e-5))) {
            fprintf(stderr, "nf4 x[%lld] = %g deq %g absmax %g\n", (long long)i, x[i], deq[i], a);
            fail();
        }
        /* the nearest code to the scaled value (a tie may go either way in exact arithmetic) */
        if (a >= MT_NF4_ABSMAX_FLOOR) {
            double s = (double)(x[i] * (1.0f / a));
            for (int k = 0; k < 16; k++)
                assert_true(fabs(s - mt_nf4_code[q]) <= fabs(s - mt_nf4_code[k]) + 1e-7);
        }
    }
    fprintf(stderr, "nf4 n=%lld dist %d: max |x - deq| / absmax %.4f (bound %.4f)\n",
            (long long)n, dist, worst, hg);
    assert_int_equal(mt_nf4_quantize(deq, n, c2, am2), MT_OK);
    assert_memory_equal(c, c2, n / 2);
    assert_memory_equal(am, am2, n / 64 * sizeof(float));
    free(x), free(deq), free(c), free(c2), free(am), free(am2), free(dh);
}

static void test_nf4_roundtrip(void **state) {
    (void)state;
    nf4_roundtrip(64, 0, 1);
    nf4_roundtrip(64 * 1000, 0, 2);
    nf4_roundtrip(64 * 1000, 1, 3);
    nf4_roundtrip(64 * 3000, 2, 4); /* past the parallel threshold */
}

static void test_nf4_edges(void **state) {
    (void)state;
    float x[4 * 64];
    uint8_t c[2 * 64];
    float am[4], deq[4 * 64];
    for (int i = 0; i < 64; i++) {
        x[i] = 0.0f;                                   /* all zero */
        x[64 + i] = i % 2 ? -0.0f : 0.0f;              /* signed zeros */
        x[128 + i] = 1e-3f * (float)(i - 32);          /* one huge value among small ones */
        x[192 + i] = -1e-30f * (float)(i + 1) / 64.0f; /* tiny negatives, absmax from -1e-30 */
    }
    x[128 + 9] = -1e30f;
    assert_int_equal(mt_nf4_quantize(x, 4 * 64, c, am), MT_OK);
    mt_nf4_dequantize(c, am, 4 * 64, deq);
    for (int j = 0; j < 64; j++) assert_int_equal(c[j], 0x77); /* code 7 = 0.0 (bnb's CPU) */
    assert_true(bits(am[0]) == 0 && bits(am[1]) == 0);         /* +0: |-0| */
    for (int i = 0; i < 128; i++) assert_true(bits(deq[i]) == 0);
    assert_true(am[2] == 1e30f && deq[128 + 9] == -1e30f);
    for (int i = 0; i < 64; i++)
        if (i != 9) assert_true(deq[128 + i] == 0.0f);
    assert_true(am[3] == 1e-30f && deq[192 + 63] == -1e-30f);
    for (int i = 0; i < 64; i++)
        assert_true(fabsf(x[192 + i] - deq[192 + i]) <= am[3] * nf4_half_gap() * 1.000001f);

    /* NaN and infinity are refused, the first one named */
    x[70] = NAN;
    x[200] = INFINITY;
    assert_int_equal(mt_nf4_quantize(x, 4 * 64, c, am), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "element 70 is NaN"));
    x[70] = 0.0f;
    assert_int_equal(mt_nf4_quantize(x, 4 * 64, c, am), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "element 200 is infinite"));
    x[200] = -INFINITY;
    assert_int_equal(mt_nf4_quantize(x, 4 * 64, c, am), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "element 200 is infinite"));
    assert_int_equal(mt_nf4_quantize(x, 0, c, am), MT_OK); /* nothing to do */

    /* threaded: the first bad element of the lowest block, whichever thread saw it */
    int64_t n = 64 * 20000;
    float *big = calloc(n, sizeof(float));
    uint8_t *bc = malloc(n / 2);
    float *ba = malloc(n / 64 * sizeof(float));
    big[64 * 15000 + 3] = NAN;
    big[64 * 9000 + 61] = INFINITY;
    big[64 * 9000 + 62] = NAN;
    assert_int_equal(mt_nf4_quantize(big, n, bc, ba), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "element 576061 is infinite"));
    free(big), free(bc), free(ba);
}

/* The same bytes for 1, 2 and 3 threads (every block on its own). */
static void test_nf4_threads(void **state) {
    (void)state;
    int64_t n = 64 * 20000;
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 7);
    float *x = malloc(n * sizeof(float)), *d[3];
    mt_test_fill_grad(&rng, x, n);
    uint8_t *c[3];
    float *a[3];
    int saved = omp_get_max_threads();
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        c[t] = malloc(n / 2), a[t] = malloc(n / 64 * sizeof(float)), d[t] = malloc(n * 4);
        assert_int_equal(mt_nf4_quantize(x, n, c[t], a[t]), MT_OK);
        mt_nf4_dequantize(c[t], a[t], n, d[t]);
    }
    omp_set_num_threads(saved);
    for (int t = 1; t < 3; t++) {
        assert_memory_equal(c[0], c[t], n / 2);
        assert_memory_equal(a[0], a[t], n / 64 * sizeof(float));
        assert_memory_equal(d[0], d[t], n * sizeof(float));
    }
    for (int t = 0; t < 3; t++) free(c[t]), free(a[t]), free(d[t]);
    free(x);
}

/* bitsandbytes' own quantize_4bit / dequantize_4bit, bit for bit. */
static void test_nf4_bnb(void **state) {
    (void)state;
    const char *cases[] = {"nf4.random", "nf4.weight", "nf4.edge"};
    for (int k = 0; k < 3; k++) {
        char name[64], what[64];
        int64_t n, nc, na, nd, nh;
        snprintf(name, sizeof name, "%s.x", cases[k]);
        float *x = fx_copy(name, MT_F32, &n);
        snprintf(name, sizeof name, "%s.codes", cases[k]);
        const uint8_t *want_c = fx(name, MT_U8, &nc);
        snprintf(name, sizeof name, "%s.absmax", cases[k]);
        float *want_a = fx_copy(name, MT_F32, &na);
        snprintf(name, sizeof name, "%s.deq", cases[k]);
        const float *want_d = fx(name, MT_F32, &nd);
        snprintf(name, sizeof name, "%s.deq_bf16", cases[k]);
        const mt_bf16 *want_h = fx(name, MT_BF16, &nh);
        assert_true(n % 64 == 0 && nc == n / 2 && na == n / 64 && nd == n && nh == n);
        uint8_t *c = malloc(nc);
        float *a = malloc(na * sizeof(float)), *d = malloc(n * sizeof(float));
        mt_bf16 *h = malloc(n * sizeof(mt_bf16));
        assert_int_equal(mt_nf4_quantize(x, n, c, a), MT_OK);
        /* dequantize bnb's own codes, so a code mismatch cannot hide a dequantization one */
        mt_nf4_dequantize(want_c, want_a, n, d);
        mt_nf4_dequantize_bf16(want_c, want_a, n, h);
        int ok = 1;
        snprintf(what, sizeof what, "%s codes", cases[k]);
        ok &= mt_test_same_elems(what, c, want_c, nc, 1);
        snprintf(what, sizeof what, "%s absmax", cases[k]);
        ok &= mt_test_same_elems(what, a, want_a, na, 4);
        snprintf(what, sizeof what, "%s deq", cases[k]);
        ok &= mt_test_same_elems(what, d, want_d, n, 4);
        snprintf(what, sizeof what, "%s deq bf16", cases[k]);
        ok &= mt_test_same_elems(what, h, want_h, n, 2);
        /* bnb's CUDA rule, as make_quant_fixture.py reproduces it from bnb's source */
        snprintf(name, sizeof name, "%s.codes_cuda", cases[k]);
        const uint8_t *want_cu = fx(name, MT_U8, &nc);
        assert_int_equal(mt_nf4_quantize_rule(x, n, c, a, MT_NF4_BNB_CUDA), MT_OK);
        snprintf(what, sizeof what, "%s codes, cuda rule", cases[k]);
        ok &= mt_test_same_elems(what, c, want_cu, nc, 1);
        ok &= memcmp(a, want_a, na * sizeof(float)) == 0;
        size_t apart = 0;
        for (int64_t i = 0; i < n; i++) {
            int sh = i % 2 ? 0 : 4;
            apart += (want_c[i / 2] >> sh & 15) != (want_cu[i / 2] >> sh & 15);
        }
        fprintf(stderr, "%-28s %zu of %lld values coded apart by bnb's CPU and CUDA rules\n",
                cases[k], apart, (long long)n);
        assert_true(ok);
        free(x), free(want_a), free(c), free(a), free(d), free(h);
    }
}

/* ---------------- FP8 e4m3 ---------------- */

/* The 256 bytes decode as torch does (NaN bits included), the format's landmarks hold, every
 * finite byte encodes back to itself, a tie between neighbours goes to the even mantissa, and
 * beyond 448 saturates. */
static void test_fp8_scalar(void **state) {
    (void)state;
    int64_t n;
    const float *dec = fx("fp8.decode", MT_F32, &n);
    assert_int_equal(n, 256);
    float want[256];
    memcpy(want, dec, sizeof want);
    for (int b = 0; b < 256; b++) assert_true(bits(mt_fp8_e4m3_to_f32((uint8_t)b)) == bits(want[b]));
    assert_true(mt_fp8_e4m3_to_f32(0x7e) == 448.0f && mt_fp8_e4m3_to_f32(0xfe) == -448.0f);
    assert_true(mt_fp8_e4m3_to_f32(0x01) == 0x1p-9f && mt_fp8_e4m3_to_f32(0x07) == 7 * 0x1p-9f);
    assert_true(mt_fp8_e4m3_to_f32(0x08) == 0x1p-6f && mt_fp8_e4m3_to_f32(0x38) == 1.0f);
    assert_true(bits(mt_fp8_e4m3_to_f32(0x80)) == 0x80000000u);
    assert_true(isnan(mt_fp8_e4m3_to_f32(0x7f)) && isnan(mt_fp8_e4m3_to_f32(0xff)));
    for (int b = 0; b < 256; b++)
        if ((b & 0x7f) != 0x7f) assert_int_equal(mt_fp8_e4m3_from_f32(mt_fp8_e4m3_to_f32(b)), b);
    for (int b = 0; b < 0x7e; b++) { /* b, b + 1 neighbours (positive), and their negatives */
        float lo = mt_fp8_e4m3_to_f32(b), hi = mt_fp8_e4m3_to_f32(b + 1);
        float mid = (lo + hi) / 2; /* exact: 4 significant bits */
        int even = (b & 1) ? b + 1 : b;
        assert_int_equal(mt_fp8_e4m3_from_f32(mid), even);
        assert_int_equal(mt_fp8_e4m3_from_f32(-mid), even | 0x80);
        assert_int_equal(mt_fp8_e4m3_from_f32(nextafterf(mid, 0)), b);
        assert_int_equal(mt_fp8_e4m3_from_f32(nextafterf(mid, 1e9f)), b + 1);
    }
    assert_int_equal(mt_fp8_e4m3_from_f32(464.0f), 0x7e);
    assert_int_equal(mt_fp8_e4m3_from_f32(1e30f), 0x7e);
    assert_int_equal(mt_fp8_e4m3_from_f32(INFINITY), 0x7e);
    assert_int_equal(mt_fp8_e4m3_from_f32(-INFINITY), 0xfe);
    assert_int_equal(mt_fp8_e4m3_from_f32(NAN), 0x7f);
    assert_int_equal(mt_fp8_e4m3_from_f32(-NAN), 0xff);
    assert_int_equal(mt_fp8_e4m3_from_f32(0x1p-10f), 0x00); /* half the smallest: tie to even 0 */
    assert_int_equal(mt_fp8_e4m3_from_f32(0x1.000002p-10f), 0x01);
    assert_int_equal(mt_fp8_e4m3_from_f32(1e-45f), 0x00);
    assert_int_equal(mt_fp8_e4m3_from_f32(-1e-45f), 0x80);
}

/* torch's cast of every representable value, tie, neighbour ulp, special and random value. */
static void test_fp8_torch_cast(void **state) {
    (void)state;
    int64_t n, nq;
    float *x = fx_copy("fp8.cast.x", MT_F32, &n);
    const uint8_t *want = fx("fp8.cast.q", MT_U8, &nq);
    assert_int_equal(n, nq);
    uint8_t *q = malloc(n);
    for (int64_t i = 0; i < n; i++) q[i] = mt_fp8_e4m3_from_f32(x[i]);
    assert_true(mt_test_same_elems("fp8 cast", q, want, n, 1));
    free(x), free(q);
}

/* 1x128 blocks as the fixture's torch code makes them, bit for bit. */
static void test_fp8_torch_blocks(void **state) {
    (void)state;
    const char *cases[] = {"fp8.random", "fp8.weight", "fp8.edge"};
    for (int k = 0; k < 3; k++) {
        char name[64], what[64];
        int64_t n, nq, ns, nd, nh;
        snprintf(name, sizeof name, "%s.x", cases[k]);
        float *x = fx_copy(name, MT_F32, &n);
        snprintf(name, sizeof name, "%s.q", cases[k]);
        const uint8_t *want_q = fx(name, MT_U8, &nq);
        snprintf(name, sizeof name, "%s.scales", cases[k]);
        float *want_s = fx_copy(name, MT_F32, &ns);
        snprintf(name, sizeof name, "%s.deq", cases[k]);
        const float *want_d = fx(name, MT_F32, &nd);
        snprintf(name, sizeof name, "%s.deq_bf16", cases[k]);
        const mt_bf16 *want_h = fx(name, MT_BF16, &nh);
        assert_true(n % 128 == 0 && nq == n && ns == n / 128 && nd == n && nh == n);
        uint8_t *q = malloc(n);
        float *s = malloc(ns * sizeof(float)), *d = malloc(n * sizeof(float));
        mt_bf16 *h = malloc(n * sizeof(mt_bf16));
        assert_int_equal(mt_fp8_quantize(x, n, q, s), MT_OK);
        mt_fp8_dequantize(want_q, want_s, n, d);
        mt_fp8_dequantize_bf16(want_q, want_s, n, h);
        int ok = 1;
        snprintf(what, sizeof what, "%s q", cases[k]);
        ok &= mt_test_same_elems(what, q, want_q, n, 1);
        snprintf(what, sizeof what, "%s scales", cases[k]);
        ok &= mt_test_same_elems(what, s, want_s, ns, 4);
        snprintf(what, sizeof what, "%s deq", cases[k]);
        ok &= mt_test_same_elems(what, d, want_d, n, 4);
        snprintf(what, sizeof what, "%s deq bf16", cases[k]);
        ok &= mt_test_same_elems(what, h, want_h, n, 2);
        assert_true(ok);
        free(x), free(want_s), free(q), free(s), free(d), free(h);
    }
}

/* Error bounds: relative 2^-4 where x / scale is an e4m3 normal (>= 2^-6), else half the
 * subnormal step (2^-10) times the scale; each byte the nearest e4m3 value to x / scale. Plus
 * re-quantizing the dequantized tensor, bf16 = fp32 rounded once. */
static void fp8_roundtrip(int64_t n, int dist, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    float *x = malloc(n * sizeof(float)), *deq = malloc(n * sizeof(float));
    uint8_t *q = malloc(n), *q2 = malloc(n);
    float *s = malloc(n / 128 * sizeof(float)), *s2 = malloc(n / 128 * sizeof(float));
    mt_bf16 *h = malloc(n * sizeof(mt_bf16));
    if (dist == 0) mt_test_fill_normal(&rng, x, n, 0.02f);
    else if (dist == 1) mt_test_fill_uniform(&rng, x, n, -100.0f, 100.0f);
    else mt_test_fill_grad(&rng, x, n);
    assert_int_equal(mt_fp8_quantize(x, n, q, s), MT_OK);
    mt_fp8_dequantize(q, s, n, deq);
    mt_fp8_dequantize_bf16(q, s, n, h);
    double worst_rel = 0;
    for (int64_t i = 0; i < n; i++) {
        float sc = s[i / 128], y = x[i] / sc;
        assert_true(bits(deq[i]) == bits(mt_fp8_e4m3_to_f32(q[i]) * sc));
        assert_true(h[i] == mt_f32_to_bf16(deq[i]));
        double err = fabs((double)x[i] - deq[i]);
        if (fabsf(y) >= 0x1p-6f) {
            double rel = err / fabs(x[i]);
            worst_rel = fmax(worst_rel, rel);
            assert_true(rel <= 0x1p-4 * (1 + 0x1p-20));
        } else {
            assert_true(err <= 0x1p-10 * sc * (1 + 0x1p-12));
        }
        if (i % 7 == 0) { /* the nearest finite e4m3 value to y */
            double best = INFINITY;
            for (int b = 0; b < 0x7f; b++)
                best = fmin(best, fabs(fabs((double)y) - mt_fp8_e4m3_to_f32(b)));
            assert_true(fabs(fabs((double)y) - fabsf(mt_fp8_e4m3_to_f32(q[i]))) == best);
        }
    }
    fprintf(stderr, "fp8 n=%lld dist %d: max relative error %.5f (bound %.5f)\n", (long long)n,
            dist, worst_rel, 0x1p-4);
    assert_int_equal(mt_fp8_quantize(deq, n, q2, s2), MT_OK);
    for (int64_t i = 0; i < n; i++) /* same values (a +-0 may flip sign: both zero) */
        assert_true(mt_fp8_e4m3_to_f32(q[i]) * s[i / 128] == mt_fp8_e4m3_to_f32(q2[i]) * s2[i / 128]);
    free(x), free(deq), free(q), free(q2), free(s), free(s2), free(h);
}

static void test_fp8_roundtrip(void **state) {
    (void)state;
    fp8_roundtrip(128, 0, 11);
    fp8_roundtrip(128 * 500, 0, 12);
    fp8_roundtrip(128 * 500, 1, 13);
    fp8_roundtrip(128 * 2000, 2, 14); /* mixed magnitudes; past the parallel threshold */
}

static void test_fp8_edges(void **state) {
    (void)state;
    float x[4 * 128], s[4], deq[4 * 128];
    uint8_t q[4 * 128];
    for (int i = 0; i < 128; i++) {
        x[i] = i % 2 ? -0.0f : 0.0f;                    /* zeros: scale 1, the signs kept */
        x[128 + i] = 1e-3f * (float)(i - 64);           /* one huge value */
        x[256 + i] = 1e-44f * (float)(i % 5);           /* amax / 448 underflows to 0 */
        x[384 + i] = -3.0f * (float)(i + 1) / 128.0f;   /* absmax from a negative value */
    }
    x[128 + 100] = 3e38f;
    assert_int_equal(mt_fp8_quantize(x, 4 * 128, q, s), MT_OK);
    mt_fp8_dequantize(q, s, 4 * 128, deq);
    assert_true(s[0] == 1.0f && s[2] == 1.0f);
    for (int i = 0; i < 128; i++) {
        assert_int_equal(q[i], i % 2 ? 0x80 : 0x00);
        assert_true(bits(deq[i]) == (i % 2 ? 0x80000000u : 0));
        assert_true((q[256 + i] & 0x7f) == 0 && deq[256 + i] == 0.0f);
    }
    assert_true(s[1] == 3e38f / 448.0f && q[128 + 100] == 0x7e);
    assert_true(fabsf(deq[128 + 100] - 3e38f) <= 3e38f * 0x1p-4f);
    for (int i = 0; i < 128; i++)
        if (i != 100) assert_true((q[128 + i] & 0x7f) == 0); /* far below the scale: zero */
    assert_true(s[3] == 3.0f / 448.0f && q[384 + 127] == 0xfe && deq[384 + 127] == -3.0f);

    x[300] = -NAN;
    assert_int_equal(mt_fp8_quantize(x, 4 * 128, q, s), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "element 300 is NaN"));
    x[5] = INFINITY;
    assert_int_equal(mt_fp8_quantize(x, 4 * 128, q, s), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "element 5 is infinite"));

    /* threads: the same bytes for 1, 2 and 3 */
    int64_t n = 128 * 10000;
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 21);
    float *big = malloc(n * sizeof(float));
    mt_test_fill_grad(&rng, big, n);
    uint8_t *bq[3];
    float *bs[3];
    int saved = omp_get_max_threads();
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        bq[t] = malloc(n), bs[t] = malloc(n / 128 * sizeof(float));
        assert_int_equal(mt_fp8_quantize(big, n, bq[t], bs[t]), MT_OK);
    }
    omp_set_num_threads(saved);
    for (int t = 1; t < 3; t++) {
        assert_memory_equal(bq[0], bq[t], n);
        assert_memory_equal(bs[0], bs[t], n / 128 * sizeof(float));
    }
    big[128 * 7000 + 1] = NAN;
    big[128 * 3000 + 127] = -INFINITY;
    assert_int_equal(mt_fp8_quantize(big, n, bq[0], bs[0]), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "element 384127 is infinite"));
    for (int t = 0; t < 3; t++) free(bq[t]), free(bs[t]);
    free(big);
}

/* The CPU backend's ops are the functions (fp32 compute dtype). */
static void test_cpu_backend_ops(void **state) {
    (void)state;
    mt_backend *be = mt_backend_cpu_create();
    assert_non_null(be->dequant_nf4);
    assert_non_null(be->dequant_fp8);
    int64_t n = 128 * 40;
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 31);
    float *x = malloc(n * sizeof(float)), *a = malloc(n * sizeof(float)),
          *b = malloc(n * sizeof(float)), sc[40 * 2];
    uint8_t *c = malloc(n);
    mt_test_fill_normal(&rng, x, n, 0.05f);
    assert_int_equal(mt_nf4_quantize(x, n, c, sc), MT_OK);
    mt_nf4_dequantize(c, sc, n, a);
    be->dequant_nf4(be, b, c, sc, n);
    be->sync(be);
    assert_memory_equal(a, b, n * sizeof(float));
    assert_int_equal(mt_fp8_quantize(x, n, c, sc), MT_OK);
    mt_fp8_dequantize(c, sc, n, a);
    be->dequant_fp8(be, b, c, sc, n);
    be->sync(be);
    assert_memory_equal(a, b, n * sizeof(float));
    be->destroy(be);
    free(x), free(a), free(b), free(c);
}

static int setup(void **state) {
    return mt_test_fixture_st_open(state, &ref, "quant/quant_ref.safetensors", "test_quant");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nf4_tables),     cmocka_unit_test(test_nf4_roundtrip),
        cmocka_unit_test(test_nf4_edges),      cmocka_unit_test(test_nf4_threads),
        cmocka_unit_test(test_nf4_bnb),        cmocka_unit_test(test_fp8_scalar),
        cmocka_unit_test(test_fp8_torch_cast), cmocka_unit_test(test_fp8_torch_blocks),
        cmocka_unit_test(test_fp8_roundtrip),  cmocka_unit_test(test_fp8_edges),
        cmocka_unit_test(test_cpu_backend_ops),
    };
    return cmocka_run_group_tests(tests, setup, mt_test_fixture_st_teardown);
}
