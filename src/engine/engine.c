#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../model/head.h"
#include "../model/layer.h"
#include "../model/moe.h"
#include "../model/docs.h"
#include "../optim/adamw.h"
#include "train_state.h"
#include "dev_trace.h"

struct mt_engine {
    const mt_param_table *t;
    mt_backend *be;
    mt_engine_opts o;
    int M;        /* micro-batches per step */
    int bN;       /* tokens per micro-batch */
    size_t elem;  /* bytes of one compute-dtype element */
    mt_layer_ctx lc;
    float *inv_freq;

    /* host */
    mt_train_state *ts;              /* weights, optimizer state, where gradients wait */
    size_t up_elem;                  /* bytes of one element of the host weights loaded */
    int k;                           /* layers 0..k-1 are in the GPU tier (not streamed) */
    int n_streamed;                  /* L - k */
    int32_t *host_ids, *host_targets;

    /* compute side */
    void **slots;
    mt_event **slot_loaded, **slot_free;
    void *embed_w, *head_w;
    mt_event *embed_loaded, *embed_free, *head_loaded, *head_free;
    float *g_layer, *g_embed, *g_head;
    void *staging[2];
    mt_event *staging_ready[2], *staging_free[2];
    int next_stage;
    void *widen;                     /* cpu, 8-bit formats: a bf16 group on its way to fp32 */
    mt_event *widened, *compute_done;
    float *norms;                    /* (L + 2) squared norms, group order */
    void *acts;                      /* (L + 1, B*T, C) layer inputs, then the last output;
                                        offload: two such sets, layer l in set l % 2 */
    void *host_ckpt;                 /* offload: (L, B*T, C) layer inputs in pinned host memory */
    mt_event *ckpt_ready, *ckpts_saved;
    mt_event *ckpt_saved[2], *set_free[2], *ckpt_loaded[2];
    void *saved;                     /* (saved_layers, M) internals of the last layers */
    size_t saved_per_mb;             /* bytes of one layer's internals for one micro-batch */
    void *saved_att;                 /* (saved_attention, M) attention outputs of the layers before */
    size_t saved_att_per_mb;
    void *dx;                        /* (B*T, C) */
    int32_t *ids, *targets, *pos;    /* (B*T) */
    int32_t *doc_start;              /* (B*T) packed rows' document starts, when use_docs */
    int use_docs;
    float *losses;
    mt_event *ids_ready, *grads_out;
    mt_layer_ws ws;
    mt_head_ws head_ws;

    /* data parallel (o->comm: ranks > 1, or one rank over nccl): the comm, this rank, the
     * reduce-scatter's summed shard */
    mt_comm *comm;                   /* NULL: no collectives at all (one rank) */
    int rank, ranks;
    float *g_shard;                  /* (largest shard) fp32; NULL with nccl, which sums in place */
    mt_event *shard_in;              /* this rank's shard of a group is in its slot */

    mt_lora_state *lora;             /* the adapters (o->lora), NULL: full-parameter training */
    mt_quant_base *qbase;            /* a quantized frozen base (o->base_format), NULL: none */
    void *qstage[2];                 /* compute side: a blob on its way from the host */
    mt_event *qstage_ready[2], *qstage_free[2];
    int next_qstage;
    mt_state_io io;                  /* the state's io, with the quantized base's tensors */

    mt_optimizer *opt;
    mt_trace *trace;
    mt_dev_trace *dtrace;            /* the streams' own timeline (with trace) */
    int *loads;                      /* per group, this step */
    int issued;                      /* layer loads issued in this pass */
    double h2d_bytes, d2h_bytes;     /* this step */
    mt_event **busy;                 /* (start, end) pairs around compute work, this step */
    int n_busy, max_busy;
    int step;                        /* steps run (for the trace) */
};

/* ---- sizes and places ---- */

/* Elements of a group's buffers on the compute side: the group padded to ranks * its shard
 * (train_state.h), so the collectives split it into equal blocks; one rank: the group. */
static size_t padded_size(const mt_param_table *t, int layer, int ranks) {
    return (size_t)mt_shard_size(mt_group_size(t, layer), ranks) * (size_t)(ranks > 1 ? ranks : 1);
}

/* A group on the compute side (compute dtype). */
static size_t group_bytes(const mt_engine *e, int layer) {
    return padded_size(e->t, layer, e->ranks) * e->elem;
}

static size_t set_bytes(const mt_engine *e) {
    return (size_t)e->M * e->bN * e->t->cfg.C * e->elem;
}

/* Checkpoint places. The first o.offload layers' inputs go to the host as the forward makes them
 * and come back one layer ahead of the backward: they rotate through two sets on the compute side
 * (layer l in set l % 2). The inputs of the other layers, and the last output, keep a set each
 * after those two; with every layer offloaded the last output takes a rotating set too (set L % 2,
 * nothing reads the one it replaces). Sparse checkpoints (checkpoint_every 2, no offload): the
 * even layers' inputs keep a set each (l / 2), the odd layers' share the next one (the forward
 * writes it and the next layer reads it at once; the backward remakes it), the last output the
 * one after. */
static int offloaded(const mt_engine *e, int l) { return l < e->o.offload; }

static int rotating(const mt_engine *e, int l) {
    int L = e->t->cfg.L;
    return offloaded(e, l) || (e->o.offload == L && l == L);
}

static int sparse(const mt_engine_opts *o) { return o->checkpoint_every == 2; }

/* Whether layer l's input (l = L: the last output) is kept from the forward to the backward. */
static int kept(const mt_engine *e, int l) { return !sparse(&e->o) || l % 2 == 0 || l == e->t->cfg.L; }

/* Sets of layer inputs on the compute side. */
static int act_sets(int L, const mt_engine_opts *o) {
    if (sparse(o)) return (L + 1) / 2 + 2;
    if (!o->offload) return L + 1;
    return o->offload == L ? 2 : 2 + (L + 1 - o->offload);
}

/* The input of layer l (l = L: the last output) for micro-batch m on the compute side. */
static void *act_at(const mt_engine *e, int l, int m) {
    size_t per_mb = (size_t)e->bN * e->t->cfg.C * e->elem;
    int L = e->t->cfg.L, set;
    if (sparse(&e->o)) set = l == L ? (L + 1) / 2 + 1 : kept(e, l) ? l / 2 : (L + 1) / 2;
    else set = !e->o.offload ? l : rotating(e, l) ? l % 2 : 2 + (l - e->o.offload);
    return (char *)e->acts + ((size_t)set * e->M + m) * per_mb;
}

static void *host_ckpt_at(const mt_engine *e, int l) {
    return (char *)e->host_ckpt + (size_t)l * set_bytes(e);
}

/* Which of the saved-internals sets layer l uses (the last saved_layers layers keep theirs), or -1. */
static int saved_index(const mt_engine *e, int l) {
    int k = l - (e->t->cfg.L - e->o.saved_layers);
    return k >= 0 ? k : -1;
}

/* Which of the saved-attention sets layer l uses (the saved_attention layers before the saved
 * ones keep theirs), or -1. */
static int saved_att_index(const mt_engine *e, int l) {
    int k = l - (e->t->cfg.L - e->o.saved_layers - e->o.saved_attention);
    return k >= 0 && k < e->o.saved_attention ? k : -1;
}

/* The working activations of layer l for micro-batch m: its own saved internals (or attention
 * output) when it keeps them, else the shared workspace. */
static mt_layer_ws ws_for(const mt_engine *e, int l, int m) {
    int k = saved_index(e, l), a = saved_att_index(e, l);
    if (k >= 0) {
        void *base = (char *)e->saved + ((size_t)k * e->M + m) * e->saved_per_mb;
        return mt_layer_ws_with_saved(&e->ws, &e->t->cfg, e->be->dtype, e->bN, base);
    }
    if (a >= 0) {
        void *base = (char *)e->saved_att + ((size_t)a * e->M + m) * e->saved_att_per_mb;
        return mt_layer_ws_with_saved_attention(&e->ws, &e->t->cfg, e->be->dtype, e->bN, base);
    }
    return e->ws;
}

