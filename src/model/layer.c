/* One decoder layer: the token mixer half (mixer_attention.c) and the MLP half (a dense SwiGLU or
 * GeGLU here, the experts in moe.c), each with its residual add (model/layer.h); gemma3 and gemma4
 * norm each half's output before its add (sandwich norms); gemma4 scales the layer's output by its
 * layer_scalar. */
#include "model/layer.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/layer_internal.h"
#include "model/linear.h"
#include "model/moe.h"
#include "model/moe_gemma4.h"

int mt_layer_check_runnable(const mt_config *cfg) {
    /* every mixer and MLP of the families config.c reads has its forward and backward, LoRA
     * included (gemma4's against PEFT: tests/fixtures/lora_gemma4, lora_gemma4_moe) */
    (void)cfg;
    return MT_OK;
}

int mt_layer_backend_check(const mt_config *cfg, const mt_backend *be) {
    /* gpt-oss needs the attention's window, sinks and scale and its own expert ops: refused by
     * name where a backend lacks them, never run without them */
    if (cfg->arch == MT_ARCH_GPT_OSS &&
        (!be->attention_options || !be->moe_matmul_io_forward || !be->swiglu_clamped_forward))
        return mt_error_set("gpt_oss: the %s backend does not have gpt-oss's ops yet (attention sinks "
                            "and sliding window, the clamped-SwiGLU experts with biases): use "
                            "--device cpu", be->name);
    /* gemma3 needs the attention's window and scale, GeGLU and the embedding's pad row */
    if (cfg->arch == MT_ARCH_GEMMA3 &&
        (!be->attention_options || !be->geglu_forward || !be->zero_rows_of_id))
        return mt_error_set("%s: the %s backend does not have Gemma 3's ops yet (GeGLU, the sliding "
                            "window and query_pre_attn_scalar in the attention, the pad token's "
                            "embedding row): use --device cpu", cfg->model_type, be->name);
    /* gemma4 needs Gemma 3's and its own: the weightless v-norm, the per-layer scalar, the
     * soft-capped LM head */
    if (cfg->arch == MT_ARCH_GEMMA4 &&
        (!be->attention_options || !be->geglu_forward || !be->zero_rows_of_id ||
         !be->rmsnorm_unweighted || !be->scale_by || !be->softcap || !be->lm_head_loss_softcap ||
         (cfg->moe_beside_dense && !be->moe_expert_scale_forward)))
        return mt_error_set("%s: the %s backend does not have Gemma 4's ops yet (GeGLU, the sliding "
                            "window and unscaled scores in the attention, the weightless v-norm, the "
                            "per-layer scalar, the soft-capped LM head, the pad token's embedding "
                            "row, the MoE block's per-expert scale): use --device cpu", cfg->model_type,
                            be->name);
    /* Gemma 4, LoRA on gpt-oss's experts and LoRA on Gated DeltaNet layers run on CUDA as verified
     * against the CPU on a GPU (tests/gpu/test_cuda_gemma4_ops, test_cuda_model test_gemma4_models,
     * test_cuda_lora test_gpt_oss_experts and test_qwen3_5_moe: bench/RESULTS.md, session 16) */
    int n = mt_config_mixer_layers(cfg, MT_MIXER_GATED_DELTANET);
    if (n > 0 && !be->gated_delta_forward)
        return mt_error_set("%s: %d of the %d layers are Gated DeltaNets, whose ops the %s backend "
                            "does not have yet: use --device cpu", cfg->model_type, n, cfg->L,
                            be->name);
    return MT_OK;
}

/* hn, rstd2 (chunk rows) = rmsnorm(h) of the n tokens of h_rows. */
static void post_norm_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, const void *h_rows,
                              int n, mt_layer_ws *ws) {
    const mt_config *cfg = lc->cfg;
    lc->be->rmsnorm_forward(lc->be, ws->hn, ws->rstd2, h_rows, w->post_norm, n, cfg->C,
                            cfg->rms_norm_eps, mt_layer_norm_offset(lc));
}

