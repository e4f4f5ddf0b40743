/* The LM head fused with cross-entropy on CUDA, chunked over rows so that (N, V) logits never exist.
 *
 * Per chunk of nc rows (x = inp rows n0 .. n0+nc, W = weight (V, C)):
 *   1. logits (nc, V) fp32   = x @ W^T                  cuBLASLt, bf16 in, fp32 accumulate, fp32 out
 *   2. one block per row: fp32 online max / sum-of-exp, losses[n] = (max - logit[t]) + log(sum);
 *      when a gradient is wanted, a second pass over the row writes
 *      dlogits (nc, V) bf16 = loss_scale * (softmax - onehot)   (a separate bf16 buffer)
 *   3. dinp chunk (nc, C) bf16 = dlogits @ W             cuBLASLt, beta 0 (written, =)
 *   4. dweight (V, C) fp32 += dlogits^T @ x              cuBLASLt, fp32 C/D, beta 1
 *
 * Precision: the logits are fp32 (exact bf16 products, fp32 accumulation, fp32 output) so that the
 * log-sum-exp and the loss are fp32 throughout; only dlogits is rounded to bf16 (relative 2^-9 per
 * element, after the softmax - onehot difference was formed in fp32) because it feeds two bf16
 * tensor-core GEMMs whose accumulation is fp32. dweight is accumulated in fp32.
 *
 * Row-major <-> cuBLASLt column-major: a row-major (r, c) matrix with leading dimension c is the
 * column-major (c, r) matrix with the same leading dimension (its transpose). So a row-major
 * product D (m, n) = A (m, k) @ B (k, n) is issued as the column-major D^T (n, m) = B^T @ A^T:
 *   1. logits^T (V, nc)  = op_T(W: col-major (C, V), ld C) @ op_N(x: col-major (C, nc), ld C)
 *                          m = V, n = nc, k = C; D fp32, ld V                    ("TN")
 *   3. dinp^T (C, nc)    = op_N(W: col-major (C, V), ld C) @ op_N(dl: col-major (V, nc), ld V)
 *                          m = C, n = nc, k = V; D bf16, ld C                    ("NN")
 *   4. dweight^T (C, V) += op_N(x: col-major (C, nc), ld C) @ op_T(dl: col-major (V, nc), ld V)
 *                          m = C, n = V, k = nc; C = D fp32, ld C, beta 1        ("NT")
 *
 * Soft-cap (Gemma 4's final_logit_softcapping, cap > 0; mt_cuda_lm_head_loss_softcap): step 2
 * reads each fp32 logit z as l = cap * tanh(z / cap) (the CPU's order, accurate tanhf, taken again
 * in the second pass rather than stored: no extra pass over the logits), the loss is over l, and
 * dlogits = loss_scale * (softmax(l) - onehot) * (1 - (l / cap)^2), formed in fp32, then bf16.
 *
 * Targets: targets[n] < 0 means ignored (loss 0, zero dlogits row). Targets >= V are a bug of the
 * data path (ids are validated when the data is loaded; a host-side check here would need a sync):
 * the kernel never reads out of bounds for them, writes a NaN loss so that the bug shows in the
 * reported loss, and leaves out the one-hot term of that row's gradient. */
#include <float.h>
#include <math.h>

#include "cuda_memory.h"
#include "ops.cuh"

/* The fp32 logits chunk stays under MT_CUDA_LM_HEAD_LOGITS_BYTES (cuda_memory.h; the bf16
 * dlogits chunk adds half of it when a gradient is wanted, so the scratch is 1.5 GiB): 1 GiB gives
 * 1728 rows for a 152k vocabulary, 2048 for 128k. Every chunk pays one read-modify-write of the fp32 (V, C) dweight in the dweight
 * GEMM (k = rows), so small chunks make it memory-bound. Measured on an H200, N = 8192, C = 3584,
 * V = 152064, forward + dinp + dweight: 63.7 ms at 256 MiB, 52.2 ms at 512 MiB, 45.5 ms at 1 GiB,
 * 43.4 ms at 2 GiB (the GEMMs alone would take ~38 ms at 700 TFLOP/s). */
