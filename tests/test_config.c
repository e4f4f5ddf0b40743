/* config.json parsing, refusals, save/load and the derived numbers (param count, RoPE).
 *
 * Reference configs in tests/data/configs are the published config.json files of real models
 * (llama-3.1-8b-v5.json is llama-3.1-8b.json as transformers 5.24 save_pretrained wrote it).
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "model/config.h"
#include "util/config_check.h"
#include "util/testutil.h"

static mt_config load_ref(const char *name) { return mt_test_config_load("../data/configs/%s", name); }

static void assert_config_equal(const mt_config *a, const mt_config *b) {
    assert_int_equal(a->arch, b->arch);
    assert_string_equal(a->model_type, b->model_type);
    assert_int_equal(a->C, b->C);
    assert_int_equal(a->F, b->F);
    assert_int_equal(a->L, b->L);
    assert_int_equal(a->H, b->H);
    assert_int_equal(a->G, b->G);
    assert_int_equal(a->D, b->D);
    assert_int_equal(a->V, b->V);
    assert_true(a->rms_norm_eps == b->rms_norm_eps);
    assert_true(a->rope_theta == b->rope_theta);
    assert_int_equal(a->rope_type, b->rope_type);
    assert_true(a->rope_factor == b->rope_factor);
    assert_true(a->rope_low_freq_factor == b->rope_low_freq_factor);
    assert_true(a->rope_high_freq_factor == b->rope_high_freq_factor);
    assert_int_equal(a->rope_original_max_pos, b->rope_original_max_pos);
    assert_int_equal(a->max_position_embeddings, b->max_position_embeddings);
    assert_int_equal(a->tie_word_embeddings, b->tie_word_embeddings);
    assert_int_equal(a->qkv_bias, b->qkv_bias);
    assert_int_equal(a->o_bias, b->o_bias);
    assert_int_equal(a->mlp_bias, b->mlp_bias);
    assert_int_equal(a->qk_norm, b->qk_norm);
    assert_int_equal(a->sliding_window, b->sliding_window);
    assert_true(a->initializer_range == b->initializer_range);
    assert_int_equal(a->bos_token_id, b->bos_token_id);
    assert_int_equal(a->eos_token_id, b->eos_token_id);
}

/* ---- each family ---- */

static void test_llama2(void **state) {
    mt_config c = load_ref("llama-2-7b.json");
    assert_int_equal(c.arch, MT_ARCH_LLAMA);
    assert_string_equal(c.model_type, "llama");
    assert_int_equal(c.C, 4096); assert_int_equal(c.F, 11008); assert_int_equal(c.L, 32);
    assert_int_equal(c.H, 32); assert_int_equal(c.G, 32); assert_int_equal(c.D, 128);
    assert_int_equal(c.V, 32000);
    assert_true(c.rms_norm_eps == 1e-5f);
    assert_true(c.rope_theta == 10000.0); /* absent: transformers' default_theta */
    assert_int_equal(c.rope_type, MT_ROPE_DEFAULT);
    assert_int_equal(c.max_position_embeddings, 4096);
    assert_int_equal(c.tie_word_embeddings, 0);
    assert_int_equal(c.qkv_bias + c.o_bias + c.mlp_bias + c.qk_norm + c.sliding_window, 0);
    assert_int_equal(c.bos_token_id, 1); assert_int_equal(c.eos_token_id, 2);
}

static void test_llama31(void **state) {
    mt_config c = load_ref("llama-3.1-8b.json");
    assert_int_equal(c.G, 8);
    assert_int_equal(c.V, 128256);
    assert_true(c.rope_theta == 500000.0);
    assert_int_equal(c.rope_type, MT_ROPE_LLAMA3);
    assert_true(c.rope_factor == 8.0);
    assert_true(c.rope_low_freq_factor == 1.0);
    assert_true(c.rope_high_freq_factor == 4.0);
    assert_int_equal(c.rope_original_max_pos, 8192);
    assert_int_equal(c.max_position_embeddings, 131072);
    assert_int_equal(c.bos_token_id, 128000); assert_int_equal(c.eos_token_id, 128001);
}

