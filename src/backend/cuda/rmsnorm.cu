/* RMSNorm as transformers' LlamaRMSNorm: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); with
 * w_offset 1 qwen3_5's (1 + w), the offset added to w in fp32 (every w below is w + w_offset).
 * One warp per row, fp32 math, bf16 storage; 16-byte accesses when C % 8 == 0.
 * Backward: dx = rstd * (dy * w) - x * rstd^3 / C * sum_c(dy * w * x) (one warp per row);
 * dweight += sum_r dy * x * rstd by the deterministic column sum of cuda_vec.cuh.
 * weight NULL (backend.h's rmsnorm_unweighted, Gemma 4's v_norm): y = x * rstd, and the backward
 * ignores dweight. The kernels then read no weight and take w + w_offset as 0 + 1 (exact, so the
 * products are the weighted op's with w = 1, as the CPU's). */
#include "cuda_vec.cuh"
#include "ops.cuh"

#define RMS_WARPS 8 /* rows per block */

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <int VEC>
static __global__ void __launch_bounds__(32 * RMS_WARPS)
    rmsnorm_forward_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *weight, int R,
                           int C, float eps, float w_offset) {
    int r = blockIdx.x * RMS_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= R) return;
    const bf16 *x = inp + (size_t)r * C;
    bf16 *y = out + (size_t)r * C;
    float ss = 0.0f;
    if (VEC == 8) {
        for (int c = lane * 8; c < C; c += 256) {
            float a[8];
            ld8(x + c, a);
#pragma unroll
            for (int j = 0; j < 8; j++) ss += a[j] * a[j];
        }
    } else {
        for (int c = lane; c < C; c += 32) {
            float a = __bfloat162float(x[c]);
            ss += a * a;
        }
    }
    ss = warp_sum(ss);
    float s = 1.0f / sqrtf(ss / (float)C + eps);
    if (lane == 0) rstd[r] = s;
    const float wo = weight ? w_offset : 1.0f; /* weight NULL: w + wo = 0 + 1 */
    if (VEC == 8) {
        for (int c = lane * 8; c < C; c += 256) {
            float a[8], w[8] = {0, 0, 0, 0, 0, 0, 0, 0}, o[8];
            ld8(x + c, a);
            if (weight) ld8(weight + c, w);
#pragma unroll
            for (int j = 0; j < 8; j++) o[j] = (a[j] * s) * (w[j] + wo);
            st8(y + c, o);
        }
    } else {
        for (int c = lane; c < C; c += 32)
            y[c] = __float2bfloat16_rn((__bfloat162float(x[c]) * s) *
                                       ((weight ? __bfloat162float(weight[c]) : 0.0f) + wo));
    }
}

template <int VEC>
static __global__ void __launch_bounds__(32 * RMS_WARPS)
    rmsnorm_backward_dinp_kernel(bf16 *dinp, const bf16 *dout, const bf16 *inp, const bf16 *weight,
                                 const float *rstd, int R, int C, int accumulate, float w_offset) {
    int r = blockIdx.x * RMS_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= R) return;
    const bf16 *x = inp + (size_t)r * C, *dy = dout + (size_t)r * C;
    bf16 *dx = dinp + (size_t)r * C;
    float s = rstd[r];
    float dot = 0.0f;
    const float wo = weight ? w_offset : 1.0f; /* weight NULL: w + wo = 0 + 1 */
    if (VEC == 8) {
        for (int c = lane * 8; c < C; c += 256) {
            float a[8], g[8], w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            ld8(x + c, a);
            ld8(dy + c, g);
            if (weight) ld8(weight + c, w);
#pragma unroll
            for (int j = 0; j < 8; j++) dot += g[j] * (w[j] + wo) * a[j];
        }
    } else {
        for (int c = lane; c < C; c += 32)
            dot += __bfloat162float(dy[c]) * ((weight ? __bfloat162float(weight[c]) : 0.0f) + wo) *
                   __bfloat162float(x[c]);
    }
    dot = warp_sum(dot);
    float k = dot * s * s * s / (float)C;
    if (VEC == 8) {
        for (int c = lane * 8; c < C; c += 256) {
            float a[8], g[8], w[8] = {0, 0, 0, 0, 0, 0, 0, 0}, o[8];
            ld8(x + c, a);
            ld8(dy + c, g);
            if (weight) ld8(weight + c, w);
            if (accumulate) ld8(dx + c, o);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float v = s * g[j] * (w[j] + wo) - k * a[j];
                o[j] = accumulate ? o[j] + v : v;
            }
            st8(dx + c, o);
        }
    } else {
        for (int c = lane; c < C; c += 32) {
            float v = s * __bfloat162float(dy[c]) *
                          ((weight ? __bfloat162float(weight[c]) : 0.0f) + wo) -
                      k * __bfloat162float(x[c]);
            if (accumulate) v += __bfloat162float(dx[c]);
            dx[c] = __float2bfloat16_rn(v);
        }
    }
}

void mt_cuda_rmsnorm_forward(bf16 *out, float *rstd, const bf16 *inp, const bf16 *weight, int R,
                             int C, float eps, float w_offset, cudaStream_t s) {
    MT_CHECK(R >= 0 && C > 0, "rmsnorm_forward: R=%d C=%d", R, C);
    /* weight NULL: the unweighted norm */
    MT_CHECK(R == 0 || (out && rstd && inp), "rmsnorm_forward: NULL tensor");
    if (R == 0) return;
    unsigned grid = (unsigned)((R + RMS_WARPS - 1) / RMS_WARPS);
    if (C % 8 == 0 && mt_aligned16(out) && mt_aligned16(inp) && mt_aligned16(weight))
        rmsnorm_forward_kernel<8><<<grid, 32 * RMS_WARPS, 0, s>>>(out, rstd, inp, weight, R, C, eps, w_offset);
    else
        rmsnorm_forward_kernel<1><<<grid, 32 * RMS_WARPS, 0, s>>>(out, rstd, inp, weight, R, C, eps, w_offset);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_rmsnorm_backward(bf16 *dinp, float *dweight, const bf16 *dout, const bf16 *inp,
                              const bf16 *weight, const float *rstd, int R, int C, int accumulate,
                              float w_offset, cudaStream_t s) {
    MT_CHECK(R >= 0 && C > 0, "rmsnorm_backward: R=%d C=%d", R, C);
    /* weight NULL: the unweighted norm, which has no dweight */
    MT_CHECK(R == 0 || (dout && inp && rstd), "rmsnorm_backward: NULL tensor");
    if (R == 0) return;
    if (dinp) {
        unsigned grid = (unsigned)((R + RMS_WARPS - 1) / RMS_WARPS);
        if (C % 8 == 0 && mt_aligned16(dinp) && mt_aligned16(dout) && mt_aligned16(inp) &&
            mt_aligned16(weight))
            rmsnorm_backward_dinp_kernel<8><<<grid, 32 * RMS_WARPS, 0, s>>>(
                dinp, dout, inp, weight, rstd, R, C, accumulate, w_offset);
        else
            rmsnorm_backward_dinp_kernel<1><<<grid, 32 * RMS_WARPS, 0, s>>>(
                dinp, dout, inp, weight, rstd, R, C, accumulate, w_offset);
        CUDA_LAUNCH_CHECK();
    }
    if (dweight && weight) mt_cuda_colsum(dweight, dout, inp, rstd, R, C, s);
}
