/* checkpoint: save -> latest -> load bitwise round trips, keep_last pruning, stale temporaries,
 * load errors that leave the state untouched (io never called), checksums (a flipped byte in any
 * file is refused), resume falling back past damaged checkpoints, exported (bf16) weights, NaN/inf
 * refused at save and at load, format-1 checkpoints, a frozen state (a LoRA base) refused at save,
 * and crash safety: a child saving a few-M-parameter model in a loop is SIGKILLed at random
 * moments; every step_ directory left behind must load completely and hold the data of the step
 * its trainer_state.json names.
 * The child is this executable re-executed with --crash-child (no fork-after-OpenMP hazards). */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/digest.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "model/params.h"
#include "util/state_io.h"
#include "util/ckpt_edit.h"
#include "util/testutil.h"
#include "util/tiny_config.h"

#define SENTINEL 0x7f /* every byte of an untouched state */
#define CRASH_KILLS 8
#define CRASH_SEED 1234u

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int exists(const char *dir, const char *name) {
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void write_text(const char *dir, const char *name, const char *text) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *read_text(const char *dir, const char *name) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 16);
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* ---- a model and its state ---- */

typedef struct {
    mt_param_table t;
    mt_state_format f;
    mt_test_state *src, *dst; /* what is saved; the load destination */
    float *w[3];              /* full: src's master, exp_avg, exp_avg_sq arenas (t.total floats) */
    size_t bytes;             /* of one such arena */
} model;

static void model_init_fmt(model *m, const mt_config *cfg, mt_state_format f, uint64_t sr_seed) {
    mt_param_table_init(&m->t, cfg);
    m->f = f;
    m->bytes = sizeof(float) * (size_t)m->t.total;
    m->src = mt_test_state_create(f, &m->t, sr_seed);
    m->dst = mt_test_state_create(f, &m->t, 0);
    mt_optim_arenas a = mt_optim_state_arenas(m->src->s);
    m->w[0] = a.master, m->w[1] = a.m, m->w[2] = a.v;
    mt_test_state_poison(m->dst, SENTINEL);
}

static void model_init_cfg(model *m, const mt_config *cfg) {
    model_init_fmt(m, cfg, MT_STATE_FULL, 0);
}

static void model_fill_random(model *m, uint64_t seed) {
    mt_test_state_fill_random(m->src, &m->t, seed);
}

static void model_init(model *m, const char *variant, uint64_t seed) {
    mt_config cfg = mt_test_tiny_config(variant);
    model_init_cfg(m, &cfg);
    model_fill_random(m, seed);
}

static void model_free(model *m) {
    mt_param_table_free(&m->t);
    mt_test_state_free(m->src);
    mt_test_state_free(m->dst);
}

static void reset_got(model *m) { mt_test_state_poison(m->dst, SENTINEL); }

static int got_untouched(const model *m) {
    return mt_test_state_poisoned(m->dst, SENTINEL) && m->dst->n_sets == 0;
}

/* The loaded state is the saved one, tensor by tensor, bit for bit. */
static void assert_loaded(model *m) {
    if (!mt_test_state_equal(m->src, m->dst, &m->t)) fail_msg("the loaded state differs");
}

static void save_ok(const model *m, const char *out, const mt_ckpt_state *st, const char *args,
                    const char *tok, int keep_last) {
    if (mt_checkpoint_save(out, &m->t, &m->src->io, st, args, tok, keep_last) != MT_OK)
        fail_msg("%s", mt_error_message());
}

static void load_ok(model *m, const char *dir, mt_ckpt_state *st) {
    m->dst->n_sets = 0;
    if (mt_checkpoint_load(dir, &m->t, &m->dst->io, st) != MT_OK)
        fail_msg("%s", mt_error_message());
}

static void latest_ok(const char *out, char *path, size_t size) {
    if (mt_checkpoint_latest(out, path, size) != MT_OK) fail_msg("%s", mt_error_message());
}

static void assert_ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    if (a < b || strcmp(s + a - b, suffix) != 0) fail_msg("'%s' does not end with '%s'", s, suffix);
}

static void assert_msg_has(const char *needle) {
    const char *msg = mt_error_message();
    printf("  error (expected): %s\n", msg);
    if (!strstr(msg, needle)) fail_msg("message '%s' does not mention '%s'", msg, needle);
}

/* ---- editing a saved checkpoint ---- */

/* XORs one byte of DIR/FILE at offset (negative: from the end). */
static void flip_byte(const char *dir, const char *file, long offset) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, offset, offset < 0 ? SEEK_END : SEEK_SET), 0);
    long at = ftell(f);
    int c = fgetc(f);
    assert_true(c != EOF);
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    fputc(c ^ 0x20, f);
    fclose(f);
}

static long file_size(const char *dir, const char *file) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    return (long)sb.st_size;
}

/* stderr into a file between capture_begin and capture_end (which returns it, malloc'd). */
static int saved_stderr = -1;
static char capture_path[4096];

static void capture_begin(void) {
    fflush(stderr);
    snprintf(capture_path, sizeof capture_path, "%s/stderr.txt", mt_test_dir);
    FILE *f = fopen(capture_path, "wb");
    assert_non_null(f);
    saved_stderr = dup(2);
    dup2(fileno(f), 2);
    fclose(f);
}

static char *capture_end(void) {
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    char *text = read_text(mt_test_dir, "stderr.txt");
    assert_non_null(text);
    fputs(text, stdout); /* shown in the test's log */
    unlink(capture_path);
    return text;
}

static void assert_has(const char *text, const char *needle) {
    if (!strstr(text, needle)) fail_msg("'%s' does not mention '%s'", text, needle);
}

/* ---- round trips ---- */

