/* A quantized frozen base on disk (engine/quant_base_cache.h). */
#include "engine/quant_base_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/error.h"
#include "io/atomic_file.h"

#define CACHE_MAGIC "MTQBASE1"
/* Bump when quantization or the blob layout changes: every older file then misses. */
#define CACHE_VERSION 1u
#define CACHE_ALIGN 4096

typedef struct {
    char magic[8];
    uint32_t version, format, first, L;
    uint64_t key, n_layers;
} cache_header;

typedef struct {
    uint64_t bytes, xxh3;
} cache_entry;

static uint64_t align_up(uint64_t x) { return (x + CACHE_ALIGN - 1) / CACHE_ALIGN * CACHE_ALIGN; }

/* ---- the key ---- */

static int weight_file(const char *name) {
    size_t n = strlen(name);
    if (strcmp(name, "config.json") == 0) return 1;
    if (n > 12 && strcmp(name + n - 12, ".safetensors") == 0) return 1;
    return n > 23 && strcmp(name + n - 23, ".safetensors.index.json") == 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The model directory's weight files (name, size, mtime) into the hash, in name order. */
static int hash_model_files(XXH3_state_t *h, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return mt_error_set("%s: cannot list the model directory: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!weight_file(e->d_name)) continue;
        if (n == cap) names = realloc(names, (cap = cap ? 2 * cap : 16) * sizeof *names);
        MT_CHECK(names, "out of memory listing %s", dir);
        names[n++] = mt_strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    int rc = MT_OK;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(dir) + strlen(names[i]) + 2;
        char *path = mt_malloc(len);
        struct stat sb;
        snprintf(path, len, "%s/%s", dir, names[i]);
        if (rc == MT_OK && stat(path, &sb) != 0) rc = mt_error_set("%s: %s", path, strerror(errno));
        free(path);
        if (rc == MT_OK) {
            int64_t meta[3] = {(int64_t)sb.st_size, (int64_t)sb.st_mtim.tv_sec, (int64_t)sb.st_mtim.tv_nsec};
            XXH3_64bits_update(h, names[i], strlen(names[i]) + 1);
            XXH3_64bits_update(h, meta, sizeof meta);
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int mt_quant_base_cache_key(const mt_param_table *t, mt_base_format f, int first, const char *model_dir,
                            const char *cache_dir, uint64_t *key, char **path) {
    char real[PATH_MAX];
    if (!realpath(model_dir, real)) return mt_error_set("%s: %s", model_dir, strerror(errno));
    XXH3_state_t *h = XXH3_createState();
    MT_CHECK(h && XXH3_64bits_reset(h) == XXH_OK, "XXH3 state (out of memory?)");
    uint32_t head[4] = {CACHE_VERSION, (uint32_t)f, (uint32_t)first, (uint32_t)t->cfg.L};
    XXH3_64bits_update(h, head, sizeof head);
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        XXH3_64bits_update(h, p->name, strlen(p->name) + 1);
        XXH3_64bits_update(h, &p->numel, sizeof p->numel);
    }
    int rc = hash_model_files(h, real);
    *key = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    MT_TRY(rc);
    /* one file per model directory, format and layer range */
    uint32_t where = (uint32_t)XXH3_64bits_withSeed(real, strlen(real), (uint64_t)first);
    const char *base = strrchr(real, '/');
    base = base && base[1] ? base + 1 : "model";
    size_t n = strlen(cache_dir) + strlen(base) + 32;
    *path = mt_malloc(n);
    snprintf(*path, n, "%s/%s.%s.%08x.mtq", cache_dir, base, mt_base_format_name(f), where);
    return MT_OK;
}

/* ---- reading ---- */

static int read_at(int fd, void *buf, size_t n, uint64_t off) {
    for (size_t done = 0; done < n;) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        done += (size_t)r;
    }
    return 0;
}

int mt_quant_base_cache_load(mt_quant_base *q, const char *path, uint64_t key) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return 0;
    if (fd < 0) return mt_error_set("%s: %s", path, strerror(errno)), -1;
    int first = mt_quant_base_first(q), n = mt_quant_base_n_layers(q);
    cache_header h;
    cache_entry *ent = mt_malloc((size_t)(n ? n : 1) * sizeof *ent);
    size_t largest = mt_quant_base_largest_blob(q);
    void *buf = mt_aligned_alloc(largest ? largest : 1);
    int result = -1;
    if (read_at(fd, &h, sizeof h, 0) != 0 || memcmp(h.magic, CACHE_MAGIC, 8) != 0) {
        mt_error_set("%s: not a megatrain base cache", path);
        goto done;
    }
    if (h.version != CACHE_VERSION || h.key != key || h.format != (uint32_t)mt_quant_base_format(q) ||
        h.first != (uint32_t)first || h.L != (uint32_t)(first + n) || h.n_layers != (uint64_t)n) {
        mt_error_set("%s: made from another model, format or megatrain version", path);
        goto done;
    }
    if (read_at(fd, ent, (size_t)n * sizeof *ent, sizeof h) != 0) {
        mt_error_set("%s: truncated header", path);
        goto done;
    }
    for (int i = 0; i < n; i++)
        if (ent[i].bytes != mt_quant_base_blob_bytes(q, first + i)) {
            mt_error_set("%s: layer %d's blob has another size", path, first + i);
            goto done;
        }
    uint64_t off = align_up(sizeof h + (uint64_t)n * sizeof *ent);
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)ent[i].bytes;
        if (read_at(fd, buf, bytes, off) != 0) {
            mt_error_set("%s: truncated at layer %d", path, first + i);
            goto done;
        }
        if (XXH3_64bits(buf, bytes) != ent[i].xxh3) {
            mt_error_set("%s: layer %d's blob is damaged (checksum)", path, first + i);
            goto done;
        }
        mt_quant_base_blob_store(q, first + i, buf);
        off += align_up(bytes);
    }
    result = 1;
