#include "layer.h"

#include <string.h>

#include "../core/error.h"
#include "moe.h"

typedef struct {
    int N, C, F, H, G, D, HD, GD;
} dims;

static dims dims_of(const mt_config *cfg, int N) {
    dims d = {N, cfg->C, cfg->F, cfg->H, cfg->G, cfg->D, cfg->H * cfg->D, cfg->G * cfg->D};
    return d;
}

/* One list of (field, elements per token) drives the allocation, the free and the byte count. */
typedef struct {
    size_t offset;   /* offsetof the pointer in mt_layer_ws */
    int per_token;   /* elements per token */
    int is_f32;      /* fp32 statistic rather than compute dtype */
    int saved;       /* kept per layer when its backward skips the recompute (a chunk field only
                        when the call is untiled) */
    int chunk;       /* chunk rows: one chunk of tokens when the call is tiled */
} ws_field;

#define WS(field) offsetof(mt_layer_ws, field)
#define WS_MAX_FIELDS 64 /* room for every list of ws_fields; it checks */

/* Appends the m fields of `list` to f (n of them so far). */
static void ws_append(ws_field *f, int *n, const ws_field *list, size_t m) {
    MT_CHECK(*n + (int)m <= WS_MAX_FIELDS, "layer workspace: more than %d fields", WS_MAX_FIELDS);
    for (size_t i = 0; i < m; i++) f[(*n)++] = list[i];
}

static int ws_fields(const mt_config *cfg, ws_field *f) {
    int C = cfg->C, HD = cfg->H * cfg->D, GD = cfg->G * cfg->D, n = 0;
    int F = mt_config_moe_layers(cfg) == cfg->L ? 0 : cfg->F; /* no dense MLP: no room for one */
    ws_field list[] = {
        {WS(xn1), C, 0, 0, 1},    {WS(q), HD, 0, 1, 0},     {WS(k), GD, 0, 1, 0},
        {WS(v), GD, 0, 1, 0},     {WS(att), HD, 0, 1, 0},   {WS(h), C, 0, 1, 0},
        {WS(hn), C, 0, 0, 1},     {WS(gate), F, 0, 1, 1},   {WS(up), F, 0, 1, 1},
        {WS(act), F, 0, 0, 1},    {WS(rstd1), 1, 1, 0, 1},  {WS(rstd2), 1, 1, 0, 1},
        {WS(lse), cfg->H, 1, 1, 0},
        {WS(d_act), F, 0, 0, 1},  {WS(d_gate), F, 0, 0, 1}, {WS(d_up), F, 0, 0, 1},
        {WS(d_hn), C, 0, 0, 1},   {WS(d_xn1), C, 0, 0, 1},
        {WS(d_att), HD, 0, 0, 0}, {WS(dq), HD, 0, 0, 0},    {WS(dk), GD, 0, 0, 0},
        {WS(dv), GD, 0, 0, 0},
    };
    ws_append(f, &n, list, sizeof list / sizeof list[0]);
    if (cfg->qk_norm) {
        ws_field extra[] = {{WS(q_raw), HD, 0, 1, 1},     {WS(k_raw), GD, 0, 1, 1},
                            {WS(q_rstd), cfg->H, 1, 1, 1}, {WS(k_rstd), cfg->G, 1, 1, 1},
                            {WS(dq_raw), HD, 0, 0, 1},     {WS(dk_raw), GD, 0, 0, 1}};
        ws_append(f, &n, extra, sizeof extra / sizeof extra[0]);
    }
    if (cfg->n_experts > 0) { /* int32 fields count as 4-byte (is_f32) */
        int E = cfg->n_experts, k = cfg->top_k, kC = k * C, kF = k * cfg->moe_F;
        ws_field moe[] = {
            {WS(moe_logits), E, 0, 0, 1}, {WS(moe_d_logits), E, 0, 0, 1}, {WS(moe_probs), E, 1, 0, 1},
            {WS(moe_idx), k, 1, 0, 1},    {WS(moe_w), k, 1, 0, 1},        {WS(moe_dw), k, 1, 0, 1},
            {WS(moe_perm), k, 1, 0, 1},   {WS(moe_inv), k, 1, 0, 1},      {WS(moe_x), kC, 0, 0, 1},
            {WS(moe_y), kC, 0, 0, 1},     {WS(moe_gate), kF, 0, 0, 1},    {WS(moe_up), kF, 0, 0, 1},
            {WS(moe_act), kF, 0, 0, 1},   {WS(moe_d_y), kC, 0, 0, 1},     {WS(moe_d_x), kC, 0, 0, 1},
            {WS(moe_d_act), kF, 0, 0, 1}, {WS(moe_d_gate), kF, 0, 0, 1},  {WS(moe_d_up), kF, 0, 0, 1},
        };
        ws_append(f, &n, moe, sizeof moe / sizeof moe[0]);
    }
    return n;
}

