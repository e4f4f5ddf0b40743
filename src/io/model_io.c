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
#include "io/hf_layout.h"
#include "io/safetensors.h"
#include "model/config.h"

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = mt_malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* ---- load ---- */

static void zero_floats(float *arena, int64_t begin, int64_t end) {
    if (end > begin) memset(arena + begin, 0, sizeof(float) * (size_t)(end - begin));
}

/* Opens DIR and finds every tensor of t there (io/hf_layout.h); *refs malloc'd. */
static int open_resolved(const mt_param_table *t, const char *dir, mt_safetensors **st, mt_hf_ref **refs) {
    MT_TRY(mt_safetensors_open_dir(st, dir));
    *refs = mt_calloc((size_t)t->n_params + 1, sizeof **refs);
    int rc = mt_hf_resolve(t, *st, *refs, NULL);
    if (rc != MT_OK) {
        free(*refs);
        mt_safetensors_close(*st);
        *refs = NULL;
        *st = NULL;
    }
    return rc;
}

int mt_model_load(const mt_param_table *t, float *arena, const char *dir) {
    mt_safetensors *st;
    mt_hf_ref *refs;
    MT_TRY(open_resolved(t, dir, &st, &refs));
    int rc = MT_OK;
    /* Only now is the arena written: a bad checkpoint never leaves it half loaded. */
    int64_t cursor = 0;
    for (int i = 0; i < t->n_params && rc == MT_OK; i++) {
        const mt_param *p = &t->params[i];
        MT_CHECK(p->offset >= cursor, "parameter table not in arena order at %s", p->name);
        zero_floats(arena, cursor, p->offset);
        rc = mt_hf_ref_to_f32(&refs[i], p, arena + p->offset);
        cursor = p->offset + p->numel;
    }
    if (rc == MT_OK) zero_floats(arena, cursor, t->total);
    free(refs);
    mt_safetensors_close(st);
    return rc;
}

int mt_model_load_tensors(const mt_param_table *t, const char *dir,
                          int (*sink)(void *ctx, const mt_param *p, const float *w), void *ctx) {
    return mt_model_load_tensors_where(t, dir, NULL, sink, ctx);
}

int mt_model_load_tensors_where(const mt_param_table *t, const char *dir,
                                int (*want)(void *ctx, const mt_param *p),
                                int (*sink)(void *ctx, const mt_param *p, const float *w), void *ctx) {
    return mt_model_load_tensors_mxfp4(t, dir, want, sink, NULL, ctx);
}

int mt_model_load_tensors_mxfp4(const mt_param_table *t, const char *dir,
                                int (*want)(void *ctx, const mt_param *p),
                                int (*sink)(void *ctx, const mt_param *p, const float *w),
                                int (*mxfp4)(void *ctx, const mt_param *p, const uint8_t *blocks,
                                             const uint8_t *scales),
                                void *ctx) {
    mt_safetensors *st;
    mt_hf_ref *refs;
    MT_TRY(open_resolved(t, dir, &st, &refs));
    int rc = MT_OK;
    int64_t biggest = 1;
    for (int i = 0; i < t->n_params; i++)
        if (t->params[i].numel > biggest) biggest = t->params[i].numel;
    /* Only now does anything reach the sink: a bad checkpoint never leaves it half loaded. */
    float *buf = mt_aligned_alloc((size_t)biggest * sizeof(float));
    for (int i = 0; i < t->n_params && rc == MT_OK; i++) {
        const mt_param *p = &t->params[i];
        if (want && !want(ctx, p)) continue;
        if (mxfp4 && refs[i].scales) { /* the pair as it is on disk (checked by mt_hf_resolve) */
            int took = mxfp4(ctx, p, refs[i].x->data, refs[i].scales->data);
            if (took != 0) {
                rc = took == 1 ? MT_OK : MT_ERR;
                continue;
            }
        }
        rc = mt_hf_ref_to_f32(&refs[i], p, buf);
        if (rc == MT_OK) rc = sink(ctx, p, buf);
    }
    free(buf);
    free(refs);
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
    const mt_param_table *t;
    const float *arena;
    const mt_hf_plan *pl;
    int first;       /* the shard's first item */
    mt_hf_reader rd; /* a carried tensor's source file */
} fill_ctx;

