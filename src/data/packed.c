/* Packed rows: open + validation, then row and batch reads that cannot fail (see packed.h). */
#include "data/packed.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "data/map_guard.h"

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const unsigned char *p) { return get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

static inline uint32_t id_at(const unsigned char *ids, int id_size, int i) {
    const unsigned char *p = ids + (size_t)i * id_size;
    return id_size == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : get_u32(p);
}

int mt_packed_is_packed(const char *path) {
    char magic[8];
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int yes = fread(magic, 1, 8, f) == 8 && memcmp(magic, MT_PACKED_MAGIC, 8) == 0;
    fclose(f);
    return yes;
}

/* The header's fields against each other, the caller's T and vocab, and the file size. */
static int check_header(mt_packed_file *f, const unsigned char *h, int64_t size, int T, int model_vocab) {
    const char *p = f->path;
    uint32_t version = get_u32(h + 8), t = get_u32(h + 12), vocab = get_u32(h + 24), id_size = get_u32(h + 28);
    uint64_t rows = get_u64(h + 16);
    if (version != MT_PACKED_VERSION)
        return mt_error_set("%s: header field version is %u; this megatrain reads version %d (repack the "
                            "data with this megatrain)", p, version, MT_PACKED_VERSION);
    if (t < 1 || t > (1u << 24)) return mt_error_set("%s: header field T is %u, not a sequence length", p, t);
    if (T > 0 && (int)t != T)
        return mt_error_set("%s: header field T is %u: the rows were packed for --seq %u, not --seq %d "
                            "(give --seq %u, or repack)", p, t, t, T, t);
    if (id_size != 2 && id_size != 4)
        return mt_error_set("%s: header field id_size is %u; must be 2 (uint16) or 4 (uint32)", p, id_size);
    if (vocab < 1 || vocab > INT32_MAX || (id_size == 2 && vocab > 65536)) /* ids are int32 when read */
        return mt_error_set("%s: header field vocab is %u, impossible for %u-byte ids", p, vocab, id_size);
    if (model_vocab > 0 && vocab > (uint32_t)model_vocab)
        return mt_error_set("%s: header field vocab is %u, more than the model's vocabulary (vocab_size) %d "
                            "(packed with another tokenizer?)", p, vocab, model_vocab);
    if (rows < 1) return mt_error_set("%s: header field rows is 0: no data", p);
    for (int i = 48; i < MT_PACKED_HEADER; i++)
        if (h[i]) return mt_error_set("%s: header field reserved (bytes 48-63) is not zero", p);
    f->T = (int)t, f->id_size = (int)id_size, f->vocab = (int)vocab;
    f->row_bytes = (size_t)(t + 1) * id_size + t;
    uint64_t body = (uint64_t)size - MT_PACKED_HEADER; /* by division: a huge rows cannot overflow */
    if (body % f->row_bytes != 0 || body / f->row_bytes != rows)
        return mt_error_set("%s: size %lld bytes, but header fields rows %llu and T %u need %llu + %llu x %zu "
                            "(truncated or damaged file)", p, (long long)size, (unsigned long long)rows, t,
                            (unsigned long long)MT_PACKED_HEADER, (unsigned long long)rows, f->row_bytes);
    f->rows = (int64_t)rows;
    f->documents = (int64_t)get_u64(h + 32);
    f->trained = (int64_t)get_u64(h + 40);
    return MT_OK;
}

/* First bad thing in one row (an error message) or MT_OK; *trained += its LOSS flags. */
static int check_row(const mt_packed_file *f, int64_t r, int64_t *trained) {
    const unsigned char *ids = f->data + MT_PACKED_HEADER + (size_t)r * f->row_bytes;
    const unsigned char *fl = ids + (size_t)(f->T + 1) * f->id_size;
    for (int t = 0; t <= f->T; t++) {
        uint32_t id = id_at(ids, f->id_size, t);
        if (id >= (uint32_t)f->vocab)
            return mt_error_set("%s: row %lld: token id %u at position %d is >= the header's vocab %d",
                                f->path, (long long)r, id, t, f->vocab);
    }
    if (!(fl[0] & MT_PACKED_DOC))
        return mt_error_set("%s: row %lld: flags[0] lacks DOC (every row starts a document)", f->path, (long long)r);
    int64_t n = 0;
    for (int t = 0; t < f->T; t++) {
        if (fl[t] & ~(MT_PACKED_LOSS | MT_PACKED_DOC))
            return mt_error_set("%s: row %lld: flags[%d] = 0x%02x has unknown bits", f->path, (long long)r, t, fl[t]);
        if (!(fl[t] & MT_PACKED_LOSS)) continue;
        if (t + 1 < f->T && (fl[t + 1] & MT_PACKED_DOC))
            return mt_error_set("%s: row %lld: flags[%d] has LOSS but its target starts another document",
                                f->path, (long long)r, t);
        n++;
    }
    *trained += n;
    return MT_OK;
}

/* Every row, threaded; the error reported is the first bad row's. */
static int check_rows(mt_packed_file *f) {
    int64_t trained = 0, first_bad = f->rows;
#pragma omp parallel for schedule(dynamic, 256) reduction(+ : trained) reduction(min : first_bad)
    for (int64_t r = 0; r < f->rows; r++)
        if (r < first_bad && check_row(f, r, &trained) != MT_OK) first_bad = r;
    if (first_bad < f->rows) {
        int64_t ignore = 0;
        return check_row(f, first_bad, &ignore); /* sets this thread's message */
    }
    if (trained != f->trained)
        return mt_error_set("%s: header field trained is %lld but the rows hold %lld LOSS flags (damaged file)",
                            f->path, (long long)f->trained, (long long)trained);
    return MT_OK;
}

int mt_packed_open(mt_packed_file *f, const char *path, int T, int model_vocab) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mt_error_set("%s: cannot open packed data: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return mt_error_set("%s: not a regular file (expected packed data)", path);
    }
    int64_t size = (int64_t)sb.st_size;
    if (size < MT_PACKED_HEADER) {
        close(fd);
        return mt_error_set("%s: %lld bytes, shorter than the %d-byte header of packed data", path,
                            (long long)size, MT_PACKED_HEADER);
    }
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    if (m == MAP_FAILED) {
        close(fd);
        return mt_error_set("%s: cannot mmap packed data: %s", path, strerror(e));
    }
    mt_map_guard_register(m, (size_t)size, fd, path); /* keeps fd, to notice a truncation */
    f->data = m;
    f->nbytes = (size_t)size;
    f->path = mt_strdup(path);
    int rc = memcmp(m, MT_PACKED_MAGIC, 8) == 0
                 ? MT_OK
                 : mt_error_set("%s: header field magic is not \"%s\" (not packed data)", path, MT_PACKED_MAGIC);
    if (rc == MT_OK) rc = check_header(f, m, size, T, model_vocab);
    if (rc == MT_OK) rc = check_rows(f);
    if (rc != MT_OK) mt_packed_close(f);
    return rc;
}

