/* The streaming schedule is real: weight transfers per step, the optimizer overlapping the next
 * forward, the per-layer wait, and the same numbers whatever the micro-batching. Runs in the
 * ThreadSanitizer build too (the copy streams and the optimizer are threads on the CPU backend). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/runner.h"
#include "util/config_check.h"
#include "util/state_snapshot.h"
#include "util/testutil.h"
#include "util/tiny_config.h"

#define B_ROWS 4
#define T_LEN 8

typedef struct {
    mt_config cfg;
    mt_param_table table;
    float *weights;
    int32_t ids[B_ROWS * T_LEN], targets[B_ROWS * T_LEN];
} setup;

static void setup_init(setup *s, const char *variant, int layers) {
    s->cfg = mt_test_tiny_config(variant);
    s->cfg.L = layers;
    mt_param_table_init(&s->table, &s->cfg);
    s->weights = mt_aligned_alloc((size_t)s->table.total * sizeof(float));
    mt_param_init(&s->table, s->weights, 0.2f, 3);
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 9);
    for (int i = 0; i < B_ROWS * T_LEN; i++) {
        s->ids[i] = (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)s->cfg.V);
        s->targets[i] = i % 7 == 2 ? -100 : (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)s->cfg.V);
    }
}

static void setup_free(setup *s) {
    free(s->weights);
    mt_param_table_free(&s->table);
}

static const mt_adamw_hparams hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

/* Each layer crosses to the compute side exactly twice per step (forward, backward), the embed
 * and head groups once, whatever the number of micro-batches; and the step's numbers do not
 * depend on the micro-batching. */
static void test_transfers_per_step(void **state) {
    setup s;
    setup_init(&s, "llama_gqa", 3);
    double loss0 = 0, norm0 = 0;
    const int micro[] = {4, 2, 1};
    for (int k = 0; k < 3; k++) {
        for (int slots = 2; slots <= 3; slots++) {
            mt_backend *be = mt_backend_cpu_create();
            mt_engine_opts o = {.batch = B_ROWS, .micro_batch = micro[k], .T = T_LEN, .n_slots = slots, .opt_threads = 1};
            mt_engine *e = mt_engine_create(&s.table, be, &o, s.weights);
            for (int step = 0; step < 2; step++) {
                mt_step_result r;
                mt_engine_step(e, s.ids, s.targets, &hp, step + 1, 1.0, &r);
                const int *loads = mt_engine_loads(e);
                assert_int_equal(loads[0], 1);               /* embed */
                for (int l = 0; l < s.cfg.L; l++) assert_int_equal(loads[l + 1], 2);
                assert_int_equal(loads[s.cfg.L + 1], 1);      /* head */
                if (step == 0) {
                    fprintf(stderr, "micro-batch %d, %d slots: loss %.7f norm %.7f\n", micro[k], slots, r.loss, r.grad_norm);
                    if (k == 0 && slots == 2) {
                        loss0 = r.loss;
                        norm0 = r.grad_norm;
                    } else {
                        assert_true(fabs(r.loss - loss0) <= 1e-6 * fabs(loss0));
                        assert_true(fabs(r.grad_norm - norm0) <= 1e-5 * norm0);
                    }
                }
            }
            mt_engine_destroy(e);
            be->destroy(be);
        }
    }
    setup_free(&s);
}

/* The engine's step equals the plain whole-model runner: loss and global gradient norm. */
static void test_engine_matches_runner(void **state) {
    const char *variants[] = {"llama_gqa", "qwen2_bias_tied", "qwen3_qknorm"};
    for (int v = 0; v < 3; v++) {
        setup s;
        setup_init(&s, variants[v], 2);
        mt_backend *be = mt_backend_cpu_create();
        mt_runner r;
        mt_runner_init(&r, &s.table, be, B_ROWS, T_LEN);
        float *g = mt_aligned_alloc((size_t)s.table.total * sizeof(float));
        memset(g, 0, (size_t)s.table.total * sizeof(float));
        int64_t count;
        double sum = mt_runner_step(&r, s.weights, g, s.ids, s.targets, B_ROWS, 0, &count);
        double sq = 0;
        for (int64_t i = 0; i < s.table.total; i++) sq += (double)g[i] * g[i];
        mt_runner_free(&r);

        mt_engine_opts o = {.batch = B_ROWS, .micro_batch = 2, .T = T_LEN, .n_slots = 2, .opt_threads = 1};
        mt_engine *e = mt_engine_create(&s.table, be, &o, s.weights);
        mt_step_result res;
        mt_engine_step(e, s.ids, s.targets, &hp, 1, 0, &res);
        fprintf(stderr, "%s: runner loss %.7f norm %.7f | engine loss %.7f norm %.7f\n", variants[v],
                sum / count, sqrt(sq), res.loss, res.grad_norm);
        assert_int_equal(res.count, count);
        assert_true(fabs(res.loss - sum / count) <= 1e-6 * fabs(res.loss));
        assert_true(fabs(res.grad_norm - sqrt(sq)) <= 1e-5 * sqrt(sq));
        assert_true(res.clip_coef == 1.0f); /* clipping off */
        mt_engine_destroy(e);
        be->destroy(be);
        free(g);
        setup_free(&s);
    }
}

