/* Long context on the CPU, at the longest row CI affords (T = 4096, a few seconds on 2 cores): the
 * tiny model trained on one row of packed documents, with the layer tiled over token chunks and the
 * checkpoints offloaded to host memory (the 512k plan's two devices) against neither.
 *   - offloading moves where the layer inputs wait, not what is computed: bitwise the same losses,
 *     gradient norms and state, untiled and tiled, with every layer's checkpoint or the first one's
 *     in host memory;
 *   - tiling (chunks of 1000 tokens: not a divisor of T, so a short last chunk) regroups the GEMMs'
 *     rows and the weight gradients' sums over tokens: within test_mlp_tiled_engine's tolerance
 *     (tests/test_engine.c, which runs the same at T = 8 across saved internals and the tier; the
 *     few-ulp reason is in tests/test_layer_tiling.c): loss 1e-5 and norm 1e-4 relative, weights
 *     1e-4 of their largest.
 * The documents (1500, 37, 2000 and 559 tokens) keep attention and RoPE positions inside each. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "util/state_snapshot.h"
#include "util/testutil.h"
#include "util/tiny_config.h"

#define T_LONG 4096
#define STEPS 2
#define CHUNK 1000

static const mt_adamw_hparams hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

typedef struct {
    double loss[STEPS], norm[STEPS];
    mt_test_snapshot snap;
    float *w;
} run_result;

static void run(const mt_param_table *t, const float *weights, const int32_t *ids, const int32_t *targets,
                const int32_t *doc_start, int chunk, int offload, run_result *out) {
    mt_backend *be = mt_backend_cpu_create();
    mt_engine_opts o = {.batch = 1, .micro_batch = 1, .T = T_LONG, .n_slots = 2, .opt_threads = 1,
                        .mlp_chunk = chunk, .offload = offload, .state = MT_STATE_FULL};
    mt_engine *e = mt_engine_create(t, be, &o, weights);
    assert_int_equal(mt_engine_set_documents(e, doc_start), MT_OK);
    for (int step = 0; step < STEPS; step++) {
        mt_step_result r;
        mt_engine_step(e, ids, targets, &hp, step + 1, 1.0, &r);
        out->loss[step] = r.loss;
        out->norm[step] = r.grad_norm;
    }
    fprintf(stderr, "T %d chunk %d offload %d: losses %.8f %.8f, norms %.6f %.6f\n", T_LONG, chunk, offload,
            out->loss[0], out->loss[1], out->norm[0], out->norm[1]);
    mt_test_snapshot_state(&out->snap, e, t);
    out->w = malloc((size_t)t->total * sizeof(float));
    mt_engine_get_weights(e, out->w);
    mt_engine_destroy(e);
    be->destroy(be);
}

static void assert_bitwise(const run_result *a, const run_result *b) {
    for (int s = 0; s < STEPS; s++) {
        assert_true(a->loss[s] == b->loss[s]);
        assert_true(a->norm[s] == b->norm[s]);
    }
    mt_test_snapshot_equal(&a->snap, &b->snap);
}

static void assert_close(const run_result *ref, const run_result *got, int64_t n) {
    for (int s = 0; s < STEPS; s++) {
        assert_true(fabs(got->loss[s] - ref->loss[s]) <= 1e-5 * ref->loss[s]);
        assert_true(fabs(got->norm[s] - ref->norm[s]) <= 1e-4 * ref->norm[s]);
    }
    double dmax = 0, wmax = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got->w[i] - ref->w[i]);
        if (d > dmax) dmax = d;
        if (fabs(ref->w[i]) > wmax) wmax = fabs(ref->w[i]);
    }
    fprintf(stderr, "  tiled vs untiled weights: max |diff| %.3g of max |w| %.3g (%.1f%% of the tolerance)\n", dmax,
            wmax, 100 * dmax / (1e-4 * wmax));
    assert_true(dmax <= 1e-4 * wmax);
}

static void test_long_row_tiled_offloaded(void **state) {
    (void)state;
    mt_config cfg = mt_test_tiny_config("qwen2_bias_tied");
    cfg.max_position_embeddings = T_LONG;
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    float *weights = mt_aligned_alloc((size_t)t.total * sizeof(float));
    mt_param_init(&t, weights, 0.2f, 3);
    int32_t *ids = malloc(T_LONG * sizeof(int32_t)), *targets = malloc(T_LONG * sizeof(int32_t)),
            *doc_start = malloc(T_LONG * sizeof(int32_t));
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 11);
    const int docs[4] = {1500, 37, 2000, 559};
    for (int d = 0, t0 = 0; d < 4; t0 += docs[d], d++)
        for (int i = t0; i < t0 + docs[d]; i++) doc_start[i] = t0;
    for (int i = 0; i < T_LONG; i++) {
        ids[i] = (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)cfg.V);
        /* a document's last token predicts nothing across the boundary */
        targets[i] = i + 1 < T_LONG && doc_start[i + 1] == doc_start[i] ? (int32_t)((ids[i] * 7 + 3) % cfg.V) : -100;
    }
    enum { MODES = 5 };
    const struct { int chunk, offload; } mode[MODES] = {
        {0, 0}, {0, 2}, {CHUNK, 0}, {CHUNK, 1}, {CHUNK, 2}};
    run_result r[MODES];
    for (int k = 0; k < MODES; k++) run(&t, weights, ids, targets, doc_start, mode[k].chunk, mode[k].offload, &r[k]);
    assert_true(r[0].loss[1] < r[0].loss[0]); /* it trains */
    assert_bitwise(&r[0], &r[1]); /* offloaded, untiled */
    assert_bitwise(&r[2], &r[3]); /* offloaded across tiers, tiled */
    assert_bitwise(&r[2], &r[4]); /* all offloaded, tiled */
    assert_close(&r[0], &r[2], t.total);
    for (int k = 0; k < MODES; k++) {
        mt_test_snapshot_free(&r[k].snap);
        free(r[k].w);
    }
    free(ids), free(targets), free(doc_start), free(weights);
    mt_param_table_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_long_row_tiled_offloaded)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
