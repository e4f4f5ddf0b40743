/* A gpt-oss checkpoint with MXFP4 experts, as the published ones (tests/fixtures/gpt_oss_mxfp4,
 * make_gpt_oss_mxfp4_fixture.py: *_blocks + *_scales for mlp.experts.gate_up_proj / down_proj,
 * everything else BF16, config.json's quantization_config quant_method mxfp4), loaded for
 * full-parameter training (io/mxfp4_tensor.h):
 *  - the dequantized experts equal transformers' (from_pretrained with Mxfp4Config(dequantize=True))
 *    bit for bit (the recorded layer-1 down_proj, two 32-value groups a row), by all three readers
 *    (mt_model_load, mt_model_load_tensors, mt_model_load_tensors_where);
 *  - logits and loss of the CPU backend against transformers' float64 run of the same weights:
 *    max|got - ref| / max|ref| <= 1e-5 (fp32; transformers' own fp32 run is 9e-7 from it);
 *  - a save writes the experts plain ([E, in, out], BF16 or F32 as asked) with a config.json
 *    without quantization_config, and loads back to the same bits;
 *  - bad checkpoints refused with one line naming the tensor, the arena untouched: a _blocks
 *    without its _scales and the reverse, blocks or scales of the wrong shape, the wrong dtype,
 *    a plain tensor beside its MXFP4 pair, a pair for a tensor the model lacks, a model whose
 *    expert width is not a multiple of 32;
 *  - the megatrain binary: `info` says the experts are MXFP4 on disk, `train` says they were
 *    dequantized and its checkpoint holds them plain in fp32 without quantization_config,
 *    `convert` writes them in bf16. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "io/hf_layout.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/runner.h"
#include "util/config_check.h"
#include "util/fixture_io.h"
#include "util/testutil.h"

#define LOGITS_TOL 1e-5 /* fp32 against a float64 reference of the same weights */
#define FIXTURE "gpt_oss_mxfp4"
#define OUT_SIZE 65536

static const char *const EXPERTS[] = {
    "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj",
    "model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj",
};

typedef struct {
    char *dir;
    mt_param_table t;
    float *w; /* the fixture loaded by mt_model_load */
} fx_model;

static fx_model fx;

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void load_table(const char *fixture, mt_param_table *t) {
    mt_config c = mt_test_config_load("%s/config.json", fixture);
    mt_param_table_init(t, &c);
}

