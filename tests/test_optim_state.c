/* The optimizer state (src/optim/state.h): each format's AdamW step against an fp64 reference of
 * the same math (dequantize -> fp64 AdamW -> requantize), long runs of tiny updates through the
 * kernels, every ISA path and thread count bitwise equal to the plain C one, full as adamw.h's
 * update (either upload dtype, the gradient in the upload copy), the checkpoint tensor list and a
 * tensor's parts round-tripping bit for bit (resume), the arenas' update, bytes per parameter,
 * the errors, and the frozen format (weights only: bytes, rounding, a no-op update, no parts,
 * not a --state). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/error.h"
#include "optim/adamw.h"
#include "optim/qmap.h"
#include "optim/state.h"
#include "util/testutil.h"

#if defined(__SANITIZE_THREAD__)
#define NSTEPS_BIG 2
#else
#define NSTEPS_BIG 3
#endif
/* More than two of the update's 1024-block thread chunks, and odd. */
#define N_THREADED (2 * 262144 + 4099)

/* test_pinned_outputs: printed by that test at 8467e7b (kernels as before the speed work);
 * tight's since its random bits became one finalizer per element (bf16x.h, 2026-12-01; the
 * scalar kernel's, which defines them; before: 0xc004ecc8add52c9f, 0x418d8f126b21d65a);
 * compact's since the element multiplies by 1/sqrt(1 - beta2^t) and the requantization by the
 * scale's reciprocal (kernel.h, session 6; before: 0xcc3e561c3c04fe26, 0x5af0f023ab5964fb).
 * tight's stayed: in these 6 steps of 4099 elements no stochastic rounding or code moved. */
#define PIN_COMPACT_F32 0xd45889c465218a79ull
#define PIN_COMPACT_BF16 0x3097ad1efa8bacecull
#define PIN_TIGHT_F32 0xe1559faa8ecf614full
#define PIN_TIGHT_BF16 0xac728d9aec583322ull

/* The full format's update as mt_adamw_update computes it on separate buffers. */
static void full_update(const mt_optim_step *a, float *p, float *m, float *v, const void *grad,
                        int grad_bf16, size_t n, void *upload, mt_dtype upload_dtype,
                        int n_threads) {
    if (grad_bf16) mt_adamw_update_bf16(a, p, m, v, grad, n, upload, upload_dtype, n_threads);
    else mt_adamw_update(a, p, m, v, grad, n, upload, upload_dtype, n_threads);
}

static int states_equal(const char *what, const mt_optim_state *a, const mt_optim_state *b);

static mt_optim_step step_args(double wd, int64_t step, float gs) {
    mt_optim_step a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                       .weight_decay = wd, .step = step, .grad_scale = gs};
    return a;
}

static mt_optim_tensor *find_tensor(mt_optim_tensor *t, int nt, const char *name) {
    for (int k = 0; k < nt; k++)
        if (!strcmp(t[k].name, name)) return &t[k];
    fail_msg("state has no tensor %s", name);
    return NULL;
}

/* The moments as the kernel reads them: code * scale (exact in double). */
static void dequant(const mt_optim_state *s, double *m, double *v) {
    mt_optim_tensor t[MT_OPTIM_MAX_TENSORS];
    int nt = mt_optim_state_tensors(s, t);
    const uint8_t *mq = find_tensor(t, nt, "exp_avg")->data, *vq = find_tensor(t, nt, "exp_avg_sq")->data;
    const float *ms = find_tensor(t, nt, "exp_avg_scale")->data;
    const float *vs = find_tensor(t, nt, "exp_avg_sq_scale")->data;
    for (size_t i = 0; i < mt_optim_state_numel(s); i++) {
        m[i] = (double)mt_qmap_signed()->code[mq[i]] * ms[i / MT_OPTIM_BLOCK];
        v[i] = (double)mt_qmap_unsigned()->code[vq[i]] * vs[i / MT_OPTIM_BLOCK];
    }
}

static double half_gap(const mt_qmap *q, double y) {
    int k = 0;
    while (k < 254 && q->code[k + 1] < y) k++;
    return 0.5 * ((double)q->code[k + 1] - q->code[k]);
}

typedef struct {
    double w, m, v, u, d; /* after the step; u the update, d its denominator */
} ref_elem;

static ref_elem ref_adamw(const mt_optim_step *a, double w, double m, double v, double g) {
    double bc1 = 1.0 - pow(a->beta1, (double)a->step), bc2 = 1.0 - pow(a->beta2, (double)a->step);
    ref_elem r;
    g *= a->grad_scale;
    r.m = m + (1.0 - a->beta1) * (g - m);
    r.v = a->beta2 * v + (1.0 - a->beta2) * g * g;
    r.d = sqrt(r.v) / sqrt(bc2) + a->eps;
    r.u = -a->lr / bc1 * r.m / r.d;
    r.w = w * (1.0 - a->lr * a->weight_decay) + r.u;
    return r;
}

/* ---- (a) one step of each format against fp64 ---- */

/* Checks the new moments of one element against the reference; the block's reference scale is
 * max |reference| over the block. Returns the error as a fraction of the bound. */
static double check_moment(const char *what, const mt_qmap *q, double got, double ref,
                           double ref_scale, float scale, size_t i) {
    /* bound: the nearest code's error (half the code spacing at ref/scale, times the scale),
     * plus 1e-5 of the scale for the kernel's fp32 arithmetic against fp64 */
    double y = ref_scale ? ref / ref_scale : 0;
    double bound = ref_scale * (half_gap(q, y) + 1e-5);
    double err = fabs(got - ref);
    if (!(err <= bound) || !(fabs(scale - ref_scale) <= 1e-5 * ref_scale))
        printf("%s[%zu]: %.9g, reference %.9g, err %.3g > %.3g (scale %.9g, reference %.9g)\n",
               what, i, got, ref, err, bound, scale, ref_scale);
    assert_true(err <= bound);
    assert_true(fabs(scale - ref_scale) <= 1e-5 * ref_scale);
    return bound > 0 ? err / bound : 0;
}

