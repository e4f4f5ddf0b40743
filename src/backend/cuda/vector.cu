/* fp32 vector helpers the engine uses on gradients: the sum of squares (global norm) and the
 * conversion to bf16 (round to nearest even, NaN stays NaN).
 *
 * sumsq is deterministic: a grid fixed by n alone, each thread summing a fixed strided subset in
 * double, a fixed tree in each block, then one block adding the block partials in a fixed order and
 * adding the total to out[0] (no atomics). */
#include "cuda_vec.cuh"
#include "ops.cuh"

#define SUMSQ_THREADS 256
#define SUMSQ_MAX_BLOCKS 1024

static __device__ double block_sum(double v, double *sh) {
    int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (t < w) sh[t] += sh[t + w];
        __syncthreads();
    }
    return sh[0];
}

template <int VEC>
static __global__ void __launch_bounds__(SUMSQ_THREADS)
    sumsq_part_kernel(double *part, const float *x, size_t groups) {
    __shared__ double sh[SUMSQ_THREADS];
    double acc = 0.0;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < groups;
         t += (size_t)gridDim.x * blockDim.x) {
        if (VEC == 4) {
            float4 v = reinterpret_cast<const float4 *>(x)[t];
            acc += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
        } else {
            double v = x[t];
            acc += v * v;
        }
    }
    double s = block_sum(acc, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

static __global__ void __launch_bounds__(SUMSQ_THREADS)
    sumsq_finish_kernel(float *out, const double *part, int parts) {
    __shared__ double sh[SUMSQ_THREADS];
    double acc = 0.0;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) acc += part[i];
    double s = block_sum(acc, sh);
    if (threadIdx.x == 0) out[0] = (float)((double)out[0] + s);
}

void mt_cuda_sumsq(float *out, const float *x, size_t n, cudaStream_t s) {
    MT_CHECK(out, "sumsq: NULL out");
    if (n == 0) return;
    MT_CHECK(x, "sumsq: NULL x");
    int vec = n % 4 == 0 && mt_aligned16(x) ? 4 : 1;
    size_t groups = n / vec;
    size_t blocks = (groups + SUMSQ_THREADS - 1) / SUMSQ_THREADS;
    if (blocks > SUMSQ_MAX_BLOCKS) blocks = SUMSQ_MAX_BLOCKS;
    double *part = NULL;
    CUDA_CHECK(cudaMallocAsync((void **)&part, blocks * sizeof(double), s));
    if (vec == 4) sumsq_part_kernel<4><<<(unsigned)blocks, SUMSQ_THREADS, 0, s>>>(part, x, groups);
    else sumsq_part_kernel<1><<<(unsigned)blocks, SUMSQ_THREADS, 0, s>>>(part, x, groups);
    CUDA_LAUNCH_CHECK();
    sumsq_finish_kernel<<<1, SUMSQ_THREADS, 0, s>>>(out, part, (int)blocks);
    CUDA_LAUNCH_CHECK();
    CUDA_CHECK(cudaFreeAsync(part, s));
}

template <int VEC>
static __global__ void from_f32_kernel(bf16 *dst, const float *src, size_t groups) {
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < groups;
         t += (size_t)gridDim.x * blockDim.x) {
        if (VEC == 8) {
            const float4 *p = reinterpret_cast<const float4 *>(src) + 2 * t;
            float4 a = p[0], b = p[1];
            float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            st8(dst + 8 * t, f); /* __floats2bfloat162_rn: round to nearest even */
        } else {
            dst[t] = __float2bfloat16_rn(src[t]);
        }
    }
}

void mt_cuda_from_f32(bf16 *dst, const float *src, size_t n, cudaStream_t s) {
    if (n == 0) return;
    MT_CHECK(dst && src, "from_f32: NULL tensor");
    if (n % 8 == 0 && mt_aligned16(dst) && mt_aligned16(src))
        from_f32_kernel<8><<<mt_ew_blocks(n / 8), MT_CUDA_EW_THREADS, 0, s>>>(dst, src, n / 8);
    else
        from_f32_kernel<1><<<mt_ew_blocks(n), MT_CUDA_EW_THREADS, 0, s>>>(dst, src, n);
    CUDA_LAUNCH_CHECK();
}
