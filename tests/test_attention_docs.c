/* Packed rows as a ragged batch (backend/attention_docs.h): the per-sequence lengths and token
 * offsets that cuDNN's variable-length attention reads, and the buckets its graphs are cached by.
 * Wrong offsets there would let a document attend into its neighbour on the GPU; here they are
 * checked exactly, on hand-made rows and on random ones against the definition; and the plan counts
 * the pool memory that path needs exactly for runs on packed rows that take it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/attention_docs.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_memory.h"
#include "core/error.h"
#include "engine/planner.h"
#include "model/config.h"
#include "model/docs.h"
#include "model/params.h"
#include "util/config_check.h"
#include "util/testutil.h"

/* doc_start of rows made of documents of the given lengths (each row's lengths sum to T). */
static void rows_of(int32_t *doc_start, const int *lens, int nlens, int T) {
    int t = 0, row = 0;
    for (int i = 0; i < nlens; i++) {
        for (int j = 0; j < lens[i]; j++) doc_start[row * T + t + j] = t;
        t += lens[i];
        if (t == T) t = 0, row++;
    }
}

static void test_hand_made_rows(void **state) {
    /* row 0: 5, 7, 4; row 1: 1, 15 (a one-token document first) */
    enum { B = 2, T = 16 };
    int32_t d[B * T];
    const int lens[] = {5, 7, 4, 1, 15};
    rows_of(d, lens, 5, T);
    assert_int_equal(mt_docs_check(d, B, T), MT_OK);
    mt_attention_docs_shape sh = mt_attention_docs_shape_of(d, B, T);
    assert_int_equal(sh.n, 5);
    assert_int_equal(sh.max_len, 15);
    assert_int_equal(sh.S, 8);
    assert_int_equal(sh.s_max, 16); /* 64 is the floor, T the ceiling */
    int32_t len[8];
    int64_t off[9];
    assert_int_equal(mt_attention_docs_layout(d, B, T, sh.S, len, off), 5);
    const int32_t want_len[8] = {5, 7, 4, 1, 15, 0, 0, 0};
    const int64_t want_off[9] = {0, 5, 12, 16, 17, 32, 32, 32, 32};
    for (int i = 0; i < 8; i++) assert_int_equal(len[i], want_len[i]);
    for (int i = 0; i < 9; i++) assert_int_equal(off[i], want_off[i]);
    mt_attention_docs_shape ex = mt_attention_docs_shape_exact(d, B, T);
    assert_int_equal(ex.n, 5), assert_int_equal(ex.S, 5), assert_int_equal(ex.s_max, 15);
    int32_t exl[5];
    int64_t exo[6];
    assert_int_equal(mt_attention_docs_layout(d, B, T, 5, exl, exo), 5);
    assert_int_equal(exo[5], 32);
    int32_t ones[4] = {0, 1, 2, 3}; /* four 1-token documents: s_max 2, not 1 */
    assert_int_equal(mt_attention_docs_shape_exact(ones, 1, 4).s_max, 2);
    /* fewer sequences than documents: refused, nothing written past S */
    int32_t small_len[5];
    int64_t small_off[5];
    small_len[4] = 99, small_off[4] = 99;
    assert_int_equal(mt_attention_docs_layout(d, B, T, 4, small_len, small_off), -1);
    assert_int_equal(small_len[4], 99);
    assert_int_equal(small_off[4], 99);
}

static void test_one_document_a_row(void **state) {
    enum { B = 3, T = 1000 };
    int32_t *d = calloc(B * T, sizeof *d);
    mt_attention_docs_shape sh = mt_attention_docs_shape_of(d, B, T);
    assert_int_equal(sh.n, 3);
    assert_int_equal(sh.max_len, T);
    assert_int_equal(sh.S, 4);
    assert_int_equal(sh.s_max, T); /* 1024 capped at T */
    int32_t len[4];
    int64_t off[5];
    assert_int_equal(mt_attention_docs_layout(d, B, T, 4, len, off), 3);
    assert_int_equal(len[0], T), assert_int_equal(len[2], T), assert_int_equal(len[3], 0);
    assert_int_equal(off[1], T), assert_int_equal(off[2], 2 * T), assert_int_equal(off[4], 3 * T);
    free(d);
}

static void test_buckets(void **state) {
    assert_int_equal(mt_attention_docs_bucket(1), 1);
    assert_int_equal(mt_attention_docs_bucket(2), 2);
    assert_int_equal(mt_attention_docs_bucket(3), 4);
    assert_int_equal(mt_attention_docs_bucket(64), 64);
    assert_int_equal(mt_attention_docs_bucket(65), 128);
    assert_int_equal(mt_attention_docs_bucket(1 << 30), 1 << 30);
    assert_int_equal(mt_attention_docs_bucket((1 << 30) + 1), -1);
    /* the length bucket: a row of T = 4096 cut into documents of L tokens (the rest last) */
    enum { T = 4096 };
    int32_t *d = malloc(T * sizeof *d);
    const int cases[][2] = {{1, 64}, {63, 64}, {64, 64}, {65, 128}, {1000, 1024}, {4000, 4096}};
    for (int c = 0; c < 6; c++) {
        int L = cases[c][0];
        for (int t = 0; t < T; t++) d[t] = t - t % L;
        mt_attention_docs_shape sh = mt_attention_docs_shape_of(d, 1, T);
        assert_int_equal(sh.max_len, L);
        assert_int_equal(sh.n, (T + L - 1) / L);
        assert_int_equal(sh.s_max, cases[c][1]);
    }
    free(d);
}