done:
    close(fd);
    free(ent);
    free(buf);
    return result;
}

/* ---- writing ---- */

static int make_dirs(const char *dir) {
    char *p = mt_strdup(dir);
    int rc = MT_OK;
    for (char *s = p + 1; rc == MT_OK; s++) {
        if (*s != '/' && *s != '\0') continue;
        char c = *s;
        *s = '\0';
        struct stat sb;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) rc = mt_error_set("%s: cannot create: %s", p, strerror(errno));
        else if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) rc = mt_error_set("%s: not a directory", p);
        *s = c;
        if (c == '\0') break;
    }
    free(p);
    return rc;
}

static int write_zeros(mt_atomic_file *af, uint64_t n) {
    static const char zeros[CACHE_ALIGN];
    while (n > 0) {
        size_t k = n > CACHE_ALIGN ? CACHE_ALIGN : (size_t)n;
        MT_TRY(mt_atomic_write(af, zeros, k));
        n -= k;
    }
    return MT_OK;
}

int mt_quant_base_cache_save(const mt_quant_base *q, const char *path, uint64_t key) {
    char *dir = mt_strdup(path), *slash = strrchr(dir, '/');
    int rc = MT_OK;
    if (slash && slash != dir) *slash = '\0', rc = make_dirs(dir);
    free(dir);
    MT_TRY(rc);
    int first = mt_quant_base_first(q), n = mt_quant_base_n_layers(q);
    cache_header h = {.version = CACHE_VERSION, .format = (uint32_t)mt_quant_base_format(q),
                      .first = (uint32_t)first, .L = (uint32_t)(first + n), .key = key, .n_layers = (uint64_t)n};
    memcpy(h.magic, CACHE_MAGIC, 8);
    cache_entry *ent = mt_calloc((size_t)(n ? n : 1), sizeof *ent);
    size_t largest = mt_quant_base_largest_blob(q);
    void *buf = mt_aligned_alloc(largest ? largest : 1);
    uint64_t head = sizeof h + (uint64_t)n * sizeof *ent;
    mt_atomic_file af;
    rc = mt_atomic_open(&af, path);
    if (rc == MT_OK) {
        /* the entries' checksums are known once their blobs are written: the table goes in last */
        rc = mt_atomic_write(&af, &h, sizeof h);
        if (rc == MT_OK) rc = mt_atomic_write(&af, ent, (size_t)n * sizeof *ent);
        if (rc == MT_OK) rc = write_zeros(&af, align_up(head) - head);
        for (int i = 0; i < n && rc == MT_OK; i++) {
            ent[i].bytes = mt_quant_base_blob_bytes(q, first + i);
            mt_quant_base_blob_fetch(q, first + i, buf);
            ent[i].xxh3 = XXH3_64bits(buf, (size_t)ent[i].bytes);
            rc = mt_atomic_write(&af, buf, (size_t)ent[i].bytes);
            if (rc == MT_OK) rc = write_zeros(&af, align_up(ent[i].bytes) - ent[i].bytes);
        }
        if (rc == MT_OK) rc = mt_atomic_write_at(&af, (long)sizeof h, ent, (size_t)n * sizeof *ent);
        if (rc == MT_OK) rc = mt_atomic_commit(&af);
        else mt_atomic_abort(&af);
    }
    free(ent);
    free(buf);
    return rc;
}
