/* model_io: save -> load round trips (f32 bitwise, bf16 rounded, sharded) on tiny llama, qwen2
 * (qkv bias, tied) and qwen3 (qk norm) models, and load errors that must leave the arena untouched.
 * Set MT_TEST_SAVE_DIR to also keep saved copies there for a manual check with Python. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "model/params.h"
#include "util/testutil.h"

#define SENTINEL 0x7f /* every byte of an untouched arena */

static mt_config tiny_config(mt_arch arch) {
    static const char *const types[] = {"llama", "mistral", "qwen2", "qwen3"};
    mt_config c;
    memset(&c, 0, sizeof c);
    c.arch = arch;
    snprintf(c.model_type, sizeof c.model_type, "%s", types[arch]);
    c.C = 64, c.F = 128, c.L = 2, c.H = 4, c.G = 2, c.D = 16, c.V = 100;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 10000.0;
    c.max_position_embeddings = 256;
    c.initializer_range = 0.02f;
    c.bos_token_id = c.eos_token_id = -1;
    if (arch == MT_ARCH_QWEN2) c.qkv_bias = 1, c.tie_word_embeddings = 1;
    if (arch == MT_ARCH_QWEN3) c.qk_norm = 1;
    return c;
}

typedef struct {
    mt_param_table t;
    float *w;   /* the saved weights */
    float *got; /* the load destination */
    size_t bytes;
} model;

static void model_init(model *m, mt_arch arch, uint64_t seed) {
    mt_config cfg = tiny_config(arch);
    mt_param_table_init(&m->t, &cfg);
    m->bytes = sizeof(float) * (size_t)m->t.total;
    m->w = mt_aligned_alloc(m->bytes);
    m->got = mt_aligned_alloc(m->bytes);
    mt_param_init(&m->t, m->w, 0.02f, seed);
    /* norms init to exactly 1; make them distinct so a mix-up would show */
    for (int i = 0; i < m->t.n_params; i++)
        if (m->t.params[i].ndim == 1)
            for (int64_t j = 0; j < m->t.params[i].numel; j++)
                m->w[m->t.params[i].offset + j] = 1.0f + 0.001f * (float)(j + i);
    memset(m->got, SENTINEL, m->bytes);
}

static void model_free(model *m) {
    mt_param_table_free(&m->t);
    free(m->w);
    free(m->got);
}

static int arena_untouched(const model *m) {
    const unsigned char *b = (const unsigned char *)m->got;
    for (size_t i = 0; i < m->bytes; i++)
        if (b[i] != SENTINEL) return 0;
    return 1;
}

