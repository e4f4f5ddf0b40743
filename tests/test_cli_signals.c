/* SIGINT and SIGTERM stop `megatrain train` (binary in env MT_BIN) cleanly: the current step
 * finishes, a checkpoint is saved and the process exits 0. A long run (--steps 100000) on the
 * train_llama fixture is started with fork+exec, signalled once metrics.jsonl holds at least 2
 * step lines, and waited for (bounded: SIGKILL and fail after 60 s). Then the newest checkpoint's
 * trainer_state.json step must equal the number of step lines in metrics.jsonl, and --resume must
 * continue from it: one more step (--stop-at step+1) appends exactly that step.
 * What ends a save: a file-size limit is a write error naming the file (exit 1); another signal
 * that kills the process during a save says so; --resume removes what a killed save left. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/testutil.h"

#define OUT_SIZE 65536
#define WAIT_S 60.0

static mt_cli_env g_env;

static int setup(void **state) {
    *state = &g_env; /* for mt_cli_env_teardown */
    return mt_cli_env_init(&g_env, "train_llama");
}

/* Step lines ("loss" objects) of PATH, checking they run 1, 2, ...; *last = the last step. */
static int64_t step_lines(const char *path, int64_t *last) {
    FILE *f = fopen(path, "r");
    *last = 0;
    if (!f) return 0;
    char line[4096];
    int64_t n = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strchr(line, '\n')) break; /* a line still being written */
        json_error_t err;
        json_t *j = json_loads(line, 0, &err);
        if (!j) fail_msg("%s: not JSON: %s", path, line);
        if (json_object_get(j, "loss")) {
            int64_t s = json_integer_value(json_object_get(j, "step"));
            if (s != n + 1) fail_msg("%s: step %lld after %lld lines", path, (long long)s, (long long)n);
            *last = s;
            n++;
        }
        json_decref(j);
    }
    fclose(f);
    return n;
}

static int status_exit_code(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The highest step_ directory of OUT/checkpoints → its trainer_state.json step (-1: none). */
static int64_t newest_checkpoint_step(const char *out_dir, char *name, size_t name_size) {
    char path[4096];
    snprintf(path, sizeof path, "%s/checkpoints", out_dir);
    DIR *d = opendir(path);
    if (!d) return -1;
    name[0] = '\0';
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "step_", 5) && strcmp(e->d_name, name) > 0) snprintf(name, name_size, "%s", e->d_name);
    closedir(d);
    if (!name[0]) return -1;
    snprintf(path, sizeof path, "%s/checkpoints/%s/trainer_state.json", out_dir, name);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j) fail_msg("%s: %s", path, err.text);
    json_t *s = json_object_get(j, "step");
    if (!json_is_integer(s)) fail_msg("%s: no integer step", path);
    int64_t step = json_integer_value(s);
    json_decref(j);
    return step;
}

static void check_clean_output(const char *what, const char *out) {
    if (strstr(out, "Sanitizer") || strstr(out, "runtime error:")) fail_msg("%s: sanitizer report:\n%s", what, out);
}

