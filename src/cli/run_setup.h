/* What train, eval and generate set up the same way: directories, the backend, the memory check
 * (the data: data/run_data.h). Each returns MT_OK or MT_ERR with a message naming the flag or file. */
#ifndef MT_RUN_SETUP_H
#define MT_RUN_SETUP_H

#include "../backend/backend.h"
#include "../engine/engine.h"
#include "../engine/planner.h"
#include "data/tokens.h"
#include "../model/config.h"

int mt_run_make_dir(const char *path);
/* A sequence length the model can run: > 0, within a sliding window if the config has one. */
int mt_run_check_seq(const mt_config *cfg, int T, const char *flag);
/* device: 0 auto (cuda when built with it and a GPU is there), 1 cpu, 2 cuda; gpu_mem: the
 * --gpu-mem cap in bytes (0 = the whole GPU). */
int mt_run_backend(mt_backend **out, int device, int64_t gpu_mem);
/* The CUDA devices this process sees: 0 in a build without CUDA or on a machine without a GPU. */
int mt_run_cuda_devices(void);
/* Bytes of host RAM available now (MemAvailable), -1 when unknown. */
double mt_run_host_available(void);
/* Resolves the request (engine/planner.h; its host_available from mt_run_host_available, or 0
 * to leave host RAM unchecked) against the backend, prints the plan, and refuses before anything is allocated what the machine cannot hold
 * (MT_ERR with what to change). *eo: the options the engine runs, every choice resolved;
 * opt_threads and trace are left 0 for the caller. */
int mt_run_check_memory(const mt_param_table *t, mt_backend *be, const mt_plan_request *rq,
                        mt_engine_opts *eo);

#endif
