/* The mixture-of-experts block: see moe.h. */
#include "moe.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "linear.h"
#include "lora.h"

static float *f32(void *p) { return (float *)p; }

/* Elements from one expert's tensor to the next's (weights and gradients alike). */
static size_t expert_stride(const mt_layer_ctx *lc, const mt_layer_weights *w) {
    return w->exp_stride / mt_dtype_size(lc->be->dtype);
}

int mt_moe_backend_check(const mt_config *cfg, const mt_backend *be) {
    if (cfg->n_experts > 0 && (!be->moe_route || !be->moe_matmul_forward))
        return mt_error_set("the %s backend has no mixture-of-experts ops yet: run %s models with "
                            "--device cpu", be->name, cfg->model_type);
    if (cfg->arch == MT_ARCH_GPT_OSS && (!be->moe_matmul_io_forward || !be->swiglu_clamped_forward))
        return mt_error_set("gpt_oss: the %s backend has no gpt-oss expert ops (fused [E, in, out] "
                            "experts with biases, the clamped SwiGLU) yet: use --device cpu", be->name);
    return MT_OK;
}

void mt_moe_ws_init(mt_layer_ws *ws, const mt_layer_ctx *lc) {
    const mt_config *cfg = lc->cfg;
    mt_backend *be = lc->be;
    if (cfg->n_experts <= 0) return;
    if (mt_moe_backend_check(cfg, be) != MT_OK) mt_fatal(__FILE__, __LINE__, "%s", mt_error_message());
    size_t E = (size_t)cfg->n_experts;
    ws->moe_offsets = be->alloc(be, (E + 1) * sizeof(int32_t));
    ws->moe_offsets_host = mt_malloc((E + 1) * sizeof(int32_t));
    mt_moe_stats *s = mt_calloc(1, sizeof *s);
    s->counts = be->alloc(be, E * sizeof(int32_t));
    s->prob_sum = be->alloc(be, E * sizeof(float));
    s->aux_grad = be->alloc(be, E * sizeof(float));
    ws->moe_stats = s;
    mt_moe_stats_reset(lc, s);
    s->collect = 0;
}

void mt_moe_ws_free(mt_layer_ws *ws, const mt_layer_ctx *lc) {
    mt_backend *be = lc->be;
    if (ws->moe_offsets) be->free(be, ws->moe_offsets);
    free(ws->moe_offsets_host);
    mt_moe_stats *s = ws->moe_stats;
    if (s) {
        be->free(be, s->counts);
        be->free(be, s->prob_sum);
        be->free(be, s->aux_grad);
        free(s);
    }
    ws->moe_offsets = NULL;
    ws->moe_offsets_host = NULL;
    ws->moe_stats = NULL;
}

void mt_moe_stats_reset(const mt_layer_ctx *lc, mt_moe_stats *s) {
    if (!s) return;
    mt_backend *be = lc->be;
    size_t E = (size_t)lc->cfg->n_experts;
    be->zero(be, s->counts, E * sizeof(int32_t));
    be->zero(be, s->prob_sum, E * sizeof(float));
    be->zero(be, s->aux_grad, E * sizeof(float));
    s->rows = 0;
    s->collect = lc->cfg->router_aux;
}

