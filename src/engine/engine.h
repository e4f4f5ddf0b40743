/* The training engine: host-resident state and the layer-streaming step (docs/DESIGN.md, "One
 * training step"), written once against the backend interface.
 *
 * Host: the training state (train_state.h): weights and Adam moments in one optimizer format
 * (full: fp32 master and moments and an upload copy in the compute dtype; compact, tight: a bf16
 * master, which is itself uploaded, and 8-bit moments), the first gpu_layers layers' whole state
 * on the compute side instead. Compute side: weight slots for the layers in
 * flight, dedicated buffers for the embed and head groups, the saved input of every layer for
 * every micro-batch (the checkpoints), one layer's working activations, one layer's fp32
 * gradient. Per step each layer's weights cross to the compute side exactly twice (forward,
 * backward) whatever the number of micro-batches — once with o->resident —; the embed and head
 * groups once.
 *
 * With o->offload = k the first k layers' checkpoints go to pinned host memory as the forward makes
 * them and come back one layer ahead of the backward, so the compute side holds two sets for
 * them instead of k (checkpoints across tiers: the plan offloads as few layers as it must).
 * With o->checkpoint_every = 2 only every second layer's input is kept; the backward remakes the
 * others from it (engine.c, remake_input).
 * With o->saved_layers = k the last k layers also keep their internals (model/layer.h), so their
 * backward remakes only the elementwise pieces: same bits, one forward's matmuls and attention less.
 *
 * A layer's gradient leaves for the host as soon as it is final, into that layer's upload
 * buffer (dead from then until its update); its squared norm is summed on the compute side, so
 * the global norm is exact when the backward ends. The optimizer thread then updates embed,
 * layer 0, 1, ..., head, and the next step's forward of layer l waits only for layer l.
 *
 * Data parallel (o->ranks > 1, o->comm; issue 12): each rank runs this schedule on its own rows
 * (o->batch is the rank's share of the global batch) and holds a 1/N shard of every group's host
 * state (train_state.h). The comm is called in two places only: where a group's gradient is
 * final (grads_out: ONE reduce-scatter, so each rank gets its shard summed over the ranks, then
 * the shard's squared norm; the N partial norms are all-reduced once the backward ends, so
 * clipping is exact) and where a group's weights are loaded (load_group: the rank's shard into
 * its block of the slot, then ONE all-gather assembles the group in the compute dtype). Each
 * rank's optimizer thread updates only its shards; the forward still waits per group. The step's
 * target count and loss sum are gathered across the ranks, so the loss is the mean over all
 * ranks' targets and each rank scales its gradient by the global count. No GPU tier with ranks.
 * Streams (cuda + nccl): the all-gather goes on the H2D stream behind the shard's copy, so the
 * compute still waits per group for its load alone; the reduce-scatter and the norms' all-reduce
 * on the compute stream, where their inputs are made and their results read (engine.c says why).
 */
#ifndef MT_ENGINE_H
#define MT_ENGINE_H

#include <stdint.h>

#include "../backend/backend.h"
#include "../comm/comm.h"
#include "../model/params.h"
#include "../optim/state_io.h"
#include "lora_state.h"
#include "quant_base.h"
#include "optimizer.h"
#include "train_state.h"
#include "trace.h"

