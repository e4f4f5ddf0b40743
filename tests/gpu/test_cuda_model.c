/* The CUDA backend against the CPU backend on whole models: logits, loss and every parameter
 * gradient of tiny models of each variant and of a small one (bf16 compute vs fp32 reference, both
 * from the same bf16-rounded weights), then 50 training steps whose loss curve must track the CPU
 * run. Exits 77 (skipped) without a GPU.
 * Metrics (bf16 activations, fp32 accumulation): per tensor the relative L2 error
 * ||got - ref|| / ||ref|| <= 2e-2 for logits and loss, <= 3e-2 for every gradient; the max-based
 * max|got-ref|/max|ref| is printed beside it but not asserted: attention-side bias gradients are
 * sums with heavy cancellation (softmax is shift-invariant) whose max element is small, so ordinary
 * bf16 noise shows as 5-10% of it (first H200 run; an emulation of the attention kernel confirms
 * that this is rounding, not a fault). Training, 50 steps: see test_training_tracks_cpu. Packed
 * rows through cuDNN's variable-length attention against ours: test_docs_cudnn_tracks_own (12
 * training steps each) and test_docs_cudnn_lockstep (each step at the same weights). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/attention_cudnn.h"
#include "core/error.h"
#include "engine/engine.h"
#include "io/model_io.h"
#include "model/runner.h"
#include "util/config_check.h"
#include "util/dev_buffers.h"
#include "util/fixture_io.h"
#include "util/host_buffers.h"
#include "util/nudge.h"
#include "util/state_snapshot.h"
#include "util/testutil.h"
#include "util/tiny_config.h"

#define LOGIT_TOL 2e-2
#define GRAD_TOL 3e-2
#define STEP_TOL 15e-2
#define QWEN_NUDGES 4 /* nudged CPU runs a qwen3_5 case (compare_model_ok) */

static mt_backend *cpu, *gpu;

/* Weights rounded to bf16 so both backends see the same values. */
static float *bf16_weights(const mt_param_table *t, float std, uint64_t seed) {
    float *w = mt_aligned_alloc((size_t)t->total * sizeof(float));
    mt_param_init(t, w, std, seed);
    mt_test_round_bf16(w, (size_t)t->total);
    return w;
}

static double rel_l2(const float *got, const float *ref, size_t n) {
    double e = 0, r = 0;
    for (size_t j = 0; j < n; j++) {
        double d = (double)got[j] - ref[j];
        e += d * d, r += (double)ref[j] * ref[j];
    }
    return r > 0 ? sqrt(e / r) : sqrt(e);
}

/* The CPU reference of cfg at weights w: logits (N x V), the loss, every gradient (zeroed first). */
static double cpu_reference(const mt_param_table *t, const float *w, const int32_t *ids, const int32_t *tg,
                            int B, int T, float *logits, float *g) {
    mt_runner rc;
    mt_runner_init(&rc, t, cpu, B, T);
    mt_runner_logits(&rc, w, ids, B, logits);
    memset(g, 0, (size_t)t->total * sizeof(float));
    int64_t count;
    double loss = mt_runner_step(&rc, w, g, ids, tg, B, 0, &count) / count;
    mt_runner_free(&rc);
    return loss;
}

/* 1 when CUDA matches the CPU on cfg, 0 after printing what differs. With nudges = 0 the bounds are
 * the fixed ones above. With nudges > 0 each tensor's bound is also at least its envelope: the
 * largest relative L2 distance from the reference of `nudges` CPU runs on weights nudged by 4 bf16
 * steps (4/512 relative), as test_cuda_moe bounds its fixtures. The Qwen3.5 models need it: their
 * logits and gradients are far more sensitive to bf16-sized changes than the Llama family's
 * (transformers itself under bf16 autocast moves the tiny qwen3_5 fixtures' logits 5-15% and every
 * gradient past 3e-2, tests/fixtures/bf16_sensitivity.py, bench/RESULTS.md session 11), so a fixed
 * 3e-2 fails on rounding alone (session 9's runs: up to 0.31 on 4-value A_log / dt_bias gradients,
 * sums over every token whose terms cancel). A kernel error still fails: it moves a tensor past the
 * distance that rounding-sized changes of every weight move it. */
static int compare_weights_ok(const mt_param_table *tp, const float *w, int B, int T, int nudges,
                              const char *label) {
    mt_param_table t = *tp;
    mt_config cfg = t.cfg;
    fprintf(stderr, "--- %s (C %d, L %d, V %d, B %d, T %d%s)\n", label, cfg.C, cfg.L, cfg.V, B, T,
            nudges ? ", bounds at least the nudged CPU runs' envelope" : "");
    int N = B * T;
    int32_t *ids = malloc((size_t)N * sizeof(int32_t)), *tg = malloc((size_t)N * sizeof(int32_t));
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 17);
    for (int i = 0; i < N; i++) {
        ids[i] = (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)cfg.V);
        tg[i] = i % 11 == 4 ? -100 : (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)cfg.V);
    }
    size_t n = (size_t)t.total, nl = (size_t)N * cfg.V;
    float *logits_ref = malloc(nl * sizeof(float)), *g_ref = mt_aligned_alloc(n * sizeof(float));
    double loss_ref = cpu_reference(&t, w, ids, tg, B, T, logits_ref, g_ref);
    /* envelope[0] the logits', [1] the loss's, [2 + i] parameter i's gradient's */
    double *envelope = calloc((size_t)t.n_params + 2, sizeof(double));
    if (nudges > 0) {
        float *logits_n = malloc(nl * sizeof(float)), *g_n = mt_aligned_alloc(n * sizeof(float));
        for (int k = 0; k < nudges; k++) {
            float *p = mt_test_nudged(&t, w, 91 + (uint64_t)k, 4.0 / 512);
            double loss_n = cpu_reference(&t, p, ids, tg, B, T, logits_n, g_n);
            double e[2] = {rel_l2(logits_n, logits_ref, nl), fabs(loss_n - loss_ref) / fabs(loss_ref)};
            for (int i = 0; i < 2; i++) envelope[i] = fmax(envelope[i], e[i]);
            for (int i = 0; i < t.n_params; i++) {
                const mt_param *q = &t.params[i];
                double d = rel_l2(g_n + q->offset, g_ref + q->offset, (size_t)q->numel);
                if (!(d <= envelope[2 + i])) envelope[2 + i] = d; /* NaN sticks */
            }
            free(p);
        }
        free(logits_n), free(g_n);
    }
    /* CUDA */
    mt_runner rg;
    mt_runner_init(&rg, &t, gpu, B, T);
    void *wd = mt_test_up_bf(gpu, w, n);
    float *logits = malloc(nl * sizeof(float));
    mt_runner_logits(&rg, wd, ids, B, logits);
    float *gd = gpu->alloc(gpu, n * sizeof(float));
    gpu->zero(gpu, gd, n * sizeof(float));
    int64_t count;
    double loss = mt_runner_step(&rg, wd, gd, ids, tg, B, 0, &count) / count;
    float *g = malloc(n * sizeof(float));
    gpu->download(gpu, g, gd, n * sizeof(float));
    mt_runner_free(&rg);

    char name[192];
    snprintf(name, sizeof name, "logits (nudged cpu %.3g)", envelope[0]);
    int ok = mt_check_rel_l2(name, logits, logits_ref, nl, fmax(LOGIT_TOL, envelope[0]));
    float lf = (float)loss, lr = (float)loss_ref;
    snprintf(name, sizeof name, "loss (nudged cpu %.3g)", envelope[1]);
    ok &= mt_check_rel_l2(name, &lf, &lr, 1, fmax(LOGIT_TOL, envelope[1]));
    for (int i = 0; i < t.n_params; i++) {
        const mt_param *p = &t.params[i];
        snprintf(name, sizeof name, "grad %s (nudged cpu %.3g)", p->name, envelope[2 + i]);
        ok &= mt_check_rel_l2(name, g + p->offset, g_ref + p->offset, (size_t)p->numel, fmax(GRAD_TOL, envelope[2 + i]));
    }
    gpu->free(gpu, wd);
    gpu->free(gpu, gd);
    free(ids), free(tg), free(logits_ref), free(logits), free(g_ref), free(g), free(envelope);
    return ok;
}

