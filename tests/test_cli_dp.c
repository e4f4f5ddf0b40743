/* `mpirun -np N megatrain train` (binary in MT_BIN, mpirun in MT_MPIRUN; both set by ctest) on the
 * train_llama fixture, against one process without mpirun on the same global batch:
 *  - N = 2 and 3 (an odd count), --state full, compact and tight: the same per-step losses and
 *    gradient norms in metrics.jsonl, and the same final weights in the checkpoint's
 *    model.safetensors (rank 0 writes the one-rank layout), within the engine's stated tolerances
 *    (test_engine_dp: fp32 reassociation, 1e-5 relative; the 8-bit formats 1e-3 and 1e-2), rank 0
 *    alone printing the step lines and writing metrics.jsonl; the evaluations (--eval-every) too;
 *  - resumed on the same N (--stop-at 6, then --resume to 12) a run is bit-identical to the
 *    uninterrupted one: the metrics' printed numbers and the final checkpoint's model and
 *    optimizer files byte for byte (full and tight on 2 ranks, compact and tight on 3);
 *  - a checkpoint of 2 ranks resumes on 3 and on one process (converted: each rank keeps its
 *    shard of the one checkpoint), within the tolerance of the uninterrupted run;
 *  - the host state each rank reports is 1/N of one rank's (computed here from the same table)
 *    up to the 256-element padding of each group's shard;
 *  - a flag that differs between the ranks (mpirun's MPMD form: `-np 1 ... --lr A : -np 1 ...
 *    --lr B`) ends the job within a bounded time with an error naming the flag;
 *  - a rank killed (SIGKILL) mid-run ends the job, non-zero, within a bounded time; a SIGTERM
 *    that reaches one rank only stops every rank after the same step, with the final checkpoint
 *    saved and exit 0;
 *  - what N ranks do not do is refused by name, printed once: a --batch that N x --micro-batch
 *    does not divide, the GPU tier;
 *  - a mixture of experts with its load-balancing loss trains on N ranks as on one (test_moe);
 *  - LoRA adapters train on N ranks as on one, and resume bit for bit (test_lora);
 *  - each of N ranks on this host plans with 1/N of its available RAM (printed: "host RAM: ...");
 *  - the ranks write the checkpoint, each its shard: a one-rank checkpoint saved again by 2 and 3
 *    ranks is the one-rank files byte for byte, and verifies.
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
#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"
#include "util/run_compare.h"
#include "util/testutil.h"

#define OUT_SIZE (1 << 17)
#define STEPS 6
#define MAX_STEPS 16

static mt_cli_env g_env;
static const char *g_mpirun;
static char g_out[OUT_SIZE];

static int setup(void **state) {
    *state = &g_env; /* for mt_cli_env_teardown */
    return mt_cli_env_init(&g_env, "train_llama");
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
    double t0 = mt_test_now_s();
    int rc = mt_test_run(cmd, g_out, sizeof g_out);
    if (secs) *secs = mt_test_now_s() - t0;
    if (strstr(g_out, "Sanitizer") || strstr(g_out, "runtime error:")) fail_msg("sanitizer report: %s\n%s", cmd, g_out);
    return rc;
}

static void run_ok(int np, const char *out, const char *extra) {
    int rc = run(np, out, extra, NULL);
    if (rc != 0) fail_msg("exit %d (np %d, %s)\n%s", rc, np, extra, g_out);
}

/* The loss and grad_norm of each step line of OUT/metrics.jsonl; text as mt_test_read_step_metrics. */
static int read_metrics_text(const char *out, double *loss, double *norm, char (*text)[256]) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", g_env.tmp, out);
    return mt_test_read_step_metrics(path, MAX_STEPS, loss, norm, text);
}

static int read_metrics(const char *out, double *loss, double *norm) {
    return read_metrics_text(out, loss, norm, NULL);
}

