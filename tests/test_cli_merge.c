/* `megatrain merge`: base + a LoRA adapter -> the merged Hugging Face model.
 *  - An adapter written by mt_lora_save_dir with random lora_A and lora_B (rank 4, alpha 6: scale
 *    1.5) on q, v, o and down of the llama_gqa fixture: every adapted weight of the merged
 *    model.safetensors is W + scale * B @ A computed here in fp64, within 1e-6 tensor-relative
 *    (max |got - ref| / max |ref|; fp32 rounding of the sum alone is ~6e-8); every other tensor is
 *    byte-identical to the base's; generation_config.json is copied.
 *  - PEFT's own merge_and_unload() of tests/fixtures/lora_llama, lora_qwen3_moe (made by
 *    make_lora_fixtures.py), lora_gpt_oss (make_lora_gpt_oss_fixture.py: the fused experts,
 *    biases and sinks written back unchanged), lora_gemma4 and lora_gemma4_moe
 *    (make_lora_gemma4_fixture.py: no v_proj on the full layers, the layer_scalar buffers, the
 *    router and fused experts written back unchanged): our merge of base/ + adapter_final/ equals merged/
 *    within 1e-6, the unadapted tensors byte for byte (skipped with a message when the fixture is
 *    absent).
 *  - Bad arguments and bad adapters: exit 1, one error line naming the flag or file, no --out. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "io/lora_io.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/params.h"
#include "util/testutil.h"

#define OUT_SIZE 65536
#define TOL 1e-6

static mt_cli_env g;
static mt_param_table g_t;
static mt_lora_table g_lt;
static float *g_arena;

static int setup(void **state) {
    if (mt_cli_env_init(&g, "llama_gqa") != 0) return -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", g.fixture);
    mt_config c;
    if (mt_config_load(&c, path) != MT_OK) {
        fprintf(stderr, "%s\n", mt_error_message());
        return -1;
    }
    mt_param_table_init(&g_t, &c);
    mt_lora_opts o = {4, 6.0, "q_proj,v_proj,o_proj,down_proj"};
    if (mt_lora_table_init(&g_lt, &g_t, &o) != MT_OK) {
        fprintf(stderr, "%s\n", mt_error_message());
        return -1;
    }
    g_arena = calloc((size_t)g_lt.total, sizeof(float));
    mt_test_rng r;
    mt_test_rng_seed(&r, 11);
    for (int i = 0; i < g_lt.n_params; i++)
        mt_test_fill_normal(&r, g_arena + g_lt.params[i].offset, (size_t)g_lt.params[i].numel, 0.2f);
    snprintf(path, sizeof path, "%s/adapter", g.tmp);
    if (mt_lora_save_dir(&g_lt, g_arena, path, g.fixture, MT_F32) != MT_OK) {
        fprintf(stderr, "%s\n", mt_error_message());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    free(g_arena);
    mt_lora_table_free(&g_lt);
    mt_param_table_free(&g_t);
    mt_cli_env_free(&g);
    return 0;
}

/* DIR's weights: model.safetensors or an index and its shards. */
static mt_safetensors *open_st(const char *dir) {
    mt_safetensors *st;
    if (mt_safetensors_open_dir(&st, dir) != MT_OK) fail_msg("%s", mt_error_message());
    return st;
}

static float *to_f32(const mt_st_tensor *x) {
    float *v = malloc((size_t)x->numel * sizeof(float));
    if (mt_st_tensor_to_f32(x, v) != MT_OK) fail_msg("%s", mt_error_message());
    return v;
}

/* W + scale * B @ A in fp64, rounded once to fp32. */
static float *reference(const mt_st_tensor *w, const float *a, const float *b, int r, float scale) {
    float *ref = to_f32(w);
    int64_t out = w->shape[0], in = w->shape[1];
    for (int64_t i = 0; i < out; i++)
        for (int64_t j = 0; j < in; j++) {
            double s = 0;
            for (int k = 0; k < r; k++) s += (double)b[i * r + k] * a[(int64_t)k * in + j];
            ref[i * in + j] = (float)((double)ref[i * in + j] + (double)scale * s);
        }
    return ref;
}

