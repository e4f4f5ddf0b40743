/* `mpirun -np N megatrain train --device cuda` (issue 12): N ranks, one GPU each (the local rank),
 * the engine's collectives over NCCL booted from the mpi comm. This test starts its own mpirun
 * jobs (as test_cli_dp does on the CPU), so ctest runs it like any GPU test; it exits 77 (skipped)
 * when the build has no NCCL or no MPI (MT_MPIRUN unset), or fewer than 2 GPUs are visible.
 * On the train_llama fixture, NCCL_NVLS_ENABLE=0 (the machines' notes):
 *  - N = 2 (and 4 when 4 GPUs are visible) against one GPU without mpirun on the same global
 *    batch, --state full and compact: every step's loss and gradient norm within 1e-2 relative,
 *    the final weights within 2e-2 of each tensor's largest |weight| (bf16 compute: the ranks'
 *    fp32 partial gradients are summed in NCCL's order, not one rank's micro-batch order, and the
 *    bf16 weights may round the other way); the header names the nccl comm and each rank's share;
 *  - resumed on N = 2 (--stop-at 3, then --resume to 6) the run is bit-identical to the
 *    uninterrupted one: the metrics' printed numbers and the final model and optimizer files byte
 *    for byte (NCCL's sums are deterministic for a fixed topology, count and version);
 *  - the 2-rank checkpoint (written by both ranks) resumes on one GPU, within the tolerance;
 *  - a mixture of experts with its load-balancing loss (train_qwen3_moe) on 2 GPUs as on one;
 *  - a rank stopped (SIGSTOP) mid-run ends the job, non-zero, within MT_COMM_TIMEOUT_S=10 plus a
 *    margin, naming the wait (the NCCL watchdog, or the mpi comm's host gather). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "comm/comm.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "util/run_compare.h"
#include "util/testutil.h"

#define OUT_SIZE (1 << 17)
#define STEPS 6
#define MAX_STEPS 16
#define LOSS_TOL 1e-2
#define WEIGHT_TOL 2e-2

static mt_cli_env g_env;
static const char *g_mpirun;
static char g_out[OUT_SIZE];
static int g_gpus;

static int setup(void **state) {
    *state = &g_env; /* for mt_cli_env_teardown */
    return mt_cli_env_init(&g_env, "train_llama");
}

static void train_args(char *buf, size_t n, const char *out, const char *extra) {
    snprintf(buf, n,
             "train --model '%s' --data '%s/data.bin' --steps %d --batch 8 --micro-batch 1 --seq 48 "
             "--lr 1e-2 --warmup 2 --device cuda --gpu-layers 0 --out '%s/%s' %s",
             g_env.fixture, g_env.fixture, STEPS, g_env.tmp, out, extra);
}

/* np 0: one process, no mpirun. */
static void run_ok(int np, const char *out, const char *extra) {
    char args[4096], cmd[8192];
    train_args(args, sizeof args, out, extra);
    if (np)
        snprintf(cmd, sizeof cmd, "NCCL_NVLS_ENABLE=0 timeout 300 '%s' --allow-run-as-root -np %d -x NCCL_NVLS_ENABLE '%s' %s",
                 g_mpirun, np, g_env.bin, args);
    else
        snprintf(cmd, sizeof cmd, "timeout 300 '%s' %s", g_env.bin, args);
    int rc = mt_test_run(cmd, g_out, sizeof g_out);
    if (rc != 0) fail_msg("exit %d: %s\n%s", rc, cmd, g_out);
}

static int read_metrics(const char *out, double *loss, double *norm, char (*text)[256]) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", g_env.tmp, out);
    return mt_test_read_step_metrics(path, MAX_STEPS, loss, norm, text);
}