static int file_exists(const char *dir, const char *name) {
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void save_ok(const model *m, const char *dir, mt_dtype dt, int64_t max_shard) {
    if (mt_model_save(&m->t, m->w, dir, dt, max_shard) != MT_OK) fail_msg("%s", mt_error_message());
}

static void load_ok(model *m, const char *dir) {
    if (mt_model_load(&m->t, m->got, dir) != MT_OK) fail_msg("%s", mt_error_message());
}

/* Keeps a copy for `python -c "from safetensors.torch import load_file; ..."` when asked. */
static void maybe_keep(const model *m, const char *name, mt_dtype dt, int64_t max_shard) {
    const char *keep = getenv("MT_TEST_SAVE_DIR");
    if (!keep || !*keep) return;
    char d[2048];
    snprintf(d, sizeof d, "%s/%s", keep, name);
    save_ok(m, d, dt, max_shard);
}

/* ---- round trips ---- */

static void roundtrip_f32(mt_arch arch, const char *name) {
    model m;
    model_init(&m, arch, 42 + arch);
    char *d = mt_test_dir_sub(name);
    save_ok(&m, d, MT_F32, 0);
    assert_true(file_exists(d, "config.json"));
    assert_true(file_exists(d, "model.safetensors"));
    assert_false(file_exists(d, "model.safetensors.index.json"));
    assert_false(file_exists(d, "model.safetensors.tmp"));
    load_ok(&m, d);
    assert_memory_equal(m.got, m.w, m.bytes); /* bitwise, padding (zero) included */

    mt_config back;
    char cfg[2048];
    snprintf(cfg, sizeof cfg, "%s/config.json", d);
    if (mt_config_load(&back, cfg) != MT_OK) fail_msg("%s", mt_error_message());
    assert_int_equal(back.arch, arch);
    assert_int_equal(back.tie_word_embeddings, m.t.cfg.tie_word_embeddings);

    /* tensors in table order, metadata format=pt */
    mt_safetensors *st;
    assert_int_equal(mt_safetensors_open_dir(&st, d), MT_OK);
    assert_int_equal(mt_safetensors_count(st), m.t.n_params);
    for (int i = 0; i < m.t.n_params; i++)
        assert_string_equal(mt_safetensors_at(st, i)->name, m.t.params[i].name);
    assert_string_equal(mt_safetensors_metadata(st, "format"), "pt");
    mt_safetensors_close(st);
    maybe_keep(&m, name, MT_F32, 0);
    free(d);
    model_free(&m);
}

static void test_roundtrip_f32_llama(void **state) { roundtrip_f32(MT_ARCH_LLAMA, "f32_llama"); }
static void test_roundtrip_f32_qwen2(void **state) { roundtrip_f32(MT_ARCH_QWEN2, "f32_qwen2"); }
static void test_roundtrip_f32_qwen3(void **state) { roundtrip_f32(MT_ARCH_QWEN3, "f32_qwen3"); }

static void test_roundtrip_bf16(void **state) {
    model m;
    model_init(&m, MT_ARCH_QWEN3, 7);
    char *d = mt_test_dir_sub("bf16");
    save_ok(&m, d, MT_BF16, 0);
    load_ok(&m, d);
    float *want = mt_aligned_alloc(m.bytes);
    for (int64_t i = 0; i < m.t.total; i++) want[i] = mt_bf16_to_f32(mt_f32_to_bf16(m.w[i]));
    assert_memory_equal(m.got, want, m.bytes);
    mt_safetensors *st;
    assert_int_equal(mt_safetensors_open_dir(&st, d), MT_OK);
    assert_int_equal(mt_safetensors_at(st, 0)->dtype, MT_BF16);
    mt_safetensors_close(st);
    maybe_keep(&m, "bf16_sharded", MT_BF16, 30000);
    maybe_keep(&m, "bf16_source_f32", MT_F32, 0);
    free(want);
    free(d);
    model_free(&m);
}

/* Parses index.json and checks it against the table and the files. Returns the shard count. */
static int check_index(const model *m, const char *dir, size_t esize) {
    char p[2048];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_error_t err;
    json_t *root = json_load_file(p, 0, &err);
    if (!root) fail_msg("%s: %s", p, err.text);
    json_t *total = json_object_get(json_object_get(root, "metadata"), "total_size");
    assert_true(json_is_integer(total));
    assert_int_equal(json_integer_value(total), m->t.n_real * (int64_t)esize);
    json_t *wmap = json_object_get(root, "weight_map");
    assert_int_equal(json_object_size(wmap), m->t.n_params);
    int of = 0, prev = 0;
    for (int i = 0; i < m->t.n_params; i++) {
        const char *shard = json_string_value(json_object_get(wmap, m->t.params[i].name));
        assert_non_null(shard);
        int k, n, len = 0;
        assert_int_equal(sscanf(shard, "model-%5d-of-%5d.safetensors%n", &k, &n, &len), 2);
        assert_int_equal((size_t)len, strlen(shard));
        assert_true(k >= prev && k <= n); /* table order across shards */
        assert_true(file_exists(dir, shard));
        prev = k;
        of = n;
    }
    json_decref(root);
    return of;
}

static void test_sharded(void **state) {
    model m;
    model_init(&m, MT_ARCH_LLAMA, 3);
    char *d = mt_test_dir_sub("sharded");
    const int64_t max = 40000; /* bytes: several shards; the embedding (25600 B) fits alone */
    save_ok(&m, d, MT_F32, max);
    int k = check_index(&m, d, 4);
    assert_true(k > 2);
    assert_false(file_exists(d, "model.safetensors"));
    char shard[64];
    for (int i = 1; i <= k; i++) {
        snprintf(shard, sizeof shard, "model-%05d-of-%05d.safetensors", i, k);
        assert_true(file_exists(d, shard));
    }
    load_ok(&m, d);
    assert_memory_equal(m.got, m.w, m.bytes);

    /* a single-file save into the same directory removes the shards and the index */
    save_ok(&m, d, MT_F32, 0);
    assert_false(file_exists(d, "model.safetensors.index.json"));
    assert_false(file_exists(d, "model-00001-of-00002.safetensors"));
    snprintf(shard, sizeof shard, "model-%05d-of-%05d.safetensors", 1, k);
    assert_false(file_exists(d, shard));
    /* and back: bf16 shards, one tensor per shard (limit below any tensor) */
    save_ok(&m, d, MT_BF16, 1);
    assert_int_equal(check_index(&m, d, 2), m.t.n_params);
    assert_false(file_exists(d, "model.safetensors"));
    memset(m.got, SENTINEL, m.bytes);
    load_ok(&m, d);
    for (int64_t i = 0; i < m.t.total; i++)
        assert_true(m.got[i] == mt_bf16_to_f32(mt_f32_to_bf16(m.w[i])));
    free(d);
    model_free(&m);
}

static void test_save_bad_args(void **state) {
    model m;
    model_init(&m, MT_ARCH_LLAMA, 1);
    char *d = mt_test_dir_sub("badargs");
    assert_int_equal(mt_model_save(&m.t, m.w, d, MT_I32, 0), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "I32"));
    assert_int_equal(mt_model_save(&m.t, m.w, d, MT_F32, -5), MT_ERR);
    char f[2048];
    snprintf(f, sizeof f, "%s/file", mt_test_dir);
    FILE *fp = fopen(f, "w");
    fclose(fp);
    strcat(f, "/sub"); /* a directory under a regular file */
    assert_int_equal(mt_model_save(&m.t, m.w, f, MT_F32, 0), MT_ERR);
    free(d);
    model_free(&m);
}

