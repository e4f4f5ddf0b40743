/* GeGLU's elementwise part (Gemma's MLP), gelu_tanh(gate) * up, and its gradient: the CPU's
 * geglu.c in fp32 with the accurate tanhf, bf16 in and out. Grid-stride loops over 8-element
 * (16-byte) groups when n % 8 == 0 and the pointers are 16-byte aligned, else over single
 * elements (as swiglu.cu). */
#include "cuda_vec.cuh"
#include "ops.cuh"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), torch's approximate="tanh" */
static __device__ __forceinline__ float gelu_t(float g) {
    return tanhf(GELU_K * (g + GELU_C * g * g * g));
}

template <int VEC>
static __global__ void geglu_forward_kernel(bf16 *out, const bf16 *gate, const bf16 *up,
                                            size_t groups) {
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < groups;
         t += (size_t)gridDim.x * blockDim.x) {
        size_t i = t * VEC;
        float g[VEC], u[VEC], o[VEC];
        if constexpr (VEC == 8) {
            ld8(gate + i, g);
            ld8(up + i, u);
        } else {
            g[0] = __bfloat162float(gate[i]);
            u[0] = __bfloat162float(up[i]);
        }
#pragma unroll
        for (int j = 0; j < VEC; j++) o[j] = 0.5f * g[j] * (1.0f + gelu_t(g[j])) * u[j];
        if constexpr (VEC == 8) st8(out + i, o);
        else out[i] = __float2bfloat16_rn(o[0]);
    }
}

/* d gelu_tanh/dg = 0.5 (1 + t) + 0.5 g (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 g^2), in the CPU's
 * order of operations (at huge |g| both give the same NaN, not one NaN and one number). */
template <int VEC>
static __global__ void geglu_backward_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout,
                                             const bf16 *gate, const bf16 *up, size_t groups) {
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < groups;
         t += (size_t)gridDim.x * blockDim.x) {
        size_t i = t * VEC;
        float g[VEC], u[VEC], d[VEC], dg[VEC], du[VEC];
        if constexpr (VEC == 8) {
            ld8(gate + i, g);
            ld8(up + i, u);
            ld8(dout + i, d);
        } else {
            g[0] = __bfloat162float(gate[i]);
            u[0] = __bfloat162float(up[i]);
            d[0] = __bfloat162float(dout[i]);
        }
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            float x = g[j], th = gelu_t(x);
            float gelu = 0.5f * x * (1.0f + th);
            float dgelu = 0.5f * (1.0f + th) +
                          0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
            dg[j] = d[j] * u[j] * dgelu;
            du[j] = d[j] * gelu;
        }
        if constexpr (VEC == 8) {
            st8(dgate + i, dg);
            st8(dup + i, du);
        } else {
            dgate[i] = __float2bfloat16_rn(dg[0]);
            dup[i] = __float2bfloat16_rn(du[0]);
        }
    }
}

void mt_cuda_geglu_forward(bf16 *out, const bf16 *gate, const bf16 *up, size_t n,
                           cudaStream_t s) {
    if (n == 0) return;
    MT_CHECK(out && gate && up, "geglu_forward: NULL tensor");
    if (n % 8 == 0 && mt_aligned16(out) && mt_aligned16(gate) && mt_aligned16(up))
        geglu_forward_kernel<8><<<mt_ew_blocks(n / 8), MT_CUDA_EW_THREADS, 0, s>>>(out, gate, up,
                                                                                 n / 8);
    else
        geglu_forward_kernel<1><<<mt_ew_blocks(n), MT_CUDA_EW_THREADS, 0, s>>>(out, gate, up, n);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_geglu_backward(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate,
                            const bf16 *up, size_t n, cudaStream_t s) {
    if (n == 0) return;
    MT_CHECK(dgate && dup && dout && gate && up, "geglu_backward: NULL tensor");
    if (n % 8 == 0 && mt_aligned16(dgate) && mt_aligned16(dup) && mt_aligned16(dout) &&
        mt_aligned16(gate) && mt_aligned16(up))
        geglu_backward_kernel<8><<<mt_ew_blocks(n / 8), MT_CUDA_EW_THREADS, 0, s>>>(
            dgate, dup, dout, gate, up, n / 8);
    else
        geglu_backward_kernel<1><<<mt_ew_blocks(n), MT_CUDA_EW_THREADS, 0, s>>>(dgate, dup, dout,
                                                                              gate, up, n);
    CUDA_LAUNCH_CHECK();
}