#define LM_HEAD_THREADS 512

/* ---------------------------------------------------------------------------------------------- */
/* softmax / cross-entropy kernel                                                                 */
/* ---------------------------------------------------------------------------------------------- */

/* Merges the running (max, sum of exp(x - max)) pair (m, s) with (m2, s2). Maxes start at -FLT_MAX
 * (not -inf) so that empty partials merge without inf - inf. */
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2) {
    float mn = fmaxf(m, m2);
    s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
    m = mn;
}

/* The block-wide (max, sum) of every thread's pair, returned to every thread. */
__device__ __forceinline__ void block_lse(float &m, float &s) {
    __shared__ float sm[32], ss[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    if (lane == 0) {
        sm[warp] = m;
        ss[warp] = s;
    }
    __syncthreads();
    m = lane < nwarps ? sm[lane] : -FLT_MAX;
    s = lane < nwarps ? ss[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
    /* every warp reduced the same 32 values in the same order: all threads now agree */
}

/* A logit as the loss sees it: z itself, or cap * tanh(z / cap) under the soft-cap. */
template <bool CAP>
__device__ __forceinline__ float lm_logit(float z, float cap) {
    return CAP ? cap * tanhf(z / cap) : z;
}

/* The factor of dlogits through the soft-cap: dl/dz = 1 - (l / cap)^2 (1 without it). */
template <bool CAP>
__device__ __forceinline__ float lm_slope(float l, float cap) {
    if (!CAP) return 1.0f;
    float t = l / cap;
    return 1.0f - t * t;
}

/* One block per row of the chunk. logits (rows, V) fp32; dl (rows, V) bf16 or NULL (loss only);
 * targets and losses already offset to the chunk. VEC: V % 4 == 0, so every row starts 16-byte
 * aligned in logits and 8-byte aligned in dl (the buffers themselves are 256-byte aligned). CAP:
 * the soft-cap at cap (the file's comment); without it the kernel is the plain one. */
template <bool VEC, bool CAP>
__global__ void __launch_bounds__(LM_HEAD_THREADS)
    lm_head_ce_kernel(const float *__restrict__ logits, bf16 *__restrict__ dl,
                      float *__restrict__ losses, const int32_t *__restrict__ targets, int V,
                      float loss_scale, float cap) {
    const int row = blockIdx.x;
    const float *x = logits + (size_t)row * V;
    bf16 *d = dl ? dl + (size_t)row * V : nullptr;
    const int tgt = targets[row];

    if (tgt < 0) { /* ignored row: loss 0, zero gradient row (uniform over the block) */
        if (threadIdx.x == 0) losses[row] = 0.0f;
        if (d) {
            if (VEC) {
                uint2 z = make_uint2(0u, 0u);
                for (int i = threadIdx.x; i < V / 4; i += blockDim.x) ((uint2 *)d)[i] = z;
            } else {
                for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] = __float2bfloat16(0.0f);
            }
        }
        return;
    }

    /* pass 1: online (max, sum of exp) in fp32 */
    float m = -FLT_MAX, s = 0.0f;
    if (VEC) {
        const float4 *x4 = (const float4 *)x;
        for (int i = threadIdx.x; i < V / 4; i += blockDim.x) {
            float4 v = x4[i];
            v.x = lm_logit<CAP>(v.x, cap), v.y = lm_logit<CAP>(v.y, cap);
            v.z = lm_logit<CAP>(v.z, cap), v.w = lm_logit<CAP>(v.w, cap);
            float mn = fmaxf(fmaxf(m, fmaxf(v.x, v.y)), fmaxf(v.z, v.w));
            s = s * __expf(m - mn) + __expf(v.x - mn) + __expf(v.y - mn) + __expf(v.z - mn) +
                __expf(v.w - mn);
            m = mn;
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            float v = lm_logit<CAP>(x[j], cap);
            if (v > m) {
                s = s * __expf(m - v) + 1.0f;
                m = v;
            } else {
                s += __expf(v - m);
            }
        }
    }
    block_lse(m, s);

    const bool valid = tgt < V; /* tgt >= V: data bug; never read out of bounds */
    if (threadIdx.x == 0)
        losses[row] = valid ? (m - lm_logit<CAP>(x[tgt], cap)) + logf(s) : __int_as_float(0x7fc00000);
    if (!d) return;

    /* pass 2: dlogits = loss_scale * softmax - loss_scale * onehot, formed in fp32, stored bf16 */
    const float k = loss_scale / s;
    const int t = valid ? tgt : -1;
    if (VEC) {
        const float4 *x4 = (const float4 *)x;
        for (int i = threadIdx.x; i < V / 4; i += blockDim.x) {
            float4 v = __ldcs(x4 + i); /* last use of the logits: stream past L2 */
            v.x = lm_logit<CAP>(v.x, cap), v.y = lm_logit<CAP>(v.y, cap);
            v.z = lm_logit<CAP>(v.z, cap), v.w = lm_logit<CAP>(v.w, cap);
            int j = 4 * i;
            float g0 = k * __expf(v.x - m) - (j + 0 == t ? loss_scale : 0.0f);
            float g1 = k * __expf(v.y - m) - (j + 1 == t ? loss_scale : 0.0f);
            float g2 = k * __expf(v.z - m) - (j + 2 == t ? loss_scale : 0.0f);
            float g3 = k * __expf(v.w - m) - (j + 3 == t ? loss_scale : 0.0f);
            g0 *= lm_slope<CAP>(v.x, cap), g1 *= lm_slope<CAP>(v.y, cap);
            g2 *= lm_slope<CAP>(v.z, cap), g3 *= lm_slope<CAP>(v.w, cap);
            __nv_bfloat162 lo = __floats2bfloat162_rn(g0, g1);
            __nv_bfloat162 hi = __floats2bfloat162_rn(g2, g3);
            uint2 u;
            u.x = *(unsigned *)&lo;
            u.y = *(unsigned *)&hi;
            ((uint2 *)d)[i] = u;
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            float l = lm_logit<CAP>(x[j], cap);
            float g = (k * __expf(l - m) - (j == t ? loss_scale : 0.0f)) * lm_slope<CAP>(l, cap);
            d[j] = __float2bfloat16(g);
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* cuBLASLt                                                                                       */
/* ---------------------------------------------------------------------------------------------- */

/* The largest power of two (<= 256) dividing the address: cuBLASLt assumes 256-byte aligned
 * buffers unless told otherwise, and chunk offsets (n0 * C elements) need not be. */
static uint32_t ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a & (al - 1))) al >>= 1;
    return al;
}

/* Column-major D (m, n) = alpha * op(A) @ op(B) + beta * D, with A and B bf16, D of type dt,
 * fp32 compute and scale; C is D (in place, same layout). op(A) is (m, k), op(B) is (k, n). */
static void lt_gemm(mt_cuda_ctx *ctx, cudaStream_t s, cublasOperation_t ta, cublasOperation_t tb,
                    int m, int n, int k, const bf16 *A, int lda, const bf16 *B, int ldb, void *D,
                    cudaDataType_t dt, int ldd, float beta) {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta == CUBLAS_OP_N ? m : k,
                                            ta == CUBLAS_OP_N ? k : m, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb == CUBLAS_OP_N ? k : n,
                                            tb == CUBLAS_OP_N ? n : k, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, dt, m, n, ldd));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = ctx->lt_workspace ? (uint64_t)ctx->lt_workspace_bytes : 0;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    uint32_t aa = ptr_align(A), ab = ptr_align(B), ad = ptr_align(D);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof(ad)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof(ad)));

    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(ctx->lt, op, la, lb, ld, ld, pref, 1, &heur,
                                                &found));
    MT_CHECK(found > 0, "lm_head_loss: no cuBLASLt algorithm for m=%d n=%d k=%d (ops %d %d)", m, n,
             k, (int)ta, (int)tb);

    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(ctx->lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld,
                                &heur.algo, ctx->lt_workspace, heur.workspaceSize, s));

    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(op));
}

