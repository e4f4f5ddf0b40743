/* What train, eval and generate set up the same way: directories, the backend, the memory check
 * (the data: run_data.h). Each returns MT_OK or MT_ERR with a message naming the flag or file. */
#ifndef MT_RUN_SETUP_H
#define MT_RUN_SETUP_H

#include "../backend/backend.h"
#include "../engine/engine.h"
#include "../io/tokens.h"
#include "../model/config.h"

int mt_run_make_dir(const char *path);
/* A sequence length the model can run: > 0, within a sliding window if the config has one. */
int mt_run_check_seq(const mt_config *cfg, int T, const char *flag);
/* device: 0 auto (cuda when built with it and a GPU is there), 1 cpu, 2 cuda; gpu_mem: the
 * --gpu-mem cap in bytes (0 = the whole GPU). */
int mt_run_backend(mt_backend **out, int device, int64_t gpu_mem);
/* Prints the memory plan and refuses, before allocating, what the machine cannot hold
 * (gpu_budget: bytes the GPU side may use, 0 = unchecked). When the budget is short it moves the
 * layer checkpoints to pinned host memory (sets eo->offload). eo->saved_layers < 0 and
 * eo->resident < 0 mean auto: they are resolved here from what the budget leaves. */
int mt_run_check_memory(const mt_param_table *t, mt_backend *be, mt_engine_opts *eo,
                        int64_t gpu_budget);

#endif
