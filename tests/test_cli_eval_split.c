/* `megatrain train --eval-split F` (binary in env MT_BIN) on the train_llama fixture: the eval losses
 * in metrics.jsonl (every --eval-every steps) are the same in two runs with the same data and seed,
 * and in a run stopped at a step and resumed (the held-out set depends on the data and --seed only);
 * another --seed holds out another set. Refused, one line each: F outside (0, 1), --eval-split
 * with --eval-data (naming both), data too small to leave both sides non-empty, and a resume with
 * another --eval-split. (That the eval set is disjoint from every training batch: test_data_split.)
 * Text data (JSONL through the llama3 fixture tokenizer: mt_cli_tokenizer_model) is split by
 * document: the run says how many documents are held out, and the eval losses are the same in two
 * runs and a resume (which re-uses the tokenized cache and its document index); a text file without
 * --doc-sep is one document, refused naming it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/testutil.h"

#define OUT_SIZE 65536

static mt_cli_env g;

static int setup(void **state) {
    *state = &g; /* for mt_cli_env_teardown */
    return mt_cli_env_init(&g, "train_llama");
}

#define COMMON "train --model '%s' --data '%s/data.bin' --steps 8 --batch 2 --seq 16 --eval-every 2 " \
               "--eval-batches 2 --device cpu "

static void train_ok(const char *out_name, const char *extra) {
    static char out[OUT_SIZE];
    int rc = mt_cli_run(&g, out, OUT_SIZE, COMMON "--out %s %s", g.fixture, g.fixture, out_name, extra);
    mt_cli_expect(rc, 0, out, "held out as the eval set");
}

/* The eval lines of OUT/metrics.jsonl, concatenated; their count. */
static int eval_lines(const char *out_name, char *buf, size_t size) {
    char path[4096], line[4096];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", g.tmp, out_name);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    buf[0] = '\0';
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "\"eval_loss\"")) {
            if (strlen(buf) + strlen(line) + 1 > size) fail_msg("too many eval lines in %s", path);
            strcat(buf, line), n++;
        }
    fclose(f);
    return n;
}

static void test_same_across_runs_and_resume(void **state) {
    static char a[8192], b[8192], c[8192], d[8192];
    train_ok("a", "--eval-split 0.2 --seed 5");
    train_ok("b", "--eval-split 0.2 --seed 5");
    train_ok("c", "--eval-split 0.2 --seed 5 --stop-at 4");
    train_ok("c", "--eval-split 0.2 --seed 5 --resume");
    train_ok("d", "--eval-split 0.2 --seed 6");
    assert_int_equal(eval_lines("a", a, sizeof a), 4); /* steps 2, 4, 6, 8 */
    assert_int_equal(eval_lines("b", b, sizeof b), 4);
    assert_int_equal(eval_lines("c", c, sizeof c), 4);
    eval_lines("d", d, sizeof d);
    printf("eval lines:\n%s", a);
    assert_string_equal(a, b);
    assert_string_equal(a, c);
    if (!strcmp(a, d)) fail_msg("--seed 6 evaluates exactly as --seed 5:\n%s", d);
}

/* `train` of the tokenizer model on DATA into OUT_NAME, which must succeed: its output. */
static const char *train_text(const char *model, const char *data, const char *out_name, const char *extra) {
    static char out[OUT_SIZE];
    int rc = mt_cli_run(&g, out, OUT_SIZE,
                        "train --model '%s' --data %s --steps 8 --batch 2 --seq 16 --eval-every 2 "
                        "--eval-batches 50 --device cpu --out %s %s", model, data, out_name, extra);
    mt_cli_expect(rc, 0, out, "held out as the eval set");
    return out;
}