/* How the activations and weights are kept changes nothing: checkpoints in host memory (the
 * --gpu-mem path), layers keeping their internals so that the backward skips the recompute (all of
 * them, or the last one; or only their attention output, so that it skips the attention's
 * recompute), and resident weights (one load per layer per step) give the same losses,
 * norms and weights, bit for bit, over several steps, as the plain recompute-everything schedule;
 * the weights cross twice per step, once when resident, never in the GPU tier. Checkpoints of all
 * layers or of the first 1 or 2 of 3 in host memory. Also with qwen3's
 * q/k norm, whose internals are the most. For each optimizer state format. */
static void check_memory_modes(const char *variant, mt_state_format format, int L) {
    setup s;
    setup_init(&s, variant, L);
    /* the GPU tier (gpu_layers) and the gradients' place (grads_on_device) are modes too: on the
     * cpu backend the tier's update is the host kernel, so every mode gives the same bits */
    /* offload: how many of the 3 layers keep their checkpoints on the host (3: all; 1, 2: across
     * tiers) */
    /* att: layers keeping only their attention output (before the `saved` ones) */
    /* comm: a comm of one rank (the local one), so that the schedule's collectives run (the
     * data-parallel path at N = 1, as nccl on one GPU: test_cuda_dp) */
    /* upd: the host groups updated on the compute side, their state streamed through it
     * (update_on_device; compact and tight with grads_dev: with full it does not apply) */
    /* every: sparse checkpoints (2: the odd layers' inputs remade in the backward), alone and
     * with the tier (the remade layer in it), saved internals or attention, resident weights,
     * gradients on the device and the streamed update, a comm */
    enum { MODES = 28 };
    const struct { int offload, saved, resident, tier, grads_dev, att, comm, upd, every; } mode[MODES] = {
        {0, 0, 0, 0, 0, 0}, {3, 0, 0, 0, 0, 0}, {0, 3, 0, 0, 0, 0}, {0, 1, 0, 0, 0, 0},
        {0, 3, 1, 0, 0, 0}, {3, 0, 1, 0, 0, 0}, {0, 0, 0, 1, 0, 0}, {0, 0, 0, 3, 0, 0},
        {0, 0, 0, 0, 1, 0}, {3, 0, 1, 2, 1, 0}, {1, 0, 0, 0, 0, 0}, {2, 0, 1, 0, 0, 0},
        {2, 0, 0, 1, 1, 0}, {0, 0, 0, 0, 0, 3}, {0, 1, 0, 0, 0, 2}, {0, 1, 0, 1, 0, 1},
        {0, 0, 0, 0, 0, 0, 1}, {2, 0, 1, 0, 1, 0, 1}, {0, 0, 0, 0, 1, 0, 0, 1},
        {3, 0, 1, 2, 1, 0, 0, 1}, {2, 0, 0, 1, 1, 0, 0, 1},
        {0, 0, 0, 0, 0, 0, 0, 0, 2}, {0, 0, 0, 1, 0, 0, 0, 0, 2}, {0, 1, 0, 0, 0, 1, 0, 0, 2},
        {0, 2, 0, 0, 0, 0, 0, 0, 2}, {0, 3, 1, 0, 0, 0, 0, 0, 2}, {0, 0, 0, 0, 1, 0, 0, 1, 2},
        {0, 0, 0, 0, 1, 0, 1, 0, 2}};
    double loss[MODES][3], norm[MODES][3], eval[MODES];
    mt_test_snapshot snap[MODES];
    for (int k = 0; k < MODES; k++) {
        mt_backend *be = mt_backend_cpu_create();
        mt_comm *comm = mode[k].comm ? mt_comm_create_local() : NULL;
        mt_engine_opts o = {.batch = B_ROWS, .micro_batch = 2, .T = T_LEN, .n_slots = 2, .comm = comm,
                            .opt_threads = 1, .offload = mode[k].offload, .saved_layers = mode[k].saved,
                            .resident = mode[k].resident, .state = format, .gpu_layers = mode[k].tier,
                            .grads_on_device = mode[k].grads_dev, .seed = 77,
                            .saved_attention = mode[k].att, .update_on_device = mode[k].upd,
                            .checkpoint_every = mode[k].every};
        mt_engine *e = mt_engine_create(&s.table, be, &o, s.weights);
        /* the streamed update took effect where it applies (not a vacuous mode) */
        assert_int_equal(mt_train_state_updates_on_device(mt_engine_state(e)),
                         mode[k].upd && format != MT_STATE_FULL);
        for (int step = 0; step < 3; step++) {
            mt_step_result r;
            mt_engine_step(e, s.ids, s.targets, &hp, step + 1, 1.0, &r);
            loss[k][step] = r.loss;
            norm[k][step] = r.grad_norm;
            const int *loads = mt_engine_loads(e);
            for (int l = 0; l < s.cfg.L; l++)
                assert_int_equal(loads[l + 1], l < mode[k].tier ? 0 : mode[k].resident ? 1 : 2);
        }
        int64_t count;
        eval[k] = mt_engine_eval(e, s.ids, s.targets, B_ROWS, &count) / (double)count;
        fprintf(stderr, "%s L %d %s offload %d saved %d att %d resident %d tier %d grads_dev %d comm %d upd %d every %d: "
                "losses %.7f %.7f %.7f, eval %.7f\n", variant, L, mt_state_format_name(format), mode[k].offload,
                mode[k].saved, mode[k].att, mode[k].resident, mode[k].tier, mode[k].grads_dev, mode[k].comm,
                mode[k].upd, mode[k].every, loss[k][0], loss[k][1],
                loss[k][2], eval[k]);
        mt_test_snapshot_state(&snap[k], e, &s.table);
        mt_engine_destroy(e);
        mt_comm_destroy(comm);
        be->destroy(be);
    }
    assert_true(loss[0][2] < loss[0][0]); /* it trains: the comparison is not of constants */
    for (int k = 1; k < MODES; k++) {
        for (int step = 0; step < 3; step++) {
            assert_true(loss[0][step] == loss[k][step]);
            assert_true(norm[0][step] == norm[k][step]);
        }
        assert_true(eval[0] == eval[k]);
        mt_test_snapshot_equal(&snap[0], &snap[k]);
    }
    for (int k = 0; k < MODES; k++) mt_test_snapshot_free(&snap[k]);
    setup_free(&s);
}