double mt_moe_aux_finish(const mt_layer_ctx *lc, mt_moe_stats *s, const mt_moe_reduce *reduce) {
    if (!s || !s->collect) return 0;
    s->collect = 0;
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    int E = cfg->n_experts;
    int32_t *cnt = mt_malloc((size_t)E * sizeof(int32_t));
    float *P = mt_malloc((size_t)E * sizeof(float)), *grad = mt_malloc((size_t)E * sizeof(float));
    double *tot = mt_malloc((2 * (size_t)E + 1) * sizeof(double)); /* cnt (E), P (E), R */
    be->download(be, cnt, s->counts, (size_t)E * sizeof(int32_t));
    be->download(be, P, s->prob_sum, (size_t)E * sizeof(float));
    for (int e = 0; e < E; e++) tot[e] = cnt[e], tot[E + e] = P[e];
    tot[2 * E] = (double)s->rows;
    if (reduce) reduce->sum(reduce->ctx, tot, 2 * (size_t)E + 1); /* exact for cnt and R */
    double R = tot[2 * E], aux = 0;
    if (R > 0) {
        for (int e = 0; e < E; e++) {
            aux += tot[e] * tot[E + e];
            grad[e] = (float)((double)cfg->router_aux_coef * E * tot[e] / (R * R));
        }
        aux *= (double)E / (R * R);
        be->upload(be, s->aux_grad, grad, (size_t)E * sizeof(float));
    }
    free(cnt), free(P), free(grad), free(tot);
    return (double)cfg->router_aux_coef * aux;
}

/* Each expert's [first, end) grouped rows, from the compute side's offsets. */
static const int32_t *expert_rows(const mt_layer_ctx *lc, mt_layer_ws *ws) {
    size_t bytes = ((size_t)lc->cfg->n_experts + 1) * sizeof(int32_t);
    lc->be->download(lc->be, ws->moe_offsets_host, ws->moe_offsets, bytes); /* a sync on a GPU */
    return ws->moe_offsets_host;
}

/* qwen3_5_moe's shared expert on the n tokens of x: a SwiGLU MLP of width F (the dense MLP's
 * weights and fields) whose output shared_y is scaled by sigmoid(x . w_g) (shared_logit) into
 * shared_g and added onto out (when not NULL). */
static void shared_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, const void *x,
                           void *out, int n, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    int C = lc->cfg->C, F = lc->cfg->F;
    mt_linear_forward(lc, w, MT_W_GATE, ws->gate, x, w->gate, NULL, n, C, F, ws);
    mt_linear_forward(lc, w, MT_W_UP, ws->up, x, w->up, NULL, n, C, F, ws);
    be->swiglu_forward(be, ws->act, ws->gate, ws->up, (size_t)n * F);
    mt_linear_forward(lc, w, MT_W_DOWN, ws->shared_y, ws->act, w->down, NULL, n, F, C, ws);
    mt_linear_forward(lc, w, MT_W_SHARED_GATE, ws->shared_logit, x, w->shared_gate, NULL, n, C, 1,
                      ws);
    if (!out) return;
    be->sigmoid_gate_forward(be, ws->shared_g, ws->shared_y, ws->shared_logit, n, C, 1);
    be->add(be, out, out, ws->shared_g, (size_t)n * C);
}

/* Its backward from dout, the gradient of the block's output: the shared expert's weight
 * gradients accumulate, and so does dx. */
static void shared_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                            const mt_layer_weights *g, const void *dout, const void *x, void *dx,
                            int n, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    int C = lc->cfg->C, F = lc->cfg->F;
    /* shared_g as the scratch of the gated output's gradient with respect to shared_y */
    be->sigmoid_gate_backward(be, ws->shared_g, ws->d_shared_logit, dout, ws->shared_y,
                              ws->shared_logit, n, C, 1);
    mt_linear_backward(lc, w, g, MT_W_SHARED_GATE, dx, f32(g->shared_gate), NULL,
                       ws->d_shared_logit, x, w->shared_gate, n, C, 1, 1, ws);
    mt_linear_backward(lc, w, g, MT_W_DOWN, ws->d_act, f32(g->down), NULL, ws->shared_g, ws->act,
                       w->down, n, F, C, 0, ws);
    be->swiglu_backward(be, ws->d_gate, ws->d_up, ws->d_act, ws->gate, ws->up, (size_t)n * F);
    mt_linear_backward(lc, w, g, MT_W_GATE, dx, f32(g->gate), NULL, ws->d_gate, x, w->gate, n, C, F,
                       1, ws);
    mt_linear_backward(lc, w, g, MT_W_UP, dx, f32(g->up), NULL, ws->d_up, x, w->up, n, C, F, 1, ws);
}

