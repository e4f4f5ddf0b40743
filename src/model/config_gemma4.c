/* config.json fields of Google's Gemma 4 text models (transformers 5.25 gemma4_text;
 * tests/fixtures/README.md, "Gemma 4 fixtures", has each fact with its place in transformers).
 * Gemma 3's layer (sliding and full attention, q/k norms, sandwich norms, GeGLU with
 * gelu_pytorch_tanh, the embedding scaled by sqrt(hidden_size) with the pad row frozen, a tied
 * head) with these changes: every RMSNorm multiplies by w (not 1 + w); the values are RMS-normed
 * per head without a weight (v_norm); the scores are not scaled (scaling 1.0: q and k are normed);
 * the full layers have their own head dim and kv heads (global_head_dim 512 and
 * num_global_key_value_heads by default, or transformers 5.25's per_layer_config) and with
 * attention_k_eq_v no v_proj (values = k_proj's output); each layer type its RoPE (sliding:
 * default; full: proportional, the first partial_rotary_factor of the frequencies rotating); each
 * layer's output times its layer_scalar buffer; logits soft-capped by final_logit_softcapping;
 * with enable_moe_block, experts beside every layer's dense MLP (model/moe_gemma4.h). The last
 * layer is always full_attention (transformers forces it). Defaults are Gemma4TextConfig's. */
#include "model/config_gemma4.h"
#include "model/config_sliding.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

int mt_config_is_gemma4(const mt_config *cfg) { return cfg->arch == MT_ARCH_GEMMA4; }

/* What the released dense and MoE configs leave off, and the E2B/E4B features: refused by name. */
static int refuse(const mt_cfg_src *s) {
    int ple = 256; /* Gemma4TextConfig's default: absent means per-layer input embeddings */
    json_t *v = json_object_get(s->root, "hidden_size_per_layer_input");
    if (v && json_is_null(v)) ple = 0;
    else if (mt_cfg_int(s, s->root, "", "hidden_size_per_layer_input", &ple) == MT_ERR) return MT_ERR;
    if (ple != 0)
        return mt_error_set("%s: hidden_size_per_layer_input = %d%s: the per-layer input embeddings "
                            "of Gemma 4 E2B/E4B are not supported (must be 0 or null, as in the "
                            "31B and 26B-A4B configs)", s->path, ple,
                            v ? "" : " (Gemma4TextConfig's default when absent)");
    int shared = 0;
    if (mt_cfg_int(s, s->root, "", "num_kv_shared_layers", &shared) == MT_ERR) return MT_ERR;
    if (shared != 0)
        return mt_error_set("%s: num_kv_shared_layers = %d: layers reusing an earlier layer's keys "
                            "and values (Gemma 4 E2B/E4B) are not supported (must be 0)", s->path,
                            shared);
    int bias = 0;
    if (mt_cfg_bool(s, "attention_bias", &bias) == MT_ERR) return MT_ERR;
    if (bias)
        return mt_error_set("%s: attention_bias = true is not supported for gemma4 (no released "
                            "Gemma 4 has attention biases)", s->path);
    json_t *cap = json_object_get(s->root, "attn_logit_softcapping");
    if (cap && !json_is_null(cap))
        return mt_error_set("%s: attn_logit_softcapping is not supported for gemma4 (transformers "
                            "5.25's Gemma 4 attention has no soft-capping; must be null)", s->path);
    json_t *bidir = json_object_get(s->root, "use_bidirectional_attention");
    if (bidir && !json_is_null(bidir)) {
        /* "vision": only image tokens attend both ways; a text batch is causal */
        if (!json_is_string(bidir) || (strcmp(json_string_value(bidir), "vision") != 0 &&
                                       strcmp(json_string_value(bidir), "all") != 0))
            return mt_error_set("%s: use_bidirectional_attention must be null, \"vision\" or \"all\"",
                                s->path);
        if (strcmp(json_string_value(bidir), "all") == 0)
            return mt_error_set("%s: use_bidirectional_attention = \"all\" (an embedding model, not a "
                                "causal LM) is not supported", s->path);
    }
    json_t *act = json_object_get(s->root, "hidden_activation");
    if (act && !json_is_null(act)) {
        if (!json_is_string(act)) return mt_error_set("%s: hidden_activation must be a string", s->path);
        if (strcmp(json_string_value(act), "gelu_pytorch_tanh") != 0)
            return mt_error_set("%s: hidden_activation \"%s\" is not supported (supported: "
                                "gelu_pytorch_tanh)", s->path, json_string_value(act));
    }
    return MT_OK;
}

