/* --eval-split (src/data/split.h through src/data/run_data.h), on a token file whose token i is i (so
 * a target names its position) and on a packed file of one 6-token document a row (ids unique over
 * the file): the held-out units are disjoint from every training row over several epochs, shuffled
 * and in order; one epoch visits every train unit exactly once; the split and the training rows are
 * the same after re-opening (a new run, a resume: nothing but the seed and the step), another seed
 * holds out other units; a split that leaves a side empty, and F outside (0, 1), are refused.
 * Text and JSONL data (byte-level tokens), each document one marker byte repeated: whole documents
 * are held out (src/data/doc_split.h): the eval rows hold every token of the held-out documents
 * exactly once and nothing else, no training row over three epochs holds a held-out marker, and one
 * epoch reads every train document; a text file without --doc-sep (one document) is refused, and
 * so is a document index that does not fit its token file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/run_data.h"
#include "util/testutil.h"

#define VOCAB 4096
#define N_TOKENS 3000
#define DOC_LEN 6
#define N_DOCS 600

static char *g_dir;
static const char *g_doc_sep; /* text data read by open_data */

static int setup(void **state) {
    g_dir = mt_test_tmpdir();
    return g_dir ? 0 : -1;
}

static int teardown(void **state) {
    mt_test_rmtree(g_dir);
    free(g_dir);
    return 0;
}

static void path_of(const char *name, char *out, size_t size) { snprintf(out, size, "%s/%s", g_dir, name); }

static void write_tokens(const char *name, int n) {
    char path[4096];
    path_of(name, path, sizeof path);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        unsigned char b[2] = {(unsigned char)(i & 255), (unsigned char)(i >> 8)};
        assert_int_equal(fwrite(b, 1, 2, f), 2);
    }
    assert_int_equal(fclose(f), 0);
}

static void write_packed(const char *name, int T) {
    char path[4096];
    path_of(name, path, sizeof path);
    mt_packed_writer w;
    assert_int_equal(mt_packed_writer_open(&w, path, T, VOCAB, 2, VOCAB - 1, MT_PACK_WHOLE), MT_OK);
    int32_t ids[DOC_LEN];
    uint8_t trained[DOC_LEN];
    for (int d = 0; d < N_DOCS; d++) {
        for (int i = 0; i < DOC_LEN; i++) ids[i] = d * DOC_LEN + i, trained[i] = 1;
        assert_int_equal(mt_packed_writer_add(&w, ids, trained, DOC_LEN), MT_OK);
    }
    assert_int_equal(mt_packed_writer_commit(&w), MT_OK);
}

static void open_data(mt_run_data *d, const char *name, int T) {
    char path[4096];
    path_of(name, path, sizeof path);
    mt_config cfg = {0};
    cfg.V = VOCAB;
    mt_run_data_opts o = {.out_dir = g_dir, .T = T, .doc_sep = g_doc_sep};
    if (mt_run_data_open(d, path, &o, &cfg) != MT_OK) fail_msg("%s", mt_error_message());
}

/* Every training row of 3 epochs, in order and shuffled, against the held-out rows: no target
 * value (a token position / a unique id) of an eval row is ever a training target, and the first
 * epoch's rows start at n_train distinct places, none of them an eval row's. */
static void check_disjoint(mt_run_data *d, int T, int B, uint64_t seed) {
    const mt_data_split *s = &d->split;
    assert_true(s->n_eval >= 1 && s->n_train >= 1 && s->n_eval + s->n_train == s->units);
    int32_t *in = malloc((size_t)B * T * sizeof(int32_t)), *tg = malloc((size_t)B * T * sizeof(int32_t));
    char *eval_target = calloc(VOCAB, 1), *eval_first = calloc(VOCAB, 1), *seen_first = calloc(VOCAB, 1);
    assert_int_equal(mt_run_data_eval_rows(d, T), s->n_eval);
    int64_t eval_targets = 0;
    for (int64_t first = 0; first < s->n_eval; first += B) {
        mt_run_data_eval_batch(d, first, B, T, in, tg);
        for (int r = 0; r < B; r++) {
            if (first + r >= s->n_eval) { /* padding past the held-out rows */
                for (int t = 0; t < T; t++) assert_int_equal(tg[r * T + t], -1);
                continue;
            }
            eval_first[in[r * T]] = 1;
            for (int t = 0; t < T; t++)
                if (tg[r * T + t] >= 0) eval_target[tg[r * T + t]] = 1, eval_targets++;
        }
    }
    assert_true(eval_targets > 0);
    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        mt_batch_order o = {.shuffle = shuffle, .seed = seed};
        memset(seen_first, 0, VOCAB);
        int64_t distinct = 0, steps = (3 * s->n_train + B - 1) / B;
        for (int64_t step = 0; step < steps; step++) {
            mt_run_data_batch(d, &o, step, B, T, in, tg);
            for (int r = 0; r < B; r++) {
                for (int t = 0; t < T; t++) {
                    int32_t v = tg[r * T + t];
                    if (v >= 0 && eval_target[v])
                        fail_msg("shuffle %d step %lld row %d: target %d is an eval target", shuffle, (long long)step, r,
                                 v);
                }
                int64_t g = step * B + r;
                int32_t first = in[r * T];
                if (eval_first[first]) fail_msg("step %lld row %d is an eval row (starts with %d)", (long long)step, r, first);
                if (g < s->n_train) distinct += !seen_first[first], seen_first[first] = 1;
            }
        }
        assert_int_equal(distinct, s->n_train); /* one epoch: every train unit once */
    }
    free(in), free(tg), free(eval_target), free(eval_first), free(seen_first);
}

