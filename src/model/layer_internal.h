/* What the layer's files share (model/layer.c, layer_ws.c, mixer_attention.c): the dimensions
 * of a call, row addressing, chunking. Internal to model/. */
#ifndef MT_LAYER_INTERNAL_H
#define MT_LAYER_INTERNAL_H

#include "model/layer.h"

typedef struct {
    int N, C, F, H, G, D, HD, GD;
} mt_layer_dims;

static inline mt_layer_dims mt_layer_dims_of(const mt_config *cfg, int N) {
    mt_layer_dims d = {N, cfg->C, cfg->F, cfg->H, cfg->G, cfg->D, cfg->H * cfg->D, cfg->G * cfg->D};
    return d;
}

/* The dims of an attention layer whose weights are w: its own head dim and kv heads where the
 * view says (Gemma 4's full layers), else the config's. */
static inline mt_layer_dims mt_layer_dims_at(const mt_config *cfg, const mt_layer_view *w, int N) {
    int D = w->head_dim ? w->head_dim : cfg->D, G = w->kv_heads ? w->kv_heads : cfg->G;
    mt_layer_dims d = {N, cfg->C, cfg->F, cfg->H, G, D, cfg->H * D, G * D};
    return d;
}

/* A call over N tokens runs its per-token ops in chunks of this many tokens; N when untiled. */
static inline int mt_layer_chunk_rows(int chunk, int N) {
    return chunk > 0 && chunk < N ? chunk : N;
}

/* Tokens a span of the Gated DeltaNet mixer covers when a call is tiled into chunks of `chunk`
 * tokens (mixer_deltanet.c): the chunk, but at least one of the delta rule's chunks, so that a
 * span's conv context (K-1 <= 64 tokens) lies in the span before. */
static inline int mt_lin_span_tokens(int chunk) {
    return chunk > MT_GATED_DELTA_CHUNK ? chunk : MT_GATED_DELTA_CHUNK;
}

/* Floats of one delta-rule state of every value head (Hv x Dk x Dv). */
static inline size_t mt_lin_state_floats(const mt_config *cfg) {
    return (size_t)cfg->lin_Hv * cfg->lin_Dk * cfg->lin_Dv;
}

/* Bytes of the conv's context-row gradients carried between spans: K-1 rows (at least one) of
 * the conv's 2 Hk Dk + Hv Dv channels in the compute dtype. */
static inline size_t mt_lin_conv_tail_bytes(const mt_config *cfg, mt_dtype dtype) {
    size_t Ch = 2 * (size_t)cfg->lin_Hk * cfg->lin_Dk + (size_t)cfg->lin_Hv * cfg->lin_Dv;
    return (size_t)(cfg->lin_K > 1 ? cfg->lin_K - 1 : 1) * Ch * mt_dtype_size(dtype);
}

/* Row r0 of a token-major (N, width) tensor of the compute dtype. */
static inline void *mt_layer_row(const mt_layer_ctx *lc, const void *base, int r0, int width) {
    return (char *)base + (size_t)r0 * (size_t)width * mt_dtype_size(lc->be->dtype);
}

static inline int mt_min_int(int a, int b) { return a < b ? a : b; }

/* What the layer's RMSNorms add to their weights (1 for the (1 + w) norms). */
static inline float mt_layer_norm_offset(const mt_layer_ctx *lc) {
    return mt_config_norm_offset(lc->cfg);
}

static inline float *mt_f32(void *p) { return (float *)p; }

/* The attention mixer (mixer_attention.c): h = inp + o_proj(attention(q, k, v of rmsnorm(inp))).
 * The forward fills q, k, v, att, lse and h (and, untiled, the chunk rows of the last chunk);
 * without run_attention, att and lse are this forward's already (saved attention). */
void mt_attention_mixer_forward(const mt_layer_ctx *lc, const mt_tokens *tok,
                                const mt_layer_weights *w, const void *inp, mt_layer_ws *ws,
                                int run_attention);
/* Its backward, with the gradient of h in dinp's rows: dinp = d_h + the mixer's gradient through
 * the input norm; the weight gradients accumulate. ws holds the forward's q, k, v, att, lse (and
 * what `recompute` says of the chunk rows). */
void mt_attention_mixer_backward(const mt_layer_ctx *lc, const mt_tokens *tok,
                                 const mt_layer_weights *w, const mt_layer_weights *g,
                                 const void *inp, void *dinp, mt_layer_ws *ws,
                                 mt_recompute recompute);

/* The Gated DeltaNet mixer (mixer_deltanet.c): the same contract over its own fields (lin_*). */
void mt_deltanet_mixer_forward(const mt_layer_ctx *lc, const mt_tokens *tok,
                               const mt_layer_weights *w, const void *inp, mt_layer_ws *ws);
/* Its backward expects ws to hold this forward (the layer remakes it first when needed). */
void mt_deltanet_mixer_backward(const mt_layer_ctx *lc, const mt_tokens *tok,
                                const mt_layer_weights *w, const mt_layer_weights *g,
                                const void *inp, void *dinp, mt_layer_ws *ws);

#endif