typedef struct {
    int batch;        /* B sequences per step */
    int micro_batch;  /* b sequences per micro-batch; B % b == 0 */
    int T;            /* tokens per sequence */
    int n_slots;      /* layer weight slots on the compute side (>= 2) */
    int opt_threads;  /* threads of the optimizer (<= 0: all) */
    int trace;        /* record a timeline (mt_engine_trace) */
    int offload;      /* the first `offload` layers (0..L) keep their checkpoints in pinned host
                         memory, not on the compute side (L: all, --offload-checkpoints) */
    int saved_layers; /* the last saved_layers layers keep their internals on the compute side
                         (mt_layer_saved_bytes per micro-batch) so that their backward skips the
                         recompute; 0 with offload */
    int saved_attention; /* the saved_attention layers before those keep only their attention's
                            output and statistics (mt_layer_attention_saved_bytes per micro-batch):
                            their backward remakes all but the attention; 0 with offload */
    int checkpoint_every; /* 2: sparse checkpoints, only the even layers' inputs (and the last
                             output) are kept; an odd layer's input is remade in the backward by
                             running the layer before it again, into one shared set: about half
                             the checkpoints' memory for one more forward of half the layers.
                             0 or 1: every layer's input kept. 2 is the most (a wider stride would
                             reload weights in the backward). Not with offload */
    int resident;     /* every layer's weights keep a slot of their own through the step (n_slots
                         is then L): loaded once per step, for the forward; the backward reuses them */
    mt_state_format state; /* optimizer state format (optim/state.h) */
    int gpu_layers;   /* the GPU tier: layers 0..gpu_layers-1 keep weights, moments and gradient
                         on the compute side and are updated there; never loaded */
    int grads_on_device; /* compact/tight: gradients wait for the update on the compute side
                            (else in a pinned host buffer); full keeps them in the upload copy */
    int update_on_device; /* with grads_on_device: the host groups' AdamW runs on the compute side,
                             their state streamed through it (train_state.h) */
    uint64_t seed;    /* tight's rounding seed */
    int mlp_chunk;    /* the layer's MLP runs over chunks of this many tokens (0: the whole
                         micro-batch), so its working memory is O(chunk): long sequences
                         (model/layer.h; a few ulp from untiled on BLAS: row blocking) */
    int ranks;        /* data-parallel ranks sharing the host state (<= 1: one); batch is then
                         this rank's rows. Sizes (mt_engine_plan_of) follow it */
    const mt_lora_table *lora; /* LoRA: these adapters train and the base is frozen (its state
                                  MT_STATE_FROZEN whatever `state` says: the weights alone; no
                                  base gradient is made or leaves the compute side; the adapters'
                                  state lives there, engine/lora_state.h); t->cfg.lora_rank must
                                  be at least its rank. NULL: every parameter trains */
    mt_base_format base_format; /* LoRA: the frozen streamed layers held as bf16 (the compute
                                   dtype, in the training state) or quantized (fp8, nf4:
                                   engine/quant_base.h, dequantized per load); one rank */
    int base_on_device; /* quantized: the layers' blobs stay on the compute side (no PCIe) */
    mt_comm *comm;    /* ranks > 1: their comm (mt_engine_create); one rank: NULL, or the nccl
                         comm of one GPU, whose collectives then run (the same bits as NULL).
                         nccl with the cuda backend, mpi (or local) with the cpu one */
} mt_engine_opts;

typedef struct {
    double loss;          /* mean over the counted targets */
    int64_t count;        /* targets counted (not ignored) */
    double grad_norm;     /* global L2 norm before clipping */
    float clip_coef;      /* the factor applied to the gradient (1 = not clipped) */
    /* measurements */
    double h2d_bytes, d2h_bytes; /* weights (and ids) in, gradients out */
    double compute_ms;    /* time the compute stream spent in layer and head work (-1: unknown) */
    double opt_ms;        /* wall time of the previous step's optimizer update (0 before one ran) */
    int skipped;          /* the loss or the gradient norm was NaN/inf: no update was applied */
} mt_step_result;

/* Compute-side and host bytes the engine will allocate (for the plan printed before training). */
typedef struct {
    double host_master, host_moments, host_upload, host_grads, host_total; /* master: the weights */
    double dev_slots, dev_embed_head, dev_grads, dev_checkpoints, dev_saved, dev_work, dev_tier,
        dev_total; /* dev_tier: the GPU tier's weights and moments (its gradients in dev_grads) */
    double dev_saved_per_layer; /* what one more saved layer would cost */
    double dev_saved_attention_per_layer; /* and one more layer's saved attention (in dev_saved) */
    double dev_lora;      /* LoRA: the adapters' weights, master, moments and gradient; a
                             quantized base's blobs (on the compute side) or their two staging
                             copies (streamed) */
    double base_quant;    /* a quantized base's blobs (in host_total or dev_total, as placed) */
} mt_engine_plan;

