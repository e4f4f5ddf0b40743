/* LoRA checkpoints (io/lora_checkpoint.h) on the lora_llama fixture's base (rank-4 adapters on its
 * seven projections): save -> resume is bit for bit (weights, both moments, the counters, the
 * args), padding comes back zero; the directory is a PEFT adapter (mt_lora_load_dir reads the same
 * weights) with trainer_state.json's "lora"; --keep prunes as for full checkpoints (the newest
 * healthy one kept while steps are skipped); a damaged newer checkpoint (a flipped byte, a NaN, a
 * finite absurd moment, a missing checksum) is named in a warning and passed over; NaN/inf is
 * refused at save naming the tensor; a checkpoint of another adapter (r, lora_alpha,
 * target_modules) or of the other kind (full vs LoRA) is refused by name with no fallback, the
 * arenas (or the full state) untouched. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/lora_checkpoint.h"
#include "io/lora_io.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/params.h"
#include "util/ckpt_edit.h"
#include "util/state_io.h"
#include "util/testutil.h"

#define SENTINEL 0x7f /* every byte of an untouched arena */
#define ARGS "{\"lr\": 0.01, \"lora\": 4}"
#define SEED_BIG 18446744073709551557ull /* > INT64_MAX: trainer_state.json keeps it as a string */

static mt_param_table g_t; /* lora_llama/base: C 32, 2 layers, H 4, G 2, D 8, F 64, V 96 */
static char *g_tmp;

static int setup(void **state) {
    char *path = mt_fixture_path("lora_llama/base/config.json");
    mt_config c;
    if (mt_config_load(&c, path) != MT_OK) fail_msg("%s", mt_error_message());
    free(path);
    mt_param_table_init(&g_t, &c);
    g_tmp = mt_test_tmpdir();
    return 0;
}

static int teardown(void **state) {
    mt_param_table_free(&g_t);
    mt_test_rmtree(g_tmp);
    free(g_tmp);
    return 0;
}

static char *subdir(const char *name) {
    char *d = malloc(4096);
    snprintf(d, 4096, "%s/%s", g_tmp, name);
    return d;
}

static void step_dir(char *buf, size_t size, const char *out, int64_t step) {
    snprintf(buf, size, "%s/checkpoints/step_%08lld", out, (long long)step);
}