/* mt_engine_set_weights between steps takes effect everywhere the weights live (the host
 * state, the upload copy, resident layers, the GPU tier): an engine given another engine's
 * weights before each step computes that engine's loss and gradient norm bit for bit, whatever
 * its own weights and moments were (the lock-step comparisons of tests/gpu rely on it). */
static void test_set_weights_between_steps(void **state) {
    (void)state;
    setup s;
    setup_init(&s, "qwen3_qknorm", 3);
    float *other = mt_aligned_alloc((size_t)s.table.total * sizeof(float));
    float *w = mt_aligned_alloc((size_t)s.table.total * sizeof(float));
    mt_param_init(&s.table, other, 0.2f, 4);
    const struct { int resident, tier; mt_state_format f; } mode[] = {
        {0, 0, MT_STATE_FULL}, {1, 0, MT_STATE_FULL}, {0, 2, MT_STATE_FULL}, {0, 3, MT_STATE_COMPACT},
        {1, 1, MT_STATE_TIGHT}};
    for (size_t k = 0; k < sizeof mode / sizeof mode[0]; k++) {
        mt_backend *ba = mt_backend_cpu_create(), *bb = mt_backend_cpu_create();
        mt_engine_opts o = {.batch = B_ROWS, .micro_batch = 2, .T = T_LEN, .n_slots = 2, .opt_threads = 1,
                            .resident = mode[k].resident, .gpu_layers = mode[k].tier, .state = mode[k].f,
                            .seed = 77};
        mt_engine *a = mt_engine_create(&s.table, ba, &o, s.weights);
        mt_engine *b = mt_engine_create(&s.table, bb, &o, other);
        for (int step = 0; step < 4; step++) {
            mt_step_result ra, rb;
            if (step == 1) { /* b trains a step on its own first: its moments and copies differ */
                mt_engine_step(b, s.ids, s.targets, &hp, 1, 1.0, &rb);
            }
            mt_engine_get_weights(a, w);
            mt_engine_set_weights(b, w);
            mt_engine_step(a, s.ids, s.targets, &hp, step + 1, 1.0, &ra);
            mt_engine_step(b, s.ids, s.targets, &hp, step + 1, 1.0, &rb);
            if (ra.loss != rb.loss || ra.grad_norm != rb.grad_norm)
                fail_msg("resident %d tier %d %s step %d: loss %.9g vs %.9g, norm %.9g vs %.9g after "
                         "set_weights", mode[k].resident, mode[k].tier, mt_state_format_name(mode[k].f),
                         step + 1, ra.loss, rb.loss, ra.grad_norm, rb.grad_norm);
        }
        mt_engine_destroy(a), mt_engine_destroy(b);
        ba->destroy(ba), bb->destroy(bb);
    }
    free(other), free(w);
    setup_free(&s);
}

