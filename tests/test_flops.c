/* The throughput counts (engine/flops.h) against hand arithmetic, and what train prints of them:
 * the Qwen2.5-7B shape at 512k, packed documents, and the step line, metrics.jsonl and summary of
 * a run of the fixture model (both counts, named, and their ratio the one computed by hand). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/flops.h"
#include "model/config.h"
#include "model/params.h"
#include "util/testutil.h"

#define OUT_SIZE 65536

static mt_cli_env env;

static int setup(void **state) {
    *state = &env; /* for mt_cli_env_teardown */
    return mt_cli_env_init(&env, "train_llama");
}

static void load_config(mt_config *cfg, const char *rel) {
    char *path = mt_fixture_path(rel);
    if (mt_config_load(cfg, path) != MT_OK) fail_msg("%s", mt_error_message());
    free(path);
}

/* Qwen2.5-7B at T = 524288, one sequence. By hand: N = 28 layers x 233,057,792 (q 3584^2 + 3584,
 * k and v 3584*512 + 512 each, o 3584^2, MLP 3*3584*18944, two norms 3584) + embed and head
 * 152064*3584 each + the final norm 3584 = 7,615,616,512; 6NT = 6 * N * 524288. Attention: per
 * layer forward 4*H*D*T^2/2 = 4*28*128*2^38/2, backward 2.5x that, 28 layers: 7*28*28*128*2^38
 * = 702464 * 2^38 = 193,091,376,195,584 * 1000 (1.931e17), 8.06x the 6NT count. */
static void test_7b_512k(void **state) {
    (void)state;
    mt_config cfg;
    load_config(&cfg, "../../bench/configs/qwen2.5-7b.json");
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    assert_int_equal(t.n_real, 7615616512LL);
    const double T = 524288.0;
    double six = mt_flops_6nt((double)t.n_real, T);
    assert_true(six == 6.0 * 7615616512.0 * 524288.0);
    double attn = mt_flops_attention(&cfg, NULL, 1, 524288);
    assert_true(attn == 702464.0 * 274877906944.0); /* 2^38 = 274877906944, exact in a double */
    fprintf(stderr, "7B 512k: 6NT %.4e, attention %.4e (%.2fx)\n", six, attn, attn / six);
    assert_true(attn / six > 8.0 && attn / six < 8.1);
    /* the forward alone is 2/7 of it: bench/attention_bench.cu's 4*B*H*T^2*D/2 per layer */
    assert_true(attn * 2.0 / 7.0 == 28.0 * 4.0 * 28.0 * T * T * 128.0 / 2.0);
    mt_param_table_free(&t);
}

/* Packed rows: only the squares of the documents count. Row 0 holds documents of 3 and 5 tokens,
 * row 1 one of 8: 9 + 25 + 64 = 98 (full rows would be 2 * 64 = 128). */
static void test_documents(void **state) {
    (void)state;
    const int32_t doc_start[16] = {0, 0, 0, 3, 3, 3, 3, 3, /* row 1 */ 0, 0, 0, 0, 0, 0, 0, 0};
    assert_true(mt_flops_doc_square_sum(doc_start, 2, 8) == 98.0);
    assert_true(mt_flops_doc_square_sum(NULL, 2, 8) == 128.0);
    /* every token its own document: T documents of 1 */
    const int32_t single[4] = {0, 1, 2, 3};
    assert_true(mt_flops_doc_square_sum(single, 1, 4) == 4.0);
    mt_config cfg;
    load_config(&cfg, "train_llama/config.json");
    /* L 2, H 4, D 8: 7 * 2 * 4 * 8 = 448 a squared token */
    assert_true(mt_flops_attention(&cfg, doc_start, 2, 8) == 448.0 * 98);
}

/* The number after "key": in a JSON line. */
static double json_num(const char *line, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(line, pat);
    if (!p) fail_msg("no %s in %s", key, line);
    return strtod(p + strlen(pat), NULL);
}

/* A run of the fixture model (B 2, T 64): the step line names both counts, metrics.jsonl has both,
 * and their ratio is 1 + attention / 6NT by hand: attention 448 * 2 * 64^2 = 3,670,016 a step. */
