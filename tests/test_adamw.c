/* CPU AdamW (src/optim/adamw.h): against a double-precision reference of the formulas, against
 * real torch.optim.AdamW (tests/fixtures/adamw, make_adamw_fixture.py), every ISA path bitwise
 * equal to the plain C one, bf16 upload == mt_f32_to_bf16, grad/upload aliasing, thread count. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "optim/adamw.h"
#include "util/testutil.h"

#define NSTEPS 10
/* Under ThreadSanitizer every access is slow: the threaded runs take fewer steps there. */
#if defined(__SANITIZE_THREAD__)
#define NSTEPS_BIG 2
#else
#define NSTEPS_BIG 3
#endif
/* More than two of the update's 256K-element thread chunks, and odd. */
#define N_THREADED (2 * 262144 + 4099)

static mt_adamw_step_args args(double wd, int64_t step, float gs) {
    mt_adamw_step_args a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                            .weight_decay = wd, .step = step, .grad_scale = gs};
    return a;
}

static int bits_equal(const char *what, const void *a, const void *b, size_t bytes) {
    if (!memcmp(a, b, bytes)) return 1;
    const unsigned char *x = a, *y = b;
    size_t i = 0;
    while (x[i] == y[i]) i++;
    printf("%s: not bitwise equal, first difference at byte %zu\n", what, i);
    return 0;
}

static float *falloc(size_t n) { return mt_aligned_alloc((n ? n : 1) * sizeof(float)); }

/* ---- (a) against a double-precision reference of the formulas ---- */

static void ref_step(const mt_adamw_step_args *a, double *p, double *m, double *v, const float *g,
                     size_t n) {
    double bc1 = 1.0 - pow(a->beta1, (double)a->step), bc2 = 1.0 - pow(a->beta2, (double)a->step);
    for (size_t i = 0; i < n; i++) {
        double gd = (double)g[i] * a->grad_scale;
        p[i] *= 1.0 - a->lr * a->weight_decay;
        m[i] += (1.0 - a->beta1) * (gd - m[i]);
        v[i] = a->beta2 * v[i] + (1.0 - a->beta2) * gd * gd;
        p[i] -= a->lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + a->eps);
    }
}

static void check_vs_double(size_t n, double wd, float gs, int threads, int bf16_grad) {
    mt_test_rng r;
    mt_test_rng_seed(&r, 42 + n);
    float *p = falloc(n), *m = falloc(n), *v = falloc(n), *g = falloc(n), *tmp = falloc(n);
    mt_bf16 *gh = mt_aligned_alloc(n * 2);
    double *pd = malloc(n * 8), *md = calloc(n, 8), *vd = calloc(n, 8);
    mt_test_fill_normal(&r, p, n, 0.5f);
    memset(m, 0, n * 4);
    memset(v, 0, n * 4);
    for (size_t i = 0; i < n; i++) pd[i] = p[i];
    for (int s = 1; s <= NSTEPS; s++) {
        mt_adamw_step_args a = args(wd, s, s % 2 ? gs : 1.0f);
        mt_test_fill_grad(&r, g, n);
        if (bf16_grad) {
            for (size_t i = 0; i < n; i++) gh[i] = mt_f32_to_bf16(g[i]);
            for (size_t i = 0; i < n; i++) g[i] = mt_bf16_to_f32(gh[i]);
            mt_adamw_update_bf16(&a, p, m, v, gh, n, NULL, MT_F32, threads);
        } else {
            mt_adamw_update(&a, p, m, v, g, n, NULL, MT_F32, threads);
        }
        ref_step(&a, pd, md, vd, g, n);
    }
    char what[96];
    snprintf(what, sizeof what, "param n=%zu wd=%g gs=%g thr=%d bf16g=%d", n, wd, gs, threads,
             bf16_grad);
    for (size_t i = 0; i < n; i++) tmp[i] = (float)pd[i];
    /* fp32 state vs exact maths after 10 steps: rtol for ~10 roundings of p (each <= 0.5 ulp),
     * atol 1e-6 of the largest total movement (lr * steps) for the rounding inside the updates */
    assert_true(mt_allclose(what, p, tmp, n, 1e-6 * 1e-3 * NSTEPS, 1e-6));
    for (size_t i = 0; i < n; i++) tmp[i] = (float)md[i];
    assert_true(mt_check_rel("exp_avg (tensor-relative)", m, tmp, n, 1e-6));
    for (size_t i = 0; i < n; i++) tmp[i] = (float)vd[i];
    assert_true(mt_check_rel("exp_avg_sq (tensor-relative)", v, tmp, n, 1e-6));
    free(p); free(m); free(v); free(g); free(tmp); free(gh); free(pd); free(md); free(vd);
}

