/* PEFT's count of LoRA parameters over the parameter table (model/lora_count.h). */
#include "model/lora_count.h"

#include <string.h>

#include "core/error.h"

/* Whether tensor name "....NAME.weight" is module NAME's weight (the name ends ".NAME.weight"). */
static int is_module(const char *tensor, const char *name, size_t len) {
    size_t n = strlen(tensor), w = strlen(".weight");
    if (n < len + w + 1 || strcmp(tensor + n - w, ".weight") != 0) return 0;
    const char *at = tensor + n - w - len;
    return at[-1] == '.' && strncmp(at, name, len) == 0;
}

int mt_lora_count(const mt_param_table *t, int rank, const char *targets, int64_t *params,
                  int64_t *modules) {
    if (rank < 1) return mt_error_set("--lora %d: the rank must be at least 1", rank);
    int strict = targets != NULL; /* the default list names what any family may have */
    if (!targets) targets = MT_LORA_DEFAULT_TARGETS;
    *params = 0;
    *modules = 0;
    const char *p = targets;
    while (1) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0) return mt_error_set("--lora-targets \"%s\": an empty module name", targets);
        int64_t found = 0;
        for (int i = 0; i < t->n_params; i++) {
            const mt_param *q = &t->params[i];
            /* an expert's gate/up/down are slices of fused parameters in transformers 5, not
             * Linear modules PEFT wraps */
            if (q->ndim != 2 || q->expert >= 0 || !is_module(q->name, p, len)) continue;
            found++;
            *params += (int64_t)rank * (q->shape[0] + q->shape[1]);
        }
        if (!found && strict)
            return mt_error_set("--lora-targets: no module of this %s model is named \"%.*s\"",
                                t->cfg.model_type, (int)len, p);
        *modules += found;
        if (!end) break;
        p = end + 1;
    }
    return MT_OK;
}
