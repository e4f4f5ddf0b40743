#include "engine/planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/flops.h"
#include "model/layer.h"

int mt_plan_default_seq(const mt_config *cfg) {
    return cfg->max_position_embeddings < 1024 ? cfg->max_position_embeddings : 1024;
}

/* The engine's bytes for p->eo, and the totals on each side. */
static void measure(const mt_param_table *t, mt_dtype dtype, mt_plan *p) {
    mt_engine_plan_of(t, dtype, &p->eo, &p->mem);
    p->compute_bytes = p->mem.dev_total + (double)p->backend.scratch;
    p->host_bytes = p->mem.host_total + (p->backend.host_ram ? p->compute_bytes : 0);
}

/* The host holds the plan, with the backend's own host memory beside it. */
static int host_fits(const mt_plan *p) {
    return p->host_available <= 0 ||
           p->host_bytes + (double)p->backend.host_overhead <= p->host_available;
}

/* The attention backward's pool bytes per element of q for the run's rows: packed rows may run
 * another attention (cuda: cuDNN's variable-length graph) with a larger workspace, which a run on
 * a token stream never takes (counting it there would take memory from the saved internals). */
static double attention_pool(const mt_plan *p) {
    return p->documents ? p->backend.attention_pool_docs : p->backend.attention_pool;
}

/* What to keep free under the budget for the backend's pool: its headroom, or at long context
 * what the attention backward takes from the pool for one micro-batch (with the pool's keep), at
 * per_elem bytes per element of q. */
static double pool_headroom_at(const mt_plan *p, double per_elem) {
    double att = per_elem * (double)p->eo.micro_batch * p->eo.T * p->cfg.H * mt_config_max_head_dim(&p->cfg) +
                 (double)(256 << 20);
    double h = (double)p->backend.headroom;
    return per_elem > 0 && att > h ? att : h;
}

static double pool_headroom(const mt_plan *p) { return pool_headroom_at(p, attention_pool(p)); }

/* Fits with the headroom kept free: what the planner's own choices must meet. */
static int fits_roomy(const mt_plan *p) {
    if (p->backend.host_ram) return host_fits(p);
    return p->budget <= 0 || p->compute_bytes + pool_headroom(p) <= (double)p->budget;
}

/* Fits at all: what is refused when it does not. */
static int fits_budget(const mt_plan *p) {
    return p->backend.host_ram || p->budget <= 0 || p->compute_bytes <= (double)p->budget;
}

/* A plan the engine can run as it stands. */
static int fits(const mt_plan *p) { return host_fits(p) && fits_budget(p); }

static int layers_in(double bytes, double per_layer, int most) {
    if (bytes <= 0 || per_layer <= 0) return 0;
    double k = floor(bytes / per_layer);
    return k >= most ? most : (int)k;
}

/* --saved-layers auto: what the memory left under the budget holds of the two kinds of save (none
 * without a budget, on host RAM — where recompute costs less than the extra RAM traffic is worth
 * measuring — or with the checkpoints offloaded). A layer's whole internals (saved_layers) spare
 * its backward the recompute of its projections and its attention; its attention output alone
 * (saved_attention) spares the attention, O(T) times fewer bytes. The kind that spares more
 * FLOPs per byte goes first: the attention's at long context (7B at 128k: 8x the whole layer's
 * per byte), the whole layer's at 4k (1.2x); what is left goes to the other kind (upgrading
 * attention-saved layers to whole ones, or saving the attention of more layers). */
static void auto_saved_layers(mt_plan *p) {
    p->eo.saved_layers = p->eo.saved_attention = 0;
    if (p->eo.offload || p->budget <= 0 || p->backend.host_ram) return;
    double left = (double)p->budget - p->compute_bytes - pool_headroom(p);
    const mt_config *c = &p->cfg;
    double whole = p->mem.dev_saved_per_layer, att = p->mem.dev_saved_attention_per_layer;
    double tokens = (double)p->eo.batch * p->eo.T;
    int tiled = p->eo.mlp_chunk > 0 && p->eo.mlp_chunk < p->eo.micro_batch * p->eo.T;
    /* the recompute's FLOPs each save spares (a tiled layer remakes gate and up in any case) */
    double att_flops = mt_flops_layer_attention_forward(c, c->L - 1, tokens, p->eo.T);
    double proj_flops = mt_flops_layer_projections(c, c->L - 1, tokens, !tiled);
    if (att <= 0 || whole <= att || att_flops / att <= (att_flops + proj_flops) / whole) {
        int k = layers_in(left, whole, p->L);
        p->eo.saved_layers = k;
        p->eo.saved_attention = layers_in(left - k * whole, att, p->L - k);
    } else {
        int a = layers_in(left, att, p->L);
        int k = layers_in(left - a * att, whole - att, a);
        p->eo.saved_layers = k;
        p->eo.saved_attention = a - k;
    }
}

/* The fewest tier layers with which the host holds the plan as it stands (with p->joint, its
 * offloaded checkpoints included), measured; 0 when no number does. */
static int tier_for_host(const mt_param_table *t, mt_dtype dtype, mt_plan *p) {
    for (int k = 0; k <= p->L; k++) {
        p->eo.gpu_layers = k;
        measure(t, dtype, p);
        if (host_fits(p)) return 1;
    }
    return 0;
}

/* 0. --gpu-layers auto: the fewest tier layers with which the host holds the state (the current
 * grads_on_device); none when no number does (p->host_short: the host is what to fix). */
static void choose_tier(const mt_param_table *t, mt_dtype dtype, mt_plan *p) {
    p->host_short = 0;
    if (tier_for_host(t, dtype, p)) return;
    p->eo.gpu_layers = 0;
    p->host_short = 1;
}

/* 0, for speed (planner.h): the fewest tier layers beyond those the host RAM needs with which the
 * next forward does not wait for the host update, adding one at a time while the GPU holds the
 * plan of step 1 (p->tier_capped when it stops holding it first). */