static void test_vs_double(void **state) {
    (void)state;
    check_vs_double(4099, 0.1, 0.37f, 1, 0);
    check_vs_double(4099, 0.0, 1.0f, 1, 0);
    check_vs_double(N_THREADED, 0.1, 0.0123f, 2, 0);
    check_vs_double(1037, 0.05, 0.5f, 1, 1);
    check_vs_double(17, 0.1, 2.0f, 1, 0);
}

/* ---- (b) every ISA, (d) aliasing, (f) thread counts: all bitwise equal to scalar, 1 thread ---- */

typedef struct {
    float *p, *m, *v, *up_f32;
    mt_bf16 *up_bf16;
    void *mem[5];
} run_out;

/* Steps from a fixed start; upload written each step; alias: grad buffer is the upload;
 * off: every buffer starts `off` elements past a 64-byte boundary (the streaming-store peel). */
static run_out run_steps(size_t n, int steps, double wd, int bf16_grad, mt_dtype up_t, int alias,
                         int threads, size_t off) {
    mt_test_rng r;
    mt_test_rng_seed(&r, 7 + n);
    run_out o;
    for (int k = 0; k < 5; k++) o.mem[k] = falloc(n + off);
    o.p = (float *)o.mem[0] + off;
    o.m = (float *)o.mem[1] + off;
    o.v = (float *)o.mem[2] + off;
    o.up_f32 = (float *)o.mem[3] + off;
    o.up_bf16 = (mt_bf16 *)o.mem[4] + off;
    float *g = falloc(n);
    mt_bf16 *gh = mt_aligned_alloc(n * 2);
    mt_test_fill_normal(&r, o.p, n, 0.5f);
    memset(o.m, 0, n * 4);
    memset(o.v, 0, n * 4);
    for (int s = 1; s <= steps; s++) {
        mt_adamw_step_args a = args(wd, s, 0.731f);
        mt_test_fill_grad(&r, g, n);
        void *up = up_t == MT_BF16 ? (void *)o.up_bf16 : (void *)o.up_f32;
        if (bf16_grad) {
            for (size_t i = 0; i < n; i++) gh[i] = mt_f32_to_bf16(g[i]);
            const mt_bf16 *src = gh;
            if (alias) { memcpy(o.up_bf16, gh, n * 2); src = o.up_bf16; }
            mt_adamw_update_bf16(&a, o.p, o.m, o.v, src, n, up, up_t, threads);
        } else {
            const float *src = g;
            if (alias) { memcpy(o.up_f32, g, n * 4); src = o.up_f32; }
            mt_adamw_update(&a, o.p, o.m, o.v, src, n, up, up_t, threads);
        }
    }
    free(g);
    free(gh);
    return o;
}

static void run_free(run_out *o) {
    for (int k = 0; k < 5; k++) free(o->mem[k]);
}

static int run_equal(const char *what, const run_out *a, const run_out *b, size_t n, mt_dtype up_t) {
    char w[160];
    int ok = 1;
    snprintf(w, sizeof w, "%s param", what); ok &= bits_equal(w, a->p, b->p, n * 4);
    snprintf(w, sizeof w, "%s exp_avg", what); ok &= bits_equal(w, a->m, b->m, n * 4);
    snprintf(w, sizeof w, "%s exp_avg_sq", what); ok &= bits_equal(w, a->v, b->v, n * 4);
    snprintf(w, sizeof w, "%s upload", what);
    if (up_t == MT_BF16) ok &= bits_equal(w, a->up_bf16, b->up_bf16, n * 2);
    else ok &= bits_equal(w, a->up_f32, b->up_f32, n * 4);
    return ok;
}

