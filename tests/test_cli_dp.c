/* `mpirun -np N megatrain train` (binary in MT_BIN, mpirun in MT_MPIRUN; both set by ctest) on the
 * train_llama fixture, against one process without mpirun on the same global batch:
 *  - N = 2 and 3 (an odd count), --state full, compact and tight: the same per-step losses and
 *    gradient norms in metrics.jsonl within the engine's stated tolerances (test_engine_dp: fp32
 *    reassociation, 1e-5 relative; the 8-bit formats 1e-3), rank 0 alone printing the step lines;
 *  - the host state each rank reports is 1/N of one rank's (computed here from the same table)
 *    up to the 256-element padding of each group's shard;
 *  - a flag that differs between the ranks (mpirun's MPMD form: `-np 1 ... --lr A : -np 1 ...
 *    --lr B`) ends the job within a bounded time with an error naming the flag;
 *  - what N ranks do not do yet is refused by name, printed once: checkpoints (without
 *    --no-save), --resume, a --batch that N x --micro-batch does not divide.
 * Exits 77 (skipped) when MT_MPIRUN is not set (a build without MPI). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/train_state.h"
#include "model/config.h"
#include "model/params.h"
#include "util/testutil.h"

#define OUT_SIZE (1 << 17)
#define STEPS 6

static mt_cli_env g_env;
static const char *g_mpirun;
static char g_out[OUT_SIZE];

static int setup(void **state) { return mt_cli_env_init(&g_env, "train_llama"); }

static int teardown(void **state) {
    mt_cli_env_free(&g_env);
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The train command line for OUT (after the binary), common to every run here. */
static void train_args(char *buf, size_t n, const char *out, const char *extra) {
    snprintf(buf, n,
             "train --model '%s' --data '%s/data.bin' --steps %d --batch 6 --micro-batch 1 --seq 48 "
             "--lr 1e-2 --warmup 2 --device cpu --out '%s/%s' %s",
             g_env.fixture, g_env.fixture, STEPS, g_env.tmp, out, extra);
}

/* `mpirun -np np megatrain ARGS` (np 0: no mpirun), bounded by `timeout 120`; returns the exit
 * status, the output in g_out and the seconds it took in *secs. */
static int run(int np, const char *out, const char *extra, double *secs) {
    char args[4096], cmd[8192];
    train_args(args, sizeof args, out, extra);
    if (np)
        snprintf(cmd, sizeof cmd, "timeout 120 '%s' --allow-run-as-root --oversubscribe -np %d '%s' %s",
                 g_mpirun, np, g_env.bin, args);
    else
        snprintf(cmd, sizeof cmd, "timeout 120 '%s' %s", g_env.bin, args);
    double t0 = now_s();
    int rc = mt_test_run(cmd, g_out, sizeof g_out);
    if (secs) *secs = now_s() - t0;
    if (strstr(g_out, "Sanitizer") || strstr(g_out, "runtime error:")) fail_msg("sanitizer report: %s\n%s", cmd, g_out);
    return rc;
}

static void run_ok(int np, const char *out, const char *extra) {
    int rc = run(np, out, extra, NULL);
    if (rc != 0) fail_msg("exit %d (np %d, %s)\n%s", rc, np, extra, g_out);
}

/* The loss and grad_norm of each step line of OUT/metrics.jsonl (steps 1..n in order). */
static int read_metrics(const char *out, double *loss, double *norm) {
    char path[4096], line[4096];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", g_env.tmp, out);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        if (!j) fail_msg("%s: not JSON: %s", path, line);
        if (json_object_get(j, "loss")) {
            assert_int_equal(json_integer_value(json_object_get(j, "step")), n + 1);
            assert_true(n < STEPS);
            loss[n] = json_number_value(json_object_get(j, "loss"));
            norm[n] = json_number_value(json_object_get(j, "grad_norm"));
            n++;
        }
        json_decref(j);
    }
    fclose(f);
    return n;
}

static int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* Bytes of host state one rank of N reports ("host state B bytes on each rank"). */
static double reported_bytes(void) {
    const char *p = strstr(g_out, "host state ");
    if (!p) fail_msg("no host state line:\n%s", g_out);
    return atof(p + strlen("host state "));
}

/* One rank's host state for this fixture and format, from the same table the CLI builds. */
static double one_rank_bytes(mt_state_format f, int64_t *total, int *L) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", g_env.fixture);
    mt_config cfg;
    assert_int_equal(mt_config_load(&cfg, path), MT_OK);
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    mt_backend *be = mt_backend_cpu_create();
    mt_train_state_opts o = {.format = f};
    mt_train_state *s = mt_train_state_create(&t, be, &o);
    double b = mt_train_state_host_bytes(s);
    *total = t.total;
    *L = cfg.L;
    mt_train_state_free(s);
    be->destroy(be);
    mt_param_table_free(&t);
    return b;
}

