/* LoRA adapters <-> a PEFT adapter directory (io/lora_io.h). */
#include "io/lora_io.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

#define CONFIG_FILE "adapter_config.json"
#define WEIGHTS_FILE "adapter_model.safetensors"
/* The version whose save_pretrained this writer follows (its keys, their defaults). */
#define PEFT_VERSION "0.21.0"
#define KEY_PREFIX "base_model.model.model."
#define KEY_PREFIX_LM "base_model.model.model.language_model."
/* target_modules of a multimodal model's adapter: PEFT's own form for gemma4 (its default
 * TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING entry), a regular expression full-matched
 * against module names that keeps the vision tower out, NAMES being "(a|b|...)". A plain list
 * would match the vision tower's q_proj, ... too, which PEFT refuses or adapts. */
#define LM_REGEX_HEAD ".*language_model\\..*\\."

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = mt_malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* ---- save ---- */

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* lt->targets as a sorted list without repeats (PEFT holds target_modules as a set); a multimodal
 * model's as the string LM_REGEX_HEAD "(a|b|...)" of that list. */
static json_t *target_list(const mt_lora_table *lt) {
    char *copy = mt_strdup(lt->targets);
    int n = 1;
    for (const char *c = copy; *c; c++) n += *c == ',';
    char **names = mt_calloc((size_t)n, sizeof *names);
    int k = 0;
    for (char *save = NULL, *s = strtok_r(copy, ",", &save); s; s = strtok_r(NULL, ",", &save))
        names[k++] = s;
    qsort(names, (size_t)k, sizeof *names, cmp_str);
    json_t *list = json_array();
    size_t len = sizeof LM_REGEX_HEAD + 3 + strlen(lt->targets);
    char *rx = mt_malloc(len);
    size_t used = (size_t)snprintf(rx, len, "%s(", LM_REGEX_HEAD);
    for (int i = 0; i < k; i++)
        if (i == 0 || strcmp(names[i], names[i - 1]) != 0) {
            json_array_append_new(list, json_string(names[i]));
            used += (size_t)snprintf(rx + used, len - used, "%s%s", i ? "|" : "", names[i]);
        }
    snprintf(rx + used, len - used, ")");
    if (lt->nested) {
        json_decref(list);
        list = json_string(rx);
    }
    free(rx);
    free(names);
    free(copy);
    return list;
}

/* adapter_config.json's text: every field PEFT's LoraConfig writes, at its default where megatrain
 * has no counterpart. */
static char *config_text(const mt_lora_table *lt, const char *base_model_name) {
    json_t *o = json_object();
    json_t *null = json_null();
    const char *null_keys[] = {"alora_invocation_tokens", "arrow_config", "auto_mapping",
                               "corda_config", "eva_config", "exclude_modules", "kasa_config",
                               "layer_replication", "layers_pattern", "layers_to_transform",
                               "lora_ga_config", "megatron_config", "modules_to_save",
                               "monteclora_config", "revision", "trainable_token_indices",
                               "use_bdlora", "velora_config"};
    for (size_t i = 0; i < sizeof null_keys / sizeof *null_keys; i++)
        json_object_set(o, null_keys[i], null);
    const char *false_keys[] = {"ensure_weight_tying", "fan_in_fan_out", "lora_bias", "use_dora",
                                "use_qalora", "use_rslora"};
    for (size_t i = 0; i < sizeof false_keys / sizeof *false_keys; i++)
        json_object_set_new(o, false_keys[i], json_false());
    json_object_set_new(o, "alpha_pattern", json_object());
    json_object_set_new(o, "rank_pattern", json_object());
    json_object_set_new(o, "loftq_config", json_object());
    json_object_set_new(o, "base_model_name_or_path",
                        base_model_name ? json_string(base_model_name) : json_null());
    json_object_set_new(o, "bias", json_string("none"));
    json_object_set_new(o, "inference_mode", json_true());
    json_object_set_new(o, "init_lora_weights", json_true());
    /* an integral alpha is written as PEFT's int, else as the float it is */
    if (lt->alpha == (double)(json_int_t)lt->alpha)
        json_object_set_new(o, "lora_alpha", json_integer((json_int_t)lt->alpha));
    else
        json_object_set_new(o, "lora_alpha", json_real(lt->alpha));
    json_object_set_new(o, "lora_dropout", json_real(0.0));
    json_object_set_new(o, "megatron_core", json_string("megatron.core"));
    json_object_set_new(o, "peft_type", json_string("LORA"));
    json_object_set_new(o, "peft_version", json_string(PEFT_VERSION));
    json_object_set_new(o, "qalora_group_size", json_integer(16));
    json_object_set_new(o, "r", json_integer(lt->rank));
    json_object_set_new(o, "target_modules", target_list(lt));
    json_t *params = json_null(); /* gpt-oss's experts: PEFT's list, in the order it was given */
    if (lt->parameters[0]) {
        params = json_array();
        char *copy = mt_strdup(lt->parameters);
        for (char *save = NULL, *p = strtok_r(copy, ",", &save); p; p = strtok_r(NULL, ",", &save))
            json_array_append_new(params, json_string(p));
        free(copy);
    }
    json_object_set_new(o, "target_parameters", params);
    json_object_set_new(o, "task_type", json_string("CAUSAL_LM"));
    json_decref(null);
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(o);
    MT_CHECK(text, "json_dumps failed (out of memory?)");
    return text;
}

