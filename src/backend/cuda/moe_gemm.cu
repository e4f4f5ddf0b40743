/* The experts' GEMMs as cuBLAS grouped GEMMs (cublasGemmGroupedBatchedEx, cuBLAS >= 12.5): one
 * call per product over every expert with rows, instead of one cuBLASLt call per expert
 * (backend.h's moe_matmul_forward; MT_MOE_GEMM=grouped, or auto with few rows an expert, picks it:
 * backend_cuda.cu, moe_gemm_choice.h).
 *
 * Each expert with rows is a group of one problem (the row counts differ), in the column-major
 * terms of matmul.cu's table: forward A = W_e op T, B = inp rows op N, D = out rows; dinp A = W_e
 * op N, B = dout rows op N, D = dinp rows (beta = accumulate); dweight A = inp rows op N, B = dout
 * rows op T, D = dW_e fp32 (beta 1). bf16 A and B, fp32 compute and scale. The sizes are host
 * arrays (from the host's offsets); a one-thread kernel writes the device pointer arrays from the
 * compute side's offsets, so nothing is uploaded. Calls reuse the arrays in stream order. The
 * handle works in the cuBLASLt workspace (on the compute stream, as every matmul); its pointer
 * arrays (3 x E pointers) are the only device memory it takes outside the budget.
 *
 * cuBLAS may refuse bf16 x bf16 -> fp32 (the weight gradient's D) in the grouped call (cuBLAS 13.1
 * on the H200 does): the first refusal is printed once (under MT_MOE_GEMM=grouped; auto says
 * nothing) and the weight gradients run as zero-padded strided batches (below), or, where padding
 * would cost too much, back in the per-expert loop (the same cuBLASLt calls as MT_MOE_GEMM=loop);
 * the data products stay grouped. */
#include <stdio.h>
#include <stdlib.h>

#include <cublas_v2.h>

#include "cuda_memory.h"
#include "cuda_vec.cuh"
#include "ops.cuh"

#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120500
#define MT_HAVE_GROUPED_GEMM 1
#else
#define MT_HAVE_GROUPED_GEMM 0
#endif

struct mt_cuda_moe_gemm {
    cublasHandle_t h;
    int cap;                /* problems the arrays hold */
    const void **dA, **dB;  /* device pointer arrays */
    void **dD;
    cublasOperation_t *ta, *tb;
    int *m, *n, *k, *lda, *ldb, *ldc, *gs;
    float *alpha, *beta;
    int f32_refused;        /* cuBLAS refused fp32 D: weight gradients padded (or loop) */
    int padded_refused;     /* cuBLAS refused the padded strided batches too: they loop */
};

/* An operand of expert e: base + e * e_stride + offsets[e] * r_stride bytes. */
typedef struct {
    const char *base;
    size_t e_stride, r_stride;
} operand;

static __global__ void pointers_kernel(const void **A, const void **B, void **D,
                                       const int32_t *off, int E, operand a, operand b,
                                       operand d) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    int j = 0;
    for (int e = 0; e < E; e++) {
        if (off[e + 1] == off[e]) continue;
        size_t r = (size_t)off[e];
        A[j] = a.base + e * a.e_stride + r * a.r_stride;
        B[j] = b.base + e * b.e_stride + r * b.r_stride;
        D[j] = (char *)d.base + e * d.e_stride + r * d.r_stride;
        j++;
    }
}

