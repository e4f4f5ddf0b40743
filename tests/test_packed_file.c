/* The packed-rows file (src/data/packed.h): what the writer lays out is checked against the format's
 * definition computed here, for several T, random documents and both id sizes: split, from the
 * plain stream (row r = stream tokens r*T .. r*T+T, targets only inside a document and on trained
 * tokens, document starts restarting at each row; documents one token long to several rows long);
 * whole, from the next-fit placement (documents 1 .. T+1 tokens long, each inside one row, the
 * rest of a row padding, the padding count); the batch order
 * (sequential, shuffled epochs, resumable from the step); eval padding rows; and every malformed
 * header field or row refused with one line naming the file and the field. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "data/packed.h"
#include "util/testutil.h"

typedef struct {
    int32_t *ids;
    uint8_t *trained;
    int *doc; /* document index of each stream token */
    int64_t n;
} stream;

/* n_docs random documents of 1..max_len tokens; ids < vocab, about half the tokens trained. */
static stream make_stream(mt_test_rng *rng, int n_docs, int max_len, int vocab) {
    stream s = {0};
    int64_t cap = (int64_t)n_docs * max_len;
    s.ids = malloc(cap * sizeof *s.ids), s.trained = malloc(cap), s.doc = malloc(cap * sizeof *s.doc);
    for (int d = 0; d < n_docs; d++) {
        int len = 1 + (int)(mt_test_rng_u64(rng) % (uint64_t)max_len);
        for (int i = 0; i < len; i++, s.n++) {
            s.ids[s.n] = (int32_t)(mt_test_rng_u64(rng) % (uint64_t)vocab);
            s.trained[s.n] = mt_test_rng_u64(rng) % 2;
            s.doc[s.n] = d;
        }
    }
    return s;
}

static void free_stream(stream *s) { free(s->ids), free(s->trained), free(s->doc); }

static char *tmp_path(const char *dir, const char *name) {
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

/* Writes the documents of s; returns the writer's padding count. */
static int64_t write_policy(const char *path, const stream *s, int n_docs, int T, int vocab, int id_size, int pad,
                            mt_pack_policy policy) {
    mt_packed_writer w;
    assert_int_equal(mt_packed_writer_open(&w, path, T, vocab, id_size, pad, policy), MT_OK);
    for (int64_t a = 0; a < s->n;) {
        int64_t b = a;
        while (b < s->n && s->doc[b] == s->doc[a]) b++;
        assert_int_equal(mt_packed_writer_add(&w, s->ids + a, s->trained + a, (size_t)(b - a)), MT_OK);
        a = b;
    }
    assert_int_equal(w.documents, n_docs);
    assert_int_equal(mt_packed_writer_commit(&w), MT_OK);
    return w.padded;
}

static void write_stream(const char *path, const stream *s, int n_docs, int T, int vocab, int id_size, int pad) {
    write_policy(path, s, n_docs, T, vocab, id_size, pad, MT_PACK_SPLIT);
}

/* Row r by the definition: stream positions p = r*T + t; past the stream: padding (pad id, its own
 * document, no loss). */
static void expected_row(const stream *s, int T, int pad, int64_t r, int32_t *in, int32_t *tg, int32_t *ds) {
    int start = 0;
    for (int t = 0; t < T; t++) {
        int64_t p = r * T + t;
        int real = p < s->n, next_real = p + 1 < s->n;
        in[t] = real ? s->ids[p] : pad;
        tg[t] = real && next_real && s->doc[p + 1] == s->doc[p] && s->trained[p + 1] ? s->ids[p + 1] : -1;
        int new_doc = t == 0 || (real ? s->doc[p] != s->doc[p - 1] : p == s->n);
        if (new_doc) start = t;
        ds[t] = start;
    }
}

static void test_layout_matches_definition(void **state) {
    (void)state;
    char *dir = mt_test_tmpdir(), *path = tmp_path(dir, "a.packed");
    const int Ts[] = {1, 2, 5, 16, 37};
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 7);
    for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
        for (int id_size = 2; id_size <= 4; id_size += 2) {
            int T = Ts[k], vocab = id_size == 2 ? 65536 : 100000, pad = 3, n_docs = 40;
            stream s = make_stream(&rng, n_docs, 3 * T + 2, vocab);
            write_stream(path, &s, n_docs, T, vocab, id_size, pad);
            mt_packed_file f;
            if (mt_packed_open(&f, path, T, vocab) != MT_OK) fail_msg("%s", mt_error_message());
            int64_t rows = s.n - 1 <= 0 ? 1 : (s.n - 1 + T - 1) / T; /* rows cover targets 1 .. n-1 */
            assert_int_equal(f.rows, rows);
            assert_int_equal(f.documents, n_docs);
            int64_t trained = 0;
            int32_t *in = malloc(T * 4), *tg = malloc(T * 4), *ds = malloc(T * 4);
            int32_t *ein = malloc(T * 4), *etg = malloc(T * 4), *eds = malloc(T * 4);
            for (int64_t r = 0; r < f.rows; r++) {
                mt_packed_row(&f, r, in, tg, ds);
                expected_row(&s, T, pad, r, ein, etg, eds);
                if (memcmp(in, ein, T * 4) || memcmp(tg, etg, T * 4) || memcmp(ds, eds, T * 4))
                    fail_msg("T %d id_size %d row %lld differs from the definition", T, id_size, (long long)r);
                for (int t = 0; t < T; t++) trained += tg[t] >= 0;
            }
            /* every trained token but a document's first is a target exactly once */
            int64_t want = 0;
            for (int64_t p = 1; p < s.n; p++) want += s.trained[p] && s.doc[p] == s.doc[p - 1];
            assert_int_equal(trained, want);
            assert_int_equal(f.trained, want);
            mt_packed_close(&f);
            free(in), free(tg), free(ds), free(ein), free(etg), free(eds);
            free_stream(&s);
        }
    }
    mt_test_rmtree(dir);
    free(dir), free(path);
}