static void test_isa_alias_threads(void **state) {
    (void)state;
    const size_t sizes[] = {1, 15, 33, 4099, N_THREADED};
    mt_adamw_isa saved = mt_adamw_isa_active();
    int checked = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
        for (int bg = 0; bg < 2; bg++)
            for (int ub = 0; ub < 2; ub++) {
                size_t n = sizes[si];
                mt_dtype up_t = ub ? MT_BF16 : MT_F32;
                double wd = (si + bg) % 2 ? 0.1 : 0.0;
                /* the update splits over threads only from two chunks on */
                int big = n == N_THREADED, steps = big ? NSTEPS_BIG : NSTEPS;
                assert_int_equal(mt_adamw_set_isa(MT_ADAMW_SCALAR), MT_OK);
                run_out ref = run_steps(n, steps, wd, bg, up_t, 0, 1, 0);
                for (int isa = MT_ADAMW_SCALAR; isa <= MT_ADAMW_AVX512; isa++) {
                    if (!mt_adamw_isa_supported((mt_adamw_isa)isa)) continue;
                    assert_int_equal(mt_adamw_set_isa((mt_adamw_isa)isa), MT_OK);
                    const int thr[] = {1, 2, 3};
                    for (int ti = 0; ti < (big ? 3 : 1); ti++)
                        for (int alias = 0; alias < 2; alias++) {
                            if (alias && (bg != ub)) continue; /* aliasing needs one element type */
                            char what[128];
                            size_t off = (size_t)(ti + alias + isa) % 2 ? 3 : 0;
                            snprintf(what, sizeof what,
                                     "n=%zu %s grad %s upload %s thr=%d alias=%d off=%zu", n,
                                     bg ? "bf16" : "f32", ub ? "bf16" : "f32",
                                     mt_adamw_isa_name((mt_adamw_isa)isa), thr[ti], alias, off);
                            run_out o = run_steps(n, steps, wd, bg, up_t, alias, thr[ti], off);
                            assert_true(run_equal(what, &o, &ref, n, up_t));
                            run_free(&o);
                            checked++;
                        }
                }
                run_free(&ref);
            }
    printf("%d runs (sizes x grad/upload types x ISA x 1-3 threads x aliasing x alignment) "
           "bitwise equal to scalar on 1 thread\n", checked);
    assert_int_equal(mt_adamw_set_isa(saved), MT_OK);
}

/* ---- (e) bf16 upload == mt_f32_to_bf16(param): ties, denormals, overflow, inf, NaN ---- */