static int exists(const char *dir, const char *name) {
    char p[8400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void assert_has(const char *text, const char *needle) {
    if (!strstr(text, needle)) fail_msg("'%s' does not mention '%s'", text, needle);
}

/* The last error mentions needle; each message is shown once in the log. */
static void assert_msg_has(const char *needle) {
    static char shown[4096];
    if (strcmp(shown, mt_error_message()) != 0) {
        printf("  error (expected): %s\n", mt_error_message());
        snprintf(shown, sizeof shown, "%s", mt_error_message());
    }
    assert_has(mt_error_message(), needle);
}

static void assert_ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    if (a < b || strcmp(s + a - b, suffix) != 0) fail_msg("'%s' does not end with '%s'", s, suffix);
}

/* stderr into a file between capture_begin and capture_end (which returns it, malloc'd). */
static int saved_stderr = -1;

static void capture_begin(void) {
    char p[4200];
    snprintf(p, sizeof p, "%s/stderr.txt", g_tmp);
    fflush(stderr);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    saved_stderr = dup(2);
    dup2(fileno(f), 2);
    fclose(f);
}

static char *capture_end(void) {
    char p[4200];
    snprintf(p, sizeof p, "%s/stderr.txt", g_tmp);
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    char *text = calloc(1, 1 << 16);
    size_t n = fread(text, 1, (1 << 16) - 1, f);
    text[n] = '\0';
    fclose(f);
    unlink(p);
    fputs(text, stdout);
    return text;
}

/* ---- an adapter and its training state ---- */

typedef struct {
    mt_lora_table lt;
    float *a[3]; /* saved: w, exp_avg, exp_avg_sq */
    float *b[3]; /* the resume's destination */
} adapter;

static void adapter_table(mt_lora_table *lt, int rank, double alpha, const char *targets) {
    mt_lora_opts o = {rank, alpha, targets};
    if (mt_lora_table_init(lt, &g_t, &o) != MT_OK) fail_msg("%s", mt_error_message());
}

static void poison(adapter *x) {
    for (int k = 0; k < 3; k++) memset(x->b[k], SENTINEL, sizeof(float) * (size_t)x->lt.total);
}

static int untouched(const adapter *x) {
    for (int k = 0; k < 3; k++) {
        const unsigned char *p = (const unsigned char *)x->b[k];
        for (size_t i = 0; i < sizeof(float) * (size_t)x->lt.total; i++)
            if (p[i] != SENTINEL) return 0;
    }
    return 1;
}

/* Weights normal(0, 0.1), exp_avg normal(0, 0.05), exp_avg_sq squares of normal(0, 1e-3);
 * padding NaN (never read nor written). Deterministic in seed. */
static void adapter_fill(adapter *x, uint64_t seed) {
    mt_test_rng r;
    mt_test_rng_seed(&r, seed);
    for (int k = 0; k < 3; k++)
        for (int64_t i = 0; i < x->lt.total; i++) x->a[k][i] = NAN;
    for (int i = 0; i < x->lt.n_params; i++) {
        const mt_lora_param *p = &x->lt.params[i];
        mt_test_fill_normal(&r, x->a[0] + p->offset, (size_t)p->numel, 0.1f);
        mt_test_fill_normal(&r, x->a[1] + p->offset, (size_t)p->numel, 0.05f);
        mt_test_fill_normal(&r, x->a[2] + p->offset, (size_t)p->numel, 1e-3f);
        for (int64_t j = 0; j < p->numel; j++) x->a[2][p->offset + j] *= x->a[2][p->offset + j];
    }
}

static void adapter_init(adapter *x, int rank, double alpha, const char *targets, uint64_t seed) {
    adapter_table(&x->lt, rank, alpha, targets);
    for (int k = 0; k < 3; k++) {
        x->a[k] = malloc(sizeof(float) * (size_t)x->lt.total);
        x->b[k] = malloc(sizeof(float) * (size_t)x->lt.total);
    }
    adapter_fill(x, seed);
    poison(x);
}

static void adapter_free(adapter *x) {
    for (int k = 0; k < 3; k++) {
        free(x->a[k]);
        free(x->b[k]);
    }
    mt_lora_table_free(&x->lt);
}

static mt_ckpt_state state_of(int64_t step, int64_t skipped, int64_t in_a_row) {
    return (mt_ckpt_state){.step = step, .seed = SEED_BIG, .loss = 2.5 + step,
                           .updates = step - skipped, .skipped = skipped, .in_a_row = in_a_row};
}

static void save_ok(const adapter *x, const char *out, const mt_ckpt_state *st, int keep) {
    if (mt_lora_checkpoint_save(out, &x->lt, x->a[0], x->a[1], x->a[2], st, ARGS, "lora_llama/base",
                                keep) != MT_OK)
        fail_msg("%s", mt_error_message());
}

static int resume(adapter *x, const mt_lora_table *lt, const char *out, mt_ckpt_state *st,
                  char *path, size_t size) {
    return mt_lora_checkpoint_resume(out, &g_t, lt, x->b[0], x->b[1], x->b[2], st, path, size);
}

/* b holds a's values bit for bit at every tensor, zero in the padding. */
static void assert_resumed(const adapter *x) {
    for (int k = 0; k < 3; k++) {
        int64_t at = 0;
        for (int i = 0; i < x->lt.n_params; i++) {
            const mt_lora_param *p = &x->lt.params[i];
            for (; at < p->offset; at++)
                if (x->b[k][at] != 0 || signbit(x->b[k][at]))
                    fail_msg("arena %d: padding element %lld is %g, not 0", k, (long long)at, x->b[k][at]);
            if (memcmp(x->b[k] + p->offset, x->a[k] + p->offset, sizeof(float) * (size_t)p->numel))
                fail_msg("arena %d: tensor %s differs", k, p->name);
            at = p->offset + p->numel;
        }
        for (; at < x->lt.total; at++)
            if (x->b[k][at] != 0) fail_msg("arena %d: padding element %lld is not 0", k, (long long)at);
    }
}

/* ---- tests ---- */

static void test_roundtrip(void **state) {
    adapter x;
    adapter_init(&x, 4, 8, NULL, 1);
    char *out = subdir("roundtrip");
    char dir[4200], path[4200];
    mt_ckpt_state st = state_of(7, 2, 1), back;
    save_ok(&x, out, &st, 0);
    step_dir(dir, sizeof dir, out, 7);
    const char *files[] = {"adapter_config.json", "adapter_model.safetensors",
                           "adapter_optimizer.safetensors", "trainer_state.json"};
    for (int i = 0; i < 4; i++) assert_true(exists(dir, files[i]));
    assert_int_equal(mt_test_count_prefix(dir, ""), 2 + 4); /* ".", "..": nothing else */
    assert_int_equal(mt_test_count_prefix(out, "checkpoints"), 1);
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/checkpoints", out);
    assert_int_equal(mt_test_count_prefix(ck, ".tmp-"), 0);

    /* trainer_state.json: a full checkpoint's fields, "state" full, "lora", three checksums */
    json_t *o = mt_test_ckpt_load_state(dir);
    assert_int_equal(json_integer_value(json_object_get(o, "format")), 3);
    assert_string_equal(json_string_value(json_object_get(o, "state")), "full");
    assert_int_equal(json_integer_value(json_object_get(o, "step")), 7);
    assert_string_equal(json_string_value(json_object_get(o, "seed")), "18446744073709551557");
    json_t *lo = json_object_get(o, "lora");
    assert_int_equal(json_integer_value(json_object_get(lo, "r")), 4);
    assert_int_equal(json_integer_value(json_object_get(lo, "lora_alpha")), 8);
    assert_string_equal(json_string_value(json_object_get(lo, "target_modules")), x.lt.targets);
    json_t *fo = json_object_get(o, "files");
    assert_int_equal(json_object_size(fo), 3);
    for (int i = 0; i < 3; i++) assert_non_null(json_object_get(fo, files[i]));
    json_decref(o);

    /* read_state: the counters, and lora = 1 */
    mt_ckpt_state rs;
    if (mt_checkpoint_read_state(dir, &rs) != MT_OK) fail_msg("%s", mt_error_message());
    assert_int_equal(rs.lora, 1);
    assert_int_equal(rs.step, 7);
    assert_true(rs.seed == SEED_BIG);
    assert_int_equal(rs.updates, 5);
    assert_int_equal(rs.skipped, 2);
    assert_int_equal(rs.in_a_row, 1);
    assert_int_equal(rs.state, MT_STATE_FULL);
    mt_ckpt_state_free(&rs);

    /* resume: bit for bit */
    capture_begin();
    int rc = resume(&x, &x.lt, out, &back, path, sizeof path);
    char *err = capture_end();
    if (rc != MT_OK) fail_msg("%s", mt_error_message());
    assert_string_equal(err, "");
    free(err);
    assert_ends_with(path, "/checkpoints/step_00000007");
    assert_resumed(&x);
    assert_int_equal(back.step, 7);
    assert_true(back.seed == SEED_BIG);
    assert_true(back.loss == st.loss);
    assert_int_equal(back.updates, 5);
    assert_int_equal(back.skipped, 2);
    assert_int_equal(back.in_a_row, 1);
    assert_int_equal(back.lora, 1);
    assert_int_equal(back.state, MT_STATE_FULL);
    assert_string_equal(back.args_json, "{\"lora\":4,\"lr\":0.01}");
    mt_ckpt_state_free(&back);

    /* a PEFT adapter directory: mt_lora_load_dir (what --adapter reads) gives the same weights */
    mt_lora_table lt2;
    float *w2;
    if (mt_lora_load_dir(dir, &g_t, &lt2, &w2) != MT_OK) fail_msg("%s", mt_error_message());
    assert_int_equal(lt2.rank, 4);
    assert_true(lt2.alpha == 8);
    assert_int_equal(lt2.n_params, x.lt.n_params);
    assert_int_equal(lt2.total, x.lt.total);
    for (int i = 0; i < x.lt.n_params; i++) {
        const mt_lora_param *p = &x.lt.params[i];
        assert_int_equal(lt2.params[i].offset, p->offset);
        assert_memory_equal(w2 + p->offset, x.a[0] + p->offset, sizeof(float) * (size_t)p->numel);
    }
    free(w2);
    mt_lora_table_free(&lt2);

    /* a non-integral alpha round-trips exactly too; the same set of targets in another order is
     * the same adapter */
    adapter y;
    adapter_init(&y, 4, 0.1 + 0.2, NULL, 2);
    char *out2 = subdir("roundtrip_alpha");
    save_ok(&y, out2, &st, 0);
    mt_lora_table rev;
    adapter_table(&rev, 4, 0.1 + 0.2, "down_proj,up_proj,gate_proj,o_proj,v_proj,k_proj,q_proj");
    if (resume(&y, &rev, out2, &back, path, sizeof path) != MT_OK) fail_msg("%s", mt_error_message());
    assert_resumed(&y);
    mt_ckpt_state_free(&back);
    mt_lora_table_free(&rev);
    adapter_free(&y);
    free(out2);

    free(out);
    adapter_free(&x);
}

static void test_keep(void **state) {
    adapter x;
    adapter_init(&x, 4, 8, NULL, 3);
    char *out = subdir("keep");
    char ck[4200], dir[4200];
    snprintf(ck, sizeof ck, "%s/checkpoints", out);
    for (int s = 1; s <= 5; s++) {
        mt_ckpt_state st = state_of(s, 0, 0);
        save_ok(&x, out, &st, 2);
    }
    assert_int_equal(mt_test_count_prefix(ck, "step_"), 2);
    step_dir(dir, sizeof dir, out, 4);
    assert_true(exists(dir, "trainer_state.json"));
    step_dir(dir, sizeof dir, out, 5);
    assert_true(exists(dir, "trainer_state.json"));
    assert_int_equal(mt_test_count_prefix(ck, ".tmp-"), 0);

    /* steps 6, 7 skipped in a row (keep 1): step 5, the last healthy one, stays until a healthy
     * save */
    mt_ckpt_state st = state_of(6, 1, 1);
    save_ok(&x, out, &st, 1);
    st = state_of(7, 2, 2);
    save_ok(&x, out, &st, 1);
    assert_int_equal(mt_test_count_prefix(ck, "step_"), 2);
    step_dir(dir, sizeof dir, out, 5);
    assert_true(exists(dir, "trainer_state.json"));
    st = state_of(8, 2, 0);
    save_ok(&x, out, &st, 1);
    assert_int_equal(mt_test_count_prefix(ck, "step_"), 1);
    step_dir(dir, sizeof dir, out, 8);
    assert_true(exists(dir, "trainer_state.json"));

    /* the same step again replaces it */
    adapter_fill(&x, 33);
    save_ok(&x, out, &st, 1);
    char path[4200];
    mt_ckpt_state back;
    if (resume(&x, &x.lt, out, &back, path, sizeof path) != MT_OK) fail_msg("%s", mt_error_message());
    assert_resumed(&x);
    mt_ckpt_state_free(&back);
    free(out);
    adapter_free(&x);
}

static void test_fallback(void **state) {
    adapter x;
    adapter_init(&x, 4, 8, NULL, 10);
    char *out = subdir("fallback");
    char ck[4200], dir[4200], path[4200], want[8400];
    snprintf(ck, sizeof ck, "%s/checkpoints", out);
    mt_ckpt_state back;
    assert_int_equal(resume(&x, &x.lt, out, &back, path, sizeof path), MT_CKPT_NONE);
    assert_msg_has("no checkpoint to resume from");
    assert_true(untouched(&x));

    for (int s = 10; s <= 40; s += 10) {
        adapter_fill(&x, (uint64_t)s);
        mt_ckpt_state st = state_of(s, 0, 0);
        save_ok(&x, out, &st, 0);
    }
    adapter_fill(&x, 10); /* what step 10 holds */

    /* 40: a flipped byte in the weights; 30: a NaN in a moment, 20: a negative exp_avg_sq (both
     * re-stamped: finite and checksummed, refused by the bounds) */
    step_dir(dir, sizeof dir, out, 40);
    char p[8400];
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    fseek(f, -5, SEEK_END);
    int c = fgetc(f);
    fseek(f, -5, SEEK_END);
    fputc(c ^ 0x20, f);
    fclose(f);
    step_dir(dir, sizeof dir, out, 30);
    mt_test_ckpt_fill_f32(dir, "adapter_optimizer.safetensors", "exp_avg.base_model.model.model.layers.1.mlp.up_proj.lora_B",
                          3, 1, NAN);
    step_dir(dir, sizeof dir, out, 20);
    mt_test_ckpt_fill_f32(dir, "adapter_optimizer.safetensors", "exp_avg_sq.base_model.model.model.layers.0.self_attn.q_proj.lora_A",
                          0, 1, -1.0f);
    capture_begin();
    int rc = resume(&x, &x.lt, out, &back, path, sizeof path);
    char *err = capture_end();
    if (rc != MT_OK) fail_msg("%s", mt_error_message());
    assert_int_equal(back.step, 10);
    assert_ends_with(path, "/checkpoints/step_00000010");
    assert_resumed(&x);
    snprintf(want, sizeof want, "megatrain: warning: %s/step_00000040 is damaged "
             "(adapter_model.safetensors: checksum mismatch", ck);
    assert_has(err, want);
    snprintf(want, sizeof want, "megatrain: warning: %s/step_00000030 is damaged", ck);
    assert_has(err, want);
    assert_has(err, "exp_avg.base_model.model.model.layers.1.mlp.up_proj.lora_B.weight holds NaN or inf");
    snprintf(want, sizeof want, "megatrain: warning: %s/step_00000020 is damaged", ck);
    assert_has(err, want);
    assert_has(err, "0 <= exp_avg_sq <= 1e16");
    assert_has(err, "); resuming from step_00000010 instead\n");
    free(err);
    mt_ckpt_state_free(&back);

    /* 10 loses the checksum of its moments: damaged too; none is left, nothing written */
    step_dir(dir, sizeof dir, out, 10);
    json_t *o = mt_test_ckpt_load_state(dir);
    json_object_del(json_object_get(o, "files"), "adapter_optimizer.safetensors");
    mt_test_ckpt_store_state(dir, o);
    mt_ckpt_state rs;
    assert_int_equal(mt_checkpoint_read_state(dir, &rs), MT_ERR);
    assert_msg_has("\"files\" has no checksum of adapter_optimizer.safetensors");
    poison(&x);
    assert_int_equal(resume(&x, &x.lt, out, &back, path, sizeof path), MT_ERR);
    assert_msg_has("step_00000040 is damaged (adapter_model.safetensors: checksum mismatch");
    assert_msg_has("none of the 3 older checkpoints is intact");
    assert_true(untouched(&x));
    free(out);
    adapter_free(&x);
}

static void test_save_nonfinite(void **state) {
    adapter x;
    adapter_init(&x, 4, 8, NULL, 4);
    char *out = subdir("nonfinite");
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/checkpoints", out);
    mt_ckpt_state st = state_of(1, 0, 0);
    struct {
        int arena, param;
        float value;
        const char *what;
    } cases[] = {{0, 0, NAN, "the adapter weights hold"},
                 {1, 5, INFINITY, "exp_avg (Adam's first moment) holds"},
                 {2, 13, -INFINITY, "exp_avg_sq (Adam's second moment) holds"}};
    for (int k = 0; k < 3; k++) {
        const mt_lora_param *p = &x.lt.params[cases[k].param];
        float *at = x.a[cases[k].arena] + p->offset + p->numel - 1;
        float keep = *at;
        *at = cases[k].value;
        assert_int_equal(mt_lora_checkpoint_save(out, &x.lt, x.a[0], x.a[1], x.a[2], &st, NULL,
                                                 NULL, 0), MT_ERR);
        assert_msg_has(cases[k].what);
        assert_msg_has(p->name);
        assert_msg_has("NaN or inf");
        *at = keep;
        assert_int_equal(mt_test_count_prefix(ck, "step_"), 0);
        assert_int_equal(mt_test_count_prefix(ck, ".tmp-"), 0);
    }
    /* bad args: refused, nothing left */
    assert_int_equal(mt_lora_checkpoint_save(out, &x.lt, x.a[0], x.a[1], x.a[2], &st, "{bad", NULL, 0),
                     MT_ERR);
    assert_msg_has("not valid JSON");
    assert_int_equal(mt_test_count_prefix(ck, "step_"), 0);
    assert_int_equal(mt_test_count_prefix(ck, ".tmp-"), 0);
    free(out);
    adapter_free(&x);
}

/* Another adapter than the run's: refused naming the directory and what differs, with no
 * fallback to an older checkpoint that matches, the arenas untouched. */
static void test_adapter_mismatch(void **state) {
    adapter x;
    adapter_init(&x, 4, 8, NULL, 5);
    char *out = subdir("mismatch");
    char path[4200];
    mt_ckpt_state st = state_of(2, 0, 0), back;
    save_ok(&x, out, &st, 0);
    adapter older;
    adapter_init(&older, 8, 8, NULL, 6); /* step 1: the rank-8 run's */
    st = state_of(1, 0, 0);
    save_ok(&older, out, &st, 0);
    struct {
        int rank;
        double alpha;
        const char *targets, *needle;
    } cases[] = {{8, 8, NULL, "r is 4, this run's 8"},
                 {4, 16, NULL, "lora_alpha is 8, this run's 16"},
                 {4, 8, "q_proj,v_proj", "target_modules are q_proj,k_proj,v_proj,o_proj,gate_proj,"
                                         "up_proj,down_proj, this run's q_proj,v_proj"}};
    for (int k = 0; k < 3; k++) {
        mt_lora_table lt;
        adapter_table(&lt, cases[k].rank, cases[k].alpha, cases[k].targets);
        poison(&older);
        assert_int_equal(resume(&older, &lt, out, &back, path, sizeof path), MT_ERR);
        assert_msg_has("/checkpoints/step_00000002: a LoRA checkpoint of another adapter (");
        assert_msg_has(cases[k].needle);
        assert_msg_has("resume with the same --lora");
        assert_true(untouched(&older));
        mt_lora_table_free(&lt);
    }
    free(out);
    adapter_free(&older);
    adapter_free(&x);
}

/* A full-parameter checkpoint and a LoRA one: neither resume takes the other's (no fallback past
 * it), mt_checkpoint_load refuses a LoRA one, the state untouched. */
static void test_kinds(void **state) {
    adapter x;
    adapter_init(&x, 4, 8, NULL, 7);
    mt_test_state *full = mt_test_state_create(MT_STATE_FULL, &g_t, 0);
    mt_test_state_fill_random(full, &g_t, 7);
    mt_test_state *into = mt_test_state_create(MT_STATE_FULL, &g_t, 0);
    char *out = subdir("kinds");
    char dir[4200], path[4200];
    mt_ckpt_state st = state_of(1, 0, 0), back;
    if (mt_checkpoint_save(out, &g_t, &full->io, &st, ARGS, NULL, 0) != MT_OK)
        fail_msg("%s", mt_error_message());
    mt_ckpt_state rs;
    step_dir(dir, sizeof dir, out, 1);
    if (mt_checkpoint_read_state(dir, &rs) != MT_OK) fail_msg("%s", mt_error_message());
    assert_int_equal(rs.lora, 0);
    mt_ckpt_state_free(&rs);

    /* the newest is full: the LoRA resume refuses it */
    assert_int_equal(resume(&x, &x.lt, out, &back, path, sizeof path), MT_ERR);
    assert_msg_has("/checkpoints/step_00000001: a full-parameter checkpoint, not a LoRA run's");
    assert_true(untouched(&x));

    /* the newest is LoRA (an older full one beside it): the full resume refuses it by name */
    st = state_of(2, 0, 0);
    save_ok(&x, out, &st, 0);
    mt_test_state_poison(into, SENTINEL);
    into->n_sets = 0;
    capture_begin();
    int rc = mt_checkpoint_resume(out, &g_t, &into->io, &back, path, sizeof path);
    char *err = capture_end();
    assert_int_equal(rc, MT_ERR);
    assert_string_equal(err, ""); /* not damage: no warning, no fallback */
    free(err);
    step_dir(dir, sizeof dir, out, 2);
    char want[8400];
    snprintf(want, sizeof want, "%s: a LoRA checkpoint (an adapter of rank 4): resume it with the same "
             "--lora flags", dir);
    assert_string_equal(mt_error_message(), want);
    assert_true(mt_test_state_poisoned(into, SENTINEL) && into->n_sets == 0);
    assert_int_equal(mt_checkpoint_load(dir, &g_t, &into->io, &back), MT_ERR);
    assert_string_equal(mt_error_message(), want);
    assert_true(into->n_sets == 0);

    /* and the LoRA resume takes it */
    if (resume(&x, &x.lt, out, &back, path, sizeof path) != MT_OK) fail_msg("%s", mt_error_message());
    assert_resumed(&x);
    assert_int_equal(back.step, 2);
    mt_ckpt_state_free(&back);

    /* the newest full again (step 3): the LoRA resume does not fall back to step 2 */
    st = state_of(3, 0, 0);
    if (mt_checkpoint_save(out, &g_t, &full->io, &st, ARGS, NULL, 0) != MT_OK)
        fail_msg("%s", mt_error_message());
    poison(&x);
    assert_int_equal(resume(&x, &x.lt, out, &back, path, sizeof path), MT_ERR);
    assert_msg_has("step_00000003: a full-parameter checkpoint");
    assert_true(untouched(&x));
    /* and the full resume takes step 3 */
    if (mt_checkpoint_resume(out, &g_t, &into->io, &back, path, sizeof path) != MT_OK)
        fail_msg("%s", mt_error_message());
    assert_int_equal(back.step, 3);
    assert_int_equal(back.lora, 0);
    assert_true(mt_test_state_equal(into, full, &g_t));
    mt_ckpt_state_free(&back);

    free(out);
    mt_test_state_free(into);
    mt_test_state_free(full);
    adapter_free(&x);
}

/* A hand-edited "lora" that is not the adapter's shape is damage, named. */
static void test_bad_lora_field(void **state) {
    adapter x;
    adapter_init(&x, 4, 8, NULL, 8);
    char *out = subdir("bad_lora");
    char dir[4200];
    mt_ckpt_state st = state_of(1, 0, 0), rs;
    save_ok(&x, out, &st, 0);
    step_dir(dir, sizeof dir, out, 1);
    json_t *o = mt_test_ckpt_load_state(dir);
    json_object_set_new(json_object_get(o, "lora"), "r", json_string("4"));
    mt_test_ckpt_store_state(dir, o);
    assert_int_equal(mt_checkpoint_read_state(dir, &rs), MT_ERR);
    assert_msg_has("trainer_state.json: \"lora\" must be {\"r\": 1 to 65536");
    o = mt_test_ckpt_load_state(dir);
    json_object_set_new(json_object_get(o, "lora"), "r", json_integer(4));
    json_object_set_new(o, "state", json_string("compact"));
    mt_test_ckpt_store_state(dir, o);
    assert_int_equal(mt_checkpoint_read_state(dir, &rs), MT_ERR);
    assert_msg_has("a LoRA checkpoint (\"lora\") must be format 3 with \"state\": \"full\"");
    free(out);
    adapter_free(&x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_keep),
        cmocka_unit_test(test_fallback),
        cmocka_unit_test(test_save_nonfinite),
        cmocka_unit_test(test_adapter_mismatch),
        cmocka_unit_test(test_kinds),
        cmocka_unit_test(test_bad_lora_field),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