/* The whole policy by its definition: documents in order; a document goes into the current row
 * when its tokens fit the ids left (fill + len <= T+1) and its first token is an input (fill < T),
 * else the rest of the row is padding and it starts the next row. Returns the rows; slot[r*(T+1)+i]
 * is the stream index of row r's id i, or -1 for padding. */
static int64_t whole_layout(const stream *s, int T, int64_t **slot_out) {
    int64_t *slot = malloc((size_t)(s->n + 1) * (size_t)(T + 1) * sizeof *slot), rows = 1;
    int fill = 0;
    for (int64_t a = 0; a < s->n;) {
        int64_t b = a;
        while (b < s->n && s->doc[b] == s->doc[a]) b++;
        if (!(fill < T && fill + (b - a) <= T + 1)) {
            while (fill <= T) slot[(rows - 1) * (T + 1) + fill++] = -1;
            rows++, fill = 0;
        }
        for (int64_t p = a; p < b; p++) slot[(rows - 1) * (T + 1) + fill++] = p;
        a = b;
    }
    while (fill <= T) slot[(rows - 1) * (T + 1) + fill++] = -1;
    *slot_out = slot;
    return rows;
}

/* Row r of the whole layout: inputs, targets (inside a document, trained), document starts (each
 * document and each padding run); *padding += its padding input positions. */
static void expected_whole_row(const stream *s, const int64_t *slot, int T, int pad, int32_t *in, int32_t *tg,
                               int32_t *ds, int64_t *padding) {
    int start = 0;
    for (int t = 0; t < T; t++) {
        int64_t p = slot[t], q = slot[t + 1];
        in[t] = p >= 0 ? s->ids[p] : pad;
        tg[t] = p >= 0 && q >= 0 && s->doc[q] == s->doc[p] && s->trained[q] ? s->ids[q] : -1;
        int64_t prev = t ? slot[t - 1] : -2;
        int new_doc = t == 0 || (p < 0 ? prev >= 0 : prev < 0 || s->doc[prev] != s->doc[p]);
        if (new_doc) start = t;
        ds[t] = start;
        *padding += p < 0;
    }
}

