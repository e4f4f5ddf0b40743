/* LoRA parameter counts as PEFT counts them (model/lora_count.h), against hand arithmetic: rank r
 * on a Linear of (in, out) trains r * (in + out). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/config.h"
#include "model/lora_count.h"
#include "model/params.h"
#include "util/testutil.h"

static void table_of(mt_param_table *t, const char *json) {
    mt_config c;
    if (mt_config_parse(&c, json, "c.json") != MT_OK) fail_msg("%s", mt_error_message());
    mt_param_table_init(t, &c);
}

static const char *llama70 =
    "{\"model_type\": \"llama\", \"hidden_size\": 8192, \"intermediate_size\": 28672, "
    "\"num_hidden_layers\": 80, \"num_attention_heads\": 64, \"num_key_value_heads\": 8, "
    "\"vocab_size\": 128256}";

/* Llama-3.3-70B's shape, rank 16 on every projection: per layer q and o 16 (8192 + 8192) =
 * 262144 each, k and v 16 (8192 + 1024) = 147456 each, gate, up and down 16 (8192 + 28672) =
 * 589824 each: 2588672; 80 layers: 207093760 (the ~0.2B the design counts). */
static void test_llama70(void **state) {
    (void)state;
    mt_param_table t;
    table_of(&t, llama70);
    int64_t p, m;
    assert_int_equal(mt_lora_count(&t, 16, NULL, &p, &m), MT_OK);
    assert_int_equal(m, 80 * 7);
    assert_int_equal(p, 207093760LL);
    assert_int_equal(mt_lora_count(&t, 16, "q_proj,v_proj", &p, &m), MT_OK);
    assert_int_equal(m, 160);
    assert_int_equal(p, 80 * (262144LL + 147456LL));
    /* a name the model lacks, an empty one, a bad rank: refused by name */
    assert_int_equal(mt_lora_count(&t, 16, "q_proj,in_proj_qkv", &p, &m), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "no module of this llama model is named \"in_proj_qkv\""));
    assert_int_equal(mt_lora_count(&t, 16, "q_proj,,v_proj", &p, &m), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "an empty module name"));
    assert_int_equal(mt_lora_count(&t, 0, NULL, &p, &m), MT_ERR);
    /* "proj" is no module's whole name: a suffix must be the module's own */
    assert_int_equal(mt_lora_count(&t, 16, "proj", &p, &m), MT_ERR);
    mt_param_table_free(&t);
}

/* Qwen3.6-35B-A3B, rank 16: 10 attention layers q 16 (2048 + 8192) = 163840, k and v 16 (2048 +
 * 512) = 40960, o 16 (4096 + 2048) = 98304; 30 Gated DeltaNets in_proj_qkv 163840, z 16 (2048 +
 * 4096) = 98304, b and a 16 (2048 + 32) = 33280, out_proj 98304; every layer's shared expert gate,
 * up, down 16 (2048 + 512) = 40960 each; no router, no expert: 21166080 over 310 modules. */
static void test_qwen3_5_moe(void **state) {
    (void)state;
    char *path = mt_fixture_path("../../configs/qwen3.6-35b-a3b.json");
    mt_config c;
    if (mt_config_load(&c, path) != MT_OK) fail_msg("%s", mt_error_message());
    free(path);
    mt_param_table t;
    mt_param_table_init(&t, &c);
    int64_t p, m;
    assert_int_equal(mt_lora_count(&t, 16, NULL, &p, &m), MT_OK);
    assert_int_equal(m, 10 * 7 + 30 * 8);
    int64_t attn = 163840 + 2 * 40960 + 98304, delta = 163840 + 98304 + 2 * 33280 + 98304,
            shared = 3 * 40960;
    assert_int_equal(p, 10 * attn + 30 * delta + 40 * shared);
    assert_int_equal(p, 21166080LL);
    mt_param_table_free(&t);
}

/* gpt-oss-20b's shape (openai/gpt-oss-20b config.json, the fields that size it): the MLP is the
 * router and the fused experts, no Linear of PEFT's, so the default is the attention projections:
 * per layer q 16 (2880 + 4096) = 111616, k and v 16 (2880 + 512) = 54272, o 111616; 24 layers:
 * 7962624 over 96 modules, and q,v at rank 8: 1990656. PEFT 0.21 on transformers 5.25's
 * GptOssForCausalLM of this config (meta device) counts the same (get_nb_trainable_parameters:
 * 7962624 of 20922719808, i.e. a base of 20914757184). */
