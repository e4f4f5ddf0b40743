#include "train_state.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

/* Fetch pieces: 64M elements (128 MiB of bf16 gradient per buffer; a larger piece is a longer
 * parallel region: fewer fork-joins and idle tails); a multiple of 256, so a
 * piece's offset inside its tensor keeps the 8-bit formats' blocks whole. */
#define FETCH_PIECE ((int64_t)1 << 26)

/* One update call: consecutive tensors of one group with the same weight decay (the 1-D tensors
 * have none), at most FETCH_PIECE elements. The padding between the tensors of a run is zero
 * weights, moments and gradients, which an update keeps zero bit for bit (every op of it maps
 * zeros to +0), so one call over the run gives each tensor the bits a call of its own would, with
 * fewer, larger calls: the small tensors (k, v, norms) no longer leave threads idle. */
typedef struct {
    int layer;
    int64_t offset, n; /* arena offset (a multiple of 256) and length */
    int decay;
} update_piece;

/* A host piece of the arena: [base, base + n) in one optimizer state. One rank: the embed group,
 * and layers k.. with the head; ranks: one group's shard each (its pad past the group included). */
typedef struct {
    int64_t base, n;
    mt_optim_state *st;
    void *grads; /* compact/tight: the gradients (compute dtype), on the compute side when
                    grads_dev, else pinned host memory; full: NULL (the upload copy holds them);
                    frozen: NULL (none) */
    int grads_dev;
} host_piece;

struct mt_train_state {
    const mt_param_table *t;
    mt_backend *be;
    mt_train_state_opts o;
    mt_dtype up_dtype;   /* of the host pieces' upload arenas */
    size_t elem;         /* compute dtype bytes (gradients) */
    host_piece *host;    /* one rank: [0] embed, [1] layers k.. and the head; ranks: a shard a group */
    int n_host;
    int *group_piece;    /* [layer + 1]: the host piece of the group (-1: in the GPU tier) */
    int rank, ranks;     /* data parallel: this rank's shard of every group (ranks 1: all) */
    /* ranks: a collective read's place in its sequence and the gathered group (padded): fp32
     * weights, and full's moments or the 8-bit ones with their scales */
    int seq;
    float *g_w, *g_m, *g_v, *g_ms, *g_vs;
    uint8_t *g_mq, *g_vq;

    /* the GPU tier: layers [0, k) at arena [tier_base, tier_base + tier_n) */
    int64_t tier_base, tier_n;
    mt_optim_arenas tier;  /* compute-side arenas */
    void *tier_weights;    /* compute dtype: tier.w itself, or a widened copy (cpu, 8-bit formats) */
    void *tier_grads;      /* compute side, compute dtype (frozen: NULL) */
    mt_optim_state *mirror;/* one layer on the host: converts the tier's weights for io */

    update_piece *pieces;  /* every group's update calls, in update order */
    int n_pieces;
    int *group_first;      /* [layer + 1]: the group's first piece; [L + 2] = n_pieces */

    /* update_on_device: two compute-side slots of a piece's state (its whole blocks), used in
     * turn, so that one piece's state goes up while the previous one's comes down */
    struct {
        mt_optim_arenas a;
        size_t cap;             /* elements a slot holds */
        mt_event *up, *done, *down;
        int used;               /* a download was enqueued (down is worth waiting for) */
        int layer;              /* the group of that download */
    } stage[2];
    int stage_next, on_device;
    /* update_on_device: the group whose state may still be coming back (NO_GROUP: none); the
     * next group's pieces go up meanwhile, so the slots never drain between groups */
    int unsettled;
    mt_group_done_fn done_fn; /* told when a group is done (mt_train_state_on_group_done) */
    void *done_ctx;

    /* compute-side gradients of host groups, fetched a piece ahead of the update */
    void *fetch_buf[2];
    mt_event *fetched[2];
    int held[2];           /* the piece each buffer holds or is receiving (-1: none) */
    int next;              /* the next piece to fetch (n_pieces: none left) */
    int fetch_next;        /* the buffer the next fetch uses */

    mt_state_io io;
};

#define NO_GROUP (-100) /* below the embed group's -1 */

/* ---- places ---- */

/* The 8-bit formats: their gradients wait in a place of their own (full's wait in the upload
 * copy; frozen has none). */
static int grads_apart(mt_state_format f) { return f == MT_STATE_COMPACT || f == MT_STATE_TIGHT; }

int mt_train_state_streams_update(const mt_train_state_opts *o) {
    return o->update_on_device && o->grads_on_device && grads_apart(o->format) && o->ranks <= 1;
}

int mt_train_state_in_tier(const mt_train_state *s, int layer) {
    return layer >= 0 && layer < s->o.gpu_layers;
}

/* Whether group `layer` is held outside the state (o.layers_outside). */
static int outside(const mt_train_state *s, int layer) {
    return s->o.layers_outside && layer >= s->o.gpu_layers && layer < s->t->cfg.L;
}

static host_piece *piece_of(const mt_train_state *s, int layer) {
    MT_CHECK(!mt_train_state_in_tier(s, layer), "group %d is in the GPU tier", layer);
    MT_CHECK(!outside(s, layer), "group %d is held outside the training state", layer);
    return &s->host[s->group_piece[layer + 1]];
}

int64_t mt_shard_size(int64_t n, int ranks) {
    if (ranks <= 1) return n;
    int64_t per = (n + ranks - 1) / ranks;
    return (per + MT_OPTIM_BLOCK - 1) / MT_OPTIM_BLOCK * MT_OPTIM_BLOCK;
}

int64_t mt_train_state_shard(const mt_train_state *s, int layer) {
    return mt_shard_size(mt_group_size(s->t, layer), s->ranks);
}

/* The arena offset of this rank's first element of group `layer` (one rank: the group's). */
static int64_t group_start(const mt_train_state *s, int layer) {
    return mt_group_offset(s->t, layer) + (int64_t)s->rank * mt_train_state_shard(s, layer);
}

/* The piece of the arena offset off (a tensor's): -1 tier, 0/1 host. */
static int piece_index_at(const mt_train_state *s, int64_t off) {
    if (off < s->host[0].base + s->host[0].n) return 0;
    if (off < s->tier_base + s->tier_n) return -1;
    if (s->o.layers_outside && off < s->t->head_offset) return -2; /* held outside */
    return 1;
}

static size_t up_size(const mt_train_state *s) { return mt_dtype_size(s->up_dtype); }

