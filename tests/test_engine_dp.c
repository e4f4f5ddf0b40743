/* The engine's data parallelism (engine.h, train_state.h) over the mpi comm, run by ctest as
 * `mpirun -np 2` and `-np 3` (CMakeLists.txt; every rank runs every test, in step):
 *  - each rank trains a sharded engine on its rows of a global batch (B 6, micro-batch 1: 3 or 2
 *    micro-batches per rank) and, beside it, a one-rank engine on the whole batch; for every
 *    format (full, compact, tight) and with untied and tied embeddings, 6 steps with clipping
 *    active give the same per-step losses and gradient norms and the same final weights
 *    (mt_engine_get_weights gathers them from the shards) within the tolerances stated at
 *    TOL_* below;
 *  - a rank's host state (the bytes its train_state allocated) is 1/N of the one-rank state,
 *    up to the padding of each group's shard to a multiple of 256 elements;
 *  - the per-layer overlap stays: with the optimizer slowed down, the next step's forward of
 *    layer l starts after this rank's update of layer l (and so after every rank's: its
 *    all-gather needs their shards) but before the update of the head;
 *  - the frozen state (a LoRA base, train_state.h): on one rank with a GPU tier (the cpu
 *    backend: its compute side is host memory) exactly the weights are allocated, fp32 (no
 *    gradient place, grads_on_device ignored), as mt_train_state_bytes_of counts; weights set
 *    through the io read back exactly, tensors have no parts, and the update, the tier's update
 *    and the restore leave every weight bit for bit; sharded over the ranks, the same, the
 *    collective read gathering the weights and no parts.
 * Not bitwise: a rank sums its micro-batches' gradients, the comm then sums the ranks' parts,
 * where one rank sums all micro-batches in one sequence (embedding rows hit by several
 * micro-batches, the per-shard squared norms), so the fp32 results differ in the last bits.
 * Exits 77 (skipped) in builds without MPI or when not started by mpirun with >= 2 ranks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "comm/comm.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/trace.h"
#include "engine/train_state.h"
#include "util/testutil.h"
#include "util/tiny_config.h"

#define B_ROWS 6
#define T_LEN 8
#define STEPS 6

/* Tolerances against the one-rank run, relative to the largest |value| (mt_check_rel). The
 * gradients differ by fp32 reassociation (~1e-7 relative); full's fp32 AdamW carries that into
 * weights and losses as is. compact and tight quantize: a last-bit difference can move an 8-bit
 * moment to the neighbouring code (compact, tight) or flip one stochastic bf16 rounding (tight),
 * so a few weights differ by one quantization step: 2^-8 relative to the weight for bf16. */
#define TOL_LOSS_FULL 1e-5
#define TOL_W_FULL 1e-5
#define TOL_LOSS_8BIT 1e-3
#define TOL_W_8BIT 1e-2

static mt_comm *g_comm;
static int g_rank, g_size;

static const mt_adamw_hparams hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

typedef struct {
    mt_config cfg;
    mt_param_table table;
    float *weights;
    int32_t ids[B_ROWS * T_LEN], targets[STEPS][B_ROWS * T_LEN];
} setup;

static void setup_init(setup *s, const char *variant) {
    s->cfg = mt_test_tiny_config(variant);
    mt_param_table_init(&s->table, &s->cfg);
    s->weights = mt_aligned_alloc((size_t)s->table.total * sizeof(float));
    mt_param_init(&s->table, s->weights, 0.2f, 3);
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 9);
    for (int i = 0; i < B_ROWS * T_LEN; i++) s->ids[i] = (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)s->cfg.V);
    /* other targets each step (some ignored, unevenly over the ranks' rows: the loss is the
     * mean over all ranks' targets, not the mean of the ranks' means) */
    for (int k = 0; k < STEPS; k++)
        for (int i = 0; i < B_ROWS * T_LEN; i++)
            s->targets[k][i] = (i + k) % 7 == 2 || (i < T_LEN && i % 3 == 0)
                                   ? -100
                                   : (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)s->cfg.V);
}

static void setup_free(setup *s) {
    free(s->weights);
    mt_param_table_free(&s->table);
}

