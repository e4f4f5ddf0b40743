/* Google's Gemma 3 config.json (model_type gemma3_text, and gemma3 nesting it in text_config):
 * the fields the fixtures use, Gemma3TextConfig's defaults (the legacy keys rope_theta /
 * rope_local_base_freq / rope_scaling and the sliding-window pattern included), the two RoPE
 * tables, the parameter table's names and shapes against the checkpoint's and the count against
 * the table (and the README's 80 tensors), the save round trip, refusals by name, the backend
 * check (a backend without Gemma 3's ops refused by name: CUDA today) and the LoRA table
 * (every projection, no norm). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/layer.h"
#include "model/lora.h"
#include "model/params.h"
#include "util/config_check.h"
#include "util/fixture_io.h"
#include "util/testutil.h"

static mt_config load_fixture(const char *name) { return mt_test_config_load("%s/config.json", name); }

#define BASE "\"model_type\": \"gemma3_text\", \"hidden_size\": 32, \"intermediate_size\": 24, " \
             "\"num_hidden_layers\": 7, \"num_attention_heads\": 4, \"vocab_size\": 96"

static void test_fixture_fields(void **state) {
    (void)state;
    mt_config c = load_fixture("gemma3_tiny");
    assert_int_equal(c.arch, MT_ARCH_GEMMA3);
    assert_string_equal(c.model_type, "gemma3_text");
    assert_int_equal(c.nested, 0);
    assert_int_equal(c.C, 32), assert_int_equal(c.F, 24), assert_int_equal(c.L, 6);
    assert_int_equal(c.H, 4), assert_int_equal(c.G, 2), assert_int_equal(c.D, 16);
    assert_int_equal(c.V, 96);
    assert_true(c.rms_norm_eps == 1e-6f);
    assert_int_equal(c.mlp_act, MT_MLP_GEGLU);
    assert_int_equal(c.norm_offset, 1);
    assert_int_equal(c.qk_norm, 1);
    assert_int_equal(c.sandwich_norm, 1);
    assert_int_equal(c.embed_scale, 1);
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_int_equal(c.qkv_bias, 0), assert_int_equal(c.o_bias, 0);
    assert_int_equal(c.pad_token_id, 0);
    assert_int_equal(c.embed_pad_no_grad, 1);
    assert_int_equal(c.query_pre_attn_scalar, 24);
    assert_true(fabs(mt_config_attn_scale(&c) - 1.0 / sqrt(24.0)) < 1e-15);
    assert_int_equal(c.attn_window, 8);
    for (int l = 0; l < 6; l++) {
        assert_int_equal(mt_config_layer_window(&c, l), l < 5 ? 8 : 0);
        assert_int_equal(mt_config_layer_rope_set(&c, l), l < 5 ? 1 : 0);
    }
    assert_int_equal(c.rope_type, MT_ROPE_LINEAR);
    assert_true(c.rope_factor == 4.0);
    assert_true(c.rope_theta == 50000.0);
    assert_true(c.rope_local_theta == 1000.0);
    assert_int_equal(c.bos_token_id, 2), assert_int_equal(c.eos_token_id, 1);
    /* the two tables: set 0 the full layers' (theta 50000, / 4), set 1 the sliding layers' */
    assert_int_equal(mt_config_rope_sets(&c), 2);
    assert_int_equal((int)mt_config_rope_inv_freq_len(&c), 16);
    float inv[16];
    mt_config_rope_inv_freq(&c, inv);
    for (int i = 0; i < 8; i++) {
        double full = 1.0 / pow(50000.0, 2.0 * i / 16) / 4, local = 1.0 / pow(1000.0, 2.0 * i / 16);
        assert_true(fabs(inv[i] - full) <= 1e-7 * full);
        assert_true(fabs(inv[8 + i] - local) <= 1e-7 * local);
    }
}

