/* A checkpoint written by every rank of a data-parallel run, each its own elements (checkpoint.h,
 * mt_checkpoint_begin): rank 0 makes the temporary directory and the two tensor files at their
 * full length with their headers; every rank pwrite()s what its shard holds at its offsets; rank 0
 * checksums the files, writes trainer_state.json and renames the directory into place. The files
 * are laid out by the same tensor lists and header code as mt_checkpoint_save's, so the bytes are
 * those of a one-rank save of the same state. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/checkpoint_dir.h"

#define CHUNK_FLOATS ((int64_t)1 << 20) /* the weights' conversion buffer: 4 MiB */

static const char *const FILES[2] = {"model.safetensors", "optimizer.safetensors"};

struct mt_ckpt_writer {
    ckpt_tmp_dir d;
    json_t *args;
    char *tok_dir;
    ckpt_file_list files;
};

/* One of the two tensor files: its tensor list and where each tensor's data goes. */
typedef struct {
    ckpt_tensor_list l;
    unsigned char *head;
    size_t head_bytes;
    uint64_t *begin, bytes;
    int *first; /* [param]: its first tensor in the file */
} file_plan;

static int plan_file(file_plan *f, const mt_param_table *t, mt_state_format fmt, int which,
                     const char *path) {
    memset(f, 0, sizeof *f);
    if (which == 0) ckpt_weight_list(t, &f->l);
    else ckpt_part_list(t, fmt, &f->l);
    f->begin = mt_calloc((size_t)f->l.n + 1, sizeof *f->begin);
    f->first = mt_calloc((size_t)t->n_params + 1, sizeof *f->first);
    if (which == 1) /* the weights go by f->l.hf's item_of and elem_of */
        for (int j = f->l.n - 1; j >= 0; j--) f->first[f->l.param_of[j]] = j;
    const mt_st_meta meta[] = {{"format", "pt"}}; /* what mt_checkpoint_save writes */
    return mt_safetensors_layout(path, f->l.w, f->l.n, meta, 1, &f->head, &f->head_bytes, f->begin,
                                 &f->bytes);
}

static void plan_free(file_plan *f) {
    ckpt_tensor_list_free(&f->l);
    free(f->head);
    free(f->begin);
    free(f->first);
}

static int write_at(int fd, const char *path, const void *data, size_t n, uint64_t at) {
    const char *p = data;
    while (n > 0) {
        ssize_t k = pwrite(fd, p, n, (off_t)at);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return mt_error_set("%s: write failed: %s", path, mt_io_errtext(k < 0 ? errno : ENOSPC));
        p += k, n -= (size_t)k, at += (uint64_t)k;
    }
    return MT_OK;
}

/* ---- rank 0: begin ---- */