/* A call over N tokens runs its per-token ops in chunks of this many tokens; N when untiled. */
static int chunk_rows(int chunk, int N) { return chunk > 0 && chunk < N ? chunk : N; }

static size_t field_bytes(const ws_field *f, mt_dtype dtype, int rows) {
    size_t elem = f->is_f32 ? 4 : mt_dtype_size(dtype);
    size_t bytes = (size_t)rows * (size_t)f->per_token * elem;
    return (bytes + 255) / 256 * 256;
}

/* Rows a workspace for max_N tokens gives field f. */
static int ws_rows(const ws_field *f, int max_N, int chunk) {
    return f->chunk ? chunk_rows(chunk, max_N) : max_N;
}

/* Whether field f is saved for a call over N tokens (a chunk field only when untiled). */
static int is_saved(const ws_field *f, int N, int chunk) {
    return f->saved && !(f->chunk && chunk_rows(chunk, N) < N);
}

size_t mt_layer_ws_bytes_tiled(const mt_config *cfg, mt_dtype dtype, int max_N, int mlp_chunk) {
    ws_field f[WS_MAX_FIELDS];
    int n = ws_fields(cfg, f);
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += field_bytes(&f[i], dtype, ws_rows(&f[i], max_N, mlp_chunk));
    return total;
}

size_t mt_layer_ws_bytes(const mt_config *cfg, mt_dtype dtype, int max_N) {
    return mt_layer_ws_bytes_tiled(cfg, dtype, max_N, 0);
}

size_t mt_layer_saved_bytes_tiled(const mt_config *cfg, mt_dtype dtype, int N, int mlp_chunk) {
    ws_field f[WS_MAX_FIELDS];
    int n = ws_fields(cfg, f);
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (is_saved(&f[i], N, mlp_chunk)) total += field_bytes(&f[i], dtype, N);
    return total;
}

size_t mt_layer_saved_bytes(const mt_config *cfg, mt_dtype dtype, int N) {
    return mt_layer_saved_bytes_tiled(cfg, dtype, N, 0);
}

static int is_attention_output(const ws_field *f) {
    return f->offset == WS(att) || f->offset == WS(lse);
}

/* Which fields a kind of save keeps. */
typedef enum { SAVE_WHOLE, SAVE_ATTENTION } save_kind;

static int keeps(save_kind kind, const ws_field *f, int N, int chunk) {
    return kind == SAVE_WHOLE ? is_saved(f, N, chunk) : is_attention_output(f);
}

/* A copy of ws whose fields of that kind point into base, one after the other. */
static mt_layer_ws ws_into(const mt_layer_ws *ws, const mt_config *cfg, mt_dtype dtype, int N,
                           void *base, save_kind kind) {
    MT_CHECK(N <= ws->max_N, "layer workspace holds %d tokens, asked for %d", ws->max_N, N);
    mt_layer_ws v = *ws;
    ws_field f[WS_MAX_FIELDS];
    int n = ws_fields(cfg, f);
    char *at = base;
    for (int i = 0; i < n; i++) {
        if (!keeps(kind, &f[i], N, ws->mlp_chunk)) continue;
        *(void **)((char *)&v + f[i].offset) = at;
        at += field_bytes(&f[i], dtype, N);
    }
    return v;
}

