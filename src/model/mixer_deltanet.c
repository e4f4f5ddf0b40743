/* The Gated DeltaNet mixer (qwen3_5's linear_attention layers), as transformers'
 * Qwen3_5GatedDeltaNet computes it:
 *   xn = rmsnorm(x); qkv = silu(causal_conv(in_proj_qkv(xn))) split into q, k (Hk heads of Dk) and
 *   v (Hv of Dv); q, k L2-normalised per head; beta = sigmoid(in_proj_b(xn)), g = -exp(A_log) *
 *   softplus(in_proj_a(xn) + dt_bias); o = the gated delta rule (q scaled by Dk^-0.5);
 *   h = x + out_proj(gated_rmsnorm(o, silu(in_proj_z(xn))))
 * Untiled, over all N tokens of the call at once. Tiled (ws->mlp_chunk < N: long rows), each row
 * runs in spans of mt_lin_span_tokens tokens, in order, so that its fields hold one span (plus
 * the conv's K-1 context rows): the delta rule's state crosses from span to span
 * (mt_gated_delta_span), saved at each span start for the backward, and each span remakes the
 * in_proj_qkv rows of the K-1 tokens before it that its conv reads. The backward walks the spans
 * in reverse: each span's forward remade from its saved state (the last one's is still in ws),
 * the state's gradient carried to the span before, and the conv's gradient for the context rows
 * added to the span before's. Nothing is saved between forward and backward: the layer remakes
 * this forward before its MLP's backward unless MT_RECOMPUTE_NONE says ws still holds it
 * (model/layer.c). */
#include <math.h>

#include "core/error.h"
#include "model/layer_internal.h"
#include "model/linear.h"

typedef struct {
    int C, Hk, Hv, Dk, Dv, KD, VD, Ch, K;
} lin_dims;

static lin_dims lin_dims_of(const mt_config *c) {
    int KD = c->lin_Hk * c->lin_Dk, VD = c->lin_Hv * c->lin_Dv;
    lin_dims d = {c->C, c->lin_Hk, c->lin_Hv, c->lin_Dk, c->lin_Dv, KD, VD, 2 * KD + VD, c->lin_K};
    return d;
}

/* The L2 norm's eps is transformers' constant, not rms_norm_eps. */
#define LIN_L2_EPS 1e-6f

/* The tokens of one call of the ops: B rows of T tokens from row r0 of the layer's (N, .)
 * tensors, at position t0 of their rows, with the ctx tokens before r0 that the conv reads (its
 * context: their xn and qkv rows come first in the lin fields). Untiled: every row, t0 = ctx = 0;
 * a span: one row's tokens [t0, t0 + T). */
typedef struct {
    int B, T, t0, ctx, r0;
    const int32_t *doc_start; /* the call's first token's (NULL: no documents) */
} lin_call;

/* Grows a compute-side buffer to at least `bytes` (its contents are lost when it grows). */
static void *grown(const mt_layer_ctx *lc, void **p, size_t *have, size_t bytes) {
    if (bytes > *have) {
        if (*p) lc->be->free(lc->be, *p);
        *p = lc->be->alloc(lc->be, bytes);
        *have = bytes;
    }
    return *p;
}

/* chunk_states for a call of B rows of T tokens. */
static float *chunk_states(const mt_layer_ctx *lc, mt_layer_ws *ws, int B, int T) {
    size_t chunks = (size_t)B * (size_t)((T + MT_GATED_DELTA_CHUNK - 1) / MT_GATED_DELTA_CHUNK);
    mt_lin_states *st = ws->lin_states;
    MT_CHECK(st, "layer workspace without the Gated DeltaNet's chunk states");
    return grown(lc, (void **)&st->p, &st->bytes, chunks * mt_lin_state_floats(lc->cfg) * sizeof(float));
}

/* The spans of a tiled call: per row, spans of `span` tokens (the last one shorter). */
typedef struct {
    int tiled, span, per_row; /* tokens a span, spans a row */
} lin_tiling;

static lin_tiling tiling_of(const mt_layer_ws *ws, const mt_tokens *tok) {
    int N = tok->B * tok->T, chunk = mt_layer_chunk_rows(ws->mlp_chunk, N);
    lin_tiling t = {chunk < N, tok->T, 1};
    if (t.tiled) {
        t.span = mt_lin_span_tokens(chunk);
        if (t.span > tok->T) t.span = tok->T;
        t.per_row = (tok->T + t.span - 1) / t.span;
    }
    return t;
}

static lin_call span_call(const mt_config *cfg, const mt_tokens *tok, lin_tiling t, int b, int s) {
    lin_call c;
    c.B = 1;
    c.t0 = s * t.span;
    c.T = mt_min_int(t.span, tok->T - c.t0);
    c.ctx = mt_min_int(cfg->lin_K - 1, c.t0);
    c.r0 = b * tok->T + c.t0;
    c.doc_start = tok->doc_start ? tok->doc_start + c.r0 : NULL;
    return c;
}

