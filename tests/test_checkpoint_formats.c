/* checkpoint formats: full, compact and tight state saved and loaded through mt_state_io (every
 * tensor's weights and parts bit for bit), the files of each format, a checkpoint of another
 * format refused by name on load and on resume (the state untouched, no fallback to an older one),
 * format-2 full checkpoints (written here the way the format-2 code wrote them) still loading, a
 * flipped U8 code caught by the checksum, NaN in a block scale refused at save and at load, and
 * tight's sr_seed round trip. (The rest of the checkpoint contract: test_checkpoint.c.) */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/digest.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"
#include "util/state_io.h"
#include "util/ckpt_edit.h"
#include "util/testutil.h"
#include "util/tiny_config.h"

#define SENTINEL 0x7f /* every byte of an untouched state */
#define SR_SEED 0xfedcba9876543210ull /* above INT64_MAX: only a string keeps it in JSON */

static const mt_state_format FORMATS[] = {MT_STATE_FULL, MT_STATE_COMPACT, MT_STATE_TIGHT};

static void assert_msg_has(const char *needle) {
    const char *msg = mt_error_message();
    printf("  error (expected): %s\n", msg);
    if (!strstr(msg, needle)) fail_msg("message '%s' does not mention '%s'", msg, needle);
}

/* ---- a model and two states of one format ---- */

typedef struct {
    mt_param_table t;
    mt_state_format f;
    mt_test_state *src, *dst; /* what is saved (random); the load destination (poisoned) */
} model;

static void model_init(model *m, const char *variant, mt_state_format f, uint64_t seed) {
    mt_config cfg = mt_test_tiny_config(variant);
    mt_param_table_init(&m->t, &cfg);
    m->f = f;
    m->src = mt_test_state_create(f, &m->t, SR_SEED);
    m->dst = mt_test_state_create(f, &m->t, 0);
    mt_test_state_fill_random(m->src, &m->t, seed);
    mt_test_state_poison(m->dst, SENTINEL);
}

static void model_free(model *m) {
    mt_test_state_free(m->src);
    mt_test_state_free(m->dst);
    mt_param_table_free(&m->t);
}

static void save_ok(const model *m, const char *out, int64_t step) {
    mt_ckpt_state st = {step, 11, 0.5, step, 0, NULL};
    if (mt_checkpoint_save(out, &m->t, &m->src->io, &st, "{\"lr\": 0.001}", NULL, 0) != MT_OK)
        fail_msg("%s", mt_error_message());
}

static void ckpt_dir(char *buf, size_t size, const char *out, int64_t step) {
    snprintf(buf, size, "%s/checkpoints/step_%08lld", out, (long long)step);
}

static void load_ok(model *m, const char *dir, mt_ckpt_state *st) {
    if (mt_checkpoint_load(dir, &m->t, &m->dst->io, st) != MT_OK)
        fail_msg("%s", mt_error_message());
}

/* A load into io's state that must fail with needle, leaving the state and *st untouched. */
static void expect_load_error(model *m, mt_test_state *into, const char *dir, const char *needle) {
    mt_test_state_poison(into, SENTINEL);
    into->n_sets = 0;
    mt_ckpt_state st, before;
    memset(&st, SENTINEL, sizeof st);
    before = st;
    assert_int_equal(mt_checkpoint_load(dir, &m->t, &into->io, &st), MT_ERR);
    assert_msg_has(needle);
    assert_true(mt_test_state_poisoned(into, SENTINEL));
    assert_int_equal(into->n_sets, 0);
    assert_memory_equal(&st, &before, sizeof st);
}

/* ---- editing saved files ---- */

/* The file offset of tensor's first data byte in the safetensors file DIR/FILE (read from its
 * header, independently of the reader under test). */
static long data_offset(const char *dir, const char *file, const char *tensor) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    uint64_t n;
    json_t *o = mt_test_st_read_header(f, p, &n);
    fclose(f);
    json_t *e = json_object_get(o, tensor);
    if (!e) fail_msg("%s: no tensor %s", p, tensor);
    long at = 8 + (long)n + (long)json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 0));
    json_decref(o);
    return at;
}

static void write_at(const char *dir, const char *file, long offset, const void *bytes, size_t n) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, offset, SEEK_SET), 0);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

static void xor_at(const char *dir, const char *file, long offset) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, offset, SEEK_SET), 0);
    int c = fgetc(f);
    assert_true(c != EOF);
    assert_int_equal(fseek(f, offset, SEEK_SET), 0);
    fputc(c ^ 0x20, f);
    fclose(f);
}

