/* config.json written from an mt_config (mt_config_save): a file transformers loads as the same
 * model, every float in its shortest exact form. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/atomic_file.h" /* config.json is replaced atomically, like every file we write */
#include "model/config.h"
#include "model/config_json.h"
#include "model/config_gemma3.h"
#include "model/config_gemma4.h"
#include "model/config_gpt_oss.h"
#include "model/config_qwen3_5.h"

/* The double whose shortest decimal form equals the float's, so 1e-6f is written as 1e-06
 * (Python reads back exactly the value the original config.json said). */
static double float_as_short_double(float f) {
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    return strtod(buf, NULL);
}

/* Fewest significant digits (<= 17) that give back the same double. */
static int real_digits(double v) {
    char buf[40];
    /* at least the integer digits, so that 500000.0 is not written as 5e5 */
    int first = fabs(v) >= 1 && fabs(v) < 1e16 ? (int)floor(log10(fabs(v))) + 1 : 1;
    for (int prec = first; prec < 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return prec;
    }
    return 17;
}

/* jansson takes one precision for a whole document: the largest any real of it needs, so that
 * every value is exact and 1e-05 is not written as 1.0000000000000001e-05. */
static int json_real_digits(json_t *j) {
    int best = 1;
    if (json_is_real(j)) return real_digits(json_real_value(j));
    if (json_is_object(j)) {
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) {
            int d = json_real_digits(v);
            if (d > best) best = d;
        }
    } else if (json_is_array(j)) {
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) {
            int d = json_real_digits(v);
            if (d > best) best = d;
        }
    }
    return best;
}

static json_t *cfg_rope_json(const mt_config *cfg, int with_theta) {
    json_t *r = json_object();
    if (cfg->rope_type == MT_ROPE_LLAMA3) {
        json_object_set_new(r, "factor", json_real(cfg->rope_factor));
        json_object_set_new(r, "high_freq_factor", json_real(cfg->rope_high_freq_factor));
        json_object_set_new(r, "low_freq_factor", json_real(cfg->rope_low_freq_factor));
        json_object_set_new(r, "original_max_position_embeddings",
                            json_integer(cfg->rope_original_max_pos));
    }
    if (with_theta) json_object_set_new(r, "rope_theta", json_real(cfg->rope_theta));
    json_object_set_new(r, "rope_type",
                        json_string(cfg->rope_type == MT_ROPE_LLAMA3 ? "llama3" : "default"));
    return r;
}

/* The expert fields under the names both transformers 4 and 5 read (num_experts for qwen3_moe,
 * which transformers 4 knows by that name only). */
static void cfg_moe_json(const mt_config *cfg, json_t *o) {
    if (cfg->arch != MT_ARCH_MIXTRAL && cfg->arch != MT_ARCH_QWEN3_MOE) return;
    int mix = cfg->arch == MT_ARCH_MIXTRAL;
    json_object_set_new(o, mix ? "num_local_experts" : "num_experts", json_integer(cfg->n_experts));
    json_object_set_new(o, "num_experts_per_tok", json_integer(cfg->top_k));
    json_object_set_new(o, "output_router_logits", json_boolean(cfg->router_aux));
    json_object_set_new(o, "router_aux_loss_coef", json_real(float_as_short_double(cfg->router_aux_coef)));
    if (mix) {
        json_object_set_new(o, "router_jitter_noise", json_real(0.0));
        return;
    }
    json_object_set_new(o, "moe_intermediate_size", json_integer(cfg->moe_F));
    json_object_set_new(o, "norm_topk_prob", json_boolean(cfg->norm_topk_prob));
    json_object_set_new(o, "decoder_sparse_step", json_integer(cfg->sparse_step));
    json_t *only = json_array();
    for (int l = 0; l < cfg->L; l++)
        if (cfg->mlp_only[l / 8] & (1u << (l % 8))) json_array_append_new(only, json_integer(l));
    json_object_set_new(o, "mlp_only_layers", only);
}

