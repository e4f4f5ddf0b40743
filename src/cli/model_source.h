/* Where a command's model comes from: --model DIR (config.json + safetensors) or --init
 * CONFIG.json (random init as the contract says). */
#ifndef MT_MODEL_SOURCE_H
#define MT_MODEL_SOURCE_H

#include <stdint.h>

#include "../model/params.h"

typedef struct {
    mt_param_table table;
    float *weights; /* fp32 arena in table layout; NULL when not loaded */
} mt_host_model;

/* Exactly one of model_dir / init_config is set. With load_weights the fp32 arena is filled from
 * the checkpoint or by mt_param_init(std = initializer_range, seed). */
int mt_host_model_open(mt_host_model *m, const char *model_dir, const char *init_config,
                       uint64_t seed, int load_weights);
void mt_host_model_free(mt_host_model *m);

#endif
