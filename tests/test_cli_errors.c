/* The `megatrain` binary (env MT_BIN) on bad input: every bad data file, model directory, config
 * field and flag value is one clear line "megatrain: ..." naming the file or flag, exit code 1,
 * before step 1, and no checkpoint written. A crash (exit >= 128) or any AddressSanitizer/UBSan
 * report fails the test (under ASan the exit code of a report is also 1, so the output is read).
 * Also: the --help of every command exits 0 with its usage, and plan / eval / info work on the
 * train_llama fixture. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "util/testutil.h"

#define OUT_SIZE 65536

typedef struct {
    char *tmp;     /* scratch directory for this file's tests */
    char *fixture; /* tests/fixtures/train_llama */
    const char *bin;
} ctx;

static ctx g;

/* ---- helpers ---- */

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

#define sh mt_test_sh

/* A copy of the fixture at TMP/NAME with config.json's KEY set to the JSON value VALUE
 * (KEY NULL: an unmodified copy). */
static void model_variant(const char *name, const char *key, const char *value) {
    sh("cp -r '%s' '%s/%s'", g.fixture, g.tmp, name);
    if (!key) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/config.json", g.tmp, name);
    json_error_t err;
    json_t *cfg = json_load_file(path, 0, &err);
    assert_non_null(cfg);
    json_t *v = json_loads(value, JSON_DECODE_ANY, &err);
    if (!v) fail_msg("bad JSON value %s: %s", value, err.text);
    json_object_set_new(cfg, key, v);
    assert_int_equal(json_dump_file(cfg, path, JSON_INDENT(2)), 0);
    json_decref(cfg);
}

/* Fails on a crash or a sanitizer report; returns the exit code. */
static int run_checked(const char *cmd, char *out, size_t out_size) {
    int rc = mt_test_run(cmd, out, out_size);
    if (rc < 0) fail_msg("could not run: %s", cmd);
    if (strstr(out, "Sanitizer") || strstr(out, "runtime error:"))
        fail_msg("sanitizer report from: %s\n%s", cmd, out);
    if (rc >= 128) fail_msg("crashed (exit %d = signal %d): %s\n%s", rc, rc - 128, cmd, out);
    return rc;
}

static int has_line_prefix(const char *out, const char *prefix) {
    size_t n = strlen(prefix);
    for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, prefix, n) == 0) return 1;
    return 0;
}

