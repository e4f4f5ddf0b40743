/* The bf16 master representations (src/optim/bf16x.h): compact's bf16 + 16-bit compensation
 * holds an fp32 value without loss and accumulates long runs of tiny updates as fp32 does (where a
 * plain bf16 master loses them all); tight's stochastic rounding is unbiased and reproducible. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "optim/bf16x.h"
#include "util/testutil.h"

/* ---- split / join ---- */

static void test_split_join_exact(void **state) {
    (void)state;
    mt_test_rng r;
    mt_test_rng_seed(&r, 3);
    size_t ties = 0;
    for (size_t j = 0; j < (1u << 22); j++) {
        uint32_t u = (uint32_t)mt_test_rng_u64(&r);
        if (j < 65536) u = (uint32_t)j << 16 | 0x8000u;           /* every tie */
        else if (j < 2 * 65536) u = (uint32_t)(j - 65536) << 16 | 0x7fffu;
        float w = mt_f32_from_bits(u);
        mt_bf16 hi;
        uint16_t comp;
        mt_bf16c_split(w, &hi, &comp);
        if (isnan(w)) {
            assert_true(isnan(mt_bf16_to_f32(hi)) && comp == 0);
            continue;
        }
        /* lossless */
        assert_int_equal(mt_f32_bits(mt_bf16c_join(hi, comp)), u);
        /* hi is the nearest bf16: round-to-even's, but for exact ties (away from zero) */
        if ((u & 0xffffu) == 0x8000u) {
            ties++;
            assert_int_equal(hi, (u >> 16) + 1);
        } else {
            assert_int_equal(hi, mt_f32_to_bf16(w));
        }
    }
    printf("2^22 bit patterns split and joined bit for bit (%zu ties rounded away from zero)\n",
           ties);
}

/* ---- long runs of tiny updates ---- */

static void check_long_run(float w0, double du, size_t steps) {
    mt_bf16 hi, plain = mt_f32_to_bf16(w0);
    uint16_t comp;
    mt_bf16c_split(w0, &hi, &comp);
    float acc = w0; /* an fp32 master, for the bitwise comparison */
    double ref = w0, maxw = fabs(w0);
    for (size_t s = 0; s < steps; s++) {
        /* the update varies: du * (0.5 .. 1.5), always below half a bf16 ulp of w */
        float u = (float)(du * (1.0 + 0.5 * sin(0.001 * (double)s)));
        float w = mt_bf16c_join(hi, comp);
        w = w + u;
        mt_bf16c_split(w, &hi, &comp);
        acc = acc + u;
        plain = mt_f32_to_bf16(mt_bf16_to_f32(plain) + u);
        ref += u;
        if (fabs(ref) > maxw) maxw = fabs(ref);
    }
    float got = mt_bf16c_join(hi, comp);
    double moved = fabs(ref - w0);
    /* compensated: exactly the fp32 accumulation, so within steps * half an fp32 ulp of the
     * largest |w| of the fp64 sum */
    double fp32_bound = (double)steps * 0.5 * ldexp(1.0, ilogb(maxw) - 23);
    double err = fabs((double)got - ref), perr = fabs((double)mt_bf16_to_f32(plain) - ref);
    printf("w0 %g, %zu updates of ~%g (moved %.6g): compensated err %.3g (bound %.3g), plain "
           "bf16 err %.3g, hi off by %.3g\n", w0, steps, du, moved, err, fp32_bound, perr,
           fabs((double)mt_bf16_to_f32(hi) - ref));
    assert_int_equal(mt_f32_bits(got), mt_f32_bits(acc));
    assert_true(err <= fp32_bound);
    assert_true(fp32_bound <= 0.02 * moved); /* the bound is tight against the movement */
    /* plain bf16 loses every update: it never moved */
    assert_true(mt_bf16_to_f32(plain) == mt_bf16_to_f32(mt_f32_to_bf16(w0)));
    assert_true(perr >= 0.99 * moved);
    /* the uploaded hi is the nearest bf16 of the true weight (up to the tiny fp32 error) */
    double bulp = ldexp(1.0, ilogb(fmax(fabs(ref), fabs((double)got))) - 7);
    assert_true(fabs((double)mt_bf16_to_f32(hi) - ref) <= 0.5 * bulp + err);
}

static void test_compensated_long_runs(void **state) {
    (void)state;
    /* bf16 half ulp at 1 is 2^-8 = 0.0039: updates of 1e-5 are all lost to a bf16 master */
    check_long_run(1.0f, 1e-5, 100000);
    check_long_run(1.0f, -1e-5, 100000);
    check_long_run(-0.3f, 2e-6, 100000);
    check_long_run(37.5f, -3e-4, 100000);
}

/* ---- stochastic rounding ---- */

