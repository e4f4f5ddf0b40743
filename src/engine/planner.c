#include "engine/planner.h"

#include <math.h>
#include <string.h>

#include "core/error.h"

int mt_plan_default_seq(const mt_config *cfg) {
    return cfg->max_position_embeddings < 1024 ? cfg->max_position_embeddings : 1024;
}

/* The engine's bytes for p->eo, and the totals on each side. */
static void measure(const mt_param_table *t, mt_dtype dtype, mt_plan *p) {
    mt_engine_plan_of(t, dtype, &p->eo, &p->mem);
    p->compute_bytes = p->mem.dev_total + (double)p->backend.scratch;
    p->host_bytes = p->mem.host_total + (p->backend.host_ram ? p->compute_bytes : 0);
}

/* Fits with the headroom kept free: what the planner's own choices must meet. */
static int fits_roomy(const mt_plan *p) {
    if (p->backend.host_ram) return p->host_available <= 0 || p->host_bytes <= p->host_available;
    return p->budget <= 0 || p->compute_bytes + (double)p->backend.headroom <= (double)p->budget;
}

/* Fits at all: what is refused when it does not. */
static int fits_budget(const mt_plan *p) {
    return p->backend.host_ram || p->budget <= 0 || p->compute_bytes <= (double)p->budget;
}

/* --saved-layers auto: as many layers as the memory left under the budget holds (none without a
 * budget, on host RAM — where recompute costs less than the extra RAM traffic is worth measuring
 * — or with the checkpoints offloaded). */
static int auto_saved_layers(const mt_plan *p) {
    if (p->eo.offload || p->budget <= 0 || p->backend.host_ram) return 0;
    double left = (double)p->budget - p->compute_bytes - (double)p->backend.headroom;
    if (left <= 0 || p->mem.dev_saved_per_layer <= 0) return 0;
    double k = floor(left / p->mem.dev_saved_per_layer);
    return k >= p->L ? p->L : (int)k;
}

int mt_plan_resolve(const mt_param_table *t, const mt_backend *be, const mt_plan_request *rq,
                    mt_plan *p) {
    const int B = rq->batch, L = t->cfg.L;
    memset(p, 0, sizeof *p);
    p->backend = be->memory;
    p->backend_name = be->name;
    p->budget = be->mem_budget;
    p->gpu_mem = rq->gpu_mem;
    p->host_available = rq->host_available;
    p->L = L;
    p->n_params = (double)t->n_real;
    if (B < 1) return mt_error_set("--batch: %d is not a batch size", B);
    if (rq->T < 1) return mt_error_set("--seq: %d is not a sequence length", rq->T);
    if (rq->micro_batch != MT_AUTO && (rq->micro_batch < 1 || B % rq->micro_batch))
        return mt_error_set("--micro-batch: %d does not divide --batch %d", rq->micro_batch, B);
    if (rq->saved_layers > L)
        return mt_error_set("--saved-layers %d: the model has %d layers", rq->saved_layers, L);
    if (rq->saved_layers > 0 && rq->offload == 1)
        return mt_error_set("--saved-layers %d: --offload-checkpoints keeps no layer's internals on "
                            "the compute side; use 0 or auto", rq->saved_layers);
    p->micro_auto = rq->micro_batch == MT_AUTO;
    p->offload_auto = rq->offload == MT_AUTO && !p->backend.host_ram;
    p->eo = (mt_engine_opts){.batch = B, .T = rq->T, .n_slots = rq->n_slots,
                             .saved_layers = rq->saved_layers > 0 ? rq->saved_layers : 0,
                             .resident = rq->resident == 1};

    /* 1. the largest micro-batch that fits with the checkpoints on the compute side, else with
     * them offloaded; when nothing fits, the smallest plan tried (mt_plan_check refuses it
     * unless it fits without the headroom) */
    int found = 0, off_first = rq->offload == 1, off_last = rq->offload == 1 || p->offload_auto;
    for (int off = off_first; off <= off_last && !found; off++) {
        p->eo.offload = off;
        for (int b = p->micro_auto ? B : rq->micro_batch; b >= 1; b--) {
            if (B % b) continue;
            p->eo.micro_batch = b;
            measure(t, be->dtype, p);
            if (fits_roomy(p)) {
                found = 1;
                break;
            }
            if (!p->micro_auto) break;
        }
    }
    if (p->eo.offload && rq->saved_layers > 0)
        return mt_error_set("--saved-layers %d: the budget is short, so the layer checkpoints go to "
                            "host memory and no layer can keep its internals; use 0 or auto, a "
                            "smaller --micro-batch, or raise --gpu-mem", rq->saved_layers);

    /* 2. saved internals from what is left */
    if (rq->saved_layers == MT_AUTO) {
        p->eo.saved_layers = auto_saved_layers(p);
        measure(t, be->dtype, p);
    }
    /* 3. resident weights: they only save PCIe traffic, so they come after the saved internals */
    if (rq->resident == MT_AUTO && !p->eo.offload && p->eo.saved_layers == L && p->budget > 0 &&
        !p->backend.host_ram) {
        p->eo.resident = 1;
        measure(t, be->dtype, p);
        if (!fits_roomy(p)) {
            p->eo.resident = 0;
            measure(t, be->dtype, p);
        }
    }
    return MT_OK;
}