/* act = act(gate) * up over n tokens: SwiGLU, or GeGLU (gemma3), as the config says. */
static void mlp_act_forward(const mt_layer_ctx *lc, mt_layer_ws *ws, int n) {
    mt_backend *be = lc->be;
    size_t m = (size_t)n * lc->cfg->F;
    if (lc->cfg->mlp_act == MT_MLP_GEGLU) be->geglu_forward(be, ws->act, ws->gate, ws->up, m);
    else be->swiglu_forward(be, ws->act, ws->gate, ws->up, m);
}

static void mlp_act_backward(const mt_layer_ctx *lc, mt_layer_ws *ws, int n) {
    mt_backend *be = lc->be;
    size_t m = (size_t)n * lc->cfg->F;
    if (lc->cfg->mlp_act == MT_MLP_GEGLU)
        be->geglu_backward(be, ws->d_gate, ws->d_up, ws->d_act, ws->gate, ws->up, m);
    else be->swiglu_backward(be, ws->d_gate, ws->d_up, ws->d_act, ws->gate, ws->up, m);
}

/* The dense MLP's output for the n tokens of ws->act into out_c: down(act), or with gemma3's
 * output norm norm(down(act)), down's output and the norm's rstd kept in mlp_y, rstd_mo. */
static void mlp_down_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, void *out_c, int n,
                             mt_layer_ws *ws) {
    const mt_config *cfg = lc->cfg;
    if (!w->mlp_out_norm) {
        mt_linear_forward(lc, w, MT_W_DOWN, out_c, ws->act, w->down, w->down_bias, n, cfg->F,
                          cfg->C, ws);
        return;
    }
    mt_linear_forward(lc, w, MT_W_DOWN, ws->mlp_y, ws->act, w->down, w->down_bias, n, cfg->F,
                      cfg->C, ws);
    lc->be->rmsnorm_forward(lc->be, out_c, ws->rstd_mo, ws->mlp_y, w->mlp_out_norm, n, cfg->C,
                            cfg->rms_norm_eps, mt_layer_norm_offset(lc));
}

/* MLP up to the down projection's input for the n tokens of h_rows: fills hn, rstd2, gate, up,
 * act from their first row (the whole call, or one chunk of it). */
static void mlp_up_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, const void *h_rows,
                           int n, mt_layer_ws *ws) {
    const mt_config *cfg = lc->cfg;
    post_norm_forward(lc, w, h_rows, n, ws);
    mt_linear_forward(lc, w, MT_W_GATE, ws->gate, ws->hn, w->gate, w->gate_bias, n, cfg->C, cfg->F,
                      ws);
    mt_linear_forward(lc, w, MT_W_UP, ws->up, ws->hn, w->up, w->up_bias, n, cfg->C, cfg->F, ws);
    mlp_act_forward(lc, ws, n);
}

/* gemma4's MoE block (model/moe_gemma4.h) on the n tokens of h_rows: the dense MLP's output (down's,
 * in g4_y1) and the experts' (g4_y2) each normed, their sum (mlp_y) normed into out_c (rstd_mo). */
static void moe4_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, const void *h_rows,
                         void *out_c, int n, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    int C = cfg->C;
    float eps = cfg->rms_norm_eps, off = mt_layer_norm_offset(lc);
    mlp_up_forward(lc, w, h_rows, n, ws);
    mt_linear_forward(lc, w, MT_W_DOWN, ws->g4_y1, ws->act, w->down, w->down_bias, n, cfg->F, C, ws);
    be->rmsnorm_forward(be, ws->mlp_y, ws->g4_rstd1, ws->g4_y1, w->mlp_out_norm_1, n, C, eps, off);
    mt_moe_gemma4_forward(lc, w, h_rows, ws->g4_y2, n, ws);
    be->rmsnorm_forward(be, ws->g4_y2n, ws->g4_rstd2, ws->g4_y2, w->mlp_out_norm_2, n, C, eps, off);
    be->add(be, ws->mlp_y, ws->mlp_y, ws->g4_y2n, (size_t)n * C);
    be->rmsnorm_forward(be, out_c, ws->rstd_mo, ws->mlp_y, w->mlp_out_norm, n, C, eps, off);
}

