/* gpt-oss's experts on the GPU (backend.h's moe_matmul_io_*): weights stored fused as the
 * checkpoint has them, [E, in, out], with biases; each expert's grouped rows compute
 * x @ W[e] + b[e]. A loop over the experts with rows (offsets_host gives the sizes; an expert
 * with none is skipped and its gradients untouched), one GEMM per product through matmul.cu's
 * launchers, so the plan cache, the alignment handling and the fallback kernel are shared.
 *
 * W[e] (K, M) row-major is the transpose of matmul.cu's nn.Linear weight (M, K), so each product
 * here is one of matmul.cu's with the roles swapped (R = the expert's rows m):
 *   out (m, M)  = X (m, K) @ W (K, M)      matmul_backward's dinp with dout' = X, W' = W (K, M):
 *                                           dinp' (m, M) = dout' (m, K) @ W' (K, M)
 *   dinp (m, K) = dO (m, M) @ W^T          matmul_forward (or _add) with inp' = dO and
 *                                           W' = W read as (M' = K, K' = M): dO @ W'^T
 *   dW (K, M)  += X^T (K, m) @ dO (m, M)   matmul_backward's dweight with dout' = X, inp' = dO:
 *                                           dW' (M' = K, K' = M) += dout'^T @ inp'
 * The forward starts from the bias rows and adds the product onto them (beta 1: fp32
 * accumulation, one rounding to bf16, as the CPU's sgemm onto its bias rows). dbias is one
 * deterministic column-sum kernel over every expert (rows in a fixed order, no atomics). */
#include "cuda_vec.cuh"
#include "ops.cuh"

#define BIAS_THREADS 128
#define DBIAS_TY 8 /* row lanes per block of the bias gradient; 32 columns a block */

/* The expert owning grouped row r: the last e with offsets[e] <= r (empty experts before it share
 * its start; r < offsets[E]). */
