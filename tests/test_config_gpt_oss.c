/* OpenAI's gpt-oss config.json (model_type gpt_oss): the fields the fixtures use, GptOssConfig's
 * defaults, YaRN's inverse frequencies and cos/sin scaling against the fixtures' recorded
 * transformers values (rope.inv_freq, rope.attention_scaling), the parameter table's names and
 * shapes against the checkpoint's, the count against the table, the save round trip, refusals by
 * name and the backend check (a backend without gpt-oss's ops refused by name). MXFP4 experts:
 * tests/test_gpt_oss_mxfp4.c. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

#define BASE "\"model_type\": \"gpt_oss\", \"hidden_size\": 32, \"intermediate_size\": 8, " \
             "\"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, " \
             "\"head_dim\": 16, \"vocab_size\": 64, \"num_local_experts\": 4"

static void test_fixture_fields(void **state) {
    (void)state;
    mt_config c = load_fixture("gpt_oss_tiny");
    assert_int_equal(c.arch, MT_ARCH_GPT_OSS);
    assert_string_equal(c.model_type, "gpt_oss");
    assert_int_equal(c.n_experts, 4);
    assert_int_equal(c.top_k, 2);
    assert_int_equal(c.moe_F, 8);
    assert_int_equal(mt_config_moe_layers(&c), 2);
    assert_int_equal(c.norm_topk_prob, 1);
    assert_int_equal(c.router_aux, 0);
    assert_int_equal(c.attn_sinks, 1);
    assert_int_equal(c.qkv_bias, 1);
    assert_int_equal(c.o_bias, 1);
    assert_int_equal(c.norm_offset, 0); /* plain w */
    assert_int_equal(c.sliding_window, 0); /* not Mistral's --seq limit */
    assert_int_equal(mt_config_layer_window(&c, 0), 8);
    assert_int_equal(mt_config_layer_window(&c, 1), 0);
    assert_true(c.swiglu_alpha == 1.702 && c.swiglu_limit == 4.0);
    assert_int_equal(c.rope_type, MT_ROPE_YARN);
    assert_true(c.rope_factor == 4 && c.rope_beta_fast == 4 && c.rope_beta_slow == 1);
    assert_int_equal(c.rope_truncate, 0);
    assert_int_equal(c.rope_original_max_pos, 32);
    assert_true(c.rope_theta == 100);
    mt_config a = load_fixture("gpt_oss_tiny_aux");
    assert_int_equal(a.router_aux, 1);
    assert_true(a.router_aux_coef == 0.05f);
    assert_int_equal(a.tie_word_embeddings, 1);
    assert_int_equal(mt_config_layer_window(&a, 0), 0);
    assert_int_equal(mt_config_layer_window(&a, 1), 5);
    assert_int_equal(a.rope_truncate, 1);
    assert_true(a.swiglu_limit == 3.0);
}

/* inv_freq and attention_scaling as transformers computed them (float32), recorded by
 * make_gpt_oss_fixtures.py. */
static void test_yarn_against_transformers(void **state) {
    (void)state;
    const char *names[] = {"gpt_oss_tiny", "gpt_oss_tiny_aux"};
    for (int i = 0; i < 2; i++) {
        mt_config c = load_fixture(names[i]);
        char rel[256];
        snprintf(rel, sizeof rel, "%s/reference.safetensors", names[i]);
        char *path = mt_fixture_path(rel);
        mt_safetensors *st;
        assert_int_equal(mt_safetensors_open_file(&st, path), MT_OK);
        float ref[64], got[64], scaling;
        const mt_st_tensor *t = mt_safetensors_find(st, "rope.inv_freq");
        assert_non_null(t);
        assert_int_equal(t->numel, c.D / 2);
        assert_int_equal(mt_st_tensor_to_f32(t, ref), MT_OK);
        assert_int_equal(mt_st_tensor_to_f32(mt_safetensors_find(st, "rope.attention_scaling"), &scaling), MT_OK);
        mt_config_rope_inv_freq(&c, got);
        assert_true(mt_check_rel("rope.inv_freq", got, ref, (size_t)c.D / 2, 1e-6));
        float s = (float)mt_config_rope_attention_scaling(&c);
        assert_true(mt_check_rel("rope.attention_scaling", &s, &scaling, 1, 1e-7));
        mt_safetensors_close(st);
        free(path);
    }
}