static int compare_model_ok(mt_config cfg, int B, int T, int nudges, const char *label) {
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    /* std 0.02 as real checkpoints: larger weights saturate the softmax of the C=512 model
     * (scores ~40) and make the comparison measure argmax flips instead of the backend */
    float *w = bf16_weights(&t, cfg.C >= 256 ? 0.02f : 0.1f, 5);
    int ok = compare_weights_ok(&t, w, B, T, nudges, label);
    free(w);
    mt_param_table_free(&t);
    return ok;
}

static void compare_model(mt_config cfg, int B, int T, const char *label) {
    if (!compare_model_ok(cfg, B, T, 0, label)) fail_msg("%s: CUDA differs from the CPU reference (see above)", label);
}

static void test_tiny_variants(void **state) {
    const char *variants[] = {"llama_gqa", "llama3_tied", "llama_bias", "qwen2_bias_tied", "qwen3_qknorm", "mistral"};
    for (int i = 0; i < 6; i++) compare_model(mt_test_tiny_config(variants[i]), 2, 16, variants[i]);
}

/* Qwen3.5: Gated DeltaNet and gated attention layers with partial RoPE and (1 + w) norms, and the
 * MoE with its gated shared expert; the fixtures' shapes (T 80: two chunks of the delta rule, the
 * second partial) and one with the real head sizes (Dk = Dv = 128, D 256). */
static mt_config fixture_config(const char *name) { return mt_test_config_load("%s/config.json", name); }

static void test_qwen3_5_models(void **state) {
    int ok = 1; /* every case runs and prints, then the test fails if one differed */
    ok &= compare_model_ok(fixture_config("qwen3_5_dense"), 2, 80, QWEN_NUDGES, "qwen3_5_dense");
    ok &= compare_model_ok(fixture_config("qwen3_5_layers_tied"), 2, 80, QWEN_NUDGES, "qwen3_5_layers_tied");
    ok &= compare_model_ok(fixture_config("qwen3_5_moe"), 2, 80, QWEN_NUDGES, "qwen3_5_moe");
    mt_config c = fixture_config("qwen3_5_dense");
    c.C = 512; c.F = 1024; c.H = 4; c.G = 1; c.D = 256; c.rotary_dim = 64; c.V = 1000;
    c.lin_Hk = 2; c.lin_Hv = 4; c.lin_Dk = 128; c.lin_Dv = 128;
    ok &= compare_model_ok(c, 1, 300, QWEN_NUDGES, "qwen3_5 head sizes of the real models");
    /* the same with one kind of mixer: which one differs */
    mt_config only_attn = c, only_delta = c, tiny_attn = fixture_config("qwen3_5_dense");
    memset(only_attn.deltanet, 0, sizeof only_attn.deltanet);
    memset(only_delta.deltanet, 0xff, sizeof only_delta.deltanet);
    memset(tiny_attn.deltanet, 0, sizeof tiny_attn.deltanet);
    ok &= compare_model_ok(only_attn, 1, 300, QWEN_NUDGES, "qwen3_5 real head sizes, gated attention only");
    ok &= compare_model_ok(only_delta, 1, 300, QWEN_NUDGES, "qwen3_5 real head sizes, Gated DeltaNet only");
    ok &= compare_model_ok(tiny_attn, 2, 80, QWEN_NUDGES, "qwen3_5_dense's shape, gated attention only");
    if (!ok) fail_msg("a qwen3_5 model differs between CUDA and the CPU (see above)");
}

/* A small model with realistic head dims (D 64 and 128 reach the fast attention kernels). */
static mt_config small_config(int D) {
    mt_config c = mt_test_tiny_config("qwen2_bias_tied");
    c.C = 512; c.F = 1408; c.L = 2; c.H = 8; c.G = 2; c.D = D; c.V = 1000;
    c.max_position_embeddings = 4096;
    return c;
}

static void test_small_models(void **state) {
    compare_model(small_config(64), 2, 256, "small D=64");
    compare_model(small_config(128), 1, 512, "small D=128");
}

