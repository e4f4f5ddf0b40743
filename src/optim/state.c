/* The optimizer state: arenas per format, the update's checks, constants, thread split and ISA
 * dispatch, the plain C kernel, and the checkpoint tensor list. Vector kernels: kernel_avx2.c,
 * kernel_avx512.c. The full format calls the AdamW of adamw.h. */
#include "state.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "adamw.h"
#include "core/cpu_isa.h"
#include "core/error.h"
#include "kernel.h"

/* libgomp is invisible to ThreadSanitizer: as in adamw_full.c, the annotations give it the
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

/* Elements from which set_weights / get_weights split over threads (below it a tensor is a few
 * hundred microseconds of one core: not worth a parallel region). */
#define MT_STATE_PARALLEL_MIN ((size_t)1 << 20)

struct mt_optim_state {
    mt_optim_arenas a;    /* every arena, as mt_optim_state_arenas hands them out */
    mt_optim_alloc alloc; /* for a.w */
};

/* ---- formats ---- */

const char *mt_state_format_name(mt_state_format f) {
    switch (f) {
    case MT_STATE_COMPACT: return "compact";
    case MT_STATE_TIGHT: return "tight";
    case MT_STATE_FROZEN: return "frozen";
    default: return "full";
    }
}

int mt_state_format_parse(const char *text, mt_state_format *out) {
    /* up to tight only: frozen is the engine's choice for a LoRA base, never --state's */
    for (int f = MT_STATE_FULL; f <= MT_STATE_TIGHT; f++)
        if (!strcmp(text, mt_state_format_name((mt_state_format)f))) {
            *out = (mt_state_format)f;
            return MT_OK;
        }
    return mt_error_set("state format '%s': expected full, compact or tight", text);
}

static size_t nblocks_of(size_t n) { return (n + MT_OPTIM_BLOCK - 1) / MT_OPTIM_BLOCK; }

size_t mt_optim_state_bytes_up(mt_state_format f, size_t n, mt_dtype upload_dtype) {
    size_t scales = 2 * nblocks_of(n) * sizeof(float), up = mt_dtype_size(upload_dtype);
    switch (f) {
    case MT_STATE_COMPACT: return n * 6 + scales;
    case MT_STATE_TIGHT: return n * 4 + scales;
    case MT_STATE_FROZEN: return n * up;
    default: return n * (12 + up);
    }
}

double mt_optim_bytes_per_param_up(mt_state_format f, mt_dtype upload_dtype) {
    double scales = 2.0 * sizeof(float) / MT_OPTIM_BLOCK, up = (double)mt_dtype_size(upload_dtype);
    switch (f) {
    case MT_STATE_COMPACT: return 6.0 + scales;
    case MT_STATE_TIGHT: return 4.0 + scales;
    case MT_STATE_FROZEN: return up;
    default: return 12.0 + up;
    }
}

/* bf16 upload: the cuda backend's, and what the planner has always counted */
size_t mt_optim_state_bytes(mt_state_format f, size_t n) {
    return mt_optim_state_bytes_up(f, n, MT_BF16);
}

