/* LoRA adapters as PEFT counts them: a rank-r adapter on a linear module of in features and out
 * features trains lora_A (r, in) and lora_B (out, r), r * (in + out) parameters. Targets are PEFT's
 * target_modules names: a module matches when its Hugging Face name (the tensor's, less
 * ".weight") ends with ".NAME". */
#ifndef MT_LORA_COUNT_H
#define MT_LORA_COUNT_H

#include <stdint.h>

#include "model/params.h"

/* The trainable parameters of rank `rank` adapters on the 2-D tensors of t that `targets` (a
 * comma-separated list; NULL: the default, model/lora.h, of which a model has what its family has) names,
 * and how many modules they are (*modules). MT_ERR naming a given target that matches no module of
 * the model (PEFT refuses those too), one megatrain does not adapt, an empty name, or a bad rank
 * (model/lora.h, whose table it counts). */
int mt_lora_count(const mt_param_table *t, int rank, const char *targets, int64_t *params,
                  int64_t *modules);

#endif
