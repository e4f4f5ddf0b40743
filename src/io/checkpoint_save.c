/* Saving training checkpoints: a temporary directory filled, fsync'd and renamed into place
 * (checkpoint.h). */
#include "io/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/checkpoint_dir.h"
#include "io/digest.h"
#include "io/safetensors.h"
#include "model/config.h"

#define COPY_CHUNK (1 << 20)

static const char *const TOKENIZER_FILES[] = {"tokenizer.json", "tokenizer_config.json",
                                              "special_tokens_map.json", "generation_config.json"};

/* ---- small file-system helpers ---- */

static int make_dirs(const char *dir) {
    if (!*dir) return mt_error_set("checkpoint: empty output directory path");
    char *p = mt_strdup(dir);
    int rc = MT_OK;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0') continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            rc = mt_error_set("%s: cannot create directory: %s", p, strerror(errno));
        else if (!ckpt_is_dir(p))
            rc = mt_error_set("%s: exists and is not a directory", p);
        *s = c;
        if (rc != MT_OK || c == '\0') break;
    }
    free(p);
    return rc;
}

static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return mt_error_set("%s: cannot open directory to fsync: %s", dir, strerror(errno));
    int rc = MT_OK;
    if (fsync(fd) != 0)
        rc = mt_error_set("%s: fsync of directory failed: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path) == 0 ? 0 : errno;
}

/* rm -rf PATH; a missing PATH is fine. Returns 0 or an errno. */
static int rmtree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? 0 : errno;
    int e = nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return e < 0 ? errno : e;
}

static void warn_rmtree(const char *path) {
    int e = rmtree(path);
    if (e)
        fprintf(stderr, "megatrain: warning: %s: could not remove: %s\n", path, strerror(e));
}

/* ---- the state, one tensor at a time ---- */

/* The writer's fill callbacks produce tensor i of a file chunk by chunk: its param's weights (or
 * parts) are fetched from io into the buffers at the first chunk, and checked there. */
typedef struct {
    const mt_param_table *t;
    const mt_state_io *io;
    ckpt_tensor_buf *b;
    const char *out_dir;
    int64_t step;
    int cur;             /* the param whose state is in b, -1 none */
    const int *param_of; /* optimizer file: tensor -> its param, and which of its parts */
    const int *part_of;
    const mt_hf_plan *pl; /* model file: its tensors */
    mt_hf_reader rd;      /* a carried tensor's source file */
} fill_ctx;

static int nonfinite(const fill_ctx *c, const char *what, const mt_param *p) {
    return mt_error_set("%s: checkpoint of step %lld not written: %s NaN or inf in tensor %s "
                        "(the older checkpoints are kept as they are)", c->out_dir,
                        (long long)c->step, what, p->name);
}

static int weight_piece(void *ctx, int i, int64_t begin, int64_t n, void *dst) {
    fill_ctx *c = ctx;
    const mt_param *p = &c->t->params[i];
    if (c->cur != i) {
        MT_TRY(c->io->get_weights(c->io->ctx, p, c->b->w));
        if (ckpt_any_nonfinite(c->b->w, p->numel))
            return nonfinite(c, "the master weights hold", p);
        c->cur = i;
    }
    memcpy(dst, c->b->w + begin, sizeof(float) * (size_t)n);
    return MT_OK;
}

static int fill_weights(void *ctx, int i, int64_t begin, int64_t n, void *dst) {
    fill_ctx *c = ctx;
    return mt_hf_fill(c->pl, i, begin, n, dst, weight_piece, c, &c->rd);
}

static int fill_parts(void *ctx, int i, int64_t begin, int64_t n, void *dst) {
    fill_ctx *c = ctx;
    const mt_param *p = &c->t->params[c->param_of[i]];
    if (c->cur != c->param_of[i]) {
        ckpt_buf_layout(c->b, p);
        MT_TRY(c->io->get_parts(c->io->ctx, p, c->b->part));
        for (int k = 0; k < c->b->n_parts; k++) {
            const mt_optim_tensor *x = &c->b->part[k];
            if (x->dtype == MT_F32 && ckpt_any_nonfinite(x->data, (int64_t)x->numel))
                return nonfinite(c, ckpt_part_what(x->name), p);
        }
        c->cur = c->param_of[i];
    }
    const mt_optim_tensor *x = &c->b->part[c->part_of[i]];
    size_t es = mt_dtype_size(x->dtype);
    memcpy(dst, (const unsigned char *)x->data + (size_t)begin * es, (size_t)n * es);
    return MT_OK;
}

