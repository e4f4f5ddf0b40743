/* Google's Gemma 4 config.json (model_type gemma4_text, and gemma4 nesting it in text_config):
 * the fields the fixtures use, Gemma4TextConfig's defaults (global_head_dim 512, the 5:1 pattern
 * with the last layer forced full, proportional RoPE), the full layers' shape from
 * global_head_dim / num_global_key_value_heads (only with attention_k_eq_v) or transformers 5.25's
 * per_layer_config, the two RoPE tables (proportional: zero frequencies past the rotated share), the
 * parameter table's names and shapes against the checkpoint's (no v_proj on the full layers with
 * keys as values, layer_scalar; the MoE block's router, scales, fused experts and norms beside the
 * dense MLP) and the count against the table and transformers' for the published 31B and 26B-A4B
 * shapes, the save round trip, refusals by name (the per-layer input embeddings and KV sharing of
 * E2B/E4B, ...), the backend check (a backend without Gemma 4's ops refused by name)
 * and LoRA's adapter table (no v_proj on the full layers with keys as values; the MoE block's
 * router and experts refused as targets by name). */
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

#define BASE "\"model_type\": \"gemma4_text\", \"hidden_size\": 32, \"intermediate_size\": 24, " \
             "\"num_hidden_layers\": 7, \"num_attention_heads\": 4, \"vocab_size\": 96, "     \
             "\"hidden_size_per_layer_input\": 0"
#define TYPES3 "\"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\"]"

static int close_to(float got, double want) { return fabs(got - want) <= 1e-7 * fabs(want); }

static void test_fixture_fields(void **state) {
    (void)state;
    mt_config c = load_fixture("gemma4_tiny");
    assert_int_equal(c.arch, MT_ARCH_GEMMA4);
    assert_string_equal(c.model_type, "gemma4_text");
    assert_int_equal(c.nested, 0);
    assert_int_equal(c.C, 32), assert_int_equal(c.F, 24), assert_int_equal(c.L, 6);
    assert_int_equal(c.H, 4), assert_int_equal(c.G, 2), assert_int_equal(c.D, 16), assert_int_equal(c.V, 96);
    assert_int_equal(c.global_D, 32), assert_int_equal(c.global_G, 1), assert_int_equal(c.k_eq_v, 1);
    assert_int_equal(c.v_norm, 1), assert_int_equal(c.qk_norm, 1), assert_int_equal(c.sandwich_norm, 1);
    assert_int_equal(c.norm_offset, 0); /* Gemma 4's norms multiply by w */
    assert_int_equal(c.mlp_act, MT_MLP_GEGLU);
    assert_int_equal(c.embed_scale, 1), assert_int_equal(c.layer_scalar, 1);
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_int_equal(c.pad_token_id, 0), assert_int_equal(c.embed_pad_no_grad, 1);
    assert_true(mt_config_attn_scale(&c) == 1.0); /* scores unscaled */
    assert_true(c.final_softcap == 2.0);
    assert_int_equal(c.attn_window, 8);
    for (int l = 0; l < 6; l++) {
        int full = l == 2 || l == 5;
        assert_int_equal(mt_config_layer_window(&c, l), full ? 0 : 8);
        assert_int_equal(mt_config_layer_rope_set(&c, l), full ? 0 : 1);
        assert_int_equal(mt_config_layer_head_dim(&c, l), full ? 32 : 16);
        assert_int_equal(mt_config_layer_kv_heads(&c, l), full ? 1 : 2);
        assert_int_equal(mt_config_layer_rotary_dim(&c, l), full ? 32 : 16);
        assert_int_equal(mt_config_layer_k_eq_v(&c, l), full);
    }
    assert_int_equal(c.rope_type, MT_ROPE_PROPORTIONAL);
    assert_true(c.rope_partial == 0.25 && c.rope_factor == 1.0);
    assert_true(c.rope_theta == 50000.0 && c.rope_local_theta == 1000.0);
    /* two tables 16 floats apart (the full layers' 32 / 2): set 0 rotates int(0.25 * 32 // 2) = 4
     * frequencies of exponent 2i / 32, the rest 0; set 1 the sliding layers' 8 of 2i / 16 */
    assert_int_equal(mt_config_rope_stride(&c), 16);
    assert_int_equal((int)mt_config_rope_inv_freq_len(&c), 32);
    float inv[32];
    mt_config_rope_inv_freq(&c, inv);
    for (int i = 0; i < 16; i++) {
        if (i < 4) assert_true(close_to(inv[i], 1.0 / pow(50000.0, 2.0 * i / 32)));
        else assert_true(inv[i] == 0);
        if (i < 8) assert_true(close_to(inv[16 + i], 1.0 / pow(1000.0, 2.0 * i / 16)));
    }
    /* the multimodal one: no keys as values, global_head_dim 24 over the common kv heads, factor 2 */
    mt_config v = load_fixture("gemma4_vl");
    assert_int_equal(v.arch, MT_ARCH_GEMMA4), assert_int_equal(v.nested, 1);
    assert_string_equal(v.model_type, "gemma4");
    assert_int_equal(v.k_eq_v, 0), assert_int_equal(v.global_D, 24), assert_int_equal(v.global_G, 2);
    assert_int_equal(v.tie_word_embeddings, 0);
    assert_true(v.final_softcap == 0);
    assert_int_equal(mt_config_layer_k_eq_v(&v, 2), 0);
    float inv2[24];
    assert_int_equal((int)mt_config_rope_inv_freq_len(&v), 24);
    mt_config_rope_inv_freq(&v, inv2);
    for (int i = 0; i < 12; i++)
        if (i < 6) assert_true(close_to(inv2[i], 1.0 / pow(1e6, 2.0 * i / 24) / 2));
        else assert_true(inv2[i] == 0);
}