/* The table's names and shapes are the checkpoint's (80 tensors, README "Names and shapes"), the
 * count is the table's; the views point the sandwich norms and the RoPE set where they belong. */
static void test_table_matches_checkpoint(void **state) {
    (void)state;
    mt_config c = load_fixture("gemma3_tiny");
    mt_param_table t;
    mt_param_table_init(&t, &c);
    assert_int_equal(mt_config_param_count(&c), t.n_real);
    assert_int_equal(t.n_params, 80);
    /* V C + C + L (4 C norms + q k v o + 2 D + 3 F C) */
    int64_t want = 96 * 32 + 32 + 6 * (4 * 32 + 64 * 32 + 2 * 32 * 32 + 32 * 64 + 2 * 16 + 3 * 24 * 32);
    assert_int_equal(t.n_real, want);
    mt_test_table_matches_fixture(&t, "gemma3_tiny");
    assert_int_equal(mt_param_find(&t, "model.layers.2.pre_feedforward_layernorm.weight")->kind, MT_W_POST_NORM);
    assert_int_equal(mt_param_find(&t, "model.layers.2.post_attention_layernorm.weight")->kind, MT_W_ATTN_OUT_NORM);
    assert_int_equal(mt_param_find(&t, "model.layers.2.post_feedforward_layernorm.weight")->kind, MT_W_MLP_OUT_NORM);
    assert_null(mt_param_find(&t, "lm_head.weight"));
    float *arena = mt_aligned_alloc((size_t)t.total * sizeof(float));
    char *fdir = mt_fixture_path("gemma3_tiny");
    assert_int_equal(mt_model_load(&t, arena, fdir), MT_OK);
    free(fdir);
    for (int l = 4; l < 6; l++) {
        mt_layer_view v = mt_layer_view_at(&t, l, arena + mt_group_offset(&t, l), sizeof(float));
        assert_non_null(v.attn_out_norm), assert_non_null(v.mlp_out_norm), assert_non_null(v.post_norm);
        assert_non_null(v.q_norm), assert_null(v.sinks), assert_null(v.router);
        assert_int_equal(v.window, l == 5 ? 0 : 8);
        assert_int_equal(v.rope_set, l == 5 ? 0 : 1);
    }
    free(arena);
    mt_param_table_free(&t);
    /* other families have no such tensors */
    mt_config q;
    assert_int_equal(mt_config_parse(&q, "{\"model_type\": \"llama\", \"hidden_size\": 32, "
                                         "\"intermediate_size\": 24, \"num_hidden_layers\": 1, "
                                         "\"num_attention_heads\": 4, \"vocab_size\": 96}", "q.json"), MT_OK);
    mt_param_table_init(&t, &q);
    assert_non_null(mt_param_find(&t, "model.layers.0.post_attention_layernorm.weight"));
    assert_null(mt_param_find(&t, "model.layers.0.post_feedforward_layernorm.weight"));
    assert_int_equal(q.pad_token_id, -1), assert_int_equal(q.embed_pad_no_grad, 0);
    assert_int_equal(mt_config_rope_sets(&q), 1);
    mt_param_table_free(&t);
}