typedef struct {
    const mt_lora_table *lt;
    const float *arena;
    mt_dtype dtype;
    int peft_of;  /* the tensor peft holds in PEFT's layout (-1: none) */
    float *peft;
} fill_ctx;

/* Tensor i in PEFT's layout: the arena's, an experts' lora_B regrouped (mt_lora_peft_layout,
 * once per tensor into one buffer: the writer fills a tensor's chunks in order). */
static int fill_tensor(void *ctx, int i, int64_t begin, int64_t n, void *dst) {
    fill_ctx *c = ctx;
    const mt_lora_param *p = &c->lt->params[i];
    const float *src = c->arena + p->offset + begin;
    if (p->experts && p->is_b) {
        if (c->peft_of != i) {
            free(c->peft);
            c->peft = mt_malloc((size_t)p->numel * sizeof(float));
            mt_lora_peft_layout(p, c->arena + p->offset, c->peft, 1);
            c->peft_of = i;
        }
        src = c->peft + begin;
    }
    if (c->dtype == MT_F32) memcpy(dst, src, (size_t)n * sizeof(float));
    else mt_convert_f32_to_bf16(dst, src, (size_t)n);
    return MT_OK;
}

/* Both files into DIR, each atomically: the tensors first, so a config never names tensors that
 * were not written. */
static int save_files(const mt_lora_table *lt, const float *arena, const char *dir,
                      const char *base_model_name, mt_dtype dtype) {
    mt_st_write_tensor *w = mt_calloc((size_t)lt->n_params, sizeof *w);
    for (int i = 0; i < lt->n_params; i++) {
        const mt_lora_param *p = &lt->params[i];
        w[i].name = p->name;
        w[i].dtype = dtype;
        w[i].ndim = 2;
        w[i].shape[0] = p->shape[0];
        w[i].shape[1] = p->shape[1];
        w[i].data = dtype == MT_F32 && !(p->experts && p->is_b) ? (const void *)(arena + p->offset)
                                                                 : NULL;
    }
    const mt_st_meta meta[] = {{"format", "pt"}};
    fill_ctx ctx = {lt, arena, dtype, -1, NULL};
    char *path = path_join(dir, WEIGHTS_FILE);
    int rc = mt_safetensors_write_fill(path, w, lt->n_params, meta, 1, fill_tensor, &ctx);
    free(ctx.peft);
    free(path);
    free(w);
    if (rc != MT_OK) return rc;
    char *text = config_text(lt, base_model_name);
    path = path_join(dir, CONFIG_FILE);
    rc = mt_atomic_write_file(path, text, strlen(text));
    free(path);
    free(text);
    return rc;
}

typedef struct {
    const mt_lora_table *lt;
    const float *arena;
    const char *base_model_name;
    mt_dtype dtype;
} save_ctx;

static int fill_dir(const char *tmp, void *ctx) {
    const save_ctx *c = ctx;
    return save_files(c->lt, c->arena, tmp, c->base_model_name, c->dtype);
}