static void test_whole_layout_matches_definition(void **state) {
    (void)state;
    char *dir = mt_test_tmpdir(), *path = tmp_path(dir, "w.packed");
    const int Ts[] = {1, 2, 5, 16, 37};
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 17);
    int64_t last_slot_used = 0; /* rows whose last document ends in ids[T], a target only */
    for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
        for (int id_size = 2; id_size <= 4; id_size += 2) {
            int T = Ts[k], vocab = id_size == 2 ? 65536 : 100000, pad = 3, n_docs = 60;
            stream s = make_stream(&rng, n_docs, T + 1, vocab); /* 1 .. T+1 tokens: each fits a row */
            int64_t padded = write_policy(path, &s, n_docs, T, vocab, id_size, pad, MT_PACK_WHOLE);
            int64_t *slot, rows = whole_layout(&s, T, &slot);
            for (int64_t r = 0; r < rows; r++) last_slot_used += slot[r * (T + 1) + T] >= 0;
            mt_packed_file f;
            if (mt_packed_open(&f, path, T, vocab) != MT_OK) fail_msg("%s", mt_error_message());
            assert_int_equal(f.rows, rows);
            assert_int_equal(f.documents, n_docs);
            int64_t padding = 0, trained = 0;
            int32_t *in = malloc(T * 4), *tg = malloc(T * 4), *ds = malloc(T * 4);
            int32_t *ein = malloc(T * 4), *etg = malloc(T * 4), *eds = malloc(T * 4);
            for (int64_t r = 0; r < f.rows; r++) {
                mt_packed_row(&f, r, in, tg, ds);
                expected_whole_row(&s, slot + r * (T + 1), T, pad, ein, etg, eds, &padding);
                if (memcmp(in, ein, T * 4) || memcmp(tg, etg, T * 4) || memcmp(ds, eds, T * 4))
                    fail_msg("whole: T %d id_size %d row %lld differs from the definition", T, id_size, (long long)r);
                for (int t = 0; t < T; t++) trained += tg[t] >= 0;
            }
            /* no document is cut: every trained token but a document's first is a target */
            int64_t want = 0;
            for (int64_t p = 1; p < s.n; p++) want += s.trained[p] && s.doc[p] == s.doc[p - 1];
            assert_int_equal(trained, want);
            assert_int_equal(padded, padding);
            assert_true(T == 1 || padding > 0); /* the documents really did not tile the rows */
            mt_packed_close(&f);
            free(in), free(tg), free(ds), free(ein), free(etg), free(eds), free(slot);
            free_stream(&s);
        }
    }
    assert_true(last_slot_used > 0);
    /* the policy's names */
    mt_pack_policy pp;
    assert_int_equal(mt_pack_policy_parse("split", &pp), MT_OK);
    assert_int_equal(pp, MT_PACK_SPLIT);
    assert_int_equal(mt_pack_policy_parse("whole", &pp), MT_OK);
    assert_int_equal(pp, MT_PACK_WHOLE);
    assert_int_equal(mt_pack_policy_parse("tight", &pp), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "--pack \"tight\""));
    assert_string_equal(mt_pack_policy_name(MT_PACK_SPLIT), "split");
    mt_test_rmtree(dir);
    free(dir), free(path);
}

/* Sequential order tiles the rows; shuffled epochs visit each row once, differently per epoch, and
 * any step's batch depends only on (seed, step). Eval rows past the end are padding. */