static void test_gpt_oss_20b(void **state) {
    (void)state;
    mt_param_table t;
    table_of(&t, "{\"model_type\": \"gpt_oss\", \"hidden_size\": 2880, \"intermediate_size\": 2880, "
                 "\"num_hidden_layers\": 24, \"num_attention_heads\": 64, \"num_key_value_heads\": 8, "
                 "\"head_dim\": 64, \"vocab_size\": 201088, \"num_local_experts\": 32, "
                 "\"num_experts_per_tok\": 4, \"sliding_window\": 128}");
    assert_int_equal(t.n_real, 20914757184LL);
    int64_t p, m;
    assert_int_equal(mt_lora_count(&t, 16, NULL, &p, &m), MT_OK);
    assert_int_equal(m, 24 * 4);
    assert_int_equal(p, 24 * (2 * 111616LL + 2 * 54272LL));
    assert_int_equal(p, 7962624LL);
    assert_int_equal(mt_lora_count(&t, 8, "q_proj,v_proj", &p, &m), MT_OK);
    assert_int_equal(p, 1990656LL);
    /* the experts through PEFT's target_parameters: down_proj (E 32, 2880, 2880) takes lora_A
     * (16 x 32, 2880) and lora_B (2880, 16 x 32) a layer */
    assert_int_equal(mt_lora_count(&t, 16, "q_proj,down_proj", &p, &m), MT_OK);
    assert_int_equal(m, 24 * 2);
    assert_int_equal(p, 24 * (111616LL + 2 * 16 * 32 * 2880LL));
    /* the router, and the dense MLP's names, are not modules there: refused by name */
    assert_int_equal(mt_lora_count(&t, 16, "q_proj,gate_proj", &p, &m), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "experts"));
    assert_int_equal(mt_lora_count(&t, 16, "router", &p, &m), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "router"));
    mt_param_table_free(&t);
}

/* gpt-oss-120b (openai/gpt-oss-120b config.json: 36 layers, 128 experts, the 20b's widths), rank 16
 * on the attention and the experts' projections (the run): per layer q, o 16 (2880 + 4096),
 * k, v 16 (2880 + 512), gate_up 16 x 128 (2880 + 5760), down 16 x 128 (2880 + 2880). */
static void test_gpt_oss_120b(void **state) {
    (void)state;
    mt_param_table t;
    table_of(&t, "{\"model_type\": \"gpt_oss\", \"hidden_size\": 2880, \"intermediate_size\": 2880, "
                 "\"num_hidden_layers\": 36, \"num_attention_heads\": 64, \"num_key_value_heads\": 8, "
                 "\"head_dim\": 64, \"vocab_size\": 201088, \"num_local_experts\": 128, "
                 "\"num_experts_per_tok\": 4, \"sliding_window\": 128}");
    int64_t p, m;
    assert_int_equal(mt_lora_count(&t, 16, "q_proj,k_proj,v_proj,o_proj,gate_up_proj,down_proj", &p, &m), MT_OK);
    assert_int_equal(m, 36 * 6);
    assert_int_equal(p, 36 * (2 * 111616LL + 2 * 54272LL + 16 * 128 * (8640LL + 5760LL)));
    assert_int_equal(p, 1073627136LL);
    mt_param_table_free(&t);
}

/* Gemma 4's published shapes (google/gemma-4-31B and 26B-A4B config.json's text_config, the fields
 * that size them; as test_config_gemma4's test_published_counts), rank 16. 31B: 50 sliding layers
 * (D 256, 16 kv heads) q 16 (5376 + 8192) = 217088, k and v 16 (5376 + 4096) = 151552, o 217088,
 * gate, up, down 16 (5376 + 21504) = 430080 each: 2027520; 10 full layers (D 512, 4 kv heads,
 * attention_k_eq_v: no v_proj) q 16 (5376 + 16384) = 348160, k 16 (5376 + 2048) = 118784, o 348160
 * and the MLP: 2105344; 122429440 over 50 * 7 + 10 * 6 = 410 modules. 26B-A4B: 25 sliding layers
 * (8 kv heads) q 16 (2816 + 4096) = 110592, k and v 16 (2816 + 2048) = 77824, o 110592, the dense
 * MLP's gate, up, down 16 (2816 + 2112) = 78848 each: 613376; 5 full layers (2 kv heads, no v_proj)
 * q 16 (2816 + 8192) = 176128, k 16 (2816 + 1024) = 61440, o 176128 and the MLP: 650240; the
 * router and the 128 fused experts no targets: 18585600 over 205 modules. PEFT 0.21 on
 * transformers 5.25's Gemma4ForCausalLM of these configs (meta device) counts the same
 * (get_nb_trainable_parameters: 122429440 of 30819774720, 18585600 of 25251727360; q_proj,v_proj:
 * 21913600 and 5591040). */
