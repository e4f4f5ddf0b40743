/* The optimizer state: arenas per format, the update's checks, constants, thread split and ISA
 * dispatch, the plain C kernel, and the checkpoint tensor list. Vector kernels: kernel_avx2.c,
 * kernel_avx512.c. */
#include "state.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_isa.h"
#include "core/error.h"
#include "kernel.h"

/* libgomp is invisible to ThreadSanitizer: as in src/engine/adamw.c, the annotations give it the
 * caller -> worker -> caller order and nothing among workers. */
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define MT_TSAN_RELEASE(x) __tsan_release(x)
#define MT_TSAN_ACQUIRE(x) __tsan_acquire(x)
#define MT_TSAN_SKIP __attribute__((no_sanitize_thread))
#else
#define MT_TSAN_RELEASE(x) ((void)(x))
#define MT_TSAN_ACQUIRE(x) ((void)(x))
#define MT_TSAN_SKIP
#endif

struct mt_optim_state {
    mt_state_format f;
    size_t n, nblocks;
    uint64_t seed;        /* tight's rounding; a checkpoint tensor of its own */
    uint64_t index_base;  /* tight: arena index of element 0 */
    mt_optim_alloc alloc; /* for w */
    float *master, *m, *v;/* full */
    mt_bf16 *w;           /* compact, tight: the master; full: the upload copy */
    uint16_t *comp;       /* compact */
    uint8_t *mq, *vq;     /* compact, tight */
    float *ms, *vs;       /* one per block */
    mt_optim_full_fn full_fn;
};

/* ---- formats ---- */

const char *mt_state_format_name(mt_state_format f) {
    switch (f) {
    case MT_STATE_COMPACT: return "compact";
    case MT_STATE_TIGHT: return "tight";
    default: return "full";
    }
}

int mt_state_format_parse(const char *text, mt_state_format *out) {
    for (int f = MT_STATE_FULL; f <= MT_STATE_TIGHT; f++)
        if (!strcmp(text, mt_state_format_name((mt_state_format)f))) {
            *out = (mt_state_format)f;
            return MT_OK;
        }
    return mt_error_set("state format '%s': expected full, compact or tight", text);
}

static size_t nblocks_of(size_t n) { return (n + MT_OPTIM_BLOCK - 1) / MT_OPTIM_BLOCK; }

size_t mt_optim_state_bytes(mt_state_format f, size_t n) {
    size_t scales = 2 * nblocks_of(n) * sizeof(float);
    switch (f) {
    case MT_STATE_COMPACT: return n * 6 + scales;
    case MT_STATE_TIGHT: return n * 4 + scales;
    default: return n * 14;
    }
}

double mt_optim_bytes_per_param(mt_state_format f) {
    double scales = 2.0 * sizeof(float) / MT_OPTIM_BLOCK;
    switch (f) {
    case MT_STATE_COMPACT: return 6.0 + scales;
    case MT_STATE_TIGHT: return 4.0 + scales;
    default: return 14.0;
    }
}

/* ---- create, free, weights ---- */

static void *w_alloc(const mt_optim_alloc *a, size_t bytes) {
    if (a->alloc) {
        void *p = a->alloc(a->ctx, bytes);
        MT_CHECK(p != NULL, "optimizer state: allocating %zu bytes failed", bytes);
        return p;
    }
    return mt_aligned_alloc(bytes);
}