static void test_memory_modes(void **state) {
    (void)state;
    for (int f = MT_STATE_FULL; f <= MT_STATE_TIGHT; f++) {
        check_memory_modes("qwen2_bias_tied", (mt_state_format)f, 3);
        check_memory_modes("qwen3_qknorm", (mt_state_format)f, 3);
    }
    /* an even count: the backward starts with a remade input (sparse checkpoints) */
    check_memory_modes("qwen3_qknorm", MT_STATE_TIGHT, 4);
}

/* The k-th (0-based) span of a kind, step and group on a lane. */
static const mt_span *find_span_k(const mt_span *s, int n, mt_trace_lane lane, mt_span_kind kind,
                                  int step, int group, int k) {
    for (int i = 0; i < n; i++)
        if (s[i].lane == lane && s[i].kind == kind && s[i].step == step && s[i].group == group && k-- == 0)
            return &s[i];
    return NULL;
}

static const mt_span *find_span(const mt_span *s, int n, mt_span_kind kind, int step, int group) {
    mt_trace_lane lane = kind == MT_SPAN_OPTIMIZER ? MT_LANE_OPT : MT_LANE_MAIN;
    return find_span_k(s, n, lane, kind, step, group, 0);
}

/* The streams' own timeline (what --trace shows as device time) is consistent with the schedule:
 * a layer computes after its weights arrived and after its update, its gradient leaves after its
 * backward. (How much the next load overlaps this layer depends on timing, so it is printed, not
 * asserted; with the optimizer slowed down as here, the loads wait for it.) */
static void check_device_lanes(const mt_span *sp, int n, int step, int L) {
    int overlapped = 0;
    for (int l = 0; l < L; l++) {
        const mt_span *load_f = find_span_k(sp, n, MT_LANE_DEV_H2D, MT_SPAN_LOAD, step, l, 0);
        const mt_span *load_b = find_span_k(sp, n, MT_LANE_DEV_H2D, MT_SPAN_LOAD, step, l, 1);
        const mt_span *fwd = find_span_k(sp, n, MT_LANE_DEV_COMPUTE, MT_SPAN_FORWARD, step, l, 0);
        const mt_span *bwd = find_span_k(sp, n, MT_LANE_DEV_COMPUTE, MT_SPAN_BACKWARD, step, l, 0);
        const mt_span *out = find_span_k(sp, n, MT_LANE_DEV_D2H, MT_SPAN_GRAD_OUT, step, l, 0);
        const mt_span *opt = find_span(sp, n, MT_SPAN_OPTIMIZER, step - 1, l);
        assert_non_null(load_f), assert_non_null(load_b), assert_non_null(fwd), assert_non_null(bwd);
        assert_non_null(out), assert_non_null(opt);
        assert_true(load_f->t0 <= load_f->t1 && fwd->t0 <= fwd->t1 && bwd->t0 <= bwd->t1);
        assert_true(fwd->t0 >= load_f->t1);
        assert_true(load_f->t0 >= opt->t1);
        assert_true(bwd->t0 >= load_b->t1 && bwd->t0 >= fwd->t1);
        assert_true(out->t0 >= bwd->t1);
        if (l + 1 < L) {
            const mt_span *next = find_span_k(sp, n, MT_LANE_DEV_H2D, MT_SPAN_LOAD, step, l + 1, 0);
            assert_non_null(next);
            overlapped += next->t0 < fwd->t1;
        }
    }
    fprintf(stderr, "step %d: %d of %d next-layer loads began while the layer computed\n", step,
            overlapped, L - 1);
}

