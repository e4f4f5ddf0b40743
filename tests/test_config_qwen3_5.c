/* The Qwen3.5 / Qwen3.6 family's config.json (qwen3_5, qwen3_5_moe, nested in text_config or
 * not): layer types, the Gated DeltaNet's shapes, partial RoPE, the shared expert; the parameter
 * table's tensors per layer type; counts checked against hand arithmetic; refusals by name.
 *
 * configs/qwen3.5-27b.json and configs/qwen3.6-35b-a3b.json carry the published shapes (hidden
 * 5120, 64 layers, 24/4 heads of 256, MLP 17408, linear heads 16 x 128 keys and 48 x 128 values;
 * hidden 2048, 40 layers, 16/2 heads, 256 experts of 512, top 8, shared expert 512, linear
 * 16 + 32 heads) in the nesting the published multimodal checkpoints use.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "model/config.h"
#include "model/layer.h"
#include "model/params.h"
#include "io/model_io.h"
#include "util/config_check.h"
#include "util/testutil.h"

static mt_config load_shape(const char *name) { return mt_test_config_load("../../configs/%s", name); }

static void test_dense_27b(void **state) {
    (void)state;
    mt_config c = load_shape("qwen3.5-27b.json");
    assert_int_equal(c.arch, MT_ARCH_QWEN3_5);
    assert_string_equal(c.model_type, "qwen3_5");
    assert_int_equal(c.nested, 1);
    assert_int_equal(c.L, 64);
    assert_int_equal(c.D, 256);
    assert_int_equal(mt_config_rotary_dim(&c), 64); /* 256 * 0.25 */
    assert_int_equal(c.norm_offset, 1);
    assert_int_equal(c.attn_gate, 1);
    assert_int_equal(c.qk_norm, 1);
    assert_int_equal(c.lin_Hk, 16);
    assert_int_equal(c.lin_Hv, 48);
    assert_true(c.rope_theta == 1e7);
    for (int l = 0; l < c.L; l++) /* full_attention_interval 4: layers 3, 7, ... are attention */
        assert_int_equal(mt_config_layer_mixer(&c, l), l % 4 == 3 ? MT_MIXER_ATTENTION : MT_MIXER_GATED_DELTANET);
    assert_int_equal(mt_config_mixer_layers(&c, MT_MIXER_GATED_DELTANET), 48);
    /* by hand: embedding and head 2 * 248320 * 5120 = 2542796800, final norm 5120; per layer
     * norms 10240 and MLP 3 * 5120 * 17408 = 267386880; an attention mixer q (with its gate)
     * 2 * 6144 * 5120 = 62914560, k and v 2 * 1024 * 5120 = 10485760, o 5120 * 6144 = 31457280,
     * q/k norms 512: 104858112; a DeltaNet (Ch = 2 * 16 * 128 + 48 * 128 = 10240) in_proj_qkv
     * 10240 * 5120 = 52428800, z 6144 * 5120 = 31457280, b and a 2 * 48 * 5120 = 491520, out
     * 31457280, conv 10240 * 4 = 40960, A_log and dt_bias 96, norm 128: 115876064.
     * 2542796800 + 5120 + 64 * 267397120 + 16 * 104858112 + 48 * 115876064 = 26895998464 */
    assert_int_equal(mt_config_param_count(&c), 26895998464LL);
    assert_int_equal(mt_config_active_param_count(&c), 26895998464LL);
    mt_param_table t;
    mt_param_table_init(&t, &c);
    assert_int_equal(t.n_real, 26895998464LL);
    mt_param_table_free(&t);
}

