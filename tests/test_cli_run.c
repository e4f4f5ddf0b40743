/* What `megatrain train` (binary in env MT_BIN) does with its --out directory and with bad steps:
 * non-finite steps are skipped or stop the run without a checkpoint of them; a used --out is
 * refused unless --overwrite; --resume cuts metrics.jsonl back to its checkpoint and refuses
 * changed settings unless --resume-changed; two processes never share an --out; a failed write
 * to metrics.jsonl or --log ends the run with exit 1, the last checkpoint intact; CPU runs write
 * no GPU fields, and every run ends with a summary. On the train_llama fixture (2 layers, C 32). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "util/testutil.h"

#define OUT_SIZE 65536

static mt_cli_env g_env;
static char g_out[OUT_SIZE]; /* static: a failing check longjmps out */

static int setup(void **state) {
    *state = &g_env; /* for mt_cli_env_teardown */
    return mt_cli_env_init(&g_env, "train_llama");
}

/* `train` on the fixture with the common flags, EXTRA and --out OUT (in the temporary dir). */
static int train(const char *out_dir, const char *extra) {
    return mt_cli_train(&g_env, g_out, sizeof g_out, out_dir, extra);
}

static void train_ok(const char *out_dir, const char *extra) {
    mt_cli_train_ok(&g_env, g_out, sizeof g_out, out_dir, extra);
}

/* The one error line of the last run (fails unless there is exactly one). */
static const char *error_line(void) {
    static char first[8192];
    int n = mt_cli_error_lines(g_out, first, sizeof first);
    if (n != 1) fail_msg("%d error lines, want 1:\n%s", n, g_out);
    return first;
}

static void expect_in(const char *text, const char *needle) {
    if (!strstr(text, needle)) fail_msg("'%s' is not in:\n%s", needle, text);
}

static char *path_in(const char *out_dir, const char *rel) {
    static char path[8][4096];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 4096, "%s/%s/%s", g_env.tmp, out_dir, rel);
    return p;
}

/* The lines of OUT/metrics.jsonl, each parsed (fails on one that is not a JSON object). */
static int metrics_lines(const char *out_dir, json_t **lines, int max) {
    FILE *f = fopen(path_in(out_dir, "metrics.jsonl"), "r");
    if (!f) fail_msg("%s: no metrics.jsonl", out_dir);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t err;
        json_t *j = json_loads(line, 0, &err);
        if (!json_is_object(j)) fail_msg("%s/metrics.jsonl line %d is not a JSON object: %s", out_dir, n + 1, line);
        if (n >= max) fail_msg("%s/metrics.jsonl: more than %d lines", out_dir, max);
        lines[n++] = j;
    }
    fclose(f);
    return n;
}

static void free_lines(json_t **lines, int n) {
    for (int i = 0; i < n; i++) json_decref(lines[i]);
}

static int64_t int_of(const json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) fail_msg("no integer \"%s\"", key);
    return json_integer_value(v);
}

/* Step lines (those with "loss") must run 1..n, each once; their count. Eval lines are counted
 * into *evals. */
static int step_lines(const char *out_dir, int *evals) {
    FILE *f = fopen(path_in(out_dir, "metrics.jsonl"), "r");
    if (!f) fail_msg("%s: no metrics.jsonl", out_dir);
    static char line[4096];
    int steps = 0;
    *evals = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t err;
        json_t *j = json_loads(line, 0, &err);
        if (!json_is_object(j)) fail_msg("%s/metrics.jsonl: not a JSON object: %s", out_dir, line);
        if (json_object_get(j, "loss")) {
            int64_t s = int_of(j, "step");
            if (s != steps + 1) fail_msg("%s/metrics.jsonl: step %lld after step %d", out_dir, (long long)s, steps);
            steps++;
        } else if (json_object_get(j, "eval_loss")) {
            (*evals)++;
        }
        json_decref(j);
    }
    fclose(f);
    return steps;
}