static int setup(void **state) {
    (void)state;
    fx.dir = mt_fixture_path(FIXTURE);
    load_table(FIXTURE, &fx.t);
    fx.w = mt_aligned_alloc((size_t)fx.t.total * sizeof(float));
    if (mt_model_load(&fx.t, fx.w, fx.dir) != MT_OK) {
        fprintf(stderr, "test_gpt_oss_mxfp4: %s\n", mt_error_message());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    free(fx.w);
    mt_param_table_free(&fx.t);
    free(fx.dir);
    return 0;
}

static mt_safetensors *open_reference(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/reference.safetensors", fx.dir);
    mt_safetensors *ref;
    if (mt_safetensors_open_file(&ref, path) != MT_OK) fail_msg("%s", mt_error_message());
    return ref;
}

/* The shape the table expects, and the checkpoint's bf16 config: the experts the only MXFP4. */
static void test_fixture_shape(void **state) {
    (void)state;
    const mt_config *c = &fx.t.cfg;
    assert_int_equal(c->arch, MT_ARCH_GPT_OSS);
    assert_int_equal(c->C, 32), assert_int_equal(c->moe_F, 64), assert_int_equal(c->n_experts, 4);
    const mt_param *gu = mt_param_find(&fx.t, EXPERTS[0]), *dn = mt_param_find(&fx.t, EXPERTS[1]);
    assert_non_null(gu), assert_non_null(dn);
    assert_true(gu->shape[0] == 4 && gu->shape[1] == 32 && gu->shape[2] == 128); /* [E, C, 2F] */
    assert_true(dn->shape[0] == 4 && dn->shape[1] == 64 && dn->shape[2] == 32);  /* [E, F, C] */
    mt_hf_source *src;
    if (mt_hf_source_open(&src, &fx.t, fx.dir) != MT_OK) fail_msg("%s", mt_error_message());
    assert_int_equal(src->n_mxfp4, 4);
    assert_int_equal(src->fused_experts, 0);
    assert_int_equal(src->n_carried, 0);
    mt_hf_source_free(src);
}

/* transformers' dequantized down_proj (BF16, exact) bit for bit, and every plain tensor as its
 * bf16 upcast. */
static void test_values_against_transformers(void **state) {
    (void)state;
    mt_safetensors *ref = open_reference();
    const mt_st_tensor *d = mt_safetensors_find(ref, "deq.model.layers.1.mlp.experts.down_proj");
    assert_non_null(d);
    assert_int_equal(d->dtype, MT_BF16);
    const mt_param *p = mt_param_find(&fx.t, "model.layers.1.mlp.experts.down_proj");
    assert_int_equal(d->numel, p->numel);
    assert_true(d->ndim == 3 && d->shape[0] == p->shape[0] && d->shape[1] == p->shape[1] &&
                d->shape[2] == p->shape[2]);
    int64_t bad = 0, nonzero = 0;
    for (int64_t i = 0; i < p->numel; i++) {
        uint16_t h;
        memcpy(&h, (const unsigned char *)d->data + 2 * i, 2);
        float got = fx.w[p->offset + i];
        nonzero += got != 0;
        if (bits(got) != (uint32_t)h << 16 && bad++ < 4)
            fprintf(stderr, "  down_proj[%lld]: got %a, transformers 0x%04x\n", (long long)i, (double)got, h);
    }
    fprintf(stderr, "layer-1 down_proj vs transformers' dequantized: %lld of %lld elements differ\n",
            (long long)bad, (long long)p->numel);
    assert_int_equal(bad, 0);
    assert_true(nonzero > p->numel / 2);
    mt_safetensors_close(ref);

    /* the plain (BF16) tensors: their upcast, so the experts are the only thing read differently */
    mt_safetensors *st;
    assert_int_equal(mt_safetensors_open_dir(&st, fx.dir), MT_OK);
    int plain = 0;
    for (int i = 0; i < fx.t.n_params; i++) {
        const mt_param *q = &fx.t.params[i];
        const mt_st_tensor *x = mt_safetensors_find(st, q->name);
        if (!x) continue;
        assert_int_equal(x->dtype, MT_BF16);
        float *v = malloc((size_t)q->numel * sizeof(float));
        assert_int_equal(mt_st_tensor_to_f32(x, v), MT_OK);
        assert_memory_equal(v, fx.w + q->offset, (size_t)q->numel * sizeof(float));
        free(v);
        plain++;
    }
    assert_int_equal(plain, fx.t.n_params - 4);
    mt_safetensors_close(st);
}

typedef struct {
    float *w;
    int calls;
} sink_ctx;

static int copy_sink(void *ctx, const mt_param *p, const float *w) {
    sink_ctx *s = ctx;
    memcpy(s->w + p->offset, w, (size_t)p->numel * sizeof(float));
    s->calls++;
    return MT_OK;
}

static int want_down(void *ctx, const mt_param *p) {
    (void)ctx;
    return p->kind == MT_W_EXP_DOWN_IO;
}

/* Every reader of model weights dequantizes the same way. */
static void test_all_readers(void **state) {
    (void)state;
    size_t bytes = (size_t)fx.t.total * sizeof(float);
    sink_ctx s = {mt_aligned_alloc(bytes), 0};
    memset(s.w, 0, bytes);
    assert_int_equal(mt_model_load_tensors(&fx.t, fx.dir, copy_sink, &s), MT_OK);
    assert_int_equal(s.calls, fx.t.n_params);
    assert_memory_equal(s.w, fx.w, bytes);
    memset(s.w, 0, bytes);
    s.calls = 0;
    assert_int_equal(mt_model_load_tensors_where(&fx.t, fx.dir, want_down, copy_sink, &s), MT_OK);
    assert_int_equal(s.calls, 2);
    for (int k = 1; k < 4; k += 2) {
        const mt_param *p = mt_param_find(&fx.t, EXPERTS[k]);
        assert_memory_equal(s.w + p->offset, fx.w + p->offset, (size_t)p->numel * sizeof(float));
    }
    free(s.w);
}

/* The loaded model's logits and loss against transformers' (float64 run of the dequantized weights). */
static void test_logits_and_loss(void **state) {
    (void)state;
    mt_safetensors *ref = open_reference();
    int B, T, B2, T2;
    int32_t *ids = mt_test_st_i32(ref, "input_ids", &B, &T), *targets = mt_test_st_i32(ref, "targets", &B2, &T2);
    assert_true(B == B2 && T == T2);
    const mt_config *c = &fx.t.cfg;
    size_t n = (size_t)B * T * c->V;
    mt_backend *be = mt_backend_cpu_create();
    mt_runner r;
    mt_runner_init(&r, &fx.t, be, B, T);
    float *logits = malloc(n * sizeof(float)), *want = mt_test_st_f32(ref, "logits", (int64_t)n);
    mt_runner_logits(&r, fx.w, ids, B, logits);
    int ok = mt_check_rel("logits (MXFP4 experts)", logits, want, n, LOGITS_TOL);
    int64_t count = 0;
    double sum = mt_runner_step(&r, fx.w, NULL, ids, targets, B, 0, &count);
    float loss = (float)(sum / (double)count + r.aux_loss), *want_loss = mt_test_st_f32(ref, "loss", 1);
    ok &= mt_check_rel("loss (MXFP4 experts)", &loss, want_loss, 1, LOGITS_TOL);
    mt_runner_free(&r);
    be->destroy(be);
    free(ids), free(targets), free(logits), free(want), free(want_loss);
    mt_safetensors_close(ref);
    if (!ok) fail_msg("logits or loss out of tolerance (see above)");
}

/* DIR/config.json has no quantization_config (and is otherwise a gpt_oss config). */
static void assert_no_quant_config(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) fail_msg("%s: %s", path, je.text);
    if (json_object_get(o, "quantization_config")) fail_msg("%s still has quantization_config", path);
    assert_string_equal(json_string_value(json_object_get(o, "model_type")), "gpt_oss");
    json_decref(o);
}