void mt_layer_forward(const mt_layer_ctx *lc, const mt_tokens *tok, const mt_layer_weights *w,
                      const void *inp, void *out, mt_layer_ws *ws) {
    int N = tok->B * tok->T, C = lc->cfg->C;
    MT_CHECK(N <= ws->max_N, "layer workspace holds %d tokens, asked for %d", ws->max_N, N);
    mt_backend *be = lc->be;
    if (w->lin_qkv) mt_deltanet_mixer_forward(lc, tok, w, inp, ws);
    else mt_attention_mixer_forward(lc, tok, w, inp, ws, 1);
    /* out = h + down(act), chunk by chunk; inp is dead, so out may alias it */
    int chunk = mt_layer_chunk_rows(ws->mlp_chunk, N);
    for (int r0 = 0; r0 < N; r0 += chunk) {
        int n = mt_min_int(chunk, N - r0);
        void *out_c = mt_layer_row(lc, out, r0, C);
        if (w->exp_gate_up_oi) {
            moe4_forward(lc, w, mt_layer_row(lc, ws->h, r0, C), out_c, n, ws);
        } else if (w->router) {
            post_norm_forward(lc, w, mt_layer_row(lc, ws->h, r0, C), n, ws);
            mt_moe_forward(lc, w, ws->hn, out_c, n, ws, 1);
        } else {
            mlp_up_forward(lc, w, mt_layer_row(lc, ws->h, r0, C), n, ws);
            mlp_down_forward(lc, w, out_c, n, ws);
        }
        be->add(be, out_c, out_c, mt_layer_row(lc, ws->h, r0, C), (size_t)n * C);
        if (w->layer_scalar) be->scale_by(be, out_c, out_c, w->layer_scalar, (size_t)n * C);
    }
}

/* MLP backward for the n tokens from row r0, whose hn, rstd2, gate, up, act (and, unless
 * remake_y, gemma3's mlp_y, rstd_mo) are in ws: the MLP weight gradients accumulate, d_h rows
 * r0.. = dout + rmsnorm2'(d_hn) (d_xn1 as scratch). d_h may alias dout: a chunk reads its own rows
 * of dout before it writes them. */
static void post_norm_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                               const mt_layer_weights *g, const void *dout_c, void *d_h_c, int r0,
                               int n, mt_layer_ws *ws);

static void mlp_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                         const mt_layer_weights *g, const void *dout, void *d_h, int r0, int n,
                         int remake_y, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    int C = cfg->C, F = cfg->F;
    const void *dout_c = mt_layer_row(lc, dout, r0, C);
    void *d_h_c = mt_layer_row(lc, d_h, r0, C);
    const void *d_y = dout_c;
    if (w->mlp_out_norm) { /* gemma3: through the output norm (its output remade into idle d_hn) */
        if (remake_y) mlp_down_forward(lc, w, ws->d_hn, n, ws);
        be->rmsnorm_backward(be, ws->d_xn1, mt_f32(g->mlp_out_norm), dout_c, ws->mlp_y,
                             w->mlp_out_norm, ws->rstd_mo, n, C, 0, mt_layer_norm_offset(lc));
        d_y = ws->d_xn1;
    }
    mt_linear_backward(lc, w, g, MT_W_DOWN, ws->d_act, mt_f32(g->down), mt_f32(g->down_bias),
                       d_y, ws->act, w->down, n, F, C, 0, ws);
    mlp_act_backward(lc, ws, n);
    mt_linear_backward(lc, w, g, MT_W_GATE, ws->d_hn, mt_f32(g->gate), mt_f32(g->gate_bias),
                       ws->d_gate, ws->hn, w->gate, n, C, F, 0, ws);
    mt_linear_backward(lc, w, g, MT_W_UP, ws->d_hn, mt_f32(g->up), mt_f32(g->up_bias), ws->d_up,
                       ws->hn, w->up, n, C, F, 1, ws);
    post_norm_backward(lc, w, g, dout_c, d_h_c, r0, n, ws);
}