/* The eval_loss values of OUT/metrics.jsonl, in order; returns their count. */
static int read_evals(const char *out, double *eval) {
    char path[4096], line[4096];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", g_env.tmp, out);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        json_t *e = json_object_get(j, "eval_loss");
        if (e && n < MAX_STEPS) eval[n++] = json_number_value(e);
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

static void compare_runs(const char *one, const char *dp, double tol, int steps) {
    double l1[MAX_STEPS], n1[MAX_STEPS], lN[MAX_STEPS], nN[MAX_STEPS];
    assert_int_equal(read_metrics(one, l1, n1), steps);
    assert_int_equal(read_metrics(dp, lN, nN), steps);
    double worst = 0;
    for (int k = 0; k < steps; k++) {
        double el = fabs(lN[k] - l1[k]) / fabs(l1[k]), en = fabs(nN[k] - n1[k]) / fabs(n1[k]);
        worst = fmax(worst, fmax(el, en));
        if (el > tol || en > tol)
            fail_msg("%s vs %s, step %d: loss %.9g vs %.9g, norm %.9g vs %.9g (tol %g)", dp, one, k + 1, lN[k],
                     l1[k], nN[k], n1[k], tol);
    }
    printf("  %s vs %s: %d steps, worst relative difference %.3g (tol %g)\n", dp, one, steps, worst, tol);
}

static void ckpt_file(char *buf, size_t n, const char *out, int step, const char *file) {
    snprintf(buf, n, "%s/%s/checkpoints/step_%08d/%s", g_env.tmp, out, step, file);
}

/* The final weights of two runs' checkpoints (model.safetensors, every tensor), within tol
 * relative to the largest |weight| of each tensor. */
static void compare_weights(const char *one, const char *dp, int step, double tol) {
    char pa[4200], pb[4200];
    ckpt_file(pa, sizeof pa, one, step, "model.safetensors");
    ckpt_file(pb, sizeof pb, dp, step, "model.safetensors");
    mt_test_weights_close(pa, pb, dp, tol);
}

static void same_as_one_rank(const char *state, mt_state_format f, double tol) {
    char one[64], extra[128];
    snprintf(one, sizeof one, "one_%s", state);
    snprintf(extra, sizeof extra, "--state %s --eval-data '%s/data.bin' --eval-every 3 --eval-batches 2", state,
             g_env.fixture);
    run_ok(0, one, extra);
    double e1[MAX_STEPS], eN[MAX_STEPS];
    assert_int_equal(read_evals(one, e1), 2);
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
        compare_runs(one, dp, tol, STEPS);
        compare_weights(one, dp, STEPS, f == MT_STATE_FULL ? 1e-5 : 1e-2);
        /* evaluation: each rank its rows of every eval batch, the loss summed over the ranks */
        assert_int_equal(read_evals(dp, eN), 2);
        for (int k = 0; k < 2; k++)
            if (fabs(eN[k] - e1[k]) > tol * fabs(e1[k])) fail_msg("%s eval %d: %.6f vs %.6f", dp, k, eN[k], e1[k]);
        double bN = reported_bytes();
        printf("  %s: one rank %.0f bytes of host state, each of %d ranks %.0f (1/N %.0f)\n", state, b1, np, bN,
               b1 / np);
        assert_true(bN * np >= b1);
        assert_true(bN <= b1 / np + (double)(L + 2) * 256 * per);
    }
}

/* Uninterrupted 12 steps against 6, then --resume to 12, on np ranks: the same bits. */
static void resume_same_n(const char *state, int np) {
    char a[64], b[64], extra[256];
    snprintf(a, sizeof a, "whole_%s_np%d", state, np);
    snprintf(b, sizeof b, "resumed_%s_np%d", state, np);
    snprintf(extra, sizeof extra, "--state %s --steps 12 --save-every 6", state);
    run_ok(np, a, extra);
    snprintf(extra, sizeof extra, "--state %s --steps 12 --save-every 6 --stop-at 6", state);
    run_ok(np, b, extra);
    snprintf(extra, sizeof extra, "--state %s --steps 12 --save-every 6 --resume", state);
    run_ok(np, b, extra);
    assert_non_null(strstr(g_out, "resuming from "));
    double l[MAX_STEPS], n[MAX_STEPS];
    char ta[MAX_STEPS][256], tb[MAX_STEPS][256];
    assert_int_equal(read_metrics_text(a, l, n, ta), 12);
    assert_int_equal(read_metrics_text(b, l, n, tb), 12);
    for (int k = 0; k < 12; k++)
        if (strcmp(ta[k], tb[k])) fail_msg("%s step %d: %s, resumed %s", state, k + 1, ta[k], tb[k]);
    static const char *const files[] = {"model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        char pa[4200], pb[4200];
        ckpt_file(pa, sizeof pa, a, 12, files[i]);
        ckpt_file(pb, sizeof pb, b, 12, files[i]);
        mt_test_same_bytes(pa, pb);
    }
    printf("  %s on %d ranks: resumed at step 6 = uninterrupted (12 steps' numbers, both files byte for byte)\n",
           state, np);
}

static void test_resume_same_ranks(void **state) {
    resume_same_n("full", 2);
    resume_same_n("tight", 2);
    resume_same_n("compact", 3);
    resume_same_n("tight", 3);
}