/* Sorted step_ directories of OUT/checkpoints → names; their count. */
static int checkpoints(const char *out_dir, char names[][64], int max) {
    DIR *d = opendir(path_in(out_dir, "checkpoints"));
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "step_", 5) && n < max) snprintf(names[n++], 64, "%.63s", e->d_name);
    closedir(d);
    qsort(names, (size_t)n, 64, (int (*)(const void *, const void *))strcmp);
    return n;
}

/* Every value of every F32 tensor in the file is finite. */
static void all_finite(const char *path) {
    mt_safetensors *st;
    if (mt_safetensors_open_file(&st, path) != MT_OK) fail_msg("%s", mt_error_message());
    size_t checked = 0;
    for (int i = 0; i < mt_safetensors_count(st); i++) {
        const mt_st_tensor *t = mt_safetensors_at(st, i);
        const float *x = t->data;
        for (size_t k = 0; k < t->nbytes / sizeof(float); k++)
            if (!isfinite(x[k])) fail_msg("%s: %s[%zu] = %g", path, t->name, k, x[k]);
        checked += t->nbytes / sizeof(float);
    }
    mt_safetensors_close(st);
    assert_true(checked > 0);
}

static json_t *trainer_state(const char *out_dir, const char *ckpt) {
    char rel[600];
    snprintf(rel, sizeof rel, "checkpoints/%s/trainer_state.json", ckpt);
    json_error_t err;
    json_t *j = json_load_file(path_in(out_dir, rel), 0, &err);
    if (!j) fail_msg("%s/%s: %s", out_dir, rel, err.text);
    return j;
}

/* The whole file (malloc'd, *n bytes). */
static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)size + 1);
    *n = fread(buf, 1, (size_t)size, f);
    fclose(f);
    return buf;
}

/* The train_llama config with initializer_range `std` as TMP/NAME. */
static void write_config(const char *name, double std) {
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/config.json", g_env.fixture);
    snprintf(dst, sizeof dst, "%s/%s", g_env.tmp, name);
    json_error_t err;
    json_t *cfg = json_load_file(src, 0, &err);
    assert_non_null(cfg);
    json_object_set_new(cfg, "initializer_range", json_real(std));
    assert_int_equal(json_dump_file(cfg, dst, 0), 0);
    json_decref(cfg);
}

static int train_init(const char *config, const char *out_dir, const char *extra) {
    return mt_cli_run(&g_env, g_out, sizeof g_out,
                      "train --init %s --data '%s/data.bin' --batch 2 --seq 16 --device cpu --out %s %s", config,
                      g_env.fixture, out_dir, extra);
}

/* ---- non-finite steps ---- */

/* initializer_range 1e25: the first step's gradient norm is already NaN (the loss is finite), and
 * so is every later one, since no update is applied. The default policy skips three in a row and
 * stops: exit 1, the error names the last good checkpoint, the checkpoints written after skipped
 * steps hold the initial (finite) weights with updates 0, and none is written for the stopping
 * step. (Before: step 1's NaN update was applied and saved as step_00000001.) */
