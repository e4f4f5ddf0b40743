/* The attention mixer: grouped-query attention with RoPE (partial where the config says), qwen3's
 * per-head q/k norms and biases, qwen3_5's output gate (q_proj yields per head D query values then
 * D gate values; the attention output is multiplied by sigmoid(gate) before o_proj), Gemma 4's
 * v-norm (the value heads RMS-normed without a weight) and its full layers' own head dim and kv
 * heads (the view's) whose values are k_proj's output where they have no v_proj, tiled over token
 * chunks around the attention itself (model/layer.h says how). */
#include <math.h>

#include "core/error.h"
#include "model/layer_internal.h"
#include "model/linear.h"

/* xn1, rstd1 (chunk rows) = rmsnorm(x) of the n tokens of inp from row r0. */
static void input_norm_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, const void *inp,
                               int r0, int n, mt_layer_ws *ws) {
    const mt_config *cfg = lc->cfg;
    lc->be->rmsnorm_forward(lc->be, ws->xn1, ws->rstd1, mt_layer_row(lc, inp, r0, cfg->C),
                            w->input_norm, n, cfg->C, cfg->rms_norm_eps, mt_layer_norm_offset(lc));
}

/* qwen3: q_raw, k_raw (chunk rows) = q/k projections of the n tokens of xn1 from row r0, q_rstd,
 * k_rstd their norms' statistics, the normed heads written to q_out (n, H*D) and k_out (n, G*D);
 * with the output gate, the gate heads to rows r0.. of ws->gate_att. */
static void qk_norm_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, int r0, int n,
                            void *q_out, void *k_out, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    mt_layer_dims d = mt_layer_dims_at(cfg, w, n);
    if (cfg->attn_gate) {
        mt_linear_forward(lc, w, MT_W_Q, ws->q_gate, ws->xn1, w->q, w->q_bias, n, d.C, 2 * d.HD,
                          ws);
        be->cols_split(be, ws->q_raw, mt_layer_row(lc, ws->gate_att, r0, d.HD), ws->q_gate, n * d.H,
                       d.D, d.D);
    } else {
        mt_linear_forward(lc, w, MT_W_Q, ws->q_raw, ws->xn1, w->q, w->q_bias, n, d.C, d.HD, ws);
    }
    mt_linear_forward(lc, w, MT_W_K, ws->k_raw, ws->xn1, w->k, w->k_bias, n, d.C, d.GD, ws);
    be->rmsnorm_forward(be, q_out, ws->q_rstd, ws->q_raw, w->q_norm, n * d.H, d.D,
                        cfg->rms_norm_eps, mt_layer_norm_offset(lc));
    be->rmsnorm_forward(be, k_out, ws->k_rstd, ws->k_raw, w->k_norm, n * d.G, d.D,
                        cfg->rms_norm_eps, mt_layer_norm_offset(lc));
}

/* gemma4: the values of the n tokens of the chunk rows into v_out (n, G*D), RMS-normed per head
 * without a weight from v_raw (v_proj's output), or from k_raw where the layer has no v_proj
 * (keys are values); v_rstd their statistics. Elsewhere v_proj's output itself. */
static void v_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, int n, void *v_out,
                      mt_layer_ws *ws) {
    const mt_config *cfg = lc->cfg;
    mt_layer_dims d = mt_layer_dims_at(cfg, w, n);
    if (!cfg->v_norm) {
        mt_linear_forward(lc, w, MT_W_V, v_out, ws->xn1, w->v, w->v_bias, n, d.C, d.GD, ws);
        return;
    }
    MT_CHECK(w->v || cfg->qk_norm, "values from k_proj need the q/k norm's k_raw");
    const void *raw = ws->k_raw;
    if (w->v) {
        mt_linear_forward(lc, w, MT_W_V, ws->v_raw, ws->xn1, w->v, w->v_bias, n, d.C, d.GD, ws);
        raw = ws->v_raw;
    }
    lc->be->rmsnorm_forward(lc->be, v_out, ws->v_rstd, raw, NULL, n * d.G, d.D, cfg->rms_norm_eps, 0);
}

/* The layer's RoPE table (gemma3/4's sliding layers have their own: mt_config_layer_rope_set). */
static const float *layer_inv_freq(const mt_layer_ctx *lc, const mt_layer_weights *w) {
    return lc->inv_freq + (size_t)w->rope_set * (size_t)mt_config_rope_stride(lc->cfg);
}

