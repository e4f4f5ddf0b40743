/* Linear layers through cuBLASLt: bf16 A and B, fp32 accumulation (CUBLAS_COMPUTE_32F), bf16 or
 * fp32 C/D, PyTorch's layout (weight (M, K), out = inp @ weight^T + bias).
 *
 * Row-major onto cuBLASLt's column-major: a row-major (r, c) buffer with row stride c IS the
 * column-major (c, r) matrix with leading dimension c, i.e. its transpose. So every product is
 * computed transposed, with m, n, k and the op flags as follows (A, B, D name cuBLASLt's operands;
 * "stored a x b" is the column-major shape given to the layout, before the op):
 *
 *   forward   out (R,M) = inp (R,K) @ W (M,K)^T      <=>  out^T (M,R) = W_cm^T (M,K) @ inp^T (K,R)
 *             A = W   stored K x M ld K, op T;  B = inp  stored K x R ld K, op N;
 *             D = out stored M x R ld M;  m = M, n = R, k = K;  bias (M) = per-row of D: the
 *             CUBLASLT_EPILOGUE_BIAS vector (length m), added in fp32 before the one rounding.
 *             forward_add: the same, no bias, beta = 1 (C = D = out: out += the product).
 *   dinp      dinp (R,K) = dout (R,M) @ W (M,K)      <=>  dinp^T (K,R) = W^T (K,M) @ dout^T (M,R)
 *             A = W   stored K x M ld K, op N;  B = dout stored M x R ld M, op N;
 *             D = dinp stored K x R ld K;  m = K, n = R, k = M;  beta = accumulate (C = D).
 *   dweight   dW (M,K) += dout^T (M,R) @ inp (R,K)   <=>  dW^T (K,M) += inp^T (K,R) @ dout (R,M)
 *             A = inp stored K x R ld K, op N;  B = dout stored M x R ld M, op T;
 *             D = dW (fp32) stored K x M ld K;  m = K, n = M, k = R;  beta = 1 (C = D).
 *   dbias     (M) += column sums of dout: the deterministic fp32 column sum of cuda_vec.cuh.
 *
 * A plan (descriptors, layouts, the algorithm from cublasLtMatmulAlgoGetHeuristic) is cached per
 * (shape, op flags, types, epilogue, pointer alignments): the same shapes repeat every layer. When
 * the heuristic offers nothing (odd shapes or alignments), a plain fp32-accumulating kernel computes
 * the same product, so every shape works. The choice is fixed per key, so results are
 * reproducible run to run. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_vec.cuh"
#include "matmul_plans.h"
#include "ops.cuh"

/* Power of two. MoE models make one shape per row count an expert (6 products x the spread of the
 * routing: thousands of keys at 4096 rows an expert), which 1024 slots would thrash, paying a
 * heuristic query per call; the plans are ~200 bytes here plus cuBLASLt's descriptors. */
#define PLAN_SLOTS 16384

typedef struct {
    int m, n, k, lda, ldb, ldd;
    int ta, tb;     /* cublasOperation_t */
    int dtype;      /* cudaDataType of C/D */
    int bias;       /* epilogue BIAS */
    int align[3];   /* A, B, C/D pointer alignments in bytes (<= 256) */
} plan_key;

typedef struct {
    int used;
    plan_key key;
    int have_algo; /* 0: the fallback kernel */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
} plan;

static plan g_plans[PLAN_SLOTS];
static pthread_mutex_t g_plans_mu = PTHREAD_MUTEX_INITIALIZER;
static long long g_plans_built, g_plans_evicted; /* under g_plans_mu */

void mt_cuda_matmul_plan_counts(long long *built, long long *evicted) {
    pthread_mutex_lock(&g_plans_mu);
    if (built) *built = g_plans_built;
    if (evicted) *evicted = g_plans_evicted;
    pthread_mutex_unlock(&g_plans_mu);
}

static int ptr_align(const void *p) {
    uintptr_t u = (uintptr_t)p;
    int a = 1;
    while (a < 256 && (u & (uintptr_t)(2 * a - 1)) == 0) a *= 2;
    return a;
}

static size_t key_hash(const plan_key *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return (size_t)h & (PLAN_SLOTS - 1);
}

static void plan_release(plan *p) {
    if (!p->used) return;
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->d);
    cublasLtMatmulDescDestroy(p->op);
    p->used = 0;
}

