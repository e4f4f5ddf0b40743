/* Token files and batch order (docs/DESIGN.md, "Data"): the no-shuffle order exactly as the
 * contract, the shuffled order (deterministic, seed-dependent, every window once per epoch,
 * resumable), eval rows, bad files, and byte-level text conversion.
 *
 * Most files hold ids equal to their position, so a token read back says where it came from. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "data/byte_text.h"
#include "data/tokens.h"
#include "util/testutil.h"

/* ids as little-endian uint16 or uint32, built by bytes so the test does not assume the host. */
static void write_tokens(const char *path, int elem, const uint32_t *ids, size_t n) {
    unsigned char *buf = malloc(n * elem + 1);
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < elem; b++) buf[i * elem + b] = (unsigned char)(ids[i] >> (8 * b));
    mt_test_write_bytes(path, buf, n * elem);
    free(buf);
}

/* A file of n tokens with id = offset + position. */
static void write_seq(const char *path, int elem, size_t n, uint32_t offset) {
    uint32_t *ids = malloc(n * sizeof *ids);
    for (size_t i = 0; i < n; i++) ids[i] = offset + (uint32_t)i;
    write_tokens(path, elem, ids, n);
    free(ids);
}

static void open_ok(mt_token_file *f, const char *path, int elem, int vocab) {
    int rc = mt_tokens_open(f, path, elem, vocab);
    if (rc != MT_OK) print_error("%s\n", mt_error_message());
    assert_int_equal(rc, MT_OK);
}

/* Row of T+1 tokens of a position-id file starting at `start`, wrapping modulo n. */
static void assert_row(const int32_t *in, const int32_t *tg, int64_t start, int T, int64_t n,
                       int32_t offset) {
    for (int t = 0; t < T; t++) {
        assert_int_equal(in[t], offset + (start + t) % n);
        assert_int_equal(tg[t], offset + (start + t + 1) % n);
    }
}

/* ---- no shuffle: the contract ---- */

