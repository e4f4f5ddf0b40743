/* The engine's data-parallel path on the CUDA backend over the NCCL comm at one rank (issue 12:
 * "the NCCL path with N = 1 runs, the same bits as without it"). The nccl comm boots from the
 * local comm (no mpirun); the engine then runs every collective of the schedule on the GPU: the
 * weight all-gathers on the H2D stream behind each shard's copy, the gradient reduce-scatters (in
 * place) and the norms' all-reduce on the compute stream. At one rank each is the identity, so
 * against the same engine without a comm, 3 steps with clipping give the same losses, gradient
 * norms, clip factors, and the same weights and optimizer state, bit for bit; per format (full,
 * compact, tight), with untied and tied embeddings, streamed (3 slots, gradients out to the host)
 * and resident (gradients waiting on the GPU). A wrong stream or a missing event shows as
 * different bits (a load read before its gather, a gradient read before its sum).
 * And `MT_COMM=nccl megatrain train --device cuda` (MT_BIN) on the train_llama fixture against the
 * same command without MT_COMM: it says it uses nccl, prints the same losses and gradient norms in
 * metrics.jsonl, and its final checkpoint's model and optimizer files are the same bytes (full and
 * compact).
 * Exits 77 (skipped) without a GPU, or when the build has no NCCL (CMakeLists.txt says why). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "comm/comm.h"
#include "core/error.h"
#include "engine/engine.h"
#include "util/state_snapshot.h"
#include "util/testutil.h"
#include "util/tiny_config.h"

#define B_ROWS 4
#define T_LEN 16
#define STEPS 3

static mt_backend *gpu;
static mt_comm *g_local, *g_nccl;

static const mt_adamw_hparams hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

typedef struct {
    double loss[STEPS], norm[STEPS];
    float clip[STEPS];
    int64_t count[STEPS];
    mt_test_snapshot state;
} run_out;

static void run(const mt_param_table *t, const float *w, mt_state_format f, int resident,
                mt_comm *comm, const int32_t *ids, int32_t (*tg)[B_ROWS * T_LEN], run_out *out) {
    mt_engine_opts o = {.batch = B_ROWS, .micro_batch = 2, .T = T_LEN, .n_slots = resident ? 2 : 3,
                        .resident = resident, .grads_on_device = resident, .opt_threads = 2,
                        .state = f, .seed = 5, .ranks = 1, .comm = comm};
    mt_engine *e = mt_engine_create(t, gpu, &o, w);
    for (int k = 0; k < STEPS; k++) {
        mt_step_result r;
        mt_engine_step(e, ids, tg[k], &hp, k + 1, 0.5, &r);
        assert_false(r.skipped);
        out->loss[k] = r.loss, out->norm[k] = r.grad_norm, out->clip[k] = r.clip_coef;
        out->count[k] = r.count;
    }
    mt_test_snapshot_state(&out->state, e, t);
    mt_engine_destroy(e);
}

static void compare(const char *variant, mt_state_format f, int resident) {
    mt_config cfg = mt_test_tiny_config(variant);
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    float *w = mt_aligned_alloc((size_t)t.total * sizeof(float));
    mt_param_init(&t, w, 0.2f, 3);
    int32_t ids[B_ROWS * T_LEN], tg[STEPS][B_ROWS * T_LEN];
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 9);
    for (int i = 0; i < B_ROWS * T_LEN; i++) ids[i] = (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)cfg.V);
    for (int k = 0; k < STEPS; k++)
        for (int i = 0; i < B_ROWS * T_LEN; i++)
            tg[k][i] = (i + k) % 7 == 2 ? -100 : (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)cfg.V);
    run_out plain, dp;
    run(&t, w, f, resident, NULL, ids, tg, &plain);
    run(&t, w, f, resident, g_nccl, ids, tg, &dp);
    int clipped = 0;
    for (int k = 0; k < STEPS; k++) {
        fprintf(stderr, "%s %s%s step %d: loss %.9g / %.9g  norm %.9g / %.9g\n", variant,
                mt_state_format_name(f), resident ? " resident" : "", k + 1, plain.loss[k], dp.loss[k],
                plain.norm[k], dp.norm[k]);
        /* bits, not values: memcmp also tells -0 from 0 and compares NaN */
        assert_memory_equal(&dp.loss[k], &plain.loss[k], sizeof(double));
        assert_memory_equal(&dp.norm[k], &plain.norm[k], sizeof(double));
        assert_memory_equal(&dp.clip[k], &plain.clip[k], sizeof(float));
        assert_int_equal(dp.count[k], plain.count[k]);
        clipped += plain.clip[k] < 1.0f;
    }
    assert_true(clipped > 0);               /* the norm decided the update */
    assert_true(plain.loss[STEPS - 1] != plain.loss[0]); /* the steps changed the weights */
    mt_test_snapshot_equal(&dp.state, &plain.state);
    mt_test_snapshot_free(&dp.state);
    mt_test_snapshot_free(&plain.state);
    free(w);
    mt_param_table_free(&t);
}

