#include "fz_util.h"

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/safetensors.h"

const char *const FZ_TOKENIZERS[FZ_N_TOKENIZERS] = {
    "tokenizers/gpt2", "tokenizers/llama3", "tokenizers/qwen2", "tokenizers/llama2",
    "tokenizers/mistral", "chat/qwen3", "chat/mistral_inst",
};

int fz_split(const uint8_t *data, size_t size, fz_part *parts, int max) {
    int n = 0;
    const uint8_t *p = data, *end = data + size;
    while (n < max - 1) {
        const uint8_t *s = size ? memmem(p, (size_t)(end - p), FZ_SEP, FZ_SEP_LEN) : NULL;
        if (!s) break;
        parts[n++] = (fz_part){p, (size_t)(s - p)};
        p = s + FZ_SEP_LEN;
    }
    parts[n++] = (fz_part){p, (size_t)(end - p)};
    return n;
}

const char *fz_fixtures(void) {
    const char *e = getenv("MT_FIXTURES");
    return e && *e ? e : MT_FIXTURES_DIR;
}

static char dir[512];
static pid_t dir_owner;

static int remove_one(const char *p, const struct stat *sb, int type, struct FTW *ftw) {
    return remove(p) != 0 && 0;
}

/* The directory and everything in it (the seed writer leaves subdirectories). */
static void remove_dir(void) {
    if (dir[0] && getpid() == dir_owner) nftw(dir, remove_one, 8, FTW_DEPTH | FTW_PHYS);
}

const char *fz_dir(void) {
    if (dir[0]) return dir;
    const char *base = getenv("MT_FUZZ_TMP");
    struct stat sb;
    if (!base || !*base) base = stat("/dev/shm", &sb) == 0 && access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    mkdir(base, 0700); /* $MT_FUZZ_TMP may not exist yet */
    snprintf(dir, sizeof dir, "%s/mtfuzz-XXXXXX", base);
    if (!mkdtemp(dir)) {
        perror(dir);
        abort();
    }
    dir_owner = getpid();
    atexit(remove_dir);
    return dir;
}

const char *fz_path(int slot, const char *name) {
    static char paths[8][600];
    FZ_ASSERT(slot >= 0 && slot < 8);
    snprintf(paths[slot], sizeof paths[slot], "%s/%s", fz_dir(), name);
    return paths[slot];
}

const char *fz_write(int slot, const char *name, const void *data, size_t n) {
    const char *p = fz_path(slot, name);
    if (!data) {
        unlink(p);
        return p;
    }
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FZ_ASSERT(fd >= 0);
    const char *b = data;
    while (n > 0) {
        ssize_t k = write(fd, b, n);
        FZ_ASSERT(k > 0);
        b += k;
        n -= (size_t)k;
    }
    close(fd);
    return p;
}

mt_tokenizer *fz_tokenizer(const char *rel) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", fz_fixtures(), rel);
    mt_tokenizer *t;
    if (mt_tokenizer_load(&t, p) != MT_OK) {
        fprintf(stderr, "fuzz: cannot load the fixture tokenizer %s: %s\n", p, mt_error_message());
        abort();
    }
    return t;
}

void fz_refused(void) {
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("MT_FUZZ_VERBOSE") != NULL;
    if (verbose) fprintf(stderr, "fuzz: refused: %s\n", mt_error_message());
}

void fz_fail(const char *file, int line, const char *what) {
    fprintf(stderr, "fuzz: %s:%d: invariant failed: %s (last error: %s)\n", file, line, what,
            mt_error_message());
    abort();
}