/* Param p's elements as the file's dtype: F32 as they are, BF16 rounded to nearest even. */
static int fill_piece(void *ctx, int p, int64_t begin, int64_t n, void *dst) {
    const fill_ctx *c = ctx;
    const float *src = c->arena + c->t->params[p].offset + begin;
    if (c->pl->items[c->pl->item_of[p]].w.dtype == MT_F32) memcpy(dst, src, sizeof(float) * (size_t)n);
    else mt_convert_f32_to_bf16(dst, src, (size_t)n);
    return MT_OK;
}

static int fill_item(void *ctx, int i, int64_t begin, int64_t n, void *dst) {
    fill_ctx *c = ctx;
    return mt_hf_fill(c->pl, c->first + i, begin, n, dst, fill_piece, c, &c->rd);
}

/* Writes items [first, first + n) of the plan into one file. */
static int write_shard(const mt_param_table *t, const float *arena, const mt_hf_plan *pl, const char *path,
                       int first, int n) {
    mt_st_write_tensor *w = mt_calloc((size_t)(n ? n : 1), sizeof *w);
    for (int i = 0; i < n; i++) w[i] = pl->items[first + i].w;
    const mt_st_meta meta[] = {{"format", "pt"}};
    fill_ctx ctx = {t, arena, pl, first, {-1, NULL}};
    int rc = mt_safetensors_write_fill(path, w, n, meta, 1, fill_item, &ctx);
    mt_hf_reader_close(&ctx.rd);
    free(w);
    return rc;
}

static int64_t item_bytes(const mt_hf_item *it) {
    int64_t b = (int64_t)mt_dtype_size(it->w.dtype);
    for (int d = 0; d < it->w.ndim; d++) b *= it->w.shape[d];
    return b;
}

/* Greedy split in write order, as transformers does: a new shard starts when the next tensor
 * would overflow the current one; a tensor larger than the limit gets a shard of its own.
 * first[k] is the first item of shard k; returns the number of shards. */
static int plan_shards(const mt_hf_plan *pl, int64_t max_bytes, int *first) {
    int k = 0;
    int64_t cur = 0;
    first[0] = 0;
    for (int i = 0; i < pl->n; i++) {
        int64_t b = item_bytes(&pl->items[i]);
        if (max_bytes > 0 && cur > 0 && cur + b > max_bytes) {
            first[++k] = i;
            cur = 0;
        }
        cur += b;
    }
    first[k + 1] = pl->n;
    return k + 1;
}

static void shard_name(char *buf, size_t size, int k, int n_shards) {
    snprintf(buf, size, "model-%05d-of-%05d.safetensors", k + 1, n_shards);
}

static int write_index(const mt_hf_plan *pl, const char *dir, const int *first, int n_shards) {
    json_t *wmap = json_object();
    int64_t total = 0;
    char name[64];
    for (int k = 0; k < n_shards; k++) {
        shard_name(name, sizeof name, k, n_shards);
        for (int i = first[k]; i < first[k + 1]; i++) {
            json_object_set_new(wmap, pl->items[i].name, json_string(name));
            total += item_bytes(&pl->items[i]);
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
    mt_hf_plan pl;
    mt_hf_plan_init(&pl, t, dtype);
    int *first = mt_malloc(sizeof(int) * (size_t)(pl.n + 2));
    int n_shards = plan_shards(&pl, max_shard_bytes, first);
    int rc = MT_OK;
    char name[64];
    for (int k = 0; k < n_shards && rc == MT_OK; k++) {
        if (n_shards == 1) snprintf(name, sizeof name, "model.safetensors");
        else shard_name(name, sizeof name, k, n_shards);
        char *path = path_join(dir, name);
        rc = write_shard(t, arena, &pl, path, first[k], first[k + 1] - first[k]);
        free(path);
    }
    if (rc == MT_OK && n_shards > 1) rc = write_index(&pl, dir, first, n_shards);
    if (rc == MT_OK) remove_stale(dir, n_shards);
    free(first);
    mt_hf_plan_free(&pl);
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
    int rc = mt_hf_config_save(t, cfg);
    free(cfg);
    MT_TRY(rc);
    return save_weights(t, arena, dir, dtype, max_shard_bytes);
}