static mt_engine_opts opts_of(mt_state_format f, int ranks) {
    mt_engine_opts o = {.batch = B_ROWS / ranks, .micro_batch = 1, .T = T_LEN, .n_slots = 2,
                        .opt_threads = 1, .state = f, .seed = 77, .ranks = ranks,
                        .comm = ranks > 1 ? g_comm : NULL};
    return o;
}

/* STEPS steps of the one-rank engine (whole batch) and the sharded one (this rank's rows). */
static void compare(const char *variant, mt_state_format f) {
    setup s;
    setup_init(&s, variant);
    mt_backend *be1 = mt_backend_cpu_create(), *beN = mt_backend_cpu_create();
    mt_engine_opts o1 = opts_of(f, 1), oN = opts_of(f, g_size);
    mt_engine *one = mt_engine_create(&s.table, be1, &o1, s.weights);
    mt_engine *dp = mt_engine_create(&s.table, beN, &oN, s.weights);
    size_t mine = (size_t)g_rank * (size_t)oN.batch * T_LEN;
    double loss1[STEPS], lossN[STEPS], norm1[STEPS], normN[STEPS];
    int clipped = 0;
    for (int k = 0; k < STEPS; k++) {
        mt_step_result r1, rN;
        mt_engine_step(one, s.ids, s.targets[k], &hp, k + 1, 1.0, &r1);
        mt_engine_step(dp, s.ids + mine, s.targets[k] + mine, &hp, k + 1, 1.0, &rN);
        assert_int_equal(rN.count, r1.count); /* the global count on every rank */
        assert_false(r1.skipped || rN.skipped);
        loss1[k] = r1.loss, lossN[k] = rN.loss, norm1[k] = r1.grad_norm, normN[k] = rN.grad_norm;
        clipped += r1.clip_coef < 1.0f;
    }
    assert_true(clipped > 0); /* the global norm decides the update */
    float l1[STEPS], lN[STEPS], n1[STEPS], nN[STEPS];
    for (int k = 0; k < STEPS; k++) l1[k] = (float)loss1[k], lN[k] = (float)lossN[k], n1[k] = (float)norm1[k],
                                    nN[k] = (float)normN[k];
    int eight = f != MT_STATE_FULL;
    char what[96];
    snprintf(what, sizeof what, "%s %s losses, %d ranks", variant, mt_state_format_name(f), g_size);
    assert_true(mt_check_rel(what, lN, l1, STEPS, eight ? TOL_LOSS_8BIT : TOL_LOSS_FULL));
    snprintf(what, sizeof what, "%s %s norms, %d ranks", variant, mt_state_format_name(f), g_size);
    assert_true(mt_check_rel(what, nN, n1, STEPS, eight ? TOL_LOSS_8BIT : TOL_LOSS_FULL));
    float *w1 = mt_aligned_alloc((size_t)s.table.total * sizeof(float));
    float *wN = mt_aligned_alloc((size_t)s.table.total * sizeof(float));
    mt_engine_get_weights(one, w1);
    mt_engine_get_weights(dp, wN); /* collective: every rank gathers */
    snprintf(what, sizeof what, "%s %s weights, %d ranks", variant, mt_state_format_name(f), g_size);
    assert_true(mt_check_rel(what, wN, w1, (size_t)s.table.total, eight ? TOL_W_8BIT : TOL_W_FULL));
    /* the run moved the weights well beyond the tolerance (the comparison is not of two initial
     * states) */
    double moved = mt_max_rel_err(w1, s.weights, (size_t)s.table.total);
    printf("  the weights moved by %.3g (relative)\n", moved);
    assert_true(moved > 2 * (eight ? TOL_W_8BIT : TOL_W_FULL));
    free(w1), free(wN);
    mt_engine_destroy(one);
    mt_engine_destroy(dp);
    be1->destroy(be1);
    beN->destroy(beN);
    setup_free(&s);
}

static void test_full(void **state) {
    compare("llama_gqa", MT_STATE_FULL);
    compare("llama3_tied", MT_STATE_FULL);
}

static void test_compact(void **state) {
    compare("llama_gqa", MT_STATE_COMPACT);
    compare("llama3_tied", MT_STATE_COMPACT);
}