/* Random rows: every token lies in exactly the sequence whose range holds it, and that sequence is
 * its document (same start); the offsets are the running sum of the lengths. */
static void test_random_rows_match_documents(void **state) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 77);
    for (int trial = 0; trial < 200; trial++) {
        int B = 1 + (int)(mt_test_rng_u64(&rng) % 4), T = 1 + (int)(mt_test_rng_u64(&rng) % 300);
        int32_t *d = malloc((size_t)B * T * sizeof *d);
        for (int b = 0; b < B; b++) {
            int start = 0;
            for (int t = 0; t < T; t++) {
                if (t > start && mt_test_rng_uniform(&rng) < 0.05f) start = t;
                d[b * T + t] = start;
            }
        }
        assert_int_equal(mt_docs_check(d, B, T), MT_OK);
        mt_attention_docs_shape sh = mt_attention_docs_shape_of(d, B, T);
        assert_true(sh.S >= sh.n && sh.S < 2 * sh.n + 1 && sh.s_max >= sh.max_len && sh.s_max <= T);
        int32_t *len = malloc((size_t)sh.S * sizeof *len);
        int64_t *off = malloc((size_t)(sh.S + 1) * sizeof *off);
        assert_int_equal(mt_attention_docs_layout(d, B, T, sh.S, len, off), sh.n);
        assert_int_equal(off[0], 0);
        assert_int_equal(off[sh.S], (int64_t)B * T);
        for (int i = 0; i < sh.S; i++) {
            assert_int_equal(off[i + 1], off[i] + len[i]);
            if (i >= sh.n) assert_int_equal(len[i], 0);
            else assert_true(len[i] >= 1 && len[i] <= sh.max_len);
            for (int64_t g = off[i]; g < off[i] + len[i]; g++) {
                int b = (int)(g / T), t = (int)(g % T);
                assert_int_equal(b, (int)(off[i] / T)); /* a sequence never crosses rows */
                assert_int_equal(d[g], (int)(off[i] % T)); /* its tokens are one document */
                (void)t;
            }
            if (i < sh.n && off[i] + len[i] < (int64_t)B * T && (off[i] + len[i]) % T != 0) {
                int64_t next = off[i] + len[i]; /* the next token starts another document */
                assert_int_equal(d[next], (int)(next % T));
            }
        }
        free(d), free(len), free(off);
    }
}

/* What the CUDA backend reports: the plain graph's pool need for rows of a token stream, always;
 * for packed rows the variable-length backward's (cuDNN's, the default) unless an own choice
 * keeps them on our kernels, whose need is the plain one. */
static void test_backend_pool_numbers(void **state) {
    (void)state;
    const double plain = MT_CUDA_ATTENTION_POOL_PER_ELEM, docs = MT_CUDA_ATTENTION_DOCS_POOL_PER_ELEM;
    assert_true(docs > plain);
    const struct {
        const char *attention, *docs; /* NULL: unset */
        double want_docs;
    } cases[] = {{NULL, NULL, docs},        {NULL, "auto", docs},     {NULL, "cudnn", docs},
                 {NULL, "own", plain},      {"auto", NULL, docs},     {"cudnn", NULL, docs},
                 {"own", NULL, plain},      {"own", "cudnn", plain},  {"cudnn", "own", plain}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].attention) setenv("MT_ATTENTION", cases[i].attention, 1);
        else unsetenv("MT_ATTENTION");
        if (cases[i].docs) setenv("MT_ATTENTION_DOCS", cases[i].docs, 1);
        else unsetenv("MT_ATTENTION_DOCS");
        mt_backend_memory m = mt_backend_cuda_memory();
        fprintf(stderr, "MT_ATTENTION=%s MT_ATTENTION_DOCS=%s: plain %.1f, packed %.1f B per element\n",
                cases[i].attention ? cases[i].attention : "(unset)",
                cases[i].docs ? cases[i].docs : "(unset)", m.attention_pool, m.attention_pool_docs);
        assert_true(m.attention_pool == plain);
        assert_true(m.attention_pool_docs == cases[i].want_docs);
    }
    unsetenv("MT_ATTENTION");
    unsetenv("MT_ATTENTION_DOCS");
}

/* The GiB the printed plan keeps free for the backend's pool ("X GiB of the budget kept free for
 * the backend's pool"), and whether the line says which rows it counted. */
