/* Dequantization of a frozen base weight stored quantized (src/quant) to bf16, before its GEMMs:
 * each value is the fp32 product code value * block scale, rounded once to nearest even, the same
 * bits as mt_nf4_dequantize_bf16 / mt_fp8_dequantize_bf16 on the host (tests/gpu/test_cuda_ops.c).
 *
 * Both kernels decode through a table in shared memory (NF4: bnb's 16 values; FP8: all 256 e4m3
 * values, made by the host's own mt_fp8_e4m3_to_f32), so every lane does the same work whatever
 * its codes. Vector path: a thread reads 8 code bytes in one load and writes 16-byte stores (NF4:
 * 16 values, a quarter of a block; FP8: 8 values, a sixteenth of one); otherwise one byte a
 * thread. Memory-bound: 0.5 (NF4) or 1 (FP8) byte in, 2 bytes out a value. */
#include "cuda_vec.cuh"
#include "ops.cuh"
#include "quant/fp8.h"
#include "quant/nf4.h"

static __constant__ float c_nf4_code[16] = MT_NF4_CODE_INIT;

static __device__ __forceinline__ void nf4_table(float *t) {
    for (int i = threadIdx.x; i < 16; i += blockDim.x) t[i] = c_nf4_code[i];
    __syncthreads();
}

/* VEC 16: thread g handles bytes [8g, 8g + 8) = values [16g, 16g + 16), in block g / 4;
 * VEC 2: thread g handles byte g = values 2g, 2g + 1, in block g / 32. */
template <int VEC>
static __global__ void nf4_kernel(bf16 *dst, const uint8_t *codes, const float *absmax,
                                  size_t groups) {
    __shared__ float code[16];
    nf4_table(code);
    for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < groups;
         g += (size_t)gridDim.x * blockDim.x) {
        if (VEC == 16) {
            uint2 u = reinterpret_cast<const uint2 *>(codes)[g];
            const uint8_t *b = reinterpret_cast<const uint8_t *>(&u);
            float s = absmax[g / 4], f[16];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                f[2 * j] = code[b[j] >> 4] * s; /* element 2j: the high nibble */
                f[2 * j + 1] = code[b[j] & 15] * s;
            }
            st8(dst + 16 * g, f);
            st8(dst + 16 * g + 8, f + 8);
        } else {
            uint8_t b = codes[g];
            float s = absmax[g / 32];
            dst[2 * g] = __float2bfloat16_rn(code[b >> 4] * s);
            dst[2 * g + 1] = __float2bfloat16_rn(code[b & 15] * s);
        }
    }
}

void mt_cuda_dequant_nf4(bf16 *dst, const uint8_t *codes, const float *absmax, size_t n,
                         cudaStream_t s) {
    MT_CHECK(n % MT_NF4_BLOCK == 0, "dequant_nf4: %zu values, not a multiple of %d", n,
             MT_NF4_BLOCK);
    if (n == 0) return;
    MT_CHECK(dst && codes && absmax, "dequant_nf4: NULL tensor");
    if (((uintptr_t)codes & 7u) == 0 && mt_aligned16(dst))
        nf4_kernel<16><<<mt_ew_blocks(n / 16), MT_CUDA_EW_THREADS, 0, s>>>(dst, codes, absmax,
                                                                           n / 16);
    else
        nf4_kernel<2><<<mt_ew_blocks(n / 2), MT_CUDA_EW_THREADS, 0, s>>>(dst, codes, absmax,
                                                                         n / 2);
    CUDA_LAUNCH_CHECK();
}

/* VEC 8: thread g handles values [8g, 8g + 8), in block g / 16; VEC 1: value g, block g / 128. */
template <int VEC>
static __global__ void fp8_kernel(bf16 *dst, const uint8_t *q, const float *scales,
                                  size_t groups) {
    __shared__ float value[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) value[i] = mt_fp8_e4m3_to_f32((uint8_t)i);
    __syncthreads();
    for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < groups;
         g += (size_t)gridDim.x * blockDim.x) {
        if (VEC == 8) {
            uint2 u = reinterpret_cast<const uint2 *>(q)[g];
            const uint8_t *b = reinterpret_cast<const uint8_t *>(&u);
            float s = scales[g / 16], f[8];
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = value[b[j]] * s;
            st8(dst + 8 * g, f);
        } else {
            dst[g] = __float2bfloat16_rn(value[q[g]] * scales[g / MT_FP8_BLOCK]);
        }
    }
}

void mt_cuda_dequant_fp8(bf16 *dst, const uint8_t *q, const float *scales, size_t n,
                         cudaStream_t s) {
    MT_CHECK(n % MT_FP8_BLOCK == 0, "dequant_fp8: %zu values, not a multiple of %d", n,
             MT_FP8_BLOCK);
    if (n == 0) return;
    MT_CHECK(dst && q && scales, "dequant_fp8: NULL tensor");
    if (((uintptr_t)q & 7u) == 0 && mt_aligned16(dst))
        fp8_kernel<8><<<mt_ew_blocks(n / 8), MT_CUDA_EW_THREADS, 0, s>>>(dst, q, scales, n / 8);
    else
        fp8_kernel<1><<<mt_ew_blocks(n), MT_CUDA_EW_THREADS, 0, s>>>(dst, q, scales, n);
    CUDA_LAUNCH_CHECK();
}