static double *train_curve_with(mt_backend *be, const mt_param_table *t, const float *w, int steps,
                                int offload, int saved_layers, int resident, int every, double *norms) {
    const int B = 4, T = 64;
    mt_engine_opts o = {.batch = B, .micro_batch = 2, .T = T, .n_slots = 2, .opt_threads = 2,
                        .offload = offload, .saved_layers = saved_layers, .resident = resident,
                        .checkpoint_every = every};
    mt_engine *e = mt_engine_create(t, be, &o, w);
    int32_t ids[B * T], tg[B * T];
    double *curve = malloc((size_t)steps * sizeof(double));
    mt_adamw_hparams hp = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    for (int s = 0; s < steps; s++) {
        mt_test_stream_rows(ids, tg, B, T, t->cfg.V, s);
        mt_step_result res;
        mt_engine_step(e, ids, tg, &hp, s + 1, 1.0, &res);
        curve[s] = res.loss;
        if (norms) norms[s] = res.grad_norm;
    }
    mt_engine_destroy(e);
    return curve;
}


/* Offloaded checkpoints and saved internals (no recompute) compute the same thing on the GPU as
 * the plain schedule. Bitwise on the CPU backend (test_engine); here the attention backward adds
 * dQ with atomics, so the order of fp32 additions may differ run to run: per step the loss must
 * agree within 1e-3 and the gradient norm within 1e-2 relative (a wrong or stale internal shows
 * as a different loss from step 2 on, far above that). */
#define MODE_LOSS_TOL 1e-3
#define MODE_NORM_TOL 1e-2
static void test_memory_modes_agree(void **state) {
    mt_config cfg = small_config(64);
    cfg.V = 256;
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    float *w = bf16_weights(&t, 0.02f, 8);
    const int steps = 6;
    /* offload: layers whose checkpoints go to the host (cfg.L: all; 1: across tiers); every 2:
     * sparse checkpoints (layer 1's input remade in the backward), alone, with the last layer's
     * internals saved, with every layer's saved and resident weights */
    const struct { int offload, saved, resident, every; } mode[] = {
        {0, 0, 0}, {cfg.L, 0, 0}, {0, 2, 0}, {0, 1, 0}, {0, 2, 1}, {1, 0, 0},
        {0, 0, 0, 2}, {0, 1, 0, 2}, {0, 2, 1, 2}};
    double norm0[6], norm[6];
    double *ref = train_curve_with(gpu, &t, w, steps, 0, 0, 0, 1, norm0);
    int ok = 1;
    for (int k = 1; k < (int)(sizeof mode / sizeof mode[0]); k++) {
        double *got = train_curve_with(gpu, &t, w, steps, mode[k].offload, mode[k].saved,
                                       mode[k].resident, mode[k].every, norm);
        for (int s = 0; s < steps; s++) {
            double dl = fabs(got[s] - ref[s]) / ref[s], dn = fabs(norm[s] - norm0[s]) / norm0[s];
            int good = dl <= MODE_LOSS_TOL && dn <= MODE_NORM_TOL;
            fprintf(stderr, "offload %d saved %d resident %d every %d step %d: loss %.6f vs %.6f (rel %.2g), norm "
                    "%.5f vs %.5f (rel %.2g)%s\n", mode[k].offload, mode[k].saved, mode[k].resident, mode[k].every,
                    s + 1, got[s], ref[s], dl, norm[s],
                    norm0[s], dn, good ? "" : "  FAIL");
            ok &= good;
        }
        free(got);
    }
    assert_true(ref[1] != ref[0]); /* the weights change: the modes are compared on a moving run */
    free(ref), free(w);
    mt_param_table_free(&t);
    if (!ok) fail_msg("a memory mode changes the training on the GPU");
}

/* A step whose loss is NaN applies no update on the GPU path either: master, moments and the bf16
 * upload copy are bit for bit what they were (the skipped update rewrites the upload copy, which
 * held the gradients, from the master), and training goes on with finite steps. The bad batch
 * reads one token whose (untied) embedding row is NaN. */
static void check_nonfinite_step_skipped(mt_state_format format, int tier, int upd) {
    mt_config cfg = small_config(64);
    cfg.V = 256;
    cfg.tie_word_embeddings = 0;
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    float *w = bf16_weights(&t, 0.02f, 8);
    const int B = 4, T = 64, bad_token = 255;
    for (int i = 0; i < t.n_params; i++)
        if (t.params[i].kind == MT_W_EMBED)
            for (int c = 0; c < cfg.C; c++) w[t.params[i].offset + (int64_t)bad_token * cfg.C + c] = NAN;
    mt_engine_opts o = {.batch = B, .micro_batch = 2, .T = T, .n_slots = 2, .opt_threads = 2,
                        .state = format, .gpu_layers = tier, .grads_on_device = 1, .seed = 3,
                        .update_on_device = upd};
    mt_engine *e = mt_engine_create(&t, gpu, &o, w);
    fprintf(stderr, "state %s, GPU tier %d layers, update on the GPU %d\n", mt_state_format_name(format),
            tier, upd);
    int32_t ids[4 * 64], tg[4 * 64];
    for (int i = 0; i < B * T; i++) ids[i] = (i * 7 + 3) % bad_token, tg[i] = (i * 5 + 1) % bad_token;
    mt_adamw_hparams hp = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    mt_step_result r;
    mt_engine_step(e, ids, tg, &hp, 1, 1.0, &r);
    assert_false(r.skipped);
    assert_true(isfinite(r.loss) && isfinite(r.grad_norm));
    mt_test_snapshot before, up_before, after, up_after;
    mt_test_snapshot_state(&before, e, &t);
    mt_test_snapshot_upload(&up_before, e, &t);
    ids[17] = bad_token;
    mt_engine_step(e, ids, tg, &hp, 2, 1.0, &r);
    fprintf(stderr, "bad batch on the GPU: loss %g norm %g skipped %d\n", r.loss, r.grad_norm, r.skipped);
    assert_true(r.skipped);
    mt_test_snapshot_state(&after, e, &t);
    mt_test_snapshot_upload(&up_after, e, &t);
    mt_test_snapshot_equal(&before, &after);
    mt_test_snapshot_equal(&up_before, &up_after);
    mt_test_snapshot *all[] = {&before, &after, &up_before, &up_after};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mt_test_snapshot_free(all[i]);
    ids[17] = 3;
    double first = 0;
    for (int s = 0; s < 4; s++) { /* finite again, and still learning (not monotone step by step on
                                     the H200: 4.60, 4.06, 4.09 — Adam on one repeated batch) */
        mt_engine_step(e, ids, tg, &hp, 2 + s, 1.0, &r);
        fprintf(stderr, "after the skip, step %d: loss %.6f norm %.5f\n", s + 1, r.loss, r.grad_norm);
        assert_false(r.skipped);
        assert_true(isfinite(r.loss) && isfinite(r.grad_norm));
        if (!s) first = r.loss;
    }
    assert_true(r.loss < first);
    mt_engine_destroy(e);
    free(w);
    mt_param_table_free(&t);
}

