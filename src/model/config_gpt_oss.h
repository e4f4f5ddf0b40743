/* OpenAI's gpt-oss family's config.json fields (model_type gpt_oss, transformers 5.25
 * GptOssConfig). Internal to model/: config.c calls it for that model type. */
#ifndef MT_CONFIG_GPT_OSS_H
#define MT_CONFIG_GPT_OSS_H

#include "model/config.h"
#include "model/config_json.h"

int mt_config_is_gpt_oss(const mt_config *cfg);

/* Reads the family's own fields (the common sizes are read already): layer_types and
 * sliding_window, the experts, the clamped SwiGLU, YaRN RoPE; refuses by name what it does not
 * implement. */
int mt_config_parse_gpt_oss(mt_config *cfg, const mt_cfg_src *s);

/* Adds the family's fields to a config.json object being written. */
void mt_config_gpt_oss_json(const mt_config *cfg, json_t *o);

/* YaRN's inverse frequencies (D/2 values) as transformers' _compute_yarn_parameters, in double. */
void mt_config_yarn_inv_freq(const mt_config *cfg, float *inv_freq);

#endif