mt_layer_ws mt_layer_ws_with_saved(const mt_layer_ws *ws, const mt_config *cfg, mt_dtype dtype,
                                   int N, void *base) {
    return ws_into(ws, cfg, dtype, N, base, SAVE_WHOLE);
}

size_t mt_layer_attention_saved_bytes(const mt_config *cfg, mt_dtype dtype, int N) {
    ws_field f[WS_MAX_FIELDS];
    int n = ws_fields(cfg, f);
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (is_attention_output(&f[i])) total += field_bytes(&f[i], dtype, N);
    return total;
}

mt_layer_ws mt_layer_ws_with_saved_attention(const mt_layer_ws *ws, const mt_config *cfg,
                                             mt_dtype dtype, int N, void *base) {
    return ws_into(ws, cfg, dtype, N, base, SAVE_ATTENTION);
}

void mt_layer_ws_init_tiled(mt_layer_ws *ws, const mt_layer_ctx *lc, int max_N, int mlp_chunk) {
    MT_CHECK(mlp_chunk >= 0, "layer chunk of %d tokens", mlp_chunk);
    memset(ws, 0, sizeof *ws);
    ws->max_N = max_N;
    ws->mlp_chunk = mlp_chunk;
    ws_field f[WS_MAX_FIELDS];
    int n = ws_fields(lc->cfg, f);
    for (int i = 0; i < n; i++) {
        void **slot = (void **)((char *)ws + f[i].offset);
        int rows = ws_rows(&f[i], max_N, mlp_chunk);
        *slot = lc->be->alloc(lc->be, field_bytes(&f[i], lc->be->dtype, rows));
    }
    mt_moe_ws_init(ws, lc);
}

void mt_layer_ws_init(mt_layer_ws *ws, const mt_layer_ctx *lc, int max_N) {
    mt_layer_ws_init_tiled(ws, lc, max_N, 0);
}

void mt_layer_ws_free(mt_layer_ws *ws, const mt_layer_ctx *lc) {
    ws_field f[WS_MAX_FIELDS];
    int n = ws_fields(lc->cfg, f);
    for (int i = 0; i < n; i++) {
        void **slot = (void **)((char *)ws + f[i].offset);
        if (*slot) lc->be->free(lc->be, *slot);
        *slot = NULL;
    }
    mt_moe_ws_free(ws, lc);
}


int mt_layer_check_runnable(const mt_config *cfg) {
    for (int l = 0; l < cfg->L; l++)
        if (mt_config_layer_mixer(cfg, l) == MT_MIXER_GATED_DELTANET)
            return mt_error_set("%s: layer %d is a Gated DeltaNet (layer_types \"linear_attention\"): "
                                "megatrain reads this model (info, plan) but cannot run that mixer "
                                "yet", cfg->model_type, l);
    if (cfg->norm_offset || cfg->attn_gate || cfg->shared_expert || mt_config_rotary_dim(cfg) != cfg->D)
        return mt_error_set("%s: the (1 + w) norms, gated attention, partial RoPE and shared expert "
                            "of this family cannot run yet", cfg->model_type);
    return MT_OK;
}

/* Row r0 of a token-major (N, width) tensor of the compute dtype. */
static void *row_at(const mt_layer_ctx *lc, const void *base, int r0, int width) {
    return (char *)base + (size_t)r0 * (size_t)width * mt_dtype_size(lc->be->dtype);
}

static int min_int(int a, int b) { return a < b ? a : b; }