static void check_vs_fp64(mt_state_format f, int bf16_grad) {
    const size_t n = 4099, split = 1536; /* two groups: decay on the first only */
    mt_test_rng r;
    mt_test_rng_seed(&r, 17 + f);
    mt_optim_state *s = mt_optim_state_create(f, n, 99, NULL);
    float *w = malloc(n * 4), *g = malloc(n * 4), *wn = malloc(n * 4);
    mt_bf16 *gh = malloc(n * 2);
    double *m = malloc(n * 8), *v = malloc(n * 8), *mn = malloc(n * 8), *vn = malloc(n * 8);
    ref_elem *ref = malloc(n * sizeof *ref);
    mt_test_fill_normal(&r, w, n, 0.5f);
    mt_optim_state_set_weights(s, 0, w, n);
    double worst_w = 0, worst_m = 0, worst_v = 0;
    for (int step = 1; step <= 10; step++) {
        mt_optim_step a1 = step_args(0.1, step, step % 2 ? 0.37f : 1.0f), a2 = a1;
        a2.weight_decay = 0.0;
        mt_test_fill_grad(&r, g, n);
        for (size_t i = 0; i < n; i++) gh[i] = mt_f32_to_bf16(g[i]);
        if (bf16_grad)
            for (size_t i = 0; i < n; i++) g[i] = mt_bf16_to_f32(gh[i]);
        mt_optim_state_get_weights(s, 0, w, n);
        dequant(s, m, v);
        for (size_t i = 0; i < n; i++) ref[i] = ref_adamw(i < split ? &a1 : &a2, w[i], m[i], v[i], g[i]);
        const void *src = bf16_grad ? (const void *)gh : (const void *)g;
        mt_dtype gt = bf16_grad ? MT_BF16 : MT_F32;
        assert_int_equal(mt_optim_state_update(s, &a1, 0, split, src, gt, 1), MT_OK);
        assert_int_equal(mt_optim_state_update(s, &a2, split, n - split,
                                               (const char *)src + split * (bf16_grad ? 2 : 4), gt, 1),
                         MT_OK);
        mt_optim_state_get_weights(s, 0, wn, n);
        dequant(s, mn, vn);
        mt_optim_tensor t[MT_OPTIM_MAX_TENSORS];
        int nt = mt_optim_state_tensors(s, t);
        const float *ms = find_tensor(t, nt, "exp_avg_scale")->data;
        const float *vs = find_tensor(t, nt, "exp_avg_sq_scale")->data;
        for (size_t b0 = 0; b0 < n; b0 += MT_OPTIM_BLOCK) {
            size_t b1 = b0 + MT_OPTIM_BLOCK < n ? b0 + MT_OPTIM_BLOCK : n;
            double am = 0, av = 0;
            for (size_t i = b0; i < b1; i++) {
                am = fmax(am, fabs(ref[i].m));
                av = fmax(av, ref[i].v);
            }
            for (size_t i = b0; i < b1; i++) {
                double fm = check_moment("exp_avg", mt_qmap_signed(), mn[i], ref[i].m, am,
                                         ms[i / MT_OPTIM_BLOCK], i);
                double fv = check_moment("exp_avg_sq", mt_qmap_unsigned(), vn[i], ref[i].v, av,
                                         vs[i / MT_OPTIM_BLOCK], i);
                worst_m = fmax(worst_m, fm);
                worst_v = fmax(worst_v, fv);
            }
        }
        for (size_t i = 0; i < n; i++) {
            /* the weight: three half-ulp fp32 roundings of w (the decay factor f32(1-lr*wd),
             * the product, the add: 1.5 ulp of the larger |w|) and the update's ~10 fp32
             * operations (1e-5 of |u|, and of m's two terms where they cancel); tight adds its
             * rounding to one of the two bf16 neighbours (< 1 bf16 ulp) */
            double bc1 = 1.0 - pow(0.9, step);
            double m_terms = fabs(m[i]) + fabs((double)g[i] * a1.grad_scale);
            double wmax = fmax(fabs(ref[i].w), fabs((double)w[i]));
            double bound = 1.5 * ldexp(1.0, ilogb(wmax) - 23) + 1e-5 * fabs(ref[i].u) +
                           1e-6 * a1.lr / bc1 * m_terms / ref[i].d;
            if (f == MT_STATE_TIGHT) bound += ldexp(1.0, ilogb(wmax) - 7);
            double err = fabs((double)wn[i] - ref[i].w);
            if (!(err <= bound))
                printf("%s step %d: w[%zu] %.9g, reference %.9g (from %.9g, update %.3g): err "
                       "%.3g > %.3g\n", mt_state_format_name(f), step, i, wn[i], ref[i].w, w[i],
                       ref[i].u, err, bound);
            assert_true(err <= bound);
            worst_w = fmax(worst_w, err / bound);
        }
    }
    printf("%s, %s grad, 10 steps vs fp64: worst weight %.1f%%, exp_avg %.1f%%, exp_avg_sq %.1f%% "
           "of the bounds\n", mt_state_format_name(f), bf16_grad ? "bf16" : "f32",
           100 * worst_w, 100 * worst_m, 100 * worst_v);
    /* the moments' bounds are tight: quantization uses most of its half spacing */
    assert_true(worst_m > 0.5 && worst_v > 0.5);
    mt_optim_state_free(s);
    free(w); free(g); free(wn); free(gh); free(m); free(v); free(mn); free(vn); free(ref);
}

static void test_vs_fp64(void **state) {
    (void)state;
    check_vs_fp64(MT_STATE_COMPACT, 0);
    check_vs_fp64(MT_STATE_COMPACT, 1);
    check_vs_fp64(MT_STATE_TIGHT, 0);
    check_vs_fp64(MT_STATE_TIGHT, 1);
}

/* full is mt_adamw_update: bitwise what it gives on separate buffers, with either upload dtype
 * (the F32 copy is the master itself) */
static void check_full_is_adamw(mt_dtype up_dtype) {
    const size_t n = 1000;
    mt_test_rng r;
    mt_test_rng_seed(&r, 4);
    mt_optim_alloc al = {.upload_dtype = up_dtype};
    mt_optim_state *s = mt_optim_state_create(MT_STATE_FULL, n, 0, &al);
    assert_int_equal(mt_optim_state_upload_dtype(s), up_dtype);
    size_t usz = mt_dtype_size(up_dtype);
    float *p = mt_aligned_alloc(n * 4), *m = mt_aligned_alloc(n * 4), *v = mt_aligned_alloc(n * 4);
    float *g = malloc(n * 4), *w = malloc(n * 4);
    void *up = mt_aligned_alloc(n * usz);
    mt_test_fill_normal(&r, p, n, 0.5f);
    memset(m, 0, n * 4);
    memset(v, 0, n * 4);
    mt_optim_state_set_weights(s, 0, p, n);
    for (int step = 1; step <= 5; step++) {
        mt_optim_step a = step_args(0.1, step, 0.5f);
        mt_test_fill_grad(&r, g, n);
        assert_int_equal(mt_optim_state_update(s, &a, 0, n, g, MT_F32, 1), MT_OK);
        full_update(&a, p, m, v, g, 0, n, up, up_dtype, 1);
    }
    mt_optim_state_get_weights(s, 0, w, n);
    assert_memory_equal(w, p, n * 4);
    assert_memory_equal(mt_optim_state_upload(s), up, n * usz);
    if (up_dtype == MT_F32) assert_memory_equal(up, p, n * 4);
    mt_optim_tensor t[MT_OPTIM_MAX_TENSORS];
    int nt = mt_optim_state_tensors(s, t);
    assert_memory_equal(find_tensor(t, nt, "exp_avg")->data, m, n * 4);
    assert_memory_equal(find_tensor(t, nt, "exp_avg_sq")->data, v, n * 4);
    mt_optim_state_free(s);
    free(p); free(m); free(v); free(g); free(w); free(up);
}

static void test_full_is_adamw(void **state) {
    (void)state;
    check_full_is_adamw(MT_BF16);
    check_full_is_adamw(MT_F32);
}

/* full with the gradient in the upload copy's own range (the engine's layout) == the same
 * gradient in a buffer of its own, for both dtypes, over a group at an odd offset */
