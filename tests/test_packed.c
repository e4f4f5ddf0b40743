/* Packed rows: documents packed into one row must give exactly what they give one by one — the
 * same summed loss and the same gradients — because attention stays inside each document and
 * positions restart at each document. Checked for the whole-model runner and the streaming engine.
 * Metric: losses |packed - separate| <= 1e-5 relative; gradients max|err|/max|ref| <= 1e-5 per
 * tensor (fp32, only the summation order differs). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/docs.h"
#include "model/runner.h"
#include "util/testutil.h"
#include "util/tiny_config.h"

#define TOL 1e-5

static const int doc_len[] = {5, 7, 4}; /* one row of T = 16 */
#define N_DOCS 3
#define T_ROW 16

/* ids of the three documents, targets = the next token inside the document, the last ignored */
static void make_docs(int V, int32_t *ids, int32_t *targets, int32_t *doc_start) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 21);
    int t = 0;
    for (int d = 0; d < N_DOCS; d++) {
        int start = t;
        for (int i = 0; i < doc_len[d]; i++, t++) {
            ids[t] = (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)V);
            doc_start[t] = start;
        }
        for (int i = start; i < t; i++) targets[i] = i + 1 < t ? ids[i + 1] : -100;
    }
}

static void test_runner_packed_equals_separate(void **state) {
    const char *variants[] = {"llama_gqa", "qwen3_qknorm", "llama3_tied"};
    for (int v = 0; v < 3; v++) {
        mt_config cfg = mt_test_tiny_config(variants[v]);
        mt_param_table t;
        mt_param_table_init(&t, &cfg);
        float *w = mt_aligned_alloc((size_t)t.total * sizeof(float));
        mt_param_init(&t, w, 0.3f, 4);
        int32_t ids[T_ROW], tg[T_ROW], ds[T_ROW];
        make_docs(cfg.V, ids, tg, ds);
        int64_t total = 0;
        for (int i = 0; i < T_ROW; i++) total += tg[i] >= 0;
        float scale = 1.0f / (float)total;
        mt_backend *be = mt_backend_cpu_create();
        size_t n = (size_t)t.total * sizeof(float);

        /* packed: one row */
        float *g_packed = mt_aligned_alloc(n);
        memset(g_packed, 0, n);
        mt_runner r;
        mt_runner_init(&r, &t, be, 1, T_ROW);
        assert_int_equal(mt_runner_set_documents(&r, ds), MT_OK);
        int64_t count;
        double packed = mt_runner_step(&r, w, g_packed, ids, tg, 1, scale, &count);
        mt_runner_free(&r);

        /* separate: each document its own row, the gradients summed with the same scale */
        float *g_sep = mt_aligned_alloc(n);
        memset(g_sep, 0, n);
        double separate = 0;
        for (int d = 0, off = 0; d < N_DOCS; off += doc_len[d], d++) {
            mt_runner_init(&r, &t, be, 1, doc_len[d]);
            separate += mt_runner_step(&r, w, g_sep, ids + off, tg + off, 1, scale, &count);
            mt_runner_free(&r);
        }
        fprintf(stderr, "%s: summed loss packed %.8f separate %.8f\n", variants[v], packed, separate);
        assert_true(fabs(packed - separate) <= TOL * fabs(separate));
        int ok = 1;
        for (int i = 0; i < t.n_params; i++) {
            const mt_param *p = &t.params[i];
            ok &= mt_check_rel(p->name, g_packed + p->offset, g_sep + p->offset, (size_t)p->numel, TOL);
        }
        assert_true(ok);
        be->destroy(be);
        free(w), free(g_packed), free(g_sep);
        mt_param_table_free(&t);
    }
}

/* The engine on packed rows (2 rows, micro-batches of 1) matches the runner on the same rows, and
 * differs from treating each row as one document (the layout is really used). */
static void test_engine_packed(void **state) {
    mt_config cfg = mt_test_tiny_config("qwen2_bias_tied");
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    float *w = mt_aligned_alloc((size_t)t.total * sizeof(float));
    mt_param_init(&t, w, 0.3f, 6);
    int32_t ids[2 * T_ROW], tg[2 * T_ROW], ds[2 * T_ROW];
    make_docs(cfg.V, ids, tg, ds);
    make_docs(cfg.V, ids + T_ROW, tg + T_ROW, ds + T_ROW);
    for (int i = T_ROW; i < 2 * T_ROW; i++) ids[i] = (ids[i] + 7) % cfg.V;
    for (int i = T_ROW; i < 2 * T_ROW; i++)
        if (tg[i] >= 0) tg[i] = ids[i + 1];
    mt_backend *be = mt_backend_cpu_create();
    mt_runner r;
    mt_runner_init(&r, &t, be, 2, T_ROW);
    assert_int_equal(mt_runner_set_documents(&r, ds), MT_OK);
    float *g = mt_aligned_alloc((size_t)t.total * sizeof(float));
    memset(g, 0, (size_t)t.total * sizeof(float));
    int64_t count;
    double sum = mt_runner_step(&r, w, g, ids, tg, 2, 0, &count);
    double sq = 0;
    for (int64_t i = 0; i < t.total; i++) sq += (double)g[i] * g[i];
    mt_runner_free(&r);

    mt_engine_opts o = {.batch = 2, .micro_batch = 1, .T = T_ROW, .n_slots = 2, .opt_threads = 1};
    mt_adamw_hparams hp = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    mt_engine *e = mt_engine_create(&t, be, &o, w);
    assert_int_equal(mt_engine_set_documents(e, ds), MT_OK);
    mt_step_result res;
    mt_engine_step(e, ids, tg, &hp, 1, 0, &res);
    mt_engine_finish(e);
    fprintf(stderr, "runner loss %.8f norm %.8f | engine loss %.8f norm %.8f\n", sum / count, sqrt(sq),
            res.loss, res.grad_norm);
    assert_true(fabs(res.loss - sum / count) <= TOL * fabs(res.loss));
    assert_true(fabs(res.grad_norm - sqrt(sq)) <= TOL * sqrt(sq));
    mt_engine_destroy(e);

    e = mt_engine_create(&t, be, &o, w); /* the same rows as single documents */
    mt_engine_step(e, ids, tg, &hp, 1, 0, &res);
    mt_engine_finish(e);
    assert_true(fabs(res.loss - sum / count) > 1e-3 * fabs(res.loss));
    mt_engine_destroy(e);
    be->destroy(be);
    free(w), free(g);
    mt_param_table_free(&t);
}

static void test_malformed_starts(void **state) {
    int32_t ok[6] = {0, 0, 0, 3, 3, 5}, past[6] = {0, 0, 3, 3, 3, 5}, gap[6] = {0, 0, 0, 3, 0, 5},
            neg[6] = {-1, 0, 0, 0, 0, 0};
    assert_int_equal(mt_docs_check(ok, 1, 6), MT_OK);
    assert_int_equal(mt_docs_check(past, 1, 6), MT_ERR); /* a start after the token */
    assert_non_null(strstr(mt_error_message(), "position 2"));
    assert_int_equal(mt_docs_check(gap, 1, 6), MT_ERR);  /* a document that resumes */
    assert_int_equal(mt_docs_check(neg, 1, 6), MT_ERR);
    int32_t pos[6];
    mt_docs_positions(ok, 1, 6, pos);
    const int32_t want[6] = {0, 1, 2, 0, 1, 0};
    assert_memory_equal(pos, want, sizeof want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runner_packed_equals_separate),
        cmocka_unit_test(test_engine_packed),
        cmocka_unit_test(test_malformed_starts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