static void speed_tier(const mt_param_table *t, mt_dtype dtype, mt_plan *p) {
    p->tier_host = p->eo.gpu_layers;
    if (!p->tier_auto || !p->timed || p->host_short) return;
    mt_step_time st;
    mt_step_time_of(t, dtype, &p->eo, &p->backend, p->host_rate, &st);
    p->tier_host_time = st;
    if (p->budget <= 0) return; /* no budget: no GPU memory spent on what is not asked for */
    while (mt_step_time_waits(&st) && p->eo.gpu_layers < p->L) {
        p->eo.gpu_layers++;
        measure(t, dtype, p);
        if (!fits_roomy(p) || !host_fits(p)) {
            p->eo.gpu_layers--;
            measure(t, dtype, p);
            p->tier_capped = 1;
            return;
        }
        mt_step_time_of(t, dtype, &p->eo, &p->backend, p->host_rate, &st);
    }
}

/* The checkpoints' place for the current micro-batch and tiling: all on the compute side (off 0);
 * else the fewest first layers in host memory with which the plan fits (all of them with
 * --offload-checkpoints). Returns 1 when it fits (eo.offload set), 0 with the last tried.
 * p->joint: "fits" is both sides, the tier (auto) re-chosen for each count, since an offloaded
 * checkpoint takes host RAM: a plan whose host is short at the fewest count that the GPU holds
 * goes on to more tier layers or, in choose_mlp_chunk, to a smaller chunk. */
static int place_checkpoints(const mt_param_table *t, mt_dtype dtype, const mt_plan_request *rq,
                             mt_plan *p, int off) {
    int L = p->L;
    for (int k = !off ? 0 : rq->offload == 1 ? L : 1; k <= (off ? L : 0); k++) {
        p->eo.offload = k;
        if (p->joint && p->tier_auto) {
            if (!tier_for_host(t, dtype, p)) continue;
        } else {
            measure(t, dtype, p);
        }
        if (fits_roomy(p) && (!p->joint || host_fits(p))) return 1;
    }
    return 0;
}

/* At the smallest micro-batch (long sequences): the largest MLP chunk, of the sizes below, with
 * which the plan fits; 0 (untiled, re-measured) when none does. */
static int choose_mlp_chunk(const mt_param_table *t, mt_dtype dtype, const mt_plan_request *rq,
                            mt_plan *p, int off) {
    static const int chunks[] = {32768, 16384, 8192, 4096, 2048, 1024};
    int N = p->eo.micro_batch * p->eo.T;
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        if (chunks[i] >= N) continue;
        p->eo.mlp_chunk = chunks[i];
        if (place_checkpoints(t, dtype, rq, p, off)) return 1;
    }
    p->eo.mlp_chunk = 0;
    place_checkpoints(t, dtype, rq, p, off);
    return 0;
}

/* Where step 1 keeps the checkpoints: every layer's input on the compute side, some in host
 * memory, or every second one on the compute side (sparse), in that order of preference. */
enum { PLACE_DEVICE, PLACE_HOST, PLACE_SPARSE, PLACES };

/* The places the request allows, in order of preference. */
static int allowed_places(const mt_plan_request *rq, const mt_plan *p, int *places) {
    int n = 0;
    if (rq->checkpoint_every != 2) {
        if (rq->offload != 1) places[n++] = PLACE_DEVICE;
        if (rq->offload == 1 || p->offload_auto) places[n++] = PLACE_HOST;
    }
    if (rq->checkpoint_every == 2 || (rq->checkpoint_every == MT_AUTO && p->offload_auto)) places[n++] = PLACE_SPARSE;
    return n;
}

/* 1. the largest micro-batch that fits with the checkpoints on the compute side, else with them
 * offloaded (the tier chosen for each: offloaded checkpoints take host RAM), else sparse; when
 * nothing fits, the smallest plan tried (of each place its last, the smallest of those:
 * mt_plan_check refuses it unless it fits without the headroom). Returns 1 when one fits. */
static int choose_places(const mt_param_table *t, mt_dtype dtype, const mt_plan_request *rq,
                         mt_plan *p) {
    int B = rq->batch, places[PLACES], n = allowed_places(rq, p, places);
    int found = 0;
    mt_plan *smallest = NULL; /* when no place fits with room: the place whose plan was smallest */
    for (int i = 0; i < n && !found; i++) {
        int off = places[i] == PLACE_HOST;
        p->eo.offload = off ? p->L : 0; /* the tier is chosen for the most host checkpoints */
        p->eo.checkpoint_every = places[i] == PLACE_SPARSE ? 2 : 1;
        p->eo.micro_batch = p->micro_auto ? B : rq->micro_batch; /* the host side does not depend on it */
        if (p->joint && p->tier_auto) p->eo.gpu_layers = 0; /* chosen per placement */
        else if (p->tier_auto && !p->host_short) choose_tier(t, dtype, p);
        else p->eo.gpu_layers = p->tier_auto ? 0 : rq->gpu_layers;
        for (int b = p->micro_auto ? B : rq->micro_batch; b >= 1; b--) {
            if (B % b) continue;
            p->eo.micro_batch = b;
            p->eo.mlp_chunk = 0;
            if (place_checkpoints(t, dtype, rq, p, off)) {
                found = 1;
                break;
            }
            if (b == 1 && choose_mlp_chunk(t, dtype, rq, p, off)) {
                found = 1;
                break;
            }
            if (!p->micro_auto) break;
        }
        if (!found && (!smallest || p->compute_bytes < smallest->compute_bytes)) {
            if (!smallest) smallest = mt_malloc(sizeof *smallest);
            *smallest = *p;
        }
    }
    if (!found && smallest) *p = *smallest;
    free(smallest);
    return found;
}

/* Which of two resolved plans is better: one that fits, then the host fitting, then every
 * layer's checkpoint kept, then without offloaded checkpoints, then the larger micro-batch. */
static int better(const mt_plan *a, int a_fits, const mt_plan *b, int b_fits) {
    if (a_fits != b_fits) return a_fits > b_fits;
    if (a->host_short != b->host_short) return a->host_short < b->host_short;
    if (a->eo.checkpoint_every != b->eo.checkpoint_every) return a->eo.checkpoint_every < b->eo.checkpoint_every;
    if (a->eo.offload != b->eo.offload) return a->eo.offload < b->eo.offload;
    return a->eo.micro_batch > b->eo.micro_batch;
}