static mt_recompute recompute_of(const mt_engine *e, int l) {
    if (saved_index(e, l) >= 0) return MT_RECOMPUTE_CHEAP;
    return saved_att_index(e, l) >= 0 ? MT_RECOMPUTE_KEEP_ATTENTION : MT_RECOMPUTE_ALL;
}

static void *dx_at(const mt_engine *e, int m) {
    return (char *)e->dx + (size_t)m * e->bN * e->t->cfg.C * e->elem;
}

/* Where micro-batch m's tokens sit (positions, and document starts of packed rows). */
static mt_tokens tokens_of(const mt_engine *e, int m) {
    size_t off = (size_t)m * e->bN;
    mt_tokens tok = {.B = e->o.micro_batch, .T = e->o.T, .pos = e->pos + off,
                     .doc_start = e->use_docs ? e->doc_start + off : NULL};
    return tok;
}

/* Embed and head tensors inside their own group buffers (weights or fp32 gradients). */
static mt_model_view ends_view(const mt_param_table *t, void *embed, void *head, size_t elem) {
    mt_model_view v = {.embed = embed};
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        if (p->kind == MT_W_FINAL_NORM) v.final_norm = (char *)head + p->group_offset * elem;
        if (p->kind == MT_W_LM_HEAD) v.lm_head = (char *)head + p->group_offset * elem;
    }
    if (t->cfg.tie_word_embeddings) v.lm_head = embed;
    return v;
}

/* LoRA with a quantized base: the streamed layers live in engine/quant_base.h, not the state. */
static int quantized(const mt_engine_opts *o) { return o->lora && o->base_format != MT_BASE_BF16; }

static mt_train_state_opts state_opts(const mt_engine_opts *o) {
    mt_train_state_opts so = {.format = o->lora ? MT_STATE_FROZEN : o->state, .gpu_layers = o->gpu_layers,
                              .layers_outside = quantized(o),
                              .grads_on_device = o->grads_on_device,
                              .update_on_device = o->update_on_device, .seed = o->seed,
                              .n_threads = o->opt_threads, .ranks = o->ranks, .comm = o->comm};
    return so;
}

void mt_engine_plan_of(const mt_param_table *t, mt_dtype dtype, const mt_engine_opts *o,
                       mt_engine_plan *p) {
    double el = (double)mt_dtype_size(dtype);
    double N = (double)o->batch * o->T, bN = (double)o->micro_batch * o->T;
    memset(p, 0, sizeof *p);
    mt_train_state_opts so = state_opts(o);
    mt_train_state_bytes sb;
    mt_train_state_bytes_of(t, dtype, &so, &sb);
    int streamed = t->cfg.L - o->gpu_layers;
    p->host_master = sb.host_weights;
    p->host_moments = sb.host_moments;
    p->host_upload = sb.host_upload;
    p->host_grads = sb.host_grads;
    p->host_total = sb.host_total + 8 * N;
    p->dev_tier = sb.dev_tier;
    /* the groups' buffers on the compute side, padded with ranks (padded_size) */
    double layer = (double)padded_size(t, 0, o->ranks), embed = (double)padded_size(t, MT_GROUP_EMBED, o->ranks),
           head = (double)padded_size(t, t->cfg.L, o->ranks);
    p->dev_slots = (double)(o->resident ? (streamed > 2 ? streamed : 2) : o->n_slots) * layer * el;
    p->dev_embed_head = (embed + head) * el;
    p->dev_grads = 4.0 * (layer + embed + head) + 2.0 * mt_group_max_size(t) * el + sb.dev_grads;
    if (o->lora) { /* no base gradient; the adapters' whole state instead */
        p->dev_grads = 0;
        p->dev_lora = mt_lora_state_bytes(o->lora, dtype);
    }
    if (quantized(o)) { /* the streamed layers' blobs; two staging copies when they stream */
        size_t largest;
        p->base_quant = mt_quant_base_bytes(t, o->base_format, o->gpu_layers, &largest);
        if (o->base_on_device) p->dev_lora += p->base_quant;
        else {
            p->host_total += p->base_quant;
            p->dev_lora += 2.0 * (double)largest;
        }
    }
    if (o->ranks > 1 && !o->lora) p->dev_grads += 4.0 * (double)mt_shard_size(mt_group_max_size(t), o->ranks); /* g_shard (cpu) */
    if (dtype != MT_BF16 && o->state != MT_STATE_FULL) p->dev_grads += 2.0 * mt_group_max_size(t); /* widen */
    /* the layer inputs (L + 1 sets, fewer when offloaded: act_sets) and the gradient dx */
    p->dev_checkpoints = (act_sets(t->cfg.L, o) + 1) * N * t->cfg.C * el;
    p->host_total += (double)o->offload * N * t->cfg.C * el;
    p->dev_saved_per_layer = (double)(o->batch / o->micro_batch) *
                             (double)mt_layer_saved_bytes_tiled(&t->cfg, dtype, o->micro_batch * o->T, o->mlp_chunk);
    p->dev_saved_attention_per_layer = (double)(o->batch / o->micro_batch) *
                                       (double)mt_layer_attention_saved_bytes(&t->cfg, dtype, o->micro_batch * o->T);
    p->dev_saved = o->saved_layers * p->dev_saved_per_layer +
                   o->saved_attention * p->dev_saved_attention_per_layer;
    p->dev_work = (double)mt_layer_ws_bytes_rows(&t->cfg, dtype, o->micro_batch, o->T, o->mlp_chunk) +
                  2 * bN * t->cfg.C * el +
                  N * 4 * 5; /* ids, targets, losses, positions, document starts */
    p->dev_total = p->dev_slots + p->dev_embed_head + p->dev_grads + p->dev_checkpoints + p->dev_saved +
                   p->dev_work + p->dev_tier + p->dev_lora;
}

/* ---- the collectives (data parallel) ---- */

/* Where the collectives run. cuda + nccl: enqueued on a backend stream (its cudaStream_t), in
 * order with that stream's work, on GPU buffers; the call returns at once. cpu + mpi or local
 * (native_stream NULL): synchronous on the calling thread, which is the cpu backend's compute
 * stream, on host buffers; so the caller first lets the compute stream wait for the work that
 * made the input, and the result is there when the call returns. */
static int comm_on_device(const mt_engine *e) { return e->be->native_stream != NULL; }

static void *comm_stream(const mt_engine *e, mt_stream s) {
    return comm_on_device(e) ? e->be->native_stream(e->be, s) : NULL;
}

/* A collective that failed leaves the ranks out of step: the job ends (comm.h). */
static void comm_check(mt_engine *e, int rc) {
    if (rc == MT_OK) return;
    fprintf(stderr, "megatrain: %s\n", mt_error_message());
    mt_comm_abort(e->comm, 1);
}

/* The one all-gather of a group's load: every rank's shard (n elements, compute dtype; this
 * rank's at `mine`, complete in the order of stream s) into dst, whole. */
static void gather_weights(mt_engine *e, void *dst, const void *mine, size_t n, mt_stream s) {
    comm_check(e, mt_comm_all_gather(e->comm, dst, mine, n, e->be->dtype, comm_stream(e, s)));
}

/* n values summed in place over the ranks, each in rank order (the same bits on every rank): the
 * step's counts and loss, and mt_moe_reduce's sum of the router's statistics. */