static json_t *cfg_to_json(const mt_config *cfg) {
    const char *name, *architecture;
    mt_config_arch_names(cfg->arch, &name, &architecture);
    json_t *o = json_object();
    json_t *archs = json_array();
    json_array_append_new(archs, json_string(architecture));
    json_object_set_new(o, "architectures", archs);
    char text_type[32]; /* a text-only qwen3_5 (gemma3, gemma4) model's config class is
                           Qwen3_5TextConfig (Gemma3TextConfig, Gemma4TextConfig) */
    snprintf(text_type, sizeof text_type, "%s%s", name,
             mt_config_is_qwen3_5(cfg) || mt_config_is_gemma3(cfg) || mt_config_is_gemma4(cfg) ? "_text" : "");
    json_object_set_new(o, "model_type", json_string(text_type));
    json_object_set_new(o, "hidden_size", json_integer(cfg->C));
    json_object_set_new(o, "intermediate_size", json_integer(cfg->F));
    json_object_set_new(o, "num_hidden_layers", json_integer(cfg->L));
    json_object_set_new(o, "num_attention_heads", json_integer(cfg->H));
    json_object_set_new(o, "num_key_value_heads", json_integer(cfg->G));
    json_object_set_new(o, "head_dim", json_integer(cfg->D));
    json_object_set_new(o, "vocab_size", json_integer(cfg->V));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "max_position_embeddings", json_integer(cfg->max_position_embeddings));
    json_object_set_new(o, "rms_norm_eps", json_real(float_as_short_double(cfg->rms_norm_eps)));
    json_object_set_new(o, "initializer_range",
                        json_real(float_as_short_double(cfg->initializer_range)));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(cfg->tie_word_embeddings));
    json_object_set_new(o, "attention_dropout", json_real(0.0));
    if (cfg->arch == MT_ARCH_LLAMA || cfg->arch == MT_ARCH_QWEN3 || cfg->arch == MT_ARCH_QWEN3_MOE ||
        mt_config_is_qwen3_5(cfg))
        json_object_set_new(o, "attention_bias", json_boolean(cfg->o_bias));
    if (cfg->arch == MT_ARCH_LLAMA) json_object_set_new(o, "mlp_bias", json_boolean(cfg->mlp_bias));
    if (cfg->arch == MT_ARCH_MISTRAL || cfg->arch == MT_ARCH_MIXTRAL)
        json_object_set_new(o, "sliding_window",
                            cfg->sliding_window > 0 ? json_integer(cfg->sliding_window) : json_null());
    if (cfg->arch == MT_ARCH_QWEN2 || cfg->arch == MT_ARCH_QWEN3 || cfg->arch == MT_ARCH_QWEN3_MOE)
        json_object_set_new(o, "use_sliding_window", json_false());
    cfg_moe_json(cfg, o);
    /* Both RoPE styles: transformers 5 reads rope_parameters, transformers 4 rope_theta +
     * rope_scaling. transformers 5 prefers a non-null rope_scaling but then takes rope_theta from
     * the top level, so both readers see the same RoPE. */
    json_object_set_new(o, "rope_theta", json_real(cfg->rope_theta));
    json_object_set_new(o, "rope_scaling",
                        cfg->rope_type == MT_ROPE_LLAMA3 ? cfg_rope_json(cfg, 0) : json_null());
    json_object_set_new(o, "rope_parameters", cfg_rope_json(cfg, 1));
    if (mt_config_is_qwen3_5(cfg)) {
        json_object_set_new(json_object_get(o, "rope_parameters"), "partial_rotary_factor",
                            json_real((double)cfg->rotary_dim / cfg->D));
        mt_config_qwen3_5_json(cfg, o);
    }
    if (mt_config_is_gpt_oss(cfg)) {
        mt_config_gpt_oss_json(cfg, o);
        json_object_set_new(o, "router_aux_loss_coef", json_real(float_as_short_double(cfg->router_aux_coef)));
    }
    if (mt_config_is_gemma3(cfg)) mt_config_gemma3_json(cfg, o);
    if (mt_config_is_gemma4(cfg)) mt_config_gemma4_json(cfg, o);
    if (cfg->bos_token_id >= 0) json_object_set_new(o, "bos_token_id", json_integer(cfg->bos_token_id));
    if (cfg->eos_token_id >= 0) json_object_set_new(o, "eos_token_id", json_integer(cfg->eos_token_id));
    /* No "dtype": with it absent, from_pretrained(dtype="auto") takes the safetensors' dtype. */
    return o;
}

int mt_config_save(const mt_config *cfg, const char *path) {
    MT_TRY(mt_config_validate(cfg, path));
    if (cfg->nested)
        return mt_error_set("%s: writing a multimodal (text_config) config.json is not implemented: "
                            "the original must be copied with its vision_config", path);
    json_t *o = cfg_to_json(cfg);
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(json_real_digits(o)));
    json_decref(o);
    MT_CHECK(text, "json_dumps failed (out of memory?)");
    size_t n = strlen(text);
    char *line = mt_malloc(n + 2);
    memcpy(line, text, n);
    line[n] = '\n';
    free(text);
    int r = mt_atomic_write_file(path, line, n + 1); /* a unique temporary, renamed over PATH */
    free(line);
    return r;
}