/* Gemma3TextConfig's defaults, and the legacy keys of the published configs. */
static void test_defaults(void **state) {
    (void)state;
    mt_config c;
    assert_int_equal(mt_config_parse(&c, "{" BASE "}", "c.json"), MT_OK);
    assert_int_equal(c.G, 4), assert_int_equal(c.D, 256);
    assert_int_equal(c.max_position_embeddings, 131072);
    assert_int_equal(c.query_pre_attn_scalar, 256);
    assert_int_equal(c.attn_window, 4096);
    assert_true(c.rope_theta == 1e6 && c.rope_local_theta == 1e4);
    assert_int_equal(c.rope_type, MT_ROPE_DEFAULT);
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_int_equal(c.pad_token_id, 0);
    assert_true(c.rms_norm_eps == 1e-6f);
    for (int l = 0; l < 7; l++) assert_int_equal(mt_config_layer_window(&c, l) > 0, l != 5); /* 5:1 */
    /* legacy keys: rope_scaling on the full layers only, rope_local_base_freq the sliding ones' */
    assert_int_equal(mt_config_parse(&c, "{" BASE ", \"sliding_window_pattern\": 2, \"rope_theta\": 5e5, "
                                     "\"rope_local_base_freq\": 2e3, \"rope_scaling\": {\"rope_type\": "
                                     "\"linear\", \"factor\": 8.0}, \"pad_token_id\": null}", "c.json"), MT_OK);
    for (int l = 0; l < 7; l++) assert_int_equal(mt_config_layer_window(&c, l) > 0, l % 2 == 0);
    assert_true(c.rope_theta == 5e5 && c.rope_local_theta == 2e3);
    assert_int_equal(c.rope_type, MT_ROPE_LINEAR);
    assert_true(c.rope_factor == 8.0);
    assert_int_equal(c.pad_token_id, -1), assert_int_equal(c.embed_pad_no_grad, 0);
    /* the private key 5.25 writes */
    assert_int_equal(mt_config_parse(&c, "{" BASE ", \"_sliding_window_pattern\": 3}", "c.json"), MT_OK);
    for (int l = 0; l < 7; l++) assert_int_equal(mt_config_layer_window(&c, l) > 0, (l + 1) % 3 != 0);
}

static void test_refusals(void **state) {
    (void)state;
    mt_test_config_refused("{" BASE ", \"final_logit_softcapping\": 30.0}", "final_logit_softcapping");
    mt_test_config_refused("{" BASE ", \"attn_logit_softcapping\": 50.0}", "attn_logit_softcapping");
    mt_test_config_refused("{" BASE ", \"use_bidirectional_attention\": true}", "use_bidirectional_attention");
    mt_test_config_refused("{" BASE ", \"hidden_activation\": \"gelu\"}", "hidden_activation \"gelu\"");
    mt_test_config_refused("{" BASE ", \"sliding_window\": null}", "sliding_window is null");
    mt_test_config_refused("{" BASE ", \"query_pre_attn_scalar\": 24.5}", "query_pre_attn_scalar");
    mt_test_config_refused("{" BASE ", \"pad_token_id\": 96}", "pad_token_id");
    mt_test_config_refused("{" BASE ", \"layer_types\": [\"full_attention\"]}", "layer_types has 1 entries");
    mt_test_config_refused("{" BASE ", \"layer_types\": [\"full_attention\", \"full_attention\", \"full_attention\", "
                           "\"full_attention\", \"full_attention\", \"full_attention\", \"chunked_attention\"]}",
                           "layer_types[6]");
    mt_test_config_refused("{" BASE ", \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"yarn\", "
                           "\"factor\": 8}, \"sliding_attention\": {\"rope_type\": \"default\"}}}",
                           "rope_type \"yarn\" is not supported for gemma3");
    mt_test_config_refused("{" BASE ", \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\"}, "
                           "\"sliding_attention\": {\"rope_type\": \"linear\", \"factor\": 2}}}",
                           "rope_parameters.sliding_attention.rope_type \"linear\"");
    mt_test_config_refused("{" BASE ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 0.5}}", "factor");
    mt_test_config_refused("{\"model_type\": \"gemma3\", \"vision_config\": {}}", "without a text_config");
    mt_test_config_refused("{" BASE ", \"attention_dropout\": 0.1}", "attention_dropout");
}

