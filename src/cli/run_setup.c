#include "run_setup.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/error.h"
#include "build_info.h"

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
        return mt_error_set("--device cuda: this build has no CUDA backend (%s)", mt_build_no_cuda_reason());
#endif
    if (gpu_mem && device == 1) return mt_error_set("--gpu-mem applies to the cuda device, not --device cpu");
    *out = mt_backend_cpu_create();
    return MT_OK;
}

int mt_run_cuda_devices(void) {
#ifdef MT_HAVE_CUDA
    return mt_backend_cuda_device_count();
#else
    return 0;
#endif
}

double mt_run_host_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    double kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

int mt_run_check_memory(const mt_param_table *t, mt_backend *be, const mt_plan_request *rq,
                        mt_engine_opts *eo) {
    mt_plan p;
    MT_TRY(mt_plan_resolve(t, be, rq, &p));
    mt_plan_print(&p, stdout);
    MT_TRY(mt_plan_check(&p));
    *eo = p.eo;
    return MT_OK;
}