mt_optim_state *mt_optim_state_create(mt_state_format f, size_t n, uint64_t seed,
                                      const mt_optim_alloc *alloc) {
    MT_CHECK(n > 0, "optimizer state of 0 parameters");
    mt_optim_state *s = mt_calloc(1, sizeof *s);
    s->f = f;
    s->n = n;
    s->nblocks = nblocks_of(n);
    s->seed = seed;
    if (alloc) s->alloc = *alloc;
    s->w = w_alloc(&s->alloc, n * sizeof(mt_bf16));
    memset(s->w, 0, n * sizeof(mt_bf16));
    if (f == MT_STATE_FULL) {
        s->master = mt_aligned_alloc(n * 4);
        s->m = mt_aligned_alloc(n * 4);
        s->v = mt_aligned_alloc(n * 4);
        memset(s->master, 0, n * 4);
        memset(s->m, 0, n * 4);
        memset(s->v, 0, n * 4);
        return s;
    }
    if (f == MT_STATE_COMPACT) {
        s->comp = mt_aligned_alloc(n * 2);
        memset(s->comp, 0, n * 2);
    }
    s->mq = mt_aligned_alloc(n);
    s->vq = mt_aligned_alloc(n);
    /* moments zero: the code of 0.0, scale 0 */
    memset(s->mq, mt_qmap_nearest(mt_qmap_signed(), 0.0f), n);
    memset(s->vq, mt_qmap_nearest(mt_qmap_unsigned(), 0.0f), n);
    s->ms = mt_calloc(s->nblocks, sizeof(float));
    s->vs = mt_calloc(s->nblocks, sizeof(float));
    return s;
}

void mt_optim_state_free(mt_optim_state *s) {
    if (!s) return;
    if (s->alloc.free) s->alloc.free(s->alloc.ctx, s->w);
    else if (!s->alloc.alloc) free(s->w);
    free(s->master); free(s->m); free(s->v); free(s->comp);
    free(s->mq); free(s->vq); free(s->ms); free(s->vs);
    free(s);
}

mt_state_format mt_optim_state_format(const mt_optim_state *s) { return s->f; }
size_t mt_optim_state_numel(const mt_optim_state *s) { return s->n; }
void mt_optim_state_set_full_update(mt_optim_state *s, mt_optim_full_fn fn) { s->full_fn = fn; }
void mt_optim_state_set_index_base(mt_optim_state *s, uint64_t base) { s->index_base = base; }
void *mt_optim_state_upload(const mt_optim_state *s) { return s->w; }
mt_dtype mt_optim_state_upload_dtype(const mt_optim_state *s) { (void)s; return MT_BF16; }

void mt_optim_state_set_weights(mt_optim_state *s, size_t offset, const float *w, size_t n) {
    MT_CHECK(n <= s->n && offset <= s->n - n, "set_weights [%zu, +%zu) outside %zu", offset, n,
             s->n);
    for (size_t i = 0; i < n; i++) {
        size_t k = offset + i;
        if (s->f == MT_STATE_FULL) {
            s->master[k] = w[i];
            s->w[k] = mt_f32_to_bf16(w[i]);
        } else if (s->f == MT_STATE_COMPACT) {
            mt_bf16c_split(w[i], &s->w[k], &s->comp[k]);
        } else {
            s->w[k] = mt_f32_to_bf16(w[i]);
        }
    }
}

void mt_optim_state_get_weights(const mt_optim_state *s, size_t offset, float *w, size_t n) {
    MT_CHECK(n <= s->n && offset <= s->n - n, "get_weights [%zu, +%zu) outside %zu", offset, n,
             s->n);
    for (size_t i = 0; i < n; i++) {
        size_t k = offset + i;
        if (s->f == MT_STATE_FULL) w[i] = s->master[k];
        else if (s->f == MT_STATE_COMPACT) w[i] = mt_bf16c_join(s->w[k], s->comp[k]);
        else w[i] = mt_bf16_to_f32(s->w[k]);
    }
}

/* ---- checkpoint tensors ---- */

static mt_optim_tensor tensor(const char *name, mt_dtype t, size_t numel, void *data) {
    mt_optim_tensor x = {name, t, numel, numel * mt_dtype_size(t), data};
    return x;
}

