/* The Gated DeltaNet's output norm (backend.h's gated_rmsnorm_*; the CPU op:
 * src/backend/cpu/gated_rmsnorm.c), transformers' Qwen3_5RMSNormGated: y = w x rstd silu(z),
 * rstd = 1/sqrt(mean(x^2) + eps), a plain weight. One warp a row, bf16 storage, fp32 math.
 * Backward, with n = x rstd and a = silu(z): dz = dy w n silu'(z), dx = rstd dn - x rstd^3/C
 * sum(dn x) with dn = dy w a (one warp a row); dweight += sum_r dy n a by parts of GRMS_ROWS rows
 * (a thread a column and a fixed row subset, the sub-sums in order) added in part order by
 * cuda_vec.cuh's colsum_finish_kernel: no atomics, the same bits every run. dweight NULL skips
 * those two kernels. */
#include "cuda_vec.cuh"
#include "ops.cuh"

#define GRMS_WARPS 8 /* rows a block of the row kernels */
#define GRMS_TY 8
#define GRMS_ROWS 128 /* rows a part of the weight gradient (at least) */
#define GRMS_MAX_PARTS 1024

static __device__ __forceinline__ float sigmoid_(float x) { return 1.0f / (1.0f + expf(-x)); }
static __device__ __forceinline__ float warp_sum_(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __global__ void __launch_bounds__(32 * GRMS_WARPS)
    grms_forward_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *gate,
                        const bf16 *weight, int R, int C, float eps) {
    int r = blockIdx.x * GRMS_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= R) return;
    const bf16 *x = inp + (size_t)r * C, *z = gate + (size_t)r * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float v = __bfloat162float(x[c]);
        ss += v * v;
    }
    float s = 1.0f / sqrtf(warp_sum_(ss) / (float)C + eps);
    if (lane == 0) rstd[r] = s;
    for (int c = lane; c < C; c += 32) {
        float zc = __bfloat162float(z[c]);
        out[(size_t)r * C + c] = __float2bfloat16_rn(__bfloat162float(weight[c]) *
                                                     (__bfloat162float(x[c]) * s) * (zc * sigmoid_(zc)));
    }
}

static __global__ void __launch_bounds__(32 * GRMS_WARPS)
    grms_backward_kernel(bf16 *dinp, bf16 *dgate, const bf16 *dout, const bf16 *inp,
                         const bf16 *gate, const bf16 *weight, const float *rstd, int R, int C) {
    int r = blockIdx.x * GRMS_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= R) return;
    size_t o = (size_t)r * C;
    float s = rstd[r], dot = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float z = __bfloat162float(gate[o + c]), sg = sigmoid_(z), a = z * sg;
        dot += __bfloat162float(dout[o + c]) * __bfloat162float(weight[c]) * a *
               __bfloat162float(inp[o + c]);
    }
    float k = warp_sum_(dot) * s * s * s / (float)C;
    for (int c = lane; c < C; c += 32) {
        float z = __bfloat162float(gate[o + c]), sg = sigmoid_(z), a = z * sg;
        float x = __bfloat162float(inp[o + c]), dy = __bfloat162float(dout[o + c]);
        float w = __bfloat162float(weight[c]), n = x * s;
        dgate[o + c] = __float2bfloat16_rn(dy * w * n * sg * (1.0f + z * (1.0f - sg)));
        dinp[o + c] = __float2bfloat16_rn(s * (dy * w * a) - k * x);
    }
}

/* part (parts, C) = each part's sum over its rows of dy n a. */
static __global__ void __launch_bounds__(32 * GRMS_TY)
    grms_dweight_part_kernel(float *part, const bf16 *dout, const bf16 *inp, const bf16 *gate,
                             const float *rstd, int R, int C, int rows_per_part) {
    __shared__ float red[GRMS_TY][32];
    int tx = threadIdx.x, ty = threadIdx.y, c = blockIdx.x * 32 + tx;
    int r0 = blockIdx.y * rows_per_part, r1 = min(R, r0 + rows_per_part);
    float acc = 0.0f;
    if (c < C)
        for (int r = r0 + ty; r < r1; r += GRMS_TY) {
            size_t i = (size_t)r * C + c;
            float z = __bfloat162float(gate[i]);
            acc += __bfloat162float(dout[i]) * (__bfloat162float(inp[i]) * rstd[r]) * (z * sigmoid_(z));
        }
    red[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && c < C) {
        float sum = red[0][tx];
        for (int t = 1; t < GRMS_TY; t++) sum += red[t][tx];
        part[(size_t)blockIdx.y * C + c] = sum;
    }
}

void mt_cuda_gated_rmsnorm_forward(bf16 *out, float *rstd, const bf16 *inp, const bf16 *gate,
                                   const bf16 *weight, int R, int C, float eps, cudaStream_t s) {
    MT_CHECK(R >= 0 && C > 0, "gated_rmsnorm_forward: R=%d C=%d", R, C);
    if (R == 0) return;
    MT_CHECK(out && rstd && inp && gate && weight, "gated_rmsnorm_forward: NULL tensor");
    grms_forward_kernel<<<(unsigned)((R + GRMS_WARPS - 1) / GRMS_WARPS), 32 * GRMS_WARPS, 0, s>>>(
        out, rstd, inp, gate, weight, R, C, eps);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_gated_rmsnorm_backward(bf16 *dinp, bf16 *dgate, float *dweight, const bf16 *dout,
                                    const bf16 *inp, const bf16 *gate, const bf16 *weight,
                                    const float *rstd, int R, int C, cudaStream_t s) {
    MT_CHECK(R >= 0 && C > 0, "gated_rmsnorm_backward: R=%d C=%d", R, C);
    if (R == 0) return;
    MT_CHECK(dinp && dgate && dout && inp && gate && weight && rstd,
             "gated_rmsnorm_backward: NULL tensor");
    grms_backward_kernel<<<(unsigned)((R + GRMS_WARPS - 1) / GRMS_WARPS), 32 * GRMS_WARPS, 0, s>>>(
        dinp, dgate, dout, inp, gate, weight, rstd, R, C);
    CUDA_LAUNCH_CHECK();
    if (!dweight) return; /* a frozen norm: no weight-gradient kernels */
    int rows = (R + GRMS_MAX_PARTS - 1) / GRMS_MAX_PARTS;
    if (rows < GRMS_ROWS) rows = GRMS_ROWS;
    int parts = (R + rows - 1) / rows;
    float *part = NULL;
    CUDA_CHECK(cudaMallocAsync((void **)&part, (size_t)parts * C * sizeof(float), s));
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)parts), block(32, GRMS_TY);
    grms_dweight_part_kernel<<<grid, block, 0, s>>>(part, dout, inp, gate, rstd, R, C, rows);
    CUDA_LAUNCH_CHECK();
    colsum_finish_kernel<<<(C + 255) / 256, 256, 0, s>>>(dweight, part, parts, C);
    CUDA_LAUNCH_CHECK();
    CUDA_CHECK(cudaFreeAsync(part, s));
}