/* Whether the request, resolved again with no suggestions of its own, fits both sides. */
static int request_fits(const mt_param_table *t, const mt_backend *be, const mt_plan_request *rq) {
    mt_plan_request r = *rq;
    r.no_suggest = 1;
    mt_plan q;
    return mt_plan_resolve(t, be, &r, &q) == MT_OK && mt_plan_check(&q) == MT_OK;
}

/* The smallest whole GiB of GPU budget (above the current one, up to 4 TiB) with which the request
 * fits; 0 when none does (a larger budget never makes a plan worse, so a bisection finds it). */
static int64_t smallest_gpu_mem(const mt_param_table *t, const mt_backend *be, const mt_plan_request *rq) {
    mt_backend q = *be;
    int64_t lo = be->mem_budget / ((int64_t)1 << 30), hi = 4096; /* lo does not fit, hi may */
    q.mem_budget = hi << 30;
    if (!request_fits(t, &q, rq)) return 0;
    while (hi - lo > 1) {
        int64_t mid = (lo + hi) / 2;
        q.mem_budget = mid << 30;
        if (request_fits(t, &q, rq)) hi = mid;
        else lo = mid;
    }
    return hi;
}

/* The largest --seq below the request's (a multiple of 1024 when it is longer than that) that fits;
 * 0 when none does. */
static int largest_seq(const mt_param_table *t, const mt_backend *be, const mt_plan_request *rq) {
    int step = rq->T > 1024 ? 1024 : 1, lo = 0, hi = (rq->T - 1) / step; /* multiples: lo fits, hi+1 not */
    mt_plan_request r = *rq;
    r.T = step;
    if (hi < 1 || !request_fits(t, be, &r)) return 0;
    lo = 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        r.T = mid * step;
        if (request_fits(t, be, &r)) lo = mid;
        else hi = mid - 1;
    }
    return lo * step;
}

/* The first lighter format whose plan fits both sides, for the message. */
static void suggest_state(const mt_param_table *t, const mt_backend *be, const mt_plan_request *rq,
                          mt_plan *p) {
    for (int f = rq->state + 1; f <= MT_STATE_TIGHT; f++) {
        mt_plan_request r = *rq;
        r.state = (mt_state_format)f;
        r.no_suggest = 1;
        mt_plan q;
        if (mt_plan_resolve(t, be, &r, &q) != MT_OK || mt_plan_check(&q) != MT_OK) continue;
        int n = snprintf(p->suggest, sizeof p->suggest, "--state %s", mt_state_format_name(r.state));
        if (q.eo.gpu_layers)
            snprintf(p->suggest + n, sizeof p->suggest - (size_t)n, " with %d layers on the GPU",
                     q.eo.gpu_layers);
        return;
    }
}

/* Steps 0 and 1 from a fresh plan: the tier, where gradients wait (compact and tight: on the GPU
 * unless the host holding them gives a better plan), the micro-batch and the checkpoints' place.
 * Returns 1 when the plan found fits. */
static int choose_all(const mt_param_table *t, const mt_backend *be, const mt_plan_request *rq,
                      mt_plan *p) {
    int eight_bit = rq->state != MT_STATE_FULL;
    p->eo.grads_on_device = eight_bit && !p->backend.host_ram;
    int found = choose_places(t, be->dtype, rq, p);
    /* --update-on gpu streams the update through gradients waiting on the GPU: keep them there
     * when that fits, whatever else the other place would gain */
    int keep = rq->update_on_device == 1 && found;
    if (p->eo.grads_on_device && !keep) {
        mt_plan q = *p;
        q.eo.grads_on_device = 0;
        q.host_short = 0;
        int q_found = choose_places(t, be->dtype, rq, &q);
        if (better(&q, q_found, p, found)) {
            *p = q;
            found = q_found;
        }
    }
    if (!found && p->tier_auto && p->eo.gpu_layers > 0) {
        /* the GPU cannot hold the layers the host cannot: the host is what is short; plan without
         * a tier so that the message names host RAM (and a --state that would fit) */
        p->host_short = 1;
        p->eo.grads_on_device = 0;
        found = choose_places(t, be->dtype, rq, p);
    }
    return found;
}