static void sum_array_over_ranks(void *ctx, double *x, size_t n) {
    mt_engine *e = ctx;
    if (e->ranks <= 1) return;
    double *all = mt_malloc((size_t)e->ranks * n * sizeof(double));
    comm_check(e, mt_comm_all_gather_host(e->comm, all, x, n * sizeof(double)));
    for (size_t i = 0; i < n; i++) {
        double s = 0;
        for (int r = 0; r < e->ranks; r++) s += all[(size_t)r * n + i];
        x[i] = s;
    }
    free(all);
}

static double sum_over_ranks(mt_engine *e, double x) {
    sum_array_over_ranks(e, &x, 1);
    return x;
}

/* The same for a count: exact as a double below 2^53. */
static int64_t count_over_ranks(mt_engine *e, int64_t n) {
    return (int64_t)sum_over_ranks(e, (double)n);
}

/* ---- weight loads ---- */

/* A quantized layer into dst: its blob, staged on the compute side unless it lives there, expanded
 * (dequantized) on the compute stream, which is in order with the compute that last read dst (so
 * the copy need not wait for dst to be free: it writes only the staging buffer, after the expansion
 * that last read that buffer). */
static void load_quantized(mt_engine *e, int layer, void *dst, mt_event *loaded) {
    mt_backend *be = e->be;
    const void *blob = mt_quant_base_blob(e->qbase, layer);
    size_t bytes = mt_quant_base_blob_bytes(e->qbase, layer);
    int st = -1;
    if (!mt_quant_base_on_device(e->qbase)) {
        st = e->next_qstage++ & 1;
        be->stream_wait(be, MT_STREAM_H2D, e->qstage_free[st]);
        int h = mt_dev_trace_begin(e->dtrace, MT_STREAM_H2D);
        be->copy_async(be, MT_STREAM_H2D, e->qstage[st], blob, bytes);
        mt_dev_trace_end(e->dtrace, h, MT_STREAM_H2D, MT_SPAN_LOAD, e->step, layer);
        be->event_record(be, e->qstage_ready[st], MT_STREAM_H2D);
        be->stream_wait(be, MT_STREAM_COMPUTE, e->qstage_ready[st]);
        blob = e->qstage[st];
        e->h2d_bytes += (double)bytes;
    }
    mt_quant_base_expand(e->qbase, layer, dst, blob);
    if (st >= 0) be->event_record(be, e->qstage_free[st], MT_STREAM_COMPUTE);
    be->event_record(be, loaded, MT_STREAM_COMPUTE);
    e->loads[layer + 1]++;
}

/* Issues the copy of a group's upload buffer into dst on the H2D stream, after `free_ev` (the
 * last compute use of dst) and, for the forward, after the optimizer has updated the group. */
static void load_group(mt_engine *e, int layer, void *dst, mt_event *free_ev, mt_event *loaded,
                       int wait_optimizer) {
    mt_backend *be = e->be;
    if (wait_optimizer) {
        double t0 = mt_trace_now(e->trace);
        mt_optimizer_wait_group(e->opt, layer);
        mt_trace_add(e->trace, MT_SPAN_WAIT_OPT, MT_LANE_MAIN, e->step, layer, t0, mt_trace_now(e->trace));
    }
    double t0 = mt_trace_now(e->trace);
    if (e->qbase && layer >= 0 && layer < e->t->cfg.L) { /* a streamed layer: quantized */
        load_quantized(e, layer, dst, loaded);
        mt_trace_add(e->trace, MT_SPAN_LOAD, MT_LANE_H2D, e->step, layer, t0, mt_trace_now(e->trace));
        return;
    }
    /* with ranks: this rank's shard (of the updated weights) into its block of dst */
    size_t n = (size_t)mt_train_state_shard(e->ts, layer), bytes = n * e->up_elem;
    void *mine = (char *)dst + (size_t)e->rank * n * e->elem;
    const void *src = mt_train_state_upload(e->ts, layer);
    be->stream_wait(be, MT_STREAM_H2D, free_ev);
    int h = mt_dev_trace_begin(e->dtrace, MT_STREAM_H2D);
    be->copy_async(be, MT_STREAM_H2D, e->widen ? e->widen : mine, src, bytes);
    mt_dev_trace_end(e->dtrace, h, MT_STREAM_H2D, MT_SPAN_LOAD, e->step, layer);
    if (e->widen) {
        /* only the cpu backend loads bf16 into fp32: its compute stream is the caller, so the
         * widening is done before the next load reuses the buffer */
        be->event_record(be, e->widened, MT_STREAM_H2D);
        be->stream_wait(be, MT_STREAM_COMPUTE, e->widened);
        be->from_bf16(be, mine, e->widen, n);
        if (e->comm) gather_weights(e, dst, mine, n, MT_STREAM_COMPUTE);
        be->event_record(be, loaded, MT_STREAM_COMPUTE);
    } else if (e->comm && comm_on_device(e)) {
        /* nccl: the all-gather is enqueued on the H2D stream right behind the shard's copy (after
         * free_ev too, so it writes no block of dst that the compute still reads), and `loaded`
         * after it: the compute waits for this group's load alone, as with one rank, and the
         * gather of the layer `ahead` positions on overlaps the compute of this one like its copy.
         * Every rank enqueues the same collectives in the same order, on these two streams (the
         * backward's reduce-scatters on the compute stream); NCCL runs one comm's kernels in that
         * order through its own stream. At one rank that is checked (test_cuda_dp); on several
         * GPUs, not yet: a hang there would mean moving the gathers to the compute stream. */
        gather_weights(e, dst, mine, n, MT_STREAM_H2D);
        be->event_record(be, loaded, MT_STREAM_H2D);
    } else if (e->comm) { /* synchronous (mpi): the cpu compute stream, the caller, gathers */
        be->event_record(be, e->shard_in, MT_STREAM_H2D);
        be->stream_wait(be, MT_STREAM_COMPUTE, e->shard_in);
        gather_weights(e, dst, mine, n, MT_STREAM_COMPUTE);
        be->event_record(be, loaded, MT_STREAM_COMPUTE);
    } else {
        be->event_record(be, loaded, MT_STREAM_H2D);
    }
    e->loads[layer + 1]++;
    e->h2d_bytes += (double)bytes;
    mt_trace_add(e->trace, MT_SPAN_LOAD, MT_LANE_H2D, e->step, layer, t0, mt_trace_now(e->trace));
}

/* The streamed layers (k..L-1; the GPU tier's 0..k-1 are never loaded) in pass order: forward
 * position pos is layer k + pos, backward position pos is layer L-1-pos. Load number q of the step
 * (forward pos, backward S + pos, S streamed layers) uses slot q % n_slots; with resident weights
 * layer k + j has slot j. */
static int streamed_layer(const mt_engine *e, int pos, int backward) {
    return backward ? e->t->cfg.L - 1 - pos : e->k + pos;
}

static int slot_of(const mt_engine *e, int pos, int backward) {
    int S = e->n_streamed;
    if (e->o.resident) return streamed_layer(e, pos, backward) - e->k;
    return (pos + (backward ? S : 0)) % e->o.n_slots;
}

/* How many layers ahead of the one computing the loads run: as many as the free slots allow
 * (resident: one, which keeps the host's per-layer optimizer waits as early as they need be). */
static int ahead(const mt_engine *e) { return e->o.resident ? 1 : e->o.n_slots - 1; }

/* Layer loads of one pass in order (forward: 0..L-1, backward: L-1..0; none in the backward with
 * resident weights). Issues every load up to `upto` (a position in the pass). */
static void prefetch_layers(mt_engine *e, int upto, int backward, int wait_optimizer) {
    if (backward && e->o.resident) return;
    for (; e->issued <= upto && e->issued < e->n_streamed; e->issued++) {
        int s = slot_of(e, e->issued, backward);
        int layer = streamed_layer(e, e->issued, backward);
        load_group(e, layer, e->slots[s], e->slot_free[s], e->slot_loaded[s], wait_optimizer);
    }
}