static void test_nonfinite_skip_then_stop(void **state) {
    write_config("huge_init.json", 1e25);
    int rc = train_init("huge_init.json", "nan_skip", "--steps 10 --save-every 1 --keep 5");
    assert_int_equal(rc, 1);
    const char *err = error_line();
    fprintf(stderr, "  %s\n", err);
    expect_in(err, "step 3: ");
    expect_in(err, "3 in a row, --max-nonfinite 3");
    expect_in(err, "no checkpoint was written");
    expect_in(err, "the last good checkpoint is nan_skip/checkpoints/step_00000002");
    expect_in(err, "lower --lr");
    expect_in(g_out, "step 1: loss 4.564, gradient norm nan: update skipped (1 in a row");
    char names[8][64];
    assert_int_equal(checkpoints("nan_skip", names, 8), 2);
    assert_string_equal(names[0], "step_00000001");
    assert_string_equal(names[1], "step_00000002");
    for (int i = 0; i < 2; i++) {
        char rel[600];
        snprintf(rel, sizeof rel, "checkpoints/%s/model.safetensors", names[i]);
        all_finite(path_in("nan_skip", rel));
        snprintf(rel, sizeof rel, "checkpoints/%s/optimizer.safetensors", names[i]);
        all_finite(path_in("nan_skip", rel));
        json_t *st = trainer_state("nan_skip", names[i]);
        assert_int_equal(int_of(st, "step"), i + 1);
        assert_int_equal(int_of(st, "updates"), 0);
        assert_int_equal(int_of(st, "skipped"), i + 1);
        json_decref(st);
    }
    /* metrics.jsonl: valid JSON, the non-finite numbers null, the two keys the plot reads */
    json_t *lines[16];
    int n = metrics_lines("nan_skip", lines, 16);
    assert_int_equal(n, 3);
    for (int i = 0; i < n; i++) {
        assert_true(json_is_null(json_object_get(lines[i], "grad_norm")));
        assert_true(json_is_number(json_object_get(lines[i], "loss")));
        assert_true(json_is_true(json_object_get(lines[i], "nonfinite")));
        assert_true(json_is_true(json_object_get(lines[i], "skipped")));
    }
    free_lines(lines, n);
}

/* --on-nonfinite stop: the first non-finite step ends the run, and nothing is saved. */
static void test_nonfinite_stop(void **state) {
    write_config("huge_init2.json", 1e25);
    int rc = train_init("huge_init2.json", "nan_stop", "--steps 10 --save-every 1 --on-nonfinite stop");
    assert_int_equal(rc, 1);
    const char *err = error_line();
    expect_in(err, "step 1: loss 4.564, gradient norm nan (--on-nonfinite stop)");
    expect_in(err, "there is no checkpoint of this run yet");
    char names[8][64];
    assert_int_equal(checkpoints("nan_stop", names, 8), 0);
    int evals;
    assert_int_equal(step_lines("nan_stop", &evals), 1);
}

/* ---- a used --out ---- */

/* A fresh run into a directory that holds a run is refused and changes nothing there; with
 * --overwrite the old metrics and checkpoints go (a later --resume then continues the new run,
 * not the old one) while data caches and the user's files stay. */
static void test_used_out(void **state) {
    train_ok("used", "--steps 6 --stop-at 3");
    int rc = train("used", "--steps 6 --stop-at 2");
    assert_int_equal(rc, 1);
    const char *err = error_line();
    fprintf(stderr, "  %s\n", err);
    expect_in(err, "--out used already holds a run (metrics.jsonl and checkpoints/step_00000003)");
    expect_in(err, "--resume");
    expect_in(err, "--overwrite");
    int evals;
    assert_int_equal(step_lines("used", &evals), 3);
    char names[8][64];
    assert_int_equal(checkpoints("used", names, 8), 1);

    mt_test_sh("echo mine > '%s' && echo mine > '%s' && echo cache > '%s'", path_in("used", "notes.txt"),
               path_in("used", "checkpoints/README"), path_in("used", "data.bin.tokens.bin"));
    train_ok("used", "--steps 6 --stop-at 2 --overwrite");
    expect_in(g_out, "--overwrite: removed the previous run's metrics.jsonl and checkpoints/step_00000003");
    assert_int_equal(step_lines("used", &evals), 2);
    assert_int_equal(checkpoints("used", names, 8), 1);
    assert_string_equal(names[0], "step_00000002");
    assert_int_equal(access(path_in("used", "notes.txt"), F_OK), 0);
    assert_int_equal(access(path_in("used", "checkpoints/README"), F_OK), 0);
    assert_int_equal(access(path_in("used", "data.bin.tokens.bin"), F_OK), 0);
    train_ok("used", "--steps 6 --stop-at 4 --resume");
    expect_in(g_out, "resuming from used/checkpoints/step_00000002 (step 2)");
    assert_int_equal(step_lines("used", &evals), 4);

    /* --resume with metrics but no checkpoint is refused too */
    train_ok("nosave", "--steps 3 --no-save");
    rc = train("nosave", "--steps 3 --resume");
    assert_int_equal(rc, 1);
    err = error_line();
    expect_in(err, "--resume: nosave holds a run's metrics.jsonl but no checkpoint");
    expect_in(err, "--overwrite");
    assert_int_equal(step_lines("nosave", &evals), 3);
}