/* The dims of each head RoPE rotates in this layer. */
static int layer_rotary_dim(const mt_layer_ctx *lc, const mt_layer_weights *w) {
    return w->rotary_dim ? w->rotary_dim : mt_config_rotary_dim(lc->cfg);
}

/* Attention's inputs for the n tokens from row r0: q, k, v rows r0.. (after norm and rope) from
 * the input norm, leaving that chunk's xn1 (and q/k norm pieces) in the chunk rows. */
static void qkv_forward(const mt_layer_ctx *lc, const mt_tokens *tok, const mt_layer_weights *w,
                        const void *inp, int r0, int n, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    mt_layer_dims d = mt_layer_dims_at(lc->cfg, w, n);
    void *q = mt_layer_row(lc, ws->q, r0, d.HD), *k = mt_layer_row(lc, ws->k, r0, d.GD);
    input_norm_forward(lc, w, inp, r0, n, ws);
    if (lc->cfg->qk_norm) {
        qk_norm_forward(lc, w, r0, n, q, k, ws);
    } else {
        mt_linear_forward(lc, w, MT_W_Q, q, ws->xn1, w->q, w->q_bias, n, d.C, d.HD, ws);
        mt_linear_forward(lc, w, MT_W_K, k, ws->xn1, w->k, w->k_bias, n, d.C, d.GD, ws);
    }
    v_forward(lc, w, n, mt_layer_row(lc, ws->v, r0, d.GD), ws);
    be->rope_forward(be, q, tok->pos + r0, layer_inv_freq(lc, w), n, d.H, d.D, layer_rotary_dim(lc, w));
    be->rope_forward(be, k, tok->pos + r0, layer_inv_freq(lc, w), n, d.G, d.D, layer_rotary_dim(lc, w));
}

/* o_proj's input for the n tokens from row r0: the attention output, or with the output gate
 * att * sigmoid(gate) in the att_g chunk rows. */
static const void *o_input(const mt_layer_ctx *lc, const mt_layer_weights *w, mt_layer_ws *ws,
                           int r0, int n) {
    mt_layer_dims d = mt_layer_dims_at(lc->cfg, w, n);
    const void *att = mt_layer_row(lc, ws->att, r0, d.HD);
    if (!lc->cfg->attn_gate) return att;
    lc->be->sigmoid_gate_forward(lc->be, ws->att_g, att, mt_layer_row(lc, ws->gate_att, r0, d.HD), n,
                                 d.HD, d.HD);
    return ws->att_g;
}

/* The layer's attention options: the sliding layers' window (gpt-oss, gemma3), gpt-oss's sinks,
 * gemma3's query_pre_attn_scalar^-0.5 for 1/sqrt(D), and YaRN's scaling of cos and sin, which
 * multiplies q and k each and so the scores by its square: folded into the scale (q and k after
 * RoPE feed nothing else). g: the gradient view (dsinks), or NULL. */
static mt_attention_opts attention_opts(const mt_layer_ctx *lc, const mt_layer_weights *w,
                                        const mt_layer_weights *g) {
    const mt_config *cfg = lc->cfg;
    mt_attention_opts o = {0};
    double s = mt_config_rope_attention_scaling(cfg), base = mt_config_attn_scale(cfg);
    if (base == 0) base = 1.0 / sqrt((double)(w->head_dim ? w->head_dim : cfg->D));
    if (s != 1.0 || mt_config_attn_scale(cfg) > 0) o.scale = (float)(s * s * base);
    o.window = w->window;
    o.sinks = w->sinks;
    o.dsinks = g && w->sinks ? mt_f32(g->sinks) : NULL;
    return o;
}

/* Attention half of the forward: fills q, k, v, att, lse, h (whole call) chunk by chunk around
 * the attention, which sees all N tokens; the chunk rows keep the last chunk's xn1 (and q/k norm
 * pieces): all of them when untiled. Without run_attention, att and lse are this forward's
 * already (saved attention) and the attention is not run again. */