static void test_moe_35b_a3b(void **state) {
    (void)state;
    mt_config c = load_shape("qwen3.6-35b-a3b.json");
    assert_int_equal(c.arch, MT_ARCH_QWEN3_5_MOE);
    assert_int_equal(c.n_experts, 256);
    assert_int_equal(c.top_k, 8);
    assert_int_equal(c.moe_F, 512);
    assert_int_equal(c.F, 512); /* the shared expert's width */
    assert_int_equal(c.shared_expert, 1);
    assert_int_equal(c.norm_topk_prob, 1);
    assert_int_equal(mt_config_moe_layers(&c), 40);
    /* by hand: embedding and head 2 * 248320 * 2048 = 1017118720, final norm 2048, norms 40 *
     * 4096; attention mixers 10 * (q 16777216 + k, v 2097152 + o 8388608 + 512) = 10 * 27263488;
     * DeltaNets (Ch 8192) 30 * (16777216 + z 8388608 + b, a 131072 + out 8388608 + conv 32768 +
     * 64 + 128) = 30 * 33718464; MoE per layer router 524288, experts 256 * 3 * 512 * 2048 =
     * 805306368, shared expert 3145728 and its gate 2048 */
    int64_t common = 1017118720LL + 2048 + 40 * 4096LL + 10 * 27263488LL + 30 * 33718464LL;
    assert_int_equal(mt_config_param_count(&c), common + 40 * (524288LL + 805306368LL + 3147776LL));
    assert_int_equal(mt_config_param_count(&c), 34660610688LL);
    /* active: 8 of the 256 experts, 8 * 3 * 512 * 2048 = 25165824 */
    assert_int_equal(mt_config_active_param_count(&c), common + 40 * (524288LL + 25165824LL + 3147776LL));
    mt_param_table t;
    mt_param_table_init(&t, &c);
    assert_int_equal(t.n_real, 34660610688LL);
    mt_param_table_free(&t);
}

/* A tiny text-only config (Qwen3_5ForCausalLM's), with `extra` fields spliced in. */
static char *tiny(const char *type, const char *extra) {
    char *s = malloc(2048);
    snprintf(s, 2048,
             "{\"model_type\": \"%s\", \"hidden_size\": 32, \"intermediate_size\": 64, "
             "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
             "\"head_dim\": 16, \"vocab_size\": 96, \"linear_num_key_heads\": 2, "
             "\"linear_num_value_heads\": 4, \"linear_key_head_dim\": 8, \"linear_value_head_dim\": 8, "
             "\"linear_conv_kernel_dim\": 4%s%s}",
             type, extra[0] ? ", " : "", extra);
    return s;
}

