/* Helpers of the tests that drive the megatrain binary (declared in testutil.h). */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "testutil.h"

void mt_test_sh(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0) fail_msg("shell command failed: %s", cmd);
}

int mt_cli_run(const mt_cli_env *env, char *out, size_t size, const char *fmt, ...) {
    char args[6144], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s", env->tmp, env->bin, args);
    int rc = mt_test_run(cmd, out, size);
    if (rc < 0) fail_msg("could not run: %s", cmd);
    if (strstr(out, "Sanitizer") || strstr(out, "runtime error:")) fail_msg("sanitizer report from: %s\n%s", cmd, out);
    if (rc >= 128) fail_msg("crashed (exit %d = signal %d): %s\n%s", rc, rc - 128, cmd, out);
    return rc;
}

int mt_cli_exists(const mt_cli_env *env, const char *rel) {
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", env->tmp, rel);
    return lstat(path, &sb) == 0;
}

int mt_cli_train(const mt_cli_env *env, char *out, size_t size, const char *out_dir,
                 const char *extra) {
    return mt_cli_run(env, out, size,
                      "train --model '%s' --data '%s/data.bin' --batch 2 --seq 16 --lr 1e-2 --warmup 1 "
                      "--device cpu --out %s %s",
                      env->fixture, env->fixture, out_dir, extra);
}

void mt_cli_train_ok(const mt_cli_env *env, char *out, size_t size, const char *out_dir,
                     const char *extra) {
    int rc = mt_cli_train(env, out, size, out_dir, extra);
    if (rc != 0) fail_msg("train --out %s %s: exit %d\n%s", out_dir, extra, rc, out);
}

void mt_cli_expect(int rc, int want, const char *out, const char *needle) {
    if (rc != want || (needle && !strstr(out, needle)))
        fail_msg("exit %d (want %d), output should contain '%s':\n%s", rc, want, needle ? needle : "", out);
}

int mt_cli_error_lines(const char *out, char *first, size_t first_size) {
    int count = 0;
    first[0] = '\0';
    for (const char *p = out; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (strncmp(p, "megatrain: ", 11) == 0 && strncmp(p, "megatrain: warning:", 19) != 0)
            if (count++ == 0) snprintf(first, first_size, "%.*s", (int)len, p);
        p = nl ? nl + 1 : NULL;
    }
    return count;
}

int mt_cli_tokenizer_model(const mt_cli_env *env, double init_std, char *model, size_t size) {
    char *cfg_path = mt_fixture_path("train_llama/config.json"), *data = mt_fixture_path("train_llama/data.bin");
    char *tok = mt_fixture_path("tokenizers/llama3");
    json_t *cfg = json_load_file(cfg_path, 0, NULL);
    char path[4096], cmd[16384];
    int rc = -1;
    if (!cfg) {
        fprintf(stderr, "cannot read %s\n", cfg_path);
        goto done;
    }
    json_object_set_new(cfg, "vocab_size", json_integer(1536));
    json_object_set_new(cfg, "initializer_range", json_real(init_std));
    snprintf(path, sizeof path, "%s/tok_model_cfg.json", env->tmp);
    if (json_dump_file(cfg, path, JSON_INDENT(2)) != 0) goto done;
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' train --init tok_model_cfg.json --data '%s' --steps 1 --batch 2 "
             "--seq 16 --device cpu --out init", env->tmp, env->bin, data);
    char *out = malloc(65536);
    int run = mt_test_run(cmd, out, 65536);
    if (run != 0) fprintf(stderr, "making the model failed:\n%s\n", out);
    free(out);
    if (run != 0) goto done;
    snprintf(model, size, "%s/init/checkpoints/step_00000001", env->tmp);
    snprintf(cmd, sizeof cmd, "cp '%s/tokenizer.json' '%s/tokenizer_config.json' '%s/'", tok, tok, model);
    rc = system(cmd) == 0 ? 0 : -1;
done:
    json_decref(cfg);
    free(cfg_path), free(data), free(tok);
    return rc;
}