/* ---- round trips ---- */

/* The parts of each tensor in optimizer.safetensors: the layout's names, dtypes and shapes. */
static void check_optimizer_file(const model *m, const char *dir) {
    char p[4400], name[256];
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    mt_safetensors *st;
    if (mt_safetensors_open_file(&st, p) != MT_OK) fail_msg("%s", mt_error_message());
    int want = 0;
    for (int i = 0; i < m->t.n_params; i++) {
        const mt_param *pa = &m->t.params[i];
        mt_optim_tensor x[MT_OPTIM_MAX_TENSORS];
        int n = mt_optim_parts_layout(m->f, (size_t)pa->numel, x);
        assert_int_equal(n, m->f == MT_STATE_FULL ? 2 : 4);
        for (int k = 0; k < n; k++, want++) {
            snprintf(name, sizeof name, "%s.%s", x[k].name, pa->name);
            const mt_st_tensor *y = mt_safetensors_find(st, name);
            if (!y) fail_msg("%s: no tensor %s", p, name);
            assert_int_equal(y->dtype, x[k].dtype);
            if (strstr(x[k].name, "_scale")) { /* one per block of 256 */
                assert_int_equal(y->ndim, 1);
                assert_int_equal(y->shape[0], (pa->numel + 255) / 256);
            } else {
                assert_int_equal(y->dtype, m->f == MT_STATE_FULL ? MT_F32 : MT_U8);
                assert_int_equal(y->ndim, pa->ndim);
                for (int d = 0; d < pa->ndim; d++) assert_int_equal(y->shape[d], pa->shape[d]);
            }
        }
    }
    assert_int_equal(mt_safetensors_count(st), want);
    mt_safetensors_close(st);
}

static void roundtrip(const char *variant, mt_state_format f) {
    model m;
    model_init(&m, variant, f, 3 + (uint64_t)f);
    char *out = mt_test_dir_sub("roundtrip");
    char dir[4200];
    save_ok(&m, out, 4);
    ckpt_dir(dir, sizeof dir, out, 4);

    json_t *o = mt_test_ckpt_load_state(dir);
    assert_int_equal(json_integer_value(json_object_get(o, "format")), 3);
    assert_string_equal(json_string_value(json_object_get(o, "state")), mt_state_format_name(f));
    json_t *seed = json_object_get(o, "sr_seed");
    if (f == MT_STATE_TIGHT) assert_string_equal(json_string_value(seed), "18364758544493064720");
    else assert_null(seed);
    json_decref(o);
    check_optimizer_file(&m, dir);
    mt_test_state_model_dir(m.src, &m.t, dir);

    mt_ckpt_state back;
    load_ok(&m, dir, &back);
    if (!mt_test_state_equal(m.src, m.dst, &m.t)) fail_msg("%s: the loaded state differs", variant);
    assert_int_equal(back.step, 4);
    assert_int_equal(back.state, f);
    assert_true(back.sr_seed == (f == MT_STATE_TIGHT ? SR_SEED : 0));
    assert_true(m.dst->sr_seed == (f == MT_STATE_TIGHT ? SR_SEED : 0)); /* set_sr_seed: tight */
    mt_ckpt_state_free(&back);
    mt_ckpt_state rs;
    assert_int_equal(mt_checkpoint_read_state(dir, &rs), MT_OK);
    assert_int_equal(rs.state, f);
    mt_ckpt_state_free(&rs);
    mt_test_rmtree(out);
    free(out);
    model_free(&m);
}

/* qwen2_bias_tied: biases of 48 and 16 elements, so U8 parts of sizes that leave the next F32
 * scale unaligned in the file. */
static void test_roundtrip_full(void **state) {
    roundtrip("llama_gqa", MT_STATE_FULL);
    roundtrip("qwen2_bias_tied", MT_STATE_FULL);
}
static void test_roundtrip_compact(void **state) {
    roundtrip("llama_gqa", MT_STATE_COMPACT);
    roundtrip("qwen2_bias_tied", MT_STATE_COMPACT);
}
static void test_roundtrip_tight(void **state) {
    roundtrip("llama_gqa", MT_STATE_TIGHT);
    roundtrip("qwen3_qknorm", MT_STATE_TIGHT);
}

/* ---- another format ---- */