/* The multimodal config nests the language model in text_config, as Qwen3.5's. */
static void test_nested(void **state) {
    (void)state;
    mt_config c;
    int r = mt_config_parse(&c, "{\"model_type\": \"gemma3\", \"architectures\": "
                                "[\"Gemma3ForConditionalGeneration\"], \"vision_config\": {\"hidden_size\": 8}, "
                                "\"text_config\": {" BASE ", \"num_key_value_heads\": 2, \"head_dim\": 16}}",
                            "c.json");
    if (r != MT_OK) fail_msg("%s", mt_error_message());
    assert_int_equal(c.arch, MT_ARCH_GEMMA3);
    assert_int_equal(c.nested, 1);
    assert_int_equal(c.C, 32), assert_int_equal(c.G, 2), assert_int_equal(c.D, 16);
    assert_int_equal(c.sandwich_norm, 1);
}

static void test_save_roundtrip(void **state) {
    (void)state;
    const char *names[] = {"gemma3_tiny", "gemma3_overflow"};
    for (int i = 0; i < 2; i++) {
        mt_config a = load_fixture(names[i]);
        mt_test_config_roundtrip(&a); /* every field, the layer bits included */
    }
    /* defaults (no scaling, pad null) too */
    mt_config a;
    assert_int_equal(mt_config_parse(&a, "{" BASE ", \"pad_token_id\": null}", "c.json"), MT_OK);
    mt_test_config_roundtrip(&a);
}

/* A backend without Gemma 3's ops (the attention options, GeGLU, the pad row) refuses it by name
 * (the CUDA backend today), before any op could run without them; the CPU backend has them. LoRA
 * adapts every projection of attention and the MLP (checked against PEFT: test_train_torch's
 * lora_gemma3), none of the norms; on CUDA the backend check refuses the model first. */
static void test_backend_refused_lora_adapts(void **state) {
    (void)state;
    mt_config c = load_fixture("gemma3_tiny");
    mt_backend *cpu = mt_backend_cpu_create();
    assert_int_equal(mt_layer_backend_check(&c, cpu), MT_OK);
    mt_backend fake = *cpu;
    fake.name = "cuda";
    fake.attention_options = 0;
    mt_test_backend_refused(&c, &fake, "gemma3_text");
    fake = *cpu;
    fake.geglu_forward = NULL;
    assert_int_equal(mt_layer_backend_check(&c, &fake), MT_ERR);
    fake = *cpu;
    fake.zero_rows_of_id = NULL;
    assert_int_equal(mt_layer_backend_check(&c, &fake), MT_ERR);
    cpu->destroy(cpu);
    mt_param_table t;
    mt_param_table_init(&t, &c);
    mt_lora_table lt;
    mt_lora_opts o = {.rank = 4};
    if (mt_lora_table_init(&lt, &t, &o) != MT_OK) fail_msg("%s", mt_error_message());
    assert_string_equal(lt.targets, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
    assert_int_equal(lt.n_modules, 7 * c.L);
    assert_int_equal(lt.n_params, 2 * 7 * c.L);
    assert_true(lt.scale == 2.0f);
    /* per layer r (in + out): q 4 (32 + 64), k and v 4 (32 + 32), o 4 (64 + 32), gate/up/down 4 (32 + 24) */
    assert_int_equal(lt.n_real, (int64_t)c.L * (384 + 2 * 256 + 384 + 3 * 224));
    const mt_lora_param *q = mt_lora_find_name(&lt, "base_model.model.model.layers.5.self_attn.o_proj.lora_B.weight");
    assert_non_null(q);
    assert_int_equal(q->shape[0], 32);
    assert_int_equal(q->shape[1], 4);
    assert_null(mt_lora_find_name(&lt, "base_model.model.model.layers.0.self_attn.q_norm.lora_A.weight"));
    mt_lora_table_free(&lt);
    o.targets = "q_norm"; /* a norm is not a linear projection megatrain adapts */
    assert_int_equal(mt_lora_table_init(&lt, &t, &o), MT_ERR);
    mt_param_table_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_fields),
        cmocka_unit_test(test_table_matches_checkpoint),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_nested),
        cmocka_unit_test(test_save_roundtrip),
        cmocka_unit_test(test_backend_refused_lora_adapts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