static void test_text_by_document(void **state) {
    char model[4096];
    if (mt_cli_tokenizer_model(&g, 0.02, model, sizeof model) != 0) fail_msg("cannot make the tokenizer model");
    char path[4096];
    snprintf(path, sizeof path, "%s/docs.jsonl", g.tmp);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    static const char *const words[] = {"river", "stone", "lamp", "cloud", "garden", "window", "paper", "bridge"};
    for (int i = 0; i < 60; i++) {
        fprintf(f, "{\"text\": \"Document %d:", i);
        for (int k = 0; k < 3 + i % 7; k++) fprintf(f, " %s", words[(i * 3 + k) % 8]);
        fprintf(f, ".\"}\n");
    }
    assert_int_equal(fclose(f), 0);
    static char a[8192], b[8192], c[8192];
    const char *out = train_text(model, "docs.jsonl", "ta", "--eval-split 0.2 --seed 5");
    if (!strstr(out, "--eval-split 0.2: ") || !strstr(out, " of 60 documents held out as the eval set"))
        fail_msg("does not hold out documents:\n%s", out);
    train_text(model, "docs.jsonl", "tb", "--eval-split 0.2 --seed 5");
    train_text(model, "docs.jsonl", "tc", "--eval-split 0.2 --seed 5 --stop-at 4");
    out = train_text(model, "docs.jsonl", "tc", "--eval-split 0.2 --seed 5 --resume");
    if (!strstr(out, "using the tokenized cache")) fail_msg("the resume tokenized again:\n%s", out);
    assert_int_equal(eval_lines("ta", a, sizeof a), 4);
    assert_int_equal(eval_lines("tb", b, sizeof b), 4);
    assert_int_equal(eval_lines("tc", c, sizeof c), 4);
    printf("eval lines:\n%s", a);
    assert_string_equal(a, b);
    assert_string_equal(a, c);
    /* plain text without --doc-sep: one document, nothing to split */
    mt_test_sh("cd '%s' && for i in $(seq 40); do echo 'a line of plain text'; done > plain.txt", g.tmp);
    static char err[OUT_SIZE];
    char first[2048];
    int rc = mt_cli_run(&g, err, sizeof err,
                        "train --model '%s' --data plain.txt --steps 2 --batch 2 --seq 16 --device cpu --out plain "
                        "--eval-split 0.5", model);
    mt_cli_expect(rc, 1, err, "of plain.txt (1 document: without --doc-sep a text file is one)");
    assert_int_equal(mt_cli_error_lines(err, first, sizeof first), 1);
}

static void expect_refused(const char *extra, const char *needle) {
    static char out[OUT_SIZE];
    char first[2048];
    int rc = mt_cli_run(&g, out, OUT_SIZE, COMMON "--out refused %s", g.fixture, g.fixture, extra);
    int n_err = mt_cli_error_lines(out, first, sizeof first);
    printf("%s -> exit %d: %s\n", extra, rc, first);
    mt_cli_expect(rc, 1, out, needle);
    assert_int_equal(n_err, 1);
    if (!strstr(first, needle)) fail_msg("'%s' not in the error line: %s", needle, first);
}

static void test_refused(void **state) {
    expect_refused("--eval-split 0", "--eval-split 0: must be more than 0 and less than 1");
    expect_refused("--eval-split 1", "--eval-split 1: must be more than 0 and less than 1");
    expect_refused("--eval-split 1.5", "--eval-split");
    expect_refused("--eval-split -0.1", "--eval-split");
    expect_refused("--eval-split abc", "--eval-split");
    char extra[4096];
    snprintf(extra, sizeof extra, "--eval-split 0.1 --eval-data '%s/data.bin'", g.fixture);
    expect_refused(extra, "--eval-split and --eval-data: give one");
    /* 20 tokens: one sequence of 16, so the eval or the train side is empty whatever F */
    mt_test_sh("cd '%s' && head -c 40 '%s/data.bin' > small.bin", g.tmp, g.fixture);
    static char out[OUT_SIZE];
    int rc = mt_cli_run(&g, out, OUT_SIZE,
                        "train --model '%s' --data small.bin --steps 2 --batch 2 --seq 16 --device cpu --out small "
                        "--eval-split 0.5", g.fixture);
    mt_cli_expect(rc, 1, out, "megatrain: --eval-split 0.5 holds out ");
    if (!strstr(out, "of small.bin (20 tokens: 1 sequences of --seq 16)")) fail_msg("does not name the data:\n%s", out);
    /* a resume with another split would train on what was held out */
    train_ok("r", "--eval-split 0.2 --stop-at 2");
    rc = mt_cli_run(&g, out, OUT_SIZE, COMMON "--out r --eval-split 0.3 --resume", g.fixture, g.fixture);
    mt_cli_expect(rc, 1, out, "--eval-split 0.2 -> 0.3");
    rc = mt_cli_run(&g, out, OUT_SIZE,
                    "train --model '%s' --data '%s/data.bin' --steps 8 --batch 2 --seq 16 --device cpu --out r "
                    "--resume", g.fixture, g.fixture);
    mt_cli_expect(rc, 1, out, "--eval-split 0.2 -> (none)");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_across_runs_and_resume),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_text_by_document),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