/* Same held-out units and same training rows at a later step after re-opening; another seed holds
 * out other units. */
static void check_stable(const char *name, int T, int B, double F, uint64_t seed) {
    mt_run_data a, b, c;
    open_data(&a, name, T);
    open_data(&b, name, T);
    open_data(&c, name, T);
    assert_int_equal(mt_run_data_split(&a, name, F, seed, T), MT_OK);
    assert_int_equal(mt_run_data_split(&b, name, F, seed, T), MT_OK);
    assert_int_equal(mt_run_data_split(&c, name, F, seed + 1, T), MT_OK);
    assert_int_equal(a.split.n_eval, b.split.n_eval);
    assert_memory_equal(a.split.eval, b.split.eval, (size_t)a.split.n_eval * sizeof(int64_t));
    for (int64_t i = 0; i < a.split.n_eval; i++) assert_true(mt_data_split_held_out(seed, F, a.split.eval[i]));
    if (a.split.n_eval == c.split.n_eval &&
        !memcmp(a.split.eval, c.split.eval, (size_t)a.split.n_eval * sizeof(int64_t)))
        fail_msg("seeds %llu and %llu hold out the same units", (unsigned long long)seed, (unsigned long long)seed + 1);
    /* the fraction held out is about F (a loose bound: a hash, not an exact count) */
    assert_true(a.split.n_eval >= F * a.split.units / 3 && a.split.n_eval <= F * a.split.units * 3);
    mt_batch_order o = {.shuffle = 1, .seed = seed};
    size_t n = (size_t)B * T;
    int32_t *ia = malloc(n * 4), *ta = malloc(n * 4), *ib = malloc(n * 4), *tb = malloc(n * 4);
    for (int64_t step = 0; step < 40; step += 13) {
        mt_run_data_batch(&a, &o, step, B, T, ia, ta);
        mt_run_data_batch(&b, &o, step, B, T, ib, tb);
        assert_memory_equal(ia, ib, n * 4);
        assert_memory_equal(ta, tb, n * 4);
    }
    free(ia), free(ta), free(ib), free(tb);
    mt_run_data_close(&a), mt_run_data_close(&b), mt_run_data_close(&c);
}

static void test_token_file(void **state) {
    write_tokens("tokens.bin", N_TOKENS);
    for (uint64_t seed = 1; seed <= 3; seed++) {
        mt_run_data d;
        open_data(&d, "tokens.bin", 16);
        assert_int_equal(mt_run_data_split(&d, "tokens.bin", 0.1, seed, 16), MT_OK);
        assert_int_equal(d.split.units, N_TOKENS / 16);
        check_disjoint(&d, 16, 4, seed);
        mt_run_data_close(&d);
    }
    check_stable("tokens.bin", 16, 4, 0.1, 1337);
}

static void test_packed_file(void **state) {
    write_packed("rows.packed", 8);
    for (uint64_t seed = 1; seed <= 3; seed++) {
        mt_run_data d;
        open_data(&d, "rows.packed", 8);
        assert_int_equal(mt_run_data_split(&d, "rows.packed", 0.2, seed, 8), MT_OK);
        assert_int_equal(d.split.units, N_DOCS); /* one document a row */
        check_disjoint(&d, 8, 3, seed);
        mt_run_data_close(&d);
    }
    check_stable("rows.packed", 8, 3, 0.2, 1337);
}

/* ---- text data: whole documents ---- */

#define TEXT_DOCS 90
#define BYTE_EOS 256

/* Document i's marker byte: printable ASCII but '%' (the separator), '"' and '\\' (JSON escapes). */
static int marker(int i) {
    int c = 33;
    for (int k = 0;; c++)
        if (c != '%' && c != '"' && c != '\\' && k++ == i) return c;
}