static void test_layer_types_explicit(void **state) {
    (void)state;
    char *j = tiny("qwen3_5_text", "\"layer_types\": [\"full_attention\", \"linear_attention\", "
                                   "\"linear_attention\", \"full_attention\"], \"tie_word_embeddings\": true");
    mt_config c;
    assert_int_equal(mt_config_parse(&c, j, "c.json"), MT_OK);
    free(j);
    assert_int_equal(c.nested, 0);
    assert_int_equal(c.tie_word_embeddings, 1);
    int want[4] = {MT_MIXER_ATTENTION, MT_MIXER_GATED_DELTANET, MT_MIXER_GATED_DELTANET, MT_MIXER_ATTENTION};
    for (int l = 0; l < 4; l++) assert_int_equal(mt_config_layer_mixer(&c, l), want[l]);
    assert_int_equal(mt_config_rotary_dim(&c), 4); /* the default factor 0.25 of 16 */

    /* the tensors of each layer type, with Hugging Face's names and shapes */
    mt_param_table t;
    mt_param_table_init(&t, &c);
    const mt_param *p = mt_param_find(&t, "model.layers.0.self_attn.q_proj.weight");
    assert_non_null(p);
    assert_int_equal(p->shape[0], 2 * 4 * 16); /* queries and their gates */
    assert_int_equal(p->shape[1], 32);
    assert_non_null(mt_param_find(&t, "model.layers.0.self_attn.q_norm.weight"));
    assert_null(mt_param_find(&t, "model.layers.0.linear_attn.in_proj_qkv.weight"));
    assert_null(mt_param_find(&t, "model.layers.1.self_attn.q_proj.weight"));
    p = mt_param_find(&t, "model.layers.1.linear_attn.conv1d.weight");
    assert_non_null(p);
    assert_int_equal(p->ndim, 3);
    assert_int_equal(p->shape[0], 2 * 2 * 8 + 4 * 8);
    assert_int_equal(p->shape[1], 1);
    assert_int_equal(p->shape[2], 4);
    struct { const char *name; int64_t rows, cols; } lin[] = {
        {"in_proj_qkv.weight", 64, 32}, {"in_proj_z.weight", 32, 32}, {"in_proj_b.weight", 4, 32},
        {"in_proj_a.weight", 4, 32},    {"dt_bias", 4, 0},            {"A_log", 4, 0},
        {"norm.weight", 8, 0},          {"out_proj.weight", 32, 32},
    };
    for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
        char name[128];
        snprintf(name, sizeof name, "model.layers.2.linear_attn.%s", lin[i].name);
        p = mt_param_find(&t, name);
        if (!p) fail_msg("no tensor %s", name);
        assert_int_equal(p->shape[0], lin[i].rows);
        assert_int_equal(p->ndim, lin[i].cols ? 2 : 1);
        if (lin[i].cols) assert_int_equal(p->shape[1], lin[i].cols);
    }
    assert_null(mt_param_find(&t, "lm_head.weight")); /* tied */
    assert_int_equal(t.n_real, mt_config_param_count(&c));
    /* the (1 + w) norms start at w = 0, the gated norm and dt_bias at 1 */
    float *arena = calloc((size_t)t.total, sizeof(float));
    mt_param_init(&t, arena, 0.02f, 1);
    assert_true(arena[mt_param_find(&t, "model.layers.1.input_layernorm.weight")->offset] == 0.0f);
    assert_true(arena[mt_param_find(&t, "model.norm.weight")->offset] == 0.0f);
    assert_true(arena[mt_param_find(&t, "model.layers.1.linear_attn.norm.weight")->offset] == 1.0f);
    assert_true(arena[mt_param_find(&t, "model.layers.1.linear_attn.dt_bias")->offset] == 1.0f);
    free(arena);
    mt_param_table_free(&t);

    /* a backend without the DeltaNet's ops is refused by name, not computed wrongly */
    assert_int_equal(mt_layer_check_runnable(&c), MT_OK);
    mt_backend none = {.name = "test"};
    assert_int_equal(mt_layer_backend_check(&c, &none), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "2 of the 4 layers are Gated DeltaNets"));
    /* a bf16 backend with the ops: full-parameter training and LoRA run (both verified against
     * the CPU on CUDA: test_cuda_model test_qwen3_5_models, test_cuda_lora test_qwen3_5_moe) */
    mt_backend *cpu = mt_backend_cpu_create(); /* the reference runs them */
    mt_backend bf = *cpu; /* a copy that says bf16, as the cuda backend does: for the check only */
    bf.dtype = MT_BF16;
    assert_int_equal(mt_layer_backend_check(&c, &bf), MT_OK);
    mt_config with_lora = c;
    with_lora.lora_rank = 4;
    assert_int_equal(mt_layer_backend_check(&with_lora, &bf), MT_OK);
    assert_int_equal(mt_layer_backend_check(&with_lora, cpu), MT_OK);
    cpu->destroy(cpu);
}