/* LoRA on a gpt-oss experts' projection `kind` (model/lora.h): expert e's W[e] (in, out) carries
 * scale * A_e^T B_e^T, A_e (r, in) and B_e (out, r) its slices of the arena (A (E, r, in), B
 * (E, out, r)), so that over e's grouped rows x (rows, in)
 *   y += scale * (x A_e^T) B_e^T
 * as three products on the grouped GEMMs (moe_matmul_forward: weight (M, K) per expert): u = x
 * A_e^T into ws->lora_moe_u, u *= scale, then scratch = u B_e^T, y += scratch. This is PEFT's
 * ParamWrapper (x (W + scale A^T B^T)) without the (E, in, out) delta: E r (in + out) adapter
 * elements and 2 r (in + out) FLOPs a row, nothing of W's size. The backward remakes u (r columns)
 * and, from dy: du = dy B_e, dB_e += dy^T u (u scaled), du *= scale, dx += du A_e, dA_e += du^T x.
 * NULL lora / no adapter on kind: nothing. */
static int expert_adapter(const mt_layer_weights *w, mt_param_kind kind) {
    return w->lora && w->lora->a[kind];
}

static void expert_lora_u(const mt_layer_ctx *lc, const mt_lora_view *lv, mt_param_kind kind,
                          const void *x, int in, mt_layer_ws *ws, const int32_t *off_d,
                          const int32_t *off) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    int E = cfg->n_experts, r = lv->rank;
    size_t nk = (size_t)off[E];
    MT_CHECK(ws->lora_moe_u && r <= cfg->lora_rank,
             "LoRA rank %d on the experts: the layer workspace was sized for rank %d", r,
             cfg->lora_rank);
    be->moe_matmul_forward(be, ws->lora_moe_u, x, lv->a[kind], (size_t)r * in, off_d, off, E, in, r);
    be->scale(be, ws->lora_moe_u, lv->scale, nk * (size_t)r);
}

/* y (grouped rows, out) += the adapter's term on x (grouped rows, in); scratch: (rows, out). */
static void expert_lora_forward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                                mt_param_kind kind, void *y, const void *x, void *scratch, int in,
                                int out, mt_layer_ws *ws, const int32_t *off_d, const int32_t *off) {
    if (!expert_adapter(w, kind)) return;
    mt_backend *be = lc->be;
    const mt_lora_view *lv = w->lora;
    int E = lc->cfg->n_experts, r = lv->rank;
    expert_lora_u(lc, lv, kind, x, in, ws, off_d, off);
    be->moe_matmul_forward(be, scratch, ws->lora_moe_u, lv->b[kind], (size_t)out * r, off_d, off, E,
                           r, out);
    be->add(be, y, y, scratch, (size_t)off[E] * out);
}

/* dx (grouped rows, in) += the adapter's share of the gradient from dy; dA, dB (fp32) += theirs. */
static void expert_lora_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                                 const mt_layer_weights *g, mt_param_kind kind, void *dx,
                                 const void *dy, const void *x, int in, int out, mt_layer_ws *ws,
                                 const int32_t *off_d, const int32_t *off) {
    if (!expert_adapter(w, kind)) return;
    mt_backend *be = lc->be;
    const mt_lora_view *lv = w->lora, *lg = g->lora;
    MT_CHECK(lg && lg->a[kind], "LoRA: the gradient view has no experts' adapter where the weights do");
    int E = lc->cfg->n_experts, r = lv->rank;
    expert_lora_u(lc, lv, kind, x, in, ws, off_d, off);
    be->moe_matmul_backward(be, ws->lora_moe_du, (float *)lg->b[kind], dy, ws->lora_moe_u,
                            lv->b[kind], (size_t)out * r, off_d, off, E, r, out, 0);
    be->scale(be, ws->lora_moe_du, lv->scale, (size_t)off[E] * (size_t)r);
    be->moe_matmul_backward(be, dx, (float *)lg->a[kind], ws->lora_moe_du, x, lv->a[kind],
                            (size_t)r * in, off_d, off, E, in, r, 1);
}