static void test_gemma4(void **state) {
    (void)state;
#define G4_COMMON "\"model_type\": \"gemma4_text\", \"head_dim\": 256, \"global_head_dim\": 512, " \
    "\"attention_k_eq_v\": true, \"vocab_size\": 262144, \"sliding_window\": 1024, " \
    "\"final_logit_softcapping\": 30.0, \"hidden_size_per_layer_input\": 0, \"max_position_embeddings\": 262144"
    mt_param_table t;
    table_of(&t, "{" G4_COMMON ", \"hidden_size\": 5376, \"intermediate_size\": 21504, \"num_hidden_layers\": 60, "
                 "\"num_attention_heads\": 32, \"num_key_value_heads\": 16, \"num_global_key_value_heads\": 4}");
    int64_t p, m;
    assert_int_equal(mt_lora_count(&t, 16, NULL, &p, &m), MT_OK);
    assert_int_equal(m, 50 * 7 + 10 * 6);
    assert_int_equal(p, 50 * (2 * 217088LL + 2 * 151552LL + 3 * 430080LL) +
                            10 * (2 * 348160LL + 118784LL + 3 * 430080LL));
    assert_int_equal(p, 122429440LL);
    assert_int_equal(mt_lora_count(&t, 16, "q_proj,v_proj", &p, &m), MT_OK);
    assert_int_equal(m, 60 + 50);
    assert_int_equal(p, 21913600LL);
    mt_param_table_free(&t);
    table_of(&t, "{" G4_COMMON ", \"hidden_size\": 2816, \"intermediate_size\": 2112, \"num_hidden_layers\": 30, "
                 "\"num_attention_heads\": 16, \"num_key_value_heads\": 8, \"num_global_key_value_heads\": 2, "
                 "\"enable_moe_block\": true, \"num_experts\": 128, \"top_k_experts\": 8, "
                 "\"moe_intermediate_size\": 704}");
#undef G4_COMMON
    assert_int_equal(mt_lora_count(&t, 16, NULL, &p, &m), MT_OK);
    assert_int_equal(m, 25 * 7 + 5 * 6);
    assert_int_equal(p, 25 * (2 * 110592LL + 2 * 77824LL + 3 * 78848LL) + 5 * (2 * 176128LL + 61440LL + 3 * 78848LL));
    assert_int_equal(p, 18585600LL);
    assert_int_equal(mt_lora_count(&t, 16, "q_proj,v_proj", &p, &m), MT_OK);
    assert_int_equal(p, 5591040LL);
    /* down_proj is the dense MLP's there (PEFT's too); the router and the experts are refused by name */
    assert_int_equal(mt_lora_count(&t, 16, "down_proj", &p, &m), MT_OK);
    assert_int_equal(m, 30);
    static const char *const refused[][2] = {{"router", "router"}, {"proj", "router"}, {"router.proj", "router"},
                                             {"q_proj,experts", "experts"}, {"gate_up_proj", "experts"},
                                             {"experts.down_proj", "experts"}};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        assert_int_equal(mt_lora_count(&t, 16, refused[i][0], &p, &m), MT_ERR);
        if (!strstr(mt_error_message(), refused[i][1]) || !strstr(mt_error_message(), "gemma4"))
            fail_msg("%s: %s", refused[i][0], mt_error_message());
    }
    mt_param_table_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama70),
        cmocka_unit_test(test_qwen3_5_moe),
        cmocka_unit_test(test_gpt_oss_20b),
        cmocka_unit_test(test_gpt_oss_120b),
        cmocka_unit_test(test_gemma4),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