static void plan_build(mt_cuda_ctx *ctx, plan *p, const plan_key *k) {
    memset(p, 0, sizeof *p);
    p->key = *k;
    cublasOperation_t ta = (cublasOperation_t)k->ta, tb = (cublasOperation_t)k->tb;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (k->bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType bt = CUDA_R_16BF;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                    sizeof epi));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                    &bt, sizeof bt));
    }
    /* stored shapes: op N -> rows x cols = m x k (A) / k x n (B); op T -> transposed */
    int a_rows = ta == CUBLAS_OP_N ? k->m : k->k, a_cols = ta == CUBLAS_OP_N ? k->k : k->m;
    int b_rows = tb == CUBLAS_OP_N ? k->k : k->n, b_cols = tb == CUBLAS_OP_N ? k->n : k->k;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, a_rows, a_cols, k->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, b_rows, b_cols, k->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, (cudaDataType)k->dtype, k->m, k->n, k->ldd));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = ctx->lt_workspace_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ws, sizeof ws));
    uint32_t al[3] = {(uint32_t)k->align[0], (uint32_t)k->align[1], (uint32_t)k->align[2]};
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof al[0]));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof al[1]));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof al[2]));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2], sizeof al[2]));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx->lt, p->op, p->a, p->b, p->d, p->d,
                                                       pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
        p->algo = res.algo;
        p->have_algo = 1;
    } else {
        fprintf(stderr,
                "megatrain: cuBLASLt has no algorithm for m=%d n=%d k=%d (ld %d %d %d, align %d %d "
                "%d); using the plain CUDA matmul for this shape\n",
                k->m, k->n, k->k, k->lda, k->ldb, k->ldd, k->align[0], k->align[1], k->align[2]);
    }
    p->used = 1;
}

/* ---- the fallback: D (m x n, ld ldd) = op(A) op(B) (+ bias per row i) + beta * D ---- */
template <typename TD>
static __global__ void gemm_fallback_kernel(TD *d, const bf16 *A, const bf16 *B, const bf16 *bias,
                                            int m, int n, int k, int lda, int ldb, int ldd, int ta,
                                            int tb, float beta) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, j = blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= m || j >= n) return;
    float acc = 0.0f;
    for (int l = 0; l < k; l++) {
        float a = __bfloat162float(ta ? A[l + (size_t)i * lda] : A[i + (size_t)l * lda]);
        float b = __bfloat162float(tb ? B[j + (size_t)l * ldb] : B[l + (size_t)j * ldb]);
        acc += a * b;
    }
    if (bias) acc += __bfloat162float(bias[i]);
    TD *o = d + i + (size_t)j * ldd;
    if (beta != 0.0f) acc += beta * (float)*o;
    *o = (TD)acc;
}

/* D = op(A) op(B) (+ bias) + beta * D, in cuBLASLt's column-major terms (see the top). */
static void lt_gemm(mt_cuda_ctx *ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                    int k, const bf16 *A, int lda, const bf16 *B, int ldb, void *D,
                    cudaDataType dtype, int ldd, float beta, const bf16 *bias, cudaStream_t s) {
    plan_key key;
    memset(&key, 0, sizeof key); /* hashed bytewise */
    key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldd = ldd;
    key.ta = (int)ta, key.tb = (int)tb, key.dtype = (int)dtype, key.bias = bias != NULL;
    key.align[0] = ptr_align(A), key.align[1] = ptr_align(B), key.align[2] = ptr_align(D);

    pthread_mutex_lock(&g_plans_mu);
    size_t h = key_hash(&key), i = h;
    plan *p = NULL;
    for (size_t probes = 0; probes < 16; probes++, i = (i + 1) & (PLAN_SLOTS - 1)) {
        plan *q = &g_plans[i];
        if (!q->used) break;
        if (memcmp(&q->key, &key, sizeof key) == 0) {
            p = q;
            break;
        }
    }
    if (!p) {
        p = &g_plans[i];
        if (p->used) { /* 16 collisions in a row: reuse the slot */
            p = &g_plans[h];
            plan_release(p);
            if (g_plans_evicted++ == 0)
                fprintf(stderr, "megatrain: cuBLASLt plan cache: %lld shapes seen, evicting from now on "
                        "(each new shape costs a heuristic query)\n", g_plans_built);
        }
        plan_build(ctx, p, &key);
        g_plans_built++;
    }
    const float alpha = 1.0f;
    if (p->have_algo) {
        if (bias)
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &bias, sizeof bias));
        CUBLAS_CHECK(cublasLtMatmul(ctx->lt, p->op, &alpha, A, p->a, B, p->b, &beta, D, p->d, D,
                                    p->d, &p->algo, ctx->lt_workspace, ctx->lt_workspace_bytes, s));
        pthread_mutex_unlock(&g_plans_mu);
        return;
    }
    pthread_mutex_unlock(&g_plans_mu);
    dim3 block(16, 16), grid((unsigned)((m + 15) / 16), (unsigned)((n + 15) / 16));
    int tav = ta != CUBLAS_OP_N, tbv = tb != CUBLAS_OP_N;
    if (dtype == CUDA_R_32F)
        gemm_fallback_kernel<float><<<grid, block, 0, s>>>((float *)D, A, B, bias, m, n, k, lda,
                                                           ldb, ldd, tav, tbv, beta);
    else
        gemm_fallback_kernel<bf16><<<grid, block, 0, s>>>((bf16 *)D, A, B, bias, m, n, k, lda, ldb,
                                                          ldd, tav, tbv, beta);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_gemm_rm(mt_cuda_ctx *ctx, int ta, int tb, int M, int N, int K, const bf16 *A, int lda,
                     const bf16 *B, int ldb, void *C, cudaDataType dtype, int ldc, float beta,
                     cudaStream_t s) {
    /* row-major C (M, N) is column-major C^T (N, M) = op(B)^T op(A)^T: B's storage read as
     * column-major is B^T, so untransposed B is op N there (and A likewise) */
    lt_gemm(ctx, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, B, ldb, A,
            lda, C, dtype, ldc, beta, NULL, s);
}