static void check_full_alias(mt_dtype dt) {
    const size_t n = 5000, off = 1003, len = 3001;
    size_t esz = mt_dtype_size(dt);
    mt_optim_alloc al = {.upload_dtype = dt};
    mt_optim_state *a = mt_optim_state_create(MT_STATE_FULL, n, 0, &al);
    mt_optim_state *b = mt_optim_state_create(MT_STATE_FULL, n, 0, &al);
    mt_test_rng r;
    mt_test_rng_seed(&r, 8);
    float *w = malloc(n * 4), *g = malloc(len * 4);
    void *gsep = malloc(len * esz);
    mt_test_fill_normal(&r, w, n, 0.5f);
    mt_optim_state_set_weights(a, 0, w, n);
    mt_optim_state_set_weights(b, 0, w, n);
    char *bup = (char *)mt_optim_state_upload(b) + off * esz;
    for (int step = 1; step <= 4; step++) {
        mt_test_fill_grad(&r, g, len);
        for (size_t i = 0; i < len; i++) {
            if (dt == MT_BF16) ((mt_bf16 *)gsep)[i] = mt_f32_to_bf16(g[i]);
            else ((float *)gsep)[i] = g[i];
        }
        memcpy(bup, gsep, len * esz); /* b's gradient lives in its upload copy */
        mt_optim_step s1 = step_args(0.1, step, 0.8f);
        assert_int_equal(mt_optim_state_update(a, &s1, off, len, gsep, dt, 2), MT_OK);
        assert_int_equal(mt_optim_state_update(b, &s1, off, len, bup, dt, 2), MT_OK);
    }
    char what[64];
    snprintf(what, sizeof what, "full, %s grad in the upload copy", mt_dtype_name(dt));
    assert_true(states_equal(what, a, b));
    /* any other overlap: one element off, the other dtype, or into a moment */
    mt_optim_step s1 = step_args(0.1, 5, 1.0f);
    assert_int_equal(mt_optim_state_update(b, &s1, off, len, bup + esz, dt, 1), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "overlaps the upload copy"));
    mt_dtype other = dt == MT_BF16 ? MT_F32 : MT_BF16;
    assert_int_equal(mt_optim_state_update(b, &s1, off, len / 2, bup, other, 1), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "overlaps the upload copy"));
    mt_optim_tensor t[MT_OPTIM_MAX_TENSORS];
    int nt = mt_optim_state_tensors(b, t);
    assert_int_equal(mt_optim_state_update(b, &s1, 0, 16, find_tensor(t, nt, "exp_avg_sq")->data,
                                           MT_F32, 1), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "overlaps the exp_avg_sq"));
    mt_optim_state_free(a);
    mt_optim_state_free(b);
    free(w); free(g); free(gsep);
}

static void test_full_alias(void **state) {
    (void)state;
    check_full_alias(MT_BF16);
    check_full_alias(MT_F32);
}

/* ---- (b) long runs of tiny updates through the kernels ---- */

static void test_long_tiny_updates(void **state) {
    (void)state;
    const size_t n = 256, steps = 20000;
    const double lr = 1e-5; /* Adam's update ~lr; bf16 half ulp at 1..2 is 2^-8 = 0.0039 */
    for (int fi = 0; fi < 2; fi++) {
        mt_state_format f = fi ? MT_STATE_TIGHT : MT_STATE_COMPACT;
        mt_test_rng r;
        mt_test_rng_seed(&r, 23);
        mt_optim_state *s = mt_optim_state_create(f, n, 5, NULL);
        float w[256], g[256], wk[256];
        double wref[256], m[256], v[256];
        mt_bf16 plain[256];
        for (size_t i = 0; i < n; i++) {
            w[i] = 1.0f + 0.5f * mt_test_rng_uniform(&r);
            g[i] = (i % 2 ? 1.0f : -1.0f) * (0.5f + mt_test_rng_uniform(&r)) * 1e-2f;
            wref[i] = w[i];
            plain[i] = mt_f32_to_bf16(w[i]);
            w[i] = mt_bf16_to_f32(plain[i]); /* start on the bf16 grid, as plain does */
            wref[i] = w[i];
        }
        mt_optim_state_set_weights(s, 0, w, n);
        for (size_t st = 1; st <= steps; st++) {
            mt_optim_step a = {.lr = lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                               .weight_decay = 0.0, .step = (int64_t)st, .grad_scale = 1.0f};
            dequant(s, m, v);
            mt_optim_state_get_weights(s, 0, wk, n);
            for (size_t i = 0; i < n; i++) {
                ref_elem e = ref_adamw(&a, wk[i], m[i], v[i], g[i]);
                wref[i] += e.u;
                plain[i] = mt_f32_to_bf16(mt_bf16_to_f32(plain[i]) + (float)e.u);
            }
            assert_int_equal(mt_optim_state_update(s, &a, 0, n, g, MT_F32, 1), MT_OK);
        }
        mt_optim_state_get_weights(s, 0, wk, n);
        double moved = 0, err_max = 0, err_mean = 0, plain_err = 0;
        for (size_t i = 0; i < n; i++) {
            moved += fabs(wref[i] - w[i]) / n;
            err_max = fmax(err_max, fabs(wk[i] - wref[i]));
            err_mean += (wk[i] - wref[i]) / n;
            plain_err += fabs(mt_bf16_to_f32(plain[i]) - wref[i]) / n;
            assert_true(plain[i] == mt_f32_to_bf16(w[i])); /* plain bf16 never moved */
        }
        /* compact accumulates in fp32: per step half an fp32 ulp (|w| < 2: 2^-24) and the
         * update's fp32 error (1e-5 of lr) */
        double bound_c = steps * (0x1p-24 + 1e-5 * lr);
        /* tight: each step's rounding is a draw of variance <= ulp * |u| (bf16 ulp <= 2^-7):
         * the mean over the 256 elements is within 5 sigma = 5 sqrt(steps ulp lr / 256) */
        double bound_t = 5 * sqrt(steps * 0x1p-7 * lr / n);
        printf("%s: %zu steps of lr %g moved the weights %.4f on average; error max %.3g mean "
               "%.3g (bound %.3g); plain bf16 error %.4f\n", mt_state_format_name(f), steps, lr,
               moved, err_max, err_mean, f == MT_STATE_COMPACT ? bound_c : bound_t, plain_err);
        assert_true(moved > 0.15);
        assert_true(plain_err > 0.95 * moved);
        if (f == MT_STATE_COMPACT) assert_true(err_max <= bound_c && bound_c < 0.01 * moved);
        else assert_true(fabs(err_mean) <= bound_t && bound_t < 0.1 * moved);
        mt_optim_state_free(s);
    }
}

/* ---- (c) every ISA and thread count bitwise equal to scalar on one thread ---- */

typedef struct {
    mt_optim_state *s;
} run_out;

/* vary: the second part's steps go through every (weight decay, lerp form) pair, each a loop of
 * its own in the vector kernels: wd 0 / beta1 0.9, wd 0.1 / beta1 0.3, both off, ... */
static mt_optim_state *run_steps_v(mt_state_format f, size_t n, int steps, int bf16_grad,
                                   int threads, int vary) {
    mt_test_rng r;
    mt_test_rng_seed(&r, 7 + n);
    mt_optim_state *s = mt_optim_state_create(f, n, 1234, NULL);
    mt_optim_state_set_index_base(s, (1ull << 32) - 1003); /* tight's counter crosses 2^32 */
    float *w = malloc(n * 4), *g = malloc(n * 4);
    mt_bf16 *gh = malloc(n * 2);
    mt_test_fill_normal(&r, w, n, 0.5f);
    mt_optim_state_set_weights(s, 0, w, n);
    size_t split = n > 512 ? 512 : n;
    for (int step = 1; step <= steps; step++) {
        mt_optim_step a1 = step_args(0.1, step, 0.731f), a2 = a1;
        a2.weight_decay = 0.0;
        if (vary && step % 2 == 0) a2.weight_decay = 0.1, a2.beta1 = 0.3;
        if (vary && step % 3 == 0) a2.weight_decay = 0.0, a2.beta1 = 0.3;
        mt_test_fill_grad(&r, g, n);
        for (size_t i = 0; i < n; i++) gh[i] = mt_f32_to_bf16(g[i]);
        const char *src = bf16_grad ? (const char *)gh : (const char *)g;
        mt_dtype gt = bf16_grad ? MT_BF16 : MT_F32;
        size_t esz = bf16_grad ? 2 : 4;
        assert_int_equal(mt_optim_state_update(s, &a1, 0, split, src, gt, threads), MT_OK);
        if (split < n)
            assert_int_equal(mt_optim_state_update(s, &a2, split, n - split, src + split * esz,
                                                   gt, threads), MT_OK);
    }
    free(w); free(g); free(gh);
    return s;
}

