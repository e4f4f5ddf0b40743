/* A run that diverges is never passed off as good (`megatrain train`, binary in env MT_BIN, on the
 * train_llama fixture):
 *  - the count of non-finite steps in a row is part of a checkpoint's state: a run whose last
 *    --max-nonfinite steps were skipped exits 1 however many processes skipped them, and one that
 *    ends on skipped steps says so beside its last checkpoint;
 *  - --keep never prunes the last checkpoint written after a healthy step while the steps after it
 *    are skipped, until a later healthy one is written;
 *  - a checkpoint with finite but absurd values (checksums made to match) is refused at load,
 *    naming the tensor; resume passes over it to the older intact one;
 *  - the step line prints a huge loss in exponent form;
 *  - a line of metrics.jsonl that is not JSON is named in a warning on --resume.
 * A model made to diverge within those bounds: every MLP and norm weight of a checkpoint set to 1e8
 * (legal at load) overflows the MLP to inf, so every later step has loss and norm NaN. */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/ckpt_edit.h"
#include "util/testutil.h"

#define OUT_SIZE 65536

static mt_cli_env g_env;
static char g_out[OUT_SIZE]; /* static: a failing check longjmps out */

static int setup(void **state) {
    *state = &g_env; /* for mt_cli_env_teardown */
    return mt_cli_env_init(&g_env, "train_llama");
}

static int train(const char *out_dir, const char *extra) {
    return mt_cli_train(&g_env, g_out, sizeof g_out, out_dir, extra);
}

static void train_ok(const char *out_dir, const char *extra) {
    mt_cli_train_ok(&g_env, g_out, sizeof g_out, out_dir, extra);
}

static void expect_in(const char *text, const char *needle) {
    if (!strstr(text, needle)) fail_msg("'%s' is not in:\n%s", needle, text);
}

static void expect_not_in(const char *text, const char *needle) {
    if (strstr(text, needle)) fail_msg("'%s' should not be in:\n%s", needle, text);
}

static const char *error_line(void) {
    static char first[8192];
    int n = mt_cli_error_lines(g_out, first, sizeof first);
    if (n != 1) fail_msg("%d error lines, want 1:\n%s", n, g_out);
    return first;
}

/* TMP/OUT/checkpoints/step_N */
static char *ckpt(const char *out_dir, int step) {
    static char path[4][4096];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, 4096, "%s/%s/checkpoints/step_%08d", g_env.tmp, out_dir, step);
    return p;
}

/* The step numbers of OUT's step_ directories, ascending, as "1,5,6". */
static const char *steps_of(const char *out_dir) {
    static char list[512];
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s/checkpoints", g_env.tmp, out_dir);
    int have[64] = {0};
    DIR *d = opendir(dir);
    if (!d) fail_msg("%s: no checkpoints", dir);
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "step_", 5) && atoi(e->d_name + 5) < 64) have[atoi(e->d_name + 5)] = 1;
    closedir(d);
    list[0] = '\0';
    for (int s = 0; s < 64; s++)
        if (have[s]) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", list[0] ? "," : "", s);
    return list;
}

static long long in_a_row_of(const char *dir) {
    json_t *o = mt_test_ckpt_load_state(dir);
    json_t *v = json_object_get(o, "nonfinite_in_a_row");
    if (!json_is_integer(v)) fail_msg("%s/trainer_state.json: no integer nonfinite_in_a_row", dir);
    long long n = json_integer_value(v);
    json_decref(o);
    return n;
}

/* Every later step of a run resumed from DIR is NaN (see the top). */
static void make_diverge(const char *dir) {
    mt_test_ckpt_fill_f32(dir, "model.safetensors", "mlp", 0, -1, 1e8f);
    mt_test_ckpt_fill_f32(dir, "model.safetensors", "norm", 0, -1, 1e8f);
}

/* Steps 2 and 3 skipped by one process (--stop-at 3), step 4 by the next: 3 in a row, exit 1,
 * nothing written for it. (Before: the count restarted at 1 on --resume, and the run ended with
 * exit 0 and "last checkpoint: step_5 (a Hugging Face model directory ...)" without a single
 * update after step 1.) A resume with --max-nonfinite 2 and no step left is refused too. */
