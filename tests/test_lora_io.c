/* PEFT adapter directories (io/lora_io.h) on the llama_gqa fixture's table: a save read back is the
 * same bits (F32) or the bf16 rounding (BF16); adapter_config.json has PEFT's fields; every
 * adapter PEFT could write that megatrain would misread is refused with one line naming the file
 * and the field or tensor, leaving *lt_out zero and *arena_out NULL. */
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

#define ALL7 "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"

static mt_param_table g_t;   /* llama_gqa: C 32, 2 layers, H 4, G 2, D 8, F 64 */
static mt_param_table g_vl;  /* qwen3_5_vl_mtp: a nested (multimodal) config */
static char *g_tmp;

static void table_from(mt_param_table *t, const char *rel) {
    char *path = mt_fixture_path(rel);
    mt_config c;
    if (mt_config_load(&c, path) != MT_OK) fail_msg("%s", mt_error_message());
    free(path);
    mt_param_table_init(t, &c);
}

static int setup(void **state) {
    table_from(&g_t, "llama_gqa/config.json");
    table_from(&g_vl, "qwen3_5_vl_mtp/config.json");
    g_tmp = mt_test_tmpdir();
    return 0;
}

static int teardown(void **state) {
    mt_param_table_free(&g_t);
    mt_param_table_free(&g_vl);
    mt_test_rmtree(g_tmp);
    free(g_tmp);
    return 0;
}

static char *tmp_path(const char *rel) {
    char *p = malloc(strlen(g_tmp) + strlen(rel) + 2);
    sprintf(p, "%s/%s", g_tmp, rel);
    return p;
}

/* A table over t and an arena of normal(0, 0.1) values (padding zero). */
static float *random_adapter(mt_lora_table *lt, const mt_param_table *t, int rank, double alpha,
                             const char *targets, uint64_t seed) {
    mt_lora_opts o = {rank, alpha, targets};
    if (mt_lora_table_init(lt, t, &o) != MT_OK) fail_msg("%s", mt_error_message());
    float *arena = calloc((size_t)lt->total, sizeof(float));
    mt_test_rng r;
    mt_test_rng_seed(&r, seed);
    for (int i = 0; i < lt->n_params; i++)
        mt_test_fill_normal(&r, arena + lt->params[i].offset, (size_t)lt->params[i].numel, 0.1f);
    return arena;
}

/* Saves a rank-4, alpha-8 adapter on targets into g_tmp/rel. */
static void save_adapter(const char *rel, const char *targets) {
    mt_lora_table lt;
    float *arena = random_adapter(&lt, &g_t, 4, 8, targets, 7);
    char *dir = tmp_path(rel);
    if (mt_lora_save_dir(&lt, arena, dir, "llama_gqa", MT_F32) != MT_OK) fail_msg("%s", mt_error_message());
    free(dir);
    free(arena);
    mt_lora_table_free(&lt);
}

static json_t *load_json(const char *dir, const char *file) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) fail_msg("%s: %s", path, je.text);
    return o;
}

/* ---- round trips ---- */