static void test_other_format_refused(void **state) {
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            if (a == b) continue;
            mt_state_format fa = FORMATS[a], fb = FORMATS[b];
            model ma, mb; /* the same model in formats a and b */
            model_init(&ma, "llama_gqa", fa, 20);
            model_init(&mb, "llama_gqa", fb, 21);
            char *out = mt_test_dir_sub("other");
            char dir[4200], want[8800], path[4200];
            save_ok(&mb, out, 1); /* an older checkpoint in the run's format */
            save_ok(&ma, out, 2);
            ckpt_dir(dir, sizeof dir, out, 2);
            snprintf(want, sizeof want,
                     "%s: holds %s optimizer state, this run uses --state %s: resume with --state %s "
                     "(converting between formats is not supported)", dir,
                     mt_state_format_name(fa), mt_state_format_name(fb), mt_state_format_name(fa));
            expect_load_error(&mb, mb.dst, dir, want);
            assert_string_equal(mt_error_message(), want);

            /* resume refuses too, and does not fall back to step 1 */
            mt_test_state_poison(mb.dst, SENTINEL);
            mb.dst->n_sets = 0;
            mt_ckpt_state st;
            assert_int_equal(mt_checkpoint_resume(out, &mb.t, &mb.dst->io, &st, path, sizeof path),
                             MT_ERR);
            assert_string_equal(mt_error_message(), want);
            assert_true(mt_test_state_poisoned(mb.dst, SENTINEL));
            assert_int_equal(mb.dst->n_sets, 0);

            /* in its own format it resumes */
            assert_int_equal(mt_checkpoint_resume(out, &ma.t, &ma.dst->io, &st, path, sizeof path),
                             MT_OK);
            assert_int_equal(st.step, 2);
            assert_true(mt_test_state_equal(ma.src, ma.dst, &ma.t));
            mt_ckpt_state_free(&st);
            mt_test_rmtree(out);
            free(out);
            model_free(&ma);
            model_free(&mb);
        }
}

/* A compact checkpoint whose trainer_state.json claims full: the parts' dtypes give it away. */
static void test_parts_of_another_format(void **state) {
    model m, full;
    model_init(&m, "llama_gqa", MT_STATE_COMPACT, 30);
    model_init(&full, "llama_gqa", MT_STATE_FULL, 31);
    char *out = mt_test_dir_sub("claims_full");
    char dir[4200], want[512];
    save_ok(&m, out, 3);
    ckpt_dir(dir, sizeof dir, out, 3);
    json_t *o = mt_test_ckpt_load_state(dir);
    json_object_set_new(o, "state", json_string("full"));
    mt_test_ckpt_store_state(dir, o);
    snprintf(want, sizeof want, "tensor exp_avg.%s: dtype U8, full optimizer state stores F32",
             m.t.params[0].name);
    expect_load_error(&full, full.dst, dir, want);
    mt_test_rmtree(out);
    free(out);
    model_free(&m);
    model_free(&full);
}

/* ---- format 2 ---- */

