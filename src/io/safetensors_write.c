/* safetensors writer: header by jansson (padded to 8 bytes), data contiguous, atomic replace. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

#define BOUNCE_BYTES ((size_t)4 << 20)

static int tensor_nbytes(const char *path, const mt_st_write_tensor *t, size_t *out) {
    size_t size = mt_dtype_size(t->dtype);
    if (size == 0) return mt_error_set("%s: tensor %s: unknown dtype %d", path, t->name, t->dtype);
    if (t->ndim < 0 || t->ndim > MT_ST_MAX_DIMS)
        return mt_error_set("%s: tensor %s: rank %d outside 0..%d", path, t->name, t->ndim,
                            MT_ST_MAX_DIMS);
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        int64_t d = t->shape[i];
        if (d < 0) return mt_error_set("%s: tensor %s: shape[%d] = %lld is negative", path,
                                       t->name, i, (long long)d);
        if (d != 0 && numel > INT64_MAX / d / (int64_t)size)
            return mt_error_set("%s: tensor %s: shape overflows 64-bit byte counts", path, t->name);
        numel *= d;
    }
    *out = (size_t)numel * size;
    return MT_OK;
}

static json_t *tensor_entry(const mt_st_write_tensor *t, size_t begin, size_t end) {
    json_t *shape = json_array();
    for (int i = 0; i < t->ndim; i++) json_array_append_new(shape, json_integer(t->shape[i]));
    return json_pack("{s:s, s:o, s:[I,I]}", "dtype", mt_dtype_name(t->dtype), "shape", shape,
                     "data_offsets", (json_int_t)begin, (json_int_t)end);
}

static int add_metadata(const char *path, json_t *root, const mt_st_meta *meta, int n_meta) {
    if (n_meta == 0) return MT_OK;
    json_t *m = json_object();
    json_object_set_new(root, "__metadata__", m);
    for (int i = 0; i < n_meta; i++) {
        json_t *v = json_string(meta[i].value);
        if (!v || json_object_set_new(m, meta[i].key, v) != 0)
            return mt_error_set("%s: __metadata__ \"%s\": key and value must be valid UTF-8", path,
                                meta[i].key);
    }
    return MT_OK;
}

/* The header JSON, padded with spaces to a multiple of 8 bytes (so the data is 8-aligned). */
static int build_header(const char *path, const mt_st_write_tensor *t, int n,
                        const mt_st_meta *meta, int n_meta, char **out, size_t *out_len) {
    json_t *root = json_object();
    int rc = add_metadata(path, root, meta, n_meta);
    size_t off = 0;
    for (int i = 0; i < n && rc == MT_OK; i++) {
        size_t nb = 0;
        if ((rc = tensor_nbytes(path, &t[i], &nb)) != MT_OK) break;
        if (strcmp(t[i].name, "__metadata__") == 0 || json_object_get(root, t[i].name)) {
            rc = mt_error_set("%s: tensor %s: name used twice or reserved", path, t[i].name);
            break;
        }
        if (json_object_set_new(root, t[i].name, tensor_entry(&t[i], off, off + nb)) != 0) {
            rc = mt_error_set("%s: tensor %s: name must be valid UTF-8", path, t[i].name);
            break;
        }
        off += nb;
    }
    char *s = rc == MT_OK ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (rc != MT_OK) return rc;
    MT_CHECK(s, "json_dumps failed (out of memory?)");
    size_t len = strlen(s), padded = (len + 7) / 8 * 8;
    *out = mt_malloc(padded);
    memcpy(*out, s, len);
    memset(*out + len, ' ', padded - len);
    *out_len = padded;
    free(s);
    return MT_OK;
}

static int write_filled(mt_atomic_file *af, const mt_st_write_tensor *t, int i, size_t nbytes,
                        mt_st_fill_fn fill, void *ctx, void *bounce) {
    size_t esize = mt_dtype_size(t->dtype);
    int64_t numel = (int64_t)(nbytes / esize), step = (int64_t)(BOUNCE_BYTES / esize);
    for (int64_t e = 0; e < numel; e += step) {
        int64_t k = numel - e < step ? numel - e : step;
        MT_TRY(fill(ctx, i, e, k, bounce));
        MT_TRY(mt_atomic_write(af, bounce, (size_t)k * esize));
    }
    return MT_OK;
}