static void test_batch_order(void **state) {
    (void)state;
    char *dir = mt_test_tmpdir(), *path = tmp_path(dir, "b.packed");
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 9);
    const int T = 4, B = 3;
    stream s = make_stream(&rng, 30, 6, 1000);
    for (int64_t i = 0; i < s.n; i++) s.ids[i] = (int32_t)(i % 1000); /* row r starts with id (r*T) % 1000 */
    write_stream(path, &s, 30, T, 1000, 2, 0);
    mt_packed_file f;
    assert_int_equal(mt_packed_open(&f, path, T, 1000), MT_OK);
    int64_t R = f.rows;
    int32_t in[B * T], tg[B * T], ds[B * T], in2[B * T], tg2[B * T], ds2[B * T];
    mt_batch_order seq = {.shuffle = 0}, shuf = {.shuffle = 1, .seed = 5};
    for (int64_t step = 0; step < 3 * R; step++) {
        mt_packed_batch(&f, &seq, step, B, in, tg, ds);
        for (int r = 0; r < B; r++) assert_int_equal(in[r * T], (((step * B + r) % R) * T) % 1000);
    }
    const int64_t epochs = B, steps = R; /* R steps of B rows: exactly B epochs */
    int *seen = calloc((size_t)R * (size_t)epochs, sizeof(int));
    int64_t first_epoch_rows[64] = {0}, same_order = 1;
    for (int64_t step = 0; step < steps; step++) {
        mt_packed_batch(&f, &shuf, step, B, in, tg, ds);
        mt_packed_batch(&f, &shuf, step, B, in2, tg2, ds2); /* stateless: the same again */
        assert_memory_equal(in, in2, sizeof in);
        assert_memory_equal(tg, tg2, sizeof tg);
        assert_memory_equal(ds, ds2, sizeof ds);
        for (int r = 0; r < B; r++) {
            int64_t g = step * B + r, e = g / R, row = (in[r * T] / T) % R;
            if (e < epochs) seen[e * R + row]++;
            if (e == 0 && g < 64) first_epoch_rows[g] = row;
            if (e == 1 && g - R < 64 && first_epoch_rows[g - R] != row) same_order = 0;
            assert_true(e < epochs);
        }
    }
    for (int64_t i = 0; i < epochs * R; i++) assert_int_equal(seen[i], 1);
    assert_false(same_order); /* epochs are permuted differently */
    free(seen);
    mt_packed_eval_batch(&f, R - 1, B, in, tg, ds); /* the last row, then two padding rows */
    mt_packed_row(&f, R - 1, in2, tg2, ds2);
    assert_memory_equal(in, in2, T * 4);
    for (int i = T; i < B * T; i++) assert_true(in[i] == 0 && tg[i] == -1 && ds[i] == 0);
    mt_packed_close(&f);
    free_stream(&s);
    mt_test_rmtree(dir);
    free(dir), free(path);
}