/* The table's names and shapes are the checkpoint's, the count the table's; the full layers have no
 * v_proj and wider q/k/o and norms; the views carry each layer's shape. */
static void test_table_matches_checkpoint(void **state) {
    (void)state;
    mt_config c = load_fixture("gemma4_tiny");
    mt_param_table t;
    mt_param_table_init(&t, &c);
    assert_int_equal(mt_config_param_count(&c), t.n_real);
    /* 2 + 4 sliding layers x 14 tensors + 2 full layers x 13 (no v_proj) */
    assert_int_equal(t.n_params, 2 + 4 * 14 + 2 * 13);
    int64_t norms = 4 * 32 + 1 + 3 * 24 * 32; /* 4 C norms, layer_scalar, the MLP */
    int64_t sliding = norms + 64 * 32 + 2 * 32 * 32 + 32 * 64 + 2 * 16;
    int64_t full = norms + 128 * 32 + 32 * 32 + 32 * 128 + 2 * 32;
    assert_int_equal(t.n_real, 96 * 32 + 32 + 4 * sliding + 2 * full);
    mt_test_table_matches_fixture(&t, "gemma4_tiny");
    assert_null(mt_param_find(&t, "model.layers.2.self_attn.v_proj.weight"));
    assert_non_null(mt_param_find(&t, "model.layers.1.self_attn.v_proj.weight"));
    assert_int_equal(mt_param_find(&t, "model.layers.2.layer_scalar")->kind, MT_W_LAYER_SCALAR);
    assert_int_equal(mt_param_find(&t, "model.layers.2.pre_feedforward_layernorm.weight")->kind, MT_W_POST_NORM);
    float *arena = mt_aligned_alloc((size_t)t.total * sizeof(float));
    char *fdir = mt_fixture_path("gemma4_tiny");
    assert_int_equal(mt_model_load(&t, arena, fdir), MT_OK);
    free(fdir);
    for (int l = 1; l < 3; l++) {
        mt_layer_view v = mt_layer_view_at(&t, l, arena + mt_group_offset(&t, l), sizeof(float));
        assert_non_null(v.layer_scalar), assert_non_null(v.attn_out_norm), assert_non_null(v.q_norm);
        assert_true(*(float *)v.layer_scalar > 0.6f && *(float *)v.layer_scalar < 1.4f);
        assert_int_equal(v.window, l == 2 ? 0 : 8);
        assert_int_equal(v.rope_set, l == 2 ? 0 : 1);
        assert_int_equal(v.head_dim, l == 2 ? 32 : 16);
        assert_int_equal(v.kv_heads, l == 2 ? 1 : 2);
        assert_true((v.v == NULL) == (l == 2));
    }
    /* a fresh model's layer_scalar is 1, as transformers initialises it */
    mt_param_init(&t, arena, 0.02f, 1);
    assert_true(arena[mt_param_find(&t, "model.layers.0.layer_scalar")->offset] == 1.0f);
    assert_true(arena[mt_param_find(&t, "model.layers.0.input_layernorm.weight")->offset] == 1.0f);
    free(arena);
    mt_param_table_free(&t);
}