/* With the optimizer slowed down, the next step's forward of layer l starts only after the
 * optimizer has updated layer l, but before it has finished the whole model: per-layer waits,
 * and real overlap. */
static void test_optimizer_overlaps_forward(void **state) {
    setup s;
    setup_init(&s, "llama_gqa", 4);
    mt_backend *be = mt_backend_cpu_create();
    mt_engine_opts o = {.batch = B_ROWS, .micro_batch = 2, .T = T_LEN, .n_slots = 2, .opt_threads = 1, .trace = 1};
    mt_engine *e = mt_engine_create(&s.table, be, &o, s.weights);
    mt_optimizer_set_delay_us(mt_engine_optimizer(e), 30000);
    const int steps = 3;
    for (int step = 0; step < steps; step++) {
        mt_step_result r;
        mt_engine_step(e, s.ids, s.targets, &hp, step + 1, 1.0, &r);
    }
    mt_engine_finish(e);
    int n;
    mt_span *sp = mt_trace_spans(mt_engine_trace(e), &n);
    int L = s.cfg.L, overlapped = 0;
    for (int step = 1; step < steps; step++) {
        for (int l = 0; l < L; l++) {
            const mt_span *fwd = find_span(sp, n, MT_SPAN_FORWARD, step, l);
            const mt_span *opt = find_span(sp, n, MT_SPAN_OPTIMIZER, step - 1, l);
            assert_non_null(fwd);
            assert_non_null(opt);
            /* never computes with stale weights */
            assert_true(fwd->t0 >= opt->t1);
        }
        const mt_span *fwd0 = find_span(sp, n, MT_SPAN_FORWARD, step, 0);
        const mt_span *opt_head = find_span(sp, n, MT_SPAN_OPTIMIZER, step - 1, L);
        assert_non_null(opt_head);
        fprintf(stderr, "step %d: forward of layer 0 starts at %.1f ms, optimizer of step %d ends at %.1f ms\n",
                step, fwd0->t0 / 1e3, step - 1, opt_head->t1 / 1e3);
        overlapped += fwd0->t0 < opt_head->t1;
        check_device_lanes(sp, n, step, L);
    }
    assert_int_equal(overlapped, steps - 1);
    free(sp);
    mt_engine_destroy(e);
    be->destroy(be);
    setup_free(&s);
}

/* The streamed update (update_on_device) keeps its staging slots busy across groups: a group is
 * done (its span ends, the next forward may read it) while the next group's state goes up, not
 * before that group starts; and still never before the forward of its layer. */