int mt_lora_save_dir(const mt_lora_table *lt, const float *arena, const char *dir,
                     const char *base_model_name, mt_dtype dtype) {
    if (dtype != MT_F32 && dtype != MT_BF16)
        return mt_error_set("%s: adapters are saved as F32 or BF16, not %s", dir, mt_dtype_name(dtype));
    if (lt->n_params == 0) return mt_error_set("%s: the adapter table has no tensors to save", dir);
    if (!*dir) return mt_error_set("adapter directory: empty path");
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode)) return mt_error_set("%s: exists and is not a directory", dir);
        return save_files(lt, arena, dir, base_model_name, dtype);
    }
    if (errno != ENOENT) return mt_error_set("%s: %s", dir, mt_io_errtext(errno));
    /* a new directory appears whole: written under a temporary name beside it, then renamed */
    save_ctx c = {lt, arena, base_model_name, dtype};
    return mt_atomic_dir_write(dir, fill_dir, &c);
}

/* ---- load: adapter_config.json ---- */

/* A field that must be false (or absent, or null). */
static int refuse_true(const char *path, json_t *o, const char *key, const char *why) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v) || json_is_false(v)) return MT_OK;
    return mt_error_set("%s: \"%s\" is %s: %s", path, key, json_is_true(v) ? "true" : "set", why);
}

/* A field that must be null, absent or empty ({}, [], ""). */
static int refuse_nonempty(const char *path, json_t *o, const char *key, const char *why) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return MT_OK;
    if (json_is_object(v) && json_object_size(v) == 0) return MT_OK;
    if (json_is_array(v) && json_array_size(v) == 0) return MT_OK;
    if (json_is_string(v) && json_string_length(v) == 0) return MT_OK;
    return mt_error_set("%s: \"%s\" is set: %s", path, key, why);
}

/* A target_modules entry megatrain can match the way PEFT matches a list entry (the module's name
 * or its last dotted components): letters, digits, '_' and '.', not starting or ending '.'. */
static int plain_module_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || s[0] == '.' || s[n - 1] == '.') return 0;
    return strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.") == n;
}

/* A multimodal model's target_modules string LM_REGEX_HEAD "(a|b|...)" (or LM_REGEX_HEAD "a")
 * -> "a,b,..." in buf; 0 when s is not of that form. */
static int lm_regex_names(const char *s, char *buf, size_t size) {
    size_t h = strlen(LM_REGEX_HEAD), n;
    if (strncmp(s, LM_REGEX_HEAD, h) != 0) return 0;
    s += h;
    n = strlen(s);
    if (n >= 2 && s[0] == '(' && s[n - 1] == ')') s++, n -= 2;
    if (n == 0 || n >= size) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i] == '|' ? ',' : s[i];
        if (c != ',' && !strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_", c))
            return 0;
        if (c == ',' && (i == 0 || i + 1 == n || s[i + 1] == '|')) return 0; /* an empty name */
        buf[i] = c;
    }
    buf[n] = '\0';
    return 1;
}

/* A list of names (field "target_modules" or "target_parameters") -> comma-joined names in buf. */
static int join_names(const char *path, const char *field, json_t *v, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        const char *s = json_is_string(e) ? json_string_value(e) : NULL;
        if (!s || !plain_module_name(s))
            return mt_error_set("%s: \"%s\" entry %zu is not a %s name (letters, digits, '_', '.')",
                                path, field, i, strcmp(field, "target_modules") ? "parameter" : "module");
        size_t n = strlen(s);
        if (used + n + 2 > size)
            return mt_error_set("%s: \"%s\" is longer than %zu characters", path, field, size - 1);
        if (used) buf[used++] = ',';
        memcpy(buf + used, s, n + 1);
        used += n;
    }
    return MT_OK;
}

/* target_parameters (null, absent or a list of names) -> comma-joined names in buf ("" none). */
static int read_parameters(const char *path, json_t *v, char *buf, size_t size) {
    buf[0] = '\0';
    if (!v || json_is_null(v)) return MT_OK;
    if (!json_is_array(v))
        return mt_error_set("%s: \"target_parameters\" must be a list of parameter names", path);
    return join_names(path, "target_parameters", v, buf, size);
}

/* target_modules -> comma-joined names in buf. nested: a multimodal model's, which may be the
 * regular expression PEFT needs there (LM_REGEX_HEAD). params: target_parameters are set, so that
 * target_modules may be empty (or null). */