/* The fused experts' W (E, in, out): W[e] + scale * A_e^T B_e^T in fp64, A (r E, in) and B (out, r E)
 * in PEFT's layout (expert e's rows e r + k of A, columns k E + e of B). */
static float *reference_experts(const mt_st_tensor *w, const float *a, const float *b, int r,
                                float scale) {
    float *ref = to_f32(w);
    int64_t E = w->shape[0], in = w->shape[1], out = w->shape[2];
    for (int64_t e = 0; e < E; e++)
        for (int64_t i = 0; i < in; i++)
            for (int64_t o = 0; o < out; o++) {
                double s = 0;
                for (int k = 0; k < r; k++)
                    s += (double)a[(e * r + k) * in + i] * b[o * r * E + k * E + e];
                float *x = &ref[(e * in + i) * out + o];
                *x = (float)((double)*x + (double)scale * s);
            }
    return ref;
}

/* Each tensor of merged against base: adapted ones (lt over table t, in arena) as ref_of says,
 * the others byte-identical (want_dtype: the merged file's dtype; a BF16 one is the base rounded). */
static void check_merged(const char *base_dir, const char *merged_dir, const mt_param_table *t,
                         const mt_lora_table *lt, const float *arena, mt_dtype want_dtype,
                         double tol) {
    mt_safetensors *b = open_st(base_dir), *m = open_st(merged_dir);
    assert_int_equal(mt_safetensors_count(m), mt_safetensors_count(b));
    assert_string_equal(mt_safetensors_metadata(m, "format"), "pt");
    fprintf(stderr, "%s against %s:\n", merged_dir, base_dir);
    int adapted = 0;
    for (int i = 0; i < mt_safetensors_count(b); i++) {
        const mt_st_tensor *x = mt_safetensors_at(b, i), *y = mt_safetensors_find(m, x->name);
        if (!y) fail_msg("%s: tensor %s is missing from the merged model", merged_dir, x->name);
        assert_int_equal(y->dtype, want_dtype);
        assert_int_equal(y->ndim, x->ndim);
        for (int d = 0; d < x->ndim; d++) assert_int_equal(y->shape[d], x->shape[d]);
        const mt_param *p = mt_param_find(t, x->name);
        assert_non_null(p);
        const mt_lora_param *a = mt_lora_find(lt, p->layer, p->kind);
        if (a && p->expert < 0) {
            float *ref;
            if (a->experts) { /* the arena's lora_B back in PEFT's layout */
                float *b_peft = malloc((size_t)a[1].numel * sizeof(float));
                mt_lora_peft_layout(&a[1], arena + a[1].offset, b_peft, 1);
                ref = reference_experts(x, arena + a->offset, b_peft, lt->rank, lt->scale);
                free(b_peft);
            } else {
                ref = reference(x, arena + a->offset, arena + a[1].offset, lt->rank, lt->scale);
            }
            float *got = to_f32(y);
            if (want_dtype == MT_BF16)
                for (int64_t j = 0; j < x->numel; j++) ref[j] = mt_bf16_to_f32(mt_f32_to_bf16(ref[j]));
            if (!mt_check_rel(x->name, got, ref, (size_t)x->numel, tol))
                fail_msg("%s: %s differs from W + scale * B @ A", merged_dir, x->name);
            adapted++;
            free(ref);
            free(got);
        } else if (want_dtype == x->dtype) {
            if (x->nbytes != y->nbytes || memcmp(x->data, y->data, x->nbytes) != 0)
                fail_msg("%s: unadapted tensor %s is not byte-identical to the base's", merged_dir, x->name);
        } else {
            float *bx = to_f32(x), *gy = to_f32(y);
            for (int64_t j = 0; j < x->numel; j++)
                if (gy[j] != mt_bf16_to_f32(mt_f32_to_bf16(bx[j])))
                    fail_msg("%s: unadapted %s[%lld] is not the base's rounded", merged_dir, x->name,
                             (long long)j);
            free(bx);
            free(gy);
        }
    }
    assert_int_equal(adapted, lt->n_modules);
    mt_safetensors_close(b);
    mt_safetensors_close(m);
}