static void test_bf16_upload_exact(void **state) {
    (void)state;
    const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x3f807fffu, 0x00008000u,
                                0x00018000u, 0x80008000u, 0x007fffffu, 0x7f7fffffu, 0xff7f8000u,
                                0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu,
                                0x00000000u, 0x80000000u, 0x3effff80u};
    const size_t n = 1000;
    float *p = falloc(n), *m = falloc(n), *v = falloc(n), *g = falloc(n);
    mt_bf16 *up = mt_aligned_alloc(n * 2), *gh = mt_aligned_alloc(n * 2);
    mt_test_rng r;
    mt_test_rng_seed(&r, 99);
    mt_adamw_isa saved = mt_adamw_isa_active();
    /* lr = 0, zero grads and moments: param stays as it is, so upload must be bf16(param). */
    mt_adamw_step_args a = {.lr = 0.0, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                            .weight_decay = 0.0, .step = 1, .grad_scale = 1.0f};
    for (int isa = MT_ADAMW_SCALAR; isa <= MT_ADAMW_AVX512; isa++) {
        if (!mt_adamw_isa_supported((mt_adamw_isa)isa)) continue;
        assert_int_equal(mt_adamw_set_isa((mt_adamw_isa)isa), MT_OK);
        for (int bg = 0; bg < 2; bg++) {
            for (size_t i = 0; i < n; i++) {
                uint32_t u = (uint32_t)mt_test_rng_u64(&r);
                if (i % 3 == 0) u = special[(i / 3) % (sizeof special / sizeof *special)];
                else if (i % 3 == 1) u = (u & 0xffff0000u) | 0x8000u; /* exact ties */
                memcpy(&p[i], &u, 4);
            }
            memset(m, 0, n * 4); memset(v, 0, n * 4); memset(g, 0, n * 4); memset(gh, 0, n * 2);
            float *p0 = falloc(n);
            memcpy(p0, p, n * 4);
            if (bg) mt_adamw_update_bf16(&a, p, m, v, gh, n, up, MT_BF16, 1);
            else mt_adamw_update(&a, p, m, v, g, n, up, MT_BF16, 1);
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                mt_bf16 want = mt_f32_to_bf16(p[i]);
                /* param unchanged (lr = 0), except that arithmetic quiets a signalling NaN */
                int same = !memcmp(&p[i], &p0[i], 4) || (isnan(p[i]) && isnan(p0[i]));
                if (up[i] != want || !same) {
                    if (bad++ < 5)
                        printf("%s: element %zu param %08x -> upload %04x, want %04x\n",
                               mt_adamw_isa_name((mt_adamw_isa)isa), i,
                               *(uint32_t *)&p0[i], up[i], want);
                }
            }
            assert_int_equal(bad, 0);
            free(p0);
        }
    }
    /* A NaN or inf gradient makes the param NaN, and its upload a NaN, on every path. */
    for (int isa = MT_ADAMW_SCALAR; isa <= MT_ADAMW_AVX512; isa++) {
        if (!mt_adamw_isa_supported((mt_adamw_isa)isa)) continue;
        assert_int_equal(mt_adamw_set_isa((mt_adamw_isa)isa), MT_OK);
        mt_test_fill_normal(&r, p, n, 1.0f);
        mt_test_fill_normal(&r, g, n, 1.0f);
        memset(m, 0, n * 4); memset(v, 0, n * 4);
        g[5] = NAN; g[20] = INFINITY; g[n - 1] = -INFINITY;
        mt_adamw_step_args b = args(0.1, 1, 1.0f);
        mt_adamw_update(&b, p, m, v, g, n, up, MT_BF16, 1);
        const size_t idx[] = {5, 20, n - 1};
        for (int k = 0; k < 3; k++) {
            assert_true(isnan(p[idx[k]]));
            assert_true(isnan(mt_bf16_to_f32(up[idx[k]])));
        }
        assert_false(isnan(p[6]));
    }
    assert_int_equal(mt_adamw_set_isa(saved), MT_OK);
    free(p); free(m); free(v); free(g); free(up); free(gh);
}

/* ---- (c) against torch.optim.AdamW + clip_grad_norm_ ---- */

typedef struct {
    int32_t n, pad;
    double lr, beta1, beta2, eps, wd;
} fx_tensor;

static void read_exact(FILE *f, void *dst, size_t bytes) {
    assert_int_equal(fread(dst, 1, bytes, f), bytes);
}