/* Layer l's weights on the compute side: its slot s, or its own place in the GPU tier. */
/* Layer l's weights (slot s, or the tier's), with its adapters in *lv when training LoRA. */
static mt_layer_weights layer_weights(const mt_engine *e, int l, int s, mt_lora_view *lv) {
    void *base = l < e->k ? mt_train_state_tier_weights(e->ts, l) : e->slots[s];
    mt_layer_weights w = mt_layer_view_at(e->t, l, base, e->elem);
    if (e->lora) {
        *lv = mt_lora_view_at(e->o.lora, l, mt_lora_state_weights(e->lora), e->elem);
        w.lora = lv;
    }
    return w;
}

/* ---- gradients out ---- */

/* The fp32 gradient g of a group leaves for the host: its squared norm is added to norms, it is
 * converted to the compute dtype in a staging buffer and copied into the group's upload buffer,
 * which the optimizer reads and overwrites with the new weights. */
static void grads_out(mt_engine *e, int layer, float *g) {
    mt_backend *be = e->be;
    size_t n = (size_t)mt_group_size(e->t, layer);
    double t0 = mt_trace_now(e->trace);
    if (e->comm) {
        /* the one reduce-scatter of the group: each rank receives its shard summed over the
         * ranks, and from here on works on that shard alone. In fp32, not the compute dtype: g is
         * fp32 already, the sum of the ranks' parts is then rounded to the compute dtype once
         * (from_f32 below), exactly as one rank rounds its own sum, and the comm's fp32 sum in rank
         * order is deterministic; bf16 would halve the traffic but round every rank's part first.
         * The pad of g (past the group) is zero.
         * On the compute stream, where g became final and where its shard is read next (sumsq,
         * from_f32), so no event orders it; the next layer's backward, which zeroes and refills g,
         * comes after it on that stream. The loads' copies go on meanwhile on their own streams
         * (the per-layer overlap is kept; a rank's compute does wait for its peers here). nccl sums
         * in place into g's block `rank` (no second buffer on the GPU); mpi into g_shard. */
        n = (size_t)mt_train_state_shard(e->ts, layer);
        float *shard = e->g_shard ? e->g_shard : g + (size_t)e->rank * n;
        comm_check(e, mt_comm_reduce_scatter(e->comm, shard, g, n * (size_t)e->ranks, MT_F32,
                                             comm_stream(e, MT_STREAM_COMPUTE)));
        g = shard;
    }
    be->sumsq(be, e->norms + layer + 1, g, n);
    void *dev = mt_train_state_grad_dev(e->ts, layer);
    if (dev) { /* it waits on the compute side */
        be->from_f32(be, dev, g, n);
        return;
    }
    int st = e->next_stage++ & 1;
    be->stream_wait(be, MT_STREAM_COMPUTE, e->staging_free[st]);
    be->from_f32(be, e->staging[st], g, n);
    be->event_record(be, e->staging_ready[st], MT_STREAM_COMPUTE);
    be->stream_wait(be, MT_STREAM_D2H, e->staging_ready[st]);
    int h = mt_dev_trace_begin(e->dtrace, MT_STREAM_D2H);
    be->copy_async(be, MT_STREAM_D2H, mt_train_state_grad_host(e->ts, layer), e->staging[st], n * e->elem);
    mt_dev_trace_end(e->dtrace, h, MT_STREAM_D2H, MT_SPAN_GRAD_OUT, e->step, layer);
    e->d2h_bytes += (double)(n * e->elem);
    be->event_record(be, e->staging_free[st], MT_STREAM_D2H);
    mt_trace_add(e->trace, MT_SPAN_GRAD_OUT, MT_LANE_D2H, e->step, layer, t0, mt_trace_now(e->trace));
}

/* ---- measuring the compute stream ---- */

/* Returns the device-trace handle of the span (see busy_end). */
static int busy_begin(mt_engine *e) {
    if (e->be->event_elapsed_ms && e->n_busy + 2 <= e->max_busy)
        e->be->event_record(e->be, e->busy[e->n_busy], MT_STREAM_COMPUTE);
    return mt_dev_trace_begin(e->dtrace, MT_STREAM_COMPUTE);
}

static void busy_end(mt_engine *e, int h, mt_span_kind kind, int group) {
    mt_dev_trace_end(e->dtrace, h, MT_STREAM_COMPUTE, kind, e->step, group);
    if (e->be->event_elapsed_ms && e->n_busy + 2 <= e->max_busy) {
        e->be->event_record(e->be, e->busy[e->n_busy + 1], MT_STREAM_COMPUTE);
        e->n_busy += 2;
    }
}

/* Sum of the measured spans; call after the compute stream has drained. */
static double busy_ms(mt_engine *e) {
    if (!e->be->event_elapsed_ms) return -1;
    double ms = 0;
    for (int i = 0; i < e->n_busy; i += 2) ms += e->be->event_elapsed_ms(e->be, e->busy[i], e->busy[i + 1]);
    return ms;
}

/* ---- the passes ---- */

static void upload_batch(mt_engine *e, const int32_t *inputs, const int32_t *targets) {
    mt_backend *be = e->be;
    size_t bytes = (size_t)e->o.batch * e->o.T * sizeof(int32_t);
    memcpy(e->host_ids, inputs, bytes);
    be->copy_async(be, MT_STREAM_H2D, e->ids, e->host_ids, bytes);
    if (targets) {
        memcpy(e->host_targets, targets, bytes);
        be->copy_async(be, MT_STREAM_H2D, e->targets, e->host_targets, bytes);
    }
    be->event_record(be, e->ids_ready, MT_STREAM_H2D);
    be->stream_wait(be, MT_STREAM_COMPUTE, e->ids_ready);
}

/* Offload: layer l's input (complete on the compute stream) leaves for the host on the D2H stream. */
static void save_checkpoint(mt_engine *e, int l) {
    mt_backend *be = e->be;
    be->event_record(be, e->ckpt_ready, MT_STREAM_COMPUTE);
    be->stream_wait(be, MT_STREAM_D2H, e->ckpt_ready);
    int h = mt_dev_trace_begin(e->dtrace, MT_STREAM_D2H);
    be->copy_async(be, MT_STREAM_D2H, host_ckpt_at(e, l), act_at(e, l, 0), set_bytes(e));
    mt_dev_trace_end(e->dtrace, h, MT_STREAM_D2H, MT_SPAN_CKPT_OUT, e->step, l);
    be->event_record(be, e->ckpt_saved[l % 2], MT_STREAM_D2H);
    e->d2h_bytes += (double)set_bytes(e);
}

/* Offload: layer l's input comes back into its set once the set's last reader is done. */
static void load_checkpoint(mt_engine *e, int l) {
    mt_backend *be = e->be;
    be->stream_wait(be, MT_STREAM_H2D, e->set_free[l % 2]);
    int h = mt_dev_trace_begin(e->dtrace, MT_STREAM_H2D);
    be->copy_async(be, MT_STREAM_H2D, act_at(e, l, 0), host_ckpt_at(e, l), set_bytes(e));
    mt_dev_trace_end(e->dtrace, h, MT_STREAM_H2D, MT_SPAN_CKPT_IN, e->step, l);
    be->event_record(be, e->ckpt_loaded[l % 2], MT_STREAM_H2D);
    e->h2d_bytes += (double)set_bytes(e);
}

/* Layer l's forward for every micro-batch (weights in slot s, or the tier's), from its input set
 * into the next one's: with `save`, layers that keep their internals write them (the step's
 * forward), else everything goes to the shared workspace. The span is `kind`. */