/* xn1, rstd1 (chunk rows) = rmsnorm(x) of the n tokens of inp from row r0. */
static void input_norm_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, const void *inp,
                               int r0, int n, mt_layer_ws *ws) {
    const mt_config *cfg = lc->cfg;
    lc->be->rmsnorm_forward(lc->be, ws->xn1, ws->rstd1, row_at(lc, inp, r0, cfg->C),
                            w->input_norm, n, cfg->C, cfg->rms_norm_eps);
}

/* qwen3: q_raw, k_raw (chunk rows) = q/k projections of the n tokens of xn1, q_rstd, k_rstd their
 * norms' statistics, the normed heads written to q_out (n, H*D) and k_out (n, G*D). */
static void qk_norm_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, int n, void *q_out,
                            void *k_out, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    dims d = dims_of(cfg, n);
    be->matmul_forward(be, ws->q_raw, ws->xn1, w->q, w->q_bias, n, d.C, d.HD);
    be->matmul_forward(be, ws->k_raw, ws->xn1, w->k, w->k_bias, n, d.C, d.GD);
    be->rmsnorm_forward(be, q_out, ws->q_rstd, ws->q_raw, w->q_norm, n * d.H, d.D,
                        cfg->rms_norm_eps);
    be->rmsnorm_forward(be, k_out, ws->k_rstd, ws->k_raw, w->k_norm, n * d.G, d.D,
                        cfg->rms_norm_eps);
}

/* Attention's inputs for the n tokens from row r0: q, k, v rows r0.. (after norm and rope) from
 * the input norm, leaving that chunk's xn1 (and q/k norm pieces) in the chunk rows. */
static void qkv_forward(const mt_layer_ctx *lc, const mt_tokens *tok, const mt_layer_weights *w,
                        const void *inp, int r0, int n, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    dims d = dims_of(lc->cfg, n);
    void *q = row_at(lc, ws->q, r0, d.HD), *k = row_at(lc, ws->k, r0, d.GD);
    input_norm_forward(lc, w, inp, r0, n, ws);
    if (lc->cfg->qk_norm) {
        qk_norm_forward(lc, w, n, q, k, ws);
    } else {
        be->matmul_forward(be, q, ws->xn1, w->q, w->q_bias, n, d.C, d.HD);
        be->matmul_forward(be, k, ws->xn1, w->k, w->k_bias, n, d.C, d.GD);
    }
    be->matmul_forward(be, row_at(lc, ws->v, r0, d.GD), ws->xn1, w->v, w->v_bias, n, d.C, d.GD);
    be->rope_forward(be, q, tok->pos + r0, lc->inv_freq, n, d.H, d.D);
    be->rope_forward(be, k, tok->pos + r0, lc->inv_freq, n, d.G, d.D);
}

/* Attention half of the forward: fills q, k, v, att, lse, h (whole call) chunk by chunk around
 * the attention, which sees all N tokens; the chunk rows keep the last chunk's xn1 (and q/k norm
 * pieces): all of them when untiled. Without run_attention, att and lse are this forward's
 * already (saved attention) and the attention is not run again. */
static void attention_block_forward(const mt_layer_ctx *lc, const mt_tokens *tok,
                                    const mt_layer_weights *w, const void *inp, mt_layer_ws *ws,
                                    int run_attention) {
    mt_backend *be = lc->be;
    dims d = dims_of(lc->cfg, tok->B * tok->T);
    int chunk = chunk_rows(ws->mlp_chunk, d.N);
    for (int r0 = 0; r0 < d.N; r0 += chunk)
        qkv_forward(lc, tok, w, inp, r0, min_int(chunk, d.N - r0), ws);
    if (run_attention)
        be->attention_forward(be, ws->att, ws->lse, ws->q, ws->k, ws->v, tok->doc_start, tok->B,
                              tok->T, d.H, d.G, d.D);
    for (int r0 = 0; r0 < d.N; r0 += chunk) {
        int n = min_int(chunk, d.N - r0);
        void *h = row_at(lc, ws->h, r0, d.C);
        be->matmul_forward(be, h, row_at(lc, ws->att, r0, d.HD), w->o, w->o_bias, n, d.HD, d.C);
        be->add(be, h, h, row_at(lc, inp, r0, d.C), (size_t)n * d.C);
    }
}

