/* Gemma 4's per-expert gate scale on CUDA, as the CPU's moe_scale.c (backend.h
 * moe_expert_scale_*): each token's k routing weights times its chosen experts' per_expert_scale
 * (bf16 on the device, read in fp32), and the backward. Letters as moe.cu: n tokens, k choices,
 * assignment a = t*k + j.
 *
 * d_scale (E) += sum of d_out * w over each expert's assignments. The op is not told E, so a
 * one-block kernel first finds the largest expert id, then one block per expert id (grid-stride
 * over the ids up to it) scans every assignment: each thread sums a fixed subset in assignment
 * order, and the block adds the threads' sums in a fixed tree. No float atomics: the same bits
 * every run, whatever the grid. It reads top_idx once per expert (n*k*E int32 reads, from L2 at
 * the sizes the model passes); the per-element products are read only where they match. */
#include "cuda_vec.cuh"
#include "ops.cuh"

#define SCALE_THREADS 512 /* threads of the reduction kernels (a power of two) */
#define SCALE_BLOCKS 256  /* blocks over the expert ids (each loops when there are more) */

/* w_out = w * scale[idx], one thread an assignment. */
static __global__ void expert_scale_kernel(float *out, const float *in, const int32_t *idx,
                                           const bf16 *scale, size_t nk) {
    for (size_t a = blockIdx.x * (size_t)blockDim.x + threadIdx.x; a < nk;
         a += (size_t)gridDim.x * blockDim.x)
        out[a] = in[a] * __bfloat162float(scale[idx[a]]);
}

/* *emax = 1 + the largest id in idx (nk > 0). */
static __global__ void __launch_bounds__(SCALE_THREADS)
    max_id_kernel(int32_t *emax, const int32_t *idx, size_t nk) {
    __shared__ int32_t red[SCALE_THREADS];
    int32_t m = 0;
    for (size_t a = threadIdx.x; a < nk; a += SCALE_THREADS) m = max(m, idx[a]);
    red[threadIdx.x] = m;
    __syncthreads();
    for (int o = SCALE_THREADS / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) red[threadIdx.x] = max(red[threadIdx.x], red[threadIdx.x + o]);
        __syncthreads();
    }
    if (threadIdx.x == 0) *emax = red[0] + 1;
}

/* d_scale[e] += sum over a with idx[a] == e of d_out[a] * w[a], for e < *emax. An expert with no
 * assignment is left as it is (no += 0, as the CPU). */
static __global__ void __launch_bounds__(SCALE_THREADS)
    expert_scale_grad_kernel(float *d_scale, const float *d_out, const float *w,
                             const int32_t *idx, const int32_t *emax, size_t nk) {
    __shared__ float red[SCALE_THREADS];
    __shared__ int hit[SCALE_THREADS];
    const int E = *emax;
    for (int e = blockIdx.x; e < E; e += gridDim.x) {
        float s = 0.0f;
        int any = 0;
        for (size_t a = threadIdx.x; a < nk; a += SCALE_THREADS)
            if (idx[a] == e) {
                s += d_out[a] * w[a];
                any = 1;
            }
        red[threadIdx.x] = s;
        hit[threadIdx.x] = any;
        __syncthreads();
        for (int o = SCALE_THREADS / 2; o > 0; o >>= 1) {
            if (threadIdx.x < o) {
                red[threadIdx.x] += red[threadIdx.x + o];
                hit[threadIdx.x] |= hit[threadIdx.x + o];
            }
            __syncthreads();
        }
        if (threadIdx.x == 0 && hit[0]) d_scale[e] += red[0];
        __syncthreads(); /* red and hit are reused by the next id */
    }
}

void mt_cuda_moe_expert_scale_forward(float *w_out, const float *w, const int32_t *top_idx,
                                      const bf16 *scale, int n, int k, cudaStream_t s) {
    MT_CHECK(n >= 0 && k > 0, "moe_expert_scale_forward: n=%d k=%d", n, k);
    size_t nk = (size_t)n * k;
    if (nk == 0) return;
    MT_CHECK(w_out && w && top_idx && scale, "moe_expert_scale_forward: NULL tensor");
    expert_scale_kernel<<<mt_ew_blocks(nk), MT_CUDA_EW_THREADS, 0, s>>>(w_out, w, top_idx, scale,
                                                                       nk);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_moe_expert_scale_backward(float *d_w, float *d_scale, const float *d_out,
                                       const float *w, const int32_t *top_idx, const bf16 *scale,
                                       int n, int k, cudaStream_t s) {
    MT_CHECK(n >= 0 && k > 0, "moe_expert_scale_backward: n=%d k=%d", n, k);
    size_t nk = (size_t)n * k;
    if (nk == 0) return;
    MT_CHECK(d_w && d_out && top_idx && scale && (!d_scale || w),
             "moe_expert_scale_backward: NULL tensor");
    /* d_w = d_out * scale[idx]: the forward's product with d_out in place of w (d_w must not alias
     * d_out, whose values d_scale still reads: as on the CPU) */
    expert_scale_kernel<<<mt_ew_blocks(nk), MT_CUDA_EW_THREADS, 0, s>>>(d_w, d_out, top_idx, scale,
                                                                       nk);
    CUDA_LAUNCH_CHECK();
    if (!d_scale) return; /* a frozen router: no work */
    int32_t *emax = NULL;
    CUDA_CHECK(cudaMallocAsync((void **)&emax, sizeof(int32_t), s));
    max_id_kernel<<<1, SCALE_THREADS, 0, s>>>(emax, top_idx, nk);
    CUDA_LAUNCH_CHECK();
    expert_scale_grad_kernel<<<SCALE_BLOCKS, SCALE_THREADS, 0, s>>>(d_scale, d_out, w, top_idx,
                                                                    emax, nk);
    CUDA_LAUNCH_CHECK();
    CUDA_CHECK(cudaFreeAsync(emax, s));
}
