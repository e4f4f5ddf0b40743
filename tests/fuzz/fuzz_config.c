/* libFuzzer: config.json (mt_config_parse, the in-memory entry point mt_config_load wraps).
 * On MT_ERR the output is untouched and a message is set; a config that parses is validated,
 * counted, its RoPE frequencies computed, and saved and parsed back: the round trip must give the
 * same model (what a checkpoint's config.json relies on). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "fz_util.h"
#include "model/config.h"

static void same_config(const mt_config *a, const mt_config *b) {
    FZ_ASSERT(a->arch == b->arch && strcmp(a->model_type, b->model_type) == 0);
    FZ_ASSERT(a->C == b->C && a->F == b->F && a->L == b->L && a->H == b->H && a->G == b->G &&
              a->D == b->D && a->V == b->V);
    FZ_ASSERT(a->rms_norm_eps == b->rms_norm_eps && a->rope_theta == b->rope_theta);
    FZ_ASSERT(a->rope_type == b->rope_type && a->rope_factor == b->rope_factor &&
              a->rope_low_freq_factor == b->rope_low_freq_factor &&
              a->rope_high_freq_factor == b->rope_high_freq_factor &&
              a->rope_original_max_pos == b->rope_original_max_pos);
    FZ_ASSERT(a->max_position_embeddings == b->max_position_embeddings);
    FZ_ASSERT(a->tie_word_embeddings == b->tie_word_embeddings && a->qkv_bias == b->qkv_bias &&
              a->o_bias == b->o_bias && a->mlp_bias == b->mlp_bias && a->qk_norm == b->qk_norm);
    FZ_ASSERT(a->sliding_window == b->sliding_window);
    FZ_ASSERT(a->initializer_range == b->initializer_range);
    /* a negative id is written as absent and read back as -1 */
    FZ_ASSERT((a->bos_token_id < 0 ? -1 : a->bos_token_id) == b->bos_token_id);
    FZ_ASSERT((a->eos_token_id < 0 ? -1 : a->eos_token_id) == b->eos_token_id);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    mt_config cfg, before;
    memset(&cfg, 0xA5, sizeof cfg);
    memset(&before, 0xA5, sizeof before);
    mt_error_clear();
    int rc = mt_config_parse(&cfg, text, "config.json");
    free(text);
    if (rc != MT_OK) {
        FZ_ASSERT(memcmp(&cfg, &before, sizeof cfg) == 0 && mt_error_message()[0]);
        fz_refused();
        return 0;
    }
    FZ_ASSERT(mt_config_validate(&cfg, "config.json") == MT_OK);
    FZ_ASSERT(mt_config_param_count(&cfg) > 0);
    if (cfg.D <= 4096) {
        float inv[2048];
        mt_config_rope_inv_freq(&cfg, inv);
    }
    const char *path = fz_path(0, "config.json");
    FZ_ASSERT(mt_config_save(&cfg, path) == MT_OK);
    mt_config back;
    FZ_ASSERT(mt_config_load(&back, path) == MT_OK);
    same_config(&cfg, &back);
    return 0;
}