static int resolve(const mt_param_table *t, const mt_backend *be, const mt_plan_request *rq,
                   mt_plan *p) {
    const int B = rq->batch, L = t->cfg.L;
    memset(p, 0, sizeof *p);
    p->backend = be->memory;
    p->backend_name = be->name;
    p->dtype = be->dtype;
    p->cfg = t->cfg;
    p->budget = be->mem_budget;
    p->gpu_mem = rq->gpu_mem;
    p->host_available = rq->host_available;
    p->L = L;
    p->n_params = (double)t->n_real;
    p->documents = rq->documents != 0;
    if (B < 1) return mt_error_set("--batch: %d is not a batch size", B);
    if (rq->T < 1) return mt_error_set("--seq: %d is not a sequence length", rq->T);
    if (rq->micro_batch != MT_AUTO && (rq->micro_batch < 1 || B % rq->micro_batch))
        return mt_error_set("--micro-batch: %d does not divide --batch %d", rq->micro_batch, B);
    if (rq->saved_layers > L)
        return mt_error_set("--saved-layers %d: the model has %d layers", rq->saved_layers, L);
    if (rq->gpu_layers != MT_AUTO && (rq->gpu_layers < 0 || rq->gpu_layers > L))
        return mt_error_set("--gpu-layers %d: the model has %d layers", rq->gpu_layers, L);
    if (rq->saved_layers > 0 && rq->offload == 1)
        return mt_error_set("--saved-layers %d: --offload-checkpoints keeps no layer's internals on "
                            "the compute side; use 0 or auto", rq->saved_layers);
    if (rq->checkpoint_every != MT_AUTO && (rq->checkpoint_every < 0 || rq->checkpoint_every > 2))
        return mt_error_set("--checkpoint-every %d: 1 (every layer's input) or 2 (every second one)",
                            rq->checkpoint_every);
    if (rq->checkpoint_every == 2 && rq->offload == 1)
        return mt_error_set("--checkpoint-every 2 keeps the checkpoints on the compute side; "
                            "--offload-checkpoints moves them to host memory: use one of the two");
    p->micro_auto = rq->micro_batch == MT_AUTO;
    p->offload_auto = rq->offload == MT_AUTO && !p->backend.host_ram;
    p->tier_auto = rq->gpu_layers == MT_AUTO;
    p->host_short = 0;
    p->eo = (mt_engine_opts){.batch = B, .T = rq->T, .n_slots = rq->n_slots,
                             .saved_layers = rq->saved_layers > 0 ? rq->saved_layers : 0,
                             .resident = rq->resident == 1, .state = rq->state, .ranks = rq->ranks,
                             .lora = rq->lora, .update_on_device = rq->update_on_device};
    if (rq->lora && rq->base_format != MT_BASE_BF16) {
        p->eo.base_format = rq->base_format;
        p->eo.base_on_device = rq->resident == 1;
        p->eo.resident = 0;
    }
    /* LoRA: the step-time model counts a host update the frozen base does not have (not yet
     * modelled for adapters: no estimate, and the tier is not chosen by time) */
    p->timed = mt_step_time_known(&p->backend) && !rq->lora;
    if (p->timed && rq->host_adamw > 0) {
        p->host_rate = rq->host_adamw;
        snprintf(p->host_rate_source, sizeof p->host_rate_source, "as asked");
    } else if (p->timed) {
        MT_TRY(mt_step_time_host_rate(rq->state, &p->host_rate, p->host_rate_source,
                                      sizeof p->host_rate_source));
    }

    /* 0 and 1: the tier, where gradients wait, the micro-batch and the checkpoints' place; fitting
     * both sides at once first, else (nothing does) the GPU alone, so that the plan printed is
     * the one the GPU holds and the message is about the host */
    mt_plan start = *p;
    p->joint = 1;
    int found = choose_all(t, be, rq, p);
    if (!found) {
        *p = start;
        found = choose_all(t, be, rq, p);
    }
    p->joint = 0;
    p->tier_host = p->eo.gpu_layers;
    if (found) speed_tier(t, be->dtype, p); /* before the saved internals take what is left */
    if (p->eo.offload && rq->saved_layers > 0)
        return mt_error_set("--saved-layers %d: the budget is short, so the layer checkpoints go to "
                            "host memory and no layer can keep its internals; use 0 or auto, a "
                            "smaller --micro-batch, or raise --gpu-mem", rq->saved_layers);

    /* 2. saved internals from what is left */
    if (rq->saved_layers == MT_AUTO) {
        auto_saved_layers(p);
        measure(t, be->dtype, p);
    }
    if (!rq->no_suggest && !rq->lora && !fits(p)) {
        /* what would fit instead, each with one thing changed (mt_plan_check names them) */
        suggest_state(t, be, rq, p);
        if (!p->backend.host_ram && p->budget > 0) p->fit_gpu_mem = smallest_gpu_mem(t, be, rq);
        p->fit_seq = largest_seq(t, be, rq);
    }
    /* 3. resident weights: they only save PCIe traffic, so they come after the saved internals */
    if (rq->resident == MT_AUTO && p->eo.base_format == MT_BASE_BF16 && !p->eo.offload &&
        p->eo.saved_layers == L && p->budget > 0 &&
        !p->backend.host_ram) {
        p->eo.resident = 1;
        measure(t, be->dtype, p);
        if (!fits_roomy(p)) {
            p->eo.resident = 0;
            measure(t, be->dtype, p);
        }
    }
    /* 3b. a quantized base kept on the GPU (auto): it only spares the PCIe stream of the frozen
     * layers, so it too comes after the saved internals, where it still fits with room */
    if (rq->resident == MT_AUTO && p->eo.base_format != MT_BASE_BF16 && !p->eo.offload && p->budget > 0 &&
        !p->backend.host_ram) {
        p->eo.base_on_device = 1;
        measure(t, be->dtype, p);
        if (!fits_roomy(p)) {
            p->eo.base_on_device = 0;
            measure(t, be->dtype, p);
        }
    }
    if (p->timed) {
        for (int l = 0; l < L && !p->expert_share; l++)
            if (mt_config_layer_is_moe(&t->cfg, l))
                p->expert_share = (double)t->cfg.n_experts * 3.0 * t->cfg.C * t->cfg.moe_F /
                                  (double)mt_group_size(t, l);
        mt_step_time_of(t, be->dtype, &p->eo, &p->backend, p->host_rate, &p->time);
        p->compute_batch = mt_step_time_compute_batch(t, be->dtype, &p->eo, &p->backend, p->host_rate);
    }
    return MT_OK;
}

int mt_plan_resolve(const mt_param_table *t, const mt_backend *be, const mt_plan_request *rq,
                    mt_plan *p) {
    if (rq->update_on_device != MT_AUTO) return resolve(t, be, rq, p);
    /* auto: the host update, unless the streamed one applies, fits and is estimated faster by
     * more than the model's noise (a plan of its own: its staging slots change the tier) */
    mt_plan_request h = *rq, g = *rq;
    h.update_on_device = 0;
    g.update_on_device = 1;
    MT_TRY(resolve(t, be, &h, p));
    mt_engine_opts eo = p->eo;
    eo.update_on_device = 1;
    eo.grads_on_device = 1;
    if (!p->timed || !mt_engine_streams_update(&eo)) return MT_OK;
    mt_plan *q = mt_calloc(1, sizeof *q);
    int rc = resolve(t, be, &g, q);
    double host_s = mt_step_time_total(&p->time);
    int take = rc == MT_OK && fits(q) && mt_engine_streams_update(&q->eo) &&
               mt_step_time_total(&q->time) < 0.95 * host_s;
    if (take) {
        *p = *q;
        p->update_other_s = host_s;
    } else {
        p->update_other_s = rc == MT_OK && fits(q) ? mt_step_time_total(&q->time) : 0;
    }
    p->update_auto = 1;
    free(q);
    mt_error_clear();
    return MT_OK;
}