/* The state, made on first use for the compute stream s (every call passes that one). */
static mt_cuda_moe_gemm *state(mt_cuda_ctx *ctx, int E, cudaStream_t s) {
    mt_cuda_moe_gemm *g = ctx->moe_gemm;
    if (!g) {
        g = (mt_cuda_moe_gemm *)mt_calloc(1, sizeof *g);
        CUBLAS_CHECK(cublasCreate(&g->h));
        /* the compute stream, once: cublasSetStream would reset the workspace set next */
        CUBLAS_CHECK(cublasSetStream(g->h, s));
        /* the cuBLASLt workspace (in the budget, used in compute-stream order by every matmul)
         * rather than one cuBLAS would allocate outside it */
        CUBLAS_CHECK(cublasSetWorkspace(g->h, ctx->lt_workspace, ctx->lt_workspace_bytes));
        ctx->moe_gemm = g;
    }
    if (E > g->cap) { /* E is fixed per model: this runs once */
        CUDA_CHECK(cudaDeviceSynchronize()); /* earlier calls may still read the old arrays */
        cudaFree(g->dA), cudaFree(g->dB), cudaFree(g->dD);
        free(g->ta), free(g->tb), free(g->m), free(g->n), free(g->k);
        free(g->lda), free(g->ldb), free(g->ldc), free(g->gs), free(g->alpha), free(g->beta);
        g->cap = E;
        CUDA_CHECK(cudaMalloc((void **)&g->dA, (size_t)E * sizeof(void *)));
        CUDA_CHECK(cudaMalloc((void **)&g->dB, (size_t)E * sizeof(void *)));
        CUDA_CHECK(cudaMalloc((void **)&g->dD, (size_t)E * sizeof(void *)));
        g->ta = (cublasOperation_t *)mt_malloc((size_t)E * sizeof *g->ta);
        g->tb = (cublasOperation_t *)mt_malloc((size_t)E * sizeof *g->tb);
        int **ints[] = {&g->m, &g->n, &g->k, &g->lda, &g->ldb, &g->ldc, &g->gs};
        for (int **p : ints) *p = (int *)mt_malloc((size_t)E * sizeof(int));
        g->alpha = (float *)mt_malloc((size_t)E * sizeof(float));
        g->beta = (float *)mt_malloc((size_t)E * sizeof(float));
    }
    return g;
}

void mt_cuda_moe_gemm_free(mt_cuda_ctx *ctx) {
    mt_cuda_moe_gemm *g = ctx->moe_gemm;
    if (!g) return;
    cublasDestroy(g->h);
    cudaFree(g->dA), cudaFree(g->dB), cudaFree(g->dD);
    free(g->ta), free(g->tb), free(g->m), free(g->n), free(g->k);
    free(g->lda), free(g->ldb), free(g->ldc), free(g->gs), free(g->alpha), free(g->beta);
    free(g);
    ctx->moe_gemm = NULL;
}

/* D_e = op(A_e) op(B_e) + beta * D_e over the experts with rows; m, n or k < 0 is the expert's row
 * count. Returns cuBLAS's status (a refusal enqueues no GEMM). */
static cublasStatus_t grouped(mt_cuda_moe_gemm *g, cublasOperation_t ta, cublasOperation_t tb,
                              int m, int n, int k, operand a, int lda, operand b, int ldb,
                              operand d, cudaDataType dtype, int ldd, float beta,
                              const int32_t *off, const int32_t *off_host, int E, cudaStream_t s) {
    int cnt = 0;
    for (int e = 0; e < E; e++) {
        int r = off_host[e + 1] - off_host[e];
        if (r == 0) continue;
        g->ta[cnt] = ta, g->tb[cnt] = tb;
        g->m[cnt] = m < 0 ? r : m, g->n[cnt] = n < 0 ? r : n, g->k[cnt] = k < 0 ? r : k;
        g->lda[cnt] = lda, g->ldb[cnt] = ldb, g->ldc[cnt] = ldd;
        g->gs[cnt] = 1, g->alpha[cnt] = 1.0f, g->beta[cnt] = beta;
        cnt++;
    }
    if (cnt == 0) return CUBLAS_STATUS_SUCCESS;
#if MT_HAVE_GROUPED_GEMM
    pointers_kernel<<<1, 1, 0, s>>>(g->dA, g->dB, g->dD, off, E, a, b, d);
    CUDA_LAUNCH_CHECK();
    return cublasGemmGroupedBatchedEx(g->h, g->ta, g->tb, g->m, g->n, g->k, g->alpha, g->dA,
                                      CUDA_R_16BF, g->lda, g->dB, CUDA_R_16BF, g->ldb, g->beta,
                                      g->dD, dtype, g->ldc, cnt, g->gs, CUBLAS_COMPUTE_32F);
#else
    return CUBLAS_STATUS_NOT_SUPPORTED;
#endif
}

/* ---- the weight gradients where the grouped call refuses fp32 D: padded strided batches ----
 * dW_e += inp_e^T dout_e for a run of consecutive experts as ONE strided-batched GEMM (bf16 in,
 * fp32 D, beta 1: the loop's math, another summation order), after copying each expert's rows
 * into a zero-padded slab of `cap` rows (cap: the most rows an expert has in this call; zero rows
 * add exactly nothing). The slabs live in the op scratch, in runs of experts that fit
 * MT_CUDA_MOE_PAD_SCRATCH. Worth it while the loop's GEMMs are small (launch-bound at ~88
 * TFLOP/s at 256 rows an expert, moe_bench session 8), which is when auto groups at all. */