static void signal_case(int sig, const char *name) {
    char out_dir[4096], log_path[4200], metrics[4200], seq_arg[16];
    snprintf(out_dir, sizeof out_dir, "%s/run_%s", g_env.tmp, name);
    snprintf(log_path, sizeof log_path, "%s/%s.log", g_env.tmp, name);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", out_dir);
    char model[4096], data[4096];
    snprintf(model, sizeof model, "%s", g_env.fixture);
    snprintf(data, sizeof data, "%s/data.bin", g_env.fixture);
    snprintf(seq_arg, sizeof seq_arg, "48");
    char *const argv[] = {(char *)g_env.bin, "train", "--model", model, "--data", data, "--steps", "100000",
                          "--batch", "4", "--seq", seq_arg, "--device", "cpu", "--out", out_dir, NULL};

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(126);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        close(fd);
        execv(g_env.bin, argv);
        _exit(127);
    }
    double t0 = mt_test_now_s();
    int64_t last = 0, lines = 0;
    int status = 0, exited = 0;
    /* wait for 2 step lines (the run fails the test if it exits by itself first) */
    while (mt_test_now_s() - t0 < WAIT_S) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            exited = 1;
            break;
        }
        if ((lines = step_lines(metrics, &last)) >= 2) break;
        mt_test_sleep_ms(10);
    }
    static char log[OUT_SIZE]; /* static: a failing check longjmps out */
    if (exited) {
        mt_test_read_text(log_path, log, OUT_SIZE);
        fail_msg("%s run exited (%d) before it was signalled:\n%s", name, status_exit_code(status), log);
    }
    if (lines < 2) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        mt_test_read_text(log_path, log, OUT_SIZE);
        fail_msg("%s run: no 2 steps within %.0f s:\n%s", name, WAIT_S, log);
    }
    double t_sig = mt_test_now_s();
    assert_int_equal(kill(pid, sig), 0);
    while (!exited && mt_test_now_s() - t_sig < WAIT_S) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) exited = 1;
        else if (w < 0 && errno != EINTR) fail_msg("waitpid: %s", strerror(errno));
        else mt_test_sleep_ms(10);
    }
    mt_test_read_text(log_path, log, OUT_SIZE);
    if (!exited) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("%s: the run did not exit within %.0f s of the signal:\n%s", name, WAIT_S, log);
    }
    check_clean_output(name, log);
    int code = status_exit_code(status);
    int64_t n = step_lines(metrics, &last);
    fprintf(stderr, "  %s after %lld step lines: exit %d in %.2f s, %lld step lines at exit\n", name,
            (long long)lines, code, mt_test_now_s() - t_sig, (long long)n);
    if (code != 0) fail_msg("%s: exit %d, want 0:\n%s", name, code, log);
    char ckpt[256];
    int64_t step = newest_checkpoint_step(out_dir, ckpt, sizeof ckpt);
    fprintf(stderr, "  newest checkpoint %s, trainer_state step %lld\n", ckpt, (long long)step);
    if (step != n) fail_msg("%s: newest checkpoint step %lld, metrics.jsonl has %lld step lines:\n%s", name,
                            (long long)step, (long long)n, log);
    char want_name[64], note[64];
    snprintf(want_name, sizeof want_name, "step_%08lld", (long long)step);
    assert_string_equal(ckpt, want_name);
    snprintf(note, sizeof note, "%s: stopping after step %lld", name, (long long)step);
    if (!strstr(log, note)) fail_msg("the log does not say '%s':\n%s", note, log);

    /* --resume continues from it: exactly one more step */
    char cmd[16384];
    snprintf(cmd, sizeof cmd,
             "'%s' train --model '%s' --data '%s' --steps 100000 --batch 4 --seq 48 --device cpu --out '%s' "
             "--resume --stop-at %lld",
             g_env.bin, model, data, out_dir, (long long)step + 1);
    int rc = mt_test_run(cmd, log, OUT_SIZE);
    check_clean_output(cmd, log);
    if (rc != 0) fail_msg("resume: exit %d: %s\n%s", rc, cmd, log);
    if (!strstr(log, "resuming from") || !strstr(log, want_name))
        fail_msg("resume did not start from %s:\n%s", want_name, log);
    int64_t n2 = step_lines(metrics, &last);
    assert_int_equal(n2, step + 1);
    assert_int_equal(last, step + 1);
    assert_int_equal(newest_checkpoint_step(out_dir, ckpt, sizeof ckpt), step + 1);
    fprintf(stderr, "  resumed: step %lld done, %s saved\n", (long long)step + 1, ckpt);
}

static void test_sigint(void **state) { signal_case(SIGINT, "SIGINT"); }
static void test_sigterm(void **state) { signal_case(SIGTERM, "SIGTERM"); }

/* ---- what ends a save ---- */

/* Under a file-size limit (ulimit -f 100: 50 KB in sh's 512-byte blocks, 100 KB in bash's; the
 * model file is 100 KB + header) the save's write fails with EFBIG: exit 1 and one error naming the
 * file, no temporary directory left behind. (Before: SIGXFSZ killed the process, exit 153 and no
 * word, and .tmp-step_00000002.* stayed.) */
static void test_file_size_limit(void **state) {
    static char out[OUT_SIZE];
    char cmd[16384];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && ulimit -f 100 && '%s' train --model '%s' --data '%s/data.bin' --batch 2 --seq 16 "
             "--device cpu --out fsize --steps 2",
             g_env.tmp, g_env.bin, g_env.fixture, g_env.fixture);
    int rc = mt_test_run(cmd, out, sizeof out);
    check_clean_output("ulimit -f", out);
    if (rc != 1) fail_msg("exit %d, want 1:\n%s", rc, out);
    char first[8192];
    if (mt_cli_error_lines(out, first, sizeof first) != 1) fail_msg("want one error line:\n%s", out);
    if (!strstr(first, "fsize/checkpoints/.tmp-step_00000002.") || !strstr(first, ".safetensors") ||
        !strstr(first, "File too large (the file-size limit, ulimit -f)"))
        fail_msg("the error should name the file and EFBIG: %s", first);
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/fsize/checkpoints", g_env.tmp);
    assert_int_equal(mt_test_count_prefix(dir, ".tmp-"), 0);
    assert_int_equal(mt_test_count_prefix(dir, "step_"), 0);
}

/* A signal that kills the process in the middle of a save says so on stderr. The save is held in
 * place deterministically: the model directory's generation_config.json, which a checkpoint copies
 * last, is a FIFO that nobody writes, so the save waits in its open(). SIGHUP then ends the process
 * (its default), after the line. The next --resume removes the dead save's temporary directory. */
