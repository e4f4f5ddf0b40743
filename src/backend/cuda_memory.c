/* mt_backend_cuda_memory: compiled in every build, so that `megatrain plan --device cuda` plans
 * the GPU side with the backend's own numbers on a machine (or a build) without CUDA. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda/cuda_memory.h"
#include "moe_gemm_choice.h"

static int head_chunk_rows(int N, int V) { return mt_cuda_lm_head_chunk_rows(N, V); }

/* Packed rows take cuDNN's variable-length graph, and its larger pool need (cuda_memory.h), unless
 * MT_ATTENTION_DOCS=own or MT_ATTENTION=own, as attention_cudnn.cu reads them (their bad values
 * are that file's error, at the first call). Whether cuDNN loads at run time is not known here:
 * without it the plan keeps the larger number free for nothing, never too little. */
static int env_is(const char *name, const char *value) {
    const char *e = getenv(name);
    return e && strcmp(e, value) == 0;
}

static double attention_pool_docs(void) {
    return env_is("MT_ATTENTION_DOCS", "own") || env_is("MT_ATTENTION", "own")
               ? MT_CUDA_ATTENTION_POOL_PER_ELEM
               : MT_CUDA_ATTENTION_DOCS_POOL_PER_ELEM;
}

/* The rows an expert under which MT_MOE_GEMM groups the experts' data products (moe_gemm_choice.h;
 * a bad value is the backend's error at creation). */
static int moe_grouped_below(void) {
    mt_moe_gemm_mode mode = MT_MOE_GEMM_AUTO;
    mt_moe_gemm_mode_parse(getenv("MT_MOE_GEMM"), &mode);
    return mt_moe_gemm_grouped_below(mode);
}

mt_backend_memory mt_backend_cuda_memory(void) {
    return (mt_backend_memory){.scratch = (int64_t)(MT_CUDA_LT_WORKSPACE + MT_CUDA_LM_HEAD_SCRATCH),
                               .headroom = (int64_t)MT_CUDA_POOL_HEADROOM,
                               .attention_pool = MT_CUDA_ATTENTION_POOL_PER_ELEM,
                               .attention_pool_docs = attention_pool_docs(),
                               /* RSS over the plan's host total on the H200: 3.4 GiB (7B compact),
                                  4.3 (14B compact), 5.3 (7B full) — bench/RESULTS.md; a 32B plan at
                                  MemAvailable without it was killed by the OOM killer */
                               .host_overhead = (int64_t)6 << 30,
                               .host_ram = 0, .head_chunk_rows = head_chunk_rows,
                               /* the H200 (docs/DESIGN.md, "The test machine"): cuBLAS bf16 GEMMs
                                  at 800 TFLOP/s, of which whole 7B steps at 16 x 4096 ran 75% (MFU
                                  74-75% where nothing waited: step 1, and full state at GPU busy
                                  95-99%; bench/RESULTS.md, session 5); smaller models run less
                                  (1.5B: 56%), so their estimate is optimistic. PCIe Gen5 x16,
                                  pinned: 55.2 GB/s up, 55.3 down, 46.2 each way at once */
                               .flops_rate = 0.75 * 800e12, .h2d_rate = 55.2e9, .d2h_rate = 55.3e9,
                               .duplex_rate = 46.2e9,
                               /* MoE on the H200 (bench/RESULTS.md, session 8). moe_bench
                                  (Qwen3-30B-A3B's layer at 4096-65536 tokens, Mixtral's): the
                                  grouped call's data products at 240-270 TFLOP/s; the routing
                                  kernels moved a routed row's 4C + 6Fe bytes at 0.9-1.35 TB/s. A
                                  call's fixed cost from training, not the bench: session 7's
                                  Qwen3 compact step (2048-token chunks: 2.36M expert GEMM calls,
                                  10.8-12.4 s GPU busy, less 3.38 s of FLOPs and 0.88 s of routing)
                                  gives ~3 us; the bench's loop showed 7-12 us a call, which that
                                  step could not have paid (not understood). With 3 us tight's
                                  estimate (4.5 s) is 27% under its trace's 6.14 s busy. */
                               .moe_call_s = 3e-6, .moe_grouped_rate = 250e12,
                               .moe_grouped_below = moe_grouped_below(), .moe_route_rate = 1.1e12,
                               /* the chunked gated delta rule's first CUDA version on the H200:
                                  5.0 TFLOP/s forward, 5.3 backward at Qwen3.6-35B-A3B's layer,
                                  4k-32k tokens (bench/RESULTS.md, session 9) */
                               .delta_rule_rate = 5.0e12};
}