/* hn, rstd2 (chunk rows) = rmsnorm(h) of the n tokens of h_rows. */
static void post_norm_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, const void *h_rows,
                              int n, mt_layer_ws *ws) {
    const mt_config *cfg = lc->cfg;
    lc->be->rmsnorm_forward(lc->be, ws->hn, ws->rstd2, h_rows, w->post_norm, n, cfg->C,
                            cfg->rms_norm_eps);
}

/* MLP up to the down projection's input for the n tokens of h_rows: fills hn, rstd2, gate, up,
 * act from their first row (the whole call, or one chunk of it). */
static void mlp_up_forward(const mt_layer_ctx *lc, const mt_layer_weights *w, const void *h_rows,
                           int n, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    post_norm_forward(lc, w, h_rows, n, ws);
    be->matmul_forward(be, ws->gate, ws->hn, w->gate, w->gate_bias, n, cfg->C, cfg->F);
    be->matmul_forward(be, ws->up, ws->hn, w->up, w->up_bias, n, cfg->C, cfg->F);
    be->swiglu_forward(be, ws->act, ws->gate, ws->up, (size_t)n * cfg->F);
}

void mt_layer_forward(const mt_layer_ctx *lc, const mt_tokens *tok, const mt_layer_weights *w,
                      const void *inp, void *out, mt_layer_ws *ws) {
    int N = tok->B * tok->T, C = lc->cfg->C;
    MT_CHECK(N <= ws->max_N, "layer workspace holds %d tokens, asked for %d", ws->max_N, N);
    mt_backend *be = lc->be;
    attention_block_forward(lc, tok, w, inp, ws, 1);
    /* out = h + down(act), chunk by chunk; inp is dead, so out may alias it */
    int chunk = chunk_rows(ws->mlp_chunk, N);
    for (int r0 = 0; r0 < N; r0 += chunk) {
        int n = min_int(chunk, N - r0);
        void *out_c = row_at(lc, out, r0, C);
        if (w->router) {
            post_norm_forward(lc, w, row_at(lc, ws->h, r0, C), n, ws);
            mt_moe_forward(lc, w, ws->hn, out_c, n, ws, 1);
        } else {
            mlp_up_forward(lc, w, row_at(lc, ws->h, r0, C), n, ws);
            be->matmul_forward(be, out_c, ws->act, w->down, w->down_bias, n, lc->cfg->F, C);
        }
        be->add(be, out_c, out_c, row_at(lc, ws->h, r0, C), (size_t)n * C);
    }
}

static float *f32(void *p) { return (float *)p; }

/* MLP backward for the n tokens from row r0, whose hn, rstd2, gate, up, act are in ws: the MLP
 * weight gradients accumulate, d_h rows r0.. = dout + rmsnorm2'(d_hn) (d_xn1 as scratch). d_h may
 * alias dout: a chunk reads its own rows of dout before it writes them. */
static void post_norm_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                               const mt_layer_weights *g, const void *dout_c, void *d_h_c, int r0,
                               int n, mt_layer_ws *ws);