static void test_sequential_order(void **state) {
    char p[512];
    const int64_t n = 50;
    const int B = 3, T = 4;
    write_seq(mt_test_dir_path(p, "seq.bin"), 2, n, 0);
    mt_token_file f;
    open_ok(&f, p, 2, 100);
    assert_int_equal(f.n_tokens, n);
    mt_batch_order o = {.shuffle = 0, .seed = 0};
    int32_t in[3 * 4], tg[3 * 4];

    /* Step 0 spelled out: row r starts at r*T; targets are inputs shifted by one. */
    mt_tokens_batch(&f, &o, 0, B, T, in, tg);
    const int32_t in0[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    const int32_t tg0[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    assert_memory_equal(in, in0, sizeof in0);
    assert_memory_equal(tg, tg0, sizeof tg0);

    /* Step 4: rows at 48, 52 = 2, 56 = 6 (mod 50); the first straddles the end of the file. */
    mt_tokens_batch(&f, &o, 4, B, T, in, tg);
    const int32_t in4[12] = {48, 49, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    const int32_t tg4[12] = {49, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    assert_memory_equal(in, in4, sizeof in4);
    assert_memory_equal(tg, tg4, sizeof tg4);

    /* Every step against the formula start = s*B*T + r*T (mod n), far past many wraps too. */
    const int64_t steps[] = {0, 1, 2, 3, 5, 8, 13, 99, 1000003, (int64_t)1 << 40};
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        int64_t s = steps[i];
        mt_tokens_batch(&f, &o, s, B, T, in, tg);
        for (int r = 0; r < B; r++) {
            int64_t start = (int64_t)(((unsigned __int128)s * B * T + (unsigned)(r * T)) % n);
            assert_row(in + r * T, tg + r * T, start, T, n, 0);
        }
    }
    assert_int_equal(mt_tokens_at(&f, 51), 1);
    assert_int_equal(mt_tokens_at(&f, -1), 49);
    mt_tokens_close(&f);
    mt_tokens_close(&f); /* closing twice is harmless */
}

/* A file shorter than one row wraps as many times as needed. */
static void test_short_file_wraps(void **state) {
    char p[512];
    write_seq(mt_test_dir_path(p, "short.bin"), 2, 3, 10);
    mt_token_file f;
    open_ok(&f, p, 2, 20);
    mt_batch_order o = {0};
    int32_t in[2 * 8], tg[2 * 8];
    mt_tokens_batch(&f, &o, 0, 2, 8, in, tg);
    const int32_t ein[16] = {10, 11, 12, 10, 11, 12, 10, 11, /* row 1 at 8 % 3 = 2 */ 12, 10, 11,
                             12, 10, 11, 12, 10};
    const int32_t etg[16] = {11, 12, 10, 11, 12, 10, 11, 12, 10, 11, 12, 10, 11, 12, 10, 11};
    assert_memory_equal(in, ein, sizeof ein);
    assert_memory_equal(tg, etg, sizeof etg);
    mt_tokens_close(&f);

    /* The smallest legal file: 2 tokens. */
    write_seq(mt_test_dir_path(p, "two.bin"), 2, 2, 0);
    open_ok(&f, p, 2, 2);
    mt_tokens_batch(&f, &o, 1, 1, 3, in, tg); /* starts at 3 % 2 = 1 */
    const int32_t in2[3] = {1, 0, 1}, tg2[3] = {0, 1, 0};
    assert_memory_equal(in, in2, sizeof in2);
    assert_memory_equal(tg, tg2, sizeof tg2);
    mt_tokens_close(&f);
}

static void test_uint16_uint32(void **state) {
    assert_int_equal(mt_tokens_elem_size_for_vocab(50257), 2);
    assert_int_equal(mt_tokens_elem_size_for_vocab(65536), 2);
    assert_int_equal(mt_tokens_elem_size_for_vocab(65537), 4);
    assert_int_equal(mt_tokens_elem_size_for_vocab(128256), 4);

    char p[512];
    const int64_t n = 40;
    const int B = 2, T = 5;
    mt_batch_order o = {0};
    int32_t in[10], tg[10];
    mt_token_file f;

    /* uint16 up to the top id 65535 */
    write_seq(mt_test_dir_path(p, "u16.bin"), 2, n, 65535 - (uint32_t)n + 1);
    open_ok(&f, p, 2, 65536);
    assert_int_equal(f.elem_size, 2);
    for (int64_t s = 0; s < 6; s++) {
        mt_tokens_batch(&f, &o, s, B, T, in, tg);
        for (int r = 0; r < B; r++)
            assert_row(in + r * T, tg + r * T, (s * B * T + r * T) % n, T, n, 65535 - n + 1);
    }
    mt_tokens_close(&f);

    /* uint32 with ids past 65535 (a 128k vocabulary) */
    write_seq(mt_test_dir_path(p, "u32.bin"), 4, n, 100000);
    open_ok(&f, p, 4, 128256);
    assert_int_equal(f.elem_size, 4);
    assert_int_equal(f.n_tokens, n);
    for (int64_t s = 0; s < 6; s++) {
        mt_tokens_batch(&f, &o, s, B, T, in, tg);
        for (int r = 0; r < B; r++)
            assert_row(in + r * T, tg + r * T, (s * B * T + r * T) % n, T, n, 100000);
    }
    mt_tokens_close(&f);
}

/* ---- shuffle ---- */

static void test_perm_is_bijection(void **state) {
    /* Every W up to 300 and some around powers of two, several seeds and epochs. */
    const int64_t extra[] = {511, 512, 513, 1000, 1023, 1024, 1025, 4097};
    char *seen = malloc(4097);
    for (int i = 0; i < 300 + 8; i++) {
        int64_t W = i < 300 ? i + 1 : extra[i - 300];
        for (uint64_t seed = 0; seed < 3; seed++)
            for (int64_t e = 0; e < 3; e++) {
                memset(seen, 0, (size_t)W);
                for (int64_t k = 0; k < W; k++) {
                    int64_t v = mt_tokens_perm(seed, e, W, k);
                    assert_true(v >= 0 && v < W);
                    assert_int_equal(seen[v], 0);
                    seen[v] = 1;
                }
            }
    }
    free(seen);
    /* It does shuffle: not the identity, and epochs differ. */
    int moved = 0, differ = 0;
    for (int64_t k = 0; k < 1000; k++) {
        moved += mt_tokens_perm(7, 0, 1000, k) != k;
        differ += mt_tokens_perm(7, 0, 1000, k) != mt_tokens_perm(7, 1, 1000, k);
    }
    print_message("perm W=1000: %d of 1000 moved, %d differ between epochs 0 and 1\n", moved,
                  differ);
    assert_true(moved > 900 && differ > 900);
}

/* Reads 3 epochs of rows through mt_tokens_batch and checks that each row is a whole window and
 * each epoch visits every window exactly once. */
static void check_epochs(int64_t W, int T, int64_t n, uint64_t seed) {
    char p[512];
    snprintf(p, sizeof p, "%s/shuf_%lld_%lld.bin", mt_test_dir, (long long)W, (long long)n);
    write_seq(p, 4, (size_t)n, 0);
    mt_token_file f;
    open_ok(&f, p, 4, (int)n);
    const int B = 5; /* not a divisor of W: epochs change in the middle of a step */
    const int64_t epochs = 3, rows = epochs * W, steps = (rows + B - 1) / B;
    mt_batch_order o = {.shuffle = 1, .seed = seed};
    int32_t *in = malloc(sizeof(int32_t) * B * T), *tg = malloc(sizeof(int32_t) * B * T);
    int64_t *order = malloc(sizeof(int64_t) * steps * B);
    for (int64_t s = 0; s < steps; s++) {
        mt_tokens_batch(&f, &o, s, B, T, in, tg);
        for (int r = 0; r < B; r++) {
            int64_t start = in[r * T];
            assert_int_equal(start % T, 0);
            assert_row(in + r * T, tg + r * T, start, T, n, 0);
            order[s * B + r] = start / T;
        }
    }
    char *seen = malloc((size_t)W);
    for (int64_t e = 0; e < epochs; e++) {
        memset(seen, 0, (size_t)W);
        for (int64_t g = e * W; g < (e + 1) * W; g++) {
            assert_true(order[g] >= 0 && order[g] < W);
            assert_int_equal(seen[order[g]], 0);
            seen[order[g]] = 1;
        }
    }
    if (W >= 7) { /* the order changes from epoch to epoch */
        int differ = 0;
        for (int64_t k = 0; k < W; k++) differ += order[k] != order[W + k];
        assert_true(differ > 0);
    }
    free(seen);
    free(order);
    free(in);
    free(tg);
    mt_tokens_close(&f);
}

static void test_shuffle_epochs(void **state) {
    check_epochs(1, 3, 4, 1);       /* one window, n not a multiple of T */
    check_epochs(1, 8, 3, 1);       /* file shorter than a row: W = max(1, 0) */
    check_epochs(7, 3, 7 * 3, 2);   /* the last window wraps for its final target */
    check_epochs(64, 4, 64 * 4 + 3, 3);
    check_epochs(1000, 2, 1000 * 2 + 1, 4);
}

static void read_steps(const mt_token_file *f, const mt_batch_order *o, const int64_t *steps,
                       int n, int B, int T, int32_t *in, int32_t *tg) {
    for (int i = 0; i < n; i++)
        mt_tokens_batch(f, o, steps[i], B, T, in + (size_t)i * B * T, tg + (size_t)i * B * T);
}

static void test_shuffle_seeds_and_resume(void **state) {
    char p[512];
    const int64_t n = 1000;
    const int B = 4, T = 8, S = 12; /* W = 125 */
    write_seq(mt_test_dir_path(p, "resume.bin"), 2, n, 0);
    mt_token_file f, g;
    open_ok(&f, p, 2, (int)n);
    open_ok(&g, p, 2, (int)n);
    const size_t sz = (size_t)S * B * T;
    int32_t *in_a = malloc(sz * 4), *tg_a = malloc(sz * 4), *in_b = malloc(sz * 4),
            *tg_b = malloc(sz * 4);
    int64_t fwd[12], rev[12], later[12];
    for (int i = 0; i < S; i++) fwd[i] = i, rev[i] = S - 1 - i, later[i] = 1000 + i;

    /* Deterministic: same seed, separate handles, same batches. */
    mt_batch_order o1 = {.shuffle = 1, .seed = 1234};
    read_steps(&f, &o1, fwd, S, B, T, in_a, tg_a);
    read_steps(&g, &o1, fwd, S, B, T, in_b, tg_b);
    assert_memory_equal(in_a, in_b, sz * 4);
    assert_memory_equal(tg_a, tg_b, sz * 4);

    /* Resumable: any step read alone, in any order, equals the one read in sequence. */
    read_steps(&g, &o1, rev, S, B, T, in_b, tg_b);
    for (int i = 0; i < S; i++) {
        assert_memory_equal(in_a + (size_t)i * B * T, in_b + (size_t)(S - 1 - i) * B * T, B * T * 4);
        assert_memory_equal(tg_a + (size_t)i * B * T, tg_b + (size_t)(S - 1 - i) * B * T, B * T * 4);
    }
    int64_t one = 7;
    read_steps(&g, &o1, &one, 1, B, T, in_b, tg_b);
    assert_memory_equal(in_a + 7 * B * T, in_b, B * T * 4);

    /* Different seeds: different batches. */
    mt_batch_order o2 = {.shuffle = 1, .seed = 1235};
    read_steps(&f, &o2, fwd, S, B, T, in_b, tg_b);
    assert_true(memcmp(in_a, in_b, sz * 4) != 0);
    /* ... and not the sequential order either. */
    mt_batch_order o0 = {.shuffle = 0};
    read_steps(&f, &o0, fwd, S, B, T, in_b, tg_b);
    assert_true(memcmp(in_a, in_b, sz * 4) != 0);
    /* Far-away steps (later epochs) still read whole windows. */
    read_steps(&f, &o1, later, S, B, T, in_b, tg_b);
    for (size_t r = 0; r < (size_t)S * B; r++) {
        assert_int_equal(in_b[r * T] % T, 0);
        assert_row(in_b + r * T, tg_b + r * T, in_b[r * T], T, n, 0);
    }
    free(in_a);
    free(tg_a);
    free(in_b);
    free(tg_b);
    mt_tokens_close(&f);
    mt_tokens_close(&g);
}

/* ---- eval order ---- */

static void test_eval_rows(void **state) {
    char p[512];
    const int64_t n = 23;
    const int T = 4, B = 3;
    write_seq(mt_test_dir_path(p, "eval.bin"), 2, n, 0);
    mt_token_file f;
    open_ok(&f, p, 2, 100);
    int64_t rows = mt_tokens_eval_rows(&f, T);
    assert_int_equal(rows, 5); /* (23 - 1) / 4 */
    int32_t in[12], tg[12];
    int counted[23] = {0}, n_targets = 0;
    for (int64_t first = 0; first < rows; first += B) {
        mt_tokens_eval_batch(&f, first, B, T, in, tg);
        for (int r = 0; r < B; r++) {
            int64_t k = first + r;
            if (k < rows) {
                assert_row(in + r * T, tg + r * T, k * T, T, n, 0);
            } else { /* padding of the last partial batch: ignored */
                for (int t = 0; t < T; t++) {
                    assert_int_equal(in[r * T + t], 0);
                    assert_int_equal(tg[r * T + t], -1);
                }
            }
            for (int t = 0; t < T; t++)
                if (tg[r * T + t] >= 0) counted[tg[r * T + t]]++, n_targets++;
        }
    }
    assert_int_equal(n_targets, rows * T);
    for (int i = 0; i < 23; i++) assert_true(counted[i] <= 1); /* nothing counted twice */
    /* The last batch (rows 3, 4 and one padding row) spelled out. */
    mt_tokens_eval_batch(&f, 3, B, T, in, tg);
    const int32_t ein[12] = {12, 13, 14, 15, 16, 17, 18, 19, 0, 0, 0, 0};
    const int32_t etg[12] = {13, 14, 15, 16, 17, 18, 19, 20, -1, -1, -1, -1};
    assert_memory_equal(in, ein, sizeof ein);
    assert_memory_equal(tg, etg, sizeof etg);
    /* Exactly divisible: n - 1 = 4 * T gives 4 rows, the last target is the last token. */
    mt_tokens_close(&f);
    write_seq(mt_test_dir_path(p, "eval17.bin"), 2, 17, 0);
    open_ok(&f, p, 2, 100);
    assert_int_equal(mt_tokens_eval_rows(&f, T), 4);
    mt_tokens_eval_batch(&f, 3, 1, T, in, tg);
    assert_int_equal(tg[T - 1], 16);
    mt_tokens_close(&f);

    /* Shorter than one row: one row, wrapping. */
    write_seq(mt_test_dir_path(p, "eval3.bin"), 2, 3, 0);
    open_ok(&f, p, 2, 100);
    assert_int_equal(mt_tokens_eval_rows(&f, 8), 1);
    int32_t in8[16], tg8[16];
    mt_tokens_eval_batch(&f, 0, 2, 8, in8, tg8);
    assert_row(in8, tg8, 0, 8, 3, 0);
    for (int t = 0; t < 8; t++) assert_int_equal(tg8[8 + t], -1);
    mt_tokens_close(&f);
}

/* ---- bad input: MT_ERR, one line naming the file, nothing left open ---- */

static void expect_open_error(const char *path, int elem, int vocab, const char *const *needles) {
    mt_token_file f;
    mt_error_clear();
    assert_int_equal(mt_tokens_open(&f, path, elem, vocab), MT_ERR);
    const char *msg = mt_error_message();
    print_message("  %s\n", msg);
    assert_non_null(strstr(msg, path));
    assert_null(strchr(msg, '\n'));
    for (int i = 0; needles[i]; i++) {
        if (!strstr(msg, needles[i])) print_error("missing '%s' in: %s\n", needles[i], msg);
        assert_non_null(strstr(msg, needles[i]));
    }
    assert_null(f.data);
    mt_tokens_close(&f); /* harmless after a failed open */
}

static void test_bad_files(void **state) {
    char p[512];
    expect_open_error(mt_test_dir_path(p, "no_such.bin"), 2, 100,
                      (const char *[]){"No such file", NULL});
    expect_open_error(mt_test_dir, 2, 100, (const char *[]){"not a regular file", NULL});

    mt_test_write_bytes(mt_test_dir_path(p, "empty.bin"), "", 0);
    expect_open_error(p, 2, 100, (const char *[]){"empty", NULL});

    mt_test_write_bytes(mt_test_dir_path(p, "odd.bin"), "\1\0\2\0\3", 5);
    expect_open_error(p, 2, 100, (const char *[]){"size 5 bytes", "multiple of 2", "1 byte", NULL});
    mt_test_write_bytes(mt_test_dir_path(p, "odd32.bin"), "\1\0\0\0\2\0", 6);
    expect_open_error(p, 4, 100, (const char *[]){"size 6 bytes", "multiple of 4", "2 byte", NULL});

    const uint32_t one[1] = {5};
    write_tokens(mt_test_dir_path(p, "one.bin"), 2, one, 1);
    expect_open_error(p, 2, 100, (const char *[]){"1 token", "at least 2", NULL});
    write_tokens(mt_test_dir_path(p, "one32.bin"), 4, one, 1);
    expect_open_error(p, 4, 100, (const char *[]){"1 token", NULL});

    const uint32_t bad[6] = {1, 2, 3, 99, 100, 7};
    write_tokens(mt_test_dir_path(p, "badid.bin"), 2, bad, 6);
    expect_open_error(p, 2, 100,
                      (const char *[]){"id 100", "position 4", "vocab 100", NULL});
    /* id == vocab is the first out of range; 0 is fine */
    const uint32_t bad0[2] = {100, 0};
    write_tokens(mt_test_dir_path(p, "badid0.bin"), 2, bad0, 2);
    expect_open_error(p, 2, 100, (const char *[]){"position 0", NULL});

    /* Several chunks of the threaded scan, several bad ids: the first one is named. */
    const size_t big = 3u << 20;
    uint32_t *ids = calloc(big, sizeof *ids);
    ids[2900005] = 70000;
    ids[1500001] = 50000;
    ids[2100000] = 60000;
    write_tokens(mt_test_dir_path(p, "big32.bin"), 4, ids, big);
    expect_open_error(p, 4, 50000,
                      (const char *[]){"id 50000", "position 1500001", "vocab 50000", NULL});
    free(ids);

    /* Bad arguments are errors too, not crashes. */
    write_seq(mt_test_dir_path(p, "fine.bin"), 2, 10, 0);
    expect_open_error(p, 3, 100, (const char *[]){"must be 2", NULL});
    expect_open_error(p, 2, 0, (const char *[]){"vocab 0", NULL});
    mt_token_file f;
    open_ok(&f, p, 2, 10); /* ids 0..9 < 10 */
    mt_tokens_close(&f);
}

/* ---- byte-level text ---- */

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* All tokens of a converted file. */
static int32_t *read_all(const char *path, int64_t *n) {
    mt_token_file f;
    open_ok(&f, path, 2, 257);
    *n = f.n_tokens;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)*n);
    for (int64_t i = 0; i < *n; i++) ids[i] = mt_tokens_at(&f, i);
    mt_tokens_close(&f);
    return ids;
}

/* ids equal to `text` with '|' standing for the eos id 256. */
static void assert_tokens_text(const int32_t *ids, int64_t n, const char *text) {
    assert_int_equal(n, (int64_t)strlen(text));
    for (int64_t i = 0; i < n; i++) {
        int32_t want = text[i] == '|' ? 256 : (unsigned char)text[i];
        if (ids[i] != want) print_error("token %lld: got %d want %d\n", (long long)i, ids[i], want);
        assert_int_equal(ids[i], want);
    }
}

static void test_byte_text(void **state) {
    char a[512], b[512], c[512], out[512];
    /* Fortune-style: "%" lines separate; nothing between two separators is no document, but a
     * whitespace-only one is kept (as Hugging Face's tokenizer(text) keeps it: it used to be
     * dropped); CRLF "%" lines count; a "%" inside a line or "%%" does not separate. */
    const char *fa = "%\none\n%\n%\n  \n\n%\ntwo 100%\nlines\n%%\n%\r\nthree\r\n%\n";
    mt_test_write_bytes(mt_test_dir_path(a, "a.txt"), fa, strlen(fa));
    mt_test_write_bytes(mt_test_dir_path(b, "b.txt"), "four", 4); /* no trailing newline, no separator */
    mt_test_write_bytes(mt_test_dir_path(c, "c.txt"), "", 0);     /* an empty file adds nothing */
    const char *paths[3] = {a, b, c};
    mt_text_stats st;
    int rc = mt_byte_text_to_tokens(paths, 3, mt_test_dir_path(out, "text.bin"), "%", 256, &st);
    if (rc != MT_OK) print_error("%s\n", mt_error_message());
    assert_int_equal(rc, MT_OK);
    const char *want = "one\n|  \n\n|two 100%\nlines\n%%\n|three\r\n|four|";
    assert_int_equal(st.tokens, (int64_t)strlen(want));
    assert_int_equal(st.documents, 5);
    assert_int_equal(st.empty_docs, 0);
    int64_t got_n;
    int32_t *ids = read_all(out, &got_n);
    assert_tokens_text(ids, got_n, want);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    assert_false(file_exists(tmp));

    /* Round trip: decode shows eos as a newline. */
    char text[256];
    int len = mt_byte_text_decode(ids, (int)got_n, text, sizeof text);
    const char *back = "one\n\n  \n\n\ntwo 100%\nlines\n%%\n\nthree\r\n\nfour\n";
    assert_int_equal(len, (int)strlen(back));
    assert_string_equal(text, back);
    free(ids);

    /* No separator: each file is one document, "%" lines are text; a whitespace-only file is a
     * document, an empty one is skipped and counted. */
    char ws[512];
    mt_test_write_bytes(mt_test_dir_path(ws, "ws.txt"), " \n\t\n", 4);
    const char *paths2[4] = {a, b, ws, c};
    rc = mt_byte_text_to_tokens(paths2, 4, out, NULL, 256, &st);
    assert_int_equal(rc, MT_OK);
    ids = read_all(out, &got_n);
    char want2[256];
    snprintf(want2, sizeof want2, "%s|four| \n\t\n|", fa);
    assert_tokens_text(ids, got_n, want2);
    assert_int_equal(st.documents, 3);
    assert_int_equal(st.empty_docs, 1);
    assert_string_equal(st.empty_path, c);
    free(ids);

    /* All bytes 0..255 survive. */
    unsigned char all[256];
    for (int i = 0; i < 256; i++) all[i] = (unsigned char)(255 - i);
    mt_test_write_bytes(mt_test_dir_path(c, "bin.txt"), all, 256);
    const char *one[1] = {c};
    assert_int_equal(mt_byte_text_to_tokens(one, 1, out, NULL, 300, &st), MT_OK);
    assert_int_equal(st.tokens, 257);
    mt_token_file f;
    open_ok(&f, out, 2, 301);
    for (int i = 0; i < 256; i++) assert_int_equal(mt_tokens_at(&f, i), 255 - i);
    assert_int_equal(mt_tokens_at(&f, 256), 300);
    mt_tokens_close(&f);
}

/* A document longer than a batch goes in pieces (bounded memory) and is still one document: the
 * same bytes, one eos, counted once (invalid UTF-8 in two of its pieces too). */
static void test_byte_text_long_document(void **state) {
    char in[512], out[512];
    size_t line_len = 100, n_lines = 5 * (size_t)MT_TEXT_BATCH_BYTES / 2 / line_len;
    size_t long_len = n_lines * line_len;
    const char *tail = "%\nshort\n";
    char *text = malloc(long_len + strlen(tail));
    for (size_t i = 0; i < n_lines; i++) {
        char *l = text + i * line_len;
        memset(l, 'a' + (int)(i % 26), line_len - 1);
        l[line_len - 1] = '\n';
    }
    text[1] = (char)0xff;                          /* invalid UTF-8 in the first piece ... */
    text[long_len - 2] = (char)0xfe;               /* ... and in the last */
    memcpy(text + long_len, tail, strlen(tail));
    mt_test_write_bytes(mt_test_dir_path(in, "long.txt"), text, long_len + strlen(tail));
    const char *paths[1] = {in};
    mt_text_stats st;
    assert_int_equal(mt_byte_text_to_tokens(paths, 1, mt_test_dir_path(out, "long.bin"), "%", 256, &st), MT_OK);
    assert_int_equal(st.documents, 2);
    assert_int_equal(st.invalid_utf8, 1);
    assert_int_equal(st.tokens, (int64_t)long_len + 1 + 6 + 1);
    int64_t n;
    int32_t *ids = read_all(out, &n);
    assert_int_equal(n, st.tokens);
    int64_t bad = -1;
    for (size_t i = 0; i < long_len && bad < 0; i++)
        if (ids[i] != (unsigned char)text[i]) bad = (int64_t)i;
    assert_int_equal(bad, -1);
    assert_int_equal(ids[long_len], 256);
    assert_tokens_text(ids + long_len + 1, 7, "short\n|");
    free(ids);
    free(text);
}

static void test_byte_text_decode(void **state) {
    const int32_t ids[] = {'h', 'i', 256, -1, 'x', 1000, -1, 'y'};
    char out[16];
    assert_int_equal(mt_byte_text_decode(ids, 8, out, sizeof out), 6);
    assert_string_equal(out, "hi\nx\ny");
    assert_int_equal(mt_byte_text_decode(ids, 8, out, 4), 3); /* truncated, NUL-terminated */
    assert_string_equal(out, "hi\n");
    assert_int_equal(mt_byte_text_decode(ids, 8, out, 0), 0);
    assert_int_equal(mt_byte_text_decode(ids, 0, out, sizeof out), 0);
    assert_string_equal(out, "");
}

static void expect_text_error(const char *const *paths, int n_paths, const char *out,
                              const char *sep, int eos, const char *needle) {
    mt_error_clear();
    mt_text_stats st;
    assert_int_equal(mt_byte_text_to_tokens(paths, n_paths, out, sep, eos, &st), MT_ERR);
    const char *msg = mt_error_message();
    print_message("  %s\n", msg);
    assert_non_null(strstr(msg, needle));
    assert_null(strchr(msg, '\n'));
    assert_int_equal(st.documents, 0);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    assert_false(file_exists(out));
    assert_false(file_exists(tmp));
}

static void test_byte_text_errors(void **state) {
    char a[512], missing[512], ws[512], out[512];
    mt_test_write_bytes(mt_test_dir_path(a, "ok.txt"), "hello\n", 6);
    mt_test_dir_path(missing, "missing.txt");
    mt_test_dir_path(out, "never.bin");
    const char *p1[2] = {a, missing};
    expect_text_error(p1, 2, out, "%", 256, missing);
    expect_text_error(p1, 1, out, "%", 255, out);   /* eos collides with a byte */
    expect_text_error(p1, 1, out, "%", 65536, out); /* eos does not fit uint16 */
    expect_text_error(p1, 0, out, "%", 256, out);
    mt_test_write_bytes(mt_test_dir_path(ws, "ws.txt"), "%\n%\n%\r\n", 7);
    const char *p2[1] = {ws};
    expect_text_error(p2, 1, out, "%", 256, out); /* no text at all */
    /* An unwritable output names its temporary. */
    char bad_out[600];
    snprintf(bad_out, sizeof bad_out, "%s/no_dir/x.bin", mt_test_dir);
    const char *p3[1] = {a};
    expect_text_error(p3, 1, bad_out, NULL, 256, "no_dir/x.bin");
    /* An input directory is a read error naming it. */
    const char *p4[1] = {mt_test_dir};
    expect_text_error(p4, 1, out, NULL, 256, mt_test_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential_order),
        cmocka_unit_test(test_short_file_wraps),
        cmocka_unit_test(test_uint16_uint32),
        cmocka_unit_test(test_perm_is_bijection),
        cmocka_unit_test(test_shuffle_epochs),
        cmocka_unit_test(test_shuffle_seeds_and_resume),
        cmocka_unit_test(test_eval_rows),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_byte_text),
        cmocka_unit_test(test_byte_text_long_document),
        cmocka_unit_test(test_byte_text_decode),
        cmocka_unit_test(test_byte_text_errors),
    };
    return cmocka_run_group_tests(tests, mt_test_dir_setup, mt_test_dir_teardown);
}