/* --resume from an older checkpoint than the metrics reach: the lines of later steps (eval lines
 * too) and a torn last line are dropped, so every step and evaluation is listed once. */
static void test_resume_cuts_metrics(void **state) {
    const char *flags = "--steps 8 --save-every 2 --keep 5 --eval-data '%s/data.bin' --eval-every 2 --eval-batches 1";
    char extra[4096];
    snprintf(extra, sizeof extra, flags, g_env.fixture);
    char first[4200];
    snprintf(first, sizeof first, "%s --stop-at 5", extra);
    train_ok("cut", first);
    int evals;
    assert_int_equal(step_lines("cut", &evals), 5);
    assert_int_equal(evals, 3); /* steps 2, 4 and the end (5) */
    /* as if the checkpoints of steps 4 and 5 were lost, and a crash had torn a line */
    mt_test_sh("rm -r '%s' '%s' && printf '{\"step\": 6, \"lo' >> '%s'", path_in("cut", "checkpoints/step_00000004"),
               path_in("cut", "checkpoints/step_00000005"), path_in("cut", "metrics.jsonl"));
    char resume[4200];
    snprintf(resume, sizeof resume, "%s --resume", extra);
    train_ok("cut", resume);
    expect_in(g_out, "resuming from cut/checkpoints/step_00000002 (step 2; 6 later lines of metrics.jsonl dropped)");
    assert_int_equal(step_lines("cut", &evals), 8);
    assert_int_equal(evals, 4); /* 2, 4, 6, 8 */
}

/* ---- verified resume ---- */

/* A damaged newest checkpoint (one byte of its weights flipped) is passed over, with a warning
 * naming both, and the run goes on from the newest intact one; a checkpoint whose weights were
 * replaced by an exported bf16 model is refused with what to do instead. */
static void test_resume_verified(void **state) {
    train_ok("dmg", "--steps 6 --stop-at 4 --save-every 2 --keep 5");
    /* flip one byte in the middle of step 4's weights (past the header: the data, not the JSON) */
    mt_test_sh("f='%s'; n=$(stat -c %%s \"$f\"); o=$((n - 64)); "
               "b=$(dd if=\"$f\" bs=1 skip=$o count=1 2>/dev/null | od -An -tu1 | tr -d ' '); "
               "printf \"$(printf '\\\\%%03o' $(( (b + 1) %% 256 )))\" | dd of=\"$f\" bs=1 seek=$o conv=notrunc 2>/dev/null",
               path_in("dmg", "checkpoints/step_00000004/model.safetensors"));
    train_ok("dmg", "--steps 6 --save-every 2 --keep 5 --resume");
    expect_in(g_out, "megatrain: warning: dmg/checkpoints/step_00000004 is damaged (");
    expect_in(g_out, "checksum");
    expect_in(g_out, "resuming from step_00000002 instead");
    expect_in(g_out, "resuming from dmg/checkpoints/step_00000002 (step 2");
    int evals;
    assert_int_equal(step_lines("dmg", &evals), 6);

    /* convert into a checkpoint: its fp32 master replaced by bf16 (convert refuses --out == --model;
     * a copy through another directory does the same damage) */
    train_ok("exp", "--steps 4 --stop-at 2 --save-every 2");
    mt_test_sh("cd '%s' && '%s' convert --model exp/checkpoints/step_00000002 --out exported >/dev/null && "
               "cp exported/model.safetensors exp/checkpoints/step_00000002/model.safetensors",
               g_env.tmp, g_env.bin);
    int rc = train("exp", "--steps 4 --resume");
    assert_int_equal(rc, 1);
    const char *line = error_line();
    expect_in(line, "holds bf16 weights: an exported model, not a training checkpoint");
    expect_in(line, "--model");
}