/* ---------------------------------------------------------------------------------------------- */
/* launcher                                                                                       */
/* ---------------------------------------------------------------------------------------------- */

void mt_cuda_lm_head_loss(mt_backend *be, float *losses, bf16 *dinp, float *dweight,
                          const bf16 *inp, const bf16 *weight, const int32_t *targets, int N,
                          int C, int V, float loss_scale, cudaStream_t s) {
    mt_cuda_lm_head_loss_softcap(be, losses, dinp, dweight, inp, weight, targets, N, C, V,
                                 loss_scale, 0.0f, s);
}

/* cap 0: the plain loss (its kernel unchanged); cap > 0: the soft-capped one. */
void mt_cuda_lm_head_loss_softcap(mt_backend *be, float *losses, bf16 *dinp, float *dweight,
                                  const bf16 *inp, const bf16 *weight, const int32_t *targets,
                                  int N, int C, int V, float loss_scale, float cap,
                                  cudaStream_t s) {
    MT_CHECK(N >= 0 && C > 0 && V > 0, "lm_head_loss: N=%d C=%d V=%d", N, C, V);
    MT_CHECK(cap >= 0, "lm_head_loss: soft-cap %g", cap);
    if (N == 0) return;
    mt_cuda_ctx *ctx = mt_cuda_ctx_of(be);
    const int chunk = mt_cuda_lm_head_chunk_rows(N, V); /* cuda_memory.h */
    const size_t logits_bytes = ((size_t)chunk * V * sizeof(float) + 255) & ~(size_t)255;
    const size_t dl_bytes = dinp ? (size_t)chunk * V * sizeof(bf16) : 0;
    char *scr = (char *)mt_cuda_scratch(be, logits_bytes + dl_bytes);
    float *logits = (float *)scr;
    bf16 *dl = dinp ? (bf16 *)(scr + logits_bytes) : nullptr;
    const bool vec = V % 4 == 0 && ((uintptr_t)scr & 15) == 0;

    for (int n0 = 0; n0 < N; n0 += chunk) {
        const int nc = N - n0 < chunk ? N - n0 : chunk;
        const bf16 *x = inp + (size_t)n0 * C;

        /* 1. logits^T (V, nc) = W^T-view op T, x op N; fp32 out */
        lt_gemm(ctx, s, CUBLAS_OP_T, CUBLAS_OP_N, V, nc, C, weight, C, x, C, logits, CUDA_R_32F, V,
                0.0f);

        /* 2. losses and dlogits */
        float *ls = losses + n0;
        const int32_t *tg = targets + n0;
        if (cap > 0 && vec)
            lm_head_ce_kernel<true, true><<<nc, LM_HEAD_THREADS, 0, s>>>(logits, dl, ls, tg, V,
                                                                         loss_scale, cap);
        else if (cap > 0)
            lm_head_ce_kernel<false, true><<<nc, LM_HEAD_THREADS, 0, s>>>(logits, dl, ls, tg, V,
                                                                          loss_scale, cap);
        else if (vec)
            lm_head_ce_kernel<true, false><<<nc, LM_HEAD_THREADS, 0, s>>>(logits, dl, ls, tg, V,
                                                                          loss_scale, cap);
        else
            lm_head_ce_kernel<false, false><<<nc, LM_HEAD_THREADS, 0, s>>>(logits, dl, ls, tg, V,
                                                                           loss_scale, cap);
        CUDA_LAUNCH_CHECK();
        if (!dinp) continue;

        /* 3. dinp^T (C, nc) = W (col-major (C, V)) @ dl^T (col-major (V, nc)); bf16 out, = */
        lt_gemm(ctx, s, CUBLAS_OP_N, CUBLAS_OP_N, C, nc, V, weight, C, dl, V,
                dinp + (size_t)n0 * C, CUDA_R_16BF, C, 0.0f);

        /* 4. dweight^T (C, V) += x^T-view (C, nc) @ (dl col-major (V, nc))^T; fp32, beta 1 */
        if (dweight)
            lt_gemm(ctx, s, CUBLAS_OP_N, CUBLAS_OP_T, C, V, nc, x, C, dl, V, dweight, CUDA_R_32F, C,
                    1.0f);
    }
}
