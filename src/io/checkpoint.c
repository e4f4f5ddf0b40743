/* Training checkpoints: a temporary directory filled, fsync'd and renamed into place. */
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
#include "io/digest.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "model/config.h"

#define CKPT_SUBDIR "checkpoints"
#define STEP_PREFIX "step_"
#define TMP_PREFIX ".tmp-"
#define COPY_CHUNK (1 << 20)
#define MAX_FILES 16        /* entries of trainer_state.json's "files" */
#define FINITE_BLOCK (1 << 16) /* floats per finiteness-check work item */

static const char *const TOKENIZER_FILES[] = {"tokenizer.json", "tokenizer_config.json",
                                              "special_tokens_map.json", "generation_config.json"};

/* ---- small file-system helpers ---- */

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = mt_malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

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
        else if (!is_dir(p))
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

/* "step_<digits>" -> step; -1 for any other name. */
static int64_t parse_step_name(const char *name) {
    size_t k = strlen(STEP_PREFIX);
    if (strncmp(name, STEP_PREFIX, k) != 0) return -1;
    const char *s = name + k;
    size_t n = strlen(s);
    if (n == 0 || n > 18 || strspn(s, "0123456789") != n) return -1;
    return strtoll(s, NULL, 10);
}

typedef struct {
    int64_t *steps;
    int n, cap;
} step_list;

/* The step_N directories of CKDIR, highest first. errno-style result in *err (0 when listed). */
static step_list list_steps(const char *ckdir, int *err) {
    step_list l = {NULL, 0, 0};
    *err = 0;
    DIR *d = opendir(ckdir);
    if (!d) {
        *err = errno;
        return l;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s = parse_step_name(e->d_name);
        if (s < 0) continue;
        char *p = path_join(ckdir, e->d_name);
        int dir = is_dir(p);
        free(p);
        if (!dir) continue;
        if (l.n == l.cap) {
            l.cap = l.cap ? 2 * l.cap : 16;
            int64_t *grown = mt_malloc(sizeof(int64_t) * (size_t)l.cap);
            if (l.n) memcpy(grown, l.steps, sizeof(int64_t) * (size_t)l.n);
            free(l.steps);
            l.steps = grown;
        }
        l.steps[l.n++] = s;
    }
    closedir(d);
    for (int i = 1; i < l.n; i++) /* insertion sort, descending; lists are short */
        for (int j = i; j > 0 && l.steps[j] > l.steps[j - 1]; j--) {
            int64_t x = l.steps[j];
            l.steps[j] = l.steps[j - 1];
            l.steps[j - 1] = x;
        }
    return l;
}

static void step_name(char *buf, size_t size, const char *prefix, int64_t step) {
    snprintf(buf, size, "%s" STEP_PREFIX "%08lld", prefix, (long long)step);
}

/* The files of a checkpoint with their digests, as trainer_state.json records them. */
typedef struct {
    char name[64];
    mt_file_digest d;
} file_entry;

typedef struct {
    file_entry e[MAX_FILES];
    int n;
} file_list;

static void add_file(file_list *l, const char *name, const mt_file_digest *d) {
    MT_CHECK(l->n < MAX_FILES && strlen(name) < sizeof l->e[0].name, "checkpoint file list");
    snprintf(l->e[l->n].name, sizeof l->e[0].name, "%s", name);
    l->e[l->n++].d = *d;
}

/* ---- finiteness: a NaN or inf in saved state would poison every step after a resume ---- */

/* 1 when any of the n floats at p (possibly unaligned: a mapped file) is NaN or inf. */
static int block_nonfinite(const unsigned char *p, int64_t n) {
    int bad = 0;
    /* |x| as bits > FLT_MAX's bits <=> NaN or inf; a signed compare, which SSE2 has */
#pragma omp simd reduction(| : bad)
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, p + 4 * i, 4);
        bad |= (int32_t)(u & 0x7fffffffu) > 0x7f7fffff;
    }
    return bad;
}