/* --resume without --micro-batch keeps the checkpoint's micro-batch (auto could pick another on a
 * machine in another state, and micro-batches change the summation order): the resumed run ends
 * with the same bits as the uninterrupted one. */
static void test_resume_keeps_micro_batch(void **state) {
    train_ok("mb_whole", "--steps 4 --micro-batch 1");
    train_ok("mb_cut", "--steps 4 --stop-at 2 --micro-batch 1");
    train_ok("mb_cut", "--steps 4 --resume");
    expect_in(g_out, "--resume: micro-batch 1, as the checkpoint's run");
    mt_test_sh("cmp '%s' '%s'", path_in("mb_whole", "checkpoints/step_00000004/model.safetensors"),
               path_in("mb_cut", "checkpoints/step_00000004/model.safetensors"));
}

/* ---- resume with other settings ---- */

static void test_resume_changed_settings(void **state) {
    train_ok("chg", "--steps 6 --stop-at 2");
    /* what changes the math is refused, by name, and nothing in OUT changes */
    int rc = train("chg", "--steps 6 --resume --lr 0.02 --seed 7 --no-shuffle --micro-batch 1 --threads 1");
    assert_int_equal(rc, 1);
    const char *err = error_line();
    fprintf(stderr, "  %s\n", err);
    expect_in(err, "--resume: chg/checkpoints/step_00000002 was trained with other settings: ");
    expect_in(err, "--seed 1337 -> 7");
    expect_in(err, "--no-shuffle shuffled -> in order");
    expect_in(err, "--lr 0.01 -> 0.02");
    expect_in(err, "--min-lr 0.001 -> 0.002");
    expect_in(err, "--resume-changed");
    assert_null(strstr(err, "--micro-batch"));
    assert_null(strstr(err, "--threads"));
    int evals;
    assert_int_equal(step_lines("chg", &evals), 2);
    /* the same with --resume-changed: a warning, and it goes on */
    train_ok("chg", "--steps 6 --stop-at 3 --resume --resume-changed --lr 0.02");
    expect_in(g_out, "megatrain: warning: --resume-changed: going on with changed settings: --lr 0.01 -> 0.02");
    expect_in(g_out, "resuming from chg/checkpoints/step_00000002");
    assert_int_equal(step_lines("chg", &evals), 3);
    /* flags that do not change the math: no warning (against the new checkpoint's --lr 0.02) */
    train_ok("chg", "--steps 6 --stop-at 4 --resume --lr 0.02 --micro-batch 1 --threads 1 --keep 1 --save-every 1");
    assert_null(strstr(g_out, "warning"));
    expect_in(g_out, "resuming from chg/checkpoints/step_00000003");
    assert_int_equal(step_lines("chg", &evals), 4);
}

/* ---- one process per --out ---- */

static int lines_in(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int n = 0, c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

/* A second train on the --out of a running one fails at once, naming the first's pid; the first
 * is not disturbed. */
static void test_one_process_per_out(void **state) {
    char data[4200], out_dir[4200];
    snprintf(data, sizeof data, "%s/data.bin", g_env.fixture);
    snprintf(out_dir, sizeof out_dir, "%s/locked", g_env.tmp);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1), dup2(fd, 2);
        execl(g_env.bin, g_env.bin, "train", "--model", g_env.fixture, "--data", data, "--batch", "2", "--seq", "16",
              "--device", "cpu", "--steps", "1000000", "--max-time", "4", "--out", out_dir, (char *)NULL);
        _exit(127);
    }
    double t0 = mt_test_now_s();
    while (lines_in(path_in("locked", "metrics.jsonl")) < 2 && mt_test_now_s() - t0 < 60) usleep(20000);
    assert_true(lines_in(path_in("locked", "metrics.jsonl")) >= 2);
    double t1 = mt_test_now_s();
    int rc = train("locked", "--steps 5");
    double took = mt_test_now_s() - t1;
    int status;
    assert_int_equal(waitpid(pid, &status, WNOHANG), 0); /* the first still runs */
    assert_int_equal(rc, 1);
    const char *err = error_line();
    fprintf(stderr, "  %s (after %.2f s)\n", err, took);
    char want[64];
    snprintf(want, sizeof want, "(pid %ld, host ", (long)pid);
    expect_in(err, "--out locked is in use by another megatrain train ");
    expect_in(err, want);
    assert_true(took < 20); /* it did not wait for the first to end */
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    int evals, steps = step_lines("locked", &evals);
    char names[8][64], want_ckpt[64];
    assert_int_equal(checkpoints("locked", names, 8), 1);
    snprintf(want_ckpt, sizeof want_ckpt, "step_%08d", steps);
    assert_string_equal(names[0], want_ckpt);
    fprintf(stderr, "  the first run: %d steps, metrics.jsonl intact, %s\n", steps, names[0]);
}