static void compare_runs(const char *one, const char *dp, int steps) {
    double l1[MAX_STEPS], n1[MAX_STEPS], lN[MAX_STEPS], nN[MAX_STEPS];
    static char t1[MAX_STEPS][256], tN[MAX_STEPS][256];
    assert_int_equal(read_metrics(one, l1, n1, t1), steps);
    assert_int_equal(read_metrics(dp, lN, nN, tN), steps);
    double worst = 0;
    int same = 1;
    for (int k = 0; k < steps; k++) {
        double el = fabs(lN[k] - l1[k]) / fabs(l1[k]), en = fabs(nN[k] - n1[k]) / fabs(n1[k]);
        worst = fmax(worst, fmax(el, en));
        same &= strcmp(t1[k], tN[k]) == 0;
        if (el > LOSS_TOL || en > LOSS_TOL)
            fail_msg("%s vs %s, step %d: loss %.9g vs %.9g, norm %.9g vs %.9g (tol %g)", dp, one, k + 1, lN[k],
                     l1[k], nN[k], n1[k], LOSS_TOL);
    }
    printf("  %s vs %s: %d steps, worst relative difference %.3g (tol %g)%s\n", dp, one, steps, worst, LOSS_TOL,
           same ? ", the same printed bits" : "");
}

static void ckpt_file(char *buf, size_t n, const char *out, int step, const char *file) {
    snprintf(buf, n, "%s/%s/checkpoints/step_%08d/%s", g_env.tmp, out, step, file);
}

static void compare_weights(const char *one, const char *dp, int step) {
    char pa[4200], pb[4200];
    ckpt_file(pa, sizeof pa, one, step, "model.safetensors");
    ckpt_file(pb, sizeof pb, dp, step, "model.safetensors");
    mt_test_weights_close(pa, pb, dp, WEIGHT_TOL);
}

static void test_against_one_gpu(void **state) {
    static const char *const states[] = {"full", "compact"};
    for (int i = 0; i < 2; i++) {
        char one[64], extra[64];
        snprintf(one, sizeof one, "one_%s", states[i]);
        snprintf(extra, sizeof extra, "--state %s", states[i]);
        run_ok(0, one, extra);
        for (int np = 2; np <= 4 && np <= g_gpus; np *= 2) {
            char dp[64];
            snprintf(dp, sizeof dp, "np%d_%s", np, states[i]);
            run_ok(np, dp, extra);
            if (!strstr(g_out, "data parallel: ") || !strstr(g_out, "nccl over mpi"))
                fail_msg("the header does not name the nccl comm:\n%s", g_out);
            assert_non_null(strstr(g_out, "host RAM: "));
            compare_runs(one, dp, STEPS);
            compare_weights(one, dp, STEPS);
        }
    }
}

/* A mixture of experts with its load-balancing loss (train_qwen3_moe, its own fixture: after
 * --model's, this one wins) on 2 GPUs against one: the router's statistics summed over the ranks
 * (test_cli_dp's test_moe on the CPU), within the same bf16 bounds. */
static void test_moe_against_one_gpu(void **state) {
    char extra[4400];
    snprintf(extra, sizeof extra, "--model '%s/../train_qwen3_moe' --data '%s/../train_qwen3_moe/data.bin'",
             g_env.fixture, g_env.fixture);
    run_ok(0, "one_moe", extra);
    run_ok(2, "np2_moe", extra);
    assert_non_null(strstr(g_out, "mixture of experts: "));
    compare_runs("one_moe", "np2_moe", STEPS);
    compare_weights("one_moe", "np2_moe", STEPS);
}

