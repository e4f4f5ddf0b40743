/* config.json (Hugging Face) <-> mt_config.
 *
 * Defaults for absent fields are those of transformers 5's config class of each model_type
 * (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, MixtralConfig, Qwen3MoeConfig). RoPE is read in both the transformers <5
 * style (rope_theta + rope_scaling) and the transformers 5 style (rope_parameters), with the same
 * precedence transformers 5 uses: rope_scaling over rope_parameters, keys inside the dict over the
 * top-level rope_theta, "rope_type" over the legacy "type".
 */
#include "model/config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "model/config_json.h"
#include "model/config_gemma3.h"
#include "model/config_gemma4.h"
#include "model/config_gpt_oss.h"
#include "model/config_qwen3_5.h"
#include "io/atomic_file.h" /* config.json is replaced atomically, like every file we write */

/* ---- refusals of what the runtime cannot honour ---- */

static int cfg_refuse_unsupported(const mt_config *cfg, const mt_cfg_src *s) {
    json_t *act = json_object_get(s->root, "hidden_act");
    if (act && !json_is_null(act) && !mt_config_is_gemma3(cfg) &&
        !mt_config_is_gemma4(cfg)) { /* gemma3, gemma4: hidden_activation */
        if (!json_is_string(act)) return mt_error_set("%s: hidden_act must be a string", s->path);
        if (strcmp(json_string_value(act), "silu") != 0)
            return mt_error_set("%s: hidden_act \"%s\" is not supported (supported: silu)", s->path,
                                json_string_value(act));
    }
    /* Mixtures of experts are mixtral and qwen3_moe (cfg_moe); these fields elsewhere, and the
     * shared experts of qwen2_moe / deepseek anywhere, describe a model we would compute wrongly. */
    int moe_type = cfg->arch == MT_ARCH_MIXTRAL || cfg->arch == MT_ARCH_QWEN3_MOE ||
                   mt_config_is_gpt_oss(cfg); /* its experts: config_gpt_oss.c */
    if (cfg->arch == MT_ARCH_QWEN3_5_MOE) moe_type = 0; /* its experts and shared expert: config_qwen3_5.c */
    static const char *moe[] = {"num_experts", "num_local_experts", "num_experts_per_tok",
                                "moe_intermediate_size", "n_routed_experts", "n_shared_experts",
                                "shared_expert_intermediate_size"};
    for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++) {
        double n = 0;
        if (moe_type && i < 4) continue;
        if (cfg->arch == MT_ARCH_QWEN3_5_MOE && i != 4 && i != 5) continue;
        if (mt_config_is_gemma4(cfg) && (i == 0 || i == 3)) continue; /* its own: config_gemma4.c */
        if (mt_cfg_num(s, s->root, "", moe[i], &n) == MT_ERR) return MT_ERR;
        if (n > 0 && moe_type)
            return mt_error_set("%s: %s = %g: shared experts are not supported (%s has none)",
                                s->path, moe[i], n, cfg->model_type);
        if (n > 0)
            return mt_error_set("%s: %s = %g: mixture-of-experts fields are supported for model_type "
                                "mixtral and qwen3_moe only (and qwen3_5_moe, with its shared expert; this is %s)", s->path, moe[i], n,
                                cfg->model_type);
    }
    double drop = 0;
    if (mt_cfg_num(s, s->root, "", "attention_dropout", &drop) == MT_ERR) return MT_ERR;
    if (drop != 0)
        return mt_error_set("%s: attention_dropout = %g is not supported (must be 0)", s->path, drop);
    int sw = 0;
    if (mt_cfg_bool(s, "use_sliding_window", &sw) == MT_ERR) return MT_ERR;
    if (sw) return mt_error_set("%s: use_sliding_window = true is not supported", s->path);
    json_t *lt = json_object_get(s->root, "layer_types");
    if (lt && !json_is_null(lt) && !mt_config_is_qwen3_5(cfg) && !mt_config_is_gpt_oss(cfg) &&
        !mt_config_is_gemma3(cfg) && !mt_config_is_gemma4(cfg)) {
        if (!json_is_array(lt)) return mt_error_set("%s: layer_types must be a list", s->path);
        size_t i;
        json_t *e;
        json_array_foreach(lt, i, e) {
            if (!json_is_string(e) || strcmp(json_string_value(e), "full_attention") != 0)
                return mt_error_set("%s: layer_types[%zu] is not \"full_attention\" (only full "
                                    "attention is supported)", s->path, i);
        }
    }
    return MT_OK;
}

/* ---- RoPE ---- */

static int cfg_partial_rotary(const mt_config *cfg, const mt_cfg_src *s, json_t *obj,
                              const char *prefix) {
    if (mt_config_is_qwen3_5(cfg)) return MT_OK; /* partial RoPE: config_qwen3_5.c */
    double f = 1.0;
    if (mt_cfg_num(s, obj, prefix, "partial_rotary_factor", &f) == MT_ERR) return MT_ERR;
    if (f != 1.0)
        return mt_error_set("%s: %spartial_rotary_factor = %g is not supported (must be 1)", s->path,
                            prefix, f);
    return MT_OK;
}

