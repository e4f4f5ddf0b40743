/* `megatrain --version` / `megatrain version` (env MT_BIN):
 *  - one line "megatrain V (COMMIT, built YYYY-MM-DD; backends: ...; COMPILER)", V the version
 *    CMakeLists.txt declares, the backends those this build compiled (CUDA: MT_HAVE_CUDA, which
 *    the tests get from mtcore too) and, without CUDA, why not;
 *  - cmake/build_stamp.cmake, which makes COMMIT at build time: "unknown" without a .git of the
 *    tree's own (a tarball, even one unpacked inside another repository), `git describe --always
 *    --dirty` in a repository (a commit, -dirty, a tag), and the header left alone when nothing
 *    changed (no rebuild). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/testutil.h"

#define OUT_SIZE 16384

static mt_cli_env g_env;
static char g_src[4096]; /* the source tree */

#define mt(out, ...) mt_cli_run(&g_env, out, OUT_SIZE, __VA_ARGS__)
#define expect mt_cli_expect

static void read_text(const char *path, char *buf, size_t size) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot read %s", path);
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* "0.3.0" from project(megatrain VERSION 0.3.0 ...) */
static void declared_version(char *v, size_t size) {
    char path[4200], *text = malloc(1 << 20);
    snprintf(path, sizeof path, "%s/CMakeLists.txt", g_src);
    read_text(path, text, 1 << 20);
    const char *p = strstr(text, "project(megatrain VERSION ");
    assert_non_null(p);
    p += strlen("project(megatrain VERSION ");
    size_t n = strspn(p, "0123456789.");
    assert_true(n > 0 && n < size);
    snprintf(v, size, "%.*s", (int)n, p);
    free(text);
}

static void test_version_line(void **st) {
    (void)st;
    char out[OUT_SIZE], again[OUT_SIZE], want[64], prefix[128];
    int rc = mt(out, "--version");
    expect(rc, 0, out, "megatrain ");
    printf("%s", out);
    assert_int_equal(mt(again, "version"), 0);
    assert_string_equal(out, again);
    assert_int_equal(mt(again, "-V"), 0);
    assert_string_equal(out, again);
    assert_non_null(strchr(out, '\n'));
    assert_string_equal(strchr(out, '\n'), "\n"); /* one line */

    declared_version(want, sizeof want);
    snprintf(prefix, sizeof prefix, "megatrain %s (", want);
    assert_int_equal(strncmp(out, prefix, strlen(prefix)), 0);
    /* the commit: git describe's characters, then the date */
    const char *c = out + strlen(prefix), *built = strstr(c, ", built ");
    assert_non_null(built);
    assert_true(built > c);
    for (const char *q = c; q < built; q++) assert_true(isalnum((unsigned char)*q) || strchr("._/+-", *q));
    const char *d = built + strlen(", built ");
    for (int i = 0; i < 10; i++) assert_true(i == 4 || i == 7 ? d[i] == '-' : isdigit((unsigned char)d[i]));
    assert_int_equal(strncmp(d + 10, "; backends: cpu", 15), 0);
#ifdef MT_HAVE_CUDA
    assert_non_null(strstr(out, "; backends: cpu, cuda; "));
    assert_non_null(strstr(out, ", nvcc "));
#else
    assert_true(strstr(out, "; backends: cpu (no cuda: built with -DMT_CUDA=OFF); ") ||
                strstr(out, "; backends: cpu (no cuda: nvcc was not found when it was configured); "));
#endif
    /* the compiler, last: "; NAME VERSION)" */
    const char *cc = strrchr(out, ';');
    assert_true(cc && cc[1] == ' ' && isalpha((unsigned char)cc[2]) && strchr(cc, ' ') != strrchr(cc, ' '));
    assert_string_equal(out + strlen(out) - 2, ")\n");
}