void *mt_train_state_upload(const mt_train_state *s, int layer) {
    const host_piece *p = piece_of(s, layer);
    int64_t off = group_start(s, layer) - p->base;
    return (char *)mt_optim_state_upload(p->st) + (size_t)off * up_size(s);
}

mt_dtype mt_train_state_upload_dtype(const mt_train_state *s) { return s->up_dtype; }

void *mt_train_state_tier_weights(const mt_train_state *s, int layer) {
    MT_CHECK(mt_train_state_in_tier(s, layer), "layer %d is not in the GPU tier", layer);
    return (char *)s->tier_weights + (size_t)layer * s->t->layer_size * s->elem;
}

void *mt_train_state_grad_dev(const mt_train_state *s, int layer) {
    int64_t off = group_start(s, layer);
    if (s->o.format == MT_STATE_FROZEN) return NULL; /* no gradient anywhere */
    if (mt_train_state_in_tier(s, layer))
        return (char *)s->tier_grads + (size_t)(off - s->tier_base) * s->elem;
    const host_piece *p = piece_of(s, layer);
    return p->grads_dev ? (char *)p->grads + (size_t)(off - p->base) * s->elem : NULL;
}

void *mt_train_state_grad_host(const mt_train_state *s, int layer) {
    if (mt_train_state_in_tier(s, layer)) return NULL;
    const host_piece *p = piece_of(s, layer);
    if (p->grads_dev || s->o.format == MT_STATE_FROZEN) return NULL; /* frozen: no gradient */
    if (!p->grads) return mt_train_state_upload(s, layer); /* full: the dead upload copy */
    return (char *)p->grads + (size_t)(group_start(s, layer) - p->base) * s->elem;
}

/* ---- sizes ---- */

static int64_t tier_size(const mt_param_table *t, int k) { return (int64_t)k * t->layer_size; }

void mt_train_state_bytes_of(const mt_param_table *t, mt_dtype compute, const mt_train_state_opts *o,
                             mt_train_state_bytes *b) {
    double el = (double)mt_dtype_size(compute);
    double n_tier = (double)tier_size(t, o->gpu_layers), n_host = (double)t->total - n_tier;
    if (o->layers_outside) n_host = (double)(t->embed_size + t->head_size); /* the layers: outside */
    if (o->ranks > 1) { /* this rank's shards (no tier with ranks) */
        n_host = 0;
        for (int g = MT_GROUP_EMBED; g <= t->cfg.L; g++)
            n_host += (double)mt_shard_size(mt_group_size(t, g), o->ranks);
    }
    memset(b, 0, sizeof *b);
    double per = mt_optim_bytes_per_param(o->format);
    if (o->format == MT_STATE_FROZEN) {
        /* the weights in the compute dtype, which is what the forward uploads; no gradients */
        b->host_weights = mt_optim_bytes_per_param_up(o->format, compute) * n_host;
        b->dev_tier = el * n_tier;
        b->host_total = b->host_weights;
        b->dev_total = b->dev_tier;
        return;
    }
    if (o->format == MT_STATE_FULL) {
        b->host_weights = 4 * n_host;
        b->host_moments = 8 * n_host;
        b->host_upload = el * n_host;
        b->dev_tier = n_tier * (12 + el);
    } else {
        b->host_weights = (per - 2 - 2.0 * sizeof(float) / MT_OPTIM_BLOCK) * n_host; /* master (+comp) */
        b->host_moments = (2 + 2.0 * sizeof(float) / MT_OPTIM_BLOCK) * n_host;
        b->host_upload = 0; /* the bf16 master is uploaded */
        b->dev_tier = n_tier * per + (compute == MT_BF16 ? 0 : n_tier * el); /* + widened copy */
        if (o->grads_on_device) b->dev_grads = el * n_host;
        else b->host_grads = el * n_host;
    }
    b->dev_grads += el * n_tier;
    double piece = (double)(mt_group_max_size(t) < FETCH_PIECE ? mt_group_max_size(t) : FETCH_PIECE);
    if (mt_train_state_streams_update(o)) /* the two staging slots, counted with the gradients they consume */
        b->dev_grads += 2.0 * per * (piece + MT_OPTIM_BLOCK);
    else if (o->grads_on_device && grads_apart(o->format))
        b->host_grads += 2.0 * el * piece;
    b->host_total = b->host_weights + b->host_moments + b->host_upload + b->host_grads;
    b->dev_total = b->dev_tier + b->dev_grads;
}

/* ---- create, free ---- */

static void *pinned_alloc(void *ctx, size_t bytes) {
    mt_backend *be = ctx;
    return be->host_alloc(be, bytes);
}
static void pinned_free(void *ctx, void *p) {
    mt_backend *be = ctx;
    be->host_free(be, p);
}

static void host_piece_init(mt_train_state *s, host_piece *p, int64_t base, int64_t n) {
    mt_backend *be = s->be;
    p->base = base;
    p->n = n;
    mt_optim_alloc a = {.alloc = pinned_alloc, .free = pinned_free, .ctx = be,
                        .upload_dtype = s->up_dtype, .all = mt_train_state_streams_update(&s->o)};
    p->st = mt_optim_state_create(s->o.format, (size_t)n, s->o.seed, &a);
    mt_optim_state_set_index_base(p->st, (uint64_t)base);
    if (!grads_apart(s->o.format)) return; /* full: in the upload copy; frozen: none */
    size_t bytes = (size_t)n * s->elem;
    p->grads_dev = s->o.grads_on_device;
    p->grads = p->grads_dev ? be->alloc(be, bytes) : be->host_alloc(be, bytes);
}

static void *dev_alloc(mt_backend *be, size_t bytes) { return bytes ? be->alloc(be, bytes) : NULL; }

/* d's arenas on the compute side for n elements and nb blocks: those that m (a state of the
 * format) has. */
static void dev_arenas_like(mt_backend *be, mt_optim_arenas *d, const mt_optim_arenas *m, size_t n,
                            size_t nb) {
    d->w = dev_alloc(be, n * mt_dtype_size(m->w_dtype));
    d->master = m->master ? dev_alloc(be, n * 4) : NULL;
    d->m = m->m ? dev_alloc(be, n * 4) : NULL;
    d->v = m->v ? dev_alloc(be, n * 4) : NULL;
    d->comp = m->comp ? dev_alloc(be, n * 2) : NULL;
    d->mq = m->mq ? dev_alloc(be, n) : NULL;
    d->vq = m->vq ? dev_alloc(be, n) : NULL;
    d->ms = m->ms ? dev_alloc(be, nb * 4) : NULL;
    d->vs = m->vs ? dev_alloc(be, nb * 4) : NULL;
}

