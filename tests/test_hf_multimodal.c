/* Published Qwen3.5 checkpoints in and out (io/hf_layout.h): the multimodal fixture
 * qwen3_5_vl_mtp loads its language model from "model.language_model.*" and carries the vision
 * tower and mtp.* tensors; every save (mt_model_save, a training checkpoint) writes them back byte
 * for byte with the original config.json; a text-only model still refuses an unknown tensor; fused
 * experts (gate_up_proj / down_proj) load to the same arena as per-expert ones and are saved fused. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/hf_layout.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"
#include "util/state_io.h"
#include "util/testutil.h"

/* A model as the host opens one: config, table, source (t.hf), fp32 arena. */
typedef struct {
    mt_param_table t;
    mt_hf_source *src;
    float *w;
} model;

static void model_open(model *m, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mt_config cfg;
    if (mt_config_load(&cfg, path) != MT_OK) fail_msg("%s", mt_error_message());
    mt_param_table_init(&m->t, &cfg);
    if (mt_hf_source_open(&m->src, &m->t, dir) != MT_OK) fail_msg("%s", mt_error_message());
    m->t.hf = m->src;
    m->w = mt_aligned_alloc(sizeof(float) * (size_t)m->t.total);
    if (mt_model_load(&m->t, m->w, dir) != MT_OK) fail_msg("%s", mt_error_message());
}

