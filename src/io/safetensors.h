/* safetensors: read (mmap, validated) and write (atomic) Hugging Face tensor files.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 *   {"__metadata__": {str: str}, NAME: {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}, ...}
 * then the data section; offsets are relative to its start.
 *
 * Reading validates the whole header against the file before any tensor is handed out: a bad file
 * is MT_ERR with one line "PATH: tensor NAME: what", never a crash and never a half-open handle.
 * A handle may span several files (a sharded checkpoint with model.safetensors.index.json).
 */
#ifndef MT_SAFETENSORS_H
#define MT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "io/digest.h"

#define MT_ST_MAX_DIMS 8
#define MT_ST_MAX_HEADER 100000000 /* bytes; the limit the Python library uses too */

/* One tensor of an open handle. Pointers stay valid until mt_safetensors_close. */
typedef struct {
    const char *name;
    mt_dtype dtype;
    int ndim;                        /* 0 (scalar) .. MT_ST_MAX_DIMS */
    int64_t shape[MT_ST_MAX_DIMS];
    int64_t numel;                   /* 1 for a scalar */
    const void *data;                /* inside the read-only mapping; may be unaligned */
    size_t nbytes;
    const char *path;                /* the file it lives in */
    uint64_t file_offset;            /* of data in that file */
} mt_st_tensor;

typedef struct mt_safetensors mt_safetensors; /* opaque */

/* Opens and validates one file. On MT_ERR *out is NULL and nothing is left open. */
int mt_safetensors_open_file(mt_safetensors **out, const char *path);

/* Opens DIR/model.safetensors, else DIR/model.safetensors.index.json and every shard it names
 * (each validated; every tensor of weight_map must be in the shard it names; shard names must be
 * plain file names inside DIR). */
int mt_safetensors_open_dir(mt_safetensors **out, const char *dir);

void mt_safetensors_close(mt_safetensors *st); /* NULL is fine */

/* NULL when absent. O(log n). */
const mt_st_tensor *mt_safetensors_find(const mt_safetensors *st, const char *name);

/* Iteration in file order (shard by shard, by data offset): for i in 0..count-1. */
int mt_safetensors_count(const mt_safetensors *st);
const mt_st_tensor *mt_safetensors_at(const mt_safetensors *st, int i);
/* The i of a tensor this handle handed out (find or at). */
int mt_safetensors_index(const mt_safetensors *st, const mt_st_tensor *t);

/* What was opened: the file, or DIR/model.safetensors.index.json for a sharded checkpoint. */
const char *mt_safetensors_source(const mt_safetensors *st);

/* A "__metadata__" value (first file that has the key); NULL when absent. */
const char *mt_safetensors_metadata(const mt_safetensors *st, const char *key);

/* Converts a F32/BF16/F16 tensor into numel fp32 values (threaded). MT_ERR for other dtypes. */
int mt_st_tensor_to_f32(const mt_st_tensor *t, float *dst);

/* ---- writing ---- */

typedef struct {
    const char *name;
    mt_dtype dtype;
    int ndim;
    int64_t shape[MT_ST_MAX_DIMS];
    const void *data; /* numel elements of dtype; NULL: the fill callback produces them */
} mt_st_write_tensor;

typedef struct {
    const char *key, *value;
} mt_st_meta;

/* Produces elements [elem_begin, elem_begin + n) of tensor i (in its dtype) into dst.
 * Returns MT_OK, or MT_ERR after mt_error_set (the write is then abandoned). */
typedef int (*mt_st_fill_fn)(void *ctx, int i, int64_t elem_begin, int64_t n, void *dst);

/* Writes tensors in the order given, data contiguous without holes, header padded with spaces to
 * a multiple of 8 bytes. Atomic: a unique PATH.tmp.XXXXXX is written, flushed, fsync'd and renamed over PATH; on
 * any error it is removed and PATH is untouched. meta may be NULL when n_meta is 0. */
int mt_safetensors_write(const char *path, const mt_st_write_tensor *tensors, int n,
                         const mt_st_meta *meta, int n_meta);

/* As above, but tensors whose data is NULL are produced chunk by chunk through fill(ctx, ...),
 * so a caller converting dtypes needs only a small bounce buffer (owned by the writer). */
int mt_safetensors_write_fill(const char *path, const mt_st_write_tensor *tensors, int n,
                              const mt_st_meta *meta, int n_meta, mt_st_fill_fn fill, void *ctx);

/* mt_safetensors_write_fill, and *digest = the file's length and XXH3-64, computed while writing. */
int mt_safetensors_write_fill_digest(const char *path, const mt_st_write_tensor *tensors, int n,
                                     const mt_st_meta *meta, int n_meta, mt_st_fill_fn fill,
                                     void *ctx, mt_file_digest *digest);

/* As mt_safetensors_write (every tensor's data given), and *digest = the file's length and XXH3-64,
 * computed while writing. */
int mt_safetensors_write_digest(const char *path, const mt_st_write_tensor *tensors, int n,
                                const mt_st_meta *meta, int n_meta, mt_file_digest *digest);

/* The file the writers above make of tensors, without its data: *head (malloc'd, *head_bytes
 * long: the 8-byte header length and the padded header, where the data starts), begin[i] (n
 * entries) the file offset of tensor i's data and *file_bytes the file's length. For writers that
 * put the data in place themselves (each rank its part: io/checkpoint_shard.c). path: for the
 * messages. */
int mt_safetensors_layout(const char *path, const mt_st_write_tensor *tensors, int n,
                          const mt_st_meta *meta, int n_meta, unsigned char **head,
                          size_t *head_bytes, uint64_t *begin, uint64_t *file_bytes);

#endif