/* DIR's model.safetensors holds the experts plain, as dtype, equal to the loaded values. */
static void assert_plain_experts(const char *dir, mt_dtype dtype) {
    mt_safetensors *st;
    if (mt_safetensors_open_dir(&st, dir) != MT_OK) fail_msg("%s", mt_error_message());
    for (int i = 0; i < mt_safetensors_count(st); i++) {
        const char *name = mt_safetensors_at(st, i)->name;
        if (strstr(name, "_blocks") || strstr(name, "_scales")) fail_msg("%s: %s saved quantized", dir, name);
    }
    for (int k = 0; k < 4; k++) {
        const mt_param *p = mt_param_find(&fx.t, EXPERTS[k]);
        const mt_st_tensor *x = mt_safetensors_find(st, EXPERTS[k]);
        if (!x) fail_msg("%s: %s missing", dir, EXPERTS[k]);
        assert_int_equal(x->dtype, dtype);
        assert_true(x->ndim == 3 && x->shape[0] == p->shape[0] && x->shape[1] == p->shape[1] &&
                    x->shape[2] == p->shape[2]);
        float *v = malloc((size_t)p->numel * sizeof(float));
        assert_int_equal(mt_st_tensor_to_f32(x, v), MT_OK);
        assert_memory_equal(v, fx.w + p->offset, (size_t)p->numel * sizeof(float)); /* bf16-exact */
        free(v);
    }
    mt_safetensors_close(st);
}