static int any_nonfinite(const void *x, int64_t n) {
    const unsigned char *p = x;
    int64_t blocks = (n + FINITE_BLOCK - 1) / FINITE_BLOCK;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (blocks > 4)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t begin = b * FINITE_BLOCK, k = n - begin < FINITE_BLOCK ? n - begin : FINITE_BLOCK;
        bad |= block_nonfinite(p + 4 * begin, k);
    }
    return bad;
}

static const char *const ARENA_WHAT[3] = {"the master weights hold",
                                          "exp_avg (Adam's first moment) holds",
                                          "exp_avg_sq (Adam's second moment) holds"};

/* The first tensor (arena order: master, m1, m2) holding NaN/inf, or NULL; *which = the arena. */
static const char *first_nonfinite(const mt_param_table *t, const float *const arenas[3],
                                   int *which) {
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < t->n_params; i++) {
            const mt_param *p = &t->params[i];
            if (any_nonfinite(arenas[k] + p->offset, p->numel)) {
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
                        file_list *files) {
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
    char *path = path_join(dir, name);
    mt_file_digest d;
    int rc = mt_safetensors_write_digest(path, w, n, meta, 1, &d);
    if (rc == MT_OK) add_file(files, name, &d);
    free(path);
    free(names);
    free(w);
    return rc;
}

/* DIR/config.json (written by the config module), its digest into files. A few hundred bytes:
 * reading it back costs nothing. */
static int save_config(const char *dir, const mt_param_table *t, file_list *files) {
    char *path = path_join(dir, "config.json");
    int rc = mt_config_save(&t->cfg, path);
    mt_file_digest d;
    if (rc == MT_OK) {
        int e = mt_digest_file(path, &d);
        if (e) rc = mt_error_set("%s: cannot read back: %s", path, strerror(e));
        else add_file(files, "config.json", &d);
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
                      const file_list *files) {
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
    char *path = path_join(dir, "trainer_state.json");
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

static int save_tokenizer(const char *dir, const char *tok_dir, file_list *files) {
    for (size_t i = 0; i < sizeof TOKENIZER_FILES / sizeof *TOKENIZER_FILES; i++) {
        char *src = path_join(tok_dir, TOKENIZER_FILES[i]);
        char *dst = path_join(dir, TOKENIZER_FILES[i]);
        mt_file_digest d;
        int copied, rc = copy_file(src, dst, &copied, &d);
        free(src);
        free(dst);
        MT_TRY(rc);
        if (copied) add_file(files, TOKENIZER_FILES[i], &d);
    }
    return MT_OK;
}

static int save_contents(const char *dir, const mt_param_table *t, const float *master,
                         const float *m1, const float *m2, const mt_ckpt_state *st, json_t *args,
                         const char *tok_dir) {
    file_list files = {.n = 0};
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
    char *dst = path_join(ckdir, name);
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
        step_list l = list_steps(ckdir, &err);
        int renamed = 0;
        for (int i = keep_last; i < l.n; i++) {
            if (l.steps[i] == keep) continue;
            step_name(name, sizeof name, "", l.steps[i]);
            step_name(tmp_name, sizeof tmp_name, TMP_PREFIX "del-", l.steps[i]);
            char *src = path_join(ckdir, name), *dst = path_join(ckdir, tmp_name);
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
        char *p = path_join(ckdir, e->d_name);
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
    if (tokenizer_dir && !is_dir(tokenizer_dir))
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
    char *ckdir = path_join(out_dir, CKPT_SUBDIR);
    int rc = make_dirs(ckdir);
    char name[64], tmp_prefix[80];
    step_name(name, sizeof name, "", st->step);
    step_name(tmp_prefix, sizeof tmp_prefix, TMP_PREFIX, st->step);
    char *prefix = path_join(ckdir, tmp_prefix), *tmp = NULL;
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

/* ---- latest ---- */

int mt_checkpoint_latest(const char *out_dir, char *path, size_t path_size) {
    char *ckdir = path_join(out_dir, CKPT_SUBDIR);
    int err;
    step_list l = list_steps(ckdir, &err);
    int rc;
    if (err && err != ENOENT)
        rc = mt_error_set("%s: cannot list checkpoints: %s", ckdir, strerror(err));
    else if (l.n == 0)
        rc = mt_error_set("%s: no checkpoint to resume from (no %s/" STEP_PREFIX "* directory)",
                          out_dir, ckdir);
    else {
        char name[64];
        step_name(name, sizeof name, "", l.steps[0]);
        int k = snprintf(path, path_size, "%s/%s", ckdir, name);
        rc = k >= 0 && (size_t)k < path_size
                 ? MT_OK
                 : mt_error_set("%s/%s: path longer than %zu bytes", ckdir, name, path_size);
    }
    free(l.steps);
    free(ckdir);
    return rc;
}

/* ---- load ---- */

/* Every field that shapes the parameter table must agree; others only warn. */
static int check_config(const mt_config *disk, const mt_config *run, const char *path) {
    if (disk->arch != run->arch)
        return mt_error_set("%s: model_type is %s, the run's model is %s; this checkpoint belongs "
                            "to a different model", path, disk->model_type, run->model_type);
    struct {
        const char *field;
        int disk, run;
    } f[] = {
        {"hidden_size", disk->C, run->C},
        {"intermediate_size", disk->F, run->F},
        {"num_hidden_layers", disk->L, run->L},
        {"num_attention_heads", disk->H, run->H},
        {"num_key_value_heads", disk->G, run->G},
        {"head_dim", disk->D, run->D},
        {"vocab_size", disk->V, run->V},
        {"tie_word_embeddings", disk->tie_word_embeddings, run->tie_word_embeddings},
        {"attention_bias (q/k/v)", disk->qkv_bias, run->qkv_bias},
        {"attention_bias (o_proj)", disk->o_bias, run->o_bias},
        {"mlp_bias", disk->mlp_bias, run->mlp_bias},
        {"qk_norm", disk->qk_norm, run->qk_norm},
    };
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        if (f[i].disk != f[i].run)
            return mt_error_set("%s: %s is %d, the run's model has %d; this checkpoint belongs to "
                                "a different model", path, f[i].field, f[i].disk, f[i].run);
    if (disk->rms_norm_eps != run->rms_norm_eps || disk->rope_theta != run->rope_theta ||
        disk->rope_type != run->rope_type)
        fprintf(stderr, "megatrain: warning: %s: rms_norm_eps or rope settings differ from the "
                "run's config; the run's values are used\n", path);
    return MT_OK;
}

/* The inverse of seed_json: an integer >= 0, or a string of decimal digits up to 2^64 - 1. */
static int parse_seed(const json_t *v, uint64_t *out) {
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *out = (uint64_t)json_integer_value(v);
        return MT_OK;
    }
    const char *digits = json_string_value(v);
    size_t n = digits ? strlen(digits) : 0;
    if (n == 0 || n > 20 || strspn(digits, "0123456789") != n) return MT_ERR;
    errno = 0;
    unsigned long long x = strtoull(digits, NULL, 10);
    if (errno) return MT_ERR;
    *out = x;
    return MT_OK;
}

/* A file name trainer_state.json may list: plain, inside the checkpoint directory. */
static int plain_file_name(const char *s) {
    return *s && strlen(s) < sizeof((file_entry *)0)->name && !strchr(s, '/') &&
           strcmp(s, ".") != 0 && strcmp(s, "..") != 0 && strcmp(s, "trainer_state.json") != 0;
}

/* "files": {NAME: {"bytes": N, "xxh3_64": "16 hex"}, ...} -> l. */
static int read_files(const char *path, const json_t *fo, file_list *l) {
    if (!json_is_object(fo))
        return mt_error_set("%s: \"files\" must be an object of file checksums (format 2)", path);
    const char *name;
    json_t *v;
    l->n = 0;
    json_object_foreach((json_t *)fo, name, v) {
        json_t *bytes = json_object_get(v, "bytes");
        mt_file_digest d;
        if (!plain_file_name(name) || l->n == MAX_FILES)
            return mt_error_set("%s: \"files\": \"%s\" is not a checkpoint file name", path, name);
        if (!json_is_integer(bytes) || json_integer_value(bytes) < 0 ||
            mt_digest_parse_hex(json_string_value(json_object_get(v, "xxh3_64")), &d.xxh3) != MT_OK)
            return mt_error_set("%s: \"files\": \"%s\" needs \"bytes\" (an integer >= 0) and "
                                "\"xxh3_64\" (16 hex digits)", path, name);
        d.bytes = (uint64_t)json_integer_value(bytes);
        add_file(l, name, &d);
    }
    static const char *const required[] = {"config.json", "model.safetensors",
                                           "optimizer.safetensors"};
    for (size_t r = 0; r < sizeof required / sizeof *required; r++) {
        int found = 0;
        for (int k = 0; k < l->n; k++) found |= strcmp(l->e[k].name, required[r]) == 0;
        if (!found)
            return mt_error_set("%s: \"files\" has no checksum of %s", path, required[r]);
    }
    return MT_OK;
}

/* The step a directory's name says (.../step_00000038 -> 38), or -1 for another name. */
static int64_t dir_step(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    char name[64];
    if (n - b >= sizeof name) return -1;
    memcpy(name, dir + b, n - b);
    name[n - b] = '\0';
    return parse_step_name(name);
}

/* trainer_state.json -> *out, *format and (format 2) the recorded files. */
static int read_state(const char *path, int64_t dir_step_num, mt_ckpt_state *out, int *format,
                      file_list *files) {
    if (access(path, R_OK) != 0) return mt_error_set("%s: cannot open: %s", path, strerror(errno));
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) return mt_error_set("%s: not valid JSON (line %d: %s)", path, je.line, je.text);
    int rc = MT_OK;
    json_t *fmt = json_object_get(o, "format"), *step = json_object_get(o, "step");
    json_t *seed = json_object_get(o, "seed"), *loss = json_object_get(o, "loss");
    json_t *updates = json_object_get(o, "updates"), *skipped = json_object_get(o, "skipped");
    json_t *args = json_object_get(o, "args");
    mt_ckpt_state s = {0, 0, NAN, 0, 0, NULL};
    files->n = 0;
    if (!json_is_integer(fmt) || json_integer_value(fmt) < 1 ||
        json_integer_value(fmt) > MT_CKPT_FORMAT)
        rc = mt_error_set("%s: \"format\" must be 1 to %d (a checkpoint of a newer version?)",
                          path, MT_CKPT_FORMAT);
    else if (!json_is_integer(step) || json_integer_value(step) < 0)
        rc = mt_error_set("%s: \"step\" must be an integer >= 0", path);
    else {
        *format = (int)json_integer_value(fmt);
        s.step = json_integer_value(step);
        if (dir_step_num >= 0 && s.step != dir_step_num)
            rc = mt_error_set("%s: \"step\" is %lld but the directory is step %lld's (a checkpoint "
                              "copied or renamed by hand?)", path, (long long)s.step,
                              (long long)dir_step_num);
        else if (parse_seed(seed, &s.seed) != MT_OK)
            rc = mt_error_set("%s: \"seed\" must be an integer >= 0", path);
    }
    if (rc == MT_OK) {
        if (json_is_number(loss)) s.loss = json_number_value(loss);
        else if (!json_is_null(loss))
            rc = mt_error_set("%s: \"loss\" must be a number or null", path);
    }
    if (rc == MT_OK) { /* absent in older checkpoints: every step was an update */
        s.updates = updates ? json_integer_value(updates) : s.step;
        s.skipped = skipped ? json_integer_value(skipped) : 0;
        if ((updates && !json_is_integer(updates)) || (skipped && !json_is_integer(skipped)) ||
            s.updates < 0 || s.skipped < 0 || s.updates > s.step || s.skipped > s.step)
            rc = mt_error_set("%s: \"updates\" and \"skipped\" must be integers from 0 to \"step\"", path);
    }
    if (rc == MT_OK && *format >= 2) rc = read_files(path, json_object_get(o, "files"), files);
    if (rc == MT_OK && args && !json_is_null(args))
        s.args_json = json_dumps(args, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    json_decref(o);
    if (rc == MT_OK) *out = s;
    return rc;
}

/* Every recorded file has its recorded length and XXH3-64; files hashed in parallel (a 7B
 * checkpoint is ~100 GB), the first failure in list order reported. */
static int verify_files(const char *dir, const file_list *l) {
    int err[MAX_FILES];
    mt_file_digest got[MAX_FILES];
#pragma omp parallel for schedule(dynamic, 1) if (l->n > 1)
    for (int i = 0; i < l->n; i++) {
        char *p = path_join(dir, l->e[i].name);
        err[i] = mt_digest_file(p, &got[i]);
        free(p);
    }
    for (int i = 0; i < l->n; i++) {
        const mt_file_digest *want = &l->e[i].d;
        const char *name = l->e[i].name;
        if (err[i])
            return mt_error_set("%s/%s: cannot read to verify its checksum: %s", dir, name,
                                strerror(err[i]));
        if (got[i].bytes != want->bytes)
            return mt_error_set("%s/%s: checksum mismatch: %llu bytes, trainer_state.json records "
                                "%llu (the file is truncated, damaged or was replaced)", dir, name,
                                (unsigned long long)got[i].bytes,
                                (unsigned long long)want->bytes);
        if (got[i].xxh3 != want->xxh3) {
            char a[MT_DIGEST_HEX], b[MT_DIGEST_HEX];
            mt_digest_hex(got[i].xxh3, a);
            mt_digest_hex(want->xxh3, b);
            return mt_error_set("%s/%s: checksum mismatch: xxh3_64 %s, trainer_state.json records "
                                "%s (the file is damaged or was replaced)", dir, name, a, b);
        }
    }
    return MT_OK;
}

/* A training checkpoint holds the fp32 master; an exported (converted) model in its place is
 * refused with what happened, before the checksum (which would only say "replaced"). */
static int check_weights_f32(const mt_safetensors *mst, const char *ckpt_dir) {
    for (int i = 0; i < mt_safetensors_count(mst); i++) {
        const mt_st_tensor *x = mt_safetensors_at(mst, i);
        if (x->dtype == MT_F32) continue;
        char dt[16];
        snprintf(dt, sizeof dt, "%s", mt_dtype_name(x->dtype));
        for (char *c = dt; *c; c++) *c = (char)tolower((unsigned char)*c);
        return mt_error_set("%s holds %s weights: an exported model, not a training checkpoint "
                            "(the fp32 master is gone); fine-tune from it with --model %s instead "
                            "of --resume", mt_safetensors_source(mst), dt, ckpt_dir);
    }
    return MT_OK;
}

/* The table's tensors in a handle (model: prefix "", optimizer: "exp_avg." ...) are finite. */
static int check_finite(const mt_safetensors *st, const mt_param_table *t, const char *prefix) {
    char name[160];
    for (int i = 0; i < t->n_params; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, t->params[i].name);
        const mt_st_tensor *x = mt_safetensors_find(st, name);
        if (x && x->dtype == MT_F32 && any_nonfinite(x->data, x->numel))
            return mt_error_set("%s: tensor %s holds NaN or inf; a checkpoint must be finite "
                                "(this one is damaged)", x->path, name);
    }
    return MT_OK;
}

static int check_moment(const mt_safetensors *ost, const char *path, const char *prefix,
                        const mt_param *p) {
    char name[128];
    snprintf(name, sizeof name, "%s.%s", prefix, p->name);
    const mt_st_tensor *x = mt_safetensors_find(ost, name);
    if (!x) return mt_error_set("%s: tensor %s is missing", path, name);
    if (x->dtype != MT_F32)
        return mt_error_set("%s: tensor %s: dtype %s, optimizer state must be F32", path, name,
                            mt_dtype_name(x->dtype));
    int same = x->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = x->shape[d] == p->shape[d];
    if (!same)
        return mt_error_set("%s: tensor %s: shape differs from the model's", path, name);
    return MT_OK;
}

static int check_optimizer(const mt_safetensors *ost, const char *path, const mt_param_table *t) {
    for (int i = 0; i < t->n_params; i++) {
        MT_TRY(check_moment(ost, path, "exp_avg", &t->params[i]));
        MT_TRY(check_moment(ost, path, "exp_avg_sq", &t->params[i]));
    }
    if (mt_safetensors_count(ost) != 2 * t->n_params)
        return mt_error_set("%s: %d tensors, the model's optimizer state has %d (tensors that are "
                            "not exp_avg/exp_avg_sq of this model)", path,
                            mt_safetensors_count(ost), 2 * t->n_params);
    return MT_OK;
}

/* Copies validated moments into an arena, zeroing the padding. */
static void load_moments(const mt_safetensors *ost, const char *prefix, const mt_param_table *t,
                         float *arena) {
    int64_t cursor = 0;
    char name[128];
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        if (p->offset > cursor)
            memset(arena + cursor, 0, sizeof(float) * (size_t)(p->offset - cursor));
        snprintf(name, sizeof name, "%s.%s", prefix, p->name);
        MT_CHECK(mt_st_tensor_to_f32(mt_safetensors_find(ost, name), arena + p->offset) == MT_OK,
                 "%s", mt_error_message());
        cursor = p->offset + p->numel;
    }
    if (t->total > cursor) memset(arena + cursor, 0, sizeof(float) * (size_t)(t->total - cursor));
}

int mt_checkpoint_read_state(const char *ckpt_dir, mt_ckpt_state *st) {
    char *path = path_join(ckpt_dir, "trainer_state.json");
    file_list files;
    int format;
    int rc = read_state(path, dir_step(ckpt_dir), st, &format, &files);
    free(path);
    return rc;
}

void mt_ckpt_state_free(mt_ckpt_state *st) {
    free(st->args_json);
    st->args_json = NULL;
}

int mt_checkpoint_load(const char *ckpt_dir, const mt_param_table *t, float *master, float *m1,
                       float *m2, mt_ckpt_state *st) {
    if (!is_dir(ckpt_dir)) return mt_error_set("%s: no such checkpoint directory", ckpt_dir);
    char *cfg_path = path_join(ckpt_dir, "config.json");
    char *state_path = path_join(ckpt_dir, "trainer_state.json");
    char *opt_path = path_join(ckpt_dir, "optimizer.safetensors");
    mt_config cfg;
    mt_ckpt_state s = {0};
    mt_safetensors *mst = NULL, *ost = NULL;
    file_list files;
    int format = 0;
    char open_err[1024] = "";
    int rc = read_state(state_path, dir_step(ckpt_dir), &s, &format, &files);
    if (rc == MT_OK) { /* an exported model in place of the master: say so first */
        if (mt_safetensors_open_dir(&mst, ckpt_dir) == MT_OK) rc = check_weights_f32(mst, ckpt_dir);
        else snprintf(open_err, sizeof open_err, "%s", mt_error_message());
    }
    if (rc == MT_OK && format >= 2) rc = verify_files(ckpt_dir, &files);
    if (rc == MT_OK && format < 2)
        fprintf(stderr, "megatrain: warning: %s: a format-%d checkpoint has no checksums; it cannot "
                "be verified\n", ckpt_dir, format);
    if (rc == MT_OK && !mst) rc = mt_error_set("%s", open_err);
    if (rc == MT_OK) rc = mt_config_load(&cfg, cfg_path);
    if (rc == MT_OK) rc = check_config(&cfg, &t->cfg, cfg_path);
    if (rc == MT_OK) rc = mt_safetensors_open_file(&ost, opt_path);
    if (rc == MT_OK) rc = check_optimizer(ost, opt_path, t);
    if (rc == MT_OK) rc = check_finite(mst, t, "");
    if (rc == MT_OK) rc = check_finite(ost, t, "exp_avg.");
    if (rc == MT_OK) rc = check_finite(ost, t, "exp_avg_sq.");
    mt_safetensors_close(mst);
    /* mt_model_load validates everything before it writes master; nothing below can fail. */
    if (rc == MT_OK) rc = mt_model_load(t, master, ckpt_dir);
    if (rc == MT_OK) {
        load_moments(ost, "exp_avg", t, m1);
        load_moments(ost, "exp_avg_sq", t, m2);
        *st = s;
    } else {
        mt_ckpt_state_free(&s);
    }
    mt_safetensors_close(ost);
    free(cfg_path);
    free(state_path);
    free(opt_path);
    return rc;
}

/* ---- resume ---- */

/* MSG without a leading "DIR/" (the warning names DIR already). */
static const char *relative_to(const char *msg, const char *dir) {
    size_t n = strlen(dir);
    return strncmp(msg, dir, n) == 0 && msg[n] == '/' ? msg + n + 1 : msg;
}

int mt_checkpoint_resume(const char *out_dir, const mt_param_table *t, float *master, float *m1,
                         float *m2, mt_ckpt_state *st, char *path, size_t path_size) {
    char *ckdir = path_join(out_dir, CKPT_SUBDIR);
    int err;
    step_list l = list_steps(ckdir, &err);
    int rc = MT_ERR, found = -1;
    char **why = mt_calloc((size_t)(l.n ? l.n : 1), sizeof *why); /* each damaged one's reason */
    if (err && err != ENOENT)
        mt_error_set("%s: cannot list checkpoints: %s", ckdir, strerror(err));
    else if (l.n == 0) {
        mt_error_set("%s: no checkpoint to resume from (no %s/" STEP_PREFIX "* directory)",
                     out_dir, ckdir);
        rc = MT_CKPT_NONE;
    }
    int too_long = 0;
    for (int i = 0; i < l.n && found < 0 && !too_long; i++) {
        char name[64];
        step_name(name, sizeof name, "", l.steps[i]);
        int k = snprintf(path, path_size, "%s/%s", ckdir, name); /* before the arenas change */
        if (k < 0 || (size_t)k >= path_size) {
            too_long = 1;
            mt_error_set("%s/%s: path longer than %zu bytes", ckdir, name, path_size);
            break;
        }
        if (mt_checkpoint_load(path, t, master, m1, m2, st) == MT_OK) found = i;
        else why[i] = mt_strdup(relative_to(mt_error_message(), path));
    }
    if (found >= 0) {
        char name[64];
        step_name(name, sizeof name, "", l.steps[found]);
        for (int i = 0; i < found; i++) {
            char bad[64];
            step_name(bad, sizeof bad, "", l.steps[i]);
            fprintf(stderr, "megatrain: warning: %s/%s is damaged (%s); resuming from %s instead\n",
                    ckdir, bad, why[i], name);
        }
        rc = MT_OK;
    } else if (l.n > 0 && !too_long) {
        char name[64];
        step_name(name, sizeof name, "", l.steps[0]);
        if (l.n == 1)
            mt_error_set("%s/%s is damaged (%s) and there is no older checkpoint to resume from",
                         ckdir, name, why[0]);
        else
            mt_error_set("%s/%s is damaged (%s), and none of the %d older checkpoints is intact "
                         "either", ckdir, name, why[0], l.n - 1);
    }
    for (int i = 0; i < l.n; i++) free(why[i]);
    free(why);
    free(l.steps);
    free(ckdir);
    return rc;
}
