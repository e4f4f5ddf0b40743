/* Token files: mmap + validation at open, then batch reads that cannot fail (see tokens.h). */
#include "data/tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "data/map_guard.h"

int mt_tokens_elem_size_for_vocab(int vocab) { return vocab <= 65536 ? 2 : 4; }

/* Little-endian by bytes, so the file format does not depend on the host. */
static inline uint32_t raw_at(const mt_token_file *f, int64_t i) {
    const unsigned char *p = f->data + (size_t)i * (size_t)f->elem_size;
    if (f->elem_size == 2) return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* First position in [lo, hi) whose id is >= vocab, or hi. */
static int64_t scan_bad(const mt_token_file *f, int64_t lo, int64_t hi, uint32_t vocab) {
    for (int64_t i = lo; i < hi; i++)
        if (raw_at(f, i) >= vocab) return i;
    return hi;
}

/* Threaded over chunks; min-reduction so the error names the first bad position, not any. */
static int64_t first_bad_id(const mt_token_file *f) {
    const int64_t chunk = (int64_t)1 << 20, n = f->n_tokens;
    const int64_t nchunks = (n + chunk - 1) / chunk;
    int64_t first = n;
#pragma omp parallel for schedule(dynamic, 1) reduction(min : first) if (nchunks > 1)
    for (int64_t c = 0; c < nchunks; c++) {
        int64_t lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;
        int64_t b = scan_bad(f, lo, hi, (uint32_t)f->vocab);
        if (b < hi && b < first) first = b;
    }
    return first;
}

int mt_tokens_open(mt_token_file *f, const char *path, int elem_size, int vocab) {
    memset(f, 0, sizeof *f);
    if (elem_size != 2 && elem_size != 4)
        return mt_error_set("%s: token size %d bytes: must be 2 (uint16) or 4 (uint32)", path,
                            elem_size);
    if (vocab <= 0) return mt_error_set("%s: vocab %d: must be positive", path, vocab);

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mt_error_set("%s: cannot open token file: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return mt_error_set("%s: cannot stat token file: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return mt_error_set("%s: not a regular file (expected a token file)", path);
    }
    const char *type = elem_size == 2 ? "uint16" : "uint32";
    int64_t size = (int64_t)sb.st_size;
    if (size == 0) {
        close(fd);
        return mt_error_set("%s: empty token file", path);
    }
    if (size % elem_size != 0) {
        close(fd);
        return mt_error_set("%s: size %lld bytes is not a multiple of %d (%s tokens): %lld byte(s) "
                            "left over (truncated file, or a uint16/uint32 mix-up?)",
                            path, (long long)size, elem_size, type, (long long)(size % elem_size));
    }
    if (size / elem_size < 2) {
        close(fd);
        return mt_error_set("%s: %lld token(s): need at least 2 (an input and its target)", path,
                            (long long)(size / elem_size));
    }
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    if (m == MAP_FAILED) {
        close(fd);
        return mt_error_set("%s: cannot mmap token file: %s", path, strerror(e));
    }
    mt_map_guard_register(m, (size_t)size, fd, path); /* keeps fd, to notice a truncation */

    f->data = m;
    f->nbytes = (size_t)size;
    f->n_tokens = size / elem_size;
    f->elem_size = elem_size;
    f->vocab = vocab;
    int64_t bad = first_bad_id(f);
    if (bad < f->n_tokens) {
        uint32_t id = raw_at(f, bad);
        mt_map_guard_unregister(m);
        munmap(m, (size_t)size);
        memset(f, 0, sizeof *f);
        return mt_error_set("%s: token id %u at position %lld is >= vocab %d (%s tokens; wrong "
                            "vocabulary or token size?)",
                            path, id, (long long)bad, vocab, type);
    }
    f->path = mt_strdup(path);
    return MT_OK;
}

void mt_tokens_close(mt_token_file *f) {
    if (f->data) mt_map_guard_unregister(f->data), munmap((void *)f->data, f->nbytes);
    free(f->path);
    memset(f, 0, sizeof *f);
}

static inline int64_t wrap(int64_t i, int64_t n) {
    int64_t p = i % n;
    return p < 0 ? p + n : p;
}

int32_t mt_tokens_at(const mt_token_file *f, int64_t i) {
    return (int32_t)raw_at(f, wrap(i, f->n_tokens));
}

/* (a * b) mod n without overflow, for start = g*T of a row far into training. */
static int64_t mulmod(int64_t a, int64_t b, int64_t n) {
    return (int64_t)((unsigned __int128)(uint64_t)a * (uint64_t)b % (uint64_t)n);
}

/* One row of T+1 tokens from `start`, wrapping at the end of the file as often as needed. */
static void fill_row(const mt_token_file *f, int64_t start, int T, int32_t *in, int32_t *tg) {
    int64_t n = f->n_tokens, p = wrap(start, n);
    in[0] = (int32_t)raw_at(f, p);
    for (int j = 1; j <= T; j++) {
        if (++p == n) p = 0;
        int32_t v = (int32_t)raw_at(f, p);
        tg[j - 1] = v;
        if (j < T) in[j] = v;
    }
}

/* ---- the shuffle permutation: Feistel network + cycle walking ---- */

/* splitmix64's finalizer: a fast bijective 64-bit mixer. */
static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static inline uint64_t low_mask(int w) { return w >= 64 ? ~0ull : ((uint64_t)1 << w) - 1; }

#define MT_FEISTEL_ROUNDS 6

/* A permutation of [0, 2^bits). x = L|R with L the high wl bits and R the low wr bits; each round
 * maps (L, R) -> (R, L ^ F(R)), which is invertible for any widths, so odd bit counts need no
 * padding to an even domain (that would double the cycle walking). */
static uint64_t feistel(uint64_t x, int bits, const uint64_t *round_keys) {
    int wl = bits / 2, wr = bits - wl;
    for (int r = 0; r < MT_FEISTEL_ROUNDS; r++) {
        uint64_t L = x >> wr, R = x & low_mask(wr);
        uint64_t F = mix64(R ^ round_keys[r]) & low_mask(wl);
        x = (R << wl) | (L ^ F);
        int t = wl;
        wl = wr;
        wr = t;
    }
    return x;
}

int64_t mt_tokens_perm(uint64_t seed, int64_t epoch, int64_t W, int64_t i) {
    MT_CHECK(W >= 1 && i >= 0 && i < W, "perm slot %lld of %lld", (long long)i, (long long)W);
    if (W == 1) return 0;
    int bits = 1;
    while (bits < 63 && ((uint64_t)1 << bits) < (uint64_t)W) bits++;
    uint64_t key = mix64(mix64(seed) ^ (uint64_t)epoch * 0xD6E8FEB86659FD93ull);
    uint64_t rk[MT_FEISTEL_ROUNDS];
    for (int r = 0; r < MT_FEISTEL_ROUNDS; r++) rk[r] = mix64(key + (uint64_t)(r + 1));
    /* Cycle walking: i lies on a cycle of the permutation of [0, 2^bits); following it until it
     * re-enters [0, W) restricts the permutation to a bijection of [0, W). */
    uint64_t x = (uint64_t)i;
    do x = feistel(x, bits, rk);
    while (x >= (uint64_t)W);
    return (int64_t)x;
}

void mt_tokens_batch(const mt_token_file *f, const mt_batch_order *o, int64_t step, int B, int T,
                     int32_t *inputs, int32_t *targets) {
    MT_CHECK(f->data && step >= 0 && B > 0 && T > 0, "step %lld B %d T %d", (long long)step, B, T);
    const int64_t n = f->n_tokens;
    const int64_t W = n / T > 1 ? n / T : 1;
    for (int r = 0; r < B; r++) {
        int64_t g = step * (int64_t)B + r; /* global row index */
        int64_t start;
        if (!o->shuffle) {
            start = mulmod(g, T, n);
        } else {
            int64_t k = mt_tokens_perm(o->seed, g / W, W, g % W);
            start = k * (int64_t)T; /* < n since k < W <= n/T, or k == 0 */
        }
        fill_row(f, start, T, inputs + (size_t)r * T, targets + (size_t)r * T);
    }
}

void mt_tokens_window(const mt_token_file *f, int64_t k, int T, int32_t *inputs, int32_t *targets) {
    MT_CHECK(f->data && k >= 0 && T > 0, "window %lld T %d", (long long)k, T);
    fill_row(f, mulmod(k, T, f->n_tokens), T, inputs, targets);
}

int64_t mt_tokens_eval_rows(const mt_token_file *f, int T) {
    MT_CHECK(T > 0, "T %d", T);
    int64_t rows = (f->n_tokens - 1) / T;
    return rows > 0 ? rows : 1;
}

void mt_tokens_eval_batch(const mt_token_file *f, int64_t first_row, int B, int T, int32_t *inputs,
                          int32_t *targets) {
    MT_CHECK(f->data && first_row >= 0 && B > 0 && T > 0, "first_row %lld B %d T %d",
             (long long)first_row, B, T);
    const int64_t rows = mt_tokens_eval_rows(f, T);
    for (int r = 0; r < B; r++) {
        int32_t *in = inputs + (size_t)r * T, *tg = targets + (size_t)r * T;
        int64_t k = first_row + r;
        if (k < rows) {
            fill_row(f, k * (int64_t)T, T, in, tg);
        } else {
            for (int t = 0; t < T; t++) in[t] = 0, tg[t] = -1;
        }
    }
}