static void test_llama32_tied_eos_list(void **state) {
    mt_config c = load_ref("llama-3.2-1b-instruct.json");
    assert_int_equal(c.D, 64);
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_true(c.rope_factor == 32.0);
    assert_int_equal(c.eos_token_id, 128001); /* first of [128001, 128008, 128009] */
}

static void test_mistral(void **state) {
    mt_config c = load_ref("mistral-7b-v0.1.json");
    assert_int_equal(c.arch, MT_ARCH_MISTRAL);
    assert_int_equal(c.F, 14336); assert_int_equal(c.G, 8); assert_int_equal(c.D, 128);
    assert_int_equal(c.sliding_window, 4096);
    assert_int_equal(c.max_position_embeddings, 32768);
    assert_int_equal(c.qkv_bias + c.o_bias + c.mlp_bias + c.qk_norm, 0);
}

static void test_qwen25(void **state) {
    mt_config c = load_ref("qwen2.5-0.5b.json");
    assert_int_equal(c.arch, MT_ARCH_QWEN2);
    assert_int_equal(c.C, 896); assert_int_equal(c.H, 14); assert_int_equal(c.G, 2);
    assert_int_equal(c.D, 64);
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_int_equal(c.qkv_bias, 1); assert_int_equal(c.o_bias, 0); assert_int_equal(c.mlp_bias, 0);
    assert_int_equal(c.sliding_window, 0); /* sliding_window is ignored without use_sliding_window */
    assert_true(c.rms_norm_eps == 1e-6f);
    assert_true(c.rope_theta == 1e6);
    c = load_ref("qwen2.5-7b.json");
    assert_int_equal(c.C, 3584); assert_int_equal(c.F, 18944); assert_int_equal(c.G, 4);
    assert_int_equal(c.V, 152064); assert_int_equal(c.tie_word_embeddings, 0);
}

static void test_qwen3(void **state) {
    mt_config c = load_ref("qwen3-0.6b.json");
    assert_int_equal(c.arch, MT_ARCH_QWEN3);
    assert_int_equal(c.C, 1024); assert_int_equal(c.H, 16); assert_int_equal(c.G, 8);
    assert_int_equal(c.D, 128); /* != C / H */
    assert_int_equal(c.qk_norm, 1);
    assert_int_equal(c.qkv_bias + c.o_bias + c.mlp_bias, 0);
    assert_true(c.rope_theta == 1e6); /* written as the integer 1000000 */
    assert_int_equal(c.eos_token_id, 151645);
}

/* Expected numbers: sum(p.numel() for p in model.parameters()) of
 * `with torch.device("meta"): AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(f))`,
 * transformers 5.24 in /opt/fixenv (tied embeddings counted once). */
static void test_param_counts(void **state) {
    static const struct { const char *file; int64_t n; } ref[] = {
        {"llama-2-7b.json", 6738415616LL},
        {"llama-3.1-8b.json", 8030261248LL},
        {"llama-3.2-1b-instruct.json", 1235814400LL},
        {"mistral-7b-v0.1.json", 7241732096LL},
        {"qwen2.5-0.5b.json", 494032768LL},
        {"qwen2.5-7b.json", 7615616512LL},
        {"qwen3-0.6b.json", 596049920LL},
    };
    for (size_t i = 0; i < sizeof ref / sizeof ref[0]; i++) {
        mt_config c = load_ref(ref[i].file);
        assert_int_equal(mt_config_param_count(&c), ref[i].n);
    }
    /* the bias and head_dim variants, same method */
    static const struct { const char *json; int64_t n; } inl[] = {
        {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 100,"
         " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
         " \"vocab_size\": 99, \"attention_bias\": true, \"mlp_bias\": true, \"head_dim\": 32}",
         101712},
        {"{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"intermediate_size\": 100,"
         " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
         " \"vocab_size\": 99, \"attention_bias\": true}", 250688},
        {"{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"intermediate_size\": 100,"
         " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
         " \"vocab_size\": 99, \"head_dim\": 24}", 88640},
    };
    for (size_t i = 0; i < sizeof inl / sizeof inl[0]; i++) {
        mt_config c;
        assert_int_equal(mt_config_parse(&c, inl[i].json, "config.json"), MT_OK);
        assert_int_equal(mt_config_param_count(&c), inl[i].n);
    }
}

