#include "run_setup.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/error.h"

int mt_run_make_dir(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return mt_error_set("%s: path too long", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return mt_error_set("%s: cannot create: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return mt_error_set("%s: cannot create: %s", buf, strerror(errno));
    return MT_OK;
}

int mt_run_check_seq(const mt_config *cfg, int T, const char *flag) {
    if (T < 1) return mt_error_set("%s: %d is not a sequence length", flag, T);
    if (cfg->sliding_window > 0 && T > cfg->sliding_window)
        return mt_error_set("%s: %d is longer than the model's sliding_window %d, which this runtime "
                            "does not implement; use %s %d or less",
                            flag, T, cfg->sliding_window, flag, cfg->sliding_window);
    if (T > cfg->max_position_embeddings)
        fprintf(stderr, "megatrain: warning: %s %d is longer than max_position_embeddings %d\n", flag, T,
                cfg->max_position_embeddings);
    return MT_OK;
}

int mt_run_backend(mt_backend **out, int device, int64_t gpu_mem) {
#ifdef MT_HAVE_CUDA
    int have_gpu = mt_backend_cuda_available();
    if (device == 2 && !have_gpu) return mt_error_set("--device cuda: no usable CUDA device found");
    if (have_gpu && device != 1) {
        *out = mt_backend_cuda_create(gpu_mem);
        return MT_OK;
    }
#else
    if (device == 2)
        return mt_error_set("--device cuda: this build has no CUDA backend (nvcc was not found at build time)");
#endif
    if (gpu_mem && device == 1) return mt_error_set("--gpu-mem applies to the cuda device, not --device cpu");
    *out = mt_backend_cpu_create();
    return MT_OK;
}

static double mem_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    double kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* cuBLASLt workspace and the LM head's logits chunk (lm_head_loss.cu), outside the engine's plan. */
#define CUDA_LIBRARY_SCRATCH (1.5 * 1073741824.0 + 64 * 1048576.0)

/* Left free under the budget when choosing saved layers: the attention backward's scratch and
 * small temporaries come from the stream-ordered pool, outside be->alloc's accounting. */
#define CUDA_POOL_HEADROOM (2.0 * 1073741824.0)

/* --saved-layers auto: as many layers as the memory left under the budget holds (none on the cpu
 * backend, where recompute costs less than the extra RAM traffic is worth measuring). */
static int auto_saved_layers(const mt_param_table *t, mt_backend *be, const mt_engine_opts *eo,
                             const mt_engine_plan *p, double scratch) {
    if (eo->offload || be->mem_budget <= 0) return 0;
    double left = (double)be->mem_budget - (p->dev_total + scratch) - CUDA_POOL_HEADROOM;
    if (left <= 0 || p->dev_saved_per_layer <= 0) return 0;
    double k = floor(left / p->dev_saved_per_layer);
    return k >= t->cfg.L ? t->cfg.L : (int)k;
}

int mt_run_check_memory(const mt_param_table *t, mt_backend *be, mt_engine_opts *eo,
                        int64_t gpu_budget) {
    int host_compute = strcmp(be->name, "cpu") == 0;
    double scratch = host_compute ? 0 : CUDA_LIBRARY_SCRATCH;
    int want_saved = eo->saved_layers, want_resident = eo->resident;
    mt_engine_plan p;
    eo->saved_layers = 0;
    eo->resident = want_resident > 0;
    mt_engine_plan_of(t, be->dtype, eo, &p);
    if (!host_compute && gpu_budget > 0 && !eo->offload && p.dev_total + scratch > (double)gpu_budget) {
        /* short of GPU memory: the layer checkpoints go to pinned host memory */
        eo->offload = 1;
        mt_engine_plan_of(t, be->dtype, eo, &p);
    }
    if (want_saved > 0 && eo->offload)
        return mt_error_set("--saved-layers %d: the layer checkpoints are offloaded (--gpu-mem short or "
                            "--offload-checkpoints), so no layer can keep its internals; use 0 or auto",
                            want_saved);
    if (want_saved > t->cfg.L)
        return mt_error_set("--saved-layers %d: the model has %d layers", want_saved, t->cfg.L);
    eo->saved_layers = want_saved < 0 ? auto_saved_layers(t, be, eo, &p, scratch) : want_saved;
    if (want_resident < 0) {
        /* resident weights only save PCIe traffic, so they come after the saved internals */
        eo->resident = 1;
        mt_engine_plan_of(t, be->dtype, eo, &p);
        eo->resident = !eo->offload && eo->saved_layers == t->cfg.L && be->mem_budget > 0 &&
                       p.dev_total + scratch + CUDA_POOL_HEADROOM <= (double)be->mem_budget;
    }
    mt_engine_plan_of(t, be->dtype, eo, &p);
    double n = (double)t->n_real, gb = 1e9;
    double host = p.host_total + (host_compute ? p.dev_total : 0);
    printf("memory plan: host %.2f GB (%.1f B/param: master %.2f, moments %.2f, upload copy %.2f%s)%s\n",
           host / gb, p.host_total / n, p.host_master / gb, p.host_moments / gb, p.host_upload / gb,
           eo->offload ? ", layer checkpoints" : "", host_compute ? " + compute" : "");
    printf("             %s %.2f GB (weight slots %.2f, embed/head %.2f, gradients %.2f, "
           "activations %.2f%s, working %.2f, library scratch %.2f)\n",
           host_compute ? "compute (in host RAM)" : "GPU", (p.dev_total + scratch) / gb, p.dev_slots / gb,
           p.dev_embed_head / gb, p.dev_grads / gb, p.dev_checkpoints / gb,
           eo->offload ? " with checkpoints offloaded" : "", p.dev_work / gb, scratch / gb);
    if (eo->saved_layers)
        printf("             + saved internals %.2f GB: the backward of the last %d of %d layers "
               "skips the recompute\n", p.dev_saved / gb, eo->saved_layers, t->cfg.L);
    if (eo->resident)
        printf("             resident weights: every layer keeps its slot, loaded once per step\n");
    double avail = mem_available_bytes();
    if (avail > 0 && host > avail)
        return mt_error_set("host RAM: training needs %.2f GB, %.2f GB available; use a smaller model, "
                            "--batch/--seq, or a machine with more RAM",
                            host / gb, avail / gb);
    if (!host_compute && gpu_budget > 0 && p.dev_total + scratch > (double)gpu_budget)
        return mt_error_set("GPU memory: the plan needs %.2f GB even with checkpoints in host memory, the "
                            "budget is %.2f GB; lower --batch or --seq, or raise --gpu-mem",
                            (p.dev_total + scratch) / gb, (double)gpu_budget / gb);
    return MT_OK;
}