static int read_targets(const char *path, json_t *v, int nested, int params, char *buf,
                        size_t size) {
    buf[0] = '\0';
    if (params && (!v || json_is_null(v) || (json_is_array(v) && json_array_size(v) == 0)))
        return MT_OK;
    if (!v || json_is_null(v))
        return mt_error_set("%s: \"target_modules\" is missing: which modules carry the adapter?", path);
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (nested && lm_regex_names(s, buf, size)) return MT_OK;
        /* PEFT full-matches a string against whole module names; save_pretrained has already
         * expanded "all-linear" into a list, so only a hand-written config has it */
        if (strcmp(s, "all-linear") == 0)
            return mt_error_set("%s: \"target_modules\" is \"all-linear\": list the module names "
                                "instead, e.g. [\"q_proj\", \"v_proj\"]", path);
        if (!plain_module_name(s))
            return mt_error_set("%s: \"target_modules\" is the string \"%s\": PEFT's regular "
                                "expressions are not supported; list the module names, e.g. "
                                "[\"q_proj\", \"v_proj\"]%s", path, s,
                                nested ? " (a multimodal model's may also be \"" LM_REGEX_HEAD
                                         "(q_proj|v_proj)\", which keeps the vision tower out)" : "");
        if (strlen(s) >= size) return mt_error_set("%s: \"target_modules\" is too long", path);
        snprintf(buf, size, "%s", s);
        return MT_OK;
    }
    if (!json_is_array(v) || json_array_size(v) == 0)
        return mt_error_set("%s: \"target_modules\" must be a non-empty list of module names", path);
    return join_names(path, "target_modules", v, buf, size);
}

/* Every field of o that changes what the adapter computes or where it sits, checked. */
static int check_config(const char *path, json_t *o) {
    json_t *v = json_object_get(o, "peft_type");
    if (!json_is_string(v) || strcmp(json_string_value(v), "LORA") != 0)
        return mt_error_set("%s: \"peft_type\" is %s%s%s: megatrain reads LoRA adapters only "
                            "(\"LORA\")", path, json_is_string(v) ? "\"" : "",
                            json_is_string(v) ? json_string_value(v) : v ? "not a string" : "missing",
                            json_is_string(v) ? "\"" : "");
    v = json_object_get(o, "task_type");
    if (v && !json_is_null(v) && !(json_is_string(v) && strcmp(json_string_value(v), "CAUSAL_LM") == 0))
        return mt_error_set("%s: \"task_type\" is %s%s%s: megatrain's models are causal LMs "
                            "(\"CAUSAL_LM\")", path, json_is_string(v) ? "\"" : "",
                            json_is_string(v) ? json_string_value(v) : "not a string",
                            json_is_string(v) ? "\"" : "");
    v = json_object_get(o, "bias");
    if (v && !json_is_null(v) && !(json_is_string(v) && strcmp(json_string_value(v), "none") == 0))
        return mt_error_set("%s: \"bias\" is %s%s%s: megatrain's adapters train no biases "
                            "(\"none\")", path, json_is_string(v) ? "\"" : "",
                            json_is_string(v) ? json_string_value(v) : "not a string",
                            json_is_string(v) ? "\"" : "");
    MT_TRY(refuse_true(path, o, "use_dora", "DoRA adapters are not supported (plain LoRA only)"));
    MT_TRY(refuse_true(path, o, "use_rslora", "rank-stabilized LoRA (scale alpha / sqrt(r)) is "
                       "not supported (plain LoRA: alpha / r)"));
    MT_TRY(refuse_true(path, o, "fan_in_fan_out", "that is for Conv1D (GPT-2) layers; megatrain's "
                       "projections are Linear"));
    MT_TRY(refuse_true(path, o, "lora_bias", "a bias on lora_B is not supported"));
    MT_TRY(refuse_true(path, o, "use_qalora", "QA-LoRA is not supported"));
    MT_TRY(refuse_true(path, o, "use_bdlora", "block-diagonal LoRA is not supported"));
    MT_TRY(refuse_nonempty(path, o, "modules_to_save", "fully trained extra modules are not "
                           "supported (adapters only)"));
    MT_TRY(refuse_nonempty(path, o, "rank_pattern", "per-module ranks are not supported (one r)"));
    MT_TRY(refuse_nonempty(path, o, "alpha_pattern", "per-module alphas are not supported (one "
                           "lora_alpha)"));
    MT_TRY(refuse_nonempty(path, o, "layers_to_transform", "adapters on some layers only are not "
                           "supported (every layer)"));
    MT_TRY(refuse_nonempty(path, o, "exclude_modules", "excluded modules are not supported"));
    MT_TRY(refuse_nonempty(path, o, "trainable_token_indices", "trained token embeddings are not "
                           "supported"));
    MT_TRY(refuse_nonempty(path, o, "layer_replication", "replicated layers are not supported"));
    MT_TRY(refuse_nonempty(path, o, "alora_invocation_tokens", "activated LoRA is not supported"));
    return MT_OK;
}