static void test_in_a_row_survives_resume(void **state) {
    train_ok("row", "--steps 5 --stop-at 1");
    make_diverge(ckpt("row", 1));
    train_ok("row", "--steps 5 --save-every 1 --resume --stop-at 3");
    expect_in(g_out, "step 2: loss nan, gradient norm nan: update skipped (1 in a row");
    expect_in(g_out, "step 3: loss nan, gradient norm nan: update skipped (2 in a row");
    assert_int_equal(in_a_row_of(ckpt("row", 2)), 1);
    assert_int_equal(in_a_row_of(ckpt("row", 3)), 2);

    int rc = train("row", "--steps 5 --save-every 1 --resume");
    assert_int_equal(rc, 1);
    expect_in(g_out, "skipped, the last 2 in a row");
    const char *err = error_line();
    expect_in(err, "step 4: ");
    expect_in(err, "3 in a row, --max-nonfinite 3");
    expect_not_in(g_out, "a Hugging Face model directory");
    assert_string_equal(steps_of("row"), "1,2,3");

    rc = train("row", "--steps 5 --save-every 1 --resume --stop-at 3 --max-nonfinite 2");
    assert_int_equal(rc, 1);
    expect_in(error_line(), "the last 2 steps up to step 3 were all non-finite and skipped (--max-nonfinite 2)");
    assert_string_equal(steps_of("row"), "1,2,3");
    assert_int_equal(in_a_row_of(ckpt("row", 1)), 0);
}

/* A run that ends on fewer than --max-nonfinite skipped steps exits 0, but its last checkpoint is
 * not called a plain model directory: the line says the steps before it were skipped. */
static void test_end_on_skipped_steps(void **state) {
    train_ok("tail", "--steps 3 --stop-at 1");
    make_diverge(ckpt("tail", 1));
    train_ok("tail", "--steps 3 --resume");
    expect_in(g_out, "(a Hugging Face model directory: use it with --model); the last 2 steps were non-finite "
                     "and skipped: its weights are from before them");
    assert_int_equal(in_a_row_of(ckpt("tail", 3)), 2);
}

/* --keep 2 while every step is skipped keeps step_1, the last healthy one, beside the two newest;
 * once a healthy step is saved again, the ordinary --keep applies. (Before: step_1 was pruned when
 * step_3 was written.) */
static void test_keep_spares_last_healthy(void **state) {
    const char *flags = "--steps 8 --save-every 1 --keep 2 --max-nonfinite 10";
    char extra[512];
    snprintf(extra, sizeof extra, "%s --stop-at 1", flags);
    train_ok("keep", extra);
    make_diverge(ckpt("keep", 1));
    snprintf(extra, sizeof extra, "%s --resume --stop-at 6", flags);
    train_ok("keep", extra);
    expect_in(g_out, "step 6: loss nan");
    assert_string_equal(steps_of("keep"), "1,5,6");
    /* healthy again: small MLP weights, unit norms */
    mt_test_ckpt_fill_f32(ckpt("keep", 6), "model.safetensors", "mlp", 0, -1, 0.01f);
    mt_test_ckpt_fill_f32(ckpt("keep", 6), "model.safetensors", "norm", 0, -1, 1.0f);
    snprintf(extra, sizeof extra, "%s --resume --stop-at 7", flags);
    train_ok("keep", extra);
    expect_not_in(g_out, "step 7: loss nan");
    assert_string_equal(steps_of("keep"), "6,7");
    assert_int_equal(in_a_row_of(ckpt("keep", 7)), 0);
}

/* The absurd values, each in the newest checkpoint with its checksum re-recorded: resume
 * names the tensor and goes back to the older intact checkpoint. (Before: both loaded; the 3e38
 * weight gave loss ln(vocab) and norm 0 ever after, the 1e30 moment weights of 1e29.) */