/* The tier's arenas on the compute side, as the mirror's (a zero state) repeated per layer. */
static void tier_init(mt_train_state *s) {
    mt_backend *be = s->be;
    const mt_param_table *t = s->t;
    int k = s->o.gpu_layers;
    s->tier_base = mt_group_offset(t, 0);
    s->tier_n = tier_size(t, k);
    mt_optim_alloc a = {.upload_dtype = s->up_dtype};
    s->mirror = mt_optim_state_create(s->o.format, (size_t)t->layer_size, s->o.seed, &a);
    if (!k) return;
    mt_optim_arenas m = mt_optim_state_arenas(s->mirror);
    size_t n = (size_t)s->tier_n, nb = (n + MT_OPTIM_BLOCK - 1) / MT_OPTIM_BLOCK;
    mt_optim_arenas *d = &s->tier;
    *d = m;
    d->n = n;
    d->nblocks = nb;
    d->seed = s->o.seed;
    d->index_base = (uint64_t)s->tier_base;
    dev_arenas_like(be, d, &m, n, nb);
    /* every layer starts as the zero mirror */
    size_t ln = (size_t)t->layer_size, lb = ln / MT_OPTIM_BLOCK;
    for (int l = 0; l < k; l++) {
        size_t o = (size_t)l * ln;
        be->upload(be, (char *)d->w + o * mt_dtype_size(m.w_dtype), m.w, ln * mt_dtype_size(m.w_dtype));
        if (d->master) be->upload(be, d->master + o, m.master, ln * 4);
        if (d->m) be->upload(be, d->m + o, m.m, ln * 4);
        if (d->v) be->upload(be, d->v + o, m.v, ln * 4);
        if (d->comp) be->upload(be, d->comp + o, m.comp, ln * 2);
        if (d->mq) be->upload(be, d->mq + o, m.mq, ln);
        if (d->vq) be->upload(be, d->vq + o, m.vq, ln);
        if (d->ms) be->upload(be, d->ms + (size_t)l * lb, m.ms, lb * 4);
        if (d->vs) be->upload(be, d->vs + (size_t)l * lb, m.vs, lb * 4);
    }
    s->tier_weights = m.w_dtype == be->dtype ? d->w : dev_alloc(be, n * s->elem);
    if (s->tier_weights != d->w) be->from_bf16(be, s->tier_weights, d->w, n);
    /* frozen: the LoRA engine never writes the base's gradients */
    s->tier_grads = s->o.format == MT_STATE_FROZEN ? NULL : dev_alloc(be, n * s->elem);
}

/* The staging slots of update_on_device: the mirror's arenas (what this format has) for the
 * largest piece plus a block (a piece's whole blocks). */
static void stage_init(mt_train_state *s) {
    if (!mt_train_state_streams_update(&s->o)) return;
    mt_backend *be = s->be;
    mt_optim_arenas m = mt_optim_state_arenas(s->mirror);
    int64_t gmax = mt_group_max_size(s->t);
    size_t cap = (size_t)(gmax < FETCH_PIECE ? gmax : FETCH_PIECE) + MT_OPTIM_BLOCK;
    size_t nb = cap / MT_OPTIM_BLOCK + 1;
    for (int i = 0; i < 2; i++) {
        mt_optim_arenas *d = &s->stage[i].a;
        *d = m;
        dev_arenas_like(be, d, &m, cap, nb);
        s->stage[i].cap = cap;
        s->stage[i].up = be->event_create(be);
        s->stage[i].done = be->event_create(be);
        s->stage[i].down = be->event_create(be);
    }
    s->on_device = 1;
}

static void stage_free(mt_train_state *s) {
    mt_backend *be = s->be;
    for (int i = 0; i < 2 && s->on_device; i++) {
        mt_optim_arenas *d = &s->stage[i].a;
        void *p[] = {d->w, d->master, d->m, d->v, d->comp, d->mq, d->vq, d->ms, d->vs};
        for (size_t j = 0; j < sizeof p / sizeof p[0]; j++)
            if (p[j]) be->free(be, p[j]);
        be->event_destroy(be, s->stage[i].up);
        be->event_destroy(be, s->stage[i].done);
        be->event_destroy(be, s->stage[i].down);
    }
}

static void init_io(mt_train_state *s);
static void free_gathered(mt_train_state *s);

/* A run of the update, cut to this rank's shard of its group (ranks 1: the whole run). */
static void add_piece(mt_train_state *s, int layer, int64_t off, int64_t n, int decay) {
    int64_t lo = group_start(s, layer), hi = lo + mt_train_state_shard(s, layer);
    if (off < lo) n -= lo - off, off = lo;
    if (off + n > hi) n = hi - off;
    for (int64_t o = 0; o < n; o += FETCH_PIECE) {
        s->pieces = realloc(s->pieces, (size_t)(s->n_pieces + 1) * sizeof *s->pieces);
        MT_CHECK(s->pieces != NULL, "out of memory");
        update_piece pc = {layer, off + o, n - o < FETCH_PIECE ? n - o : FETCH_PIECE, decay};
        s->pieces[s->n_pieces++] = pc;
    }
}

/* The update pieces: runs of tensors (table order is arena order, group by group). */
static void make_pieces(mt_train_state *s) {
    const mt_param_table *t = s->t;
    int L = t->cfg.L;
    s->group_first = mt_calloc((size_t)L + 3, sizeof(int));
    int run_layer = -2, run_decay = 0;
    int64_t run_off = 0, run_end = 0;
    for (int i = 0; i <= t->n_params; i++) {
        const mt_param *p = i < t->n_params ? &t->params[i] : NULL;
        int decay = p && p->ndim >= 2;
        if (p && p->layer == run_layer && decay == run_decay) {
            run_end = p->offset + p->numel;
            continue;
        }
        if (run_layer > -2) add_piece(s, run_layer, run_off, run_end - run_off, run_decay);
        if (!p) break;
        MT_CHECK(p->layer >= run_layer, "parameter table not in group order at %s", p->name);
        for (int g = run_layer + 1; g <= p->layer; g++) s->group_first[g + 1] = s->n_pieces;
        run_layer = p->layer, run_decay = decay, run_off = p->offset, run_end = p->offset + p->numel;
    }
    for (int g = run_layer + 1; g <= L + 1; g++) s->group_first[g + 1] = s->n_pieces;
}

