/* config.json fields of OpenAI's gpt-oss (transformers 5.25 gpt_oss; tests/fixtures/README.md,
 * "gpt-oss fixtures", has each fact with its line in transformers): sliding and full attention
 * layers (layer_types, sliding_window: W keys, the current one included), a learned sink per
 * query head, q/k/v/o biases, every layer's MLP E experts with biases, routed by the top-k raw
 * logits of a biased router and a softmax over those k, the clamped SwiGLU (swiglu_alpha,
 * swiglu_limit), YaRN RoPE, plain RMSNorm. Defaults are GptOssConfig's. */
#include "model/config_gpt_oss.h"
#include "model/config_sliding.h"

#include <math.h>
#include <string.h>

#include "core/error.h"

int mt_config_is_gpt_oss(const mt_config *cfg) { return cfg->arch == MT_ARCH_GPT_OSS; }

/* layer_types: L names, "sliding_attention" or "full_attention"; absent: even layers slide; the
 * window defaults to 128. */
static int parse_layer_types(mt_config *cfg, const mt_cfg_src *s) {
    return mt_config_parse_sliding(cfg, s, 2, 128);
}

/* The experts: every layer, num_local_experts (alias num_experts) of width intermediate_size. */
static int parse_moe(mt_config *cfg, const mt_cfg_src *s) {
    int a = 0, b = 0;
    int ra = mt_cfg_int(s, s->root, "", "num_local_experts", &a);
    int rb = mt_cfg_int(s, s->root, "", "num_experts", &b);
    if (ra == MT_ERR || rb == MT_ERR) return MT_ERR;
    if (ra == 1 && rb == 1 && a != b)
        return mt_error_set("%s: num_local_experts = %d and num_experts = %d disagree", s->path, a, b);
    cfg->n_experts = ra == 1 ? a : rb == 1 ? b : 128;
    cfg->top_k = 4;
    if (mt_cfg_int(s, s->root, "", "num_experts_per_tok", &cfg->top_k) == MT_ERR) return MT_ERR;
    cfg->moe_F = cfg->F;
    cfg->norm_topk_prob = 1; /* a softmax over the k chosen logits = their probabilities renormalised */
    cfg->sparse_step = 1;
    cfg->router_aux = 0;
    if (mt_cfg_bool(s, "output_router_logits", &cfg->router_aux) == MT_ERR) return MT_ERR;
    double coef = 0.001;
    if (mt_cfg_num(s, s->root, "", "router_aux_loss_coef", &coef) == MT_ERR) return MT_ERR;
    cfg->router_aux_coef = (float)coef;
    double alpha = 1.702, limit = 7.0;
    if (mt_cfg_num(s, s->root, "", "swiglu_alpha", &alpha) == MT_ERR) return MT_ERR;
    json_t *lim = json_object_get(s->root, "swiglu_limit");
    if (lim && json_is_null(lim))
        return mt_error_set("%s: swiglu_limit = null (no clamp) is not supported for gpt_oss", s->path);
    if (mt_cfg_num(s, s->root, "", "swiglu_limit", &limit) == MT_ERR) return MT_ERR;
    if (!(alpha > 0) || !isfinite((float)alpha))
        return mt_error_set("%s: swiglu_alpha = %g must be positive", s->path, alpha);
    if (!(limit > 0) || !isfinite((float)limit))
        return mt_error_set("%s: swiglu_limit = %g must be positive", s->path, limit);
    cfg->swiglu_alpha = alpha;
    cfg->swiglu_limit = limit;
    return MT_OK;
}

/* YaRN (or default) RoPE: rope_scaling over rope_parameters, keys inside the dict over the top
 * level's rope_theta, as config.c reads the other families; absent: GptOssConfig's YaRN. */
