/* The Qwen3.5 / Qwen3.6 family's config.json fields (model_type qwen3_5, qwen3_5_moe and their
 * _text configs). Internal to model/: config.c calls it for those model types. */
#ifndef MT_CONFIG_QWEN3_5_H
#define MT_CONFIG_QWEN3_5_H

#include <stdint.h>

#include "model/config.h"
#include "model/config_json.h"

int mt_config_is_qwen3_5(const mt_config *cfg);

/* Reads the family's own fields (C, H, D, L and the common ones are read already): layer types,
 * the DeltaNet's shapes, partial RoPE, and for qwen3_5_moe the experts and shared expert. */
int mt_config_parse_qwen3_5(mt_config *cfg, const mt_cfg_src *s);

/* Parameters of one Gated DeltaNet mixer (without the layer's norms). */
int64_t mt_config_deltanet_params(const mt_config *cfg);

/* Adds the family's fields to a config.json object being written. */
void mt_config_qwen3_5_json(const mt_config *cfg, json_t *o);

#endif