static int doc_len(int i) { return 2 + (i * 7) % 13; }

/* TEXT_DOCS documents, document i = marker(i) repeated doc_len(i) times: as text lines ending in
 * "\n", separated by "%" lines (jsonl 0), or as JSONL "text" fields (jsonl 1). Returns the tokens
 * of each document, eos included. */
static int write_docs(const char *name, int jsonl, int *tokens) {
    char path[4096];
    path_of(name, path, sizeof path);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < TEXT_DOCS; i++) {
        if (jsonl) fputs("{\"text\": \"", f);
        for (int k = 0; k < doc_len(i); k++) fputc(marker(i), f);
        fputs(jsonl ? "\"}\n" : "\n%\n", f);
        tokens[i] = doc_len(i) + (jsonl ? 1 : 2); /* the "\n" of a text line; eos */
    }
    assert_int_equal(fclose(f), 0);
    return 0;
}

/* Counts of each token id (0..256) in a row's tokens that eval or training reads. */
static void count_row(const int32_t *in, const int32_t *tg, int T, int first, int64_t *count) {
    if (first) count[in[0]]++; /* the stream's first token is read as an input only */
    for (int t = 0; t < T; t++)
        if (tg[t] >= 0) count[tg[t]]++;
}

static void check_documents(const char *name, int jsonl, double F, uint64_t seed, int T, int B) {
    int tokens[TEXT_DOCS];
    write_docs(name, jsonl, tokens);
    mt_run_data d;
    open_data(&d, name, T);
    assert_int_equal(mt_run_data_split(&d, name, F, seed, T), MT_OK);
    const mt_data_split *s = &d.split;
    assert_int_equal(s->units, TEXT_DOCS); /* the units are the documents */
    assert_string_equal(mt_run_data_split_units(&d), "documents");
    int held[TEXT_DOCS], n_eval = 0;
    int64_t eval_tokens = 0, train_tokens = 0;
    for (int i = 0; i < TEXT_DOCS; i++) {
        held[i] = mt_data_split_held_out(seed, F, i);
        n_eval += held[i];
        *(held[i] ? &eval_tokens : &train_tokens) += tokens[i];
    }
    assert_int_equal(s->n_eval, n_eval);
    assert_true(n_eval >= 1 && n_eval < TEXT_DOCS);

    /* eval: every token of every held-out document exactly once, nothing of a trained one */
    int32_t *in = malloc((size_t)B * T * sizeof(int32_t)), *tg = malloc((size_t)B * T * sizeof(int32_t));
    int64_t count[BYTE_EOS + 1] = {0}, rows = mt_run_data_eval_rows(&d, T);
    assert_int_equal(rows, (eval_tokens - 1 + T - 1) / T);
    for (int64_t first = 0; first < rows + B; first += B) { /* and a batch of padding past the end */
        mt_run_data_eval_batch(&d, first, B, T, in, tg);
        for (int r = 0; r < B; r++) {
            if (first + r >= rows) {
                for (int t = 0; t < T; t++) assert_int_equal(tg[r * T + t], -1);
                continue;
            }
            count_row(in + r * T, tg + r * T, T, first + r == 0, count);
        }
    }
    for (int i = 0; i < TEXT_DOCS; i++)
        if (count[marker(i)] != (held[i] ? doc_len(i) : 0))
            fail_msg("%s: document %d (%s, marker '%c', %d long): %lld of its tokens in the eval rows", name, i,
                     held[i] ? "held out" : "trained", marker(i), doc_len(i), (long long)count[marker(i)]);
    assert_int_equal(count[BYTE_EOS], n_eval);
    assert_int_equal(count['\n'], jsonl ? 0 : n_eval);

    /* training: the train documents' stream in windows of T; no held-out marker in 3 epochs, and
     * one epoch reads every document that starts before the windows' end (W*T; past it, fewer than
     * T tokens, only as the wrapped tail of the last window) */
    int64_t W = train_tokens / T > 1 ? train_tokens / T : 1;
    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        mt_batch_order o = {.shuffle = shuffle, .seed = seed};
        int64_t seen[BYTE_EOS + 1] = {0};
        for (int64_t step = 0; step < (3 * W + B - 1) / B; step++) {
            mt_run_data_batch(&d, &o, step, B, T, in, tg);
            for (int r = 0; r < B; r++) {
                for (int t = 0; t < T; t++) {
                    int32_t v[2] = {in[r * T + t], tg[r * T + t]};
                    for (int k = 0; k < 2; k++)
                        for (int i = 0; i < TEXT_DOCS; i++)
                            if (held[i] && v[k] == marker(i))
                                fail_msg("%s: shuffle %d step %lld row %d holds '%c' of held-out document %d", name,
                                         shuffle, (long long)step, r, v[k], i);
                }
                if (step * B + r < W) count_row(in + r * T, tg + r * T, T, 1, seen);
            }
        }
        int64_t at = 0;
        for (int i = 0; i < TEXT_DOCS; i++) {
            if (held[i]) continue;
            if (at < W * T && !seen[marker(i)])
                fail_msg("%s: shuffle %d: one epoch never reads train document %d", name, shuffle, i);
            at += tokens[i];
        }
    }
    free(in), free(tg);
    mt_run_data_close(&d);
}

