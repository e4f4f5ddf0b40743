/* The checkpoint tests' mt_state_io over one host state (state_io.h). */
#include "util/state_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/model_io.h"
#include "util/testutil.h"

/* p's parts in the state's arenas, checked against the layout the caller's buffers follow. */
static int state_parts(const mt_test_state *ts, const mt_param *p, const mt_optim_tensor *want,
                       mt_optim_tensor *got) {
    mt_optim_arenas a = mt_optim_state_arenas(ts->s);
    int n = mt_optim_arenas_parts(&a, (size_t)p->offset, (size_t)p->numel, got);
    if (n < 0) return MT_ERR;
    mt_optim_tensor layout[MT_OPTIM_MAX_TENSORS];
    MT_CHECK(n == mt_optim_parts_layout(ts->io.format, (size_t)p->numel, layout), "parts of %s",
             p->name);
    for (int k = 0; k < n; k++)
        MT_CHECK(got[k].bytes == want[k].bytes && got[k].dtype == want[k].dtype &&
                 strcmp(got[k].name, want[k].name) == 0, "part %d of %s", k, p->name);
    return n;
}

static int get_weights(void *ctx, const mt_param *p, float *dst) {
    mt_test_state *ts = ctx;
    mt_optim_state_get_weights(ts->s, (size_t)p->offset, dst, (size_t)p->numel);
    return MT_OK;
}

static int set_weights(void *ctx, const mt_param *p, const float *src) {
    mt_test_state *ts = ctx;
    mt_optim_state_set_weights(ts->s, (size_t)p->offset, src, (size_t)p->numel);
    ts->n_sets++;
    return MT_OK;
}

static int get_parts(void *ctx, const mt_param *p, const mt_optim_tensor *parts) {
    mt_test_state *ts = ctx;
    mt_optim_tensor x[MT_OPTIM_MAX_TENSORS];
    int n = state_parts(ts, p, parts, x);
    for (int k = 0; k < n; k++) memcpy(parts[k].data, x[k].data, x[k].bytes);
    return n < 0 ? MT_ERR : MT_OK;
}

static int set_parts(void *ctx, const mt_param *p, const mt_optim_tensor *parts) {
    mt_test_state *ts = ctx;
    mt_optim_tensor x[MT_OPTIM_MAX_TENSORS];
    int n = state_parts(ts, p, parts, x);
    for (int k = 0; k < n; k++) memcpy(x[k].data, parts[k].data, x[k].bytes);
    ts->n_sets++;
    return n < 0 ? MT_ERR : MT_OK;
}

static void set_sr_seed(void *ctx, uint64_t seed) {
    mt_test_state *ts = ctx;
    ts->sr_seed = seed;
    ts->n_sets++;
}

mt_test_state *mt_test_state_create(mt_state_format f, const mt_param_table *t, uint64_t seed) {
    mt_test_state *ts = calloc(1, sizeof *ts);
    ts->s = mt_optim_state_create(f, (size_t)t->total, seed, NULL);
    ts->sr_seed = seed;
    ts->io = (mt_state_io){.format = f, .sr_seed = seed, .ctx = ts, .get_weights = get_weights,
                           .set_weights = set_weights, .get_parts = get_parts,
                           .set_parts = set_parts, .set_sr_seed = set_sr_seed};
    return ts;
}

void mt_test_state_free(mt_test_state *ts) {
    if (!ts) return;
    mt_optim_state_free(ts->s);
    free(ts);
}

/* A tensor's parts in malloc'd buffers of its layout (free parts[0].data: one block). */
static int alloc_parts(mt_state_format f, const mt_param *p, mt_optim_tensor *parts) {
    int n = mt_optim_parts_layout(f, (size_t)p->numel, parts);
    size_t bytes = 0;
    for (int k = 0; k < n; k++) bytes += (parts[k].bytes + 63) / 64 * 64;
    unsigned char *block = mt_aligned_alloc(bytes ? bytes : 64);
    for (int k = 0, at = 0; k < n; k++) {
        parts[k].data = block + at;
        at += (int)((parts[k].bytes + 63) / 64 * 64);
    }
    return n;
}

