/* The CUDA backend's optim_update against the host's mt_optim_arenas_update, byte for byte, for
 * every format and gradient dtype, and its from_bf16. Exits 77 (ctest: skipped) when no CUDA
 * device is usable.
 *
 * Each case makes a host state of n parameters (random weights, then a few host steps so the
 * moments and scales are not trivial), copies every arena to the device, and runs N_STEPS steps
 * with the same gradients on both, over groups that start at a nonzero offset, end in a partial
 * block and leave some elements out (which must stay untouched on both). Gradients mix
 * magnitudes (some 1e3x, some tiny enough that v goes subnormal, some zero, one block all zero:
 * the zero-scale path). Then every arena is downloaded and compared with memcmp; the first
 * differing element is printed. Cases also check the steps changed the arenas (not vacuous). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "optim/state.h"
#include "util/testutil.h"

#define N_WARMUP 3 /* host steps before the copy to the device */
#define N_STEPS 5  /* steps on both */
#define MAX_GROUPS 3
#define MAX_ARENAS 10

static mt_backend *gpu;

typedef struct {
    size_t offset, n;
} group;

typedef struct {
    const char *what;
    mt_state_format f;
    mt_dtype grad_dtype;
    size_t n;
    group groups[MAX_GROUPS];
    int ngroups;
    uint64_t index_base;
    double beta1, weight_decay;
    float grad_scale;
    size_t zero_block; /* a block of 256 whose gradient is always 0 (SIZE_MAX: none) */
    int alias;         /* full, bf16: the gradient sits in the upload copy's own range */
} opt_case;

/* One arena of a state: its name, the field of mt_optim_arenas, its elements and their size. */
typedef struct {
    const char *name;
    void **ptr;
    size_t count, esize, bytes;
} arena;

static arena arena_of(const char *name, void **ptr, size_t count, size_t esize) {
    arena a = {name, ptr, count, esize, count * esize};
    return a;
}

static int arena_list(mt_optim_arenas *a, arena *out) {
    int k = 0;
    size_t n = a->n, nb = a->nblocks;
    if (a->master) out[k++] = arena_of("master", (void **)&a->master, n, 4);
    if (a->m) out[k++] = arena_of("exp_avg f32", (void **)&a->m, n, 4);
    if (a->v) out[k++] = arena_of("exp_avg_sq f32", (void **)&a->v, n, 4);
    if (a->w) out[k++] = arena_of("w", (void **)&a->w, n, mt_dtype_size(a->w_dtype));
    if (a->comp) out[k++] = arena_of("master_comp", (void **)&a->comp, n, 2);
    if (a->mq) out[k++] = arena_of("exp_avg u8", (void **)&a->mq, n, 1);
    if (a->vq) out[k++] = arena_of("exp_avg_sq u8", (void **)&a->vq, n, 1);
    if (a->ms) out[k++] = arena_of("exp_avg_scale", (void **)&a->ms, nb, 4);
    if (a->vs) out[k++] = arena_of("exp_avg_sq_scale", (void **)&a->vs, nb, 4);
    return k;
}

/* Compares one arena; on a difference prints the count and the first differing element. */
static int arena_equal(const char *what, const arena *ar, const void *got, const void *want) {
    const unsigned char *x = got, *y = want;
    size_t diff = 0, first = 0;
    for (size_t i = 0; i < ar->count; i++)
        if (memcmp(x + i * ar->esize, y + i * ar->esize, ar->esize) != 0 && diff++ == 0) first = i;
    if (!diff) {
        printf("%s: %-16s %9zu bytes equal\n", what, ar->name, ar->bytes);
        return 1;
    }
    uint32_t gv = 0, hv = 0;
    memcpy(&gv, x + first * ar->esize, ar->esize);
    memcpy(&hv, y + first * ar->esize, ar->esize);
    fprintf(stderr, "%s: %s differs in %zu of %zu elements; the first, %zu: gpu 0x%x, host 0x%x\n",
            what, ar->name, diff, ar->count, first, gv, hv);
    return 0;
}

/* Gradients with mixed magnitudes, as tests/test_optim_state.c's; the zero block stays zero. */
static void fill_grad(mt_test_rng *r, float *g, size_t n, size_t offset, size_t zero_block) {
    mt_test_fill_normal(r, g, n, 0.02f);
    for (size_t i = 0; i < n; i++) {
        size_t k = offset + i;
        if (k % 7 == 0) g[i] *= 1e3f;
        else if (k % 11 == 3) g[i] *= 1e-20f;
        else if (k % 13 == 5) g[i] = 0.0f;
        if (k / 256 == zero_block) g[i] = 0.0f;
    }
}