static void layer_forward(mt_engine *e, int l, int s, int save, mt_span_kind kind) {
    mt_lora_view lv;
    mt_layer_weights lw = layer_weights(e, l, s, &lv);
    double t0 = mt_trace_now(e->trace);
    int h = busy_begin(e);
    for (int m = 0; m < e->M; m++) {
        mt_tokens tok = tokens_of(e, m);
        mt_layer_ws ws = save ? ws_for(e, l, m) : e->ws;
        mt_layer_forward(&e->lc, &tok, &lw, act_at(e, l, m), act_at(e, l + 1, m), &ws);
    }
    busy_end(e, h, kind, l);
    mt_trace_add(e->trace, kind, MT_LANE_MAIN, e->step, l, t0, mt_trace_now(e->trace));
}

/* Embedding and every layer, micro-batch by micro-batch, saving each layer's input (when `save`
 * and offloading, to the host). Each layer's compute is issued before the load of the layer
 * ahead(e) positions on, so that on an asynchronous backend the copy runs while the layer computes. */
static void forward(mt_engine *e, const mt_model_view *w, int save) {
    mt_backend *be = e->be;
    int L = e->t->cfg.L;

    load_group(e, MT_GROUP_EMBED, e->embed_w, e->embed_free, e->embed_loaded, 1);
    e->issued = 0;
    prefetch_layers(e, ahead(e) - 1, 0, 1);
    be->stream_wait(be, MT_STREAM_COMPUTE, e->embed_loaded);
    for (int m = 0; m < e->M; m++)
        mt_embed_forward(&e->lc, w, e->ids + (size_t)m * e->bN, e->bN, act_at(e, 0, m));

    for (int l = 0; l < L; l++) {
        int tier = l < e->k, pos = l - e->k;
        int s = tier ? -1 : slot_of(e, pos, 0);
        if (offloaded(e, l) && save) save_checkpoint(e, l);
        /* a rotating output set held layer l - 1's input: its copy to the host must be done */
        if (rotating(e, l + 1)) be->stream_wait(be, MT_STREAM_COMPUTE, e->ckpt_saved[(l + 1) % 2]);
        if (!tier) be->stream_wait(be, MT_STREAM_COMPUTE, e->slot_loaded[s]);
        layer_forward(e, l, s, save, MT_SPAN_FORWARD);
        if (!tier) be->event_record(be, e->slot_free[s], MT_STREAM_COMPUTE);
        if (!tier) prefetch_layers(e, pos + ahead(e), 0, 1);
    }
    load_group(e, L, e->head_w, e->head_free, e->head_loaded, 1);
    be->stream_wait(be, MT_STREAM_COMPUTE, e->head_loaded);
    if (e->o.offload && save) {
        be->event_record(be, e->ckpts_saved, MT_STREAM_D2H);
        be->stream_wait(be, MT_STREAM_H2D, e->ckpts_saved); /* reloads read finished copies */
    }
}

/* The first loads of the backward (no optimizer wait: the same step's weights). */
static void backward_prefetch(mt_engine *e) {
    e->issued = 0;
    prefetch_layers(e, ahead(e) - 1, 1, 0);
}

/* Sparse checkpoints: layer l's input (odd l, at backward position i) was not kept; it is remade
 * from layer l - 1's kept input by running that layer's forward again, with its weights loaded
 * now (backward position i + 1, one ahead of the usual prefetch, into the slot layer l + 1 has just
 * freed; no load for the GPU tier or resident weights). The forward writes the shared working
 * activations only (no saved internals, no router statistics: the step's were final after its
 * forward), and the same bits as the forward's, so the backward sees the input the forward saw. */
static void remake_input(mt_engine *e, int l, int i) {
    mt_backend *be = e->be;
    int p = l - 1, tier = p < e->k;
    int s = tier ? -1 : slot_of(e, i + 1, 1);
    if (!tier) {
        prefetch_layers(e, i + 1, 1, 0);
        be->stream_wait(be, MT_STREAM_COMPUTE, e->slot_loaded[s]);
    }
    layer_forward(e, p, s, 0, MT_SPAN_REMAKE);
}

static void backward(mt_engine *e, const mt_model_view *g) {
    mt_backend *be = e->be;
    int L = e->t->cfg.L;
    for (int i = 0; i < L; i++) {
        int l = L - 1 - i;
        int tier = l < e->k; /* the streamed layers come first: position i */
        int s = tier ? -1 : slot_of(e, i, 1);
        if (!kept(e, l)) remake_input(e, l, i);
        /* the last offloaded layer's input is still on the compute side; the others were reloaded */
        if (offloaded(e, l) && l < e->o.offload - 1)
            be->stream_wait(be, MT_STREAM_COMPUTE, e->ckpt_loaded[l % 2]);
        if (!tier) be->stream_wait(be, MT_STREAM_COMPUTE, e->slot_loaded[s]);
        mt_lora_view lv, lgv;
        mt_layer_weights lw = layer_weights(e, l, s, &lv);
        mt_layer_weights lg;
        if (e->lora) { /* the base is frozen: no gradient of its own; the adapters' accumulate */
            memset(&lg, 0, sizeof lg);
            lgv = mt_lora_view_at(e->o.lora, l, mt_lora_state_grads(e->lora), sizeof(float));
            lg.lora = &lgv;
        } else {
            lg = mt_layer_view_at(e->t, l, e->g_layer, sizeof(float));
        }
        double t0 = mt_trace_now(e->trace);
        int h = busy_begin(e);
        if (!e->lora) be->zero(be, e->g_layer, padded_size(e->t, 0, e->ranks) * sizeof(float));
        for (int m = 0; m < e->M; m++) {
            mt_tokens tok = tokens_of(e, m);
            mt_layer_ws ws = ws_for(e, l, m);
            mt_layer_backward(&e->lc, &tok, &lw, &lg, act_at(e, l, m), dx_at(e, m), dx_at(e, m),
                              &ws, recompute_of(e, l));
        }
        busy_end(e, h, MT_SPAN_BACKWARD, l);
        if (!tier) be->event_record(be, e->slot_free[s], MT_STREAM_COMPUTE);
        mt_trace_add(e->trace, MT_SPAN_BACKWARD, MT_LANE_MAIN, e->step, l, t0, mt_trace_now(e->trace));
        if (offloaded(e, l)) {
            be->event_record(be, e->set_free[l % 2], MT_STREAM_COMPUTE);
            if (l >= 1) load_checkpoint(e, l - 1);
        }
        if (!tier) prefetch_layers(e, i + ahead(e), 1, 0);
        if (!e->lora) grads_out(e, l, e->g_layer);
    }
    if (e->lora) return; /* the embedding is frozen */
    for (int m = 0; m < e->M; m++)
        mt_embed_backward(&e->lc, g, e->ids + (size_t)m * e->bN, e->bN, dx_at(e, m));
    grads_out(e, MT_GROUP_EMBED, e->g_embed);
}

/* LoRA: the adapters' gradient is final once the backward ends; with ranks it is summed over
 * them first (every rank holds the whole adapter state and applies the same update); its squared
 * norm is the whole gradient's. */
static void lora_grads_final(mt_engine *e) {
    float *g = mt_lora_state_grads(e->lora);
    if (e->comm)
        comm_check(e, mt_comm_all_reduce(e->comm, g, (size_t)e->o.lora->total, MT_F32,
                                         comm_stream(e, MT_STREAM_COMPUTE)));
    mt_lora_state_sumsq(e->lora, e->norms);
}

static double download_losses(mt_engine *e, int n) {
    float *losses = mt_malloc((size_t)n * sizeof(float));
    e->be->download(e->be, losses, e->losses, (size_t)n * sizeof(float));
    double sum = 0;
    for (int i = 0; i < n; i++) sum += losses[i];
    free(losses);
    return sum;
}

