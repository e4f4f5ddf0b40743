/* SwiGLU's elementwise part, silu(gate) * up, its gradient, the residual add and scale. fp32 math with
 * the accurate expf; grid-stride loops over 8-element (16-byte) groups when n % 8 == 0 and the
 * pointers are 16-byte aligned, else over single elements. */
#include "cuda_vec.cuh"
#include "ops.cuh"

static __device__ __forceinline__ float sigmoidf_(float g) { return 1.0f / (1.0f + expf(-g)); }

template <int VEC>
static __global__ void swiglu_forward_kernel(bf16 *out, const bf16 *gate, const bf16 *up,
                                             size_t groups) {
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < groups;
         t += (size_t)gridDim.x * blockDim.x) {
        size_t i = t * VEC;
        if (VEC == 8) {
            float g[8], u[8], o[8];
            ld8(gate + i, g);
            ld8(up + i, u);
#pragma unroll
            for (int j = 0; j < 8; j++) o[j] = g[j] * sigmoidf_(g[j]) * u[j];
            st8(out + i, o);
        } else {
            float g = __bfloat162float(gate[i]);
            out[i] = __float2bfloat16_rn(g * sigmoidf_(g) * __bfloat162float(up[i]));
        }
    }
}

/* d silu(g)/dg = sig * (1 + g * (1 - sig)). */
template <int VEC>
static __global__ void swiglu_backward_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout,
                                              const bf16 *gate, const bf16 *up, size_t groups) {
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < groups;
         t += (size_t)gridDim.x * blockDim.x) {
        size_t i = t * VEC;
        if (VEC == 8) {
            float g[8], u[8], d[8], dg[8], du[8];
            ld8(gate + i, g);
            ld8(up + i, u);
            ld8(dout + i, d);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float sig = sigmoidf_(g[j]);
                dg[j] = d[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig));
                du[j] = d[j] * (g[j] * sig);
            }
            st8(dgate + i, dg);
            st8(dup + i, du);
        } else {
            float g = __bfloat162float(gate[i]), u = __bfloat162float(up[i]);
            float d = __bfloat162float(dout[i]);
            float sig = sigmoidf_(g);
            dgate[i] = __float2bfloat16_rn(d * u * sig * (1.0f + g * (1.0f - sig)));
            dup[i] = __float2bfloat16_rn(d * (g * sig));
        }
    }
}

/* out may alias a or b: each thread reads its elements before writing them. */
template <int VEC>
static __global__ void add_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t groups) {
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < groups;
         t += (size_t)gridDim.x * blockDim.x) {
        size_t i = t * VEC;
        if (VEC == 8) {
            float x[8], y[8];
            ld8(a + i, x);
            ld8(b + i, y);
#pragma unroll
            for (int j = 0; j < 8; j++) x[j] += y[j];
            st8(out + i, x);
        } else {
            out[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
        }
    }
}

/* x *= s: one fp32 product an element, rounded once to bf16. */
template <int VEC>
static __global__ void scale_kernel(bf16 *x, float s, size_t groups) {
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < groups;
         t += (size_t)gridDim.x * blockDim.x) {
        size_t i = t * VEC;
        if (VEC == 8) {
            float v[8];
            ld8(x + i, v);
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] *= s;
            st8(x + i, v);
        } else {
            x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * s);
        }
    }
}

void mt_cuda_swiglu_forward(bf16 *out, const bf16 *gate, const bf16 *up, size_t n,
                            cudaStream_t s) {
    if (n == 0) return;
    MT_CHECK(out && gate && up, "swiglu_forward: NULL tensor");
    if (n % 8 == 0 && mt_aligned16(out) && mt_aligned16(gate) && mt_aligned16(up))
        swiglu_forward_kernel<8><<<mt_ew_blocks(n / 8), MT_CUDA_EW_THREADS, 0, s>>>(out, gate, up, n / 8);
    else
        swiglu_forward_kernel<1><<<mt_ew_blocks(n), MT_CUDA_EW_THREADS, 0, s>>>(out, gate, up, n);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_swiglu_backward(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate,
                             const bf16 *up, size_t n, cudaStream_t s) {
    if (n == 0) return;
    MT_CHECK(dgate && dup && dout && gate && up, "swiglu_backward: NULL tensor");
    if (n % 8 == 0 && mt_aligned16(dgate) && mt_aligned16(dup) && mt_aligned16(dout) &&
        mt_aligned16(gate) && mt_aligned16(up))
        swiglu_backward_kernel<8><<<mt_ew_blocks(n / 8), MT_CUDA_EW_THREADS, 0, s>>>(
            dgate, dup, dout, gate, up, n / 8);
    else
        swiglu_backward_kernel<1><<<mt_ew_blocks(n), MT_CUDA_EW_THREADS, 0, s>>>(dgate, dup, dout,
                                                                               gate, up, n);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_add(bf16 *out, const bf16 *a, const bf16 *b, size_t n, cudaStream_t s) {
    if (n == 0) return;
    MT_CHECK(out && a && b, "add: NULL tensor");
    if (n % 8 == 0 && mt_aligned16(out) && mt_aligned16(a) && mt_aligned16(b))
        add_kernel<8><<<mt_ew_blocks(n / 8), MT_CUDA_EW_THREADS, 0, s>>>(out, a, b, n / 8);
    else
        add_kernel<1><<<mt_ew_blocks(n), MT_CUDA_EW_THREADS, 0, s>>>(out, a, b, n);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_scale(bf16 *x, float s, size_t n, cudaStream_t st) {
    if (n == 0) return;
    MT_CHECK(x, "scale: NULL tensor");
    if (n % 8 == 0 && mt_aligned16(x))
        scale_kernel<8><<<mt_ew_blocks(n / 8), MT_CUDA_EW_THREADS, 0, st>>>(x, s, n / 8);
    else
        scale_kernel<1><<<mt_ew_blocks(n), MT_CUDA_EW_THREADS, 0, st>>>(x, s, n);
    CUDA_LAUNCH_CHECK();
}
