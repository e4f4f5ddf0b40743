/* The optimizer thread: AdamW over the host state, group by group, in the order the next forward
 * needs the groups (embed, layer 0..L-1, head), so that the forward of the next step waits for
 * one layer's update, never for the whole model. What one group's update reads and writes (the
 * format, where its gradient waits) is the training state's (train_state.h); GPU-tier groups are
 * updated on the compute side and count as done at once here. */
#ifndef MT_OPTIMIZER_H
#define MT_OPTIMIZER_H

#include <stdint.h>

#include "../backend/backend.h"
#include "../model/params.h"
#include "trace.h"

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
} mt_adamw_hparams;

typedef struct mt_train_state mt_train_state;

typedef struct mt_optimizer mt_optimizer;

mt_optimizer *mt_optimizer_create(const mt_param_table *t, mt_train_state *st, mt_backend *be,
                                  mt_trace *trace);
void mt_optimizer_destroy(mt_optimizer *o);

/* Starts Adam step `step` (1-based) in the background: once grads_ready has completed, each
 * group is updated with gradient * grad_scale; weight decay only on tensors of >= 2 dims. */
void mt_optimizer_start(mt_optimizer *o, const mt_adamw_hparams *hp, int64_t step,
                        float grad_scale, mt_event *grads_ready);

/* Instead of an update (a skipped step): once grads_ready has completed, restores each group
 * (mt_train_state_restore_group: full's upload buffer, which holds the dropped gradient, is
 * rewritten from master) in the same group order and with the same per-group waits, so the next
 * forward sees the weights as they were; master and the moments are not touched. `step` only
 * labels the trace. */
void mt_optimizer_skip(mt_optimizer *o, int64_t step, mt_event *grads_ready);

/* Blocks until the running step, if any, has updated group `layer` (-1 embed, L head). */
void mt_optimizer_wait_group(mt_optimizer *o, int layer);
void mt_optimizer_wait_all(mt_optimizer *o);

/* Wall time of the last completed update (all groups, the wait for the gradients excluded). */
double mt_optimizer_last_ms(mt_optimizer *o);

/* Tests only: sleep this long after each group, to make the overlap with the next forward
 * observable on a fast machine. */
void mt_optimizer_set_delay_us(mt_optimizer *o, int us);

#endif
