/* `megatrain train --resume` (binary in env MT_BIN) on the CPU is bit-identical to an uninterrupted
 * run: run A trains 20 steps of the train_llama fixture; run B stops after step 10 (--stop-at 10),
 * then resumes into the same --out up to step 20. B's metrics.jsonl (appended on resume) must hold
 * the same 20 loss / lr / grad_norm strings as A's, and the final checkpoints' model and optimizer
 * tensors (and trainer_state's last loss) must be byte-identical. Both in the contract's sequential
 * order and shuffled (--seed 5). Also: --resume into an empty or new --out starts at step 0 with a
 * note, and --save-every 5 --keep 2 leaves exactly the 2 newest step_ directories. */
#include <dirent.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "util/testutil.h"

#define OUT_SIZE 65536
#define MAX_STEPS 64

static mt_cli_env g_env;

static int setup(void **state) {
    *state = &g_env; /* for mt_cli_env_teardown */
    return mt_cli_env_init(&g_env, "train_llama");
}

/* Runs `megatrain train <common flags> EXTRA --out TMP/OUT`; fails unless it exits 0 without a
 * sanitizer report. The output is left in out. */
static void train(const char *out_name, const char *extra, char *out) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "'%s' train --model '%s' --data '%s/data.bin' --steps 20 --batch 4 --micro-batch 2 --seq 48 "
             "--lr 1e-2 --warmup 3 --device cpu --out '%s/%s' %s",
             g_env.bin, g_env.fixture, g_env.fixture, g_env.tmp, out_name, extra);
    int rc = mt_test_run(cmd, out, OUT_SIZE);
    if (strstr(out, "Sanitizer") || strstr(out, "runtime error:")) fail_msg("sanitizer report: %s\n%s", cmd, out);
    if (rc != 0) fail_msg("exit %d: %s\n%s", rc, cmd, out);
}

/* The step lines of OUT/metrics.jsonl: the printed text of loss, lr and grad_norm of each step,
 * checking the steps run 1, 2, ... n. Returns n. */
typedef struct {
    char loss[64], lr[64], grad_norm[64];
} step_text;

static void field_text(const char *line, const char *key, char *dst, size_t n) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    if (!p) fail_msg("no %s in metrics line: %s", key, line);
    p += strlen(pat);
    while (*p == ' ') p++;
    size_t len = strcspn(p, ",}");
    if (len == 0 || len >= n) fail_msg("bad %s in metrics line: %s", key, line);
    memcpy(dst, p, len);
    dst[len] = '\0';
}

static int read_metrics(const char *out_name, step_text *steps) {
    char path[4096], line[4096];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", g_env.tmp, out_name);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t err;
        json_t *j = json_loads(line, 0, &err);
        if (!j) fail_msg("%s: not JSON: %s", path, line);
        if (json_object_get(j, "loss")) {
            json_int_t step = json_integer_value(json_object_get(j, "step"));
            if (step != n + 1) fail_msg("%s: line for step %lld where step %d was expected", path, (long long)step, n + 1);
            assert_true(n < MAX_STEPS);
            field_text(line, "loss", steps[n].loss, sizeof steps[n].loss);
            field_text(line, "lr", steps[n].lr, sizeof steps[n].lr);
            field_text(line, "grad_norm", steps[n].grad_norm, sizeof steps[n].grad_norm);
            n++;
        }
        json_decref(j);
    }
    fclose(f);
    return n;
}

static void compare_metrics(const char *a, const char *b, int want_steps) {
    step_text sa[MAX_STEPS], sb[MAX_STEPS];
    int na = read_metrics(a, sa), nb = read_metrics(b, sb);
    assert_int_equal(na, want_steps);
    assert_int_equal(nb, want_steps);
    int bad = 0;
    for (int i = 0; i < na; i++) {
        if (strcmp(sa[i].loss, sb[i].loss) || strcmp(sa[i].lr, sb[i].lr) || strcmp(sa[i].grad_norm, sb[i].grad_norm)) {
            fprintf(stderr, "  step %d: %s: loss %s lr %s norm %s | %s: loss %s lr %s norm %s  DIFFER\n", i + 1, a,
                    sa[i].loss, sa[i].lr, sa[i].grad_norm, b, sb[i].loss, sb[i].lr, sb[i].grad_norm);
            bad++;
        }
    }
    fprintf(stderr, "  %s vs %s: %d steps, loss/lr/grad_norm %s (last loss %s)\n", a, b, na,
            bad ? "DIFFER" : "identical", sa[na - 1].loss);
    if (bad) fail_msg("%d of %d steps differ between %s and %s", bad, na, a, b);
}