/* The state entering span s >= 1 of row b of B (saved by the forward for the backward; the
 * buffer is sized for every row at once, so that it never moves within a call). */
static float *span_state(const mt_layer_ctx *lc, mt_layer_ws *ws, lin_tiling t, int B, int b,
                         int s) {
    mt_lin_states *st = ws->lin_states;
    size_t n = (size_t)(t.per_row - 1) * (size_t)B;
    float *p = grown(lc, (void **)&st->spans, &st->span_bytes,
                     n * mt_lin_state_floats(lc->cfg) * sizeof(float));
    return p + ((size_t)b * (t.per_row - 1) + (s - 1)) * mt_lin_state_floats(lc->cfg);
}

/* The forward of one call into the lin fields; h rows r0.. = inp + out_proj(...) when want_h. */
static void call_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, const void *inp,
                         mt_layer_ws *ws, const lin_call *c, const mt_gated_delta_span *span,
                         int want_h) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    lin_dims d = lin_dims_of(cfg);
    int n = c->B * c->T, m = n + c->ctx; /* the call's tokens, with the conv's context */
    be->rmsnorm_forward(be, ws->lin_xn, ws->lin_rstd1, mt_layer_row(lc, inp, c->r0 - c->ctx, d.C),
                        w->input_norm, m, d.C, cfg->rms_norm_eps, mt_layer_norm_offset(lc));
    mt_linear_forward(lc, w, MT_W_LIN_QKV, ws->lin_qkv_pre, ws->lin_xn, w->lin_qkv, NULL, m, d.C,
                      d.Ch, ws);
    const void *xn = mt_layer_row(lc, ws->lin_xn, c->ctx, d.C);
    mt_linear_forward(lc, w, MT_W_LIN_Z, ws->lin_z, xn, w->lin_z, NULL, n, d.C, d.VD, ws);
    mt_linear_forward(lc, w, MT_W_LIN_B, ws->lin_b, xn, w->lin_b, NULL, n, d.C, d.Hv, ws);
    mt_linear_forward(lc, w, MT_W_LIN_A, ws->lin_a, xn, w->lin_a, NULL, n, d.C, d.Hv, ws);
    be->causal_conv1d_forward(be, ws->lin_qkv, ws->lin_qkv_pre, w->lin_conv,
                              c->doc_start ? c->doc_start - c->ctx : NULL, c->B, c->T + c->ctx,
                              d.Ch, d.K, c->t0 - c->ctx);
    be->cols_split(be, ws->lin_q_raw, ws->lin_rest, mt_layer_row(lc, ws->lin_qkv, c->ctx, d.Ch), n,
                   d.KD, d.KD + d.VD);
    be->cols_split(be, ws->lin_k_raw, ws->lin_v, ws->lin_rest, n, d.KD, d.VD);
    be->l2norm_forward(be, ws->lin_q, ws->lin_rq, ws->lin_q_raw, n * d.Hk, d.Dk, LIN_L2_EPS);
    be->l2norm_forward(be, ws->lin_k, ws->lin_rk, ws->lin_k_raw, n * d.Hk, d.Dk, LIN_L2_EPS);
    be->gdn_gates_forward(be, ws->lin_g, ws->lin_beta, ws->lin_a, ws->lin_b, w->lin_a_log,
                          w->lin_dt_bias, n, d.Hv);
    be->gated_delta_forward(be, ws->lin_o, chunk_states(lc, ws, c->B, c->T), ws->lin_q, ws->lin_k,
                            ws->lin_v, ws->lin_g, ws->lin_beta, c->doc_start, c->B, c->T, d.Hk,
                            d.Hv, d.Dk, d.Dv, 1.0f / sqrtf((float)d.Dk), span);
    be->gated_rmsnorm_forward(be, ws->lin_on, ws->lin_rstd, ws->lin_o, ws->lin_z, w->lin_norm,
                              n * d.Hv, d.Dv, cfg->rms_norm_eps);
    if (!want_h) return;
    void *h = mt_layer_row(lc, ws->h, c->r0, d.C);
    mt_linear_forward(lc, w, MT_W_LIN_OUT, h, ws->lin_on, w->lin_out, NULL, n, d.VD, d.C, ws);
    be->add(be, h, h, mt_layer_row(lc, inp, c->r0, d.C), (size_t)n * d.C);
}

/* The conv's context rows between spans in the backward: the gradient a span's conv sends to the
 * K-1 tokens before it, which the span before adds to its own. */