static void roundtrip(const char *variant) {
    model m;
    model_init(&m, variant, 7);
    char *out = mt_test_dir_sub(variant);
    char *tok = mt_test_dir_sub("tokenizer_src");
    mkdir(tok, 0755);
    write_text(tok, "tokenizer.json", "{\"version\": \"1.0\", \"model\": {}}\n");
    write_text(tok, "tokenizer_config.json", "{\"bos_token\": \"<s>\"}\n");

    mt_ckpt_state st = {7, 0xfedcba9876543210ull, 2.718281828459045, 5, 2, NULL}, back;
    save_ok(&m, out, &st, "{\"lr\": 0.0003, \"batch\": 8, \"model\": \"tiny\"}", tok, 0);

    char path[4096];
    latest_ok(out, path, sizeof path);
    assert_ends_with(path, "/checkpoints/step_00000007");
    const char *files[] = {"config.json", "model.safetensors", "optimizer.safetensors",
                           "trainer_state.json", "tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++)
        if (!exists(path, files[i])) fail_msg("%s/%s missing", path, files[i]);
    assert_false(exists(path, "special_tokens_map.json")); /* absent in the source: skipped */
    assert_false(exists(path, "model.safetensors.tmp"));
    char ckdir[4096];
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", out);
    assert_int_equal(mt_test_count_prefix(ckdir, ".tmp-"), 0);
    char *a = read_text(tok, "tokenizer.json"), *b = read_text(path, "tokenizer.json");
    assert_string_equal(a, b);
    free(a);
    free(b);

    /* trainer_state.json: the documented fields, args embedded as JSON */
    char sp[4200];
    snprintf(sp, sizeof sp, "%s/trainer_state.json", path);
    json_error_t je;
    json_t *o = json_load_file(sp, 0, &je);
    assert_non_null(o);
    assert_int_equal(json_integer_value(json_object_get(o, "format")), 3);
    assert_string_equal(json_string_value(json_object_get(o, "state")), "full");
    assert_null(json_object_get(o, "sr_seed")); /* tight's alone */
    assert_int_equal(json_integer_value(json_object_get(o, "step")), 7);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(o, "args"), "batch")), 8);
    /* every file but trainer_state.json itself, with its length and XXH3-64 */
    json_t *fo = json_object_get(o, "files");
    assert_int_equal(json_object_size(fo), 5);
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        if (strcmp(files[i], "trainer_state.json") == 0) continue;
        json_t *e = json_object_get(fo, files[i]);
        if (!e) fail_msg("trainer_state.json: no checksum of %s", files[i]);
        char fp[4400];
        snprintf(fp, sizeof fp, "%s/%s", path, files[i]);
        mt_file_digest d;
        assert_int_equal(mt_digest_file(fp, &d), 0);
        char hex[MT_DIGEST_HEX];
        mt_digest_hex(d.xxh3, hex);
        assert_int_equal(json_integer_value(json_object_get(e, "bytes")), (json_int_t)d.bytes);
        assert_string_equal(json_string_value(json_object_get(e, "xxh3_64")), hex);
    }
    json_decref(o);

    load_ok(&m, path, &back);
    assert_loaded(&m); /* bitwise */
    assert_int_equal(back.step, st.step);
    assert_true(back.seed == st.seed);
    assert_true(back.loss == st.loss);
    assert_int_equal(back.updates, 5);
    assert_int_equal(back.skipped, 2);
    assert_string_equal(back.args_json, "{\"batch\":8,\"lr\":0.00029999999999999997,\"model\":\"tiny\"}");
    mt_ckpt_state_free(&back);

    /* model.safetensors + config.json alone are a Hugging Face model directory */
    mt_test_state_model_dir(m.src, &m.t, path);

    /* the same step saved again replaces the checkpoint; a NaN loss comes back as NaN */
    model_fill_random(&m, 99);
    mt_ckpt_state st2 = {7, 5, NAN, 7, 0, NULL};
    save_ok(&m, out, &st2, NULL, NULL, 0);
    reset_got(&m);
    load_ok(&m, path, &back);
    assert_loaded(&m);
    assert_true(back.seed == 5 && isnan(back.loss));
    assert_false(exists(path, "tokenizer.json")); /* a fresh directory, not a merge */
    assert_int_equal(mt_test_count_prefix(ckdir, ".tmp-"), 0);

    mt_test_rmtree(out);
    free(out);
    free(tok);
    model_free(&m);
}

static void test_roundtrip_llama(void **state) { roundtrip("llama_gqa"); }
static void test_roundtrip_qwen2_tied(void **state) { roundtrip("qwen2_bias_tied"); }
static void test_roundtrip_qwen3(void **state) { roundtrip("qwen3_qknorm"); }

static void test_keep_last(void **state) {
    model m;
    model_init(&m, "llama_gqa", 1);
    char *out = mt_test_dir_sub("keep");
    char ckdir[4096];
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", out);
    for (int s = 1; s <= 4; s++) {
        mt_ckpt_state st = {s * 10, 1, 1.0 / s, s * 10, 0, NULL};
        save_ok(&m, out, &st, NULL, NULL, 2);
    }
    assert_int_equal(mt_test_count_prefix(ckdir, "step_"), 2);
    assert_true(exists(ckdir, "step_00000030") && exists(ckdir, "step_00000040"));
    assert_int_equal(mt_test_count_prefix(ckdir, ".tmp-"), 0);
    /* keep_last <= 0 keeps all */
    for (int s = 5; s <= 6; s++) {
        mt_ckpt_state st = {s * 10, 1, 0.0, s * 10, 0, NULL};
        save_ok(&m, out, &st, NULL, NULL, 0);
    }
    assert_int_equal(mt_test_count_prefix(ckdir, "step_"), 4);
    /* an older step saved after newer ones (a rewind) is kept even with keep_last 1 */
    mt_ckpt_state old = {15, 1, 0.0, 15, 0, NULL};
    save_ok(&m, out, &old, NULL, NULL, 1);
    assert_int_equal(mt_test_count_prefix(ckdir, "step_"), 2);
    assert_true(exists(ckdir, "step_00000015") && exists(ckdir, "step_00000060"));
    char path[4096];
    latest_ok(out, path, sizeof path);
    assert_ends_with(path, "step_00000060");
    /* steps past 8 digits */
    mt_ckpt_state big = {123456789012LL, 1, 0.0, 123456789012LL, 0, NULL};
    save_ok(&m, out, &big, NULL, NULL, 0);
    latest_ok(out, path, sizeof path);
    assert_ends_with(path, "step_123456789012");
    mt_test_rmtree(out);
    free(out);
    model_free(&m);
}

