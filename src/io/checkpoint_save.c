/* Saving training checkpoints: a temporary directory filled, fsync'd and renamed into place
 * (checkpoint.h). */
#include "io/checkpoint.h"

#include <ctype.h>
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
#include "io/model_io.h"
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

/* ---- finiteness: a NaN or inf in saved state would poison every step after a resume ---- */

static const char *const ARENA_WHAT[3] = {"the master weights hold",
                                          "exp_avg (Adam's first moment) holds",
                                          "exp_avg_sq (Adam's second moment) holds"};

/* The first tensor (arena order: master, m1, m2) holding NaN/inf, or NULL; *which = the arena. */
static const char *first_nonfinite(const mt_param_table *t, const float *const arenas[3],
                                   int *which) {
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < t->n_params; i++) {
            const mt_param *p = &t->params[i];
            if (ckpt_any_nonfinite(arenas[k] + p->offset, p->numel)) {
                *which = k;
                return p->name;
            }
        }
    return NULL;
}

/* ---- save ---- */

/* DIR/NAME: one tensor per parameter and prefix (prefix "" names it as the model does), every
 * arena in table order, F32, metadata {"format": "pt"}; its digest into files. */
static int save_tensors(const char *dir, const char *name, const mt_param_table *t,
                        const float *const *arenas, const char *const *prefixes, int n_arenas,
                        ckpt_file_list *files) {
    int n = n_arenas * t->n_params;
    mt_st_write_tensor *w = mt_calloc((size_t)(n ? n : 1), sizeof *w);
    char (*names)[160] = mt_calloc((size_t)(n ? n : 1), sizeof *names);
    for (int k = 0; k < n_arenas; k++)
        for (int i = 0; i < t->n_params; i++) {
            const mt_param *p = &t->params[i];
            int j = k * t->n_params + i;
            snprintf(names[j], sizeof names[j], "%s%s", prefixes[k], p->name);
            w[j].name = names[j];
            w[j].dtype = MT_F32;
            w[j].ndim = p->ndim;
            for (int d = 0; d < p->ndim; d++) w[j].shape[d] = p->shape[d];
            w[j].data = arenas[k] + p->offset;
        }
    const mt_st_meta meta[] = {{"format", "pt"}};
    char *path = ckpt_path_join(dir, name);
    mt_file_digest d;
    int rc = mt_safetensors_write_digest(path, w, n, meta, 1, &d);
    if (rc == MT_OK) ckpt_add_file(files, name, &d);
    free(path);
    free(names);
    free(w);
    return rc;
}

/* DIR/config.json (written by the config module), its digest into files. A few hundred bytes:
 * reading it back costs nothing. */