static void test_vs_torch(void **state) {
    (void)state;
    char *path = mt_fixture_path("adamw/adamw_ref.bin");
    FILE *f = fopen(path, "rb");
    if (!f) printf("cannot open %s (regenerate: make_adamw_fixture.py)\n", path);
    assert_non_null(f);
    char magic[8];
    int32_t T, S;
    double max_norm;
    read_exact(f, magic, 8);
    assert_memory_equal(magic, "MTAWFX01", 8);
    read_exact(f, &T, 4); read_exact(f, &S, 4); read_exact(f, &max_norm, 8);
    assert_true(T > 0 && T <= 16 && S > 0 && S <= 100);
    fx_tensor tens[16];
    size_t N = 0;
    for (int t = 0; t < T; t++) {
        read_exact(f, &tens[t], sizeof(fx_tensor));
        assert_true(tens[t].n > 0 && tens[t].n <= 1 << 20);
        N += (size_t)tens[t].n;
    }
    float *p = falloc(N), *m = falloc(N), *v = falloc(N), *g = falloc(N), *want = falloc(N);
    float *gcopy = falloc(N);
    mt_bf16 *up = mt_aligned_alloc(N * 2);
    read_exact(f, p, N * 4);
    memset(m, 0, N * 4);
    memset(v, 0, N * 4);
    size_t same_bits = 0, total = 0;
    for (int s = 1; s <= S; s++) {
        float norm, coef;
        read_exact(f, g, N * 4);
        read_exact(f, &norm, 4);
        read_exact(f, &coef, 4);
        read_exact(f, want, N * 4);
        float mine = mt_adamw_clip_coef(norm, max_norm);
        if (memcmp(&mine, &coef, 4))
            printf("step %d: clip coef %.9g, torch %.9g (norm %.9g)\n", s, mine, coef, norm);
        assert_memory_equal(&mine, &coef, 4);
        size_t off = 0;
        for (int t = 0; t < T; t++) {
            mt_adamw_step_args a = {.lr = tens[t].lr, .beta1 = tens[t].beta1,
                                    .beta2 = tens[t].beta2, .eps = tens[t].eps,
                                    .weight_decay = tens[t].wd, .step = s, .grad_scale = coef};
            /* the engine's layout: the gradient buffer receives the upload copy */
            size_t n = (size_t)tens[t].n;
            memcpy(gcopy + off, g + off, n * 4);
            mt_adamw_update(&a, p + off, m + off, v + off, gcopy + off, n, gcopy + off, MT_F32, 0);
            off += n;
        }
        for (size_t i = 0; i < N; i++) same_bits += !memcmp(&p[i], &want[i], 4);
        total += N;
        assert_true(bits_equal("upload == param", gcopy, p, N * 4));
        /* torch's sqrt is MKL's (not correctly rounded): a few params 1-2 ulp apart */
        char what[64];
        snprintf(what, sizeof what, "torch step %d param", s);
        assert_true(mt_allclose(what, p, want, N, 1e-8, 1e-6));
    }
    read_exact(f, want, N * 4);
    assert_true(mt_check_rel("torch exp_avg", m, want, N, 1e-6));
    read_exact(f, want, N * 4);
    assert_true(mt_check_rel("torch exp_avg_sq", v, want, N, 1e-6));
    printf("params bitwise equal to torch (MKL sqrt): %zu of %zu (%.2f%%)\n", same_bits, total,
           100.0 * same_bits / total);
    /* torch with a correctly rounded sqrt: every other op is torch's kernel; bitwise equal */
    read_exact(f, want, N * 4);
    assert_true(bits_equal("param vs torch (true sqrt)", p, want, N * 4));
    read_exact(f, want, N * 4);
    assert_true(bits_equal("exp_avg vs torch (true sqrt)", m, want, N * 4));
    read_exact(f, want, N * 4);
    assert_true(bits_equal("exp_avg_sq vs torch (true sqrt)", v, want, N * 4));
    printf("param, exp_avg, exp_avg_sq after %d steps bitwise equal to torch with a true sqrt\n", S);
    char extra;
    assert_int_equal(fread(&extra, 1, 1, f), 0); /* the whole file was read */
    fclose(f);
    free(path); free(p); free(m); free(v); free(g); free(want); free(gcopy); free(up);
}

int main(void) {
    printf("AdamW ISA in use: %s\n", mt_adamw_isa_name(mt_adamw_isa_active()));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vs_double),
        cmocka_unit_test(test_isa_alias_threads),
        cmocka_unit_test(test_bf16_upload_exact),
        cmocka_unit_test(test_vs_torch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