static void test_stale_tmp(void **state) {
    model m;
    model_init(&m, "llama_gqa", 2);
    char *out = mt_test_dir_sub("stale");
    mt_ckpt_state st = {3, 1, 0.5}, back;
    save_ok(&m, out, &st, NULL, NULL, 0);
    char ckdir[4096], junk[4200];
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", out);
    /* an interrupted save of a later step, its own temporary, and names that are not steps */
    snprintf(junk, sizeof junk, "%s/.tmp-step_00000099", ckdir);
    assert_int_equal(mkdir(junk, 0755), 0);
    write_text(junk, "model.safetensors.tmp", "half a file");
    snprintf(junk, sizeof junk, "%s/.tmp-step_00000004", ckdir);
    assert_int_equal(mkdir(junk, 0755), 0);
    write_text(junk, "config.json", "{");
    /* a save in progress elsewhere (its temporary is locked): left alone until it is done */
    char live[4200];
    snprintf(live, sizeof live, "%s/.tmp-step_00000077.AbCd12", ckdir);
    assert_int_equal(mkdir(live, 0755), 0);
    int live_fd = open(live, O_RDONLY | O_DIRECTORY);
    assert_true(live_fd >= 0);
    assert_int_equal(flock(live_fd, LOCK_EX), 0);
    snprintf(junk, sizeof junk, "%s/step_abc", ckdir);
    assert_int_equal(mkdir(junk, 0755), 0);
    write_text(ckdir, "step_00000500", "a file, not a directory");

    char path[4096];
    latest_ok(out, path, sizeof path);
    assert_ends_with(path, "/step_00000003");
    load_ok(&m, path, &back);
    assert_int_equal(back.step, 3);

    st.step = 4;
    save_ok(&m, out, &st, NULL, NULL, 0);
    assert_int_equal(mt_test_count_prefix(ckdir, ".tmp-"), 1);
    assert_true(exists(ckdir, ".tmp-step_00000077.AbCd12"));
    close(live_fd); /* that save died: its leftover goes with the next save */
    save_ok(&m, out, &st, NULL, NULL, 0);
    assert_int_equal(mt_test_count_prefix(ckdir, ".tmp-"), 0);
    latest_ok(out, path, sizeof path);
    assert_ends_with(path, "/step_00000004");
    reset_got(&m);
    load_ok(&m, path, &back);
    assert_int_equal(back.step, 4);
    assert_true(exists(ckdir, "step_abc")); /* not ours: left alone */
    mt_test_rmtree(out);
    free(out);
    model_free(&m);
}

/* ---- errors ---- */

static void test_latest_empty(void **state) {
    char *out = mt_test_dir_sub("empty");
    char path[4096];
    mkdir(out, 0755);
    assert_int_equal(mt_checkpoint_latest(out, path, sizeof path), MT_ERR);
    assert_msg_has("no checkpoint to resume from");
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/checkpoints", out);
    mkdir(ck, 0755);
    assert_int_equal(mt_checkpoint_latest(out, path, sizeof path), MT_ERR);
    assert_msg_has("no checkpoint to resume from");

    model m;
    model_init(&m, "llama_gqa", 3);
    mt_ckpt_state st = {1, 1, 0.0};
    save_ok(&m, out, &st, NULL, NULL, 0);
    char small[16];
    assert_int_equal(mt_checkpoint_latest(out, small, sizeof small), MT_ERR);
    assert_msg_has("step_00000001");
    mt_test_rmtree(out);
    free(out);
    model_free(&m);
}

static void test_save_errors(void **state) {
    model m;
    model_init(&m, "llama_gqa", 4);
    mt_ckpt_state st = {1, 1, 0.0};
    /* the output directory is a regular file */
    write_text(mt_test_dir, "not_a_dir", "x");
    char *out = mt_test_dir_sub("not_a_dir");
    assert_int_equal(mt_checkpoint_save(out, &m.t, &m.src->io, &st, NULL, NULL, 0),
                     MT_ERR);
    assert_msg_has("not_a_dir");
    free(out);
    /* checkpoints/.tmp-step_ path taken by a file that cannot be a directory parent */
    out = mt_test_dir_sub("errs");
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/checkpoints", out);
    mkdir(out, 0755);
    write_text(out, "checkpoints", "a file");
    assert_int_equal(mt_checkpoint_save(out, &m.t, &m.src->io, &st, NULL, NULL, 0),
                     MT_ERR);
    assert_msg_has("checkpoints");
    unlink(ck);
    /* bad args, missing tokenizer dir, negative step: refused before anything is written */
    assert_int_equal(mt_checkpoint_save(out, &m.t, &m.src->io, &st, "{\"lr\": ", NULL, 0), MT_ERR);
    assert_msg_has("not valid JSON");
    char *nodir = mt_test_dir_sub("no_such_tokenizer");
    assert_int_equal(mt_checkpoint_save(out, &m.t, &m.src->io, &st, NULL, nodir, 0),
                     MT_ERR);
    assert_msg_has("no_such_tokenizer");
    free(nodir);
    mt_ckpt_state neg = {-1, 1, 0.0};
    assert_int_equal(mt_checkpoint_save(out, &m.t, &m.src->io, &neg, NULL, NULL, 0),
                     MT_ERR);
    assert_msg_has("step");
    /* a frozen state (a LoRA base: weights, no optimizer state) is not a training state */
    mt_test_state *fz = mt_test_state_create(MT_STATE_FROZEN, &m.t, 0);
    assert_int_equal(mt_checkpoint_save(out, &m.t, &fz->io, &st, NULL, NULL, 0), MT_ERR);
    assert_msg_has("frozen");
    mt_test_state_free(fz);
    assert_int_equal(mt_test_count_prefix(ck, "step_"), 0);
    assert_int_equal(mt_test_count_prefix(ck, ".tmp-"), 0);
    /* a save failing mid-way (a tokenizer file that cannot be read) leaves no directory */
    char *tok = mt_test_dir_sub("tok_bad");
    mkdir(tok, 0755);
    char tj[4200];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", tok);
    mkdir(tj, 0755); /* a directory where a file is expected: reading it fails */
    assert_int_equal(mt_checkpoint_save(out, &m.t, &m.src->io, &st, NULL, tok, 0),
                     MT_ERR);
    printf("  error (expected): %s\n", mt_error_message());
    assert_int_equal(mt_test_count_prefix(ck, "step_"), 0);
    assert_int_equal(mt_test_count_prefix(ck, ".tmp-"), 0);
    mt_test_rmtree(tok);
    free(tok);
    mt_test_rmtree(out);
    free(out);
    model_free(&m);
}

/* A saved checkpoint under OUT; its step directory into path. */
static void fresh_checkpoint(const model *m, const char *name, char *path, size_t size) {
    char *out = mt_test_dir_sub(name);
    mt_ckpt_state st = {5, 9, 1.5};
    save_ok(m, out, &st, NULL, NULL, 0);
    latest_ok(out, path, size);
    free(out);
}

static void expect_load_error(model *m, const mt_param_table *t, const char *dir,
                              const char *needle) {
    reset_got(m);
    mt_ckpt_state st, before;
    memset(&st, SENTINEL, sizeof st);
    before = st;
    m->dst->n_sets = 0;
    assert_int_equal(mt_checkpoint_load(dir, t, &m->dst->io, &st), MT_ERR);
    assert_msg_has(needle);
    assert_true(got_untouched(m));
    assert_memory_equal(&st, &before, sizeof st);
}