static void test_resume_bits(void **state) {
    run_ok(2, "whole", "--save-every 3");
    run_ok(2, "resumed", "--save-every 3 --stop-at 3");
    run_ok(2, "resumed", "--save-every 3 --resume");
    assert_non_null(strstr(g_out, "resuming from "));
    double l[MAX_STEPS], n[MAX_STEPS];
    static char ta[MAX_STEPS][256], tb[MAX_STEPS][256];
    assert_int_equal(read_metrics("whole", l, n, ta), STEPS);
    assert_int_equal(read_metrics("resumed", l, n, tb), STEPS);
    for (int k = 0; k < STEPS; k++)
        if (strcmp(ta[k], tb[k])) fail_msg("step %d: %s, resumed %s", k + 1, ta[k], tb[k]);
    static const char *const files[] = {"model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        char pa[4200], pb[4200];
        ckpt_file(pa, sizeof pa, "whole", STEPS, files[i]);
        ckpt_file(pb, sizeof pb, "resumed", STEPS, files[i]);
        mt_test_same_bytes(pa, pb);
    }
    printf("  2 GPUs: resumed at step 3 = uninterrupted (the numbers and both files byte for byte)\n");
    /* the 2-rank checkpoint of step 3 on one GPU */
    mt_test_sh("mkdir -p '%s/on_one/checkpoints' && cp -r '%s/whole/checkpoints/step_00000003' '%s/on_one/checkpoints/' "
               "&& head -3 '%s/whole/metrics.jsonl' > '%s/on_one/metrics.jsonl'",
               g_env.tmp, g_env.tmp, g_env.tmp, g_env.tmp, g_env.tmp);
    run_ok(0, "on_one", "--save-every 3 --resume");
    compare_runs("whole", "on_one", STEPS);
    compare_weights("whole", "on_one", STEPS);
}

/* Rank 1 stopped once the first step is logged: the job must end by itself. */
static void test_stopped_rank(void **state) {
    char args[4096], cmd[16384];
    train_args(args, sizeof args, "stopped", "--steps 100000 --no-save");
    snprintf(cmd, sizeof cmd,
             "cd '%s' || exit 1; rm -f pid.0 pid.1; "
             "(MT_COMM_TIMEOUT_S=10 NCCL_NVLS_ENABLE=0 timeout 240 '%s' --allow-run-as-root -np 2 -x MT_COMM_TIMEOUT_S "
             "-x NCCL_NVLS_ENABLE sh -c 'echo $$ > pid.$OMPI_COMM_WORLD_RANK; exec \"$0\" \"$@\"' '%s' %s > job.log 2>&1; "
             "echo $? > job.rc) & "
             "for i in $(seq 2400); do [ -s '%s/stopped/metrics.jsonl' ] && [ -s pid.1 ] && break; sleep 0.05; done; "
             "t0=$(date +%%s.%%N); kill -STOP $(cat pid.1); wait; t1=$(date +%%s.%%N); kill -KILL $(cat pid.1) 2>/dev/null; "
             "cat job.log; echo \"rc $(cat job.rc) secs $(awk \"BEGIN { print $t1 - $t0 }\")\"",
             g_env.tmp, g_mpirun, g_env.bin, args, g_env.tmp);
    mt_test_run(cmd, g_out, sizeof g_out);
    const char *p = strstr(g_out, "\nrc ");
    if (!p) fail_msg("no result line:\n%s", g_out);
    int rc = -1;
    double secs = -1;
    sscanf(p, "\nrc %d secs %lf", &rc, &secs);
    printf("  SIGSTOP rank 1: job exit %d, %.1f s after the signal\n", rc, secs);
    if (rc == 0 || rc == 124) fail_msg("exit %d (124: `timeout` had to end it):\n%s", rc, g_out);
    assert_true(secs >= 0 && secs < 60);
    if (!strstr(g_out, "made no progress within 10 s") && !strstr(g_out, "no answer from rank 1 within 10 s"))
        fail_msg("no timeout message:\n%s", g_out);
}

int main(void) {
    g_mpirun = getenv("MT_MPIRUN");
    if (!mt_comm_built_with_nccl() || !mt_comm_built_with_mpi()) {
        printf("test_cuda_dp_ranks: skipped, the build has no %s\n", mt_comm_built_with_nccl() ? "MPI" : "NCCL");
        return 77;
    }
    if (!g_mpirun || !*g_mpirun) {
        printf("test_cuda_dp_ranks: skipped, no MT_MPIRUN (run it through ctest)\n");
        return 77;
    }
    g_gpus = mt_backend_cuda_device_count();
    if (g_gpus < 2) {
        printf("test_cuda_dp_ranks: skipped, %d CUDA device%s visible (2 needed)\n", g_gpus, g_gpus == 1 ? "" : "s");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_one_gpu),
        cmocka_unit_test(test_moe_against_one_gpu),
        cmocka_unit_test(test_resume_bits),
        cmocka_unit_test(test_stopped_rank),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
