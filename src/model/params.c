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
    [MT_W_LIN_QKV] = "linear_attn.in_proj_qkv.weight",
    [MT_W_LIN_Z] = "linear_attn.in_proj_z.weight",
    [MT_W_LIN_B] = "linear_attn.in_proj_b.weight",
    [MT_W_LIN_A] = "linear_attn.in_proj_a.weight",
    [MT_W_LIN_CONV] = "linear_attn.conv1d.weight",
    [MT_W_LIN_DT_BIAS] = "linear_attn.dt_bias",
    [MT_W_LIN_A_LOG] = "linear_attn.A_log",
    [MT_W_LIN_NORM] = "linear_attn.norm.weight",
    [MT_W_LIN_OUT] = "linear_attn.out_proj.weight",
    [MT_W_SHARED_GATE] = "mlp.shared_expert_gate.weight",
    [MT_W_SINKS] = "self_attn.sinks",
    [MT_W_ROUTER_BIAS] = "mlp.router.bias",
    [MT_W_EXP_GATE_UP] = "mlp.experts.gate_up_proj",
    [MT_W_EXP_GATE_UP_BIAS] = "mlp.experts.gate_up_proj_bias",
    [MT_W_EXP_DOWN_IO] = "mlp.experts.down_proj",
    [MT_W_EXP_DOWN_BIAS] = "mlp.experts.down_proj_bias",
    [MT_W_ATTN_OUT_NORM] = "post_attention_layernorm.weight",
    [MT_W_MLP_OUT_NORM] = "post_feedforward_layernorm.weight",
    [MT_W_LAYER_SCALAR] = "layer_scalar",
    [MT_W_ROUTER_SCALE] = "router.scale",
    [MT_W_EXPERT_SCALE] = "router.per_expert_scale",
    [MT_W_EXP_GATE_UP_OI] = "experts.gate_up_proj",
    [MT_W_EXP_DOWN_OI] = "experts.down_proj",
    [MT_W_PRE_NORM_2] = "pre_feedforward_layernorm_2.weight",
    [MT_W_MLP_OUT_NORM_1] = "post_feedforward_layernorm_1.weight",
    [MT_W_MLP_OUT_NORM_2] = "post_feedforward_layernorm_2.weight",
};

/* A per-layer kind's name suffix: gemma3's MLP input norm is pre_feedforward_layernorm (its
 * post_attention_layernorm norms the attention's output). */
static const char *layer_suffix(const mt_config *c, mt_param_kind k) {
    if (k == MT_W_POST_NORM && c->sandwich_norm) return "pre_feedforward_layernorm.weight";
    return mt_layer_suffix[k];
}

/* The shared expert's names (qwen3_5_moe) for the dense MLP kinds in an MoE layer. */
static const char *shared_suffix(mt_param_kind k) {
    switch (k) {
    case MT_W_GATE: return "mlp.shared_expert.gate_proj.weight";
    case MT_W_UP: return "mlp.shared_expert.up_proj.weight";
    case MT_W_DOWN: return "mlp.shared_expert.down_proj.weight";
    default: MT_CHECK(0, "not a shared expert kind: %d", (int)k);
    }
}

/* The MoE kinds' names (after "model.layers.{i}."), per model_type; %d is the expert. */
static const char *moe_suffix(const mt_config *c, mt_param_kind k) {
    int mix = c->arch == MT_ARCH_MIXTRAL;
    switch (k) {
    case MT_W_ROUTER:
        if (c->arch == MT_ARCH_GPT_OSS) return "mlp.router.weight";
        if (c->moe_beside_dense) return "router.proj.weight"; /* gemma4 */
        return mix ? "block_sparse_moe.gate.weight" : "mlp.gate.weight";
    case MT_W_EXP_GATE: return mix ? "block_sparse_moe.experts.%d.w1.weight" : "mlp.experts.%d.gate_proj.weight";
    case MT_W_EXP_UP: return mix ? "block_sparse_moe.experts.%d.w3.weight" : "mlp.experts.%d.up_proj.weight";
    case MT_W_EXP_DOWN: return mix ? "block_sparse_moe.experts.%d.w2.weight" : "mlp.experts.%d.down_proj.weight";
    default: MT_CHECK(0, "not an MoE kind: %d", (int)k);
    }
}