static void test_tight(void **state) {
    compare("llama_gqa", MT_STATE_TIGHT);
    compare("llama3_tied", MT_STATE_TIGHT);
}

/* Host state per rank = 1/N of one rank's, up to a group's shard padding (< 256 elements per
 * group), on a model whose groups are large against that. */
static void test_host_bytes(void **state) {
    mt_config cfg = mt_test_tiny_config("llama_gqa");
    cfg.C = 64, cfg.F = 256, cfg.H = 8, cfg.G = 4, cfg.D = 8, cfg.V = 1024, cfg.L = 3;
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    const mt_state_format fs[] = {MT_STATE_FULL, MT_STATE_COMPACT, MT_STATE_TIGHT};
    for (int i = 0; i < 3; i++) {
        mt_backend *be = mt_backend_cpu_create();
        mt_train_state_opts o1 = {.format = fs[i]}, oN = {.format = fs[i], .ranks = g_size, .comm = g_comm};
        mt_train_state *s1 = mt_train_state_create(&t, be, &o1), *sN = mt_train_state_create(&t, be, &oN);
        double b1 = mt_train_state_host_bytes(s1), bN = mt_train_state_host_bytes(sN);
        double per = b1 / (double)t.total; /* bytes per element of this format */
        double pad = (double)(cfg.L + 2) * 256 * per;
        printf("%s: one rank %.0f bytes, each of %d ranks %.0f (1/N: %.0f, +%.2f%%)\n",
               mt_state_format_name(fs[i]), b1, g_size, bN, b1 / g_size, 100 * (bN * g_size / b1 - 1));
        assert_true(bN * g_size >= b1);
        assert_true(bN <= b1 / g_size + pad);
        assert_true(bN * g_size <= 1.05 * b1); /* the padding is small against the groups here */
        mt_train_state_free(s1);
        mt_train_state_free(sN);
        be->destroy(be);
    }
    mt_param_table_free(&t);
}

/* ---- the frozen state ---- */

/* The cpu backend's allocators, counting the bytes a train state asks of them. */
static void *(*real_alloc)(mt_backend *, size_t), *(*real_host_alloc)(mt_backend *, size_t);
static double dev_bytes, host_bytes;
static void *count_alloc(mt_backend *be, size_t bytes) {
    dev_bytes += (double)bytes;
    return real_alloc(be, bytes);
}
static void *count_host_alloc(mt_backend *be, size_t bytes) {
    host_bytes += (double)bytes;
    return real_host_alloc(be, bytes);
}

/* Every tensor's fp32 weights through the io into arena (the table's layout). */
static void io_weights(const mt_state_io *io, const mt_param_table *t, float *arena) {
    for (int i = 0; i < t->n_params; i++)
        assert_int_equal(io->get_weights(io->ctx, &t->params[i], arena + t->params[i].offset), MT_OK);
}

/* Random weights set through io (each rank the same: it keeps its shard), read back exactly;
 * no tensor has optimizer parts. */
static void frozen_io(mt_train_state *s, const mt_param_table *t, float *set, float *got) {
    const mt_state_io *io = mt_train_state_io(s);
    assert_int_equal(io->format, MT_STATE_FROZEN);
    mt_test_rng r;
    mt_test_rng_seed(&r, 5);
    mt_test_fill_normal(&r, set, (size_t)t->total, 0.5f);
    for (int i = 0; i < t->n_params; i++)
        assert_int_equal(io->set_weights(io->ctx, &t->params[i], set + t->params[i].offset), MT_OK);
    io = mt_train_state_io(s); /* a read starts over */
    io_weights(io, t, got);
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        assert_memory_equal(got + p->offset, set + p->offset, (size_t)p->numel * sizeof(float));
    }
    mt_optim_tensor parts[MT_OPTIM_MAX_TENSORS];
    for (int i = 0; i < t->n_params; i++) {
        assert_int_equal(mt_optim_parts_layout(MT_STATE_FROZEN, (size_t)t->params[i].numel, parts), 0);
        assert_int_equal(io->get_parts(io->ctx, &t->params[i], parts), MT_OK);
        assert_int_equal(io->set_parts(io->ctx, &t->params[i], parts), MT_OK);
    }
}