/* What every handle must satisfy, whichever files it came from (also used by the index target). */
void fz_check_safetensors(const mt_safetensors *st, size_t total_bytes) {
    int n = mt_safetensors_count(st);
    size_t sum = 0;
    for (int i = 0; i < n; i++) {
        const mt_st_tensor *t = mt_safetensors_at(st, i);
        FZ_ASSERT(t->name && t->path && t->ndim >= 0 && t->ndim <= MT_ST_MAX_DIMS);
        FZ_ASSERT(mt_safetensors_find(st, t->name) == t);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
        FZ_ASSERT(numel == t->numel);
        FZ_ASSERT(t->nbytes == (size_t)t->numel * mt_dtype_size(t->dtype));
        sum += t->nbytes;
        FZ_ASSERT(sum <= total_bytes); /* tensors do not overlap and lie in the data sections */
        if (t->dtype == MT_F32 || t->dtype == MT_BF16 || t->dtype == MT_F16) {
            float *f = malloc(sizeof(float) * (size_t)(t->numel ? t->numel : 1));
            FZ_ASSERT(mt_st_tensor_to_f32(t, f) == MT_OK);
            volatile float sink = 0;
            for (int64_t k = 0; k < t->numel; k++) sink += f[k];
            (void)sink;
            free(f);
        } else {
            FZ_ASSERT(mt_st_tensor_to_f32(t, NULL) == MT_ERR);
        }
    }
    FZ_ASSERT(mt_safetensors_find(st, "") == NULL || mt_safetensors_find(st, "")->name[0] == 0);
    (void)mt_safetensors_metadata(st, "format");
    FZ_ASSERT(mt_safetensors_source(st) != NULL);
}


/* ---- the checkpoint target's state ---- */

static int fz_parts(fz_state *fs, const mt_param *p, mt_optim_tensor *x) {
    mt_optim_arenas a = mt_optim_state_arenas(fs->s);
    return mt_optim_arenas_parts(&a, (size_t)p->offset, (size_t)p->numel, x);
}

static int fz_get_weights(void *ctx, const mt_param *p, float *dst) {
    fz_state *fs = ctx;
    mt_optim_state_get_weights(fs->s, (size_t)p->offset, dst, (size_t)p->numel);
    return MT_OK;
}

static int fz_set_weights(void *ctx, const mt_param *p, const float *src) {
    fz_state *fs = ctx;
    mt_optim_state_set_weights(fs->s, (size_t)p->offset, src, (size_t)p->numel);
    fs->n_sets++;
    return MT_OK;
}

static int fz_get_parts(void *ctx, const mt_param *p, const mt_optim_tensor *parts) {
    mt_optim_tensor x[MT_OPTIM_MAX_TENSORS];
    int n = fz_parts(ctx, p, x);
    for (int k = 0; k < n; k++) memcpy(parts[k].data, x[k].data, x[k].bytes);
    return n < 0 ? MT_ERR : MT_OK;
}

static int fz_set_parts(void *ctx, const mt_param *p, const mt_optim_tensor *parts) {
    fz_state *fs = ctx;
    mt_optim_tensor x[MT_OPTIM_MAX_TENSORS];
    int n = fz_parts(fs, p, x);
    for (int k = 0; k < n; k++) memcpy(x[k].data, parts[k].data, x[k].bytes);
    fs->n_sets++;
    return n < 0 ? MT_ERR : MT_OK;
}

static void fz_set_sr_seed(void *ctx, uint64_t seed) {
    fz_state *fs = ctx;
    fs->io.sr_seed = seed;
    fs->n_sets++;
}

fz_state *fz_state_create(mt_state_format f, const mt_param_table *t) {
    fz_state *fs = calloc(1, sizeof *fs);
    fs->s = mt_optim_state_create(f, (size_t)t->total, 0, NULL);
    fs->io = (mt_state_io){.format = f, .ctx = fs, .get_weights = fz_get_weights,
                           .set_weights = fz_set_weights, .get_parts = fz_get_parts,
                           .set_parts = fz_set_parts, .set_sr_seed = fz_set_sr_seed};
    return fs;
}

void fz_state_free(fz_state *fs) {
    if (!fs) return;
    mt_optim_state_free(fs->s);
    free(fs);
}