static void test_merge_fp32(void **state) {
    static char out[OUT_SIZE];
    int rc = mt_cli_run(&g, out, OUT_SIZE, "merge --model '%s' --adapter adapter --out merged 2>&1", g.fixture);
    fprintf(stderr, "%s", out);
    mt_cli_expect(rc, 0, out, "wrote merged (fp32");
    assert_non_null(strstr(out, "merged 8 adapted modules (r 4, lora_alpha 6, scale 1.5)"));
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/merged", g.tmp);
    check_merged(g.fixture, dir, &g_t, &g_lt, g_arena, MT_F32, TOL);
    /* the base's side files, a config transformers loads, no temporary left */
    mt_test_sh("cmp '%s/generation_config.json' '%s/merged/generation_config.json'", g.fixture, g.tmp);
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/merged/config.json", g.tmp);
    mt_config c;
    if (mt_config_load(&c, cfg) != MT_OK) fail_msg("%s", mt_error_message());
    assert_true(c.C == g_t.cfg.C && c.L == g_t.cfg.L && c.V == g_t.cfg.V);
    assert_int_equal(mt_test_count_prefix(g.tmp, "merged.tmp"), 0);
}

static void test_merge_bf16_into_empty_dir(void **state) {
    static char out[OUT_SIZE];
    mt_test_sh("mkdir -p '%s/empty'", g.tmp);
    int rc = mt_cli_run(&g, out, OUT_SIZE, "merge --model '%s' --adapter adapter --out empty/ --dtype bf16 2>&1",
                        g.fixture);
    mt_cli_expect(rc, 0, out, "(bf16");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/empty", g.tmp);
    /* bf16 of the fp32 merge: at most one bf16 rounding (2^-8 relative) apart from bf16(ref) */
    check_merged(g.fixture, dir, &g_t, &g_lt, g_arena, MT_BF16, 1.0 / 256);
    assert_int_equal(mt_test_count_prefix(g.tmp, "empty.tmp"), 0);
}

/* A bf16 base (sharded) merges into bf16 by default; --shard-size shards the output. */
static void test_merge_bf16_base(void **state) {
    static char out[OUT_SIZE];
    char *base = mt_fixture_path("llama_bf16_sharded");
    int rc = mt_cli_run(&g, out, OUT_SIZE, "merge --model '%s' --adapter adapter --out sharded --shard-size 40K 2>&1",
                        base);
    mt_cli_expect(rc, 0, out, "wrote sharded (bf16");
    assert_true(mt_cli_exists(&g, "sharded/model.safetensors.index.json"));
    assert_false(mt_cli_exists(&g, "sharded/model.safetensors"));
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/sharded", g.tmp);
    check_merged(base, dir, &g_t, &g_lt, g_arena, MT_BF16, 1.0 / 256);
    free(base);
}

/* merge of base/ + adapter_final/ against PEFT's merged/ of one fixture directory. */
static void check_peft_fixture(const char *name) {
    char *root = mt_fixture_path(name);
    char base[4096], adapter[4096], merged[4096];
    snprintf(base, sizeof base, "%s/base", root);
    snprintf(adapter, sizeof adapter, "%s/adapter_final", root);
    snprintf(merged, sizeof merged, "%s/merged", root);
    struct stat sb;
    if (stat(base, &sb) != 0 || stat(adapter, &sb) != 0 || stat(merged, &sb) != 0) {
        fprintf(stderr, "SKIP: %s has no base/, adapter_final/ and merged/ (make_lora_fixtures.py "
                        "writes them)\n", root);
        free(root);
        skip();
    }
    static char out[OUT_SIZE];
    int rc = mt_cli_run(&g, out, OUT_SIZE, "merge --model '%s' --adapter '%s' --out peft_%s 2>&1",
                        base, adapter, name);
    fprintf(stderr, "%s", out);
    mt_cli_expect(rc, 0, out, "(fp32");
    char config[4200];
    snprintf(config, sizeof config, "%s/config.json", base);
    mt_config c;
    if (mt_config_load(&c, config) != MT_OK) fail_msg("%s", mt_error_message());
    mt_param_table t;
    mt_param_table_init(&t, &c);
    mt_lora_table lt;
    float *arena;
    if (mt_lora_load_dir(adapter, &t, &lt, &arena) != MT_OK) fail_msg("%s", mt_error_message());
    char ours[4200];
    snprintf(ours, sizeof ours, "%s/peft_%s", g.tmp, name);
    /* ours against our own fp64 reference, then against PEFT's tensor by tensor */
    check_merged(base, ours, &t, &lt, arena, MT_F32, TOL);
    mt_safetensors *p = open_st(merged), *m = open_st(ours);
    assert_int_equal(mt_safetensors_count(m), mt_safetensors_count(p));
    for (int i = 0; i < mt_safetensors_count(p); i++) {
        const mt_st_tensor *x = mt_safetensors_at(p, i), *y = mt_safetensors_find(m, x->name);
        if (!y) fail_msg("%s: PEFT's %s is missing from ours", ours, x->name);
        assert_int_equal(y->numel, x->numel);
        float *want = to_f32(x), *got = to_f32(y);
        char what[256];
        snprintf(what, sizeof what, "%s vs PEFT: %s", name, x->name);
        if (!mt_check_rel(what, got, want, (size_t)x->numel, TOL)) fail_msg("%s differs from PEFT's merge", x->name);
        free(want);
        free(got);
    }
    mt_test_sh("cmp '%s/generation_config.json' '%s/generation_config.json'", merged, ours);
    mt_safetensors_close(p);
    mt_safetensors_close(m);
    free(arena);
    mt_lora_table_free(&lt);
    mt_param_table_free(&t);
    free(root);
}

