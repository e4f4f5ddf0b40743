/* The parameter table (layout, names, lookup, views) and the random init. */
#include "model/params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* Hugging Face name suffix of each per-layer kind (after "model.layers.{i}."). */
static const char *const mt_layer_suffix[MT_LAYER_KINDS] = {
    [MT_W_INPUT_NORM] = "input_layernorm.weight",
    [MT_W_Q] = "self_attn.q_proj.weight",
    [MT_W_Q_BIAS] = "self_attn.q_proj.bias",
    [MT_W_K] = "self_attn.k_proj.weight",
    [MT_W_K_BIAS] = "self_attn.k_proj.bias",
    [MT_W_V] = "self_attn.v_proj.weight",
    [MT_W_V_BIAS] = "self_attn.v_proj.bias",
    [MT_W_O] = "self_attn.o_proj.weight",
    [MT_W_O_BIAS] = "self_attn.o_proj.bias",
    [MT_W_Q_NORM] = "self_attn.q_norm.weight",
    [MT_W_K_NORM] = "self_attn.k_norm.weight",
    [MT_W_POST_NORM] = "post_attention_layernorm.weight",
    [MT_W_GATE] = "mlp.gate_proj.weight",
    [MT_W_GATE_BIAS] = "mlp.gate_proj.bias",
    [MT_W_UP] = "mlp.up_proj.weight",
    [MT_W_UP_BIAS] = "mlp.up_proj.bias",
    [MT_W_DOWN] = "mlp.down_proj.weight",
    [MT_W_DOWN_BIAS] = "mlp.down_proj.bias",
};

#define MT_LAYER_PREFIX "model.layers."

static int64_t align_up(int64_t n) { return (n + MT_PARAM_ALIGN - 1) / MT_PARAM_ALIGN * MT_PARAM_ALIGN; }

/* Shape (rows, cols; cols 0 for vectors) of a per-layer kind, or rows 0 when the model lacks it. */
static void layer_kind_shape(const mt_config *c, mt_param_kind k, int64_t *rows, int64_t *cols) {
    int64_t C = c->C, F = c->F, QD = (int64_t)c->H * c->D, KD = (int64_t)c->G * c->D;
    *cols = 0;
    switch (k) {
    case MT_W_INPUT_NORM: case MT_W_POST_NORM: *rows = C; break;
    case MT_W_Q: *rows = QD; *cols = C; break;
    case MT_W_K: case MT_W_V: *rows = KD; *cols = C; break;
    case MT_W_O: *rows = C; *cols = QD; break;
    case MT_W_Q_BIAS: *rows = c->qkv_bias ? QD : 0; break;
    case MT_W_K_BIAS: case MT_W_V_BIAS: *rows = c->qkv_bias ? KD : 0; break;
    case MT_W_O_BIAS: *rows = c->o_bias ? C : 0; break;
    case MT_W_Q_NORM: case MT_W_K_NORM: *rows = c->qk_norm ? c->D : 0; break;
    case MT_W_GATE: case MT_W_UP: *rows = F; *cols = C; break;
    case MT_W_DOWN: *rows = C; *cols = F; break;
    case MT_W_GATE_BIAS: case MT_W_UP_BIAS: *rows = c->mlp_bias ? F : 0; break;
    case MT_W_DOWN_BIAS: *rows = c->mlp_bias ? C : 0; break;
    default: MT_CHECK(0, "not a layer kind: %d", (int)k);
    }
}

/* Appends one tensor at the next aligned offset of its group; *group_pos advances. */
static void table_add(mt_param_table *t, mt_param_kind kind, int layer, const char *name,
                      int64_t rows, int64_t cols, int64_t group_start, int64_t *group_pos) {
    mt_param *p = &t->params[t->n_params++];
    memset(p, 0, sizeof *p);
    MT_CHECK(strlen(name) < sizeof p->name, "tensor name too long: %s", name);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->kind = kind;
    p->layer = layer;
    p->ndim = cols ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols;
    p->numel = cols ? rows * cols : rows;
    p->group_offset = *group_pos;
    p->offset = group_start + *group_pos;
    *group_pos = align_up(*group_pos + p->numel);
    t->n_real += p->numel;
}