static const char *budget_source(const mt_plan *p) {
    return p->gpu_mem > 0 ? "--gpu-mem" : "the GPU's free memory";
}

static const char *more_memory(const mt_plan *p) {
    return p->gpu_mem > 0 ? "raise --gpu-mem" : "free GPU memory";
}

/* "; what would fit: ..." from the suggestions the plan found (""); skip_state: the message
 * names the --state already. */
static void what_fits(const mt_plan *p, int skip_state, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = '\0';
    const char *sep = "; what would fit: ";
    if (p->suggest[0] && !skip_state) {
        len += (size_t)snprintf(buf + len, n - len, "%s%s", sep, p->suggest);
        sep = ", or ";
    }
    if (p->fit_gpu_mem && len < n) {
        len += (size_t)snprintf(buf + len, n - len, "%s%lld GiB of GPU memory (--gpu-mem %lldG)", sep,
                                (long long)p->fit_gpu_mem, (long long)p->fit_gpu_mem);
        sep = ", or ";
    }
    if (p->fit_seq && len < n)
        snprintf(buf + len, n - len, "%s--seq %d (the longest%s that fits as asked otherwise)", sep,
                 p->fit_seq, p->eo.T > 1024 ? " multiple of 1024" : "");
}

static int check_host(const mt_plan *p) {
    if (host_fits(p)) return MT_OK;
    const char *fmt = p->eo.state == MT_STATE_FULL ? "compact" : p->eo.state == MT_STATE_COMPACT ? "tight" : NULL;
    char hint[160] = "", fits[320];
    if (p->suggest[0]) snprintf(hint, sizeof hint, "; %s would fit", p->suggest);
    else if (fmt) snprintf(hint, sizeof hint, "; --state %s takes fewer bytes per parameter", fmt);
    what_fits(p, 1, fits, sizeof fits);
    return mt_error_set("host RAM: training needs %.2f GiB (+ %.2f for the %s runtime), %.2f GiB are "
                        "available (--state %s, %.2f B/param)%s; or use a smaller model, --batch or "
                        "--seq%s, more GPU layers, or a machine with more RAM%s",
                        p->host_bytes / MT_GIB, (double)p->backend.host_overhead / MT_GIB,
                        p->backend_name, p->host_available / MT_GIB,
                        mt_state_format_name(p->eo.state), p->mem.host_total / p->n_params, hint,
                        p->backend.host_ram && p->eo.micro_batch > 1 ? ", a smaller --micro-batch" : "", fits);
}

int mt_plan_check(const mt_plan *p) {
    const double g = MT_GIB;
    const int b = p->eo.micro_batch;
    if (fits_budget(p) || p->host_short) return check_host(p);
    char fits[320];
    what_fits(p, 0, fits, sizeof fits);
    if (p->eo.checkpoint_every == 2)
        return mt_error_set("GPU memory: the plan needs %.2f GiB at --micro-batch %d even with sparse "
                            "checkpoints (--checkpoint-every 2), the budget is %.2f GiB (%s); lower "
                            "--batch or --seq, or %s%s",
                            p->compute_bytes / g, b, (double)p->budget / g, budget_source(p),
                            more_memory(p), fits);
    if (!p->eo.offload)
        return mt_error_set("GPU memory: the plan needs %.2f GiB at --micro-batch %d, the budget is "
                            "%.2f GiB (%s); use a smaller --micro-batch (or auto), "
                            "--offload-checkpoints, lower --batch or --seq, or %s%s",
                            p->compute_bytes / g, b, (double)p->budget / g, budget_source(p),
                            more_memory(p), fits);
    if (p->micro_auto || b == 1)
        return mt_error_set("GPU memory: the plan needs %.2f GiB even at --micro-batch 1 with the "
                            "checkpoints in host memory, the budget is %.2f GiB (%s); lower --batch "
                            "or --seq, or %s%s",
                            p->compute_bytes / g, (double)p->budget / g, budget_source(p),
                            more_memory(p), fits);
    return mt_error_set("GPU memory: the plan needs %.2f GiB at --micro-batch %d with the checkpoints "
                        "in host memory, the budget is %.2f GiB (%s); use a smaller --micro-batch "
                        "(or auto), lower --batch or --seq, or %s%s",
                        p->compute_bytes / g, b, (double)p->budget / g, budget_source(p),
                        more_memory(p), fits);
}

void mt_plan_print_host(const mt_plan *p, FILE *out) {
    const double g = MT_GIB;
    const mt_engine_plan *m = &p->mem;
    /* the rest: the host's token arrays, and the layer checkpoints when offloaded */
    double rest = m->host_total - m->host_master - m->host_moments - m->host_upload - m->host_grads -
                  (p->eo.base_on_device ? 0 : m->base_quant);
    if (p->eo.lora) /* a frozen base: its weights alone */
        fprintf(out, "host %.2f GiB (%.2f B/param: frozen base weights %.2f%s", p->host_bytes / g,
                m->host_total / p->n_params, (m->host_master + (p->eo.base_on_device ? 0 : m->base_quant)) / g,
                p->eo.base_format != MT_BASE_BF16 && !p->eo.base_on_device ? " (the layers quantized)" : "");
    else
        fprintf(out, "host %.2f GiB (%.2f B/param: master %.2f, moments %.2f", p->host_bytes / g,
                m->host_total / p->n_params, m->host_master / g, m->host_moments / g);
    if (m->host_upload > 0) fprintf(out, ", upload copy %.2f", m->host_upload / g);
    if (m->host_grads > 0) fprintf(out, ", gradients %.2f", m->host_grads / g);
    if (p->eo.offload) fprintf(out, ", layer checkpoints %.2f", rest / g);
    else if (rest >= 0.005 * g) fprintf(out, ", tokens %.2f", rest / g);
    fprintf(out, ")%s", p->backend.host_ram ? " + compute" : "");
}