static void mlp_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                         const mt_layer_weights *g, const void *dout, void *d_h, int r0, int n,
                         mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    int C = cfg->C, F = cfg->F;
    const void *dout_c = row_at(lc, dout, r0, C);
    void *d_h_c = row_at(lc, d_h, r0, C);
    be->matmul_backward(be, ws->d_act, f32(g->down), f32(g->down_bias), dout_c, ws->act, w->down,
                        n, F, C, 0);
    be->swiglu_backward(be, ws->d_gate, ws->d_up, ws->d_act, ws->gate, ws->up, (size_t)n * F);
    be->matmul_backward(be, ws->d_hn, f32(g->gate), f32(g->gate_bias), ws->d_gate, ws->hn, w->gate,
                        n, C, F, 0);
    be->matmul_backward(be, ws->d_hn, f32(g->up), f32(g->up_bias), ws->d_up, ws->hn, w->up, n, C,
                        F, 1);
    post_norm_backward(lc, w, g, dout_c, d_h_c, r0, n, ws);
}

/* From d_hn: d_h rows r0.. = dout + rmsnorm2'(d_hn) (d_xn1 as scratch), the post-norm gradient. */
static void post_norm_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                               const mt_layer_weights *g, const void *dout_c, void *d_h_c, int r0,
                               int n, mt_layer_ws *ws) {
    mt_backend *be = lc->be;
    int C = lc->cfg->C;
    be->rmsnorm_backward(be, ws->d_xn1, f32(g->post_norm), ws->d_hn, row_at(lc, ws->h, r0, C),
                         w->post_norm, ws->rstd2, n, C, 0);
    be->add(be, d_h_c, dout_c, ws->d_xn1, (size_t)n * C);
}

/* The MoE layer's MLP half for the n tokens from row r0: its block remade from h unless ws holds
 * this forward's (untiled MT_RECOMPUTE_NONE), then its backward into d_hn and the post norm's. */
static void moe_mlp_backward(const mt_layer_ctx *lc, const mt_layer_weights *w,
                             const mt_layer_weights *g, const void *dout, void *d_h, int r0, int n,
                             int remake, mt_layer_ws *ws) {
    int C = lc->cfg->C;
    if (remake) {
        post_norm_forward(lc, w, row_at(lc, ws->h, r0, C), n, ws);
        mt_moe_forward(lc, w, ws->hn, NULL, n, ws, 0);
    }
    const void *dout_c = row_at(lc, dout, r0, C);
    mt_moe_backward(lc, w, g, dout_c, ws->hn, ws->d_hn, n, ws);
    post_norm_backward(lc, w, g, dout_c, row_at(lc, d_h, r0, C), r0, n, ws);
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
    dims d = dims_of(cfg, n);
    void *dq = row_at(lc, ws->dq, r0, d.HD), *dk = row_at(lc, ws->dk, r0, d.GD);
    be->rope_backward(be, dq, tok->pos + r0, lc->inv_freq, n, d.H, d.D);
    be->rope_backward(be, dk, tok->pos + r0, lc->inv_freq, n, d.G, d.D);
    if (cfg->qk_norm) {
        be->rmsnorm_backward(be, ws->dq_raw, f32(g->q_norm), dq, ws->q_raw, w->q_norm, ws->q_rstd,
                             n * d.H, d.D, 0);
        be->rmsnorm_backward(be, ws->dk_raw, f32(g->k_norm), dk, ws->k_raw, w->k_norm, ws->k_rstd,
                             n * d.G, d.D, 0);
        dq = ws->dq_raw;
        dk = ws->dk_raw;
    }
    be->matmul_backward(be, ws->d_xn1, f32(g->q), f32(g->q_bias), dq, ws->xn1, w->q, n, d.C, d.HD,
                        0);
    be->matmul_backward(be, ws->d_xn1, f32(g->k), f32(g->k_bias), dk, ws->xn1, w->k, n, d.C, d.GD,
                        1);
    be->matmul_backward(be, ws->d_xn1, f32(g->v), f32(g->v_bias), row_at(lc, ws->dv, r0, d.GD),
                        ws->xn1, w->v, n, d.C, d.GD, 1);
    /* rmsnorm1' into the idle d_hn, then onto d_h: dinp = rmsnorm1'(d_xn1) + d_h */
    void *dinp_c = row_at(lc, dinp, r0, d.C);
    be->rmsnorm_backward(be, ws->d_hn, f32(g->input_norm), ws->d_xn1, row_at(lc, inp, r0, d.C),
                         w->input_norm, ws->rstd1, n, d.C, 0);
    be->add(be, dinp_c, ws->d_hn, dinp_c, (size_t)n * d.C);
}

