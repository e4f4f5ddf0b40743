/* The cuBLASLt plan cache of matmul.cu, counted (tests, benches): an MoE model's per-expert GEMMs
 * come in as many shapes as there are row counts an expert, which change every step. */
#ifndef MT_CUDA_MATMUL_PLANS_H
#define MT_CUDA_MATMUL_PLANS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Plans built (a shape not cached: descriptors and a heuristic query) and plans evicted to make
 * room, since the process started. */
void mt_cuda_matmul_plan_counts(long long *built, long long *evicted);

#ifdef __cplusplus
}
#endif

#endif