/* DIR/NAME from the tensors w (data produced by fill), metadata {"format": "pt"}; its digest
 * into files. */
static int write_file(const char *dir, const char *name, const mt_st_write_tensor *w, int n,
                      mt_st_fill_fn fill, fill_ctx *c, ckpt_file_list *files) {
    const mt_st_meta meta[] = {{"format", "pt"}};
    char *path = ckpt_path_join(dir, name);
    mt_file_digest d;
    c->cur = -1;
    int rc = mt_safetensors_write_fill_digest(path, w, n, meta, 1, fill, c, &d);
    if (rc == MT_OK) ckpt_add_file(files, name, &d);
    free(path);
    return rc;
}

/* DIR/model.safetensors: every tensor's fp32 weights under its Hugging Face name, table order,
 * then the carried tensors (what mt_model_save writes for F32: with config.json, a model
 * directory). */
static int save_weights(const char *dir, fill_ctx *c, ckpt_file_list *files) {
    ckpt_tensor_list l;
    ckpt_weight_list(c->t, &l);
    c->pl = l.hf;
    mt_hf_reader_init(&c->rd);
    int rc = write_file(dir, "model.safetensors", l.w, l.n, fill_weights, c, files);
    mt_hf_reader_close(&c->rd);
    ckpt_tensor_list_free(&l);
    return rc;
}

/* DIR/optimizer.safetensors: tensor by tensor, its parts in the layout's order. */
static int save_parts(const char *dir, fill_ctx *c, ckpt_file_list *files) {
    ckpt_tensor_list l;
    ckpt_part_list(c->t, c->io->format, &l);
    c->param_of = l.param_of;
    c->part_of = l.part_of;
    int rc = write_file(dir, "optimizer.safetensors", l.w, l.n, fill_parts, c, files);
    ckpt_tensor_list_free(&l);
    return rc;
}

/* ---- save ---- */

/* DIR/config.json (written by the config module), its digest into files. A few hundred bytes:
 * reading it back costs nothing. */
int ckpt_save_config(const char *dir, const mt_param_table *t, ckpt_file_list *files) {
    char *path = ckpt_path_join(dir, "config.json");
    int rc = mt_hf_config_save(t, path);
    mt_file_digest d;
    if (rc == MT_OK) {
        int e = mt_digest_file(path, &d);
        if (e) rc = mt_error_set("%s: cannot read back: %s", path, strerror(e));
        else ckpt_add_file(files, "config.json", &d);
    }
    free(path);
    return rc;
}

/* seed: a JSON integer when it fits one, else its decimal digits as a string. */
static json_t *seed_json(uint64_t seed) {
    if (seed <= (uint64_t)INT64_MAX) return json_integer((json_int_t)seed);
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)seed);
    return json_string(buf);
}

/* A frozen state (a LoRA base) is weights without optimizer state: a checkpoint of it would
 * claim a resumable run that it is not. */
static int refuse_frozen(const mt_state_io *io) {
    if (io->format != MT_STATE_FROZEN) return MT_OK;
    return mt_error_set("checkpoint save: the state is frozen (a LoRA base model's weights, no "
                        "optimizer state): there is no training state to checkpoint");
}

static int save_state(const char *dir, const mt_ckpt_state *st, const mt_state_io *io,
                      json_t *args, json_t *lora, const ckpt_file_list *files) {
    MT_TRY(refuse_frozen(io)); /* the per-rank save reaches here (mt_checkpoint_finish) */
    json_t *o = json_object();
    json_object_set_new(o, "format", json_integer(MT_CKPT_FORMAT));
    json_object_set_new(o, "state", json_string(mt_state_format_name(io->format)));
    if (io->format == MT_STATE_TIGHT) { /* a string always: JSON readers lose u64 integers */
        char seed[32];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)io->sr_seed);
        json_object_set_new(o, "sr_seed", json_string(seed));
    }
    json_object_set_new(o, "step", json_integer((json_int_t)st->step));
    json_object_set_new(o, "seed", seed_json(st->seed));
    json_object_set_new(o, "loss", isfinite(st->loss) ? json_real(st->loss) : json_null());
    json_object_set_new(o, "updates", json_integer((json_int_t)st->updates));
    json_object_set_new(o, "skipped", json_integer((json_int_t)st->skipped));
    json_object_set_new(o, "nonfinite_in_a_row", json_integer((json_int_t)st->in_a_row));
    json_object_set(o, "args", args ? args : json_null());
    json_t *fo = json_object();
    for (int i = 0; i < files->n; i++) {
        char hex[MT_DIGEST_HEX];
        mt_digest_hex(files->e[i].d.xxh3, hex);
        json_t *e = json_object();
        json_object_set_new(e, "bytes", json_integer((json_int_t)files->e[i].d.bytes));
        json_object_set_new(e, "xxh3_64", json_string(hex));
        json_object_set_new(fo, files->e[i].name, e);
    }
    json_object_set_new(o, "files", fo);
    if (lora) json_object_set(o, "lora", lora);
    char *s = json_dumps(o, JSON_INDENT(2));
    json_decref(o);
    MT_CHECK(s, "json_dumps failed (out of memory?)");
    size_t n = strlen(s);
    char *text = mt_malloc(n + 2);
    memcpy(text, s, n);
    text[n] = '\n';
    free(s);
    char *path = ckpt_path_join(dir, "trainer_state.json");
    int rc = mt_atomic_write_file(path, text, n + 1);
    free(path);
    free(text);
    return rc;
}

