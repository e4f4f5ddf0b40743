/* data/map_guard.h: a token file or packed file truncated while mapped.
 *  - mt_map_guard_check passes while the file is whole and, once it shrank, is MT_ERR naming the
 *    file and both sizes; unguarded or closed mappings pass;
 *  - the SIGBUS backstop (a read of a lost page, bypassing the check) in a child process: one line
 *    naming the file on stderr and exit 1, not a death by SIGBUS; a SIGBUS that is not a data
 *    mapping's still kills with SIGBUS. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "data/map_guard.h"
#include "data/packed.h"
#include "data/tokens.h"
#include "util/testutil.h"

static char *g_tmp;

static int setup(void **state) {
    g_tmp = mt_test_tmpdir();
    return 0;
}

static int teardown(void **state) {
    mt_test_rmtree(g_tmp);
    free(g_tmp);
    return 0;
}

/* A token file of n uint16 tokens (ids i % 50) at TMP/name; 3 pages for n = 6000. */
static void write_tokens(char *path, size_t size, const char *name, int n) {
    snprintf(path, size, "%s/%s", g_tmp, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        unsigned char b[2] = {(unsigned char)(i % 50), 0};
        assert_int_equal(fwrite(b, 1, 2, f), 2);
    }
    assert_int_equal(fclose(f), 0);
}

static void write_packed(char *path, size_t size, const char *name) {
    snprintf(path, size, "%s/%s", g_tmp, name);
    mt_packed_writer w;
    assert_int_equal(mt_packed_writer_open(&w, path, 16, 50, 2, 0, MT_PACK_WHOLE), MT_OK);
    int32_t ids[17];
    uint8_t trained[17];
    for (int d = 0; d < 400; d++) {
        for (int i = 0; i < 17; i++) ids[i] = (d + i) % 50, trained[i] = 1;
        assert_int_equal(mt_packed_writer_add(&w, ids, trained, 17), MT_OK);
    }
    assert_int_equal(mt_packed_writer_commit(&w), MT_OK);
}

static void test_check(void **state) {
    char path[4096];
    write_tokens(path, sizeof path, "check.bin", 6000);
    mt_token_file f;
    assert_int_equal(mt_tokens_open(&f, path, 2, 50), MT_OK);
    assert_int_equal(mt_map_guard_check(f.data), MT_OK);
    assert_int_equal(truncate(path, 100), 0);
    mt_error_clear();
    assert_int_equal(mt_map_guard_check(f.data), MT_ERR);
    const char *msg = mt_error_message();
    print_message("  %s\n", msg);
    assert_non_null(strstr(msg, path));
    assert_non_null(strstr(msg, "shrank from 12000 to 100 bytes"));
    assert_non_null(strstr(msg, "nothing of it was applied"));
    assert_null(strchr(msg, '\n'));
    mt_tokens_close(&f);
    assert_int_equal(mt_map_guard_check(f.data), MT_OK); /* closed: no longer guarded */
    int x = 0;
    assert_int_equal(mt_map_guard_check(&x), MT_OK);     /* never guarded */

    /* growing is fine (an append does not lose mapped pages) */
    write_tokens(path, sizeof path, "grow.bin", 100);
    assert_int_equal(mt_tokens_open(&f, path, 2, 50), MT_OK);
    FILE *a = fopen(path, "ab");
    fputs("more", a);
    fclose(a);
    assert_int_equal(mt_map_guard_check(f.data), MT_OK);
    mt_tokens_close(&f);

    /* packed rows too */
    write_packed(path, sizeof path, "check.packed");
    mt_packed_file p;
    assert_int_equal(mt_packed_open(&p, path, 16, 50), MT_OK);
    assert_int_equal(mt_map_guard_check(p.data), MT_OK);
    assert_int_equal(truncate(path, 64), 0);
    assert_int_equal(mt_map_guard_check(p.data), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "check.packed: the data file shrank from"));
    mt_packed_close(&p);
}

/* Runs body(path, file) in a child with the guard installed and stderr into a pipe; returns the
 * wait status, the child's stderr in err. The file is opened before the fork: the child of a
 * process with an OpenMP thread pool must not start parallel regions (the validation scans). */
static int in_child(void (*body)(const char *, void *), const char *path, void *file, char *err,
                    size_t err_size) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        mt_map_guard_install();
        body(path, file);
        _exit(7); /* the body must not return */
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < err_size && (k = read(fds[0], err + n, err_size - 1 - n)) > 0) n += (size_t)k;
    err[n] = '\0';
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

static volatile int32_t sink;

/* Reads the last token of a file truncated to nothing: the read is past the end, no check first. */
static void read_truncated_tokens(const char *path, void *file) {
    const mt_token_file *f = file;
    if (truncate(path, 0) != 0) _exit(4);
    sink = mt_tokens_at(f, f->n_tokens - 1);
}

static void read_truncated_packed(const char *path, void *file) {
    const mt_packed_file *f = file;
    if (truncate(path, 64) != 0) _exit(4);
    int32_t in[16], tg[16], ds[16];
    mt_packed_row(f, f->rows - 1, in, tg, ds);
    sink = in[0];
}

static void raise_sigbus(const char *path, void *file) {
    (void)path, (void)file;
    raise(SIGBUS);
}

static void test_sigbus_backstop(void **state) {
    char path[4096], err[4096];
    write_tokens(path, sizeof path, "bus.bin", 6000);
    mt_token_file t;
    assert_int_equal(mt_tokens_open(&t, path, 2, 50), MT_OK);
    int st = in_child(read_truncated_tokens, path, &t, err, sizeof err);
    mt_tokens_close(&t);
    print_message("  child: %s", err);
    if (!WIFEXITED(st)) fail_msg("the child died of signal %d: %s", WTERMSIG(st), err);
    assert_int_equal(WEXITSTATUS(st), 1);
    char want[4200];
    snprintf(want, sizeof want, "megatrain: %s: the data file was truncated while being read", path);
    assert_non_null(strstr(err, want));
    assert_non_null(strstr(err, "nothing of it was applied\n"));

    write_packed(path, sizeof path, "bus.packed");
    mt_packed_file p;
    assert_int_equal(mt_packed_open(&p, path, 16, 50), MT_OK);
    st = in_child(read_truncated_packed, path, &p, err, sizeof err);
    mt_packed_close(&p);
    if (!WIFEXITED(st)) fail_msg("the child died of signal %d: %s", WTERMSIG(st), err);
    assert_int_equal(WEXITSTATUS(st), 1);
    assert_non_null(strstr(err, "bus.packed: the data file was truncated"));

    /* not a data mapping: still a SIGBUS death, not a data message */
    st = in_child(raise_sigbus, path, NULL, err, sizeof err);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGBUS);
    assert_null(strstr(err, "truncated"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_sigbus_backstop),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