void mt_attention_mixer_forward(const mt_layer_ctx *lc, const mt_tokens *tok,
                                const mt_layer_weights *w, const void *inp, mt_layer_ws *ws,
                                int run_attention) {
    mt_backend *be = lc->be;
    mt_layer_dims d = mt_layer_dims_at(lc->cfg, w, tok->B * tok->T);
    int chunk = mt_layer_chunk_rows(ws->mlp_chunk, d.N);
    for (int r0 = 0; r0 < d.N; r0 += chunk)
        qkv_forward(lc, tok, w, inp, r0, mt_min_int(chunk, d.N - r0), ws);
    mt_attention_opts opts = attention_opts(lc, w, NULL);
    if (run_attention)
        be->attention_forward(be, ws->att, ws->lse, ws->q, ws->k, ws->v, tok->doc_start, tok->B,
                              tok->T, d.H, d.G, d.D, &opts);
    for (int r0 = 0; r0 < d.N; r0 += chunk) {
        int n = mt_min_int(chunk, d.N - r0);
        void *h = mt_layer_row(lc, ws->h, r0, d.C);
        if (w->attn_out_norm) { /* gemma3: h = inp + norm(o_proj(att)) */
            void *o = mt_layer_row(lc, ws->attn_o, r0, d.C);
            mt_linear_forward(lc, w, MT_W_O, o, o_input(lc, w, ws, r0, n), w->o, w->o_bias, n, d.HD,
                              d.C, ws);
            be->rmsnorm_forward(be, h, ws->rstd_ao + r0, o, w->attn_out_norm, n, d.C,
                                lc->cfg->rms_norm_eps, mt_layer_norm_offset(lc));
        } else {
            mt_linear_forward(lc, w, MT_W_O, h, o_input(lc, w, ws, r0, n), w->o, w->o_bias, n, d.HD,
                              d.C, ws);
        }
        be->add(be, h, h, mt_layer_row(lc, inp, r0, d.C), (size_t)n * d.C);
    }
}

/* Attention-half backward after the attention's for the n tokens from row r0, whose xn1, rstd1
 * (and q/k norm pieces) are in the chunk rows: rope' and q/k norm' of dq, dk rows r0.., the q, k,
 * v and input-norm weight gradients accumulate, dinp rows r0.. = d_h (already there) +
 * rmsnorm1'(d_xn1). */
static void qkv_backward(const mt_layer_ctx *lc, const mt_tokens *tok, const mt_layer_weights *w,
                         const mt_layer_weights *g, const void *inp, void *dinp, int r0, int n,
                         mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    mt_layer_dims d = mt_layer_dims_at(cfg, w, n);
    void *dq = mt_layer_row(lc, ws->dq, r0, d.HD), *dk = mt_layer_row(lc, ws->dk, r0, d.GD);
    be->rope_backward(be, dq, tok->pos + r0, layer_inv_freq(lc, w), n, d.H, d.D, layer_rotary_dim(lc, w));
    be->rope_backward(be, dk, tok->pos + r0, layer_inv_freq(lc, w), n, d.G, d.D, layer_rotary_dim(lc, w));
    if (cfg->qk_norm) {
        be->rmsnorm_backward(be, ws->dq_raw, mt_f32(g->q_norm), dq, ws->q_raw, w->q_norm,
                             ws->q_rstd, n * d.H, d.D, 0, mt_layer_norm_offset(lc));
        be->rmsnorm_backward(be, ws->dk_raw, mt_f32(g->k_norm), dk, ws->k_raw, w->k_norm,
                             ws->k_rstd, n * d.G, d.D, 0, mt_layer_norm_offset(lc));
        dq = ws->dq_raw;
        dk = ws->dk_raw;
    }
    void *dv = mt_layer_row(lc, ws->dv, r0, d.GD);
    if (cfg->v_norm) { /* gemma4: through the v-norm; with keys as values onto k_raw's gradient */
        be->rmsnorm_backward(be, w->v ? ws->dv_raw : ws->dk_raw, NULL, dv, w->v ? ws->v_raw : ws->k_raw,
                             NULL, ws->v_rstd, n * d.G, d.D, !w->v, 0);
        dv = ws->dv_raw;
    }
    int q_rows = d.HD;
    if (cfg->attn_gate) { /* the query and gate heads' gradients, interleaved as q_proj made them */
        be->cols_join(be, ws->d_q_gate, dq, mt_layer_row(lc, ws->d_gate_att, r0, d.HD), n * d.H, d.D,
                      d.D);
        dq = ws->d_q_gate;
        q_rows = 2 * d.HD;
    }
    mt_linear_backward(lc, w, g, MT_W_Q, ws->d_xn1, mt_f32(g->q), mt_f32(g->q_bias), dq, ws->xn1,
                       w->q, n, d.C, q_rows, 0, ws);
    mt_linear_backward(lc, w, g, MT_W_K, ws->d_xn1, mt_f32(g->k), mt_f32(g->k_bias), dk, ws->xn1,
                       w->k, n, d.C, d.GD, 1, ws);
    if (w->v)
        mt_linear_backward(lc, w, g, MT_W_V, ws->d_xn1, mt_f32(g->v), mt_f32(g->v_bias), dv, ws->xn1,
                           w->v, n, d.C, d.GD, 1, ws);
    /* rmsnorm1' into the idle d_hn, then onto d_h: dinp = rmsnorm1'(d_xn1) + d_h */
    void *dinp_c = mt_layer_row(lc, dinp, r0, d.C);
    be->rmsnorm_backward(be, ws->d_hn, mt_f32(g->input_norm), ws->d_xn1,
                         mt_layer_row(lc, inp, r0, d.C), w->input_norm, ws->rstd1, n, d.C, 0,
                         mt_layer_norm_offset(lc));
    be->add(be, dinp_c, ws->d_hn, dinp_c, (size_t)n * d.C);
}