/* A checkpoint of 2 ranks at step 6, resumed to 12 on 3 ranks and on one process: each rank
 * takes its shard of the one checkpoint; the steps match the uninterrupted 2-rank run within the
 * tolerance of test_full. */
static void test_resume_other_ranks(void **state) {
    const char *extra = "--steps 12 --save-every 6";
    run_ok(2, "whole_np2", extra);
    int targets[] = {3, 0};
    for (int i = 0; i < 2; i++) {
        char out[64];
        snprintf(out, sizeof out, "from_np2_on_%d", targets[i]);
        mt_test_sh("mkdir -p '%s/%s/checkpoints' && cp -r '%s/whole_np2/checkpoints/step_00000006' '%s/%s/checkpoints/' "
                   "&& head -6 '%s/whole_np2/metrics.jsonl' > '%s/%s/metrics.jsonl'",
                   g_env.tmp, out, g_env.tmp, g_env.tmp, out, g_env.tmp, g_env.tmp, out);
        run_ok(targets[i], out, "--steps 12 --save-every 6 --resume");
        assert_non_null(strstr(g_out, "resuming from "));
        compare_runs("whole_np2", out, 1e-5, 12);
        compare_weights("whole_np2", out, 12, 1e-5);
    }
}

/* A one-rank checkpoint resumed on np ranks with no step left is saved again by the ranks, each
 * writing its shard into the one directory: its files are the one-rank files byte for byte. */
