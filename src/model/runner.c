#include "runner.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "docs.h"
#include "moe.h"

static size_t act_bytes(const mt_param_table *t, mt_dtype dtype, int N) {
    return (size_t)N * t->cfg.C * mt_dtype_size(dtype);
}

void mt_runner_init(mt_runner *r, const mt_param_table *t, mt_backend *be, int max_B, int T) {
    memset(r, 0, sizeof *r);
    const mt_config *cfg = &t->cfg;
    r->table = t;
    r->max_B = max_B;
    r->T = T;
    r->max_N = max_B * T;
    int N = r->max_N;

    size_t rope_bytes = mt_config_rope_inv_freq_len(cfg) * sizeof(float); /* gemma3: two tables */
    float *inv_freq = mt_calloc(1, rope_bytes);
    mt_config_rope_inv_freq(cfg, inv_freq);
    r->inv_freq = be->alloc(be, rope_bytes);
    be->upload(be, r->inv_freq, inv_freq, rope_bytes);
    free(inv_freq);

    r->lc = (mt_layer_ctx){.cfg = cfg, .be = be, .inv_freq = r->inv_freq};
    mt_layer_ws_init(&r->ws, &r->lc, N);
    mt_head_ws_init(&r->head_ws, &r->lc, N);
    r->acts = be->alloc(be, (size_t)(cfg->L + 1) * act_bytes(t, be->dtype, N));
    r->dx = be->alloc(be, act_bytes(t, be->dtype, N));
    r->losses = be->alloc(be, (size_t)N * sizeof(float));
    r->ids = be->alloc(be, (size_t)N * sizeof(int32_t));
    r->targets = be->alloc(be, (size_t)N * sizeof(int32_t));
    r->pos = be->alloc(be, (size_t)N * sizeof(int32_t));

    r->doc_start = be->alloc(be, (size_t)N * sizeof(int32_t));
    mt_runner_set_documents(r, NULL);
}

int mt_runner_set_documents(mt_runner *r, const int32_t *doc_start) {
    mt_backend *be = r->lc.be;
    if (doc_start) MT_TRY(mt_docs_check(doc_start, r->max_B, r->T));
    size_t bytes = (size_t)r->max_N * sizeof(int32_t);
    int32_t *pos = mt_malloc(bytes);
    mt_docs_positions(doc_start, r->max_B, r->T, pos);
    be->upload(be, r->pos, pos, bytes);
    free(pos);
    if (doc_start) be->upload(be, r->doc_start, doc_start, bytes);
    if (be->note_documents) be->note_documents(be, r->doc_start, doc_start, r->max_B, r->T);
    r->use_docs = doc_start != NULL;
    return MT_OK;
}

void mt_runner_free(mt_runner *r) {
    mt_backend *be = r->lc.be;
    if (!be) return;
    mt_layer_ws_free(&r->ws, &r->lc);
    mt_head_ws_free(&r->head_ws, &r->lc);
    void *bufs[] = {r->acts, r->dx, r->losses, r->ids, r->targets, r->pos, r->doc_start, r->inv_freq};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
    memset(r, 0, sizeof *r);
}

/* Checkpoint l: the input of layer l (l = L: the last layer's output). */
static void *act_at(const mt_runner *r, int l) {
    return (char *)r->acts + (size_t)l * act_bytes(r->table, r->lc.be->dtype, r->max_N);
}

static void *layer_base(const mt_param_table *t, const void *arena, size_t elem, int l) {
    return (char *)arena + (size_t)mt_group_offset(t, l) * elem;
}

/* Runs embedding and every layer, leaving layer inputs in acts[0..L-1] and the output in acts[L]. */
static void forward_layers(mt_runner *r, const void *weights, const mt_tokens *tok,
                           const mt_model_view *w) {
    const mt_param_table *t = r->table;
    mt_backend *be = r->lc.be;
    size_t elem = mt_dtype_size(be->dtype);
    int N = tok->B * tok->T;
    mt_embed_forward(&r->lc, w, r->ids, N, act_at(r, 0));
    for (int l = 0; l < t->cfg.L; l++) {
        mt_layer_weights lw = mt_layer_view_at(t, l, layer_base(t, weights, elem, l), elem);
        mt_layer_forward(&r->lc, tok, &lw, act_at(r, l), act_at(r, l + 1), &r->ws);
    }
}