void mt_attention_mixer_backward(const mt_layer_ctx *lc, const mt_tokens *tok,
                                 const mt_layer_weights *w, const mt_layer_weights *g,
                                 const void *inp, void *dinp, mt_layer_ws *ws,
                                 mt_recompute recompute) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    mt_layer_dims d = mt_layer_dims_at(cfg, w, tok->B * tok->T);
    int chunk = mt_layer_chunk_rows(ws->mlp_chunk, d.N), tiled = chunk < d.N;
    /* attention: h = x + o(att), then the attention over all N tokens */
    for (int r0 = 0; r0 < d.N; r0 += chunk) {
        int n = mt_min_int(chunk, d.N - r0);
        void *d_att = mt_layer_row(lc, ws->d_att, r0, d.HD);
        const void *d_o = mt_layer_row(lc, dinp, r0, d.C);
        if (w->attn_out_norm) { /* through gemma3's output norm, into the idle d_xn1 */
            be->rmsnorm_backward(be, ws->d_xn1, mt_f32(g->attn_out_norm), d_o,
                                 mt_layer_row(lc, ws->attn_o, r0, d.C), w->attn_out_norm,
                                 ws->rstd_ao + r0, n, d.C, 0, mt_layer_norm_offset(lc));
            d_o = ws->d_xn1;
        }
        mt_linear_backward(lc, w, g, MT_W_O, d_att, mt_f32(g->o), mt_f32(g->o_bias), d_o,
                           o_input(lc, w, ws, r0, n), w->o, n, d.HD, d.C, 0, ws);
        if (cfg->attn_gate) /* d_att held the gated output's gradient: now the attention's */
            be->sigmoid_gate_backward(be, d_att, mt_layer_row(lc, ws->d_gate_att, r0, d.HD), d_att,
                                      mt_layer_row(lc, ws->att, r0, d.HD),
                                      mt_layer_row(lc, ws->gate_att, r0, d.HD), n, d.HD, d.HD);
    }
    mt_attention_opts opts = attention_opts(lc, w, g);
    be->attention_backward(be, ws->dq, ws->dk, ws->dv, ws->d_att, ws->att, ws->lse, ws->q, ws->k,
                           ws->v, tok->doc_start, tok->B, tok->T, d.H, d.G, d.D, &opts);

    /* the projections in: a tiled call remakes each chunk's xn1 (and qwen3's q_raw, k_raw and
     * their rstd, the normed heads into the dq_raw, dk_raw scratch they are about to become) */
    for (int r0 = 0; r0 < d.N; r0 += chunk) {
        int n = mt_min_int(chunk, d.N - r0);
        if (tiled) {
            input_norm_forward(lc, w, inp, r0, n, ws);
            if (cfg->qk_norm) qk_norm_forward(lc, w, r0, n, ws->dq_raw, ws->dk_raw, ws);
            if (cfg->v_norm) v_forward(lc, w, n, ws->dv_raw, ws); /* v_raw, v_rstd */
        } else if (recompute == MT_RECOMPUTE_CHEAP) { /* the forward's kernels on its inputs */
            input_norm_forward(lc, w, inp, r0, n, ws);
        }
        qkv_backward(lc, tok, w, g, inp, dinp, r0, n, ws);
    }
}