/* The table holds exactly the checkpoint's tensors, names and shapes; the count agrees. */
static void test_table_matches_checkpoint(void **state) {
    (void)state;
    const char *names[] = {"gpt_oss_tiny", "gpt_oss_tiny_aux"};
    for (int i = 0; i < 2; i++) {
        mt_config c = load_fixture(names[i]);
        mt_param_table t;
        mt_param_table_init(&t, &c);
        assert_int_equal(mt_config_param_count(&c), t.n_real);
        mt_test_table_matches_fixture(&t, names[i]);
        const mt_param *gu = mt_param_find(&t, "model.layers.1.mlp.experts.gate_up_proj");
        assert_non_null(gu);
        assert_int_equal(gu->kind, MT_W_EXP_GATE_UP);
        assert_int_equal(gu->shape[0], 4), assert_int_equal(gu->shape[1], 32), assert_int_equal(gu->shape[2], 16);
        float *arena = mt_aligned_alloc((size_t)t.total * sizeof(float));
        char *fdir = mt_fixture_path(names[i]);
        assert_int_equal(mt_model_load(&t, arena, fdir), MT_OK);
        free(fdir);
        mt_layer_view v1 = mt_layer_view_at(&t, 1, arena + mt_group_offset(&t, 1), sizeof(float));
        assert_non_null(v1.sinks), assert_non_null(v1.router_bias), assert_non_null(v1.exp_gate_up);
        assert_null(v1.exp_gate), assert_null(v1.gate);
        assert_int_equal(v1.window, mt_config_layer_window(&c, 1));
        free(arena);
        mt_param_table_free(&t);
    }
}

static void test_defaults(void **state) {
    (void)state;
    mt_config c;
    assert_int_equal(mt_config_parse(&c, "{" BASE "}", "c.json"), MT_OK);
    for (int l = 0; l < 3; l++) assert_int_equal(mt_config_layer_window(&c, l), l % 2 == 0 ? 128 : 0);
    assert_int_equal(c.top_k, 4);
    assert_true(c.rms_norm_eps == 1e-5f);
    assert_true(c.rope_theta == 150000.0);
    assert_int_equal(c.rope_type, MT_ROPE_YARN);
    assert_true(c.rope_factor == 32 && c.rope_beta_fast == 32 && c.rope_beta_slow == 1);
    assert_int_equal(c.rope_original_max_pos, 4096);
    assert_int_equal(c.rope_truncate, 0);
    assert_true(c.swiglu_alpha == 1.702 && c.swiglu_limit == 7.0);
    assert_int_equal(c.qkv_bias, 1);
    assert_int_equal(c.max_position_embeddings, 131072);
    /* a rope dict without truncate: transformers' default there is true */
    assert_int_equal(mt_config_parse(&c, "{" BASE ", \"rope_parameters\": {\"rope_type\": \"yarn\", "
                                     "\"factor\": 8, \"original_max_position_embeddings\": 16}}", "c.json"), MT_OK);
    assert_int_equal(c.rope_truncate, 1);
    assert_true(c.rope_beta_fast == 32);
}

static void test_refusals(void **state) {
    (void)state;
    mt_test_config_refused("{" BASE ", \"layer_types\": [\"full_attention\", \"chunked_attention\", "
                           "\"full_attention\"]}", "layer_types[1]");
    mt_test_config_refused("{" BASE ", \"layer_types\": [\"full_attention\"]}", "layer_types has 1 entries");
    mt_test_config_refused("{" BASE ", \"sliding_window\": null}", "sliding_window is null");
    mt_test_config_refused("{" BASE ", \"swiglu_limit\": null}", "swiglu_limit");
    mt_test_config_refused("{" BASE ", \"swiglu_limit\": -1}", "swiglu_limit");
    mt_test_config_refused("{" BASE ", \"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 8}}",
                           "rope_type \"llama3\" is not supported for gpt_oss");
    mt_test_config_refused("{" BASE ", \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 8, "
                           "\"original_max_position_embeddings\": 16, \"attention_factor\": 0.5}}",
                           "attention_factor");
    mt_test_config_refused("{" BASE ", \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 8, "
                           "\"original_max_position_embeddings\": 16, \"mscale_all_dim\": 1}}", "mscale_all_dim");
    mt_test_config_refused("{" BASE ", \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 8, "
                           "\"original_max_position_embeddings\": 16, \"partial_rotary_factor\": 0.5}}",
                           "partial_rotary_factor");
    mt_test_config_refused("{" BASE ", \"num_experts\": 8}", "disagree");
    mt_test_config_refused("{" BASE ", \"n_shared_experts\": 1}", "shared experts");
    mt_test_config_refused("{" BASE ", \"num_experts_per_tok\": 5}", "num_experts_per_tok");
    mt_test_config_refused("{" BASE ", \"attention_dropout\": 0.1}", "attention_dropout");
}

static void test_save_roundtrip(void **state) {
    (void)state;
    const char *names[] = {"gpt_oss_tiny", "gpt_oss_tiny_aux"};
    for (int i = 0; i < 2; i++) {
        mt_config a = load_fixture(names[i]);
        mt_test_config_roundtrip(&a); /* every field, the layer bits included */
    }
}

/* A backend without the attention options or the experts' ops refuses gpt_oss by name (the CUDA
 * backend today), before any op could run without them; the CPU backend has them. LoRA's default
 * targets are the attention projections there (PEFT's numbers: tests/fixtures/lora_gpt_oss); the
 * router, the experts and the dense MLP's names are refused saying what is supported. */
