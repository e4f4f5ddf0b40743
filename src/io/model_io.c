/* Model weights <-> Hugging Face safetensors, walking the parameter table. */
#include "io/model_io.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "model/config.h"

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = mt_malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static const char *fmt_shape(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < size) snprintf(buf + k, size - k, "]");
    return buf;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* ---- load ---- */

static int check_one(const mt_param *p, const mt_st_tensor *st, const char *source) {
    char want[96], got[160];
    fmt_shape(want, sizeof want, p->ndim, p->shape);
    if (!st)
        return mt_error_set("%s: tensor %s is missing (the model needs shape %s); the "
                            "checkpoint does not match its config.json",
                            source, p->name, want);
    int same = st->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = st->shape[d] == p->shape[d];
    if (!same)
        return mt_error_set("%s: tensor %s: shape %s on disk, the model needs %s (check "
                            "config.json's sizes)",
                            st->path, p->name, fmt_shape(got, sizeof got, st->ndim, st->shape),
                            want);
    if (st->dtype != MT_F32 && st->dtype != MT_BF16 && st->dtype != MT_F16)
        return mt_error_set("%s: tensor %s: dtype %s; weights must be F32, BF16 or F16", st->path,
                            p->name, mt_dtype_name(st->dtype));
    return MT_OK;
}

/* Every tensor on disk must belong to the model, except a few that are safe to drop. */
static int check_extra(const mt_param_table *t, const mt_safetensors *st) {
    for (int i = 0; i < mt_safetensors_count(st); i++) {
        const mt_st_tensor *x = mt_safetensors_at(st, i);
        if (mt_param_find(t, x->name) || ends_with(x->name, "rotary_emb.inv_freq")) continue;
        if (t->cfg.tie_word_embeddings && strcmp(x->name, "lm_head.weight") == 0) {
            fprintf(stderr, "megatrain: warning: %s: ignoring lm_head.weight: the model ties it to "
                    "model.embed_tokens.weight (tie_word_embeddings)\n", x->path);
            continue;
        }
        return mt_error_set("%s: tensor %s is not part of this %s model (check config.json: "
                            "model_type, biases, qk norm, layer count)",
                            x->path, x->name, t->cfg.model_type);
    }
    return MT_OK;
}

static void zero_floats(float *arena, int64_t begin, int64_t end) {
    if (end > begin) memset(arena + begin, 0, sizeof(float) * (size_t)(end - begin));
}

int mt_model_load(const mt_param_table *t, float *arena, const char *dir) {
    mt_safetensors *st;
    MT_TRY(mt_safetensors_open_dir(&st, dir));
    int rc = MT_OK;
    for (int i = 0; i < t->n_params && rc == MT_OK; i++)
        rc = check_one(&t->params[i], mt_safetensors_find(st, t->params[i].name),
                       mt_safetensors_source(st));
    if (rc == MT_OK) rc = check_extra(t, st);
    /* Only now is the arena written: a bad checkpoint never leaves it half loaded. */
    int64_t cursor = 0;
    for (int i = 0; i < t->n_params && rc == MT_OK; i++) {
        const mt_param *p = &t->params[i];
        MT_CHECK(p->offset >= cursor, "parameter table not in arena order at %s", p->name);
        zero_floats(arena, cursor, p->offset);
        rc = mt_st_tensor_to_f32(mt_safetensors_find(st, p->name), arena + p->offset);
        cursor = p->offset + p->numel;
    }
    if (rc == MT_OK) zero_floats(arena, cursor, t->total);
    mt_safetensors_close(st);
    return rc;
}

int mt_model_load_tensors(const mt_param_table *t, const char *dir,
                          int (*sink)(void *ctx, const mt_param *p, const float *w), void *ctx) {
    mt_safetensors *st;
    MT_TRY(mt_safetensors_open_dir(&st, dir));
    int rc = MT_OK;
    int64_t biggest = 1;
    for (int i = 0; i < t->n_params && rc == MT_OK; i++) {
        rc = check_one(&t->params[i], mt_safetensors_find(st, t->params[i].name),
                       mt_safetensors_source(st));
        if (t->params[i].numel > biggest) biggest = t->params[i].numel;
    }
    if (rc == MT_OK) rc = check_extra(t, st);
    /* Only now does anything reach the sink: a bad checkpoint never leaves it half loaded. */
    float *buf = rc == MT_OK ? mt_aligned_alloc((size_t)biggest * sizeof(float)) : NULL;
    for (int i = 0; i < t->n_params && rc == MT_OK; i++) {
        const mt_param *p = &t->params[i];
        rc = mt_st_tensor_to_f32(mt_safetensors_find(st, p->name), buf);
        if (rc == MT_OK) rc = sink(ctx, p, buf);
    }
    free(buf);
    mt_safetensors_close(st);
    return rc;
}

/* ---- save ---- */

static int make_dirs(const char *dir) {
    if (!*dir) return mt_error_set("model directory: empty path");
    char *p = mt_strdup(dir);
    int rc = MT_OK;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0') continue;
        char c = *s;
        *s = '\0';
        struct stat sb;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            rc = mt_error_set("%s: cannot create directory: %s", p, strerror(errno));
        } else if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            rc = mt_error_set("%s: exists and is not a directory", p);
        }
        *s = c;
        if (rc != MT_OK || c == '\0') break;
    }
    free(p);
    return rc;
}

typedef struct {
    const float *arena;
    const mt_param *const *params; /* the shard's tensors, in write order */
} fill_ctx;

static int fill_bf16(void *ctx, int i, int64_t elem_begin, int64_t n, void *dst) {
    const fill_ctx *c = ctx;
    mt_convert_f32_to_bf16(dst, c->arena + c->params[i]->offset + elem_begin, (size_t)n);
    return MT_OK;
}