double mt_optim_bytes_per_param(mt_state_format f) {
    return mt_optim_bytes_per_param_up(f, MT_BF16);
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

/* Every other arena: through alloc too when it asks for all (a state streamed to the compute
 * side), else plain aligned memory. */
static void *arena_alloc(const mt_optim_alloc *a, size_t bytes) {
    return a->all ? w_alloc(a, bytes) : mt_aligned_alloc(bytes);
}
static void arena_free(const mt_optim_alloc *a, void *p) {
    if (!p) return;
    if (a->all && a->free) a->free(a->ctx, p);
    else if (!a->all || !a->alloc) free(p);
}

static void *zeroed(const mt_optim_alloc *a, size_t bytes) {
    void *p = arena_alloc(a, bytes);
    memset(p, 0, bytes);
    return p;
}

mt_optim_state *mt_optim_state_create(mt_state_format f, size_t n, uint64_t seed,
                                      const mt_optim_alloc *alloc) {
    MT_CHECK(n > 0, "optimizer state of 0 parameters");
    mt_optim_state *s = mt_calloc(1, sizeof *s);
    mt_dtype up = MT_BF16;
    if (alloc) {
        s->alloc = *alloc;
        up = alloc->upload_dtype;
    }
    MT_CHECK(f >= MT_STATE_FULL && f <= MT_STATE_FROZEN, "optimizer state: format %d", (int)f);
    MT_CHECK(up == MT_BF16 || (up == MT_F32 && (f == MT_STATE_FULL || f == MT_STATE_FROZEN)),
             "optimizer state %s: upload_dtype %s (full and frozen take BF16 or F32; compact and "
             "tight upload their bf16 master, so BF16 only)", mt_state_format_name(f),
             mt_dtype_name(up));
    mt_optim_arenas *a = &s->a;
    a->f = f;
    a->n = n;
    a->nblocks = nblocks_of(n);
    a->seed = seed;
    a->w_dtype = up;
    size_t wbytes = n * mt_dtype_size(up);
    a->w = w_alloc(&s->alloc, wbytes);
    memset(a->w, 0, wbytes);
    if (f == MT_STATE_FROZEN) return s; /* the upload copy is all it has */
    const mt_optim_alloc *al = &s->alloc;
    if (f == MT_STATE_FULL) {
        a->master = zeroed(al, n * 4);
        a->m = zeroed(al, n * 4);
        a->v = zeroed(al, n * 4);
        return s;
    }
    if (f == MT_STATE_COMPACT) a->comp = zeroed(al, n * 2);
    a->mq = arena_alloc(al, n);
    a->vq = arena_alloc(al, n);
    /* moments zero: the code of 0.0, scale 0 */
    memset(a->mq, mt_qmap_nearest(mt_qmap_signed(), 0.0f), n);
    memset(a->vq, mt_qmap_nearest(mt_qmap_unsigned(), 0.0f), n);
    a->ms = zeroed(al, a->nblocks * sizeof(float));
    a->vs = zeroed(al, a->nblocks * sizeof(float));
    return s;
}

void mt_optim_state_free(mt_optim_state *s) {
    if (!s) return;
    mt_optim_arenas *a = &s->a;
    if (s->alloc.free) s->alloc.free(s->alloc.ctx, a->w);
    else if (!s->alloc.alloc) free(a->w);
    void *parts[] = {a->master, a->m, a->v, a->comp, a->mq, a->vq, a->ms, a->vs};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) arena_free(&s->alloc, parts[i]);
    free(s);
}

mt_state_format mt_optim_state_format(const mt_optim_state *s) { return s->a.f; }
size_t mt_optim_state_numel(const mt_optim_state *s) { return s->a.n; }
void mt_optim_state_set_index_base(mt_optim_state *s, uint64_t base) { s->a.index_base = base; }
void *mt_optim_state_upload(const mt_optim_state *s) { return s->a.w; }
mt_dtype mt_optim_state_upload_dtype(const mt_optim_state *s) { return s->a.w_dtype; }
mt_optim_arenas mt_optim_state_arenas(const mt_optim_state *s) { return s->a; }
void mt_optim_state_set_seed(mt_optim_state *s, uint64_t seed) { s->a.seed = seed; }

void mt_optim_state_set_weights(mt_optim_state *s, size_t offset, const float *w, size_t n) {
    const mt_optim_arenas *a = &s->a;
    MT_CHECK(n <= a->n && offset <= a->n - n, "set_weights [%zu, +%zu) outside %zu", offset, n,
             a->n);
    mt_bf16 *wh = a->w;
    float *wf = a->w;
    /* every core: a model's initial weights pass through here (and first touch the master's
     * pages); small tensors stay on the calling thread */
#pragma omp parallel for schedule(static) if (n >= MT_STATE_PARALLEL_MIN)
    for (size_t i = 0; i < n; i++) {
        size_t k = offset + i;
        if (a->f == MT_STATE_FULL || a->f == MT_STATE_FROZEN) { /* frozen: the copy alone */
            if (a->f == MT_STATE_FULL) a->master[k] = w[i];
            if (a->w_dtype == MT_F32) wf[k] = w[i];
            else wh[k] = mt_f32_to_bf16(w[i]);
        } else if (a->f == MT_STATE_COMPACT) {
            mt_bf16c_split(w[i], &wh[k], &a->comp[k]);
        } else {
            wh[k] = mt_f32_to_bf16(w[i]);
        }
    }
}