/* Every tensor of the two files: same names, dtypes, shapes and raw bytes. */
static void compare_safetensors(const char *pa, const char *pb) {
    mt_safetensors *a = NULL, *b = NULL;
    if (mt_safetensors_open_file(&a, pa) != MT_OK) fail_msg("%s", mt_error_message());
    if (mt_safetensors_open_file(&b, pb) != MT_OK) fail_msg("%s", mt_error_message());
    assert_int_equal(mt_safetensors_count(a), mt_safetensors_count(b));
    assert_true(mt_safetensors_count(a) > 0);
    size_t bytes = 0;
    for (int i = 0; i < mt_safetensors_count(a); i++) {
        const mt_st_tensor *x = mt_safetensors_at(a, i);
        const mt_st_tensor *y = mt_safetensors_find(b, x->name);
        if (!y) fail_msg("%s has %s, %s does not", pa, x->name, pb);
        assert_int_equal(x->dtype, y->dtype);
        assert_int_equal(x->ndim, y->ndim);
        for (int d = 0; d < x->ndim; d++) assert_int_equal(x->shape[d], y->shape[d]);
        assert_int_equal(x->nbytes, y->nbytes);
        if (memcmp(x->data, y->data, x->nbytes) != 0) {
            const unsigned char *p = x->data, *q = y->data;
            size_t k = 0;
            while (p[k] == q[k]) k++;
            fail_msg("%s: tensor %s differs from %s (first at byte %zu)", pa, x->name, pb, k);
        }
        bytes += x->nbytes;
    }
    fprintf(stderr, "  %s: %d tensors, %zu bytes identical\n", strrchr(pa, '/') + 1, mt_safetensors_count(a), bytes);
    mt_safetensors_close(a);
    mt_safetensors_close(b);
}

static json_t *trainer_state(const char *ckpt) {
    char path[4096];
    snprintf(path, sizeof path, "%s/trainer_state.json", ckpt);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j) fail_msg("%s: %s", path, err.text);
    return j;
}

static void compare_checkpoints(const char *a, const char *b, int step) {
    char ca[4096], cb[4096], pa[4200], pb[4200];
    snprintf(ca, sizeof ca, "%s/%s/checkpoints/step_%08d", g_env.tmp, a, step);
    snprintf(cb, sizeof cb, "%s/%s/checkpoints/step_%08d", g_env.tmp, b, step);
    static const char *const files[] = {"model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(pa, sizeof pa, "%s/%s", ca, files[i]);
        snprintf(pb, sizeof pb, "%s/%s", cb, files[i]);
        compare_safetensors(pa, pb);
    }
    json_t *sa = trainer_state(ca), *sb = trainer_state(cb);
    assert_int_equal(json_integer_value(json_object_get(sa, "step")), step);
    assert_int_equal(json_integer_value(json_object_get(sb, "step")), step);
    double la = json_real_value(json_object_get(sa, "loss")), lb = json_real_value(json_object_get(sb, "loss"));
    if (memcmp(&la, &lb, sizeof la) != 0) fail_msg("trainer_state loss %.17g vs %.17g", la, lb);
    json_decref(sa);
    json_decref(sb);
}

/* Sorted names of the step_ directories in OUT/checkpoints (and whether any other entry exists). */
static int list_checkpoints(const char *out_name, char names[][64], int max, int *others) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/checkpoints", g_env.tmp, out_name);
    DIR *d = opendir(path);
    if (!d) fail_msg("cannot open %s", path);
    int n = 0;
    *others = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (strncmp(e->d_name, "step_", 5) != 0 || n >= max) {
            fprintf(stderr, "  unexpected entry %s/%s\n", path, e->d_name);
            (*others)++;
            continue;
        }
        snprintf(names[n++], 64, "%.63s", e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, 64, (int (*)(const void *, const void *))strcmp);
    return n;
}