/* gemma4's MoE block's own kinds */
static int kind_is_gemma4_moe(mt_param_kind k) { return k >= MT_W_ROUTER_SCALE && k <= MT_W_MLP_OUT_NORM_2; }
static int kind_is_moe(mt_param_kind k) {
    return (k >= MT_W_ROUTER && k <= MT_W_EXP_DOWN) || k == MT_W_SHARED_GATE ||
           (k >= MT_W_ROUTER_BIAS && k <= MT_W_EXP_DOWN_BIAS) || kind_is_gemma4_moe(k);
}
/* gpt-oss's own kinds; its experts take these instead of the per-expert ones */
static int kind_is_gpt_oss(mt_param_kind k) { return k >= MT_W_SINKS && k <= MT_W_EXP_DOWN_BIAS; }
static int kind_is_per_expert(mt_param_kind k) { return k >= MT_W_EXP_GATE && k <= MT_W_EXP_DOWN; }
static int kind_is_dense_mlp(mt_param_kind k) { return k >= MT_W_GATE && k <= MT_W_DOWN_BIAS; }
static int kind_is_attention(mt_param_kind k) { return (k >= MT_W_Q && k <= MT_W_K_NORM) || k == MT_W_SINKS; }
static int kind_is_deltanet(mt_param_kind k) { return k >= MT_W_LIN_QKV && k <= MT_W_LIN_OUT; }

int mt_layer_type_of(const mt_config *cfg, int l) {
    int global = cfg->global_D > 0 && mt_config_layer_window(cfg, l) == 0; /* gemma4's full layers */
    return 4 * global + 2 * (mt_config_layer_mixer(cfg, l) == MT_MIXER_GATED_DELTANET) +
           mt_config_layer_is_moe(cfg, l);
}

#define MT_LAYER_PREFIX "model.layers."

static int64_t align_up(int64_t n) { return (n + MT_PARAM_ALIGN - 1) / MT_PARAM_ALIGN * MT_PARAM_ALIGN; }

/* Shape (rows, cols, depth; cols 0 for vectors, depth 0 below rank 3) of a per-layer kind in a
 * layer of type `type` (mt_layer_type_of), or rows 0 when such a layer lacks it. */