/* Per optimizer format, with and without layers in the GPU tier (there the update runs in the
 * backend's optim_update). */
static void test_nonfinite_step_skipped(void **state) {
    (void)state;
    for (int f = MT_STATE_FULL; f <= MT_STATE_TIGHT; f++) {
        check_nonfinite_step_skipped((mt_state_format)f, 0, 0);
        check_nonfinite_step_skipped((mt_state_format)f, 2, 0);
        if (f != MT_STATE_FULL) check_nonfinite_step_skipped((mt_state_format)f, 0, 1);
    }
}

/* The GPU tier changes where a layer's update runs, not what it computes: the CUDA AdamW of each
 * format gives the host kernel's bits (test_cuda_optim), so training with layers in the tier, and
 * with the gradients waiting on the GPU or in host memory, or with the host layers' state streamed
 * through the GPU for their update (update_on_device), gives the same losses and state, bit for
 * bit, as training with every layer streamed and updated on the host. */
static void test_gpu_tier_same_bits(void **state) {
    (void)state;
    mt_config cfg = small_config(64);
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    float *w = bf16_weights(&t, 0.02f, 11);
    const int B = 4, T = 64;
    int32_t ids[4 * 64], tg[4 * 64];
    for (int i = 0; i < B * T; i++) ids[i] = (i * 7 + 3) % cfg.V, tg[i] = (i * 5 + 1) % cfg.V;
    mt_adamw_hparams hp = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    for (int f = MT_STATE_FULL; f <= MT_STATE_TIGHT; f++) {
        /* upd: the host layers' update on the GPU, their state streamed (update_on_device;
         * compact and tight only) */
        enum { NM = 5 };
        const struct { int tier, grads_dev, upd; } mode[NM] = {{0, 1, 0}, {2, 1, 0}, {1, 0, 0},
                                                              {0, 1, 1}, {2, 1, 1}};
        mt_test_snapshot snap[NM];
        double loss[NM][4];
        for (int k = 0; k < NM; k++) {
            mt_engine_opts o = {.batch = B, .micro_batch = 2, .T = T, .n_slots = 2, .opt_threads = 2,
                                .state = (mt_state_format)f, .gpu_layers = mode[k].tier,
                                .grads_on_device = mode[k].grads_dev, .seed = 9,
                                .update_on_device = mode[k].upd};
            mt_engine *e = mt_engine_create(&t, gpu, &o, w);
            assert_int_equal(mt_train_state_updates_on_device(mt_engine_state(e)),
                             mode[k].upd && f != MT_STATE_FULL);
            for (int s = 0; s < 4; s++) {
                mt_step_result r;
                mt_engine_step(e, ids, tg, &hp, s + 1, 1.0, &r);
                loss[k][s] = r.loss;
            }
            fprintf(stderr, "%s tier %d grads_dev %d upd %d: losses %.7f %.7f %.7f %.7f\n",
                    mt_state_format_name((mt_state_format)f), mode[k].tier, mode[k].grads_dev, mode[k].upd,
                    loss[k][0], loss[k][1], loss[k][2], loss[k][3]);
            mt_test_snapshot_state(&snap[k], e, &t);
            mt_engine_destroy(e);
        }
        assert_true(loss[0][3] < loss[0][0]);
        for (int k = 1; k < NM; k++) {
            for (int s = 0; s < 4; s++) assert_true(loss[k][s] == loss[0][s]);
            mt_test_snapshot_equal(&snap[0], &snap[k]);
        }
        for (int k = 0; k < NM; k++) mt_test_snapshot_free(&snap[k]);
    }
    free(w);
    mt_param_table_free(&t);
}

/* w nudged by a relative amount uniform in (-2^-9, 2^-9): bf16's rounding step, the size of the
 * difference between what the two backends compute with. */
static float *nudged(const mt_param_table *t, const float *w, uint64_t seed) {
    return mt_test_nudged(t, w, seed, 1.0 / 512);
}

static double window_rel(const double *a, const double *b, int w0) {
    double x = 0, y = 0;
    for (int s = w0; s < w0 + 10; s++) x += a[s], y += b[s];
    return fabs(y - x) / x;
}

/* 50 steps on a steep curve are chaotic: the first H200 runs put the CUDA run's last 10-step mean
 * 6.3% above the CPU's, and nudging the CPU run's initial weights by bf16-sized amounts (no GPU
 * involved) moved that window by 5.1%, 10.0% and 6.5% (dev box). So the reference for "tracks" is
 * measured in the test itself: NUDGES fp32 CPU runs from nudged weights give, per 10-step window,
 * the largest deviation d_w that bf16-level noise alone causes; the CUDA run must stay within
 * WINDOW_SLACK * d_w + WINDOW_TOL_FLOOR of the CPU run in every window, must learn (final loss
 * under half the first), and no single step may be more than STEP_TOL off. A wrong gradient lags
 * or fails to learn far outside that envelope (the early windows, where the runs have not yet
 * diverged, have envelopes well under 1%).
 * NUDGES was 3 until the parameter table's alignment went from 32 to 256 elements (issue 10): the
 * CUDA run stayed bit for bit what it was (step 21: 3.3143, step 50: 1.2528, as in the session-3
 * log), but the three nudges, then drawn over the whole arena with its padding, changed, and by
 * chance all stayed close in steps 21-30 (0.9% against 2.8% before), failing that window (CUDA
 * 2.9%). Three draws under-estimate the spread: ten per-tensor draws on the dev box give, for
 * steps 21-30, 0.05% to 5.7%. So: 8 draws, per tensor. */
/* The per-step bound was STEP_TOL alone until cuDNN's forward ran in this test (session 5): its
 * run stayed inside every window's envelope (steps 41-50: 0.103 against the nudged runs' 0.138)
 * but steps 45, 47 and 48 came out 16-19% off the CPU run, past STEP_TOL; late in the run single
 * steps of the nudged CPU runs move as much (printed beside each step). So a step may be off by
 * WINDOW_SLACK times the nudged runs' own deviation at that step when that is above STEP_TOL. */