/* dst[j][r][:] = src row offsets[e0 + j] + r, or zeros past expert e0 + j's rows. V elements
 * a thread (8: one 16-byte load, when width and the base allow it). */
template <int V>
static __global__ void pad_rows_kernel(bf16 *dst, const bf16 *src, const int32_t *off, int e0,
                                       int cap, int width) {
    int j = blockIdx.y;
    size_t per = (size_t)cap * width / V;
    int r0 = off[e0 + j], rows = off[e0 + j + 1] - r0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < per;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i * V / width, c = i * V % width;
        bf16 *d = dst + ((size_t)j * cap + r) * width + c;
        if (V == 8) {
            uint4 v = make_uint4(0, 0, 0, 0);
            if ((int)r < rows) v = *(const uint4 *)(src + ((size_t)r0 + r) * width + c);
            *(uint4 *)d = v;
        } else {
            d[0] = (int)r < rows ? src[((size_t)r0 + r) * width + c] : __float2bfloat16_rn(0.0f);
        }
    }
}

static void pad_rows(bf16 *dst, const bf16 *src, const int32_t *off, int e0, int nexp, int cap,
                     int width, cudaStream_t s) {
    int vec = width % 8 == 0 && mt_aligned16(src) && mt_aligned16(dst);
    size_t per = (size_t)cap * width / (vec ? 8 : 1);
    unsigned bx = (unsigned)((per + MT_CUDA_EW_THREADS - 1) / MT_CUDA_EW_THREADS);
    if (bx > 1024) bx = 1024;
    dim3 grid(bx, (unsigned)nexp);
    if (vec) pad_rows_kernel<8><<<grid, MT_CUDA_EW_THREADS, 0, s>>>(dst, src, off, e0, cap, width);
    else pad_rows_kernel<1><<<grid, MT_CUDA_EW_THREADS, 0, s>>>(dst, src, off, e0, cap, width);
    CUDA_LAUNCH_CHECK();
}