static int cfg_llama3_key(const mt_cfg_src *s, json_t *rp, const char *pre, const char *key, double *out) {
    int r = mt_cfg_num(s, rp, pre, key, out);
    if (r == MT_ERR) return MT_ERR;
    if (r == 0) return mt_error_set("%s: %s%s is missing (required by rope_type llama3)", s->path, pre, key);
    return MT_OK;
}

static int cfg_parse_rope(mt_config *cfg, const mt_cfg_src *s) {
    cfg->rope_theta = 10000.0; /* transformers' default_theta */
    if (mt_cfg_num(s, s->root, "", "rope_theta", &cfg->rope_theta) == MT_ERR) return MT_ERR;
    MT_TRY(cfg_partial_rotary(cfg, s, s->root, ""));

    const char *pre;
    json_t *rp;
    MT_TRY(mt_cfg_rope_dict(s, &rp, &pre));
    cfg->rope_type = MT_ROPE_DEFAULT;
    if (!rp || json_is_null(rp)) return MT_OK;

    json_t *ty = json_object_get(rp, "rope_type");
    const char *tkey = "rope_type";
    if (!ty || json_is_null(ty)) { ty = json_object_get(rp, "type"); tkey = "type"; }
    const char *tname = "default";
    if (ty && !json_is_null(ty)) {
        if (!json_is_string(ty)) return mt_error_set("%s: %s%s must be a string", s->path, pre, tkey);
        tname = json_string_value(ty);
    }
    if (mt_cfg_num(s, rp, pre, "rope_theta", &cfg->rope_theta) == MT_ERR) return MT_ERR;
    MT_TRY(cfg_partial_rotary(cfg, s, rp, pre));
    if (strcmp(tname, "default") == 0) return MT_OK;
    if (strcmp(tname, "llama3") != 0)
        return mt_error_set("%s: %s%s \"%s\" is not supported (supported: default, llama3)", s->path,
                            pre, tkey, tname);
    cfg->rope_type = MT_ROPE_LLAMA3;
    MT_TRY(cfg_llama3_key(s, rp, pre, "factor", &cfg->rope_factor));
    MT_TRY(cfg_llama3_key(s, rp, pre, "low_freq_factor", &cfg->rope_low_freq_factor));
    MT_TRY(cfg_llama3_key(s, rp, pre, "high_freq_factor", &cfg->rope_high_freq_factor));
    /* transformers falls back to max_position_embeddings (a top-level
     * original_max_position_embeddings is ignored for these model types) */
    cfg->rope_original_max_pos = cfg->max_position_embeddings;
    if (mt_cfg_int(s, rp, pre, "original_max_position_embeddings", &cfg->rope_original_max_pos) == MT_ERR)
        return MT_ERR;
    return MT_OK;
}

/* ---- the model type and its transformers defaults ---- */

typedef struct {
    const char *name, *architecture;
    mt_arch arch;
    int max_pos;     /* max_position_embeddings default */
    int kv_default;  /* num_key_value_heads when absent (0: = H); null always means H */
    int head_dim;    /* head_dim when absent (0: C / H) */
} mt_arch_info;

static const mt_arch_info mt_archs[] = {
    {"llama", "LlamaForCausalLM", MT_ARCH_LLAMA, 2048, 0, 0},
    {"mistral", "MistralForCausalLM", MT_ARCH_MISTRAL, 4096 * 32, 8, 0},
    {"qwen2", "Qwen2ForCausalLM", MT_ARCH_QWEN2, 32768, 32, 0},
    {"qwen3", "Qwen3ForCausalLM", MT_ARCH_QWEN3, 32768, 32, 128},
    {"mixtral", "MixtralForCausalLM", MT_ARCH_MIXTRAL, 4096 * 32, 8, 0},
    {"qwen3_moe", "Qwen3MoeForCausalLM", MT_ARCH_QWEN3_MOE, 32768, 4, 0}, /* head_dim: C / H */
    {"qwen3_5", "Qwen3_5ForCausalLM", MT_ARCH_QWEN3_5, 32768, 4, 256},
    {"qwen3_5_moe", "Qwen3_5MoeForCausalLM", MT_ARCH_QWEN3_5_MOE, 32768, 2, 256},
    {"gpt_oss", "GptOssForCausalLM", MT_ARCH_GPT_OSS, 131072, 8, 64},
    {"gemma3", "Gemma3ForCausalLM", MT_ARCH_GEMMA3, 131072, 4, 256}, /* gemma3_text; gemma3 nests it */
    {"gemma4", "Gemma4ForCausalLM", MT_ARCH_GEMMA4, 131072, 4, 256}, /* gemma4_text; gemma4 nests it */
};

static const mt_arch_info *arch_info(mt_arch a) {
    for (size_t i = 0; i < sizeof mt_archs / sizeof mt_archs[0]; i++)
        if (mt_archs[i].arch == a) return &mt_archs[i];
    MT_CHECK(0, "unknown arch %d", (int)a);
}

void mt_config_arch_names(mt_arch a, const char **model_type, const char **architecture) {
    const mt_arch_info *info = arch_info(a);
    *model_type = info->name;
    *architecture = info->architecture;
}


/* The model type; a multimodal checkpoint's config (qwen3_5 with a text_config) gives the object
 * the model's fields are read from in *s. */