static void test_streamed_update_spans_groups(void **state) {
    (void)state;
    setup s;
    setup_init(&s, "llama_gqa", 4);
    mt_backend *be = mt_backend_cpu_create();
    mt_engine_opts o = {.batch = B_ROWS, .micro_batch = 2, .T = T_LEN, .n_slots = 2, .opt_threads = 1,
                        .trace = 1, .state = MT_STATE_COMPACT, .grads_on_device = 1,
                        .update_on_device = 1, .gpu_layers = 1};
    mt_engine *e = mt_engine_create(&s.table, be, &o, s.weights);
    assert_true(mt_train_state_updates_on_device(mt_engine_state(e)));
    mt_optimizer_set_delay_us(mt_engine_optimizer(e), 20000);
    const int steps = 3;
    for (int step = 0; step < steps; step++) {
        mt_step_result r;
        mt_engine_step(e, s.ids, s.targets, &hp, step + 1, 1.0, &r);
    }
    mt_engine_finish(e);
    int n, L = s.cfg.L, overlaps = 0;
    mt_span *sp = mt_trace_spans(mt_engine_trace(e), &n);
    for (int step = 0; step < steps; step++) {
        for (int l = -1; l < L; l++) {
            const mt_span *a = find_span(sp, n, MT_SPAN_OPTIMIZER, step, l);
            const mt_span *b = find_span(sp, n, MT_SPAN_OPTIMIZER, step, l + 1);
            assert_non_null(a);
            assert_non_null(b);
            assert_true(a->t1 <= b->t1); /* done in order */
            /* streamed groups (the embed, layers 1.. and the head: layer 0 is in the tier) */
            int streamed = l != 0 && l + 1 != 0;
            if (streamed) {
                assert_true(a->t1 > b->t0); /* done while the next group's update runs */
                overlaps++;
            }
            if (step + 1 < steps && l >= 0) { /* never a stale weight */
                const mt_span *fwd = find_span(sp, n, MT_SPAN_FORWARD, step + 1, l);
                assert_non_null(fwd);
                assert_true(fwd->t0 >= a->t1);
            }
        }
    }
    fprintf(stderr, "%d streamed groups were done while the next one's update ran\n", overlaps);
    assert_int_equal(overlaps, steps * (L - 1));
    free(sp);
    mt_engine_destroy(e);
    be->destroy(be);
    setup_free(&s);
}

/* A step whose loss is NaN applies no update: master, moments and the upload copy are bit for bit
 * what they were, and the next finite step (with the same Adam step t) gives what a run that never
 * saw the bad batch gives: the same loss, norm and state, bit for bit. The bad batch is made by a
 * NaN embedding row for one token that only it contains (llama_gqa is untied, so the row feeds
 * nothing else, and its gradient in the good batches is zero). */
static void check_nonfinite_step_skipped(mt_state_format format, int tier, int upd) {
    setup s;
    setup_init(&s, "llama_gqa", 2);
    int V = s.cfg.V, N = B_ROWS * T_LEN, bad_token = V - 1;
    const mt_param *embed = NULL;
    for (int i = 0; i < s.table.n_params; i++)
        if (s.table.params[i].kind == MT_W_EMBED) embed = &s.table.params[i];
    assert_non_null(embed);
    assert_false(s.cfg.tie_word_embeddings);
    for (int c = 0; c < s.cfg.C; c++) s.weights[embed->offset + (size_t)bad_token * s.cfg.C + c] = NAN;
    int32_t good1[B_ROWS * T_LEN], good2[B_ROWS * T_LEN], bad[B_ROWS * T_LEN];
    for (int i = 0; i < N; i++) {
        good1[i] = s.ids[i] % (V - 1);
        good2[i] = (s.ids[i] * 7 + 3) % (V - 1);
        bad[i] = i == 5 ? bad_token : good2[i];
    }
    mt_backend *be = mt_backend_cpu_create();
    /* upd: gradients waiting on the compute side and the host groups updated there, streamed */
    mt_engine_opts o = {.batch = B_ROWS, .micro_batch = 2, .T = T_LEN, .n_slots = 2, .opt_threads = 1,
                        .state = format, .gpu_layers = tier, .seed = 5, .grads_on_device = upd,
                        .update_on_device = upd};

    /* run A: good1, bad (skipped), good2 */
    mt_engine *a = mt_engine_create(&s.table, be, &o, s.weights);
    mt_step_result r1, rbad, ra;
    mt_engine_step(a, good1, s.targets, &hp, 1, 1.0, &r1);
    assert_false(r1.skipped);
    assert_true(isfinite(r1.loss) && isfinite(r1.grad_norm));
    mt_test_snapshot before, after, up_before, up_after;
    mt_test_snapshot_state(&before, a, &s.table);
    mt_test_snapshot_upload(&up_before, a, &s.table);
    mt_engine_step(a, bad, s.targets, &hp, 2, 1.0, &rbad);
    fprintf(stderr, "bad batch: loss %g norm %g skipped %d\n", rbad.loss, rbad.grad_norm, rbad.skipped);
    assert_true(rbad.skipped);
    assert_false(isfinite(rbad.loss));
    mt_test_snapshot_state(&after, a, &s.table);
    mt_test_snapshot_upload(&up_after, a, &s.table);
    mt_test_snapshot_equal(&before, &after);
    mt_test_snapshot_equal(&up_before, &up_after);
    mt_engine_step(a, good2, s.targets, &hp, 2, 1.0, &ra);
    assert_false(ra.skipped);
    mt_test_snapshot end_a;
    mt_test_snapshot_state(&end_a, a, &s.table);

    /* run B: good1, good2 */
    mt_engine *b = mt_engine_create(&s.table, be, &o, s.weights);
    mt_step_result rb;
    mt_engine_step(b, good1, s.targets, &hp, 1, 1.0, &rb);
    mt_engine_step(b, good2, s.targets, &hp, 2, 1.0, &rb);
    mt_test_snapshot end_b;
    mt_test_snapshot_state(&end_b, b, &s.table);
    fprintf(stderr, "after the skip: loss %.7f norm %.7f | never bad: loss %.7f norm %.7f\n", ra.loss,
            ra.grad_norm, rb.loss, rb.grad_norm);
    assert_true(ra.loss == rb.loss && ra.grad_norm == rb.grad_norm);
    mt_test_snapshot_equal(&end_a, &end_b);
    /* the comparison is not of an untouched state: good2's update moved the weights */
    assert_true(memcmp(end_a.data, after.data, after.bytes) != 0);

    mt_test_snapshot *all[] = {&before, &after, &up_before, &up_after, &end_a, &end_b};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mt_test_snapshot_free(all[i]);
    mt_engine_destroy(a);
    mt_engine_destroy(b);
    be->destroy(be);
    setup_free(&s);
}


