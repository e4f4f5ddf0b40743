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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama70),
        cmocka_unit_test(test_qwen3_5_moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