/* Copies SRC to DST (atomic); *copied = 0 when SRC does not exist, else *d its digest. */
static int copy_file(const char *src, const char *dst, int *copied, mt_file_digest *d) {
    *copied = 0;
    FILE *in = fopen(src, "rb");
    if (!in) {
        if (errno == ENOENT) return MT_OK;
        return mt_error_set("%s: cannot read: %s", src, strerror(errno));
    }
    mt_atomic_file af;
    if (mt_atomic_open(&af, dst) != MT_OK) {
        fclose(in);
        return MT_ERR;
    }
    char *buf = mt_malloc(COPY_CHUNK);
    int rc = MT_OK;
    size_t k;
    while (rc == MT_OK && (k = fread(buf, 1, COPY_CHUNK, in)) > 0)
        rc = mt_atomic_write(&af, buf, k);
    if (rc == MT_OK && ferror(in)) rc = mt_error_set("%s: read failed: %s", src, strerror(errno));
    fclose(in);
    free(buf);
    if (rc != MT_OK) {
        mt_atomic_abort(&af);
        return MT_ERR;
    }
    MT_TRY(mt_atomic_commit_digest(&af, d));
    *copied = 1;
    return MT_OK;
}

static int save_tokenizer(const char *dir, const char *tok_dir, ckpt_file_list *files) {
    for (size_t i = 0; i < sizeof TOKENIZER_FILES / sizeof *TOKENIZER_FILES; i++) {
        char *src = ckpt_path_join(tok_dir, TOKENIZER_FILES[i]);
        char *dst = ckpt_path_join(dir, TOKENIZER_FILES[i]);
        mt_file_digest d;
        int copied, rc = copy_file(src, dst, &copied, &d);
        free(src);
        free(dst);
        MT_TRY(rc);
        if (copied) ckpt_add_file(files, TOKENIZER_FILES[i], &d);
    }
    return MT_OK;
}

int ckpt_save_last(const char *dir, const mt_ckpt_state *st, const mt_state_io *io,
                   struct json_t *args, const char *tok_dir, ckpt_file_list *files) {
    if (tok_dir) MT_TRY(save_tokenizer(dir, tok_dir, files));
    MT_TRY(save_state(dir, st, io, args, NULL, files)); /* last: it records the digests */
    return fsync_dir(dir); /* each file was fsync'd (and renamed by its writer) */
}

int ckpt_save_last_lora(const char *dir, const mt_ckpt_state *st, const mt_state_io *io,
                        struct json_t *args, struct json_t *lora, ckpt_file_list *files) {
    MT_TRY(save_state(dir, st, io, args, lora, files));
    return fsync_dir(dir);
}

static int save_contents(const char *dir, const mt_param_table *t, const mt_state_io *io,
                         const mt_ckpt_state *st, json_t *args, const char *tok_dir,
                         const char *out_dir) {
    ckpt_file_list files = {.n = 0};
    ckpt_tensor_buf b;
    ckpt_buf_init(&b, t, io->format);
    fill_ctx c = {.t = t, .io = io, .b = &b, .out_dir = out_dir, .step = st->step};
    /* config.json + model.safetensors are what mt_model_save writes for F32: a model directory */
    int rc = ckpt_save_config(dir, t, &files);
    if (rc == MT_OK) rc = save_weights(dir, &c, &files);
    if (rc == MT_OK) rc = save_parts(dir, &c, &files);
    ckpt_buf_free(&b);
    if (rc == MT_OK) rc = ckpt_save_last(dir, st, io, args, tok_dir, &files);
    return rc;
}

