/* The optimizer thread: AdamW over the host state, group by group, in the order the next forward
 * needs the groups (embed, layer 0..L-1, head), so that the forward of the next step waits for
 * one layer's update, never for the whole model.
 *
 * Each group's gradient is read from the group's upload buffer, where the schedule left it after
 * the group's last use in the backward (the buffer is dead between that use and this update), and
 * the new upload copy is written in its place in the same pass: no gradient buffer the size of
 * the model exists anywhere. */
#ifndef MT_OPTIMIZER_H
#define MT_OPTIMIZER_H

#include <stdint.h>

#include "../backend/backend.h"
#include "../model/params.h"
#include "trace.h"

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
} mt_adamw_hparams;

typedef struct mt_optimizer mt_optimizer;

/* master, m, v: fp32 arenas; upload: the arena in upload_dtype (MT_F32 or MT_BF16), all laid out
 * as the table. n_threads: threads of one update (OpenMP inside the optimizer thread). */
mt_optimizer *mt_optimizer_create(const mt_param_table *t, float *master, float *m, float *v,
                                  void *upload, mt_dtype upload_dtype, int n_threads,
                                  mt_backend *be, mt_trace *trace);
void mt_optimizer_destroy(mt_optimizer *o);

/* Starts Adam step `step` (1-based) in the background: once grads_ready has completed, each
 * group is updated with gradient * grad_scale; weight decay only on tensors of >= 2 dims. */
void mt_optimizer_start(mt_optimizer *o, const mt_adamw_hparams *hp, int64_t step,
                        float grad_scale, mt_event *grads_ready);

/* Instead of an update (a skipped step): once grads_ready has completed, rewrites each group's
 * upload buffer (which holds the dropped gradient) from master, in the same group order and with
 * the same per-group waits, so the next forward sees the weights as they were; master and the
 * moments are not touched. `step` only labels the trace. */
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