/* The MoE block (gemma4_moe): every layer an MoE layer that keeps its dense MLP; the checkpoint's
 * names and shapes. */
static void test_moe_table(void **state) {
    (void)state;
    mt_config c = load_fixture("gemma4_moe");
    assert_int_equal(c.n_experts, 4), assert_int_equal(c.top_k, 2), assert_int_equal(c.moe_F, 8);
    assert_int_equal(c.moe_beside_dense, 1), assert_int_equal(c.norm_topk_prob, 1);
    assert_int_equal(c.router_aux, 0), assert_int_equal(mt_config_moe_layers(&c), 3);
    mt_param_table t;
    mt_param_table_init(&t, &c);
    assert_int_equal(mt_config_param_count(&c), t.n_real);
    mt_test_table_matches_fixture(&t, "gemma4_moe");
    const struct { const char *name; mt_param_kind kind; } want[] = {
        {"model.layers.1.router.proj.weight", MT_W_ROUTER},
        {"model.layers.1.router.scale", MT_W_ROUTER_SCALE},
        {"model.layers.1.router.per_expert_scale", MT_W_EXPERT_SCALE},
        {"model.layers.1.experts.gate_up_proj", MT_W_EXP_GATE_UP_OI},
        {"model.layers.1.experts.down_proj", MT_W_EXP_DOWN_OI},
        {"model.layers.1.mlp.gate_proj.weight", MT_W_GATE},
        {"model.layers.1.pre_feedforward_layernorm_2.weight", MT_W_PRE_NORM_2},
        {"model.layers.1.post_feedforward_layernorm_1.weight", MT_W_MLP_OUT_NORM_1},
        {"model.layers.1.post_feedforward_layernorm_2.weight", MT_W_MLP_OUT_NORM_2},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const mt_param *p = mt_param_find(&t, want[i].name);
        if (!p) fail_msg("%s: not in the table", want[i].name);
        assert_int_equal(p->kind, want[i].kind);
    }
    const mt_param *gu = mt_param_find(&t, "model.layers.0.experts.gate_up_proj");
    assert_int_equal(gu->shape[0], 4), assert_int_equal(gu->shape[1], 16), assert_int_equal(gu->shape[2], 32);
    /* a fresh model: the router's scales start at 1, as transformers initialises them */
    float *arena = mt_aligned_alloc((size_t)t.total * sizeof(float));
    mt_param_init(&t, arena, 0.02f, 1);
    assert_true(arena[mt_param_find(&t, "model.layers.0.router.scale")->offset] == 1.0f);
    assert_true(arena[mt_param_find(&t, "model.layers.0.router.per_expert_scale")->offset + 3] == 1.0f);
    free(arena);
    mt_param_table_free(&t);
    mt_test_config_refused("{" BASE ", \"enable_moe_block\": true, \"num_experts\": 4, \"moe_intermediate_size\": 8}",
                           "top_k_experts is missing");
    mt_test_config_refused("{" BASE ", \"enable_moe_block\": true, \"num_experts\": 4, \"top_k_experts\": 5, "
                           "\"moe_intermediate_size\": 8}", "num_experts_per_tok = 5");
    /* off: the three are ignored, as transformers does */
    mt_config d = mt_test_config_parse("{" BASE ", \"num_experts\": 4, \"top_k_experts\": 2, "
                                       "\"moe_intermediate_size\": 8}");
    assert_int_equal(d.n_experts, 0), assert_int_equal(d.moe_beside_dense, 0);
}

