/* The `megatrain` binary (env MT_BIN) on chat data:
 *  - `tokenize --chat --pack whole` writes exactly the file `train --data chat.jsonl` packs by
 *    default, and training on either is bit for bit the same run (metrics, and the final weights
 *    and Adam moments), with and without shuffling; eval gives one loss for both; --pack split
 *    likewise gives one file both ways, another file than whole;
 *  - the packed cache is re-used only while source, tokenizer, --seq, --loss-on, --long and --pack
 *    are the same;
 *  - --resume on chat data continues bit-identically (the row order is a function of the step);
 *  - bad input: counted warnings for bad lines; one-line errors naming the file and header field
 *    for damaged packed files, naming the flag for bad chat flags, exit 1, no step run.
 * The model: mt_cli_tokenizer_model (a tiny Llama with the llama3 fixture tokenizer), with
 * initializer_range 0.3. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "util/testutil.h"

#define OUT_SIZE 65536

static mt_cli_env g_env;
static char g_model[4096]; /* tiny model dir with tokenizer.json */

#define sh mt_test_sh

#define mt(out, ...) mt_cli_run(&g_env, out, OUT_SIZE, __VA_ARGS__)
#define expect mt_cli_expect
static void same_file(const char *a, const char *b) { sh("cd '%s' && cmp '%s' '%s'", g_env.tmp, a, b); }

/* "loss", "lr", "grad_norm" and "tokens" of every line of RUN/metrics.jsonl, concatenated. */
static void metrics_of(const char *run, char *buf, size_t size) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", g_env.tmp, run);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("no %s", path);
    char *line = NULL;
    size_t cap = 0;
    buf[0] = '\0';
    while (getline(&line, &cap, f) > 0) {
        static const char *const keys[] = {"\"loss\": ", "\"lr\": ", "\"grad_norm\": ", "\"tokens\": "};
        for (int k = 0; k < 4; k++) {
            const char *p = strstr(line, keys[k]);
            if (!p) continue;
            p += strlen(keys[k]);
            size_t have = strlen(buf), n = strcspn(p, ",}");
            if (have + n + 2 > size) fail_msg("metrics too long");
            snprintf(buf + have, size - have, "%.*s;", (int)n, p);
        }
    }
    free(line);
    fclose(f);
}

/* Two runs: the same metrics, and the same final weights and moments, byte for byte. */
static void same_run(const char *a, const char *b, int step) {
    char ma[8192], mb[8192];
    metrics_of(a, ma, sizeof ma);
    metrics_of(b, mb, sizeof mb);
    printf("%s: %s\n", a, ma);
    if (strcmp(ma, mb)) fail_msg("metrics differ:\n%s: %s\n%s: %s", a, ma, b, mb);
    char fa[4096], fb[4096];
    for (int i = 0; i < 2; i++) {
        const char *file = i ? "optimizer.safetensors" : "model.safetensors";
        snprintf(fa, sizeof fa, "%s/checkpoints/step_%08d/%s", a, step, file);
        snprintf(fb, sizeof fb, "%s/checkpoints/step_%08d/%s", b, step, file);
        same_file(fa, fb);
    }
}

#define TRAIN "train --steps 4 --batch 2 --seq 64 --lr 0.01 --seed 7 --device cpu --model '%s' "