static void set_sliding(mt_config *cfg, int l, int on) {
    if (on) cfg->sliding[l / 8] |= (uint8_t)(1u << (l % 8));
    else cfg->sliding[l / 8] &= (uint8_t)~(1u << (l % 8));
}

/* enable_moe_block (26B-A4B): every layer keeps its dense MLP and adds num_experts experts of width
 * moe_intermediate_size, top_k_experts of them a token, the gates always renormalised
 * (model/moe_gemma4.h); Gemma4TextConfig has no defaults for the three. Off: they are ignored, as
 * transformers does. */
static int parse_moe(mt_config *cfg, const mt_cfg_src *s) {
    int on = 0;
    if (mt_cfg_bool(s, "enable_moe_block", &on) == MT_ERR) return MT_ERR;
    if (!on) return MT_OK;
    const char *keys[3] = {"num_experts", "top_k_experts", "moe_intermediate_size"};
    int *dst[3] = {&cfg->n_experts, &cfg->top_k, &cfg->moe_F};
    for (int i = 0; i < 3; i++) {
        int r = mt_cfg_int(s, s->root, "", keys[i], dst[i]);
        if (r == MT_ERR) return MT_ERR;
        if (r == 0)
            return mt_error_set("%s: %s is missing (required with enable_moe_block: Gemma4TextConfig has "
                                "no default)", s->path, keys[i]);
    }
    cfg->moe_beside_dense = 1;
    cfg->norm_topk_prob = 1; /* Gemma4TextRouter divides the top-k by their sum */
    cfg->sparse_step = 1;    /* every layer */
    cfg->router_aux = 0;     /* no load-balancing loss in Gemma4ForCausalLM */
    return MT_OK;
}

/* layer_types (absent: 5 sliding then 1 full), the window (default 512), the last layer full. */
static int parse_layer_types(mt_config *cfg, const mt_cfg_src *s) {
    MT_TRY(mt_config_parse_sliding(cfg, s, 6, 512));
    int last = cfg->L - 1;
    if (mt_config_layer_window(cfg, last) > 0) {
        set_sliding(cfg, last, 0); /* Gemma4TextConfig.__post_init__ does the same, with a warning */
        fprintf(stderr, "megatrain: warning: %s: the last layer (%d) would be sliding_attention; it is "
                "full_attention, as transformers forces it\n", s->path, last);
    }
    return MT_OK;
}

/* per_layer_config (transformers 5.25 writes it): {"<layer>": {"head_dim": .., "num_key_value_heads":
 * ..}} for full layers only, all of them alike. */
static int parse_per_layer(mt_config *cfg, const mt_cfg_src *s, json_t *plc) {
    if (!json_is_object(plc)) return mt_error_set("%s: per_layer_config must be an object", s->path);
    int D = -1, G = -1;
    const char *key;
    json_t *o;
    json_object_foreach(plc, key, o) {
        char *end;
        long l = strtol(key, &end, 10);
        if (!*key || *end || l < 0 || l >= cfg->L)
            return mt_error_set("%s: per_layer_config key \"%s\" is not a layer index (0..%d)", s->path,
                                key, cfg->L - 1);
        if (mt_config_layer_window(cfg, (int)l) > 0)
            return mt_error_set("%s: per_layer_config.%s overrides a sliding_attention layer: only the "
                                "full layers' head_dim and num_key_value_heads may differ", s->path, key);
        if (!json_is_object(o))
            return mt_error_set("%s: per_layer_config.%s must be an object", s->path, key);
        const char *k;
        json_t *x;
        json_object_foreach(o, k, x) {
            if (strcmp(k, "head_dim") != 0 && strcmp(k, "num_key_value_heads") != 0)
                return mt_error_set("%s: per_layer_config.%s.%s is not supported (only head_dim and "
                                    "num_key_value_heads)", s->path, key, k);
        }
        char pre[64];
        snprintf(pre, sizeof pre, "per_layer_config.%s.", key);
        int d = cfg->D, g = cfg->G;
        if (mt_cfg_int(s, o, pre, "head_dim", &d) == MT_ERR) return MT_ERR;
        if (mt_cfg_int(s, o, pre, "num_key_value_heads", &g) == MT_ERR) return MT_ERR;
        if (D >= 0 && (d != D || g != G))
            return mt_error_set("%s: per_layer_config gives full layers different shapes (head_dim %d "
                                "and %d, num_key_value_heads %d and %d): not supported", s->path, D, d,
                                G, g);
        D = d, G = g;
    }
    /* a full layer it leaves out keeps the common shape: every full layer listed, or none */
    int listed = (int)json_object_size(plc), full = 0;
    for (int l = 0; l < cfg->L; l++) full += mt_config_layer_window(cfg, l) == 0;
    if (listed == 0) D = cfg->D, G = cfg->G;
    if (listed != full && (D != cfg->D || G != cfg->G))
        return mt_error_set("%s: per_layer_config lists %d of the %d full_attention layers: the others "
                            "would keep head_dim %d; not supported", s->path, listed, full, cfg->D);
    cfg->global_D = D;
    cfg->global_G = G;
    return MT_OK;
}

