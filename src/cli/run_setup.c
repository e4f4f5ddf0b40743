#include "run_setup.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "../io/byte_text.h"

#define BYTE_EOS 256

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

static int is_token_file(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot && (!strcmp(dot, ".bin") || !strcmp(dot, ".tokens"));
}

int mt_run_open_data(mt_token_file *f, const char *path, const char *out_dir, const char *doc_sep,
                     const mt_config *cfg) {
    if (is_token_file(path)) return mt_tokens_open(f, path, mt_tokens_elem_size_for_vocab(cfg->V), cfg->V);
    if (cfg->V <= BYTE_EOS)
        return mt_error_set("%s: text data needs a tokenizer; this model's vocabulary (%d) is too small "
                            "for byte-level tokens (257); give a token file (.bin)", path, cfg->V);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char cache[4096];
    snprintf(cache, sizeof cache, "%s/%s.tokens.bin", out_dir, base);
    int64_t n;
    const char *paths[1] = {path};
    MT_TRY(mt_byte_text_to_tokens(paths, 1, cache, doc_sep, BYTE_EOS, &n));
    printf("%s: %lld byte-level tokens -> %s\n", path, (long long)n, cache);
    return mt_tokens_open(f, cache, 2, cfg->V);
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

int mt_run_check_memory(const mt_param_table *t, mt_backend *be, const mt_engine_opts *eo,
                        int64_t gpu_budget) {
    mt_engine_plan p;
    mt_engine_plan_of(t, be->dtype, eo, &p);
    double n = (double)t->n_real, gb = 1e9;
    int host_compute = strcmp(be->name, "cpu") == 0;
    double host = p.host_total + (host_compute ? p.dev_total : 0);
    printf("memory plan: host %.2f GB (%.1f B/param: master %.2f, moments %.2f, upload copy %.2f)%s\n",
           host / gb, p.host_total / n, p.host_master / gb, p.host_moments / gb, p.host_upload / gb,
           host_compute ? " + compute" : "");
    printf("             %s %.2f GB (weight slots %.2f, embed/head %.2f, gradients %.2f, "
           "checkpoints %.2f, working %.2f)\n",
           host_compute ? "compute (in host RAM)" : "GPU", p.dev_total / gb, p.dev_slots / gb,
           p.dev_embed_head / gb, p.dev_grads / gb, p.dev_checkpoints / gb, p.dev_work / gb);
    double avail = mem_available_bytes();
    if (avail > 0 && host > avail)
        return mt_error_set("host RAM: training needs %.2f GB, %.2f GB available; use a smaller model, "
                            "--batch/--seq, or a machine with more RAM",
                            host / gb, avail / gb);
    if (!host_compute && gpu_budget > 0 && p.dev_total > (double)gpu_budget)
        return mt_error_set("GPU memory: the plan needs %.2f GB, the budget is %.2f GB; lower --batch or "
                            "--seq, or raise --gpu-mem",
                            p.dev_total / gb, (double)gpu_budget / gb);
    return MT_OK;
}