static void test_tokenize_then_train(void **st) {
    (void)st;
    char *out = malloc(OUT_SIZE);
    int rc = mt(out, "tokenize --tokenizer '%s' --chat --seq 64 --pack whole --out chat.packed chat.jsonl", g_model);
    expect(rc, 0, out, "conversations (llama3, loss on assistant) -> ");
    expect(rc, 0, out, "rows of 64 tokens (--pack whole: ");
    printf("%s", out);
    rc = mt(out, TRAIN "--data chat.jsonl --out r_jsonl", g_model);
    expect(rc, 0, out, "step 4/4");
    same_file("chat.packed", "r_jsonl/chat.jsonl.packed");
    rc = mt(out, TRAIN "--data chat.packed --out r_packed", g_model);
    expect(rc, 0, out, "packed rows of 64 tokens");
    same_run("r_jsonl", "r_packed", 4);
    /* the data order without shuffling, too (and not the shuffled run: the order is really used) */
    rc = mt(out, TRAIN "--data chat.jsonl --no-shuffle --out r_jsonl_seq", g_model);
    expect(rc, 0, out, "step 4/4");
    rc = mt(out, TRAIN "--data chat.packed --no-shuffle --out r_packed_seq", g_model);
    expect(rc, 0, out, "step 4/4");
    same_run("r_jsonl_seq", "r_packed_seq", 4);
    char ma[8192], mb[8192];
    metrics_of("r_jsonl", ma, sizeof ma);
    metrics_of("r_jsonl_seq", mb, sizeof mb);
    assert_string_not_equal(ma, mb);
    /* --loss-on all trains more targets: a different packed file and a different run */
    rc = mt(out, TRAIN "--data chat.jsonl --loss-on all --out r_all", g_model);
    expect(rc, 0, out, "loss on all");
    metrics_of("r_all", mb, sizeof mb);
    assert_string_not_equal(ma, mb);
    /* eval: packed file and chat JSONL, one loss */
    rc = mt(out, "eval --model '%s' --data chat.packed --seq 64", g_model);
    expect(rc, 0, out, ": loss ");
    char la[256], lb[256];
    snprintf(la, sizeof la, "%s", strstr(out, ": loss "));
    rc = mt(out, "eval --model '%s' --data chat.jsonl --seq 64", g_model);
    expect(rc, 0, out, ": loss ");
    snprintf(lb, sizeof lb, "%s", strstr(out, ": loss "));
    printf("eval: %s", la);
    assert_string_equal(la, lb);

    /* --pack split: one file made either way, not whole's; eval on it one loss either way */
    rc = mt(out, "tokenize --tokenizer '%s' --chat --seq 64 --pack split --out split.packed chat.jsonl", g_model);
    expect(rc, 0, out, "rows of 64 tokens (--pack split: ");
    rc = mt(out, TRAIN "--data chat.jsonl --pack split --out r_split", g_model);
    expect(rc, 0, out, "step 4/4");
    same_file("split.packed", "r_split/chat.jsonl.packed");
    char cmd[4200], cmp_out[256];
    snprintf(cmd, sizeof cmd, "cd '%s' && cmp split.packed chat.packed", g_env.tmp);
    assert_int_equal(mt_test_run(cmd, cmp_out, sizeof cmp_out), 1); /* differ */
    rc = mt(out, "eval --model '%s' --data split.packed --seq 64", g_model);
    expect(rc, 0, out, ": loss ");
    snprintf(la, sizeof la, "%s", strstr(out, ": loss "));
    rc = mt(out, "eval --model '%s' --data chat.jsonl --pack split --seq 64", g_model);
    expect(rc, 0, out, ": loss ");
    snprintf(lb, sizeof lb, "%s", strstr(out, ": loss "));
    assert_string_equal(la, lb);

    /* the engine on packed rows = the runner (eval) on them: one step over every row with the
     * initial weights has eval's loss, which it would not if the document starts were lost */
    rc = mt(out, "eval --model '%s' --data chat.packed --seq 64", g_model);
    snprintf(la, sizeof la, "%s", strstr(out, ": loss "));
    rc = mt(out, "tokenize --tokenizer '%s' --chat --seq 64 --out chat.packed chat.jsonl", g_model);
    const char *p = strstr(out, "-> ");
    assert_non_null(p);
    int rows = atoi(p + 3);
    assert_true(rows > 4);
    const char *tt = strstr(out, " trained targets");
    assert_non_null(tt);
    while (tt > out && tt[-1] >= '0' && tt[-1] <= '9') tt--;
    long long trained = atoll(tt);
    rc = mt(out, "train --steps 1 --batch %d --seq 64 --no-shuffle --device cpu --model '%s' --data chat.packed "
                 "--out r_all_rows", rows, g_model);
    expect(rc, 0, out, "step 1/1");
    char m1[8192];
    metrics_of("r_all_rows", m1, sizeof m1);
    double train_loss = strtod(m1, NULL), eval_loss = strtod(la + 7, NULL);
    printf("one step over all %d rows: loss %.6f; eval %.6f\n", rows, train_loss, eval_loss);
    assert_true(fabs(train_loss - eval_loss) <= 1e-5 * eval_loss); /* fp32, the sums in another order */
    /* and the step's loss was averaged over exactly the packed file's trained targets */
    char path[4096], line[4096];
    snprintf(path, sizeof path, "%s/r_all_rows/metrics.jsonl", g_env.tmp);
    FILE *mf = fopen(path, "rb");
    assert_non_null(mf);
    assert_non_null(fgets(line, sizeof line, mf));
    fclose(mf);
    const char *tg = strstr(line, "\"targets\": ");
    assert_non_null(tg);
    printf("targets in the step: %lld; trained targets in the file: %lld\n", atoll(tg + 11), trained);
    assert_int_equal(atoll(tg + 11), trained);
    free(out);
}

