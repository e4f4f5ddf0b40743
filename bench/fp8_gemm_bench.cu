/* Would fp8 GEMMs make a LoRA step on a frozen fp8 base faster? (issue: "the Hopper GPU can run the
 * frozen GEMMs in fp8; measure whether that is faster".) Times, through cuBLASLt on this GPU, the
 * frozen projections' forward GEMM Y[M][N] = X[M][K] W[N][K]^T of a model's layer at M tokens:
 *   bf16      bf16 x bf16 -> bf16 (what megatrain runs today after dequantizing the base)
 *   fp8 vec   e4m3 x e4m3 -> bf16 with an fp32 scale per 128 values along K on both sides
 *             (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F): megatrain's fp8 base format as stored
 *             (a scale per 128 values of a row) against activations quantized the same way
 *   fp8 blk   the weight with a scale per 128 x 128 block instead (BLK128x128_32F), the layout the
 *             backward's dX = dY W would need in either orientation
 *   fp8 tensor one fp32 scale a tensor (the plain Hopper fp8 GEMM; not megatrain's format)
 * and the cost that fp8 adds on the activation side: quantizing X (amax per 128 values, scale,
 * convert; a simple kernel here, one read of X and one write). The GEMMs only; whether the
 * backward's dX GEMM can run in fp8 is the same question at (M, K, N).
 *
 * Build: the CMake target fp8_gemm_bench in CUDA builds. Run: build/fp8_gemm_bench [--iters N]
 * (default 20, after 3 warm-ups). Inputs are random; scales 1 (the GEMM's speed does not depend on
 * them). A mode cuBLASLt refuses on this GPU prints "not supported". Exit 1 on a CUDA error.
 * Shapes: Llama-3.1-8B's (C 4096, kv 1024, F 14336) and Llama-3.3-70B's (C 8192, kv 1024, F 28672)
 * layer projections at M = 16384 (a micro-batch of 4 x 4096). */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                                          \
    do {                                                                                               \
        cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) {                                                                       \
            fprintf(stderr, "fp8_gemm_bench: %s: %s\n", #x, cudaGetErrorString(e_));                  \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

enum mode { BF16, FP8_VEC, FP8_BLK, FP8_TENSOR, N_MODES };
static const char *mode_name[N_MODES] = {"bf16", "fp8 vec128", "fp8 blk128", "fp8 tensor"};

static __global__ void fill_kernel(unsigned char *p, size_t n, unsigned seed) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = (unsigned char)((i * 2654435761u + seed) >> 13) & 0x77;
}

/* One warp a (row, 128-value block): amax, scale = amax / 448, e4m3 values. */
static __global__ void quantize_vec128(__nv_fp8_e4m3 *q, float *scale, const __nv_bfloat16 *x, int M, int K) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32, nb = K / 128;
    if (warp >= M * nb) return;
    int r = warp / nb, b = warp % nb;
    const __nv_bfloat16 *src = x + (size_t)r * K + b * 128 + lane * 4;
    float v[4], a = 0.0f;
    for (int i = 0; i < 4; i++) v[i] = __bfloat162float(src[i]), a = fmaxf(a, fabsf(v[i]));
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    float s = a > 0.0f ? a / 448.0f : 1.0f;
    for (int i = 0; i < 4; i++) q[(size_t)r * K + b * 128 + lane * 4 + i] = __nv_fp8_e4m3(v[i] / s);
    if (lane == 0) scale[(size_t)b * M + r] = s;
}

typedef struct {
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_size;
    cudaStream_t stream;
} ctx;

/* ms per GEMM of mode m at (M, N, K), or -1 when cuBLASLt has no algorithm for it. */
static double time_gemm(ctx *c, enum mode m, int M, int N, int K, int iters) {
    int fp8 = m != BF16;
    size_t esz = fp8 ? 1 : 2;
    void *A, *B, *D;
    float *sa, *sb;
    CK(cudaMalloc(&A, (size_t)N * K * esz));
    CK(cudaMalloc(&B, (size_t)M * K * esz));
    CK(cudaMalloc(&D, (size_t)M * N * 2));
    size_t ns = (size_t)(M + N) * (K / 128 + 1) + 1;
    CK(cudaMalloc(&sa, ns * sizeof(float)));
    CK(cudaMalloc(&sb, ns * sizeof(float)));
    fill_kernel<<<1024, 256, 0, c->stream>>>((unsigned char *)A, (size_t)N * K * esz, 1);
    fill_kernel<<<1024, 256, 0, c->stream>>>((unsigned char *)B, (size_t)M * K * esz, 2);
    {
        float *one = (float *)malloc(ns * sizeof(float));
        for (size_t i = 0; i < ns; i++) one[i] = 1.0f;
        CK(cudaMemcpy(sa, one, ns * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(sb, one, ns * sizeof(float), cudaMemcpyHostToDevice));
        free(one);
    }
    /* column-major: D (N x M) = op(A) (N x K) op(B) (K x M); A = W (K x N, transposed), B = X (K x M) */
    cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    cublasLtMatmulDesc_t op;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (fp8) {
        int32_t a_mode = m == FP8_VEC ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                         : m == FP8_BLK ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                        : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
        int32_t b_mode = m == FP8_TENSOR ? CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof a_mode);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof b_mode);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
    }
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, in, K, N, K);
    cublasLtMatrixLayoutCreate(&lb, in, K, M, K);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, N, M, N);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &c->ws_size, sizeof c->ws_size);
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    double ms = -1;
    if (cublasLtMatmulAlgoGetHeuristic(c->lt, op, la, lb, ld, ld, pref, 1, &h, &found) == CUBLAS_STATUS_SUCCESS && found) {
        float alpha = 1.0f, beta = 0.0f;
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        int okrun = 1;
        for (int i = 0; i < 3 + iters && okrun; i++) {
            if (i == 3) CK(cudaEventRecord(e0, c->stream));
            okrun = cublasLtMatmul(c->lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &h.algo, c->ws, c->ws_size,
                                   c->stream) == CUBLAS_STATUS_SUCCESS;
        }
        CK(cudaEventRecord(e1, c->stream));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        if (okrun) ms = t / iters;
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(D));
    CK(cudaFree(sa));
    CK(cudaFree(sb));
    CK(cudaGetLastError());
    return ms;
}