static void test_peft_llama(void **state) { check_peft_fixture("lora_llama"); }
static void test_peft_qwen3_moe(void **state) { check_peft_fixture("lora_qwen3_moe"); }
static void test_peft_gpt_oss(void **state) { check_peft_fixture("lora_gpt_oss"); }
/* the experts' delta folded into the fused (E, in, out) gate_up_proj and down_proj */
static void test_peft_gpt_oss_experts(void **state) { check_peft_fixture("lora_gpt_oss_experts"); }
static void test_peft_gemma4(void **state) { check_peft_fixture("lora_gemma4"); }
static void test_peft_gemma4_moe(void **state) { check_peft_fixture("lora_gemma4_moe"); }

/* ---- refusals ---- */

static void expect_refused(const char *args, const char *needle, const char *out_rel) {
    static char out[OUT_SIZE];
    char first[2048];
    int rc = mt_cli_run(&g, out, OUT_SIZE, "merge %s 2>&1", args);
    int n = mt_cli_error_lines(out, first, sizeof first);
    fprintf(stderr, "  exit %d: %s\n", rc, first);
    if (rc != 1 || n != 1) fail_msg("%s: exit %d with %d error lines, want 1 and 1:\n%s", args, rc, n, out);
    if (!strstr(first, needle)) fail_msg("%s: the error does not say '%s': %s", args, needle, first);
    if (strstr(out, "wrote ")) fail_msg("%s: something was written:\n%s", args, out);
    if (out_rel && mt_cli_exists(&g, out_rel)) fail_msg("%s: %s was created", args, out_rel);
}

/* A copy of adapter as rel with adapter_config.json's key set to the JSON value. */
static void edited_adapter(const char *rel, const char *key, const char *value) {
    mt_test_sh("cd '%s' && rm -rf %s && cp -r adapter %s", g.tmp, rel, rel);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/adapter_config.json", g.tmp, rel);
    json_t *o = json_load_file(path, 0, NULL);
    assert_non_null(o);
    json_object_set_new(o, key, json_loads(value, JSON_DECODE_ANY, NULL));
    assert_int_equal(json_dump_file(o, path, JSON_INDENT(2)), 0);
    json_decref(o);
}

