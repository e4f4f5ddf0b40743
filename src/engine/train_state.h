/* The engine's training state: where each group's weights, optimizer state and gradient live, and
 * the per-group work on them (the update, the restore after a skipped step, tensor-by-tensor
 * access for checkpoints and initial weights).
 *
 * The state is one optimizer format (optim/state.h: full, compact, tight, frozen) over three pieces
 * of the parameter arena:
 *   host A    the embed group                       host RAM, updated by the optimizer thread
 *   GPU tier  layers 0 .. k-1 (k = gpu_layers)      compute side, updated there (optim_update)
 *   host B    layers k .. L-1 and the head group    host RAM, updated by the optimizer thread
 * The tier takes the first layers: the next forward needs them first, and with their update on
 * the compute side the host optimizer starts that many layers ahead of the forward.
 *
 * Gradients wait for the update (clipping needs the global norm, known only when the backward
 * ends):
 *   full, host piece       in the group's upload copy, dead between the backward's last use and
 *                          the update (no extra bytes; the optimizer rewrites it with weights)
 *   compact/tight, host    the bf16 master IS the upload copy, so: on the compute side when
 *                          grads_on_device (the optimizer thread fetches each group before its
 *                          update), else in a pinned host buffer (2 B/param more on the host)
 *   GPU tier               on the compute side, always
 * Gradients are in the compute dtype (bf16 on cuda, as the upload copy held them before).
 *
 * frozen (a LoRA base: the LoRA engine never writes the base's gradients): the weights alone, in
 * the compute dtype (the upload copy on the host, the tier's weights on the compute side); no
 * gradient place anywhere (grad_dev and grad_host NULL, grads_on_device ignored, no fetch
 * buffers), the update and the restore do nothing, and a tensor has no optimizer parts
 * (get_parts / set_parts handle none; a checkpoint save refuses the state).
 *
 * Weights for the forward: host groups are copied from mt_train_state_upload (the upload dtype:
 * the compute dtype for full and frozen, bf16 for compact/tight — the cpu backend widens those with
 * from_bf16); tier layers are used in place (mt_train_state_tier_weights).
 *
 * Data parallel (ranks > 1, issue 12): every host group is cut into `ranks` shards of
 * mt_shard_size elements, the group padded with zeros to ranks * S, and rank r holds only
 * [r*S, (r+1)*S) of each group: master, moments, upload copy and the waiting gradient. A host
 * piece is then one group's shard (its own optimizer state, whose tight index base is the shard's
 * arena offset, so it rounds as the whole-model state would). mt_train_state_upload and the grad
 * places point at this rank's shard, mt_train_state_shard gives its length; the update pieces are
 * the one-rank pieces cut at the shard's ends (multiples of 256: 8-bit blocks stay whole), so a
 * shard's update is bit for bit that of the same elements on one rank. Padding is zero weights,
 * moments and gradients, which the update keeps zero. No GPU tier then (gpu_layers must be 0).
 * Tensor access (io): set_weights and set_parts keep this rank's part of the tensor (a checkpoint
 * loads on every rank, each keeping its shard: so it loads on any number of ranks). owned,
 * get_weights_range and parts_range (state_io.h) give this rank's own elements without any
 * collective: a checkpoint save has every rank write those (io/checkpoint.h). get_weights and
 * get_parts of whole tensors are COLLECTIVE: the ranks gather one group at a time over the comm's
 * host gather, in the order of a whole-state read (every tensor's weights in table order, then
 * every tensor's parts), every rank making the same calls (mt_engine_get_weights in the tests);
 * the gathered group is freed when the next read starts (mt_train_state_io) or with the state. */
#ifndef MT_TRAIN_STATE_H
#define MT_TRAIN_STATE_H

#include <stdint.h>

#include "../backend/backend.h"
#include "../comm/comm.h"
#include "../model/params.h"
#include "../optim/state.h"
#include "../optim/state_io.h"
#include "optimizer.h"

typedef struct {
    mt_state_format format;
    int gpu_layers;      /* k: layers 0..k-1 in the GPU tier (0..L) */
    int grads_on_device; /* compact/tight host pieces: gradients wait on the compute side */
    int update_on_device;/* with grads_on_device (compact/tight): the host groups are updated on
                            the compute side (optim_update, the host kernel's bits), their state
                            streamed up and back through two staging slots piece by piece, instead
                            of their gradients coming down to a host update (ignored otherwise) */
    uint64_t seed;       /* tight's rounding seed */
    int n_threads;       /* of one host update (<= 0: all) */
    int ranks;           /* data-parallel ranks sharing the host state (<= 1: one, unsharded) */
    mt_comm *comm;       /* ranks > 1: the ranks' comm (this rank's index, the io's gathers) */
    int layers_outside;  /* frozen, one rank: the streamed layer groups (gpu_layers .. L-1) are
                            held outside the state (a quantized base, engine/quant_base.h): the
                            state keeps the embed and head groups and the tier alone; its io
                            refuses those layers' tensors and nothing uploads them from here */
} mt_train_state_opts;

