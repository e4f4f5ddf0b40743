/* Dequantization of a frozen base weight stored quantized (src/quant) to bf16, before its GEMMs:
 * each value is the fp32 product code value * block scale, rounded once to nearest even, the same
 * bits as mt_nf4_dequantize_bf16 / mt_fp8_dequantize_bf16 on the host (tests/gpu/test_cuda_ops.c).
 *
 * Both kernels decode through a table in shared memory (NF4: bnb's 16 values; FP8: all 256 e4m3
 * values, made by the host's own mt_fp8_e4m3_to_f32), so every lane does the same work whatever
 * its codes. Vector path: a thread reads 8 code bytes in one load and writes 16-byte stores (NF4:
 * 16 values, a quarter of a block; FP8: 8 values, a sixteenth of one); otherwise one byte a
 * thread. Memory-bound: 0.5 (NF4) or 1 (FP8) byte in, 2 bytes out a value.
 *
 * MXFP4 (gpt-oss's experts, quant/mxfp4.h) also transposes: its blocks run along each output row
 * of the checkpoint's [E, out, in] and the table wants [E, in, out]. A thread block of 256 takes a
 * tile of 32 rows x 8 groups of 32 columns of one matrix: warp w group g0 + w, lane i row r0 + i.
 * Each thread reads its block's e8m0 scale and 16 code bytes (one 16-byte load when aligned: the
 * blob's blocks are) and writes its 32 values to out[m][32 g + j][r], j = 0..31; for each j the
 * warp's 32 stores are 32 adjacent bf16 of one output row (64 bytes, coalesced); its 32 loads are
 * 16 bytes each, one row apart, and the tile's 8 warps read each row's 128 contiguous bytes. The
 * value is e2m1 * 2^(s - 127) in fp32 with the host's own operations (mt_mxfp4_value: exact, +-inf
 * past FLT_MAX, s = 255 as 2^127 * 2), then bf16 (exact too). 0.53 bytes in, 2 out a value. */
#include "cuda_vec.cuh"
#include "ops.cuh"
#include "quant/fp8.h"
#include "quant/mxfp4.h"
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

static __constant__ float c_e2m1[16] = MT_MXFP4_E2M1_INIT;

#define MXFP4_TILE_ROWS 32  /* a warp's lanes */
#define MXFP4_TILE_GROUPS 8 /* a block's warps (MT_CUDA_EW_THREADS / 32) */

/* VEC: the 16 code bytes in one 16-byte load (blocks 16-byte aligned); else byte by byte. */
template <bool VEC>
static __global__ void mxfp4_kernel(bf16 *dst, const uint8_t *blocks, const uint8_t *scales,
                                    int64_t mats, int64_t rows, int64_t groups, int64_t row_tiles,
                                    int64_t group_tiles) {
    __shared__ float e2m1[16];
    for (int i = threadIdx.x; i < 16; i += blockDim.x) e2m1[i] = c_e2m1[i];
    __syncthreads();
    const int lane = threadIdx.x % MXFP4_TILE_ROWS, warp = threadIdx.x / MXFP4_TILE_ROWS;
    const int64_t per_mat = row_tiles * group_tiles, tiles = mats * per_mat,
                  cols = groups * MT_MXFP4_BLOCK;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        int64_t m = t / per_mat, rest = t % per_mat;
        int64_t r = (rest / group_tiles) * MXFP4_TILE_ROWS + lane;
        int64_t g = (rest % group_tiles) * MXFP4_TILE_GROUPS + warp;
        if (r >= rows || g >= groups) continue;
        int64_t b = (m * rows + r) * groups + g; /* the block: [m][r][g] */
        uint8_t code[MT_MXFP4_BLOCK_BYTES];
        if (VEC) {
            uint4 u = *reinterpret_cast<const uint4 *>(blocks + b * MT_MXFP4_BLOCK_BYTES);
            memcpy(code, &u, sizeof code);
        } else {
#pragma unroll
            for (int j = 0; j < MT_MXFP4_BLOCK_BYTES; j++) code[j] = blocks[b * MT_MXFP4_BLOCK_BYTES + j];
        }
        unsigned s = scales[b];
        /* 2^(s - 127): s = 0 the subnormal 2^-127; 255 as 2^127, the product then doubled */
        float x = s == 0 ? __int_as_float(0x00400000) : __int_as_float((int)((s == 255 ? 254u : s) << 23));
        bf16 *o = dst + (m * cols + g * MT_MXFP4_BLOCK) * rows + r; /* out[m][32 g][r] */
#pragma unroll
        for (int j = 0; j < MT_MXFP4_BLOCK_BYTES; j++) {
            float lo = e2m1[code[j] & 15u] * x, hi = e2m1[code[j] >> 4] * x; /* low nibble: even */
            if (s == 255) lo *= 2.0f, hi *= 2.0f;
            o[(2 * j) * rows] = __float2bfloat16_rn(lo);
            o[(2 * j + 1) * rows] = __float2bfloat16_rn(hi);
        }
    }
}

void mt_cuda_dequant_mxfp4(bf16 *dst, const uint8_t *blocks, const uint8_t *scales, int64_t mats,
                           int64_t rows, int64_t cols, cudaStream_t s) {
    MT_CHECK(mats >= 0 && rows >= 0 && cols >= 0 && cols % MT_MXFP4_BLOCK == 0,
             "dequant_mxfp4: %lld matrices of %lld x %lld (columns a multiple of %d)", (long long)mats,
             (long long)rows, (long long)cols, MT_MXFP4_BLOCK);
    if (mats == 0 || rows == 0 || cols == 0) return;
    MT_CHECK(dst && blocks && scales, "dequant_mxfp4: NULL tensor");
    static_assert(MXFP4_TILE_ROWS * MXFP4_TILE_GROUPS == MT_CUDA_EW_THREADS, "a warp a group");
    int64_t groups = cols / MT_MXFP4_BLOCK, row_tiles = (rows + MXFP4_TILE_ROWS - 1) / MXFP4_TILE_ROWS,
            group_tiles = (groups + MXFP4_TILE_GROUPS - 1) / MXFP4_TILE_GROUPS,
            tiles = mats * row_tiles * group_tiles;
    unsigned grid = (unsigned)(tiles < MT_CUDA_EW_MAX_BLOCKS ? tiles : MT_CUDA_EW_MAX_BLOCKS);
    if (mt_aligned16(blocks))
        mxfp4_kernel<true><<<grid, MT_CUDA_EW_THREADS, 0, s>>>(dst, blocks, scales, mats, rows, groups,
                                                              row_tiles, group_tiles);
    else
        mxfp4_kernel<false><<<grid, MT_CUDA_EW_THREADS, 0, s>>>(dst, blocks, scales, mats, rows, groups,
                                                               row_tiles, group_tiles);
    CUDA_LAUNCH_CHECK();
}