static void test_round_trip_f32(void **state) {
    mt_lora_table lt, back;
    float *arena = random_adapter(&lt, &g_t, 4, 8, ALL7, 1), *got = NULL;
    char *dir = tmp_path("new/parents/f32");
    assert_int_equal(mt_lora_save_dir(&lt, arena, dir, "llama_gqa", MT_F32), MT_OK);
    /* the directory was renamed into place: no temporary is left beside it */
    char *parent = tmp_path("new/parents");
    assert_int_equal(mt_test_count_prefix(parent, "f32.tmp"), 0);
    assert_int_equal(mt_test_count_prefix(parent, "f32"), 1);
    assert_int_equal(mt_lora_load_dir(dir, &g_t, &back, &got), MT_OK);
    assert_int_equal(back.rank, 4);
    assert_true(back.alpha == 8.0);
    assert_true(back.scale == 2.0f);
    assert_int_equal(back.n_params, lt.n_params);
    assert_int_equal(back.n_modules, 2 * 7);
    assert_int_equal(back.total, lt.total);
    for (int i = 0; i < lt.n_params; i++) {
        assert_string_equal(back.params[i].name, lt.params[i].name);
        assert_int_equal(back.params[i].offset, lt.params[i].offset);
    }
    /* every bit, the padding's zeros included */
    assert_memory_equal(got, arena, (size_t)lt.total * sizeof(float));
    free(got);
    mt_lora_table_free(&back);
    /* a second save into the now existing directory replaces both files */
    for (int64_t i = 0; i < lt.n_params; i++) arena[lt.params[i].offset] = 0.5f;
    assert_int_equal(mt_lora_save_dir(&lt, arena, dir, NULL, MT_F32), MT_OK);
    assert_int_equal(mt_lora_load_dir(dir, &g_t, &back, &got), MT_OK);
    assert_memory_equal(got, arena, (size_t)lt.total * sizeof(float));
    json_t *o = load_json(dir, "adapter_config.json");
    assert_true(json_is_null(json_object_get(o, "base_model_name_or_path")));
    json_decref(o);
    free(got);
    mt_lora_table_free(&back);
    free(parent);
    free(dir);
    free(arena);
    mt_lora_table_free(&lt);
}

static void test_round_trip_bf16(void **state) {
    mt_lora_table lt, back;
    float *arena = random_adapter(&lt, &g_t, 3, 5, "q_proj,down_proj", 2), *got = NULL;
    char *dir = tmp_path("bf16");
    assert_int_equal(mt_lora_save_dir(&lt, arena, dir, "llama_gqa", MT_BF16), MT_OK);
    char *path = tmp_path("bf16/adapter_model.safetensors");
    mt_safetensors *st;
    assert_int_equal(mt_safetensors_open_file(&st, path), MT_OK);
    assert_int_equal(mt_safetensors_count(st), lt.n_params);
    for (int i = 0; i < mt_safetensors_count(st); i++)
        assert_int_equal(mt_safetensors_at(st, i)->dtype, MT_BF16);
    mt_safetensors_close(st);
    assert_int_equal(mt_lora_load_dir(dir, &g_t, &back, &got), MT_OK);
    assert_true(back.alpha == 5.0 && back.scale == (float)(5.0 / 3));
    for (int64_t i = 0; i < lt.total; i++)
        if (got[i] != mt_bf16_to_f32(mt_f32_to_bf16(arena[i])))
            fail_msg("element %lld: %g, want bf16(%g)", (long long)i, got[i], arena[i]);
    free(got);
    mt_lora_table_free(&back);
    free(path);
    free(dir);
    free(arena);
    mt_lora_table_free(&lt);
}

/* An fp16 file (as PEFT writes for a model loaded in float16 without autocast) reads as its
 * values. */
static void test_read_f16(void **state) {
    mt_lora_table lt, back;
    float *arena = random_adapter(&lt, &g_t, 2, 4, "v_proj", 3), *got = NULL;
    char *dir = tmp_path("f16");
    assert_int_equal(mt_lora_save_dir(&lt, arena, dir, "llama_gqa", MT_F32), MT_OK);
    mt_st_write_tensor *w = calloc((size_t)lt.n_params, sizeof *w);
    uint16_t *h = calloc((size_t)lt.total, sizeof *h);
    mt_convert_f32_to_f16(h, arena, (size_t)lt.total);
    for (int i = 0; i < lt.n_params; i++)
        w[i] = (mt_st_write_tensor){lt.params[i].name, MT_F16, 2,
                                    {lt.params[i].shape[0], lt.params[i].shape[1]},
                                    h + lt.params[i].offset};
    char *path = tmp_path("f16/adapter_model.safetensors");
    assert_int_equal(mt_safetensors_write(path, w, lt.n_params, NULL, 0), MT_OK);
    assert_int_equal(mt_lora_load_dir(dir, &g_t, &back, &got), MT_OK);
    for (int64_t i = 0; i < lt.total; i++) assert_true(got[i] == mt_f16_to_f32(h[i]));
    free(got);
    mt_lora_table_free(&back);
    free(path);
    free(h);
    free(w);
    free(dir);
    free(arena);
    mt_lora_table_free(&lt);
}