static int64_t file_lines(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int64_t n = 0;
    int c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

/* Number of entries (other than . and ..) of DIR; 0 when it does not exist. */
static int dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* Runs `megatrain ARGS` (in g.tmp) and checks the contract for bad input: exit 1, one error
 * line containing every needle, no step run, nothing saved under OUT (when given). */
static void expect_error_impl(const char *what, const char *args, const char *out_dir,
                              const char *needle1, const char *needle2) {
    char cmd[8192], first[2048];
    static char out[OUT_SIZE]; /* static: a failing check longjmps out */
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s", g.tmp, g.bin, args);
    int rc = run_checked(cmd, out, OUT_SIZE);
    int n = mt_cli_error_lines(out, first, sizeof first);
    fprintf(stderr, "  %-28s exit %d: %s\n", what, rc, first);
    if (rc != 1) fail_msg("%s: exit %d, want 1: %s\n%s", what, rc, cmd, out);
    if (n != 1) fail_msg("%s: %d 'megatrain:' error lines, want exactly 1:\n%s", what, n, out);
    if (needle1 && !strstr(first, needle1)) fail_msg("%s: the error does not name '%s': %s", what, needle1, first);
    if (needle2 && !strstr(first, needle2)) fail_msg("%s: the error does not say '%s': %s", what, needle2, first);
    if (has_line_prefix(out, "step ")) fail_msg("%s: a step ran before the error:\n%s", what, out);
    if (out_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s/checkpoints", g.tmp, out_dir);
        if (dir_entries(path)) fail_msg("%s: something was written to %s", what, path);
        snprintf(path, sizeof path, "%s/%s/metrics.jsonl", g.tmp, out_dir);
        if (file_lines(path)) fail_msg("%s: %s has step lines", what, path);
    }
}
#define expect_error expect_error_impl

/* ---- setup: data files and model variants in one scratch directory ---- */

static int setup(void **state) {
    g.bin = getenv("MT_BIN");
    if (!g.bin) {
        fprintf(stderr, "MT_BIN is not set (run through ctest)\n");
        return -1;
    }
    /* The runs are tiny: OpenMP threads that spin while idle make them 10x slower on a loaded
     * 2-core machine. Passive waiting changes no result. */
    setenv("OMP_WAIT_POLICY", "passive", 0);
    g.tmp = mt_test_tmpdir();
    g.fixture = mt_fixture_path("train_llama");
    char path[4096];
    snprintf(path, sizeof path, "%s/empty.bin", g.tmp);
    write_bytes(path, "", 0);
    snprintf(path, sizeof path, "%s/odd.bin", g.tmp);
    write_bytes(path, "\x01\x00\x02\x00\x03", 5);
    uint16_t ids[64];
    for (int i = 0; i < 64; i++) ids[i] = (uint16_t)(i % 90);
    ids[37] = 96; /* == vocab: the first id out of range */
    snprintf(path, sizeof path, "%s/id96.bin", g.tmp);
    write_bytes(path, ids, sizeof ids);
    ids[37] = 5;
    ids[50] = 65535;
    snprintf(path, sizeof path, "%s/id65535.bin", g.tmp);
    write_bytes(path, ids, sizeof ids);
    snprintf(path, sizeof path, "%s/bad.json", g.tmp);
    write_bytes(path, "{\"model_type\": \"llama\",", 23);
    snprintf(path, sizeof path, "%s/afile", g.tmp);
    write_bytes(path, "x", 1);
    sh("mkdir '%s/dir.bin'", g.tmp);

    model_variant("gelu", "hidden_act", "\"gelu\"");
    model_variant("yarn", "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 2}");
    model_variant("truncated", NULL, NULL);
    snprintf(path, sizeof path, "%s/truncated/model.safetensors", g.tmp);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(truncate(path, st.st_size / 2), 0);
    model_variant("mistral_sw", "sliding_window", "16");
    snprintf(path, sizeof path, "%s/mistral_sw/config.json", g.tmp);
    json_error_t err;
    json_t *cfg = json_load_file(path, 0, &err);
    assert_non_null(cfg);
    json_object_set_new(cfg, "model_type", json_string("mistral"));
    json_object_set_new(cfg, "architectures", json_pack("[s]", "MistralForCausalLM"));
    assert_int_equal(json_dump_file(cfg, path, JSON_INDENT(2)), 0);
    json_decref(cfg);
    *state = &g;
    return 0;
}

static int teardown(void **state) {
    if (g.tmp) mt_test_rmtree(g.tmp);
    free(g.tmp), free(g.fixture);
    return 0;
}

/* The flags of a valid 2-step run on the fixture, into OUT. */
static const char *good(const char *out) {
    static char buf[4][4096];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "--model '%s' --data '%s/data.bin' --steps 2 --batch 4 --seq 48 --device cpu --out %s",
             g.fixture, g.fixture, out);
    return b;
}

/* printf into one of 8 rotating buffers (so a few may be live at once). */
static const char *f(const char *fmt, ...) {
    static char buf[8][8192];
    static int k;
    char *r = buf[k++ % 8];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r, sizeof buf[0], fmt, ap);
    va_end(ap);
    return r;
}

/* ---- bad data ---- */

static void test_bad_data(void **state) {
    char m[4096];
    snprintf(m, sizeof m, "train --model '%s' --device cpu --steps 2 --batch 4 --seq 48", g.fixture);
    expect_error("empty data file", f("%s --data empty.bin --out o_empty", m), "o_empty", "empty.bin", "empty");
    expect_error("odd-sized data file", f("%s --data odd.bin --out o_odd", m), "o_odd", "odd.bin", "multiple of 2");
    expect_error("token id 96 (= vocab)", f("%s --data id96.bin --out o_id96", m), "o_id96", "id96.bin", "96");
    expect_error("token id 65535", f("%s --data id65535.bin --out o_id65535", m), "o_id65535", "id65535.bin", "65535");
    expect_error("nonexistent data file", f("%s --data nonexistent.bin --out o_nodata", m), "o_nodata", "nonexistent.bin", NULL);
    char nodata[4096];
    snprintf(nodata, sizeof nodata, "%s/o_nodata", g.tmp);
    if (access(nodata, F_OK) == 0) fail_msg("a missing --data file still created --out %s", nodata);
    expect_error("data is a directory", f("%s --data dir.bin --out o_dirdata", m), "o_dirdata", "dir.bin", NULL);
    expect_error("missing --data", f("%s --out o_missing", m), "o_missing", "--data", NULL);
    expect_error("empty --eval-data", f("train %s --eval-data empty.bin", good("o_evalempty")), "o_evalempty", "empty.bin", NULL);
}