static void test_v4_v5_rope_equal(void **state) {
    mt_config a = load_ref("llama-3.1-8b.json");
    mt_config b = load_ref("llama-3.1-8b-v5.json");
    assert_config_equal(&a, &b);
}

/* ---- inline JSON helpers ---- */

static const char *base_json =
    "{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"intermediate_size\": 128,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"head_dim\": 32, \"vocab_size\": 100, \"rope_theta\": 10000.0, \"hidden_act\": \"silu\"}";

/* base_json with `key` set to `value` (JSON text), or removed when value is NULL. */
static char *with_field(const char *base, const char *key, const char *value) {
    json_t *root = json_loads(base, 0, NULL);
    assert_non_null(root);
    if (value) {
        json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
        assert_non_null(v);
        json_object_set_new(root, key, v);
    } else {
        json_object_del(root, key);
    }
    char *s = json_dumps(root, 0);
    json_decref(root);
    return s;
}

static int parse_with(mt_config *c, const char *base, const char *key, const char *value) {
    char *s = with_field(base, key, value);
    int r = mt_config_parse(c, s, "config.json");
    free(s);
    return r;
}

static void expect_refused(const char *base, const char *key, const char *value, const char *needle) {
    mt_config c;
    mt_error_clear();
    int r = parse_with(&c, base, key, value);
    const char *msg = mt_error_message();
    if (r != MT_ERR || !strstr(msg, needle) || !strstr(msg, "config.json"))
        print_error("%s=%s: got r=%d message \"%s\", wanted \"%s\"\n", key, value ? value : "(del)",
                    r, msg, needle);
    assert_int_equal(r, MT_ERR);
    assert_non_null(strstr(msg, needle));
    assert_non_null(strstr(msg, "config.json"));
}