static void test_load_config_mismatch(void **state) {
    model m;
    model_init(&m, "llama_gqa", 5);
    char path[4096];
    fresh_checkpoint(&m, "mismatch", path, sizeof path);
    mt_config cfg = m.t.cfg;
    cfg.C = 32;
    model big; /* a state sized for the other table */
    model_init_cfg(&big, &cfg);
    expect_load_error(&big, &big.t, path, "hidden_size");
    model_free(&big);

    cfg = m.t.cfg;
    cfg.tie_word_embeddings = 1;
    model_init_cfg(&big, &cfg);
    expect_load_error(&big, &big.t, path, "tie_word_embeddings");
    model_free(&big);

    cfg = m.t.cfg;
    cfg.arch = MT_ARCH_QWEN3;
    strcpy(cfg.model_type, "qwen3");
    cfg.qk_norm = 1;
    model_init_cfg(&big, &cfg);
    expect_load_error(&big, &big.t, path, "model_type");
    model_free(&big);
    model_free(&m);
}

static void test_load_missing_optimizer_tensor(void **state) {
    model m;
    model_init(&m, "llama_gqa", 6);
    char path[4096];
    fresh_checkpoint(&m, "missing_opt", path, sizeof path);
    /* rewrite optimizer.safetensors without exp_avg_sq.model.norm.weight */
    int n = 2 * m.t.n_params;
    mt_st_write_tensor *w = calloc((size_t)n + 2, sizeof *w); /* room for extras below */
    char (*names)[128] = calloc((size_t)n, sizeof *names);
    int k = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < m.t.n_params; i++) {
            const mt_param *p = &m.t.params[i];
            snprintf(names[k], sizeof names[k], "%s.%s", pass ? "exp_avg_sq" : "exp_avg", p->name);
            if (strcmp(names[k], "exp_avg_sq.model.norm.weight") == 0) continue;
            w[k].name = names[k];
            w[k].dtype = MT_F32;
            w[k].ndim = p->ndim;
            for (int d = 0; d < p->ndim; d++) w[k].shape[d] = p->shape[d];
            w[k].data = m.w[1 + pass] + p->offset;
            k++;
        }
    char opt[4200];
    snprintf(opt, sizeof opt, "%s/optimizer.safetensors", path);
    assert_int_equal(mt_safetensors_write(opt, w, k, NULL, 0), MT_OK);
    mt_test_ckpt_restamp(path, "optimizer.safetensors"); /* the structure checks are past the checksum */
    expect_load_error(&m, &m.t, path, "exp_avg_sq.model.norm.weight");

    /* an extra tensor beside the full set */
    w[k] = w[0];
    w[k].name = "exp_avg_sq.model.norm.weight";
    w[k].ndim = 1;
    w[k].shape[0] = m.t.cfg.C;
    w[k].data = m.w[2];
    w[k + 1] = w[0];
    w[k + 1].name = "exp_avg.something_else";
    assert_int_equal(mt_safetensors_write(opt, w, k + 2, NULL, 0), MT_OK);
    mt_test_ckpt_restamp(path, "optimizer.safetensors");
    expect_load_error(&m, &m.t, path, "tensors that are not exp_avg/exp_avg_sq");

    /* a wrong shape */
    w[k + 1] = w[0];
    w[k].shape[0] = m.t.cfg.C - 1;
    assert_int_equal(mt_safetensors_write(opt, w, k + 1, NULL, 0), MT_OK);
    mt_test_ckpt_restamp(path, "optimizer.safetensors");
    expect_load_error(&m, &m.t, path, "exp_avg_sq.model.norm.weight: shape");

    /* the file itself missing */
    unlink(opt);
    expect_load_error(&m, &m.t, path, "optimizer.safetensors");
    free(names);
    free(w);
    model_free(&m);
}

static void test_load_bad_state(void **state) {
    model m;
    model_init(&m, "llama_gqa", 8);
    char path[4096];
    fresh_checkpoint(&m, "bad_state", path, sizeof path);
    const char *bad[] = {
        "{\"format\": 1, \"step\": 5",                             /* truncated */
        "[1, 2]",                                                   /* not an object */
        "{\"format\": 1, \"step\": -3, \"seed\": 1, \"loss\": 0}",  /* negative step */
        "{\"format\": 1, \"step\": 2.5, \"seed\": 1, \"loss\": 0}", /* not an integer */
        "{\"format\": 1, \"seed\": 1, \"loss\": 0}",                /* no step */
        "{\"format\": 4, \"step\": 5, \"seed\": 1, \"loss\": 0}",   /* a future format */
        "{\"format\": 3, \"step\": 5, \"seed\": 1, \"loss\": 0}",   /* format 3 without files */
        "{\"format\": 1, \"state\": \"half\", \"step\": 5, \"seed\": 1, \"loss\": 0}",
        "{\"format\": 1, \"state\": 2, \"step\": 5, \"seed\": 1, \"loss\": 0}",
        "{\"format\": 2, \"step\": 5, \"seed\": 1, \"loss\": 0}",   /* format 2 without files */
        "{\"format\": 1, \"step\": 11, \"seed\": 1, \"loss\": 0}",  /* not the directory's step */
        "{\"format\": 1, \"step\": 5, \"seed\": -1, \"loss\": 0}",  /* negative seed */
        "{\"format\": 1, \"step\": 5, \"seed\": \"12x\", \"loss\": 0}",
        "{\"format\": 1, \"step\": 5, \"seed\": 1, \"loss\": \"low\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_text(path, "trainer_state.json", bad[i]);
        expect_load_error(&m, &m.t, path, "trainer_state.json");
    }
    char sp[4200];
    snprintf(sp, sizeof sp, "%s/trainer_state.json", path);
    unlink(sp);
    expect_load_error(&m, &m.t, path, "trainer_state.json");
    /* a good hand-written one of format 1 (no checksums) loads, saying it cannot be verified */
    write_text(path, "trainer_state.json",
               "{\"format\": 1, \"step\": 5, \"seed\": \"18446744073709551615\", \"loss\": null}");
    mt_ckpt_state st;
    reset_got(&m);
    capture_begin();
    load_ok(&m, path, &st);
    char *err = capture_end();
    assert_has(err, "megatrain: warning: ");
    assert_has(err, "format-1 checkpoint has no checksums; it cannot be verified");
    assert_has(err, path);
    free(err);
    assert_loaded(&m);
    assert_int_equal(st.step, 5);
    assert_true(st.seed == UINT64_MAX && isnan(st.loss));
    model_free(&m);
}