/* The shard of a group of n elements (a multiple of MT_OPTIM_BLOCK) over `ranks` ranks: ceil(n /
 * ranks) rounded up to a multiple of MT_OPTIM_BLOCK; n itself for one rank. */
int64_t mt_shard_size(int64_t n, int ranks);

/* Bytes the state takes on each side (for the planner), gradients included (frozen: the weights
 * in the compute dtype, host_weights and dev_tier, nothing else). */
typedef struct {
    double host_weights, host_moments, host_upload, host_grads, host_total;
    double dev_tier, dev_grads, dev_total;
} mt_train_state_bytes;

void mt_train_state_bytes_of(const mt_param_table *t, mt_dtype compute, const mt_train_state_opts *o,
                             mt_train_state_bytes *b);

typedef struct mt_train_state mt_train_state;

/* Weights zero, moments zero. */
mt_train_state *mt_train_state_create(const mt_param_table *t, mt_backend *be,
                                      const mt_train_state_opts *o);
void mt_train_state_free(mt_train_state *s);
/* 1 when the host groups are updated on the compute side (update_on_device took effect). */
int mt_train_state_updates_on_device(const mt_train_state *s);
/* 1 when options o would have them updated there: update_on_device with grads_on_device, compact
 * or tight, one rank (otherwise update_on_device is ignored). */
int mt_train_state_streams_update(const mt_train_state_opts *o);

/* 1 when group `layer` (-1 embed .. L head) is in the GPU tier. */
int mt_train_state_in_tier(const mt_train_state *s, int layer);

/* This rank's shard of group `layer` in elements (the group's size with one rank). */
int64_t mt_train_state_shard(const mt_train_state *s, int layer);
/* Host bytes the state allocated (arenas, scales, waiting gradients, fetch buffers): what one
 * rank holds. */
double mt_train_state_host_bytes(const mt_train_state *s);

/* Host groups: the weights the forward uploads (dtype mt_train_state_upload_dtype); with ranks,
 * this rank's shard of them (mt_train_state_shard elements). */
void *mt_train_state_upload(const mt_train_state *s, int layer);
mt_dtype mt_train_state_upload_dtype(const mt_train_state *s);
/* Tier layers: the layer's weights on the compute side, in the compute dtype. */
void *mt_train_state_tier_weights(const mt_train_state *s, int layer);

/* Where group `layer`'s gradient (compute dtype, the group's size) goes at the end of its
 * backward: on the compute side (non-NULL), else into the host buffer mt_train_state_grad_host.
 * frozen: both NULL (there is no gradient). */
void *mt_train_state_grad_dev(const mt_train_state *s, int layer);
void *mt_train_state_grad_host(const mt_train_state *s, int layer);

/* The optimizer thread's work on a host group (tier groups: nothing), in group order between
 * begin_update (once a step, before the first group: compute-side gradients are fetched a group
 * ahead) and end_update. A group is done when the weights the next forward reads are its
 * updated ones; on the host that is when update_group returns, but a streamed update
 * (updates_on_device) has a group's state come back while the next group's goes up, so it is
 * done during a later call, or at end_update. fn (NULL: none), on the optimizer thread, hears of
 * each group as it is done, in order (restore_group: at once). */
typedef void (*mt_group_done_fn)(void *ctx, int layer);
void mt_train_state_on_group_done(mt_train_state *s, mt_group_done_fn fn, void *ctx);
void mt_train_state_begin_update(mt_train_state *s);
void mt_train_state_update_group(mt_train_state *s, int layer, const mt_adamw_hparams *hp,
                                 int64_t step, float grad_scale);
void mt_train_state_end_update(mt_train_state *s);
/* After a skipped step: the weights the next forward reads are as before the step. */
void mt_train_state_restore_group(mt_train_state *s, int layer);
/* The tier's update, enqueued on the compute stream once the clip coefficient is known. */
void mt_train_state_update_tier(mt_train_state *s, const mt_adamw_hparams *hp, int64_t step,
                                float grad_scale);

/* The number of host and tier update calls a step makes (runs of tensors, <= 64M elements each:
 * one parallel region each; `megatrain bench adamw --pattern training` prints it). */
int mt_train_state_n_pieces(const mt_train_state *s);
/* Tensor by tensor access (checkpoints, initial weights); not while an update runs. */
const mt_state_io *mt_train_state_io(mt_train_state *s);

#endif