/* out (R, M) = bias rows, or zeros when bias is NULL. */
static __global__ void fill_rows_kernel(bf16 *out, const bf16 *bias, int R, int M) {
    size_t total = (size_t)R * M;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total;
         t += (size_t)gridDim.x * blockDim.x)
        out[t] = bias ? bias[t % M] : __float2bfloat16_rn(0.0f);
}

void mt_cuda_matmul_forward(mt_cuda_ctx *ctx, bf16 *out, const bf16 *inp, const bf16 *weight,
                            const bf16 *bias, int R, int K, int M, cudaStream_t s) {
    MT_CHECK(ctx, "matmul_forward: NULL context");
    MT_CHECK(R >= 0 && K >= 0 && M >= 0, "matmul_forward: R=%d K=%d M=%d", R, K, M);
    if (R == 0 || M == 0) return;
    MT_CHECK(out && (K == 0 || (inp && weight)), "matmul_forward: NULL tensor");
    if (K == 0) {
        fill_rows_kernel<<<mt_ew_blocks((size_t)R * M), MT_CUDA_EW_THREADS, 0, s>>>(out, bias, R, M);
        CUDA_LAUNCH_CHECK();
        return;
    }
    if (bias && ptr_align(bias) < 16) {
        /* the epilogue wants an aligned bias: start from the bias rows and add the product onto
         * them (beta 1), which rounds once as well */
        fill_rows_kernel<<<mt_ew_blocks((size_t)R * M), MT_CUDA_EW_THREADS, 0, s>>>(out, bias, R, M);
        CUDA_LAUNCH_CHECK();
        lt_gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, M, R, K, weight, K, inp, K, out, CUDA_R_16BF, M,
                1.0f, NULL, s);
        return;
    }
    lt_gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, M, R, K, weight, K, inp, K, out, CUDA_R_16BF, M, 0.0f,
            bias, s);
}

/* The forward's product added onto out (beta 1: C = D = out, fp32 accumulation of the product
 * and out's bf16 value, one rounding), without bias. */
void mt_cuda_matmul_forward_add(mt_cuda_ctx *ctx, bf16 *out, const bf16 *inp, const bf16 *weight,
                                int R, int K, int M, cudaStream_t s) {
    MT_CHECK(ctx, "matmul_forward_add: NULL context");
    MT_CHECK(R >= 0 && K >= 0 && M >= 0, "matmul_forward_add: R=%d K=%d M=%d", R, K, M);
    if (R == 0 || M == 0 || K == 0) return; /* K 0: adds nothing */
    MT_CHECK(out && inp && weight, "matmul_forward_add: NULL tensor");
    lt_gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, M, R, K, weight, K, inp, K, out, CUDA_R_16BF, M, 1.0f,
            NULL, s);
}

void mt_cuda_matmul_backward(mt_cuda_ctx *ctx, bf16 *dinp, float *dweight, float *dbias,
                             const bf16 *dout, const bf16 *inp, const bf16 *weight, int R, int K,
                             int M, int accumulate, cudaStream_t s) {
    MT_CHECK(ctx, "matmul_backward: NULL context");
    MT_CHECK(R >= 0 && K >= 0 && M >= 0, "matmul_backward: R=%d K=%d M=%d", R, K, M);
    if (R == 0) return;
    if (dinp && K > 0) {
        if (M > 0) {
            MT_CHECK(dout && weight, "matmul_backward: dinp needs dout and weight");
            lt_gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, K, R, M, weight, K, dout, M, dinp, CUDA_R_16BF,
                    K, accumulate ? 1.0f : 0.0f, NULL, s);
        } else if (!accumulate) {
            CUDA_CHECK(cudaMemsetAsync(dinp, 0, (size_t)R * K * sizeof(bf16), s));
        }
    }
    if (dweight && M > 0 && K > 0) {
        MT_CHECK(dout && inp, "matmul_backward: dweight needs dout and inp");
        lt_gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, K, M, R, inp, K, dout, M, dweight, CUDA_R_32F, K,
                1.0f, NULL, s);
    }
    if (dbias && M > 0) {
        MT_CHECK(dout, "matmul_backward: dbias needs dout");
        mt_cuda_colsum(dbias, dout, NULL, NULL, R, M, s);
    }
}