/* A 20-step run and a 10 + 10 resumed one with the same extra flags. */
static void resume_case(const char *a, const char *b, const char *flags) {
    static char out[OUT_SIZE]; /* static: a failing check longjmps out */
    char extra[1024];
    train(a, flags, out);
    snprintf(extra, sizeof extra, "%s --stop-at 10", flags);
    train(b, extra, out);
    step_text s[MAX_STEPS];
    assert_int_equal(read_metrics(b, s), 10);
    char names[8][64];
    int others;
    assert_int_equal(list_checkpoints(b, names, 8, &others), 1);
    assert_string_equal(names[0], "step_00000010");
    assert_int_equal(others, 0);

    snprintf(extra, sizeof extra, "%s --resume", flags);
    train(b, extra, out);
    if (!strstr(out, "resuming from") || !strstr(out, "step_00000010"))
        fail_msg("the resumed run does not say it resumes from step_00000010:\n%s", out);
    if (strstr(out, "step 1/20 ") || !strstr(out, "step 11/20 "))
        fail_msg("the resumed run does not start at step 11:\n%s", out);
    compare_metrics(a, b, 20);
    compare_checkpoints(a, b, 20);
}

static void test_resume_sequential(void **state) { resume_case("seq_A", "seq_B", "--no-shuffle"); }

static void test_resume_shuffled(void **state) {
    resume_case("shuf_A", "shuf_B", "--seed 5");
    /* the shuffled order really is another order: its losses differ from the sequential run's */
    static char out[OUT_SIZE]; /* static: a failing check longjmps out */
    train("shuf_seq", "--no-shuffle --stop-at 5", out);
    step_text x[MAX_STEPS], y[MAX_STEPS];
    read_metrics("shuf_A", x);
    assert_int_equal(read_metrics("shuf_seq", y), 5);
    int same = 0;
    for (int i = 0; i < 5; i++) same += !strcmp(x[i].loss, y[i].loss);
    if (same == 5) fail_msg("--seed 5 without --no-shuffle gives the sequential order's losses");
}

/* Every optimizer state format resumes bit for bit: a 20-step run and a 10 + 10 one save the same
 * metrics and the same checkpoint files (compact's weights with their compensation, the 8-bit
 * moments and their scales, tight's rounding seed). */
static void test_resume_state_formats(void **state) {
    resume_case("compact_A", "compact_B", "--no-shuffle --state compact");
    resume_case("tight_A", "tight_B", "--no-shuffle --state tight");
    /* the formats are not the same run: compact's losses differ from full's and tight's */
    step_text c[MAX_STEPS], t[MAX_STEPS], f[MAX_STEPS];
    read_metrics("compact_A", c);
    read_metrics("tight_A", t);
    static char out[OUT_SIZE]; /* static: a failing check longjmps out */
    train("full_ref", "--no-shuffle", out);
    read_metrics("full_ref", f);
    assert_true(strcmp(c[19].loss, f[19].loss) != 0 && strcmp(c[19].loss, t[19].loss) != 0);
}

/* The checkpoint does not depend on where the state lived: a tight run with 2 layers in the GPU
 * tier (on the cpu backend the tier's update is the host kernel) resumed with none gives the
 * bits of an uninterrupted run without a tier. */
static void test_resume_other_tier(void **state) {
    static char out[OUT_SIZE]; /* static: a failing check longjmps out */
    train("tier_A", "--no-shuffle --state tight --gpu-layers 0", out);
    train("tier_B", "--no-shuffle --state tight --gpu-layers 2 --stop-at 10", out);
    if (!strstr(out, "GPU tier: layers 0-1")) fail_msg("no GPU tier in the first half:\n%s", out);
    train("tier_B", "--no-shuffle --gpu-layers 0 --resume", out);
    compare_metrics("tier_A", "tier_B", 20);
    compare_checkpoints("tier_A", "tier_B", 20);
}

/* --resume without --state continues in the checkpoint's format and says so; another --state is
 * refused by name, exit 1, nothing written. */
static void test_resume_state_mismatch(void **state) {
    static char out[OUT_SIZE]; /* static: a failing check longjmps out */
    train("mis", "--no-shuffle --state tight --stop-at 10", out);
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "'%s' train --model '%s' --data '%s/data.bin' --steps 20 --batch 4 --micro-batch 2 --seq 48 "
             "--lr 1e-2 --warmup 3 --device cpu --out '%s/mis' --no-shuffle --resume --state compact",
             g_env.bin, g_env.fixture, g_env.fixture, g_env.tmp);
    assert_int_equal(mt_test_run(cmd, out, OUT_SIZE), 1);
    if (!strstr(out, "holds tight optimizer state, this run uses --state compact: resume with --state tight"))
        fail_msg("no refusal naming both formats:\n%s", out);
    char names[8][64];
    int others;
    assert_int_equal(list_checkpoints("mis", names, 8, &others), 1);
    train("mis", "--no-shuffle --resume", out);
    if (!strstr(out, "--resume: --state tight, as the checkpoint's run"))
        fail_msg("the resumed run does not take the checkpoint's format:\n%s", out);
    if (!strstr(out, "step 11/20 ")) fail_msg("the resumed run does not go on at step 11:\n%s", out);
}