typedef struct {
    void *in;  /* rows to add onto the call's last `in_rows` qkv_pre gradients (NULL: none) */
    int in_rows;
    void *out; /* where the call leaves its ctx rows' gradients (NULL: nowhere) */
} conv_carry;

/* The backward of one call whose forward ws holds; dinp rows r0.. hold d_h and get the mixer's
 * gradient added. */
static void call_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                          const mt_layer_weights *g, const void *inp, void *dinp, mt_layer_ws *ws,
                          const lin_call *c, const mt_gated_delta_span *span,
                          const conv_carry *cc) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    lin_dims d = lin_dims_of(cfg);
    int n = c->B * c->T, m = n + c->ctx;
    void *dh = mt_layer_row(lc, dinp, c->r0, d.C);
    /* h = x + out_proj(on): d_on from d_h */
    mt_linear_backward(lc, w, g, MT_W_LIN_OUT, ws->lin_d_on, mt_f32(g->lin_out), NULL, dh,
                       ws->lin_on, w->lin_out, n, d.VD, d.C, 0, ws);
    be->gated_rmsnorm_backward(be, ws->lin_d_o, ws->lin_d_z, mt_f32(g->lin_norm), ws->lin_d_on,
                               ws->lin_o, ws->lin_z, w->lin_norm, ws->lin_rstd, n * d.Hv, d.Dv);
    be->gated_delta_backward(be, ws->lin_dq, ws->lin_dk, ws->lin_dv, ws->lin_dg, ws->lin_dbeta,
                             ws->lin_d_o, ws->lin_states->p, ws->lin_q, ws->lin_k, ws->lin_v,
                             ws->lin_g, ws->lin_beta, c->doc_start, c->B, c->T, d.Hk, d.Hv, d.Dk,
                             d.Dv, 1.0f / sqrtf((float)d.Dk), span);
    be->gdn_gates_backward(be, ws->lin_da, ws->lin_db, mt_f32(g->lin_a_log),
                           mt_f32(g->lin_dt_bias), ws->lin_dg, ws->lin_dbeta, ws->lin_a, ws->lin_b,
                           w->lin_a_log, w->lin_dt_bias, n, d.Hv);
    be->l2norm_backward(be, ws->lin_dq_raw, ws->lin_dq, ws->lin_q_raw, ws->lin_rq, n * d.Hk, d.Dk);
    be->l2norm_backward(be, ws->lin_dk_raw, ws->lin_dk, ws->lin_k_raw, ws->lin_rk, n * d.Hk, d.Dk);
    be->cols_join(be, ws->lin_d_rest, ws->lin_dk_raw, ws->lin_dv, n, d.KD, d.VD);
    /* the conv's output gradient: zero on the context rows (their outputs are the span before's) */
    size_t esz = mt_dtype_size(be->dtype);
    if (c->ctx) be->zero(be, ws->lin_d_qkv, (size_t)c->ctx * d.Ch * esz);
    be->cols_join(be, mt_layer_row(lc, ws->lin_d_qkv, c->ctx, d.Ch), ws->lin_dq_raw, ws->lin_d_rest,
                  n, d.KD, d.KD + d.VD);
    be->causal_conv1d_backward(be, ws->lin_d_qkv_pre, mt_f32(g->lin_conv), ws->lin_d_qkv,
                               ws->lin_qkv_pre, w->lin_conv,
                               c->doc_start ? c->doc_start - c->ctx : NULL, c->B, c->T + c->ctx,
                               d.Ch, d.K, c->t0 - c->ctx);
    if (cc && cc->in) { /* the next span's conv read this call's last rows */
        void *last = mt_layer_row(lc, ws->lin_d_qkv_pre, m - cc->in_rows, d.Ch);
        be->add(be, last, last, cc->in, (size_t)cc->in_rows * d.Ch);
    }
    if (cc && cc->out && c->ctx) { /* for the span before */
        be->zero(be, cc->out, (size_t)c->ctx * d.Ch * esz);
        be->add(be, cc->out, cc->out, ws->lin_d_qkv_pre, (size_t)c->ctx * d.Ch);
    }
    /* the four projections of the call's own rows of xn */
    const void *xn = mt_layer_row(lc, ws->lin_xn, c->ctx, d.C);
    mt_linear_backward(lc, w, g, MT_W_LIN_QKV, ws->lin_d_xn, mt_f32(g->lin_qkv), NULL,
                       mt_layer_row(lc, ws->lin_d_qkv_pre, c->ctx, d.Ch), xn, w->lin_qkv, n, d.C,
                       d.Ch, 0, ws);
    mt_linear_backward(lc, w, g, MT_W_LIN_Z, ws->lin_d_xn, mt_f32(g->lin_z), NULL, ws->lin_d_z, xn,
                       w->lin_z, n, d.C, d.VD, 1, ws);
    mt_linear_backward(lc, w, g, MT_W_LIN_B, ws->lin_d_xn, mt_f32(g->lin_b), NULL, ws->lin_db, xn,
                       w->lin_b, n, d.C, d.Hv, 1, ws);
    mt_linear_backward(lc, w, g, MT_W_LIN_A, ws->lin_d_xn, mt_f32(g->lin_a), NULL, ws->lin_da, xn,
                       w->lin_a, n, d.C, d.Hv, 1, ws);
    /* dinp = d_h + rmsnorm1'(d_xn) */
    be->rmsnorm_backward(be, ws->lin_d_x, mt_f32(g->input_norm), ws->lin_d_xn,
                         mt_layer_row(lc, inp, c->r0, d.C), w->input_norm, ws->lin_rstd1 + c->ctx, n, d.C,
                         0, mt_layer_norm_offset(lc));
    be->add(be, dh, ws->lin_d_x, dh, (size_t)n * d.C);
}