static void test_moe_tensors(void **state) {
    (void)state;
    char *j = tiny("qwen3_5_moe_text", "\"num_experts\": 4, \"num_experts_per_tok\": 2, "
                                       "\"moe_intermediate_size\": 16, \"shared_expert_intermediate_size\": 24");
    mt_config c;
    int r = mt_config_parse(&c, j, "c.json");
    if (r != MT_OK) print_error("%s\n", mt_error_message());
    assert_int_equal(r, MT_OK);
    free(j);
    assert_int_equal(c.F, 24);
    mt_param_table t;
    mt_param_table_init(&t, &c);
    const mt_param *p = mt_param_find(&t, "model.layers.0.mlp.shared_expert.gate_proj.weight");
    assert_non_null(p);
    assert_int_equal(p->shape[0], 24);
    p = mt_param_find(&t, "model.layers.3.mlp.shared_expert.down_proj.weight");
    assert_non_null(p);
    assert_int_equal(p->shape[1], 24);
    p = mt_param_find(&t, "model.layers.0.mlp.shared_expert_gate.weight");
    assert_non_null(p);
    assert_int_equal(p->shape[0], 1);
    assert_int_equal(p->shape[1], 32);
    assert_non_null(mt_param_find(&t, "model.layers.0.mlp.gate.weight"));
    assert_null(mt_param_find(&t, "model.layers.0.mlp.gate_proj.weight"));
    assert_null(mt_param_find(&t, "model.layers.0.mlp.shared_expert.gate_proj.bias"));
    assert_int_equal(t.n_real, mt_config_param_count(&c));
    /* the layer views of both mixers over the same MLP */
    float *base = calloc((size_t)t.layer_size, sizeof(float));
    mt_layer_view v0 = mt_layer_view_at(&t, 0, base, sizeof(float));
    mt_layer_view v3 = mt_layer_view_at(&t, 3, base, sizeof(float));
    assert_non_null(v0.lin_qkv);
    assert_null(v0.q);
    assert_non_null(v0.shared_gate);
    assert_non_null(v0.router);
    assert_non_null(v3.q);
    assert_null(v3.lin_qkv);
    free(base);
    mt_param_table_free(&t);
}

static void test_refusals(void **state) {
    (void)state;
    char *j = tiny("qwen3_5_text", "\"layer_types\": [\"linear_attention\", \"full_attention\"]");
    mt_test_config_refused(j, "layer_types has 2 entries for num_hidden_layers = 4");
    free(j);
    j = tiny("qwen3_5_text", "\"layer_types\": [\"linear_attention\", \"full_attention\", "
                             "\"sliding_attention\", \"full_attention\"]");
    mt_test_config_refused(j, "layer_types[2] must be \"linear_attention\" or \"full_attention\"");
    free(j);
    j = tiny("qwen3_5_text", "\"linear_num_key_heads\": 3");
    mt_test_config_refused(j, "linear_num_value_heads 4 is not a multiple of linear_num_key_heads 3");
    free(j);
    j = tiny("qwen3_5_text", "\"partial_rotary_factor\": 0.1");
    mt_test_config_refused(j, "partial_rotary_factor = 0.1 gives 1 rotary dims");
    free(j);
    j = tiny("qwen3_5_text", "\"full_attention_interval\": 0");
    mt_test_config_refused(j, "full_attention_interval = 0 must be positive");
    free(j);
    j = tiny("qwen3_5_text", "\"linear_conv_kernel_dim\": 0");
    mt_test_config_refused(j, "linear_conv_kernel_dim = 0 must be positive");
    free(j);
    j = tiny("qwen3_5_text", "\"num_experts\": 4");
    mt_test_config_refused(j, "num_experts = 4: mixture-of-experts fields");
    free(j);
    mt_test_config_refused("{\"model_type\": \"qwen3_5\", \"text_config\": 3}", "text_config must be an object");
    mt_test_config_refused("{\"model_type\": \"llama_text\", \"hidden_size\": 8}",
                           "model_type \"llama_text\" is not supported");
    j = tiny("qwen3_5_text", "");
    char nested[4096];
    snprintf(nested, sizeof nested, "{\"model_type\": \"qwen3_5\", \"tie_word_embeddings\": true, "
             "\"text_config\": %s}", j);
    free(j);
    mt_config c;
    assert_int_equal(mt_config_parse(&c, nested, "c.json"), MT_OK); /* the text config says nothing */
    assert_int_equal(c.tie_word_embeddings, 1);
    j = tiny("qwen3_5_text", "\"tie_word_embeddings\": false");
    snprintf(nested, sizeof nested, "{\"model_type\": \"qwen3_5\", \"tie_word_embeddings\": true, "
             "\"text_config\": %s}", j);
    free(j);
    mt_test_config_refused(nested, "tie_word_embeddings = true but text_config.tie_word_embeddings = false");
}