static mt_optim_state *run_steps(mt_state_format f, size_t n, int steps, int bf16_grad,
                                 int threads) {
    return run_steps_v(f, n, steps, bf16_grad, threads, 0);
}

static int states_equal(const char *what, const mt_optim_state *a, const mt_optim_state *b) {
    mt_optim_tensor ta[MT_OPTIM_MAX_TENSORS], tb[MT_OPTIM_MAX_TENSORS];
    int na = mt_optim_state_tensors(a, ta), nb = mt_optim_state_tensors(b, tb), ok = na == nb;
    for (int k = 0; ok && k < na; k++) {
        if (ta[k].bytes != tb[k].bytes || memcmp(ta[k].data, tb[k].data, ta[k].bytes)) {
            const unsigned char *x = ta[k].data, *y = tb[k].data;
            size_t i = 0;
            while (i < ta[k].bytes && x[i] == y[i]) i++;
            printf("%s: %s differs, first at byte %zu\n", what, ta[k].name, i);
            ok = 0;
        }
    }
    size_t n = mt_optim_state_numel(a);
    size_t usz = mt_dtype_size(mt_optim_state_upload_dtype(a));
    if (ok && (mt_optim_state_upload_dtype(b) != mt_optim_state_upload_dtype(a) ||
               memcmp(mt_optim_state_upload(a), mt_optim_state_upload(b), n * usz))) {
        printf("%s: upload differs\n", what);
        ok = 0;
    }
    return ok;
}

static void test_isa_threads_bitwise(void **state) {
    (void)state;
    const size_t sizes[] = {1, 15, 256, 257, 4099, N_THREADED};
    mt_adamw_isa saved = mt_adamw_isa_active();
    int checked = 0;
    for (int fi = 0; fi < 2; fi++)
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
            for (int bg = 0; bg < 2; bg++) {
                mt_state_format f = fi ? MT_STATE_TIGHT : MT_STATE_COMPACT;
                size_t n = sizes[si];
                int big = n == N_THREADED, steps = big ? NSTEPS_BIG : 6;
                assert_int_equal(mt_adamw_set_isa(MT_ADAMW_SCALAR), MT_OK);
                mt_optim_state *ref = run_steps_v(f, n, steps, bg, 1, 1);
                for (int isa = MT_ADAMW_SCALAR; isa <= MT_ADAMW_AVX512; isa++) {
                    if (!mt_adamw_isa_supported((mt_adamw_isa)isa)) continue;
                    assert_int_equal(mt_adamw_set_isa((mt_adamw_isa)isa), MT_OK);
                    const int thr[] = {1, 2, 3};
                    for (int ti = 0; ti < (big ? 3 : 1); ti++) {
                        if (isa == MT_ADAMW_SCALAR && thr[ti] == 1) continue;
                        char what[128];
                        snprintf(what, sizeof what, "%s n=%zu %s grad %s thr=%d",
                                 mt_state_format_name(f), n, bg ? "bf16" : "f32",
                                 mt_adamw_isa_name((mt_adamw_isa)isa), thr[ti]);
                        mt_optim_state *o = run_steps_v(f, n, steps, bg, thr[ti], 1);
                        assert_true(states_equal(what, o, ref));
                        mt_optim_state_free(o);
                        checked++;
                    }
                }
                mt_optim_state_free(ref);
            }
    printf("%d runs (formats x sizes x grad types x ISA x threads) bitwise equal to scalar on "
           "1 thread; paths here:", checked);
    for (int isa = MT_ADAMW_SCALAR; isa <= MT_ADAMW_AVX512; isa++)
        if (mt_adamw_isa_supported((mt_adamw_isa)isa)) printf(" %s", mt_adamw_isa_name((mt_adamw_isa)isa));
    printf("\n");
    assert_true(checked > 0);
    assert_int_equal(mt_adamw_set_isa(saved), MT_OK);
}

/* ---- (c2) pinned outputs: the kernels' results for a fixed input never change ---- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* FNV-1a of every tensor and the upload after run_steps(f, 4099, 6 steps, bf16 and f32 grads);
 * the values the scalar and AVX2 kernels gave at 8467e7b, before the AVX2 kernel was made
 * faster, tight's since its new random bits (a change of the definition, or of a path, shows up
 * here even if all paths agree). */
static void test_pinned_outputs(void **state) {
    (void)state;
    const uint64_t want[2][2] = {{PIN_COMPACT_F32, PIN_COMPACT_BF16},
                                 {PIN_TIGHT_F32, PIN_TIGHT_BF16}};
    mt_adamw_isa saved = mt_adamw_isa_active();
    int bad = 0, checked = 0;
    for (int isa = MT_ADAMW_SCALAR; isa <= MT_ADAMW_AVX512; isa++) {
        if (!mt_adamw_isa_supported((mt_adamw_isa)isa)) continue;
        assert_int_equal(mt_adamw_set_isa((mt_adamw_isa)isa), MT_OK);
        for (int fi = 0; fi < 2; fi++)
            for (int bg = 0; bg < 2; bg++) {
                mt_optim_state *s = run_steps(fi ? MT_STATE_TIGHT : MT_STATE_COMPACT, 4099, 6, bg, 1);
                mt_optim_tensor t[MT_OPTIM_MAX_TENSORS];
                int nt = mt_optim_state_tensors(s, t);
                uint64_t h = 0xcbf29ce484222325ull;
                for (int k = 0; k < nt; k++) h = fnv1a(h, t[k].data, t[k].bytes);
                h = fnv1a(h, mt_optim_state_upload(s), 4099 * 2);
                printf("%s %s grad %s: %016llx\n", fi ? "tight" : "compact", bg ? "bf16" : "f32",
                       mt_adamw_isa_name((mt_adamw_isa)isa), (unsigned long long)h);
                bad += h != want[fi][bg];
                checked++;
                mt_optim_state_free(s);
            }
    }
    assert_int_equal(mt_adamw_set_isa(saved), MT_OK);
    assert_int_equal(bad, 0);
    assert_true(checked >= 8);
}

/* ---- (d) checkpoint tensors: save, restore into a fresh state, resume bit-exact ---- */

