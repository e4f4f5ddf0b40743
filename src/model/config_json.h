/* Typed reads of config.json fields for the config parsers (model/config.c and the family files
 * beside it): every error names the file and the field. Internal to model/. */
#ifndef MT_CONFIG_JSON_H
#define MT_CONFIG_JSON_H

#include <jansson.h>

typedef struct {
    const char *path; /* file name for messages */
    json_t *root;     /* the object the model's fields are read from (text_config when nested) */
} mt_cfg_src;

/* Reads an integer (integral reals accepted: transformers writes some as 8192.0) or a number.
 * Returns 1 when set, 0 when absent or null, MT_ERR on a wrong type. `prefix` goes before the key
 * in messages ("rope_parameters."). */
int mt_cfg_int(const mt_cfg_src *s, json_t *obj, const char *prefix, const char *key, int *out);
int mt_cfg_num(const mt_cfg_src *s, json_t *obj, const char *prefix, const char *key, double *out);
/* A boolean field of s->root; the same returns. */
int mt_cfg_bool(const mt_cfg_src *s, const char *key, int *out);
/* A required positive size of s->root: MT_OK or MT_ERR (missing, wrong type, not positive). */
int mt_cfg_size(const mt_cfg_src *s, const char *key, int *out);

/* config.json's RoPE dict: rope_scaling when it is a non-empty object, else rope_parameters; *dict
 * NULL when neither is given (null, or an empty rope_scaling alone), *prefix its name for messages ("rope_scaling."). MT_ERR when
 * either is present and neither an object nor null. */
int mt_cfg_rope_dict(const mt_cfg_src *s, json_t **dict, const char **prefix);

#include <stdint.h>
/* layer_types (lt, a list): exactly L names, each `marked` (bit l of bits set) or
 * "full_attention"; bits is cleared first. MT_ERR names the entry and model_type. */
int mt_cfg_layer_types(const mt_cfg_src *s, json_t *lt, int L, const char *marked, uint8_t *bits,
                       int nbytes, const char *model_type);

/* The model type's config.json names: "qwen3_5" and "Qwen3_5ForCausalLM", ... (config.c's table). */
#include "model/config.h"
void mt_config_arch_names(mt_arch a, const char **model_type, const char **architecture);

#endif
