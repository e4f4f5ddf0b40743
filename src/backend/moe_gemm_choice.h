/* Which way a backend runs the experts' GEMMs (backend.h's moe_matmul_forward / backward): one
 * GEMM per expert (loop) or one grouped GEMM per product (grouped: the CUDA backend's
 * moe_gemm.cu). MT_MOE_GEMM names the mode; auto, the default, picks per call from the rows per
 * expert, by the H200's moe_bench (bench/RESULTS.md, session 8): grouped over the loop 1.78x on
 * the experts' GEMMs at 256 rows an expert (Qwen3-30B-A3B's layer at 4096 tokens), 0.94x at
 * 1024, 0.50-0.63x from 4096 (Qwen3 at 65536 tokens, Mixtral). The loop's per-expert calls
 * are launch-bound when each is small; the grouped call is slower once they are large. */
#ifndef MT_BACKEND_MOE_GEMM_CHOICE_H
#define MT_BACKEND_MOE_GEMM_CHOICE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MT_MOE_GEMM_LOOP = 0,
    MT_MOE_GEMM_GROUPED = 1,
    MT_MOE_GEMM_AUTO = 2,
} mt_moe_gemm_mode;

/* auto takes grouped below this many rows an expert (the mean: routed rows / E). Between the
 * measured 256 (grouped ahead) and 1024 (the loop ahead); 512 itself was not measured. */
#define MT_MOE_GROUPED_MAX_ROWS 512

/* MT_MOE_GEMM's value: NULL or "" is auto; "auto", "loop", "grouped". 1 with *mode set; 0 on any
 * other value (*mode untouched). */
int mt_moe_gemm_mode_parse(const char *s, mt_moe_gemm_mode *mode);
/* "loop", "grouped" or "auto". */
const char *mt_moe_gemm_mode_name(mt_moe_gemm_mode mode);
/* The mean rows an expert below which mode groups a call: 0 for loop (never), INT_MAX for grouped
 * (always), MT_MOE_GROUPED_MAX_ROWS for auto. The planner takes it as the backend's report. */
int mt_moe_gemm_grouped_below(mt_moe_gemm_mode mode);
/* 1 when a call of `rows` routed rows over E experts runs grouped under mode (its mean rows an
 * expert under mt_moe_gemm_grouped_below), 0 when it loops. */
int mt_moe_gemm_use_grouped(mt_moe_gemm_mode mode, int64_t rows, int E);

#ifdef __cplusplus
}
#endif

#endif
