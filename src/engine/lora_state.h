/* The LoRA adapters' training state, all of it on the compute side (the adapters are small: a
 * 70B's rank-16 adapters are 0.2 B parameters, 3.3 GB with their fp32 master and moments): the
 * fp32 master, the two fp32 Adam moments (optim/state.h's full format, torch's AdamW), the copy
 * in the compute dtype the layers read (model/lora.h's arena layout), and the fp32 gradient the
 * backward accumulates into. The update runs on the compute stream (be->optim_update), like the
 * GPU tier's; no host optimizer, no gradient download. Every adapter tensor is 2-D, so all of
 * them take weight decay. With data parallel ranks each rank holds the whole state and the
 * gradient is summed over the ranks before the norm: the same update on every rank. */
#ifndef MT_LORA_STATE_H
#define MT_LORA_STATE_H

#include <stdint.h>

#include "../backend/backend.h"
#include "../model/lora.h"
#include "optimizer.h"

typedef struct mt_lora_state mt_lora_state;

/* The state of lt's adapters with weights `init` (host fp32, lt->total), moments zero. */
mt_lora_state *mt_lora_state_create(const mt_lora_table *lt, mt_backend *be, const float *init);
void mt_lora_state_free(mt_lora_state *s);

/* Compute side: the weights in the compute dtype, and the fp32 gradient (lt->total each). */
void *mt_lora_state_weights(const mt_lora_state *s);
float *mt_lora_state_grads(const mt_lora_state *s);
/* Bytes it holds on the compute side (for the plan): 12 + compute dtype + 4 per element. */
double mt_lora_state_bytes(const mt_lora_table *lt, mt_dtype compute);

/* On the compute stream: the gradient zeroed; its squared norm added to *out (compute side). */
void mt_lora_state_zero_grads(mt_lora_state *s);
void mt_lora_state_sumsq(mt_lora_state *s, float *out);
/* AdamW step `step` (1-based) with the gradient times grad_scale, on the compute stream. */
void mt_lora_state_update(mt_lora_state *s, const mt_adamw_hparams *hp, int64_t step,
                          float grad_scale);

/* Host copies (synchronous): the fp32 master weights, and the two moments (each lt->total fp32);
 * setting them (a resume, --adapter) refreshes the compute-dtype copy. moments may be NULL. */
void mt_lora_state_get(mt_lora_state *s, float *weights, float *exp_avg, float *exp_avg_sq);
void mt_lora_state_set(mt_lora_state *s, const float *weights, const float *exp_avg,
                       const float *exp_avg_sq);

#endif
