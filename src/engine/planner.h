/* The memory planner: from what the user asked for (a request, where a choice may be MT_AUTO) and
 * what the backend reports (its dtype, be->mem_budget, be->memory), the options the engine runs —
 * every value resolved — and the bytes they hold on each side, before anything is allocated.
 *
 * The choices, in this order (each uses what the ones before it left):
 *  0. the GPU tier and where gradients wait (the optimizer format itself is the user's --state):
 *     --gpu-layers auto puts the fewest layers on the GPU that make the host state fit host RAM
 *     (none when it fits: the tier takes GPU memory the steps below would use); after step 1,
 *     when the backend reports rates (step_time.h), it adds the fewest more with which the next
 *     forward never waits for the host update (the host starts that many layers ahead), or when
 *     the GPU memory left at the micro-batch and checkpoint places of step 1 runs out first, the
 *     most that fit; before the saved internals of step 2 take that memory. compact and tight
 *     keep their gradients on the GPU (they cannot share the bf16 master the way full's share the
 *     upload copy) unless the host has room for them and that gives a better plan below (no
 *     offloaded checkpoints, then a larger micro-batch); on a cpu backend always on the host.
 *  1. micro-batch and checkpoint placement: the largest b dividing B whose plan fits the budget
 *     with the layer checkpoints on the compute side; only when no b does, the checkpoints of the
 *     first k layers go to host memory (k the fewest that fit; all with --offload-checkpoints) and
 *     it is the largest b that fits then. Offloading comes last because it costs
 *     most: it rules out saved internals (step 2, worth +6% at 7B and +16% at 1.5B on the H200,
 *     bench/RESULTS.md) and adds PCIe traffic (−2% at 7B), while halving b cost 4–5% (1.5B:
 *     micro 8, 4, 2 = 376, 362, 343 TFLOPS). On a backend whose compute side is host RAM (cpu)
 *     nothing is offloaded and b is the largest that host RAM holds: B unless RAM is short (one
 *     pass gives BLAS the most rows; there is no copy to overlap).
 *     When no plan fits that way either (long context, where the host is full too: offloading
 *     moves checkpoints into the host RAM the state needs), sparse checkpoints
 *     (--checkpoint-every auto): only every second layer's input kept, the others remade in the
 *     backward; about half the checkpoints' memory for one more forward of half the layers
 *     (~1/8 of the step's compute), so it comes after offloading, which costs only PCIe.
 *  2. saved internals (--saved-layers auto): as many layers as the memory left holds.
 *  3. resident weights (auto): when every layer keeps its internals and the L slots still fit.
 * Within step 1, at the smallest micro-batch (a long sequence), the layer's MLP is tiled over
 * token chunks (the largest of 32k..1k tokens that fits) before the checkpoints are offloaded:
 * tiling costs no traffic, only a few ulp against the untiled bits (model/layer.h).
 * Steps 0 and 1 first look for a plan that fits both sides at once: an offloaded checkpoint takes
 * host RAM, so for each count of offloaded layers the tier (auto) is the fewest layers that let
 * the host hold it, and a chunk whose fewest offloaded layers leave the host short gives way to a
 * smaller chunk (the 7B at 512k with full state: 16k chunks, 5 layers offloaded, where 32k chunks
 * need 6 and the host cannot hold them). Only when no such plan exists does the search fit the GPU
 * alone (the plan printed is then the one the GPU holds; the message is about the host).
 * A plan that does not fit carries what would (fit_gpu_mem, fit_seq, suggest), each found by
 * planning again with one thing changed; mt_plan_check names them.
 * "Fits" keeps be->memory.headroom free under the budget (at long context the attention
 * backward's pool need for one micro-batch when that is more: attention_pool, or
 * attention_pool_docs for a request whose rows pack documents); a plan is refused only when it
 * does not fit even without the headroom. No budget (0: cpu, or a GPU planned without --gpu-mem)
 * means nothing to fit: b = B, nothing offloaded, saved or resident unless asked for.
 *
 * Sizes are printed in GiB (2^30 bytes), as --gpu-mem reads them (args.h). */
#ifndef MT_PLANNER_H
#define MT_PLANNER_H

#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "engine/step_time.h"
#include "model/config.h"
#include "model/params.h"

#define MT_AUTO (-1) /* a request's choice left to the planner */

/* The defaults of train and plan when --batch / --seq are not given. */
#define MT_PLAN_DEFAULT_BATCH 8
int mt_plan_default_seq(const mt_config *cfg); /* min(max_position_embeddings, 1024) */