/* ---- bad model ---- */

static void test_bad_model(void **state) {
    char d[4096];
    snprintf(d, sizeof d, "--data '%s/data.bin' --device cpu --steps 2 --batch 4", g.fixture);
    expect_error("nonexistent --model", f("train --model no_such_model_dir --out o_nomodel %s", d), "o_nomodel", "no_such_model_dir", NULL);
    expect_error("hidden_act gelu", f("train --model gelu --out o_gelu %s", d), "o_gelu", "hidden_act", "gelu");
    expect_error("rope_scaling yarn", f("train --model yarn --out o_yarn %s", d), "o_yarn", "rope_scaling", "yarn");
    expect_error("truncated safetensors", f("train --model truncated --out o_trunc %s", d), "o_trunc", "model.safetensors", NULL);
    expect_error("--seq > sliding_window", f("train --model mistral_sw --seq 48 --out o_sw %s", d), "o_sw", "sliding_window", "--seq");
    expect_error("--init invalid JSON", f("train --init bad.json --out o_badjson %s", d), "o_badjson", "bad.json", NULL);
    expect_error("--init nonexistent", f("train --init no_such_config.json --out o_noinit %s", d), "o_noinit", "no_such_config.json", NULL);
    expect_error("--model and --init", f("train --init bad.json %s", good("o_both")), "o_both", "--model", "--init");
}

/* ---- bad flag values ---- */

/* MT_COMM (run_ranks.h): a value other than nccl, and nccl on the cpu backend, are one error
 * naming it before step 1 (the old binary ignored MT_COMM and trained). */
static void test_bad_comm_env(void **state) {
    setenv("MT_COMM", "bogus", 1);
    expect_error("MT_COMM=bogus", f("train %s", good("o_comm_bogus")), "o_comm_bogus", "MT_COMM=bogus", "nccl");
    setenv("MT_COMM", "nccl", 1);
    expect_error("MT_COMM=nccl on the cpu", f("train %s", good("o_comm_cpu")), "o_comm_cpu", "MT_COMM=nccl",
                 "--device cpu");
    unsetenv("MT_COMM");
}