static void test_cache_keyed(void **st) {
    (void)st;
    char *out = malloc(OUT_SIZE);
    const char *args = "train --steps 1 --batch 2 --lr 0.01 --device cpu --no-save --model '%s' --data chat.jsonl "
                       "--out r_cache --overwrite %s"; /* the data cache outlives --overwrite */
    int rc = mt(out, args, g_model, "--seq 64");
    expect(rc, 0, out, "rows of 64 tokens");
    assert_null(strstr(out, "using the packed cache"));
    rc = mt(out, args, g_model, "--seq 64");
    expect(rc, 0, out, "using the packed cache");
    static const char *const changed[] = {"--seq 24", "--seq 24 --loss-on all", "--seq 24 --loss-on all --long skip",
                                          "--seq 24 --loss-on all --long skip --pack split",
                                          "--seq 24 --loss-on all --long skip --pack split --chat-format llama3"};
    for (int i = 0; i < 5; i++) {
        rc = mt(out, args, g_model, changed[i]);
        /* the last one names the format auto picks anyway: the same key, the cache is used */
        expect(rc, 0, out, i < 4 ? "conversations (llama3" : "using the packed cache");
        rc = mt(out, args, g_model, changed[i]);
        expect(rc, 0, out, "using the packed cache");
    }
    sh("touch -d '+2 seconds' '%s/chat.jsonl'", g_env.tmp); /* a changed source */
    rc = mt(out, args, g_model, "--seq 24");
    expect(rc, 0, out, "conversations (llama3");
    sh("touch -d '+3 seconds' '%s/tokenizer_config.json'", g_model); /* a changed tokenizer config */
    rc = mt(out, args, g_model, "--seq 24");
    expect(rc, 0, out, "conversations (llama3");
    rc = mt(out, args, g_model, "--seq 24");
    expect(rc, 0, out, "using the packed cache");
    free(out);
}

static void test_resume(void **st) {
    (void)st;
    char *out = malloc(OUT_SIZE);
    int rc = mt(out, TRAIN "--data chat.jsonl --out r_straight", g_model);
    expect(rc, 0, out, "step 4/4");
    rc = mt(out, TRAIN "--data chat.jsonl --out r_resumed --stop-at 2", g_model);
    expect(rc, 0, out, "step 2/4");
    rc = mt(out, TRAIN "--data chat.jsonl --out r_resumed --resume", g_model);
    expect(rc, 0, out, "resuming from r_resumed/checkpoints/step_00000002");
    same_run("r_straight", "r_resumed", 4);
    free(out);
}

/* ---- bad input ---- */

/* exit 1, exactly one error line naming both needles, no step run */
static void expect_error(const char *what, const char *args, const char *n1, const char *n2) {
    static char out[OUT_SIZE];
    char first[2048];
    int rc = mt(out, "%s", args);
    int n = mt_cli_error_lines(out, first, sizeof first);
    fprintf(stderr, "  %-26s exit %d: %s\n", what, rc, first);
    if (rc != 1 || n != 1) fail_msg("%s: exit %d with %d error lines (want 1 and 1):\n%s", what, rc, n, out);
    if ((n1 && !strstr(first, n1)) || (n2 && !strstr(first, n2)))
        fail_msg("%s: the error should name '%s' and '%s': %s", what, n1, n2 ? n2 : "", first);
    if (strstr(out, "\nstep ") || !strncmp(out, "step ", 5)) fail_msg("%s: a step ran:\n%s", what, out);
}