int mt_cuda_moe_dweight_padded(mt_backend *be, float *dweight, const bf16 *dout, const bf16 *inp,
                               size_t w_stride, const int32_t *offsets,
                               const int32_t *offsets_host, int E, int K, int M, cudaStream_t s) {
    mt_cuda_ctx *ctx = mt_cuda_ctx_of(be);
    int cap = 0;
    for (int e = 0; e < E; e++) {
        int r = offsets_host[e + 1] - offsets_host[e];
        if (r > cap) cap = r;
    }
    if (cap == 0) return 1; /* no rows: nothing to add */
    /* padding past 4x the rows (skewed routing) or a slab over the scratch: the loop is better */
    size_t slab = (size_t)cap * (size_t)(K + M) * sizeof(bf16);
    if ((int64_t)E * cap > 4 * (int64_t)offsets_host[E] || slab > MT_CUDA_MOE_PAD_SCRATCH)
        return 0;
    int run = (int)(MT_CUDA_MOE_PAD_SCRATCH / slab);
    if (run > E) run = E;
    mt_cuda_moe_gemm *g = state(ctx, E, s);
    if (g->padded_refused) return 0;
    bf16 *pad_inp = (bf16 *)mt_cuda_scratch(be, (size_t)run * slab);
    bf16 *pad_dout = pad_inp + (size_t)run * cap * K;
    const float one = 1.0f;
    int added = 0;
    for (int e0 = 0; e0 < E;) {
        /* a run of consecutive experts with rows (an expert without rows is skipped, as the loop
         * skips it: its gradient keeps its bits), at most `run` long */
        if (offsets_host[e0 + 1] == offsets_host[e0]) {
            e0++;
            continue;
        }
        int n = 1;
        while (n < run && e0 + n < E && offsets_host[e0 + n + 1] > offsets_host[e0 + n]) n++;
        pad_rows(pad_inp, inp, offsets, e0, n, cap, K, s);
        pad_rows(pad_dout, dout, offsets, e0, n, cap, M, s);
        cublasStatus_t st = cublasGemmStridedBatchedEx(
            g->h, CUBLAS_OP_N, CUBLAS_OP_T, K, M, cap, &one, pad_inp, CUDA_R_16BF, K,
            (long long)cap * K, pad_dout, CUDA_R_16BF, M, (long long)cap * M, &one,
            dweight + (size_t)e0 * w_stride, CUDA_R_32F, K, (long long)w_stride, n,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        /* a refusal of the first run added nothing yet: the caller loops, now and from now on */
        if (st != CUBLAS_STATUS_SUCCESS && !added) {
            g->padded_refused = 1;
            return 0;
        }
        CUBLAS_CHECK(st);
        added = 1;
        e0 += n;
    }
    return 1;
}

static operand weights(const void *p, size_t w_stride, size_t elem) {
    return {(const char *)p, w_stride * elem, 0};
}
static operand rows(const void *p, int width) {
    return {(const char *)p, 0, (size_t)width * sizeof(bf16)};
}

int mt_cuda_moe_gemm_available(void) { return MT_HAVE_GROUPED_GEMM; }

void mt_cuda_moe_matmul_forward(mt_cuda_ctx *ctx, bf16 *out, const bf16 *inp, const bf16 *weight,
                                size_t w_stride, const int32_t *offsets,
                                const int32_t *offsets_host, int E, int K, int M, cudaStream_t s) {
    MT_CHECK(E >= 0 && K > 0 && M > 0, "moe_matmul_forward: E=%d K=%d M=%d", E, K, M);
    mt_cuda_moe_gemm *g = state(ctx, E, s);
    cublasStatus_t st = grouped(g, CUBLAS_OP_T, CUBLAS_OP_N, M, -1, K, weights(weight, w_stride, 2),
                                K, rows(inp, K), K, rows(out, M), CUDA_R_16BF, M, 0.0f, offsets,
                                offsets_host, E, s);
    if (st != CUBLAS_STATUS_SUCCESS)
        mt_fatal(__FILE__, __LINE__, "moe_matmul_forward: cublasGemmGroupedBatchedEx status %d "
                 "(E=%d K=%d M=%d); MT_MOE_GEMM=loop avoids it", (int)st, E, K, M);
}

/* Returns 0 when cuBLAS refused the fp32 weight gradient (nothing enqueued for it: the caller
 * loops), 1 when it is enqueued. The data gradient is always enqueued. */
int mt_cuda_moe_matmul_backward(mt_cuda_ctx *ctx, bf16 *dinp, float *dweight, const bf16 *dout,
                                const bf16 *inp, const bf16 *weight, size_t w_stride,
                                const int32_t *offsets, const int32_t *offsets_host, int E, int K,
                                int M, int accumulate, cudaStream_t s) {
    MT_CHECK(E >= 0 && K > 0 && M > 0, "moe_matmul_backward: E=%d K=%d M=%d", E, K, M);
    mt_cuda_moe_gemm *g = state(ctx, E, s);
    if (dinp) {
        cublasStatus_t st = grouped(g, CUBLAS_OP_N, CUBLAS_OP_N, K, -1, M,
                                    weights(weight, w_stride, 2), K, rows(dout, M), M,
                                    rows(dinp, K), CUDA_R_16BF, K, accumulate ? 1.0f : 0.0f,
                                    offsets, offsets_host, E, s);
        if (st != CUBLAS_STATUS_SUCCESS)
            mt_fatal(__FILE__, __LINE__, "moe_matmul_backward: cublasGemmGroupedBatchedEx status "
                     "%d (E=%d K=%d M=%d); MT_MOE_GEMM=loop avoids it", (int)st, E, K, M);
    }
    if (!dweight) return 1; /* frozen experts: no weight-gradient GEMM, nothing to loop */
    if (g->f32_refused) return 0;
    cublasStatus_t st = grouped(g, CUBLAS_OP_N, CUBLAS_OP_T, K, M, -1, rows(inp, K), K,
                                rows(dout, M), M, weights(dweight, w_stride, 4), CUDA_R_32F, K,
                                1.0f, offsets, offsets_host, E, s);
    if (st == CUBLAS_STATUS_SUCCESS) return 1;
    g->f32_refused = 1;
    if (ctx->moe_gemm_mode == MT_MOE_GEMM_GROUPED) /* asked for by name: say it */
        fprintf(stderr, "megatrain: cuBLAS's grouped GEMM refuses bf16 x bf16 -> fp32 (status %d): "
                "the experts' weight gradients run as zero-padded batches (or one GEMM per expert)\n", (int)st);
    return 0;
}