void mt_engine_step(mt_engine *e, const int32_t *inputs, const int32_t *targets,
                    const mt_adamw_hparams *hp, int64_t adam_step, double max_norm,
                    mt_step_result *res) {
    mt_backend *be = e->be;
    const mt_param_table *t = e->t;
    int L = t->cfg.L, N = e->o.batch * e->o.T;
    mt_dev_trace_flush(e->dtrace); /* the previous step's device spans */
    e->step = (int)(adam_step - 1);
    for (int i = 0; i < L + 2; i++) e->loads[i] = 0;
    e->h2d_bytes = e->d2h_bytes = 0;
    e->n_busy = 0;
    int64_t count = 0;
    for (int i = 0; i < N; i++) count += targets[i] >= 0;
    count = count_over_ranks(e, count); /* every rank scales its gradient by the global count */
    float loss_scale = count ? 1.0f / (float)count : 0.0f;

    upload_batch(e, inputs, targets);
    mt_model_view w = ends_view(t, e->embed_w, e->head_w, e->elem);
    mt_model_view g = {NULL, NULL, NULL}; /* LoRA: the embedding, final norm and head are frozen */
    if (!e->lora) g = ends_view(t, e->g_embed, e->g_head, sizeof(float));
    mt_moe_stats_reset(&e->lc, e->ws.moe_stats); /* MoE: the step's router statistics */
    forward(e, &w, 1);
    /* MoE: coef * load-balancing loss, from every rank's router statistics */
    mt_moe_reduce over_ranks = {sum_array_over_ranks, e};
    double aux = mt_moe_aux_finish(&e->lc, e->ws.moe_stats, e->ranks > 1 ? &over_ranks : NULL);
    backward_prefetch(e);

    /* head: loss, and the gradient flowing into the last layer */
    be->zero(be, e->norms, (size_t)(L + 2) * sizeof(float));
    if (e->lora) {
        mt_lora_state_zero_grads(e->lora);
    } else {
        be->zero(be, e->g_embed, padded_size(t, MT_GROUP_EMBED, e->ranks) * sizeof(float));
        be->zero(be, e->g_head, padded_size(t, L, e->ranks) * sizeof(float));
    }
    double t0 = mt_trace_now(e->trace);
    int h = busy_begin(e);
    for (int m = 0; m < e->M; m++)
        mt_head_loss(&e->lc, &w, &g, act_at(e, L, m), e->targets + (size_t)m * e->bN, e->bN,
                     loss_scale, e->losses + (size_t)m * e->bN, dx_at(e, m), &e->head_ws);
    busy_end(e, h, MT_SPAN_HEAD, L);
    be->event_record(be, e->head_free, MT_STREAM_COMPUTE);
    be->event_record(be, e->embed_free, MT_STREAM_COMPUTE);
    /* the set the first reload fills (layer offload - 2's) has no reader after this */
    if (e->o.offload) be->event_record(be, e->set_free[e->o.offload % 2], MT_STREAM_COMPUTE);
    mt_trace_add(e->trace, MT_SPAN_HEAD, MT_LANE_MAIN, e->step, L, t0, mt_trace_now(e->trace));
    if (!e->lora) grads_out(e, L, e->g_head);

    backward(e, &g);
    if (e->lora) lora_grads_final(e);
    /* every gradient is out: copied to the host (D2H) or written on the compute side */
    be->event_record(be, e->compute_done, MT_STREAM_COMPUTE);
    be->stream_wait(be, MT_STREAM_D2H, e->compute_done);
    be->event_record(be, e->grads_out, MT_STREAM_D2H);

    /* the global norm is exact now: every group's squared norm is in (with ranks: the sums of
     * each rank's shards, added over the ranks) */
    if (e->comm && !e->lora) /* on the compute stream, before the download there reads the sums */
        comm_check(e, mt_comm_all_reduce(e->comm, e->norms, (size_t)L + 2, MT_F32,
                                         comm_stream(e, MT_STREAM_COMPUTE)));
    float *norms = mt_malloc((size_t)(L + 2) * sizeof(float));
    be->download(be, norms, e->norms, (size_t)(L + 2) * sizeof(float));
    double sq = 0;
    for (int i = 0; i < L + 2; i++) sq += norms[i];
    free(norms);
    res->grad_norm = sqrt(sq);
    res->clip_coef = mt_adamw_clip_coef((float)res->grad_norm, max_norm);
    res->count = count;
    double loss_sum = sum_over_ranks(e, download_losses(e, N));
    res->loss = (count ? loss_sum / (double)count : 0.0) + aux;
    res->h2d_bytes = e->h2d_bytes + 2.0 * N * sizeof(int32_t);
    res->d2h_bytes = e->d2h_bytes;
    res->compute_ms = busy_ms(e);
    res->opt_ms = mt_optimizer_last_ms(e->opt);

    /* a NaN or inf anywhere in the loss or the gradient shows in one of the two numbers; such an
     * update would make master and the moments NaN for good, so it is never applied */
    res->skipped = !isfinite(res->loss) || !isfinite(res->grad_norm);
    if (res->skipped) {
        mt_optimizer_skip(e->opt, adam_step, e->grads_out);
    } else {
        mt_train_state_update_tier(e->ts, hp, adam_step, res->clip_coef); /* compute stream */
        if (e->lora) mt_lora_state_update(e->lora, hp, adam_step, res->clip_coef);
        mt_optimizer_start(e->opt, hp, adam_step, res->clip_coef, e->grads_out);
    }
}

double mt_engine_eval(mt_engine *e, const int32_t *inputs, const int32_t *targets, int B,
                      int64_t *count) {
    MT_CHECK(B == e->o.batch, "eval batches hold %d rows (got %d)", e->o.batch, B);
    int L = e->t->cfg.L, N = B * e->o.T;
    int64_t n = 0;
    for (int i = 0; i < N; i++) n += targets[i] >= 0;
    *count = count_over_ranks(e, n);
    upload_batch(e, inputs, targets);
    mt_model_view w = ends_view(e->t, e->embed_w, e->head_w, e->elem);
    forward(e, &w, 0);
    for (int m = 0; m < e->M; m++)
        mt_head_loss(&e->lc, &w, NULL, act_at(e, L, m), e->targets + (size_t)m * e->bN, e->bN, 1.0f,
                     e->losses + (size_t)m * e->bN, NULL, &e->head_ws);
    e->be->event_record(e->be, e->head_free, MT_STREAM_COMPUTE);
    e->be->event_record(e->be, e->embed_free, MT_STREAM_COMPUTE);
    return sum_over_ranks(e, download_losses(e, N));
}

/* ---- state ---- */

static mt_event *new_event(mt_engine *e) { return e->be->event_create(e->be); }

