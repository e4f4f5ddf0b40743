/* The `megatrain` binary (env MT_BIN) with a tokenizer.json:
 *  - `tokenize --tokenizer` writes exactly the file `train --data TEXT` caches (.txt and .jsonl),
 *    and training on that file gives the same losses as training on the text;
 *  - `tokenize --bytes` of a JSONL reads its "text" fields, and writes exactly the file `train --data`
 *    makes from it for a model without a tokenizer (whitespace-only texts encoded, "" skipped);
 *  - the cache is re-used while source, tokenizer and --doc-sep are unchanged, remade otherwise;
 *  - generate encodes the prompt and decodes the output with the tokenizer;
 *  - bad input: clear one-line errors with exit 1 (no output file left), warnings with counts for
 *    skipped lines, no crash and no sanitizer report.
 * The model: mt_cli_tokenizer_model (a tiny Llama with the llama3 fixture tokenizer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "util/testutil.h"

#define OUT_SIZE 65536

static mt_cli_env g_env;
static struct {
    char model[4096]; /* tiny model dir with tokenizer.json */
    char tok[4096];   /* tests/fixtures/tokenizers/llama3 */
    char *tmp;
} g;

#define sh mt_test_sh

#define mt(out, ...) mt_cli_run(&g_env, out, OUT_SIZE, __VA_ARGS__)
#define expect mt_cli_expect
static int exists(const char *rel) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", g.tmp, rel);
    return access(p, F_OK) == 0;
}

static void write_text(const char *rel, const char *text) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", g.tmp, rel);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static void same_file(const char *a, const char *b) {
    sh("cd '%s' && cmp '%s' '%s'", g.tmp, a, b);
}

/* The "loss X" of every "step " line, concatenated. */
static void losses(const char *out, char *buf, size_t size) {
    buf[0] = '\0';
    for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, "step ", 5) != 0) continue;
        const char *l = strstr(p, "| loss ");
        assert_non_null(l);
        size_t have = strlen(buf), n = strcspn(l + 7, " ");
        if (have + n + 2 > size) fail_msg("too many step lines");
        snprintf(buf + have, size - have, "%.*s,", (int)n, l + 7);
    }
}

#define TRAIN "train --steps 3 --batch 2 --seq 16 --no-shuffle --lr 0.01 --seed 7"

static void test_tokenize_equals_train(void **st) {
    (void)st;
    char *out = malloc(OUT_SIZE), a[512], b[512];
    int rc = mt(out, "tokenize --tokenizer '%s' --out corpus.bin corpus.txt", g.model);
    expect(rc, 0, out, "tokens/s");
    rc = mt(out, TRAIN " --model '%s' --data corpus.txt --out run_txt", g.model);
    expect(rc, 0, out, "corpus.txt: ");
    losses(out, a, sizeof a);
    same_file("corpus.bin", "run_txt/corpus.txt.tokens.bin");
    rc = mt(out, TRAIN " --model '%s' --data corpus.bin --out run_bin", g.model);
    expect(rc, 0, out, "step 3/3");
    losses(out, b, sizeof b);
    printf("losses on text %s, on the token file %s\n", a, b);
    assert_true(strlen(a) > 3);
    assert_string_equal(a, b);

    /* JSONL */
    rc = mt(out, "tokenize --tokenizer '%s/tokenizer.json' --out docs.bin docs.jsonl", g.model);
    expect(rc, 0, out, "from 3 documents");
    rc = mt(out, TRAIN " --model '%s' --data docs.jsonl --out run_jsonl", g.model);
    expect(rc, 0, out, "step 3/3");
    same_file("docs.bin", "run_jsonl/docs.jsonl.tokens.bin");
    /* --dtype u32 holds the same ids */
    rc = mt(out, "tokenize --tokenizer '%s' --dtype u32 --out docs32.bin docs.jsonl", g.model);
    expect(rc, 0, out, "uint32");
    sh("cd '%s' && od -An -v -tu2 -w2 docs.bin > a.txt && od -An -v -tu4 -w4 docs32.bin > b.txt && "
       "diff -w a.txt b.txt > /dev/null",
       g.tmp);
    free(out);
}