mt_train_state *mt_train_state_create(const mt_param_table *t, mt_backend *be,
                                      const mt_train_state_opts *o) {
    int L = t->cfg.L;
    MT_CHECK(o->gpu_layers >= 0 && o->gpu_layers <= L, "GPU tier of %d layers: the model has %d",
             o->gpu_layers, L);
    MT_CHECK(t->layer_size % MT_OPTIM_BLOCK == 0 && t->embed_size % MT_OPTIM_BLOCK == 0,
             "parameter groups must be multiples of %d elements", MT_OPTIM_BLOCK);
    int ranks = o->ranks > 1 ? o->ranks : 1;
    MT_CHECK(!o->layers_outside || (o->format == MT_STATE_FROZEN && ranks == 1),
             "layers held outside the state: a frozen state on one rank only");
    MT_CHECK(ranks == 1 || (o->comm && mt_comm_size(o->comm) == ranks),
             "a state sharded over %d ranks needs their comm", ranks);
    MT_CHECK(ranks == 1 || o->gpu_layers == 0, "a state sharded over ranks has no GPU tier");
    mt_train_state *s = mt_calloc(1, sizeof *s);
    s->t = t;
    s->be = be;
    s->o = *o;
    s->ranks = ranks;
    s->rank = ranks > 1 ? mt_comm_rank(o->comm) : 0;
    s->unsettled = NO_GROUP;
    s->elem = mt_dtype_size(be->dtype);
    /* full, frozen: an upload copy in the compute dtype; compact, tight: their bf16 master */
    s->up_dtype = grads_apart(o->format) ? MT_BF16 : be->dtype;
    make_pieces(s);
    tier_init(s);
    s->group_piece = mt_calloc((size_t)L + 2, sizeof(int));
    if (ranks == 1) {
        s->n_host = 2;
        s->host = mt_calloc(2, sizeof *s->host);
        host_piece_init(s, &s->host[0], 0, t->embed_size);
        int64_t b1 = o->layers_outside ? t->head_offset : s->tier_base + s->tier_n;
        host_piece_init(s, &s->host[1], b1, t->total - b1);
        for (int g = MT_GROUP_EMBED; g <= L; g++)
            s->group_piece[g + 1] = g == MT_GROUP_EMBED ? 0 : mt_train_state_in_tier(s, g) ? -1 : 1;
    } else {
        s->n_host = L + 2;
        s->host = mt_calloc((size_t)s->n_host, sizeof *s->host);
        for (int g = MT_GROUP_EMBED; g <= L; g++) {
            host_piece_init(s, &s->host[g + 1], group_start(s, g), mt_train_state_shard(s, g));
            s->group_piece[g + 1] = g + 1;
        }
    }
    stage_init(s);
    if (o->grads_on_device && grads_apart(o->format) && !s->on_device) {
        for (int i = 0; i < 2; i++) {
            int64_t n = mt_group_max_size(t) < FETCH_PIECE ? mt_group_max_size(t) : FETCH_PIECE;
            s->fetch_buf[i] = be->host_alloc(be, (size_t)n * s->elem);
            s->fetched[i] = be->event_create(be);
        }
    }
    init_io(s);
    return s;
}

void mt_train_state_free(mt_train_state *s) {
    if (!s) return;
    mt_backend *be = s->be;
    for (int i = 0; i < s->n_host; i++) {
        host_piece *p = &s->host[i];
        mt_optim_state_free(p->st);
        if (p->grads) {
            if (p->grads_dev) be->free(be, p->grads);
            else be->host_free(be, p->grads);
        }
    }
    free(s->host);
    free(s->group_piece);
    free_gathered(s);
    for (int i = 0; i < 2; i++) {
        if (s->fetch_buf[i]) be->host_free(be, s->fetch_buf[i]);
        if (s->fetched[i]) be->event_destroy(be, s->fetched[i]);
    }
    mt_optim_arenas *d = &s->tier;
    if (s->tier_weights && s->tier_weights != d->w) be->free(be, s->tier_weights);
    void *dev[] = {d->w, d->master, d->m, d->v, d->comp, d->mq, d->vq, d->ms, d->vs, s->tier_grads};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) be->free(be, dev[i]);
    stage_free(s);
    mt_optim_state_free(s->mirror);
    free(s->pieces);
    free(s->group_first);
    free(s);
}

int mt_train_state_n_pieces(const mt_train_state *s) { return s->n_pieces; }
int mt_train_state_updates_on_device(const mt_train_state *s) { return s->on_device; }
void mt_train_state_on_group_done(mt_train_state *s, mt_group_done_fn fn, void *ctx) {
    s->done_fn = fn;
    s->done_ctx = ctx;
}

/* ---- updates ---- */

static mt_optim_step step_args(const mt_adamw_hparams *hp, const update_piece *pc, int64_t step,
                               float grad_scale) {
    mt_optim_step a = {.lr = hp->lr, .beta1 = hp->beta1, .beta2 = hp->beta2, .eps = hp->eps,
                       .weight_decay = pc->decay ? hp->weight_decay : 0.0, .step = step,
                       .grad_scale = grad_scale};
    return a;
}

/* Whether piece k's gradient waits on the compute side for a host update (it is fetched). */
static int fetched_piece(const mt_train_state *s, int k) {
    int l = s->pieces[k].layer;
    return !mt_train_state_in_tier(s, l) && piece_of(s, l)->grads_dev;
}

/* Starts the copy of the next fetched piece into the next buffer (whose update is over). */
static void fetch_one(mt_train_state *s) {
    while (s->next < s->n_pieces && !fetched_piece(s, s->next)) s->next++;
    if (s->next >= s->n_pieces) return;
    mt_backend *be = s->be;
    const update_piece *pc = &s->pieces[s->next];
    int b = s->fetch_next;
    s->fetch_next ^= 1;
    s->held[b] = s->next++;
    const char *src = (const char *)mt_train_state_grad_dev(s, pc->layer) +
                      (size_t)(pc->offset - group_start(s, pc->layer)) * s->elem;
    be->copy_async(be, MT_STREAM_D2H, s->fetch_buf[b], src, (size_t)pc->n * s->elem);
    be->event_record(be, s->fetched[b], MT_STREAM_D2H);
}

void mt_train_state_begin_update(mt_train_state *s) {
    s->seq = 0; /* the weights change: a read starts over */
    s->unsettled = NO_GROUP;
    if (!s->fetch_buf[0]) return;
    s->fetch_next = 0;
    s->held[0] = s->held[1] = -1;
    s->next = 0;
    fetch_one(s);
    fetch_one(s);
}

