/* The mixture-of-experts block that replaces an MoE layer's MLP (mixtral, qwen3_moe):
 *   logits = router(x), p = softmax(logits) (fp32), the k most probable experts with gates
 *   w = their p (divided by the k's sum when norm_topk_prob), out = sum_j w_j * expert_j(x),
 *   expert(x) = down(silu(gate(x)) * up(x)),
 * over the n tokens of one call (a micro-batch, or one chunk of it when tiled), forward and
 * hand-written backward, as transformers' MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock compute
 * it. Tokens are grouped by expert (moe_group: a permutation and its inverse), each expert runs
 * one GEMM per projection over its rows, and the gate-weighted combine sums each token's k rows.
 * An expert no token chose this step gets no gradient contribution (its rows are empty): its
 * gradient is 0, and AdamW still decays its moments and applies weight decay and the moments'
 * remaining update to it, exactly as torch.optim.AdamW does for a parameter whose .grad is a zero
 * tensor (the case when transformers' experts are one fused tensor).
 *
 * The load-balancing loss (transformers' load_balancing_loss_func, attention_mask None: every
 * token counts, ignored targets included), when config.json says output_router_logits:
 *   aux = E * sum_e (cnt_e / R) * (P_e / R),  R = tokens x MoE layers of the step,
 *   cnt_e = top-k selections of expert e, P_e = sum of its probabilities, over all MoE layers,
 * and router_aux_loss_coef * aux joins the loss. cnt is a step-wide count, so the layers'
 * forwards collect (cnt, P, R) into mt_moe_stats and the gradient, coef * E * cnt_e / R^2 on every
 * probability of every row, is known once the whole forward has run: callers bracket the forward
 * with mt_moe_stats_reset and mt_moe_aux_finish, then run the backward.
 */
#ifndef MT_MOE_H
#define MT_MOE_H

#include "layer.h"

struct mt_moe_stats {
    int32_t *counts;  /* (E) compute side: top-k selections per expert */
    float *prob_sum;  /* (E) compute side: router probabilities per expert */
    float *aux_grad;  /* (E) compute side: d(coef * aux)/d p, set by mt_moe_aux_finish */
    int64_t rows;     /* tokens routed by the forwards since the reset */
    int collect;      /* between reset and finish, with the aux loss on: forwards collect */
};

/* A training step begins: statistics zeroed, forwards collect (when the config has the aux loss). */
void mt_moe_stats_reset(const mt_layer_ctx *lc, mt_moe_stats *s);
/* Sums n doubles in place over the ranks of a data-parallel step (the same bits on every rank). */
typedef struct {
    void (*sum)(void *ctx, double *x, size_t n);
    void *ctx;
} mt_moe_reduce;

/* The forward has run: returns router_aux_loss_coef * aux (0 without the aux loss) and sets the
 * gradient the backwards add. Forwards after it no longer collect. With several ranks, reduce
 * (else NULL) sums every rank's (cnt, P, R) first, so that aux and its gradient are those of the
 * global batch, as one process on it computes them (transformers under DDP would use each
 * rank's own rows instead; one rank's result is what the N-rank run must reproduce). */
double mt_moe_aux_finish(const mt_layer_ctx *lc, mt_moe_stats *s, const mt_moe_reduce *reduce);

/* out (n, C) = the block on x (n, C) (out NULL: only the internals, for a backward's recompute).
 * Fills ws's moe fields; collects statistics when `collect` and the stats collect. */
void mt_moe_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, const void *x, void *out,
                    int n, mt_layer_ws *ws, int collect);
/* From dout (n, C): dx (n, C) written, the router's and experts' gradients in g accumulate (+=).
 * ws's moe fields hold this x's forward. */
void mt_moe_backward(const mt_layer_ctx *lc, const mt_layer_weights *w, const mt_layer_weights *g,
                     const void *dout, const void *x, void *dx, int n, mt_layer_ws *ws);

/* MT_ERR (naming the backend and what to do) when cfg has experts and be lacks the MoE ops: for
 * the run's setup to call before it builds an engine (mt_layer_ws_init stops with a fatal error
 * otherwise). */
int mt_moe_backend_check(const mt_config *cfg, const mt_backend *be);

/* Workspace pieces beside the per-token fields: offsets (compute side and host), the stats. */
void mt_moe_ws_init(mt_layer_ws *ws, const mt_layer_ctx *lc);
void mt_moe_ws_free(mt_layer_ws *ws, const mt_layer_ctx *lc);

#endif