/* The published shapes (config.json's text_config as released): the count transformers 5.25's
 * Gemma4ForCausalLM has (parameters, plus the L layer_scalar buffers). */
static void test_published_counts(void **state) {
    (void)state;
#define G4_COMMON "\"model_type\": \"gemma4_text\", \"head_dim\": 256, \"global_head_dim\": 512, " \
    "\"attention_k_eq_v\": true, \"vocab_size\": 262144, \"sliding_window\": 1024, " \
    "\"final_logit_softcapping\": 30.0, \"hidden_size_per_layer_input\": 0, \"max_position_embeddings\": 262144"
    mt_config b31 = mt_test_config_parse("{" G4_COMMON ", \"hidden_size\": 5376, \"intermediate_size\": 21504, "
                                         "\"num_hidden_layers\": 60, \"num_attention_heads\": 32, "
                                         "\"num_key_value_heads\": 16, \"num_global_key_value_heads\": 4}");
    assert_int_equal(mt_config_param_count(&b31), 30697345280LL + 60);
    mt_config b26 = mt_test_config_parse("{" G4_COMMON ", \"hidden_size\": 2816, \"intermediate_size\": 2112, "
                                         "\"num_hidden_layers\": 30, \"num_attention_heads\": 16, "
                                         "\"num_key_value_heads\": 8, \"num_global_key_value_heads\": 2, "
                                         "\"enable_moe_block\": true, \"num_experts\": 128, "
                                         "\"top_k_experts\": 8, \"moe_intermediate_size\": 704}");
    assert_int_equal(mt_config_param_count(&b26), 25233141760LL + 30);
    /* 8 of 128 experts a token: 3.82 B active */
    assert_int_equal(mt_config_active_param_count(&b26),
                     25233141790LL - 30LL * 120 * 3 * 704 * 2816);
#undef G4_COMMON
}