void mt_param_table_init(mt_param_table *t, const mt_config *cfg) {
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    int per_layer = 0;
    for (int k = 0; k < MT_LAYER_KINDS; k++) {
        int64_t rows, cols;
        layer_kind_shape(cfg, (mt_param_kind)k, &rows, &cols);
        per_layer += rows > 0;
    }
    t->params = mt_calloc((size_t)cfg->L * per_layer + 3, sizeof(mt_param));
    int64_t C = cfg->C, V = cfg->V, pos = 0;
    char name[128];

    t->embed_offset = 0;
    table_add(t, MT_W_EMBED, MT_GROUP_EMBED, "model.embed_tokens.weight", V, C, 0, &pos);
    t->embed_size = pos;

    t->layer_offset0 = t->embed_offset + t->embed_size;
    for (int k = 0; k < MT_LAYER_KINDS; k++) t->layer_kind_offset[k] = -1;
    for (int l = 0; l < cfg->L; l++) {
        int64_t start = t->layer_offset0 + (int64_t)l * t->layer_size;
        pos = 0;
        for (int k = 0; k < MT_LAYER_KINDS; k++) {
            int64_t rows, cols;
            layer_kind_shape(cfg, (mt_param_kind)k, &rows, &cols);
            if (rows == 0) continue;
            snprintf(name, sizeof name, MT_LAYER_PREFIX "%d.%s", l, mt_layer_suffix[k]);
            if (l == 0) t->layer_kind_offset[k] = pos;
            table_add(t, (mt_param_kind)k, l, name, rows, cols, start, &pos);
        }
        if (l == 0) t->layer_size = pos; /* every layer has layer 0's layout */
    }

    t->head_offset = t->layer_offset0 + (int64_t)cfg->L * t->layer_size;
    pos = 0;
    table_add(t, MT_W_FINAL_NORM, cfg->L, "model.norm.weight", C, 0, t->head_offset, &pos);
    if (!cfg->tie_word_embeddings)
        table_add(t, MT_W_LM_HEAD, cfg->L, "lm_head.weight", V, C, t->head_offset, &pos);
    t->head_size = pos;
    t->total = t->head_offset + t->head_size;
}

void mt_param_table_free(mt_param_table *t) {
    free(t->params);
    memset(t, 0, sizeof *t);
}

/* Names are structured, so lookup parses them instead of keeping an index:
 * "model.layers.{l}.{suffix}" maps to l * per_layer + rank(suffix) after the embed entry. */
const mt_param *mt_param_find(const mt_param_table *t, const char *name) {
    if (!name || t->n_params == 0) return NULL;
    const mt_param *hit = NULL;
    size_t plen = strlen(MT_LAYER_PREFIX);
    if (strncmp(name, MT_LAYER_PREFIX, plen) == 0) {
        const char *s = name + plen;
        if (*s < '0' || *s > '9') return NULL;
        char *end;
        long l = strtol(s, &end, 10);
        if (*end != '.' || l < 0 || l >= t->cfg.L) return NULL;
        int rank = 0, per_layer = 0, found = -1;
        for (int k = 0; k < MT_LAYER_KINDS; k++) {
            if (t->layer_kind_offset[k] < 0) continue;
            if (strcmp(end + 1, mt_layer_suffix[k]) == 0) found = rank;
            rank++;
        }
        per_layer = rank;
        if (found < 0) return NULL;
        hit = &t->params[1 + l * per_layer + found];
    } else {
        /* embed first, head group last */
        if (strcmp(name, t->params[0].name) == 0) return &t->params[0];
        for (int i = t->n_params - 1; i >= 0 && t->params[i].layer == t->cfg.L; i--)
            if (strcmp(name, t->params[i].name) == 0) return &t->params[i];
        return NULL;
    }
    return strcmp(hit->name, name) == 0 ? hit : NULL; /* rejects e.g. "model.layers.01.…" */
}

int64_t mt_group_offset(const mt_param_table *t, int layer) {
    MT_CHECK(layer >= MT_GROUP_EMBED && layer <= t->cfg.L, "group %d of %d layers", layer, t->cfg.L);
    if (layer == MT_GROUP_EMBED) return t->embed_offset;
    if (layer == t->cfg.L) return t->head_offset;
    return t->layer_offset0 + (int64_t)layer * t->layer_size;
}

int64_t mt_group_size(const mt_param_table *t, int layer) {
    MT_CHECK(layer >= MT_GROUP_EMBED && layer <= t->cfg.L, "group %d of %d layers", layer, t->cfg.L);
    if (layer == MT_GROUP_EMBED) return t->embed_size;
    if (layer == t->cfg.L) return t->head_size;
    return t->layer_size;
}

int64_t mt_group_max_size(const mt_param_table *t) {
    int64_t g = t->layer_size;
    if (t->embed_size > g) g = t->embed_size;
    if (t->head_size > g) g = t->head_size;
    return g;
}

static void *at(void *base, int64_t off, size_t elem_size) {
    return off < 0 ? NULL : (char *)base + (size_t)off * elem_size;
}

