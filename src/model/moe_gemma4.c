/* Gemma 4's experts branch (model/moe_gemma4.h): the backend's routing, grouping and per-expert
 * GEMM ops (the same as mixtral's and qwen3_moe's, model/moe.c) with the router's own input and
 * the per-expert gate scale. */
#include "model/moe_gemma4.h"

#include <math.h>

#include "core/error.h"

static float *f32(void *p) { return (float *)p; }

/* Each expert's [first, end) grouped rows, from the compute side's offsets. */
static const int32_t *expert_rows(const mt_layer_ctx *lc, mt_layer_ws *ws) {
    size_t bytes = ((size_t)lc->cfg->n_experts + 1) * sizeof(int32_t);
    lc->be->download(lc->be, ws->moe_offsets_host, ws->moe_offsets, bytes); /* a sync on a GPU */
    return ws->moe_offsets_host;
}

/* router.scale * C^-0.5 on the weightless norm: the norm with router.scale as its weight, then the
 * constant (transformers: norm, * scale, * scalar_root_size). */
static float root_size(const mt_config *cfg) { return (float)(1.0 / sqrt((double)cfg->C)); }

void mt_moe_gemma4_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, const void *h, void *y,
                           int n, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    int C = cfg->C, Fe = cfg->moe_F, E = cfg->n_experts, k = cfg->top_k, nk = n * k;
    be->rmsnorm_forward(be, ws->g4_rx, ws->g4_rstd_rx, h, w->router_scale, n, C, cfg->rms_norm_eps, 0);
    be->scale(be, ws->g4_rx, root_size(cfg), (size_t)n * C);
    be->matmul_forward(be, ws->moe_logits, ws->g4_rx, w->router, NULL, n, C, E);
    be->moe_route(be, ws->moe_probs, ws->moe_idx, ws->moe_w, NULL, NULL, ws->moe_logits, n, E, k, 1);
    be->moe_expert_scale_forward(be, ws->g4_w, ws->moe_w, ws->moe_idx, w->expert_scale, n, k);
    be->rmsnorm_forward(be, ws->g4_x2, ws->g4_rstd_x2, h, w->pre_norm_2, n, C, cfg->rms_norm_eps, 0);
    be->moe_group(be, ws->moe_perm, ws->moe_inv, ws->moe_offsets, ws->moe_idx, n, E, k);
    be->moe_gather(be, ws->moe_x, ws->g4_x2, ws->moe_perm, n, C, k);
    const int32_t *off = expert_rows(lc, ws), *off_d = ws->moe_offsets;
    be->moe_matmul_forward(be, ws->moe_gate, ws->moe_x, w->exp_gate_up_oi, (size_t)2 * Fe * C, off_d, off,
                           E, C, 2 * Fe);
    be->cols_split(be, ws->g4_gate, ws->moe_up, ws->moe_gate, nk, Fe, Fe);
    be->geglu_forward(be, ws->moe_act, ws->g4_gate, ws->moe_up, (size_t)nk * Fe);
    be->moe_matmul_forward(be, ws->moe_y, ws->moe_act, w->exp_down_oi, (size_t)C * Fe, off_d, off, E, Fe, C);
    be->moe_combine(be, y, ws->moe_y, ws->g4_w, ws->moe_inv, n, C, k);
}

void mt_moe_gemma4_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                            const mt_layer_weights *g, const void *dy, const void *h, void *dh, int n,
                            mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    int C = cfg->C, Fe = cfg->moe_F, E = cfg->n_experts, k = cfg->top_k, nk = n * k;
    const int32_t *off = ws->moe_offsets_host, *off_d = ws->moe_offsets; /* this forward's */
    /* the experts: an expert with no token adds nothing to its gradient */
    be->moe_combine_backward(be, ws->moe_d_y, ws->moe_dw, dy, ws->moe_y, ws->g4_w, ws->moe_inv, n, C, k);
    be->moe_matmul_backward(be, ws->moe_d_act, f32(g->exp_down_oi), ws->moe_d_y, ws->moe_act,
                            w->exp_down_oi, (size_t)C * Fe, off_d, off, E, Fe, C, 0);
    be->geglu_backward(be, ws->g4_d_gate, ws->moe_d_up, ws->moe_d_act, ws->g4_gate, ws->moe_up,
                       (size_t)nk * Fe);
    be->cols_join(be, ws->moe_d_gate, ws->g4_d_gate, ws->moe_d_up, nk, Fe, Fe);
    be->moe_matmul_backward(be, ws->moe_d_x, f32(g->exp_gate_up_oi), ws->moe_d_gate, ws->moe_x,
                            w->exp_gate_up_oi, (size_t)2 * Fe * C, off_d, off, E, C, 2 * Fe, 0);
    be->moe_gather_backward(be, ws->g4_d3, ws->moe_d_x, ws->moe_inv, n, C, k, 0);
    be->rmsnorm_backward(be, dh, f32(g->pre_norm_2), ws->g4_d3, h, w->pre_norm_2, ws->g4_rstd_x2, n, C,
                         0, 0);
    /* the router: the gates' gradient through per_expert_scale, the renormalised top-k and the
     * softmax, then the projection and the router's input */
    be->moe_expert_scale_backward(be, ws->g4_dw, f32(g->expert_scale), ws->moe_dw, ws->moe_w, ws->moe_idx,
                                  w->expert_scale, n, k);
    be->moe_route_backward(be, ws->moe_d_logits, ws->g4_dw, ws->moe_probs, ws->moe_idx, ws->moe_w, NULL,
                           n, E, k, 1);
    be->matmul_backward(be, ws->g4_d3, f32(g->router), NULL, ws->moe_d_logits, ws->g4_rx, w->router, n, C,
                        E, 0);
    be->scale(be, ws->g4_d3, root_size(cfg), (size_t)n * C);
    be->rmsnorm_backward(be, dh, f32(g->router_scale), ws->g4_d3, h, w->router_scale, ws->g4_rstd_rx, n,
                         C, 1, 0);
}
