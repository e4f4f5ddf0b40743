/* --eval-split (src/data/split.h through src/data/run_data.h), on a token file whose token i is i (so
 * a target names its position) and on a packed file of one 6-token document a row (ids unique over
 * the file): the held-out units are disjoint from every training row over several epochs, shuffled
 * and in order; one epoch visits every train unit exactly once; the split and the training rows are
 * the same after re-opening (a new run, a resume: nothing but the seed and the step), another seed
 * holds out other units; a split that leaves a side empty, and F outside (0, 1), are refused. */
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
    mt_run_data_opts o = {.out_dir = g_dir, .T = T};
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
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
