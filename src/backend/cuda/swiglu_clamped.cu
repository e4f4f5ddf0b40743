/* gpt-oss's clamped SwiGLU (transformers' GptOssExperts._apply_gate) and its gradient: the CPU's
 * swiglu_clamped.c in fp32 with the accurate expf, bf16 in and out. gate_up (R, 2F) holds gate j
 * in column 2j and up j in 2j+1, so element i of the (R, F) output reads gate_up[2i], [2i+1]
 * across the whole tensor. The clamps are the CPU's ternaries, not fminf/fmaxf, so that a NaN
 * passes through as it does there. Grid-stride loops over 8 outputs (16 inputs: two 16-byte
 * loads) when R*F % 8 == 0 and the pointers are 16-byte aligned, else over single outputs. */
#include "cuda_vec.cuh"
#include "ops.cuh"

static __device__ __forceinline__ float clamp_gate(float g, float limit) {
    return g > limit ? limit : g;
}
static __device__ __forceinline__ float clamp_up(float u, float limit) {
    return u > limit ? limit : u < -limit ? -limit : u;
}

template <int VEC>
static __global__ void swiglu_clamped_forward_kernel(bf16 *out, const bf16 *gate_up, float alpha,
                                                     float limit, size_t groups) {
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < groups;
         t += (size_t)gridDim.x * blockDim.x) {
        size_t i = t * VEC;
        float gu[2 * VEC], o[VEC];
        if constexpr (VEC == 8) {
            ld8(gate_up + 2 * i, gu);
            ld8(gate_up + 2 * i + 8, gu + 8);
        } else {
            gu[0] = __bfloat162float(gate_up[2 * i]);
            gu[1] = __bfloat162float(gate_up[2 * i + 1]);
        }
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            float g = clamp_gate(gu[2 * j], limit), u = clamp_up(gu[2 * j + 1], limit);
            float sig = 1.0f / (1.0f + expf(-alpha * g));
            o[j] = (u + 1.0f) * g * sig;
        }
        if constexpr (VEC == 8) st8(out + i, o);
        else out[i] = __float2bfloat16_rn(o[0]);
    }
}

/* d/dg [g sigmoid(a g)] = sig (1 + a g (1 - sig)); where a clamp acted (g0 > limit, |u0| > limit)
 * that input gets 0, the bounds themselves pass (torch.clamp). The gate's gradient uses the
 * clamped up, as the CPU does. */
template <int VEC>
static __global__ void swiglu_clamped_backward_kernel(bf16 *dgate_up, const bf16 *dout,
                                                      const bf16 *gate_up, float alpha,
                                                      float limit, size_t groups) {
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < groups;
         t += (size_t)gridDim.x * blockDim.x) {
        size_t i = t * VEC;
        float gu[2 * VEC], d[VEC], dgu[2 * VEC];
        if constexpr (VEC == 8) {
            ld8(gate_up + 2 * i, gu);
            ld8(gate_up + 2 * i + 8, gu + 8);
            ld8(dout + i, d);
        } else {
            gu[0] = __bfloat162float(gate_up[2 * i]);
            gu[1] = __bfloat162float(gate_up[2 * i + 1]);
            d[0] = __bfloat162float(dout[i]);
        }
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            float g0 = gu[2 * j], u0 = gu[2 * j + 1];
            float g = clamp_gate(g0, limit), u = clamp_up(u0, limit);
            float sig = 1.0f / (1.0f + expf(-alpha * g));
            float glu = g * sig;
            float dg = d[j] * (u + 1.0f) * sig * (1.0f + alpha * g * (1.0f - sig));
            dgu[2 * j] = g0 > limit ? 0.0f : dg;
            dgu[2 * j + 1] = (u0 > limit || u0 < -limit) ? 0.0f : d[j] * glu;
        }
        if constexpr (VEC == 8) {
            st8(dgate_up + 2 * i, dgu);
            st8(dgate_up + 2 * i + 8, dgu + 8);
        } else {
            dgate_up[2 * i] = __float2bfloat16_rn(dgu[0]);
            dgate_up[2 * i + 1] = __float2bfloat16_rn(dgu[1]);
        }
    }
}

void mt_cuda_swiglu_clamped_forward(bf16 *out, const bf16 *gate_up, int R, int F, float alpha,
                                    float limit, cudaStream_t s) {
    MT_CHECK(R >= 0 && F >= 0, "swiglu_clamped_forward: R=%d F=%d", R, F);
    size_t n = (size_t)R * F;
    if (n == 0) return;
    MT_CHECK(out && gate_up, "swiglu_clamped_forward: NULL tensor");
    if (n % 8 == 0 && mt_aligned16(out) && mt_aligned16(gate_up))
        swiglu_clamped_forward_kernel<8><<<mt_ew_blocks(n / 8), MT_CUDA_EW_THREADS, 0, s>>>(
            out, gate_up, alpha, limit, n / 8);
    else
        swiglu_clamped_forward_kernel<1><<<mt_ew_blocks(n), MT_CUDA_EW_THREADS, 0, s>>>(
            out, gate_up, alpha, limit, n);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_swiglu_clamped_backward(bf16 *dgate_up, const bf16 *dout, const bf16 *gate_up, int R,
                                     int F, float alpha, float limit, cudaStream_t s) {
    MT_CHECK(R >= 0 && F >= 0, "swiglu_clamped_backward: R=%d F=%d", R, F);
    size_t n = (size_t)R * F;
    if (n == 0) return;
    MT_CHECK(dgate_up && dout && gate_up, "swiglu_clamped_backward: NULL tensor");
    if (n % 8 == 0 && mt_aligned16(dgate_up) && mt_aligned16(dout) && mt_aligned16(gate_up))
        swiglu_clamped_backward_kernel<8><<<mt_ew_blocks(n / 8), MT_CUDA_EW_THREADS, 0, s>>>(
            dgate_up, dout, gate_up, alpha, limit, n / 8);
    else
        swiglu_clamped_backward_kernel<1><<<mt_ew_blocks(n), MT_CUDA_EW_THREADS, 0, s>>>(
            dgate_up, dout, gate_up, alpha, limit, n);
    CUDA_LAUNCH_CHECK();
}