static void test_bad_flags(void **state) {
    static const struct { const char *flags, *n1, *n2; } cases[] = {
        {"--lr abc", "--lr", "abc"},
        {"--batch 0", "--batch", NULL},
        {"--micro-batch 3", "--micro-batch", NULL},
        {"--schedule foo", "--schedule", "foo"},
        {"--device tpu", "--device", "tpu"},
        {"--gpu-mem 12Q", "--gpu-mem", "12Q"},
        {"--bogus", "--bogus", NULL},
        {"--eval-every 5", "--eval-every", "--eval-data"},
        {"--steps 0", "--steps", NULL},
        {"--warmup 50", "--warmup", NULL},
        {"--clip nan", "--clip", NULL},
        {"--seq 0", "--seq", NULL},
        {"stray_argument", "stray_argument", NULL},
        {"--steps", "--steps", NULL}, /* no value */
        {"--update-on disk", "--update-on", "disk"},
        /* the streamed update needs gradients waiting on a GPU: the cpu device refuses it */
        {"--update-on gpu --state tight", "--update-on gpu", "in host memory"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *out = f("o_flag%zu", i);
        expect_error(cases[i].flags, f("train %s %s", good(out), cases[i].flags), out, cases[i].n1, cases[i].n2);
    }
    expect_error("unknown command", "bogus_command", NULL, "bogus_command", NULL);
}

/* ---- bad output paths ---- */

static void test_bad_out(void **state) {
    expect_error("--out is a file", f("train %s", good("afile")), NULL, "afile", NULL);
    /* once a double fclose of metrics.jsonl (exit 134): the error path must close each file once */
    expect_error("--log unwritable", f("train %s --log no_such_dir/train.log", good("o_log")), "o_log", "--log", "no_such_dir");
}

/* ---- --resume from a bad checkpoint leaves it alone ---- */

static void test_bad_resume(void **state) {
    char cmd[8192], path[4096];
    static char out[OUT_SIZE]; /* static: a failing check longjmps out */
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' train %s --stop-at 2 --steps 4", g.tmp, g.bin, good("o_res"));
    int rc = run_checked(cmd, out, OUT_SIZE);
    if (rc != 0) fail_msg("%s exited %d:\n%s", cmd, rc, out);
    snprintf(path, sizeof path, "%s/o_res/checkpoints", g.tmp);
    assert_int_equal(dir_entries(path), 1);

    /* a checkpoint of another model (mistral with --seq 16 is valid on its own) */
    char d[4096];
    snprintf(d, sizeof d, "train --model mistral_sw --seq 16 --data '%s/data.bin' --device cpu --steps 4 --batch 4 --out o_res --resume",
             g.fixture);
    expect_error_impl("resume: other model", d, NULL, "o_res/checkpoints/step_00000002", "different model");

    /* a truncated optimizer file */
    snprintf(path, sizeof path, "%s/o_res/checkpoints/step_00000002/optimizer.safetensors", g.tmp);
    assert_int_equal(truncate(path, 1000), 0);
    expect_error("resume: truncated optimizer", f("train %s --steps 4 --resume", good("o_res")), NULL,
                      "optimizer.safetensors", NULL);
    snprintf(path, sizeof path, "%s/o_res/checkpoints", g.tmp);
    assert_int_equal(dir_entries(path), 1); /* still only step_00000002 */
    snprintf(path, sizeof path, "%s/o_res/checkpoints/step_00000002", g.tmp);
    assert_int_equal(dir_entries(path) > 0, 1);
    snprintf(path, sizeof path, "%s/o_res/metrics.jsonl", g.tmp);
    assert_int_equal(file_lines(path), 2); /* neither truncated nor appended to */
}

/* ---- usage and the other commands ---- */

static void test_help(void **state) {
    static const char *const cmds[] = {"train", "eval", "plan", "generate", "tokenize", "info", "convert", "bench"};
    char cmd[8192], want[256];
    static char out[OUT_SIZE]; /* static: a failing check longjmps out */
    snprintf(cmd, sizeof cmd, "'%s' --help", g.bin);
    assert_int_equal(run_checked(cmd, out, OUT_SIZE), 0);
    assert_non_null(strstr(out, "usage: megatrain"));
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        snprintf(want, sizeof want, "  %s ", cmds[i]);
        if (!strstr(out, want)) fail_msg("megatrain --help does not list '%s':\n%s", cmds[i], out);
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        snprintf(cmd, sizeof cmd, "'%s' %s --help", g.bin, cmds[i]);
        int rc = run_checked(cmd, out, OUT_SIZE);
        if (rc != 0) fail_msg("%s: exit %d:\n%s", cmd, rc, out);
        snprintf(want, sizeof want, "usage: megatrain %s", cmds[i]);
        if (strncmp(out, want, strlen(want)) != 0) fail_msg("%s does not start with '%s':\n%s", cmd, want, out);
    }
    /* train --help documents every contract flag */
    snprintf(cmd, sizeof cmd, "'%s' train --help", g.bin);
    assert_int_equal(run_checked(cmd, out, OUT_SIZE), 0);
    static const char *const flags[] = {"--model", "--init", "--data", "--out", "--steps", "--batch", "--seq",
                                        "--micro-batch", "--lr", "--min-lr", "--warmup", "--schedule", "--beta1",
                                        "--beta2", "--eps", "--weight-decay", "--clip", "--seed", "--no-shuffle",
                                        "--device", "--gpu-mem", "--save-every", "--resume", "--eval-data",
                                        "--eval-every", "--log"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strstr(out, flags[i])) fail_msg("train --help does not mention %s", flags[i]);
    /* no command at all: usage on stderr, exit 1 */
    snprintf(cmd, sizeof cmd, "'%s'", g.bin);
    assert_int_equal(run_checked(cmd, out, OUT_SIZE), 1);
    assert_non_null(strstr(out, "usage: megatrain"));
}

/* Runs `megatrain plan ARGS` (must exit 0) and returns its output. */
static const char *plan_output(const char *args) {
    char cmd[8192];
    static char out[OUT_SIZE]; /* static: a failing check longjmps out */
    snprintf(cmd, sizeof cmd, "'%s' plan %s", g.bin, args);
    int rc = run_checked(cmd, out, OUT_SIZE);
    fprintf(stderr, "%s", out);
    if (rc != 0) fail_msg("%s: exit %d:\n%s", cmd, rc, out);
    return out;
}

