/* The `megatrain` binary (env MT_BIN) when its data file is truncated under a running `train`
 * (rewritten in place): one line naming the file and exit 1 -- not a SIGBUS (exit 135) -- and the
 * last checkpoint saved before stays whole (eval loads it). And data that is not a regular file (a
 * FIFO, a directory, a device): refused by name before it is opened. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/testutil.h"

#define OUT_SIZE 65536

static mt_cli_env g;
static pid_t g_child = -1; /* a train still running when a check failed: killed in teardown */

static int setup(void **state) { return mt_cli_env_init(&g, "train_llama"); }

static int teardown(void **state) {
    if (g_child > 0) {
        kill(g_child, SIGKILL);
        waitpid(g_child, NULL, 0);
    }
    mt_cli_env_free(&g);
    return 0;
}

static void test_truncated_under_train(void **state) {
    static char out[OUT_SIZE];
    char data[4096], log[4096], cmd[8192];
    snprintf(data, sizeof data, "%s/d.bin", g.tmp);
    snprintf(log, sizeof log, "%s/train.out", g.tmp);
    mt_test_sh("cp '%s/data.bin' '%s'", g.fixture, data);
    /* far more steps than the test waits for: it ends only by the truncation (or is killed) */
    snprintf(cmd, sizeof cmd,
             "cd '%s' && exec '%s' train --model '%s' --data d.bin --out run --steps 1000000 --batch 2 "
             "--seq 16 --save-every 5 --no-shuffle > train.out 2>&1",
             g.tmp, g.bin, g.fixture);
    fflush(NULL);
    g_child = fork();
    assert_true(g_child >= 0);
    if (g_child == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    /* after step 7 a checkpoint (step 5, or a later one by the time of the truncation) is on disk */
    double t0 = mt_test_now_s();
    while (!strstr(out, "step 7/")) {
        if (mt_test_now_s() - t0 > 120) fail_msg("no 'step 7/' line after 120 s:\n%s", out);
        if (waitpid(g_child, NULL, WNOHANG) == g_child) {
            g_child = -1;
            mt_test_read_text(log, out, OUT_SIZE);
            fail_msg("train ended before the truncation:\n%s", out);
        }
        mt_test_sleep_ms(5);
        mt_test_read_text(log, out, OUT_SIZE);
    }
    assert_int_equal(truncate(data, 0), 0);
    int status = 0;
    t0 = mt_test_now_s();
    while (waitpid(g_child, &status, WNOHANG) == 0) {
        if (mt_test_now_s() - t0 > 60) fail_msg("train still running 60 s after the truncation");
        mt_test_sleep_ms(5);
    }
    g_child = -1;
    mt_test_read_text(log, out, OUT_SIZE);
    if (WIFSIGNALED(status)) fail_msg("train died of signal %d:\n%s", WTERMSIG(status), out);
    char first[2048];
    int n_err = mt_cli_error_lines(out, first, sizeof first);
    printf("train: exit %d: %s\n", WEXITSTATUS(status), first);
    assert_int_equal(WEXITSTATUS(status), 1);
    assert_int_equal(n_err, 1);
    /* the size check before the batch, or (a read racing the truncation) the SIGBUS backstop */
    if (!strstr(first, "megatrain: d.bin: the data file shrank from 6000 to 0 bytes while being read") &&
        !strstr(first, "megatrain: d.bin: the data file was truncated while being read"))
        fail_msg("the error does not name d.bin and what happened: %s", first);
    assert_non_null(strstr(first, "nothing of it was applied"));
    if (strstr(out, "Sanitizer") || strstr(out, "runtime error:")) fail_msg("sanitizer report:\n%s", out);

    /* the last checkpoint saved before is whole: eval loads it (on an intact copy of the data) */
    int rc = mt_cli_run(&g, out, OUT_SIZE, "eval --model run/checkpoints/$(ls run/checkpoints | grep '^step_' | "
                        "sort | tail -1) --data '%s/data.bin' --batch 2 --seq 16 --batches 1 2>&1", g.fixture);
    mt_cli_expect(rc, 0, out, "loss");
}

/* `cd tmp && timeout 10 megatrain ARGS`: a command that blocks (opening a FIFO that has no writer)
 * is killed and fails the test (exit 124) instead of hanging it. */
static int run_bounded(char *out, size_t size, const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cd '%s' && timeout 10 '%s' %s 2>&1", g.tmp, g.bin, args);
    int rc = mt_test_run(cmd, out, size);
    if (rc == 124) fail_msg("still running after 10 s (blocked on the FIFO?): %s\n%s", args, out);
    return rc;
}

static void expect_refused(const char *args, const char *needle) {
    static char out[OUT_SIZE];
    int rc = run_bounded(out, OUT_SIZE, args);
    char first[2048];
    int n_err = mt_cli_error_lines(out, first, sizeof first);
    printf("%s -> exit %d: %s\n", args, rc, first);
    assert_int_equal(rc, 1);
    assert_int_equal(n_err, 1);
    if (!strstr(first, needle)) fail_msg("'%s' not in the error: %s", needle, first);
}

/* --data / --eval-data / eval --data naming a FIFO with no writer, a directory or a device: refused
 * at once with one line naming the flag, the path and what it is -- never opened (which blocks). */
static void test_not_regular_file(void **state) {
    char args[4096];
    mt_test_sh("cd '%s' && rm -f pipe.bin && mkfifo pipe.bin && mkdir -p dir.bin", g.tmp);
    snprintf(args, sizeof args, "train --model '%s' --data pipe.bin --out run_fifo --steps 1 --batch 2 --seq 16",
             g.fixture);
    expect_refused(args, "megatrain: --data pipe.bin: is a FIFO (named pipe), not a regular file");
    snprintf(args, sizeof args, "train --model '%s' --data '%s/data.bin' --eval-data pipe.bin --out run_fifo "
             "--steps 1 --batch 2 --seq 16", g.fixture, g.fixture);
    expect_refused(args, "megatrain: --eval-data pipe.bin: is a FIFO (named pipe), not a regular file");
    snprintf(args, sizeof args, "eval --model '%s' --data pipe.bin --batch 2 --seq 16 --batches 1", g.fixture);
    expect_refused(args, "megatrain: --data pipe.bin: is a FIFO (named pipe), not a regular file");
    snprintf(args, sizeof args, "train --model '%s' --data dir.bin --out run_dir --steps 1 --batch 2 --seq 16",
             g.fixture);
    expect_refused(args, "megatrain: --data dir.bin: is a directory, not a regular file");
    snprintf(args, sizeof args, "train --model '%s' --data /dev/null --out run_dev --steps 1 --batch 2 --seq 16",
             g.fixture);
    expect_refused(args, "megatrain: --data /dev/null: is a character device, not a regular file");
    /* refused before --out is made: nothing left behind */
    char path[4096];
    snprintf(path, sizeof path, "%s/run_fifo", g.tmp);
    assert_int_not_equal(access(path, F_OK), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncated_under_train),
        cmocka_unit_test(test_not_regular_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