static void test_save_restore(void **state) {
    (void)state;
    const size_t n = 3000;
    for (int fi = 0; fi <= 2; fi++) {
        mt_state_format f = (mt_state_format)fi;
        mt_test_rng r;
        mt_test_rng_seed(&r, 31);
        float *w = malloc(n * 4), *g = malloc(n * 4);
        mt_test_fill_normal(&r, w, n, 0.5f);
        mt_optim_state *a = mt_optim_state_create(f, n, 777, NULL);
        mt_optim_state_set_weights(a, 0, w, n);
        int step = 1;
        for (; step <= 4; step++) {
            mt_test_fill_grad(&r, g, n);
            mt_optim_step sa = step_args(0.1, step, 0.9f);
            assert_int_equal(mt_optim_state_update(a, &sa, 0, n, g, MT_F32, 1), MT_OK);
        }
        /* save: copy every listed tensor's bytes */
        mt_optim_tensor ta[MT_OPTIM_MAX_TENSORS], tb[MT_OPTIM_MAX_TENSORS];
        int na = mt_optim_state_tensors(a, ta);
        size_t listed = 0;
        void *saved[MT_OPTIM_MAX_TENSORS];
        for (int k = 0; k < na; k++) {
            assert_int_equal(ta[k].bytes, ta[k].numel * mt_dtype_size(ta[k].dtype));
            saved[k] = malloc(ta[k].bytes);
            memcpy(saved[k], ta[k].data, ta[k].bytes);
            listed += ta[k].bytes;
        }
        /* everything but full's upload copy (bf16(master)) and tight's 8-byte seed is listed */
        size_t want = mt_optim_state_bytes(f, n) - (f == MT_STATE_FULL ? 2 * n : 0) +
                      (f == MT_STATE_TIGHT ? 8 : 0);
        assert_int_equal(listed, want);
        /* restore into a fresh state with another seed */
        mt_optim_state *b = mt_optim_state_create(f, n, 1, NULL);
        int nb = mt_optim_state_tensors(b, tb);
        assert_int_equal(na, nb);
        for (int k = 0; k < nb; k++) {
            assert_string_equal(ta[k].name, tb[k].name);
            assert_int_equal(ta[k].dtype, tb[k].dtype);
            assert_int_equal(ta[k].bytes, tb[k].bytes);
            memcpy(tb[k].data, saved[k], tb[k].bytes);
        }
        if (f == MT_STATE_FULL) { /* the upload copy is rebuilt from the master */
            float *mw = malloc(n * 4);
            mt_optim_state_get_weights(b, 0, mw, n);
            mt_optim_state_set_weights(b, 0, mw, n);
            free(mw);
        }
        /* resume both: identical bits after 3 more steps */
        for (; step <= 7; step++) {
            mt_test_fill_grad(&r, g, n);
            mt_optim_step sa = step_args(0.1, step, 0.9f);
            assert_int_equal(mt_optim_state_update(a, &sa, 0, n, g, MT_F32, 1), MT_OK);
            assert_int_equal(mt_optim_state_update(b, &sa, 0, n, g, MT_F32, 2), MT_OK);
        }
        char what[64];
        snprintf(what, sizeof what, "%s resumed", mt_state_format_name(f));
        assert_true(states_equal(what, a, b));
        printf("%s: %d tensors (%zu bytes) restored; 3 more steps bitwise equal\n",
               mt_state_format_name(f), na, listed);
        for (int k = 0; k < na; k++) free(saved[k]);
        mt_optim_state_free(a);
        mt_optim_state_free(b);
        free(w); free(g);
    }
}

/* ---- (e) the arenas: their update is the state's, a tensor's parts restore it ---- */

static void test_arenas_update(void **state) {
    (void)state;
    const size_t n = 4099;
    for (int fi = 0; fi <= 2; fi++) {
        mt_state_format f = (mt_state_format)fi;
        mt_optim_state *a = mt_optim_state_create(f, n, 55, NULL);
        mt_optim_state *b = mt_optim_state_create(f, n, 55, NULL);
        mt_optim_state_set_index_base(a, 77 * 256);
        mt_optim_state_set_index_base(b, 77 * 256);
        mt_optim_arenas ar = mt_optim_state_arenas(b);
        assert_int_equal(ar.f, f);
        assert_int_equal(ar.n, n);
        assert_int_equal(ar.nblocks, (n + 255) / 256);
        assert_int_equal(ar.seed, 55);
        assert_int_equal(ar.index_base, 77 * 256);
        assert_ptr_equal(ar.w, mt_optim_state_upload(b));
        assert_int_equal(ar.w_dtype, MT_BF16);
        assert_true((ar.master != NULL) == (f == MT_STATE_FULL));
        assert_true((ar.comp != NULL) == (f == MT_STATE_COMPACT));
        assert_true((ar.mq != NULL) == (f != MT_STATE_FULL));
        mt_test_rng r;
        mt_test_rng_seed(&r, 3);
        float *w = malloc(n * 4), *g = malloc(n * 4);
        mt_test_fill_normal(&r, w, n, 0.5f);
        mt_optim_state_set_weights(a, 0, w, n);
        mt_optim_state_set_weights(b, 0, w, n);
        for (int step = 1; step <= 3; step++) {
            mt_test_fill_grad(&r, g, n);
            mt_optim_step s1 = step_args(0.1, step, 0.6f), s2 = s1;
            s2.weight_decay = 0;
            assert_int_equal(mt_optim_state_update(a, &s1, 0, 1024, g, MT_F32, 1), MT_OK);
            assert_int_equal(mt_optim_state_update(a, &s2, 1024, n - 1024, g + 1024, MT_F32, 1),
                             MT_OK);
            assert_int_equal(mt_optim_arenas_update(&ar, &s1, 0, 1024, g, MT_F32, 2), MT_OK);
            assert_int_equal(mt_optim_arenas_update(&ar, &s2, 1024, n - 1024, g + 1024, MT_F32, 2),
                             MT_OK);
        }
        assert_true(states_equal("arenas_update vs state_update", a, b));
        /* the same checks: an arena missing, a bad offset */
        mt_optim_arenas bad = ar;
        bad.v = NULL;
        bad.vq = NULL;
        mt_optim_step s1 = step_args(0.0, 4, 1.0f);
        assert_int_equal(mt_optim_arenas_update(&bad, &s1, 0, 256, g, MT_F32, 1), MT_ERR);
        assert_non_null(strstr(mt_error_message(), "arenas lack"));
        if (f != MT_STATE_FULL) {
            assert_int_equal(mt_optim_arenas_update(&ar, &s1, 128, 256, g, MT_F32, 1), MT_ERR);
            assert_non_null(strstr(mt_error_message(), "multiples of 256"));
        }
        mt_optim_state_free(a);
        mt_optim_state_free(b);
        free(w); free(g);
    }
}

/* Tensors at 256-element boundaries, as the engine lays them out: padding between them. */
static const size_t part_off[] = {0, 768, 1024, 1280}, part_len[] = {700, 256, 1, 1500};
#define N_PARTS 4
#define PARTS_N (1280 + 1500)

static void parts_grad(mt_test_rng *r, float *g) {
    mt_test_fill_grad(r, g, PARTS_N);
    for (size_t i = 0; i < PARTS_N; i++) { /* padding: weights and gradients 0, as the engine's */
        int in = 0;
        for (int t = 0; t < N_PARTS; t++) in |= i >= part_off[t] && i < part_off[t] + part_len[t];
        if (!in) g[i] = 0;
    }
}

static void parts_steps(mt_optim_state *a, mt_optim_state *b, mt_test_rng *r, float *g, int from,
                        int to) {
    for (int step = from; step <= to; step++) {
        parts_grad(r, g);
        mt_optim_step s1 = step_args(0.1, step, 0.7f);
        assert_int_equal(mt_optim_state_update(a, &s1, 0, PARTS_N, g, MT_F32, 1), MT_OK);
        if (b) assert_int_equal(mt_optim_state_update(b, &s1, 0, PARTS_N, g, MT_F32, 2), MT_OK);
    }
}