void mt_optim_state_get_weights(const mt_optim_state *s, size_t offset, float *w, size_t n) {
    const mt_optim_arenas *a = &s->a;
    MT_CHECK(n <= a->n && offset <= a->n - n, "get_weights [%zu, +%zu) outside %zu", offset, n,
             a->n);
    const mt_bf16 *wh = a->w;
    const float *wf = a->w;
#pragma omp parallel for schedule(static) if (n >= MT_STATE_PARALLEL_MIN)
    for (size_t i = 0; i < n; i++) {
        size_t k = offset + i;
        if (a->f == MT_STATE_FULL) w[i] = a->master[k];
        else if (a->f == MT_STATE_FROZEN) w[i] = a->w_dtype == MT_F32 ? wf[k] : mt_bf16_to_f32(wh[k]);
        else if (a->f == MT_STATE_COMPACT) w[i] = mt_bf16c_join(wh[k], a->comp[k]);
        else w[i] = mt_bf16_to_f32(wh[k]);
    }
}

/* ---- checkpoint tensors ---- */

static mt_optim_tensor tensor(const char *name, mt_dtype t, size_t numel, void *data) {
    mt_optim_tensor x = {name, t, numel, numel * mt_dtype_size(t), data};
    return x;
}

int mt_optim_state_tensors(const mt_optim_state *s, mt_optim_tensor *out) {
    mt_optim_state *w = (mt_optim_state *)s; /* the list hands out writable pointers for restore */
    const mt_optim_arenas *a = &w->a;
    int k = 0;
    if (a->f == MT_STATE_FROZEN) { /* the weights as uploaded: restoring them is bit for bit */
        out[k++] = tensor("weights", a->w_dtype, a->n, a->w);
        return k;
    }
    if (a->f == MT_STATE_FULL) {
        out[k++] = tensor("master", MT_F32, a->n, a->master);
        out[k++] = tensor("exp_avg", MT_F32, a->n, a->m);
        out[k++] = tensor("exp_avg_sq", MT_F32, a->n, a->v);
        return k;
    }
    out[k++] = tensor("master", MT_BF16, a->n, a->w);
    if (a->f == MT_STATE_COMPACT) out[k++] = tensor("master_comp", MT_U16, a->n, a->comp);
    out[k++] = tensor("exp_avg", MT_U8, a->n, a->mq);
    out[k++] = tensor("exp_avg_scale", MT_F32, a->nblocks, a->ms);
    out[k++] = tensor("exp_avg_sq", MT_U8, a->n, a->vq);
    out[k++] = tensor("exp_avg_sq_scale", MT_F32, a->nblocks, a->vs);
    if (a->f == MT_STATE_TIGHT) out[k++] = tensor("sr_seed", MT_I64, 1, &w->a.seed);
    return k;
}

/* One tensor's parts: the arenas at [offset, offset+numel), or data NULL (layout) when s is. */
static int parts(mt_state_format f, const mt_optim_arenas *s, size_t offset, size_t numel,
                 mt_optim_tensor *out) {
    int k = 0;
    if (f == MT_STATE_FROZEN) return 0; /* weights only: no optimizer parts */
    if (f == MT_STATE_FULL) {
        out[k++] = tensor("exp_avg", MT_F32, numel, s ? s->m + offset : NULL);
        out[k++] = tensor("exp_avg_sq", MT_F32, numel, s ? s->v + offset : NULL);
        return k;
    }
    size_t nb = nblocks_of(numel), b = offset / MT_OPTIM_BLOCK;
    out[k++] = tensor("exp_avg", MT_U8, numel, s ? s->mq + offset : NULL);
    out[k++] = tensor("exp_avg_scale", MT_F32, nb, s ? s->ms + b : NULL);
    out[k++] = tensor("exp_avg_sq", MT_U8, numel, s ? s->vq + offset : NULL);
    out[k++] = tensor("exp_avg_sq_scale", MT_F32, nb, s ? s->vs + b : NULL);
    return k;
}

int mt_optim_arenas_parts(const mt_optim_arenas *s, size_t offset, size_t numel,
                          mt_optim_tensor *out) {
    if (numel == 0 || numel > s->n || offset > s->n - numel) {
        mt_error_set("optimizer parts [%zu, %zu): outside the state's %zu parameters (or empty)",
                     offset, offset + numel, s->n);
        return -1;
    }
    if (s->f != MT_STATE_FULL && s->f != MT_STATE_FROZEN && offset % MT_OPTIM_BLOCK) {
        mt_error_set("optimizer parts at offset %zu: %s tensors start at multiples of %d", offset,
                     mt_state_format_name(s->f), MT_OPTIM_BLOCK);
        return -1;
    }
    return parts(s->f, s, offset, numel, out);
}