static void test_load_missing_pieces(void **state) {
    model m;
    model_init(&m, "qwen2_bias_tied", 9);
    char *nodir = mt_test_dir_sub("no_such_checkpoint");
    expect_load_error(&m, &m.t, nodir, "no_such_checkpoint");
    free(nodir);
    char path[4096], p[4200];
    fresh_checkpoint(&m, "missing_model", path, sizeof path);
    snprintf(p, sizeof p, "%s/model.safetensors", path);
    unlink(p);
    expect_load_error(&m, &m.t, path, "model.safetensors");
    snprintf(p, sizeof p, "%s/config.json", path);
    unlink(p);
    expect_load_error(&m, &m.t, path, "config.json");
    model_free(&m);
}

/* ---- integrity ---- */

/* A flipped byte in any recorded file is refused by name, with "checksum"; flipped back, it loads. */
static void test_checksum_flip(void **state) {
    model m;
    model_init(&m, "llama_gqa", 21);
    char *out = mt_test_dir_sub("flip"), *tok = mt_test_dir_sub("flip_tok");
    mkdir(tok, 0755);
    write_text(tok, "tokenizer.json", "{\"version\": \"1.0\", \"model\": {}}\n");
    mt_ckpt_state st = {5, 9, 1.5, 5, 0, NULL}, back;
    save_ok(&m, out, &st, NULL, tok, 0);
    char path[4096];
    latest_ok(out, path, sizeof path);
    const char *names[] = {"model.safetensors", "optimizer.safetensors", "config.json",
                           "tokenizer.json"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        long at = file_size(path, names[i]) / 2; /* model/optimizer: inside a tensor's data */
        flip_byte(path, names[i], at);
        char want[4400];
        snprintf(want, sizeof want, "%s/%s: checksum mismatch", path, names[i]);
        expect_load_error(&m, &m.t, path, want);
        flip_byte(path, names[i], at);
        reset_got(&m);
        load_ok(&m, path, &back);
        assert_loaded(&m);
        mt_ckpt_state_free(&back);
    }
    /* a truncated file, and one whose recorded checksum is not hex */
    char p[4400];
    snprintf(p, sizeof p, "%s/optimizer.safetensors", path);
    assert_int_equal(truncate(p, file_size(path, "optimizer.safetensors") - 4), 0);
    expect_load_error(&m, &m.t, path, "optimizer.safetensors: checksum mismatch");
    json_t *o = mt_test_ckpt_load_state(path);
    json_object_set_new(json_object_get(json_object_get(o, "files"), "model.safetensors"),
                        "xxh3_64", json_string("not hex"));
    mt_test_ckpt_store_state(path, o);
    expect_load_error(&m, &m.t, path, "\"xxh3_64\"");
    mt_test_rmtree(out);
    mt_test_rmtree(tok);
    free(out);
    free(tok);
    model_free(&m);
}

/* convert --model CK --out CK replaced the fp32 master with bf16: refused with what happened,
 * before the checksum would only say "replaced". */
static void test_exported_weights_refused(void **state) {
    model m;
    model_init(&m, "qwen2_bias_tied", 22);
    char path[4096];
    fresh_checkpoint(&m, "exported", path, sizeof path);
    assert_int_equal(mt_model_save(&m.t, m.w[0], path, MT_BF16, 0), MT_OK);
    char want[8400];
    snprintf(want, sizeof want,
             "%s/model.safetensors holds bf16 weights: an exported model, not a training checkpoint "
             "(the fp32 master is gone); fine-tune from it with --model %s instead of --resume",
             path, path);
    expect_load_error(&m, &m.t, path, want);
    assert_string_equal(mt_error_message(), want);
    /* the same for a format-1 checkpoint, which has no checksum to catch it */
    json_t *o = mt_test_ckpt_load_state(path);
    json_object_set_new(o, "format", json_integer(1));
    json_object_del(o, "files");
    mt_test_ckpt_store_state(path, o);
    expect_load_error(&m, &m.t, path, want);
    model_free(&m);
}

/* Writes DIR/FILE as the table's tensors (prefix before each name) from arena, with one value of
 * tensor `name` replaced by bad, and records its checksum: only the finiteness check can refuse it. */
static void write_with_value(const model *m, const char *dir, const char *file, const char *prefix,
                             const float *arena, const char *name, float bad) {
    int n = m->t.n_params;
    mt_st_write_tensor *w = calloc((size_t)n, sizeof *w);
    char (*names)[160] = calloc((size_t)n, sizeof *names);
    float *copy = malloc(m->bytes);
    memcpy(copy, arena, m->bytes);
    int hit = 0;
    for (int i = 0; i < n; i++) {
        const mt_param *p = &m->t.params[i];
        snprintf(names[i], sizeof names[i], "%s%s", prefix, p->name);
        if (strcmp(p->name, name) == 0) copy[p->offset + p->numel / 2] = bad, hit = 1;
        w[i].name = names[i];
        w[i].dtype = MT_F32;
        w[i].ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) w[i].shape[d] = p->shape[d];
        w[i].data = copy + m->t.params[i].offset;
    }
    assert_true(hit);
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    const mt_st_meta meta[] = {{"format", "pt"}};
    assert_int_equal(mt_safetensors_write(p, w, n, meta, 1), MT_OK);
    mt_test_ckpt_restamp(dir, file);
    free(copy);
    free(names);
    free(w);
}

/* trainer_state.json's nonfinite_in_a_row: saved, loaded, absent (older checkpoints) as 0, refused
 * out of [0, skipped]. keep_last 2 while saves come after skipped steps (in_a_row > 0) keeps the
 * newest checkpoint of a healthy step too, until a healthy one is saved again. (Before: no field,
 * and step 10 was pruned when step 30 was written.) */