static void test_same_bits(void **state) {
    (void)state;
    const char *variants[] = {"llama_gqa", "llama3_tied"};
    for (int v = 0; v < 2; v++)
        for (int f = MT_STATE_FULL; f <= MT_STATE_TIGHT; f++)
            for (int resident = 0; resident <= 1; resident++)
                compare(variants[v], (mt_state_format)f, resident);
}

/* ---- the command ---- */

#define CLI_STEPS 3
static char g_out[1 << 17];

/* The "loss" and "grad_norm" fields of each step line of DIR/metrics.jsonl as printed, joined. */
static void metrics_text(const char *dir, char *text, size_t size) {
    char path[4200], line[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    size_t len = 0;
    int steps = 0;
    text[0] = 0;
    while (fgets(line, sizeof line, f)) {
        const char *a = strstr(line, "\"loss\""), *b = strstr(line, "\"grad_norm\"");
        if (!a || !b || strstr(line, "eval_loss")) continue;
        len += (size_t)snprintf(text + len, size - len, "%.*s %.*s\n", (int)strcspn(a, ","), a,
                                (int)strcspn(b, ","), b);
        assert_true(len < size);
        steps++;
    }
    fclose(f);
    assert_int_equal(steps, CLI_STEPS);
}

static void train_cli(const mt_cli_env *env, const char *state, const char *comm, const char *out) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && %s timeout 300 '%s' train --model '%s' --data '%s/data.bin' --steps %d "
             "--batch 4 --micro-batch 2 --seq 48 --lr 1e-2 --warmup 1 --state %s --gpu-layers 0 "
             "--device cuda --out %s",
             env->tmp, comm, env->bin, env->fixture, env->fixture, CLI_STEPS, state, out);
    int rc = mt_test_run(cmd, g_out, sizeof g_out);
    if (rc != 0) fail_msg("exit %d: %s\n%s", rc, cmd, g_out);
    int says = strstr(g_out, "comm: nccl on one GPU") != NULL;
    if (says != (*comm != 0)) fail_msg("%s: the run %s the nccl comm:\n%s", cmd, says ? "names" : "does not name", g_out);
}

static void same_bytes(const char *pa, const char *pb) {
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "cmp '%s' '%s'", pa, pb);
    if (mt_test_run(cmd, g_out, sizeof g_out) != 0) fail_msg("%s differs from %s: %s", pb, pa, g_out);
}

static void test_train_command(void **state) {
    (void)state;
    mt_cli_env env;
    if (mt_cli_env_init(&env, "train_llama") != 0) fail_msg("MT_BIN / MT_FIXTURES not set (run through ctest)");
    const char *states[] = {"full", "compact"};
    for (int i = 0; i < 2; i++) {
        char plain[64], dp[64], a[4200], b[4200];
        static char ta[8192], tb[8192];
        snprintf(plain, sizeof plain, "plain_%s", states[i]);
        snprintf(dp, sizeof dp, "nccl_%s", states[i]);
        train_cli(&env, states[i], "", plain);
        train_cli(&env, states[i], "MT_COMM=nccl", dp);
        snprintf(a, sizeof a, "%s/%s", env.tmp, plain);
        snprintf(b, sizeof b, "%s/%s", env.tmp, dp);
        metrics_text(a, ta, sizeof ta);
        metrics_text(b, tb, sizeof tb);
        fprintf(stderr, "%s without a comm:\n%s%s with MT_COMM=nccl:\n%s", states[i], ta, states[i], tb);
        assert_string_equal(tb, ta);
        const char *files[] = {"model.safetensors", "optimizer.safetensors"};
        for (int k = 0; k < 2; k++) {
            snprintf(a, sizeof a, "%s/%s/checkpoints/step_%08d/%s", env.tmp, plain, CLI_STEPS, files[k]);
            snprintf(b, sizeof b, "%s/%s/checkpoints/step_%08d/%s", env.tmp, dp, CLI_STEPS, files[k]);
            same_bytes(a, b);
        }
    }
    mt_cli_env_free(&env);
}

int main(void) {
    if (!mt_comm_built_with_nccl()) {
        fprintf(stderr, "this build has no NCCL (nccl.h / libnccl beside CUDA when configured): "
                        "skipped\n");
        return 77;
    }
    if (!mt_backend_cuda_available()) {
        fprintf(stderr, "no CUDA device: skipped\n");
        return 77;
    }
    gpu = mt_backend_cuda_create(0);
    g_local = mt_comm_create_local();
    g_nccl = mt_comm_create_nccl(g_local, 0);
    if (!g_nccl) {
        fprintf(stderr, "the nccl comm of one rank: %s\n", mt_error_message());
        return 1;
    }
    if (strcmp(mt_comm_name(g_nccl), "nccl") != 0 || mt_comm_size(g_nccl) != 1) {
        fprintf(stderr, "the nccl comm of one rank came back as %s of %d ranks\n",
                mt_comm_name(g_nccl), mt_comm_size(g_nccl));
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bits),
        cmocka_unit_test(test_train_command),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    mt_comm_destroy(g_nccl);
    mt_comm_destroy(g_local);
    gpu->destroy(gpu);
    return rc;
}
