/* LoRA adapters as PEFT counts them: a rank-r adapter on a linear module of in features and out
 * features trains lora_A (r, in) and lora_B (out, r), r * (in + out) parameters. Targets are PEFT's
 * target_modules names: a module matches when its Hugging Face name (the tensor's, less
 * ".weight") ends with ".NAME". Counting only: megatrain does not train adapters yet. */
#ifndef MT_LORA_COUNT_H
#define MT_LORA_COUNT_H

#include <stdint.h>

#include "model/params.h"

/* The default targets: every linear projection of the token mixers and the MLPs (attention's
 * q/k/v/o, the Gated DeltaNet's in_proj_qkv/z/b/a and out_proj, gate/up/down, which includes a
 * shared expert's); not the embedding, the LM head, the MoE router or the experts. The experts
 * are never counted: transformers 5 holds them as fused parameters, not Linear modules. */
#define MT_LORA_DEFAULT_TARGETS \
    "q_proj,k_proj,v_proj,o_proj,in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,out_proj,gate_proj,up_proj,down_proj"

/* The trainable parameters of rank `rank` adapters on the 2-D tensors of t that `targets` (a
 * comma-separated list; NULL: the default above, of which a model has what its family has) names,
 * and how many modules they are (*modules). MT_ERR naming a given target that matches no module of
 * the model (PEFT refuses those too), an empty name, or rank < 1. */
int mt_lora_count(const mt_param_table *t, int rank, const char *targets, int64_t *params,
                  int64_t *modules);

#endif