static void test_signal_during_save(void **state) {
    char model[4096], log_path[4200], out_dir[4200], ckdir[4300];
    snprintf(model, sizeof model, "%s/fifo_model", g_env.tmp);
    snprintf(log_path, sizeof log_path, "%s/fifo.log", g_env.tmp);
    snprintf(out_dir, sizeof out_dir, "%s/fifo_run", g_env.tmp);
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", out_dir);
    mt_test_sh("mkdir -p '%s' && cp '%s/config.json' '%s/model.safetensors' '%s/' && mkfifo '%s/generation_config.json'",
               model, g_env.fixture, g_env.fixture, model, model);
    char data[4200];
    snprintf(data, sizeof data, "%s/data.bin", g_env.fixture);
    char *const argv[] = {(char *)g_env.bin, "train", "--model", model, "--data", data, "--steps", "1",
                          "--batch", "2", "--seq", "16", "--device", "cpu", "--out", out_dir, NULL};
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(126);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        close(fd);
        execv(g_env.bin, argv);
        _exit(127);
    }
    static char log[OUT_SIZE];
    int status = 0, exited = 0;
    double t0 = mt_test_now_s();
    /* the save has begun once its temporary directory holds the optimizer file */
    while (mt_test_now_s() - t0 < WAIT_S && !exited) {
        if (waitpid(pid, &status, WNOHANG) == pid) exited = 1;
        else if (mt_test_count_prefix(ckdir, ".tmp-step_00000001.") == 1) break;
        else mt_test_sleep_ms(10);
    }
    mt_test_sleep_ms(200); /* into the open() of the FIFO */
    if (exited) {
        mt_test_read_text(log_path, log, OUT_SIZE);
        fail_msg("the run exited (%d) before its save was signalled:\n%s", status_exit_code(status), log);
    }
    assert_int_equal(kill(pid, SIGHUP), 0);
    t0 = mt_test_now_s();
    while (!exited && mt_test_now_s() - t0 < WAIT_S) {
        if (waitpid(pid, &status, WNOHANG) == pid) exited = 1;
        else mt_test_sleep_ms(10);
    }
    mt_test_read_text(log_path, log, OUT_SIZE);
    if (!exited) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("no exit within %.0f s of SIGHUP:\n%s", WAIT_S, log);
    }
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGHUP)
        fail_msg("want death by SIGHUP, got exit %d:\n%s", status_exit_code(status), log);
    if (!strstr(log, "megatrain: SIGHUP while writing the checkpoint of step 1 into ") ||
        !strstr(log, "fifo_run/checkpoints: it was not written"))
        fail_msg("no word of the save it ended:\n%s", log);
    assert_int_equal(mt_test_count_prefix(ckdir, ".tmp-step_00000001."), 1);
}

/* --resume removes the temporary checkpoint directories no live save holds (a killed save's), even
 * when its own save fails (here under ulimit -f: no prune runs). (Before: they stayed until a save
 * succeeded.) */
static void test_resume_removes_stale_temps(void **state) {
    static char out[OUT_SIZE];
    char cmd[16384], ckdir[4200];
    const char *common = "--batch 2 --seq 16 --device cpu --out stale --steps 4";
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' train --model '%s' --data '%s/data.bin' %s --stop-at 1", g_env.tmp,
             g_env.bin, g_env.fixture, g_env.fixture, common);
    if (mt_test_run(cmd, out, sizeof out) != 0) fail_msg("%s\n%s", cmd, out);
    snprintf(ckdir, sizeof ckdir, "%s/stale/checkpoints", g_env.tmp);
    mt_test_sh("mkdir '%s/.tmp-step_00000002.Ab12Cd' && echo x > '%s/.tmp-step_00000002.Ab12Cd/model.safetensors.tmp.Zz9Yy8'",
               ckdir, ckdir);
    snprintf(cmd, sizeof cmd, "cd '%s' && ulimit -f 100 && '%s' train --model '%s' --data '%s/data.bin' %s --resume --stop-at 2",
             g_env.tmp, g_env.bin, g_env.fixture, g_env.fixture, common);
    int rc = mt_test_run(cmd, out, sizeof out);
    check_clean_output(cmd, out);
    if (rc != 1 || !strstr(out, "File too large")) fail_msg("exit %d, want 1 (File too large): %s\n%s", rc, cmd, out);
    if (!strstr(out, "--resume: removed 1 temporary checkpoint directory in stale/checkpoints (a save that was killed)"))
        fail_msg("no note of the removal:\n%s", out);
    assert_int_equal(mt_test_count_prefix(ckdir, ".tmp-"), 0);
    assert_int_equal(mt_test_count_prefix(ckdir, "step_00000001"), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigint),
        cmocka_unit_test(test_sigterm),
        cmocka_unit_test(test_file_size_limit),
        cmocka_unit_test(test_signal_during_save),
        cmocka_unit_test(test_resume_removes_stale_temps),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