static void test_refusals(void **state) {
    char args[8192];
    const char *f = g.fixture;
    expect_refused("--adapter adapter --out x", "merge needs --model, --adapter and --out", "x");
    snprintf(args, sizeof args, "--model '%s' --out x", f);
    expect_refused(args, "merge needs --model, --adapter and --out", "x");
    snprintf(args, sizeof args, "--model '%s' --adapter adapter", f);
    expect_refused(args, "merge needs --model, --adapter and --out", NULL);
    snprintf(args, sizeof args, "--model '%s' --adapter adapter --out x stray", f);
    expect_refused(args, "unexpected argument stray", "x");
    snprintf(args, sizeof args, "--model '%s' --adapter adapter --out x --dtype f16", f);
    expect_refused(args, "--dtype: 'f16' is not one of bf16|fp32|f32", "x");
    /* --out: not empty, a file, inside an input */
    mt_test_sh("cd '%s' && mkdir -p full && echo hi > full/notes.txt && echo x > afile", g.tmp);
    snprintf(args, sizeof args, "--model '%s' --adapter adapter --out full", f);
    expect_refused(args, "--out full is not empty (it holds notes.txt)", NULL);
    mt_test_sh("grep -qx hi '%s/full/notes.txt'", g.tmp);
    snprintf(args, sizeof args, "--model '%s' --adapter adapter --out afile", f);
    expect_refused(args, "--out afile exists and is not a directory", NULL);
    snprintf(args, sizeof args, "--model '%s' --adapter adapter --out adapter/sub", f);
    expect_refused(args, "--out adapter/sub is inside --adapter adapter", "adapter/sub");
    snprintf(args, sizeof args, "--model '%s' --adapter adapter --out nowhere/../adapter/sub", f);
    expect_refused(args, "is inside --adapter adapter", "adapter/sub");
    snprintf(args, sizeof args, "--model '%s' --adapter adapter --out '%s/sub'", f, f);
    expect_refused(args, "is inside --model", NULL);
    /* the model and the adapter */
    expect_refused("--model nomodel --adapter adapter --out x", "nomodel", "x");
    snprintf(args, sizeof args, "--model '%s' --adapter noadapter --out x", f);
    expect_refused(args, "noadapter: cannot open", "x");
    edited_adapter("ad_nope", "target_modules", "[\"q_proj\", \"w_nope\"]");
    snprintf(args, sizeof args, "--model '%s' --adapter ad_nope --out x", f);
    expect_refused(args, "ad_nope/adapter_config.json: \"target_modules\": no module of this llama "
                   "model is named \"w_nope\"", "x");
    edited_adapter("ad_dora", "use_dora", "true");
    snprintf(args, sizeof args, "--model '%s' --adapter ad_dora --out x", f);
    expect_refused(args, "ad_dora/adapter_config.json: \"use_dora\" is true", "x");
    edited_adapter("ad_rank", "r", "2");
    snprintf(args, sizeof args, "--model '%s' --adapter ad_rank --out x", f);
    expect_refused(args, "ad_rank/adapter_model.safetensors: tensor base_model.model.model.layers.0."
                   "self_attn.q_proj.lora_A.weight: shape [4, 32], expected [2, 32]", "x");
    /* an adapter of another model: the gated-delta fixture has no q_proj on layer 0 */
    char *other = mt_fixture_path("qwen3_5_dense");
    snprintf(args, sizeof args, "--model '%s' --adapter adapter --out x", other);
    expect_refused(args, "adapter/adapter_model.safetensors: tensor ", "x");
    free(other);
    /* a base without weights where the adapter is fine */
    mt_test_sh("cd '%s' && mkdir -p noweights && cp '%s/config.json' noweights/", g.tmp, f);
    expect_refused("--model noweights --adapter adapter --out x", "noweights", "x");
}

/* listed by megatrain --help; merge --help is its usage, exit 0 */
static void test_help(void **state) {
    static char out[OUT_SIZE];
    int rc = mt_cli_run(&g, out, OUT_SIZE, "--help 2>&1");
    mt_cli_expect(rc, 0, out, "  merge ");
    rc = mt_cli_run(&g, out, OUT_SIZE, "merge --help 2>&1");
    mt_cli_expect(rc, 0, out, "--adapter DIR");
    if (strncmp(out, "usage: megatrain merge", 22) != 0) fail_msg("merge --help:\n%s", out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_fp32),  cmocka_unit_test(test_merge_bf16_into_empty_dir),
        cmocka_unit_test(test_merge_bf16_base),
        cmocka_unit_test(test_peft_llama),  cmocka_unit_test(test_peft_qwen3_moe),
        cmocka_unit_test(test_peft_gpt_oss),
        cmocka_unit_test(test_peft_gpt_oss_experts),
        cmocka_unit_test(test_peft_gemma4),
        cmocka_unit_test(test_peft_gemma4_moe),
        cmocka_unit_test(test_refusals),    cmocka_unit_test(test_help),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
