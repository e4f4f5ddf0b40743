/* `megatrain convert` never overwrites its input nor an earlier model: an --out that is --model
 * (however spelled: ./CK, CK/, an absolute path, a symlink) or lies inside it, and an --out that
 * already holds a model, are one error line naming both flags / the directory, exit 1, nothing
 * written. A new or model-free directory is written as before. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/testutil.h"

#define OUT_SIZE 65536

static mt_cli_env g;

static int setup(void **state) {
    *state = &g; /* for mt_cli_env_teardown */
    if (mt_cli_env_init(&g, "train_llama") != 0) return -1;
    mt_test_sh("cp -r '%s' '%s/CK' && ln -s CK '%s/L'", g.fixture, g.tmp, g.tmp);
    return 0;
}

/* CK is exactly the fixture: same file names, same bytes. */
static void expect_input_intact(const char *what) {
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof cmd, "diff -r '%s' '%s/CK'", g.fixture, g.tmp);
    if (mt_test_run(cmd, out, sizeof out) != 0) fail_msg("%s: the input changed:\n%s", what, out);
}

static void expect_refused(const char *out_arg, const char *needle) {
    static char out[OUT_SIZE];
    char first[2048];
    int rc = mt_cli_run(&g, out, OUT_SIZE, "convert --model CK --out %s 2>&1", out_arg);
    int n = mt_cli_error_lines(out, first, sizeof first);
    fprintf(stderr, "  --out %-16s exit %d: %s\n", out_arg, rc, first);
    if (rc != 1 || n != 1) fail_msg("--out %s: exit %d with %d error lines, want 1 and 1:\n%s", out_arg, rc, n, out);
    if (!strstr(first, "--out") || !strstr(first, needle)) fail_msg("--out %s: the error does not say '%s': %s", out_arg, needle, first);
    if (strstr(out, "wrote ")) fail_msg("--out %s: something was written:\n%s", out_arg, out);
    expect_input_intact(out_arg);
}

static void test_out_is_the_input(void **state) {
    char abs[4200];
    snprintf(abs, sizeof abs, "'%s/CK'", g.tmp);
    const char *same[] = {"CK", "./CK", "CK/", "CK//", "L", "L/", abs, "nowhere/../CK"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        expect_refused(same[i], "is the same directory as --model CK");
    const char *inside[] = {"CK/sub", "L/sub", "CK/a/b", "CK/a/../b", "./CK/./sub/"};
    for (size_t i = 0; i < sizeof inside / sizeof inside[0]; i++)
        expect_refused(inside[i], "is inside --model CK");
    assert_false(mt_cli_exists(&g, "CK/sub"));
    assert_false(mt_cli_exists(&g, "CK/a"));
    assert_false(mt_cli_exists(&g, "nowhere"));
}

static void test_out_holds_a_model(void **state) {
    static char out[OUT_SIZE];
    /* a sibling whose name starts like the input's is not inside it */
    int rc = mt_cli_run(&g, out, OUT_SIZE, "convert --model CK --out CK2 2>&1");
    mt_cli_expect(rc, 0, out, "wrote CK2");
    assert_true(mt_cli_exists(&g, "CK2/model.safetensors"));
    mt_test_sh("cd '%s' && cp CK2/model.safetensors before.safetensors", g.tmp);
    /* again into the same directory: refused, the first output untouched */
    rc = mt_cli_run(&g, out, OUT_SIZE, "convert --model CK --out CK2 --dtype f32 2>&1");
    mt_cli_expect(rc, 1, out, "megatrain: --out CK2 already holds a model");
    mt_test_sh("cd '%s' && cmp CK2/model.safetensors before.safetensors", g.tmp);
    /* sharded output counts too, and a lone config.json */
    mt_test_sh("cd '%s' && mkdir S C && touch S/model-00001-of-00002.safetensors && "
               "echo '{}' > C/config.json", g.tmp);
    rc = mt_cli_run(&g, out, OUT_SIZE, "convert --model CK --out S 2>&1");
    mt_cli_expect(rc, 1, out, "--out S already holds a model (model-00001-of-00002.safetensors)");
    rc = mt_cli_run(&g, out, OUT_SIZE, "convert --model CK --out C 2>&1");
    mt_cli_expect(rc, 1, out, "--out C already holds a model (config.json)");
    /* an existing directory without a model (say, a tokenizer copied in first) is fine */
    mt_test_sh("cd '%s' && mkdir T && echo '{}' > T/tokenizer.json", g.tmp);
    rc = mt_cli_run(&g, out, OUT_SIZE, "convert --model CK --out T 2>&1");
    mt_cli_expect(rc, 0, out, "wrote T");
    assert_true(mt_cli_exists(&g, "T/model.safetensors") && mt_cli_exists(&g, "T/tokenizer.json"));
    expect_input_intact("after the good conversions");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_out_is_the_input),
        cmocka_unit_test(test_out_holds_a_model),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