#define NUDGES 8
#define WINDOW_SLACK 1.5
#define WINDOW_TOL_FLOOR 5e-3
static void test_training_tracks_cpu(void **state) {
    mt_config cfg = small_config(64);
    cfg.V = 256;
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    float *w = bf16_weights(&t, 0.02f, 8);
    const int steps = 50;
    double ref_norm[50], got_norm[50];
    double *ref = train_curve_with(cpu, &t, w, steps, 0, 0, 0, 1, ref_norm);
    double *got = train_curve_with(gpu, &t, w, steps, 0, 0, 0, 1, got_norm);
    double envelope[5] = {0}, step_env[50] = {0};
    for (int k = 0; k < NUDGES; k++) {
        float *p = nudged(&t, w, 1234 + (uint64_t)k);
        double *alt = train_curve_with(cpu, &t, p, steps, 0, 0, 0, 1, NULL);
        for (int i = 0; i < 5; i++) {
            double d = window_rel(ref, alt, 10 * i);
            if (d > envelope[i]) envelope[i] = d;
        }
        for (int s = 0; s < steps; s++) {
            double d = fabs(alt[s] - ref[s]) / ref[s];
            if (d > step_env[s]) step_env[s] = d;
        }
        free(alt), free(p);
    }
    int ok = 1;
    for (int s = 0; s < steps; s++) {
        double rel = fabs(got[s] - ref[s]) / ref[s];
        double tol = WINDOW_SLACK * step_env[s] > STEP_TOL ? WINDOW_SLACK * step_env[s] : STEP_TOL;
        if (s % 5 == 0 || s < 3 || s == steps - 1 || rel > STEP_TOL)
            fprintf(stderr, "step %2d: cpu %.4f cuda %.4f (rel %.3g; nudged cpu up to %.3g; tol %.3g), "
                            "grad norm cpu %.4f cuda %.4f%s\n", s + 1, ref[s], got[s], rel,
                    step_env[s], tol, ref_norm[s], got_norm[s], rel > tol ? "  FAIL" : "");
        ok &= rel <= tol;
    }
    for (int i = 0; i < 5; i++) {
        double rel = window_rel(ref, got, 10 * i), tol = WINDOW_SLACK * envelope[i] + WINDOW_TOL_FLOOR;
        fprintf(stderr, "steps %2d-%2d: cuda vs cpu %.4f; cpu vs nudged cpu up to %.4f; tol %.4f%s\n",
                10 * i + 1, 10 * i + 10, rel, envelope[i], tol, rel <= tol ? "" : "  FAIL");
        ok &= rel <= tol;
    }
    assert_true(ref[steps - 1] < 0.5 * ref[0]); /* the runs actually learn */
    assert_true(got[steps - 1] < 0.5 * got[0]);
    free(ref), free(got), free(w);
    mt_param_table_free(&t);
    if (!ok) fail_msg("the CUDA loss curve leaves the envelope of the CPU run");
}

/* Gemma 3 (issue 29): the fixtures' own weights, sliding (window 8 < T) and full layers, GeGLU,
 * four norms a layer, query_pre_attn_scalar, the pad token's row (ids hold pad id 0), tied head.
 * gemma3_overflow's post-norm gains push the residual to ~9e4, where fp16 overflows: in bf16 the
 * CUDA step must stay finite and match the fp32 CPU within the nudged runs' envelope (a bf16
 * residual of 9e4 has a spacing of 512, so its logits move by rounding alone), and 10 training
 * steps must skip none and follow the CPU's loss within STEP_TOL or the nudged runs' spread. */
#define GEMMA_STEPS 10
/* One Gemma fixture as above: the step against the CPU, then the 10 training steps; 1 when all
 * passed (everything is printed either way). */
static int gemma_fixture_ok(const char *name) {
    mt_param_table t;
    float *w = mt_test_fixture_weights_bf16(name, &t); /* both backends see the same values */
    int ok = compare_weights_ok(&t, w, 2, 40, QWEN_NUDGES, name);
    double ref_norm[GEMMA_STEPS], got_norm[GEMMA_STEPS], step_env[GEMMA_STEPS] = {0};
    double *ref = train_curve_with(cpu, &t, w, GEMMA_STEPS, 0, 0, 0, 1, ref_norm);
    double *got = train_curve_with(gpu, &t, w, GEMMA_STEPS, 0, 0, 0, 1, got_norm);
    for (int k = 0; k < QWEN_NUDGES; k++) {
        float *p = mt_test_nudged(&t, w, 1234 + (uint64_t)k, 4.0 / 512);
        double *alt = train_curve_with(cpu, &t, p, GEMMA_STEPS, 0, 0, 0, 1, NULL);
        for (int s = 0; s < GEMMA_STEPS; s++) step_env[s] = fmax(step_env[s], fabs(alt[s] - ref[s]) / ref[s]);
        free(alt), free(p);
    }
    for (int s = 0; s < GEMMA_STEPS; s++) {
        double rel = fabs(got[s] - ref[s]) / ref[s], tol = fmax(STEP_TOL, 1.5 * step_env[s]);
        int good = isfinite(got[s]) && isfinite(got_norm[s]) && rel <= tol;
        fprintf(stderr, "%s step %d: cpu %.4f cuda %.4f (rel %.3g; nudged cpu %.3g; tol %.3g), grad norm "
                        "cpu %.4f cuda %.4f%s\n", name, s + 1, ref[s], got[s], rel, step_env[s], tol,
                ref_norm[s], got_norm[s], good ? "" : "  FAIL");
        ok &= good;
    }
    free(ref), free(got), free(w);
    mt_param_table_free(&t);
    return ok;
}

static void test_gemma3_models(void **state) {
    const char *names[] = {"gemma3_tiny", "gemma3_overflow"};
    int ok = 1;
    for (int i = 0; i < 2; i++) ok &= gemma_fixture_ok(names[i]);
    if (!ok) fail_msg("a Gemma 3 model differs between CUDA and the CPU (see above)");
}

/* Gemma 4 (issue 29), the same checks on its fixtures: gemma4_tiny (the dense 31B's switches:
 * keys as values and the weightless v-norm, full layers with their own head dim, kv heads and
 * partial proportional RoPE, the per-layer scalar, the soft-capped head at cap 2, tied), gemma4_vl
 * (the multimodal checkpoint's text model: v_proj with the v-norm, no cap, untied head) and
 * gemma4_moe (the 26B-A4B's MoE block beside the dense MLP: the router's own norm and scale, the
 * per-expert gate scale). Every CUDA op these reach: test_cuda_gemma4_ops and
 * test_cuda_gemma_gptoss_ops. */