/* The bytes of each non-empty "text" (whitespace-only included) + eos 256, uint16 little-endian. */
static void test_tokenize_bytes_jsonl(void **st) {
    (void)st;
    char *out = malloc(OUT_SIZE);
    write_text("bytes.jsonl", "{\"text\": \"ab\"}\n"
                              "{\"text\": \"\"}\n"
                              "\n"
                              "{\"text\": \" \\n\"}\n"
                              "not json\n"
                              "{\"text\": \"caf\\u00e9\", \"id\": 3}\n");
    static const unsigned char want[] = {'a', 0, 'b', 0, 0, 1, ' ', 0, '\n', 0, 0, 1,
                                         'c', 0, 'a', 0, 'f', 0, 0xc3, 0, 0xa9, 0, 0, 1};
    char path[4096];
    snprintf(path, sizeof path, "%s/want.bin", g.tmp);
    FILE *f = fopen(path, "wb");
    assert_int_equal(fwrite(want, 1, sizeof want, f), sizeof want);
    assert_int_equal(fclose(f), 0);
    int rc = mt(out, "tokenize --bytes --out bytes.bin bytes.jsonl 2>&1");
    expect(rc, 0, out, "bytes.bin: 12 tokens from 3 documents");
    expect(rc, 0, out, "1 empty document(s) skipped (first: bytes.jsonl line 2)");
    expect(rc, 0, out, "1 line(s) that are not a JSON object skipped (first: bytes.jsonl line 5");
    same_file("bytes.bin", "want.bin");
    /* train on a model without a tokenizer (vocab 300 > 256) derives the same file */
    char *fx = mt_fixture_path("train_llama");
    sh("cd '%s' && sed 's/\"vocab_size\": 96/\"vocab_size\": 300/' '%s/config.json' > bytes_cfg.json && "
       "grep -q '\"vocab_size\": 300' bytes_cfg.json", g.tmp, fx);
    free(fx);
    rc = mt(out, "train --init bytes_cfg.json --data bytes.jsonl --out run_bytes --steps 1 --batch 1 "
                 "--seq 4 --no-save 2>&1");
    expect(rc, 0, out, "12 byte-level tokens");
    same_file("bytes.bin", "run_bytes/bytes.jsonl.tokens.bin");
    /* plain text: the same reader, so the same file too (a whitespace-only document kept) */
    write_text("bytes.txt", "one\n%\n  \n%\n%\ntwo\n");
    rc = mt(out, "tokenize --bytes --doc-sep %% --out bytes_txt.bin bytes.txt 2>&1");
    expect(rc, 0, out, "bytes_txt.bin: 14 tokens from 3 documents");
    rc = mt(out, "train --init bytes_cfg.json --data bytes.txt --doc-sep %% --out run_bytes_txt "
                 "--steps 1 --batch 1 --seq 4 --no-save 2>&1");
    expect(rc, 0, out, "14 byte-level tokens");
    same_file("bytes_txt.bin", "run_bytes_txt/bytes.txt.tokens.bin");
    free(out);
}

static void test_cache_reuse(void **st) {
    (void)st;
    char *out = malloc(OUT_SIZE);
    const char *args = TRAIN " --model '%s' --data corpus.txt --out run_cache --no-save --overwrite %s";
    int rc = mt(out, args, g.model, "");
    expect(rc, 0, out, "corpus.txt: ");
    assert_null(strstr(out, "using the tokenized cache"));
    assert_true(exists("run_cache/corpus.txt.tokens.bin.json"));
    rc = mt(out, args, g.model, "");
    expect(rc, 0, out, "using the tokenized cache");
    sh("touch -d '+2 seconds' '%s/corpus.txt'", g.tmp); /* a changed source is re-tokenized */
    rc = mt(out, args, g.model, "");
    expect(rc, 0, out, "tokens from");
    assert_null(strstr(out, "using the tokenized cache"));
    rc = mt(out, args, g.model, "--doc-sep XYZ"); /* so is another --doc-sep */
    expect(rc, 0, out, "tokens from");
    rc = mt(out, args, g.model, "--doc-sep XYZ");
    expect(rc, 0, out, "using the tokenized cache");
    free(out);
}

static void test_generate(void **st) {
    (void)st;
    char *out = malloc(OUT_SIZE);
    int rc = mt(out, "generate --model '%s' --prompt 'The quick' --tokens 8 --top-k 1 --context 32", g.model);
    expect(rc, 0, out, NULL);
    printf("generate: %s", out);
    assert_int_equal(strncmp(out, "The quick", 9), 0);
    rc = mt(out, "generate --model '%s' --tokens 4 --top-k 3 --ignore-eos --context 16", g.model);
    expect(rc, 0, out, NULL);
    free(out);
}