static int cfg_model_type(mt_config *cfg, mt_cfg_src *s, const mt_arch_info **info) {
    json_t *mt = json_object_get(s->root, "model_type");
    if (!mt || json_is_null(mt)) return mt_error_set("%s: model_type is missing", s->path);
    if (!json_is_string(mt)) return mt_error_set("%s: model_type must be a string", s->path);
    const char *name = json_string_value(mt);
    size_t len = strlen(name);
    int text = len > 5 && strcmp(name + len - 5, "_text") == 0; /* Qwen3_5TextConfig's own name */
    for (size_t i = 0; i < sizeof mt_archs / sizeof mt_archs[0]; i++) {
        int same = text ? strlen(mt_archs[i].name) == len - 5 && strncmp(name, mt_archs[i].name, len - 5) == 0
                        : strcmp(name, mt_archs[i].name) == 0;
        if (same && text && mt_archs[i].arch != MT_ARCH_QWEN3_5 && mt_archs[i].arch != MT_ARCH_QWEN3_5_MOE &&
            mt_archs[i].arch != MT_ARCH_GEMMA3 && mt_archs[i].arch != MT_ARCH_GEMMA4)
            same = 0;
        if (same) {
            *info = &mt_archs[i];
            cfg->arch = mt_archs[i].arch;
            snprintf(cfg->model_type, sizeof cfg->model_type, "%s", name);
            json_t *tc = json_object_get(s->root, "text_config");
            /* Gemma3Config / Gemma4Config (multimodal) always nest their language model */
            int gemma = mt_config_is_gemma3(cfg) || mt_config_is_gemma4(cfg);
            if (!text && gemma && (!tc || json_is_null(tc)))
                return mt_error_set("%s: model_type %s without a text_config (the language "
                                    "model's fields): use model_type %s_text for a text model",
                                    s->path, name, name);
            if (!text && (mt_config_is_qwen3_5(cfg) || gemma) && tc && !json_is_null(tc)) {
                if (!json_is_object(tc)) return mt_error_set("%s: text_config must be an object", s->path);
                cfg->nested = 1;
                s->root = tc; /* the language model's fields; vision_config is not ours */
            }
            return MT_OK;
        }
    }
    return mt_error_set("%s: model_type \"%s\" is not supported (supported: llama, mistral, qwen2, "
                        "qwen3, mixtral, qwen3_moe, qwen3_5, qwen3_5_moe, gpt_oss, gemma3_text, gemma3, gemma4_text, "
                        "gemma4)", s->path, name);
}

/* bos/eos: int, list of ints (the first is taken) or null. */
static int cfg_token_id(const mt_cfg_src *s, const char *key, int *out) {
    *out = -1;
    json_t *v = json_object_get(s->root, key);
    if (v && json_is_array(v)) {
        if (json_array_size(v) == 0) return MT_OK;
        json_t *wrap = json_object();
        json_object_set(wrap, key, json_array_get(v, 0));
        int r = mt_cfg_int(s, wrap, "", key, out);
        json_decref(wrap);
        return r == MT_ERR ? MT_ERR : MT_OK;
    }
    return mt_cfg_int(s, s->root, "", key, out) == MT_ERR ? MT_ERR : MT_OK;
}

static int cfg_sizes(mt_config *cfg, const mt_cfg_src *s, const mt_arch_info *info) {
    MT_TRY(mt_cfg_size(s, "hidden_size", &cfg->C));
    if (cfg->arch != MT_ARCH_QWEN3_5_MOE) /* it has none: F is its shared expert's width */
        MT_TRY(mt_cfg_size(s, "intermediate_size", &cfg->F));
    MT_TRY(mt_cfg_size(s, "num_hidden_layers", &cfg->L));
    MT_TRY(mt_cfg_size(s, "num_attention_heads", &cfg->H));
    MT_TRY(mt_cfg_size(s, "vocab_size", &cfg->V));
    json_t *kv = json_object_get(s->root, "num_key_value_heads");
    cfg->G = (kv || !info->kv_default) ? cfg->H : info->kv_default;
    if (mt_cfg_int(s, s->root, "", "num_key_value_heads", &cfg->G) == MT_ERR) return MT_ERR;
    json_t *hd = json_object_get(s->root, "head_dim");
    cfg->D = (!hd && info->head_dim) ? info->head_dim : cfg->C / cfg->H;
    if (mt_cfg_int(s, s->root, "", "head_dim", &cfg->D) == MT_ERR) return MT_ERR;
    cfg->max_position_embeddings = info->max_pos;
    if (mt_cfg_int(s, s->root, "", "max_position_embeddings", &cfg->max_position_embeddings) == MT_ERR)
        return MT_ERR;
    if (cfg->arch == MT_ARCH_LLAMA && cfg->C % cfg->H != 0) /* LlamaConfig refuses it too */
        return mt_error_set("%s: hidden_size %d is not a multiple of num_attention_heads %d", s->path,
                            cfg->C, cfg->H);
    return MT_OK;
}

