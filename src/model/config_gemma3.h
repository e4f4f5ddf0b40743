/* Google's Gemma 3 text models' config.json fields (model_type gemma3_text, transformers 5.25
 * Gemma3TextConfig; and the text_config of a multimodal gemma3 config). Internal to model/:
 * config.c calls it for that model type. */
#ifndef MT_CONFIG_GEMMA3_H
#define MT_CONFIG_GEMMA3_H

#include "model/config.h"
#include "model/config_json.h"

int mt_config_is_gemma3(const mt_config *cfg);

/* Reads the family's own fields (the common sizes are read already): layer_types (or the
 * sliding-window pattern) and sliding_window, query_pre_attn_scalar, the two RoPEs (per layer type
 * in rope_parameters, or the legacy rope_theta / rope_local_base_freq / rope_scaling),
 * hidden_activation, pad_token_id; refuses by name what it does not implement (soft-capping,
 * bidirectional attention, other activations and RoPE types). */
int mt_config_parse_gemma3(mt_config *cfg, const mt_cfg_src *s);

/* Adds the family's fields to a config.json object being written (replacing the generic RoPE
 * and activation keys with Gemma 3's). */
void mt_config_gemma3_json(const mt_config *cfg, json_t *o);

#endif