/* The full layers' shape and attention_k_eq_v. */
static int parse_global(mt_config *cfg, const mt_cfg_src *s) {
    if (mt_cfg_bool(s, "attention_k_eq_v", &cfg->k_eq_v) == MT_ERR) return MT_ERR;
    json_t *plc = json_object_get(s->root, "per_layer_config");
    if (plc && !json_is_null(plc)) MT_TRY(parse_per_layer(cfg, s, plc));
    else {
        /* Gemma4TextConfig: global_head_dim (default 512) always; num_global_key_value_heads only
         * with attention_k_eq_v */
        cfg->global_D = 512;
        if (mt_cfg_int(s, s->root, "", "global_head_dim", &cfg->global_D) == MT_ERR) return MT_ERR;
        cfg->global_G = cfg->G;
        if (cfg->k_eq_v &&
            mt_cfg_int(s, s->root, "", "num_global_key_value_heads", &cfg->global_G) == MT_ERR)
            return MT_ERR;
    }
    if (cfg->global_D <= 0 || cfg->global_D % 2 != 0 || cfg->global_D > MT_CONFIG_MAX_HEAD_DIM)
        return mt_error_set("%s: the full layers' head_dim (global_head_dim) = %d must be even and in "
                            "2..%d", s->path, cfg->global_D, MT_CONFIG_MAX_HEAD_DIM);
    if ((int64_t)cfg->H * cfg->global_D > MT_CONFIG_MAX_WIDTH)
        return mt_error_set("%s: num_attention_heads * global_head_dim = %d * %d is larger than "
                            "megatrain's limit %d", s->path, cfg->H, cfg->global_D, MT_CONFIG_MAX_WIDTH);
    if (cfg->global_G <= 0 || cfg->global_G > cfg->H || cfg->H % cfg->global_G != 0)
        return mt_error_set("%s: num_attention_heads %d is not a multiple of the full layers' "
                            "num_key_value_heads (num_global_key_value_heads) %d", s->path, cfg->H,
                            cfg->global_G);
    return MT_OK;
}

/* One layer type's RoPE dict: its theta, and for the full layers its type (default, or proportional
 * with partial_rotary_factor and factor). */
static int parse_rope_dict(mt_config *cfg, const mt_cfg_src *s, json_t *rp, const char *type, int full,
                           double *theta) {
    char pre[64];
    snprintf(pre, sizeof pre, "rope_parameters.%s.", type);
    if (!rp || json_is_null(rp))
        return mt_error_set("%s: %.*s is missing (each layer type needs its RoPE)", s->path,
                            (int)strlen(pre) - 1, pre);
    if (!json_is_object(rp))
        return mt_error_set("%s: %.*s must be an object", s->path, (int)strlen(pre) - 1, pre);
    if (mt_cfg_num(s, rp, pre, "rope_theta", theta) != 1)
        return mt_error_set("%s: %srope_theta is missing or not a number", s->path, pre);
    json_t *ty = json_object_get(rp, "rope_type");
    if (!ty || json_is_null(ty)) ty = json_object_get(rp, "type");
    if (ty && !json_is_null(ty) && !json_is_string(ty))
        return mt_error_set("%s: %srope_type must be a string", s->path, pre);
    const char *tname = ty && json_is_string(ty) ? json_string_value(ty) : "default";
    double prf = 1.0;
    if (mt_cfg_num(s, rp, pre, "partial_rotary_factor", &prf) == MT_ERR) return MT_ERR;
    if (strcmp(tname, "default") == 0) {
        /* transformers' default RoPE would ignore it: refused rather than dropped */
        if (prf != 1.0)
            return mt_error_set("%s: %spartial_rotary_factor = %g with rope_type default is not "
                                "supported (transformers ignores it there; use proportional)",
                                s->path, pre, prf);
        if (full) cfg->rope_type = MT_ROPE_DEFAULT;
        return MT_OK;
    }
    if (!full || strcmp(tname, "proportional") != 0)
        return mt_error_set("%s: %srope_type \"%s\" is not supported for gemma4 (supported: default%s)",
                            s->path, pre, tname, full ? ", proportional" : "");
    cfg->rope_type = MT_ROPE_PROPORTIONAL;
    cfg->rope_partial = prf;
    if (mt_cfg_num(s, rp, pre, "factor", &cfg->rope_factor) == MT_ERR) return MT_ERR;
    if (!(prf >= 0 && prf <= 1))
        return mt_error_set("%s: %spartial_rotary_factor = %g must be in [0, 1]", s->path, pre, prf);
    if (!(cfg->rope_factor > 0) || !isfinite(cfg->rope_factor))
        return mt_error_set("%s: %sfactor = %g must be positive", s->path, pre, cfg->rope_factor);
    return MT_OK;
}