static const char *budget_source(const mt_plan *p) {
    return p->gpu_mem > 0 ? "--gpu-mem" : "the GPU's free memory";
}

static const char *more_memory(const mt_plan *p) {
    return p->gpu_mem > 0 ? "raise --gpu-mem" : "free GPU memory";
}

static int check_host(const mt_plan *p) {
    if (p->host_available <= 0 || p->host_bytes <= p->host_available) return MT_OK;
    return mt_error_set("host RAM: training needs %.2f GiB, %.2f GiB are available; use a smaller "
                        "model, --batch or --seq%s, or a machine with more RAM",
                        p->host_bytes / MT_GIB, p->host_available / MT_GIB,
                        p->backend.host_ram && p->eo.micro_batch > 1 ? ", a smaller --micro-batch" : "");
}

int mt_plan_check(const mt_plan *p) {
    const double g = MT_GIB;
    const int b = p->eo.micro_batch;
    if (fits_budget(p)) return check_host(p);
    if (!p->eo.offload)
        return mt_error_set("GPU memory: the plan needs %.2f GiB at --micro-batch %d, the budget is "
                            "%.2f GiB (%s); use a smaller --micro-batch (or auto), "
                            "--offload-checkpoints, lower --batch or --seq, or %s",
                            p->compute_bytes / g, b, (double)p->budget / g, budget_source(p),
                            more_memory(p));
    if (p->micro_auto || b == 1)
        return mt_error_set("GPU memory: the plan needs %.2f GiB even at --micro-batch 1 with the "
                            "checkpoints in host memory, the budget is %.2f GiB (%s); lower --batch "
                            "or --seq, or %s",
                            p->compute_bytes / g, (double)p->budget / g, budget_source(p),
                            more_memory(p));
    return mt_error_set("GPU memory: the plan needs %.2f GiB at --micro-batch %d with the checkpoints "
                        "in host memory, the budget is %.2f GiB (%s); use a smaller --micro-batch "
                        "(or auto), lower --batch or --seq, or %s",
                        p->compute_bytes / g, b, (double)p->budget / g, budget_source(p),
                        more_memory(p));
}

void mt_plan_print_host(const mt_plan *p, FILE *out) {
    const double g = MT_GIB;
    const mt_engine_plan *m = &p->mem;
    /* the rest: the host's token arrays, and the layer checkpoints when offloaded */
    double rest = m->host_total - m->host_master - m->host_moments - m->host_upload;
    fprintf(out, "host %.2f GiB (%.1f B/param: master %.2f, moments %.2f, upload copy %.2f",
            p->host_bytes / g, m->host_total / p->n_params, m->host_master / g, m->host_moments / g,
            m->host_upload / g);
    if (p->eo.offload) fprintf(out, ", layer checkpoints %.2f", rest / g);
    else if (rest >= 0.005 * g) fprintf(out, ", tokens %.2f", rest / g);
    fprintf(out, ")%s", p->backend.host_ram ? " + compute" : "");
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
                                "that fits with them in host memory"
                              : "the largest that fits the budget with the checkpoints on the GPU");    fprintf(out, "\nmemory plan: ");
    mt_plan_print_host(p, out);
    fprintf(out, "\n             %s %.2f GiB", p->backend.host_ram ? "compute (in host RAM)" : "GPU",
            p->compute_bytes / g);
    if (!p->backend.host_ram && p->budget > 0)
        fprintf(out, " of %.2f GiB (%s)", (double)p->budget / g, budget_source(p));
    fprintf(out, " (weight slots %.2f, embed/head %.2f, gradients %.2f, activations %.2f%s, working %.2f, "
            "library scratch %.2f)\n",
            m->dev_slots / g, m->dev_embed_head / g, m->dev_grads / g, m->dev_checkpoints / g,
            eo->offload ? " with checkpoints offloaded" : "", m->dev_work / g,
            (double)p->backend.scratch / g);
    if (eo->saved_layers)
        fprintf(out, "             of which saved internals %.2f GiB: the backward of the last %d of %d layers "
                "skips the recompute\n", m->dev_saved / g, eo->saved_layers, p->L);
    if (eo->resident)
        fprintf(out, "             resident weights: every layer keeps its slot, loaded once per step\n");
    if (!p->backend.host_ram && p->budget > 0 && p->backend.headroom > 0) {
        if (fits_roomy(p))
            fprintf(out, "             %.2f GiB of the budget kept free for the backend's pool\n",
                    (double)p->backend.headroom / g);
        else if (fits_budget(p))
            fprintf(out, "             only %.2f GiB of the budget left for the backend's pool (it "
                    "asks for %.2f)\n", ((double)p->budget - p->compute_bytes) / g,
                    (double)p->backend.headroom / g);
    }
}
