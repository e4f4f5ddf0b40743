/* The layer's workspace: one table of fields drives its allocation, its byte counts and the
 * saved-internals views (model/layer.h). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/layer_internal.h"
#include "model/moe.h"

/* One list of (field, elements per token) drives the allocation, the free and the byte count. */
typedef struct {
    size_t offset; /* offsetof the pointer in mt_layer_ws */
    int per_token; /* elements per token */
    int is_f32;    /* fp32 statistic rather than compute dtype */
    int saved;     /* kept per layer when its backward skips the recompute (a chunk field only
                        when the call is untiled) */
    int chunk;     /* WS_CHUNK: one chunk of tokens when the call is tiled; WS_SPAN: one span of
                      the Gated DeltaNet mixer and its conv's ctx context rows */
    int ctx;
} ws_field;

enum { WS_WHOLE, WS_CHUNK, WS_SPAN };

#define WS(field) offsetof(mt_layer_ws, field)
#define WS_MAX_FIELDS 128 /* room for every list of ws_fields; it checks */

/* Appends the m fields of `list` to f (n of them so far). */
static void ws_append(ws_field *f, int *n, const ws_field *list, size_t m) {
    MT_CHECK(*n + (int)m <= WS_MAX_FIELDS, "layer workspace: more than %d fields", WS_MAX_FIELDS);
    for (size_t i = 0; i < m; i++) f[(*n)++] = list[i];
}