static void test_backend_and_lora_targets(void **state) {
    (void)state;
    mt_config c = load_fixture("gpt_oss_tiny");
    mt_backend *cpu = mt_backend_cpu_create();
    assert_int_equal(mt_layer_backend_check(&c, cpu), MT_OK);
    mt_backend fake = *cpu;
    fake.name = "cuda";
    fake.attention_options = 0;
    mt_test_backend_refused(&c, &fake, "gpt_oss");
    fake = *cpu;
    fake.swiglu_clamped_forward = NULL;
    assert_int_equal(mt_layer_backend_check(&c, &fake), MT_ERR);
    cpu->destroy(cpu);
    mt_param_table t;
    mt_param_table_init(&t, &c);
    mt_lora_table lt;
    mt_lora_opts o = {.rank = 4};
    if (mt_lora_table_init(&lt, &t, &o) != MT_OK) fail_msg("%s", mt_error_message());
    assert_string_equal(lt.targets, MT_LORA_GPT_OSS_TARGETS);
    assert_int_equal(lt.n_modules, 2 * 4);
    /* per layer q (64, 32) and o (32, 64): 4 (32 + 64) each; k and v (32, 32): 4 (32 + 32) each */
    assert_int_equal(lt.n_real, 2 * (2 * 384 + 2 * 256));
    mt_lora_table_free(&lt);
    /* the experts (PEFT's target_parameters): lora_A (r E, in), lora_B (out, r E) of the fused
     * gate_up_proj (E 4, C 32, 2 Fe 16) and down_proj (4, 8, 32), keys as PEFT nests its wrappers */
    o.targets = "q_proj,k_proj,v_proj,o_proj,gate_up_proj,mlp.experts.down_proj";
    if (mt_lora_table_init(&lt, &t, &o) != MT_OK) fail_msg("%s", mt_error_message());
    assert_string_equal(lt.targets, MT_LORA_GPT_OSS_TARGETS);
    assert_string_equal(lt.parameters, "mlp.experts.gate_up_proj,mlp.experts.down_proj");
    assert_int_equal(lt.n_modules, 2 * 6);
    assert_int_equal(lt.n_real, 2 * (2 * 384 + 2 * 256) + 2 * (4 * 4 * (32 + 16) + 4 * 4 * (8 + 32)));
    const mt_lora_param *a = mt_lora_find(&lt, 1, MT_W_EXP_GATE_UP), *d = mt_lora_find(&lt, 1, MT_W_EXP_DOWN_IO);
    assert_non_null(a);
    assert_non_null(d);
    assert_string_equal(a->name, "base_model.model.model.layers.1.mlp.experts.base_layer.lora_A.weight");
    assert_string_equal(a[1].name, "base_model.model.model.layers.1.mlp.experts.base_layer.lora_B.weight");
    assert_string_equal(d->name, "base_model.model.model.layers.1.mlp.experts.lora_A.weight");
    assert_true(a->experts == 4 && a->shape[0] == 16 && a->shape[1] == 32);
    assert_true(a[1].shape[0] == 16 && a[1].shape[1] == 16 && d->shape[1] == 8 && d[1].shape[0] == 32);
    mt_lora_table_free(&lt);
    o.targets = "q_proj,down_proj"; /* down_proj alone: no nesting */
    if (mt_lora_table_init(&lt, &t, &o) != MT_OK) fail_msg("%s", mt_error_message());
    assert_string_equal(lt.parameters, "mlp.experts.down_proj");
    assert_string_equal(mt_lora_find(&lt, 0, MT_W_EXP_DOWN_IO)->name,
                        "base_model.model.model.layers.0.mlp.experts.lora_A.weight");
    mt_lora_table_free(&lt);
    static const char *const refused[][2] = {
        {"q_proj,router", "gpt_oss's router (mlp.router) is not a Linear module"},
        {"mlp.router", "gpt_oss's router"},
        {"experts", "gpt_oss's MLP is only its experts"},
        {"q_proj,up_proj", "gpt_oss's MLP is only its experts"},
        {"q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", "\"gate_proj\": gpt_oss's MLP"},
        {"sinks", "no module of this gpt_oss model is named \"sinks\""},
        {"self_attn.gate_up_proj", "no module of this gpt_oss model is named"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        o.targets = refused[i][0];
        assert_int_equal(mt_lora_table_init(&lt, &t, &o), MT_ERR);
        if (!strstr(mt_error_message(), refused[i][1]))
            fail_msg("--lora-targets %s: \"%s\" does not say \"%s\"", refused[i][0],
                     mt_error_message(), refused[i][1]);
        if (i < 5 && !strstr(mt_error_message(), "adapts the attention projections (" MT_LORA_GPT_OSS_TARGETS
                                                 ") and the experts (" MT_LORA_GPT_OSS_EXPERTS ")"))
            fail_msg("--lora-targets %s: \"%s\" does not say what is supported", refused[i][0],
                     mt_error_message());
    }
    mt_param_table_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_fields),
        cmocka_unit_test(test_yarn_against_transformers),
        cmocka_unit_test(test_table_matches_checkpoint),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_save_roundtrip),
        cmocka_unit_test(test_backend_and_lora_targets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