/* rope_parameters keyed by layer type (absent: sliding default theta 1e4, full proportional 0.25
 * theta 1e6); an entry for each layer type the model has. */
static int parse_rope(mt_config *cfg, const mt_cfg_src *s) {
    cfg->rope_type = MT_ROPE_PROPORTIONAL;
    cfg->rope_theta = 1e6;
    cfg->rope_partial = 0.25;
    cfg->rope_factor = 1.0;
    cfg->rope_local_theta = 1e4;
    json_t *rp = json_object_get(s->root, "rope_parameters");
    if (!rp || json_is_null(rp)) return MT_OK;
    if (!json_is_object(rp)) return mt_error_set("%s: rope_parameters must be an object or null", s->path);
    cfg->rope_partial = 1.0;
    int sliding = 0;
    for (int l = 0; l < cfg->L; l++) sliding += mt_config_layer_window(cfg, l) > 0;
    MT_TRY(parse_rope_dict(cfg, s, json_object_get(rp, "full_attention"), "full_attention", 1,
                           &cfg->rope_theta));
    if (sliding)
        MT_TRY(parse_rope_dict(cfg, s, json_object_get(rp, "sliding_attention"), "sliding_attention", 0,
                               &cfg->rope_local_theta));
    if (!(cfg->rope_theta > 0) || !(cfg->rope_local_theta > 0))
        return mt_error_set("%s: rope_theta = %g and the sliding layers' rope_theta = %g must be positive",
                            s->path, cfg->rope_theta, cfg->rope_local_theta);
    return MT_OK;
}

int mt_config_parse_gemma4(mt_config *cfg, const mt_cfg_src *s) {
    MT_TRY(refuse(s));
    cfg->mlp_act = MT_MLP_GEGLU;
    cfg->norm_offset = 0; /* Gemma4RMSNorm: x * w, w initialised to ones */
    cfg->qk_norm = 1;
    cfg->v_norm = 1;
    cfg->sandwich_norm = 1;
    cfg->embed_scale = 1;
    cfg->layer_scalar = 1;
    cfg->query_pre_attn_scalar = 1; /* Gemma4TextAttention.scaling = 1.0 */
    cfg->tie_word_embeddings = 1;   /* Gemma4TextConfig's default */
    if (mt_cfg_bool(s, "tie_word_embeddings", &cfg->tie_word_embeddings) == MT_ERR) return MT_ERR;
    double cap = 0;
    if (mt_cfg_num(s, s->root, "", "final_logit_softcapping", &cap) == MT_ERR) return MT_ERR;
    if (json_object_get(s->root, "final_logit_softcapping") &&
        !json_is_null(json_object_get(s->root, "final_logit_softcapping")) && !(cap > 0 && isfinite(cap)))
        return mt_error_set("%s: final_logit_softcapping = %g must be positive or null", s->path, cap);
    cfg->final_softcap = cap;
    /* nn.Embedding(padding_idx = pad_token_id): that row gets no gradient from the lookup */
    cfg->pad_token_id = 0;
    json_t *pad = json_object_get(s->root, "pad_token_id");
    if (pad && json_is_null(pad)) cfg->pad_token_id = -1;
    else if (mt_cfg_int(s, s->root, "", "pad_token_id", &cfg->pad_token_id) == MT_ERR) return MT_ERR;
    if (cfg->pad_token_id < -1 || cfg->pad_token_id >= cfg->V)
        return mt_error_set("%s: pad_token_id = %d is not a token of vocab_size %d", s->path,
                            cfg->pad_token_id, cfg->V);
    cfg->embed_pad_no_grad = cfg->pad_token_id >= 0;
    MT_TRY(parse_layer_types(cfg, s));
    MT_TRY(parse_global(cfg, s));
    MT_TRY(parse_rope(cfg, s));
    MT_TRY(parse_moe(cfg, s));
    return MT_OK;
}