static void layer_kind_shape(const mt_config *c, int type, mt_param_kind k, int64_t *rows, int64_t *cols,
                             int64_t *depth) {
    int moe = type & 1, deltanet = (type >> 1) & 1, global = type >> 2;
    int64_t D = global ? c->global_D : c->D, G = global ? c->global_G : c->G; /* gemma4's full layers */
    int64_t C = c->C, F = c->F, QD = (int64_t)c->H * D, KD = G * D;
    int64_t Hv = c->lin_Hv, VD = (int64_t)c->lin_Hv * c->lin_Dv;
    int64_t Ch = 2 * (int64_t)c->lin_Hk * c->lin_Dk + VD;
    *cols = 0;
    *rows = 0;
    *depth = 0;
    if (moe ? kind_is_dense_mlp(k) && !c->shared_expert && !c->moe_beside_dense : kind_is_moe(k)) return;
    if (moe && kind_is_dense_mlp(k) && (k == MT_W_GATE_BIAS || k == MT_W_UP_BIAS || k == MT_W_DOWN_BIAS))
        return; /* the shared expert has no biases */
    if (k == MT_W_SHARED_GATE && !c->shared_expert) return;
    if (deltanet ? kind_is_attention(k) : kind_is_deltanet(k)) return;
    if (global && c->k_eq_v && (k == MT_W_V || k == MT_W_V_BIAS)) return; /* values from k_proj */
    int oss = c->arch == MT_ARCH_GPT_OSS, g4 = c->moe_beside_dense;
    if (oss ? kind_is_per_expert(k) : kind_is_gpt_oss(k)) return;
    if (g4 ? kind_is_per_expert(k) : kind_is_gemma4_moe(k)) return; /* gemma4: its fused experts */
    int64_t E = c->n_experts, Fe = c->moe_F;
    switch (k) {
    case MT_W_INPUT_NORM: case MT_W_POST_NORM: *rows = C; break;
    case MT_W_ATTN_OUT_NORM: case MT_W_MLP_OUT_NORM: *rows = c->sandwich_norm ? C : 0; break;
    case MT_W_Q: *rows = QD * (c->attn_gate ? 2 : 1); *cols = C; break;
    case MT_W_K: case MT_W_V: *rows = KD; *cols = C; break;
    case MT_W_O: *rows = C; *cols = QD; break;
    case MT_W_Q_BIAS: *rows = c->qkv_bias ? QD * (c->attn_gate ? 2 : 1) : 0; break;
    case MT_W_K_BIAS: case MT_W_V_BIAS: *rows = c->qkv_bias ? KD : 0; break;
    case MT_W_O_BIAS: *rows = c->o_bias ? C : 0; break;
    case MT_W_Q_NORM: case MT_W_K_NORM: *rows = c->qk_norm ? D : 0; break;
    case MT_W_LAYER_SCALAR: *rows = c->layer_scalar ? 1 : 0; break;
    case MT_W_ROUTER_SCALE: case MT_W_PRE_NORM_2: case MT_W_MLP_OUT_NORM_1: case MT_W_MLP_OUT_NORM_2:
        *rows = C; break;
    case MT_W_EXPERT_SCALE: *rows = E; break;
    case MT_W_EXP_GATE_UP_OI: *rows = E; *cols = 2 * Fe; *depth = C; break;
    case MT_W_EXP_DOWN_OI: *rows = E; *cols = C; *depth = Fe; break;
    case MT_W_GATE: case MT_W_UP: *rows = F; *cols = C; break;
    case MT_W_DOWN: *rows = C; *cols = F; break;
    case MT_W_GATE_BIAS: case MT_W_UP_BIAS: *rows = c->mlp_bias ? F : 0; break;
    case MT_W_DOWN_BIAS: *rows = c->mlp_bias ? C : 0; break;
    case MT_W_ROUTER: *rows = c->n_experts; *cols = C; break;
    case MT_W_EXP_GATE: case MT_W_EXP_UP: *rows = c->moe_F; *cols = C; break;
    case MT_W_EXP_DOWN: *rows = C; *cols = c->moe_F; break;
    case MT_W_LIN_QKV: *rows = Ch; *cols = C; break;
    case MT_W_LIN_Z: *rows = VD; *cols = C; break;
    case MT_W_LIN_B: case MT_W_LIN_A: *rows = Hv; *cols = C; break;
    case MT_W_LIN_CONV: *rows = Ch; *cols = 1; *depth = c->lin_K; break;
    case MT_W_LIN_DT_BIAS: case MT_W_LIN_A_LOG: *rows = Hv; break;
    case MT_W_LIN_NORM: *rows = c->lin_Dv; break;
    case MT_W_LIN_OUT: *rows = C; *cols = VD; break;
    case MT_W_SHARED_GATE: *rows = 1; *cols = C; break;
    case MT_W_SINKS: *rows = c->attn_sinks ? c->H : 0; break;
    case MT_W_ROUTER_BIAS: *rows = E; break;
    case MT_W_EXP_GATE_UP: *rows = E; *cols = C; *depth = 2 * Fe; break;
    case MT_W_EXP_GATE_UP_BIAS: *rows = E; *cols = 2 * Fe; break;
    case MT_W_EXP_DOWN_IO: *rows = E; *cols = Fe; *depth = C; break;
    case MT_W_EXP_DOWN_BIAS: *rows = E; *cols = C; break;
    default: MT_CHECK(0, "not a layer kind: %d", (int)k);
    }
}

/* Appends one tensor at the next aligned offset of its group; *group_pos advances. */
static void table_add(mt_param_table *t, mt_param_kind kind, int layer, const char *name,
                      int64_t rows, int64_t cols, int64_t depth, int64_t group_start, int64_t *group_pos) {
    mt_param *p = &t->params[t->n_params++];
    memset(p, 0, sizeof *p);
    p->expert = -1;
    MT_CHECK(strlen(name) < sizeof p->name, "tensor name too long: %s", name);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->kind = kind;
    p->layer = layer;
    p->ndim = depth ? 3 : cols ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols;
    p->shape[2] = depth;
    p->numel = rows * (cols ? cols : 1) * (depth ? depth : 1);
    p->group_offset = *group_pos;
    p->offset = group_start + *group_pos;
    *group_pos = align_up(*group_pos + p->numel);
    t->n_real += p->numel;
}

