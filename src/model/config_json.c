/* Typed reads of config.json fields (model/config_json.h). */
#include "model/config_json.h"

#include <math.h>
#include <string.h>

#include "core/error.h"

/* Reads an integer field. Returns 1 when set, 0 when absent or null, MT_ERR on a wrong type. */
int mt_cfg_int(const mt_cfg_src *s, json_t *obj, const char *prefix, const char *key, int *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    /* transformers writes some ints as floats (e.g. 8192.0); accept integral reals */
    double d;
    if (json_is_integer(v)) {
        d = (double)json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v))) {
        d = json_real_value(v);
    } else {
        return mt_error_set("%s: %s%s must be an integer", s->path, prefix, key);
    }
    if (d < -2147483647.0 || d > 2147483647.0)
        return mt_error_set("%s: %s%s = %.0f is out of range", s->path, prefix, key, d);
    *out = (int)d;
    return 1;
}

int mt_cfg_num(const mt_cfg_src *s, json_t *obj, const char *prefix, const char *key, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return mt_error_set("%s: %s%s must be a number", s->path, prefix, key);
    *out = json_number_value(v);
    return 1;
}

int mt_cfg_bool(const mt_cfg_src *s, const char *key, int *out) {
    json_t *v = json_object_get(s->root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return mt_error_set("%s: %s must be true or false", s->path, key);
    *out = json_is_true(v);
    return 1;
}

/* A required positive size. */
int mt_cfg_size(const mt_cfg_src *s, const char *key, int *out) {
    int r = mt_cfg_int(s, s->root, "", key, out);
    if (r == MT_ERR) return MT_ERR;
    if (r == 0) return mt_error_set("%s: %s is missing (required)", s->path, key);
    if (*out <= 0) return mt_error_set("%s: %s = %d must be positive", s->path, key, *out);
    return MT_OK;
}

int mt_cfg_rope_dict(const mt_cfg_src *s, json_t **dict, const char **prefix) {
    static const char *const keys[2] = {"rope_scaling", "rope_parameters"};
    *dict = NULL;
    *prefix = "rope_scaling.";
    for (int i = 0; i < 2; i++) {
        json_t *d = json_object_get(s->root, keys[i]);
        if (d && !json_is_null(d) && !json_is_object(d))
            return mt_error_set("%s: %s must be an object or null", s->path, keys[i]);
        if (d && !json_is_null(d) && (i == 1 || json_object_size(d) > 0)) {
            *dict = d;
            *prefix = i ? "rope_parameters." : "rope_scaling.";
            return MT_OK;
        }
    }
    return MT_OK;
}

int mt_cfg_layer_types(const mt_cfg_src *s, json_t *lt, int L, const char *marked, uint8_t *bits,
                       int nbytes, const char *model_type) {
    memset(bits, 0, (size_t)nbytes);
    if (!json_is_array(lt)) return mt_error_set("%s: layer_types must be a list", s->path);
    if (json_array_size(lt) != (size_t)L)
        return mt_error_set("%s: layer_types has %zu entries for num_hidden_layers = %d", s->path,
                            json_array_size(lt), L);
    size_t i;
    json_t *e;
    json_array_foreach(lt, i, e) {
        const char *name = json_is_string(e) ? json_string_value(e) : "";
        if (strcmp(name, marked) == 0) bits[i / 8] |= (uint8_t)(1u << (i % 8));
        else if (strcmp(name, "full_attention") != 0)
            return mt_error_set("%s: layer_types[%zu] must be \"%s\" or \"full_attention\" for %s", s->path,
                                i, marked, model_type);
    }
    return MT_OK;
}