mt_engine *mt_engine_create(const mt_param_table *t, mt_backend *be, const mt_engine_opts *o,
                            const float *weights) {
    MT_CHECK(o->batch > 0 && o->micro_batch > 0 && o->batch % o->micro_batch == 0,
             "batch %d must be a multiple of micro-batch %d", o->batch, o->micro_batch);
    MT_CHECK(o->n_slots >= 2, "need at least 2 weight slots (got %d)", o->n_slots);
    MT_CHECK(o->offload >= 0 && o->offload <= t->cfg.L, "offloaded checkpoints of %d layers: the model has %d",
             o->offload, t->cfg.L);
    MT_CHECK(o->saved_layers >= 0 && o->saved_layers <= t->cfg.L && !(o->offload && o->saved_layers),
             "saved layers %d: must be in [0, %d] and 0 with offloaded checkpoints", o->saved_layers,
             t->cfg.L);
    MT_CHECK(o->saved_attention >= 0 && o->saved_layers + o->saved_attention <= t->cfg.L &&
                 !(o->offload && o->saved_attention),
             "saved attention of %d layers: with %d saved layers at most %d, and 0 with offloaded "
             "checkpoints", o->saved_attention, o->saved_layers, t->cfg.L - o->saved_layers);
    MT_CHECK(o->checkpoint_every >= 0 && o->checkpoint_every <= 2 && !(sparse(o) && o->offload),
             "checkpoints every %d layers: 1 or 2, and 1 with offloaded checkpoints", o->checkpoint_every);
    MT_CHECK(o->gpu_layers >= 0 && o->gpu_layers <= t->cfg.L, "GPU tier of %d layers: the model has %d",
             o->gpu_layers, t->cfg.L);
    int ranks = o->ranks > 1 ? o->ranks : 1;
    MT_CHECK(ranks == 1 || (o->comm && mt_comm_size(o->comm) == ranks && o->gpu_layers == 0),
             "data parallel over %d ranks: needs their comm and no GPU tier", ranks);
    /* a comm at one rank runs the same collectives (nccl on one GPU: the same bits as none) */
    MT_CHECK(!o->comm || (mt_comm_size(o->comm) == ranks && o->gpu_layers == 0),
             "a comm of %d ranks for %d ranks (and no GPU tier)", o->comm ? mt_comm_size(o->comm) : 0,
             ranks);
    MT_CHECK(!o->comm || (be->native_stream != NULL) == (strcmp(mt_comm_name(o->comm), "nccl") == 0),
             "the %s comm does not fit the %s backend (nccl's collectives take GPU buffers on its "
             "streams; mpi and local take host buffers)", o->comm ? mt_comm_name(o->comm) : "", be->name);
    mt_engine *e = mt_calloc(1, sizeof *e);
    e->ranks = ranks;
    e->comm = o->comm;
    e->rank = o->comm ? mt_comm_rank(o->comm) : 0;
    const mt_config *cfg = &t->cfg;
    e->t = t;
    e->be = be;
    e->o = *o;
    e->k = o->gpu_layers;
    e->n_streamed = t->cfg.L - e->k;
    if (o->resident) e->o.n_slots = e->n_streamed > 2 ? e->n_streamed : 2;
    e->M = o->batch / o->micro_batch;
    e->bN = o->micro_batch * o->T;
    e->elem = mt_dtype_size(be->dtype);
    int N = o->batch * o->T, L = cfg->L;

    mt_train_state_opts so = state_opts(o);
    e->ts = mt_train_state_create(t, be, &so);
    e->up_elem = mt_dtype_size(mt_train_state_upload_dtype(e->ts));
    e->host_ids = be->host_alloc(be, (size_t)N * sizeof(int32_t));
    e->host_targets = be->host_alloc(be, (size_t)N * sizeof(int32_t));

    e->slots = mt_calloc((size_t)e->o.n_slots, sizeof(void *));
    e->slot_loaded = mt_calloc((size_t)e->o.n_slots, sizeof(mt_event *));
    e->slot_free = mt_calloc((size_t)e->o.n_slots, sizeof(mt_event *));
    for (int s = 0; s < e->o.n_slots; s++) {
        e->slots[s] = be->alloc(be, group_bytes(e, 0));
        e->slot_loaded[s] = new_event(e);
        e->slot_free[s] = new_event(e);
    }
    e->embed_w = be->alloc(be, group_bytes(e, MT_GROUP_EMBED));
    e->head_w = be->alloc(be, group_bytes(e, L));
    e->embed_loaded = new_event(e);
    e->embed_free = new_event(e);
    e->head_loaded = new_event(e);
    e->head_free = new_event(e);
    MT_CHECK(!quantized(o) || (ranks == 1 && !o->comm),
             "a quantized base (%s) runs on one rank", mt_base_format_name(o->base_format));
    if (quantized(o)) {
        e->qbase = mt_quant_base_create(t, be, o->base_format, o->gpu_layers,
                                        o->base_on_device || be->memory.host_ram);
        if (!mt_quant_base_on_device(e->qbase))
            for (int i = 0; i < 2; i++) {
                e->qstage[i] = be->alloc(be, mt_quant_base_largest_blob(e->qbase));
                e->qstage_ready[i] = new_event(e);
                e->qstage_free[i] = new_event(e);
            }
    }
    if (o->lora) { /* the adapters' state instead of the base's gradient buffers */
        MT_CHECK(cfg->lora_rank >= o->lora->rank, "LoRA rank %d: the layer workspace is sized for "
                 "rank %d (set the table's cfg.lora_rank)", o->lora->rank, cfg->lora_rank);
        float *init = mt_malloc((size_t)(o->lora->total ? o->lora->total : 1) * sizeof(float));
        mt_lora_init(o->lora, init, o->seed);
        e->lora = mt_lora_state_create(o->lora, be, init);
        free(init);
    } else {
        e->g_layer = be->alloc(be, padded_size(t, 0, ranks) * sizeof(float));
        e->g_embed = be->alloc(be, padded_size(t, MT_GROUP_EMBED, ranks) * sizeof(float));
        e->g_head = be->alloc(be, padded_size(t, L, ranks) * sizeof(float));
    }
    if (o->comm && !be->native_stream) { /* the loads' all-gather; the gradients' reduce-scatter */
        if (!o->lora)
            e->g_shard = be->alloc(be, (size_t)mt_shard_size(mt_group_max_size(t), ranks) * sizeof(float));
        e->shard_in = new_event(e);
    }
    for (int i = 0; i < 2 && !o->lora; i++) { /* gradients on their way out */
        e->staging[i] = be->alloc(be, (size_t)mt_group_max_size(t) * e->elem);
        e->staging_ready[i] = new_event(e);
        e->staging_free[i] = new_event(e);
    }
    if (mt_train_state_upload_dtype(e->ts) != be->dtype) {
        e->widen = be->alloc(be, (size_t)mt_group_max_size(t) * e->up_elem);
        e->widened = new_event(e);
    }
    e->compute_done = new_event(e);
    e->norms = be->alloc(be, (size_t)(L + 2) * sizeof(float));
    e->acts = be->alloc(be, (size_t)act_sets(L, o) * N * cfg->C * e->elem);
    if (o->offload) {
        e->host_ckpt = be->host_alloc(be, (size_t)o->offload * N * cfg->C * e->elem);
        e->ckpt_ready = new_event(e);
        e->ckpts_saved = new_event(e);
        for (int i = 0; i < 2; i++) {
            e->ckpt_saved[i] = new_event(e);
            e->set_free[i] = new_event(e);
            e->ckpt_loaded[i] = new_event(e);
        }
    }
    e->saved_per_mb = mt_layer_saved_bytes_tiled(cfg, be->dtype, e->bN, o->mlp_chunk);
    if (o->saved_layers) e->saved = be->alloc(be, (size_t)o->saved_layers * e->M * e->saved_per_mb);
    e->saved_att_per_mb = mt_layer_attention_saved_bytes(cfg, be->dtype, e->bN);
    if (o->saved_attention)
        e->saved_att = be->alloc(be, (size_t)o->saved_attention * e->M * e->saved_att_per_mb);
    e->dx = be->alloc(be, (size_t)N * cfg->C * e->elem);
    e->ids = be->alloc(be, (size_t)N * sizeof(int32_t));
    e->targets = be->alloc(be, (size_t)N * sizeof(int32_t));
    e->losses = be->alloc(be, (size_t)N * sizeof(float));
    e->ids_ready = new_event(e);
    e->grads_out = new_event(e);

    e->pos = be->alloc(be, (size_t)N * sizeof(int32_t));
    e->doc_start = be->alloc(be, (size_t)N * sizeof(int32_t));
    mt_engine_set_documents(e, NULL);
    size_t rope_bytes = mt_config_rope_inv_freq_len(cfg) * sizeof(float); /* gemma3: two tables */
    float *inv_freq = mt_calloc(1, rope_bytes);
    mt_config_rope_inv_freq(cfg, inv_freq);
    e->inv_freq = be->alloc(be, rope_bytes);
    be->upload(be, e->inv_freq, inv_freq, rope_bytes);
    free(inv_freq);

    e->lc = (mt_layer_ctx){.cfg = cfg, .be = be, .inv_freq = e->inv_freq};
    mt_layer_ws_init_tiled(&e->ws, &e->lc, e->bN, o->mlp_chunk);
    mt_head_ws_init(&e->head_ws, &e->lc, e->bN);
    e->loads = mt_calloc((size_t)L + 2, sizeof(int));
    e->max_busy = 6 * L + 4; /* forward, backward, remade inputs, head: begin and end */
    e->busy = mt_calloc((size_t)e->max_busy, sizeof(mt_event *));
    for (int i = 0; i < e->max_busy; i++) e->busy[i] = new_event(e);
    if (o->trace) e->trace = mt_trace_create();
    e->dtrace = mt_dev_trace_create(be, e->trace);
    e->opt = mt_optimizer_create(t, e->ts, be, e->trace);
    if (weights) mt_engine_set_weights(e, weights);
    return e;
}

