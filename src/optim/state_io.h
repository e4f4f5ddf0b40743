/* The training state as its readers and writers see it, tensor by tensor: the model's fp32
 * weights and the optimizer's parts of each tensor (mt_optim_arenas_parts), whichever format and
 * wherever they live (host arenas, GPU-tier arenas). The engine implements it over its state;
 * checkpoints save and load through it, and the CLI sets initial weights through it, one tensor at
 * a time, so no fp32 copy of the whole model ever exists (a 14B model's would be 59 GB).
 *
 * Every call handles one tensor of the table; host buffers are the caller's (get) or only read
 * (set). Calls are not concurrent with a training step (the engine finishes its update first). */
#ifndef MT_OPTIM_STATE_IO_H
#define MT_OPTIM_STATE_IO_H

#include <stdint.h>

#include "model/params.h"
#include "state.h"

typedef struct {
    mt_state_format format;
    uint64_t sr_seed; /* tight's rounding seed (saved and restored with the state) */
    void *ctx;
    /* p's fp32 weights -> dst (p->numel floats): exact for every format */
    int (*get_weights)(void *ctx, const mt_param *p, float *dst);
    /* p's weights from fp32 (the format's own rounding: full keeps them, compact splits them
     * exactly, tight rounds to nearest bf16); the upload copy follows, moments are untouched */
    int (*set_weights)(void *ctx, const mt_param *p, const float *src);
    /* p's optimizer parts (mt_optim_parts_layout(format, p->numel) order and sizes) -> parts[i].data,
     * buffers the caller allocated from that layout */
    int (*get_parts)(void *ctx, const mt_param *p, const mt_optim_tensor *parts);
    /* p's optimizer parts from parts[i].data (same layout) */
    int (*set_parts)(void *ctx, const mt_param *p, const mt_optim_tensor *parts);
    /* tight: sets the rounding seed (a resumed run rounds as the saved one); may be NULL */
    void (*set_sr_seed)(void *ctx, uint64_t seed);

    /* A state sharded over data-parallel ranks (NULL otherwise): what this rank holds, so that each
     * rank writes its own elements of a checkpoint (mt_checkpoint_write_shard). Not collective.
     * owned: elements [*lo, *hi) of tensor p are this rank's (*hi <= *lo: none); lo is 0 or a
     * multiple of MT_OPTIM_BLOCK, hi is numel or one. */
    void (*owned)(void *ctx, const mt_param *p, int64_t *lo, int64_t *hi);
    /* p's fp32 weights of elements [lo, lo + n), within owned -> dst (n floats) */
    int (*get_weights_range)(void *ctx, const mt_param *p, int64_t lo, int64_t n, float *dst);
    /* p's parts over its elements [lo, hi), within owned, in the state itself (read only): a part
     * of p->numel elements from element lo, hi - lo long; a block part (the scales) from block
     * lo / MT_OPTIM_BLOCK. Returns the number of parts, -1 with the error set. */
    int (*parts_range)(void *ctx, const mt_param *p, int64_t lo, int64_t hi, mt_optim_tensor *out);
} mt_state_io;

#endif
