/* The planner's estimate of one training step's time (issues 10 and 14): what the compute, the
 * PCIe copies and the host AdamW each take, which of them bounds the step, and how long the next
 * forward waits for the host update (what --gpu-layers auto weighs, planner.h). Arithmetic only.
 *
 * The schedule estimated is the engine's (engine.c, optimizer.c):
 *  - compute: the step's executed matmul FLOPs (flops.h: forward, recompute, backward, LM head,
 *    sparse checkpoints' remade inputs;
 *    MoE layers their k active experts) at the backend's flops_rate; MoE layers add what the
 *    backend reports beyond FLOPs (a fixed cost per expert GEMM call, the grouped GEMM's rate,
 *    the routing kernels' bytes; moe_pass_extra_s) per call of a micro-batch or chunk.
 *  - PCIe, per step: the streamed layers' weights go up twice (forward, backward; once when
 *    resident), embed and head once; the offloaded checkpoints down once and all but the last
 *    back up; every host group's gradient comes down once (in the backward, or fetched by the
 *    update when it waits on the GPU). The copies overlap the compute; they take at least the
 *    larger direction at its one-way rate, and both directions at the duplex rate.
 *  - host AdamW: the host groups (all but the GPU tier's layers) at host_rate, on the optimizer
 *    thread once the backward's last gradient is out, in the order embed, layers k..L-1, head. It
 *    overlaps only the NEXT forward. That forward enqueues nothing before the embed and the first
 *    streamed layer are updated (engine.c, forward: the first prefetch waits for both), so it
 *    starts start_s after the backward whatever the tier; then each streamed layer's load waits
 *    for that layer's update, the head's for the head's. The tier's layers (0..k-1) wait for
 *    nothing, so with k of them the host starts k layers ahead of the forward (their own update,
 *    on the compute stream, runs meanwhile: at GPU memory speed it is a few ms, left out).
 *  - --update-on gpu (engine.h update_on_device): the same schedule, the "host" update running at
 *    the pace of each group's state going up and coming back (double-buffered, so at the duplex
 *    rate), with the next forward's weights sharing the uplink (each group's upload follows its
 *    update): duplex_rate / (state + weight bytes) parameters/s; the state's bytes in the PCIe
 *    totals instead of the gradients'.
 *  - wait_s: how much later that forward ends than with an instant host from the same start
 *    (loads and compute simulated layer by layer; 0: the host keeps ahead).
 */
#ifndef MT_STEP_TIME_H
#define MT_STEP_TIME_H

#include "backend/backend.h"
#include "engine/engine.h"
#include "model/params.h"

/* The forward "waits" when the host holds it back by more than this share of the forward (about
 * 1% of the step): below it, a GPU tier layer (1.3-3 GiB at 7B) would cost about as much, in the
 * saved internals its memory would have held (a layer's recompute is ~1/4 of its step time), as
 * it gains. The forward, not the step: it does not depend on the saves chosen after the tier. */
#define MT_STEP_WAIT_SHARE 0.03

typedef enum { MT_BOUND_COMPUTE = 0, MT_BOUND_PCIE = 1, MT_BOUND_HOST = 2 } mt_step_bound;

typedef struct {
    double flops, compute_s;       /* executed matmul FLOPs; at the backend's rate, + moe_s */
    double moe_s;                  /* the MoE layers' time beyond their FLOPs (step_time.c) */
    double delta_s;                /* the Gated DeltaNet layers' recurrence beyond its FLOPs at the
                                      GEMMs' rate (delta_rule_rate) */
    double forward_s;              /* of which the forward (layers and the LM head's product) */
    double remake_s;               /* of which sparse checkpoints' remade inputs (the forward of
                                      every layer before an odd one, again in the backward) */
    double span_s;                 /* of which a tiled call's Gated DeltaNet spans, remade in the
                                      backward (model/mixer_deltanet.c: about one mixer forward
                                      more a DeltaNet layer) */
    double h2d_bytes, d2h_bytes, pcie_s;
    double host_params, host_s;    /* parameters the host updates; at host_rate */
    double start_s;                /* the next forward starts this long after the backward */
    double wait_s;                 /* and then waits this long for the host update in all */
    double layer_bytes;            /* the largest layer's weights as uploaded */
    double layer_forward_s, layer_host_s; /* its forward, its host update */
    /* per token mixer (model/config.h mt_mixer), for models that mix them: its layers, the first
     * such layer's parameters (unpadded) and forward */
    int mixer_layers[2];
    double mixer_params[2], mixer_forward_s[2];
    mt_step_bound bound;           /* what bounds the step (mt_step_time_of says how) */
    int streamed;                  /* --update-on gpu: host_s is the streamed update's, at the pace
                                      of the state crossing PCIe both ways (duplex_rate / state_bytes
                                      a param), the state's bytes in h2d and d2h (no gradient
                                      comes down) */
    double state_bytes;            /* streamed: the state's bytes a param (each way; the uplink
                                      also carries the weights' upload, el) */
} mt_step_time;

/* 1 when the forward waits for the host (MT_STEP_WAIT_SHARE). */
int mt_step_time_waits(const mt_step_time *st);
/* The step's estimate in seconds: the compute with the forward's late start and waits, or the
 * copies where they take longer. */
double mt_step_time_total(const mt_step_time *st);

/* 1 when the backend reports the rates an estimate needs. */
int mt_step_time_known(const mt_backend_memory *m);

/* The estimate for the plan eo (batch, T, gpu_layers, offload, saved layers, resident, state),
 * one rank, compute dtype `dtype`, host AdamW at host_rate parameters/s. bound: PCIe when the
 * copies outlast the compute and the forward's waits; else the host when the forward waits
 * for it (mt_step_time_waits); else compute. */
void mt_step_time_of(const mt_param_table *t, mt_dtype dtype, const mt_engine_opts *eo,
                     const mt_backend_memory *m, double host_rate, mt_step_time *st);

/* The smallest --batch (eo's --seq, tier, saves and checkpoint places) at which the step is
 * compute-bound: the copies take no longer than the compute and the forward does not wait for the
 * host; 0 when none up to 2^20. */
int mt_step_time_compute_batch(const mt_param_table *t, mt_dtype dtype, const mt_engine_opts *eo,
                               const mt_backend_memory *m, double host_rate);

/* The host AdamW rate of format f in parameters/s: MT_HOST_ADAMW (Gparam/s) when set, else the
 * table below, for the ISA the kernels run (core/cpu_isa.h). source says which ("MT_HOST_ADAMW",
 * or the table's entry). MT_ERR when MT_HOST_ADAMW is not a positive number.
 *
 * The table is measured IN TRAINING on the H200 host (16 threads, AVX-512; bench/RESULTS.md,
 * sessions 4-5): 7B full 1665-1685 ms for 7.6 Gparam = 4.5; compact, the median of eight steps
 * with and without a tier, 3.8 (3.4-4.5); tight not measured in training: compact's rate times
 * the kernels' ratio alone (5.36 / 5.99) = 3.4. AVX2: x 0.6 (compact 3.59 / 5.99, tight 3.33 /
 * 5.36 alone on that host); scalar: x 0.45 (plain C 2.38 against the AVX-512 kernel's 5.05,
 * docs/DESIGN.md). Not a calibration at plan time: the kernel timed alone ran 1.5x faster (5.99)
 * than in training, where it shares memory bandwidth with the copies and the gradient fetches,
 * and `plan` often runs on another machine than the one that trains. */
int mt_step_time_host_rate(mt_state_format f, double *rate, char *source, size_t n);

#endif
