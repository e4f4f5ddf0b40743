/* The sliding-window layers of a family whose layer_types are "sliding_attention" /
 * "full_attention" (gpt_oss, gemma3), and their window: one reading for every such family.
 * Internal to model/: the family files call it. */
#ifndef MT_CONFIG_SLIDING_H
#define MT_CONFIG_SLIDING_H

#include "model/config.h"
#include "model/config_json.h"

/* cfg->sliding from layer_types (L entries), or, when absent, layer l slides unless (l + 1) %
 * every == 0 (gpt_oss: every 2, even layers slide; gemma3: its sliding_window_pattern); then
 * cfg->attn_window from sliding_window (default_window when absent; refused when null or not
 * positive while a layer slides). MT_ERR names the file and the entry. */
int mt_config_parse_sliding(mt_config *cfg, const mt_cfg_src *s, int every, int default_window);

/* The reverse, into a config.json object o: layer_types (one entry a layer) and sliding_window. */
void mt_config_sliding_json(const mt_config *cfg, json_t *o);

#endif