/* DIR/NAME with its header, holes up to its full length (the ranks fill them). */
static int make_file(const char *dir, const char *name, const file_plan *f) {
    char *path = ckpt_path_join(dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    int rc = fd < 0 ? mt_error_set("%s: cannot create: %s", path, mt_io_errtext(errno)) : MT_OK;
    if (rc == MT_OK) rc = write_at(fd, path, f->head, f->head_bytes, 0);
    if (rc == MT_OK && ftruncate(fd, (off_t)f->bytes) != 0)
        rc = mt_error_set("%s: cannot size to %llu bytes: %s", path, (unsigned long long)f->bytes,
                          mt_io_errtext(errno));
    if (fd >= 0 && close(fd) != 0 && rc == MT_OK)
        rc = mt_error_set("%s: close failed: %s", path, mt_io_errtext(errno));
    free(path);
    return rc;
}

/* The carried tensors (io/hf_layout.h) into DIR/model.safetensors at their places, from their
 * source files: no rank holds them. */
static int copy_carried(const char *dir, const file_plan *f) {
    const mt_hf_plan *pl = f->l.hf;
    int n = 0;
    for (int j = 0; j < pl->n; j++) n += pl->items[j].carried != NULL;
    if (n == 0) return MT_OK;
    char *path = ckpt_path_join(dir, FILES[0]);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    int rc = fd < 0 ? mt_error_set("%s: cannot open: %s", path, mt_io_errtext(errno)) : MT_OK;
    unsigned char *buf = mt_aligned_alloc((size_t)CHUNK_FLOATS * sizeof(float));
    mt_hf_reader rd;
    mt_hf_reader_init(&rd);
    for (int j = 0; j < pl->n && rc == MT_OK; j++) {
        const mt_hf_carried *c = pl->items[j].carried;
        if (!c) continue;
        size_t es = mt_dtype_size(c->dtype), step = (size_t)CHUNK_FLOATS * sizeof(float) / es;
        int64_t numel = (int64_t)(c->nbytes / es);
        for (int64_t e = 0; e < numel && rc == MT_OK; e += (int64_t)step) {
            int64_t k = numel - e < (int64_t)step ? numel - e : (int64_t)step;
            rc = mt_hf_fill(pl, j, e, k, buf, NULL, NULL, &rd);
            if (rc == MT_OK) rc = write_at(fd, path, buf, (size_t)k * es, f->begin[j] + (uint64_t)e * es);
        }
    }
    mt_hf_reader_close(&rd);
    free(buf);
    if (fd >= 0 && close(fd) != 0 && rc == MT_OK) rc = mt_error_set("%s: close failed: %s", path, mt_io_errtext(errno));
    free(path);
    return rc;
}

int mt_checkpoint_begin(const char *out_dir, const mt_param_table *t, mt_state_format format,
                        int64_t step, const char *args_json, const char *tokenizer_dir,
                        mt_ckpt_writer **out) {
    *out = NULL;
    mt_ckpt_writer *w = mt_calloc(1, sizeof *w);
    if (ckpt_tmp_open(out_dir, step, args_json, tokenizer_dir, &w->args, &w->d) != MT_OK) {
        free(w);
        return MT_ERR;
    }
    w->tok_dir = tokenizer_dir ? mt_strdup(tokenizer_dir) : NULL;
    int rc = ckpt_save_config(w->d.tmp, t, &w->files);
    for (int i = 0; i < 2 && rc == MT_OK; i++) {
        file_plan f;
        rc = plan_file(&f, t, format, i, FILES[i]);
        if (rc == MT_OK) rc = make_file(w->d.tmp, FILES[i], &f);
        if (rc == MT_OK && i == 0) rc = copy_carried(w->d.tmp, &f);
        plan_free(&f);
    }
    if (rc != MT_OK) {
        mt_checkpoint_abort(w);
        return rc;
    }
    *out = w;
    return MT_OK;
}

const char *mt_checkpoint_writer_dir(const mt_ckpt_writer *w) { return w->d.tmp; }

/* ---- every rank: its elements ---- */

typedef struct {
    const mt_param_table *t;
    const mt_state_io *io;
    const char *out_dir, *path;
    int64_t step;
    int fd;
    float *buf;
} shard_ctx;

static int nonfinite(const shard_ctx *c, const char *what, const mt_param *p) {
    return mt_error_set("%s: checkpoint of step %lld not written: %s NaN or inf in tensor %s "
                        "(the older checkpoints are kept as they are)", c->out_dir,
                        (long long)c->step, what, p->name);
}

/* p's owned weights, in chunks converted to fp32, at their place in model.safetensors. */
static int write_weights(shard_ctx *c, const file_plan *f, const mt_param *p, int i, int64_t lo, int64_t hi) {
    for (int64_t e = lo; e < hi; e += CHUNK_FLOATS) {
        int64_t n = hi - e < CHUNK_FLOATS ? hi - e : CHUNK_FLOATS;
        MT_TRY(c->io->get_weights_range(c->io->ctx, p, e, n, c->buf));
        if (ckpt_any_nonfinite(c->buf, n)) return nonfinite(c, "the master weights hold", p);
        uint64_t at = f->begin[f->l.hf->item_of[i]] + (uint64_t)(f->l.hf->elem_of[i] + e) * sizeof(float);
        MT_TRY(write_at(c->fd, c->path, c->buf, (size_t)n * sizeof(float), at));
    }
    return MT_OK;
}

/* p's owned parts, straight from the state, at their places in optimizer.safetensors: a part of
 * numel elements from element lo, a block part from block lo / 256. */
static int write_parts(shard_ctx *c, const file_plan *f, const mt_param *p, int i, int64_t lo, int64_t hi) {
    mt_optim_tensor x[MT_OPTIM_MAX_TENSORS];
    int k_n = c->io->parts_range(c->io->ctx, p, lo, hi, x);
    if (k_n < 0) return MT_ERR;
    for (int k = 0; k < k_n; k++) {
        int j = f->first[i] + k;
        MT_CHECK(j < f->l.n && f->l.param_of[j] == i && f->l.part_of[j] == k, "part %d of %s", k, p->name);
        size_t es = mt_dtype_size(x[k].dtype), numel = 1;
        for (int d = 0; d < f->l.w[j].ndim; d++) numel *= (size_t)f->l.w[j].shape[d];
        uint64_t skip = numel == (size_t)p->numel ? (uint64_t)lo : (uint64_t)lo / MT_OPTIM_BLOCK;
        MT_CHECK((skip * es + x[k].bytes) <= numel * es, "%s of %s: [%lld, %lld) past its end", x[k].name,
                 p->name, (long long)lo, (long long)hi);
        if (x[k].dtype == MT_F32 && ckpt_any_nonfinite(x[k].data, (int64_t)x[k].numel))
            return nonfinite(c, ckpt_part_what(x[k].name), p);
        MT_TRY(write_at(c->fd, c->path, x[k].data, x[k].bytes, f->begin[j] + skip * es));
    }
    return MT_OK;
}

static int write_file_shard(shard_ctx *c, const char *dir, int which) {
    char *path = ckpt_path_join(dir, FILES[which]);
    file_plan f;
    int rc = plan_file(&f, c->t, c->io->format, which, path);
    c->path = path;
    c->fd = rc == MT_OK ? open(path, O_WRONLY | O_CLOEXEC) : -1;
    struct stat sb = {.st_size = -1};
    if (rc == MT_OK && c->fd < 0)
        rc = mt_error_set("%s: cannot open to write this rank's shard: %s (every rank writes its part "
                          "of a checkpoint: --out must be on a file system that all ranks see)",
                          path, mt_io_errtext(errno));
    else if (rc == MT_OK && (fstat(c->fd, &sb) != 0 || sb.st_size != (off_t)f.bytes))
        rc = mt_error_set("%s: %lld bytes where rank 0 made %llu (not the file rank 0 made: --out must "
                          "be on one file system that all ranks see)",
                          path, (long long)sb.st_size, (unsigned long long)f.bytes);
    for (int i = 0; i < c->t->n_params && rc == MT_OK; i++) {
        const mt_param *p = &c->t->params[i];
        int64_t lo, hi;
        c->io->owned(c->io->ctx, p, &lo, &hi);
        if (hi <= lo) continue;
        rc = which == 0 ? write_weights(c, &f, p, i, lo, hi) : write_parts(c, &f, p, i, lo, hi);
    }
    if (rc == MT_OK && fsync(c->fd) != 0) rc = mt_error_set("%s: fsync failed: %s", path, mt_io_errtext(errno));
    if (c->fd >= 0 && close(c->fd) != 0 && rc == MT_OK)
        rc = mt_error_set("%s: close failed: %s", path, mt_io_errtext(errno));
    plan_free(&f);
    free(path);
    return rc;
}

int mt_checkpoint_write_shard(const char *tmp_dir, const mt_param_table *t, const mt_state_io *io,
                              const char *out_dir, int64_t step) {
    MT_CHECK(io && io->owned && io->get_weights_range && io->parts_range,
             "checkpoint shard: the state is not sharded (mt_state_io without owned)");
    shard_ctx c = {.t = t, .io = io, .out_dir = out_dir, .step = step, .fd = -1,
                   .buf = mt_aligned_alloc(CHUNK_FLOATS * sizeof(float))};
    int rc = write_file_shard(&c, tmp_dir, 0);
    if (rc == MT_OK) rc = write_file_shard(&c, tmp_dir, 1);
    free(c.buf);
    return rc;
}

/* ---- rank 0: finish or abort ---- */

/* PATH's length and XXH3-64, read through a 4 MiB buffer: no mapping of the file, so rank 0's
 * resident memory does not grow by the checkpoint's size. Returns 0 or an errno. */
static int digest_read(const char *path, mt_file_digest *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    size_t cap = (size_t)CHUNK_FLOATS * sizeof(float);
    unsigned char *buf = mt_aligned_alloc(cap);
    XXH3_state_t *st = XXH3_createState();
    MT_CHECK(st, "XXH3_createState: out of memory");
    XXH3_64bits_reset(st);
    uint64_t bytes = 0;
    int e = 0;
    for (;;) {
        ssize_t k = read(fd, buf, cap);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) e = errno;
        if (k <= 0) break;
        XXH3_64bits_update(st, buf, (size_t)k);
        bytes += (uint64_t)k;
    }
    out->bytes = bytes;
    out->xxh3 = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    free(buf);
    close(fd);
    return e;
}