void mt_config_gemma4_inv_freq(const mt_config *cfg, float *inv_freq) {
    int stride = mt_config_rope_stride(cfg), Dg = cfg->global_D, D = cfg->D;
    /* set 0, the full layers': _compute_proportional_rope_parameters rotates the first
     * int(partial * Dg // 2) frequencies, exponent 2i / Dg (the whole head), the rest are 0 */
    int angles = Dg / 2;
    if (cfg->rope_type == MT_ROPE_PROPORTIONAL) angles = (int)floor(cfg->rope_partial * Dg / 2.0);
    for (int i = 0; i < Dg / 2; i++) {
        double f = i < angles ? 1.0 / pow(cfg->rope_theta, (double)(2 * i) / (double)Dg) : 0.0;
        if (cfg->rope_type == MT_ROPE_PROPORTIONAL) f /= cfg->rope_factor;
        inv_freq[i] = (float)f;
    }
    if (mt_config_rope_sets(cfg) < 2) return;
    for (int i = 0; i < D / 2; i++) /* set 1, the sliding layers': default RoPE of head_dim */
        inv_freq[stride + i] = (float)(1.0 / pow(cfg->rope_local_theta, (double)(2 * i) / (double)D));
}

static json_t *rope_json(const mt_config *cfg, int full) {
    json_t *r = json_object();
    int prop = full && cfg->rope_type == MT_ROPE_PROPORTIONAL;
    if (prop) { /* factor only when not 1: transformers warns of it (but applies it) */
        if (cfg->rope_factor != 1.0) json_object_set_new(r, "factor", json_real(cfg->rope_factor));
        json_object_set_new(r, "partial_rotary_factor", json_real(cfg->rope_partial));
    }
    json_object_set_new(r, "rope_theta", json_real(full ? cfg->rope_theta : cfg->rope_local_theta));
    json_object_set_new(r, "rope_type", json_string(prop ? "proportional" : "default"));
    return r;
}

void mt_config_gemma4_json(const mt_config *cfg, json_t *o) {
    json_object_del(o, "hidden_act");
    json_object_del(o, "rope_theta");
    json_object_del(o, "rope_scaling");
    json_object_set_new(o, "hidden_activation", json_string("gelu_pytorch_tanh"));
    mt_config_sliding_json(cfg, o);
    json_t *plc = json_object(); /* the full layers' own shape */
    for (int l = 0; l < cfg->L; l++) {
        if (mt_config_layer_window(cfg, l) > 0) continue;
        char key[16];
        snprintf(key, sizeof key, "%d", l);
        json_t *e = json_object();
        json_object_set_new(e, "head_dim", json_integer(cfg->global_D));
        json_object_set_new(e, "num_key_value_heads", json_integer(cfg->global_G));
        json_object_set_new(plc, key, e);
    }
    json_object_set_new(o, "per_layer_config", plc);
    json_object_set_new(o, "attention_k_eq_v", json_boolean(cfg->k_eq_v));
    json_object_set_new(o, "attention_bias", json_false());
    json_object_set_new(o, "final_logit_softcapping",
                        cfg->final_softcap > 0 ? json_real(cfg->final_softcap) : json_null());
    json_object_set_new(o, "use_bidirectional_attention", json_null());
    json_object_set_new(o, "hidden_size_per_layer_input", json_integer(0));
    json_object_set_new(o, "num_kv_shared_layers", json_integer(0));
    json_object_set_new(o, "enable_moe_block", json_boolean(cfg->moe_beside_dense));
    if (cfg->moe_beside_dense) {
        json_object_set_new(o, "num_experts", json_integer(cfg->n_experts));
        json_object_set_new(o, "top_k_experts", json_integer(cfg->top_k));
        json_object_set_new(o, "moe_intermediate_size", json_integer(cfg->moe_F));
    }
    json_object_set_new(o, "pad_token_id",
                        cfg->pad_token_id >= 0 ? json_integer(cfg->pad_token_id) : json_null());
    json_t *rp = json_object();
    json_object_set_new(rp, "full_attention", rope_json(cfg, 1));
    json_object_set_new(rp, "sliding_attention", rope_json(cfg, 0));
    json_object_set_new(o, "rope_parameters", rp);
}