static void model_close(model *m) {
    mt_hf_source_free(m->src);
    mt_param_table_free(&m->t);
    free(m->w);
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("%s: cannot open", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = mt_malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void assert_same_file(const char *a, const char *b) {
    size_t na, nb;
    char *x = read_all(a, &na), *y = read_all(b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(x, y, na);
    free(x);
    free(y);
}

/* A and B hold tensor NAME with the same dtype, shape and bytes. */
static void assert_same_tensor(const mt_safetensors *a, const mt_safetensors *b, const char *name) {
    const mt_st_tensor *x = mt_safetensors_find(a, name), *y = mt_safetensors_find(b, name);
    if (!x || !y) fail_msg("tensor %s: %s", name, x ? "not in the copy" : "not in the source");
    assert_int_equal(x->dtype, y->dtype);
    assert_int_equal(x->ndim, y->ndim);
    for (int d = 0; d < x->ndim; d++) assert_int_equal(x->shape[d], y->shape[d]);
    assert_int_equal(x->nbytes, y->nbytes);
    if (memcmp(x->data, y->data, x->nbytes) != 0) fail_msg("tensor %s: bytes differ", name);
}

/* names.json's group (a JSON array of names), malloc'd; count into *n. */
static json_t *names_group(const char *fixture, const char *group) {
    char path[4200];
    snprintf(path, sizeof path, "%s/names.json", fixture);
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    json_t *g = json_incref(json_object_get(root, group));
    json_decref(root);
    assert_true(json_is_array(g));
    return g;
}

/* Every carried tensor, visual and mtp ones and nothing else; the language model as names.json says. */
static void test_vl_load(void **state) {
    (void)state;
    char *fx = mt_fixture_path("qwen3_5_vl_mtp");
    model m;
    model_open(&m, fx);
    assert_true(m.t.cfg.nested);
    json_t *vis = names_group(fx, "visual"), *mtp = names_group(fx, "mtp"), *lm = names_group(fx, "language_model");
    assert_int_equal(m.src->n_visual, (int)json_array_size(vis));
    assert_int_equal(m.src->n_mtp, (int)json_array_size(mtp));
    assert_int_equal(m.src->n_carried, (int)(json_array_size(vis) + json_array_size(mtp)));
    assert_int_equal(m.t.n_params, (int)json_array_size(lm));
    for (int i = 0; i < m.src->n_carried; i++) {
        const char *c = m.src->carried[i].name;
        int found = 0;
        for (size_t k = 0; k < json_array_size(vis); k++) found |= strcmp(c, json_string_value(json_array_get(vis, k))) == 0;
        for (size_t k = 0; k < json_array_size(mtp); k++) found |= strcmp(c, json_string_value(json_array_get(mtp, k))) == 0;
        if (!found) fail_msg("carried %s is neither visual nor mtp", c);
    }
    /* the language model's weights are the fixture's, under the prefixed names */
    mt_safetensors *st;
    if (mt_safetensors_open_dir(&st, fx) != MT_OK) fail_msg("%s", mt_error_message());
    char name[MT_HF_NAME];
    for (int i = 0; i < m.t.n_params; i++) {
        const mt_param *p = &m.t.params[i];
        mt_hf_name(&m.t, p, name, sizeof name);
        int listed = 0;
        for (size_t k = 0; k < json_array_size(lm); k++) listed |= strcmp(name, json_string_value(json_array_get(lm, k))) == 0;
        if (!listed) fail_msg("%s is not in names.json's language_model", name);
        const mt_st_tensor *x = mt_safetensors_find(st, name);
        assert_non_null(x);
        assert_int_equal(x->dtype, MT_F32);
        assert_memory_equal(m.w + p->offset, x->data, x->nbytes);
    }
    mt_safetensors_close(st);
    json_decref(vis);
    json_decref(mtp);
    json_decref(lm);
    model_close(&m);
    free(fx);
}

/* OUT holds the fixture again: config.json identical, every source tensor byte-identical (fp32
 * language model included), and it loads to the same arena. */
static void assert_copy_of_fixture(const model *m, const char *fx, const char *out) {
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/config.json", fx);
    snprintf(b, sizeof b, "%s/config.json", out);
    assert_same_file(a, b);
    mt_safetensors *src, *dst;
    if (mt_safetensors_open_dir(&src, fx) != MT_OK) fail_msg("%s", mt_error_message());
    if (mt_safetensors_open_dir(&dst, out) != MT_OK) fail_msg("%s", mt_error_message());
    assert_int_equal(mt_safetensors_count(dst), mt_safetensors_count(src));
    for (int i = 0; i < mt_safetensors_count(src); i++)
        assert_same_tensor(src, dst, mt_safetensors_at(src, i)->name);
    mt_safetensors_close(src);
    mt_safetensors_close(dst);
    float *back = mt_aligned_alloc(sizeof(float) * (size_t)m->t.total);
    if (mt_model_load(&m->t, back, out) != MT_OK) fail_msg("%s", mt_error_message());
    assert_memory_equal(back, m->w, sizeof(float) * (size_t)m->t.total);
    free(back);
}

static void test_vl_save(void **state) {
    (void)state;
    char *fx = mt_fixture_path("qwen3_5_vl_mtp");
    model m;
    model_open(&m, fx);
    char out[4200];
    snprintf(out, sizeof out, "%s/vl_f32", mt_test_dir);
    if (mt_model_save(&m.t, m.w, out, MT_F32, 0) != MT_OK) fail_msg("%s", mt_error_message());
    assert_copy_of_fixture(&m, fx, out);
    /* sharded: the carried tensors go into the shards and the index like the others */
    snprintf(out, sizeof out, "%s/vl_shards", mt_test_dir);
    if (mt_model_save(&m.t, m.w, out, MT_F32, 40000) != MT_OK) fail_msg("%s", mt_error_message());
    assert_true(mt_test_count_prefix(out, "model-0000") > 2);
    assert_copy_of_fixture(&m, fx, out);
    /* bf16: the language model rounded, the carried tensors still as they were */
    snprintf(out, sizeof out, "%s/vl_bf16", mt_test_dir);
    if (mt_model_save(&m.t, m.w, out, MT_BF16, 0) != MT_OK) fail_msg("%s", mt_error_message());
    mt_safetensors *src, *dst;
    if (mt_safetensors_open_dir(&src, fx) != MT_OK || mt_safetensors_open_dir(&dst, out) != MT_OK)
        fail_msg("%s", mt_error_message());
    for (int i = 0; i < m.src->n_carried; i++) assert_same_tensor(src, dst, m.src->carried[i].name);
    assert_int_equal(mt_safetensors_find(dst, "model.language_model.norm.weight")->dtype, MT_BF16);
    mt_safetensors_close(src);
    mt_safetensors_close(dst);
    model_close(&m);
    free(fx);
}

/* A training checkpoint of the multimodal model is a model directory of it too, and resumes. */
static void test_vl_checkpoint(void **state) {
    (void)state;
    char *fx = mt_fixture_path("qwen3_5_vl_mtp");
    model m;
    model_open(&m, fx);
    mt_test_state *a = mt_test_state_create(MT_STATE_FULL, &m.t, 1), *b = mt_test_state_create(MT_STATE_FULL, &m.t, 1);
    for (int i = 0; i < m.t.n_params; i++) /* the fixture's weights as the master */
        assert_int_equal(a->io.set_weights(a->io.ctx, &m.t.params[i], m.w + m.t.params[i].offset), MT_OK);
    char out[4200], dir[4300];
    snprintf(out, sizeof out, "%s/run", mt_test_dir);
    mt_ckpt_state st = {.step = 3, .seed = 1, .loss = 1.0, .updates = 3};
    if (mt_checkpoint_save(out, &m.t, &a->io, &st, NULL, NULL, 0) != MT_OK) fail_msg("%s", mt_error_message());
    snprintf(dir, sizeof dir, "%s/checkpoints/step_00000003", out);
    assert_copy_of_fixture(&m, fx, dir);
    mt_ckpt_state got = {0};
    if (mt_checkpoint_load(dir, &m.t, &b->io, &got) != MT_OK) fail_msg("%s", mt_error_message());
    assert_true(mt_test_state_equal(a, b, &m.t));
    mt_ckpt_state_free(&got);
    mt_test_state_free(a);
    mt_test_state_free(b);
    model_close(&m);
    free(fx);
}

/* Writes DIR/model.safetensors: every tensor of SRC (renamed/fused by `edit`, which may add
 * tensors of its own into w) and copies SRC's config.json. */
typedef int (*edit_fn)(const mt_safetensors *src, mt_st_write_tensor *w, int n, void *data);

static void write_variant(const char *fx, const char *dir, edit_fn edit, void *data) {
    mt_safetensors *src;
    if (mt_safetensors_open_dir(&src, fx) != MT_OK) fail_msg("%s", mt_error_message());
    int n = mt_safetensors_count(src);
    mt_st_write_tensor *w = mt_calloc((size_t)n + 8, sizeof *w);
    for (int i = 0; i < n; i++) {
        const mt_st_tensor *x = mt_safetensors_at(src, i);
        w[i] = (mt_st_write_tensor){.name = x->name, .dtype = x->dtype, .ndim = x->ndim, .data = x->data};
        for (int d = 0; d < x->ndim; d++) w[i].shape[d] = x->shape[d];
    }
    n = edit(src, w, n, data);
    mt_test_sh("mkdir -p '%s' && cp '%s/config.json' '%s/'", dir, fx, dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (mt_safetensors_write(path, w, n, NULL, 0) != MT_OK) fail_msg("%s", mt_error_message());
    free(w);
    mt_safetensors_close(src);
}

static float extra_data[4] = {1, 2, 3, 4};

static int add_extra(const mt_safetensors *src, mt_st_write_tensor *w, int n, void *data) {
    (void)src;
    w[n] = (mt_st_write_tensor){.name = data, .dtype = MT_F32, .ndim = 1, .shape = {4}, .data = extra_data};
    return n + 1;
}

static void expect_refused(const char *dir, const char *tensor) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mt_config cfg;
    if (mt_config_load(&cfg, path) != MT_OK) fail_msg("%s", mt_error_message());
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    float *w = mt_aligned_alloc(sizeof(float) * (size_t)t.total);
    assert_int_equal(mt_model_load(&t, w, dir), MT_ERR);
    if (!strstr(mt_error_message(), tensor)) fail_msg("'%s' does not name %s", mt_error_message(), tensor);
    mt_hf_source *s = NULL;
    assert_int_equal(mt_hf_source_open(&s, &t, dir), MT_ERR);
    assert_null(s);
    free(w);
    mt_param_table_free(&t);
}

/* Only a multimodal checkpoint carries: a text-only one refuses mtp.* by name, and a multimodal
 * one refuses an unknown tensor inside its language model. */
static void test_unknown_refused(void **state) {
    (void)state;
    char *dense = mt_fixture_path("qwen3_5_dense"), *vl = mt_fixture_path("qwen3_5_vl_mtp");
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/text_extra", mt_test_dir);
    write_variant(dense, dir, add_extra, "mtp.fc.weight");
    expect_refused(dir, "mtp.fc.weight");
    snprintf(dir, sizeof dir, "%s/vl_extra", mt_test_dir);
    write_variant(vl, dir, add_extra, "model.language_model.layers.0.mlp.extra.weight");
    expect_refused(dir, "model.language_model.layers.0.mlp.extra.weight");
    free(dense);
    free(vl);
}

/* ---- fused experts ---- */

typedef struct {
    int L, E;
    int64_t Fe, C;
    unsigned char *buf[64]; /* the fused tensors' bytes */
    char names[64][96];
    int n_buf;
    int keep_per_expert;     /* 1: leave the per-expert tensors too (a checkpoint with both) */
} fuse_ctx;

/* Drops every "model.layers.{l}.mlp.experts.{e}.*" tensor and adds each layer's gate_up_proj
 * (E, 2 Fe, C) and down_proj (E, C, Fe) built from them. */
static int fuse(const mt_safetensors *src, mt_st_write_tensor *w, int n, void *data) {
    fuse_ctx *c = data;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (c->keep_per_expert || !strstr(w[i].name, "mlp.experts.")) w[k++] = w[i];
    char name[128];
    size_t mat = (size_t)(c->Fe * c->C) * sizeof(float);
    for (int l = 0; l < c->L; l++) {
        unsigned char *gu = mt_malloc(2 * mat * (size_t)c->E), *dn = mt_malloc(mat * (size_t)c->E);
        for (int e = 0; e < c->E; e++) {
            static const char *const part[3] = {"gate_proj", "up_proj", "down_proj"};
            for (int j = 0; j < 3; j++) {
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, part[j]);
                const mt_st_tensor *x = mt_safetensors_find(src, name);
                assert_non_null(x);
                assert_int_equal(x->nbytes, mat);
                memcpy(j == 2 ? dn + (size_t)e * mat : gu + (2 * (size_t)e + (size_t)j) * mat, x->data, mat);
            }
        }
        for (int j = 0; j < 2; j++) {
            snprintf(c->names[c->n_buf], sizeof c->names[0], "model.layers.%d.mlp.experts.%s", l,
                     j ? "down_proj" : "gate_up_proj");
            c->buf[c->n_buf] = j ? dn : gu;
            w[k] = (mt_st_write_tensor){.name = c->names[c->n_buf], .dtype = MT_F32, .ndim = 3,
                                        .shape = {c->E, j ? c->C : 2 * c->Fe, j ? c->Fe : c->C}, .data = c->buf[c->n_buf]};
            k++, c->n_buf++;
        }
    }
    return k;
}

static void fuse_free(fuse_ctx *c) {
    for (int i = 0; i < c->n_buf; i++) free(c->buf[i]);
}

static void test_fused_experts(void **state) {
    (void)state;
    char *fx = mt_fixture_path("qwen3_5_moe");
    model per;
    model_open(&per, fx);
    assert_false(per.src->fused_experts);
    fuse_ctx fc = {.L = per.t.cfg.L, .E = per.t.cfg.n_experts, .Fe = per.t.cfg.moe_F, .C = per.t.cfg.C};
    char dir[4200], out[4200];
    snprintf(dir, sizeof dir, "%s/moe_fused", mt_test_dir);
    write_variant(fx, dir, fuse, &fc);
    model fused;
    model_open(&fused, dir);
    assert_true(fused.src->fused_experts);
    assert_int_equal(fused.t.total, per.t.total);
    assert_memory_equal(fused.w, per.w, sizeof(float) * (size_t)per.t.total); /* the same arena */
    /* saved as the source had them: fused, the same tensors byte for byte */
    snprintf(out, sizeof out, "%s/moe_fused_saved", mt_test_dir);
    if (mt_model_save(&fused.t, fused.w, out, MT_F32, 0) != MT_OK) fail_msg("%s", mt_error_message());
    mt_safetensors *a, *b;
    if (mt_safetensors_open_dir(&a, dir) != MT_OK || mt_safetensors_open_dir(&b, out) != MT_OK)
        fail_msg("%s", mt_error_message());
    assert_int_equal(mt_safetensors_count(b), mt_safetensors_count(a));
    for (int i = 0; i < mt_safetensors_count(a); i++) assert_same_tensor(a, b, mt_safetensors_at(a, i)->name);
    mt_safetensors_close(a);
    mt_safetensors_close(b);
    /* a per-expert source saves per expert */
    snprintf(out, sizeof out, "%s/moe_per_saved", mt_test_dir);
    if (mt_model_save(&per.t, per.w, out, MT_F32, 0) != MT_OK) fail_msg("%s", mt_error_message());
    if (mt_safetensors_open_dir(&b, out) != MT_OK) fail_msg("%s", mt_error_message());
    assert_non_null(mt_safetensors_find(b, "model.layers.0.mlp.experts.1.up_proj.weight"));
    assert_null(mt_safetensors_find(b, "model.layers.0.mlp.experts.gate_up_proj"));
    mt_safetensors_close(b);
    /* both layouts at once: ambiguous, refused */
    fuse_ctx both = fc;
    both.n_buf = 0;
    both.keep_per_expert = 1;
    snprintf(dir, sizeof dir, "%s/moe_both", mt_test_dir);
    write_variant(fx, dir, fuse, &both);
    float *w = mt_aligned_alloc(sizeof(float) * (size_t)per.t.total);
    assert_int_equal(mt_model_load(&per.t, w, dir), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "experts twice"));
    free(w);
    fuse_free(&both);
    fuse_free(&fc);
    model_close(&fused);
    model_close(&per);
    free(fx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vl_load),
        cmocka_unit_test(test_vl_save),
        cmocka_unit_test(test_vl_checkpoint),
        cmocka_unit_test(test_unknown_refused),
        cmocka_unit_test(test_fused_experts),
    };
    return cmocka_run_group_tests(tests, mt_test_dir_setup, mt_test_dir_teardown);
}
