/* The ends of the model around the layers: token embedding in, final RMSNorm + LM head +
 * cross-entropy out. Same stateless style as layer.h: weights and gradients come in as views.
 */
#ifndef MT_HEAD_H
#define MT_HEAD_H

#include "layer.h"

/* Head working memory for up to max_N tokens (compute side). */
typedef struct {
    int max_N;
    void *xn;     /* (N, C) final rmsnorm output */
    void *dxn;    /* (N, C) its gradient */
    float *rstd;  /* (N) */
} mt_head_ws;

void mt_head_ws_init(mt_head_ws *ws, const mt_layer_ctx *lc, int max_N);
void mt_head_ws_free(mt_head_ws *ws, const mt_layer_ctx *lc);

/* x0 (N, C) = embed[ids] (times gemma3's embedding scale). */
void mt_embed_forward(const mt_layer_ctx *lc, const mt_model_view *w, const int32_t *ids, int N,
                      void *x0);
/* grads->embed += scatter of dx0 (N, C). dx0 is consumed: gemma3 scales it in place and zeroes
 * the pad token's rows (nn.Embedding's padding_idx: the lookup gives that row no gradient). */
void mt_embed_backward(const mt_layer_ctx *lc, const mt_model_view *grads, const int32_t *ids,
                       int N, void *dx0);

/* losses (N) of the last residual x (N, C) against targets (N, < 0 = ignored). When grads is not
 * NULL: also dx (N, C) = d(loss_scale * sum(losses))/dx, and the final-norm and LM-head
 * gradients accumulate into grads (into grads->embed when the head is tied). */
void mt_head_loss(const mt_layer_ctx *lc, const mt_model_view *w, const mt_model_view *grads,
                  const void *x, const int32_t *targets, int N, float loss_scale, float *losses,
                  void *dx, mt_head_ws *ws);

/* logits (N, V) in the compute dtype, for evaluation and generation (N small). */
void mt_head_logits(const mt_layer_ctx *lc, const mt_model_view *w, const void *x, int N,
                    void *logits, mt_head_ws *ws);

#endif