/* Lays out one layer of type `type` from group_start: its tensors (names with `layer` when adding,
 * else only counted: t->params NULL) and the kinds' offsets. Returns the group's elements. */
static int64_t layer_layout(mt_param_table *t, int layer, int type, int64_t group_start, int *count) {
    const mt_config *cfg = &t->cfg;
    int64_t pos = 0;
    char name[128], suffix[96];
    for (int k = 0; k < MT_LAYER_KINDS; k++) {
        int64_t rows, cols, depth;
        layer_kind_shape(cfg, type, (mt_param_kind)k, &rows, &cols, &depth);
        if (rows == 0) continue;
        int n = k == MT_W_EXP_GATE || k == MT_W_EXP_UP || k == MT_W_EXP_DOWN ? cfg->n_experts : 1;
        t->kind_offset[type][k] = pos;
        for (int e = 0; e < n; e++) {
            if (!t->params) { /* counting */
                (*count)++;
                pos = align_up(pos + rows * (cols ? cols : 1) * (depth ? depth : 1));
                continue;
            }
            if (k >= MT_W_ROUTER && k <= MT_W_EXP_DOWN)
                snprintf(suffix, sizeof suffix, moe_suffix(cfg, k), e);
            else if ((type & 1) && kind_is_dense_mlp((mt_param_kind)k) && !cfg->moe_beside_dense)
                snprintf(suffix, sizeof suffix, "%s", shared_suffix((mt_param_kind)k));
            else snprintf(suffix, sizeof suffix, "%s", layer_suffix(cfg, (mt_param_kind)k));
            snprintf(name, sizeof name, MT_LAYER_PREFIX "%d.%s", layer, suffix);
            table_add(t, (mt_param_kind)k, layer, name, rows, cols, depth, group_start, &pos);
            if (n > 1) t->params[t->n_params - 1].expert = e;
        }
    }
    return pos;
}

void mt_param_table_init(mt_param_table *t, const mt_config *cfg) {
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    for (int m = 0; m < MT_LAYER_TYPES; m++)
        for (int k = 0; k < MT_LAYER_KINDS; k++) t->kind_offset[m][k] = -1;
    t->expert_stride = align_up((int64_t)cfg->moe_F * cfg->C);
    /* a first pass counts each type's tensors and size: a group holds the largest type */
    int count[MT_LAYER_TYPES] = {0}, have[MT_LAYER_TYPES] = {0};
    int64_t size[MT_LAYER_TYPES];
    for (int m = 0; m < MT_LAYER_TYPES; m++) size[m] = layer_layout(t, 0, m, 0, &count[m]);
    for (int l = 0; l < cfg->L; l++) have[mt_layer_type_of(cfg, l)]++;
    t->layer_size = 0;
    size_t n_tensors = 3;
    for (int m = 0; m < MT_LAYER_TYPES; m++) {
        if (have[m] && size[m] > t->layer_size) t->layer_size = size[m];
        n_tensors += (size_t)have[m] * (size_t)count[m];
    }
    t->params = mt_calloc(n_tensors, sizeof(mt_param));
    t->layer_first = mt_calloc((size_t)cfg->L + 1, sizeof(int));
    int64_t C = cfg->C, V = cfg->V, pos = 0;

    t->embed_offset = 0;
    table_add(t, MT_W_EMBED, MT_GROUP_EMBED, "model.embed_tokens.weight", V, C, 0, 0, &pos);
    t->embed_size = pos;

    t->layer_offset0 = t->embed_offset + t->embed_size;
    for (int l = 0; l < cfg->L; l++) {
        t->layer_first[l] = t->n_params;
        layer_layout(t, l, mt_layer_type_of(cfg, l), t->layer_offset0 + (int64_t)l * t->layer_size, NULL);
    }
    t->layer_first[cfg->L] = t->n_params;
    for (int m = 0; m < MT_LAYER_TYPES; m++) /* a type no layer has has no offsets */
        if (!have[m])
            for (int k = 0; k < MT_LAYER_KINDS; k++) t->kind_offset[m][k] = -1;

    t->head_offset = t->layer_offset0 + (int64_t)cfg->L * t->layer_size;
    pos = 0;
    table_add(t, MT_W_FINAL_NORM, cfg->L, "model.norm.weight", C, 0, 0, t->head_offset, &pos);
    if (!cfg->tie_word_embeddings)
        table_add(t, MT_W_LM_HEAD, cfg->L, "lm_head.weight", V, C, 0, t->head_offset, &pos);
    t->head_size = pos;
    t->total = t->head_offset + t->head_size;
}

