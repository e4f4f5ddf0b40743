/* safetensors reader: mmap each file read-only, validate the whole header, then hand out tensors. */
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

typedef struct {
    char *path;
    const unsigned char *map;
    size_t size;
    json_t *meta; /* "__metadata__" object (own reference) or NULL */
} st_file;

struct mt_safetensors {
    st_file *files;
    int n_files, cap_files;
    mt_st_tensor *tensors; /* file order; names are owned (malloc'd) */
    int n, cap;
    const mt_st_tensor **by_name; /* sorted by name; built once every file is parsed */
    char *source;                 /* the file or index that was opened */
};

static const char *const SUPPORTED = "F32 BF16 F16 I32 I64 U16 U8";

/* ---- handle bookkeeping ---- */

static mt_safetensors *st_new(void) { return mt_calloc(1, sizeof(mt_safetensors)); }

void mt_safetensors_close(mt_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n_files; i++) {
        st_file *f = &st->files[i];
        if (f->map) munmap((void *)f->map, f->size);
        if (f->meta) json_decref(f->meta);
        free(f->path);
    }
    for (int i = 0; i < st->n; i++) free((char *)st->tensors[i].name);
    free(st->files);
    free(st->tensors);
    free((void *)st->by_name);
    free(st->source);
    free(st);
}

static void *grow(void *p, int *cap, int need, size_t elem) {
    if (need <= *cap) return p;
    int c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(p, (size_t)c * elem);
    MT_CHECK(q, "out of host memory growing a safetensors table to %d entries", c);
    *cap = c;
    return q;
}

static st_file *st_add_file(mt_safetensors *st, const char *path) {
    st->files = grow(st->files, &st->cap_files, st->n_files + 1, sizeof(st_file));
    st_file *f = &st->files[st->n_files++];
    memset(f, 0, sizeof *f);
    f->path = mt_strdup(path);
    return f;
}

/* ---- mapping ---- */

static int st_map(st_file *f) {
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mt_error_set("%s: cannot open: %s", f->path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return mt_error_set("%s: not a regular file", f->path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return mt_error_set("%s: %lld bytes, too short for a safetensors file (the header length "
                            "alone is 8 bytes); the file is empty or truncated",
                            f->path, (long long)sb.st_size);
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return mt_error_set("%s: cannot mmap: %s", f->path, strerror(errno));
    f->map = m;
    f->size = (size_t)sb.st_size;
    return MT_OK;
}

/* ---- header validation ---- */

static int get_nonneg_int(const json_t *v, int64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (int64_t)json_integer_value(v);
    return 0;
}

static int parse_dtype(const char *path, const char *name, const json_t *e, mt_st_tensor *t) {
    const json_t *d = json_object_get(e, "dtype");
    if (!json_is_string(d))
        return mt_error_set("%s: tensor %s: \"dtype\" missing or not a string", path, name);
    if (mt_dtype_parse(json_string_value(d), &t->dtype) != 0)
        return mt_error_set("%s: tensor %s: dtype \"%s\" is not supported (supported: %s)", path,
                            name, json_string_value(d), SUPPORTED);
    return MT_OK;
}

static int parse_shape(const char *path, const char *name, const json_t *e, mt_st_tensor *t) {
    const json_t *s = json_object_get(e, "shape");
    if (!json_is_array(s))
        return mt_error_set("%s: tensor %s: \"shape\" missing or not an array", path, name);
    size_t nd = json_array_size(s);
    if (nd > MT_ST_MAX_DIMS)
        return mt_error_set("%s: tensor %s: rank %zu exceeds the supported %d", path, name, nd,
                            MT_ST_MAX_DIMS);
    t->ndim = (int)nd;
    int64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        int64_t dim;
        if (get_nonneg_int(json_array_get(s, i), &dim) != 0)
            return mt_error_set("%s: tensor %s: shape[%zu] must be a non-negative integer", path,
                                name, i);
        if (dim != 0 && numel > INT64_MAX / dim)
            return mt_error_set("%s: tensor %s: shape overflows 64-bit element counts", path, name);
        t->shape[i] = dim;
        numel *= dim;
    }
    int64_t size = (int64_t)mt_dtype_size(t->dtype);
    if (numel > INT64_MAX / size)
        return mt_error_set("%s: tensor %s: shape overflows 64-bit byte counts", path, name);
    t->numel = numel;
    t->nbytes = (size_t)(numel * size);
    return MT_OK;
}

static int parse_offsets(const char *path, const char *name, const json_t *e, size_t data_size,
                         int64_t *begin, int64_t *end) {
    const json_t *o = json_object_get(e, "data_offsets");
    if (!json_is_array(o) || json_array_size(o) != 2 ||
        get_nonneg_int(json_array_get(o, 0), begin) != 0 ||
        get_nonneg_int(json_array_get(o, 1), end) != 0)
        return mt_error_set("%s: tensor %s: \"data_offsets\" must be two non-negative integers",
                            path, name);
    if (*begin > *end)
        return mt_error_set("%s: tensor %s: data_offsets begin %lld > end %lld", path, name,
                            (long long)*begin, (long long)*end);
    if ((uint64_t)*end > data_size)
        return mt_error_set("%s: tensor %s: data_offsets end %lld is past the data section "
                            "(%zu bytes): the file is truncated or corrupt",
                            path, name, (long long)*end, data_size);
    return MT_OK;
}

static int parse_entry(const st_file *f, const char *name, const json_t *e, size_t data_start,
                       mt_st_tensor *t) {
    if (!json_is_object(e))
        return mt_error_set("%s: tensor %s: entry must be an object with dtype, shape and "
                            "data_offsets",
                            f->path, name);
    int64_t begin = 0, end = 0;
    MT_TRY(parse_dtype(f->path, name, e, t));
    MT_TRY(parse_shape(f->path, name, e, t));
    MT_TRY(parse_offsets(f->path, name, e, f->size - data_start, &begin, &end));
    if ((uint64_t)(end - begin) != t->nbytes)
        return mt_error_set("%s: tensor %s: data_offsets span %lld bytes but %s x %lld elements "
                            "need %zu",
                            f->path, name, (long long)(end - begin), mt_dtype_name(t->dtype),
                            (long long)t->numel, t->nbytes);
    t->data = f->map + data_start + begin;
    t->file_offset = (uint64_t)data_start + (uint64_t)begin;
    t->path = f->path;
    return MT_OK;
}

static int parse_metadata(const st_file *f, const json_t *m) {
    if (!json_is_object(m))
        return mt_error_set("%s: __metadata__ must be an object of strings", f->path);
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)m, k, v) {
        if (!json_is_string(v))
            return mt_error_set("%s: __metadata__: value of \"%s\" must be a string", f->path, k);
    }
    return MT_OK;
}