/* A step's updates and a skipped step's restore: no weight moves. */
static void frozen_step(mt_train_state *s, const mt_param_table *t, const float *want, float *got) {
    mt_train_state_begin_update(s);
    mt_train_state_update_tier(s, &hp, 1, 0.5f);
    for (int g = MT_GROUP_EMBED; g <= t->cfg.L; g++) mt_train_state_update_group(s, g, &hp, 1, 0.5f);
    for (int g = MT_GROUP_EMBED; g <= t->cfg.L; g++) mt_train_state_restore_group(s, g);
    io_weights(mt_train_state_io(s), t, got);
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        assert_memory_equal(got + p->offset, want + p->offset, (size_t)p->numel * sizeof(float));
    }
}

static void test_frozen_state(void **state) {
    mt_config cfg = mt_test_tiny_config("llama_gqa");
    cfg.C = 64, cfg.F = 256, cfg.H = 8, cfg.G = 4, cfg.D = 8, cfg.V = 1024, cfg.L = 3;
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    float *set = mt_aligned_alloc((size_t)t.total * sizeof(float));
    float *got = mt_aligned_alloc((size_t)t.total * sizeof(float));
    mt_backend *be = mt_backend_cpu_create();
    assert_int_equal(be->dtype, MT_F32);
    real_alloc = be->alloc, real_host_alloc = be->host_alloc;
    be->alloc = count_alloc, be->host_alloc = count_host_alloc;

    /* one rank, layers 0 and 1 in the GPU tier; grads_on_device would put compact's gradients
     * on the compute side: frozen has none to put anywhere */
    const int k = 2;
    double n_tier = (double)k * (double)t.layer_size, n_host = (double)t.total - n_tier;
    mt_train_state_opts o = {.format = MT_STATE_FROZEN, .gpu_layers = k, .grads_on_device = 1};
    mt_train_state_bytes b;
    mt_train_state_bytes_of(&t, be->dtype, &o, &b);
    assert_true(b.host_weights == 4 * n_host && b.host_total == 4 * n_host);
    assert_true(b.host_moments == 0 && b.host_upload == 0 && b.host_grads == 0);
    assert_true(b.dev_tier == 4 * n_tier && b.dev_grads == 0 && b.dev_total == 4 * n_tier);
    dev_bytes = host_bytes = 0;
    mt_train_state *s = mt_train_state_create(&t, be, &o);
    printf("frozen, %d of %d layers in the tier: host %.0f bytes (planned %.0f), compute side %.0f "
           "(planned %.0f)\n", k, cfg.L, host_bytes, b.host_total, dev_bytes, b.dev_total);
    assert_true(dev_bytes == 4 * n_tier); /* the tier's weights, no tier_grads */
    assert_true(host_bytes == 4 * n_host); /* the upload copies, no grad buffer or fetch buffers */
    assert_true(mt_train_state_host_bytes(s) == b.host_total);
    assert_int_equal(mt_train_state_upload_dtype(s), MT_F32);
    for (int g = MT_GROUP_EMBED; g <= cfg.L; g++) {
        assert_null(mt_train_state_grad_dev(s, g));
        assert_null(mt_train_state_grad_host(s, g));
        if (mt_train_state_in_tier(s, g)) assert_non_null(mt_train_state_tier_weights(s, g));
        else assert_non_null(mt_train_state_upload(s, g));
    }
    frozen_io(s, &t, set, got);
    frozen_step(s, &t, set, got);
    mt_train_state_free(s);
    /* the counting sees gradients where a format has them: tight's tier allocates its own */
    mt_train_state_opts ot = o;
    ot.format = MT_STATE_TIGHT;
    dev_bytes = 0;
    s = mt_train_state_create(&t, be, &ot);
    assert_true(dev_bytes > 4 * n_tier + 4 * n_host); /* tier arenas, widened copy, gradients */
    mt_train_state_free(s);

    /* sharded over the ranks: this rank's shard of every group, weights only */
    mt_train_state_opts on = {.format = MT_STATE_FROZEN, .ranks = g_size, .comm = g_comm};
    mt_train_state_bytes_of(&t, be->dtype, &on, &b);
    dev_bytes = host_bytes = 0;
    s = mt_train_state_create(&t, be, &on);
    double shards = 0;
    for (int g = MT_GROUP_EMBED; g <= cfg.L; g++) shards += (double)mt_train_state_shard(s, g);
    assert_true(dev_bytes == 0);
    assert_true(host_bytes == 4 * shards && mt_train_state_host_bytes(s) == 4 * shards);
    assert_true(b.host_total == 4 * shards && b.dev_total == 0);
    for (int g = MT_GROUP_EMBED; g <= cfg.L; g++) {
        assert_null(mt_train_state_grad_dev(s, g));
        assert_null(mt_train_state_grad_host(s, g));
    }
    frozen_io(s, &t, set, got); /* the reads are collective: every rank makes them */
    frozen_step(s, &t, set, got);
    mt_train_state_free(s);

    be->alloc = real_alloc, be->host_alloc = real_host_alloc;
    be->destroy(be);
    free(set), free(got);
    mt_param_table_free(&t);
}