int mt_optim_parts_layout(mt_state_format f, size_t numel, mt_optim_tensor *out) {
    return parts(f, NULL, 0, numel, out);
}

/* ---- the plain C kernel ---- */

void mt_optim_kernel_scalar(const mt_optim_consts *c, const mt_optim_span *s, size_t n) {
    float mb[MT_OPTIM_BLOCK], vb[MT_OPTIM_BLOCK];
    for (size_t b0 = 0; b0 < n; b0 += MT_OPTIM_BLOCK) {
        size_t nb = n - b0 < MT_OPTIM_BLOCK ? n - b0 : MT_OPTIM_BLOCK;
        mt_optim_span sb = mt_optim_span_at(s, b0);
        uint32_t am = 0, av = 0;
        mt_optim_block_elems(c, &sb, 0, nb, mb, vb, &am, &av);
        mt_optim_block_requant(c, &sb, 0, nb, mb, vb, mt_optim_recip(am), mt_optim_recip(av));
        sb.ms[0] = mt_f32_from_bits(am);
        sb.vs[0] = mt_f32_from_bits(av);
    }
}

/* ---- dispatch ---- */

static mt_optim_kernel_fn kernel_for(mt_adamw_isa isa) {
    switch (isa) {
    case MT_ADAMW_AVX512: return mt_optim_kernel_avx512;
    case MT_ADAMW_AVX2: return mt_optim_kernel_avx2;
    default: return mt_optim_kernel_scalar;
    }
}

/* ---- the update ---- */

/* The fp32 constants of the AdamW element (adamw.h's one definition), and the 8-bit formats'. */
static mt_optim_consts make_consts(const mt_optim_arenas *s, const mt_optim_step *a) {
    mt_adamw_consts b = mt_adamw_consts_of(a);
    mt_optim_consts c;
    memset(&c, 0, sizeof c);
    c.gs = b.gs;
    c.do_decay = b.do_decay;
    c.decay = b.decay;
    c.lerp_small = b.lerp_small;
    c.lerp_coef = b.lerp_coef;
    c.b2 = b.b2;
    c.c2 = b.c2;
    c.inv_bc2s = b.inv_bc2s;
    c.eps = b.eps;
    c.neg_step = b.neg_step;
    c.tight = s->f == MT_STATE_TIGHT;
    c.key = mt_sr_key_make(s->seed, a->step);
    c.qm = mt_qmap_signed();
    c.qv = mt_qmap_unsigned();
    return c;
}

static int overlaps(const void *a, size_t abytes, const void *b, size_t bbytes) {
    if (!a || !b) return 0;
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + bbytes && y < x + abytes;
}