static void test_gemma4_models(void **state) {
    const char *names[] = {"gemma4_tiny", "gemma4_vl", "gemma4_moe"};
    int ok = 1;
    for (int i = 0; i < 3; i++) ok &= gemma_fixture_ok(names[i]);
    if (!ok) fail_msg("a Gemma 4 model differs between CUDA and the CPU (see above)");
}

/* ---- packed rows: cuDNN's variable-length attention (the default) against ours ----
 *
 * The same weights and data trained DOCS_STEPS steps on rows of several documents (3-8 a row,
 * 24-128 tokens each, a new layout every step through mt_engine_set_documents), once with the
 * default choice for packed rows (cuDNN's variable-length graph, attention_cudnn.h) and once with
 * MT_ATTENTION_DOCS=own. The two differ as bf16 computations of the same attention do (cuDNN
 * rounds P to bf16 before the PV product; ours keeps it in fp32: test_cuda_attention), so the
 * bound is measured as test_training_tracks_cpu measures its own: NUDGES runs of ours from weights
 * nudged by bf16's rounding step give, per step, the largest relative change of the loss (e_l) and
 * of the gradient norm (e_n) that noise of that size causes; cuDNN's run must stay within
 * WINDOW_SLACK * e + the GPU path's own run-to-run noise (MODE_LOSS_TOL, MODE_NORM_TOL: the dQ
 * atomics, test_memory_modes_agree) at every step. A nudge is one perturbation at the start, but
 * cuDNN's rounding of P differs from ours at every step and compounds: on the H200 (session 8,
 * bench/RESULTS.md) cuDNN's packed run left the nudge bound from step 8 (loss 1.1e-2 against 7.7e-3
 * at step 9, norm 8.8e-2 against 4.5e-2 at step 10) while agreeing to 2e-6 (loss) and 1.3e-4
 * (norm) at step 1, and test_cuda_attention's op-level checks of the variable-length graph
 * against the CPU passed. So e per step is the larger of the nudge's change and the same
 * per-step difference without documents: the plain rows trained with cuDNN's plain graph against
 * ours (e_c). The bound can still fail: the same run without the documents (one causal document a
 * row, positions not restarting) must leave it, and a wrong mask does so at step 1. On the dev box
 * (CPU backend, this model and data, fp32) the nudged runs moved the loss 2e-5 at step 1 to 1.2%
 * at step 12 and the norm 2e-4 to 9%, the run without documents 0.4% and 24% at step 1 already.
 * Every step of cuDNN's run must have run its variable-length graph both ways, over the documents
 * of a micro-batch (mt_cuda_attention_last_docs), so a silent fall back to our kernels (documents
 * not noted, a plan cuDNN refused) fails; ours must have run ours. Skipped without a usable cuDNN
 * unless MT_REQUIRE_CUDNN=1 (then a failure), as test_cuda_attention. */
#define DOCS_STEPS 12
#define DOCS_B 4
#define DOCS_T 256

/* The documents of step s: row after row, lengths 24-128 drawn from the step's seed, the last
 * one cut at the row's end. */
static void docs_of_step(int32_t *doc_start, int s) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 4242 + (uint64_t)s);
    for (int b = 0; b < DOCS_B; b++)
        for (int t = 0; t < DOCS_T;) {
            int len = 24 + (int)(mt_test_rng_u64(&rng) % 105);
            if (len > DOCS_T - t) len = DOCS_T - t;
            for (int j = 0; j < len; j++) doc_start[b * DOCS_T + t + j] = t;
            t += len;
        }
}

/* Documents in rows r0 .. r0 + n - 1 of doc_start. */
static int docs_in_rows(const int32_t *doc_start, int r0, int n) {
    int k = 0;
    for (int i = r0 * DOCS_T; i < (r0 + n) * DOCS_T; i++) k += doc_start[i] == i % DOCS_T;
    return k;
}

/* Whether the latest forward and backward ran cuDNN's variable-length graph over one of the two
 * micro-batches' documents of layout doc (docs_curve's check). */
static int ran_docs_cudnn(const int32_t *doc) {
    int S = 0, s_max = 0, n0 = docs_in_rows(doc, 0, 2), n1 = docs_in_rows(doc, 2, 2);
    int nf = mt_cuda_attention_last_docs(0, &S, &s_max), nb = mt_cuda_attention_last_docs(1, NULL, NULL);
    return mt_cuda_attention_last(0) == MT_ATTENTION_CUDNN && mt_cuda_attention_last(1) == MT_ATTENTION_CUDNN &&
           (nf == n0 || nf == n1) && (nb == n0 || nb == n1) && S >= nf && s_max <= DOCS_T;
}

/* The loss and gradient norm of each step; with documents (packed), each step's layout. With
 * want_docs 1, after each step the latest forward and backward attention must have run cuDNN's
 * variable-length graph over one micro-batch's documents; with 0, ours; -1: not checked. Returns
 * the number of steps that did not. */
static int docs_curve(const mt_param_table *t, const float *w, int packed, int want_docs,
                      double *loss, double *norm) {
    mt_engine_opts o = {.batch = DOCS_B, .micro_batch = 2, .T = DOCS_T, .n_slots = 2, .opt_threads = 2};
    mt_engine *e = mt_engine_create(t, gpu, &o, w);
    int32_t ids[DOCS_B * DOCS_T], tg[DOCS_B * DOCS_T], doc[DOCS_B * DOCS_T];
    mt_adamw_hparams hp = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    int wrong = 0;
    for (int s = 0; s < DOCS_STEPS; s++) {
        mt_test_stream_rows(ids, tg, DOCS_B, DOCS_T, t->cfg.V, s);
        if (packed) {
            docs_of_step(doc, s);
            assert_int_equal(mt_engine_set_documents(e, doc), MT_OK);
        }
        mt_step_result r;
        mt_engine_step(e, ids, tg, &hp, s + 1, 1.0, &r);
        loss[s] = r.loss, norm[s] = r.grad_norm;
        if (!packed || want_docs < 0) continue;
        int S = 0, s_max = 0, n0 = docs_in_rows(doc, 0, 2), n1 = docs_in_rows(doc, 2, 2);
        int nf = mt_cuda_attention_last_docs(0, &S, &s_max), nb = mt_cuda_attention_last_docs(1, NULL, NULL);
        mt_attention_impl f = mt_cuda_attention_last(0), b = mt_cuda_attention_last(1);
        int ok = want_docs ? ran_docs_cudnn(doc)
                           : f == MT_ATTENTION_OWN && b == MT_ATTENTION_OWN && nf == 0 && nb == 0;
        if (!ok || s == 0)
            fprintf(stderr, "  step %d: forward %s, backward %s, variable-length graph over %d / %d "
                            "documents (%d sequences of up to %d; the micro-batches have %d and %d)%s\n",
                    s + 1, f == MT_ATTENTION_CUDNN ? "cudnn" : "own", b == MT_ATTENTION_CUDNN ? "cudnn" : "own",
                    nf, nb, S, s_max, n0, n1, ok ? "" : "  FAIL");
        wrong += !ok;
    }
    mt_engine_destroy(e);
    return wrong;
}

