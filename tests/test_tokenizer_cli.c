/* `megatrain tokenize` (env MT_BIN) with tokenizer directories as Hugging Face releases them:
 * the real Llama 2 / Mistral tokenizer_config.json, whose model_max_length (1e30) does not fit
 * 64 bits, is accepted, and the token file equals the one made without that config. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/testutil.h"

#define OUT_SIZE 65536

static mt_cli_env g_env;

static void test_tokenize_real_config(void **st) {
    (void)st;
    char *out = malloc(OUT_SIZE);
    mt_test_sh("cd '%s' && printf 'Hello world, the quick brown fox\\ncaf\\303\\251 na\\303\\257ve\\n' > in.txt",
               g_env.tmp);
    int rc = mt_cli_run(&g_env, out, OUT_SIZE, "tokenize --tokenizer '%s/mistral_real_config' --out a.bin in.txt",
                        g_env.fixture);
    mt_cli_expect(rc, 0, out, "tokens/s");
    rc = mt_cli_run(&g_env, out, OUT_SIZE, "tokenize --tokenizer '%s/mistral' --out b.bin in.txt", g_env.fixture);
    mt_cli_expect(rc, 0, out, "tokens/s");
    mt_test_sh("cd '%s' && test -s a.bin && cmp a.bin b.bin", g_env.tmp);
    free(out);
}

static int setup(void **st) {
    *st = &g_env; /* for mt_cli_env_teardown */
    return mt_cli_env_init(&g_env, "tokenizers");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenize_real_config),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
