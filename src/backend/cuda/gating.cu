/* Sigmoid gates and column splits (qwen3_5's gated attention and shared expert), bf16 storage,
 * fp32 math with the accurate expf. An elementwise gate (one gate an element) runs a grid-stride
 * loop; a gate a row runs one warp per row, whose backward sums the row's dg terms with a warp
 * reduction. The splits and joins are strided copies: cudaMemcpy2DAsync on the stream. */
#include "cuda_vec.cuh"
#include "ops.cuh"

#define GATE_WARPS 8 /* rows per block of the row-gate kernels */

static __device__ __forceinline__ float sigmoid_(float g) { return 1.0f / (1.0f + expf(-g)); }

static __global__ void gate_elem_forward_kernel(bf16 *out, const bf16 *x, const bf16 *g, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * sigmoid_(__bfloat162float(g[i])));
}

static __global__ void gate_elem_backward_kernel(bf16 *dx, bf16 *dg, const bf16 *dout, const bf16 *x,
                                                 const bf16 *g, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = sigmoid_(__bfloat162float(g[i])), d = __bfloat162float(dout[i]);
        float xv = __bfloat162float(x[i]);
        dx[i] = __float2bfloat16_rn(d * s); /* dx may alias dout: read above */
        dg[i] = __float2bfloat16_rn(d * xv * s * (1.0f - s));
    }
}

static __global__ void __launch_bounds__(32 * GATE_WARPS)
    gate_row_forward_kernel(bf16 *out, const bf16 *x, const bf16 *g, int R, int C) {
    int r = blockIdx.x * GATE_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= R) return;
    float s = sigmoid_(__bfloat162float(g[r]));
    for (int c = lane; c < C; c += 32) {
        size_t i = (size_t)r * C + c;
        out[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * s);
    }
}

static __global__ void __launch_bounds__(32 * GATE_WARPS)
    gate_row_backward_kernel(bf16 *dx, bf16 *dg, const bf16 *dout, const bf16 *x, const bf16 *g,
                             int R, int C) {
    int r = blockIdx.x * GATE_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= R) return;
    float s = sigmoid_(__bfloat162float(g[r])), sum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        size_t i = (size_t)r * C + c;
        float d = __bfloat162float(dout[i]);
        sum += d * __bfloat162float(x[i]);
        dx[i] = __float2bfloat16_rn(d * s);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) dg[r] = __float2bfloat16_rn(sum * s * (1.0f - s));
}

static void check_gate(int R, int C, int Cg) {
    MT_CHECK(R >= 0 && C > 0 && (Cg == C || Cg == 1), "sigmoid_gate: R=%d C=%d gate columns %d", R,
             C, Cg);
}

void mt_cuda_sigmoid_gate_forward(bf16 *out, const bf16 *x, const bf16 *g, int R, int C, int Cg,
                                  cudaStream_t s) {
    check_gate(R, C, Cg);
    if (R == 0) return;
    MT_CHECK(out && x && g, "sigmoid_gate_forward: NULL tensor");
    size_t n = (size_t)R * C;
    if (Cg == C && C > 1)
        gate_elem_forward_kernel<<<mt_ew_blocks(n), MT_CUDA_EW_THREADS, 0, s>>>(out, x, g, n);
    else
        gate_row_forward_kernel<<<(R + GATE_WARPS - 1) / GATE_WARPS, 32 * GATE_WARPS, 0, s>>>(
            out, x, g, R, C);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_sigmoid_gate_backward(bf16 *dx, bf16 *dg, const bf16 *dout, const bf16 *x,
                                   const bf16 *g, int R, int C, int Cg, cudaStream_t s) {
    check_gate(R, C, Cg);
    if (R == 0) return;
    MT_CHECK(dx && dg && dout && x && g, "sigmoid_gate_backward: NULL tensor");
    size_t n = (size_t)R * C;
    if (Cg == C && C > 1)
        gate_elem_backward_kernel<<<mt_ew_blocks(n), MT_CUDA_EW_THREADS, 0, s>>>(dx, dg, dout, x, g,
                                                                                 n);
    else
        gate_row_backward_kernel<<<(R + GATE_WARPS - 1) / GATE_WARPS, 32 * GATE_WARPS, 0, s>>>(
            dx, dg, dout, x, g, R, C);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_cols_split(bf16 *a, bf16 *b, const bf16 *in, int R, int wa, int wb, cudaStream_t s) {
    MT_CHECK(R >= 0 && wa > 0 && wb > 0, "cols_split: R=%d widths %d, %d", R, wa, wb);
    if (R == 0) return;
    size_t e = sizeof(bf16), pitch = (size_t)(wa + wb) * e;
    CUDA_CHECK(cudaMemcpy2DAsync(a, wa * e, in, pitch, wa * e, R, cudaMemcpyDeviceToDevice, s));
    CUDA_CHECK(cudaMemcpy2DAsync(b, wb * e, in + wa, pitch, wb * e, R, cudaMemcpyDeviceToDevice, s));
}

void mt_cuda_cols_join(bf16 *out, const bf16 *a, const bf16 *b, int R, int wa, int wb,
                       cudaStream_t s) {
    MT_CHECK(R >= 0 && wa > 0 && wb > 0, "cols_join: R=%d widths %d, %d", R, wa, wb);
    if (R == 0) return;
    size_t e = sizeof(bf16), pitch = (size_t)(wa + wb) * e;
    CUDA_CHECK(cudaMemcpy2DAsync(out, pitch, a, wa * e, wa * e, R, cudaMemcpyDeviceToDevice, s));
    CUDA_CHECK(cudaMemcpy2DAsync(out + wa, pitch, b, wb * e, wb * e, R, cudaMemcpyDeviceToDevice, s));
}