/* "tiles: ..." the layer's token chunks and the LM head's row chunks. */
static void print_tiles(const mt_plan *p, FILE *out) {
    const mt_engine_opts *eo = &p->eo;
    int bN = eo->micro_batch * eo->T;
    if (eo->mlp_chunk)
        fprintf(out, "tiles:       layer in chunks of %d of its %d tokens (working %.2f GiB; untiled %.2f)",
                eo->mlp_chunk, bN, p->mem.dev_work / MT_GIB,
                (p->mem.dev_work + (double)mt_layer_ws_bytes(&p->cfg, p->dtype, bN) -
                 (double)mt_layer_ws_bytes_tiled(&p->cfg, p->dtype, bN, eo->mlp_chunk)) / MT_GIB);
    else
        fprintf(out, "tiles:       layer untiled (%d tokens a call: the micro-batch)", bN);
    if (p->backend.head_chunk_rows)
        fprintf(out, "; LM head + loss in chunks of %d rows", p->backend.head_chunk_rows(bN, p->cfg.V));
    fputc('\n', out);
}

/* "checkpoints: ..." where each layer's input waits for the backward. */
static void print_checkpoints(const mt_plan *p, FILE *out) {
    const mt_engine_opts *eo = &p->eo;
    const int L = p->L, k = eo->offload;
    double set = (double)eo->batch * eo->T * p->cfg.C * (double)mt_dtype_size(p->dtype);
    const char *dev = p->backend.host_ram ? "the compute side" : "the GPU";
    fprintf(out, "checkpoints: %.2f GiB a layer (its input, %d x %d tokens); ", set / MT_GIB, eo->batch, eo->T);
    if (eo->checkpoint_every == 2) {
        int kept = (L + 1) / 2;
        fprintf(out, "every second layer's (%d of %d) on %s, the others remade in the backward (the "
                "forward of the layer before each, again: %d layers); %s holds %.0f sets, %.2f GiB (its %d, "
                "1 shared by the remade inputs, the last output, the gradient)\n", kept, L, dev, L / 2, dev,
                p->mem.dev_checkpoints / set, p->mem.dev_checkpoints / MT_GIB, kept);
        return;
    }
    char host[32], dev_layers[32];
    if (k == 1) snprintf(host, sizeof host, "layer 0");
    else snprintf(host, sizeof host, "layers 0-%d", k - 1);
    if (k == L - 1) snprintf(dev_layers, sizeof dev_layers, "layer %d", k);
    else snprintf(dev_layers, sizeof dev_layers, "layers %d-%d", k, L - 1);
    if (!k) fprintf(out, "all %d on %s", L, dev);
    else if (k < L)
        fprintf(out, "%s in pinned host memory (%.2f GiB), %s on %s", host, k * set / MT_GIB, dev_layers, dev);
    else fprintf(out, "all %d in pinned host memory (%.2f GiB)", L, L * set / MT_GIB);
    fprintf(out, "; %s holds %.0f sets, %.2f GiB (", dev, p->mem.dev_checkpoints / set,
            p->mem.dev_checkpoints / MT_GIB);
    if (k < L) fprintf(out, "its %d, the last output, ", L - k);
    fprintf(out, "the gradient%s)\n", k ? " and 2 that the offloaded pass through" : "");
}

/* "gpu tier: ..." why --gpu-layers auto has the size it has (timed plans). */
/* What the update of the host groups is called: where it runs (--update-on). */
static const char *update_name(const mt_step_time *s) {
    return s->streamed ? "streamed update" : "host update";
}

static void print_tier_reason(const mt_plan *p, FILE *out) {
    if (!p->tier_auto || p->host_short) return;
    const mt_step_time *now = &p->time, *few = &p->tier_host_time;
    const char *un = update_name(now);
    int k = p->eo.gpu_layers, h = p->tier_host;
    fprintf(out, "gpu tier:    ");
    if (p->budget <= 0) {
        if (k) fprintf(out, "%d layers, what the host needs", k);
        else fprintf(out, "none");
        fprintf(out, " (no GPU budget to fit: --gpu-mem); with %s the %s (%.2f s) %s the next "
                "forward (%.2f s)", k ? "them" : "none", un, few->host_s,
                mt_step_time_waits(few) ? "holds back" : "keeps ahead of", few->forward_s);
        if (mt_step_time_waits(few)) fprintf(out, " by %.2f s", few->wait_s);
        fputc('\n', out);
        return;
    }
    if (k == h && !mt_step_time_waits(few)) {
        if (k) fprintf(out, "%d layers (%.2f GiB), the fewest that let the host hold the rest; ", k, p->mem.dev_tier / MT_GIB);
        else fprintf(out, "none: ");
        fprintf(out, "the %s (%.2f s) keeps ahead of the next forward (%.2f s)\n", un, now->host_s, now->forward_s);
        return;
    }
    /* what the fewest layers (those the host RAM needs) would leave */
    if (k) fprintf(out, "%d layers (%.2f GiB): ", k, p->mem.dev_tier / MT_GIB);
    else fprintf(out, "none: ");
    if (k != h && h) fprintf(out, "with %d (what the host RAM needs) ", h);
    else if (k != h) fprintf(out, "with none ");
    else if (h) fprintf(out, "what the host RAM needs; with them ");
    fprintf(out, "the %s (%.2f s) %s the next forward (%.2f s) back %.2f s; ", un, few->host_s,
            k == h ? "holds" : "would hold", few->forward_s, few->wait_s);
    if (k == h)
        fprintf(out, "%s beside the plan\n", h ? "no more tier layers fit" : "no tier layer fits");
    else if (!mt_step_time_waits(now))
        fprintf(out, "with %d the host starts %d layers ahead: the forward waits %.2f s (under %.0f%% of "
                "it)\n", k, k, now->wait_s, 100 * MT_STEP_WAIT_SHARE);
    else if (p->tier_capped)
        fprintf(out, "%d are the most the GPU memory holds beside the plan: the forward still waits %.2f s\n",
                k, now->wait_s);
    else
        fprintf(out, "even with every layer the forward still waits %.2f s (the embedding's and the head's "
                "updates)\n", now->wait_s);
}