/* A copy of chat.packed at NAME with `len` bytes at `off` replaced (len 0: truncated to off). */
static void damaged(const char *name, long off, const void *bytes, size_t len) {
    char src[4200], dst[4200];
    snprintf(src, sizeof src, "%s/chat.packed", g_env.tmp);
    snprintf(dst, sizeof dst, "%s/%s", g_env.tmp, name);
    sh("cp '%s' '%s'", src, dst);
    if (!len) {
        assert_int_equal(truncate(dst, off), 0);
        return;
    }
    FILE *f = fopen(dst, "r+b");
    assert_non_null(f);
    fseek(f, off, SEEK_SET);
    assert_int_equal(fwrite(bytes, 1, len, f), len);
    fclose(f);
}

static void test_bad_input(void **st) {
    (void)st;
    char *out = malloc(OUT_SIZE), m[4600];
    int rc = mt(out, "tokenize --tokenizer '%s' --chat --seq 64 --out chat.packed chat.jsonl", g_model);
    expect(rc, 0, out, NULL);
    /* counted, not fatal */
    rc = mt(out, "tokenize --tokenizer '%s' --chat --seq 64 --out bad.packed bad.jsonl", g_model);
    expect(rc, 0, out, "megatrain: warning: 1 line(s) that are not a JSON object skipped (first: bad.jsonl line 2");
    expect(rc, 0, out, "megatrain: warning: 1 object(s) without a \"messages\" array skipped (first: bad.jsonl line 3)");
    expect(rc, 0, out, "megatrain: warning: 1 conversation(s) with a role other than system, user and assistant "
                       "skipped (first: bad.jsonl line 4)");
    expect(rc, 0, out, "megatrain: warning: 1 conversation(s) without an assistant reply skipped");
    expect(rc, 0, out, "bad.jsonl: 2 conversations (llama3");

    /* damaged packed files: one error naming the file and the header field */
    static const struct { const char *file; long off; uint32_t v; int len; const char *needle; } bad[] = {
        {"magic.packed", 4, 0x58454b43u /* "MTPACKED" -> "MTPACKEX" */, 4, "header field magic"},
        {"version.packed", 8, 2, 4, "header field version is 2"},
        {"vocab.packed", 24, 1600, 4, "header field vocab is 1600, more than the model's"},
        {"idsize.packed", 28, 3, 4, "header field id_size is 3"},
        {"trained.packed", 40, 0, 4, "header field trained"},
        {"short.packed", 100, 0, 0, "header fields rows"},
        {"tiny.packed", 20, 0, 0, "64-byte header"},
    };
    snprintf(m, sizeof m, "train --model '%s' --device cpu --steps 2 --batch 2 --seq 64 --out o_bad", g_model);
    char a[8192];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        damaged(bad[i].file, bad[i].off, &bad[i].v, (size_t)bad[i].len);
        snprintf(a, sizeof a, "%s --data %s", m, bad[i].file);
        expect_error(bad[i].file, a, bad[i].file, bad[i].needle);
    }
    snprintf(a, sizeof a, "eval --model '%s' --data vocab.packed --seq 64", g_model);
    expect_error("eval: packed vocab", a, "vocab.packed", "header field vocab");
    snprintf(a, sizeof a, "eval --model '%s' --data chat.jsonl --seq 64 --pack tight", g_model);
    expect_error("eval: --pack tight", a, "--pack", "tight");
    /* flags and data that do not go together */
    static const struct { const char *args, *n1, *n2; } flags[] = {
        {"--data chat.packed --seq 48", "chat.packed", "header field T is 64"},
        {"--data chat.jsonl --loss-on prompt", "--loss-on", "prompt"},
        {"--data chat.jsonl --chat-format jinja", "--chat-format", "jinja"},
        {"--data chat.jsonl --long cut", "--long", "cut"},
        {"--data chat.jsonl --pack tight", "--pack", "tight"},
        {"--data chat.packed --loss-on all", "--loss-on", "already packed"},
        {"--data chat.packed --pack split", "--pack", "already packed"},
        {"--data docs.jsonl --loss-on all", "docs.jsonl", "not chat data"},
        {"--data chat.jsonl --chat-format chatml", "chat format chatml", "<|im_start|>"},
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        snprintf(a, sizeof a, "%s %s", m, flags[i].args);
        expect_error(flags[i].args, a, flags[i].n1, flags[i].n2);
    }
    expect_error("chat data, no tokenizer",
                 "train --init tok_model_cfg.json --device cpu --steps 1 --batch 2 --seq 64 --data chat.jsonl --out o_notok",
                 "chat.jsonl", "tokenizer.json");
    static const struct { const char *args, *n1; } tok_flags[] = {
        {"--chat --out x.packed chat.jsonl", "--seq"},
        {"--seq 64 --out x.packed chat.jsonl", "--chat"},
        {"--chat --seq 64 --dtype u32 --out x.packed chat.jsonl", "--dtype"},
        {"--chat --seq 64 --pack tight --out x.packed chat.jsonl", "--pack \"tight\""},
        {"--seq 64 --pack split --out x.packed chat.jsonl", "--chat"},
    };
    for (size_t i = 0; i < sizeof tok_flags / sizeof tok_flags[0]; i++) {
        snprintf(a, sizeof a, "tokenize --tokenizer '%s' %s", g_model, tok_flags[i].args);
        expect_error(tok_flags[i].args, a, tok_flags[i].n1, NULL);
    }
    snprintf(a, sizeof a, "tokenize --tokenizer '%s' --chat --seq 64 --out x.packed junk.jsonl", g_model);
    expect_error("nothing usable", a, "x.packed", "no conversation to train on");
    char x[4200];
    snprintf(x, sizeof x, "%s/x.packed", g_env.tmp);
    assert_int_equal(access(x, F_OK), -1);
    free(out);
}