static double printed_pool(const mt_plan *p, char *line, size_t size) {
    FILE *f = tmpfile();
    assert_non_null(f);
    mt_plan_print(p, f);
    rewind(f);
    char buf[1024];
    double gib = -1;
    line[0] = '\0';
    while (fgets(buf, sizeof buf, f)) /* size: the caller's line holds buf */
        if (strstr(buf, "kept free for the backend's pool")) {
            assert_int_equal(sscanf(buf, " %lf GiB of the budget", &gib), 1);
            snprintf(line, size, "%s", buf);
        }
    fclose(f);
    if (gib < 0) fail_msg("the plan prints no pool line");
    return gib;
}

/* The plan counts the variable-length backward's pool need exactly when the run will use it: rows
 * packing documents (the request's documents: train's packed data, plan --packed) under the
 * default choice; the plain graph's need for a token stream (the larger number would take memory
 * from the saved internals for nothing) and for packed rows kept on our kernels. The 7B at 128k
 * tokens on the H200's budget, where the pool is past the 2 GiB headroom both ways: 4.0 against
 * 7.5 GiB. */
static void test_plan_counts_docs_pool(void **state) {
    (void)state;
    mt_config cfg = mt_test_config_load("../../configs/qwen2.5-7b.json");
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    const int T = 131072;
    const double elems = (double)T * cfg.H * cfg.D, keep = 256.0 * 1024 * 1024;
    const struct {
        const char *attention, *docs;
        int documents;
        double per_elem;
    } cases[] = {{NULL, NULL, 1, MT_CUDA_ATTENTION_DOCS_POOL_PER_ELEM},
                 {NULL, NULL, 0, MT_CUDA_ATTENTION_POOL_PER_ELEM},
                 {NULL, "cudnn", 0, MT_CUDA_ATTENTION_POOL_PER_ELEM},
                 {NULL, "cudnn", 1, MT_CUDA_ATTENTION_DOCS_POOL_PER_ELEM},
                 {NULL, "own", 1, MT_CUDA_ATTENTION_POOL_PER_ELEM},
                 {"own", NULL, 1, MT_CUDA_ATTENTION_POOL_PER_ELEM}};
    double compute[2] = {0, 0}; /* the default choice's plans: token stream, packed */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].attention) setenv("MT_ATTENTION", cases[i].attention, 1);
        else unsetenv("MT_ATTENTION");
        if (cases[i].docs) setenv("MT_ATTENTION_DOCS", cases[i].docs, 1);
        else unsetenv("MT_ATTENTION_DOCS");
        mt_backend be = {.name = "cuda", .dtype = MT_BF16, .mem_budget = (int64_t)139 << 30,
                         .memory = mt_backend_cuda_memory()};
        mt_plan_request rq = {.batch = 1, .T = T, .micro_batch = MT_AUTO, .offload = MT_AUTO,
                              .saved_layers = MT_AUTO, .resident = MT_AUTO, .n_slots = 2,
                              .documents = cases[i].documents};
        mt_plan p;
        assert_int_equal(mt_plan_resolve(&t, &be, &rq, &p), MT_OK);
        assert_int_equal(mt_plan_check(&p), MT_OK);
        char line[1024];
        double got = printed_pool(&p, line, sizeof line), want = cases[i].per_elem * elems + keep;
        fprintf(stderr, "MT_ATTENTION=%s MT_ATTENTION_DOCS=%s documents %d: %s", 
                cases[i].attention ? cases[i].attention : "(unset)",
                cases[i].docs ? cases[i].docs : "(unset)", cases[i].documents, line);
        assert_true(fabs(got - want / MT_GIB) <= 0.0051);
        /* the plan leaves it free: the saved internals took only the rest */
        assert_true(p.compute_bytes + want <= (double)be.mem_budget);
        /* the line says which rows it counted where the two numbers differ */
        if (be.memory.attention_pool_docs != be.memory.attention_pool)
            assert_non_null(strstr(line, cases[i].documents ? "(packed rows; a token stream: 3.97)"
                                                            : "(a token stream; packed rows: 7.47)"));
        if (i < 2) compute[cases[i].documents] = p.compute_bytes;
    }
    /* the token stream's plan spends what packed rows keep free on saved internals */
    fprintf(stderr, "GPU: %.2f GiB for a token stream, %.2f for packed rows\n", compute[0] / MT_GIB,
            compute[1] / MT_GIB);
    assert_true(compute[0] > compute[1]);
    unsetenv("MT_ATTENTION");
    unsetenv("MT_ATTENTION_DOCS");
    mt_param_table_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_made_rows),
        cmocka_unit_test(test_one_document_a_row),
        cmocka_unit_test(test_buckets),
        cmocka_unit_test(test_random_rows_match_documents),
        cmocka_unit_test(test_backend_pool_numbers),
        cmocka_unit_test(test_plan_counts_docs_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