/* ---- what is written ---- */

static void test_config_fields(void **state) {
    /* targets given unsorted and repeated: PEFT's set, written sorted */
    save_adapter("fields", "v_proj,q_proj,down_proj,q_proj");
    char *dir = tmp_path("fields");
    json_t *o = load_json(dir, "adapter_config.json");
    assert_string_equal(json_string_value(json_object_get(o, "peft_type")), "LORA");
    assert_string_equal(json_string_value(json_object_get(o, "task_type")), "CAUSAL_LM");
    assert_string_equal(json_string_value(json_object_get(o, "base_model_name_or_path")), "llama_gqa");
    assert_string_equal(json_string_value(json_object_get(o, "bias")), "none");
    assert_true(json_is_integer(json_object_get(o, "r")) && json_integer_value(json_object_get(o, "r")) == 4);
    assert_true(json_is_integer(json_object_get(o, "lora_alpha")) &&
                json_integer_value(json_object_get(o, "lora_alpha")) == 8);
    assert_true(json_is_real(json_object_get(o, "lora_dropout")));
    const char *falses[] = {"fan_in_fan_out", "use_rslora", "use_dora", "lora_bias"};
    for (size_t i = 0; i < sizeof falses / sizeof *falses; i++)
        if (!json_is_false(json_object_get(o, falses[i]))) fail_msg("%s is not false", falses[i]);
    const char *trues[] = {"inference_mode", "init_lora_weights"};
    for (size_t i = 0; i < 2; i++)
        if (!json_is_true(json_object_get(o, trues[i]))) fail_msg("%s is not true", trues[i]);
    const char *nulls[] = {"modules_to_save", "revision", "layers_to_transform", "layers_pattern",
                           "exclude_modules"};
    for (size_t i = 0; i < sizeof nulls / sizeof *nulls; i++) {
        json_t *v = json_object_get(o, nulls[i]);
        if (!v || !json_is_null(v)) fail_msg("%s is not null", nulls[i]);
    }
    assert_int_equal(json_object_size(json_object_get(o, "rank_pattern")), 0);
    assert_int_equal(json_object_size(json_object_get(o, "alpha_pattern")), 0);
    json_t *tm = json_object_get(o, "target_modules");
    assert_true(json_is_array(tm));
    assert_int_equal(json_array_size(tm), 3);
    assert_string_equal(json_string_value(json_array_get(tm, 0)), "down_proj");
    assert_string_equal(json_string_value(json_array_get(tm, 1)), "q_proj");
    assert_string_equal(json_string_value(json_array_get(tm, 2)), "v_proj");
    json_decref(o);
    /* the text's keys are sorted, as json.dumps(sort_keys=True) writes them */
    char *path = tmp_path("fields/adapter_config.json");
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char text[16384];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *order[] = {"\"alpha_pattern\"", "\"base_model_name_or_path\"", "\"bias\"",
                           "\"lora_alpha\"", "\"peft_type\"", "\"r\"", "\"target_modules\"",
                           "\"task_type\"", "\"use_rslora\""};
    const char *prev = text;
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        const char *at = strstr(text, order[i]);
        if (!at || at < prev) fail_msg("key %s missing or out of order:\n%s", order[i], text);
        prev = at;
    }
    /* the tensors: PEFT's names (no adapter name), shapes, {"format": "pt"} */
    free(path);
    path = tmp_path("fields/adapter_model.safetensors");
    mt_safetensors *st;
    assert_int_equal(mt_safetensors_open_file(&st, path), MT_OK);
    assert_int_equal(mt_safetensors_count(st), 2 * 2 * 3);
    assert_string_equal(mt_safetensors_metadata(st, "format"), "pt");
    const mt_st_tensor *a = mt_safetensors_find(st, "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
    const mt_st_tensor *b = mt_safetensors_find(st, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
    assert_non_null(a);
    assert_non_null(b);
    assert_true(a->dtype == MT_F32 && a->ndim == 2 && a->shape[0] == 4 && a->shape[1] == 32);
    assert_true(b->ndim == 2 && b->shape[0] == 32 && b->shape[1] == 4);
    mt_safetensors_close(st);
    free(path);
    free(dir);
}

/* A fractional alpha is written as the float it is and read back the same. */
static void test_fractional_alpha(void **state) {
    mt_lora_table lt, back;
    float *arena = random_adapter(&lt, &g_t, 8, 2.5, "o_proj", 4), *got = NULL;
    char *dir = tmp_path("alpha");
    assert_int_equal(mt_lora_save_dir(&lt, arena, dir, "x", MT_F32), MT_OK);
    json_t *o = load_json(dir, "adapter_config.json");
    assert_true(json_is_real(json_object_get(o, "lora_alpha")) &&
                json_real_value(json_object_get(o, "lora_alpha")) == 2.5);
    json_decref(o);
    assert_int_equal(mt_lora_load_dir(dir, &g_t, &back, &got), MT_OK);
    assert_true(back.alpha == 2.5 && back.scale == (float)(2.5 / 8));
    free(got);
    mt_lora_table_free(&back);
    free(dir);
    free(arena);
    mt_lora_table_free(&lt);
}

/* ---- refusals ---- */

/* Loading g_tmp/rel fails with one line holding each needle; nothing is handed out. */
static void expect_refused(const char *rel, const mt_param_table *t, const char *needle,
                           const char *needle2) {
    char *dir = tmp_path(rel);
    mt_lora_table lt;
    memset(&lt, 0x5a, sizeof lt);
    float *arena = (float *)&lt;
    int rc = mt_lora_load_dir(dir, t, &lt, &arena);
    const char *msg = mt_error_message();
    fprintf(stderr, "  %-14s %s\n", rel, msg);
    if (rc != MT_ERR) fail_msg("%s: loaded, want refused with '%s'", rel, needle);
    if (!strstr(msg, needle)) fail_msg("%s: the error does not say '%s': %s", rel, needle, msg);
    if (needle2 && !strstr(msg, needle2)) fail_msg("%s: the error does not say '%s': %s", rel, needle2, msg);
    if (strchr(msg, '\n')) fail_msg("%s: the error is more than one line: %s", rel, msg);
    assert_null(arena);
    assert_null(lt.params);
    assert_int_equal(lt.n_params, 0);
    free(dir);
}

/* A copy of g_tmp/src as g_tmp/rel whose adapter_config.json has key set to the JSON value
 * (NULL: key removed). */
static void edited(const char *src, const char *rel, const char *key, const char *value) {
    mt_test_sh("rm -rf '%s/%s' && cp -r '%s/%s' '%s/%s'", g_tmp, rel, g_tmp, src, g_tmp, rel);
    char *dir = tmp_path(rel);
    json_t *o = load_json(dir, "adapter_config.json");
    if (value) {
        json_error_t je;
        json_t *v = json_loads(value, JSON_DECODE_ANY, &je);
        if (!v) fail_msg("bad test value %s", value);
        json_object_set_new(o, key, v);
    } else {
        json_object_del(o, key);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    assert_int_equal(json_dump_file(o, path, JSON_INDENT(2)), 0);
    json_decref(o);
    free(dir);
}

static void test_refused_config(void **state) {
    save_adapter("good", "q_proj,v_proj,down_proj");
    static const struct {
        const char *key, *value, *needle, *file;
    } cases[] = {
        {"peft_type", "\"LOHA\"", "\"peft_type\" is \"LOHA\": megatrain reads LoRA adapters only"},
        {"peft_type", NULL, "\"peft_type\" is missing"},
        {"use_dora", "true", "\"use_dora\" is true: DoRA"},
        {"use_rslora", "true", "\"use_rslora\" is true: rank-stabilized LoRA"},
        {"fan_in_fan_out", "true", "\"fan_in_fan_out\" is true"},
        {"lora_bias", "true", "\"lora_bias\" is true"},
        {"bias", "\"all\"", "\"bias\" is \"all\""},
        {"bias", "\"lora_only\"", "\"bias\" is \"lora_only\""},
        {"task_type", "\"SEQ_CLS\"", "\"task_type\" is \"SEQ_CLS\""},
        {"modules_to_save", "[\"lm_head\"]", "\"modules_to_save\" is set"},
        {"rank_pattern", "{\"q_proj\": 8}", "\"rank_pattern\" is set"},
        {"alpha_pattern", "{\"q_proj\": 16}", "\"alpha_pattern\" is set"},
        {"layers_to_transform", "[0]", "\"layers_to_transform\" is set"},
        {"exclude_modules", "[\"v_proj\"]", "\"exclude_modules\" is set"},
        {"target_parameters", "[\"mlp.experts.gate_up_proj\"]", "supported on gpt_oss only"},
        {"trainable_token_indices", "[1, 2]", "\"trainable_token_indices\" is set"},
        {"r", NULL, "\"r\" is missing"},
        {"r", "0", "\"r\" must be an integer from 1"},
        {"r", "4.5", "\"r\" must be an integer from 1"},
        {"lora_alpha", NULL, "\"lora_alpha\" is missing"},
        {"lora_alpha", "0", "\"lora_alpha\" must be a number > 0"},
        {"lora_alpha", "\"8\"", "\"lora_alpha\" must be a number > 0"},
        {"target_modules", NULL, "\"target_modules\" is missing"},
        {"target_modules", "null", "\"target_modules\" is missing"},
        {"target_modules", "[]", "\"target_modules\" must be a non-empty list"},
        {"target_modules", "\".*\\\\.(q_proj|v_proj)\"", "is the string \".*\\.(q_proj|v_proj)\": PEFT's regular expressions"},
        {"target_modules", "\"all-linear\"", "\"target_modules\" is \"all-linear\""},
        /* a multimodal model's form, on a text model (PEFT would match nothing there) */
        {"target_modules", "\".*language_model\\\\..*\\\\.(q_proj|v_proj)\"", "PEFT's regular expressions are not supported"},
        {"target_modules", "[\"q_proj\", 3]", "\"target_modules\" entry 1 is not a module name"},
        {"target_modules", "[\"q_proj\", \"w_nope\"]", "\"target_modules\": no module of this llama model is named \"w_nope\""},
        {"target_modules", "[\"embed_tokens\"]", "\"target_modules\": \"embed_tokens\": model.embed_tokens.weight is not a module megatrain adapts"},
        {"target_modules", "[\"lm_head\"]", "\"target_modules\": no module of this llama model is named \"lm_head\""},
        /* the tensors then disagree with the config, each named */
        {"r", "8", "shape [4, 32], expected [8, 32] (r = 8 in adapter_config.json)"},
        {"target_modules", "[\"q_proj\", \"v_proj\"]", "tensor base_model.model.model.layers.0.mlp.down_proj.lora_A.weight is unexpected", "adapter_model.safetensors"},
        {"target_modules", "[\"q_proj\", \"v_proj\", \"down_proj\", \"k_proj\"]", "k_proj.lora_A.weight is missing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char rel[32];
        snprintf(rel, sizeof rel, "bad%02zu", i);
        edited("good", rel, cases[i].key, cases[i].value);
        expect_refused(rel, &g_t, cases[i].needle, cases[i].file ? cases[i].file : "adapter_config.json");
    }
    /* not JSON at all, not an object */
    mt_test_sh("cp -r '%s/good' '%s/notjson' && echo '{\"r\": 4,' > '%s/notjson/adapter_config.json'",
               g_tmp, g_tmp, g_tmp);
    expect_refused("notjson", &g_t, "adapter_config.json: not valid JSON (line", NULL);
    mt_test_sh("cp -r '%s/good' '%s/list' && echo '[1]' > '%s/list/adapter_config.json'", g_tmp, g_tmp, g_tmp);
    expect_refused("list", &g_t, "adapter_config.json: not a JSON object", NULL);
    /* the adapter of another model: every shape differs, the first is named */
    expect_refused("good", &g_vl, "adapter_model.safetensors: tensor ", NULL);
}

/* A plain module name as a string (PEFT would full-match it; megatrain takes it as the one name);
 * an unknown field of a newer PEFT is ignored. */
static void test_accepted_config(void **state) {
    save_adapter("one", "q_proj");
    edited("one", "str", "target_modules", "\"q_proj\"");
    edited("one", "newer", "some_future_field", "{\"x\": 1}");
    const char *ok[] = {"str", "newer"};
    for (int i = 0; i < 2; i++) {
        char *dir = tmp_path(ok[i]);
        mt_lora_table lt;
        float *arena;
        if (mt_lora_load_dir(dir, &g_t, &lt, &arena) != MT_OK) fail_msg("%s: %s", ok[i], mt_error_message());
        assert_int_equal(lt.n_modules, 2);
        free(arena);
        mt_lora_table_free(&lt);
        free(dir);
    }
}

/* g_tmp/rel: g_tmp/tgood's config and a safetensors of its tensors, with drop left out,
 * extra added (a copy of the first tensor's data), the tensor named reshape given shape
 * (r0, r1) and the one named retype written as I32 bits. */
static void rewritten(const char *rel, const char *drop, const char *extra, const char *reshape,
                      int64_t r0, int64_t r1, const char *retype) {
    mt_test_sh("rm -rf '%s/%s' && cp -r '%s/tgood' '%s/%s'", g_tmp, rel, g_tmp, g_tmp, rel);
    char *src = tmp_path("tgood/adapter_model.safetensors");
    char dst[4096];
    snprintf(dst, sizeof dst, "%s/%s/adapter_model.safetensors", g_tmp, rel);
    mt_safetensors *st;
    assert_int_equal(mt_safetensors_open_file(&st, src), MT_OK);
    int n = mt_safetensors_count(st), k = 0;
    mt_st_write_tensor *w = calloc((size_t)n + 1, sizeof *w);
    for (int i = 0; i < n; i++) {
        const mt_st_tensor *x = mt_safetensors_at(st, i);
        if (drop && strcmp(x->name, drop) == 0) continue;
        w[k] = (mt_st_write_tensor){x->name, x->dtype, x->ndim, {x->shape[0], x->shape[1]}, x->data};
        if (reshape && strcmp(x->name, reshape) == 0) {
            assert_true(r0 * r1 <= x->numel);
            w[k].shape[0] = r0, w[k].shape[1] = r1;
        }
        if (retype && strcmp(x->name, retype) == 0) w[k].dtype = MT_I32;
        k++;
    }
    if (extra) {
        const mt_st_tensor *x = mt_safetensors_at(st, 0);
        w[k++] = (mt_st_write_tensor){extra, x->dtype, x->ndim, {x->shape[0], x->shape[1]}, x->data};
    }
    assert_int_equal(mt_safetensors_write(dst, w, k, NULL, 0), MT_OK);
    mt_safetensors_close(st);
    free(w);
    free(src);
}

static void test_refused_tensors(void **state) {
    save_adapter("tgood", "q_proj,v_proj");
    const char *qa = "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight";
    const char *vb = "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight";
    rewritten("t_missing", vb, NULL, NULL, 0, 0, NULL);
    expect_refused("t_missing", &g_t, "adapter_model.safetensors: tensor " "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight is missing", NULL);
    rewritten("t_extra", NULL, "base_model.model.lm_head.lora_A.weight", NULL, 0, 0, NULL);
    expect_refused("t_extra", &g_t, "adapter_model.safetensors: tensor base_model.model.lm_head.lora_A.weight is unexpected", NULL);
    /* keys that carry the adapter name ("default") are not PEFT's saved names */
    rewritten("t_named", NULL, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",
              NULL, 0, 0, NULL);
    expect_refused("t_named", &g_t, "lora_A.default.weight is unexpected", NULL);
    rewritten("t_shape", NULL, NULL, qa, 4, 31, NULL);
    expect_refused("t_shape", &g_t, "tensor base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight: shape [4, 31], expected [4, 32]", NULL);
    rewritten("t_transposed", NULL, NULL, qa, 32, 4, NULL);
    expect_refused("t_transposed", &g_t, "q_proj.lora_A.weight: shape [32, 4], expected [4, 32]", NULL);
    rewritten("t_dtype", NULL, NULL, NULL, 0, 0, vb);
    expect_refused("t_dtype", &g_t, "v_proj.lora_B.weight: dtype I32, expected F32, BF16 or F16", NULL);
    /* files missing */
    mt_test_sh("cp -r '%s/tgood' '%s/t_bin' && mv '%s/t_bin/adapter_model.safetensors' '%s/t_bin/adapter_model.bin'",
               g_tmp, g_tmp, g_tmp, g_tmp);
    expect_refused("t_bin", &g_t, "adapter_model.bin is PEFT's pickle format", "safe_serialization=True");
    mt_test_sh("cp -r '%s/tgood' '%s/t_none' && rm '%s/t_none/adapter_model.safetensors'", g_tmp, g_tmp, g_tmp);
    expect_refused("t_none", &g_t, "t_none/adapter_model.safetensors: cannot open", NULL);
    mt_test_sh("cp -r '%s/tgood' '%s/t_nocfg' && rm '%s/t_nocfg/adapter_config.json'", g_tmp, g_tmp, g_tmp);
    expect_refused("t_nocfg", &g_t, "t_nocfg/adapter_config.json: cannot open", NULL);
    expect_refused("nowhere", &g_t, "nowhere: cannot open", NULL);
    expect_refused("tgood/adapter_config.json", &g_t, "not a directory", NULL);
    mt_test_sh("printf 'garbage' > '%s/t_none/adapter_model.safetensors'", g_tmp);
    expect_refused("t_none", &g_t, "t_none/adapter_model.safetensors", NULL);
}

/* A multimodal model's adapter is saved as PEFT names it there (model.language_model.layers...,
 * target_modules the regular expression that keeps the vision tower out) and loads back; the text
 * model's names (model.layers..., as megatrain wrote them before) load as well; one of each for the
 * same tensor is refused. */
static void test_nested_keys(void **state) {
    mt_lora_table lt, back;
    float *arena = random_adapter(&lt, &g_vl, 2, 4, "q_proj,in_proj_qkv", 5), *got = NULL;
    assert_non_null(mt_lora_find_name(&lt, "base_model.model.model.language_model.layers.3.self_attn.q_proj.lora_A.weight"));
    char *dir = tmp_path("vl");
    assert_int_equal(mt_lora_save_dir(&lt, arena, dir, "qwen3_5_vl_mtp", MT_F32), MT_OK);
    char *cfg = tmp_path("vl/adapter_config.json");
    json_t *o = json_load_file(cfg, 0, NULL);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "target_modules")),
                        ".*language_model\\..*\\.(in_proj_qkv|q_proj)");
    json_decref(o);
    free(cfg);
    assert_int_equal(mt_lora_load_dir(dir, &g_vl, &back, &got), MT_OK);
    assert_memory_equal(got, arena, (size_t)lt.total * sizeof(float));
    free(got);
    mt_lora_table_free(&back);
    mt_st_write_tensor *w = calloc((size_t)lt.n_params + 1, sizeof *w);
    char (*names)[200] = calloc((size_t)lt.n_params + 1, sizeof *names);
    for (int i = 0; i < lt.n_params; i++) {
        const mt_lora_param *p = &lt.params[i];
        snprintf(names[i], sizeof names[i], "base_model.model.model.%s",
                 p->name + strlen("base_model.model.model.language_model."));
        w[i] = (mt_st_write_tensor){names[i], MT_F32, 2, {p->shape[0], p->shape[1]}, arena + p->offset};
    }
    char *path = tmp_path("vl/adapter_model.safetensors");
    assert_int_equal(mt_safetensors_write(path, w, lt.n_params, NULL, 0), MT_OK);
    assert_int_equal(mt_lora_load_dir(dir, &g_vl, &back, &got), MT_OK);
    assert_memory_equal(got, arena, (size_t)lt.total * sizeof(float));
    free(got);
    mt_lora_table_free(&back);
    /* both spellings of one tensor */
    const mt_lora_param *p = &lt.params[0];
    w[lt.n_params] = (mt_st_write_tensor){p->name, MT_F32, 2, {p->shape[0], p->shape[1]}, arena + p->offset};
    assert_int_equal(mt_safetensors_write(path, w, lt.n_params + 1, NULL, 0), MT_OK);
    expect_refused("vl", &g_vl, "are the same adapter tensor", NULL);
    /* the multimodal form with an empty name, or anything else after its head, is refused */
    edited("vl", "vl_rx", "target_modules", "\".*language_model\\\\..*\\\\.(q_proj||in_proj_qkv)\"");
    expect_refused("vl_rx", &g_vl, "keeps the vision tower out", "adapter_config.json");
    edited("vl", "vl_rx2", "target_modules", "\".*language_model\\\\..*\\\\.(q_proj|in_proj_.*)\"");
    expect_refused("vl_rx2", &g_vl, "PEFT's regular expressions are not supported", "adapter_config.json");
    /* a text-only model takes no language_model key */
    free(path);
    free(names);
    free(w);
    free(dir);
    free(arena);
    mt_lora_table_free(&lt);
}