static void test_train_prints_both(void **state) {
    (void)state;
    static char out[OUT_SIZE];
    int rc = mt_cli_run(&env, out, sizeof out,
                        "train --model '%s' --data '%s/data.bin' --steps 3 --batch 2 --seq 64 "
                        "--device cpu --no-save --out run_flops", env.fixture, env.fixture);
    fprintf(stderr, "%s", out);
    mt_cli_expect(rc, 0, out, "TFLOPS 6NT, ");
    mt_cli_expect(rc, 0, out, " with attention");
    mt_cli_expect(rc, 0, out, "throughput: ");
    mt_cli_expect(rc, 0, out, "with attention (causal, over full rows)");
    mt_config cfg;
    load_config(&cfg, "train_llama/config.json");
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    double six = 6.0 * (double)t.n_real * 2 * 64, attn = 448.0 * 2 * 64 * 64, r = 1 + attn / six;
    mt_param_table_free(&t);
    char path[4200];
    snprintf(path, sizeof path, "%s/run_flops/metrics.jsonl", env.tmp);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[2048];
    int steps = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"tflops\"")) continue;
        double a = json_num(line, "tflops"), b = json_num(line, "tflops_attn"), ms = json_num(line, "ms");
        /* tflops printed with 6 decimals: 5e-7 of rounding each */
        fprintf(stderr, "step %d: %.6f 6NT, %.6f with attention (ratio %.5f, by hand %.5f)\n", steps + 1, a,
                b, b / a, r);
        assert_true(fabs(b - a * r) <= 5e-7 * (1 + r) + 1e-12);
        /* and the 6NT rate is 6NT over the step's time (ms printed with 3 decimals) */
        assert_true(fabs(a - six / (ms / 1e3) / 1e12) <= 5e-7 + a * 5e-4 / ms);
        assert_null(strstr(line, "attn_docs")); /* plain token data: full rows */
        steps++;
    }
    fclose(f);
    assert_int_equal(steps, 3);
}

/* Packed chat rows: the engine knows the documents, so the step line says "(in documents)", the
 * metrics carry attn_docs, the summary says "within documents", and the attention count is below
 * the full-row count of the same shape (several conversations share a 64-token row). */
static void test_train_packed_documents(void **state) {
    (void)state;
    char model[4096];
    if (mt_cli_tokenizer_model(&env, 0.02, model, sizeof model) != 0) fail_msg("no tokenizer model");
    char path[4200];
    snprintf(path, sizeof path, "%s/chat.jsonl", env.tmp);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int c = 0; c < 24; c++)
        fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi %d\"}, "
                   "{\"role\": \"assistant\", \"content\": \"ok %d\"}]}\n", c, c * 7);
    assert_int_equal(fclose(f), 0);
    static char out[OUT_SIZE];
    int rc = mt_cli_run(&env, out, sizeof out,
                        "train --model '%s' --data chat.jsonl --steps 2 --batch 2 --seq 64 --device cpu "
                        "--no-save --out run_docs", model);
    fprintf(stderr, "%s", out);
    mt_cli_expect(rc, 0, out, " with attention (in documents)");
    mt_cli_expect(rc, 0, out, "with attention (causal, within documents)");
    mt_config cfg;
    char cfg_path[4200];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", model);
    if (mt_config_load(&cfg, cfg_path) != MT_OK) fail_msg("%s", mt_error_message());
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    double six = 6.0 * (double)t.n_real * 2 * 64, full = 1 + mt_flops_attention(&cfg, NULL, 2, 64) / six;
    mt_param_table_free(&t);
    snprintf(path, sizeof path, "%s/run_docs/metrics.jsonl", env.tmp);
    f = fopen(path, "r");
    assert_non_null(f);
    char line[2048];
    int steps = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"tflops\"")) continue;
        double a = json_num(line, "tflops"), b = json_num(line, "tflops_attn");
        fprintf(stderr, "step %d: ratio %.5f, full rows %.5f\n", steps + 1, b / a, full);
        assert_non_null(strstr(line, "\"attn_docs\": true"));
        assert_true(b > a && b / a < full - 1e-3 * (full - 1));
        steps++;
    }
    fclose(f);
    assert_int_equal(steps, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_7b_512k),
        cmocka_unit_test(test_documents),
        cmocka_unit_test(test_train_prints_both),
        cmocka_unit_test(test_train_packed_documents),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