/* "step time: ..." the estimate per piece, what bounds the step, one layer's numbers. */
static void print_step_time(const mt_plan *p, FILE *out) {
    const mt_step_time *s = &p->time;
    const mt_config *c = &p->cfg;
    char moe[512] = "";
    if (c->n_experts)
        snprintf(moe, sizeof moe, ", active experts only; + %.2f s for the MoE layers' GEMM calls and routing",
                 s->moe_s);
    if (s->delta_s > 0) /* the delta rule's kernel runs far below the GEMMs' rate */
        snprintf(moe + strlen(moe), sizeof moe - strlen(moe), "; + %.2f s for the Gated DeltaNet's chunked "
                 "rule at %.0f TFLOP/s", s->delta_s, p->backend.delta_rule_rate / 1e12);
    if (s->remake_s > 0)
        snprintf(moe + strlen(moe), sizeof moe - strlen(moe), "; of which %.2f s remakes the inputs that "
                 "sparse checkpoints do not keep", s->remake_s);
    if (s->span_s > 0)
        snprintf(moe + strlen(moe), sizeof moe - strlen(moe), "; + %.2f s remaking the tiled Gated "
                 "DeltaNet layers' spans in the backward", s->span_s);
    char upd[256];
    if (s->streamed)
        snprintf(upd, sizeof upd, "the update on the GPU %.2f s (--update-on gpu: %.2f Gparam, their "
                 "state streamed, %.2f B/param each way at %.1f GB/s, the uplink shared with the next "
                 "forward's weights)", s->host_s, s->host_params / 1e9, s->state_bytes,
                 p->backend.duplex_rate / 1e9);
    else
        snprintf(upd, sizeof upd, "host AdamW %.2f s (%.2f Gparam at %.1f Gparam/s: %s)", s->host_s,
                 s->host_params / 1e9, p->host_rate / 1e9, p->host_rate_source);
    fprintf(out, "step time:   ~%.2f s: compute %.2f s (%.3g PFLOP at %.0f TFLOP/s%s), PCIe %.2f s (up %.2f "
            "GiB, down %.2f GiB), %s\n",
            mt_step_time_total(s), s->compute_s, s->flops / 1e15, p->backend.flops_rate / 1e12,
            moe, s->pcie_s, s->h2d_bytes / MT_GIB, s->d2h_bytes / MT_GIB, upd);
    if (p->update_auto) {
        fprintf(out, "             --update-on auto: %s", s->streamed ? "gpu" : "host");
        if (p->update_other_s > 0)
            fprintf(out, " (~%.2f s a step with the %s update)\n", p->update_other_s,
                    s->streamed ? "host" : "streamed");
        else
            fprintf(out, " (the streamed update's plan does not fit)\n");
    }
    if (s->bound == MT_BOUND_HOST)
        fprintf(out, "             bound: the %s, which only the next forward (%.2f s) overlaps: that "
                "forward starts %.2f s after the backward and waits %.2f s more; ", update_name(s), s->forward_s,
                s->start_s, s->wait_s);
    else
        fprintf(out, "             bound: %s; the %s overlaps the next forward (%.2f s), which starts "
                "%.2f s after the backward and waits %.2f s more; ",
                s->bound == MT_BOUND_PCIE ? "PCIe (the copies overlap the whole step)" : "compute", update_name(s),
                s->forward_s, s->start_s, s->wait_s);
    if (p->compute_batch)
        fprintf(out, "compute-bound from --batch %d at --seq %d (memory aside)\n", p->compute_batch, p->eo.T);
    else
        fprintf(out, "compute-bound at no --batch up to 2^20 at --seq %d\n", p->eo.T);
    fprintf(out, "per layer:   %.2f GiB of weights up %s a step, forward %.0f ms, %s %.0f ms",
            s->layer_bytes / MT_GIB, p->eo.resident ? "once" : "twice", s->layer_forward_s * 1e3, update_name(s),
            s->layer_host_s * 1e3);
    if (p->expert_share > 0)
        fprintf(out, "; an MoE layer's experts are %.0f%% of its bytes, a token computes with %d of %d",
                100.0 * p->expert_share, c->top_k, c->n_experts);
    fputc('\n', out);
    if (s->mixer_layers[MT_MIXER_GATED_DELTANET] > 0) { /* a hybrid: each kind of layer on its own */
        fprintf(out, "layer types:");
        for (int mx = 0; mx < 2; mx++)
            if (s->mixer_layers[mx] > 0)
                fprintf(out, "%s %d %s layers of %.0fM parameters, forward %.1f ms each", mx ? ";" : "",
                        s->mixer_layers[mx], mt_mixer_name((mt_mixer)mx), s->mixer_params[mx] / 1e6,
                        s->mixer_forward_s[mx] * 1e3);
        fputc('\n', out);
    }
}