static int parse_rope(mt_config *cfg, const mt_cfg_src *s) {
    cfg->rope_theta = 150000.0; /* GptOssConfig.default_theta */
    if (mt_cfg_num(s, s->root, "", "rope_theta", &cfg->rope_theta) == MT_ERR) return MT_ERR;
    const char *pre;
    json_t *rp;
    MT_TRY(mt_cfg_rope_dict(s, &rp, &pre));
    cfg->rope_type = MT_ROPE_YARN;
    cfg->rope_factor = 32.0;
    cfg->rope_beta_fast = 32.0;
    cfg->rope_beta_slow = 1.0;
    cfg->rope_truncate = 0;
    cfg->rope_original_max_pos = 4096;
    if (!rp || json_is_null(rp)) return MT_OK; /* GptOssConfig's default rope_parameters */
    cfg->rope_truncate = 1; /* transformers: truncate defaults to true once the dict is given */
    if (mt_cfg_num(s, rp, pre, "rope_theta", &cfg->rope_theta) == MT_ERR) return MT_ERR;
    json_t *ty = json_object_get(rp, "rope_type");
    if (!ty || json_is_null(ty)) ty = json_object_get(rp, "type");
    const char *tname = ty && json_is_string(ty) ? json_string_value(ty) : "default";
    if (ty && !json_is_null(ty) && !json_is_string(ty))
        return mt_error_set("%s: %srope_type must be a string", s->path, pre);
    double prf = 1.0;
    if (mt_cfg_num(s, rp, pre, "partial_rotary_factor", &prf) == MT_ERR) return MT_ERR;
    if (prf != 1.0)
        return mt_error_set("%s: %spartial_rotary_factor = %g is not supported for gpt_oss (must be 1)",
                            s->path, pre, prf);
    if (strcmp(tname, "default") == 0) {
        cfg->rope_type = MT_ROPE_DEFAULT;
        return MT_OK;
    }
    if (strcmp(tname, "yarn") != 0)
        return mt_error_set("%s: %srope_type \"%s\" is not supported for gpt_oss (supported: yarn, "
                            "default)", s->path, pre, tname);
    static const char *unsupported[] = {"attention_factor", "mscale", "mscale_all_dim"};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        double v = 0;
        if (mt_cfg_num(s, rp, pre, unsupported[i], &v) == MT_ERR) return MT_ERR;
        if (v != 0)
            return mt_error_set("%s: %s%s = %g is not supported (YaRN's scaling from factor only)",
                                s->path, pre, unsupported[i], v);
    }
    int rf = mt_cfg_num(s, rp, pre, "factor", &cfg->rope_factor);
    if (rf == MT_ERR) return MT_ERR;
    if (mt_cfg_int(s, rp, pre, "original_max_position_embeddings", &cfg->rope_original_max_pos) == MT_ERR)
        return MT_ERR;
    if (rf == 0) cfg->rope_factor = (double)cfg->max_position_embeddings / cfg->rope_original_max_pos;
    /* transformers: `get("beta_fast") or 32`, so 0 and null take the default too */
    double bf = 0, bs = 0;
    if (mt_cfg_num(s, rp, pre, "beta_fast", &bf) == MT_ERR) return MT_ERR;
    if (mt_cfg_num(s, rp, pre, "beta_slow", &bs) == MT_ERR) return MT_ERR;
    cfg->rope_beta_fast = bf != 0 ? bf : 32.0;
    cfg->rope_beta_slow = bs != 0 ? bs : 1.0;
    json_t *tr = json_object_get(rp, "truncate");
    if (tr && !json_is_null(tr)) {
        if (!json_is_boolean(tr)) return mt_error_set("%s: %struncate must be true or false", s->path, pre);
        cfg->rope_truncate = json_is_true(tr);
    }
    if (!(cfg->rope_factor > 0) || cfg->rope_original_max_pos <= 0 || !(cfg->rope_beta_fast > 0) ||
        !(cfg->rope_beta_slow > 0))
        return mt_error_set("%s: %s(yarn): factor, original_max_position_embeddings, beta_fast and "
                            "beta_slow must be positive", s->path, pre);
    return MT_OK;
}

int mt_config_parse_gpt_oss(mt_config *cfg, const mt_cfg_src *s) {
    double eps = 1e-5; /* GptOssConfig's, not Llama's 1e-6 */
    if (mt_cfg_num(s, s->root, "", "rms_norm_eps", &eps) == MT_ERR) return MT_ERR;
    cfg->rms_norm_eps = (float)eps;
    cfg->attn_sinks = 1;
    MT_TRY(parse_layer_types(cfg, s));
    MT_TRY(parse_moe(cfg, s));
    MT_TRY(parse_rope(cfg, s));
    return MT_OK;
}

void mt_config_yarn_inv_freq(const mt_config *cfg, float *inv_freq) {
    const double pi = 3.14159265358979323846;
    int D = cfg->D;
    double base = cfg->rope_theta, orig = cfg->rope_original_max_pos;
    /* the dims where the rotations at the original context are beta_fast and beta_slow */
    double low = D * log(orig / (cfg->rope_beta_fast * 2 * pi)) / (2 * log(base));
    double high = D * log(orig / (cfg->rope_beta_slow * 2 * pi)) / (2 * log(base));
    if (cfg->rope_truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > D - 1) high = D - 1;
    if (low == high) high += 0.001; /* transformers' guard against a zero-width ramp */
    for (int i = 0; i < D / 2; i++) {
        double pos_freq = pow(base, (double)(2 * i) / D);
        double extrap = 1.0 / pos_freq, interp = 1.0 / (cfg->rope_factor * pos_freq);
        double ramp = (i - low) / (high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        inv_freq[i] = (float)(interp * ramp + extrap * (1 - ramp));
    }
}

static json_t *rope_json(const mt_config *cfg, int with_theta) {
    json_t *r = json_object();
    if (cfg->rope_type == MT_ROPE_YARN) {
        json_object_set_new(r, "beta_fast", json_real(cfg->rope_beta_fast));
        json_object_set_new(r, "beta_slow", json_real(cfg->rope_beta_slow));
        json_object_set_new(r, "factor", json_real(cfg->rope_factor));
        json_object_set_new(r, "original_max_position_embeddings", json_integer(cfg->rope_original_max_pos));
        json_object_set_new(r, "truncate", json_boolean(cfg->rope_truncate));
    }
    if (with_theta) json_object_set_new(r, "rope_theta", json_real(cfg->rope_theta));
    json_object_set_new(r, "rope_type", json_string(cfg->rope_type == MT_ROPE_YARN ? "yarn" : "default"));
    return r;
}

void mt_config_gpt_oss_json(const mt_config *cfg, json_t *o) {
    mt_config_sliding_json(cfg, o);
    json_object_set_new(o, "attention_bias", json_boolean(cfg->o_bias));
    json_object_set_new(o, "num_local_experts", json_integer(cfg->n_experts));
    json_object_set_new(o, "num_experts_per_tok", json_integer(cfg->top_k));
    json_object_set_new(o, "output_router_logits", json_boolean(cfg->router_aux));
    json_object_set_new(o, "swiglu_alpha", json_real(cfg->swiglu_alpha));
    json_object_set_new(o, "swiglu_limit", json_real(cfg->swiglu_limit));
    json_object_set_new(o, "rope_scaling", cfg->rope_type == MT_ROPE_YARN ? rope_json(cfg, 0) : json_null());
    json_object_set_new(o, "rope_parameters", rope_json(cfg, 1));
}