/* Piece k's fetched gradient: its copy is done. */
static const void *fetched(mt_train_state *s, int k) {
    int b = s->held[0] == k ? 0 : 1;
    MT_CHECK(s->held[b] == k, "the gradient of update piece %d was not fetched", k);
    s->be->event_sync(s->be, s->fetched[b]);
    return s->fetch_buf[b];
}

/* Copies the arenas' elements [e0, e0 + d->n) and blocks [b0, b0 + d->nblocks) of host state h
 * to the slot d (up) or back (down), on stream st. */
static void stage_copy(mt_backend *be, mt_stream st, const mt_optim_arenas *d,
                       const mt_optim_arenas *h, size_t e0, size_t b0, int up) {
    size_t n = d->n, nb = d->nblocks, ws = mt_dtype_size(h->w_dtype);
    struct { void *dev, *host; size_t bytes; } part[] = {
        {d->w, h->w ? (char *)h->w + e0 * ws : NULL, n * ws},
        {d->master, h->master ? h->master + e0 : NULL, n * 4},
        {d->m, h->m ? h->m + e0 : NULL, n * 4},
        {d->v, h->v ? h->v + e0 : NULL, n * 4},
        {d->comp, h->comp ? h->comp + e0 : NULL, n * 2},
        {d->mq, h->mq ? h->mq + e0 : NULL, n},
        {d->vq, h->vq ? h->vq + e0 : NULL, n},
        {d->ms, h->ms ? h->ms + b0 : NULL, nb * 4},
        {d->vs, h->vs ? h->vs + b0 : NULL, nb * 4},
    };
    for (size_t i = 0; i < sizeof part / sizeof part[0]; i++) {
        if (!part[i].dev) continue;
        if (up) be->copy_async(be, st, part[i].dev, part[i].host, part[i].bytes);
        else be->copy_async(be, st, part[i].host, part[i].dev, part[i].bytes);
    }
}

/* update_on_device: piece pc of host piece hp_ on the compute side. Its whole blocks go up to the
 * next slot (once that slot's previous download is over), optim_update runs there with the
 * gradient where it waits (as the tier's does: the host kernel's bits; the index base keeps
 * tight's rounding that of the whole arena), and the blocks come back; the caller waits for the
 * downloads before the group counts as updated. */
static void update_piece_on_device(mt_train_state *s, host_piece *hp_, const update_piece *pc,
                                   const mt_optim_step *a) {
    mt_backend *be = s->be;
    mt_optim_arenas h = mt_optim_state_arenas(hp_->st);
    size_t off = (size_t)(pc->offset - hp_->base), n = (size_t)pc->n, B = MT_OPTIM_BLOCK;
    size_t b0 = off / B, b1 = (off + n + B - 1) / B;
    if (b1 > h.nblocks) b1 = h.nblocks;
    size_t e0 = b0 * B, e1 = b1 * B < h.n ? b1 * B : h.n;
    int k = s->stage_next;
    s->stage_next ^= 1;
    if (s->stage[k].used) be->event_sync(be, s->stage[k].down);
    MT_CHECK(e1 - e0 <= s->stage[k].cap, "update piece of %zu elements over the staging slot's %zu",
             e1 - e0, s->stage[k].cap);
    mt_optim_arenas d = s->stage[k].a;
    d.n = e1 - e0;
    d.nblocks = b1 - b0;
    d.seed = h.seed;
    d.index_base = h.index_base + e0;
    stage_copy(be, MT_STREAM_H2D, &d, &h, e0, b0, 1);
    be->event_record(be, s->stage[k].up, MT_STREAM_H2D);
    be->stream_wait(be, MT_STREAM_COMPUTE, s->stage[k].up);
    be->optim_update(be, &d, a, off - e0, n, (const char *)hp_->grads + off * s->elem, be->dtype);
    be->event_record(be, s->stage[k].done, MT_STREAM_COMPUTE);
    be->stream_wait(be, MT_STREAM_D2H, s->stage[k].done);
    stage_copy(be, MT_STREAM_D2H, &d, &h, e0, b0, 0);
    be->event_record(be, s->stage[k].down, MT_STREAM_D2H);
    s->stage[k].used = 1;
    s->stage[k].layer = pc->layer;
}

static void group_done(mt_train_state *s, int layer) {
    if (s->done_fn) s->done_fn(s->done_ctx, layer);
}

/* The unsettled group is back once no slot's last download is its own: a slot is reused only
 * after its download (update_piece_on_device), so two pieces of the next group settle it without
 * a wait. wait: wait for what is left (a one-piece group next, a group not streamed, the end). */
static void settle(mt_train_state *s, int wait) {
    if (s->unsettled == NO_GROUP) return;
    for (int i = 0; i < 2; i++) {
        if (!s->stage[i].used || s->stage[i].layer != s->unsettled) continue;
        if (!wait) return;
        s->be->event_sync(s->be, s->stage[i].down);
        s->stage[i].used = 0;
    }
    group_done(s, s->unsettled);
    s->unsettled = NO_GROUP;
}

/* update_on_device: group `layer` piece by piece through the slots; done (settle) when its state,
 * the upload copy the next forward reads among it, is back. */
static void update_streamed(mt_train_state *s, int layer, const mt_adamw_hparams *hp, int64_t step,
                            float grad_scale) {
    for (int k = s->group_first[layer + 1]; k < s->group_first[layer + 2]; k++) {
        mt_optim_step a = step_args(hp, &s->pieces[k], step, grad_scale);
        update_piece_on_device(s, piece_of(s, layer), &s->pieces[k], &a);
        settle(s, 0); /* the group before, once its downloads are over */
    }
    settle(s, 1);
    s->unsettled = layer;
}

/* Group `layer` on the host, piece by piece (restore: only consumes the fetched gradients; a
 * streamed update fetched none). */
static void update_pieces(mt_train_state *s, int layer, const mt_adamw_hparams *hp, int64_t step,
                          float grad_scale, int restore) {
    host_piece *hp_ = piece_of(s, layer);
    int64_t goff = group_start(s, layer);
    if (s->on_device && hp_->grads_dev) return;
    for (int k = s->group_first[layer + 1]; k < s->group_first[layer + 2]; k++) {
        const update_piece *pc = &s->pieces[k];
        const void *g = hp_->grads_dev ? fetched(s, k)
                                       : (const char *)mt_train_state_grad_host(s, layer) +
                                             (size_t)(pc->offset - goff) * s->elem;
        if (!restore) {
            mt_optim_step a = step_args(hp, pc, step, grad_scale);
            MT_CHECK(mt_optim_state_update(hp_->st, &a, (size_t)(pc->offset - hp_->base), (size_t)pc->n, g,
                                           s->be->dtype, s->o.n_threads) == MT_OK,
                     "%s", mt_error_message());
        }
        if (hp_->grads_dev) fetch_one(s); /* into the buffer just used */
    }
}

