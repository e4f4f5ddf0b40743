/* Per-head L2 normalisation of the Gated DeltaNet's q and k (backend.h's l2norm_*; the CPU op:
 * src/backend/cpu/l2norm.c): y = x * rinv, rinv = 1/sqrt(sum(x^2) + eps); backward
 * dx = rinv dy - x rinv^3 (x . dy). One warp a row, bf16 storage, fp32 math. */
#include "cuda_vec.cuh"
#include "ops.cuh"

#define L2_WARPS 8 /* rows a block */

static __device__ __forceinline__ float warp_sum_(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __global__ void __launch_bounds__(32 * L2_WARPS)
    l2norm_forward_kernel(bf16 *out, float *rinv, const bf16 *inp, int R, int D, float eps) {
    int r = blockIdx.x * L2_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= R) return;
    const bf16 *x = inp + (size_t)r * D;
    float ss = 0.0f;
    for (int d = lane; d < D; d += 32) {
        float a = __bfloat162float(x[d]);
        ss += a * a;
    }
    float s = 1.0f / sqrtf(warp_sum_(ss) + eps);
    if (lane == 0) rinv[r] = s;
    for (int d = lane; d < D; d += 32)
        out[(size_t)r * D + d] = __float2bfloat16_rn(__bfloat162float(x[d]) * s);
}

static __global__ void __launch_bounds__(32 * L2_WARPS)
    l2norm_backward_kernel(bf16 *dinp, const bf16 *dout, const bf16 *inp, const float *rinv, int R,
                           int D) {
    int r = blockIdx.x * L2_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= R) return;
    const bf16 *x = inp + (size_t)r * D, *dy = dout + (size_t)r * D;
    float dot = 0.0f;
    for (int d = lane; d < D; d += 32) dot += __bfloat162float(x[d]) * __bfloat162float(dy[d]);
    float s = rinv[r], k = warp_sum_(dot) * s * s * s;
    for (int d = lane; d < D; d += 32)
        dinp[(size_t)r * D + d] =
            __float2bfloat16_rn(s * __bfloat162float(dy[d]) - k * __bfloat162float(x[d]));
}

void mt_cuda_l2norm_forward(bf16 *out, float *rinv, const bf16 *inp, int R, int D, float eps,
                            cudaStream_t s) {
    MT_CHECK(R >= 0 && D > 0, "l2norm_forward: R=%d D=%d", R, D);
    if (R == 0) return;
    MT_CHECK(out && rinv && inp, "l2norm_forward: NULL tensor");
    l2norm_forward_kernel<<<(unsigned)((R + L2_WARPS - 1) / L2_WARPS), 32 * L2_WARPS, 0, s>>>(
        out, rinv, inp, R, D, eps);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_l2norm_backward(bf16 *dinp, const bf16 *dout, const bf16 *inp, const float *rinv,
                             int R, int D, cudaStream_t s) {
    MT_CHECK(R >= 0 && D > 0, "l2norm_backward: R=%d D=%d", R, D);
    if (R == 0) return;
    MT_CHECK(dinp && dout && inp && rinv, "l2norm_backward: NULL tensor");
    l2norm_backward_kernel<<<(unsigned)((R + L2_WARPS - 1) / L2_WARPS), 32 * L2_WARPS, 0, s>>>(
        dinp, dout, inp, rinv, R, D);
    CUDA_LAUNCH_CHECK();
}
