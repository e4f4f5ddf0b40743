/* config.json fields of the Qwen3.5 / Qwen3.6 family (transformers 5.25 qwen3_5, qwen3_5_moe):
 * which layers are Gated DeltaNets (layer_types, else every full_attention_interval-th layer is
 * attention), the DeltaNet's head shapes, partial RoPE, the gated attention, (1 + w) norms and
 * the MoE's shared expert. Defaults are those of Qwen3_5TextConfig / Qwen3_5MoeTextConfig.
 */
#include "model/config_qwen3_5.h"

#include <string.h>

#include "core/error.h"

int mt_config_is_qwen3_5(const mt_config *cfg) {
    return cfg->arch == MT_ARCH_QWEN3_5 || cfg->arch == MT_ARCH_QWEN3_5_MOE;
}

static void set_deltanet(mt_config *cfg, int l) { cfg->deltanet[l / 8] |= (uint8_t)(1u << (l % 8)); }

/* layer_types: a list of L names, "linear_attention" or "full_attention"; absent: every
 * full_attention_interval-th layer (1-based) is attention, the others linear. */
static int parse_layer_types(mt_config *cfg, const mt_cfg_src *s) {
    memset(cfg->deltanet, 0, sizeof cfg->deltanet);
    json_t *lt = json_object_get(s->root, "layer_types");
    if (!lt || json_is_null(lt)) {
        int every = 4;
        if (mt_cfg_int(s, s->root, "", "full_attention_interval", &every) == MT_ERR) return MT_ERR;
        if (every <= 0)
            return mt_error_set("%s: full_attention_interval = %d must be positive", s->path, every);
        for (int l = 0; l < cfg->L; l++)
            if ((l + 1) % every != 0) set_deltanet(cfg, l);
        return MT_OK;
    }
    return mt_cfg_layer_types(s, lt, cfg->L, "linear_attention", cfg->deltanet, sizeof cfg->deltanet,
                              cfg->model_type);
}

/* The DeltaNet's head shapes; each a positive size with transformers' default. */
static int parse_deltanet(mt_config *cfg, const mt_cfg_src *s) {
    struct { const char *key; int *out, def; } f[] = {
        {"linear_num_key_heads", &cfg->lin_Hk, 16},   {"linear_num_value_heads", &cfg->lin_Hv, 32},
        {"linear_key_head_dim", &cfg->lin_Dk, 128},   {"linear_value_head_dim", &cfg->lin_Dv, 128},
        {"linear_conv_kernel_dim", &cfg->lin_K, 4},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        *f[i].out = f[i].def;
        if (mt_cfg_int(s, s->root, "", f[i].key, f[i].out) == MT_ERR) return MT_ERR;
        if (*f[i].out <= 0)
            return mt_error_set("%s: %s = %d must be positive", s->path, f[i].key, *f[i].out);
    }
    if (cfg->lin_Hv % cfg->lin_Hk != 0)
        return mt_error_set("%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads "
                            "%d", s->path, cfg->lin_Hv, cfg->lin_Hk);
    return MT_OK;
}

/* partial_rotary_factor, top level or in rope_parameters (transformers' default 0.25 here). */
static int parse_rotary(mt_config *cfg, const mt_cfg_src *s) {
    double f = 0.25;
    if (mt_cfg_num(s, s->root, "", "partial_rotary_factor", &f) == MT_ERR) return MT_ERR;
    json_t *rp = json_object_get(s->root, "rope_parameters");
    if (rp && json_is_object(rp) &&
        mt_cfg_num(s, rp, "rope_parameters.", "partial_rotary_factor", &f) == MT_ERR)
        return MT_ERR;
    int rd = (int)(cfg->D * f); /* transformers: int(head_dim * partial_rotary_factor) */
    if (!(f > 0 && f <= 1) || rd < 2 || rd % 2 != 0)
        return mt_error_set("%s: partial_rotary_factor = %g gives %d rotary dims of head_dim %d "
                            "(must be even and at least 2)", s->path, f, rd, cfg->D);
    cfg->rotary_dim = rd;
    return MT_OK;
}

/* qwen3_5_moe: every layer routes (norm_topk always) and adds a gated shared expert, whose width
 * takes F's place (the family has no dense intermediate_size). */