static void test_in_a_row_and_keep(void **state) {
    model m;
    model_init(&m, "llama_gqa", 5);
    char *out = mt_test_dir_sub("in_a_row");
    char ckdir[4096], dir[4200];
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", out);
    int64_t in_a_row[] = {0, 1, 2, 3, 0, 0};
    const char *kept[] = {"10", "10 20", "10 20 30", "10 30 40", "40 50", "50 60"};
    for (int s = 1; s <= 6; s++) {
        mt_ckpt_state st = {s * 10, 1, 0.5, s * 10, 3, NULL};
        st.in_a_row = in_a_row[s - 1];
        save_ok(&m, out, &st, NULL, NULL, 2);
        char want[64] = "", name[32];
        for (int k = 1; k <= 6; k++) {
            snprintf(name, sizeof name, "step_%08d", k * 10);
            if (exists(ckdir, name)) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", want[0] ? " " : "", k * 10);
        }
        if (strcmp(want, kept[s - 1]) != 0) fail_msg("after step %d: kept %s, want %s", s * 10, want, kept[s - 1]);
    }
    mt_ckpt_state st = {70, 1, 0.5, 67, 3, NULL};
    st.in_a_row = 3;
    save_ok(&m, out, &st, NULL, NULL, 0);
    snprintf(dir, sizeof dir, "%s/step_00000070", ckdir);
    load_ok(&m, dir, &st);
    assert_int_equal(st.in_a_row, 3);
    mt_ckpt_state_free(&st);
    json_t *o = mt_test_ckpt_load_state(dir);
    json_object_del(o, "nonfinite_in_a_row");
    mt_test_ckpt_store_state(dir, o);
    load_ok(&m, dir, &st);
    assert_int_equal(st.in_a_row, 0);
    mt_ckpt_state_free(&st);
    const char *bad[] = {"-1", "4", "1.5", "\"2\""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        o = mt_test_ckpt_load_state(dir);
        json_object_set_new(o, "nonfinite_in_a_row", json_loads(bad[i], JSON_DECODE_ANY, NULL));
        mt_test_ckpt_store_state(dir, o);
        expect_load_error(&m, &m.t, dir, "\"nonfinite_in_a_row\" must be an integer from 0 to \"skipped\"");
    }
    mt_test_rmtree(out);
    free(out);
    model_free(&m);
}

static void test_nonfinite_file_refused(void **state) {
    model m;
    model_init(&m, "llama_gqa", 23);
    char path[4096];
    fresh_checkpoint(&m, "nan_file", path, sizeof path);
    const char *tensor = "model.layers.1.self_attn.k_proj.weight";
    write_with_value(&m, path, "model.safetensors", "", m.w[0], tensor, NAN);
    expect_load_error(&m, &m.t, path, "tensor model.layers.1.self_attn.k_proj.weight holds NaN or inf");
    assert_msg_has("model.safetensors");
    write_with_value(&m, path, "model.safetensors", "", m.w[0], tensor, 1.0f); /* repaired */

    /* moments: an inf in exp_avg_sq; the optimizer file has both prefixes, so write it whole */
    int n = 2 * m.t.n_params;
    mt_st_write_tensor *w = calloc((size_t)n, sizeof *w);
    char (*names)[160] = calloc((size_t)n, sizeof *names);
    float *m2 = malloc(m.bytes);
    memcpy(m2, m.w[2], m.bytes);
    const mt_param *last = &m.t.params[m.t.n_params - 1];
    m2[last->offset + last->numel - 1] = -INFINITY;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < m.t.n_params; i++) {
            const mt_param *p = &m.t.params[i];
            int j = k * m.t.n_params + i;
            snprintf(names[j], sizeof names[j], "%s.%s", k ? "exp_avg_sq" : "exp_avg", p->name);
            w[j].name = names[j];
            w[j].dtype = MT_F32;
            w[j].ndim = p->ndim;
            for (int d = 0; d < p->ndim; d++) w[j].shape[d] = p->shape[d];
            w[j].data = (k ? m2 : m.w[1]) + p->offset;
        }
    char opt[4400];
    snprintf(opt, sizeof opt, "%s/optimizer.safetensors", path);
    assert_int_equal(mt_safetensors_write(opt, w, n, NULL, 0), MT_OK);
    mt_test_ckpt_restamp(path, "optimizer.safetensors");
    char want[256];
    snprintf(want, sizeof want, "tensor exp_avg_sq.%s holds NaN or inf", last->name);
    expect_load_error(&m, &m.t, path, want);
    free(m2);
    free(names);
    free(w);
    model_free(&m);
}

/* Never write non-finite state: refused, nothing written, older checkpoints kept and not pruned. */
static void test_save_nonfinite_refused(void **state) {
    model m;
    model_init(&m, "llama_gqa", 24);
    char *out = mt_test_dir_sub("save_nan");
    char ckdir[4096];
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", out);
    for (int s = 1; s <= 2; s++) {
        mt_ckpt_state st = {s, 1, 0.5, s, 0, NULL};
        save_ok(&m, out, &st, NULL, NULL, 2);
    }
    const mt_param *p = &m.t.params[3];
    struct {
        int arena;
        float value;
        const char *what;
    } cases[] = {{2, NAN, "exp_avg_sq"}, {0, INFINITY, "master weights"}, {1, -INFINITY, "exp_avg"}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        float keep = m.w[cases[c].arena][p->offset + p->numel - 1];
        m.w[cases[c].arena][p->offset + p->numel - 1] = cases[c].value;
        mt_ckpt_state st = {3, 1, 0.5, 3, 0, NULL};
        assert_int_equal(mt_checkpoint_save(out, &m.t, &m.src->io, &st, NULL, NULL, 1),
                         MT_ERR);
        assert_msg_has(cases[c].what);
        assert_msg_has(p->name);
        assert_msg_has("NaN or inf");
        m.w[cases[c].arena][p->offset + p->numel - 1] = keep;
        /* keep_last 1 would have pruned step 1: both are still there and load */
        assert_int_equal(mt_test_count_prefix(ckdir, "step_"), 2);
        assert_false(exists(ckdir, "step_00000003"));
        assert_int_equal(mt_test_count_prefix(ckdir, ".tmp-"), 0);
    }
    for (int s = 1; s <= 2; s++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/step_%08d", ckdir, s);
        mt_ckpt_state back;
        reset_got(&m);
        load_ok(&m, dir, &back);
        assert_loaded(&m);
        assert_int_equal(back.step, s);
    }
    /* a NaN in the padding between tensors is not state: ignored */
    if (m.t.params[1].offset > m.t.params[0].offset + m.t.params[0].numel) {
        m.w[0][m.t.params[0].offset + m.t.params[0].numel] = NAN;
        mt_ckpt_state st = {3, 1, 0.5, 3, 0, NULL};
        save_ok(&m, out, &st, NULL, NULL, 0);
    }
    mt_test_rmtree(out);
    free(out);
    model_free(&m);
}

/* ---- resume ---- */

