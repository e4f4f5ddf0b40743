/* A layer's linear projection with its LoRA adapter, when it has one (model/lora.h):
 *   y (n, out) = x (n, in) W^T (+ bias) + scale * (x A^T) B^T
 * Every projection a layer runs goes through here, so an adapter on any of them is the layer's
 * business nowhere else. Without an adapter on `kind` (w->lora NULL, or no adapter there) these
 * are be->matmul_forward / matmul_backward exactly.
 *
 * The low-rank term runs as three products on the backend's matmuls: u = x A^T (ws->lora_u),
 * u *= scale, y += u B^T. Its backward remakes u (r columns: cheap, nothing is kept between the
 * calls) and adds dx += (scale * dy B) A, dA += (scale * dy B)^T x, dB += dy^T (scale * u).
 * PEFT computes (x A^T B^T) * scale: the same value, rounded in another order. */
#ifndef MT_LINEAR_H
#define MT_LINEAR_H

#include "model/layer.h"

/* y (n, out) = the projection `kind` of x (n, in); W (out, in) and bias (out, or NULL) in the
 * compute dtype. */
void mt_linear_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, mt_param_kind kind,
                       void *y, const void *x, const void *W, const void *bias, int n, int in,
                       int out, mt_layer_ws *ws);

/* From dy (n, out): dx (n, in) = (or += when accumulate) the gradient through W and the adapter;
 * dW (out, in) and db (out) += (NULL: skipped: a frozen W); the adapter's fp32 gradients (g->lora)
 * += when it has one. */
void mt_linear_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                        const mt_layer_weights *g, mt_param_kind kind, void *dx, float *dW,
                        float *db, const void *dy, const void *x, const void *W, int n, int in,
                        int out, int accumulate, mt_layer_ws *ws);

#endif
