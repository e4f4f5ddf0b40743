/* The whole model on one batch, every weight already on the compute side: the non-streamed
 * reference path used by the tests, `megatrain eval`/`generate` and the CPU benchmark. The
 * streaming engine runs the same layer and head functions in its own schedule.
 *
 * Forward saves each layer's input (the checkpoints); backward recomputes each layer from it.
 */
#ifndef MT_RUNNER_H
#define MT_RUNNER_H

#include <stdint.h>

#include "head.h"
#include "layer.h"
#include "params.h"

typedef struct {
    const mt_param_table *table;
    mt_layer_ctx lc;
    mt_layer_ws ws;
    mt_head_ws head_ws;
    int max_B, T, max_N;
    void *acts;       /* (L+1, max_N, C) checkpoints: input of every layer, then the last output */
    void *dx;         /* (max_N, C) gradient flowing down the residual stream */
    float *losses;    /* (max_N) per-token losses */
    int32_t *ids, *targets, *pos; /* (max_N) on the compute side */
    int32_t *doc_start;           /* (max_N) on the compute side when documents are set */
    int use_docs;
    float *inv_freq;  /* (D/2 per RoPE table: mt_config_rope_inv_freq_len) on the compute side */
    double aux_loss;  /* the last mt_runner_step's router_aux_loss_coef * load-balancing loss (0
                         without it): that step's loss is sum / count + aux_loss */
} mt_runner;

void mt_runner_init(mt_runner *r, const mt_param_table *t, mt_backend *be, int max_B, int T);
void mt_runner_free(mt_runner *r);

/* Loss of B rows of T tokens: ids and targets (B, T) on the host, targets < 0 ignored.
 * weights: the compute-side arena (be->dtype) laid out as the table. Returns the sum of the
 * per-token losses and sets *count to the number of targets counted. When grads (fp32,
 * compute side, table layout) is not NULL, the gradient of loss_scale * sum(losses)
 * accumulates into it; loss_scale 0 means 1/count (the mean, as PyTorch's cross_entropy). A model
 * with the MoE load-balancing loss adds r->aux_loss (set here) to the mean, and the gradient of
 * that term (unscaled by loss_scale) to grads. */
double mt_runner_step(mt_runner *r, const void *weights, float *grads, const int32_t *ids,
                      const int32_t *targets, int B, float loss_scale, int64_t *count);

/* Packed rows for the following calls: doc_start (max_B, T) on the host (see model/docs.h), or
 * NULL for one document per row. MT_ERR when the starts are malformed. */
int mt_runner_set_documents(mt_runner *r, const int32_t *doc_start);

/* fp32 logits (B, T, V) on the host of B rows of T tokens. */
void mt_runner_logits(mt_runner *r, const void *weights, const int32_t *ids, int B,
                      float *logits);

#endif