static void test_version_args(void **st) {
    (void)st;
    char out[OUT_SIZE], first[512];
    expect(mt(out, "version --help"), 0, out, "usage: megatrain version | megatrain --version");
    int rc = mt(out, "version extra");
    expect(rc, 1, out, "megatrain: version takes no arguments (got 'extra')");
    assert_int_equal(mt_cli_error_lines(out, first, sizeof first), 1);
    expect(mt(out, "--help"), 0, out, "megatrain --version");
    expect(mt(out, "--help"), 0, out, "  plot ");
    expect(mt(out, "--help"), 0, out, "  version ");
#ifndef MT_HAVE_CUDA
    /* a build without the backend says how it was built, not that a compiler is missing */
    mt_test_sh("printf 'some text to train on\\n' > '%s/t.txt'", g_env.tmp);
    expect(mt(out, "tokenize --bytes --out t.bin t.txt"), 0, out, NULL);
    rc = mt(out, "train --init '%s/configs/tiny-bytes.json' --data t.bin --out run --steps 1 --batch 1 --seq 4 "
                 "--device cuda", g_src);
    expect(rc, 1, out, "megatrain: --device cuda: this build has no CUDA backend (");
    assert_true(strstr(out, "(built with -DMT_CUDA=OFF)") || strstr(out, "(nvcc was not found when it was configured)"));
    assert_int_equal(mt_cli_error_lines(out, first, sizeof first), 1);
#endif
}

static int have(const char *tool) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", tool);
    return system(cmd) == 0;
}

/* Runs the stamp script on source dir `dir` (under the temp dir), returns MT_BUILD_COMMIT. */
static void stamp(const char *dir, char *commit, size_t size) {
    mt_test_sh("cd '%s' && cmake -DMT_STAMP_SOURCE='%s/%s' -DMT_STAMP_OUT='%s/stamp.h' -P '%s/cmake/build_stamp.cmake'",
               g_env.tmp, g_env.tmp, dir, g_env.tmp, g_src);
    char path[4200], text[1024];
    snprintf(path, sizeof path, "%s/stamp.h", g_env.tmp);
    read_text(path, text, sizeof text);
    const char *p = strstr(text, "#define MT_BUILD_COMMIT \"");
    assert_non_null(p);
    p += strlen("#define MT_BUILD_COMMIT \"");
    snprintf(commit, size, "%.*s", (int)strcspn(p, "\""), p);
    printf("%s: %s\n", dir, commit);
    assert_non_null(strstr(text, "#define MT_BUILD_DATE \"20"));
}

static void test_stamp_script(void **st) {
    (void)st;
    if (!have("cmake")) skip();
    char commit[256], out[256];
    /* a tarball: no .git */
    mt_test_sh("mkdir -p '%s/tarball'", g_env.tmp);
    stamp("tarball", commit, sizeof commit);
    assert_string_equal(commit, "unknown");
    if (!have("git")) {
        printf("no git: the repository cases are not run\n");
        return;
    }
    /* a repository with one commit, then a change, then a tag */
    mt_test_sh("cd '%s' && mkdir repo && cd repo && git init -q && echo a > f && git add f && "
               "git -c user.name=t -c user.email=t@t commit -qm one && git rev-parse --short HEAD > ../head",
               g_env.tmp);
    char path[4200];
    snprintf(path, sizeof path, "%s/head", g_env.tmp);
    read_text(path, out, sizeof out);
    out[strcspn(out, "\n")] = '\0';
    stamp("repo", commit, sizeof commit);
    assert_string_equal(commit, out);
    /* unchanged: the header keeps its time stamp, so nothing is recompiled */
    mt_test_sh("touch -d @1000000000 '%s/stamp.h'", g_env.tmp);
    stamp("repo", commit, sizeof commit);
    mt_test_sh("test \"$(stat -c %%Y '%s/stamp.h')\" = 1000000000", g_env.tmp);
    mt_test_sh("echo b > '%s/repo/f'", g_env.tmp);
    stamp("repo", commit, sizeof commit);
    strcat(out, "-dirty");
    assert_string_equal(commit, out);
    mt_test_sh("cd '%s/repo' && git -c user.name=t -c user.email=t@t commit -qam two && git tag -a v9.9 -m v9.9", g_env.tmp);
    stamp("repo", commit, sizeof commit);
    assert_string_equal(commit, "v9.9");
    /* a tree without its own .git inside a repository is a tarball, not that repository */
    mt_test_sh("mkdir -p '%s/repo/unpacked'", g_env.tmp);
    stamp("repo/unpacked", commit, sizeof commit);
    assert_string_equal(commit, "unknown");
}

static int setup(void **st) {
    *st = &g_env; /* for mt_cli_env_teardown */
    if (mt_cli_env_init(&g_env, "") != 0) return -1;
    /* MT_FIXTURES is SOURCE/tests/fixtures */
    char *f = mt_fixture_path("");
    snprintf(g_src, sizeof g_src, "%s", f);
    free(f);
    char *end = strstr(g_src, "/tests/fixtures");
    if (!end) return -1;
    *end = '\0';
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_line),
        cmocka_unit_test(test_version_args),
        cmocka_unit_test(test_stamp_script),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