static lin_call whole_call(const mt_tokens *tok) {
    lin_call c = {tok->B, tok->T, 0, 0, 0, tok->doc_start};
    return c;
}

/* The forward's span carry of span s of row b: the state saved at its start, the next's written. */
static mt_gated_delta_span forward_carry(const mt_layer_ctx *lc, mt_layer_ws *ws, lin_tiling t,
                                         const lin_call *c, int B, int b, int s, int write_next) {
    mt_gated_delta_span sp = {c->t0, NULL, NULL, NULL, NULL};
    if (s > 0) sp.state_in = span_state(lc, ws, t, B, b, s);
    if (write_next && s + 1 < t.per_row) sp.state_out = span_state(lc, ws, t, B, b, s + 1);
    return sp;
}

void mt_deltanet_mixer_forward(const mt_layer_ctx *lc, const mt_tokens *tok,
                               const mt_layer_weights *w, const void *inp, mt_layer_ws *ws) {
    MT_CHECK(lc->be->gated_delta_forward, "the %s backend has no Gated DeltaNet ops", lc->be->name);
    lin_tiling t = tiling_of(ws, tok);
    if (!t.tiled) {
        lin_call c = whole_call(tok);
        call_forward(lc, w, inp, ws, &c, NULL, 1);
        return;
    }
    for (int b = 0; b < tok->B; b++)
        for (int s = 0; s < t.per_row; s++) {
            lin_call c = span_call(lc->cfg, tok, t, b, s);
            mt_gated_delta_span sp = forward_carry(lc, ws, t, &c, tok->B, b, s, 1);
            call_forward(lc, w, inp, ws, &c, &sp, 1);
        }
}

void mt_deltanet_mixer_backward(const mt_layer_ctx *lc, const mt_tokens *tok,
                                const mt_layer_weights *w, const mt_layer_weights *g,
                                const void *inp, void *dinp, mt_layer_ws *ws) {
    lin_tiling t = tiling_of(ws, tok);
    if (!t.tiled) {
        lin_call c = whole_call(tok);
        call_backward(lc, w, g, inp, dinp, ws, &c, NULL, NULL);
        return;
    }
    const mt_config *cfg = lc->cfg;
    mt_lin_states *st = ws->lin_states;
    size_t sbytes = mt_lin_state_floats(cfg) * sizeof(float);
    float *dS = grown(lc, (void **)&st->dstates, &st->dstate_bytes, 2 * sbytes);
    void *tail = grown(lc, &st->conv_tail, &st->conv_tail_bytes,
                       mt_lin_conv_tail_bytes(cfg, lc->be->dtype));
    int cur = 0, next_ctx = 0;
    for (int b = tok->B - 1; b >= 0; b--)
        for (int s = t.per_row - 1; s >= 0; s--) {
            lin_call c = span_call(cfg, tok, t, b, s);
            int last = b == tok->B - 1 && s == t.per_row - 1; /* ws holds its forward */
            mt_gated_delta_span sp = forward_carry(lc, ws, t, &c, tok->B, b, s, 0);
            if (!last) call_forward(lc, w, inp, ws, &c, &sp, 0);
            float *d_out = dS + (size_t)cur * mt_lin_state_floats(cfg);
            float *d_in = dS + (size_t)(1 - cur) * mt_lin_state_floats(cfg);
            sp.dstate_out = s + 1 < t.per_row ? d_out : NULL;
            sp.dstate_in = s > 0 ? d_in : NULL;
            conv_carry cc = {s + 1 < t.per_row ? tail : NULL, next_ctx, s > 0 ? tail : NULL};
            call_backward(lc, w, g, inp, dinp, ws, &c, &sp, &cc);
            next_ctx = s > 0 ? c.ctx : 0;
            cur = 1 - cur;
        }
}