/* A save of the loaded model: plain experts, no quantization_config, the same bits back. */
static void test_save(void **state) {
    (void)state;
    mt_hf_source *src;
    if (mt_hf_source_open(&src, &fx.t, fx.dir) != MT_OK) fail_msg("%s", mt_error_message());
    fx.t.hf = src; /* as the CLI's host model: what the source had */
    char *tmp = mt_test_tmpdir(), dir[4096];
    const mt_dtype dts[2] = {MT_BF16, MT_F32};
    float *back = mt_aligned_alloc((size_t)fx.t.total * sizeof(float));
    for (int k = 0; k < 2; k++) {
        snprintf(dir, sizeof dir, "%s/%s", tmp, mt_dtype_name(dts[k]));
        if (mt_model_save(&fx.t, fx.w, dir, dts[k], 0) != MT_OK) fail_msg("%s", mt_error_message());
        assert_no_quant_config(dir);
        assert_plain_experts(dir, dts[k]);
        mt_param_table t2;
        char cfg[4200];
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        mt_config c2;
        if (mt_config_load(&c2, cfg) != MT_OK) fail_msg("%s", mt_error_message());
        mt_param_table_init(&t2, &c2);
        assert_int_equal(t2.total, fx.t.total);
        if (mt_model_load(&t2, back, dir) != MT_OK) fail_msg("%s", mt_error_message());
        assert_memory_equal(back, fx.w, (size_t)fx.t.total * sizeof(float));
        mt_param_table_free(&t2);
    }
    fx.t.hf = NULL;
    mt_hf_source_free(src);
    free(back);
    mt_test_rmtree(tmp);
    free(tmp);
}

/* ---- bad checkpoints ---- */

/* One edit of the fixture's tensors: drop `drop`, give `reshape` a new dtype/shape (same bytes),
 * add `add` (zeros). */
typedef struct {
    const char *drop;
    const char *reshape;
    mt_dtype dtype;
    int ndim;
    int64_t shape[4];
    const char *add;
    int add_ndim;
    int64_t add_shape[4];
    const char *says[2]; /* the error names these */
} edit;