/* From d_hn: d_h rows r0.. = dout + rmsnorm2'(d_hn) (d_xn1 as scratch), the post-norm gradient. */
static void post_norm_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                               const mt_layer_weights *g, const void *dout_c, void *d_h_c, int r0,
                               int n, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    int C = lc->cfg->C;
    be->rmsnorm_backward(be, ws->d_xn1, mt_f32(g->post_norm), ws->d_hn,
                         mt_layer_row(lc, ws->h, r0, C), w->post_norm, ws->rstd2, n, C, 0,
                         mt_layer_norm_offset(lc));
    be->add(be, d_h_c, dout_c, ws->d_xn1, (size_t)n * C);
}

/* The MoE layer's MLP half for the n tokens from row r0: its block remade from h unless ws holds
 * this forward's (untiled MT_RECOMPUTE_NONE), then its backward into d_hn and the post norm's. */
static void moe_mlp_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                             const mt_layer_weights *g, const void *dout, void *d_h, int r0, int n,
                             int remake, mt_layer_ws *ws) {
    int C = lc->cfg->C;
    if (remake) {
        post_norm_forward(lc, w, mt_layer_row(lc, ws->h, r0, C), n, ws);
        mt_moe_forward(lc, w, ws->hn, NULL, n, ws, 0);
    }
    const void *dout_c = mt_layer_row(lc, dout, r0, C);
    mt_moe_backward(lc, w, g, dout_c, ws->hn, ws->d_hn, n, ws);
    post_norm_backward(lc, w, g, dout_c, mt_layer_row(lc, d_h, r0, C), r0, n, ws);
}

/* gemma4's MoE block backward for the n tokens from row r0 (its forward remade from h first when
 * `remake`): through the outer norm, then each branch's norm, the dense MLP into d_hn and the
 * experts into g4_d1; d_h rows r0.. = dout + pre-norm'(d_hn) + the experts' input gradient. */
static void moe4_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                          const mt_layer_weights *g, const void *dout, void *d_h, int r0, int n,
                          int remake, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    int C = cfg->C, F = cfg->F;
    float off = mt_layer_norm_offset(lc);
    const void *h_c = mt_layer_row(lc, ws->h, r0, C), *dout_c = mt_layer_row(lc, dout, r0, C);
    void *d_h_c = mt_layer_row(lc, d_h, r0, C);
    if (remake) moe4_forward(lc, w, h_c, ws->d_hn, n, ws); /* its output into the idle d_hn */
    be->rmsnorm_backward(be, ws->g4_d1, mt_f32(g->mlp_out_norm), dout_c, ws->mlp_y, w->mlp_out_norm,
                         ws->rstd_mo, n, C, 0, off);
    be->rmsnorm_backward(be, ws->g4_d2, mt_f32(g->mlp_out_norm_1), ws->g4_d1, ws->g4_y1,
                         w->mlp_out_norm_1, ws->g4_rstd1, n, C, 0, off);
    mt_linear_backward(lc, w, g, MT_W_DOWN, ws->d_act, mt_f32(g->down), mt_f32(g->down_bias), ws->g4_d2,
                       ws->act, w->down, n, F, C, 0, ws);
    mlp_act_backward(lc, ws, n);
    mt_linear_backward(lc, w, g, MT_W_GATE, ws->d_hn, mt_f32(g->gate), mt_f32(g->gate_bias), ws->d_gate,
                       ws->hn, w->gate, n, C, F, 0, ws);
    mt_linear_backward(lc, w, g, MT_W_UP, ws->d_hn, mt_f32(g->up), mt_f32(g->up_bias), ws->d_up, ws->hn,
                       w->up, n, C, F, 1, ws);
    be->rmsnorm_backward(be, ws->g4_d2, mt_f32(g->mlp_out_norm_2), ws->g4_d1, ws->g4_y2,
                         w->mlp_out_norm_2, ws->g4_rstd2, n, C, 0, off);
    mt_moe_gemma4_backward(lc, w, g, ws->g4_d2, h_c, ws->g4_d1, n, ws);
    post_norm_backward(lc, w, g, dout_c, d_h_c, r0, n, ws);
    be->add(be, d_h_c, d_h_c, ws->g4_d1, (size_t)n * C);
}

