/* The sizes the CUDA backend takes for itself on the GPU, in one place: the backend allocates by
 * them and mt_backend_cuda_memory() (backend/cuda_memory.c, in every build) reports them to the
 * memory planner, so that a plan made without a GPU counts the same bytes. Plain C. */
#ifndef MT_CUDA_MEMORY_H
#define MT_CUDA_MEMORY_H

#include <stddef.h>

#define MT_CUDA_LT_WORKSPACE ((size_t)64 << 20) /* cuBLASLt workspace, shared by every matmul */
#define MT_CUDA_POOL_KEEP ((size_t)256 << 20)   /* stream-ordered pool memory kept between ops */

/* The LM head's fp32 logits chunk stays under this many bytes; the bf16 dlogits chunk adds half
 * of it when a gradient is wanted, so the op scratch is 1.5 times it (lm_head_loss.cu says why
 * 1 GiB). */
#ifndef MT_CUDA_LM_HEAD_LOGITS_BYTES /* a test may shrink it to exercise many chunks */
#define MT_CUDA_LM_HEAD_LOGITS_BYTES ((size_t)1 << 30)
#endif
#define MT_CUDA_LM_HEAD_SCRATCH (MT_CUDA_LM_HEAD_LOGITS_BYTES + MT_CUDA_LM_HEAD_LOGITS_BYTES / 2)

/* The gated delta rule's fp32 scratch between its kernels stays under this (gated_delta_chunk.cuh:
 * long inputs run in ranges of chunks): the LM head's, as both take the one op scratch buffer at
 * different times, so the planner's count of that buffer holds for both. */
#define MT_CUDA_GATED_DELTA_SCRATCH MT_CUDA_LM_HEAD_SCRATCH

/* The experts' padded weight-gradient slabs (moe_gemm.cu) stay under this: the same op scratch
 * buffer again, at another time than the LM head's and the gated delta rule's. */
#define MT_CUDA_MOE_PAD_SCRATCH MT_CUDA_LM_HEAD_SCRATCH

/* Rows per chunk of the LM head over N rows: the fp32 logits chunk fits
 * MT_CUDA_LM_HEAD_LOGITS_BYTES, rounded down to a multiple of 64 (GEMM tiles; keeps chunk offsets
 * n0 * C aligned), at least 16, at most N. Here so that the planner prints what the kernel runs. */
static inline int mt_cuda_lm_head_chunk_rows(int N, int V) {
    size_t rows = MT_CUDA_LM_HEAD_LOGITS_BYTES / ((size_t)V * sizeof(float));
    if (rows >= 64) rows -= rows % 64;
    if (rows < 16) rows = 16;
    if (rows > (size_t)N) rows = (size_t)N;
    return (int)rows;
}

/* Left free under the budget: the attention backward's scratch (fp32 dQ and Delta, ~0.5 GiB for
 * 32k tokens of 28 heads of 128) and small temporaries come from the stream-ordered pool, outside
 * be->alloc's accounting. */
#define MT_CUDA_POOL_HEADROOM ((size_t)2 << 30)
/* ... unless the attention backward's pool memory is more: cuDNN's workspace measured 8.0-8.2
 * bytes per element of q (450 MiB at 16k tokens of 28 heads of 128, 900 MiB at 32k, 3.6 GiB at
 * 128k: bench/RESULTS.md, session 3), our kernel's about half; with a margin. At 512k tokens of
 * the 7B: 14.9 GiB. */
#define MT_CUDA_ATTENTION_POOL_PER_ELEM 8.5
/* ... and with packed rows through cuDNN's variable-length graph (the default for them,
 * attention_cudnn.h; the planner counts it only for runs on packed rows): the frontend's own
 * workspace of the variable-length backward with GQA is 12 + 4/D bytes per element of q (fp32 dQ,
 * and fp32-sized full-head dK and dV, each max_total_seq_len x H x D; the softmax sum H per token:
 * scaled_dot_product_flash_attention.h's ragged_workspace_size), measured as predicted: 12.03 at
 * D 128 by attention_bench's packed rows on the H200 (674 MiB at 4 x 4096 tokens of 28 heads,
 * 2695 MiB at 16 x 4096; bench/logs/2026-12-01-session7/call1-attention-bench.log); plus
 * our token-major stats (4/D), plus the engine's own workspace, which for the plain graph was the
 * 8.0-8.2 measured minus the frontend's 4 + 4/D, ~4; with a margin. */
#define MT_CUDA_ATTENTION_DOCS_POOL_PER_ELEM 16.5

#endif
