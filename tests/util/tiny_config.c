#include "tiny_config.h"

#include <string.h>

#include "cmocka_includes.h"

mt_config mt_test_tiny_config(const char *variant) {
    mt_config c;
    memset(&c, 0, sizeof c);
    c.arch = MT_ARCH_LLAMA;
    strcpy(c.model_type, "llama");
    c.C = 16; c.F = 32; c.L = 2; c.H = 4; c.G = 2; c.D = 4; c.V = 40;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 10000.0;
    c.rope_type = MT_ROPE_DEFAULT;
    c.max_position_embeddings = 64;
    c.initializer_range = 0.02f;
    c.bos_token_id = c.eos_token_id = -1;
    if (!strcmp(variant, "llama_gqa")) {
    } else if (!strcmp(variant, "llama3_tied")) {
        c.G = 1;
        c.D = 8;
        c.H = 2;
        c.tie_word_embeddings = 1;
        c.rope_type = MT_ROPE_LLAMA3;
        c.rope_theta = 500.0;
        c.rope_factor = 8.0;
        c.rope_low_freq_factor = 1.0;
        c.rope_high_freq_factor = 4.0;
        c.rope_original_max_pos = 8;
    } else if (!strcmp(variant, "llama_bias")) {
        c.G = 4;
        c.qkv_bias = c.o_bias = c.mlp_bias = 1;
    } else if (!strcmp(variant, "qwen2_bias_tied")) {
        c.arch = MT_ARCH_QWEN2;
        strcpy(c.model_type, "qwen2");
        c.qkv_bias = 1;
        c.tie_word_embeddings = 1;
    } else if (!strcmp(variant, "qwen3_qknorm")) {
        c.arch = MT_ARCH_QWEN3;
        strcpy(c.model_type, "qwen3");
        c.D = 8;
        c.qk_norm = 1;
    } else if (!strcmp(variant, "mistral")) {
        c.arch = MT_ARCH_MISTRAL;
        strcpy(c.model_type, "mistral");
        c.G = 1;
    } else {
        fail_msg("unknown tiny config variant %s", variant);
    }
    return c;
}
