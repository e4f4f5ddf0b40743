/* config.json fields of Google's Gemma 3 text models (transformers 5.25 gemma3_text;
 * tests/fixtures/README.md, "Gemma 3 fixtures", has each fact with its line in transformers):
 * sliding and full attention layers (layer_types, else every sliding_window_pattern-th layer is
 * full; sliding_window W keys, the current one included), the scores scaled by
 * query_pre_attn_scalar^-0.5, each layer type its own RoPE (sliding: default with
 * rope_local_base_freq; full: rope_theta, with rope_scaling's linear factor), q/k norms, (1 + w)
 * norms with the branch outputs normed too (sandwich norms), GeGLU with gelu_pytorch_tanh, the
 * embedding scaled by sqrt(hidden_size), the pad token's row frozen in the lookup, a tied head.
 * Defaults are Gemma3TextConfig's. */
#include "model/config_gemma3.h"
#include "model/config_sliding.h"

#include <math.h>
#include <string.h>

#include "core/error.h"

int mt_config_is_gemma3(const mt_config *cfg) { return cfg->arch == MT_ARCH_GEMMA3; }

/* layer_types: L names; absent: layer i slides unless (i + 1) % sliding_window_pattern == 0
 * (the public key, or the private one 5.25 writes; default 6); the window defaults to 4096. */
static int parse_layer_types(mt_config *cfg, const mt_cfg_src *s) {
    int every = 6;
    int r = mt_cfg_int(s, s->root, "", "sliding_window_pattern", &every);
    if (r == MT_ERR) return MT_ERR;
    if (r == 0 && mt_cfg_int(s, s->root, "", "_sliding_window_pattern", &every) == MT_ERR) return MT_ERR;
    if (every <= 0) return mt_error_set("%s: sliding_window_pattern = %d must be positive", s->path, every);
    return mt_config_parse_sliding(cfg, s, every, 4096);
}

/* One layer type's RoPE dict: rope_theta into *theta when given, its type (default or, where
 * `linear_ok`, linear with its factor). */
static int parse_rope_dict(mt_config *cfg, const mt_cfg_src *s, json_t *rp, const char *pre,
                           int linear_ok, double *theta) {
    if (!json_is_object(rp)) return mt_error_set("%s: %s must be an object", s->path, pre);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s.", pre);
    if (mt_cfg_num(s, rp, prefix, "rope_theta", theta) == MT_ERR) return MT_ERR;
    double prf = 1.0;
    if (mt_cfg_num(s, rp, prefix, "partial_rotary_factor", &prf) == MT_ERR) return MT_ERR;
    if (prf != 1.0)
        return mt_error_set("%s: %spartial_rotary_factor = %g is not supported for gemma3 (must be 1)",
                            s->path, prefix, prf);
    json_t *ty = json_object_get(rp, "rope_type");
    if (!ty || json_is_null(ty)) ty = json_object_get(rp, "type");
    if (ty && !json_is_null(ty) && !json_is_string(ty))
        return mt_error_set("%s: %srope_type must be a string", s->path, prefix);
    const char *tname = ty && json_is_string(ty) ? json_string_value(ty) : "default";
    if (strcmp(tname, "default") == 0) return MT_OK;
    if (!linear_ok || strcmp(tname, "linear") != 0)
        return mt_error_set("%s: %srope_type \"%s\" is not supported for gemma3 (supported: default%s)",
                            s->path, prefix, tname, linear_ok ? ", linear" : "");
    cfg->rope_type = MT_ROPE_LINEAR;
    cfg->rope_factor = 1.0;
    if (mt_cfg_num(s, rp, prefix, "factor", &cfg->rope_factor) == MT_ERR) return MT_ERR;
    if (!(cfg->rope_factor >= 1.0) || !isfinite(cfg->rope_factor))
        return mt_error_set("%s: %sfactor = %g must be at least 1", s->path, prefix, cfg->rope_factor);
    return MT_OK;
}

/* The two RoPEs: rope_parameters keyed by layer type (5.25), else the legacy keys (rope_theta,
 * rope_local_base_freq, rope_scaling merged into the full layers' only). */