static int cmp_data(const void *a, const void *b) {
    const mt_st_tensor *x = a, *y = b;
    uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
    if (px != py) return px < py ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Sorts one file's tensors by offset (file order) and refuses overlapping byte ranges. */
static int check_overlaps(const st_file *f, mt_st_tensor *t, int n) {
    if (n < 2) return MT_OK;
    qsort(t, (size_t)n, sizeof *t, cmp_data);
    const mt_st_tensor *last = NULL; /* the non-empty tensor reaching furthest so far */
    for (int i = 0; i < n; i++) {
        if (t[i].nbytes == 0) continue;
        const unsigned char *b = t[i].data;
        if (last && b < (const unsigned char *)last->data + last->nbytes)
            return mt_error_set("%s: tensor %s: data overlaps tensor %s", f->path, t[i].name,
                                last->name);
        if (!last || b + t[i].nbytes > (const unsigned char *)last->data + last->nbytes)
            last = &t[i];
    }
    return MT_OK;
}

static uint64_t read_u64_le(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int load_header_json(const st_file *f, json_t **root) {
    uint64_t n = read_u64_le(f->map);
    if (n > MT_ST_MAX_HEADER)
        return mt_error_set("%s: header length %llu exceeds the %d-byte limit: not a "
                            "safetensors file or corrupt",
                            f->path, (unsigned long long)n, MT_ST_MAX_HEADER);
    if (n > f->size - 8)
        return mt_error_set("%s: header length %llu runs past the end of the file (%zu bytes): "
                            "the file is truncated",
                            f->path, (unsigned long long)n, f->size);
    json_error_t err;
    *root = json_loadb((const char *)f->map + 8, (size_t)n, JSON_REJECT_DUPLICATES, &err);
    if (!*root)
        return mt_error_set("%s: header is not valid JSON: line %d column %d: %s", f->path,
                            err.line, err.column, err.text);
    if (!json_is_object(*root)) {
        json_decref(*root);
        return mt_error_set("%s: header JSON must be an object of tensors", f->path);
    }
    return MT_OK;
}

/* Parses and validates file fi, appending its tensors to st. */
static int st_parse_file(mt_safetensors *st, int fi) {
    st_file *f = &st->files[fi];
    json_t *root;
    MT_TRY(load_header_json(f, &root));
    size_t data_start = 8 + (size_t)read_u64_le(f->map);
    int first = st->n;
    const char *name;
    json_t *e;
    int rc = MT_OK;
    json_object_foreach(root, name, e) {
        if (strcmp(name, "__metadata__") == 0) {
            if ((rc = parse_metadata(f, e)) != MT_OK) break;
            f->meta = json_incref(e);
            continue;
        }
        st->tensors = grow(st->tensors, &st->cap, st->n + 1, sizeof(mt_st_tensor));
        mt_st_tensor *t = &st->tensors[st->n];
        memset(t, 0, sizeof *t);
        if ((rc = parse_entry(f, name, e, data_start, t)) != MT_OK) break;
        t->name = mt_strdup(name);
        st->n++;
    }
    json_decref(root);
    if (rc != MT_OK) return rc;
    return check_overlaps(f, st->tensors + first, st->n - first);
}

/* ---- lookup ---- */

static int cmp_by_name(const void *a, const void *b) {
    return strcmp((*(const mt_st_tensor *const *)a)->name, (*(const mt_st_tensor *const *)b)->name);
}

/* Builds the name index; a name in two files is an error (the checkpoint is ambiguous). */
static int st_index(mt_safetensors *st) {
    st->by_name = mt_malloc(sizeof(*st->by_name) * (size_t)(st->n ? st->n : 1));
    for (int i = 0; i < st->n; i++) st->by_name[i] = &st->tensors[i];
    qsort(st->by_name, (size_t)st->n, sizeof(*st->by_name), cmp_by_name);
    for (int i = 1; i < st->n; i++) {
        const mt_st_tensor *a = st->by_name[i - 1], *b = st->by_name[i];
        if (strcmp(a->name, b->name) == 0)
            return mt_error_set("%s: tensor %s: also in %s; a tensor may appear only once", b->path,
                                b->name, a->path);
    }
    return MT_OK;
}

const mt_st_tensor *mt_safetensors_find(const mt_safetensors *st, const char *name) {
    int lo = 0, hi = st->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const mt_st_tensor *t = st->by_name[mid];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

int mt_safetensors_count(const mt_safetensors *st) { return st->n; }

const mt_st_tensor *mt_safetensors_at(const mt_safetensors *st, int i) {
    MT_CHECK(i >= 0 && i < st->n, "tensor index %d of %d", i, st->n);
    return &st->tensors[i];
}

int mt_safetensors_index(const mt_safetensors *st, const mt_st_tensor *t) {
    MT_CHECK(t >= st->tensors && t < st->tensors + st->n, "tensor %s is not of this handle", t->name);
    return (int)(t - st->tensors);
}

const char *mt_safetensors_source(const mt_safetensors *st) { return st->source; }

const char *mt_safetensors_metadata(const mt_safetensors *st, const char *key) {
    for (int i = 0; i < st->n_files; i++) {
        const json_t *v = st->files[i].meta ? json_object_get(st->files[i].meta, key) : NULL;
        if (json_is_string(v)) return json_string_value(v);
    }
    return NULL;
}

/* ---- opening ---- */

static int st_add_and_parse(mt_safetensors *st, const char *path) {
    st_add_file(st, path);
    MT_TRY(st_map(&st->files[st->n_files - 1]));
    return st_parse_file(st, st->n_files - 1);
}

int mt_safetensors_open_file(mt_safetensors **out, const char *path) {
    *out = NULL;
    mt_safetensors *st = st_new();
    if (st_add_and_parse(st, path) != MT_OK || st_index(st) != MT_OK) {
        mt_safetensors_close(st);
        return MT_ERR;
    }
    st->source = mt_strdup(path);
    *out = st;
    return MT_OK;
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = mt_malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* A shard must be a plain file name inside the directory (symlinks inside are fine: HF caches). */
static int shard_name_ok(const char *s) {
    return *s && !strchr(s, '/') && !strchr(s, '\\') && strcmp(s, ".") != 0 &&
           strcmp(s, "..") != 0;
}

static int load_weight_map(const char *idx, json_t **root, json_t **wmap) {
    json_error_t err;
    *root = json_load_file(idx, JSON_REJECT_DUPLICATES, &err);
    if (!*root)
        return mt_error_set("%s: not valid JSON: line %d column %d: %s", idx, err.line,
                            err.column, err.text);
    *wmap = json_object_get(*root, "weight_map");
    if (!json_is_object(*wmap)) {
        json_decref(*root);
        return mt_error_set("%s: \"weight_map\" missing or not an object of tensor -> shard file",
                            idx);
    }
    return MT_OK;
}

static int find_file(const mt_safetensors *st, const char *path) {
    for (int i = 0; i < st->n_files; i++)
        if (strcmp(st->files[i].path, path) == 0) return i;
    return -1;
}

/* Opens every shard the weight map names (once each), then checks each entry against them. */
static int st_open_shards(mt_safetensors *st, const char *dir, const char *idx, json_t *wmap) {
    const char *name;
    json_t *v;
    json_object_foreach(wmap, name, v) {
        if (!json_is_string(v))
            return mt_error_set("%s: tensor %s: shard must be a file name string", idx, name);
        if (!shard_name_ok(json_string_value(v)))
            return mt_error_set("%s: tensor %s: shard \"%s\" must be a plain file name inside %s",
                                idx, name, json_string_value(v), dir);
        char *p = path_join(dir, json_string_value(v));
        int rc = MT_OK;
        if (find_file(st, p) < 0)
            rc = is_file(p) ? st_add_and_parse(st, p)
                            : mt_error_set("%s: tensor %s: shard %s does not exist in %s", idx,
                                           name, json_string_value(v), dir);
        free(p);
        MT_TRY(rc);
    }
    MT_TRY(st_index(st));
    json_object_foreach(wmap, name, v) {
        const mt_st_tensor *t = mt_safetensors_find(st, name);
        char *p = path_join(dir, json_string_value(v));
        int ok = t && strcmp(t->path, p) == 0;
        free(p);
        if (!ok)
            return mt_error_set("%s: tensor %s: not found in shard %s, which weight_map names%s%s",
                                idx, name, json_string_value(v), t ? "; it is in " : "",
                                t ? t->path : "");
    }
    return MT_OK;
}

int mt_safetensors_open_dir(mt_safetensors **out, const char *dir) {
    *out = NULL;
    char *single = path_join(dir, "model.safetensors");
    if (is_file(single)) {
        int rc = mt_safetensors_open_file(out, single);
        free(single);
        return rc;
    }
    free(single);
    char *idx = path_join(dir, "model.safetensors.index.json");
    if (!is_file(idx)) {
        free(idx);
        return mt_error_set("%s: no model.safetensors or model.safetensors.index.json; is this a "
                            "Hugging Face model directory?",
                            dir);
    }
    json_t *root, *wmap;
    int rc = load_weight_map(idx, &root, &wmap);
    if (rc == MT_OK) {
        mt_safetensors *st = st_new();
        rc = st_open_shards(st, dir, idx, wmap);
        json_decref(root);
        if (rc == MT_OK) {
            st->source = mt_strdup(idx);
            *out = st;
        } else {
            mt_safetensors_close(st);
        }
    }
    free(idx);
    return rc;
}

/* ---- conversion ---- */

#define BOUNCE_ELEMS (1 << 20)

/* Unaligned 16-bit data (a header length not a multiple of 2) goes through an aligned buffer. */
static void convert16(float *dst, const void *src, int64_t n, int is_bf16) {
    if (((uintptr_t)src & 1) == 0) {
        if (is_bf16) mt_convert_bf16_to_f32(dst, src, (size_t)n);
        else mt_convert_f16_to_f32(dst, src, (size_t)n);
        return;
    }
    uint16_t *tmp = mt_malloc(sizeof(uint16_t) * BOUNCE_ELEMS);
    for (int64_t i = 0; i < n; i += BOUNCE_ELEMS) {
        int64_t k = n - i < BOUNCE_ELEMS ? n - i : BOUNCE_ELEMS;
        memcpy(tmp, (const unsigned char *)src + 2 * i, (size_t)k * 2);
        if (is_bf16) mt_convert_bf16_to_f32(dst + i, tmp, (size_t)k);
        else mt_convert_f16_to_f32(dst + i, tmp, (size_t)k);
    }
    free(tmp);
}

static void copy_parallel(void *dst, const void *src, size_t n) {
    const size_t chunk = (size_t)1 << 22;
    int64_t chunks = (int64_t)((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static) if (chunks > 4)
    for (int64_t c = 0; c < chunks; c++) {
        size_t b = (size_t)c * chunk, k = n - b < chunk ? n - b : chunk;
        memcpy((char *)dst + b, (const char *)src + b, k);
    }
}

int mt_st_tensor_to_f32(const mt_st_tensor *t, float *dst) {
    switch (t->dtype) {
    case MT_F32: copy_parallel(dst, t->data, t->nbytes); return MT_OK;
    case MT_BF16: convert16(dst, t->data, t->numel, 1); return MT_OK;
    case MT_F16: convert16(dst, t->data, t->numel, 0); return MT_OK;
    default:
        return mt_error_set("%s: tensor %s: dtype %s cannot be read as floating-point weights "
                            "(F32, BF16 or F16 expected)",
                            t->path, t->name, mt_dtype_name(t->dtype));
    }
}