/* ---- malformed files: one line naming the file and the field ---- */

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 16);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void write_all(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

static void put32(unsigned char *p, uint32_t v) { p[0] = v, p[1] = v >> 8, p[2] = v >> 16, p[3] = v >> 24; }

static void expect_refused(const char *path, const unsigned char *b, size_t n, int T, int vocab,
                           const char *needle) {
    write_all(path, b, n);
    mt_packed_file f;
    mt_error_clear();
    assert_int_equal(mt_packed_open(&f, path, T, vocab), MT_ERR);
    const char *msg = mt_error_message();
    fprintf(stderr, "  %s\n", msg);
    if (strncmp(msg, path, strlen(path)) != 0 || !strstr(msg, needle) || strchr(msg, '\n'))
        fail_msg("error [%s] should be one line starting with the path and naming [%s]", msg, needle);
    assert_null(f.data);
}

static void test_bad_files(void **state) {
    (void)state;
    char *dir = mt_test_tmpdir(), *good = tmp_path(dir, "good.packed"), *bad = tmp_path(dir, "bad.packed");
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 3);
    const int T = 8, V = 50;
    stream s = make_stream(&rng, 12, 10, V);
    write_stream(good, &s, 12, T, V, 2, 1);
    size_t n;
    unsigned char *g = read_all(good, &n), *b = malloc(n + 16);
    mt_packed_file f;
    assert_int_equal(mt_packed_open(&f, good, T, V), MT_OK);
    size_t row = f.row_bytes;
    int64_t rows = f.rows;
    mt_packed_close(&f);
    unsigned char *flags0 = b + MT_PACKED_HEADER + (size_t)(T + 1) * 2; /* row 0's flags */
#define FRESH() memcpy(b, g, n)
    FRESH(), memcpy(b, "MTPACKEX", 8), expect_refused(bad, b, n, T, V, "magic");
    FRESH(), put32(b + 8, 2), expect_refused(bad, b, n, T, V, "version is 2");
    FRESH(), expect_refused(bad, b, n, 16, V, "header field T is 8");
    FRESH(), put32(b + 12, 0), expect_refused(bad, b, n, 0, V, "header field T is 0");
    FRESH(), put32(b + 16, 0), put32(b + 20, 0), expect_refused(bad, b, n, T, V, "header field rows is 0");
    FRESH(), put32(b + 16, (uint32_t)rows + 1), expect_refused(bad, b, n, T, V, "header fields rows");
    FRESH(), put32(b + 20, 0x40000000u), expect_refused(bad, b, n, T, V, "header fields rows");
    FRESH(), put32(b + 24, 40), expect_refused(bad, b, n, T, 40 + 0, "token id");
    FRESH(), expect_refused(bad, b, n, T, V - 1, "header field vocab is 50, more than the model's");
    FRESH(), put32(b + 24, 70000), expect_refused(bad, b, n, T, 0, "header field vocab is 70000");
    /* ids are read as int32: a larger vocabulary would let negative ids through (found by fuzz_packed) */
    FRESH(), put32(b + 24, 0x80000000u), put32(b + 28, 4),
        expect_refused(bad, b, n, T, 0, "header field vocab is 2147483648");
    FRESH(), put32(b + 28, 3), expect_refused(bad, b, n, T, V, "header field id_size is 3");
    FRESH(), b[50] = 1, expect_refused(bad, b, n, T, V, "header field reserved");
    FRESH(), put32(b + 40, 0), put32(b + 44, 0), expect_refused(bad, b, n, T, V, "header field trained");
    FRESH(), expect_refused(bad, b, n - 1, T, V, "truncated");
    FRESH(), b[n] = 0, expect_refused(bad, b, n + 1, T, V, "truncated");
    FRESH(), expect_refused(bad, b, 40, T, V, "shorter than the 64-byte header");
    FRESH(), flags0[0] = 0, expect_refused(bad, b, n, T, V, "row 0: flags[0] lacks DOC");
    FRESH(), flags0[3] |= 0x80, expect_refused(bad, b, n, T, V, "row 0: flags[3] = 0x");
    FRESH(), flags0[2] |= MT_PACKED_LOSS, flags0[3] |= MT_PACKED_DOC,
        expect_refused(bad, b, n, T, V, "row 0: flags[2] has LOSS but its target starts another document");
    FRESH(), b[MT_PACKED_HEADER + row + 2] = 60, b[MT_PACKED_HEADER + row + 3] = 0, expect_refused(bad, b, n, T, V, "row 1: token id 60 at position 1");
    mt_error_clear();
    assert_int_equal(mt_packed_open(&f, "no_such.packed", T, V), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "no_such.packed: cannot open"));
    assert_false(mt_packed_is_packed("no_such.packed"));
    assert_true(mt_packed_is_packed(good));
    /* a writer given nothing leaves nothing */
    mt_packed_writer w;
    char *empty = tmp_path(dir, "empty.packed");
    assert_int_equal(mt_packed_writer_open(&w, empty, T, V, 2, 0, MT_PACK_WHOLE), MT_OK);
    assert_int_equal(mt_packed_writer_commit(&w), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "no document"));
    assert_int_equal(access(empty, F_OK), -1);
    char tmpname[4200];
    snprintf(tmpname, sizeof tmpname, "%s.tmp", empty);
    assert_int_equal(access(tmpname, F_OK), -1);
    free(g), free(b), free(empty);
    free_stream(&s);
    mt_test_rmtree(dir);
    free(dir), free(good), free(bad);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_matches_definition),
        cmocka_unit_test(test_whole_layout_matches_definition),
        cmocka_unit_test(test_batch_order),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