/* A text-only config written and read back is the same model; a nested one is not written (its
 * vision_config would be lost). */
static void test_save_round_trip(void **state) {
    (void)state;
    char *dir = mt_test_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *j = tiny("qwen3_5_moe_text", "\"num_experts\": 4, \"num_experts_per_tok\": 2, "
                                       "\"moe_intermediate_size\": 16, \"shared_expert_intermediate_size\": 24, "
                                       "\"layer_types\": [\"full_attention\", \"linear_attention\", "
                                       "\"full_attention\", \"linear_attention\"], \"output_router_logits\": true");
    mt_config a, b;
    assert_int_equal(mt_config_parse(&a, j, "c.json"), MT_OK);
    free(j);
    assert_int_equal(mt_config_save(&a, path), MT_OK);
    int r = mt_config_load(&b, path);
    if (r != MT_OK) print_error("%s\n", mt_error_message());
    assert_int_equal(r, MT_OK);
    assert_int_equal(b.arch, a.arch);
    assert_string_equal(b.model_type, "qwen3_5_moe_text");
    assert_memory_equal(b.deltanet, a.deltanet, sizeof a.deltanet);
    assert_int_equal(b.lin_Hk, a.lin_Hk);
    assert_int_equal(b.lin_Hv, a.lin_Hv);
    assert_int_equal(b.lin_Dk, a.lin_Dk);
    assert_int_equal(b.lin_Dv, a.lin_Dv);
    assert_int_equal(b.lin_K, a.lin_K);
    assert_int_equal(b.rotary_dim, a.rotary_dim);
    assert_int_equal(b.F, a.F);
    assert_int_equal(b.n_experts, a.n_experts);
    assert_int_equal(b.top_k, a.top_k);
    assert_int_equal(b.moe_F, a.moe_F);
    assert_int_equal(b.router_aux, 1);
    assert_int_equal(mt_config_param_count(&b), mt_config_param_count(&a));
    mt_config n = load_shape("qwen3.5-27b.json");
    assert_int_equal(mt_config_save(&n, path), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "multimodal"));
    mt_test_rmtree(dir);
    free(dir);
}

/* transformers' own checkpoints of the family (tests/fixtures, written by save_pretrained of 5.25)
 * load into our table: every tensor present with our shape, none left over. */
static void test_fixtures_load(void **state) {
    (void)state;
    const char *dirs[] = {"qwen3_5_dense", "qwen3_5_layers_tied", "qwen3_5_moe", "qwen3_5_moe_noaux",
                          "train_qwen3_5", "train_qwen3_5_moe"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        char *dir = mt_fixture_path(dirs[i]), cfg_path[1024];
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
        mt_config c;
        int r = mt_config_load(&c, cfg_path);
        if (r != MT_OK) fail_msg("%s: %s", dirs[i], mt_error_message());
        assert_true(c.arch == MT_ARCH_QWEN3_5 || c.arch == MT_ARCH_QWEN3_5_MOE);
        mt_param_table t;
        mt_param_table_init(&t, &c);
        float *arena = calloc((size_t)t.total, sizeof(float));
        r = mt_model_load(&t, arena, dir);
        if (r != MT_OK) fail_msg("%s: %s", dirs[i], mt_error_message());
        free(arena);
        mt_param_table_free(&t);
        free(dir);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_27b),         cmocka_unit_test(test_moe_35b_a3b),
        cmocka_unit_test(test_layer_types_explicit), cmocka_unit_test(test_moe_tensors),
        cmocka_unit_test(test_refusals),          cmocka_unit_test(test_save_round_trip),
        cmocka_unit_test(test_fixtures_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
