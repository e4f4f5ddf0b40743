/* Atomic files (io/atomic_file.h):
 *  - every writer has its own temporary (PATH.tmp.XXXXXX), so two writers of one PATH leave one
 *    complete result: the API with two open writers, and two concurrent `megatrain tokenize` runs
 *    (MT_BIN) to one --out, repeated, whose output is always exactly one run's;
 *  - a killed writer's leftover temporary (nobody holds its lock) is removed, a live writer's not;
 *  - the mode is what fopen gives; the digest is the file's XXH3-64;
 *  - a failed rename reports the real errno, and says "disk full" only for ENOSPC/EDQUOT. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/digest.h"
#include "util/testutil.h"

#define OUT_SIZE 65536
#define TOKENIZE_RUNS 12

static mt_cli_env g_env;

static int group_setup(void **state) {
    *state = &g_env; /* for mt_cli_env_teardown; the fixture is unused */
    return mt_cli_env_init(&g_env, "train_llama");
}

static char *path_in(const char *name) {
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/%s", g_env.tmp, name);
    return p;
}

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)size + 1);
    *n = fread(buf, 1, (size_t)size, f);
    buf[*n] = '\0';
    fclose(f);
    return buf;
}

static int exists(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0;
}

/* Entries of g_env.tmp (which must exist) whose names start with prefix. */
static int tmp_entries(const char *prefix) {
    assert_true(exists(g_env.tmp));
    return mt_test_count_prefix(g_env.tmp, prefix);
}

static void open_ok(mt_atomic_file *af, const char *path) {
    if (mt_atomic_open(af, path) != MT_OK) fail_msg("%s", mt_error_message());
}

/* Two writers of one path at once: distinct temporaries, each committed whole; the last wins. */
static void test_two_writers(void **state) {
    char *path = path_in("two.bin");
    mt_atomic_file a, b;
    open_ok(&a, path);
    open_ok(&b, path);
    printf("  temporaries: %s, %s\n", a.tmp, b.tmp);
    assert_true(strcmp(a.tmp, b.tmp) != 0);
    assert_true(strncmp(a.tmp, path, strlen(path)) == 0 && strncmp(a.tmp + strlen(path), ".tmp.", 5) == 0);
    assert_int_equal(mt_atomic_write(&a, "first writer, long text", 23), MT_OK);
    assert_int_equal(mt_atomic_write(&b, "second", 6), MT_OK);
    assert_int_equal(mt_atomic_write(&a, " and more", 9), MT_OK);
    mt_file_digest da, db;
    assert_int_equal(mt_atomic_commit_digest(&a, &da), MT_OK);
    size_t n;
    char *got = read_all(path, &n);
    assert_string_equal(got, "first writer, long text and more");
    free(got);
    assert_int_equal(mt_atomic_commit_digest(&b, &db), MT_OK);
    got = read_all(path, &n);
    assert_string_equal(got, "second");
    free(got);
    /* the digest is the committed file's */
    mt_file_digest d;
    assert_int_equal(mt_digest_file(path, &d), 0);
    assert_true(d.bytes == 6 && d.xxh3 == db.xxh3);
    assert_true(da.bytes == 32 && da.xxh3 != db.xxh3);
    assert_int_equal(tmp_entries("two.bin.tmp"), 0);
    /* the mode is fopen's under the umask */
    mode_t um = umask(022);
    mt_atomic_write_file(path, "x", 1);
    umask(um);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0644);
    free(path);
}

/* A leftover of a killed writer (no lock holder) goes at the next open; a live writer's and names
 * that are not ours stay. */
static void test_abandoned_temps(void **state) {
    char *path = path_in("left.bin");
    const char *mine[] = {"left.bin.tmp.Abc123", "left.bin.tmp.zzzzzz"};
    const char *others[] = {"left.bin.tmp", "left.bin.tmp.toolong1", "other.bin.tmp.Abc123",
                            "left.bin.tmp.ab-123"};
    for (size_t i = 0; i < 2; i++) mt_test_sh("echo stale > '%s/%s'", g_env.tmp, mine[i]);
    for (size_t i = 0; i < 4; i++) mt_test_sh("echo keep > '%s/%s'", g_env.tmp, others[i]);
    mt_atomic_file live, next;
    open_ok(&live, path);
    for (size_t i = 0; i < 2; i++) {
        char *p = path_in(mine[i]);
        assert_false(exists(p));
        free(p);
    }
    for (size_t i = 0; i < 4; i++) {
        char *p = path_in(others[i]);
        assert_true(exists(p));
        unlink(p);
        free(p);
    }
    open_ok(&next, path); /* sees live's temporary: locked, so left alone */
    assert_true(exists(live.tmp));
    assert_int_equal(mt_atomic_write(&live, "live", 4), MT_OK);
    assert_int_equal(mt_atomic_commit(&live), MT_OK);
    mt_atomic_abort(&next);
    assert_int_equal(tmp_entries("left.bin.tmp"), 0);
    size_t n;
    char *got = read_all(path, &n);
    assert_string_equal(got, "live");
    free(got);
    free(path);
}

