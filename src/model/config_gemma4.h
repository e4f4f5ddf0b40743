/* Google's Gemma 4 text models' config.json fields (model_type gemma4_text, transformers 5.25
 * Gemma4TextConfig; and the text_config of a multimodal gemma4 config). Internal to model/:
 * config.c calls it for that model type. */
#ifndef MT_CONFIG_GEMMA4_H
#define MT_CONFIG_GEMMA4_H

#include "model/config.h"
#include "model/config_json.h"

int mt_config_is_gemma4(const mt_config *cfg);

/* Reads the family's own fields (the common sizes are read already): layer_types (or the 5:1
 * pattern) and sliding_window, the full layers' head dim and kv heads (per_layer_config, else
 * global_head_dim and num_global_key_value_heads), attention_k_eq_v, the RoPE of each layer type
 * (rope_parameters: default, proportional), final_logit_softcapping, hidden_activation,
 * pad_token_id, the MoE block (enable_moe_block: num_experts, top_k_experts,
 * moe_intermediate_size); sets the Gemma 3 switches it shares (sandwich norms, q/k norms, GeGLU,
 * the scaled embedding) and its own (v-norm, the per-layer scalar, scores unscaled). Refuses by
 * name what it does not implement: the per-layer input embeddings of E2B/E4B
 * (hidden_size_per_layer_input), KV sharing across layers (num_kv_shared_layers), bidirectional
 * attention ("all"), attention biases, other activations and RoPE types. */
int mt_config_parse_gemma4(mt_config *cfg, const mt_cfg_src *s);

/* Fills the RoPE tables (mt_config_rope_inv_freq's layout): set 0 the full layers' (their own
 * head dim; proportional or default), set 1 the sliding layers' (default). */
void mt_config_gemma4_inv_freq(const mt_config *cfg, float *inv_freq);

/* Adds the family's fields to a config.json object being written (replacing the generic RoPE and
 * activation keys with Gemma 4's; the full layers' shape as transformers 5.25 writes it,
 * per_layer_config). */
void mt_config_gemma4_json(const mt_config *cfg, json_t *o);

#endif