static void test_resave_on_ranks(void **state) {
    static const char *const states[] = {"full", "tight"};
    for (int i = 0; i < 2; i++) {
        char one[64], extra[128];
        snprintf(one, sizeof one, "saved1_%s", states[i]);
        snprintf(extra, sizeof extra, "--state %s", states[i]);
        run_ok(0, one, extra);
        for (int np = 2; np <= 3; np++) {
            char out[64];
            snprintf(out, sizeof out, "resaved_np%d_%s", np, states[i]);
            mt_test_sh("mkdir -p '%s/%s/checkpoints' && cp -r '%s/%s/checkpoints/step_%08d' '%s/%s/checkpoints/' && "
                       "cp '%s/%s/metrics.jsonl' '%s/%s/'",
                       g_env.tmp, out, g_env.tmp, one, STEPS, g_env.tmp, out, g_env.tmp, one, g_env.tmp, out);
            snprintf(extra, sizeof extra, "--state %s --resume", states[i]);
            run_ok(np, out, extra);
            if (!strstr(g_out, "saved ")) fail_msg("np %d did not save:\n%s", np, g_out);
            static const char *const files[] = {"model.safetensors", "optimizer.safetensors", "config.json"};
            for (int k = 0; k < 3; k++) {
                char pa[4200], pb[4200];
                ckpt_file(pa, sizeof pa, one, STEPS, files[k]);
                ckpt_file(pb, sizeof pb, out, STEPS, files[k]);
                mt_test_same_bytes(pa, pb);
            }
            /* and it verifies: one process resumes from it */
            snprintf(extra, sizeof extra, "--state %s --resume --resume-changed --steps %d", states[i], STEPS + 1);
            run_ok(0, out, extra);
            printf("  %s, saved again by %d ranks: the one-rank files byte for byte\n", states[i], np);
        }
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
    double t0 = mt_test_now_s();
    int rc = mt_test_run(cmd, g_out, sizeof g_out);
    double secs = mt_test_now_s() - t0;
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

/* A long run on 2 ranks, each started through `sh -c 'echo $$ > pid.R; exec megatrain ...'` so that
 * its pid is known; once the first step is logged, `kill -SIG` goes to rank 1 alone. Returns the
 * job's exit status; the seconds from the signal to the job's end in *secs; output in g_out. */
static int signal_rank1(const char *sig, const char *out, double *secs) {
    char args[4096], cmd[16384];
    train_args(args, sizeof args, out, "--steps 100000");
    snprintf(cmd, sizeof cmd,
             "cd '%s' || exit 1; rm -f pid.0 pid.1; "
             "(timeout 120 '%s' --allow-run-as-root --oversubscribe -np 2 sh -c "
             "'echo $$ > pid.$OMPI_COMM_WORLD_RANK; exec \"$0\" \"$@\"' '%s' %s > job.log 2>&1; echo $? > job.rc) & "
             "for i in $(seq 1200); do [ -s '%s/metrics.jsonl' ] && [ -s pid.1 ] && break; sleep 0.05; done; "
             "t0=$(date +%%s.%%N); kill -%s $(cat pid.1); wait; t1=$(date +%%s.%%N); "
             "cat job.log; echo \"rc $(cat job.rc) secs $(awk \"BEGIN { print $t1 - $t0 }\")\"",
             g_env.tmp, g_mpirun, g_env.bin, args, out, sig);
    mt_test_run(cmd, g_out, sizeof g_out);
    const char *p = strstr(g_out, "\nrc ");
    if (!p) fail_msg("no result line:\n%s", g_out);
    int rc = -1;
    *secs = -1;
    sscanf(p, "\nrc %d secs %lf", &rc, secs);
    printf("  kill -%s rank 1: job exit %d, %.1f s after the signal\n", sig, rc, *secs);
    return rc;
}

static void test_killed_rank(void **state) {
    double secs;
    int rc = signal_rank1("KILL", "killed", &secs);
    assert_true(rc != 0 && rc != 124); /* 124: `timeout` had to end it */
    assert_true(secs >= 0 && secs < 30);
}

static void test_signal_one_rank(void **state) {
    double secs;
    int rc = signal_rank1("TERM", "termed", &secs);
    if (rc != 0) fail_msg("exit %d:\n%s", rc, g_out);
    const char *p = strstr(g_out, "SIGTERM: stopping after step ");
    if (!p) fail_msg("no stop note:\n%s", g_out);
    int step = atoi(p + strlen("SIGTERM: stopping after step "));
    assert_true(step >= 1 && step < 100000);
    char ck[4200];
    ckpt_file(ck, sizeof ck, "termed", step, "model.safetensors");
    FILE *f = fopen(ck, "rb");
    if (!f) fail_msg("no checkpoint of step %d (%s):\n%s", step, ck, g_out);
    fclose(f);
    printf("  SIGTERM to rank 1: every rank stopped after step %d, checkpoint saved\n", step);
}

/* Refused by name, the message printed once although every rank has it. */
static void refused(int np, const char *extra, const char *needle) {
    int rc = run(np, "refused", extra, NULL);
    if (rc != 1 || !strstr(g_out, needle)) fail_msg("exit %d, want 1 and '%s':\n%s", rc, needle, g_out);
    char first[1024];
    assert_int_equal(mt_cli_error_lines(g_out, first, sizeof first), 1);
    printf("  %s\n", first);
}

/* MemAvailable now, in GiB (-1 when unknown). */
static double mem_available_gib(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    double kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb / 1048576.0;
}

/* The ranks of one host divide its RAM: each plans with its share (the old ranks each planned
 * with all of it, together overcommitting the host np times). */
static void test_host_share(void **state) {
    for (int np = 2; np <= 3; np++) {
        run_ok(np, "host_share", "--no-save --steps 2 --overwrite");
        double avail = mem_available_gib();
        const char *p = strstr(g_out, "host RAM: ");
        if (!p) fail_msg("no host RAM line:\n%s", g_out);
        double each = atof(p + strlen("host RAM: "));
        char want[64];
        snprintf(want, sizeof want, "shared by its %d ranks", np);
        assert_non_null(strstr(p, want));
        printf("  np %d: %.2f GiB for each rank, MemAvailable %.2f GiB (/%d = %.2f)\n", np, each, avail, np,
               avail / np);
        assert_true(avail > 0 && fabs(each - avail / np) < 0.2 * avail / np);
    }
}

static void test_refusals(void **state) {
    refused(2, "--no-save --batch 5", "--batch 5: the global batch must divide by 2 ranks");
    refused(2, "--no-save --micro-batch 2 --batch 6", "--batch 6: the global batch must divide by 2 ranks x micro-batch 2");
    refused(3, "--no-save --gpu-layers 1", "--gpu-layers 1: the GPU tier is not supported on 3 ranks");
}

/* A mixture of experts with the load-balancing loss (train_qwen3_moe: 4 experts, top 2, a dense
 * layer first, router_aux_loss_coef 0.05) on 2 and 3 ranks against one process: the aux loss and
 * its gradient come from every rank's router statistics summed (mt_moe_aux_finish's reduce), so
 * the losses, norms and final weights are one process's within fp32 reassociation. With each rank
 * using its own rows' statistics instead (checked) step 1's loss is 1.1e-4 and its gradient norm
 * 0.5% off one process's here. */
static void test_moe(void **state) {
    char extra[4400];
    /* its own fixture: after --model's, this one wins */
    snprintf(extra, sizeof extra, "--model '%s/../train_qwen3_moe' --data '%s/../train_qwen3_moe/data.bin'",
             g_env.fixture, g_env.fixture);
    run_ok(0, "one_moe", extra);
    for (int np = 2; np <= 3; np++) {
        char dp[64];
        snprintf(dp, sizeof dp, "np%d_moe", np);
        run_ok(np, dp, extra);
        assert_non_null(strstr(g_out, "mixture of experts: "));
        compare_runs("one_moe", dp, 1e-5, STEPS);
        compare_weights("one_moe", dp, STEPS, 1e-5);
    }
}

/* Qwen3.5's MoE (train_qwen3_5_moe: Gated DeltaNet and gated attention layers, 4 experts, top 2,
 * a gated shared expert in every layer, the load-balancing loss summed over the ranks): N ranks =
 * one process over 2 steps (loss and norm within 1e-5). Not 6 steps and the final weights as
 * above: the ranks' fp32 sums (rank parts, then their sum) differ from one process's sequential
 * sum in the last bits, and AdamW's first steps (an update of about lr * sign(g)) turn that noise
 * into whole updates on the elements whose gradient is near zero, which this tiny DeltaNet has (its
 * gate projections): measured 1.0e-4 in the norm at step 3 and 4e-3 at step 4 on 2 ranks, the
 * same growth on the dense train_qwen3_5; step 2 agrees to 2e-6. */
static void test_qwen3_5_moe(void **state) {
    char extra[4400];
    snprintf(extra, sizeof extra, "--model '%s/../train_qwen3_5_moe' --data '%s/../train_qwen3_5_moe/data.bin' "
             "--seq 32 --steps 2", g_env.fixture, g_env.fixture);
    run_ok(0, "one_q35", extra);
    for (int np = 2; np <= 3; np++) {
        char dp[64];
        snprintf(dp, sizeof dp, "np%d_q35", np);
        run_ok(np, dp, extra);
        assert_non_null(strstr(g_out, "mixture of experts: "));
        compare_runs("one_q35", dp, 1e-5, 2);
    }
}

/* LoRA (the lora_llama fixture: PEFT's rank-4 adapters on the frozen train_llama base): N ranks =
 * one process within 1e-5 (the adapters' gradient is summed over the ranks before its norm, and
 * every rank applies the same update); resumed at step 3 of 6 = uninterrupted, the adapter and
 * its moments byte for byte, on one process and on 2 ranks. */
static void test_lora(void **state) {
    char extra[4400], more[4600];
    snprintf(extra, sizeof extra, "--model '%s/../lora_llama/base' --adapter '%s/../lora_llama/adapter_init'",
             g_env.fixture, g_env.fixture);
    run_ok(0, "one_lora", extra);
    assert_non_null(strstr(g_out, "LoRA: rank 4"));
    for (int np = 2; np <= 3; np++) {
        char dp[64], pa[4200], pb[4200];
        snprintf(dp, sizeof dp, "np%d_lora", np);
        run_ok(np, dp, extra);
        compare_runs("one_lora", dp, 1e-5, STEPS);
        ckpt_file(pa, sizeof pa, "one_lora", STEPS, "adapter_model.safetensors");
        ckpt_file(pb, sizeof pb, dp, STEPS, "adapter_model.safetensors");
        mt_test_weights_close(pa, pb, dp, 1e-5);
    }
    for (int np = 0; np <= 2; np += 2) {
        char a[64], b[64];
        snprintf(a, sizeof a, "whole_lora_np%d", np);
        snprintf(b, sizeof b, "resumed_lora_np%d", np);
        snprintf(more, sizeof more, "%s --save-every 3", extra);
        run_ok(np, a, more);
        snprintf(more, sizeof more, "%s --save-every 3 --stop-at 3", extra);
        run_ok(np, b, more);
        snprintf(more, sizeof more, "%s --save-every 3 --resume", extra);
        run_ok(np, b, more);
        assert_non_null(strstr(g_out, "resuming from "));
        static const char *const files[] = {"adapter_model.safetensors", "adapter_optimizer.safetensors"};
        for (int i = 0; i < 2; i++) {
            char pa[4200], pb[4200];
            ckpt_file(pa, sizeof pa, a, STEPS, files[i]);
            ckpt_file(pb, sizeof pb, b, STEPS, files[i]);
            mt_test_same_bytes(pa, pb);
        }
        printf("  LoRA on %d process%s: resumed at step 3 = uninterrupted (adapter and moments byte for byte)\n",
               np ? np : 1, np ? "es" : "");
    }
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
        cmocka_unit_test(test_resume_same_ranks),
        cmocka_unit_test(test_resume_other_ranks),
        cmocka_unit_test(test_resave_on_ranks),
        cmocka_unit_test(test_mismatched_flags),
        cmocka_unit_test(test_killed_rank),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_qwen3_5_moe),
        cmocka_unit_test(test_lora),
        cmocka_unit_test(test_signal_one_rank),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_host_share),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