/* A directory that vanished before the rename: the errno's text, not a guess about the disk. */
static void test_rename_errno(void **state) {
    char *dir = path_in("vanish");
    assert_int_equal(mkdir(dir, 0755), 0);
    char path[4200];
    snprintf(path, sizeof path, "%s/out.bin", dir);
    mt_atomic_file af;
    open_ok(&af, path);
    assert_int_equal(mt_atomic_write(&af, "data", 4), MT_OK);
    assert_int_equal(unlink(af.tmp), 0);
    assert_int_equal(rmdir(dir), 0);
    assert_int_equal(mt_atomic_commit(&af), MT_ERR);
    const char *msg = mt_error_message();
    printf("  error (expected): %s\n", msg);
    assert_non_null(strstr(msg, "rename failed: No such file or directory"));
    assert_null(strstr(msg, "disk full"));
    assert_false(exists(path));
    mt_atomic_abort(&af); /* safe after a failed commit */
    /* a read-only directory: EACCES (root is not refused, so only checked for other users) */
    if (geteuid() != 0) {
        assert_int_equal(mkdir(dir, 0755), 0);
        assert_int_equal(chmod(dir, 0555), 0);
        assert_int_equal(mt_atomic_open(&af, path), MT_ERR);
        printf("  error (expected): %s\n", mt_error_message());
        assert_non_null(strstr(mt_error_message(), strerror(EACCES)));
        assert_null(strstr(mt_error_message(), "disk full"));
        chmod(dir, 0755);
        rmdir(dir);
    }
    /* "disk full" is for ENOSPC and EDQUOT alone */
    assert_non_null(strstr(mt_io_errtext(ENOSPC), "(disk full)"));
    assert_non_null(strstr(mt_io_errtext(EDQUOT), "(disk full)"));
    assert_null(strstr(mt_io_errtext(EIO), "disk full"));
    assert_string_equal(mt_io_errtext(EIO), strerror(EIO));
    free(dir);
}

static void test_temp_dirs(void **state) {
    char *prefix = path_in(".tmp-step_00000001");
    char *a = NULL, *b = NULL;
    mode_t um = umask(022);
    assert_int_equal(mt_make_temp_dir(prefix, &a), MT_OK);
    assert_int_equal(mt_make_temp_dir(prefix, &b), MT_OK);
    umask(um);
    printf("  %s, %s\n", a, b);
    assert_true(strcmp(a, b) != 0);
    struct stat sb;
    assert_int_equal(stat(a, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    assert_int_equal(sb.st_mode & 07777, 0755);
    assert_int_equal(rmdir(a), 0);
    assert_int_equal(rmdir(b), 0);
    free(a);
    free(b);
    free(prefix);
}

/* A text whose every line says which input it came from; ~1.5 MB -> ~3 MB of tokens. */
static void write_input(const char *name, char tag) {
    char *p = path_in(name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    for (int i = 0; i < 30000; i++) fprintf(f, "%c line %06d of input %c %040d\n", tag, i, tag, i);
    fclose(f);
    free(p);
}

static int same_file(const char *a, const char *b) {
    size_t na, nb;
    char *x = read_all(a, &na), *y = read_all(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* Two `megatrain tokenize` runs with different inputs and one --out, at the same time, again and
 * again: each exits 0 (or reports an error) and the output is exactly one complete result. */
static void test_concurrent_tokenize(void **state) {
    char out[OUT_SIZE];
    write_input("a.txt", 'a');
    write_input("b.txt", 'b');
    mt_cli_expect(mt_cli_run(&g_env, out, sizeof out, "tokenize --bytes --out ref_a.bin a.txt"), 0, out, NULL);
    mt_cli_expect(mt_cli_run(&g_env, out, sizeof out, "tokenize --bytes --out ref_b.bin b.txt"), 0, out, NULL);
    char *ref_a = path_in("ref_a.bin"), *ref_b = path_in("ref_b.bin"), *both = path_in("both.bin");
    assert_false(same_file(ref_a, ref_b));
    int got_a = 0, got_b = 0;
    for (int run = 0; run < TOKENIZE_RUNS; run++) {
        char cmd[8192], log[OUT_SIZE];
        snprintf(cmd, sizeof cmd,
                 "cd '%s' || exit 9; rm -f both.bin; ('%s' tokenize --bytes --out both.bin a.txt > ra.log 2>&1; "
                 "echo $? > ra.rc) & ('%s' tokenize --bytes --out both.bin b.txt > rb.log 2>&1; "
                 "echo $? > rb.rc) & wait; cat ra.rc rb.rc ra.log rb.log",
                 g_env.tmp, g_env.bin, g_env.bin);
        assert_int_equal(mt_test_run(cmd, log, sizeof log), 0);
        int ra = -1, rb = -1;
        assert_int_equal(sscanf(log, "%d %d", &ra, &rb), 2);
        int is_a = same_file(both, ref_a), is_b = same_file(both, ref_b);
        printf("  run %d: exit %d and %d, output is %s\n", run, ra, rb,
               is_a ? "a's" : is_b ? "b's" : "A MIX");
        if (!is_a && !is_b) fail_msg("the output is neither run's result:\n%s", log);
        /* both succeed, or one reports an error and the output is the other's */
        if ((ra != 0 && rb != 0) || (ra != 0 && !is_b) || (rb != 0 && !is_a))
            fail_msg("exit codes %d and %d do not fit the output:\n%s", ra, rb, log);
        got_a += is_a, got_b += is_b;
        assert_int_equal(tmp_entries("both.bin.tmp"), 0);
    }
    printf("  a's result %d times, b's %d times\n", got_a, got_b);
    free(ref_a);
    free(ref_b);
    free(both);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_writers),
        cmocka_unit_test(test_abandoned_temps),
        cmocka_unit_test(test_rename_errno),
        cmocka_unit_test(test_temp_dirs),
        cmocka_unit_test(test_concurrent_tokenize),
    };
    return cmocka_run_group_tests(tests, group_setup, mt_cli_env_teardown);
}