static void test_absurd_values_refused(void **state) {
    struct {
        const char *file, *tensor;
        float value;
        const char *want;
    } cases[] = {
        {"model.safetensors", "model.layers.1.mlp.up_proj.weight", 3e38f,
         "model.safetensors: tensor model.layers.1.mlp.up_proj.weight: element 5 is 3e+38, outside |w| <= 1e8"},
        {"optimizer.safetensors", "exp_avg.model.layers.0.self_attn.q_proj.weight", 1e30f,
         "tensor exp_avg.model.layers.0.self_attn.q_proj.weight: element 5 is 1e+30, outside |exp_avg| <= 1e8"},
        {"optimizer.safetensors", "exp_avg_sq.model.norm.weight", -1.0f,
         "tensor exp_avg_sq.model.norm.weight: element 5 is -1, outside 0 <= exp_avg_sq <= 1e16"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char out[64];
        snprintf(out, sizeof out, "absurd%zu", c);
        train_ok(out, "--steps 4 --save-every 1 --stop-at 2");
        mt_test_ckpt_fill_f32(ckpt(out, 2), cases[c].file, cases[c].tensor, 5, 1, cases[c].value);
        train_ok(out, "--steps 4 --save-every 1 --resume --stop-at 3");
        expect_in(g_out, "step_00000002 is damaged (");
        expect_in(g_out, cases[c].want);
        expect_in(g_out, "resuming from step_00000001 instead");
    }
}

/* A loss of 1.5e6 (initializer_range 1e5) in the step line: exponent form, as in the summary.
 * (Before: "loss 1496921.7871"; a diverged run printed 31 digits.) */
static void test_huge_loss_exponent(void **state) {
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/config.json", g_env.fixture);
    snprintf(dst, sizeof dst, "%s/init_1e5.json", g_env.tmp);
    json_error_t je;
    json_t *cfg = json_load_file(src, 0, &je);
    assert_non_null(cfg);
    json_object_set_new(cfg, "initializer_range", json_real(1e5));
    assert_int_equal(json_dump_file(cfg, dst, 0), 0);
    json_decref(cfg);
    int rc = mt_cli_run(&g_env, g_out, sizeof g_out,
                        "train --init init_1e5.json --data '%s/data.bin' --batch 2 --seq 16 --device cpu "
                        "--out huge_loss --steps 1 --no-save",
                        g_env.fixture);
    assert_int_equal(rc, 0);
    const char *at = strstr(g_out, "step 1/1 | loss ");
    if (!at) fail_msg("no step line:\n%s", g_out);
    at += strlen("step 1/1 | loss ");
    double loss = strtod(at, NULL);
    assert_true(loss > 1e6);
    const char *bar = strchr(at, '|');
    assert_non_null(bar);
    if (!memchr(at, 'e', (size_t)(bar - at))) fail_msg("loss not in exponent form: %.40s", at);
    assert_true(bar - at <= 12); /* "1.4969e+06 " */
}

/* A garbage line in the middle of metrics.jsonl stays, named in a warning on --resume. */
static void test_metrics_garbage_warned(void **state) {
    train_ok("garbage", "--steps 4 --stop-at 2");
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/garbage/metrics.jsonl", g_env.tmp);
    snprintf(tmp, sizeof tmp, "%s.new", path);
    FILE *in = fopen(path, "r"), *out = fopen(tmp, "w");
    assert_non_null(in);
    assert_non_null(out);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, in)) {
        fputs(line, out);
        if (++n == 1) fputs("this is not json\n", out);
    }
    fclose(in);
    fclose(out);
    assert_int_equal(rename(tmp, path), 0);
    train_ok("garbage", "--steps 4 --resume --stop-at 3");
    expect_in(g_out, "megatrain: warning: garbage/metrics.jsonl line 2 is not a JSON object (kept as it is): "
                     "this is not json");
    FILE *f = fopen(path, "r");
    int found = 0;
    while (fgets(line, sizeof line, f)) found |= strcmp(line, "this is not json\n") == 0;
    fclose(f);
    assert_true(found);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_a_row_survives_resume),
        cmocka_unit_test(test_end_on_skipped_steps),
        cmocka_unit_test(test_keep_spares_last_healthy),
        cmocka_unit_test(test_absurd_values_refused),
        cmocka_unit_test(test_huge_loss_exponent),
        cmocka_unit_test(test_metrics_garbage_warned),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