/* Group `layer`, whose update (if any) is over: done once those before it are. */
static void done_in_order(mt_train_state *s, int layer) {
    settle(s, 1);
    group_done(s, layer);
}

void mt_train_state_update_group(mt_train_state *s, int layer, const mt_adamw_hparams *hp,
                                 int64_t step, float grad_scale) {
    if (mt_train_state_in_tier(s, layer) || s->o.format == MT_STATE_FROZEN) {
        done_in_order(s, layer); /* nothing to update here */
    } else if (s->on_device && piece_of(s, layer)->grads_dev) {
        update_streamed(s, layer, hp, step, grad_scale);
    } else {
        update_pieces(s, layer, hp, step, grad_scale, 0);
        done_in_order(s, layer);
    }
}

void mt_train_state_end_update(mt_train_state *s) { settle(s, 1); }

static void restore_weights(mt_train_state *s, int layer) {
    /* frozen: no update ever touched the weights */
    if (mt_train_state_in_tier(s, layer) || s->o.format == MT_STATE_FROZEN) return;
    host_piece *pc = piece_of(s, layer);
    if (pc->grads) {
        /* compact/tight: the gradient never touched the weights; a pending fetch is dropped */
        if (pc->grads_dev) update_pieces(s, layer, NULL, 0, 0, 1);
        return;
    }
    /* full: the upload copy held the gradient; it comes back from master as the update writes it */
    const mt_param_table *t = s->t;
    mt_optim_arenas a = mt_optim_state_arenas(pc->st);
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        if (p->layer != layer) continue;
        /* the tensor's part in this piece (ranks: in this rank's shard) */
        int64_t lo = p->offset > pc->base ? p->offset : pc->base;
        int64_t hi = p->offset + p->numel < pc->base + pc->n ? p->offset + p->numel : pc->base + pc->n;
        if (hi <= lo) continue;
        size_t off = (size_t)(lo - pc->base), n = (size_t)(hi - lo);
        if (s->up_dtype == MT_BF16) mt_convert_f32_to_bf16((mt_bf16 *)a.w + off, a.master + off, n);
        else memcpy((float *)a.w + off, a.master + off, n * sizeof(float));
    }
}

void mt_train_state_restore_group(mt_train_state *s, int layer) {
    restore_weights(s, layer);
    done_in_order(s, layer);
}

void mt_train_state_update_tier(mt_train_state *s, const mt_adamw_hparams *hp, int64_t step,
                                float grad_scale) {
    if (!s->o.gpu_layers || s->o.format == MT_STATE_FROZEN) return;
    mt_backend *be = s->be;
    for (int k = s->group_first[1]; k < s->group_first[s->o.gpu_layers + 1]; k++) {
        const update_piece *pc = &s->pieces[k];
        mt_optim_step a = step_args(hp, pc, step, grad_scale);
        size_t off = (size_t)(pc->offset - s->tier_base);
        be->optim_update(be, &s->tier, &a, off, (size_t)pc->n,
                         (const char *)s->tier_grads + off * s->elem, be->dtype);
    }
    if (s->tier_weights != s->tier.w) be->from_bf16(be, s->tier_weights, s->tier.w, (size_t)s->tier_n);
}

static size_t w_size(const mt_optim_arenas *a) { return mt_dtype_size(a->w_dtype); }

/* The tier's weight arenas of tensor p <-> the mirror at p's offset in its layer. */
static void tier_weights_copy(mt_train_state *s, const mt_param *p, int to_device) {
    mt_backend *be = s->be;
    mt_optim_arenas m = mt_optim_state_arenas(s->mirror), *d = &s->tier;
    size_t lo = (size_t)p->group_offset, off = (size_t)(p->offset - s->tier_base), n = (size_t)p->numel;
    struct { void *dev, *host; size_t el; } r[] = {
        {d->w, m.w, w_size(d)}, {d->master, m.master, 4}, {d->comp, m.comp, 2}};
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        if (!r[i].dev) continue;
        char *dv = (char *)r[i].dev + off * r[i].el, *hv = (char *)r[i].host + lo * r[i].el;
        if (to_device) be->upload(be, dv, hv, n * r[i].el);
        else be->download(be, hv, dv, n * r[i].el);
    }
    if (to_device && s->tier_weights != d->w)
        be->from_bf16(be, (char *)s->tier_weights + off * s->elem, (mt_bf16 *)d->w + off, n);
}

/* ---- tensor by tensor, sharded over ranks ----
 * Writes keep this rank's part of the tensor. A read is collective: the ranks gather one whole
 * group at a time, in the one order a reader of the whole state takes (mt_checkpoint_save: every
 * tensor's weights in table order, then every tensor's parts). Step q of that sequence gathers
 * the weights of group q - 1 (q < L + 2), then the optimizer arenas of group q - (L + 2) - 1. A
 * get_* call advances the sequence to its group, gathering on the way; every rank makes the
 * same calls. (A checkpoint save reads no whole tensor: each rank writes its own elements.) */

/* p's part in this rank's shard: arena [*lo, *hi) (empty when *hi <= *lo). */
static const host_piece *shard_part(const mt_train_state *s, const mt_param *p, int64_t *lo, int64_t *hi) {
    const host_piece *pc = piece_of(s, p->layer);
    *lo = p->offset > pc->base ? p->offset : pc->base;
    *hi = p->offset + p->numel < pc->base + pc->n ? p->offset + p->numel : pc->base + pc->n;
    return pc;
}

static int64_t largest_shard(const mt_train_state *s) {
    int64_t most = 0;
    for (int g = MT_GROUP_EMBED; g <= s->t->cfg.L; g++)
        if (mt_train_state_shard(s, g) > most) most = mt_train_state_shard(s, g);
    return most;
}

/* block (this rank's, n elements of dtype at mine) of every rank into *all (allocated on first
 * use for the largest group), in place. */
static int gather_into(mt_train_state *s, void **all, const void *mine, size_t n, mt_dtype dtype) {
    size_t es = mt_dtype_size(dtype), most = (size_t)largest_shard(s) * (size_t)s->ranks;
    if (!*all) *all = mt_aligned_alloc(most * es);
    char *dst = (char *)*all + (size_t)s->rank * n * es;
    memcpy(dst, mine, n * es);
    /* host memory on every comm (the nccl comm's device collectives would not take it) */
    return mt_comm_all_gather_host(s->o.comm, *all, dst, n * es);
}