/* Gemma4TextConfig's defaults, the last-layer rule and the two ways of giving the full layers' shape. */
static void test_defaults(void **state) {
    (void)state;
    mt_config c = mt_test_config_parse("{" BASE "}");
    assert_int_equal(c.G, 4), assert_int_equal(c.D, 256);
    assert_int_equal(c.global_D, 512), assert_int_equal(c.global_G, 4), assert_int_equal(c.k_eq_v, 0);
    assert_int_equal(c.max_position_embeddings, 131072);
    assert_int_equal(c.attn_window, 512);
    assert_int_equal(c.rope_type, MT_ROPE_PROPORTIONAL);
    assert_true(c.rope_theta == 1e6 && c.rope_local_theta == 1e4 && c.rope_partial == 0.25);
    assert_int_equal(c.tie_word_embeddings, 1), assert_int_equal(c.pad_token_id, 0);
    assert_true(c.final_softcap == 0);
    /* 5:1, and layer 6 (sliding by the pattern) forced to full: transformers does the same */
    for (int l = 0; l < 7; l++) assert_int_equal(mt_config_layer_window(&c, l) > 0, l != 5 && l != 6);
    c = mt_test_config_parse("{" BASE ", \"num_hidden_layers\": 3, " TYPES3 "}");
    assert_int_equal(mt_config_layer_window(&c, 2), 0);
    /* num_global_key_value_heads counts only with attention_k_eq_v (configuration_gemma4.py) */
    c = mt_test_config_parse("{" BASE ", \"num_global_key_value_heads\": 2, \"global_head_dim\": 64}");
    assert_int_equal(c.global_G, 4), assert_int_equal(c.global_D, 64);
    c = mt_test_config_parse("{" BASE ", \"num_global_key_value_heads\": 2, \"attention_k_eq_v\": true}");
    assert_int_equal(c.global_G, 2), assert_int_equal(c.k_eq_v, 1);
    assert_int_equal(mt_config_max_kv_width(&c), 4 * 256);
    /* transformers 5.25's per_layer_config wins over global_head_dim */
    c = mt_test_config_parse("{" BASE ", \"num_hidden_layers\": 3, " TYPES3 ", \"global_head_dim\": 64, "
                             "\"per_layer_config\": {\"1\": {\"head_dim\": 128, \"num_key_value_heads\": 1}, "
                             "\"2\": {\"head_dim\": 128, \"num_key_value_heads\": 1}}}");
    assert_int_equal(c.global_D, 128), assert_int_equal(c.global_G, 1);
    c = mt_test_config_parse("{" BASE ", \"per_layer_config\": {}}"); /* none listed: the common shape */
    assert_int_equal(c.global_D, 256), assert_int_equal(c.global_G, 4);
    /* default RoPE on the full layers: their head dim, every frequency */
    c = mt_test_config_parse("{" BASE ", \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\", "
                             "\"rope_theta\": 1e4}, \"sliding_attention\": {\"rope_type\": \"default\", "
                             "\"rope_theta\": 100}}}");
    assert_int_equal(c.rope_type, MT_ROPE_DEFAULT);
    float *inv = malloc(mt_config_rope_inv_freq_len(&c) * sizeof(float));
    mt_config_rope_inv_freq(&c, inv);
    assert_true(close_to(inv[255], 1.0 / pow(1e4, 510.0 / 512)));
    assert_true(close_to(inv[256 + 127], 1.0 / pow(100.0, 254.0 / 256)));
    free(inv);
    /* the multimodal config nests it; "vision" bidirectional attention concerns image tokens only */
    c = mt_test_config_parse("{\"model_type\": \"gemma4\", \"vision_config\": {\"hidden_size\": 8}, \"text_config\": {"
                             BASE ", \"use_bidirectional_attention\": \"vision\"}}");
    assert_int_equal(c.nested, 1), assert_int_equal(c.arch, MT_ARCH_GEMMA4);
}