void mt_engine_destroy(mt_engine *e) {
    if (!e) return;
    mt_backend *be = e->be;
    mt_optimizer_destroy(e->opt);
    be->sync(be);
    mt_dev_trace_free(e->dtrace);
    mt_layer_ws_free(&e->ws, &e->lc);
    mt_head_ws_free(&e->head_ws, &e->lc);
    for (int s = 0; s < e->o.n_slots; s++) {
        be->free(be, e->slots[s]);
        be->event_destroy(be, e->slot_loaded[s]);
        be->event_destroy(be, e->slot_free[s]);
    }
    free(e->slots), free(e->slot_loaded), free(e->slot_free);
    for (int i = 0; i < 2 && e->staging[i]; i++) {
        be->free(be, e->staging[i]);
        be->event_destroy(be, e->staging_ready[i]);
        be->event_destroy(be, e->staging_free[i]);
    }
    mt_lora_state_free(e->lora);
    for (int i = 0; i < 2 && e->qstage[i]; i++) {
        be->free(be, e->qstage[i]);
        be->event_destroy(be, e->qstage_ready[i]);
        be->event_destroy(be, e->qstage_free[i]);
    }
    mt_quant_base_free(e->qbase);
    if (e->saved) be->free(be, e->saved);
    if (e->saved_att) be->free(be, e->saved_att);
    void *dev[] = {e->embed_w, e->head_w, e->g_layer, e->g_embed, e->g_head, e->norms, e->acts,
                   e->dx, e->ids, e->targets, e->losses, e->pos, e->doc_start, e->inv_freq, e->g_shard};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) be->free(be, dev[i]);
    if (e->widen) be->free(be, e->widen);
    mt_event *evs[] = {e->embed_loaded, e->embed_free, e->head_loaded, e->head_free, e->ids_ready,
                       e->grads_out, e->widened, e->compute_done, e->shard_in};
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
        if (evs[i]) be->event_destroy(be, evs[i]);
    for (int i = 0; i < e->max_busy; i++) be->event_destroy(be, e->busy[i]);
    if (e->o.offload) {
        be->host_free(be, e->host_ckpt);
        mt_event *off[] = {e->ckpt_ready, e->ckpts_saved, e->ckpt_saved[0], e->ckpt_saved[1],
                           e->set_free[0], e->set_free[1], e->ckpt_loaded[0], e->ckpt_loaded[1]};
        for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) be->event_destroy(be, off[i]);
    }
    free(e->busy);
    mt_train_state_free(e->ts);
    be->host_free(be, e->host_ids);
    be->host_free(be, e->host_targets);
    free(e->loads);
    mt_trace_free(e->trace);
    free(e);
}

void mt_engine_finish(mt_engine *e) { mt_optimizer_wait_all(e->opt); }

int mt_engine_set_documents(mt_engine *e, const int32_t *doc_start) {
    mt_backend *be = e->be;
    int B = e->o.batch, T = e->o.T;
    if (doc_start) MT_TRY(mt_docs_check(doc_start, B, T));
    size_t bytes = (size_t)B * T * sizeof(int32_t);
    int32_t *pos = mt_malloc(bytes);
    mt_docs_positions(doc_start, B, T, pos);
    be->upload(be, e->pos, pos, bytes); /* synchronous: ordered after the previous step's work */
    free(pos);
    if (doc_start) be->upload(be, e->doc_start, doc_start, bytes);
    if (be->note_documents) be->note_documents(be, e->doc_start, doc_start, B, T);
    e->use_docs = doc_start != NULL;
    return MT_OK;
}

mt_train_state *mt_engine_state(mt_engine *e) { return e->ts; }
int mt_engine_streams_update(const mt_engine_opts *o) {
    mt_train_state_opts so = state_opts(o);
    return mt_train_state_streams_update(&so);
}
mt_quant_base *mt_engine_quant_base(mt_engine *e) { return e->qbase; }

/* With a quantized base: the state's io, but the base's own tensors go to and from it. */
static int qio_get_weights(void *ctx, const mt_param *p, float *dst) {
    mt_engine *e = ctx;
    if (mt_quant_base_holds(e->qbase, p)) return mt_quant_base_get(e->qbase, p, dst);
    const mt_state_io *io = mt_train_state_io(e->ts);
    return io->get_weights(io->ctx, p, dst);
}
static int qio_set_weights(void *ctx, const mt_param *p, const float *src) {
    mt_engine *e = ctx;
    if (mt_quant_base_holds(e->qbase, p)) return mt_quant_base_set(e->qbase, p, src);
    const mt_state_io *io = mt_train_state_io(e->ts);
    return io->set_weights(io->ctx, p, src);
}
static int qio_parts(void *ctx, const mt_param *p, const mt_optim_tensor *parts) {
    (void)ctx, (void)parts;
    return mt_error_set("%s: a frozen base has no optimizer state", p->name);
}

const mt_state_io *mt_engine_state_io(mt_engine *e) {
    mt_optimizer_wait_all(e->opt);
    e->be->sync(e->be); /* the GPU tier's update runs on the compute stream */
    if (!e->qbase) return mt_train_state_io(e->ts);
    e->io = (mt_state_io){.format = MT_STATE_FROZEN, .ctx = e, .get_weights = qio_get_weights,
                          .set_weights = qio_set_weights, .get_parts = qio_parts, .set_parts = qio_parts};
    return &e->io;
}

void mt_engine_set_weights(mt_engine *e, const float *arena) {
    const mt_state_io *io = mt_engine_state_io(e);
    for (int i = 0; i < e->t->n_params; i++) {
        const mt_param *p = &e->t->params[i];
        MT_CHECK(io->set_weights(io->ctx, p, arena + p->offset) == MT_OK, "%s", mt_error_message());
    }
}

void mt_engine_get_weights(mt_engine *e, float *arena) {
    const mt_state_io *io = mt_engine_state_io(e);
    memset(arena, 0, (size_t)e->t->total * sizeof(float));
    for (int i = 0; i < e->t->n_params; i++) {
        const mt_param *p = &e->t->params[i];
        MT_CHECK(io->get_weights(io->ctx, p, arena + p->offset) == MT_OK, "%s", mt_error_message());
    }
}

const int *mt_engine_loads(const mt_engine *e) { return e->loads; }
double mt_engine_host_state_bytes(const mt_engine *e) { return mt_train_state_host_bytes(e->ts); }
mt_lora_state *mt_engine_lora(mt_engine *e) { return e->lora; }

mt_trace *mt_engine_trace(mt_engine *e) {
    mt_dev_trace_flush(e->dtrace);
    return e->trace;
}
mt_optimizer *mt_engine_optimizer(mt_engine *e) { return e->opt; }