static void test_parts_restore(void **state) {
    (void)state;
    for (int fi = 0; fi <= 2; fi++) {
        mt_state_format f = (mt_state_format)fi;
        mt_test_rng r;
        mt_test_rng_seed(&r, 41);
        float *w = calloc(PARTS_N, 4), *g = malloc(PARTS_N * 4);
        for (int t = 0; t < N_PARTS; t++) mt_test_fill_normal(&r, w + part_off[t], part_len[t], 0.5f);
        mt_optim_state *a = mt_optim_state_create(f, PARTS_N, 909, NULL);
        mt_optim_state_set_weights(a, 0, w, PARTS_N);
        parts_steps(a, NULL, &r, g, 1, 4);
        /* save each tensor: its fp32 weights and its parts */
        mt_optim_arenas ar = mt_optim_state_arenas(a);
        float *saved_w[N_PARTS];
        void *saved[N_PARTS][MT_OPTIM_MAX_TENSORS];
        int np = 0;
        for (int t = 0; t < N_PARTS; t++) {
            mt_optim_tensor p[MT_OPTIM_MAX_TENSORS], lay[MT_OPTIM_MAX_TENSORS];
            np = mt_optim_arenas_parts(&ar, part_off[t], part_len[t], p);
            assert_int_equal(np, f == MT_STATE_FULL ? 2 : 4);
            assert_int_equal(mt_optim_parts_layout(f, part_len[t], lay), np);
            for (int k = 0; k < np; k++) {
                assert_string_equal(p[k].name, lay[k].name);
                assert_int_equal(p[k].dtype, lay[k].dtype);
                assert_int_equal(p[k].bytes, lay[k].bytes);
                assert_null(lay[k].data);
                saved[t][k] = malloc(p[k].bytes);
                memcpy(saved[t][k], p[k].data, p[k].bytes);
            }
            saved_w[t] = malloc(part_len[t] * 4);
            mt_optim_state_get_weights(a, part_off[t], saved_w[t], part_len[t]);
        }
        /* restore into a fresh state (tight: the saved seed), tensor by tensor */
        mt_optim_state *b = mt_optim_state_create(f, PARTS_N, 909, NULL);
        mt_optim_arenas br = mt_optim_state_arenas(b);
        for (int t = 0; t < N_PARTS; t++) {
            mt_optim_tensor p[MT_OPTIM_MAX_TENSORS];
            assert_int_equal(mt_optim_arenas_parts(&br, part_off[t], part_len[t], p), np);
            for (int k = 0; k < np; k++) memcpy(p[k].data, saved[t][k], p[k].bytes);
            mt_optim_state_set_weights(b, part_off[t], saved_w[t], part_len[t]);
        }
        char what[64];
        snprintf(what, sizeof what, "%s restored from parts", mt_state_format_name(f));
        assert_true(states_equal(what, a, b));
        parts_steps(a, b, &r, g, 5, 8);
        snprintf(what, sizeof what, "%s restored from parts, 4 more steps", mt_state_format_name(f));
        assert_true(states_equal(what, a, b));
        printf("%s: %d tensors restored from %d parts each; 4 more steps bitwise equal\n",
               mt_state_format_name(f), N_PARTS, np);
        for (int t = 0; t < N_PARTS; t++) {
            for (int k = 0; k < np; k++) free(saved[t][k]);
            free(saved_w[t]);
        }
        mt_optim_state_free(a);
        mt_optim_state_free(b);
        free(w); free(g);
    }
}

static void test_parts_layout_and_errors(void **state) {
    (void)state;
    mt_optim_tensor p[MT_OPTIM_MAX_TENSORS];
    assert_int_equal(mt_optim_parts_layout(MT_STATE_FULL, 700, p), 2);
    assert_string_equal(p[0].name, "exp_avg");
    assert_string_equal(p[1].name, "exp_avg_sq");
    for (int k = 0; k < 2; k++) {
        assert_int_equal(p[k].dtype, MT_F32);
        assert_int_equal(p[k].numel, 700);
        assert_int_equal(p[k].bytes, 2800);
    }
    const char *names[] = {"exp_avg", "exp_avg_scale", "exp_avg_sq", "exp_avg_sq_scale"};
    for (int fi = MT_STATE_COMPACT; fi <= MT_STATE_TIGHT; fi++) {
        assert_int_equal(mt_optim_parts_layout((mt_state_format)fi, 700, p), 4);
        for (int k = 0; k < 4; k++) {
            assert_string_equal(p[k].name, names[k]);
            assert_int_equal(p[k].dtype, k % 2 ? MT_F32 : MT_U8);
            assert_int_equal(p[k].numel, k % 2 ? 3 : 700);
            assert_int_equal(p[k].bytes, k % 2 ? 12 : 700);
        }
        assert_int_equal(mt_optim_parts_layout((mt_state_format)fi, 512, p), 4);
        assert_int_equal(p[1].numel, 2);
        /* parts point into the arenas: the scales of block offset/256 */
        mt_optim_state *s = mt_optim_state_create((mt_state_format)fi, 2000, 0, NULL);
        mt_optim_arenas ar = mt_optim_state_arenas(s);
        assert_int_equal(mt_optim_arenas_parts(&ar, 512, 300, p), 4);
        assert_ptr_equal(p[0].data, ar.mq + 512);
        assert_ptr_equal(p[1].data, ar.ms + 2);
        assert_ptr_equal(p[2].data, ar.vq + 512);
        assert_ptr_equal(p[3].data, ar.vs + 2);
        assert_int_equal(mt_optim_arenas_parts(&ar, 100, 300, p), -1);
        assert_non_null(strstr(mt_error_message(), "multiples of 256"));
        assert_int_equal(mt_optim_arenas_parts(&ar, 1792, 300, p), -1);
        assert_non_null(strstr(mt_error_message(), "outside"));
        mt_optim_state_free(s);
    }
    mt_optim_state *s = mt_optim_state_create(MT_STATE_FULL, 2000, 0, NULL);
    mt_optim_arenas ar = mt_optim_state_arenas(s);
    assert_int_equal(mt_optim_arenas_parts(&ar, 100, 300, p), 2); /* full: any offset */
    assert_ptr_equal(p[0].data, ar.m + 100);
    assert_ptr_equal(p[1].data, ar.v + 100);
    assert_int_equal(mt_optim_arenas_parts(&ar, 1900, 101, p), -1);
    assert_non_null(strstr(mt_error_message(), "outside"));
    mt_optim_state_free(s);
}

/* compact and tight with an fp32 upload copy: fatal, naming it (their master is bf16) */
static void test_upload_dtype_f32_refused(void **state) {
    (void)state;
    for (int fi = MT_STATE_COMPACT; fi <= MT_STATE_TIGHT; fi++) {
        int fd[2];
        assert_int_equal(pipe(fd), 0);
        fflush(stdout);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            dup2(fd[1], 2);
            mt_optim_alloc al = {.upload_dtype = MT_F32};
            mt_optim_state_create((mt_state_format)fi, 256, 0, &al);
            _exit(0);
        }
        close(fd[1]);
        char buf[1024];
        size_t len = 0;
        for (ssize_t k; len < sizeof buf - 1 && (k = read(fd[0], buf + len, sizeof buf - 1 - len)) > 0;)
            len += (size_t)k;
        close(fd[0]);
        buf[len] = 0;
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        printf("%s", buf);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
        assert_non_null(strstr(buf, "upload_dtype F32"));
    }
}

/* ---- (f) bytes per parameter and errors ---- */