static int save_config(const char *dir, const mt_param_table *t, ckpt_file_list *files) {
    char *path = ckpt_path_join(dir, "config.json");
    int rc = mt_config_save(&t->cfg, path);
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

static int save_state(const char *dir, const mt_ckpt_state *st, json_t *args,
                      const ckpt_file_list *files) {
    json_t *o = json_object();
    json_object_set_new(o, "format", json_integer(MT_CKPT_FORMAT));
    json_object_set_new(o, "step", json_integer((json_int_t)st->step));
    json_object_set_new(o, "seed", seed_json(st->seed));
    json_object_set_new(o, "loss", isfinite(st->loss) ? json_real(st->loss) : json_null());
    json_object_set_new(o, "updates", json_integer((json_int_t)st->updates));
    json_object_set_new(o, "skipped", json_integer((json_int_t)st->skipped));
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

static int save_contents(const char *dir, const mt_param_table *t, const float *master,
                         const float *m1, const float *m2, const mt_ckpt_state *st, json_t *args,
                         const char *tok_dir) {
    ckpt_file_list files = {.n = 0};
    const float *const model_arena[] = {master}, *const moments[] = {m1, m2};
    const char *const model_prefix[] = {""}, *const moment_prefixes[] = {"exp_avg.", "exp_avg_sq."};
    /* config.json + model.safetensors are what mt_model_save writes for F32: a model directory */
    MT_TRY(save_config(dir, t, &files));
    MT_TRY(save_tensors(dir, "model.safetensors", t, model_arena, model_prefix, 1, &files));
    MT_TRY(save_tensors(dir, "optimizer.safetensors", t, moments, moment_prefixes, 2, &files));
    if (tok_dir) MT_TRY(save_tokenizer(dir, tok_dir, &files));
    MT_TRY(save_state(dir, st, args, &files)); /* last: it records the others' digests */
    return fsync_dir(dir); /* each file was fsync'd and renamed by the atomic writer */
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

/* Keeps the keep_last highest steps (and `keep`, the one just written), then removes every
 * .tmp-* entry. Directories are renamed to .tmp-* before removal, so a crash mid-removal never
 * leaves a partial step_ directory. Failures here only warn: the new checkpoint is in place. */
static void prune(const char *ckdir, int keep_last, int64_t keep) {
    int err;
    char name[64], tmp_name[80];
    if (keep_last > 0) {
        ckpt_step_list l = ckpt_list_steps(ckdir, &err);
        int renamed = 0;
        for (int i = keep_last; i < l.n; i++) {
            if (l.steps[i] == keep) continue;
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
    DIR *d = opendir(ckdir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) != 0) continue;
        char *p = ckpt_path_join(ckdir, e->d_name);
        int fd = lock_dir(p, LOCK_NB);
        if (fd >= 0 || errno != EWOULDBLOCK) warn_rmtree(p); /* not a live save's */
        if (fd >= 0) close(fd);
        free(p);
    }
    closedir(d);
}

int mt_checkpoint_save(const char *out_dir, const mt_param_table *t, const float *master,
                       const float *m1, const float *m2, const mt_ckpt_state *st,
                       const char *args_json, const char *tokenizer_dir, int keep_last) {
    if (st->step < 0)
        return mt_error_set("%s: checkpoint step %lld must be >= 0", out_dir, (long long)st->step);
    if (tokenizer_dir && !ckpt_is_dir(tokenizer_dir))
        return mt_error_set("%s: tokenizer directory not found", tokenizer_dir);
    const float *const arenas[3] = {master, m1, m2};
    int which;
    const char *bad = first_nonfinite(t, arenas, &which);
    if (bad)
        return mt_error_set("%s: checkpoint of step %lld not written: %s NaN or inf in tensor %s "
                            "(the older checkpoints are kept as they are)", out_dir,
                            (long long)st->step, ARENA_WHAT[which], bad);
    json_t *args = NULL;
    if (args_json) {
        json_error_t je;
        args = json_loads(args_json, JSON_DECODE_ANY, &je);
        if (!args)
            return mt_error_set("%s: checkpoint args are not valid JSON (line %d: %s)", out_dir,
                                je.line, je.text);
    }
    char *ckdir = ckpt_path_join(out_dir, CKPT_SUBDIR);
    int rc = make_dirs(ckdir);
    char name[64], tmp_prefix[80];
    ckpt_step_name(name, sizeof name, "", st->step);
    ckpt_step_name(tmp_prefix, sizeof tmp_prefix, TMP_PREFIX, st->step);
    char *prefix = ckpt_path_join(ckdir, tmp_prefix), *tmp = NULL;
    if (rc == MT_OK) rc = mt_make_temp_dir(prefix, &tmp); /* .tmp-step_N.XXXXXX, ours alone */
    int lock = rc == MT_OK ? lock_dir(tmp, 0) : -1;
    if (rc == MT_OK && lock < 0)
        rc = mt_error_set("%s: cannot lock: %s", tmp, strerror(errno));
    if (rc == MT_OK) {
        rc = save_contents(tmp, t, master, m1, m2, st, args, tokenizer_dir);
        if (rc == MT_OK) rc = publish(ckdir, tmp, name);
        if (rc != MT_OK) {
            char msg[1024]; /* the cleanup must not overwrite the message */
            snprintf(msg, sizeof msg, "%s", mt_error_message());
            warn_rmtree(tmp);
            mt_error_set("%s", msg);
        }
    }
    if (lock >= 0) close(lock);
    if (rc == MT_OK) prune(ckdir, keep_last, st->step);
    json_decref(args);
    free(prefix);
    free(tmp);
    free(ckdir);
    return rc;
}