static __device__ __forceinline__ int expert_of_row(const int32_t *offsets, int E, int r) {
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (offsets[mid] <= r) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* out row r (of rows row0 .. row0 + gridDim.x - 1) = bias[expert of r]: one block a row. */
static __global__ void bias_rows_kernel(bf16 *out, const bf16 *bias, const int32_t *offsets, int E,
                                        int M, int row0) {
    int r = row0 + blockIdx.x;
    int e = expert_of_row(offsets, E, r);
    const bf16 *b = bias + (size_t)e * M;
    bf16 *o = out + (size_t)r * M;
    for (int c = threadIdx.x; c < M; c += blockDim.x) o[c] = b[c];
}

/* dbias[e] (M) += column sums of dout over expert e's rows. Block (32, DBIAS_TY) sums 32 columns of
 * one expert (blockIdx.y): lane ty takes rows r0 + ty, r0 + ty + DBIAS_TY, ... in order, and the
 * lanes' sums are added in lane order. */
static __global__ void __launch_bounds__(32 * DBIAS_TY)
    dbias_kernel(float *dbias, const bf16 *dout, const int32_t *offsets, int M) {
    __shared__ float red[DBIAS_TY][32];
    int e = blockIdx.y, tx = threadIdx.x, ty = threadIdx.y;
    int r0 = offsets[e], r1 = offsets[e + 1];
    if (r1 <= r0) return; /* no rows: the gradient stays untouched (the whole block leaves) */
    int c = blockIdx.x * 32 + tx;
    float acc = 0.0f;
    if (c < M)
        for (int r = r0 + ty; r < r1; r += DBIAS_TY)
            acc += __bfloat162float(dout[(size_t)r * M + c]);
    red[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && c < M) {
        float s = red[0][tx];
#pragma unroll
        for (int t = 1; t < DBIAS_TY; t++) s += red[t][tx];
        dbias[(size_t)e * M + c] += s;
    }
}

/* The offsets' shape: non-decreasing. Returns the number of grouped rows. */
static int check_offsets(const char *op, const int32_t *offsets, const int32_t *offsets_host,
                         int E, int K, int M) {
    MT_CHECK(E >= 1 && E <= 65535 && K >= 0 && M >= 0, "%s: E=%d K=%d M=%d", op, E, K, M);
    MT_CHECK(offsets && offsets_host, "%s: NULL offsets", op);
    MT_CHECK(offsets_host[0] >= 0, "%s: offsets[0]=%d", op, offsets_host[0]);
    for (int e = 0; e < E; e++)
        MT_CHECK(offsets_host[e + 1] >= offsets_host[e], "%s: offsets[%d]=%d > offsets[%d]=%d", op,
                 e, offsets_host[e], e + 1, offsets_host[e + 1]);
    return offsets_host[E] - offsets_host[0];
}

void mt_cuda_moe_matmul_io_forward(mt_cuda_ctx *ctx, bf16 *out, const bf16 *inp,
                                   const bf16 *weight, const bf16 *bias, const int32_t *offsets,
                                   const int32_t *offsets_host, int E, int K, int M,
                                   cudaStream_t s) {
    MT_CHECK(ctx, "moe_matmul_io_forward: NULL context");
    int rows = check_offsets("moe_matmul_io_forward", offsets, offsets_host, E, K, M);
    if (rows == 0 || M == 0) return;
    MT_CHECK(out && (K == 0 || (inp && weight)), "moe_matmul_io_forward: NULL tensor");
    if (bias) {
        bias_rows_kernel<<<(unsigned)rows, BIAS_THREADS, 0, s>>>(out, bias, offsets, E, M,
                                                                 offsets_host[0]);
        CUDA_LAUNCH_CHECK();
    }
    for (int e = 0; e < E; e++) {
        int r0 = offsets_host[e], m = offsets_host[e + 1] - r0;
        if (m == 0) continue;
        /* out = X @ W (+ the bias rows already there): matmul_backward's dinp, see the top */
        mt_cuda_matmul_backward(ctx, out + (size_t)r0 * M, NULL, NULL, inp + (size_t)r0 * K, NULL,
                                weight + (size_t)e * K * M, m, M, K, bias ? 1 : 0, s);
    }
}

void mt_cuda_moe_matmul_io_backward(mt_cuda_ctx *ctx, bf16 *dinp, float *dweight, float *dbias,
                                    const bf16 *dout, const bf16 *inp, const bf16 *weight,
                                    const int32_t *offsets, const int32_t *offsets_host, int E,
                                    int K, int M, int accumulate, cudaStream_t s) {
    MT_CHECK(ctx, "moe_matmul_io_backward: NULL context");
    int rows = check_offsets("moe_matmul_io_backward", offsets, offsets_host, E, K, M);
    if (rows == 0 || (!dinp && !dweight && !dbias)) return;
    MT_CHECK(M == 0 || dout, "moe_matmul_io_backward: NULL dout");
    MT_CHECK(!dinp || M == 0 || K == 0 || weight, "moe_matmul_io_backward: dinp needs weight");
    MT_CHECK(!dweight || M == 0 || K == 0 || inp, "moe_matmul_io_backward: dweight needs inp");
    for (int e = 0; e < E; e++) {
        int r0 = offsets_host[e], m = offsets_host[e + 1] - r0;
        if (m == 0) continue; /* no token: this expert's gradients untouched */
        const bf16 *dO = dout + (size_t)r0 * M, *X = inp ? inp + (size_t)r0 * K : NULL;
        const bf16 *W = weight ? weight + (size_t)e * K * M : NULL;
        if (dinp) {
            /* dinp = dO @ W^T: matmul_forward with W read as (K, M) = nn.Linear's (out K, in M) */
            bf16 *dI = dinp + (size_t)r0 * K;
            if (accumulate) mt_cuda_matmul_forward_add(ctx, dI, dO, W, m, M, K, s);
            else mt_cuda_matmul_forward(ctx, dI, dO, W, NULL, m, M, K, s);
        }
        if (dweight) /* dW (K, M) += X^T @ dO: matmul_backward's dweight with X and dO swapped */
            mt_cuda_matmul_backward(ctx, NULL, dweight + (size_t)e * K * M, NULL, X, dO, NULL, m, M,
                                    K, 0, s);
    }
    if (dbias && M > 0) {
        dim3 block(32, DBIAS_TY), grid((unsigned)((M + 31) / 32), (unsigned)E);
        dbias_kernel<<<grid, block, 0, s>>>(dbias, dout, offsets, M);
        CUDA_LAUNCH_CHECK();
    }
}