static int ws_fields(const mt_config *cfg, ws_field *f) {
    /* the widest layer's (gemma4's full layers have their own head dim and kv heads) */
    int C = cfg->C, HD = cfg->H * mt_config_max_head_dim(cfg), GD = mt_config_max_kv_width(cfg), n = 0;
    int G = mt_config_max_kv_heads(cfg);
    /* no dense MLP (nor a shared expert, which uses its fields): no room for one */
    int F = mt_config_moe_layers(cfg) == cfg->L && !cfg->shared_expert && !cfg->moe_beside_dense ? 0 : cfg->F;
    ws_field list[] = {
        {WS(xn1), C, 0, 0, 1},      {WS(q), HD, 0, 1, 0},    {WS(k), GD, 0, 1, 0},
        {WS(v), GD, 0, 1, 0},       {WS(att), HD, 0, 1, 0},  {WS(h), C, 0, 1, 0},
        {WS(hn), C, 0, 0, 1},       {WS(gate), F, 0, 1, 1},  {WS(up), F, 0, 1, 1},
        {WS(act), F, 0, 0, 1},      {WS(rstd1), 1, 1, 0, 1}, {WS(rstd2), 1, 1, 0, 1},
        {WS(lse), cfg->H, 1, 1, 0}, {WS(d_act), F, 0, 0, 1}, {WS(d_gate), F, 0, 0, 1},
        {WS(d_up), F, 0, 0, 1},     {WS(d_hn), C, 0, 0, 1},  {WS(d_xn1), C, 0, 0, 1},
        {WS(d_att), HD, 0, 0, 0},   {WS(dq), HD, 0, 0, 0},   {WS(dk), GD, 0, 0, 0},
        {WS(dv), GD, 0, 0, 0},
    };
    ws_append(f, &n, list, sizeof list / sizeof list[0]);
    if (cfg->qk_norm) {
        ws_field extra[] = {{WS(q_raw), HD, 0, 1, 1},      {WS(k_raw), GD, 0, 1, 1},
                            {WS(q_rstd), cfg->H, 1, 1, 1}, {WS(k_rstd), G, 1, 1, 1},
                            {WS(dq_raw), HD, 0, 0, 1},     {WS(dk_raw), GD, 0, 0, 1}};
        ws_append(f, &n, extra, sizeof extra / sizeof extra[0]);
    }
    if (cfg->v_norm) { /* gemma4: v_proj's output (or k_raw) before its norm, saved as k_raw */
        ws_field vn[] = {{WS(v_raw), GD, 0, 1, 1}, {WS(v_rstd), G, 1, 1, 1}, {WS(dv_raw), GD, 0, 0, 1}};
        ws_append(f, &n, vn, sizeof vn / sizeof vn[0]);
    }
    if (cfg->attn_gate) { /* the gate heads are saved: o_proj's input is remade from them */
        ws_field gated[] = {{WS(q_gate), 2 * HD, 0, 0, 1}, {WS(d_q_gate), 2 * HD, 0, 0, 1},
                            {WS(gate_att), HD, 0, 1, 0},   {WS(d_gate_att), HD, 0, 0, 0},
                            {WS(att_g), HD, 0, 0, 1}};
        ws_append(f, &n, gated, sizeof gated / sizeof gated[0]);
    }
    if (cfg->sandwich_norm) { /* the branch outputs before their norms: saved as o_proj's and down's */
        ws_field sandwich[] = {{WS(attn_o), C, 0, 1, 0}, {WS(rstd_ao), 1, 1, 1, 0},
                               {WS(mlp_y), C, 0, 1, 1},  {WS(rstd_mo), 1, 1, 1, 1}};
        ws_append(f, &n, sandwich, sizeof sandwich / sizeof sandwich[0]);
    }
    if (mt_config_mixer_layers(cfg, MT_MIXER_GATED_DELTANET) > 0) {
        int KD = cfg->lin_Hk * cfg->lin_Dk, VD = cfg->lin_Hv * cfg->lin_Dv, Ch = 2 * KD + VD;
        int Hk = cfg->lin_Hk, Hv = cfg->lin_Hv;
        int first = n; /* every field of the mixer holds a span when tiled (mixer_deltanet.c) */
        ws_field lin[] = {
            {WS(lin_xn), C, 0, 0, 0},         {WS(lin_d_xn), C, 0, 0, 0},
            {WS(lin_d_x), C, 0, 0, 0},        {WS(lin_rstd1), 1, 1, 0, 0},
            {WS(lin_qkv_pre), Ch, 0, 0, 0},   {WS(lin_qkv), Ch, 0, 0, 0},
            {WS(lin_d_qkv), Ch, 0, 0, 0},     {WS(lin_d_qkv_pre), Ch, 0, 0, 0},
            {WS(lin_rest), KD + VD, 0, 0, 0}, {WS(lin_d_rest), KD + VD, 0, 0, 0},
            {WS(lin_q_raw), KD, 0, 0, 0},     {WS(lin_k_raw), KD, 0, 0, 0},
            {WS(lin_q), KD, 0, 0, 0},         {WS(lin_k), KD, 0, 0, 0},
            {WS(lin_dq), KD, 0, 0, 0},        {WS(lin_dk), KD, 0, 0, 0},
            {WS(lin_dq_raw), KD, 0, 0, 0},    {WS(lin_dk_raw), KD, 0, 0, 0},
            {WS(lin_rq), Hk, 1, 0, 0},        {WS(lin_rk), Hk, 1, 0, 0},
            {WS(lin_v), VD, 0, 0, 0},         {WS(lin_dv), VD, 0, 0, 0},
            {WS(lin_z), VD, 0, 0, 0},         {WS(lin_d_z), VD, 0, 0, 0},
            {WS(lin_o), VD, 0, 0, 0},         {WS(lin_on), VD, 0, 0, 0},
            {WS(lin_d_o), VD, 0, 0, 0},       {WS(lin_d_on), VD, 0, 0, 0},
            {WS(lin_rstd), Hv, 1, 0, 0},      {WS(lin_a), Hv, 0, 0, 0},
            {WS(lin_b), Hv, 0, 0, 0},         {WS(lin_da), Hv, 0, 0, 0},
            {WS(lin_db), Hv, 0, 0, 0},        {WS(lin_g), Hv, 1, 0, 0},
            {WS(lin_beta), Hv, 1, 0, 0},      {WS(lin_dg), Hv, 1, 0, 0},
            {WS(lin_dbeta), Hv, 1, 0, 0},
        };
        ws_append(f, &n, lin, sizeof lin / sizeof lin[0]);
        for (int i = first; i < n; i++) f[i].chunk = WS_SPAN, f[i].ctx = cfg->lin_K - 1;
    }
    if (cfg->lora_rank > 0) { /* one adapter's x A^T and its gradient at a time (model/linear.h) */
        ws_field lora[] = {{WS(lora_u), cfg->lora_rank, 0, 0, 0}, {WS(lora_du), cfg->lora_rank, 0, 0, 0}};
        ws_append(f, &n, lora, sizeof lora / sizeof lora[0]);
    }
    if (cfg->n_experts > 0) { /* int32 fields count as 4-byte (is_f32) */
        int E = cfg->n_experts, k = cfg->top_k, kC = k * C, kF = k * cfg->moe_F;
        /* gpt-oss: moe_gate and moe_d_gate hold gate and up interleaved (2 Fe a row) */
        int kG = cfg->arch == MT_ARCH_GPT_OSS || cfg->moe_beside_dense ? 2 * kF : kF; /* gemma4: too */
        ws_field moe[] = {
            {WS(moe_logits), E, 0, 0, 1},  {WS(moe_d_logits), E, 0, 0, 1},
            {WS(moe_probs), E, 1, 0, 1},   {WS(moe_idx), k, 1, 0, 1},
            {WS(moe_w), k, 1, 0, 1},       {WS(moe_dw), k, 1, 0, 1},
            {WS(moe_perm), k, 1, 0, 1},    {WS(moe_inv), k, 1, 0, 1},
            {WS(moe_x), kC, 0, 0, 1},      {WS(moe_y), kC, 0, 0, 1},
            {WS(moe_gate), kG, 0, 0, 1},   {WS(moe_up), kF, 0, 0, 1},
            {WS(moe_act), kF, 0, 0, 1},    {WS(moe_d_y), kC, 0, 0, 1},
            {WS(moe_d_x), kC, 0, 0, 1},    {WS(moe_d_act), kF, 0, 0, 1},
            {WS(moe_d_gate), kG, 0, 0, 1}, {WS(moe_d_up), kF, 0, 0, 1},
        };
        ws_append(f, &n, moe, sizeof moe / sizeof moe[0]);
        if (cfg->lora_rank > 0 && cfg->arch == MT_ARCH_GPT_OSS) { /* adapters on the experts */
            int kr = k * cfg->lora_rank;
            ws_field lora_moe[] = {{WS(lora_moe_u), kr, 0, 0, 1}, {WS(lora_moe_du), kr, 0, 0, 1}};
            ws_append(f, &n, lora_moe, sizeof lora_moe / sizeof lora_moe[0]);
        }
        if (cfg->moe_beside_dense) { /* gemma4 */
            ws_field g4[] = {
                {WS(g4_y1), C, 0, 0, 1},      {WS(g4_y2), C, 0, 0, 1},      {WS(g4_y2n), C, 0, 0, 1},
                {WS(g4_rx), C, 0, 0, 1},      {WS(g4_x2), C, 0, 0, 1},      {WS(g4_d1), C, 0, 0, 1},
                {WS(g4_d2), C, 0, 0, 1},      {WS(g4_d3), C, 0, 0, 1},      {WS(g4_rstd1), 1, 1, 0, 1},
                {WS(g4_rstd2), 1, 1, 0, 1},   {WS(g4_rstd_rx), 1, 1, 0, 1}, {WS(g4_rstd_x2), 1, 1, 0, 1},
                {WS(g4_w), k, 1, 0, 1},       {WS(g4_dw), k, 1, 0, 1},      {WS(g4_gate), kF, 0, 0, 1},
                {WS(g4_d_gate), kF, 0, 0, 1},
            };
            ws_append(f, &n, g4, sizeof g4 / sizeof g4[0]);
        }
        if (cfg->shared_expert) {
            ws_field shared[] = {{WS(shared_y), C, 0, 0, 1},     {WS(shared_g), C, 0, 0, 1},
                                 {WS(shared_logit), 1, 0, 0, 1}, {WS(d_shared_logit), 1, 0, 0, 1}};
            ws_append(f, &n, shared, sizeof shared / sizeof shared[0]);
        }
    }
    return n;
}