static int gather_step(mt_train_state *s, int q) {
    int G = s->t->cfg.L + 2;
    int g = (q < G ? q : q - G) - 1;
    const host_piece *pc = piece_of(s, g);
    size_t S = (size_t)pc->n;
    if (q < G) {
        float *w = mt_aligned_alloc(S * sizeof(float));
        mt_optim_state_get_weights(pc->st, 0, w, S);
        int rc = gather_into(s, (void **)&s->g_w, w, S, MT_F32);
        free(w);
        return rc;
    }
    mt_optim_arenas a = mt_optim_state_arenas(pc->st);
    if (a.f == MT_STATE_FROZEN) return MT_OK; /* no optimizer parts to gather */
    if (a.f == MT_STATE_FULL) {
        MT_TRY(gather_into(s, (void **)&s->g_m, a.m, S, MT_F32));
        return gather_into(s, (void **)&s->g_v, a.v, S, MT_F32);
    }
    MT_TRY(gather_into(s, (void **)&s->g_mq, a.mq, S, MT_U8));
    MT_TRY(gather_into(s, (void **)&s->g_vq, a.vq, S, MT_U8));
    MT_TRY(gather_into(s, (void **)&s->g_ms, a.ms, S / MT_OPTIM_BLOCK, MT_F32));
    return gather_into(s, (void **)&s->g_vs, a.vs, S / MT_OPTIM_BLOCK, MT_F32);
}

/* The sequence up to and including step q. */
static int gather_to(mt_train_state *s, int q) {
    if (q < s->seq - 1)
        return mt_error_set("a sharded state is read group by group in table order, weights before "
                            "parts (step %d asked after %d)", q, s->seq - 1);
    while (s->seq <= q) MT_TRY(gather_step(s, s->seq++));
    return MT_OK;
}

static void free_gathered(mt_train_state *s) {
    void *b[] = {s->g_w, s->g_m, s->g_v, s->g_mq, s->g_vq, s->g_ms, s->g_vs};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) free(b[i]);
    s->g_w = s->g_m = s->g_v = s->g_ms = s->g_vs = NULL;
    s->g_mq = s->g_vq = NULL;
}

static int io_get_weights_sharded(mt_train_state *s, const mt_param *p, float *dst) {
    MT_TRY(gather_to(s, p->layer + 1));
    memcpy(dst, s->g_w + (p->offset - mt_group_offset(s->t, p->layer)), (size_t)p->numel * sizeof(float));
    return MT_OK;
}

static int io_set_weights_sharded(mt_train_state *s, const mt_param *p, const float *src) {
    int64_t lo, hi;
    const host_piece *pc = shard_part(s, p, &lo, &hi);
    if (hi > lo)
        mt_optim_state_set_weights(pc->st, (size_t)(lo - pc->base), src + (lo - p->offset), (size_t)(hi - lo));
    return MT_OK;
}

/* p's parts from the gathered arenas of its whole (padded) group. */
static int io_get_parts_sharded(mt_train_state *s, const mt_param *p, const mt_optim_tensor *parts) {
    MT_TRY(gather_to(s, s->t->cfg.L + 2 + p->layer + 1));
    size_t n = (size_t)mt_train_state_shard(s, p->layer) * (size_t)s->ranks;
    mt_optim_arenas g = {.f = s->o.format, .n = n, .nblocks = n / MT_OPTIM_BLOCK, .m = s->g_m, .v = s->g_v,
                         .mq = s->g_mq, .vq = s->g_vq, .ms = s->g_ms, .vs = s->g_vs};
    mt_optim_tensor src[MT_OPTIM_MAX_TENSORS];
    int k = mt_optim_arenas_parts(&g, (size_t)(p->offset - mt_group_offset(s->t, p->layer)), (size_t)p->numel, src);
    if (k < 0) return MT_ERR;
    for (int i = 0; i < k; i++) {
        MT_CHECK(parts[i].bytes == src[i].bytes, "%s of %s: %zu bytes, expected %zu", src[i].name, p->name,
                 parts[i].bytes, src[i].bytes);
        memcpy(parts[i].data, src[i].data, src[i].bytes);
    }
    return MT_OK;
}

/* This rank's slice of p's parts: element parts (numel long) from element lo - offset, block
 * parts (the scales) from block (lo - offset) / 256 — lo is a shard start or the tensor's, both
 * on a 256 boundary of the tensor. */
static int io_set_parts_sharded(mt_train_state *s, const mt_param *p, const mt_optim_tensor *parts) {
    int64_t lo, hi;
    const host_piece *pc = shard_part(s, p, &lo, &hi);
    if (hi <= lo) return MT_OK;
    mt_optim_arenas a = mt_optim_state_arenas(pc->st);
    mt_optim_tensor mine[MT_OPTIM_MAX_TENSORS];
    int k = mt_optim_arenas_parts(&a, (size_t)(lo - pc->base), (size_t)(hi - lo), mine);
    if (k < 0) return MT_ERR;
    size_t skip_el = (size_t)(lo - p->offset);
    for (int i = 0; i < k; i++) {
        size_t es = mt_dtype_size(mine[i].dtype);
        size_t skip = parts[i].numel == (size_t)p->numel ? skip_el : skip_el / MT_OPTIM_BLOCK;
        MT_CHECK((skip * es + mine[i].bytes) <= parts[i].bytes, "%s of %s: %zu bytes, too few for this shard",
                 mine[i].name, p->name, parts[i].bytes);
        memcpy(mine[i].data, (const char *)parts[i].data + skip * es, mine[i].bytes);
    }
    return MT_OK;
}

/* This rank's own elements, for a checkpoint each rank writes (state_io.h): not collective. */
static void io_owned(void *ctx, const mt_param *p, int64_t *lo, int64_t *hi) {
    shard_part(ctx, p, lo, hi);
    *lo -= p->offset;
    *hi -= p->offset;
    if (*hi <= *lo) *lo = *hi = 0;
}

static int io_get_weights_range(void *ctx, const mt_param *p, int64_t lo, int64_t n, float *dst) {
    const host_piece *pc = piece_of(ctx, p->layer);
    int64_t at = p->offset + lo - pc->base;
    MT_CHECK(at >= 0 && at + n <= pc->n, "weights [%lld, %lld) of %s: not this rank's", (long long)lo,
             (long long)(lo + n), p->name);
    mt_optim_state_get_weights(pc->st, (size_t)at, dst, (size_t)n);
    return MT_OK;
}