/* ---- write errors ---- */

static int can_mount_tmpfs(void) {
    char out[1024];
    return mt_test_run("unshare -rm sh -c 'mount -t tmpfs -o size=64k tmpfs /tmp'", out, sizeof out) == 0;
}

static void test_write_errors(void **state) {
    /* --log on a full device (ENOSPC at the first flush) */
    int rc = train("full_log", "--steps 4 --log /dev/full");
    assert_int_equal(rc, 1);
    assert_string_equal(error_line(), "megatrain: --log /dev/full: write failed: No space left on device");
    char names[8][64];
    assert_int_equal(checkpoints("full_log", names, 8), 0);

    /* the same on a resume: the last checkpoint stays, byte for byte, and nothing is added */
    train_ok("full_resume", "--steps 6 --stop-at 3");
    size_t n0, n1;
    char *before = slurp(path_in("full_resume", "checkpoints/step_00000003/model.safetensors"), &n0);
    rc = train("full_resume", "--steps 6 --resume --log /dev/full");
    assert_int_equal(rc, 1);
    assert_string_equal(error_line(), "megatrain: --log /dev/full: write failed: No space left on device");
    assert_int_equal(checkpoints("full_resume", names, 8), 1);
    assert_string_equal(names[0], "step_00000003");
    char *after = slurp(path_in("full_resume", "checkpoints/step_00000003/model.safetensors"), &n1);
    assert_true(n0 == n1 && memcmp(before, after, n0) == 0);
    free(before), free(after);

    /* metrics.jsonl on a full device */
    mt_test_sh("mkdir '%s/full_metrics' && ln -s /dev/full '%s'", g_env.tmp, path_in("full_metrics", "metrics.jsonl"));
    rc = train("full_metrics", "--steps 4");
    assert_int_equal(rc, 1);
    assert_string_equal(error_line(), "megatrain: full_metrics/metrics.jsonl: write failed: No space left on device");
    assert_int_equal(checkpoints("full_metrics", names, 8), 0);

    /* and on a filesystem that fills up (64 KiB hold ~190 step lines) */
    if (!can_mount_tmpfs()) {
        fprintf(stderr, "  (no tmpfs: unshare -rm cannot mount here; the full-filesystem case is not run)\n");
        return;
    }
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && mkdir small && unshare -rm sh -c \"mount -t tmpfs -o size=64k tmpfs small && '%s' train "
             "--model '%s' --data '%s/data.bin' --batch 2 --seq 16 --device cpu --steps 100000 --out small/run; "
             "echo exit=\\$?\"",
             g_env.tmp, g_env.bin, g_env.fixture, g_env.fixture);
    mt_test_run(cmd, g_out, sizeof g_out);
    expect_in(g_out, "exit=1");
    assert_string_equal(error_line(), "megatrain: small/run/metrics.jsonl: write failed: No space left on device");
    expect_in(g_out, "no checkpoint was written");
}

/* ---- what the user sees ---- */