/* cuDNN's version; skips the test without a usable cuDNN (fails under MT_REQUIRE_CUDNN=1). */
static long cudnn_or_skip(void) {
    const char *why = NULL;
    long version = 0;
    if (!mt_cuda_cudnn_status(&why, &version)) {
        const char *req = getenv("MT_REQUIRE_CUDNN");
        if (req && strcmp(req, "1") == 0) fail_msg("MT_REQUIRE_CUDNN=1 but cuDNN is not usable (%s)", why);
        fprintf(stderr, "cuDNN not usable (%s): packed rows run our kernels; skipped\n", why);
        skip();
    }
    return version;
}

/* Packed rows in lock step, without chaos: before each step the cuDNN engine and a control
 * engine (the same rows without documents) take the own engine's weights (mt_engine_set_weights:
 * test_engine's test_set_weights_between_steps shows it takes effect), so each step compares one
 * forward and backward at the same weights and layout: the loss within MODE_LOSS_TOL (1e-3) and
 * the gradient norm within MODE_NORM_TOL (1e-2) relative, the bounds test_memory_modes_agree uses
 * for the GPU path's run-to-run noise. On the H200 (session 8) the first step of
 * test_docs_cudnn_tracks_own, where the weights are still the same, differed by 1.9e-6 and
 * 1.3e-4. The control must leave the bound at some step (a mask ignored shows at once: 4.4e-3
 * and 2.3e-1 at that first step). */
static void test_docs_cudnn_lockstep(void **state) {
    (void)state;
    cudnn_or_skip();
    mt_attention_impl was = mt_cuda_attention_get_impl(), docs_was = mt_cuda_attention_get_docs_impl();
    mt_cuda_attention_set_impl(MT_ATTENTION_AUTO);
    mt_config cfg = small_config(64);
    cfg.V = 256;
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    float *w = bf16_weights(&t, 0.02f, 8);
    float *now = mt_aligned_alloc((size_t)t.total * sizeof(float));
    mt_engine_opts o = {.batch = DOCS_B, .micro_batch = 2, .T = DOCS_T, .n_slots = 2, .opt_threads = 2};
    mt_engine *own = mt_engine_create(&t, gpu, &o, w), *cud = mt_engine_create(&t, gpu, &o, w);
    mt_engine *ctl = mt_engine_create(&t, gpu, &o, w);
    mt_adamw_hparams hp = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    int32_t ids[DOCS_B * DOCS_T], tg[DOCS_B * DOCS_T], doc[DOCS_B * DOCS_T];
    int ok = 1, control_out = 0, wrong = 0;
    double first_l = 0, last_l = 0;
    for (int s = 0; s < DOCS_STEPS; s++) {
        mt_test_stream_rows(ids, tg, DOCS_B, DOCS_T, t.cfg.V, s);
        docs_of_step(doc, s);
        assert_int_equal(mt_engine_set_documents(own, doc), MT_OK);
        assert_int_equal(mt_engine_set_documents(cud, doc), MT_OK);
        mt_engine_get_weights(own, now);
        mt_engine_set_weights(cud, now), mt_engine_set_weights(ctl, now);
        mt_step_result a, b, c;
        mt_cuda_attention_set_docs_impl(MT_ATTENTION_OWN);
        mt_engine_step(own, ids, tg, &hp, s + 1, 1.0, &a);
        mt_cuda_attention_set_docs_impl(MT_ATTENTION_CUDNN);
        mt_engine_step(cud, ids, tg, &hp, s + 1, 1.0, &b);
        int ran = ran_docs_cudnn(doc);
        mt_engine_step(ctl, ids, tg, &hp, s + 1, 1.0, &c);
        double dl = fabs(b.loss - a.loss) / a.loss, dn = fabs(b.grad_norm - a.grad_norm) / a.grad_norm;
        double cl = fabs(c.loss - a.loss) / a.loss, cn = fabs(c.grad_norm - a.grad_norm) / a.grad_norm;
        int good = dl <= MODE_LOSS_TOL && dn <= MODE_NORM_TOL;
        fprintf(stderr, "lock step %2d: loss own %.5f cudnn %.5f (rel %.2e; tol %.0e), norm %.5f vs %.5f "
                        "(rel %.2e; tol %.0e); no documents %.2e, %.2e%s%s\n",
                s + 1, a.loss, b.loss, dl, MODE_LOSS_TOL, a.grad_norm, b.grad_norm, dn, MODE_NORM_TOL, cl,
                cn, ran ? "" : "  (not cuDNN's variable-length graph)", good && ran ? "" : "  FAIL");
        ok &= good, wrong += !ran;
        control_out |= cl > MODE_LOSS_TOL || cn > MODE_NORM_TOL;
        if (s == 0) first_l = a.loss;
        last_l = a.loss;
    }
    mt_engine_destroy(own), mt_engine_destroy(cud), mt_engine_destroy(ctl);
    mt_cuda_attention_set_docs_impl(docs_was);
    mt_cuda_attention_set_impl(was);
    free(w), free(now);
    mt_param_table_free(&t);
    assert_true(last_l < first_l); /* the weights compared are trained ones */
    if (wrong) fail_msg("%d steps did not run cuDNN's variable-length graph (above)", wrong);
    if (!control_out) fail_msg("the rows without documents stay inside the bound: it cannot tell them apart");
    if (!ok) fail_msg("packed rows through cuDNN leave the bound of ours at the same weights (above)");
}