/* Writes params [first, first + n) of the table into one file. */
static int write_shard(const mt_param_table *t, const float *arena, const char *path,
                       mt_dtype dtype, int first, int n) {
    mt_st_write_tensor *w = mt_calloc((size_t)(n ? n : 1), sizeof *w);
    const mt_param **ps = mt_calloc((size_t)(n ? n : 1), sizeof *ps);
    for (int i = 0; i < n; i++) {
        const mt_param *p = &t->params[first + i];
        ps[i] = p;
        w[i].name = p->name;
        w[i].dtype = dtype;
        w[i].ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) w[i].shape[d] = p->shape[d];
        w[i].data = dtype == MT_F32 ? (const void *)(arena + p->offset) : NULL;
    }
    const mt_st_meta meta[] = {{"format", "pt"}};
    fill_ctx ctx = {arena, ps};
    int rc = mt_safetensors_write_fill(path, w, n, meta, 1, fill_bf16, &ctx);
    free(w);
    free((void *)ps);
    return rc;
}

/* Greedy split in table order, as transformers does: a new shard starts when the next tensor
 * would overflow the current one; a tensor larger than the limit gets a shard of its own.
 * first[k] is the first param of shard k; returns the number of shards. */
static int plan_shards(const mt_param_table *t, size_t esize, int64_t max_bytes, int *first) {
    int k = 0;
    int64_t cur = 0;
    first[0] = 0;
    for (int i = 0; i < t->n_params; i++) {
        int64_t b = t->params[i].numel * (int64_t)esize;
        if (max_bytes > 0 && cur > 0 && cur + b > max_bytes) {
            first[++k] = i;
            cur = 0;
        }
        cur += b;
    }
    first[k + 1] = t->n_params;
    return k + 1;
}

static void shard_name(char *buf, size_t size, int k, int n_shards) {
    snprintf(buf, size, "model-%05d-of-%05d.safetensors", k + 1, n_shards);
}

static int write_index(const mt_param_table *t, const char *dir, size_t esize, const int *first,
                       int n_shards) {
    json_t *wmap = json_object();
    int64_t total = 0;
    char name[64];
    for (int k = 0; k < n_shards; k++) {
        shard_name(name, sizeof name, k, n_shards);
        for (int i = first[k]; i < first[k + 1]; i++) {
            json_object_set_new(wmap, t->params[i].name, json_string(name));
            total += t->params[i].numel * (int64_t)esize;
        }
    }
    json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
                             "weight_map", wmap);
    MT_CHECK(root, "json_pack failed building the shard index");
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    MT_CHECK(text, "json_dumps failed (out of memory?)");
    char *path = path_join(dir, "model.safetensors.index.json");
    int rc = mt_atomic_write_file(path, text, strlen(text));
    free(path);
    free(text);
    return rc;
}

/* A shard file name of some earlier save ("model-00002-of-00005.safetensors"); *of gets K. */
static int parse_shard_name(const char *s, int *of) {
    int a, b, len = -1;
    if (sscanf(s, "model-%5d-of-%5d.safetensors%n", &a, &b, &len) != 2 || len < 0) return 0;
    *of = b;
    return (size_t)len == strlen(s);
}

/* Removes what an earlier save in the other layout (or with another shard count) left, so the
 * directory never holds two disagreeing checkpoints. Runs after the new files are complete. */
static void remove_stale(const char *dir, int n_shards) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int of = 0, stale = 0;
        if (parse_shard_name(e->d_name, &of)) stale = n_shards == 1 || of != n_shards;
        else if (n_shards == 1) stale = strcmp(e->d_name, "model.safetensors.index.json") == 0;
        else stale = strcmp(e->d_name, "model.safetensors") == 0;
        if (!stale) continue;
        char *p = path_join(dir, e->d_name);
        if (unlink(p) != 0)
            fprintf(stderr, "megatrain: warning: %s: could not remove a stale file: %s\n", p,
                    strerror(errno));
        free(p);
    }
    closedir(d);
}

static int save_weights(const mt_param_table *t, const float *arena, const char *dir,
                        mt_dtype dtype, int64_t max_shard_bytes) {
    size_t esize = mt_dtype_size(dtype);
    int *first = mt_malloc(sizeof(int) * (size_t)(t->n_params + 2));
    int n_shards = plan_shards(t, esize, max_shard_bytes, first);
    int rc = MT_OK;
    char name[64];
    for (int k = 0; k < n_shards && rc == MT_OK; k++) {
        if (n_shards == 1) snprintf(name, sizeof name, "model.safetensors");
        else shard_name(name, sizeof name, k, n_shards);
        char *path = path_join(dir, name);
        rc = write_shard(t, arena, path, dtype, first[k], first[k + 1] - first[k]);
        free(path);
    }
    if (rc == MT_OK && n_shards > 1) rc = write_index(t, dir, esize, first, n_shards);
    if (rc == MT_OK) remove_stale(dir, n_shards);
    free(first);
    return rc;
}

int mt_model_save(const mt_param_table *t, const float *arena, const char *dir, mt_dtype dtype,
                  int64_t max_shard_bytes) {
    if (dtype != MT_F32 && dtype != MT_BF16)
        return mt_error_set("%s: weights can be saved as F32 or BF16, not %s", dir,
                            mt_dtype_name(dtype));
    if (max_shard_bytes < 0)
        return mt_error_set("%s: max shard size %lld must be >= 0 (0 = one file)", dir,
                            (long long)max_shard_bytes);
    MT_TRY(make_dirs(dir));
    char *cfg = path_join(dir, "config.json");
    int rc = mt_config_save(&t->cfg, cfg);
    free(cfg);
    MT_TRY(rc);
    return save_weights(t, arena, dir, dtype, max_shard_bytes);
}