/* A training run of one engine layout: `steps` steps of a fixed batch from the same weights. */
typedef struct {
    int chunk, saved, tier;
} tiled_mode;

typedef struct {
    const mt_param_table *table;
    const float *weights;
    const int32_t *ids, *targets;
    int batch, micro_batch, T, steps;
    const mt_adamw_hparams *hp;
    const char *name;
} tiled_run;

/* Trains run r in each of the n modes (mode 0 the reference) and checks every other against it:
 * each step's loss within 1e-5 and gradient norm within 1e-4 (relative), and the weights at the
 * end within 1e-4 of the largest. */
static void expect_tiled_match(const tiled_run *r, const tiled_mode *mode, int n) {
    double loss[4][3], norm[4][3];
    float *w[4];
    assert_true(n <= 4 && r->steps <= 3);
    for (int k = 0; k < n; k++) {
        mt_backend *be = mt_backend_cpu_create();
        mt_engine_opts o = {.batch = r->batch, .micro_batch = r->micro_batch, .T = r->T, .n_slots = 2,
                            .opt_threads = 1, .mlp_chunk = mode[k].chunk,
                            .saved_layers = mode[k].saved, .gpu_layers = mode[k].tier,
                            .state = MT_STATE_FULL};
        mt_engine *e = mt_engine_create(r->table, be, &o, r->weights);
        for (int step = 0; step < r->steps; step++) {
            mt_step_result res;
            mt_engine_step(e, r->ids, r->targets, r->hp, step + 1, 1.0, &res);
            loss[k][step] = res.loss;
            norm[k][step] = res.grad_norm;
        }
        w[k] = malloc((size_t)r->table->total * sizeof(float));
        mt_engine_get_weights(e, w[k]);
        fprintf(stderr, "%s mlp_chunk %d saved %d tier %d: losses", r->name, mode[k].chunk,
                mode[k].saved, mode[k].tier);
        for (int step = 0; step < r->steps; step++) fprintf(stderr, " %.8f", loss[k][step]);
        fprintf(stderr, ", norms");
        for (int step = 0; step < r->steps; step++) fprintf(stderr, " %.6f", norm[k][step]);
        fprintf(stderr, "\n");
        mt_engine_destroy(e);
        be->destroy(be);
    }
    assert_true(loss[0][r->steps - 1] < loss[0][0]); /* it trains */
    for (int k = 1; k < n; k++) {
        for (int step = 0; step < r->steps; step++) {
            assert_true(fabs(loss[k][step] - loss[0][step]) <= 1e-5 * loss[0][step]);
            assert_true(fabs(norm[k][step] - norm[0][step]) <= 1e-4 * norm[0][step]);
        }
        double dmax = 0, wmax = 0;
        for (int64_t i = 0; i < r->table->total; i++) {
            dmax = fmax(dmax, fabs((double)w[k][i] - w[0][i]));
            wmax = fmax(wmax, fabs(w[0][i]));
        }
        fprintf(stderr, "  weights: max |tiled - untiled| %.3g of max |w| %.3g\n", dmax, wmax);
        assert_true(dmax <= 1e-4 * wmax);
    }
    for (int k = 0; k < n; k++) free(w[k]);
}