static void add_digest(json_t *files, const char *dir, const char *name) {
    char p[4400], hex[MT_DIGEST_HEX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    mt_file_digest d;
    assert_int_equal(mt_digest_file(p, &d), 0);
    mt_digest_hex(d.xxh3, hex);
    json_object_set_new(files, name, json_pack("{s:I, s:s}", "bytes", (json_int_t)d.bytes,
                                               "xxh3_64", hex));
}

/* DIR/NAME: the table's tensors from arenas[0..n_arenas), each under prefix + its name, F32, in
 * arena-then-table order, metadata {"format": "pt"}: the format-2 writer's layout. */
static void write_arenas(const mt_param_table *t, const char *dir, const char *name,
                         float *const *arenas, const char *const *prefixes, int n_arenas) {
    int n = n_arenas * t->n_params;
    mt_st_write_tensor *w = calloc((size_t)n, sizeof *w);
    char (*names)[160] = calloc((size_t)n, sizeof *names);
    for (int k = 0; k < n_arenas; k++)
        for (int i = 0; i < t->n_params; i++) {
            const mt_param *p = &t->params[i];
            int j = k * t->n_params + i;
            snprintf(names[j], sizeof names[j], "%s%s", prefixes[k], p->name);
            w[j] = (mt_st_write_tensor){.name = names[j], .dtype = MT_F32, .ndim = p->ndim,
                                        .data = arenas[k] + p->offset};
            for (int d = 0; d < p->ndim; d++) w[j].shape[d] = p->shape[d];
        }
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    const mt_st_meta meta[] = {{"format", "pt"}};
    assert_int_equal(mt_safetensors_write(p, w, n, meta, 1), MT_OK);
    free(names);
    free(w);
}

/* OUT/checkpoints/step_N as the format-2 code saved it, from a full state's arenas. */
static void write_format2(const model *m, const char *out, int64_t step, char *dir, size_t size) {
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/checkpoints", out);
    mkdir(out, 0755);
    mkdir(ck, 0755);
    ckpt_dir(dir, size, out, step);
    assert_int_equal(mkdir(dir, 0755), 0);
    mt_optim_arenas a = mt_optim_state_arenas(m->src->s);
    char cfg[4400];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    assert_int_equal(mt_config_save(&m->t.cfg, cfg), MT_OK);
    float *master[] = {a.master}, *moments[] = {a.m, a.v};
    const char *none[] = {""}, *prefixes[] = {"exp_avg.", "exp_avg_sq."};
    write_arenas(&m->t, dir, "model.safetensors", master, none, 1);
    write_arenas(&m->t, dir, "optimizer.safetensors", moments, prefixes, 2);
    json_t *files = json_object();
    add_digest(files, dir, "config.json");
    add_digest(files, dir, "model.safetensors");
    add_digest(files, dir, "optimizer.safetensors");
    json_t *o = json_pack("{s:i, s:I, s:I, s:f, s:I, s:I, s:{s:f}, s:o}", "format", 2, "step",
                          (json_int_t)step, "seed", (json_int_t)77, "loss", 1.25, "updates",
                          (json_int_t)step, "skipped", (json_int_t)0, "args", "lr", 0.001, "files",
                          files);
    mt_test_ckpt_store_state(dir, o);
}

static void test_format2_full_loads(void **state) {
    model m;
    model_init(&m, "qwen2_bias_tied", MT_STATE_FULL, 40);
    char *out = mt_test_dir_sub("format2");
    char dir[4200], path[4200];
    write_format2(&m, out, 6, dir, sizeof dir);
    mt_ckpt_state st;
    load_ok(&m, dir, &st);
    assert_true(mt_test_state_equal(m.src, m.dst, &m.t));
    assert_int_equal(st.step, 6);
    assert_true(st.seed == 77 && st.loss == 1.25);
    assert_int_equal(st.state, MT_STATE_FULL);
    assert_string_equal(st.args_json, "{\"lr\":0.001}");
    mt_ckpt_state_free(&st);
    mt_test_state_poison(m.dst, SENTINEL);
    assert_int_equal(mt_checkpoint_resume(out, &m.t, &m.dst->io, &st, path, sizeof path), MT_OK);
    assert_string_equal(path, dir);
    assert_true(mt_test_state_equal(m.src, m.dst, &m.t));
    mt_ckpt_state_free(&st);

    /* it holds full state: a compact run is refused by name */
    model c;
    model_init(&c, "qwen2_bias_tied", MT_STATE_COMPACT, 41);
    char want[8800];
    snprintf(want, sizeof want, "%s: holds full optimizer state, this run uses --state compact: "
             "resume with --state full", dir);
    expect_load_error(&c, c.dst, dir, want);
    model_free(&c);
    mt_test_rmtree(out);
    free(out);
    model_free(&m);
}

/* ---- integrity of the 8-bit parts ---- */

/* U8 codes have no finiteness to check: a flipped code is the checksum's to catch. */
static void test_u8_flip_checksum(void **state) {
    for (int f = MT_STATE_COMPACT; f <= MT_STATE_TIGHT; f++) {
        model m;
        model_init(&m, "llama_gqa", (mt_state_format)f, 50);
        char *out = mt_test_dir_sub("u8_flip");
        char dir[4200], tensor[256], want[4400];
        save_ok(&m, out, 2);
        ckpt_dir(dir, sizeof dir, out, 2);
        const char *parts[] = {"exp_avg", "exp_avg_sq"};
        for (int k = 0; k < 2; k++) {
            snprintf(tensor, sizeof tensor, "%s.model.layers.1.mlp.up_proj.weight", parts[k]);
            long at = data_offset(dir, "optimizer.safetensors", tensor) + 37;
            xor_at(dir, "optimizer.safetensors", at);
            snprintf(want, sizeof want, "%s/optimizer.safetensors: checksum mismatch", dir);
            expect_load_error(&m, m.dst, dir, want);
            xor_at(dir, "optimizer.safetensors", at); /* repaired: it loads */
            mt_ckpt_state st;
            mt_test_state_poison(m.dst, SENTINEL);
            load_ok(&m, dir, &st);
            assert_true(mt_test_state_equal(m.src, m.dst, &m.t));
            mt_ckpt_state_free(&st);
        }
        mt_test_rmtree(out);
        free(out);
        model_free(&m);
    }
}

static void test_scale_nonfinite(void **state) {
    model m;
    model_init(&m, "llama_gqa", MT_STATE_COMPACT, 60);
    char *out = mt_test_dir_sub("scale_nan");
    char dir[4200], ck[4200], want[512];
    snprintf(ck, sizeof ck, "%s/checkpoints", out);
    save_ok(&m, out, 1);
    /* at save: an inf in a block scale of tensor 3; nothing written, nothing pruned */
    const mt_param *p = &m.t.params[3];
    mt_optim_arenas a = mt_optim_state_arenas(m.src->s);
    float *scale = &a.ms[p->offset / 256 + (p->numel - 1) / 256], keep = *scale;
    *scale = INFINITY;
    mt_ckpt_state st = {2, 11, 0.5, 2, 0, NULL};
    assert_int_equal(mt_checkpoint_save(out, &m.t, &m.src->io, &st, NULL, NULL, 1), MT_ERR);
    assert_msg_has("exp_avg_scale");
    assert_msg_has(p->name);
    assert_msg_has("NaN or inf");
    *scale = keep;
    ckpt_dir(dir, sizeof dir, out, 2);
    struct stat sb;
    assert_true(stat(dir, &sb) != 0);
    ckpt_dir(dir, sizeof dir, out, 1);
    assert_int_equal(stat(dir, &sb), 0); /* keep_last 1 did not prune it */
    /* at load: a NaN written into a scale of the file (its checksum recorded) */
    char tensor[256];
    snprintf(tensor, sizeof tensor, "exp_avg_sq_scale.%s", p->name);
    float nan = NAN;
    write_at(dir, "optimizer.safetensors", data_offset(dir, "optimizer.safetensors", tensor),
             &nan, sizeof nan);
    mt_test_ckpt_restamp(dir, "optimizer.safetensors");
    snprintf(want, sizeof want, "tensor %s holds NaN or inf", tensor);
    expect_load_error(&m, m.dst, dir, want);
    mt_test_rmtree(out);
    free(out);
    model_free(&m);
}

/* Finite but absurd block scales, each written into the file with its checksum re-recorded:
 * negative, or past the moment's bound (1e8 for exp_avg's, 1e16 for exp_avg_sq's). The load names
 * the tensor and the value, and leaves the state untouched; the bounds themselves still load.
 * (Before: all of them loaded.) */
static void test_scale_out_of_range(void **state) {
    model m;
    model_init(&m, "llama_gqa", MT_STATE_COMPACT, 61);
    char *out = mt_test_dir_sub("scale_range");
    char dir[4200], want[512], tensor[256];
    save_ok(&m, out, 1);
    ckpt_dir(dir, sizeof dir, out, 1);
    const mt_param *p = &m.t.params[3];
    struct {
        const char *part;
        float value;
        int ok;
    } cases[] = {{"exp_avg_scale", -0.5f, 0}, {"exp_avg_scale", 1e9f, 0},   {"exp_avg_sq_scale", -1e-20f, 0},
                 {"exp_avg_sq_scale", 1e17f, 0}, {"exp_avg_scale", 1e8f, 1}, {"exp_avg_sq_scale", 1e16f, 1},
                 {"exp_avg_scale", -0.0f, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        snprintf(tensor, sizeof tensor, "%s.%s", cases[c].part, p->name);
        long at = data_offset(dir, "optimizer.safetensors", tensor);
        float keep;
        char file[4400];
        snprintf(file, sizeof file, "%s/optimizer.safetensors", dir);
        FILE *f = fopen(file, "rb");
        assert_non_null(f);
        assert_int_equal(fseek(f, at, SEEK_SET), 0);
        assert_int_equal(fread(&keep, 4, 1, f), 1);
        fclose(f);
        write_at(dir, "optimizer.safetensors", at, &cases[c].value, sizeof(float));
        mt_test_ckpt_restamp(dir, "optimizer.safetensors");
        if (cases[c].ok) {
            mt_ckpt_state st;
            load_ok(&m, dir, &st);
            mt_ckpt_state_free(&st);
        } else {
            snprintf(want, sizeof want, "optimizer.safetensors: tensor %s: element 0 is %g, outside ", tensor,
                     (double)cases[c].value);
            expect_load_error(&m, m.dst, dir, want);
        }
        write_at(dir, "optimizer.safetensors", at, &keep, sizeof keep);
        mt_test_ckpt_restamp(dir, "optimizer.safetensors");
    }
    mt_ckpt_state st;
    load_ok(&m, dir, &st);
    assert_true(mt_test_state_equal(m.src, m.dst, &m.t));
    mt_ckpt_state_free(&st);
    mt_test_rmtree(out);
    free(out);
    model_free(&m);
}

/* ---- tight's seed ---- */

static void test_tight_sr_seed(void **state) {
    model m;
    model_init(&m, "llama_gqa", MT_STATE_TIGHT, 70);
    char *out = mt_test_dir_sub("sr_seed");
    char dir[4200];
    save_ok(&m, out, 9);
    ckpt_dir(dir, sizeof dir, out, 9);
    const char *bad[] = {NULL, "12x", "", "18446744073709551616", "-1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *o = mt_test_ckpt_load_state(dir);
        if (bad[i]) json_object_set_new(o, "sr_seed", json_string(bad[i]));
        else json_object_del(o, "sr_seed");
        mt_test_ckpt_store_state(dir, o);
        expect_load_error(&m, m.dst, dir, "\"sr_seed\"");
    }
    /* the largest u64 comes back exactly, to the state (set_sr_seed) and to the caller */
    json_t *o = mt_test_ckpt_load_state(dir);
    json_object_set_new(o, "sr_seed", json_string("18446744073709551615"));
    mt_test_ckpt_store_state(dir, o);
    mt_ckpt_state st;
    load_ok(&m, dir, &st);
    assert_true(st.sr_seed == UINT64_MAX && m.dst->sr_seed == UINT64_MAX);
    assert_true(mt_test_state_equal(m.src, m.dst, &m.t));
    mt_ckpt_state_free(&st);

    /* what the seed is for: a state resumed with it rounds the next update as the saved one
     * does (a state of another seed would not: checked, so the comparison can fail) */
    save_ok(&m, out, 10);
    ckpt_dir(dir, sizeof dir, out, 10);
    load_ok(&m, dir, &st); /* m.dst->sr_seed: the saved seed */
    mt_ckpt_state_free(&st);
    mt_test_state *resumed = mt_test_state_create(MT_STATE_TIGHT, &m.t, m.dst->sr_seed);
    mt_test_state *other = mt_test_state_create(MT_STATE_TIGHT, &m.t, m.dst->sr_seed + 1);
    assert_int_equal(mt_checkpoint_load(dir, &m.t, &resumed->io, &st), MT_OK);
    mt_ckpt_state_free(&st);
    assert_int_equal(mt_checkpoint_load(dir, &m.t, &other->io, &st), MT_OK);
    mt_ckpt_state_free(&st);
    size_t n = (size_t)m.t.total;
    float *grad = malloc(sizeof(float) * n);
    mt_test_rng r;
    mt_test_rng_seed(&r, 5);
    mt_test_fill_normal(&r, grad, n, 0.1f);
    mt_optim_step a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .step = 11,
                       .grad_scale = 1.0f};
    mt_test_state *all[] = {m.src, resumed, other};
    for (int k = 0; k < 3; k++)
        assert_int_equal(mt_optim_state_update(all[k]->s, &a, 0, n, grad, MT_F32, 0), MT_OK);
    assert_true(mt_test_state_equal(m.src, resumed, &m.t));
    assert_false(mt_test_state_equal(m.src, other, &m.t));
    free(grad);
    mt_test_state_free(resumed);
    mt_test_state_free(other);
    mt_test_rmtree(out);
    free(out);
    model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_full),
        cmocka_unit_test(test_roundtrip_compact),
        cmocka_unit_test(test_roundtrip_tight),
        cmocka_unit_test(test_other_format_refused),
        cmocka_unit_test(test_parts_of_another_format),
        cmocka_unit_test(test_format2_full_loads),
        cmocka_unit_test(test_u8_flip_checksum),
        cmocka_unit_test(test_scale_nonfinite),
        cmocka_unit_test(test_scale_out_of_range),
        cmocka_unit_test(test_tight_sr_seed),
    };
    return cmocka_run_group_tests(tests, mt_test_dir_setup, mt_test_dir_teardown);
}