static void test_refusals(void **state) {
    (void)state;
    mt_test_config_refused("{\"model_type\": \"gemma4_text\", \"hidden_size\": 32, \"intermediate_size\": 24, "
                           "\"num_hidden_layers\": 7, \"num_attention_heads\": 4, \"vocab_size\": 96}",
                           "hidden_size_per_layer_input = 256 (Gemma4TextConfig's default when absent)");
    mt_test_config_refused("{" BASE ", \"hidden_size_per_layer_input\": 256}", "E2B/E4B");
    mt_test_config_refused("{" BASE ", \"num_kv_shared_layers\": 2}", "num_kv_shared_layers = 2");
    mt_test_config_refused("{" BASE ", \"enable_moe_block\": true}", "enable_moe_block");
    mt_test_config_refused("{" BASE ", \"attention_bias\": true}", "attention_bias");
    mt_test_config_refused("{" BASE ", \"attn_logit_softcapping\": 50.0}", "attn_logit_softcapping");
    mt_test_config_refused("{" BASE ", \"use_bidirectional_attention\": \"all\"}", "use_bidirectional_attention");
    mt_test_config_refused("{" BASE ", \"hidden_activation\": \"gelu\"}", "hidden_activation \"gelu\"");
    mt_test_config_refused("{" BASE ", \"final_logit_softcapping\": 0}", "final_logit_softcapping");
    mt_test_config_refused("{" BASE ", \"sliding_window\": null}", "sliding_window is null");
    mt_test_config_refused("{" BASE ", \"pad_token_id\": 96}", "pad_token_id");
    mt_test_config_refused("{" BASE ", \"global_head_dim\": 7}", "global_head_dim");
    mt_test_config_refused("{" BASE ", \"attention_k_eq_v\": true, \"num_global_key_value_heads\": 3}",
                           "num_global_key_value_heads");
    mt_test_config_refused("{" BASE ", \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"yarn\", "
                           "\"rope_theta\": 1e6}, \"sliding_attention\": {\"rope_theta\": 1e4}}}",
                           "rope_type \"yarn\" is not supported for gemma4");
    mt_test_config_refused("{" BASE ", \"rope_parameters\": {\"full_attention\": {\"rope_theta\": 1e6}, "
                           "\"sliding_attention\": {\"rope_type\": \"proportional\", \"rope_theta\": 1e4}}}",
                           "rope_parameters.sliding_attention.rope_type \"proportional\"");
    mt_test_config_refused("{" BASE ", \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\", "
                           "\"partial_rotary_factor\": 0.5, \"rope_theta\": 1e6}, \"sliding_attention\": "
                           "{\"rope_theta\": 1e4}}}", "partial_rotary_factor = 0.5 with rope_type default");
    mt_test_config_refused("{" BASE ", \"rope_parameters\": {\"full_attention\": {\"rope_theta\": 1e6}}}",
                           "rope_parameters.sliding_attention is missing");
    mt_test_config_refused("{" BASE ", \"num_hidden_layers\": 3, " TYPES3 ", \"per_layer_config\": "
                           "{\"0\": {\"head_dim\": 64}}}", "sliding_attention layer");
    mt_test_config_refused("{" BASE ", \"num_hidden_layers\": 3, " TYPES3 ", \"per_layer_config\": "
                           "{\"1\": {\"intermediate_size\": 64}}}", "per_layer_config.1.intermediate_size");
    mt_test_config_refused("{" BASE ", \"num_hidden_layers\": 3, \"layer_types\": [\"full_attention\", "
                           "\"full_attention\", \"full_attention\"], \"per_layer_config\": {\"1\": {\"head_dim\": 64}, "
                           "\"2\": {\"head_dim\": 32}}}", "different shapes");
    mt_test_config_refused("{" BASE ", \"num_hidden_layers\": 3, \"layer_types\": [\"full_attention\", "
                           "\"full_attention\", \"full_attention\"], "
                           "\"per_layer_config\": {\"1\": {\"head_dim\": 64}}}",
                           "lists 1 of the 3");
    mt_test_config_refused("{\"model_type\": \"gemma4\", \"vision_config\": {}}", "without a text_config");
    mt_test_config_refused("{" BASE ", \"attention_dropout\": 0.1}", "attention_dropout");
}

/* The saved config reads back as the same model (the layer bits, the full layers' shape, RoPE). */
static void test_save_roundtrip(void **state) {
    (void)state;
    mt_config cases[5] = {load_fixture("gemma4_tiny"), load_fixture("gemma4_vl"), load_fixture("gemma4_moe"),
                          mt_test_config_parse("{" BASE ", \"pad_token_id\": null, \"final_logit_softcapping\": 30}"),
                          mt_test_config_parse("{" BASE ", \"rope_parameters\": {\"full_attention\": {\"rope_type\": "
                                               "\"default\", \"rope_theta\": 5e5}, "
                                               "\"sliding_attention\": {\"rope_theta\": 9}}}")};
    cases[1].nested = 0; /* a nested config is copied, not written: its text part as a text model */
    strcpy(cases[1].model_type, "gemma4_text");
    for (int i = 0; i < 5; i++) mt_test_config_roundtrip(&cases[i]); /* every field, the layer bits included */
}

/* A backend without Gemma 4's ops refuses it by name (a fake one here), the CPU backend has them; LoRA
 * runs (checked against PEFT: test_train_torch's lora_gemma4, lora_gemma4_moe). */