void mt_engine_plan_of(const mt_param_table *t, mt_dtype dtype, const mt_engine_opts *o,
                       mt_engine_plan *plan);

typedef struct mt_engine mt_engine;

/* Allocates the state; weights = the given fp32 arena (table layout; NULL: zeros, for a caller
 * that sets them tensor by tensor through mt_engine_state_io), moments zero. */
mt_engine *mt_engine_create(const mt_param_table *t, mt_backend *be, const mt_engine_opts *o,
                            const float *weights);
void mt_engine_destroy(mt_engine *e);

/* One training step on B rows of T tokens (host arrays, targets < 0 ignored): forward, head,
 * backward, exact global norm; then starts the AdamW update (Adam step `adam_step`, 1-based: the
 * updates applied before this one, plus 1) in the background and returns. max_norm <= 0 disables
 * clipping. adam_step also labels the step's spans in the trace.
 *
 * When the loss or the gradient norm is not finite the update is skipped (res->skipped): master,
 * moments and the upload copy stay bit for bit as they were (the optimizer thread rewrites the
 * upload buffers, which hold this step's gradients, from master), so the next step sees the state
 * as if this batch had not been; pass the same adam_step again then. What to do about such steps
 * (go on, stop) is the caller's policy; applying one is never right, so there is no option. */
void mt_engine_step(mt_engine *e, const int32_t *inputs, const int32_t *targets,
                    const mt_adamw_hparams *hp, int64_t adam_step, double max_norm,
                    mt_step_result *res);

/* Loss (sum over counted targets, *count set) of up to B rows with the current weights,
 * streamed like the forward (waits for the optimizer per layer). With ranks: B is this rank's
 * rows, and the sum and count are those of every rank's rows (the same on every rank). */
double mt_engine_eval(mt_engine *e, const int32_t *inputs, const int32_t *targets, int B,
                      int64_t *count);

/* Packed rows for the following steps and evals: doc_start (B, T) on the host (model/docs.h) —
 * attention stays inside each document and positions restart — or NULL for one document per row.
 * MT_ERR when the starts are malformed. */
int mt_engine_set_documents(mt_engine *e, const int32_t *doc_start);

/* Waits for the optimizer; after it, master/moments are the state after the last step. */
void mt_engine_finish(mt_engine *e);

/* The training state, tensor by tensor (checkpoints, initial weights); waits for the running
 * update first. */
const mt_state_io *mt_engine_state_io(mt_engine *e);
/* The whole weights as an fp32 arena of t->total floats (padding zero) / from one: for tests and
 * small models (a big model's arena would not fit; use mt_engine_state_io). */
void mt_engine_get_weights(mt_engine *e, float *arena);
void mt_engine_set_weights(mt_engine *e, const float *arena);
/* 1 when an engine of options o updates its host groups on the compute side (--update-on gpu:
 * update_on_device where it applies, train_state.h; LoRA's frozen state never). */
int mt_engine_streams_update(const mt_engine_opts *o);
/* The state itself (tests look at the upload copy around a skipped step). */
mt_train_state *mt_engine_state(mt_engine *e);
/* The quantized frozen base (a LoRA run with --base-dtype fp8|nf4), else NULL. */
mt_quant_base *mt_engine_quant_base(mt_engine *e);

/* Host bytes of the training state this rank allocated (train_state.h). */
double mt_engine_host_state_bytes(const mt_engine *e);

/* Weight loads issued per group in the last step (index layer + 1: 0 embed, L+1 head). */
const int *mt_engine_loads(const mt_engine *e);
mt_trace *mt_engine_trace(mt_engine *e);
mt_optimizer *mt_engine_optimizer(mt_engine *e);
/* The adapters' state (o->lora), NULL without adapters. It starts from mt_lora_init(o->seed);
 * mt_lora_state_set replaces that (waits for the running step first: mt_engine_finish). */
mt_lora_state *mt_engine_lora(mt_engine *e);

#endif
