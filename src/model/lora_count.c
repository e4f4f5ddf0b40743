/* PEFT's count of LoRA parameters over the parameter table (model/lora_count.h). */
#include "model/lora_count.h"

#include "core/error.h"
#include "model/lora.h"

int mt_lora_count(const mt_param_table *t, int rank, const char *targets, int64_t *params,
                  int64_t *modules) {
    mt_lora_table lt;
    mt_lora_opts o = {.rank = rank, .targets = targets};
    if (mt_lora_table_init(&lt, t, &o) != MT_OK) return MT_ERR;
    *params = lt.n_real;
    *modules = lt.n_modules;
    mt_lora_table_free(&lt);
    return MT_OK;
}