static size_t field_bytes(const ws_field *f, mt_dtype dtype, int rows) {
    size_t elem = f->is_f32 ? 4 : mt_dtype_size(dtype);
    size_t bytes = (size_t)rows * (size_t)f->per_token * elem;
    return (bytes + 255) / 256 * 256;
}

/* Rows a workspace for max_N tokens gives field f. */
static int ws_rows(const ws_field *f, int max_N, int chunk) {
    int rows = mt_layer_chunk_rows(chunk, max_N);
    if (f->chunk == WS_WHOLE || rows == max_N) return max_N;
    if (f->chunk == WS_CHUNK) return rows;
    rows = mt_lin_span_tokens(rows) + f->ctx;
    return rows < max_N ? rows : max_N;
}

/* Whether field f is saved for a call over N tokens (a chunk field only when untiled). */
static int is_saved(const ws_field *f, int N, int chunk) {
    return f->saved && !(f->chunk && mt_layer_chunk_rows(chunk, N) < N);
}

/* The fields' bytes (the chunk states aside). */
static size_t fields_bytes(const mt_config *cfg, mt_dtype dtype, int max_N, int mlp_chunk) {
    ws_field f[WS_MAX_FIELDS];
    int n = ws_fields(cfg, f);
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += field_bytes(&f[i], dtype, ws_rows(&f[i], max_N, mlp_chunk));
    return total;
}