static void test_refusals(void **state) {
    static const struct { const char *key, *value, *needle; } cases[] = {
        {"model_type", NULL, "model_type"},
        {"model_type", "\"gemma\"", "model_type \"gemma\""},
        {"model_type", "3", "model_type"},
        {"hidden_act", "\"gelu\"", "hidden_act \"gelu\""},
        {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}",
         "rope_scaling.rope_type \"yarn\" is not supported (supported: default, llama3)"},
        {"rope_scaling", "{\"type\": \"dynamic\", \"factor\": 2.0}", "rope_scaling.type \"dynamic\""},
        {"rope_parameters", "{\"rope_type\": \"linear\", \"rope_theta\": 1e4, \"factor\": 2.0}",
         "rope_parameters.rope_type \"linear\""},
        {"rope_scaling", "\"llama3\"", "rope_scaling"},
        {"rope_scaling", "{\"rope_type\": \"llama3\", \"low_freq_factor\": 1.0, "
                         "\"high_freq_factor\": 4.0}", "rope_scaling.factor"},
        {"rope_parameters", "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0}",
         "rope_parameters.high_freq_factor"},
        {"rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4,"
                         " \"high_freq_factor\": 1}", "high_freq_factor"},
        {"rms_norm_eps", "0", "rms_norm_eps"},
        {"rms_norm_eps", "1e205", "rms_norm_eps = inf must be positive and fit a float32"},
        {"initializer_range", "-1e39", "initializer_range = -inf must fit a float32"},
        {"max_position_embeddings", "0", "max_position_embeddings"},
        {"partial_rotary_factor", "0.5", "partial_rotary_factor"},
        {"rope_parameters", "{\"rope_type\": \"default\", \"partial_rotary_factor\": 0.5}",
         "rope_parameters.partial_rotary_factor"},
        {"use_sliding_window", "true", "use_sliding_window"},
        {"layer_types", "[\"full_attention\", \"sliding_attention\"]", "layer_types[1]"},
        {"num_experts", "8", "num_experts"},
        {"num_local_experts", "8", "num_local_experts"},
        {"num_experts_per_tok", "2", "num_experts_per_tok"},
        {"attention_dropout", "0.1", "attention_dropout"},
        {"hidden_size", NULL, "hidden_size"},
        {"intermediate_size", NULL, "intermediate_size"},
        {"num_hidden_layers", NULL, "num_hidden_layers"},
        {"num_attention_heads", NULL, "num_attention_heads"},
        {"vocab_size", NULL, "vocab_size"},
        {"hidden_size", "\"64\"", "hidden_size"},
        {"num_hidden_layers", "2.5", "num_hidden_layers"},
        {"num_hidden_layers", "0", "num_hidden_layers"},
        {"vocab_size", "-5", "vocab_size"},
        {"num_key_value_heads", "3", "num_key_value_heads"},
        {"num_key_value_heads", "0", "num_key_value_heads"},
        {"head_dim", "31", "head_dim"},
        {"tie_word_embeddings", "\"yes\"", "tie_word_embeddings"},
        {"rms_norm_eps", "\"1e-6\"", "rms_norm_eps"},
        {"rope_theta", "\"1e4\"", "rope_theta"},
        {"rope_theta", "-1.0", "rope_theta"},
        {"eos_token_id", "\"</s>\"", "eos_token_id"},
        {"attention_bias", "1", "attention_bias"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_refused(base_json, cases[i].key, cases[i].value, cases[i].needle);
    /* llama: hidden_size must be a multiple of the heads (LlamaConfig refuses it too) */
    char *llama = with_field(base_json, "model_type", "\"llama\"");
    expect_refused(llama, "hidden_size", "66", "hidden_size");
    free(llama);
}

/* Absurd sizes are bad input naming the field, not an out-of-memory fatal or an int64 overflow
 * of the parameter count later. */
static void test_absurd_sizes(void **state) {
    static const struct { const char *key, *value, *needle; } cases[] = {
        {"num_hidden_layers", "2000000000", "num_hidden_layers = 2000000000 is larger than"},
        {"hidden_size", "1000000000", "hidden_size = 1000000000 is larger than"},
        {"intermediate_size", "2000000000", "intermediate_size = 2000000000 is larger than"},
        {"vocab_size", "1000000000000", "vocab_size"},
        {"vocab_size", "100000000", "vocab_size = 100000000 is larger than"},
        {"num_attention_heads", "1048576", "num_attention_heads = 1048576 is larger than"},
        {"num_key_value_heads", "1048576", "num_key_value_heads"},
        {"head_dim", "1048576", "head_dim = 1048576 is larger than"},
        {"max_position_embeddings", "2000000000", "max_position_embeddings = 2000000000 is larger"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_refused(base_json, cases[i].key, cases[i].value, cases[i].needle);
    /* each field within its bound, the products not: H * D (the q projection's rows) */
    char *heads = with_field(base_json, "num_attention_heads", "128");
    expect_refused(heads, "head_dim", "16384", "num_attention_heads * head_dim = 128 * 16384");
    free(heads);
    /* and the total: C = F = 2^20 with 16384 layers is ~5.4e16 parameters (petabytes) */
    char *wide = with_field(base_json, "hidden_size", "1048576");
    char *wider = with_field(wide, "intermediate_size", "1048576");
    expect_refused(wider, "num_hidden_layers", "16384", "more than megatrain's limit 2^40");
    free(wide);
    free(wider);
    /* the largest published dense model still parses (Llama 3.1 405B) */
    mt_config c = load_ref("llama-3.1-8b.json");
    c.C = 16384, c.F = 53248, c.L = 126, c.H = 128, c.G = 8, c.D = 128;
    assert_int_equal(mt_config_validate(&c, "config.json"), MT_OK);
    assert_true(mt_config_param_count(&c) > 400000000000LL);
}

/* The CLI: `megatrain info --init huge.json` is one error line naming the file, exit 1. */
static void test_cli_absurd_config(void **state) {
    mt_cli_env env;
    assert_int_equal(mt_cli_env_init(&env, "train_llama"), 0);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", env.fixture);
    json_t *cfg = json_load_file(path, 0, NULL);
    assert_non_null(cfg);
    json_object_set_new(cfg, "num_hidden_layers", json_integer(2000000000));
    snprintf(path, sizeof path, "%s/huge.json", env.tmp);
    assert_int_equal(json_dump_file(cfg, path, 0), 0);
    json_decref(cfg);
    static char out[65536];
    char first[1024];
    int rc = mt_cli_run(&env, out, sizeof out, "info --init huge.json 2>&1");
    mt_cli_expect(rc, 1, out, "huge.json: num_hidden_layers = 2000000000 is larger than");
    assert_int_equal(mt_cli_error_lines(out, first, sizeof first), 1);
    mt_cli_env_free(&env);
}

static void test_bad_json(void **state) {
    mt_config c;
    memset(&c, 0x5a, sizeof c);
    mt_config before = c;
    const char *bad = "{\"model_type\": \"llama\",\n  \"hidden_size\": }";
    assert_int_equal(mt_config_parse(&c, bad, "x/config.json"), MT_ERR);
    const char *msg = mt_error_message();
    assert_non_null(strstr(msg, "x/config.json"));
    assert_non_null(strstr(msg, "line 2"));
    assert_memory_equal(&c, &before, sizeof c); /* untouched on error */
    assert_int_equal(mt_config_parse(&c, "[1, 2]", "config.json"), MT_ERR);
    assert_int_equal(mt_config_load(&c, "/nonexistent/config.json"), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "/nonexistent/config.json"));
}

/* Absent fields take the transformers 5 class defaults of each model_type. */
static void test_defaults(void **state) {
    static const char *minimal =
        "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128,"
        " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100}";
    mt_config c;
    assert_int_equal(mt_config_parse(&c, minimal, "config.json"), MT_OK);
    assert_int_equal(c.G, 4); assert_int_equal(c.D, 16);
    assert_true(c.rms_norm_eps == 1e-6f);
    assert_true(c.rope_theta == 10000.0);
    assert_int_equal(c.rope_type, MT_ROPE_DEFAULT);
    assert_int_equal(c.max_position_embeddings, 2048);
    assert_true(c.initializer_range == 0.02f);
    assert_int_equal(c.tie_word_embeddings, 0);
    assert_int_equal(c.bos_token_id, -1); assert_int_equal(c.eos_token_id, -1);

    char *mistral0 = with_field(minimal, "model_type", "\"mistral\"");
    char *mistral = with_field(mistral0, "num_attention_heads", "16");
    free(mistral0);
    assert_int_equal(mt_config_parse(&c, mistral, "config.json"), MT_OK);
    assert_int_equal(c.G, 8); /* MistralConfig.num_key_value_heads = 8 */
    assert_int_equal(c.max_position_embeddings, 4096 * 32);
    assert_int_equal(c.sliding_window, 4096);
    assert_int_equal(parse_with(&c, mistral, "sliding_window", "null"), MT_OK);
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(parse_with(&c, mistral, "num_key_value_heads", "null"), MT_OK);
    assert_int_equal(c.G, 16); /* explicit null: = H */
    free(mistral);

    char *qwen2_0 = with_field(minimal, "model_type", "\"qwen2\"");
    char *qwen2 = with_field(qwen2_0, "num_attention_heads", "32");
    free(qwen2_0);
    assert_int_equal(mt_config_parse(&c, qwen2, "config.json"), MT_OK);
    assert_int_equal(c.G, 32); assert_int_equal(c.D, 2); /* Qwen2Config: kv heads 32, D = C/H */
    assert_int_equal(c.qkv_bias, 1); assert_int_equal(c.o_bias, 0);
    assert_int_equal(c.max_position_embeddings, 32768);
    assert_int_equal(parse_with(&c, qwen2, "attention_bias", "true"), MT_OK); /* not a Qwen2 field */
    assert_int_equal(c.o_bias, 0);
    free(qwen2);

    char *qwen3_0 = with_field(minimal, "model_type", "\"qwen3\"");
    char *qwen3 = with_field(qwen3_0, "num_attention_heads", "32");
    free(qwen3_0);
    assert_int_equal(mt_config_parse(&c, qwen3, "config.json"), MT_OK);
    assert_int_equal(c.G, 32); assert_int_equal(c.D, 128); /* Qwen3Config.head_dim = 128 */
    assert_int_equal(c.qk_norm, 1);
    assert_int_equal(parse_with(&c, qwen3, "attention_bias", "true"), MT_OK);
    assert_int_equal(c.qkv_bias, 1); assert_int_equal(c.o_bias, 1); assert_int_equal(c.mlp_bias, 0);
    free(qwen3);

    char *llama = with_field(minimal, "attention_bias", "true");
    assert_int_equal(parse_with(&c, llama, "mlp_bias", "true"), MT_OK);
    assert_int_equal(c.qkv_bias + c.o_bias + c.mlp_bias, 3);
    free(llama);
}

/* transformers 5 precedence: rope_scaling over rope_parameters, the dict's rope_theta over the
 * top-level one, rope_type over type; original_max_position_embeddings defaults to max_pos. */
static void test_rope_precedence(void **state) {
    mt_config c;
    assert_int_equal(parse_with(&c, base_json, "rope_parameters",
                                "{\"rope_type\": \"default\", \"rope_theta\": 1e6}"), MT_OK);
    assert_true(c.rope_theta == 1e6);
    char *both = with_field(base_json, "rope_parameters", "{\"rope_type\": \"linear\", \"factor\": 2}");
    assert_int_equal(parse_with(&c, both, "rope_scaling",
                                "{\"type\": \"yarn\", \"rope_type\": \"llama3\", \"factor\": 8,"
                                " \"low_freq_factor\": 1, \"high_freq_factor\": 4}"), MT_OK);
    assert_int_equal(c.rope_type, MT_ROPE_LLAMA3);
    assert_int_equal(c.rope_original_max_pos, 32768); /* Qwen3 max_position_embeddings default */
    assert_true(c.rope_theta == 10000.0);
    free(both);
    char *top = with_field(base_json, "original_max_position_embeddings", "4096");
    assert_int_equal(parse_with(&c, top, "rope_parameters",
                                "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1,"
                                " \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}"),
                     MT_OK);
    assert_int_equal(c.rope_original_max_pos, 8192); /* transformers 5 ignores the top-level one */
    free(top);
    assert_int_equal(parse_with(&c, base_json, "rope_scaling", "{}"), MT_OK);
    assert_int_equal(c.rope_type, MT_ROPE_DEFAULT);
}

/* Values of LlamaRotaryEmbedding(config).inv_freq, transformers 5.24 (float32, printed %.9e). */
static void check_inv_freq(const char *file, const int *idx, const float *hf, int n) {
    mt_config c = load_ref(file);
    float *inv = malloc(sizeof(float) * (size_t)c.D / 2);
    mt_config_rope_inv_freq(&c, inv);
    for (int i = 0; i < n; i++) {
        double err = fabs((double)inv[idx[i]] - hf[i]) / hf[i];
        if (err > 2.4e-7) print_error("%s inv_freq[%d] = %.9e, transformers %.9e\n", file, idx[i],
                                      inv[idx[i]], hf[i]);
        assert_true(err <= 2.4e-7); /* 2 ulp: transformers computes the powers in fp32 */
    }
    free(inv);
}

static void test_rope_inv_freq(void **state) {
    static const int i31[] = {0, 1, 7, 15, 20, 25, 29, 30, 31, 61, 63};
    static const float h31[] = {1.000000000e+00f, 8.146172166e-01f, 2.380538136e-01f,
                                4.616405070e-02f, 1.656044088e-02f, 5.940730684e-03f,
                                2.166570630e-03f, 1.371893683e-03f, 8.567514597e-04f,
                                4.624653798e-07f, 3.068925878e-07f};
    check_inv_freq("llama-3.1-8b.json", i31, h31, 11); /* 29..31: the smoothed band */
    static const int i32[] = {0, 1, 7, 12, 15, 20, 22, 25, 31};
    static const float h32[] = {1.000000000e+00f, 6.636012793e-01f, 5.666961893e-02f,
                                7.292665076e-03f, 1.290548011e-03f, 8.570255886e-06f,
                                3.774054449e-06f, 1.102883630e-06f, 9.418306490e-08f};
    check_inv_freq("llama-3.2-1b-instruct.json", i32, h32, 9);
    static const int iq3[] = {0, 1, 7, 15, 20, 25, 27, 28, 29, 30, 31, 61, 63};
    static const float hq3[] = {1.000000000e+00f, 8.058422208e-01f, 2.206733972e-01f,
                                3.924189880e-02f, 1.333521493e-02f, 4.531583749e-03f,
                                2.942727180e-03f, 2.371373819e-03f, 1.910952851e-03f,
                                1.539926510e-03f, 1.240937854e-03f, 1.910952960e-06f,
                                1.240937763e-06f};
    check_inv_freq("qwen3-0.6b.json", iq3, hq3, 13);
    static const int il2[] = {0, 1, 7, 15, 20, 25, 30, 31, 41, 42, 43, 61, 63};
    static const float hl2[] = {1.000000000e+00f, 8.659643531e-01f, 3.651741445e-01f,
                                1.154782027e-01f, 5.623412877e-02f, 2.738419548e-02f,
                                1.333521493e-02f, 1.154781971e-02f, 2.738419687e-03f,
                                2.371373819e-03f, 2.053525066e-03f, 1.539926452e-04f,
                                1.154781930e-04f};
    check_inv_freq("llama-2-7b.json", il2, hl2, 13);
}

static void test_save_roundtrip(void **state) {
    static const char *files[] = {"llama-2-7b.json", "llama-3.1-8b.json",
                                  "llama-3.2-1b-instruct.json", "mistral-7b-v0.1.json",
                                  "qwen2.5-0.5b.json", "qwen2.5-7b.json", "qwen3-0.6b.json"};
    char *dir = mt_test_tmpdir();
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        mt_config a = load_ref(files[i]), b;
        assert_int_equal(mt_config_save(&a, path), MT_OK);
        assert_int_equal(access(tmp, F_OK), -1); /* renamed away */
        assert_int_equal(mt_config_load(&b, path), MT_OK);
        assert_config_equal(&a, &b);
    }
    /* a llama with every bias and a mistral without a window */
    mt_config a = load_ref("llama-2-7b.json"), b;
    a.qkv_bias = a.o_bias = a.mlp_bias = 1;
    a.rms_norm_eps = 3.3e-7f;
    a.rope_theta = 123456.789;
    assert_int_equal(mt_config_save(&a, path), MT_OK);
    assert_int_equal(mt_config_load(&b, path), MT_OK);
    assert_config_equal(&a, &b);
    a = load_ref("mistral-7b-v0.1.json");
    a.sliding_window = 0;
    assert_int_equal(mt_config_save(&a, path), MT_OK);
    assert_int_equal(mt_config_load(&b, path), MT_OK);
    assert_config_equal(&a, &b);
    /* an invalid config is not written */
    a.G = 7;
    assert_int_equal(mt_config_save(&a, path), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "num_key_value_heads"));
    assert_int_equal(mt_config_save(&a, "/nonexistent/dir/config.json"), MT_ERR);
    mt_test_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_llama31),
        cmocka_unit_test(test_llama32_tied_eos_list),
        cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_qwen25),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_param_counts),
        cmocka_unit_test(test_v4_v5_rope_equal),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_absurd_sizes),
        cmocka_unit_test(test_cli_absurd_config),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_rope_precedence),
        cmocka_unit_test(test_rope_inv_freq),
        cmocka_unit_test(test_save_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
