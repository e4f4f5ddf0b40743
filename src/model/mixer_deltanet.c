/* The Gated DeltaNet mixer (qwen3_5's linear_attention layers), as transformers'
 * Qwen3_5GatedDeltaNet computes it:
 *   xn = rmsnorm(x); qkv = silu(causal_conv(in_proj_qkv(xn))) split into q, k (Hk heads of Dk) and
 *   v (Hv of Dv); q, k L2-normalised per head; beta = sigmoid(in_proj_b(xn)), g = -exp(A_log) *
 *   softplus(in_proj_a(xn) + dt_bias); o = the gated delta rule (q scaled by Dk^-0.5);
 *   h = x + out_proj(gated_rmsnorm(o, silu(in_proj_z(xn))))
 * over all N tokens of the call at once (the recurrence runs along each row; its projections are
 * not tiled yet). Nothing is saved between forward and backward: the layer remakes this forward
 * before its MLP's backward unless MT_RECOMPUTE_NONE says ws still holds it (model/layer.c). */
#include <math.h>

#include "core/error.h"
#include "model/layer_internal.h"
#include "model/linear.h"

typedef struct {
    int N, C, Hk, Hv, Dk, Dv, KD, VD, Ch, K;
} lin_dims;

static lin_dims lin_dims_of(const mt_config *c, int N) {
    int KD = c->lin_Hk * c->lin_Dk, VD = c->lin_Hv * c->lin_Dv;
    lin_dims d = {N, c->C, c->lin_Hk, c->lin_Hv, c->lin_Dk, c->lin_Dv, KD, VD, 2 * KD + VD, c->lin_K};
    return d;
}

/* The L2 norm's eps is transformers' constant, not rms_norm_eps. */
#define LIN_L2_EPS 1e-6f

/* chunk_states for B rows of T tokens: taken (once, or again when a call needs more). */
static float *chunk_states(const mt_layer_ctx *lc, mt_layer_ws *ws, int B, int T) {
    const mt_config *c = lc->cfg;
    size_t chunks = (size_t)B * (size_t)((T + MT_GATED_DELTA_CHUNK - 1) / MT_GATED_DELTA_CHUNK);
    size_t bytes = chunks * (size_t)c->lin_Hv * c->lin_Dk * c->lin_Dv * sizeof(float);
    mt_lin_states *st = ws->lin_states;
    MT_CHECK(st, "layer workspace without the Gated DeltaNet's chunk states");
    if (bytes > st->bytes) {
        if (st->p) lc->be->free(lc->be, st->p);
        st->p = lc->be->alloc(lc->be, bytes);
        st->bytes = bytes;
    }
    return st->p;
}

void mt_deltanet_mixer_forward(const mt_layer_ctx *lc, const mt_tokens *tok,
                               const mt_layer_weights *w, const void *inp, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    lin_dims d = lin_dims_of(cfg, tok->B * tok->T);
    MT_CHECK(be->gated_delta_forward, "the %s backend has no Gated DeltaNet ops", be->name);
    be->rmsnorm_forward(be, ws->lin_xn, ws->lin_rstd1, inp, w->input_norm, d.N, d.C,
                        cfg->rms_norm_eps, mt_layer_norm_offset(lc));
    mt_linear_forward(lc, w, MT_W_LIN_QKV, ws->lin_qkv_pre, ws->lin_xn, w->lin_qkv, NULL, d.N, d.C,
                      d.Ch, ws);
    mt_linear_forward(lc, w, MT_W_LIN_Z, ws->lin_z, ws->lin_xn, w->lin_z, NULL, d.N, d.C, d.VD, ws);
    mt_linear_forward(lc, w, MT_W_LIN_B, ws->lin_b, ws->lin_xn, w->lin_b, NULL, d.N, d.C, d.Hv, ws);
    mt_linear_forward(lc, w, MT_W_LIN_A, ws->lin_a, ws->lin_xn, w->lin_a, NULL, d.N, d.C, d.Hv, ws);
    be->causal_conv1d_forward(be, ws->lin_qkv, ws->lin_qkv_pre, w->lin_conv, tok->doc_start,
                              tok->B, tok->T, d.Ch, d.K);
    be->cols_split(be, ws->lin_q_raw, ws->lin_rest, ws->lin_qkv, d.N, d.KD, d.KD + d.VD);
    be->cols_split(be, ws->lin_k_raw, ws->lin_v, ws->lin_rest, d.N, d.KD, d.VD);
    be->l2norm_forward(be, ws->lin_q, ws->lin_rq, ws->lin_q_raw, d.N * d.Hk, d.Dk, LIN_L2_EPS);
    be->l2norm_forward(be, ws->lin_k, ws->lin_rk, ws->lin_k_raw, d.N * d.Hk, d.Dk, LIN_L2_EPS);
    be->gdn_gates_forward(be, ws->lin_g, ws->lin_beta, ws->lin_a, ws->lin_b, w->lin_a_log,
                          w->lin_dt_bias, d.N, d.Hv);
    be->gated_delta_forward(be, ws->lin_o, chunk_states(lc, ws, tok->B, tok->T), ws->lin_q,
                            ws->lin_k, ws->lin_v, ws->lin_g, ws->lin_beta, tok->doc_start, tok->B,
                            tok->T, d.Hk, d.Hv, d.Dk, d.Dv, 1.0f / sqrtf((float)d.Dk));
    be->gated_rmsnorm_forward(be, ws->lin_on, ws->lin_rstd, ws->lin_o, ws->lin_z, w->lin_norm,
                              d.N * d.Hv, d.Dv, cfg->rms_norm_eps);
    mt_linear_forward(lc, w, MT_W_LIN_OUT, ws->h, ws->lin_on, w->lin_out, NULL, d.N, d.VD, d.C, ws);
    be->add(be, ws->h, ws->h, inp, (size_t)d.N * d.C);
}