static void test_docs_cudnn_tracks_own(void **state) {
    (void)state;
    long version = cudnn_or_skip();
    mt_attention_impl was = mt_cuda_attention_get_impl();
    mt_cuda_attention_set_impl(MT_ATTENTION_AUTO); /* the default, whatever MT_ATTENTION says */
    const char *env = getenv("MT_ATTENTION_DOCS");
    if (!env) /* nothing before this test ran packed rows: this reads the default */
        assert_int_equal(mt_cuda_attention_get_docs_impl(), MT_ATTENTION_CUDNN);
    else
        fprintf(stderr, "MT_ATTENTION_DOCS=%s in the environment: the test sets the default (auto)\n", env);
    mt_attention_impl docs_was = mt_cuda_attention_get_docs_impl();
    mt_cuda_attention_set_docs_impl(MT_ATTENTION_AUTO);

    mt_config cfg = small_config(64);
    cfg.V = 256;
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    float *w = bf16_weights(&t, 0.02f, 8);
    double got_l[DOCS_STEPS], got_n[DOCS_STEPS], ref_l[DOCS_STEPS], ref_n[DOCS_STEPS];
    double alt_l[DOCS_STEPS], alt_n[DOCS_STEPS], env_l[DOCS_STEPS] = {0}, env_n[DOCS_STEPS] = {0};
    fprintf(stderr, "cuDNN %ld, the default choice for packed rows:\n", version);
    int wrong = docs_curve(&t, w, 1, 1, got_l, got_n);
    mt_cuda_attention_set_docs_impl(MT_ATTENTION_OWN);
    fprintf(stderr, "MT_ATTENTION_DOCS=own:\n");
    wrong += docs_curve(&t, w, 1, 0, ref_l, ref_n);
    for (int k = 0; k < NUDGES; k++) {
        float *p = nudged(&t, w, 1234 + (uint64_t)k);
        docs_curve(&t, p, 1, -1, alt_l, alt_n); /* ours (MT_ATTENTION_DOCS=own in force) */
        for (int s = 0; s < DOCS_STEPS; s++) {
            double dl = fabs(alt_l[s] - ref_l[s]) / ref_l[s], dn = fabs(alt_n[s] - ref_n[s]) / ref_n[s];
            if (dl > env_l[s]) env_l[s] = dl;
            if (dn > env_n[s]) env_n[s] = dn;
        }
        free(p);
    }
    /* e_c: the plain rows through cuDNN's plain graph against ours, the per-step difference. */
    double pc_l[DOCS_STEPS], pc_n[DOCS_STEPS], po_l[DOCS_STEPS], po_n[DOCS_STEPS];
    mt_cuda_attention_set_impl(MT_ATTENTION_CUDNN);
    docs_curve(&t, w, 0, -1, pc_l, pc_n);
    int plain_cudnn = mt_cuda_attention_last(0) == MT_ATTENTION_CUDNN && mt_cuda_attention_last(1) == MT_ATTENTION_CUDNN;
    mt_cuda_attention_set_impl(MT_ATTENTION_OWN);
    docs_curve(&t, w, 0, -1, po_l, po_n);
    mt_cuda_attention_set_impl(MT_ATTENTION_AUTO);
    docs_curve(&t, w, 0, -1, alt_l, alt_n); /* the control: the same rows without documents */
    mt_cuda_attention_set_docs_impl(docs_was);
    mt_cuda_attention_set_impl(was);
    int ok = 1, control_out = 0;
    for (int s = 0; s < DOCS_STEPS; s++) {
        double ec_l = fabs(pc_l[s] - po_l[s]) / po_l[s], ec_n = fabs(pc_n[s] - po_n[s]) / po_n[s];
        double e_l = env_l[s] > ec_l ? env_l[s] : ec_l, e_n = env_n[s] > ec_n ? env_n[s] : ec_n;
        double tl = WINDOW_SLACK * e_l + MODE_LOSS_TOL, tn = WINDOW_SLACK * e_n + MODE_NORM_TOL;
        double dl = fabs(got_l[s] - ref_l[s]) / ref_l[s], dn = fabs(got_n[s] - ref_n[s]) / ref_n[s];
        double cl = fabs(alt_l[s] - ref_l[s]) / ref_l[s], cn = fabs(alt_n[s] - ref_n[s]) / ref_n[s];
        int good = dl <= tl && dn <= tn;
        fprintf(stderr, "step %2d: loss cudnn %.5f own %.5f (rel %.2e; nudged %.2e, plain %.2e; tol %.2e), "
                        "norm %.5f vs %.5f (rel %.2e; nudged %.2e, plain %.2e; tol %.2e); "
                        "no documents: %.2e, %.2e%s\n",
                s + 1, got_l[s], ref_l[s], dl, env_l[s], ec_l, tl, got_n[s], ref_n[s], dn, env_n[s], ec_n,
                tn, cl, cn, good ? "" : "  FAIL");
        ok &= good;
        control_out |= cl > tl || cn > tn;
    }
    assert_true(ref_l[DOCS_STEPS - 1] < ref_l[0]); /* the runs learn */
    free(w);
    mt_param_table_free(&t);
    if (wrong) fail_msg("%d steps did not run the attention they had to (above)", wrong);
    if (!plain_cudnn) fail_msg("the plain rows did not run cuDNN's plain graph: e_c measures nothing");
    if (!control_out) fail_msg("the run without documents stays inside the bound: it cannot tell them apart");
    if (!ok) fail_msg("packed rows through cuDNN leave the bound of ours (above)");
}

int main(void) {
    if (!mt_backend_cuda_available()) {
        fprintf(stderr, "no CUDA device: skipped\n");
        return 77;
    }
    cpu = mt_backend_cpu_create();
    gpu = mt_backend_cuda_create(0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_5_models),
        cmocka_unit_test(test_gemma3_models),
        cmocka_unit_test(test_gemma4_models),
        cmocka_unit_test(test_tiny_variants),
        cmocka_unit_test(test_small_models),
        cmocka_unit_test(test_memory_modes_agree),
        cmocka_unit_test(test_nonfinite_step_skipped),
        cmocka_unit_test(test_gpu_tier_same_bits),
        cmocka_unit_test(test_training_tracks_cpu),
        cmocka_unit_test(test_docs_cudnn_tracks_own),
        cmocka_unit_test(test_docs_cudnn_lockstep),
    };
    /* MT_TEST_FILTER: run the tests whose names match it (cmocka's pattern), e.g. a device check
     * that has no time for the whole file */
    const char *filter = getenv("MT_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    return rc;
}
