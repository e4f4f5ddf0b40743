/* Tiny model configs of each family variant, built in code for tests. */
#ifndef MT_TINY_CONFIG_H
#define MT_TINY_CONFIG_H

#include "model/config.h"

/* variant: "llama_gqa", "llama3_tied", "llama_bias", "qwen2_bias_tied", "qwen3_qknorm",
 * "mistral". C 16, F 32, L 2, H 4, D 8 (qwen3: D 8 with H*D = 32 != C), V 40. */
mt_config mt_test_tiny_config(const char *variant);

#endif