static int cfg_flags(mt_config *cfg, const mt_cfg_src *s) {
    int attn_bias = mt_config_is_gpt_oss(cfg), mlp_bias = 0; /* GptOssConfig: attention_bias true */
    if (mt_config_is_gpt_oss(cfg) || mt_config_is_gemma3(cfg) || mt_config_is_gemma4(cfg) || cfg->arch == MT_ARCH_LLAMA || cfg->arch == MT_ARCH_QWEN3 || cfg->arch == MT_ARCH_QWEN3_MOE ||
        mt_config_is_qwen3_5(cfg))
        if (mt_cfg_bool(s, "attention_bias", &attn_bias) == MT_ERR) return MT_ERR;
    if (cfg->arch == MT_ARCH_LLAMA && mt_cfg_bool(s, "mlp_bias", &mlp_bias) == MT_ERR) return MT_ERR;
    cfg->qkv_bias = cfg->arch == MT_ARCH_QWEN2 ? 1 : attn_bias;
    cfg->o_bias = attn_bias;
    cfg->mlp_bias = mlp_bias;
    cfg->qk_norm = cfg->arch == MT_ARCH_QWEN3 || cfg->arch == MT_ARCH_QWEN3_MOE;
    cfg->tie_word_embeddings = 0;
    if (mt_cfg_bool(s, "tie_word_embeddings", &cfg->tie_word_embeddings) == MT_ERR) return MT_ERR;

    /* Only Mistral and Mixtral honour sliding_window without use_sliding_window; absent means
     * their default (4096 and none). */
    cfg->sliding_window = 0;
    if (cfg->arch == MT_ARCH_MISTRAL || cfg->arch == MT_ARCH_MIXTRAL) {
        json_t *v = json_object_get(s->root, "sliding_window");
        if (!v && cfg->arch == MT_ARCH_MISTRAL) cfg->sliding_window = 4096;
        if (mt_cfg_int(s, s->root, "", "sliding_window", &cfg->sliding_window) == MT_ERR) return MT_ERR;
    }
    double eps = 1e-6, init = 0.02;
    if (mt_cfg_num(s, s->root, "", "rms_norm_eps", &eps) == MT_ERR) return MT_ERR;
    if (mt_cfg_num(s, s->root, "", "initializer_range", &init) == MT_ERR) return MT_ERR;
    cfg->rms_norm_eps = (float)eps;
    cfg->initializer_range = (float)init;
    MT_TRY(cfg_token_id(s, "bos_token_id", &cfg->bos_token_id));
    MT_TRY(cfg_token_id(s, "eos_token_id", &cfg->eos_token_id));
    cfg->pad_token_id = -1; /* read where it matters (config_gemma3.c) */
    return MT_OK;
}

/* ---- mixture of experts ---- */

/* qwen3_moe's mlp_only_layers: null or a list of layer indices (0..L-1). */
static int cfg_mlp_only(mt_config *cfg, const mt_cfg_src *s) {
    json_t *v = json_object_get(s->root, "mlp_only_layers");
    if (!v || json_is_null(v)) return MT_OK;
    if (!json_is_array(v)) return mt_error_set("%s: mlp_only_layers must be a list of layer indices", s->path);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= cfg->L)
            return mt_error_set("%s: mlp_only_layers[%zu] is not a layer index (0..%d)", s->path, i,
                                cfg->L - 1);
        int l = (int)json_integer_value(e);
        cfg->mlp_only[l / 8] |= (uint8_t)(1u << (l % 8));
    }
    return MT_OK;
}

/* Mixtral: every layer routes to num_local_experts experts of width intermediate_size, top-k
 * gates always renormalised; Qwen3-MoE: experts of width moe_intermediate_size, norm_topk_prob,
 * dense layers by decoder_sparse_step and mlp_only_layers. Defaults are transformers 5's. */
static int cfg_moe(mt_config *cfg, const mt_cfg_src *s) {
    cfg->sparse_step = 1;
    if (cfg->arch != MT_ARCH_MIXTRAL && cfg->arch != MT_ARCH_QWEN3_MOE) return MT_OK;
    int mix = cfg->arch == MT_ARCH_MIXTRAL;
    /* transformers maps num_experts to num_local_experts for both (attribute_map); its
     * save_pretrained writes num_local_experts even for qwen3_moe, whose published configs say
     * num_experts */
    int a = 0, b = 0;
    int ra = mt_cfg_int(s, s->root, "", "num_local_experts", &a);
    int rb = mt_cfg_int(s, s->root, "", "num_experts", &b);
    if (ra == MT_ERR || rb == MT_ERR) return MT_ERR;
    if (ra == 1 && rb == 1 && a != b)
        return mt_error_set("%s: num_local_experts = %d and num_experts = %d disagree", s->path, a, b);
    cfg->n_experts = ra == 1 ? a : rb == 1 ? b : (mix ? 8 : 128);
    cfg->top_k = mix ? 2 : 8;
    if (mt_cfg_int(s, s->root, "", "num_experts_per_tok", &cfg->top_k) == MT_ERR) return MT_ERR;
    cfg->moe_F = mix ? cfg->F : 768;
    if (!mix && mt_cfg_int(s, s->root, "", "moe_intermediate_size", &cfg->moe_F) == MT_ERR) return MT_ERR;
    cfg->norm_topk_prob = mix; /* MixtralTopKRouter always divides by the top-k sum */
    if (!mix && mt_cfg_bool(s, "norm_topk_prob", &cfg->norm_topk_prob) == MT_ERR) return MT_ERR;
    if (!mix) {
        if (mt_cfg_int(s, s->root, "", "decoder_sparse_step", &cfg->sparse_step) == MT_ERR) return MT_ERR;
        if (cfg->sparse_step <= 0)
            return mt_error_set("%s: decoder_sparse_step = %d must be positive", s->path, cfg->sparse_step);
        MT_TRY(cfg_mlp_only(cfg, s));
    }
    cfg->router_aux = 0;
    if (mt_cfg_bool(s, "output_router_logits", &cfg->router_aux) == MT_ERR) return MT_ERR;
    double coef = 0.001;
    if (mt_cfg_num(s, s->root, "", "router_aux_loss_coef", &coef) == MT_ERR) return MT_ERR;
    cfg->router_aux_coef = (float)coef;
    double jitter = 0;
    if (mt_cfg_num(s, s->root, "", "router_jitter_noise", &jitter) == MT_ERR) return MT_ERR;
    if (jitter != 0)
        return mt_error_set("%s: router_jitter_noise = %g is not supported (must be 0)", s->path, jitter);
    return MT_OK;
}