/* DIR/adapter_config.json -> the adapter table over t. */
static int read_config(const char *path, const mt_param_table *t, mt_lora_table *lt) {
    if (access(path, R_OK) != 0)
        return mt_error_set("%s: cannot open: %s (a PEFT adapter directory has adapter_config.json "
                            "and adapter_model.safetensors)", path, strerror(errno));
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) return mt_error_set("%s: not valid JSON (line %d: %s)", path, je.line, je.text);
    int rc = MT_OK;
    char targets[sizeof lt->targets], params[sizeof lt->parameters * 2];
    json_t *r = json_object_get(o, "r"), *alpha = json_object_get(o, "lora_alpha");
    if (!json_is_object(o)) rc = mt_error_set("%s: not a JSON object", path);
    else if (check_config(path, o) != MT_OK) rc = MT_ERR;
    else if (!r) rc = mt_error_set("%s: \"r\" is missing (the rank)", path);
    else if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > MT_LORA_MAX_RANK)
        rc = mt_error_set("%s: \"r\" must be an integer from 1 to %d", path, MT_LORA_MAX_RANK);
    else if (!alpha) rc = mt_error_set("%s: \"lora_alpha\" is missing", path);
    else if (!json_is_number(alpha) || !(json_number_value(alpha) > 0))
        rc = mt_error_set("%s: \"lora_alpha\" must be a number > 0", path);
    else if (read_parameters(path, json_object_get(o, "target_parameters"), params,
                             sizeof params) != MT_OK)
        rc = MT_ERR;
    else rc = read_targets(path, json_object_get(o, "target_modules"), t->cfg.nested,
                           params[0] != '\0', targets, sizeof targets);
    if (rc == MT_OK) {
        mt_lora_opts opts = {(int)json_integer_value(r), json_number_value(alpha), targets, params};
        if (mt_lora_table_init(lt, t, &opts) != MT_OK) {
            /* its message speaks of --lora-targets: say which file the names came from */
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", mt_error_message());
            const char *m = strncmp(msg, "--lora-targets", 14) == 0 ? msg + 14 : msg;
            while (*m == ' ' || *m == ':') m++;
            rc = mt_error_set("%s: %s%s", path, strncmp(msg, "target_parameters", 17) == 0 ? ""
                              : "\"target_modules\": ", m);
        }
    }
    json_decref(o);
    return rc;
}

/* ---- load: adapter_model.safetensors ---- */

/* The adapter tensor that file key `name` stands for, NULL when none. A multimodal model's
 * adapter tensors are named as PEFT names them there (KEY_PREFIX_LM); the text model's spelling
 * (KEY_PREFIX, which megatrain wrote before) stands for the same tensor. */
static const mt_lora_param *find_key(const mt_lora_table *lt, const mt_param_table *t, const char *name) {
    const mt_lora_param *p = mt_lora_find_name(lt, name);
    if (p || !t->cfg.nested || strncmp(name, KEY_PREFIX, strlen(KEY_PREFIX)) != 0 ||
        strncmp(name, KEY_PREFIX_LM, strlen(KEY_PREFIX_LM)) == 0)
        return p;
    char alias[sizeof p->name + 32];
    snprintf(alias, sizeof alias, KEY_PREFIX_LM "%s", name + strlen(KEY_PREFIX));
    return mt_lora_find_name(lt, alias);
}

