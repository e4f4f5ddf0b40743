/* --model ORG/NAME: a model in the Hugging Face hub cache, found offline. The test builds the tree
 * huggingface_hub writes (models--org--tiny/refs/main holding a commit hash, snapshots/<hash>/ of
 * symlinks into ../../blobs/) from the train_llama fixture, then loads it by name with info and a
 * one-step train; the cache root from $HF_HUB_CACHE, else $HF_HOME/hub, else
 * $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub; --revision as a ref or a commit;
 * and a missing model, ref or snapshot as one error line naming the paths looked at. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/testutil.h"

#define OUT_SIZE 65536
#define MAIN "0123456789abcdef0123456789abcdef01234567"
#define GONE "fedcba9876543210fedcba9876543210fedcba98" /* refs/v2's commit: no snapshot */

static mt_cli_env g;
static char out[OUT_SIZE];

static int setup(void **state) {
    *state = &g; /* for mt_cli_env_teardown */
    if (mt_cli_env_init(&g, "train_llama") != 0) return -1;
    mt_test_sh("cd '%s' && r=hub/models--org--tiny && mkdir -p $r/blobs $r/refs $r/snapshots/" MAIN
               " && cp '%s/config.json' $r/blobs/1c0f && cp '%s/model.safetensors' $r/blobs/9e2a"
               " && ln -s ../../blobs/1c0f $r/snapshots/" MAIN "/config.json"
               " && ln -s ../../blobs/9e2a $r/snapshots/" MAIN "/model.safetensors"
               " && printf " MAIN " > $r/refs/main && printf '" GONE "\\n' > $r/refs/v2",
               g.tmp, g.fixture, g.fixture);
    return 0;
}

/* Only the given root variables set (relative to the temporary directory; NULL: unset). */
static void cache_env(const char *hub, const char *hf_home, const char *xdg, const char *home) {
    const char *names[] = {"HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME"};
    const char *values[] = {hub, hf_home, xdg, home};
    for (int i = 0; i < 4; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", g.tmp, values[i] ? values[i] : "");
        if (values[i]) setenv(names[i], path, 1);
        else unsetenv(names[i]);
    }
}

static void expect_info_ok(const char *how) {
    int rc = mt_cli_run(&g, out, OUT_SIZE, "info --model org/tiny 2>&1");
    fprintf(stderr, "  %s: exit %d\n", how, rc);
    mt_cli_expect(rc, 0, out, "weights: all");
}

/* One error line, exit 1, naming each of the needles. */
static void expect_error(const char *args, const char *n1, const char *n2) {
    char first[4096];
    int rc = mt_cli_run(&g, out, OUT_SIZE, "%s 2>&1", args);
    int n = mt_cli_error_lines(out, first, sizeof first);
    fprintf(stderr, "  %s: exit %d: %s\n", args, rc, first);
    if (rc != 1 || n != 1) fail_msg("%s: exit %d with %d error lines, want 1 and 1:\n%s", args, rc, n, out);
    if (!strstr(first, n1) || (n2 && !strstr(first, n2)))
        fail_msg("%s: the error does not name '%s'%s%s: %s", args, n1, n2 ? " and " : "", n2 ? n2 : "", first);
}

static void test_info_and_train_by_name(void **state) {
    (void)state;
    cache_env("hub", NULL, NULL, "nohome");
    expect_info_ok("$HF_HUB_CACHE");
    int rc = mt_cli_run(&g, out, OUT_SIZE, "info --model org/tiny --revision main 2>&1");
    mt_cli_expect(rc, 0, out, "weights: all");
    rc = mt_cli_run(&g, out, OUT_SIZE, "info --model org/tiny --revision " MAIN " 2>&1");
    mt_cli_expect(rc, 0, out, "weights: all");
    rc = mt_cli_run(&g, out, OUT_SIZE,
                    "train --model org/tiny --data '%s/data.bin' --out run --steps 1 --batch 2 --seq 16 "
                    "--device cpu 2>&1",
                    g.fixture);
    mt_cli_expect(rc, 0, out, "step 1/1");
    /* the checkpoint's stored arguments name the snapshot it came from */
    mt_test_sh("grep -rq 'snapshots/" MAIN "' '%s/run/checkpoints/step_00000001'", g.tmp);
}

static void test_cache_root_order(void **state) {
    (void)state;
    mt_test_sh("cd '%s' && mkdir -p empty hfhome xdg/huggingface home/.cache/huggingface && ln -s ../hub hfhome/hub"
               " && ln -s ../../hub xdg/huggingface/hub && ln -s ../../../hub home/.cache/huggingface/hub",
               g.tmp);
    cache_env(NULL, "hfhome", "empty", "empty");
    expect_info_ok("$HF_HOME/hub");
    cache_env(NULL, NULL, "xdg", "empty");
    expect_info_ok("$XDG_CACHE_HOME/huggingface/hub");
    cache_env(NULL, NULL, NULL, "home");
    expect_info_ok("~/.cache/huggingface/hub");
    /* the first one set is the root, even when the model is only under a later one */
    cache_env("empty", "hfhome", NULL, "home");
    expect_error("info --model org/tiny", "empty/models--org--tiny", "$HF_HUB_CACHE");
    cache_env(NULL, "empty", NULL, "home");
    expect_error("info --model org/tiny", "empty/hub/models--org--tiny", "$HF_HOME/hub");
    cache_env(NULL, NULL, NULL, "empty");
    expect_error("info --model org/tiny", "empty/.cache/huggingface/hub/models--org--tiny", "./org/tiny");
}

static void test_errors(void **state) {
    (void)state;
    cache_env("hub", NULL, NULL, "nohome");
    expect_error("info --model org/nope", "hub/models--org--nope", "./org/nope");
    expect_error("train --model org/nope --data x --out o", "hub/models--org--nope", NULL);
    expect_error("info --model org/tiny --revision v9", "hub/models--org--tiny/refs/v9", "--revision");
    expect_error("info --model org/tiny --revision v2", "hub/models--org--tiny/snapshots/" GONE, "revision v2");
    expect_error("info --model org/tiny --revision " GONE, "hub/models--org--tiny/snapshots/" GONE, NULL);
    expect_error("info --model org/tiny --revision ../../x", "--revision ../../x", NULL);
    expect_error("info --model hub --revision main", "--revision main", "is a directory");
    expect_error("info --model ./no/such/dir", "./no/such/dir: no such directory", NULL);
    /* a directory of that name wins over the cache */
    mt_test_sh("cd '%s' && mkdir -p org && cp -r '%s' org/tiny", g.tmp, g.fixture);
    cache_env("empty", NULL, NULL, "nohome");
    expect_info_ok("./org/tiny, a directory");
    mt_test_sh("rm -r '%s/org'", g.tmp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_info_and_train_by_name),
        cmocka_unit_test(test_cache_root_order),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