void mt_layer_backward(const mt_layer_ctx *lc, const mt_tokens *tok, const mt_layer_weights *w,
                       const mt_layer_weights *g, const void *inp, const void *dout, void *dinp,
                       mt_layer_ws *ws, mt_recompute recompute) {
    mt_backend *be = lc->be;
    const mt_config *cfg = lc->cfg;
    dims d = dims_of(cfg, tok->B * tok->T);
    MT_CHECK(d.N <= ws->max_N, "layer workspace holds %d tokens, asked for %d", ws->max_N, d.N);
    int chunk = chunk_rows(ws->mlp_chunk, d.N), tiled = chunk < d.N;
    int remake = recompute == MT_RECOMPUTE_ALL || recompute == MT_RECOMPUTE_KEEP_ATTENTION;
    if (remake) attention_block_forward(lc, tok, w, inp, ws, recompute == MT_RECOMPUTE_ALL);

    /* MLP: out = h + down(act), chunk by chunk; a tiled MLP remakes every chunk from h. d_h, the
     * gradient of h, goes into dinp's rows (dout's rows are read first where they alias). */
    for (int r0 = 0; r0 < d.N; r0 += chunk) {
        int n = min_int(chunk, d.N - r0);
        if (w->router) {
            moe_mlp_backward(lc, w, g, dout, dinp, r0, n, tiled || recompute != MT_RECOMPUTE_NONE, ws);
            continue;
        }
        if (tiled || remake) {
            mlp_up_forward(lc, w, row_at(lc, ws->h, r0, d.C), n, ws);
        } else if (recompute == MT_RECOMPUTE_CHEAP) { /* gate and up are saved */
            be->rmsnorm_forward(be, ws->hn, ws->rstd2, row_at(lc, ws->h, r0, d.C), w->post_norm,
                                n, d.C, cfg->rms_norm_eps);
            be->swiglu_forward(be, ws->act, ws->gate, ws->up, (size_t)n * d.F);
        }
        mlp_backward(lc, w, g, dout, dinp, r0, n, ws);
    }

    /* attention: h = x + o(att), then the attention over all N tokens */
    for (int r0 = 0; r0 < d.N; r0 += chunk) {
        int n = min_int(chunk, d.N - r0);
        be->matmul_backward(be, row_at(lc, ws->d_att, r0, d.HD), f32(g->o), f32(g->o_bias),
                            row_at(lc, dinp, r0, d.C), row_at(lc, ws->att, r0, d.HD), w->o, n,
                            d.HD, d.C, 0);
    }
    be->attention_backward(be, ws->dq, ws->dk, ws->dv, ws->d_att, ws->att, ws->lse, ws->q, ws->k,
                           ws->v, tok->doc_start, tok->B, tok->T, d.H, d.G, d.D);

    /* the projections in: a tiled call remakes each chunk's xn1 (and qwen3's q_raw, k_raw and
     * their rstd, the normed heads into the dq_raw, dk_raw scratch they are about to become) */
    for (int r0 = 0; r0 < d.N; r0 += chunk) {
        int n = min_int(chunk, d.N - r0);
        if (tiled) {
            input_norm_forward(lc, w, inp, r0, n, ws);
            if (cfg->qk_norm) qk_norm_forward(lc, w, n, ws->dq_raw, ws->dk_raw, ws);
        } else if (recompute == MT_RECOMPUTE_CHEAP) { /* the forward's kernels on its inputs */
            input_norm_forward(lc, w, inp, r0, n, ws);
        }
        qkv_backward(lc, tok, w, g, inp, dinp, r0, n, ws);
    }
}