/* Every tensor of st checked against lt before anything is converted; the arena filled after. */
static int read_tensors(const char *path, const mt_safetensors *st, const mt_param_table *t,
                        const mt_lora_table *lt, float *arena) {
    const mt_st_tensor **by_param = mt_calloc((size_t)lt->n_params + 1, sizeof *by_param);
    int rc = MT_OK;
    for (int i = 0; i < mt_safetensors_count(st) && rc == MT_OK; i++) {
        const mt_st_tensor *x = mt_safetensors_at(st, i);
        const mt_lora_param *p = find_key(lt, t, x->name);
        if (!p) {
            rc = mt_error_set("%s: tensor %s is unexpected: no lora_A/lora_B of target_modules "
                              "(%s) in this %s model has that name", path, x->name, lt->targets,
                              t->cfg.model_type);
            break;
        }
        int k = (int)(p - lt->params);
        if (by_param[k])
            rc = mt_error_set("%s: tensors %s and %s are the same adapter tensor", path,
                              by_param[k]->name, x->name);
        else if (x->dtype != MT_F32 && x->dtype != MT_BF16 && x->dtype != MT_F16)
            rc = mt_error_set("%s: tensor %s: dtype %s, expected F32, BF16 or F16", path, x->name,
                              mt_dtype_name(x->dtype));
        else if (x->ndim != 2 || x->shape[0] != p->shape[0] || x->shape[1] != p->shape[1]) {
            char got[128] = "";
            for (int d = 0; d < x->ndim; d++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                         (long long)x->shape[d]);
            rc = mt_error_set("%s: tensor %s: shape [%s], expected [%lld, %lld] (r = %d in "
                              CONFIG_FILE ")", path, x->name, got, (long long)p->shape[0],
                              (long long)p->shape[1], lt->rank);
        }
        by_param[k] = x;
    }
    for (int k = 0; k < lt->n_params && rc == MT_OK; k++)
        if (!by_param[k])
            rc = mt_error_set("%s: tensor %s is missing (target_modules %s, r = %d in " CONFIG_FILE
                              " ask for it)", path, lt->params[k].name, lt->targets, lt->rank);
    if (rc == MT_OK) {
        memset(arena, 0, (size_t)lt->total * sizeof(float));
        for (int k = 0; k < lt->n_params && rc == MT_OK; k++) {
            const mt_lora_param *p = &lt->params[k];
            if (!(p->experts && p->is_b)) {
                rc = mt_st_tensor_to_f32(by_param[k], arena + p->offset);
                continue;
            }
            float *peft = mt_malloc((size_t)p->numel * sizeof(float)); /* (out, r E) -> (E, out, r) */
            rc = mt_st_tensor_to_f32(by_param[k], peft);
            if (rc == MT_OK) mt_lora_peft_layout(p, peft, arena + p->offset, 0);
            free(peft);
        }
    }
    free(by_param);
    return rc;
}

int mt_lora_load_dir(const char *dir, const mt_param_table *t, mt_lora_table *lt_out,
                     float **arena_out) {
    memset(lt_out, 0, sizeof *lt_out);
    *arena_out = NULL;
    struct stat sb;
    if (stat(dir, &sb) != 0) return mt_error_set("%s: cannot open: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return mt_error_set("%s: not a directory (a PEFT adapter directory has " CONFIG_FILE
                            " and " WEIGHTS_FILE ")", dir);
    char *cfg = path_join(dir, CONFIG_FILE), *wpath = path_join(dir, WEIGHTS_FILE);
    mt_lora_table lt;
    memset(&lt, 0, sizeof lt);
    mt_safetensors *st = NULL;
    float *arena = NULL;
    int rc = read_config(cfg, t, &lt);
    if (rc == MT_OK && access(wpath, F_OK) != 0) {
        char *bin = path_join(dir, "adapter_model.bin");
        rc = access(bin, F_OK) == 0
                 ? mt_error_set("%s: missing; %s is PEFT's pickle format, which megatrain does not "
                                "read: save the adapter with safe_serialization=True", wpath, bin)
                 : mt_error_set("%s: cannot open: %s", wpath, strerror(errno));
        free(bin);
    }
    if (rc == MT_OK) rc = mt_safetensors_open_file(&st, wpath);
    if (rc == MT_OK) {
        arena = mt_aligned_alloc((size_t)(lt.total ? lt.total : 1) * sizeof(float));
        rc = read_tensors(wpath, st, t, &lt, arena);
    }
    mt_safetensors_close(st);
    free(cfg);
    free(wpath);
    if (rc != MT_OK) {
        free(arena);
        mt_lora_table_free(&lt);
        return MT_ERR;
    }
    *lt_out = lt;
    *arena_out = arena;
    return MT_OK;
}