int mt_optim_state_tensors(const mt_optim_state *s, mt_optim_tensor *out) {
    mt_optim_state *w = (mt_optim_state *)s; /* the list hands out writable pointers for restore */
    int k = 0;
    if (s->f == MT_STATE_FULL) {
        out[k++] = tensor("master", MT_F32, s->n, w->master);
        out[k++] = tensor("exp_avg", MT_F32, s->n, w->m);
        out[k++] = tensor("exp_avg_sq", MT_F32, s->n, w->v);
        return k;
    }
    out[k++] = tensor("master", MT_BF16, s->n, w->w);
    if (s->f == MT_STATE_COMPACT) out[k++] = tensor("master_comp", MT_U16, s->n, w->comp);
    out[k++] = tensor("exp_avg", MT_U8, s->n, w->mq);
    out[k++] = tensor("exp_avg_scale", MT_F32, s->nblocks, w->ms);
    out[k++] = tensor("exp_avg_sq", MT_U8, s->n, w->vq);
    out[k++] = tensor("exp_avg_sq_scale", MT_F32, s->nblocks, w->vs);
    if (s->f == MT_STATE_TIGHT) out[k++] = tensor("sr_seed", MT_I64, 1, &w->seed);
    return k;
}

/* ---- the plain C kernel ---- */

void mt_optim_kernel_scalar(const mt_optim_consts *c, const mt_optim_span *s, size_t n) {
    float mb[MT_OPTIM_BLOCK], vb[MT_OPTIM_BLOCK];
    for (size_t b0 = 0; b0 < n; b0 += MT_OPTIM_BLOCK) {
        size_t nb = n - b0 < MT_OPTIM_BLOCK ? n - b0 : MT_OPTIM_BLOCK;
        mt_optim_span sb = mt_optim_span_at(s, b0);
        uint32_t am = 0, av = 0;
        mt_optim_block_elems(c, &sb, 0, nb, mb, vb, &am, &av);
        mt_optim_block_requant(c, &sb, 0, nb, mb, vb, mt_optim_divisor(am), mt_optim_divisor(av));
        sb.ms[0] = mt_f32_from_bits(am);
        sb.vs[0] = mt_f32_from_bits(av);
    }
}

/* ---- dispatch ---- */

const char *mt_optim_isa_name(mt_optim_isa isa) { return mt_isa_name((mt_isa)isa); }

int mt_optim_isa_supported(mt_optim_isa isa) { return mt_isa_supported((mt_isa)isa); }

mt_optim_isa mt_optim_isa_active(void) { return (mt_optim_isa)mt_isa_active(); }

int mt_optim_set_isa(mt_optim_isa isa) { return mt_isa_set((mt_isa)isa); }

static mt_optim_kernel_fn kernel_for(mt_optim_isa isa) {
    switch (isa) {
    case MT_OPTIM_AVX512: return mt_optim_kernel_avx512;
    case MT_OPTIM_AVX2: return mt_optim_kernel_avx2;
    default: return mt_optim_kernel_scalar;
    }
}

/* ---- the update ---- */

/* The fp32 constants as src/engine/adamw.c computes them (double hyperparameters, one rounding
 * each), so the moment and weight arithmetic is torch's. */
static mt_optim_consts make_consts(const mt_optim_state *s, const mt_optim_step *a) {
    mt_optim_consts c;
    memset(&c, 0, sizeof c);
    c.gs = a->grad_scale;
    c.do_decay = a->weight_decay != 0.0;
    c.decay = (float)(1.0 - a->lr * a->weight_decay);
    float w = (float)(1.0 - a->beta1);
    c.lerp_small = fabsf(w) < 0.5f;
    c.lerp_coef = c.lerp_small ? w : w - 1.0f;
    c.b2 = (float)a->beta2;
    c.c2 = (float)(1.0 - a->beta2);
    double bc1 = 1.0 - pow(a->beta1, (double)a->step);
    double bc2 = 1.0 - pow(a->beta2, (double)a->step);
    c.bc2s = (float)pow(bc2, 0.5);
    c.eps = (float)a->eps;
    c.neg_step = (float)(-(a->lr / bc1));
    c.tight = s->f == MT_STATE_TIGHT;
    c.key = mt_sr_key_make(s->seed, a->step);
    c.qm = mt_qmap_signed();
    c.qv = mt_qmap_unsigned();
    return c;
}