/* A multimodal config may say tie_word_embeddings at the top level too: it must not contradict
 * the text config's. */
static int cfg_nested_tie(mt_config *cfg, const mt_cfg_src *top) {
    int tie = cfg->tie_word_embeddings;
    int r = mt_cfg_bool(top, "tie_word_embeddings", &tie);
    if (r == MT_ERR) return MT_ERR;
    if (r == 1 && json_object_get(top->root, "text_config") &&
        json_object_get(json_object_get(top->root, "text_config"), "tie_word_embeddings") &&
        tie != cfg->tie_word_embeddings)
        return mt_error_set("%s: tie_word_embeddings = %s but text_config.tie_word_embeddings = %s",
                            top->path, tie ? "true" : "false",
                            cfg->tie_word_embeddings ? "true" : "false");
    cfg->tie_word_embeddings = tie;
    return MT_OK;
}

float mt_config_norm_offset(const mt_config *cfg) { return cfg->norm_offset ? 1.0f : 0.0f; }

int mt_config_rotary_dim(const mt_config *cfg) { return cfg->rotary_dim ? cfg->rotary_dim : cfg->D; }

mt_mixer mt_config_layer_mixer(const mt_config *cfg, int l) {
    return cfg->deltanet[l / 8] & (1u << (l % 8)) ? MT_MIXER_GATED_DELTANET : MT_MIXER_ATTENTION;
}

int mt_config_mixer_layers(const mt_config *cfg, mt_mixer m) {
    int n = 0;
    for (int l = 0; l < cfg->L; l++) n += mt_config_layer_mixer(cfg, l) == m;
    return n;
}

const char *mt_mixer_name(mt_mixer m) {
    return m == MT_MIXER_GATED_DELTANET ? "gated_deltanet" : "attention";
}

int mt_config_layer_window(const mt_config *cfg, int l) {
    return cfg->sliding[l / 8] & (1u << (l % 8)) ? cfg->attn_window : 0;
}

/* Gemma 4's full layers: their own head dim and kv heads (global_D > 0 and not sliding). */
static int layer_global(const mt_config *cfg, int l) {
    return cfg->global_D > 0 && mt_config_layer_window(cfg, l) == 0;
}

int mt_config_layer_head_dim(const mt_config *cfg, int l) {
    return layer_global(cfg, l) ? cfg->global_D : cfg->D;
}

int mt_config_layer_kv_heads(const mt_config *cfg, int l) {
    return layer_global(cfg, l) ? cfg->global_G : cfg->G;
}

int mt_config_layer_rotary_dim(const mt_config *cfg, int l) {
    return layer_global(cfg, l) ? cfg->global_D : mt_config_rotary_dim(cfg);
}

int mt_config_layer_k_eq_v(const mt_config *cfg, int l) { return cfg->k_eq_v && layer_global(cfg, l); }

int mt_config_max_head_dim(const mt_config *cfg) { return cfg->global_D > cfg->D ? cfg->global_D : cfg->D; }

int mt_config_max_kv_heads(const mt_config *cfg) { return cfg->global_G > cfg->G ? cfg->global_G : cfg->G; }

int mt_config_max_kv_width(const mt_config *cfg) {
    int w = cfg->G * cfg->D, g = cfg->global_G * cfg->global_D;
    return g > w ? g : w;
}

double mt_config_rope_attention_scaling(const mt_config *cfg) {
    if (cfg->rope_type != MT_ROPE_YARN || cfg->rope_factor <= 1) return 1.0;
    return 0.1 * log(cfg->rope_factor) + 1.0; /* transformers' yarn_get_mscale */
}

int mt_config_layer_is_moe(const mt_config *cfg, int l) {
    if (cfg->n_experts <= 0) return 0;
    if (cfg->mlp_only[l / 8] & (1u << (l % 8))) return 0;
    return (l + 1) % cfg->sparse_step == 0;
}

int mt_config_moe_layers(const mt_config *cfg) {
    int n = 0;
    for (int l = 0; l < cfg->L; l++) n += mt_config_layer_is_moe(cfg, l);
    return n;
}

