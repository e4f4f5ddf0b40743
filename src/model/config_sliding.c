/* Sliding-window layer types (model/config_sliding.h). */
#include "model/config_sliding.h"

#include <string.h>

#include "core/error.h"

static void set_sliding(mt_config *cfg, int l) { cfg->sliding[l / 8] |= (uint8_t)(1u << (l % 8)); }

int mt_config_parse_sliding(mt_config *cfg, const mt_cfg_src *s, int every, int default_window) {
    memset(cfg->sliding, 0, sizeof cfg->sliding);
    json_t *lt = json_object_get(s->root, "layer_types");
    if (lt && !json_is_null(lt)) {
        MT_TRY(mt_cfg_layer_types(s, lt, cfg->L, "sliding_attention", cfg->sliding, sizeof cfg->sliding,
                                  cfg->model_type));
    } else {
        for (int l = 0; l < cfg->L; l++)
            if ((l + 1) % every != 0) set_sliding(cfg, l);
    }
    cfg->attn_window = default_window;
    if (mt_cfg_int(s, s->root, "", "sliding_window", &cfg->attn_window) == MT_ERR) return MT_ERR;
    json_t *sw = json_object_get(s->root, "sliding_window");
    int any = 0;
    for (int l = 0; l < cfg->L; l++) any |= (cfg->sliding[l / 8] >> (l % 8)) & 1;
    if (any && sw && json_is_null(sw))
        return mt_error_set("%s: sliding_window is null but layer_types has sliding_attention layers",
                            s->path);
    if (any && cfg->attn_window <= 0)
        return mt_error_set("%s: sliding_window = %d must be positive", s->path, cfg->attn_window);
    return MT_OK;
}

void mt_config_sliding_json(const mt_config *cfg, json_t *o) {
    json_t *types = json_array();
    for (int l = 0; l < cfg->L; l++)
        json_array_append_new(types, json_string(mt_config_layer_window(cfg, l) > 0 ? "sliding_attention"
                                                                                  : "full_attention"));
    json_object_set_new(o, "layer_types", types);
    json_object_set_new(o, "sliding_window", json_integer(cfg->attn_window));
}