/* The plan's state line: the optimizer format and the GPU tier, or LoRA's adapters and base. */
static void print_state(const mt_plan *p, FILE *out) {
    const double g = MT_GIB;
    const mt_engine_plan *m = &p->mem;
    const mt_engine_opts *eo = &p->eo;
    if (eo->lora) {
        const mt_lora_table *lt = eo->lora;
        char names[sizeof lt->targets + sizeof lt->parameters];
        fprintf(out, "\nLoRA: rank %d, alpha %g (scale %g) on %d modules (%s): %.4gM adapter "
                     "parameters, their state %.1f MiB on the %s (fp32 master, moments, gradient); "
                     "the base frozen: its weights alone, %d B/param, no gradient",
                lt->rank, lt->alpha, (double)lt->scale, lt->n_modules,
                mt_lora_targets_text(lt, names, sizeof names), (double)lt->n_real / 1e6, mt_lora_state_bytes(lt, p->dtype) / 1048576.0,
                p->backend.host_ram ? "compute side (host RAM)" : "GPU", (int)mt_dtype_size(p->dtype));
        if (eo->gpu_layers)
            fprintf(out, "; layers 0-%d of %d resident on the GPU (%.2f GiB)", eo->gpu_layers - 1,
                    p->L, m->dev_tier / g);
        if (eo->base_format != MT_BASE_BF16)
            fprintf(out, "; layers %d-%d quantized %s (%.2f GiB) %s, dequantized on the compute "
                    "side per load", eo->gpu_layers, p->L - 1, mt_base_format_name(eo->base_format),
                    m->base_quant / g, eo->base_on_device ? "kept there" : "in pinned host memory, streamed");
        return;
    }
    fprintf(out, "\noptimizer state: %s, %.2f B/param", mt_state_format_name(eo->state),
            eo->state == MT_STATE_FULL ? 12.0 + (double)mt_dtype_size(p->dtype)
                                       : mt_optim_bytes_per_param(eo->state));
    if (eo->state == MT_STATE_COMPACT)
        fprintf(out, " (bf16 master 2 + compensation 2 + 8-bit moments 2 + block scales 0.03)");
    else if (eo->state == MT_STATE_TIGHT)
        fprintf(out, " (bf16 master 2 + 8-bit moments 2 + block scales 0.03)");
    else
        fprintf(out, " (fp32 master 4 + fp32 moments 8 + upload copy %d)", (int)mt_dtype_size(p->dtype));
    if (eo->gpu_layers)
        fprintf(out, "; GPU tier: layers 0-%d of %d (%.2f GiB on the GPU, updated there%s)",
                eo->gpu_layers - 1, p->L, m->dev_tier / g,
                !p->tier_auto ? "" : p->timed && !p->host_short ? "; auto: below" : "; auto: the fewest that let the host hold the rest");
    if (eo->state != MT_STATE_FULL)
        fprintf(out, "; gradients wait %s", eo->grads_on_device ? "on the GPU" : "in host memory");
}

void mt_plan_print(const mt_plan *p, FILE *out) {
    const double g = MT_GIB;
    const mt_engine_plan *m = &p->mem;
    const mt_engine_opts *eo = &p->eo;
    fprintf(out, "micro-batch %d of --batch %d", eo->micro_batch, eo->batch);
    if (p->micro_auto)
        fprintf(out, " (auto: %s)",
                p->backend.host_ram ? (p->host_available > 0 ? "the largest that host RAM holds"
                                                               : "the whole batch")
                : p->budget <= 0 ? "the whole batch; no GPU budget to fit"
                : eo->offload ? "no micro-batch fits with the checkpoints on the GPU; the largest "
                                "that fits with some of them in host memory"
                : eo->checkpoint_every == 2 ? "no micro-batch fits with every layer's checkpoint, on "
                                              "the GPU or in host memory; the largest that fits with "
                                              "every second one"
                              : "the largest that fits the budget with the checkpoints on the GPU");
    print_state(p, out);
    fprintf(out, "\nmemory plan: ");
    mt_plan_print_host(p, out);
    fprintf(out, "\n             %s %.2f GiB", p->backend.host_ram ? "compute (in host RAM)" : "GPU",
            p->compute_bytes / g);
    if (!p->backend.host_ram && p->budget > 0)
        fprintf(out, " of %.2f GiB (%s)", (double)p->budget / g, budget_source(p));
    char off[96] = "";
    if (eo->offload)
        snprintf(off, sizeof off, " with the checkpoints of layers 0-%d of %d in host memory",
                 eo->offload - 1, p->L);
    fprintf(out, " (weight slots %.2f, embed/head %.2f, gradients %.2f, activations %.2f%s, working %.2f, "
            "library scratch %.2f)\n",
            m->dev_slots / g, m->dev_embed_head / g, m->dev_grads / g, m->dev_checkpoints / g, off,
            m->dev_work / g, (double)p->backend.scratch / g);
    if (eo->saved_layers)
        fprintf(out, "             of which saved internals %.2f GiB: the backward of the last %d of %d layers "
                "skips the recompute\n", eo->saved_layers * m->dev_saved_per_layer / g, eo->saved_layers, p->L);
    if (eo->saved_attention) {
        int last = p->L - eo->saved_layers - 1;
        char which[48];
        if (eo->saved_attention == 1) snprintf(which, sizeof which, "layer %d", last);
        else snprintf(which, sizeof which, "layers %d-%d", last - eo->saved_attention + 1, last);
        fprintf(out, "             of which saved attention %.2f GiB: the backward of %s remakes "
                "all but the attention\n", eo->saved_attention * m->dev_saved_attention_per_layer / g,
                which);
    }
    if (eo->resident)
        fprintf(out, "             resident weights: every layer keeps its slot, loaded once per step\n");
    if (!p->backend.host_ram && p->budget > 0 && p->backend.headroom > 0) {
        /* which rows the pool is counted for, where the backend's two numbers differ, and what
         * the other rows would keep when that is another size */
        char rows[96] = "";
        if (p->backend.attention_pool_docs != p->backend.attention_pool) {
            const char *mine = p->documents ? "packed rows" : "a token stream";
            const char *theirs = p->documents ? "a token stream" : "packed rows";
            double other = pool_headroom_at(p, p->documents ? p->backend.attention_pool
                                                            : p->backend.attention_pool_docs);
            if (other != pool_headroom(p))
                snprintf(rows, sizeof rows, " (%s; %s: %.2f)", mine, theirs, other / g);
            else
                snprintf(rows, sizeof rows, " (%s)", mine);
        }
        if (fits_roomy(p))
            fprintf(out, "             %.2f GiB of the budget kept free for the backend's pool%s\n",
                    pool_headroom(p) / g, rows);
        else if (fits_budget(p))
            fprintf(out, "             only %.2f GiB of the budget left for the backend's pool (it "
                    "asks for %.2f)%s\n", ((double)p->budget - p->compute_bytes) / g,
                    pool_headroom(p) / g, rows);
    }
    print_tiles(p, out);
    print_checkpoints(p, out);
    if (p->timed) {
        print_tier_reason(p, out);
        print_step_time(p, out);
    }
}