/* The layer tiled over token chunks (the long-context plan): the same training as untiled within a
 * few fp32 ulp (BLAS blocks rows by the GEMM's row count, so a chunk's rows may round differently;
 * tests/test_layer_tiling.c), with and without saved internals and the GPU tier. In full state:
 * the 8-bit formats turn an ulp into a whole quantization step now and then (a moment on a code
 * boundary), which is the formats' noise, not the tiling's (the ASan build, whose own ops round
 * differently, moved one weight of a compact run by 3.7e-4). */
static void test_mlp_tiled_engine(void **state) {
    (void)state;
    setup s;
    setup_init(&s, "qwen3_qknorm", 3);
    const tiled_mode mode[4] = {{0, 0, 0}, {5, 0, 0}, {3, 2, 0}, {7, 0, 1}};
    tiled_run r = {&s.table, s.weights, s.ids, s.targets, B_ROWS, 2, T_LEN, 3, &hp, "qwen3"};
    expect_tiled_match(&r, mode, 4);
    setup_free(&s);
}

/* Qwen3.5's Gated DeltaNet layers tiled (qwen3_5_dense's config, random init, 2 rows of 150
 * tokens a micro-batch of 1): the mixer runs each row in spans of the chunk (64, 100 tokens: 3 and
 * 2 spans), its state carried between them, with and without saved internals and the GPU tier.
 * The same training as untiled within what test_mlp_tiled_engine allows. Its eps is 1e-4, not
 * 1e-8: the DeltaNet's tiled gradients differ from the untiled ones by up to ~1e-5 of each
 * tensor's largest (the state crosses spans in fp32, which the CPU op otherwise carries in
 * double, and the delta rule's triangular inverse amplifies it: test_layer_tiling), and with eps
 * 1e-8 AdamW's first steps move an element whose gradient is ~1e-8 by lr times a ratio those
 * differences change by 10% (measured: 1.3e-3 apart after one step, the step-2 norm 1.2e-4). */
static const mt_adamw_hparams hp_eps = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-4,
                                        .weight_decay = 0.1};
static void test_deltanet_tiled_engine(void **state) {
    (void)state;
    enum { B = 2, T = 150 };
    mt_config cfg = mt_test_config_load("qwen3_5_dense/config.json");
    mt_param_table table;
    mt_param_table_init(&table, &cfg);
    float *weights = mt_aligned_alloc((size_t)table.total * sizeof(float));
    mt_param_init(&table, weights, 0.2f, 3);
    int32_t ids[B * T], targets[B * T];
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 19);
    for (int i = 0; i < B * T; i++) {
        ids[i] = (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)cfg.V);
        targets[i] = (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)cfg.V);
    }
    const tiled_mode mode[4] = {{0, 0, 0}, {64, 0, 0}, {100, 2, 0}, {64, 0, 1}};
    tiled_run r = {&table, weights, ids, targets, B, 1, T, 2, &hp_eps, "qwen3_5"};
    expect_tiled_match(&r, mode, 4);
    free(weights);
    mt_param_table_free(&table);
}

static void test_nonfinite_step_skipped(void **state) {
    (void)state;
    for (int f = MT_STATE_FULL; f <= MT_STATE_TIGHT; f++) {
        check_nonfinite_step_skipped((mt_state_format)f, 0, 0);
        check_nonfinite_step_skipped((mt_state_format)f, 1, 0);
        if (f != MT_STATE_FULL) check_nonfinite_step_skipped((mt_state_format)f, 0, 1);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transfers_per_step),
        cmocka_unit_test(test_engine_matches_runner),
        cmocka_unit_test(test_optimizer_overlaps_forward),
        cmocka_unit_test(test_streamed_update_spans_groups),
        cmocka_unit_test(test_memory_modes),
        cmocka_unit_test(test_set_weights_between_steps),
        cmocka_unit_test(test_nonfinite_step_skipped),
        cmocka_unit_test(test_mlp_tiled_engine), cmocka_unit_test(test_deltanet_tiled_engine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