MT_TSAN_SKIP static void run(const mt_optim_consts *c, const mt_optim_span *s, size_t n,
                             int n_threads) {
    mt_optim_kernel_fn fn = kernel_for(mt_adamw_isa_active());
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

/* The arenas a format needs are there; the name of the first missing one otherwise. */
static const char *missing_arena(const mt_optim_arenas *s) {
    if (!s->w) return "w";
    if (s->f == MT_STATE_FULL) {
        if (s->w_dtype != MT_BF16 && s->w_dtype != MT_F32) return "w (dtype BF16 or F32)";
        return !s->master ? "master" : !s->m ? "m" : !s->v ? "v" : NULL;
    }
    if (s->w_dtype != MT_BF16) return "w (dtype BF16)";
    if (s->f == MT_STATE_COMPACT && !s->comp) return "comp";
    return !s->mq ? "mq" : !s->vq ? "vq" : !s->ms ? "ms" : !s->vs ? "vs" : NULL;
}

/* The gradient must not overlap any arena; full's only exception is the upload copy's own
 * [offset, offset+n) in the upload dtype (adamw.h reads each element before writing it). */
static int check_grad(const mt_optim_arenas *s, size_t offset, size_t n, const void *grad,
                      mt_dtype grad_dtype) {
    size_t gbytes = n * mt_dtype_size(grad_dtype), wsz = mt_dtype_size(s->w_dtype);
    const char *w_name = s->f == MT_STATE_FULL ? "upload copy" : "bf16 master";
    if (overlaps(grad, gbytes, s->w, s->n * wsz)) {
        int own = s->f == MT_STATE_FULL && grad_dtype == s->w_dtype &&
                  grad == (const char *)s->w + offset * wsz;
        if (!own)
            return mt_error_set("optimizer update: the gradient overlaps the %s%s", w_name,
                                s->f == MT_STATE_FULL ? " other than as its own range in the "
                                                        "upload dtype" : "");
    }
    struct {
        const void *p;
        size_t bytes;
        const char *name;
    } other[] = {{s->master, s->n * 4, "master"}, {s->m, s->n * 4, "exp_avg"},
                 {s->v, s->n * 4, "exp_avg_sq"},  {s->comp, s->n * 2, "compensation"},
                 {s->mq, s->n, "exp_avg"},        {s->vq, s->n, "exp_avg_sq"},
                 {s->ms, s->nblocks * 4, "exp_avg scales"},
                 {s->vs, s->nblocks * 4, "exp_avg_sq scales"}};
    for (size_t k = 0; k < sizeof other / sizeof *other; k++)
        if (overlaps(grad, gbytes, other[k].p, other[k].bytes))
            return mt_error_set("optimizer update: the gradient overlaps the %s", other[k].name);
    return MT_OK;
}

int mt_optim_arenas_update(const mt_optim_arenas *s, const mt_optim_step *a, size_t offset,
                           size_t n, const void *grad, mt_dtype grad_dtype, int n_threads) {
    if (s->f == MT_STATE_FROZEN) return MT_OK; /* a frozen model does not train */
    if (s->f < MT_STATE_FULL || s->f > MT_STATE_TIGHT)
        return mt_error_set("optimizer update: unknown state format %d", (int)s->f);
    const char *miss = missing_arena(s);
    if (miss)
        return mt_error_set("optimizer update: %s arenas lack %s", mt_state_format_name(s->f),
                            miss);
    if (n > s->n || offset > s->n - n)
        return mt_error_set("optimizer update [%zu, %zu) outside the state's %zu parameters",
                            offset, offset + n, s->n);
    if (grad_dtype != MT_F32 && grad_dtype != MT_BF16)
        return mt_error_set("optimizer update: gradient dtype %s, expected F32 or BF16",
                            mt_dtype_name(grad_dtype));
    if (a->step < 1)
        return mt_error_set("optimizer update: step is 1-based, got %lld", (long long)a->step);
    if (n == 0) return MT_OK;
    if (s->f != MT_STATE_FULL && offset % MT_OPTIM_BLOCK)
        return mt_error_set("optimizer update at offset %zu: %s state groups start at multiples "
                            "of %d", offset, mt_state_format_name(s->f), MT_OPTIM_BLOCK);
    MT_TRY(check_grad(s, offset, n, grad, grad_dtype));
    int gbf = grad_dtype == MT_BF16;
    if (s->f == MT_STATE_FULL) {
        mt_adamw_step_args b = {.lr = a->lr, .beta1 = a->beta1, .beta2 = a->beta2,
                                .eps = a->eps, .weight_decay = a->weight_decay, .step = a->step,
                                .grad_scale = a->grad_scale};
        void *up = (char *)s->w + offset * mt_dtype_size(s->w_dtype);
        if (gbf)
            mt_adamw_update_bf16(&b, s->master + offset, s->m + offset, s->v + offset, grad, n,
                                 up, s->w_dtype, n_threads);
        else
            mt_adamw_update(&b, s->master + offset, s->m + offset, s->v + offset, grad, n, up,
                            s->w_dtype, n_threads);
        return MT_OK;
    }
    mt_optim_consts c = make_consts(s, a);
    mt_optim_span sp = {.w = s->w, .comp = s->comp, .mq = s->mq, .vq = s->vq, .ms = s->ms,
                        .vs = s->vs, .grad = grad, .grad_bf16 = gbf, .index0 = s->index_base};
    /* span_at works on whole blocks of the arena; grad is the group's own */
    mt_optim_span so = mt_optim_span_at(&sp, offset);
    so.grad = grad;
    run(&c, &so, n, n_threads);
    return MT_OK;
}

int mt_optim_state_update(mt_optim_state *s, const mt_optim_step *a, size_t offset, size_t n,
                          const void *grad, mt_dtype grad_dtype, int n_threads) {
    return mt_optim_arenas_update(&s->a, a, offset, n, grad, grad_dtype, n_threads);
}