static void compare_runs(const char *one, const char *dp, double tol) {
    double l1[STEPS], n1[STEPS], lN[STEPS], nN[STEPS];
    assert_int_equal(read_metrics(one, l1, n1), STEPS);
    assert_int_equal(read_metrics(dp, lN, nN), STEPS);
    double worst = 0;
    for (int k = 0; k < STEPS; k++) {
        double el = fabs(lN[k] - l1[k]) / fabs(l1[k]), en = fabs(nN[k] - n1[k]) / fabs(n1[k]);
        worst = fmax(worst, fmax(el, en));
        if (el > tol || en > tol)
            fail_msg("%s vs %s, step %d: loss %.9g vs %.9g, norm %.9g vs %.9g (tol %g)", dp, one, k + 1, lN[k],
                     l1[k], nN[k], n1[k], tol);
    }
    printf("  %s vs %s: %d steps, worst relative difference %.3g (tol %g)\n", dp, one, STEPS, worst, tol);
}

static void same_as_one_rank(const char *state, mt_state_format f, double tol) {
    char one[64], extra[128];
    snprintf(one, sizeof one, "one_%s", state);
    snprintf(extra, sizeof extra, "--state %s --no-save", state);
    run_ok(0, one, extra);
    int64_t total;
    int L;
    double b1 = one_rank_bytes(f, &total, &L), per = b1 / (double)total;
    for (int np = 2; np <= 3; np++) {
        char dp[64];
        snprintf(dp, sizeof dp, "np%d_%s", np, state);
        run_ok(np, dp, extra);
        /* rank 0 alone speaks: one header, one line per step */
        assert_int_equal(count_of(g_out, "training 0.0M parameters"), 1);
        assert_int_equal(count_of(g_out, "final loss"), 1);
        assert_non_null(strstr(g_out, "data parallel: "));
        compare_runs(one, dp, tol);
        double bN = reported_bytes();
        printf("  %s: one rank %.0f bytes of host state, each of %d ranks %.0f (1/N %.0f)\n", state, b1, np, bN,
               b1 / np);
        assert_true(bN * np >= b1);
        assert_true(bN <= b1 / np + (double)(L + 2) * 256 * per);
    }
}

static void test_full(void **state) { same_as_one_rank("full", MT_STATE_FULL, 1e-5); }
static void test_compact(void **state) { same_as_one_rank("compact", MT_STATE_COMPACT, 1e-3); }
static void test_tight(void **state) { same_as_one_rank("tight", MT_STATE_TIGHT, 1e-3); }

/* mpirun's MPMD form: rank 0 and rank 1 get different flags. */
static void mismatch(const char *flag, const char *a, const char *b) {
    char args_a[4096], args_b[4096], extra[256], cmd[9000];
    snprintf(extra, sizeof extra, "--no-save %s %s", flag, a);
    train_args(args_a, sizeof args_a, "mismatch", extra);
    snprintf(extra, sizeof extra, "--no-save %s %s", flag, b);
    train_args(args_b, sizeof args_b, "mismatch", extra);
    snprintf(cmd, sizeof cmd, "timeout 120 '%s' --allow-run-as-root --oversubscribe -np 1 '%s' %s : -np 1 '%s' %s",
             g_mpirun, g_env.bin, args_a, g_env.bin, args_b);
    double t0 = now_s();
    int rc = mt_test_run(cmd, g_out, sizeof g_out);
    double secs = now_s() - t0;
    printf("  %s %s / %s: exit %d after %.1f s\n", flag, a, b, rc, secs);
    assert_true(rc != 0 && rc != 124); /* 124: `timeout` had to end it */
    char want[128];
    snprintf(want, sizeof want, "the ranks differ in %s: rank 1 differs from rank 0's", flag);
    if (!strstr(g_out, want)) fail_msg("no '%s' in:\n%s", want, g_out);
    assert_true(secs < 60);
    assert_null(strstr(g_out, "step 1/")); /* ended before training */
}

static void test_mismatched_flags(void **state) {
    mismatch("--lr", "1e-2", "2e-2");
    mismatch("--seed", "1", "2");
    mismatch("--state", "full", "compact");
}

/* Refused by name, the message printed once although every rank has it. */
static void refused(int np, const char *extra, const char *needle) {
    int rc = run(np, "refused", extra, NULL);
    if (rc != 1 || !strstr(g_out, needle)) fail_msg("exit %d, want 1 and '%s':\n%s", rc, needle, g_out);
    char first[1024];
    assert_int_equal(mt_cli_error_lines(g_out, first, sizeof first), 1);
    printf("  %s\n", first);
}

static void test_refusals(void **state) {
    refused(2, "", "checkpoints of a run on 2 ranks are not written yet");
    refused(2, "--resume", "--resume: a run on 2 ranks cannot resume yet");
    refused(2, "--no-save --batch 5", "--batch 5: the global batch must divide by 2 ranks");
    refused(2, "--no-save --micro-batch 2 --batch 6", "--batch 6: the global batch must divide by 2 ranks x micro-batch 2");
    refused(3, "--no-save --gpu-layers 1", "--gpu-layers 1: the GPU tier is not supported on 3 ranks");
}

int main(void) {
    g_mpirun = getenv("MT_MPIRUN");
    if (!g_mpirun || !*g_mpirun) {
        printf("test_cli_dp: skipped, no MT_MPIRUN (the build has no MPI)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_compact),
        cmocka_unit_test(test_tight),
        cmocka_unit_test(test_mismatched_flags),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