/* ---- load errors: a file crafted from a good save ---- */

typedef struct {
    const char *drop;       /* leave this tensor out */
    const char *transpose;  /* write this 2-D tensor with its dims swapped */
    const char *add;        /* add a 4-element F32 tensor of this name */
    const char *add2;
    mt_dtype as;            /* convert every F32 tensor to this dtype (F32, F16, I32) */
} edit;

static void craft(const char *src, const char *dst, edit e) {
    mt_safetensors *st;
    if (mt_safetensors_open_dir(&st, src) != MT_OK) fail_msg("%s", mt_error_message());
    int n = mt_safetensors_count(st);
    mt_st_write_tensor *w = calloc((size_t)n + 2, sizeof *w);
    void **bufs = calloc((size_t)n, sizeof *bufs);
    int k = 0;
    static const float four[4] = {1, 2, 3, 4};
    for (int i = 0; i < n; i++) {
        const mt_st_tensor *t = mt_safetensors_at(st, i);
        if (e.drop && strcmp(t->name, e.drop) == 0) continue;
        mt_st_write_tensor *o = &w[k++];
        o->name = t->name;
        o->dtype = t->dtype;
        o->ndim = t->ndim;
        memcpy(o->shape, t->shape, sizeof o->shape);
        o->data = t->data;
        if (e.transpose && strcmp(t->name, e.transpose) == 0) {
            o->shape[0] = t->shape[1];
            o->shape[1] = t->shape[0];
        }
        if (e.as == MT_F16) {
            float *f = malloc(sizeof(float) * (size_t)t->numel + 1);
            uint16_t *h = malloc(2 * (size_t)t->numel + 1);
            assert_int_equal(mt_st_tensor_to_f32(t, f), MT_OK);
            mt_convert_f32_to_f16(h, f, (size_t)t->numel);
            free(f);
            bufs[i] = h;
            o->dtype = MT_F16;
            o->data = h;
        } else if (e.as == MT_I32) {
            o->dtype = MT_I32; /* same byte count as F32 */
        }
    }
    if (e.add) w[k++] = (mt_st_write_tensor){e.add, MT_F32, 1, {4}, four};
    if (e.add2) w[k++] = (mt_st_write_tensor){e.add2, MT_F32, 1, {4}, four};
    mkdir(dst, 0755);
    char p[2048];
    snprintf(p, sizeof p, "%s/model.safetensors", dst);
    if (mt_safetensors_write(p, w, k, NULL, 0) != MT_OK) fail_msg("%s", mt_error_message());
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    free(w);
    mt_safetensors_close(st);
}

static void load_fails(model *m, const char *dir, const char *tensor, const char *must_say) {
    memset(m->got, SENTINEL, m->bytes);
    int rc = mt_model_load(&m->t, m->got, dir);
    const char *msg = mt_error_message();
    fprintf(stderr, "  error: %s\n", msg);
    assert_int_equal(rc, MT_ERR);
    assert_non_null(strstr(msg, dir));
    assert_non_null(strstr(msg, tensor));
    if (must_say) assert_non_null(strstr(msg, must_say));
    assert_true(arena_untouched(m));
}