static void writer_free(mt_ckpt_writer *w) {
    json_decref(w->args);
    free(w->tok_dir);
    free(w);
}

int mt_checkpoint_finish(mt_ckpt_writer *w, const mt_state_io *io, const mt_ckpt_state *st, int keep_last) {
    MT_CHECK(st->step == w->d.step, "checkpoint finish: step %lld, begun as %lld", (long long)st->step,
             (long long)w->d.step);
    int rc = MT_OK;
    /* the checksums trainer_state.json records, read back: no rank saw the whole file */
    for (int i = 0; i < 2 && rc == MT_OK; i++) {
        char *path = ckpt_path_join(w->d.tmp, FILES[i]);
        mt_file_digest d;
        int e = digest_read(path, &d);
        if (e) rc = mt_error_set("%s: cannot read back: %s", path, mt_io_errtext(e));
        else ckpt_add_file(&w->files, FILES[i], &d);
        free(path);
    }
    if (rc == MT_OK) rc = ckpt_save_last(w->d.tmp, st, io, w->args, w->tok_dir, &w->files);
    if (rc == MT_OK) rc = ckpt_tmp_publish(&w->d, keep_last, st->in_a_row);
    else ckpt_tmp_abort(&w->d);
    writer_free(w);
    return rc;
}

void mt_checkpoint_abort(mt_ckpt_writer *w) {
    if (!w) return;
    ckpt_tmp_abort(&w->d);
    writer_free(w);
}