static const mt_span *find_span(const mt_span *sp, int n, mt_span_kind kind, int step, int group) {
    mt_trace_lane lane = kind == MT_SPAN_OPTIMIZER ? MT_LANE_OPT : MT_LANE_MAIN;
    for (int i = 0; i < n; i++)
        if (sp[i].lane == lane && sp[i].kind == kind && sp[i].step == step && sp[i].group == group) return &sp[i];
    return NULL;
}

static void test_overlap(void **state) {
    setup s;
    setup_init(&s, "llama_gqa");
    mt_backend *be = mt_backend_cpu_create();
    mt_engine_opts o = opts_of(MT_STATE_FULL, g_size);
    o.trace = 1;
    mt_engine *e = mt_engine_create(&s.table, be, &o, s.weights);
    mt_optimizer_set_delay_us(mt_engine_optimizer(e), 30000);
    size_t mine = (size_t)g_rank * (size_t)o.batch * T_LEN;
    const int steps = 3;
    for (int k = 0; k < steps; k++) {
        mt_step_result r;
        mt_engine_step(e, s.ids + mine, s.targets[k] + mine, &hp, k + 1, 1.0, &r);
    }
    mt_engine_finish(e);
    int n, L = s.cfg.L, overlapped = 0;
    mt_span *sp = mt_trace_spans(mt_engine_trace(e), &n);
    for (int k = 1; k < steps; k++) {
        for (int l = 0; l < L; l++) {
            const mt_span *fwd = find_span(sp, n, MT_SPAN_FORWARD, k, l), *opt = find_span(sp, n, MT_SPAN_OPTIMIZER, k - 1, l);
            assert_non_null(fwd);
            assert_non_null(opt);
            assert_true(fwd->t0 >= opt->t1); /* never computes with stale weights */
        }
        const mt_span *fwd0 = find_span(sp, n, MT_SPAN_FORWARD, k, 0), *head = find_span(sp, n, MT_SPAN_OPTIMIZER, k - 1, L);
        assert_non_null(head);
        printf("rank %d step %d: forward of layer 0 at %.1f ms, the update of step %d ends at %.1f ms\n", g_rank, k,
               fwd0->t0 / 1e3, k - 1, head->t1 / 1e3);
        overlapped += fwd0->t0 < head->t1;
    }
    assert_int_equal(overlapped, steps - 1);
    free(sp);
    mt_engine_destroy(e);
    be->destroy(be);
    setup_free(&s);
}

int main(void) {
    if (!mt_comm_built_with_mpi()) {
        printf("test_engine_dp: skipped, the build has no MPI\n");
        return 77;
    }
    mt_comm *probe = mt_comm_create_from_env();
    int size = probe ? mt_comm_size(probe) : 1;
    if (size < 2) {
        mt_comm_destroy(probe);
        printf("test_engine_dp: skipped, not started by mpirun with 2 or more ranks\n");
        return 77;
    }
    g_comm = probe;
    g_rank = mt_comm_rank(g_comm);
    g_size = size;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_compact),
        cmocka_unit_test(test_tight),
        cmocka_unit_test(test_host_bytes),
        cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_frozen_state),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    /* a rank that failed an assertion may have left the others in a collective: end them all */
    if (failed) mt_comm_abort(g_comm, 1);
    mt_comm_destroy(g_comm);
    return 0;
}