static int resume(model *m, const char *out, mt_ckpt_state *st, char *path, size_t size) {
    m->dst->n_sets = 0;
    return mt_checkpoint_resume(out, &m->t, &m->dst->io, st, path, size);
}

static void test_resume_fallback(void **state) {
    model m;
    model_init(&m, "llama_gqa", 25);
    char *out = mt_test_dir_sub("fallback");
    char ckdir[4096], path[4096], dir[4200];
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", out);
    mt_ckpt_state st, back;

    /* no checkpoint at all (no OUT, then an empty checkpoints/): MT_CKPT_NONE */
    assert_int_equal(resume(&m, out, &st, path, sizeof path), MT_CKPT_NONE);
    assert_msg_has("no checkpoint to resume from");
    mkdir(out, 0755);
    mkdir(ckdir, 0755);
    assert_int_equal(resume(&m, out, &st, path, sizeof path), MT_CKPT_NONE);
    assert_true(got_untouched(&m));

    /* steps 10, 20, 30 with different data; the newest intact one loads without a warning */
    mt_test_state *s10 = mt_test_state_create(m.f, &m.t, 0);
    mt_test_state_fill_random(s10, &m.t, 10);
    for (int s = 10; s <= 30; s += 10) {
        model_fill_random(&m, (uint64_t)s);
        st = (mt_ckpt_state){s, 3, 0.25, s, 0, NULL};
        save_ok(&m, out, &st, NULL, NULL, 0);
    }
    capture_begin();
    int rc = resume(&m, out, &back, path, sizeof path);
    char *err = capture_end();
    if (rc != MT_OK) fail_msg("%s", mt_error_message());
    assert_int_equal(back.step, 30);
    assert_ends_with(path, "/checkpoints/step_00000030");
    assert_loaded(&m);
    assert_string_equal(err, "");
    free(err);
    mt_ckpt_state_free(&back);

    /* 30: a flipped byte; 20: its trainer_state.json gone. Resume takes 10, naming both. */
    snprintf(dir, sizeof dir, "%s/step_00000030", ckdir);
    flip_byte(dir, "optimizer.safetensors", -5);
    snprintf(dir, sizeof dir, "%s/step_00000020/trainer_state.json", ckdir);
    assert_int_equal(unlink(dir), 0);
    reset_got(&m);
    capture_begin();
    rc = resume(&m, out, &back, path, sizeof path);
    err = capture_end();
    if (rc != MT_OK) fail_msg("%s", mt_error_message());
    assert_int_equal(back.step, 10);
    assert_ends_with(path, "/checkpoints/step_00000010");
    assert_true(mt_test_state_equal(m.dst, s10, &m.t));
    char want[8400];
    snprintf(want, sizeof want,
             "megatrain: warning: %s/step_00000030 is damaged (optimizer.safetensors: checksum "
             "mismatch", ckdir);
    assert_has(err, want);
    assert_has(err, "); resuming from step_00000010 instead\n");
    snprintf(want, sizeof want,
             "megatrain: warning: %s/step_00000020 is damaged (trainer_state.json: cannot open",
             ckdir);
    assert_has(err, want);
    free(err);
    mt_ckpt_state_free(&back);

    /* every one damaged: MT_ERR naming the newest and its damage, the state untouched */
    snprintf(dir, sizeof dir, "%s/step_00000010", ckdir);
    flip_byte(dir, "model.safetensors", -1);
    reset_got(&m);
    memset(&back, SENTINEL, sizeof back);
    assert_int_equal(resume(&m, out, &back, path, sizeof path), MT_ERR);
    assert_msg_has("step_00000030 is damaged (optimizer.safetensors: checksum mismatch");
    assert_msg_has("none of the 2 older checkpoints is intact");
    assert_true(got_untouched(&m));
    mt_test_state_free(s10);
    mt_test_rmtree(out);
    free(out);
    model_free(&m);
}

/* ---- crash safety ---- */

/* A model of ~2.7M parameters: a save writes ~32 MB. */
static mt_config crash_config(void) {
    mt_config c = mt_test_tiny_config("llama_gqa");
    c.C = 256, c.F = 704, c.L = 2, c.H = 4, c.G = 4, c.D = 64, c.V = 2048;
    return c;
}

/* Arena k's element i at step s; every step and arena distinguishable, cheap to produce. */
static float pattern(int64_t s, int k, int64_t i) {
    return (float)(s % 1000000) + 0.25f * (float)k + (float)(i & 1023) * (1.0f / 4096.0f);
}

static void fill_step(const mt_param_table *t, float *const a[3], int64_t s) {
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < t->n_params; i++) {
            const mt_param *p = &t->params[i];
            float *x = a[k] + p->offset;
            for (int64_t j = 0; j < p->numel; j++) x[j] = pattern(s, k, p->offset + j);
        }
}

/* A full state's master, exp_avg and exp_avg_sq arenas. */
static void full_arenas(const mt_test_state *ts, float *a[3]) {
    mt_optim_arenas x = mt_optim_state_arenas(ts->s);
    a[0] = x.master, a[1] = x.m, a[2] = x.v;
}

/* 1 when the loaded arenas hold step s's data exactly (in the tensors: a load does not write
 * the padding between them). */
static int check_step(const mt_param_table *t, float *const a[3], int64_t s) {
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < t->n_params; i++) {
            const mt_param *p = &t->params[i];
            for (int64_t j = 0; j < p->numel; j++)
                if (a[k][p->offset + j] != pattern(s, k, p->offset + j)) {
                    fprintf(stderr, "arena %d %s[%lld] = %g, step %lld wants %g\n", k, p->name,
                            (long long)j, a[k][p->offset + j], (long long)s,
                            pattern(s, k, p->offset + j));
                    return 0;
                }
        }
    }
    return 1;
}

/* The child: saves steps start, start+1, ... until killed; writes one byte on ready_fd first. */
static int crash_child(const char *out, int64_t start, int ready_fd) {
    mt_config cfg = crash_config();
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    mt_test_state *ts = mt_test_state_create(MT_STATE_FULL, &t, 0);
    float *a[3];
    full_arenas(ts, a);
    char one = 1;
    if (write(ready_fd, &one, 1) != 1) return 2;
    close(ready_fd);
    for (int64_t s = start; s < start + 100000; s++) {
        fill_step(&t, a, s);
        mt_ckpt_state st = {s, CRASH_SEED, 0.5 * (double)s};
        if (mt_checkpoint_save(out, &t, &ts->io, &st, "{\"crash\": true}", NULL, 2) != MT_OK) {
            fprintf(stderr, "crash child: %s\n", mt_error_message());
            return 1;
        }
    }
    return 0;
}