typedef struct {
    int batch;            /* B sequences per step */
    int T;                /* tokens per sequence */
    int micro_batch;      /* b dividing B, or MT_AUTO */
    int offload;          /* 1: the layer checkpoints go to host memory; MT_AUTO: when short */
    int checkpoint_every; /* 2: sparse checkpoints (engine.h); 1 (or 0): every layer's input;
                             MT_AUTO: sparse only when nothing fits otherwise (with offload auto) */
    int saved_layers;     /* 0..L, or MT_AUTO */
    int resident;         /* 0, 1, or MT_AUTO */
    int n_slots;          /* weight slots (>= 2) when not resident */
    int64_t gpu_mem;      /* --gpu-mem as given (0: not given), for the messages */
    double host_available; /* host RAM free for training in bytes (<= 0: unknown, unchecked) */
    mt_state_format state; /* --state */
    int gpu_layers;       /* 0..L, or MT_AUTO */
    int ranks;            /* data-parallel ranks sharing the host state (0, 1: one); batch is one rank's rows */
    int no_suggest;       /* internal: do not look for a lighter --state that would fit */
    double host_adamw;    /* host AdamW parameters/s for the time estimate (0: MT_HOST_ADAMW or
                             the measured table, mt_step_time_host_rate) */
    int documents;        /* 1: the rows pack several documents (packed data: doc_start), whose
                             attention backward takes be->memory.attention_pool_docs of the pool;
                             0: rows of one token stream, attention_pool */
    const mt_lora_table *lora; /* LoRA: these adapters train on a frozen base (engine.h); NULL */
    mt_base_format base_format; /* LoRA: the frozen layers bf16, fp8 or nf4 (engine/quant_base.h);
                                   quantized, --resident-weights yes keeps their blobs on the GPU
                                   (2 slots still: a layer is dequantized into one per load) */
    int update_on_device; /* --update-on gpu: where gradients wait on the GPU (compact, tight),
                             the host groups' AdamW runs there, their state streamed (engine.h);
                             the plan counts its staging slots and estimates the step with it
                             (step_time.h); MT_AUTO: where the estimate says it is faster (and
                             it fits) */
} mt_plan_request;

typedef struct {
    mt_engine_opts eo;    /* what the engine runs (batch, micro_batch, T, n_slots, offload,
                             saved_layers, resident; the caller adds opt_threads and trace) */
    mt_engine_plan mem;   /* the engine's bytes for eo */
    mt_backend_memory backend; /* what the backend takes for itself */
    const char *backend_name;
    mt_dtype dtype;       /* the backend's compute dtype */
    mt_config cfg;        /* the model's (for the printout) */
    int64_t budget;       /* compute-side budget in bytes (be->mem_budget; 0: none) */
    int64_t gpu_mem;      /* from the request */
    double host_available;
    double host_bytes;    /* host RAM in all (with the compute side when it is host RAM) */
    double compute_bytes; /* compute side in all: the engine's bytes + the backend's scratch */
    int micro_auto, offload_auto, tier_auto; /* chosen by the planner (printout, messages) */
    int host_short;       /* the host state does not fit host RAM even with every layer on the GPU */
    int joint;            /* internal: the search fits the host as well as the GPU */
    char suggest[96];     /* when the plan does not fit: a lighter --state that would */
    int64_t fit_gpu_mem;  /* ... the smallest --gpu-mem (whole GiB) that would (0: none, or not asked) */
    int fit_seq;          /* ... the longest --seq that would (0: none) */
    int L;
    double n_params;
    /* the step's time (step_time.h), when the backend reports rates (timed) */
    int timed;
    double host_rate;     /* host AdamW parameters/s, and where the number comes from */
    char host_rate_source[96];
    mt_step_time time;
    int compute_batch;    /* the smallest compute-bound --batch (0: none) */
    int tier_host;        /* auto: the fewest tier layers the host RAM needs */
    mt_step_time tier_host_time; /* ... and the step's time with only those */
    int tier_capped;      /* auto: the GPU memory ran out before the forward stopped waiting */
    double expert_share;  /* MoE: the experts' share of an MoE layer's parameters */
    int documents;        /* from the request: the pool is counted for packed rows */
    int update_auto;      /* --update-on auto: the planner compared both places ... */
    double update_other_s;/* ... and this is the step's estimate with the other (0: it did not fit) */
} mt_plan;

/* Resolves the request. MT_ERR (message naming the flag) when the request contradicts itself or
 * the model (a micro-batch that does not divide B, more saved layers than the model has, saved
 * layers with offloaded checkpoints); MT_OK otherwise, also when the plan does not fit: print it,
 * then mt_plan_check says so. */
int mt_plan_resolve(const mt_param_table *t, const mt_backend *be, const mt_plan_request *rq,
                    mt_plan *p);
/* MT_OK when the machine holds the plan; else MT_ERR with what to change. */
int mt_plan_check(const mt_plan *p);

/* The plan as `megatrain plan` and `train` show it: the micro-batch line, the host line
 * (mt_plan_print_host), the compute-side line, saved internals, resident weights, the tiles (the
 * layer's token chunk, the LM head's row chunk) and where the checkpoints wait; when timed, why
 * the tier (auto) has its size, the step's time per piece, what bounds it and the smallest
 * compute-bound batch, and one layer's bytes and times. */
void mt_plan_print(const mt_plan *p, FILE *out);
/* "host X GiB (Y B/param: master .., moments .., upload copy .., gradients .., tokens ..[, layer
 * checkpoints])" */
void mt_plan_print_host(const mt_plan *p, FILE *out);

#define MT_GIB 1073741824.0

#endif