void mt_deltanet_mixer_backward(const mt_layer_ctx *lc, const mt_tokens *tok,
                                const mt_layer_weights *w, const mt_layer_weights *g,
                                const void *inp, void *dinp, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    lin_dims d = lin_dims_of(cfg, tok->B * tok->T);
    /* h = x + out_proj(on): d_on from d_h (in dinp's rows) */
    mt_linear_backward(lc, w, g, MT_W_LIN_OUT, ws->lin_d_on, mt_f32(g->lin_out), NULL, dinp,
                       ws->lin_on, w->lin_out, d.N, d.VD, d.C, 0, ws);
    be->gated_rmsnorm_backward(be, ws->lin_d_o, ws->lin_d_z, mt_f32(g->lin_norm), ws->lin_d_on,
                               ws->lin_o, ws->lin_z, w->lin_norm, ws->lin_rstd, d.N * d.Hv, d.Dv);
    be->gated_delta_backward(be, ws->lin_dq, ws->lin_dk, ws->lin_dv, ws->lin_dg, ws->lin_dbeta,
                             ws->lin_d_o, ws->lin_states->p, ws->lin_q, ws->lin_k, ws->lin_v,
                             ws->lin_g, ws->lin_beta, tok->doc_start, tok->B, tok->T, d.Hk, d.Hv,
                             d.Dk, d.Dv, 1.0f / sqrtf((float)d.Dk));
    be->gdn_gates_backward(be, ws->lin_da, ws->lin_db, mt_f32(g->lin_a_log),
                           mt_f32(g->lin_dt_bias), ws->lin_dg, ws->lin_dbeta, ws->lin_a, ws->lin_b,
                           w->lin_a_log, w->lin_dt_bias, d.N, d.Hv);
    be->l2norm_backward(be, ws->lin_dq_raw, ws->lin_dq, ws->lin_q_raw, ws->lin_rq, d.N * d.Hk,
                        d.Dk);
    be->l2norm_backward(be, ws->lin_dk_raw, ws->lin_dk, ws->lin_k_raw, ws->lin_rk, d.N * d.Hk,
                        d.Dk);
    be->cols_join(be, ws->lin_d_rest, ws->lin_dk_raw, ws->lin_dv, d.N, d.KD, d.VD);
    be->cols_join(be, ws->lin_d_qkv, ws->lin_dq_raw, ws->lin_d_rest, d.N, d.KD, d.KD + d.VD);
    be->causal_conv1d_backward(be, ws->lin_d_qkv_pre, mt_f32(g->lin_conv), ws->lin_d_qkv,
                               ws->lin_qkv_pre, w->lin_conv, tok->doc_start, tok->B, tok->T, d.Ch,
                               d.K);
    /* the four projections of xn */
    mt_linear_backward(lc, w, g, MT_W_LIN_QKV, ws->lin_d_xn, mt_f32(g->lin_qkv), NULL,
                       ws->lin_d_qkv_pre, ws->lin_xn, w->lin_qkv, d.N, d.C, d.Ch, 0, ws);
    mt_linear_backward(lc, w, g, MT_W_LIN_Z, ws->lin_d_xn, mt_f32(g->lin_z), NULL, ws->lin_d_z,
                       ws->lin_xn, w->lin_z, d.N, d.C, d.VD, 1, ws);
    mt_linear_backward(lc, w, g, MT_W_LIN_B, ws->lin_d_xn, mt_f32(g->lin_b), NULL, ws->lin_db,
                       ws->lin_xn, w->lin_b, d.N, d.C, d.Hv, 1, ws);
    mt_linear_backward(lc, w, g, MT_W_LIN_A, ws->lin_d_xn, mt_f32(g->lin_a), NULL, ws->lin_da,
                       ws->lin_xn, w->lin_a, d.N, d.C, d.Hv, 1, ws);
    /* dinp = d_h + rmsnorm1'(d_xn) */
    be->rmsnorm_backward(be, ws->lin_d_x, mt_f32(g->input_norm), ws->lin_d_xn, inp, w->input_norm,
                         ws->lin_rstd1, d.N, d.C, 0, mt_layer_norm_offset(lc));
    be->add(be, dinp, ws->lin_d_x, dinp, (size_t)d.N * d.C);
}