void mt_layer_backward(const mt_layer_ctx *lc, const mt_tokens *tok, const mt_layer_weights *w,
                       const mt_layer_weights *g, const void *inp, const void *dout, void *dinp,
                       mt_layer_ws *ws, mt_recompute recompute) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    mt_layer_dims d = mt_layer_dims_of(cfg, tok->B * tok->T);
    MT_CHECK(d.N <= ws->max_N, "layer workspace holds %d tokens, asked for %d", ws->max_N, d.N);
    int chunk = mt_layer_chunk_rows(ws->mlp_chunk, d.N), tiled = chunk < d.N;
    int remake = recompute == MT_RECOMPUTE_ALL || recompute == MT_RECOMPUTE_KEEP_ATTENTION;
    /* the MLP needs h: a DeltaNet mixer saves nothing, so only MT_RECOMPUTE_NONE spares its remake */
    if (w->lin_qkv && recompute != MT_RECOMPUTE_NONE) mt_deltanet_mixer_forward(lc, tok, w, inp, ws);
    else if (remake) mt_attention_mixer_forward(lc, tok, w, inp, ws, recompute == MT_RECOMPUTE_ALL);

    /* gemma4: out = (h + mlp) * layer_scalar, so the halves see dout * layer_scalar (written into
     * dinp, which the MLP may alias as dout); the scalar itself is a buffer: no gradient */
    if (w->layer_scalar) {
        be->scale_by(be, dinp, dout, w->layer_scalar, (size_t)d.N * d.C);
        dout = dinp;
    }

    /* MLP: out = h + down(act), chunk by chunk; a tiled MLP remakes every chunk from h. d_h, the
     * gradient of h, goes into dinp's rows (dout's rows are read first where they alias). */
    for (int r0 = 0; r0 < d.N; r0 += chunk) {
        int n = mt_min_int(chunk, d.N - r0);
        if (w->exp_gate_up_oi) {
            moe4_backward(lc, w, g, dout, dinp, r0, n, tiled || recompute != MT_RECOMPUTE_NONE, ws);
            continue;
        }
        if (w->router) {
            moe_mlp_backward(lc, w, g, dout, dinp, r0, n, tiled || recompute != MT_RECOMPUTE_NONE,
                             ws);
            continue;
        }
        if (tiled || remake) {
            mlp_up_forward(lc, w, mt_layer_row(lc, ws->h, r0, d.C), n, ws);
        } else if (recompute == MT_RECOMPUTE_CHEAP) { /* gate and up are saved */
            be->rmsnorm_forward(be, ws->hn, ws->rstd2, mt_layer_row(lc, ws->h, r0, d.C),
                                w->post_norm, n, d.C, cfg->rms_norm_eps, mt_layer_norm_offset(lc));
            mlp_act_forward(lc, ws, n);
        }
        mlp_backward(lc, w, g, dout, dinp, r0, n, tiled || remake, ws);
    }

    if (w->lin_qkv) mt_deltanet_mixer_backward(lc, tok, w, g, inp, dinp, ws);
    else mt_attention_mixer_backward(lc, tok, w, g, inp, dinp, ws, recompute);
}
