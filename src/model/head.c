#include "head.h"

#include "../core/error.h"

void mt_head_ws_init(mt_head_ws *ws, const mt_layer_ctx *lc, int max_N) {
    size_t act = (size_t)max_N * lc->cfg->C * mt_dtype_size(lc->be->dtype);
    ws->max_N = max_N;
    ws->xn = lc->be->alloc(lc->be, act);
    ws->dxn = lc->be->alloc(lc->be, act);
    ws->rstd = lc->be->alloc(lc->be, (size_t)max_N * sizeof(float));
}

void mt_head_ws_free(mt_head_ws *ws, const mt_layer_ctx *lc) {
    lc->be->free(lc->be, ws->xn);
    lc->be->free(lc->be, ws->dxn);
    lc->be->free(lc->be, ws->rstd);
    ws->xn = ws->dxn = NULL;
    ws->rstd = NULL;
}

#include <math.h>

/* gemma3's embedding scale: sqrt(C) rounded to the compute dtype, as transformers' embed_scale
 * buffer is cast to the weights' dtype (fp32 sqrtf(C); bf16 e.g. 50.5 for C 2560); 1 elsewhere. */
static float embed_scale(const mt_layer_ctx *lc) {
    if (!lc->cfg->embed_scale) return 1.0f;
    float s = (float)sqrt((double)lc->cfg->C);
    return lc->be->dtype == MT_BF16 ? mt_bf16_to_f32(mt_f32_to_bf16(s)) : s;
}

void mt_embed_forward(const mt_layer_ctx *lc, const mt_model_view *w, const int32_t *ids, int N,
                      void *x0) {
    mt_backend *be = lc->be;
    be->embedding_forward(be, x0, ids, w->embed, N, lc->cfg->C);
    if (lc->cfg->embed_scale) be->scale(be, x0, embed_scale(lc), (size_t)N * lc->cfg->C);
}

void mt_embed_backward(const mt_layer_ctx *lc, const mt_model_view *grads, const int32_t *ids,
                       int N, void *dx0) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    if (cfg->embed_scale) be->scale(be, dx0, embed_scale(lc), (size_t)N * cfg->C);
    if (cfg->embed_pad_no_grad) be->zero_rows_of_id(be, dx0, ids, cfg->pad_token_id, N, cfg->C);
    be->embedding_backward(be, (float *)grads->embed, dx0, ids, N, cfg->C);
}

void mt_head_loss(const mt_layer_ctx *lc, const mt_model_view *w, const mt_model_view *grads,
                  const void *x, const int32_t *targets, int N, float loss_scale, float *losses,
                  void *dx, mt_head_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    MT_CHECK(N <= ws->max_N, "head workspace holds %d tokens, asked for %d", ws->max_N, N);
    be->rmsnorm_forward(be, ws->xn, ws->rstd, x, w->final_norm, N, cfg->C, cfg->rms_norm_eps,
                        mt_config_norm_offset(cfg));
    void *dxn = grads ? ws->dxn : NULL;
    float *dhead = grads ? (float *)grads->lm_head : NULL;
    if (cfg->final_softcap > 0) /* gemma4: logits = cap * tanh(logits / cap) */
        be->lm_head_loss_softcap(be, losses, dxn, dhead, ws->xn, w->lm_head, targets, N, cfg->C,
                                 cfg->V, loss_scale, (float)cfg->final_softcap);
    else
        be->lm_head_loss(be, losses, dxn, dhead, ws->xn, w->lm_head, targets, N, cfg->C, cfg->V,
                         loss_scale);
    if (!grads) return;
    be->rmsnorm_backward(be, dx, (float *)grads->final_norm, ws->dxn, x, w->final_norm, ws->rstd,
                         N, cfg->C, 0, mt_config_norm_offset(cfg));
}

void mt_head_logits(const mt_layer_ctx *lc, const mt_model_view *w, const void *x, int N,
                    void *logits, mt_head_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    MT_CHECK(N <= ws->max_N, "head workspace holds %d tokens, asked for %d", ws->max_N, N);
    be->rmsnorm_forward(be, ws->xn, ws->rstd, x, w->final_norm, N, cfg->C, cfg->rms_norm_eps,
                        mt_config_norm_offset(cfg));
    be->matmul_forward(be, logits, ws->xn, w->lm_head, NULL, N, cfg->C, cfg->V);
    if (cfg->final_softcap > 0) be->softcap(be, logits, (float)cfg->final_softcap, (size_t)N * cfg->V);
}