static int setup(void **st) {
    *st = &g_env; /* for mt_cli_env_teardown */
    if (mt_cli_env_init(&g_env, "train_llama") != 0) return -1;
    /* weights large enough that attention is sharp: a row's loss depends on what it may see */
    if (mt_cli_tokenizer_model(&g_env, 0.3, g_model, sizeof g_model) != 0) return -1;
    char path[4096];
    /* 40 conversations of varied shape, deterministic */
    static const char *const words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog",
                                        "caf\xc3\xa9", "\xe6\x97\xa5\xe6\x9c\xac", "why", "42", "ok"};
    snprintf(path, sizeof path, "%s/chat.jsonl", g_env.tmp);
    FILE *f = fopen(path, "wb");
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 5);
    for (int c = 0; c < 40; c++) {
        fputs("{\"messages\": [", f);
        if (c % 3 == 0) fputs("{\"role\": \"system\", \"content\": \"Be brief.\"}, ", f);
        int turns = 1 + (int)(mt_test_rng_u64(&rng) % 2);
        for (int t = 0; t < turns; t++) {
            for (int r = 0; r < 2; r++) {
                fprintf(f, "%s{\"role\": \"%s\", \"content\": \"", t + r ? ", " : "", r ? "assistant" : "user");
                int n = 1 + (int)(mt_test_rng_u64(&rng) % 6);
                for (int w = 0; w < n; w++) fprintf(f, "%s%s", w ? " " : "", words[mt_test_rng_u64(&rng) % 14]);
                fputs("\"}", f);
            }
        }
        fputs("]}\n", f);
    }
    fclose(f);
    snprintf(path, sizeof path, "%s/bad.jsonl", g_env.tmp);
    f = fopen(path, "wb");
    fputs("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n"
          "nope\n"
          "{\"text\": \"x\"}\n"
          "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}\n"
          "{\"messages\": [{\"role\": \"user\", \"content\": \"no answer\"}]}\n"
          "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n",
          f);
    fclose(f);
    snprintf(path, sizeof path, "%s/docs.jsonl", g_env.tmp);
    f = fopen(path, "wb");
    fputs("{\"text\": \"a text document\"}\n", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/junk.jsonl", g_env.tmp);
    f = fopen(path, "wb");
    fputs("{\"messages\": []}\nnope\n", f);
    fclose(f);

    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenize_then_train),
        cmocka_unit_test(test_cache_keyed),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
