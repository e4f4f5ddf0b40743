/* The mixture-of-experts block: see moe.h. */
#include "moe.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

static float *f32(void *p) { return (float *)p; }

/* Row r0 of a (rows, width) tensor of the compute dtype. */
static void *rows_at(const mt_layer_ctx *lc, const void *base, int r0, int width) {
    return (char *)base + (size_t)r0 * (size_t)width * mt_dtype_size(lc->be->dtype);
}

/* Expert e's tensor of a kind whose expert 0 is at p (weights or gradients: the view's stride). */
static void *expert_at(const mt_layer_weights *v, void *p, int e) {
    return (char *)p + (size_t)e * v->exp_stride;
}

int mt_moe_backend_check(const mt_config *cfg, const mt_backend *be) {
    if (cfg->n_experts > 0 && !be->moe_route)
        return mt_error_set("the %s backend has no mixture-of-experts ops yet: run %s models with "
                            "--device cpu", be->name, cfg->model_type);
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

double mt_moe_aux_finish(const mt_layer_ctx *lc, mt_moe_stats *s) {
    if (!s || !s->collect) return 0;
    s->collect = 0;
    if (s->rows == 0) return 0;
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    int E = cfg->n_experts;
    int32_t *cnt = mt_malloc((size_t)E * sizeof(int32_t));
    float *P = mt_malloc((size_t)E * sizeof(float)), *grad = mt_malloc((size_t)E * sizeof(float));
    be->download(be, cnt, s->counts, (size_t)E * sizeof(int32_t));
    be->download(be, P, s->prob_sum, (size_t)E * sizeof(float));
    double R = (double)s->rows, aux = 0;
    for (int e = 0; e < E; e++) {
        aux += (double)cnt[e] * P[e];
        grad[e] = (float)((double)cfg->router_aux_coef * E * cnt[e] / (R * R));
    }
    aux *= (double)E / (R * R);
    be->upload(be, s->aux_grad, grad, (size_t)E * sizeof(float));
    free(cnt), free(P), free(grad);
    return (double)cfg->router_aux_coef * aux;
}

/* Each expert's [first, end) grouped rows, from the compute side's offsets. */
static const int32_t *expert_rows(const mt_layer_ctx *lc, mt_layer_ws *ws) {
    size_t bytes = ((size_t)lc->cfg->n_experts + 1) * sizeof(int32_t);
    lc->be->download(lc->be, ws->moe_offsets_host, ws->moe_offsets, bytes); /* a sync on a GPU */
    return ws->moe_offsets_host;
}

void mt_moe_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, const void *x, void *out,
                    int n, mt_layer_ws *ws, int collect) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    int C = cfg->C, Fe = cfg->moe_F, E = cfg->n_experts, k = cfg->top_k;
    mt_moe_stats *st = ws->moe_stats;
    int stats = collect && st->collect;
    be->matmul_forward(be, ws->moe_logits, x, w->router, NULL, n, C, E);
    be->moe_route(be, ws->moe_probs, ws->moe_idx, ws->moe_w, stats ? st->counts : NULL,
                  stats ? st->prob_sum : NULL, ws->moe_logits, n, E, k, cfg->norm_topk_prob);
    if (stats) st->rows += n;
    be->moe_group(be, ws->moe_perm, ws->moe_inv, ws->moe_offsets, ws->moe_idx, n, E, k);
    be->moe_gather(be, ws->moe_x, x, ws->moe_perm, n, C, k);
    const int32_t *off = expert_rows(lc, ws);
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - off[e];
        if (m == 0) continue;
        const void *xe = rows_at(lc, ws->moe_x, r0, C);
        be->matmul_forward(be, rows_at(lc, ws->moe_gate, r0, Fe), xe, expert_at(w, w->exp_gate, e),
                           NULL, m, C, Fe);
        be->matmul_forward(be, rows_at(lc, ws->moe_up, r0, Fe), xe, expert_at(w, w->exp_up, e), NULL,
                           m, C, Fe);
    }
    size_t nk = (size_t)n * k;
    be->swiglu_forward(be, ws->moe_act, ws->moe_gate, ws->moe_up, nk * Fe);
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - off[e];
        if (m == 0) continue;
        be->matmul_forward(be, rows_at(lc, ws->moe_y, r0, C), rows_at(lc, ws->moe_act, r0, Fe),
                           expert_at(w, w->exp_down, e), NULL, m, Fe, C);
    }
    if (out) be->moe_combine(be, out, ws->moe_y, ws->moe_w, ws->moe_inv, n, C, k);
}

void mt_moe_backward(const mt_layer_ctx *lc, const mt_layer_weights *w, const mt_layer_weights *g,
                     const void *dout, const void *x, void *dx, int n, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    int C = cfg->C, Fe = cfg->moe_F, E = cfg->n_experts, k = cfg->top_k;
    be->moe_combine_backward(be, ws->moe_d_y, ws->moe_dw, dout, ws->moe_y, ws->moe_w, ws->moe_inv,
                             n, C, k);
    const int32_t *off = ws->moe_offsets_host; /* this forward's, downloaded by it */
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - off[e];
        if (m == 0) continue; /* no token: no contribution to this expert's gradient */
        be->matmul_backward(be, rows_at(lc, ws->moe_d_act, r0, Fe), f32(expert_at(g, g->exp_down, e)),
                            NULL, rows_at(lc, ws->moe_d_y, r0, C), rows_at(lc, ws->moe_act, r0, Fe),
                            expert_at(w, w->exp_down, e), m, Fe, C, 0);
    }
    size_t nk = (size_t)n * k;
    be->swiglu_backward(be, ws->moe_d_gate, ws->moe_d_up, ws->moe_d_act, ws->moe_gate, ws->moe_up,
                        nk * Fe);
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - off[e];
        if (m == 0) continue;
        void *dxe = rows_at(lc, ws->moe_d_x, r0, C);
        const void *xe = rows_at(lc, ws->moe_x, r0, C);
        be->matmul_backward(be, dxe, f32(expert_at(g, g->exp_gate, e)), NULL,
                            rows_at(lc, ws->moe_d_gate, r0, Fe), xe, expert_at(w, w->exp_gate, e), m,
                            C, Fe, 0);
        be->matmul_backward(be, dxe, f32(expert_at(g, g->exp_up, e)), NULL,
                            rows_at(lc, ws->moe_d_up, r0, Fe), xe, expert_at(w, w->exp_up, e), m, C,
                            Fe, 1);
    }
    be->moe_gather_backward(be, dx, ws->moe_d_x, ws->moe_inv, n, C, k, 0);
    const float *aux = cfg->router_aux ? ws->moe_stats->aux_grad : NULL;
    be->moe_route_backward(be, ws->moe_d_logits, ws->moe_dw, ws->moe_probs, ws->moe_idx, ws->moe_w,
                           aux, n, E, k, cfg->norm_topk_prob);
    be->matmul_backward(be, dx, f32(g->router), NULL, ws->moe_d_logits, x, w->router, n, C, E, 1);
}