static double time_quantize(ctx *c, int M, int K, int iters) {
    __nv_bfloat16 *x;
    __nv_fp8_e4m3 *q;
    float *s;
    CK(cudaMalloc(&x, (size_t)M * K * 2));
    CK(cudaMalloc(&q, (size_t)M * K));
    CK(cudaMalloc(&s, (size_t)M * (K / 128) * sizeof(float)));
    fill_kernel<<<1024, 256, 0, c->stream>>>((unsigned char *)x, (size_t)M * K * 2, 3);
    int warps = M * (K / 128), blocks = (warps * 32 + 255) / 256;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 3 + iters; i++) {
        if (i == 3) CK(cudaEventRecord(e0, c->stream));
        quantize_vec128<<<blocks, 256, 0, c->stream>>>(q, s, x, M, K);
    }
    CK(cudaEventRecord(e1, c->stream));
    CK(cudaEventSynchronize(e1));
    float t;
    CK(cudaEventElapsedTime(&t, e0, e1));
    CK(cudaGetLastError());
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    CK(cudaFree(x));
    CK(cudaFree(q));
    CK(cudaFree(s));
    return t / iters;
}

int main(int argc, char **argv) {
    int iters = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--help")) {
            printf("fp8_gemm_bench [--iters N]: bf16 vs fp8 (block-scaled) cuBLASLt GEMMs at Llama 8B/70B layer shapes\n");
            return 0;
        } else {
            fprintf(stderr, "fp8_gemm_bench: unknown argument %s (--iters N)\n", argv[i]);
            return 2;
        }
    }
    int dev_count = 0;
    if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
        fprintf(stderr, "fp8_gemm_bench: no CUDA device\n");
        return 77;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, cuBLASLt %zu, M = 16384 rows, %d iterations\n", prop.name, cublasLtGetVersion(), iters);
    ctx c;
    cublasLtCreate(&c.lt);
    c.ws_size = 64u << 20;
    CK(cudaMalloc(&c.ws, c.ws_size));
    CK(cudaStreamCreate(&c.stream));
    struct { const char *name; int N, K; } shapes[] = {
        {"8B q/o", 4096, 4096},    {"8B k/v", 1024, 4096},   {"8B gate/up", 14336, 4096}, {"8B down", 4096, 14336},
        {"70B q/o", 8192, 8192},   {"70B k/v", 1024, 8192},  {"70B gate/up", 28672, 8192}, {"70B down", 8192, 28672},
    };
    const int M = 16384;
    printf("%-12s %6s %6s", "shape", "N", "K");
    for (int m = 0; m < N_MODES; m++) printf(" | %-10s ms  TF/s", mode_name[m]);
    printf(" | quantize X ms | fp8 vec + quantize vs bf16\n");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s].N, K = shapes[s].K;
        double flops = 2.0 * M * N * K, t[N_MODES];
        printf("%-12s %6d %6d", shapes[s].name, N, K);
        for (int m = 0; m < N_MODES; m++) {
            t[m] = time_gemm(&c, (enum mode)m, M, N, K, iters);
            if (t[m] < 0) printf(" | %-10s not supported", mode_name[m]);
            else printf(" | %8.3f ms %6.0f", t[m], flops / t[m] / 1e9);
        }
        double tq = time_quantize(&c, M, K, iters);
        printf(" | %8.3f", tq);
        if (t[FP8_VEC] > 0) printf(" | %.2fx", t[BF16] / (t[FP8_VEC] + tq));
        printf("\n");
        fflush(stdout);
    }
    cublasLtDestroy(c.lt);
    return 0;
}