static int write_body(mt_atomic_file *af, const char *header, size_t hlen,
                      const mt_st_write_tensor *t, int n, mt_st_fill_fn fill, void *ctx) {
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    MT_TRY(mt_atomic_write(af, len8, 8));
    MT_TRY(mt_atomic_write(af, header, hlen));
    void *bounce = NULL;
    int rc = MT_OK;
    for (int i = 0; i < n && rc == MT_OK; i++) {
        size_t nb = 0;
        tensor_nbytes(af->path, &t[i], &nb); /* validated by build_header */
        if (t[i].data || nb == 0) {
            rc = mt_atomic_write(af, t[i].data, nb);
            continue;
        }
        if (!bounce) bounce = mt_aligned_alloc(BOUNCE_BYTES);
        rc = write_filled(af, &t[i], i, nb, fill, ctx, bounce);
    }
    free(bounce);
    return rc;
}

static int write_file(const char *path, const mt_st_write_tensor *tensors, int n,
                      const mt_st_meta *meta, int n_meta, mt_st_fill_fn fill, void *ctx,
                      mt_file_digest *digest) {
    char *header;
    size_t hlen;
    MT_TRY(build_header(path, tensors, n, meta, n_meta, &header, &hlen));
    for (int i = 0; i < n; i++) { /* a caller bug: stop before a temporary file exists */
        size_t nb = 0;
        tensor_nbytes(path, &tensors[i], &nb);
        MT_CHECK(tensors[i].data || fill || nb == 0,
                 "tensor %s has no data and no fill callback was given", tensors[i].name);
    }
    mt_atomic_file af;
    int rc = mt_atomic_open(&af, path);
    if (rc == MT_OK) {
        rc = write_body(&af, header, hlen, tensors, n, fill, ctx);
        if (rc == MT_OK) rc = mt_atomic_commit_digest(&af, digest);
        else mt_atomic_abort(&af);
    }
    free(header);
    return rc;
}

int mt_safetensors_write_fill(const char *path, const mt_st_write_tensor *tensors, int n,
                              const mt_st_meta *meta, int n_meta, mt_st_fill_fn fill, void *ctx) {
    return write_file(path, tensors, n, meta, n_meta, fill, ctx, NULL);
}

int mt_safetensors_write_fill_digest(const char *path, const mt_st_write_tensor *tensors, int n,
                                     const mt_st_meta *meta, int n_meta, mt_st_fill_fn fill,
                                     void *ctx, mt_file_digest *digest) {
    return write_file(path, tensors, n, meta, n_meta, fill, ctx, digest);
}

int mt_safetensors_write(const char *path, const mt_st_write_tensor *tensors, int n,
                         const mt_st_meta *meta, int n_meta) {
    return write_file(path, tensors, n, meta, n_meta, NULL, NULL, NULL);
}

int mt_safetensors_write_digest(const char *path, const mt_st_write_tensor *tensors, int n,
                                const mt_st_meta *meta, int n_meta, mt_file_digest *digest) {
    return write_file(path, tensors, n, meta, n_meta, NULL, NULL, digest);
}

int mt_safetensors_layout(const char *path, const mt_st_write_tensor *tensors, int n,
                          const mt_st_meta *meta, int n_meta, unsigned char **head,
                          size_t *head_bytes, uint64_t *begin, uint64_t *file_bytes) {
    char *header;
    size_t hlen;
    MT_TRY(build_header(path, tensors, n, meta, n_meta, &header, &hlen));
    unsigned char *h = mt_malloc(8 + hlen);
    for (int i = 0; i < 8; i++) h[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    memcpy(h + 8, header, hlen);
    free(header);
    uint64_t at = 8 + (uint64_t)hlen;
    for (int i = 0; i < n; i++) { /* the order build_header gave the data_offsets */
        size_t nb = 0;
        tensor_nbytes(path, &tensors[i], &nb);
        begin[i] = at;
        at += nb;
    }
    *head = h;
    *head_bytes = 8 + hlen;
    *file_bytes = at;
    return MT_OK;
}
