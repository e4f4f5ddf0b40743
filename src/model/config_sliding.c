/* Sliding-window layer types (model/config_sliding.h). */
#include "model/config_sliding.h"

#include <string.h>

#include "core/error.h"

static void set_sliding(mt_config *cfg, int l) { cfg->sliding[l / 8] |= (uint8_t)(1u << (l % 8)); }

static int parse_names(mt_config *cfg, const mt_cfg_src *s, json_t *lt) {
    if (!json_is_array(lt)) return mt_error_set("%s: layer_types must be a list", s->path);
    if (json_array_size(lt) != (size_t)cfg->L)
        return mt_error_set("%s: layer_types has %zu entries for num_hidden_layers = %d", s->path,
                            json_array_size(lt), cfg->L);
    size_t i;
    json_t *e;
    json_array_foreach(lt, i, e) {
        const char *name = json_is_string(e) ? json_string_value(e) : "";
        if (strcmp(name, "sliding_attention") == 0) set_sliding(cfg, (int)i);
        else if (strcmp(name, "full_attention") != 0)
            return mt_error_set("%s: layer_types[%zu] must be \"sliding_attention\" or "
                                "\"full_attention\" for %s", s->path, i, cfg->model_type);
    }
    return MT_OK;
}

int mt_config_parse_sliding(mt_config *cfg, const mt_cfg_src *s, int every, int default_window) {
    memset(cfg->sliding, 0, sizeof cfg->sliding);
    json_t *lt = json_object_get(s->root, "layer_types");
    if (lt && !json_is_null(lt)) {
        MT_TRY(parse_names(cfg, s, lt));
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