static void test_bad_input(void **st) {
    (void)st;
    char *out = malloc(OUT_SIZE);
    int rc = mt(out, "tokenize --help");
    expect(rc, 0, out, "--tokenizer");
    rc = mt(out, "tokenize --out x.bin corpus.txt");
    expect(rc, 1, out, "megatrain: tokenize: give exactly one of --tokenizer DIR and --bytes");
    rc = mt(out, "tokenize --bytes --tokenizer '%s' --out x.bin corpus.txt", g.model);
    expect(rc, 1, out, "exactly one");
    rc = mt(out, "tokenize --tokenizer '%s' --dtype u8 --out x.bin corpus.txt", g.model);
    expect(rc, 1, out, "--dtype: 'u8'");
    rc = mt(out, "tokenize --tokenizer '%s' --out x.bin missing.txt", g.model);
    expect(rc, 1, out, "missing.txt: cannot open");
    assert_false(exists("x.bin"));
    rc = mt(out, "tokenize --tokenizer '%s' --out x.bin", g.model);
    expect(rc, 1, out, "usage:");
    char *bad = mt_fixture_path("tokenizers/bad/unigram.json");
    rc = mt(out, "tokenize --tokenizer '%s' --out x.bin corpus.txt", bad);
    expect(rc, 1, out, "Unigram");
    free(bad);
    rc = mt(out, "tokenize --tokenizer '%s' --out x.bin no_dir_here", g.tmp);
    expect(rc, 1, out, "tokenizer.json");

    /* a JSONL with nothing usable: exit 1, no file; with some bad lines: warnings with counts */
    write_text("junk.jsonl", "nope\n{\"a\": 1}\n{\"text\": \"\"}\n");
    rc = mt(out, "tokenize --tokenizer '%s' --out x.bin junk.jsonl", g.model);
    expect(rc, 1, out, "no text");
    assert_false(exists("x.bin"));
    assert_false(exists("x.bin.tmp"));
    write_text("mixed.jsonl", "{\"text\": \"good one\"}\nnope\n{\"a\": 1}\n{\"text\": \"\"}\n"
                              "{\"text\": \"good two\"}\n");
    rc = mt(out, "tokenize --tokenizer '%s' --out x.bin mixed.jsonl", g.model);
    expect(rc, 0, out, "from 2 documents");
    expect(rc, 0, out, "1 line(s) that are not a JSON object skipped (first: mixed.jsonl line 2");
    expect(rc, 0, out, "1 JSON object(s) without a string \"text\" skipped (first: mixed.jsonl line 3)");
    expect(rc, 0, out, "1 empty document(s) skipped (first: mixed.jsonl line 4)");
    write_text("bad_utf8.txt", "ok \xff\xfe text\n");
    rc = mt(out, "tokenize --tokenizer '%s' --out y.bin bad_utf8.txt", g.model);
    expect(rc, 0, out, "1 document(s) with invalid UTF-8");

    /* a tokenizer larger than the model's vocabulary */
    char *fx = mt_fixture_path("train_llama");
    sh("cp -r '%s' '%s/small_vocab' && cp '%s/tokenizer.json' '%s/small_vocab/'", fx, g.tmp, g.tok, g.tmp);
    free(fx);
    rc = mt(out, TRAIN " --model small_vocab --data corpus.txt --out run_small");
    expect(rc, 1, out, "the tokenizer has 1506 ids but the model's vocabulary (vocab_size) is 96");
    rc = mt(out, "generate --model small_vocab --tokens 2");
    expect(rc, 1, out, "the tokenizer has 1506 ids");
    free(out);
}

static int setup(void **st) {
    *st = &g_env; /* for mt_cli_env_teardown */
    if (mt_cli_env_init(&g_env, "train_llama") != 0) return -1;
    g.tmp = g_env.tmp;
    if (mt_cli_tokenizer_model(&g_env, 0.02, g.model, sizeof g.model) != 0) return -1;
    char *tok = mt_fixture_path("tokenizers/llama3");
    snprintf(g.tok, sizeof g.tok, "%s", tok);
    free(tok);
    char path[4096];
    snprintf(path, sizeof path, "%s/corpus.txt", g.tmp);
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 40; i++)
        fprintf(f, "Line %d: the quick brown fox jumps over the lazy dog. Caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac "
                   "\xf0\x9f\x99\x82 %d\n", i, i * 37);
    fclose(f);
    snprintf(path, sizeof path, "%s/docs.jsonl", g.tmp);
    f = fopen(path, "wb");
    fputs("{\"text\": \"first document, with some words in it\"}\n"
          "{\"text\": \"second: \\u00fcber na\\u00efve caf\\u00e9s \\ud83d\\ude42\"}\n"
          "{\"text\": \"third\\nhas\\nlines <|end_of_text|> and a special token\"}\n", f);
    fclose(f);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenize_equals_train),
        cmocka_unit_test(test_tokenize_bytes_jsonl),
        cmocka_unit_test(test_cache_reuse),
        cmocka_unit_test(test_generate),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