/* Moves CKDIR/TMP to CKDIR/NAME. When NAME exists (the same step saved again) the two are
 * exchanged atomically and the old one, now under TMP, is removed. */
static int publish(const char *ckdir, const char *tmp, const char *name) {
    char *dst = ckpt_path_join(ckdir, name);
    int rc = MT_OK, exchanged = 0;
    if (rename(tmp, dst) != 0) {
        int e = errno;
        if ((e == ENOTEMPTY || e == EEXIST) &&
            renameat2(AT_FDCWD, tmp, AT_FDCWD, dst, RENAME_EXCHANGE) == 0)
            exchanged = 1;
        else
            rc = mt_error_set("%s: cannot rename to %s: %s", tmp, dst,
                              strerror(e == ENOTEMPTY || e == EEXIST ? errno : e));
    }
    if (rc == MT_OK && fsync_dir(ckdir) != MT_OK)
        fprintf(stderr, "megatrain: warning: %s\n", mt_error_message());
    if (exchanged) warn_rmtree(tmp);
    free(dst);
    return rc;
}

/* An flock on directory PATH (flags: 0 or LOCK_NB), held while the returned fd is open; -1 and
 * errno on failure. A save holds one on its temporary directory, so that even without OUT's lock
 * another process's prune never removes a save in progress. */
static int lock_dir(const char *path, int flags) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    if (flock(fd, LOCK_EX | flags) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* CKDIR/step_N's trainer_state.json "nonfinite_in_a_row" (absent: 0); -1 when it cannot be read
 * (a damaged checkpoint is no healthy one). */
static int64_t saved_in_a_row(const char *ckdir, int64_t step) {
    char rel[128];
    ckpt_step_name(rel, sizeof rel, "", step);
    snprintf(rel + strlen(rel), sizeof rel - strlen(rel), "/trainer_state.json");
    char *path = ckpt_path_join(ckdir, rel);
    json_t *o = json_load_file(path, 0, NULL);
    free(path);
    json_t *v = json_object_get(o, "nonfinite_in_a_row");
    int64_t n = !json_is_object(o) ? -1 : !v ? 0 : json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
    json_decref(o);
    return n;
}

/* Removes every .tmp-* directory of CKDIR that no save holds locked; their count. */
static int remove_stale_temps(const char *ckdir) {
    DIR *d = opendir(ckdir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) != 0) continue;
        char *p = ckpt_path_join(ckdir, e->d_name);
        int fd = lock_dir(p, LOCK_NB);
        if (fd >= 0 || errno != EWOULDBLOCK) { /* not a live save's */
            int err = rmtree(p);
            if (err) fprintf(stderr, "megatrain: warning: %s: could not remove: %s\n", p, strerror(err));
            else n++;
        }
        if (fd >= 0) close(fd);
        free(p);
    }
    closedir(d);
    return n;
}

int mt_checkpoint_clean_temps(const char *out_dir) {
    char *ckdir = ckpt_path_join(out_dir, CKPT_SUBDIR);
    int n = remove_stale_temps(ckdir);
    free(ckdir);
    return n;
}

/* Keeps the keep_last highest steps (and `keep`, the one just written; and while keep's
 * in_a_row > 0, the newest one saved after a healthy step), then removes every .tmp-* entry.
 * Directories are renamed to .tmp-* before removal, so a crash mid-removal never leaves a partial
 * step_ directory. Failures here only warn: the new checkpoint is in place. */
static void prune(const char *ckdir, int keep_last, int64_t keep, int64_t in_a_row) {
    int err;
    char name[64], tmp_name[80];
    if (keep_last > 0) {
        ckpt_step_list l = ckpt_list_steps(ckdir, &err);
        int renamed = 0;
        int64_t healthy = -1; /* the step kept for the healthy state a run of skipped steps left */
        for (int i = 0; in_a_row > 0 && healthy < 0 && i < l.n; i++)
            if (l.steps[i] < keep && saved_in_a_row(ckdir, l.steps[i]) == 0) healthy = l.steps[i];
        for (int i = keep_last; i < l.n; i++) {
            if (l.steps[i] == keep || l.steps[i] == healthy) continue;
            ckpt_step_name(name, sizeof name, "", l.steps[i]);
            ckpt_step_name(tmp_name, sizeof tmp_name, TMP_PREFIX "del-", l.steps[i]);
            char *src = ckpt_path_join(ckdir, name), *dst = ckpt_path_join(ckdir, tmp_name);
            warn_rmtree(dst);
            if (rename(src, dst) == 0) renamed = 1;
            else fprintf(stderr, "megatrain: warning: %s: could not remove an old checkpoint: %s\n",
                         src, strerror(errno));
            free(src);
            free(dst);
        }
        free(l.steps);
        if (renamed && fsync_dir(ckdir) != MT_OK)
            fprintf(stderr, "megatrain: warning: %s\n", mt_error_message());
    }
    remove_stale_temps(ckdir);
}