static int io_parts_range(void *ctx, const mt_param *p, int64_t lo, int64_t hi, mt_optim_tensor *out) {
    const host_piece *pc = piece_of(ctx, p->layer);
    int64_t at = p->offset + lo - pc->base;
    MT_CHECK(at >= 0 && hi > lo && at + (hi - lo) <= pc->n, "parts [%lld, %lld) of %s: not this rank's",
             (long long)lo, (long long)hi, p->name);
    mt_optim_arenas a = mt_optim_state_arenas(pc->st);
    return mt_optim_arenas_parts(&a, (size_t)at, (size_t)(hi - lo), out);
}

/* ---- tensor by tensor ---- */

static int io_get_weights(void *ctx, const mt_param *p, float *dst) {
    mt_train_state *s = ctx;
    if (s->ranks > 1) return io_get_weights_sharded(s, p, dst);
    int k = piece_index_at(s, p->offset);
    if (k == -2) return mt_error_set("%s: held outside the training state (the quantized base)", p->name);
    if (k < 0) {
        tier_weights_copy(s, p, 0);
        mt_optim_state_get_weights(s->mirror, (size_t)p->group_offset, dst, (size_t)p->numel);
    } else {
        const host_piece *pc = &s->host[k];
        mt_optim_state_get_weights(pc->st, (size_t)(p->offset - pc->base), dst, (size_t)p->numel);
    }
    return MT_OK;
}

static int io_set_weights(void *ctx, const mt_param *p, const float *src) {
    mt_train_state *s = ctx;
    if (s->ranks > 1) return io_set_weights_sharded(s, p, src);
    int k = piece_index_at(s, p->offset);
    if (k == -2) return mt_error_set("%s: held outside the training state (the quantized base)", p->name);
    if (k < 0) {
        mt_optim_state_set_weights(s->mirror, (size_t)p->group_offset, src, (size_t)p->numel);
        tier_weights_copy(s, p, 1);
    } else {
        host_piece *pc = &s->host[k];
        mt_optim_state_set_weights(pc->st, (size_t)(p->offset - pc->base), src, (size_t)p->numel);
    }
    return MT_OK;
}

/* The optimizer parts of p where they live; *dev = 1 when on the compute side. */
static int parts_of(mt_train_state *s, const mt_param *p, mt_optim_tensor *out, int *dev) {
    int k = piece_index_at(s, p->offset);
    *dev = k < 0;
    if (k == -2) return 0; /* held outside: frozen, no parts */
    if (k < 0)
        return mt_optim_arenas_parts(&s->tier, (size_t)(p->offset - s->tier_base), (size_t)p->numel, out);
    mt_optim_arenas a = mt_optim_state_arenas(s->host[k].st);
    return mt_optim_arenas_parts(&a, (size_t)(p->offset - s->host[k].base), (size_t)p->numel, out);
}

static int io_parts(void *ctx, const mt_param *p, const mt_optim_tensor *parts, int set) {
    mt_train_state *s = ctx;
    if (s->ranks > 1) return set ? io_set_parts_sharded(s, p, parts) : io_get_parts_sharded(s, p, parts);
    mt_optim_tensor mine[MT_OPTIM_MAX_TENSORS];
    int dev, n = parts_of(s, p, mine, &dev);
    if (n < 0) return MT_ERR;
    for (int i = 0; i < n; i++) {
        MT_CHECK(parts[i].bytes == mine[i].bytes, "%s of %s: %zu bytes, expected %zu", mine[i].name,
                 p->name, parts[i].bytes, mine[i].bytes);
        if (dev && set) s->be->upload(s->be, mine[i].data, parts[i].data, mine[i].bytes);
        else if (dev) s->be->download(s->be, parts[i].data, mine[i].data, mine[i].bytes);
        else if (set) memcpy(mine[i].data, parts[i].data, mine[i].bytes);
        else memcpy(parts[i].data, mine[i].data, mine[i].bytes);
    }
    return MT_OK;
}

static int io_get_parts(void *ctx, const mt_param *p, const mt_optim_tensor *parts) {
    return io_parts(ctx, p, parts, 0);
}
static int io_set_parts(void *ctx, const mt_param *p, const mt_optim_tensor *parts) {
    return io_parts(ctx, p, parts, 1);
}

static void io_set_sr_seed(void *ctx, uint64_t seed) {
    mt_train_state *s = ctx;
    s->o.seed = seed;
    s->io.sr_seed = seed;
    s->tier.seed = seed;
    for (int i = 0; i < s->n_host; i++) mt_optim_state_set_seed(s->host[i].st, seed);
}

static void init_io(mt_train_state *s) {
    s->io = (mt_state_io){.format = s->o.format, .sr_seed = s->o.seed, .ctx = s,
                          .get_weights = io_get_weights, .set_weights = io_set_weights,
                          .get_parts = io_get_parts, .set_parts = io_set_parts,
                          .set_sr_seed = io_set_sr_seed};
    if (s->ranks > 1) {
        s->io.owned = io_owned;
        s->io.get_weights_range = io_get_weights_range;
        s->io.parts_range = io_parts_range;
    }
}

const mt_state_io *mt_train_state_io(mt_train_state *s) {
    s->seq = 0; /* a read starts over */
    free_gathered(s);
    return &s->io;
}

/* What the arenas of a state hold, from their pointers (so: what was allocated). */
static double arena_bytes(const mt_optim_state *st) {
    mt_optim_arenas a = mt_optim_state_arenas(st);
    double n = (double)a.n, nb = (double)a.nblocks;
    return n * (double)mt_dtype_size(a.w_dtype) + (a.master ? 4 * n : 0) + (a.m ? 4 * n : 0) +
           (a.v ? 4 * n : 0) + (a.comp ? 2 * n : 0) + (a.mq ? n : 0) + (a.vq ? n : 0) +
           (a.ms ? 4 * nb : 0) + (a.vs ? 4 * nb : 0);
}

double mt_train_state_host_bytes(const mt_train_state *s) {
    double b = 0;
    for (int i = 0; i < s->n_host; i++) {
        const host_piece *p = &s->host[i];
        b += arena_bytes(p->st);
        if (p->grads && !p->grads_dev) b += (double)p->n * (double)s->elem;
    }
    if (s->fetch_buf[0]) {
        int64_t n = mt_group_max_size(s->t) < FETCH_PIECE ? mt_group_max_size(s->t) : FETCH_PIECE;
        b += 2.0 * (double)n * (double)s->elem;
    }
    return b;
}
