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
 * cuBLAS may refuse bf16 x bf16 -> fp32 (the weight gradient's D) in the grouped call: the first
 * refusal is printed once (under MT_MOE_GEMM=grouped; auto says nothing) and the weight gradients
 * go back to the per-expert loop (the same cuBLASLt calls as MT_MOE_GEMM=loop); the data products
 * stay grouped. */
#include <stdio.h>
#include <stdlib.h>

#include <cublas_v2.h>

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
    int f32_refused;        /* cuBLAS refused fp32 D: weight gradients loop */
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
                "the experts' weight gradients run one GEMM per expert\n", (int)st);
    return 0;
}