int ckpt_tmp_open(const char *out_dir, int64_t step, const char *args_json, const char *tokenizer_dir,
                  json_t **args, ckpt_tmp_dir *d) {
    memset(d, 0, sizeof *d);
    d->lock = -1;
    *args = NULL;
    if (step < 0) return mt_error_set("%s: checkpoint step %lld must be >= 0", out_dir, (long long)step);
    if (tokenizer_dir && !ckpt_is_dir(tokenizer_dir))
        return mt_error_set("%s: tokenizer directory not found", tokenizer_dir);
    if (args_json) {
        json_error_t je;
        *args = json_loads(args_json, JSON_DECODE_ANY, &je);
        if (!*args)
            return mt_error_set("%s: checkpoint args are not valid JSON (line %d: %s)", out_dir,
                                je.line, je.text);
    }
    d->step = step;
    d->ckdir = ckpt_path_join(out_dir, CKPT_SUBDIR);
    char tmp_prefix[80];
    ckpt_step_name(d->name, sizeof d->name, "", step);
    ckpt_step_name(tmp_prefix, sizeof tmp_prefix, TMP_PREFIX, step);
    char *prefix = ckpt_path_join(d->ckdir, tmp_prefix);
    int rc = make_dirs(d->ckdir);
    if (rc == MT_OK) rc = mt_make_temp_dir(prefix, &d->tmp); /* .tmp-step_N.XXXXXX, ours alone */
    free(prefix);
    if (rc == MT_OK && (d->lock = lock_dir(d->tmp, 0)) < 0)
        rc = mt_error_set("%s: cannot lock: %s", d->tmp, strerror(errno));
    if (rc != MT_OK) {
        ckpt_tmp_abort(d);
        json_decref(*args);
        *args = NULL;
    }
    return rc;
}

static void tmp_free(ckpt_tmp_dir *d) {
    if (d->lock >= 0) close(d->lock);
    free(d->ckdir);
    free(d->tmp);
    memset(d, 0, sizeof *d);
    d->lock = -1;
}

void ckpt_tmp_abort(ckpt_tmp_dir *d) {
    if (d->tmp) {
        char msg[1024]; /* the cleanup must not overwrite the message */
        snprintf(msg, sizeof msg, "%s", mt_error_message());
        warn_rmtree(d->tmp);
        mt_error_set("%s", msg);
    }
    tmp_free(d);
}

int ckpt_tmp_publish(ckpt_tmp_dir *d, int keep_last, int64_t in_a_row) {
    int rc = publish(d->ckdir, d->tmp, d->name);
    if (rc != MT_OK) {
        ckpt_tmp_abort(d);
        return rc;
    }
    char *ckdir = mt_strdup(d->ckdir);
    int64_t step = d->step;
    tmp_free(d); /* the lock goes before the prune, which skips locked directories */
    prune(ckdir, keep_last, step, in_a_row);
    free(ckdir);
    return MT_OK;
}

int mt_checkpoint_save(const char *out_dir, const mt_param_table *t, const mt_state_io *io,
                       const mt_ckpt_state *st, const char *args_json, const char *tokenizer_dir,
                       int keep_last) {
    if (io) MT_TRY(refuse_frozen(io)); /* before anything is written */
    MT_CHECK(io && io->get_weights && io->get_parts && io->format >= MT_STATE_FULL &&
             io->format <= MT_STATE_TIGHT, "checkpoint save: incomplete mt_state_io");
    json_t *args;
    ckpt_tmp_dir d;
    MT_TRY(ckpt_tmp_open(out_dir, st->step, args_json, tokenizer_dir, &args, &d));
    int rc = save_contents(d.tmp, t, io, st, args, tokenizer_dir, out_dir);
    if (rc == MT_OK) rc = ckpt_tmp_publish(&d, keep_last, st->in_a_row);
    else ckpt_tmp_abort(&d);
    json_decref(args);
    return rc;
}