static void test_save_refusals(void **state) {
    mt_lora_table lt;
    float *arena = random_adapter(&lt, &g_t, 2, 4, "q_proj", 6);
    char *dir = tmp_path("s_f16");
    assert_int_equal(mt_lora_save_dir(&lt, arena, dir, NULL, MT_F16), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "adapters are saved as F32 or BF16, not F16"));
    struct stat sb;
    assert_int_not_equal(stat(dir, &sb), 0);
    free(dir);
    mt_test_sh("echo x > '%s/s_file'", g_tmp);
    dir = tmp_path("s_file");
    assert_int_equal(mt_lora_save_dir(&lt, arena, dir, NULL, MT_F32), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "s_file: exists and is not a directory"));
    free(dir);
    dir = tmp_path("s_file/sub");
    assert_int_equal(mt_lora_save_dir(&lt, arena, dir, NULL, MT_F32), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "s_file"));
    free(dir);
    free(arena);
    mt_lora_table_free(&lt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_f32),  cmocka_unit_test(test_round_trip_bf16),
        cmocka_unit_test(test_read_f16),        cmocka_unit_test(test_config_fields),
        cmocka_unit_test(test_fractional_alpha), cmocka_unit_test(test_refused_config),
        cmocka_unit_test(test_accepted_config), cmocka_unit_test(test_refused_tensors),
        cmocka_unit_test(test_nested_keys),     cmocka_unit_test(test_save_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