mt_layer_view mt_layer_view_of(const mt_param_table *t, void *layer_base, size_t elem_size) {
    const int64_t *o = t->layer_kind_offset;
    mt_layer_view v = {
        .input_norm = at(layer_base, o[MT_W_INPUT_NORM], elem_size),
        .q = at(layer_base, o[MT_W_Q], elem_size),
        .q_bias = at(layer_base, o[MT_W_Q_BIAS], elem_size),
        .k = at(layer_base, o[MT_W_K], elem_size),
        .k_bias = at(layer_base, o[MT_W_K_BIAS], elem_size),
        .v = at(layer_base, o[MT_W_V], elem_size),
        .v_bias = at(layer_base, o[MT_W_V_BIAS], elem_size),
        .o = at(layer_base, o[MT_W_O], elem_size),
        .o_bias = at(layer_base, o[MT_W_O_BIAS], elem_size),
        .q_norm = at(layer_base, o[MT_W_Q_NORM], elem_size),
        .k_norm = at(layer_base, o[MT_W_K_NORM], elem_size),
        .post_norm = at(layer_base, o[MT_W_POST_NORM], elem_size),
        .gate = at(layer_base, o[MT_W_GATE], elem_size),
        .gate_bias = at(layer_base, o[MT_W_GATE_BIAS], elem_size),
        .up = at(layer_base, o[MT_W_UP], elem_size),
        .up_bias = at(layer_base, o[MT_W_UP_BIAS], elem_size),
        .down = at(layer_base, o[MT_W_DOWN], elem_size),
        .down_bias = at(layer_base, o[MT_W_DOWN_BIAS], elem_size),
    };
    return v;
}

mt_model_view mt_model_view_of(const mt_param_table *t, void *arena_base, size_t elem_size) {
    mt_model_view v = {NULL, NULL, NULL};
    for (int i = 0; i < t->n_params; i++) { /* a few thousand entries at most: cheap */
        const mt_param *p = &t->params[i];
        if (p->kind == MT_W_EMBED) v.embed = at(arena_base, p->offset, elem_size);
        if (p->kind == MT_W_FINAL_NORM) v.final_norm = at(arena_base, p->offset, elem_size);
        if (p->kind == MT_W_LM_HEAD) v.lm_head = at(arena_base, p->offset, elem_size);
    }
    if (!v.lm_head) v.lm_head = v.embed; /* tied */
    return v;
}

/* ---- init ---- */

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Counter-based normals: pair j of a tensor depends only on (tensor key, j), so the values do
 * not depend on how the loop is split among threads. Marsaglia's polar method (one log and one
 * sqrt per pair, no sin/cos: ~2x faster than Box-Muller); a rejected draw retries with the next
 * counter of the same pair, so determinism is kept. */
static void fill_normal(float *x, int64_t n, float std, uint64_t key) {
    const double scale = 1.0 / 2147483648.0; /* 32-bit halves to [-1, 1) */
    int64_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t j = 0; j < pairs; j++) {
        double u, v, s;
        uint64_t ctr = (uint64_t)j << 8; /* 256 attempts per pair; P(reject) = 0.215 */
        do {
            uint64_t h = splitmix64(key ^ splitmix64(ctr++));
            u = (double)(int32_t)(uint32_t)(h >> 32) * scale;
            v = (double)(int32_t)(uint32_t)h * scale;
            s = u * u + v * v;
        } while (s >= 1.0 || s == 0.0);
        double f = sqrt(-2.0 * log(s) / s) * std;
        x[2 * j] = (float)(u * f);
        if (2 * j + 1 < n) x[2 * j + 1] = (float)(v * f);
    }
}

static void fill_const(float *x, int64_t n, float v) {
#pragma omp parallel for schedule(static) if (n > (1 << 18))
    for (int64_t i = 0; i < n; i++) x[i] = v;
}

static int kind_is_norm(mt_param_kind k) {
    return k == MT_W_INPUT_NORM || k == MT_W_POST_NORM || k == MT_W_Q_NORM || k == MT_W_K_NORM ||
           k == MT_W_FINAL_NORM;
}

void mt_param_init_tensor(const mt_param_table *t, int i, float *x, float std, uint64_t seed) {
    const mt_param *p = &t->params[i];
    if (kind_is_norm(p->kind)) {
        fill_const(x, p->numel, 1.0f);
    } else if (p->ndim == 1) {
        fill_const(x, p->numel, 0.0f); /* biases */
    } else {
        float resid = std / sqrtf(2.0f * (float)t->cfg.L);
        float s = (p->kind == MT_W_O || p->kind == MT_W_DOWN) ? resid : std;
        fill_normal(x, p->numel, s, splitmix64(seed ^ splitmix64(0x6d74ull + (uint64_t)i)));
    }
}

void mt_param_init(const mt_param_table *t, float *arena, float std, uint64_t seed) {
    int64_t end = 0; /* end of the previous tensor: the gap up to the next one is padding */
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        fill_const(arena + end, p->offset - end, 0.0f);
        mt_param_init_tensor(t, i, arena + p->offset, std, seed);
        end = p->offset + p->numel;
    }
    fill_const(arena + end, t->total - end, 0.0f);
}