static void upload_ids(mt_runner *r, int32_t *dst, const int32_t *src, int N) {
    r->lc.be->upload(r->lc.be, dst, src, (size_t)N * sizeof(int32_t));
}

double mt_runner_step(mt_runner *r, const void *weights, float *grads, const int32_t *ids,
                      const int32_t *targets, int B, float loss_scale, int64_t *count) {
    const mt_param_table *t = r->table;
    mt_backend *be = r->lc.be;
    MT_CHECK(B >= 1 && B <= r->max_B, "batch of %d rows, runner sized for %d", B, r->max_B);
    int N = B * r->T;
    int64_t n_counted = 0;
    for (int i = 0; i < N; i++) n_counted += targets[i] >= 0;
    if (count) *count = n_counted;
    if (loss_scale == 0) loss_scale = n_counted ? 1.0f / (float)n_counted : 0.0f;

    upload_ids(r, r->ids, ids, N);
    upload_ids(r, r->targets, targets, N);
    mt_tokens tok = {.B = B, .T = r->T, .pos = r->pos, .doc_start = r->use_docs ? r->doc_start : NULL};
    size_t elem = mt_dtype_size(be->dtype);
    mt_model_view w = mt_model_view_of(t, (void *)weights, elem);
    mt_moe_stats_reset(&r->lc, r->ws.moe_stats);
    forward_layers(r, weights, &tok, &w);
    r->aux_loss = mt_moe_aux_finish(&r->lc, r->ws.moe_stats, NULL);

    mt_model_view g = {0};
    if (grads) g = mt_model_view_of(t, grads, sizeof(float));
    mt_head_loss(&r->lc, &w, grads ? &g : NULL, act_at(r, t->cfg.L), r->targets, N, loss_scale,
                 r->losses, r->dx, &r->head_ws);
    if (grads) {
        for (int l = t->cfg.L - 1; l >= 0; l--) {
            mt_layer_weights lw = mt_layer_view_at(t, l, layer_base(t, weights, elem, l), elem);
            mt_layer_weights lg = mt_layer_view_at(t, l, layer_base(t, grads, sizeof(float), l), sizeof(float));
            mt_layer_backward(&r->lc, &tok, &lw, &lg, act_at(r, l), r->dx, r->dx, &r->ws, MT_RECOMPUTE_ALL);
        }
        mt_embed_backward(&r->lc, &g, r->ids, N, r->dx);
    }

    float *losses = mt_malloc((size_t)N * sizeof(float));
    be->download(be, losses, r->losses, (size_t)N * sizeof(float));
    double sum = 0;
    for (int i = 0; i < N; i++) sum += losses[i];
    free(losses);
    return sum;
}

void mt_runner_logits(mt_runner *r, const void *weights, const int32_t *ids, int B,
                      float *logits) {
    const mt_param_table *t = r->table;
    mt_backend *be = r->lc.be;
    MT_CHECK(B >= 1 && B <= r->max_B, "batch of %d rows, runner sized for %d", B, r->max_B);
    int N = B * r->T, V = t->cfg.V;
    upload_ids(r, r->ids, ids, N);
    mt_tokens tok = {.B = B, .T = r->T, .pos = r->pos, .doc_start = r->use_docs ? r->doc_start : NULL};
    size_t elem = mt_dtype_size(be->dtype);
    mt_model_view w = mt_model_view_of(t, (void *)weights, elem);
    forward_layers(r, weights, &tok, &w);
    /* logits one row of T tokens at a time so that only (T, V) exists on the compute side */
    size_t row_elems = (size_t)r->T * V;
    void *dev = be->alloc(be, row_elems * elem);
    void *host = mt_malloc(row_elems * elem);
    for (int b = 0; b < B; b++) {
        void *x = (char *)act_at(r, t->cfg.L) + (size_t)b * r->T * t->cfg.C * elem;
        mt_head_logits(&r->lc, &w, x, r->T, dev, &r->head_ws);
        be->download(be, host, dev, row_elems * elem);
        float *dst = logits + (size_t)b * row_elems;
        if (be->dtype == MT_F32) memcpy(dst, host, row_elems * sizeof(float));
        else mt_convert_bf16_to_f32(dst, host, row_elems);
    }
    free(host);
    be->free(be, dev);
}