static int cfg_parse_root(mt_config *cfg, const mt_cfg_src *top) {
    const mt_arch_info *info = NULL;
    if (!json_is_object(top->root)) return mt_error_set("%s: the top level must be a JSON object", top->path);
    mt_cfg_src src = *top, *s = &src;
    MT_TRY(cfg_model_type(cfg, s, &info));
    MT_TRY(cfg_refuse_unsupported(cfg, s));
    MT_TRY(cfg_sizes(cfg, s, info));
    MT_TRY(cfg_flags(cfg, s));
    MT_TRY(cfg_moe(cfg, s));
    if (!mt_config_is_gpt_oss(cfg) && !mt_config_is_gemma3(cfg) && !mt_config_is_gemma4(cfg))
        MT_TRY(cfg_parse_rope(cfg, s)); /* gpt_oss: YaRN; gemma3/4: a RoPE per layer type; their files */
    cfg->rotary_dim = cfg->D;
    if (mt_config_is_qwen3_5(cfg)) MT_TRY(mt_config_parse_qwen3_5(cfg, s));
    if (mt_config_is_gpt_oss(cfg)) MT_TRY(mt_config_parse_gpt_oss(cfg, s));
    if (mt_config_is_gemma3(cfg)) MT_TRY(mt_config_parse_gemma3(cfg, s));
    if (mt_config_is_gemma4(cfg)) MT_TRY(mt_config_parse_gemma4(cfg, s));
    if (cfg->nested) MT_TRY(cfg_nested_tie(cfg, top));
    return mt_config_validate(cfg, s->path);
}

int mt_config_parse(mt_config *cfg, const char *json_text, const char *path) {
    json_error_t jerr;
    json_t *root = json_loads(json_text, 0, &jerr);
    if (!root)
        return mt_error_set("%s: invalid JSON at line %d, column %d: %s", path, jerr.line,
                            jerr.column, jerr.text);
    mt_config tmp;
    memset(&tmp, 0, sizeof tmp);
    mt_cfg_src s = {path, root};
    int r = cfg_parse_root(&tmp, &s);
    json_decref(root);
    if (r == MT_OK) *cfg = tmp; /* nothing half-done on error */
    return r;
}