/* --resume with nothing to resume: a note, then the same run as without --resume. */
static void test_resume_empty_out(void **state) {
    static char out[OUT_SIZE]; /* static: a failing check longjmps out */
    char path[4096];
    train("fresh", "--no-shuffle --stop-at 6", out);
    snprintf(path, sizeof path, "%s/empty_out", g_env.tmp);
    assert_int_equal(mkdir(path, 0755), 0);
    static const char *const dirs[] = {"empty_out", "new_out/sub"};
    for (int i = 0; i < 2; i++) {
        train(dirs[i], "--no-shuffle --stop-at 6 --resume", out);
        if (!strstr(out, "no checkpoint")) fail_msg("--resume into %s: no note about starting at step 0:\n%s", dirs[i], out);
        if (!strstr(out, "step 1/20 ")) fail_msg("--resume into %s did not start at step 1:\n%s", dirs[i], out);
        compare_metrics("fresh", dirs[i], 6);
        compare_checkpoints("fresh", dirs[i], 6);
    }
}

/* --save-every 5 --keep 2 over 20 steps: saves 5, 10, 15, 20; keeps 15 and 20. Resuming then
 * takes the newest. */
static void test_save_every_keep(void **state) {
    static char out[OUT_SIZE]; /* static: a failing check longjmps out */
    train("keep", "--no-shuffle --save-every 5 --keep 2", out);
    char names[16][64];
    int others;
    int n = list_checkpoints("keep", names, 16, &others);
    fprintf(stderr, "  checkpoints left: %d (%s, %s)\n", n, n > 0 ? names[0] : "-", n > 1 ? names[1] : "-");
    assert_int_equal(others, 0);
    assert_int_equal(n, 2);
    assert_string_equal(names[0], "step_00000015");
    assert_string_equal(names[1], "step_00000020");
    for (int i = 0; i < 2; i++) {
        char ckpt[4096];
        snprintf(ckpt, sizeof ckpt, "%s/keep/checkpoints/%s", g_env.tmp, names[i]);
        json_t *st = trainer_state(ckpt);
        assert_int_equal(json_integer_value(json_object_get(st, "step")), i == 0 ? 15 : 20);
        json_decref(st);
    }
    /* the intermediate saves do not disturb the run: same as one without them */
    train("nokeep", "--no-shuffle", out);
    compare_metrics("nokeep", "keep", 20);
    compare_checkpoints("nokeep", "keep", 20);
    /* and a resume with more steps continues from step_00000020 */
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "'%s' train --model '%s' --data '%s/data.bin' --steps 22 --batch 4 --micro-batch 2 --seq 48 "
             "--lr 1e-2 --warmup 3 --device cpu --no-shuffle --save-every 5 --keep 2 --resume --resume-changed --out '%s/keep'",
             g_env.bin, g_env.fixture, g_env.fixture, g_env.tmp);
    int rc = mt_test_run(cmd, out, OUT_SIZE);
    if (rc != 0 || strstr(out, "Sanitizer")) fail_msg("exit %d: %s\n%s", rc, cmd, out);
    if (!strstr(out, "step_00000020") || !strstr(out, "step 21/22 ")) fail_msg("did not resume from step 20:\n%s", out);
    n = list_checkpoints("keep", names, 16, &others);
    assert_int_equal(n, 2);
    assert_string_equal(names[0], "step_00000020");
    assert_string_equal(names[1], "step_00000022");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_sequential),
        cmocka_unit_test(test_resume_shuffled),
        cmocka_unit_test(test_resume_empty_out),
        cmocka_unit_test(test_resume_state_formats),
        cmocka_unit_test(test_resume_state_mismatch),
        cmocka_unit_test(test_resume_other_tier),
        cmocka_unit_test(test_save_every_keep),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