/* gpt-oss's experts on the grouped rows (ws->moe_x, offsets set): gate_up = x @ W[e] + b[e] into
 * moe_gate (n*k, 2Fe, gate and up interleaved), the clamped SwiGLU into moe_act, then
 * y = act @ down[e] + b[e] into moe_y: each expert's down bias inside its routing weight. */
static void oss_experts_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, int n,
                                mt_layer_ws *ws, const int32_t *off) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    int C = cfg->C, Fe = cfg->moe_F, E = cfg->n_experts, nk = n * cfg->top_k;
    be->moe_matmul_io_forward(be, ws->moe_gate, ws->moe_x, w->exp_gate_up, w->exp_gate_up_bias,
                              ws->moe_offsets, off, E, C, 2 * Fe);
    /* the adapters' scratch: the backward's moe_d_gate / moe_d_y, idle until the backward (whose
     * recompute runs this forward before it writes them) */
    expert_lora_forward(lc, w, MT_W_EXP_GATE_UP, ws->moe_gate, ws->moe_x, ws->moe_d_gate, C, 2 * Fe,
                        ws, ws->moe_offsets, off);
    be->swiglu_clamped_forward(be, ws->moe_act, ws->moe_gate, nk, Fe, (float)cfg->swiglu_alpha,
                               (float)cfg->swiglu_limit);
    be->moe_matmul_io_forward(be, ws->moe_y, ws->moe_act, w->exp_down_io, w->exp_down_bias,
                              ws->moe_offsets, off, E, Fe, C);
    expert_lora_forward(lc, w, MT_W_EXP_DOWN_IO, ws->moe_y, ws->moe_act, ws->moe_d_y, Fe, C, ws,
                        ws->moe_offsets, off);
}

/* Its backward from moe_d_y into moe_d_x; the experts' weight and bias gradients accumulate. */
static void oss_experts_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                                 const mt_layer_weights *g, int n, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    int C = cfg->C, Fe = cfg->moe_F, E = cfg->n_experts, nk = n * cfg->top_k;
    const int32_t *off = ws->moe_offsets_host, *off_d = ws->moe_offsets; /* this forward's */
    be->moe_matmul_io_backward(be, ws->moe_d_act, f32(g->exp_down_io), f32(g->exp_down_bias),
                               ws->moe_d_y, ws->moe_act, w->exp_down_io, off_d, off, E, Fe, C, 0);
    expert_lora_backward(lc, w, g, MT_W_EXP_DOWN_IO, ws->moe_d_act, ws->moe_d_y, ws->moe_act, Fe, C,
                         ws, off_d, off);
    be->swiglu_clamped_backward(be, ws->moe_d_gate, ws->moe_d_act, ws->moe_gate, nk, Fe,
                                (float)cfg->swiglu_alpha, (float)cfg->swiglu_limit);
    be->moe_matmul_io_backward(be, ws->moe_d_x, f32(g->exp_gate_up), f32(g->exp_gate_up_bias),
                               ws->moe_d_gate, ws->moe_x, w->exp_gate_up, off_d, off, E, C, 2 * Fe,
                               0);
    expert_lora_backward(lc, w, g, MT_W_EXP_GATE_UP, ws->moe_d_x, ws->moe_d_gate, ws->moe_x, C,
                         2 * Fe, ws, off_d, off);
}