/* The gradient of one group in grad_dtype: host bytes (the caller frees). */
static void *make_grad(mt_test_rng *r, const opt_case *c, const group *gr) {
    float *g = malloc(gr->n * sizeof(float));
    fill_grad(r, g, gr->n, gr->offset, c->zero_block);
    if (c->grad_dtype == MT_F32) return g;
    mt_bf16 *h = malloc(gr->n * sizeof(mt_bf16));
    for (size_t i = 0; i < gr->n; i++) h[i] = mt_f32_to_bf16(g[i]);
    free(g);
    return h;
}

static mt_optim_step step_args(const opt_case *c, int64_t step) {
    mt_optim_step a = {.lr = 1e-3, .beta1 = c->beta1, .beta2 = 0.95, .eps = 1e-8,
                       .weight_decay = c->weight_decay, .step = step,
                       .grad_scale = c->grad_scale};
    return a;
}

static int run_case(const opt_case *c) {
    mt_test_rng r;
    mt_test_rng_seed(&r, 1234 + c->n + (uint64_t)c->f * 7 + (uint64_t)c->grad_dtype);
    mt_optim_state *s = mt_optim_state_create(c->f, c->n, 0x5eed0000ull + c->n, NULL);
    mt_optim_state_set_index_base(s, c->index_base);
    float *w0 = malloc(c->n * sizeof(float));
    mt_test_fill_normal(&r, w0, c->n, 0.05f);
    mt_optim_state_set_weights(s, 0, w0, c->n);
    free(w0);

    /* warm-up on the host over the whole state */
    int64_t step = 1;
    group all = {0, c->n};
    for (; step <= N_WARMUP; step++) {
        void *g = make_grad(&r, c, &all);
        mt_optim_step a = step_args(c, step);
        assert_int_equal(mt_optim_state_update(s, &a, 0, c->n, g, c->grad_dtype, 0), MT_OK);
        free(g);
    }

    /* the device copy: the same arenas, device pointers */
    mt_optim_arenas h = mt_optim_state_arenas(s), d = h;
    arena ha[MAX_ARENAS], da[MAX_ARENAS];
    int na = arena_list(&h, ha);
    assert_int_equal(arena_list(&d, da), na);
    void *before[MAX_ARENAS];
    for (int k = 0; k < na; k++) {
        *da[k].ptr = gpu->alloc(gpu, da[k].bytes);
        gpu->upload(gpu, *da[k].ptr, *ha[k].ptr, ha[k].bytes);
        before[k] = malloc(ha[k].bytes);
        memcpy(before[k], *ha[k].ptr, ha[k].bytes);
    }
    size_t gmax = 0;
    for (int k = 0; k < c->ngroups; k++)
        if (c->groups[k].n > gmax) gmax = c->groups[k].n;
    void *dgrad = gpu->alloc(gpu, gmax * mt_dtype_size(c->grad_dtype));

    for (int64_t last = step + N_STEPS; step < last; step++) {
        mt_optim_step a = step_args(c, step);
        for (int k = 0; k < c->ngroups; k++) {
            const group *gr = &c->groups[k];
            void *g = make_grad(&r, c, gr);
            size_t gbytes = gr->n * mt_dtype_size(c->grad_dtype);
            void *hg = g, *dg = dgrad;
            if (c->alias) {
                hg = (char *)h.w + gr->offset * gbytes / gr->n;
                dg = (char *)d.w + gr->offset * gbytes / gr->n;
                memcpy(hg, g, gbytes);
            }
            assert_int_equal(mt_optim_arenas_update(&h, &a, gr->offset, gr->n, hg,
                                                    c->grad_dtype, 0),
                             MT_OK);
            gpu->upload(gpu, dg, g, gbytes);
            gpu->optim_update(gpu, &d, &a, gr->offset, gr->n, dg, c->grad_dtype);
            gpu->sync(gpu); /* dgrad is reused by the next upload */
            free(g);
        }
    }

    int ok = 1;
    for (int k = 0; k < na; k++) {
        void *got = malloc(ha[k].bytes);
        gpu->download(gpu, got, *da[k].ptr, da[k].bytes);
        ok &= arena_equal(c->what, &ha[k], got, *ha[k].ptr);
        if (memcmp(before[k], *ha[k].ptr, ha[k].bytes) == 0) {
            fprintf(stderr, "%s: %s not changed by %d steps: the test is vacuous\n", c->what,
                    ha[k].name, N_STEPS);
            ok = 0;
        }
        free(got);
        free(before[k]);
        gpu->free(gpu, *da[k].ptr);
    }
    gpu->free(gpu, dgrad);
    mt_optim_state_free(s);
    return ok;
}