static void test_sr_unbiased(void **state) {
    (void)state;
    mt_test_rng r;
    mt_test_rng_seed(&r, 8);
    const float fracs[] = {0.001f, 0.1f, 0.25f, 0.5f, 0.75f, 0.999f};
    const size_t N = 1u << 16;
    for (int t = 0; t < 24; t++) {
        /* a value a fraction of the way through its bf16 cell, various magnitudes and signs */
        float base = (t % 2 ? -1.0f : 1.0f) * ldexpf(1.0f + (t % 7) / 8.0f, t - 12);
        double ulp = ldexp(1.0, ilogb(base) - 7);
        float x = (float)(base + (base > 0 ? 1 : -1) * fracs[t % 6] * ulp);
        double sum_steps = 0, sum_index = 0, sum_rne = 0;
        uint64_t seed = mt_test_rng_u64(&r);
        for (size_t k = 0; k < N; k++) {
            /* over steps at one index, and over indices in one step */
            sum_steps += mt_bf16_to_f32(mt_bf16_round_sr(x, mt_sr_bits16(mt_sr_key_make(seed, (int64_t)k + 1), 12345)));
            sum_index += mt_bf16_to_f32(mt_bf16_round_sr(x, mt_sr_bits16(mt_sr_key_make(seed, 7), k)));
            sum_rne += mt_bf16_to_f32(mt_f32_to_bf16(x));
        }
        /* a draw is one of two values ulp apart: sigma <= ulp/2, so the mean of N draws is
         * within 5 sigma / sqrt(N) = 2.5 ulp / 256 of x (deterministic: fixed seeds) */
        double bound = 2.5 * ulp / sqrt((double)N);
        double e1 = fabs(sum_steps / N - x), e2 = fabs(sum_index / N - x);
        double e3 = fabs(sum_rne / N - x);
        if (t < 6 || e1 > bound || e2 > bound)
            printf("x %.9g: SR mean off by %.3g ulp (steps), %.3g ulp (indices); bound %.3g ulp; "
                   "round-to-nearest off by %.3g ulp\n", x, e1 / ulp, e2 / ulp, bound / ulp,
                   e3 / ulp);
        assert_true(e1 <= bound);
        assert_true(e2 <= bound);
        /* the contrast: round-to-nearest is biased by min(f, 1-f) ulp */
        assert_true(e3 >= 0.9 * fmin(fracs[t % 6], 1 - fracs[t % 6]) * ulp);
    }
    /* exact bf16 values, inf and NaN round to themselves */
    for (uint32_t rr = 0; rr < 65536; rr += 4099) {
        assert_int_equal(mt_bf16_round_sr(1.5f, rr), mt_f32_to_bf16(1.5f));
        assert_int_equal(mt_bf16_round_sr(INFINITY, rr), 0x7f80);
        assert_true(isnan(mt_bf16_to_f32(mt_bf16_round_sr(NAN, rr))));
    }
}

static void test_sr_reproducible(void **state) {
    (void)state;
    const size_t N = 100000;
    size_t same_seed_diff = 0, other_seed_same = 0, other_step_same = 0, other_hi_same = 0;
    double mean = 0;
    for (size_t i = 0; i < N; i++) {
        uint64_t idx = i * 977 + ((uint64_t)(i % 3) << 32);
        uint32_t a = mt_sr_bits16(mt_sr_key_make(42, 1000), idx);
        uint32_t b = mt_sr_bits16(mt_sr_key_make(42, 1000), idx);
        same_seed_diff += a != b;
        other_seed_same += a == mt_sr_bits16(mt_sr_key_make(43, 1000), idx);
        other_step_same += a == mt_sr_bits16(mt_sr_key_make(42, 1001), idx);
        /* the high half is mixed into the key: index and index + 2^32 draw independently */
        other_hi_same += a == mt_sr_bits16(mt_sr_key_make(42, 1000), idx + (1ull << 32));
        assert_true(a < 65536);
        mean += a;
    }
    mean /= N;
    printf("SR bits: mean %.1f (uniform: 32767.5); equal under another seed %zu, another step "
           "%zu, another high half %zu of %zu\n", mean, other_seed_same, other_step_same,
           other_hi_same, N);
    assert_int_equal(same_seed_diff, 0);
    /* independent 16-bit draws agree 1 in 65536: ~1.5 of 1e5; 20 would be a correlation */
    assert_true(other_seed_same < 20 && other_step_same < 20 && other_hi_same < 20);
    /* uniform: sigma of the mean 18918 / sqrt(N) = 60 */
    assert_true(fabs(mean - 32767.5) < 300);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_join_exact),
        cmocka_unit_test(test_compensated_long_runs),
        cmocka_unit_test(test_sr_unbiased),
        cmocka_unit_test(test_sr_reproducible),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