static void test_plan(void **state) {
    const char *out = plan_output(f("--init '%s/config.json' --batch 4 --seq 48 --device cpu", g.fixture));
    assert_non_null(strstr(out, "memory plan"));
    assert_non_null(strstr(out, "fits"));
    /* the GPU side, planned even without a GPU, for the fixture model with 16 layers and 512k
     * tokens a step: its 18 activation sets (0.56 GiB) do not fit a budget of 1890 MiB beside the
     * 1.56 GiB of library scratch, so some layers' checkpoints go to the host; 8 GiB holds
     * the internals of 14 layers; 12 GiB those of all 16, and then every layer's weights too */
    char path[4096], cfg[4096];
    snprintf(path, sizeof path, "%s/config.json", g.fixture);
    json_t *j = json_load_file(path, 0, NULL);
    assert_non_null(j);
    json_object_set_new(j, "num_hidden_layers", json_integer(16));
    snprintf(cfg, sizeof cfg, "%s/cfg16.json", g.tmp);
    assert_int_equal(json_dump_file(j, cfg, 0), 0);
    json_decref(j);
    const char *gpu = "--batch 8192 --seq 64 --micro-batch 64 --device cuda --gpu-mem";
    out = plan_output(f("--init '%s' %s 1890M", cfg, gpu));
    assert_non_null(strstr(out, "of 16 in host memory"));
    assert_null(strstr(out, "saved internals"));
    out = plan_output(f("--init '%s' %s 8G", cfg, gpu));
    assert_null(strstr(out, "in host memory"));
    assert_non_null(strstr(out, "saved internals"));
    assert_null(strstr(out, "last 16 of 16"));     /* not all layers: no resident weights either */
    assert_null(strstr(out, "resident weights"));
    out = plan_output(f("--init '%s' %s 12G", cfg, gpu));
    assert_non_null(strstr(out, "last 16 of 16"));
    assert_non_null(strstr(out, "resident weights"));
}

static void test_eval(void **state) {
    char cmd[8192];
    static char out[OUT_SIZE]; /* static: a failing check longjmps out */
    snprintf(cmd, sizeof cmd, "'%s' eval --model '%s' --data '%s/data.bin' --seq 48", g.bin, g.fixture, g.fixture);
    int rc = run_checked(cmd, out, OUT_SIZE);
    if (rc != 0) fail_msg("%s: exit %d:\n%s", cmd, rc, out);
    fprintf(stderr, "%s", out);
    const char *p = strstr(out, "loss ");
    if (!p) fail_msg("no loss printed:\n%s", out);
    double loss = strtod(p + 5, NULL);
    /* an untrained 96-token model: near ln(96) = 4.56 */
    if (!(isfinite(loss) && loss > 3.5 && loss < 6.5)) fail_msg("eval loss %g is implausible:\n%s", loss, out);
    /* eval's own bad input is a one-line error too */
    expect_error("eval: empty data", f("eval --model '%s' --data empty.bin --seq 48", g.fixture), NULL,
                      "empty.bin", NULL);
    expect_error("eval: gelu model", f("eval --model gelu --data '%s/data.bin'", g.fixture), NULL,
                      "hidden_act", NULL);
}

static void test_info_tensors(void **state) {
    char cmd[8192];
    static char out[OUT_SIZE]; /* static: a failing check longjmps out */
    snprintf(cmd, sizeof cmd, "'%s' info --model '%s' --tensors", g.bin, g.fixture);
    int rc = run_checked(cmd, out, OUT_SIZE);
    if (rc != 0) fail_msg("%s: exit %d:\n%s", cmd, rc, out);
    mt_safetensors *st = NULL;
    if (mt_safetensors_open_dir(&st, g.fixture) != MT_OK) fail_msg("%s", mt_error_message());
    int n = mt_safetensors_count(st);
    assert_true(n > 0);
    for (int i = 0; i < n; i++) {
        const char *name = mt_safetensors_at(st, i)->name;
        char want[512];
        snprintf(want, sizeof want, " %s ", name);
        if (!strstr(out, want)) fail_msg("info --tensors does not list %s:\n%s", name, out);
    }
    fprintf(stderr, "  info --tensors lists all %d tensors\n", n);
    mt_safetensors_close(st);
    expect_error_impl("info: truncated", "info --model truncated", NULL, "model.safetensors", NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_data),   cmocka_unit_test(test_bad_model), cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_bad_comm_env),
        cmocka_unit_test(test_bad_out),    cmocka_unit_test(test_bad_resume), cmocka_unit_test(test_help),
        cmocka_unit_test(test_plan),       cmocka_unit_test(test_eval),      cmocka_unit_test(test_info_tensors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