/* Writes FIXTURE's tensors, edited, to DIR/model.safetensors. */
static void write_edited(const char *fixture, const char *dir, const edit *e) {
    char path[4096], rel[256];
    snprintf(rel, sizeof rel, "%s/model.safetensors", fixture);
    char *src_path = mt_fixture_path(rel);
    mt_safetensors *st;
    if (mt_safetensors_open_file(&st, src_path) != MT_OK) fail_msg("%s", mt_error_message());
    int n = mt_safetensors_count(st), m = 0;
    mt_st_write_tensor *w = calloc((size_t)n + 1, sizeof *w);
    void *zeros = NULL;
    for (int i = 0; i < n; i++) {
        const mt_st_tensor *x = mt_safetensors_at(st, i);
        if (e->drop && strcmp(x->name, e->drop) == 0) continue;
        mt_st_write_tensor *o = &w[m++];
        o->name = x->name, o->dtype = x->dtype, o->ndim = x->ndim, o->data = x->data;
        for (int d = 0; d < x->ndim; d++) o->shape[d] = x->shape[d];
        if (e->reshape && strcmp(x->name, e->reshape) == 0) {
            o->dtype = e->dtype, o->ndim = e->ndim;
            int64_t numel = 1;
            for (int d = 0; d < e->ndim; d++) o->shape[d] = e->shape[d], numel *= e->shape[d];
            assert_int_equal((size_t)numel * mt_dtype_size(e->dtype), x->nbytes);
        }
    }
    if (e->add) {
        mt_st_write_tensor *o = &w[m++];
        int64_t numel = 1;
        o->name = e->add, o->dtype = MT_F32, o->ndim = e->add_ndim;
        for (int d = 0; d < e->add_ndim; d++) o->shape[d] = e->add_shape[d], numel *= e->add_shape[d];
        o->data = zeros = calloc((size_t)numel, sizeof(float));
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (mt_safetensors_write(path, w, m, NULL, 0) != MT_OK) fail_msg("%s", mt_error_message());
    free(zeros), free(w), free(src_path);
    mt_safetensors_close(st);
}

/* Refused by every reader with one line naming e->says, the arena untouched. */
static void expect_refused(const char *fixture, mt_param_table *t, const edit *e) {
    char *dir = mt_test_tmpdir();
    write_edited(fixture, dir, e);
    size_t bytes = (size_t)t->total * sizeof(float);
    float *w = mt_aligned_alloc(bytes);
    for (int64_t i = 0; i < t->total; i++) w[i] = 42.0f;
    mt_error_clear();
    assert_int_equal(mt_model_load(t, w, dir), MT_ERR);
    const char *msg = mt_error_message();
    fprintf(stderr, "refused: %s\n", msg);
    for (int k = 0; k < 2; k++)
        if (e->says[k] && !strstr(msg, e->says[k])) fail_msg("'%s' does not say '%s'", msg, e->says[k]);
    assert_null(strchr(msg, '\n'));
    for (int64_t i = 0; i < t->total; i++)
        if (w[i] != 42.0f) fail_msg("arena written at %lld on a refused load", (long long)i);
    char first[2048];
    snprintf(first, sizeof first, "%s", msg);
    sink_ctx s = {w, 0};
    assert_int_equal(mt_model_load_tensors(t, dir, copy_sink, &s), MT_ERR);
    assert_int_equal(s.calls, 0);
    assert_string_equal(mt_error_message(), first);
    mt_hf_source *src = (mt_hf_source *)1;
    assert_int_equal(mt_hf_source_open(&src, t, dir), MT_ERR);
    assert_null(src);
    free(w);
    mt_test_rmtree(dir);
    free(dir);
}

#define L0 "model.layers.0.mlp.experts."
#define L1 "model.layers.1.mlp.experts."

static void test_refusals(void **state) {
    (void)state;
    const edit cases[] = {
        /* a half missing, either way */
        {.drop = L0 "gate_up_proj_scales",
         .says = {L0 "gate_up_proj_blocks has no " L0 "gate_up_proj_scales", "model.safetensors"}},
        {.drop = L1 "down_proj_blocks", .says = {L1 "down_proj_scales has no " L1 "down_proj_blocks", NULL}},
        /* blocks of another shape (the bytes of [E, in, out/32, 16]: in and out swapped) */
        {.reshape = L0 "gate_up_proj_blocks", .dtype = MT_U8, .ndim = 4, .shape = {4, 32, 4, 16},
         .says = {L0 "gate_up_proj_blocks [4, 32, 4, 16]", "needs [4, 128, 1, 16] and [4, 128, 1]"}},
        /* blocks without their last dimension of 16 */
        {.reshape = L1 "down_proj_blocks", .dtype = MT_U8, .ndim = 4, .shape = {4, 32, 1, 32},
         .says = {L1 "down_proj_blocks [4, 32, 1, 32]", "needs [4, 32, 2, 16]"}},
        /* scales inconsistent with the blocks */
        {.reshape = L1 "down_proj_scales", .dtype = MT_U8, .ndim = 3, .shape = {4, 64, 1},
         .says = {L1 "down_proj_scales [4, 64, 1]", "needs [4, 32, 2, 16] and [4, 32, 2]"}},
        {.reshape = L0 "gate_up_proj_scales", .dtype = MT_U8, .ndim = 2, .shape = {4, 128},
         .says = {L0 "gate_up_proj_scales [4, 128]", NULL}},
        /* not U8 */
        {.reshape = L0 "down_proj_blocks", .dtype = MT_BF16, .ndim = 4, .shape = {4, 32, 2, 8},
         .says = {"tensor " L0 "down_proj_blocks: dtype BF16", "are U8"}},
        /* the plain tensor beside its pair */
        {.add = L1 "gate_up_proj", .add_ndim = 3, .add_shape = {4, 32, 128},
         .says = {"tensor " L1 "gate_up_proj is there twice", NULL}},
        /* a pair the model has no tensor for */
        {.add = L0 "up_proj_blocks", .add_ndim = 1, .add_shape = {8},
         .says = {L0 "up_proj_blocks is MXFP4-quantized", "no tensor to read it into"}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) expect_refused(FIXTURE, &fx.t, &cases[k]);
}

/* gpt_oss_tiny's experts are 8 wide: its down_proj (input 8) cannot be MXFP4 (32 inputs a group). */
static void test_width_not_multiple_of_32(void **state) {
    (void)state;
    mt_param_table tiny;
    load_table("gpt_oss_tiny", &tiny);
    char *src = mt_fixture_path("gpt_oss_tiny/model.safetensors"), *dir = mt_test_tmpdir(), path[4096];
    mt_safetensors *st;
    assert_int_equal(mt_safetensors_open_file(&st, src), MT_OK);
    int n = mt_safetensors_count(st), m = 0;
    mt_st_write_tensor *w = calloc((size_t)n + 2, sizeof *w);
    static uint8_t blocks[4 * 32 * 1 * 16], scales[4 * 32 * 1];
    for (int i = 0; i < n; i++) {
        const mt_st_tensor *x = mt_safetensors_at(st, i);
        if (strcmp(x->name, L0 "down_proj") == 0) continue;
        mt_st_write_tensor *o = &w[m++];
        o->name = x->name, o->dtype = x->dtype, o->ndim = x->ndim, o->data = x->data;
        for (int d = 0; d < x->ndim; d++) o->shape[d] = x->shape[d];
    }
    w[m++] = (mt_st_write_tensor){L0 "down_proj_blocks", MT_U8, 4, {4, 32, 1, 16}, blocks};
    w[m++] = (mt_st_write_tensor){L0 "down_proj_scales", MT_U8, 3, {4, 32, 1}, scales};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(mt_safetensors_write(path, w, m, NULL, 0), MT_OK);
    float *arena = mt_aligned_alloc((size_t)tiny.total * sizeof(float));
    assert_int_equal(mt_model_load(&tiny, arena, dir), MT_ERR);
    const char *msg = mt_error_message();
    fprintf(stderr, "refused: %s\n", msg);
    if (!strstr(msg, L0 "down_proj") || !strstr(msg, "[4, 8, 32]") || !strstr(msg, "multiple of 32"))
        fail_msg("'%s' does not explain the width", msg);
    free(arena), free(w), free(src);
    mt_safetensors_close(st);
    mt_test_rmtree(dir);
    free(dir);
    mt_param_table_free(&tiny);
}

/* ---- the binary ---- */

static char g_out[OUT_SIZE]; /* static: a failing check longjmps out */

static void test_cli(void **state) {
    (void)state;
    mt_cli_env env;
    if (mt_cli_env_init(&env, FIXTURE) != 0) fail_msg("MT_BIN is not set (run through ctest)");
    int rc = mt_cli_run(&env, g_out, sizeof g_out, "info --model '%s'", env.fixture);
    mt_cli_expect(rc, 0, g_out, "experts: MXFP4 on disk (4 tensors");
    /* a learnable stream of ids < V */
    char data[4200];
    snprintf(data, sizeof data, "%s/tokens.bin", env.tmp);
    FILE *f = fopen(data, "wb");
    assert_non_null(f);
    uint16_t tok = 5;
    for (int i = 0; i < 512; i++, tok = (uint16_t)((3 * tok + 1) % 64)) fwrite(&tok, 2, 1, f);
    fclose(f);
    rc = mt_cli_run(&env, g_out, sizeof g_out,
                    "train --model '%s' --data '%s' --batch 2 --seq 16 --steps 2 --lr 1e-3 --warmup 1 "
                    "--device cpu --out run",
                    env.fixture, data);
    mt_cli_expect(rc, 0, g_out,
                  "experts loaded from MXFP4 (dequantized): saved checkpoints hold them unquantized");
    char ck[4300];
    snprintf(ck, sizeof ck, "%s/run/checkpoints/step_00000002", env.tmp);
    assert_no_quant_config(ck);
    mt_safetensors *st;
    if (mt_safetensors_open_dir(&st, ck) != MT_OK) fail_msg("%s", mt_error_message());
    for (int k = 0; k < 4; k++) {
        const mt_st_tensor *x = mt_safetensors_find(st, EXPERTS[k]);
        if (!x) fail_msg("%s: %s missing", ck, EXPERTS[k]);
        assert_int_equal(x->dtype, MT_F32); /* the fp32 master */
    }
    mt_safetensors_close(st);
    /* convert: bf16, plain, without quantization_config, the values as loaded */
    rc = mt_cli_run(&env, g_out, sizeof g_out, "convert --model '%s' --out conv --dtype bf16", env.fixture);
    mt_cli_expect(rc, 0, g_out, "bf16");
    char conv[4300];
    snprintf(conv, sizeof conv, "%s/conv", env.tmp);
    assert_no_quant_config(conv);
    assert_plain_experts(conv, MT_BF16);
    mt_cli_env_free(&env);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_shape),
        cmocka_unit_test(test_values_against_transformers),
        cmocka_unit_test(test_all_readers),
        cmocka_unit_test(test_logits_and_loss),
        cmocka_unit_test(test_save),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_width_not_multiple_of_32),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
