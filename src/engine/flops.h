/* FLOPs of one training step for the throughput lines (train's step line and summary, bench).
 * Two counts, always printed side by side and named:
 *   6NT             6 · N · tokens (N = every parameter): the anchors' convention (bench/RESULTS.md).
 *                   It leaves attention's T² work out, which at long context is most of the step
 *                   (the Qwen2.5-7B shape at 512k: 6NT is 2.40e16, attention 1.93e17).
 *   with attention  6NT + every layer's causal attention, counted as bench/attention_bench.cu and
 *                   bench/RESULTS.md count it: forward 4·H·D·n²/2 for a document of n tokens (QK^T
 *                   and PV, 2 FLOPs a multiply-add, the visible half), backward 2.5× the forward
 *                   (five T×T×D products against two, the scores remade): 7·L·H·D·n² a document.
 * Packed rows (doc_start given): attention stays inside each document, so only n² within
 * documents counts; without doc_start every row is one causal document of T tokens (the engine
 * attends over the whole row then, whatever the tokens are). Neither count includes the
 * recompute of checkpointed layers (the MFU of the step line counts executed matmuls instead). */
#ifndef MT_FLOPS_H
#define MT_FLOPS_H

#include <stdint.h>

#include "model/config.h"

/* 6 · n_params · tokens. */
double mt_flops_6nt(double n_params, double tokens);

/* Sum over rows and documents of n² (n = tokens of the document): B·T² without doc_start;
 * doc_start (B, T) as model/docs.h defines it (a document starts where doc_start[t] == t). */
double mt_flops_doc_square_sum(const int32_t *doc_start, int B, int T);

/* The attention FLOPs of one step, forward and backward: 7 · L · H · D · doc_square_sum over the
 * attention layers, plus the Gated DeltaNet layers' recurrence (3.5 x its forward). */
double mt_flops_attention(const mt_config *c, const int32_t *doc_start, int B, int T);

/* The matmul FLOPs layer l's forward spends on `tokens` tokens in its projections (q, k, v, o,
 * and with_mlp its MLP: a dense layer's gate, up, down; an MoE layer's router and the k experts
 * each token goes through, not all E), and in its causal attention over rows of T tokens (QK^T
 * and PV over the visible half). What the recompute of a checkpointed layer repeats, what saving
 * its internals or its attention output spares (planner.c), and the forward's time per layer
 * (step_time.h). */
double mt_flops_layer_projections(const mt_config *c, int l, double tokens, int with_mlp);
double mt_flops_layer_attention_forward(const mt_config *c, int l, double tokens, int T);
/* A Gated DeltaNet mixer's recurrence in the chunked form (chunk 64), forward, on `tokens`
 * tokens (what mt_flops_layer_attention_forward gives for such a layer; flops.c has the count). */
double mt_flops_deltanet_core_forward(const mt_config *c, double tokens);
/* The MLP part of that: 2 * tokens * 3 * C * F dense; MoE 2 * tokens * (C * E + k * 3 * C * Fe). */
double mt_flops_layer_mlp(const mt_config *c, int l, double tokens);
/* The LM head's forward product: 2 * tokens * C * V. */
double mt_flops_head_forward(const mt_config *c, double tokens);

/* The matmul FLOPs one step executes (the MFU's numerator): every layer's forward, again in the
 * recompute (all of it for layers without saved internals, all but the attention for the
 * saved_attention ones; the saved layers are the last ones, the saved-attention ones before
 * them), the backward at twice the projections and 2.5x the attention; the LM head forward and
 * its two backward products. MoE layers count their active experts only (so the projections are
 * 6 * N_active * tokens, as the throughput line counts them). */
double mt_flops_executed(const mt_config *c, double tokens, int T, int saved_layers, int saved_attention);
/* What sparse checkpoints add (every == 2, engine.h checkpoint_every): the forward, again in the
 * backward, of the layer before each odd one (its projections, MLP or experts, attention); 0 for
 * every <= 1. Not in mt_flops_executed, whose callers add it. */
double mt_flops_remade(const mt_config *c, double tokens, int T, int every);
/* The same for a LoRA run (a frozen base): the backward computes the activations' gradient alone,
 * no weight gradient, so the projections' and the LM head's backward count once, not twice. The
 * adapters' own products (rank r: 2 r (in + out) a token and module, forward; ~0.5% of an 8B's
 * projections at r 16) are left out. */
double mt_flops_executed_frozen(const mt_config *c, double tokens, int T, int saved_layers,
                                int saved_attention);

#endif