int mt_config_load(mt_config *cfg, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return mt_error_set("%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return mt_error_set("%s: cannot seek", path); }
    long n = ftell(f);
    if (n < 0 || n > (64L << 20)) {
        fclose(f);
        return mt_error_set("%s: not a plausible config.json (size %ld bytes)", path, n);
    }
    rewind(f);
    char *text = mt_malloc((size_t)n + 1);
    size_t got = fread(text, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) {
        free(text);
        return mt_error_set("%s: short read (%zu of %ld bytes)", path, got, n);
    }
    text[n] = '\0';
    int r = mt_config_parse(cfg, text, path);
    free(text);
    return r;
}

int mt_config_validate(const mt_config *cfg, const char *path) {
    const struct { const char *name; int v; } sizes[] = {
        {"hidden_size", cfg->C}, {"intermediate_size", cfg->F}, {"num_hidden_layers", cfg->L},
        {"num_attention_heads", cfg->H}, {"num_key_value_heads", cfg->G}, {"head_dim", cfg->D},
        {"vocab_size", cfg->V},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].v <= 0)
            return mt_error_set("%s: %s = %d must be positive", path, sizes[i].name, sizes[i].v);
    if (cfg->H % cfg->G != 0)
        return mt_error_set("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                            path, cfg->H, cfg->G);
    /* Upper bounds, so that an absurd value is this error instead of an out-of-memory fatal
     * later. Each is far above any published model (C 16384, F 53248, L 126, H 128, D 256,
     * V 262144, 10M positions); with them (and G <= H) every product below fits in int64. */
    const struct { const char *name; int v, max; } bounds[] = {
        {"hidden_size", cfg->C, MT_CONFIG_MAX_WIDTH},
        {"intermediate_size", cfg->F, MT_CONFIG_MAX_WIDTH},
        {"num_hidden_layers", cfg->L, MT_CONFIG_MAX_LAYERS},
        {"num_attention_heads", cfg->H, MT_CONFIG_MAX_HEADS},
        {"num_key_value_heads", cfg->G, MT_CONFIG_MAX_HEADS},
        {"head_dim", cfg->D, MT_CONFIG_MAX_HEAD_DIM},
        {"vocab_size", cfg->V, MT_CONFIG_MAX_VOCAB},
        {"max_position_embeddings", cfg->max_position_embeddings, MT_CONFIG_MAX_POSITIONS},
    };
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++)
        if (bounds[i].v > bounds[i].max)
            return mt_error_set("%s: %s = %d is larger than megatrain's limit %d", path,
                                bounds[i].name, bounds[i].v, bounds[i].max);
    if ((int64_t)cfg->H * cfg->D > MT_CONFIG_MAX_WIDTH)
        return mt_error_set("%s: num_attention_heads * head_dim = %d * %d is larger than "
                            "megatrain's limit %d", path, cfg->H, cfg->D, MT_CONFIG_MAX_WIDTH);
    if (cfg->arch == MT_ARCH_MIXTRAL && cfg->n_experts <= 0)
        return mt_error_set("%s: num_local_experts = %d must be positive", path, cfg->n_experts);
    if (cfg->n_experts < 0 || cfg->n_experts > MT_CONFIG_MAX_EXPERTS)
        return mt_error_set("%s: num_experts = %d must be in 0..%d", path, cfg->n_experts,
                            MT_CONFIG_MAX_EXPERTS);
    if (cfg->n_experts > 0) {
        if (cfg->top_k < 1 || cfg->top_k > cfg->n_experts)
            return mt_error_set("%s: num_experts_per_tok = %d must be in 1..num_experts (%d)", path,
                                cfg->top_k, cfg->n_experts);
        if (cfg->moe_F <= 0 || cfg->moe_F > MT_CONFIG_MAX_WIDTH)
            return mt_error_set("%s: moe_intermediate_size = %d must be in 1..%d", path, cfg->moe_F,
                                MT_CONFIG_MAX_WIDTH);
        if (cfg->sparse_step <= 0)
            return mt_error_set("%s: decoder_sparse_step = %d must be positive", path, cfg->sparse_step);
        if (!isfinite(cfg->router_aux_coef))
            return mt_error_set("%s: router_aux_loss_coef = %g must fit a float32", path,
                                cfg->router_aux_coef);
    }
    if (mt_config_is_qwen3_5(cfg)) {
        const struct { const char *name; int64_t v; } w[] = {
            {"linear_num_key_heads * linear_key_head_dim", (int64_t)cfg->lin_Hk * cfg->lin_Dk},
            {"linear_num_value_heads * linear_value_head_dim", (int64_t)cfg->lin_Hv * cfg->lin_Dv},
            {"linear_conv_kernel_dim", cfg->lin_K},
        };
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            if (w[i].v <= 0 || w[i].v > MT_CONFIG_MAX_WIDTH)
                return mt_error_set("%s: %s = %lld must be in 1..%d", path, w[i].name,
                                    (long long)w[i].v, MT_CONFIG_MAX_WIDTH);
        if (cfg->lin_Hk <= 0 || cfg->lin_Hv % cfg->lin_Hk != 0)
            return mt_error_set("%s: linear_num_value_heads %d is not a multiple of "
                                "linear_num_key_heads %d", path, cfg->lin_Hv, cfg->lin_Hk);
    }
    if (cfg->rotary_dim != 0 && (cfg->rotary_dim < 2 || cfg->rotary_dim > cfg->D || cfg->rotary_dim % 2 != 0))
        return mt_error_set("%s: %d rotary dims of head_dim %d (partial_rotary_factor) must be even "
                            "and at most head_dim", path, cfg->rotary_dim, cfg->D);
    int64_t n = mt_config_param_count(cfg);
    if (n > MT_CONFIG_MAX_PARAMS)
        return mt_error_set("%s: the model has %lld parameters (hidden_size %d, intermediate_size "
                            "%d, num_hidden_layers %d, vocab_size %d), more than megatrain's limit "
                            "2^40 = %lld", path, (long long)n, cfg->C, cfg->F, cfg->L, cfg->V,
                            (long long)MT_CONFIG_MAX_PARAMS);
    if (cfg->D % 2 != 0) return mt_error_set("%s: head_dim = %d must be even (RoPE)", path, cfg->D);
    if (cfg->max_position_embeddings <= 0)
        return mt_error_set("%s: max_position_embeddings = %d must be positive", path,
                            cfg->max_position_embeddings);
    if (cfg->sliding_window < 0)
        return mt_error_set("%s: sliding_window = %d must be positive or null", path,
                            cfg->sliding_window);
    /* float fields: a value past float32's range became inf when read (json_real cannot write it) */
    if (!(cfg->rms_norm_eps > 0) || isinf(cfg->rms_norm_eps))
        return mt_error_set("%s: rms_norm_eps = %g must be positive and fit a float32", path,
                            cfg->rms_norm_eps);
    if (!isfinite(cfg->initializer_range))
        return mt_error_set("%s: initializer_range = %g must fit a float32", path, cfg->initializer_range);
    if (!(cfg->rope_theta > 0))
        return mt_error_set("%s: rope_theta = %g must be positive", path, cfg->rope_theta);
    if (cfg->rope_type == MT_ROPE_LLAMA3 &&
        !(cfg->rope_factor > 0 && cfg->rope_original_max_pos > 0 && cfg->rope_low_freq_factor > 0 &&
          cfg->rope_high_freq_factor > cfg->rope_low_freq_factor))
        return mt_error_set("%s: rope_scaling (llama3): factor, low_freq_factor, high_freq_factor and "
                            "original_max_position_embeddings must be positive, with "
                            "high_freq_factor > low_freq_factor", path);
    if (cfg->rope_type == MT_ROPE_LINEAR && !(cfg->rope_factor >= 1))
        return mt_error_set("%s: rope_scaling (linear): factor = %g must be at least 1", path,
                            cfg->rope_factor);
    if (cfg->rope_type == MT_ROPE_YARN &&
        !(cfg->rope_factor > 0 && cfg->rope_original_max_pos > 0 && cfg->rope_beta_fast > 0 &&
          cfg->rope_beta_slow > 0))
        return mt_error_set("%s: rope_parameters (yarn): factor, original_max_position_embeddings, "
                            "beta_fast and beta_slow must be positive", path);
    if (cfg->attn_window < 0)
        return mt_error_set("%s: sliding_window = %d must be positive", path, cfg->attn_window);
    if (cfg->arch == MT_ARCH_GPT_OSS && (!(cfg->swiglu_limit > 0) || !(cfg->swiglu_alpha > 0)))
        return mt_error_set("%s: swiglu_alpha = %g and swiglu_limit = %g must be positive", path,
                            cfg->swiglu_alpha, cfg->swiglu_limit);
    return MT_OK;
}

/* ---- derived quantities ---- */

