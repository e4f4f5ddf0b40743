/* Gemma 4's elementwise ops on CUDA, as the CPU's softcap.c: the final logits' soft-cap,
 * cap * tanh(x / cap) in place, and the scale by the per-layer scalar held as a one-element tensor
 * on the device (layer_scalar). fp32 math with the accurate tanhf, each result rounded once to
 * bf16; grid-stride loops over 8-element (16-byte) groups when n % 8 == 0 and the pointers are
 * 16-byte aligned, else over single elements (as swiglu.cu). */
#include "cuda_vec.cuh"
#include "ops.cuh"

template <int VEC>
static __global__ void softcap_kernel(bf16 *x, float cap, size_t groups) {
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < groups;
         t += (size_t)gridDim.x * blockDim.x) {
        size_t i = t * VEC;
        float v[VEC];
        if constexpr (VEC == 8) ld8(x + i, v);
        else v[0] = __bfloat162float(x[i]);
#pragma unroll
        for (int j = 0; j < VEC; j++) v[j] = cap * tanhf(v[j] / cap); /* the CPU's order */
        if constexpr (VEC == 8) st8(x + i, v);
        else x[i] = __float2bfloat16_rn(v[0]);
    }
}

/* s is read on the device (no sync to fetch it); every thread reads the same element. */
template <int VEC>
static __global__ void scale_by_kernel(bf16 *out, const bf16 *x, const bf16 *s, size_t groups) {
    const float k = __bfloat162float(s[0]);
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < groups;
         t += (size_t)gridDim.x * blockDim.x) {
        size_t i = t * VEC;
        float v[VEC];
        if constexpr (VEC == 8) ld8(x + i, v);
        else v[0] = __bfloat162float(x[i]);
#pragma unroll
        for (int j = 0; j < VEC; j++) v[j] *= k;
        if constexpr (VEC == 8) st8(out + i, v);
        else out[i] = __float2bfloat16_rn(v[0]);
    }
}

void mt_cuda_softcap(bf16 *x, float cap, size_t n, cudaStream_t s) {
    if (n == 0) return;
    MT_CHECK(x, "softcap: NULL tensor");
    MT_CHECK(cap > 0, "softcap: cap %g (must be > 0)", cap);
    if (n % 8 == 0 && mt_aligned16(x))
        softcap_kernel<8><<<mt_ew_blocks(n / 8), MT_CUDA_EW_THREADS, 0, s>>>(x, cap, n / 8);
    else
        softcap_kernel<1><<<mt_ew_blocks(n), MT_CUDA_EW_THREADS, 0, s>>>(x, cap, n);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_scale_by(bf16 *out, const bf16 *x, const bf16 *sc, size_t n, cudaStream_t s) {
    if (n == 0) return;
    MT_CHECK(out && x && sc, "scale_by: NULL tensor");
    /* out == x (in place) is fine: each element is read before it is written, by one thread */
    if (n % 8 == 0 && mt_aligned16(out) && mt_aligned16(x))
        scale_by_kernel<8><<<mt_ew_blocks(n / 8), MT_CUDA_EW_THREADS, 0, s>>>(out, x, sc, n / 8);
    else
        scale_by_kernel<1><<<mt_ew_blocks(n), MT_CUDA_EW_THREADS, 0, s>>>(out, x, sc, n);
    CUDA_LAUNCH_CHECK();
}