static int overlaps(const void *a, size_t abytes, const void *b, size_t bbytes) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + bbytes && y < x + abytes;
}

MT_TSAN_SKIP static void run(const mt_optim_consts *c, const mt_optim_span *s, size_t n,
                             int n_threads) {
    mt_optim_kernel_fn fn = kernel_for(mt_optim_isa_active());
    /* chunks of whole blocks handed out dynamically: every block is computed the same way
     * wherever it lands, so results do not depend on the thread count or schedule */
    const size_t chunk = (size_t)MT_OPTIM_CHUNK_BLOCKS * MT_OPTIM_BLOCK;
    size_t nchunks = (n + chunk - 1) / chunk;
    size_t nt = n_threads > 0 ? (size_t)n_threads : (size_t)omp_get_max_threads();
    if (nt > nchunks) nt = nchunks;
    if (nt <= 1) {
        fn(c, s, n);
        return;
    }
    char sync[2]; /* TSan sync objects: [0] team start, [1] team end */
    MT_TSAN_RELEASE(&sync[0]);
#pragma omp parallel for schedule(dynamic, 1) num_threads((int)nt)
    for (size_t k = 0; k < nchunks; k++) {
        MT_TSAN_ACQUIRE(&sync[0]);
        size_t lo = k * chunk, hi = lo + chunk < n ? lo + chunk : n;
        mt_optim_span sk = mt_optim_span_at(s, lo);
        fn(c, &sk, hi - lo);
        MT_TSAN_RELEASE(&sync[1]);
    }
    MT_TSAN_ACQUIRE(&sync[1]);
}

int mt_optim_state_update(mt_optim_state *s, const mt_optim_step *a, size_t offset, size_t n,
                          const void *grad, mt_dtype grad_dtype, int n_threads) {
    if (n > s->n || offset > s->n - n)
        return mt_error_set("optimizer update [%zu, %zu) outside the state's %zu parameters",
                            offset, offset + n, s->n);
    if (grad_dtype != MT_F32 && grad_dtype != MT_BF16)
        return mt_error_set("optimizer update: gradient dtype %s, expected F32 or BF16",
                            mt_dtype_name(grad_dtype));
    if (a->step < 1)
        return mt_error_set("optimizer update: step is 1-based, got %lld", (long long)a->step);
    if (n == 0) return MT_OK;
    int gbf = grad_dtype == MT_BF16;
    if (overlaps(grad, n * (gbf ? 2 : 4), s->w, s->n * sizeof(mt_bf16)))
        return mt_error_set("optimizer update: the gradient overlaps the %s",
                            s->f == MT_STATE_FULL ? "upload copy" : "bf16 master");
    if (s->f == MT_STATE_FULL) {
        if (!s->full_fn)
            return mt_error_set("optimizer update: state full has no update function "
                                "(mt_optim_state_set_full_update)");
        s->full_fn(a, s->master + offset, s->m + offset, s->v + offset, grad, gbf, n,
                   s->w + offset, n_threads);
        return MT_OK;
    }
    if (offset % MT_OPTIM_BLOCK)
        return mt_error_set("optimizer update at offset %zu: %s state groups start at multiples "
                            "of %d", offset, mt_state_format_name(s->f), MT_OPTIM_BLOCK);
    mt_optim_consts c = make_consts(s, a);
    mt_optim_span sp = {.w = s->w, .comp = s->comp, .mq = s->mq, .vq = s->vq, .ms = s->ms,
                        .vs = s->vs, .grad = grad, .grad_bf16 = gbf,
                        .index0 = s->index_base};
    /* span_at works on whole blocks of the arena; grad is the group's own */
    mt_optim_span so = mt_optim_span_at(&sp, offset);
    so.grad = grad;
    run(&c, &so, n, n_threads);
    return MT_OK;
}