#define B 256
#define NONE ((size_t)-1)
#define HIGH_BASE ((3ull << 32) + 1000) /* tight: index_base with a nonzero high half */

static void check_cases(mt_state_format f) {
    /* the groups leave [512, 768) (8-bit formats) or element 300 (full) out */
    size_t n = 7 * B + 77;
    group g8[2] = {{0, 2 * B}, {3 * B, n - 3 * B}};
    group gf[2] = {{0, 300}, {301, n - 301}};
    const group *gs = f == MT_STATE_FULL ? gf : g8;
    size_t big = 3000 * B + 5; /* many CUDA blocks */
    mt_dtype dts[2] = {MT_F32, MT_BF16};
    int ok = 1;
    for (int t = 0; t < 2; t++) {
        opt_case c1 = {.what = "", .f = f, .grad_dtype = dts[t], .n = n, .ngroups = 2,
                       .index_base = HIGH_BASE, .beta1 = 0.9, .weight_decay = 0.1,
                       .grad_scale = 0.75f, .zero_block = 4};
        c1.groups[0] = gs[0];
        c1.groups[1] = gs[1];
        char what[96];
        snprintf(what, sizeof what, "%s %s groups", mt_state_format_name(f),
                 mt_dtype_name(dts[t]));
        c1.what = what;
        ok &= run_case(&c1);
        /* torch's other lerp branch (1 - beta1 >= 0.5), no decay, no clip, one big group */
        opt_case c2 = {.what = "", .f = f, .grad_dtype = dts[t], .n = big, .ngroups = 1,
                       .index_base = 12345 * B, .beta1 = 0.3, .weight_decay = 0.0,
                       .grad_scale = 1.0f, .zero_block = NONE};
        c2.groups[0] = (group){B, big - B};
        char what2[96];
        snprintf(what2, sizeof what2, "%s %s big", mt_state_format_name(f),
                 mt_dtype_name(dts[t]));
        c2.what = what2;
        ok &= run_case(&c2);
    }
    if (f == MT_STATE_FULL) {
        /* the engine's full path: the bf16 gradient in the upload copy, read before written */
        opt_case c3 = {.what = "full BF16 grad in the upload copy", .f = f,
                       .grad_dtype = MT_BF16, .n = n, .ngroups = 2, .beta1 = 0.9,
                       .weight_decay = 0.1, .grad_scale = 0.75f, .zero_block = NONE,
                       .alias = 1};
        c3.groups[0] = gs[0];
        c3.groups[1] = gs[1];
        ok &= run_case(&c3);
    }
    assert_true(ok);
}

static void test_full(void **state) { check_cases(MT_STATE_FULL); }
static void test_compact(void **state) { check_cases(MT_STATE_COMPACT); }
static void test_tight(void **state) { check_cases(MT_STATE_TIGHT); }

/* from_bf16 on the device is a copy: every bf16 bit pattern (NaNs, infinities, subnormals, -0)
 * comes through unchanged, at an odd length and offset. */
static void test_from_bf16(void **state) {
    size_t n = 65536 + 3;
    mt_bf16 *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) x[i] = (mt_bf16)(i * 40503u);
    mt_bf16 *dx = gpu->alloc(gpu, (n + 1) * sizeof *dx), *dy = gpu->alloc(gpu, (n + 1) * 2);
    gpu->upload(gpu, dx + 1, x, n * sizeof *x);
    gpu->zero(gpu, dy, (n + 1) * 2);
    gpu->from_bf16(gpu, dy + 1, dx + 1, n);
    gpu->download(gpu, y, dy + 1, n * sizeof *y);
    assert_memory_equal(x, y, n * sizeof *x);
    gpu->free(gpu, dx);
    gpu->free(gpu, dy);
    free(x);
    free(y);
}

int main(void) {
    if (!mt_backend_cuda_available()) {
        fprintf(stderr, "test_cuda_optim: no usable CUDA device, skipped\n");
        return 77;
    }
    gpu = mt_backend_cuda_create(0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_compact),
        cmocka_unit_test(test_tight),
        cmocka_unit_test(test_from_bf16),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    gpu->destroy(gpu);
    return failed ? 1 : 0;
}