/* The delta rule's states (mt_lin_states): Dk x Dv fp32 a value head, none without DeltaNet
 * layers. */
static size_t states_bytes(const mt_config *cfg, size_t states) {
    if (mt_config_mixer_layers(cfg, MT_MIXER_GATED_DELTANET) == 0) return 0;
    return states * mt_lin_state_floats(cfg) * sizeof(float);
}

static size_t chunks_of(size_t T) { return (T + MT_GATED_DELTA_CHUNK - 1) / MT_GATED_DELTA_CHUNK; }

/* A tiled call's states beside one span's chunk states (mixer_deltanet.c): `spans` saved span
 * starts, the two gradients between spans, and the conv's K-1 context rows (compute dtype). */
static size_t span_extra_bytes(const mt_config *cfg, mt_dtype dtype, size_t spans) {
    if (mt_config_mixer_layers(cfg, MT_MIXER_GATED_DELTANET) == 0) return 0;
    return states_bytes(cfg, spans + 2) + mt_lin_conv_tail_bytes(cfg, dtype);
}

size_t mt_layer_ws_bytes_tiled(const mt_config *cfg, mt_dtype dtype, int max_N, int mlp_chunk) {
    size_t fields = fields_bytes(cfg, dtype, max_N, mlp_chunk);
    int rows = mt_layer_chunk_rows(mlp_chunk, max_N);
    /* untiled: states counted for rows of at least 64 tokens (a row's last chunk may be partial:
     * one more chunk a row, bounded by rows of 64) */
    if (rows == max_N) return fields + states_bytes(cfg, 2 * chunks_of((size_t)max_N));
    /* tiled: one span's chunks (a span of a whole row: no more), and at most N / span saved
     * starts (a row of T has ceil(T / span) - 1 of them, each after a full span) */
    size_t span = (size_t)mt_lin_span_tokens(rows);
    return fields + states_bytes(cfg, chunks_of(span)) +
           span_extra_bytes(cfg, dtype, (size_t)max_N / span);
}

size_t mt_layer_ws_bytes_rows(const mt_config *cfg, mt_dtype dtype, int B, int T, int mlp_chunk) {
    size_t fields = fields_bytes(cfg, dtype, B * T, mlp_chunk);
    int N = B * T, rows = mt_layer_chunk_rows(mlp_chunk, N);
    if (rows == N) return fields + states_bytes(cfg, (size_t)B * chunks_of((size_t)T));
    size_t span = (size_t)mt_lin_span_tokens(rows);
    if (span > (size_t)T) span = (size_t)T;
    size_t per_row = ((size_t)T + span - 1) / span;
    return fields + states_bytes(cfg, chunks_of(span)) +
           span_extra_bytes(cfg, dtype, (size_t)B * (per_row - 1));
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
    if (mt_layer_backend_check(lc->cfg, lc->be) != MT_OK)
        mt_fatal(__FILE__, __LINE__, "%s", mt_error_message());
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
    if (mt_config_mixer_layers(lc->cfg, MT_MIXER_GATED_DELTANET) > 0)
        ws->lin_states = mt_calloc(1, sizeof *ws->lin_states);
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
    if (ws->lin_states) {
        mt_lin_states *st = ws->lin_states;
        void *bufs[] = {st->p, st->spans, st->dstates, st->conv_tail};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) lc->be->free(lc->be, bufs[i]);
        free(ws->lin_states);
    }
    ws->lin_states = NULL;
}
