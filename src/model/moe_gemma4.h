/* Gemma 4's MoE block (enable_moe_block, 26B-A4B): experts beside the dense MLP. The layer's MLP
 * half (model/layer.c) is
 *   out = h + post_ff_norm(post_ff_norm_1(mlp(pre_ff_norm(h))) + post_ff_norm_2(experts(h)))
 * and this file is the experts branch, as transformers 5.25's Gemma4TextRouter and
 * Gemma4TextExperts compute it:
 *   rx = rmsnorm(h) (no weight) * router.scale * C^-0.5,  p = softmax(rx . router.proj) (fp32),
 *   the k most probable experts, their p renormalised to sum 1, times per_expert_scale[e]: w;
 *   x2 = pre_feedforward_layernorm_2(h),  y = sum_j w_j * down_e(gelu_tanh(gate_e x2) * up_e x2)
 * with each expert's gate_up_proj (2Fe, C) (gate rows, then up rows) and down_proj (C, Fe) fused
 * [E, out, in] tensors. No load-balancing loss (Gemma 4 has none). Internal to model/. */
#ifndef MT_MOE_GEMMA4_H
#define MT_MOE_GEMMA4_H

#include "model/layer.h"

/* y (n, C) = the experts branch on the n tokens of the residual h (n, C); ws's g4_* and moe fields
 * keep what the backward reads. */
void mt_moe_gemma4_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, const void *h, void *y,
                           int n, mt_layer_ws *ws);
/* From dy (n, C), the gradient of y: dh (n, C) written (=) through the router's input and the
 * experts' input norm; the router's, the two scales', the experts' and pre_feedforward_layernorm_2's
 * gradients accumulate. ws holds this h's forward. dh must not alias dy or ws's g4_d3. */
void mt_moe_gemma4_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                            const mt_layer_weights *g, const void *dy, const void *h, void *dh, int n,
                            mt_layer_ws *ws);

#endif