static void test_backend_refused_lora_runs(void **state) {
    (void)state;
    mt_config c = load_fixture("gemma4_tiny");
    mt_backend *cpu = mt_backend_cpu_create();
    assert_int_equal(mt_layer_backend_check(&c, cpu), MT_OK);
    assert_int_equal(mt_layer_check_runnable(&c), MT_OK);
    mt_backend fake = *cpu;
    fake.name = "cuda";
    fake.rmsnorm_unweighted = 0;
    mt_test_backend_refused(&c, &fake, "gemma4_text");
    void (*const *ops[])(void) = {(void (*const *)(void))&fake.scale_by, (void (*const *)(void))&fake.softcap,
                                  (void (*const *)(void))&fake.lm_head_loss_softcap,
                                  (void (*const *)(void))&fake.geglu_forward};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        fake = *cpu;
        *(void (**)(void))ops[i] = NULL;
        assert_int_equal(mt_layer_backend_check(&c, &fake), MT_ERR);
    }
    cpu->destroy(cpu);
    c.lora_rank = 4;
    assert_int_equal(mt_layer_check_runnable(&c), MT_OK);
}

/* LoRA's adapter table: every projection of attention and the MLP; gemma4_tiny's full layers (2, 5)
 * have no v_proj (keys as values) and their own q/k/o shapes; on gemma4_moe the dense MLP is
 * adapted and the router and the experts are refused as targets by name. */
static void test_lora_table(void **state) {
    (void)state;
    mt_config c = load_fixture("gemma4_tiny");
    mt_param_table t;
    mt_param_table_init(&t, &c);
    mt_lora_table lt;
    mt_lora_opts o = {.rank = 4};
    if (mt_lora_table_init(&lt, &t, &o) != MT_OK) fail_msg("%s", mt_error_message());
    assert_string_equal(lt.targets, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
    assert_int_equal(lt.n_modules, 4 * 7 + 2 * 6);
    /* sliding: q 4 (32 + 64), k and v 4 (32 + 32), o 4 (64 + 32), gate/up/down 4 (32 + 24); full
     * (D 32, 1 kv head): q 4 (32 + 128), k 4 (32 + 32), o 4 (128 + 32), the MLP */
    assert_int_equal(lt.n_real, 4 * (384 + 2 * 256 + 384 + 3 * 224) + 2 * (640 + 256 + 640 + 3 * 224));
    for (int l = 0; l < c.L; l++) {
        char name[160];
        snprintf(name, sizeof name, "base_model.model.model.layers.%d.self_attn.v_proj.lora_A.weight", l);
        int full = mt_config_layer_window(&c, l) == 0;
        assert_int_equal(mt_lora_find_name(&lt, name) == NULL, full);
        assert_int_equal(mt_lora_find(&lt, l, MT_W_V) == NULL, full);
    }
    const mt_lora_param *q = mt_lora_find_name(&lt, "base_model.model.model.layers.5.self_attn.q_proj.lora_B.weight");
    assert_non_null(q);
    assert_int_equal(q->shape[0], 128), assert_int_equal(q->shape[1], 4);
    mt_lora_table_free(&lt);
    o.targets = "v_proj,layer_scalar"; /* a buffer, not a module */
    assert_int_equal(mt_lora_table_init(&lt, &t, &o), MT_ERR);
    mt_param_table_free(&t);

    c = load_fixture("gemma4_moe");
    mt_param_table_init(&t, &c);
    o.targets = NULL;
    if (mt_lora_table_init(&lt, &t, &o) != MT_OK) fail_msg("%s", mt_error_message());
    assert_int_equal(lt.n_modules, 2 * 7 + 6);
    assert_non_null(mt_lora_find_name(&lt, "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"));
    mt_lora_table_free(&lt);
    static const char *const refused[] = {"router", "proj", "experts", "gate_up_proj", "q_proj,router.proj"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        o.targets = refused[i];
        assert_int_equal(mt_lora_table_init(&lt, &t, &o), MT_ERR);
        if (!strstr(mt_error_message(), "gemma4")) fail_msg("%s: %s", refused[i], mt_error_message());
    }
    mt_param_table_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_fields),
        cmocka_unit_test(test_table_matches_checkpoint),
        cmocka_unit_test(test_moe_table),
        cmocka_unit_test(test_published_counts),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_save_roundtrip),
        cmocka_unit_test(test_backend_refused_lora_runs),
        cmocka_unit_test(test_lora_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