static int parse_moe(mt_config *cfg, const mt_cfg_src *s) {
    cfg->n_experts = 256;
    cfg->top_k = 8;
    cfg->moe_F = 512;
    cfg->F = 512;
    cfg->norm_topk_prob = 1;
    cfg->sparse_step = 1;
    cfg->shared_expert = 1;
    if (mt_cfg_int(s, s->root, "", "num_experts", &cfg->n_experts) == MT_ERR) return MT_ERR;
    if (mt_cfg_int(s, s->root, "", "num_experts_per_tok", &cfg->top_k) == MT_ERR) return MT_ERR;
    if (mt_cfg_int(s, s->root, "", "moe_intermediate_size", &cfg->moe_F) == MT_ERR) return MT_ERR;
    if (mt_cfg_int(s, s->root, "", "shared_expert_intermediate_size", &cfg->F) == MT_ERR) return MT_ERR;
    if (cfg->F <= 0)
        return mt_error_set("%s: shared_expert_intermediate_size = %d must be positive", s->path, cfg->F);
    cfg->router_aux = 0;
    if (mt_cfg_bool(s, "output_router_logits", &cfg->router_aux) == MT_ERR) return MT_ERR;
    double coef = 0.001;
    if (mt_cfg_num(s, s->root, "", "router_aux_loss_coef", &coef) == MT_ERR) return MT_ERR;
    cfg->router_aux_coef = (float)coef;
    return MT_OK;
}

int mt_config_parse_qwen3_5(mt_config *cfg, const mt_cfg_src *s) {
    cfg->norm_offset = 1;
    cfg->attn_gate = 1;
    cfg->qk_norm = 1;
    MT_TRY(parse_layer_types(cfg, s));
    MT_TRY(parse_deltanet(cfg, s));
    MT_TRY(parse_rotary(cfg, s));
    if (cfg->arch == MT_ARCH_QWEN3_5_MOE) MT_TRY(parse_moe(cfg, s));
    return MT_OK;
}

/* Parameters of one Gated DeltaNet mixer: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a,
 * out_proj, conv1d, A_log, dt_bias and the gated norm. */
int64_t mt_config_deltanet_params(const mt_config *cfg) {
    int64_t C = cfg->C, Hk = cfg->lin_Hk, Hv = cfg->lin_Hv, Dk = cfg->lin_Dk, Dv = cfg->lin_Dv;
    int64_t conv_ch = 2 * Hk * Dk + Hv * Dv;
    return conv_ch * C + Hv * Dv * C + 2 * Hv * C + C * Hv * Dv + conv_ch * cfg->lin_K + 2 * Hv + Dv;
}

void mt_config_qwen3_5_json(const mt_config *cfg, json_t *o) {
    json_t *types = json_array();
    for (int l = 0; l < cfg->L; l++)
        json_array_append_new(types, json_string(mt_config_layer_mixer(cfg, l) == MT_MIXER_GATED_DELTANET
                                                     ? "linear_attention" : "full_attention"));
    json_object_set_new(o, "layer_types", types);
    json_object_set_new(o, "linear_num_key_heads", json_integer(cfg->lin_Hk));
    json_object_set_new(o, "linear_num_value_heads", json_integer(cfg->lin_Hv));
    json_object_set_new(o, "linear_key_head_dim", json_integer(cfg->lin_Dk));
    json_object_set_new(o, "linear_value_head_dim", json_integer(cfg->lin_Dv));
    json_object_set_new(o, "linear_conv_kernel_dim", json_integer(cfg->lin_K));
    if (cfg->arch != MT_ARCH_QWEN3_5_MOE) return;
    json_object_del(o, "intermediate_size");
    json_object_set_new(o, "num_experts", json_integer(cfg->n_experts));
    json_object_set_new(o, "num_experts_per_tok", json_integer(cfg->top_k));
    json_object_set_new(o, "moe_intermediate_size", json_integer(cfg->moe_F));
    json_object_set_new(o, "shared_expert_intermediate_size", json_integer(cfg->F));
    json_object_set_new(o, "output_router_logits", json_boolean(cfg->router_aux));
}