void mt_moe_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, const void *x, void *out,
                    int n, mt_layer_ws *ws, int collect) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    int C = cfg->C, Fe = cfg->moe_F, E = cfg->n_experts, k = cfg->top_k;
    mt_moe_stats *st = ws->moe_stats;
    int stats = collect && st->collect;
    be->matmul_forward(be, ws->moe_logits, x, w->router, w->router_bias, n, C, E);
    be->moe_route(be, ws->moe_probs, ws->moe_idx, ws->moe_w, stats ? st->counts : NULL,
                  stats ? st->prob_sum : NULL, ws->moe_logits, n, E, k, cfg->norm_topk_prob);
    if (stats) st->rows += n;
    be->moe_group(be, ws->moe_perm, ws->moe_inv, ws->moe_offsets, ws->moe_idx, n, E, k);
    be->moe_gather(be, ws->moe_x, x, ws->moe_perm, n, C, k);
    const int32_t *off = expert_rows(lc, ws), *off_d = ws->moe_offsets;
    if (w->exp_gate_up) { /* gpt-oss */
        oss_experts_forward(lc, w, n, ws, off);
        if (out) be->moe_combine(be, out, ws->moe_y, ws->moe_w, ws->moe_inv, n, C, k);
        return;
    }
    size_t es = expert_stride(lc, w);
    be->moe_matmul_forward(be, ws->moe_gate, ws->moe_x, w->exp_gate, es, off_d, off, E, C, Fe);
    be->moe_matmul_forward(be, ws->moe_up, ws->moe_x, w->exp_up, es, off_d, off, E, C, Fe);
    size_t nk = (size_t)n * k;
    be->swiglu_forward(be, ws->moe_act, ws->moe_gate, ws->moe_up, nk * Fe);
    be->moe_matmul_forward(be, ws->moe_y, ws->moe_act, w->exp_down, es, off_d, off, E, Fe, C);
    if (out) be->moe_combine(be, out, ws->moe_y, ws->moe_w, ws->moe_inv, n, C, k);
    if (w->shared_gate) shared_forward(lc, w, x, out, n, ws);
}

void mt_moe_backward(const mt_layer_ctx *lc, const mt_layer_weights *w, const mt_layer_weights *g,
                     const void *dout, const void *x, void *dx, int n, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    int C = cfg->C, Fe = cfg->moe_F, E = cfg->n_experts, k = cfg->top_k;
    be->moe_combine_backward(be, ws->moe_d_y, ws->moe_dw, dout, ws->moe_y, ws->moe_w, ws->moe_inv,
                             n, C, k);
    const int32_t *off = ws->moe_offsets_host, *off_d = ws->moe_offsets; /* this forward's */
    size_t es = expert_stride(lc, w); /* an expert with no token: no contribution to its gradient */
    if (w->exp_gate_up) {
        oss_experts_backward(lc, w, g, n, ws);
    } else {
        be->moe_matmul_backward(be, ws->moe_d_act, f32(g->exp_down), ws->moe_d_y, ws->moe_act,
                                w->exp_down, es, off_d, off, E, Fe, C, 0);
        size_t nk = (size_t)n * k;
        be->swiglu_backward(be, ws->moe_d_gate, ws->moe_d_up, ws->moe_d_act, ws->moe_gate,
                            ws->moe_up, nk * Fe);
        be->moe_matmul_backward(be, ws->moe_d_x, f32(g->exp_gate), ws->moe_d_gate, ws->moe_x,
                                w->exp_gate, es, off_d, off, E, C, Fe, 0);
        be->moe_matmul_backward(be, ws->moe_d_x, f32(g->exp_up), ws->moe_d_up, ws->moe_x, w->exp_up,
                                es, off_d, off, E, C, Fe, 1);
    }
    be->moe_gather_backward(be, dx, ws->moe_d_x, ws->moe_inv, n, C, k, 0);
    const float *aux = cfg->router_aux ? ws->moe_stats->aux_grad : NULL;
    be->moe_route_backward(be, ws->moe_d_logits, ws->moe_dw, ws->moe_probs, ws->moe_idx, ws->moe_w,
                           aux, n, E, k, cfg->norm_topk_prob);
    be->matmul_backward(be, dx, f32(g->router), f32(g->router_bias), ws->moe_d_logits, x, w->router,
                        n, C, E, 1);
    if (w->shared_gate) shared_backward(lc, w, g, dout, x, dx, n, ws);
}