void mt_param_table_free(mt_param_table *t) {
    free(t->params);
    free(t->layer_first);
    memset(t, 0, sizeof *t);
}

/* Names are structured, so lookup parses the layer out of "model.layers.{l}.{suffix}" and
 * searches that layer's tensors only. */
const mt_param *mt_param_find(const mt_param_table *t, const char *name) {
    if (!name || t->n_params == 0) return NULL;
    size_t plen = strlen(MT_LAYER_PREFIX);
    if (strncmp(name, MT_LAYER_PREFIX, plen) == 0) {
        const char *s = name + plen;
        if (*s < '0' || *s > '9') return NULL;
        char *end;
        long l = strtol(s, &end, 10);
        if (*end != '.' || l < 0 || l >= t->cfg.L) return NULL;
        for (int i = t->layer_first[l]; i < t->layer_first[l + 1]; i++)
            if (strcmp(name, t->params[i].name) == 0) return &t->params[i]; /* "layers.01." finds none */
        return NULL;
    }
    /* embed first, head group last */
    if (strcmp(name, t->params[0].name) == 0) return &t->params[0];
    for (int i = t->n_params - 1; i >= 0 && t->params[i].layer == t->cfg.L; i--)
        if (strcmp(name, t->params[i].name) == 0) return &t->params[i];
    return NULL;
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

mt_layer_view mt_layer_view_at(const mt_param_table *t, int l, void *layer_base, size_t elem_size) {
    MT_CHECK(l >= 0 && l < t->cfg.L, "layer %d of %d", l, t->cfg.L);
    const int64_t *o = t->kind_offset[mt_layer_type_of(&t->cfg, l)];
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
        .attn_out_norm = at(layer_base, o[MT_W_ATTN_OUT_NORM], elem_size),
        .mlp_out_norm = at(layer_base, o[MT_W_MLP_OUT_NORM], elem_size),
        .gate = at(layer_base, o[MT_W_GATE], elem_size),
        .gate_bias = at(layer_base, o[MT_W_GATE_BIAS], elem_size),
        .up = at(layer_base, o[MT_W_UP], elem_size),
        .up_bias = at(layer_base, o[MT_W_UP_BIAS], elem_size),
        .down = at(layer_base, o[MT_W_DOWN], elem_size),
        .down_bias = at(layer_base, o[MT_W_DOWN_BIAS], elem_size),
        .router = at(layer_base, o[MT_W_ROUTER], elem_size),
        .exp_gate = at(layer_base, o[MT_W_EXP_GATE], elem_size),
        .exp_up = at(layer_base, o[MT_W_EXP_UP], elem_size),
        .exp_down = at(layer_base, o[MT_W_EXP_DOWN], elem_size),
        .exp_stride = (size_t)t->expert_stride * elem_size,
        .shared_gate = at(layer_base, o[MT_W_SHARED_GATE], elem_size),
        .lin_qkv = at(layer_base, o[MT_W_LIN_QKV], elem_size),
        .lin_z = at(layer_base, o[MT_W_LIN_Z], elem_size),
        .lin_b = at(layer_base, o[MT_W_LIN_B], elem_size),
        .lin_a = at(layer_base, o[MT_W_LIN_A], elem_size),
        .lin_conv = at(layer_base, o[MT_W_LIN_CONV], elem_size),
        .lin_dt_bias = at(layer_base, o[MT_W_LIN_DT_BIAS], elem_size),
        .lin_a_log = at(layer_base, o[MT_W_LIN_A_LOG], elem_size),
        .lin_norm = at(layer_base, o[MT_W_LIN_NORM], elem_size),
        .lin_out = at(layer_base, o[MT_W_LIN_OUT], elem_size),
        .sinks = at(layer_base, o[MT_W_SINKS], elem_size),
        .router_bias = at(layer_base, o[MT_W_ROUTER_BIAS], elem_size),
        .exp_gate_up = at(layer_base, o[MT_W_EXP_GATE_UP], elem_size),
        .exp_gate_up_bias = at(layer_base, o[MT_W_EXP_GATE_UP_BIAS], elem_size),
        .exp_down_io = at(layer_base, o[MT_W_EXP_DOWN_IO], elem_size),
        .exp_down_bias = at(layer_base, o[MT_W_EXP_DOWN_BIAS], elem_size),
        .window = mt_config_layer_window(&t->cfg, l),
        .rope_set = mt_config_layer_rope_set(&t->cfg, l),
        .head_dim = mt_config_layer_head_dim(&t->cfg, l),
        .kv_heads = mt_config_layer_kv_heads(&t->cfg, l),
        .rotary_dim = mt_config_layer_rotary_dim(&t->cfg, l),
        .layer_scalar = at(layer_base, o[MT_W_LAYER_SCALAR], elem_size),
        .router_scale = at(layer_base, o[MT_W_ROUTER_SCALE], elem_size),
        .expert_scale = at(layer_base, o[MT_W_EXPERT_SCALE], elem_size),
        .exp_gate_up_oi = at(layer_base, o[MT_W_EXP_GATE_UP_OI], elem_size),
        .exp_down_oi = at(layer_base, o[MT_W_EXP_DOWN_OI], elem_size),
        .pre_norm_2 = at(layer_base, o[MT_W_PRE_NORM_2], elem_size),
        .mlp_out_norm_1 = at(layer_base, o[MT_W_MLP_OUT_NORM_1], elem_size),
        .mlp_out_norm_2 = at(layer_base, o[MT_W_MLP_OUT_NORM_2], elem_size),
    };
    return v;
}