/* Without OMP_WAIT_POLICY the process re-executes itself with PASSIVE (idle OpenMP threads sleep
 * instead of spinning, README "Threads"); a user's own setting is kept. The run header says which. */
static void test_wait_policy_default(void **state) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && env -u OMP_WAIT_POLICY '%s' train --model '%s' --data '%s/data.bin' --batch 2 --seq 16 "
             "--steps 1 --device cpu --no-save --out pol",
             g_env.tmp, g_env.bin, g_env.fixture, g_env.fixture);
    assert_int_equal(mt_test_run(cmd, g_out, sizeof g_out), 0);
    expect_in(g_out, "(OpenMP wait policy PASSIVE (megatrain's default))");
    snprintf(cmd, sizeof cmd,
             "cd '%s' && OMP_WAIT_POLICY=active '%s' train --model '%s' --data '%s/data.bin' --batch 2 --seq 16 "
             "--steps 1 --device cpu --no-save --overwrite --out pol",
             g_env.tmp, g_env.bin, g_env.fixture, g_env.fixture);
    assert_int_equal(mt_test_run(cmd, g_out, sizeof g_out), 0);
    expect_in(g_out, "(OpenMP wait policy active (OMP_WAIT_POLICY))");
}

static void test_cpu_lines_and_summary(void **state) {
    train_ok("seen", "--steps 5 --stop-at 4");
    json_t *lines[16];
    int n = metrics_lines("seen", lines, 16);
    assert_int_equal(n, 4);
    static const char *const gpu_keys[] = {"mfu", "gpu_busy", "h2d_gbs", "d2h_gbs", "opt_ms", "gpu_gib"};
    for (int i = 0; i < n; i++) {
        for (size_t k = 0; k < sizeof gpu_keys / sizeof gpu_keys[0]; k++)
            if (json_object_get(lines[i], gpu_keys[k])) fail_msg("a CPU run wrote \"%s\"", gpu_keys[k]);
        assert_non_null(json_object_get(lines[i], "host_gib"));
        assert_null(json_object_get(lines[i], "nonfinite"));
    }
    free_lines(lines, n);
    assert_null(strstr(g_out, "MFU"));
    assert_null(strstr(g_out, "GPU busy"));
    /* the ETA from the second step on */
    const char *s1 = strstr(g_out, "step 1/5 "), *s2 = strstr(g_out, "step 2/5 ");
    assert_non_null(s1), assert_non_null(s2);
    assert_null(memmem(s1, (size_t)(s2 - s1), "ETA", 3));
    expect_in(s2, "| ETA ");
    expect_in(g_out, "summary: steps 1-4 of 5 done in ");
    expect_in(g_out, "(0 skipped in all); 128 tokens, ");
    expect_in(g_out, "final loss ");
    expect_in(g_out, "last checkpoint: seen/checkpoints/step_00000004; continue with the same command and --resume");
    train_ok("seen", "--steps 5 --resume");
    expect_in(g_out, "summary: steps 5-5 of 5 done in ");
    expect_in(g_out, "last checkpoint: seen/checkpoints/step_00000005 (a Hugging Face model directory");

    int rc = mt_cli_run(&g_env, g_out, sizeof g_out, "train --help");
    assert_int_equal(rc, 0);
    static const char *const flags[] = {"--on-nonfinite", "--max-nonfinite", "--overwrite", "--resume-changed"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) expect_in(g_out, flags[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nonfinite_skip_then_stop),
        cmocka_unit_test(test_nonfinite_stop),
        cmocka_unit_test(test_used_out),
        cmocka_unit_test(test_resume_cuts_metrics),
        cmocka_unit_test(test_resume_verified),
        cmocka_unit_test(test_resume_keeps_micro_batch),
        cmocka_unit_test(test_resume_changed_settings),
        cmocka_unit_test(test_one_process_per_out),
        cmocka_unit_test(test_write_errors),
        cmocka_unit_test(test_cpu_lines_and_summary),
        cmocka_unit_test(test_wait_policy_default),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