/* Loads and checks every step_ directory of OUT; returns the highest step. */
static int64_t verify_all(const mt_param_table *t, mt_test_state *ts, const char *out) {
    float *a[3];
    full_arenas(ts, a);
    char path[4096], ckdir[4096];
    latest_ok(out, path, sizeof path);
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", out);
    int64_t latest = -1;
    DIR *d = opendir(ckdir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "step_", 5) != 0) continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", ckdir, e->d_name);
        mt_ckpt_state st;
        mt_test_state_poison(ts, SENTINEL);
        if (mt_checkpoint_load(p, t, &ts->io, &st) != MT_OK)
            fail_msg("after a kill: %s", mt_error_message());
        if (strtoll(e->d_name + 5, NULL, 10) != st.step)
            fail_msg("%s holds step %lld", p, (long long)st.step);
        assert_true(st.seed == CRASH_SEED && st.loss == 0.5 * (double)st.step);
        if (!check_step(t, a, st.step))
            fail_msg("%s: data is not step %lld's", p, (long long)st.step);
        if (st.step > latest) latest = st.step;
        mt_ckpt_state_free(&st);
    }
    closedir(d);
    char want[64];
    snprintf(want, sizeof want, "/step_%08lld", (long long)latest);
    assert_ends_with(path, want);
    return latest;
}

static void test_crash_safety(void **state) {
    double t0 = now_ms();
    mt_config cfg = crash_config();
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    mt_test_state *ts = mt_test_state_create(MT_STATE_FULL, &t, 0);
    float *a[3];
    full_arenas(ts, a);
    char *out = mt_test_dir_sub("crash");

    /* step 0 from here, timed: the kills are spread over a few save times */
    fill_step(&t, a, 0);
    double t_save = now_ms();
    mt_ckpt_state st0 = {0, CRASH_SEED, 0.0};
    if (mt_checkpoint_save(out, &t, &ts->io, &st0, NULL, NULL, 2) != MT_OK)
        fail_msg("%s", mt_error_message());
    double save_ms = now_ms() - t_save;
    printf("  crash model: %lld params, %.1f MB per checkpoint, one save %.1f ms\n",
           (long long)t.n_real, 3.0 * 4.0 * (double)t.n_real / 1e6, save_ms);

    mt_test_rng rng;
    const char *env_seed = getenv("MT_TEST_SEED"); /* to replay a failure */
    uint64_t seed = env_seed ? strtoull(env_seed, NULL, 10) : (uint64_t)time(NULL);
    printf("  kill delays from seed %llu (MT_TEST_SEED replays)\n", (unsigned long long)seed);
    mt_test_rng_seed(&rng, seed);
    int64_t latest = 0;
    int mid_save = 0;
    char ckdir[4096];
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", out);
    /* CRASH_KILLS kills, and more (a few) until one has landed mid-save */
    int kills = 0;
    for (int kill_i = 0; kill_i < CRASH_KILLS || (mid_save == 0 && kill_i < 3 * CRASH_KILLS);
         kill_i++, kills++) {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        char start[32], fd_arg[16];
        snprintf(start, sizeof start, "%lld", (long long)(latest + 1));
        snprintf(fd_arg, sizeof fd_arg, "%d", fds[1]);
        char *argv[] = {"test_checkpoint", "--crash-child", out, start, fd_arg, NULL};
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            execv("/proc/self/exe", argv);
            _exit(127);
        }
        close(fds[1]);
        char c;
        assert_int_equal(read(fds[0], &c, 1), 1); /* the child is about to save */
        close(fds[0]);
        double delay = (0.2 + 3.0 * mt_test_rng_uniform(&rng)) * save_ms;
        usleep((useconds_t)(delay * 1000.0));
        assert_int_equal(kill(pid, SIGKILL), 0);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (!WIFSIGNALED(status)) fail_msg("the child exited by itself (status %d)", status);
        int tmp_left = mt_test_count_prefix(ckdir, ".tmp-");
        mid_save += tmp_left > 0;
        int64_t now = verify_all(&t, ts, out);
        printf("  kill %d after %.1f ms: latest step %lld (from %lld)%s\n", kill_i, delay,
               (long long)now, (long long)latest, tmp_left ? ", a .tmp- directory left" : "");
        assert_true(now >= latest);
        latest = now;
    }
    printf("  %d of %d kills left a temporary behind (killed mid-save); crash test %.0f ms\n",
           mid_save, kills, now_ms() - t0);
    assert_true(mid_save >= 1);
    /* the next save (a resume) removes the leftovers */
    fill_step(&t, a, latest + 1);
    mt_ckpt_state st = {latest + 1, CRASH_SEED, 0.5 * (double)(latest + 1)};
    if (mt_checkpoint_save(out, &t, &ts->io, &st, NULL, NULL, 2) != MT_OK)
        fail_msg("%s", mt_error_message());
    assert_int_equal(mt_test_count_prefix(ckdir, ".tmp-"), 0);
    assert_int_equal(mt_test_count_prefix(ckdir, "step_"), 2);
    assert_int_equal(verify_all(&t, ts, out), latest + 1);

    mt_test_rmtree(out);
    free(out);
    mt_test_state_free(ts);
    mt_param_table_free(&t);
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "--crash-child") == 0)
        return crash_child(argv[2], strtoll(argv[3], NULL, 10), atoi(argv[4]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_llama),
        cmocka_unit_test(test_roundtrip_qwen2_tied),
        cmocka_unit_test(test_roundtrip_qwen3),
        cmocka_unit_test(test_keep_last),
        cmocka_unit_test(test_in_a_row_and_keep),
        cmocka_unit_test(test_stale_tmp),
        cmocka_unit_test(test_latest_empty),
        cmocka_unit_test(test_save_errors),
        cmocka_unit_test(test_load_config_mismatch),
        cmocka_unit_test(test_load_missing_optimizer_tensor),
        cmocka_unit_test(test_load_bad_state),
        cmocka_unit_test(test_load_missing_pieces),
        cmocka_unit_test(test_checksum_flip),
        cmocka_unit_test(test_exported_weights_refused),
        cmocka_unit_test(test_nonfinite_file_refused),
        cmocka_unit_test(test_save_nonfinite_refused),
        cmocka_unit_test(test_resume_fallback),
        cmocka_unit_test(test_crash_safety),
    };
    return cmocka_run_group_tests(tests, mt_test_dir_setup, mt_test_dir_teardown);
}