mt_layer_view mt_layer_view_of(const mt_param_table *t, void *layer_base, size_t elem_size) {
    for (int l = 1; l < t->cfg.L; l++)
        MT_CHECK(mt_layer_type_of(&t->cfg, l) == mt_layer_type_of(&t->cfg, 0),
                 "layers 0 and %d are of different types: a layer's view needs its index "
                 "(mt_layer_view_at)", l);
    return mt_layer_view_at(t, 0, layer_base, elem_size);
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
           k == MT_W_FINAL_NORM || k == MT_W_ATTN_OUT_NORM || k == MT_W_MLP_OUT_NORM ||
           k == MT_W_PRE_NORM_2 || k == MT_W_MLP_OUT_NORM_1 || k == MT_W_MLP_OUT_NORM_2;
}

void mt_param_init_tensor(const mt_param_table *t, int i, float *x, float std, uint64_t seed) {
    const mt_param *p = &t->params[i];
    if (p->kind == MT_W_LAYER_SCALAR || p->kind == MT_W_ROUTER_SCALE || p->kind == MT_W_EXPERT_SCALE) {
        fill_const(x, p->numel, 1.0f); /* transformers' init: ones */
    } else if (kind_is_norm(p->kind)) {
        fill_const(x, p->numel, t->cfg.norm_offset ? 0.0f : 1.0f); /* (1 + w) norms start at w = 0 */
    } else if (p->kind == MT_W_LIN_NORM || p->kind == MT_W_LIN_DT_BIAS) {
        fill_const(x, p->numel, 1.0f); /* transformers' init: ones */
    } else if (p->kind == MT_W_LIN_A_LOG) {
        /* log(A) for A spread evenly over [1, 16] (transformers draws it uniformly from
         * [0.01, 16]): each value head decays at its own rate */
        for (int64_t h = 0; h < p->numel; h++) x[h] = logf(1.0f + 15.0f * ((float)h + 0.5f) / (float)p->numel);
    } else if (p->ndim == 1 || p->kind == MT_W_EXP_GATE_UP_BIAS || p->kind == MT_W_EXP_DOWN_BIAS) {
        fill_const(x, p->numel, 0.0f); /* biases (gpt-oss's experts' are (E, width)), sinks */
    } else {
        float resid = std / sqrtf(2.0f * (float)t->cfg.L);
        int residual = p->kind == MT_W_O || p->kind == MT_W_DOWN || p->kind == MT_W_EXP_DOWN ||
                       p->kind == MT_W_EXP_DOWN_OI ||
                       p->kind == MT_W_EXP_DOWN_IO;
        float s = residual ? resid : std;
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
