/* Linear projections with LoRA adapters (model/linear.h). */
#include "model/linear.h"

#include "core/error.h"
#include "model/lora.h"

static int has_adapter(const mt_layer_weights *w, mt_param_kind kind) {
    return w->lora && w->lora->a[kind];
}

/* ws->lora_u (n, r) = scale * x A^T */
static void low_rank_in(const mt_layer_ctx *lc, const mt_lora_view *lv, mt_param_kind kind,
                        const void *x, int n, int in, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    be->matmul_forward(be, ws->lora_u, x, lv->a[kind], NULL, n, in, lv->rank);
    be->scale(be, ws->lora_u, lv->scale, (size_t)n * (size_t)lv->rank);
}

void mt_linear_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, mt_param_kind kind,
                       void *y, const void *x, const void *W, const void *bias, int n, int in,
                       int out, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    be->matmul_forward(be, y, x, W, bias, n, in, out);
    if (!has_adapter(w, kind)) return;
    const mt_lora_view *lv = w->lora;
    MT_CHECK(ws->lora_u && lv->rank <= lc->cfg->lora_rank,
             "LoRA rank %d: the layer workspace was sized for rank %d", lv->rank, lc->cfg->lora_rank);
    low_rank_in(lc, lv, kind, x, n, in, ws);
    be->matmul_forward_add(be, y, ws->lora_u, lv->b[kind], n, lv->rank, out);
}

void mt_linear_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                        const mt_layer_weights *g, mt_param_kind kind, void *dx, float *dW,
                        float *db, const void *dy, const void *x, const void *W, int n, int in,
                        int out, int accumulate, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    be->matmul_backward(be, dx, dW, db, dy, x, W, n, in, out, accumulate);
    if (!has_adapter(w, kind)) return;
    const mt_lora_view *lv = w->lora, *lg = g->lora;
    MT_CHECK(lg && lg->a[kind], "LoRA: the gradient view has no adapter where the weights do");
    int r = lv->rank;
    low_rank_in(lc, lv, kind, x, n, in, ws);
    /* through B: lora_du = dy B, dB += dy^T (scale u) */
    be->matmul_backward(be, ws->lora_du, (float *)lg->b[kind], NULL, dy, ws->lora_u, lv->b[kind],
                        n, r, out, 0);
    /* through A: du = scale * dy B; dx += du A, dA += du^T x */
    be->scale(be, ws->lora_du, lv->scale, (size_t)n * (size_t)r);
    be->matmul_backward(be, dx, (float *)lg->a[kind], NULL, ws->lora_du, x, lv->a[kind], n, in, r,
                        1);
}
