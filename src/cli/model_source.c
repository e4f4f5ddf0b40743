#include "model_source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../io/model_io.h"

int mt_host_model_open(mt_host_model *m, const char *model_dir, const char *init_config,
                       uint64_t seed, int load_weights) {
    memset(m, 0, sizeof *m);
    if ((model_dir == NULL) == (init_config == NULL))
        return mt_error_set("give exactly one of --model DIR and --init CONFIG.json");
    mt_config cfg;
    if (model_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", model_dir);
        MT_TRY(mt_config_load(&cfg, path));
    } else {
        MT_TRY(mt_config_load(&cfg, init_config));
    }
    mt_param_table_init(&m->table, &cfg);
    if (!load_weights) return MT_OK;
    m->weights = mt_aligned_alloc((size_t)m->table.total * sizeof(float));
    if (model_dir) {
        if (mt_model_load(&m->table, m->weights, model_dir) != MT_OK) {
            mt_host_model_free(m);
            return MT_ERR;
        }
    } else {
        mt_param_init(&m->table, m->weights, cfg.initializer_range, seed);
    }
    return MT_OK;
}

void mt_host_model_free(mt_host_model *m) {
    free(m->weights);
    if (m->table.params) mt_param_table_free(&m->table);
    memset(m, 0, sizeof *m);
}
