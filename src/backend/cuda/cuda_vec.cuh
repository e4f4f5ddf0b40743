/* Helpers the elementwise and row kernels share: 16-byte loads and stores of 8 bf16 with fp32
 * math, the alignment test that picks the vector path, and the deterministic column sum used by
 * the rmsnorm weight gradient and the matmul bias gradient. Header-only; everything static. */
#ifndef MT_CUDA_VEC_CUH
#define MT_CUDA_VEC_CUH

#include "cuda_common.cuh"

/* Threads per block of the elementwise kernels, and the grid cap of their grid-stride loops. */
#define MT_CUDA_EW_THREADS 256
#define MT_CUDA_EW_MAX_BLOCKS 4096

static inline int mt_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

static inline unsigned mt_ew_blocks(size_t work) {
    size_t b = (work + MT_CUDA_EW_THREADS - 1) / MT_CUDA_EW_THREADS;
    if (b < 1) b = 1;
    if (b > MT_CUDA_EW_MAX_BLOCKS) b = MT_CUDA_EW_MAX_BLOCKS;
    return (unsigned)b;
}

/* 8 bf16 <-> 8 fp32 through one 16-byte access; p must be 16-byte aligned. */
static __device__ __forceinline__ void ld8(const bf16 *p, float f[8]) {
    uint4 u = *reinterpret_cast<const uint4 *>(p);
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
static __device__ __forceinline__ void st8(bf16 *p, const float f[8]) {
    uint4 u;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    *reinterpret_cast<uint4 *>(p) = u;
}

/* ---- deterministic column sums ----
 * out[c] += sum_r f(r, c) over R rows of width C, where f = src[r,c] (x == NULL) or
 * src[r,c] * x[r,c] * scale[r]. Rows are cut into fixed parts of COLSUM_ROWS rows (independent of the
 * device); a block (32 x COLSUM_TY threads) sums one part for 32*VEC columns, each thread a fixed
 * row subset in order, the COLSUM_TY sub-sums are added in order, and the parts' partials are added
 * in part order by a second kernel. No atomics: the same bits on every run. */
#define COLSUM_TY 8
#define COLSUM_ROWS 64
#define COLSUM_MAX_PARTS 256

template <int VEC, bool SCALED>
static __global__ void __launch_bounds__(32 * COLSUM_TY)
    colsum_part_kernel(float *dst, int add_into, const bf16 *src, const bf16 *x,
                       const float *scale, int R, int C, int rows_per_part) {
    __shared__ float red[COLSUM_TY][32 * VEC];
    int tx = threadIdx.x, ty = threadIdx.y;
    int c0 = (blockIdx.x * 32 + tx) * VEC;
    int r0 = blockIdx.y * rows_per_part;
    int r1 = min(R, r0 + rows_per_part);
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; j++) acc[j] = 0.0f;
    if (c0 < C) {
        for (int r = r0 + ty; r < r1; r += COLSUM_TY) {
            size_t off = (size_t)r * C + c0;
            if (VEC == 8) {
                float a[8];
                ld8(src + off, a);
                if (SCALED) {
                    float b[8];
                    ld8(x + off, b);
                    float s = scale[r];
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[j] += a[j] * b[j] * s;
                } else {
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[j] += a[j];
                }
            } else {
                float a = __bfloat162float(src[off]);
                if (SCALED) acc[0] += a * __bfloat162float(x[off]) * scale[r];
                else acc[0] += a;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < VEC; j++) red[ty][tx * VEC + j] = acc[j];
    __syncthreads();
    /* the block's 32*VEC columns, summed over ty in order */
    for (int i = ty * 32 + tx; i < 32 * VEC; i += 32 * COLSUM_TY) {
        int c = blockIdx.x * 32 * VEC + i;
        if (c >= C) continue;
        float s = red[0][i];
#pragma unroll
        for (int t = 1; t < COLSUM_TY; t++) s += red[t][i];
        if (add_into) dst[c] += s;
        else dst[(size_t)blockIdx.y * C + c] = s;
    }
}

static __global__ void colsum_finish_kernel(float *out, const float *part, int parts, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int p = 0; p < parts; p++) s += part[(size_t)p * C + c];
    out[c] += s;
}

/* out (C) += column sums as above; x and scale both NULL or both set. */
static inline void mt_cuda_colsum(float *out, const bf16 *src, const bf16 *x, const float *scale,
                                  int R, int C, cudaStream_t s) {
    if (R <= 0 || C <= 0) return;
    int rows_per_part = COLSUM_ROWS;
    int parts = (R + rows_per_part - 1) / rows_per_part;
    if (parts > COLSUM_MAX_PARTS) {
        parts = COLSUM_MAX_PARTS;
        rows_per_part = (R + parts - 1) / parts;
        parts = (R + rows_per_part - 1) / rows_per_part;
    }
    int vec = C % 8 == 0 && mt_aligned16(src) && (!x || mt_aligned16(x)) ? 8 : 1;
    dim3 block(32, COLSUM_TY);
    dim3 grid((unsigned)((C + 32 * vec - 1) / (32 * vec)), (unsigned)parts);
    float *part = NULL;
    float *dst = out;
    int add_into = parts == 1;
    if (!add_into) {
        CUDA_CHECK(cudaMallocAsync((void **)&part, (size_t)parts * C * sizeof(float), s));
        dst = part;
    }
    if (vec == 8) {
        if (x) colsum_part_kernel<8, true><<<grid, block, 0, s>>>(dst, add_into, src, x, scale, R, C, rows_per_part);
        else colsum_part_kernel<8, false><<<grid, block, 0, s>>>(dst, add_into, src, x, scale, R, C, rows_per_part);
    } else {
        if (x) colsum_part_kernel<1, true><<<grid, block, 0, s>>>(dst, add_into, src, x, scale, R, C, rows_per_part);
        else colsum_part_kernel<1, false><<<grid, block, 0, s>>>(dst, add_into, src, x, scale, R, C, rows_per_part);
    }
    CUDA_LAUNCH_CHECK();
    if (!add_into) {
        colsum_finish_kernel<<<(C + 255) / 256, 256, 0, s>>>(out, part, parts, C);
        CUDA_LAUNCH_CHECK();
        CUDA_CHECK(cudaFreeAsync(part, s));
    }
}

#endif