static int parse_rope(mt_config *cfg, const mt_cfg_src *s) {
    cfg->rope_type = MT_ROPE_DEFAULT;
    cfg->rope_theta = 1000000.0;
    cfg->rope_local_theta = 10000.0;
    if (mt_cfg_num(s, s->root, "", "rope_theta", &cfg->rope_theta) == MT_ERR) return MT_ERR;
    if (mt_cfg_num(s, s->root, "", "rope_local_base_freq", &cfg->rope_local_theta) == MT_ERR) return MT_ERR;
    json_t *rs = json_object_get(s->root, "rope_scaling");
    if (rs && !json_is_null(rs) && json_object_size(rs) > 0)
        MT_TRY(parse_rope_dict(cfg, s, rs, "rope_scaling", 1, &cfg->rope_theta));
    json_t *rp = json_object_get(s->root, "rope_parameters");
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp)) return mt_error_set("%s: rope_parameters must be an object or null", s->path);
        json_t *full = json_object_get(rp, "full_attention"), *slide = json_object_get(rp, "sliding_attention");
        if (!full && !slide) /* one dict for both: the full layers' (as rope_scaling) */
            MT_TRY(parse_rope_dict(cfg, s, rp, "rope_parameters", 1, &cfg->rope_theta));
        if (full && !json_is_null(full))
            MT_TRY(parse_rope_dict(cfg, s, full, "rope_parameters.full_attention", 1, &cfg->rope_theta));
        if (slide && !json_is_null(slide))
            MT_TRY(parse_rope_dict(cfg, s, slide, "rope_parameters.sliding_attention", 0,
                                   &cfg->rope_local_theta));
    }
    if (!(cfg->rope_theta > 0) || !(cfg->rope_local_theta > 0))
        return mt_error_set("%s: rope_theta = %g and the sliding layers' rope_theta = %g must be positive",
                            s->path, cfg->rope_theta, cfg->rope_local_theta);
    return MT_OK;
}

/* What Gemma 3 could ask for that is not implemented: refused by name. */
static int refuse(const mt_cfg_src *s) {
    static const char *caps[] = {"final_logit_softcapping", "attn_logit_softcapping"};
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        json_t *v = json_object_get(s->root, caps[i]);
        if (v && !json_is_null(v))
            return mt_error_set("%s: %s is not supported (must be null, as in every Gemma 3 config)",
                                s->path, caps[i]);
    }
    int bidir = 0;
    if (mt_cfg_bool(s, "use_bidirectional_attention", &bidir) == MT_ERR) return MT_ERR;
    if (bidir)
        return mt_error_set("%s: use_bidirectional_attention = true (an embedding model, not a causal "
                            "LM) is not supported", s->path);
    json_t *act = json_object_get(s->root, "hidden_activation");
    if (act && !json_is_null(act)) {
        if (!json_is_string(act)) return mt_error_set("%s: hidden_activation must be a string", s->path);
        if (strcmp(json_string_value(act), "gelu_pytorch_tanh") != 0)
            return mt_error_set("%s: hidden_activation \"%s\" is not supported (supported: "
                                "gelu_pytorch_tanh)", s->path, json_string_value(act));
    }
    return MT_OK;
}

int mt_config_parse_gemma3(mt_config *cfg, const mt_cfg_src *s) {
    MT_TRY(refuse(s));
    cfg->mlp_act = MT_MLP_GEGLU;
    cfg->norm_offset = 1;
    cfg->qk_norm = 1;
    cfg->sandwich_norm = 1;
    cfg->embed_scale = 1;
    cfg->tie_word_embeddings = 1; /* Gemma3TextConfig's default */
    if (mt_cfg_bool(s, "tie_word_embeddings", &cfg->tie_word_embeddings) == MT_ERR) return MT_ERR;
    cfg->query_pre_attn_scalar = 256;
    /* an int in Gemma3TextConfig (5.25 refuses 24.0 when loading) */
    if (mt_cfg_int(s, s->root, "", "query_pre_attn_scalar", &cfg->query_pre_attn_scalar) == MT_ERR)
        return MT_ERR;
    if (cfg->query_pre_attn_scalar <= 0)
        return mt_error_set("%s: query_pre_attn_scalar = %d must be positive", s->path,
                            cfg->query_pre_attn_scalar);
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
    MT_TRY(parse_rope(cfg, s));
    return MT_OK;
}

static json_t *rope_json(const mt_config *cfg, int full) {
    json_t *r = json_object();
    if (full && cfg->rope_type == MT_ROPE_LINEAR) json_object_set_new(r, "factor", json_real(cfg->rope_factor));
    json_object_set_new(r, "rope_theta", json_real(full ? cfg->rope_theta : cfg->rope_local_theta));
    json_object_set_new(r, "rope_type",
                        json_string(full && cfg->rope_type == MT_ROPE_LINEAR ? "linear" : "default"));
    return r;
}

void mt_config_gemma3_json(const mt_config *cfg, json_t *o) {
    json_object_del(o, "hidden_act");
    json_object_del(o, "rope_theta");
    json_object_del(o, "rope_scaling");
    json_object_set_new(o, "hidden_activation", json_string("gelu_pytorch_tanh"));
    mt_config_sliding_json(cfg, o);
    json_object_set_new(o, "query_pre_attn_scalar", json_integer(cfg->query_pre_attn_scalar));
    json_object_set_new(o, "attention_bias", json_boolean(cfg->o_bias));
    json_object_set_new(o, "final_logit_softcapping", json_null());
    json_object_set_new(o, "attn_logit_softcapping", json_null());
    json_object_set_new(o, "use_bidirectional_attention", json_false());
    json_object_set_new(o, "pad_token_id", cfg->pad_token_id >= 0 ? json_integer(cfg->pad_token_id) : json_null());
    json_t *rp = json_object();
    json_object_set_new(rp, "full_attention", rope_json(cfg, 1));
    json_object_set_new(rp, "sliding_attention", rope_json(cfg, 0));
    json_object_set_new(o, "rope_parameters", rp);
}