void mt_test_state_fill_random(mt_test_state *ts, const mt_param_table *t, uint64_t seed) {
    mt_test_rng r;
    mt_test_rng_seed(&r, seed);
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        float *w = malloc(sizeof(float) * (size_t)p->numel);
        mt_test_fill_normal(&r, w, (size_t)p->numel, 0.05f);
        MT_CHECK(ts->io.set_weights(ts, p, w) == MT_OK, "%s", mt_error_message());
        free(w);
        mt_optim_tensor parts[MT_OPTIM_MAX_TENSORS];
        int n = alloc_parts(ts->io.format, p, parts);
        for (int k = 0; k < n; k++) {
            mt_optim_tensor *x = &parts[k];
            if (x->dtype == MT_U8) {
                for (size_t j = 0; j < x->numel; j++)
                    ((uint8_t *)x->data)[j] = (uint8_t)mt_test_rng_u64(&r);
            } else if (strstr(x->name, "_scale")) {
                mt_test_fill_uniform(&r, x->data, x->numel, 1e-4f, 1.0f);
            } else if (strcmp(x->name, "exp_avg_sq") == 0) {
                float *v = x->data;
                mt_test_fill_normal(&r, v, x->numel, 1e-3f);
                for (size_t j = 0; j < x->numel; j++) v[j] *= v[j];
            } else {
                mt_test_fill_normal(&r, x->data, x->numel, 0.05f);
            }
        }
        MT_CHECK(ts->io.set_parts(ts, p, parts) == MT_OK, "%s", mt_error_message());
        free(parts[0].data);
    }
    ts->n_sets = 0;
}

int mt_test_state_equal(mt_test_state *a, mt_test_state *b, const mt_param_table *t) {
    if (a->io.format != b->io.format) {
        printf("  states of formats %d and %d\n", (int)a->io.format, (int)b->io.format);
        return 0;
    }
    int same = 1;
    for (int i = 0; i < t->n_params && same; i++) {
        const mt_param *p = &t->params[i];
        size_t bytes = sizeof(float) * (size_t)p->numel;
        float *wa = malloc(bytes), *wb = malloc(bytes);
        MT_CHECK(a->io.get_weights(a, p, wa) == MT_OK && b->io.get_weights(b, p, wb) == MT_OK,
                 "get_weights");
        if (memcmp(wa, wb, bytes) != 0) {
            printf("  %s: weights differ\n", p->name);
            same = 0;
        }
        free(wa);
        free(wb);
        mt_optim_tensor pa[MT_OPTIM_MAX_TENSORS], pb[MT_OPTIM_MAX_TENSORS];
        int n = alloc_parts(a->io.format, p, pa);
        alloc_parts(b->io.format, p, pb);
        MT_CHECK(a->io.get_parts(a, p, pa) == MT_OK && b->io.get_parts(b, p, pb) == MT_OK,
                 "get_parts");
        for (int k = 0; k < n && same; k++)
            if (memcmp(pa[k].data, pb[k].data, pa[k].bytes) != 0) {
                printf("  %s: part %s differs\n", p->name, pa[k].name);
                same = 0;
            }
        free(pa[0].data);
        free(pb[0].data);
    }
    return same;
}

/* The arenas of a state with their sizes in bytes. */
static int arena_list(const mt_test_state *ts, void **ptr, size_t *bytes) {
    mt_optim_arenas a = mt_optim_state_arenas(ts->s);
    void *p[] = {a.master, a.m, a.v, a.w, a.comp, a.mq, a.vq, a.ms, a.vs};
    size_t b[] = {4 * a.n, 4 * a.n, 4 * a.n, mt_dtype_size(a.w_dtype) * a.n, 2 * a.n, a.n, a.n,
                  4 * a.nblocks, 4 * a.nblocks};
    int n = 0;
    for (size_t i = 0; i < sizeof p / sizeof *p; i++)
        if (p[i]) ptr[n] = p[i], bytes[n++] = b[i];
    return n;
}

void mt_test_state_poison(mt_test_state *ts, unsigned char byte) {
    void *p[9];
    size_t b[9];
    int n = arena_list(ts, p, b);
    for (int i = 0; i < n; i++) memset(p[i], byte, b[i]);
}

int mt_test_state_poisoned(const mt_test_state *ts, unsigned char byte) {
    void *p[9];
    size_t b[9];
    int n = arena_list(ts, p, b);
    for (int i = 0; i < n; i++)
        for (size_t j = 0; j < b[i]; j++)
            if (((const unsigned char *)p[i])[j] != byte) return 0;
    return 1;
}

void mt_test_state_model_dir(mt_test_state *ts, const mt_param_table *t, const char *dir) {
    size_t bytes = sizeof(float) * (size_t)t->total;
    float *arena = mt_aligned_alloc(bytes), *w = mt_aligned_alloc(bytes);
    if (mt_model_load(t, arena, dir) != MT_OK) fail_msg("%s", mt_error_message());
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        assert_int_equal(ts->io.get_weights(ts, p, w), MT_OK);
        assert_memory_equal(arena + p->offset, w, sizeof(float) * (size_t)p->numel);
    }
    free(arena);
    free(w);
}