/* One good f32 llama save every load-error test crafts from. */
static char *good_llama(model *m) {
    model_init(m, MT_ARCH_LLAMA, 9);
    char *d = mt_test_dir_sub("good_llama");
    struct stat sb;
    if (stat(d, &sb) != 0) save_ok(m, d, MT_F32, 0);
    return d;
}

static void test_load_missing_tensor(void **state) {
    model m;
    char *src = good_llama(&m), *d = mt_test_dir_sub("missing");
    craft(src, d, (edit){.drop = "model.layers.1.mlp.up_proj.weight", .as = MT_F32});
    load_fails(&m, d, "model.layers.1.mlp.up_proj.weight", "[128, 64]");
    free(d);
    d = mt_test_dir_sub("missing_head");
    craft(src, d, (edit){.drop = "lm_head.weight", .as = MT_F32});
    load_fails(&m, d, "lm_head.weight", "missing");
    assert_non_null(strstr(mt_error_message(), "/missing_head/model.safetensors:"));
    free(d);
    free(src);
    model_free(&m);
}

static void test_load_wrong_shape(void **state) {
    model m;
    char *src = good_llama(&m), *d = mt_test_dir_sub("wrong_shape");
    craft(src, d, (edit){.transpose = "model.layers.0.self_attn.k_proj.weight", .as = MT_F32});
    load_fails(&m, d, "model.layers.0.self_attn.k_proj.weight", "[64, 32] on disk, the model needs [32, 64]");
    free(d);
    free(src);
    model_free(&m);
}

static void test_load_unexpected_tensor(void **state) {
    model m;
    char *src = good_llama(&m), *d = mt_test_dir_sub("extra");
    craft(src, d, (edit){.add = "model.layers.0.self_attn.q_proj.bias", .as = MT_F32});
    load_fails(&m, d, "model.layers.0.self_attn.q_proj.bias", "not part of this llama model");
    free(d);
    d = mt_test_dir_sub("extra_layer");
    craft(src, d, (edit){.add = "model.layers.2.input_layernorm.weight", .as = MT_F32});
    load_fails(&m, d, "model.layers.2.input_layernorm.weight", NULL);
    free(d);
    free(src);
    model_free(&m);
}

static void test_load_wrong_dtype(void **state) {
    model m;
    char *src = good_llama(&m), *d = mt_test_dir_sub("int_weights");
    craft(src, d, (edit){.as = MT_I32});
    load_fails(&m, d, "model.embed_tokens.weight", "I32");
    free(d);
    free(src);
    model_free(&m);
}

static void test_load_bad_file_and_dir(void **state) {
    model m;
    model_init(&m, MT_ARCH_LLAMA, 9);
    char *d = mt_test_dir_sub("nothing_here");
    mkdir(d, 0755);
    load_fails(&m, d, "model.safetensors", NULL);
    char p[2048];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    FILE *f = fopen(p, "wb");
    fwrite("\x08\0\0\0\0\0\0\0{\"x\":1} ", 1, 16, f);
    fclose(f);
    load_fails(&m, d, "tensor x", NULL);
    free(d);
    model_free(&m);
}

/* F16 on disk is accepted; inv_freq and (tied) lm_head.weight are ignored. */
static void test_load_f16_and_ignorable(void **state) {
    model m;
    model_init(&m, MT_ARCH_QWEN2, 5);
    char *src = mt_test_dir_sub("qwen2_src"), *d = mt_test_dir_sub("qwen2_f16_extra");
    save_ok(&m, src, MT_F32, 0);
    craft(src, d, (edit){.add = "lm_head.weight", .add2 = "model.layers.0.self_attn.rotary_emb.inv_freq",
                         .as = MT_F16});
    load_ok(&m, d);
    for (int64_t i = 0; i < m.t.total; i++)
        assert_true(m.got[i] == mt_f16_to_f32(mt_f32_to_f16(m.w[i])));
    free(src);
    free(d);
    model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_f32_llama),
        cmocka_unit_test(test_roundtrip_f32_qwen2),
        cmocka_unit_test(test_roundtrip_f32_qwen3),
        cmocka_unit_test(test_roundtrip_bf16),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_save_bad_args),
        cmocka_unit_test(test_load_missing_tensor),
        cmocka_unit_test(test_load_wrong_shape),
        cmocka_unit_test(test_load_unexpected_tensor),
        cmocka_unit_test(test_load_wrong_dtype),
        cmocka_unit_test(test_load_bad_file_and_dir),
        cmocka_unit_test(test_load_f16_and_ignorable),
    };
    return cmocka_run_group_tests(tests, mt_test_dir_setup, mt_test_dir_teardown);
}