static void test_text_documents(void **state) {
    g_doc_sep = "%";
    for (uint64_t seed = 1; seed <= 3; seed++) check_documents("docs.txt", 0, 0.2, seed, 8, 3);
    check_documents("docs.txt", 0, 0.5, 7, 16, 4);
    check_stable("docs.txt", 8, 3, 0.2, 1337);
    g_doc_sep = NULL;
}

static void test_jsonl_documents(void **state) {
    for (uint64_t seed = 1; seed <= 3; seed++) check_documents("docs.jsonl", 1, 0.2, seed, 8, 3);
    check_documents("docs.jsonl", 1, 0.1, 9, 5, 2);
    check_stable("docs.jsonl", 8, 3, 0.2, 1337);
}

/* A text file without --doc-sep is one document: one side is always empty. */
static void test_one_document_refused(void **state) {
    char path[4096];
    path_of("one.txt", path, sizeof path);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 200; i++) fputs("a line of text\n%\n", f);
    assert_int_equal(fclose(f), 0);
    mt_run_data d;
    open_data(&d, "one.txt", 8);
    assert_int_equal(mt_run_data_split(&d, "one.txt", 0.5, 1337, 8), MT_ERR);
    const char *msg = mt_error_message();
    if (!strstr(msg, "of one.txt (1 document: without --doc-sep a text file is one)")) fail_msg("%s", msg);
    assert_int_equal(d.split.units, 0);
    mt_run_data_close(&d);
}

/* An index that does not fit its token file: one line naming both. */
static void test_bad_index(void **state) {
    write_tokens("ix.bin", 100);
    mt_run_data d;
    open_data(&d, "ix.bin", 8);
    char path[4096];
    path_of("ix.bin.docs", path, sizeof path);
    int64_t ends[3][3] = {{40, 30, 100}, {40, 70, 99}, {40, 70, 101}}, *got, n;
    for (int c = 0; c < 4; c++) {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        if (c < 3) assert_int_equal(fwrite(ends[c], 8, 3, f), 3);
        else assert_int_equal(fwrite(ends[0], 1, 7, f), 7); /* not whole int64s */
        assert_int_equal(fclose(f), 0);
        assert_int_equal(mt_doc_index_load(path, &d.tokens, &got, &n), MT_ERR);
        const char *msg = mt_error_message();
        if (!strstr(msg, "ix.bin.docs: ") || !strstr(msg, "ix.bin") || !strstr(msg, "remove both")) fail_msg("%s", msg);
    }
    int64_t good[3] = {40, 70, 100};
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(good, 8, 3, f), 3);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(mt_doc_index_load(path, &d.tokens, &got, &n), MT_OK);
    assert_int_equal(n, 3);
    assert_memory_equal(got, good, sizeof good);
    free(got);
    mt_run_data_close(&d);
}

static void expect_refused(mt_run_data *d, double F, int T, const char *needle) {
    assert_int_equal(mt_run_data_split(d, "small.bin", F, 1337, T), MT_ERR);
    const char *msg = mt_error_message();
    if (!strstr(msg, needle)) fail_msg("'%s' not in: %s", needle, msg);
    assert_int_equal(d->split.units, 0);
}

static void test_refused(void **state) {
    write_tokens("small.bin", 20); /* one sequence of 16: one side is always empty */
    mt_run_data d;
    open_data(&d, "small.bin", 16);
    int empty_eval = !mt_data_split_held_out(1337, 0.5, 0);
    expect_refused(&d, 0.5, 16, empty_eval ? "holds out nothing of small.bin (20 tokens: 1 sequences"
                                           : "holds out all of small.bin (20 tokens: 1 sequences");
    expect_refused(&d, 0, 16, "--eval-split 0: must be between 0 and 1");
    expect_refused(&d, 1, 16, "--eval-split 1: must be between 0 and 1");
    expect_refused(&d, -0.5, 16, "--eval-split -0.5: must be between 0 and 1");
    mt_run_data_close(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_file),
        cmocka_unit_test(test_packed_file),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_text_documents),
        cmocka_unit_test(test_jsonl_documents),
        cmocka_unit_test(test_one_document_refused),
        cmocka_unit_test(test_bad_index),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