static void test_bytes_and_errors(void **state) {
    (void)state;
    assert_true(mt_optim_bytes_per_param(MT_STATE_FULL) == 14.0);
    assert_true(mt_optim_bytes_per_param(MT_STATE_COMPACT) == 6.03125);
    assert_true(mt_optim_bytes_per_param(MT_STATE_TIGHT) == 4.03125);
    assert_int_equal(mt_optim_state_bytes(MT_STATE_COMPACT, 1000), 6000 + 2 * 4 * 4);
    assert_int_equal(mt_optim_state_bytes(MT_STATE_TIGHT, 1024), 4096 + 2 * 4 * 4);
    mt_state_format f;
    assert_int_equal(mt_state_format_parse("tight", &f), MT_OK);
    assert_int_equal(f, MT_STATE_TIGHT);
    assert_int_equal(mt_state_format_parse("medium", &f), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "'medium'"));

    const size_t n = 1024;
    float g[1024] = {0};
    mt_optim_state *s = mt_optim_state_create(MT_STATE_COMPACT, n, 0, NULL);
    mt_optim_step a = step_args(0.0, 1, 1.0f);
    assert_int_equal(mt_optim_state_update(s, &a, 100, 256, g, MT_F32, 1), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "multiples of 256"));
    assert_int_equal(mt_optim_state_update(s, &a, 768, 512, g, MT_F32, 1), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "outside"));
    assert_int_equal(mt_optim_state_update(s, &a, 0, 256, g, MT_F16, 1), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "F16"));
    assert_int_equal(mt_optim_state_update(s, &a, 0, 256, mt_optim_state_upload(s), MT_BF16, 1),
                     MT_ERR);
    assert_non_null(strstr(mt_error_message(), "overlaps the bf16 master"));
    a.step = 0;
    assert_int_equal(mt_optim_state_update(s, &a, 0, 256, g, MT_F32, 1), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "1-based"));
    mt_optim_state_free(s);
    s = mt_optim_state_create(MT_STATE_FULL, n, 0, NULL);
    a.step = 1;
    assert_int_equal(mt_optim_state_update(s, &a, 3, 5, g, MT_F32, 1), MT_OK); /* any offset */
    assert_int_equal(mt_optim_state_update(s, &a, 0, 8, mt_optim_state_upload(s), MT_F32, 1),
                     MT_ERR); /* fp32 gradient over the bf16 upload */
    assert_non_null(strstr(mt_error_message(), "overlaps the upload copy"));
    mt_optim_state_free(s);
}

/* ---- (f2) frozen: the upload copy alone ---- */

/* Bits of a float, and the float of bits. */
static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static void test_frozen(void **state) {
    (void)state;
    /* bytes: the upload dtype's size and nothing else; a bf16 upload when the dtype is not said */
    assert_string_equal(mt_state_format_name(MT_STATE_FROZEN), "frozen");
    assert_true(mt_optim_bytes_per_param(MT_STATE_FROZEN) == 2.0);
    assert_true(mt_optim_bytes_per_param_up(MT_STATE_FROZEN, MT_BF16) == 2.0);
    assert_true(mt_optim_bytes_per_param_up(MT_STATE_FROZEN, MT_F32) == 4.0);
    assert_int_equal(mt_optim_state_bytes(MT_STATE_FROZEN, 1000), 2000);
    assert_int_equal(mt_optim_state_bytes_up(MT_STATE_FROZEN, 1000, MT_F32), 4000);
    assert_int_equal(mt_optim_state_bytes_up(MT_STATE_FROZEN, 1000, MT_BF16), 2000);
    /* the others as before; full's fp32 upload copy is 2 B more */
    assert_true(mt_optim_bytes_per_param_up(MT_STATE_FULL, MT_F32) == 16.0);
    assert_true(mt_optim_bytes_per_param_up(MT_STATE_FULL, MT_BF16) == 14.0);
    assert_int_equal(mt_optim_state_bytes_up(MT_STATE_FULL, 1000, MT_F32), 16000);
    assert_int_equal(mt_optim_state_bytes_up(MT_STATE_TIGHT, 1024, MT_BF16), 4096 + 2 * 4 * 4);
    /* --state cannot choose it: the error still lists what it can */
    mt_state_format f = MT_STATE_TIGHT;
    assert_int_equal(mt_state_format_parse("frozen", &f), MT_ERR);
    assert_int_equal(f, MT_STATE_TIGHT);
    assert_non_null(strstr(mt_error_message(), "'frozen'"));
    assert_non_null(strstr(mt_error_message(), "full, compact or tight"));

    const size_t n = 4099;
    const mt_dtype ups[] = {MT_F32, MT_BF16};
    for (int u = 0; u < 2; u++) {
        mt_dtype up = ups[u];
        mt_optim_alloc al = {.upload_dtype = up};
        mt_optim_state *s = mt_optim_state_create(MT_STATE_FROZEN, n, 9, &al);
        assert_int_equal(mt_optim_state_format(s), MT_STATE_FROZEN);
        assert_int_equal(mt_optim_state_upload_dtype(s), up);
        mt_optim_arenas ar = mt_optim_state_arenas(s);
        assert_ptr_equal(ar.w, mt_optim_state_upload(s));
        assert_int_equal(ar.w_dtype, up);
        assert_null(ar.master); assert_null(ar.m); assert_null(ar.v); assert_null(ar.comp);
        assert_null(ar.mq); assert_null(ar.vq); assert_null(ar.ms); assert_null(ar.vs);
        /* set / get: fp32 exact on an F32 upload; bf16 rounds to nearest even (ties at the
         * front: 1 + 2^-8 is a tie that goes down to 1, 1 + 3 * 2^-8 one that goes up) */
        mt_test_rng r;
        mt_test_rng_seed(&r, 17);
        float *w = malloc(n * 4), *got = malloc(n * 4);
        mt_test_fill_normal(&r, w, n, 0.5f);
        w[0] = float_of(0x3f808000u);
        w[1] = float_of(0x3f818000u);
        w[2] = float_of(0xbf808000u);
        mt_optim_state_set_weights(s, 0, w, n);
        mt_optim_state_get_weights(s, 0, got, n);
        if (up == MT_F32) {
            assert_memory_equal(got, w, n * 4);
            assert_memory_equal(ar.w, w, n * 4);
        } else {
            const mt_bf16 *wh = ar.w;
            for (size_t i = 0; i < n; i++) {
                assert_int_equal(wh[i], mt_f32_to_bf16(w[i]));
                assert_int_equal(bits_of(got[i]), (uint32_t)wh[i] << 16);
                assert_true(fabsf(got[i] - w[i]) <= fabsf(w[i]) * 0x1p-8f);
            }
            assert_int_equal(wh[0], 0x3f80);
            assert_int_equal(wh[1], 0x3f82);
            assert_int_equal(wh[2], 0xbf80);
        }
        /* a range in the middle, at an offset off any 256 boundary */
        float part[50];
        for (int i = 0; i < 50; i++) part[i] = (float)i * 0.25f - 3.0f; /* exact in bf16 */
        mt_optim_state_set_weights(s, 1000, part, 50);
        mt_optim_state_get_weights(s, 1000, got, 50);
        assert_memory_equal(got, part, sizeof part);
        mt_optim_state_get_weights(s, 1050, got, 1);
        mt_optim_state_get_weights(s, 999, got + 1, 1);
        if (up == MT_F32) {
            assert_int_equal(bits_of(got[0]), bits_of(w[1050]));
            assert_int_equal(bits_of(got[1]), bits_of(w[999]));
        }
        /* the update is a no-op: the weights bit for bit, whatever the gradient (none too) */
        size_t wbytes = n * mt_dtype_size(up);
        unsigned char *before = malloc(wbytes);
        memcpy(before, ar.w, wbytes);
        float *g = malloc(n * 4);
        mt_test_fill_grad(&r, g, n);
        for (int step = 1; step <= 3; step++) {
            mt_optim_step sa = step_args(0.1, step, 0.7f);
            assert_int_equal(mt_optim_state_update(s, &sa, 0, n, g, MT_F32, 1), MT_OK);
            assert_int_equal(mt_optim_state_update(s, &sa, 100, 256, NULL, MT_BF16, 2), MT_OK);
            assert_int_equal(mt_optim_arenas_update(&ar, &sa, 0, n, g, MT_F32, 0), MT_OK);
        }
        assert_memory_equal(ar.w, before, wbytes);
        /* checkpoint tensors: the weights as uploaded; no optimizer parts, at any offset */
        mt_optim_tensor t[MT_OPTIM_MAX_TENSORS];
        assert_int_equal(mt_optim_state_tensors(s, t), 1);
        assert_string_equal(t[0].name, "weights");
        assert_int_equal(t[0].dtype, up);
        assert_int_equal(t[0].numel, n);
        assert_int_equal(t[0].bytes, mt_optim_state_bytes_up(MT_STATE_FROZEN, n, up));
        assert_ptr_equal(t[0].data, ar.w);
        assert_int_equal(mt_optim_parts_layout(MT_STATE_FROZEN, 700, t), 0);
        assert_int_equal(mt_optim_arenas_parts(&ar, 100, 300, t), 0);
        assert_int_equal(mt_optim_arenas_parts(&ar, n - 10, 11, t), -1);
        assert_non_null(strstr(mt_error_message(), "outside"));
        /* restoring the listed bytes into a fresh state reproduces it */
        mt_optim_state *b = mt_optim_state_create(MT_STATE_FROZEN, n, 1, &al);
        mt_optim_tensor tb[MT_OPTIM_MAX_TENSORS];
        assert_int_equal(mt_optim_state_tensors(b, tb), 1);
        memcpy(tb[0].data, t[0].data, t[0].bytes);
        float *gb = malloc(n * 4);
        mt_optim_state_get_weights(s, 0, got, n);
        mt_optim_state_get_weights(b, 0, gb, n);
        assert_memory_equal(got, gb, n * 4);
        printf("frozen, %s upload: %zu bytes, set/get %s, 9 updates left them bit for bit\n",
               mt_dtype_name(up), wbytes, up == MT_F32 ? "exact" : "rounded to nearest even");
        mt_optim_state_free(b);
        mt_optim_state_free(s);
        free(before); free(w); free(got); free(g); free(gb);
    }
}