void mt_packed_close(mt_packed_file *f) {
    if (f->data) mt_map_guard_unregister(f->data), munmap((void *)f->data, f->nbytes);
    free(f->path);
    memset(f, 0, sizeof *f);
}

void mt_packed_row(const mt_packed_file *f, int64_t row, int32_t *in, int32_t *tg, int32_t *ds) {
    MT_CHECK(f->data && row >= 0 && row < f->rows, "row %lld of %lld", (long long)row, (long long)f->rows);
    const unsigned char *ids = f->data + MT_PACKED_HEADER + (size_t)row * f->row_bytes;
    const unsigned char *fl = ids + (size_t)(f->T + 1) * f->id_size;
    int32_t start = 0;
    for (int t = 0; t < f->T; t++) {
        if (fl[t] & MT_PACKED_DOC) start = t;
        in[t] = (int32_t)id_at(ids, f->id_size, t);
        tg[t] = (fl[t] & MT_PACKED_LOSS) ? (int32_t)id_at(ids, f->id_size, t + 1) : -1;
        ds[t] = start;
    }
}

void mt_packed_batch(const mt_packed_file *f, const mt_batch_order *o, int64_t step, int B, int32_t *in,
                     int32_t *tg, int32_t *ds) {
    MT_CHECK(step >= 0 && B > 0, "step %lld B %d", (long long)step, B);
    for (int r = 0; r < B; r++) {
        int64_t g = step * (int64_t)B + r, row = g % f->rows;
        if (o->shuffle) row = mt_tokens_perm(o->seed, g / f->rows, f->rows, row);
        size_t off = (size_t)r * f->T;
        mt_packed_row(f, row, in + off, tg + off, ds + off);
    }
}

void mt_packed_eval_batch(const mt_packed_file *f, int64_t first_row, int B, int32_t *in, int32_t *tg,
                          int32_t *ds) {
    MT_CHECK(first_row >= 0 && B > 0, "first_row %lld B %d", (long long)first_row, B);
    for (int r = 0; r < B; r++) {
        size_t off = (size_t)r * f->T;
        if (first_row + r < f->rows) {
            mt_packed_row(f, first_row + r, in + off, tg + off, ds + off);
            continue;
        }
        for (int t = 0; t < f->T; t++) in[off + t] = 0, tg[off + t] = -1, ds[off + t] = 0;
    }
}