/* An attention layer's parameters (layer l's head dim and kv heads; no v_proj where k = v). */
static int64_t attn_params(const mt_config *cfg, int l) {
    int64_t C = cfg->C, H = cfg->H;
    int64_t G = mt_config_layer_kv_heads(cfg, l), D = mt_config_layer_head_dim(cfg, l);
    int64_t kv = mt_config_layer_k_eq_v(cfg, l) ? 1 : 2;
    int64_t attn = (H * D * (cfg->attn_gate ? 2 : 1) + kv * G * D) * C /* q (and its gate), k, v */
                   + C * H * D;                                         /* o */
    if (cfg->qkv_bias) attn += H * D * (cfg->attn_gate ? 2 : 1) + kv * G * D;
    if (cfg->o_bias) attn += C;
    if (cfg->qk_norm) attn += 2 * D;
    if (cfg->attn_sinks) attn += H;
    return attn;
}

/* Parameters of the model; with `active`, an MoE layer counts its router and k of its E experts. */
static int64_t param_count(const mt_config *cfg, int active) {
    int64_t C = cfg->C, F = cfg->F, V = cfg->V;
    int64_t dense = 3 * F * C + (cfg->mlp_bias ? 2 * F + C : 0); /* gate, up, down */
    int64_t experts = active ? cfg->top_k : cfg->n_experts;
    int64_t moe = (int64_t)cfg->n_experts * C + experts * 3 * (int64_t)cfg->moe_F * C; /* router + experts */
    if (cfg->shared_expert) moe += dense + C;                     /* the shared expert and its gate */
    if (cfg->moe_beside_dense) moe += dense + C + cfg->n_experts + 3 * C; /* gemma4: the dense MLP,
                                            the router's two scales, the branches' three norms */
    if (mt_config_is_gpt_oss(cfg)) moe += cfg->n_experts + experts * (2 * (int64_t)cfg->moe_F + C); /* biases */
    int64_t total = V * C + C;                                    /* embedding, final norm */
    for (int l = 0; l < cfg->L; l++) {
        total += (cfg->sandwich_norm ? 4 : 2) * C; /* input + post norms (+ the branch outputs') */
        total += cfg->layer_scalar;                /* gemma4's buffer */
        total += mt_config_layer_mixer(cfg, l) == MT_MIXER_GATED_DELTANET ? mt_config_deltanet_params(cfg)
                                                                           : attn_params(cfg, l);
        total += mt_config_layer_is_moe(cfg, l) ? moe : dense;
    }
    if (!cfg->tie_word_embeddings) total += V * C;
    return total;
}

int64_t mt_config_param_count(const mt_config *cfg) { return param_count(cfg, 0); }
int64_t mt_config_active_param_count(const mt_config *cfg) { return param_count(cfg, 1); }

/* transformers' _compute_default_rope_parameters and _compute_llama3_parameters, in double. */
int mt_config_rope_sets(const mt_config *cfg) { return cfg->rope_local_theta > 0 ? 2 : 1; }

int mt_config_rope_stride(const mt_config *cfg) { return mt_config_max_head_dim(cfg) / 2; }

size_t mt_config_rope_inv_freq_len(const mt_config *cfg) {
    return (size_t)mt_config_rope_sets(cfg) * (size_t)mt_config_rope_stride(cfg);
}

int mt_config_layer_rope_set(const mt_config *cfg, int l) {
    return cfg->rope_local_theta > 0 && mt_config_layer_window(cfg, l) > 0;
}

double mt_config_attn_scale(const mt_config *cfg) {
    return cfg->query_pre_attn_scalar > 0 ? 1.0 / sqrt((double)cfg->query_pre_attn_scalar) : 0.0;
}

void mt_config_rope_inv_freq(const mt_config *cfg, float *inv_freq) {
    const double pi = 3.14159265358979323846;
    if (mt_config_is_gemma4(cfg)) { /* each layer type its own head dim */
        mt_config_gemma4_inv_freq(cfg, inv_freq);
        return;
    }
    int D = mt_config_rotary_dim(cfg), stride = mt_config_rope_stride(cfg); /* partial RoPE: the
                                                       rotated dims' own frequencies */
    if (cfg->rope_local_theta > 0) /* set 1: the sliding layers' plain RoPE (Gemma 3) */
        for (int i = 0; i < D / 2; i++)
            inv_freq[stride + i] = (float)(1.0 / pow(cfg->rope_local_theta, (double)(2 * i) / (double)D));
    if (cfg->rope_type == MT_ROPE_YARN) {
        mt_config_yarn_inv_freq(cfg, inv_freq);
        return;
    }
    for (int i = 0; i < D / 2; i++) {
        double f = 1.0 / pow(cfg->rope_theta, (double)(2 * i) / (double)D);
        if (cfg->rope_type == MT_ROPE_LINEAR) f /= cfg->rope_factor; /* positions / factor */
        if (cfg->rope_type == MT_ROPE_LLAMA3) {
            double old = cfg->rope_original_max_pos;
            double lo = cfg->rope_low_freq_factor, hi = cfg->rope_high_freq_factor;
            double wavelen = 2 * pi / f;
            if (wavelen > old / lo) {
                f = f / cfg->rope_factor;
            } else if (!(wavelen < old / hi)) {
                double smooth = (old / wavelen - lo) / (hi - lo);
                f = (1 - smooth) * f / cfg->rope_factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}