/* ---- (g) megatrain bench adamw --state ---- */

static void test_bench_cli(void **state) {
    (void)state;
    const char *bin = getenv("MT_BIN");
    if (!bin) fail_msg("MT_BIN is not set (run through ctest)");
    char cmd[1024], out[4096];
    const char *states[] = {"compact", "tight", "full"};
    for (int k = 0; k < 3; k++) {
        snprintf(cmd, sizeof cmd, "%s bench adamw --state %s --params 5000 --threads 1 --reps 1 "
                 "--grad bf16", bin, states[k]);
        int rc = mt_test_run(cmd, out, sizeof out);
        printf("%s", out);
        assert_int_equal(rc, 0);
        assert_non_null(strstr(out, "Gparam/s"));
        assert_non_null(strstr(out, "GB/s"));
        if (k < 2) {
            char want[64];
            snprintf(want, sizeof want, "--state %s: 5000 params", states[k]);
            assert_non_null(strstr(out, want));
        }
    }
    snprintf(cmd, sizeof cmd, "%s bench adamw --state medium", bin);
    assert_int_equal(mt_test_run(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "megatrain: --state: 'medium' is not one of full|compact|tight"));
    snprintf(cmd, sizeof cmd, "%s bench adamw --state tight --grad bf16 --alias", bin);
    assert_int_equal(mt_test_run(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "--alias is for --state full"));
}

/* --pattern training: the engine's update calls for a model. qwen2_bias_tied (2 layers, q/k/v
 * biases, tied head) makes 22 calls in 4 groups: the embed; per layer the runs of same-decay
 * tensors [input norm] [q] [q bias] [k] [k bias] [v] [v bias] [o] [post norm] [gate up down],
 * 10; the head's final norm. */
static void test_bench_training_pattern(void **state) {
    (void)state;
    const char *bin = getenv("MT_BIN");
    if (!bin) fail_msg("MT_BIN is not set (run through ctest)");
    char *cfg = mt_fixture_path("qwen2_bias_tied/config.json");
    char cmd[2048], out[8192];
    const char *states[] = {"compact", "tight", "full"};
    for (int k = 0; k < 3; k++)
        for (int bg = 0; bg < 2; bg++) {
            snprintf(cmd, sizeof cmd, "%s bench adamw --pattern training --model %s --state %s "
                     "--threads 2 --reps 1 --grad %s", bin, cfg, states[k], bg ? "bf16" : "f32");
            int rc = mt_test_run(cmd, out, sizeof out);
            printf("%s", out);
            assert_int_equal(rc, 0);
            char want[128];
            snprintf(want, sizeof want, "--state %s, 2 threads, %s grad, gradients in host memory",
                     states[k], bg ? "bf16" : "f32");
            assert_non_null(strstr(out, want));
            assert_non_null(strstr(out, "4 groups, 22 update calls"));
            const char *tr = strstr(out, "  training ");
            assert_non_null(tr);
            assert_non_null(strstr(tr, "Gparam/s"));
            /* the one-call line of as many parameters comes first */
            assert_true(strstr(out, "GB/s") != NULL && strstr(out, "GB/s") < tr);
        }
    const struct {
        const char *args, *msg;
    } bad[] = {
        {"--pattern training", "--pattern training needs --model CONFIG.json"},
        {"--model CFG", "--model is for --pattern training"},
        {"--device cpu", "--device is for --pattern training"},
        {"--pattern training --model CFG --params 100", "takes its size from --model"},
        {"--pattern training --model /nonexistent/config.json",
         "--model: /nonexistent/config.json"},
        {"--pattern sideways", "--pattern: 'sideways' is not one of one|training"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char args[1024];
        const char *at = strstr(bad[i].args, "CFG");
        if (at) snprintf(args, sizeof args, "%.*s%s%s", (int)(at - bad[i].args), bad[i].args, cfg, at + 3);
        else snprintf(args, sizeof args, "%s", bad[i].args);
        snprintf(cmd, sizeof cmd, "%s bench adamw %s", bin, args);
        assert_int_equal(mt_test_run(cmd, out, sizeof out), 1);
        if (!strstr(out, bad[i].msg)) fail_msg("%s: got '%s', want '%s'", args, out, bad[i].msg);
    }
    free(cfg);
}

int main(void) {
    printf("optimizer ISA in use: %s\n", mt_adamw_isa_name(mt_adamw_isa_active()));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vs_fp64),
        cmocka_unit_test(test_full_is_adamw),
        cmocka_unit_test(test_full_alias),
        cmocka_unit_test(test_long_tiny_updates),
        cmocka_unit_test(test_isa_threads_bitwise),
        cmocka_unit_test(test_pinned_outputs),
        cmocka_unit_test(test_save_restore),
        cmocka_unit_test(test_arenas_update),
        cmocka_unit_test(test_parts_restore),
        cmocka_unit_test(test_parts_layout_and_errors),
        cmocka_unit_test(test_upload_dtype_f32_refused),
        cmocka_unit_test(test_bytes_and_errors),
        cmocka_unit_test(test_frozen),
        cmocka_unit_test(test_bench_cli),
        cmocka_unit_test(test_bench_training_pattern),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
