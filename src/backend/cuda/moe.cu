/* Mixture-of-experts routing on the GPU: the launchers mirror src/backend/cpu/moe.c argument for
 * argument (bf16 for the compute dtype, fp32 math). Every result is deterministic: integer atomics
 * only (the selection counts and the grouping histogram), sums in a fixed order. Letters: n
 * tokens, E experts, k choices; assignment a = t*k + j; grouped rows sorted by expert, then a.
 * One warp per token for the router's softmax/top-k and its backward (E up to a few thousand, k
 * small), one block per expert for the stable grouping, grid-stride loops for the row copies. */
#include <stdlib.h>
#include <string.h>

#include "cuda_vec.cuh"
#include "ops.cuh"

#define MOE_WARPS 8 /* warps (tokens) per block of the per-token kernels */

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static unsigned token_blocks(int n) { return (unsigned)((n + MOE_WARPS - 1) / MOE_WARPS); }

/* ---- route: softmax, top-k, gates, selection counts ---- */

static __global__ void route_kernel(float *probs, int32_t *top_idx, float *top_w, int32_t *counts,
                                    const bf16 *logits, int n, int E, int k, int renorm) {
    int t = blockIdx.x * MOE_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (t >= n) return;
    const bf16 *z = logits + (size_t)t * E;
    float *p = probs + (size_t)t * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, __bfloat162float(z[e]));
    mx = warp_max(mx);
    float s = 0;
    for (int e = lane; e < E; e += 32) {
        float v = expf(__bfloat162float(z[e]) - mx);
        p[e] = v;
        s += v;
    }
    float inv = 1.0f / warp_sum(s);
    for (int e = lane; e < E; e += 32) p[e] *= inv;
    __syncwarp();
    int32_t *idx = top_idx + (size_t)t * k;
    float *w = top_w + (size_t)t * k;
    float wsum = 0;
    for (int j = 0; j < k; j++) {
        float best = -1.0f;
        int bi = E;
        for (int e = lane; e < E; e += 32) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= idx[i] == e;
            if (!taken && p[e] > best) { best = p[e]; bi = e; } /* lane's lowest index on ties */
        }
        for (int o = 16; o > 0; o >>= 1) { /* the largest, ties to the lower expert */
            float ob = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ob > best || (ob == best && oi < bi)) { best = ob; bi = oi; }
        }
        if (bi >= E) bi = j; /* NaN probabilities: any valid expert (the step is skipped anyway) */
        if (lane == 0) {
            idx[j] = bi;
            w[j] = best;
            if (counts) atomicAdd(&counts[bi], 1);
        }
        wsum += best;
        __syncwarp();
    }
    if (renorm && lane < k) w[lane] /= wsum;
}

/* prob_sum[e] += sum over tokens of probs[t, e]: one block per expert, a fixed order. */
static __global__ void prob_sum_kernel(float *prob_sum, const float *probs, int n, int E) {
    __shared__ float part[256];
    int e = blockIdx.x;
    float s = 0;
    for (int t = threadIdx.x; t < n; t += blockDim.x) s += probs[(size_t)t * E + e];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h) part[threadIdx.x] += part[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) prob_sum[e] += part[0];
}

void mt_cuda_moe_route(float *probs, int32_t *top_idx, float *top_w, int32_t *counts,
                       float *prob_sum, const bf16 *logits, int n, int E, int k, int renorm,
                       cudaStream_t s) {
    if (n <= 0) return;
    MT_CHECK(probs && top_idx && top_w && logits && k >= 1 && k <= E && k <= 32,
             "moe_route: bad arguments (n %d, E %d, k %d)", n, E, k);
    route_kernel<<<token_blocks(n), MOE_WARPS * 32, 0, s>>>(probs, top_idx, top_w, counts, logits, n,
                                                            E, k, renorm);
    CUDA_LAUNCH_CHECK();
    if (prob_sum) {
        prob_sum_kernel<<<E, 256, 0, s>>>(prob_sum, probs, n, E);
        CUDA_LAUNCH_CHECK();
    }
}

/* ---- group: a stable counting sort of the assignments by expert ---- */

static __global__ void histogram_kernel(int32_t *offsets, const int32_t *top_idx, int nk) {
    for (int a = blockIdx.x * blockDim.x + threadIdx.x; a < nk; a += gridDim.x * blockDim.x)
        atomicAdd(&offsets[top_idx[a] + 1], 1);
}

static __global__ void scan_kernel(int32_t *offsets, int E) { /* one thread: E is small */
    for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
}

/* Block e walks all assignments in order, in tiles of its threads, ranking those of expert e. */
static __global__ void place_kernel(int32_t *perm, int32_t *inv, const int32_t *offsets,
                                    const int32_t *top_idx, int nk) {
    __shared__ int warp_count[32];
    __shared__ int base;
    int e = blockIdx.x, lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
    if (threadIdx.x == 0) base = offsets[e];
    __syncthreads();
    for (int a0 = 0; a0 < nk; a0 += blockDim.x) {
        int a = a0 + threadIdx.x;
        int mine = a < nk && top_idx[a] == e;
        unsigned ballot = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) warp_count[wid] = __popc(ballot);
        __syncthreads();
        int before = 0, total = 0;
        for (int w = 0; w < nw; w++) {
            before += w < wid ? warp_count[w] : 0;
            total += warp_count[w];
        }
        if (mine) {
            int row = base + before + __popc(ballot & ((1u << lane) - 1u));
            perm[row] = a;
            inv[a] = row;
        }
        __syncthreads();
        if (threadIdx.x == 0) base += total;
        __syncthreads();
    }
}

void mt_cuda_moe_group(int32_t *perm, int32_t *inv, int32_t *offsets, const int32_t *top_idx, int n,
                       int E, int k, cudaStream_t s) {
    MT_CHECK(perm && inv && offsets && top_idx, "moe_group: NULL tensor");
    int nk = n * k;
    CUDA_CHECK(cudaMemsetAsync(offsets, 0, ((size_t)E + 1) * sizeof(int32_t), s));
    if (nk <= 0) return;
    histogram_kernel<<<mt_ew_blocks((size_t)nk), MT_CUDA_EW_THREADS, 0, s>>>(offsets, top_idx, nk);
    CUDA_LAUNCH_CHECK();
    scan_kernel<<<1, 1, 0, s>>>(offsets, E);
    CUDA_LAUNCH_CHECK();
    place_kernel<<<E, 1024, 0, s>>>(perm, inv, offsets, top_idx, nk);
    CUDA_LAUNCH_CHECK();
}

/* ---- gather, combine and their backward: row copies and k-term sums in choice order ---- */

static __global__ void gather_kernel(bf16 *xg, const bf16 *x, const int32_t *perm, size_t nkC, int C,
                                     int k) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nkC;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / C, c = i % C;
        xg[i] = x[(size_t)(perm[r] / k) * C + c];
    }
}

static __global__ void gather_backward_kernel(bf16 *dx, const bf16 *dxg, const int32_t *inv,
                                              size_t nC, int C, int k, int accumulate) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nC;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / C, c = i % C;
        float v = accumulate ? __bfloat162float(dx[i]) : 0.0f;
        for (int j = 0; j < k; j++) v += __bfloat162float(dxg[(size_t)inv[t * k + j] * C + c]);
        dx[i] = __float2bfloat16_rn(v);
    }
}

static __global__ void combine_kernel(bf16 *out, const bf16 *y, const float *top_w,
                                      const int32_t *inv, size_t nC, int C, int k) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nC;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / C, c = i % C;
        float v = 0;
        for (int j = 0; j < k; j++)
            v += top_w[t * k + j] * __bfloat162float(y[(size_t)inv[t * k + j] * C + c]);
        out[i] = __float2bfloat16_rn(v);
    }
}

/* One warp per assignment: its dy row and the dot product d_w. */
static __global__ void combine_backward_kernel(bf16 *dy, float *d_w, const bf16 *dout, const bf16 *y,
                                               const float *top_w, const int32_t *inv, int nk, int C,
                                               int k) {
    int a = blockIdx.x * MOE_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (a >= nk) return;
    size_t t = (size_t)a / k, row = (size_t)inv[a];
    float w = top_w[a], dot = 0;
    for (int c = lane; c < C; c += 32) {
        float g = __bfloat162float(dout[t * C + c]);
        dy[row * C + c] = __float2bfloat16_rn(w * g);
        dot += g * __bfloat162float(y[row * C + c]);
    }
    dot = warp_sum(dot);
    if (lane == 0) d_w[a] = dot;
}

/* The same four as row kernels on 16-byte vectors (8 bf16), for C a multiple of 8 with aligned
 * tensors (every model's width): one block per row, its threads across the row, no division per
 * element; the scalar kernels above measured 15-20% of HBM bandwidth (moe_bench, session 8). The
 * same fp32 sums in the same order (over j), so the same bits; combine_backward's dot product is
 * summed in another order (lane-strided vectors). */
#define MOE_ROW_THREADS 128

/* MT_MOE_ROW_KERNELS=scalar keeps the scalar kernels (for moe_bench's side by side). */
static int moe_vec_ok(int C, const void *a, const void *b) {
    static int scalar = -1;
    if (scalar < 0) {
        const char *e = getenv("MT_MOE_ROW_KERNELS");
        scalar = e && strcmp(e, "scalar") == 0;
    }
    return !scalar && C % 8 == 0 && mt_aligned16(a) && mt_aligned16(b);
}

static __global__ void gather_vec_kernel(bf16 *xg, const bf16 *x, const int32_t *perm, int C, int k) {
    size_t r = blockIdx.x;
    const uint4 *src = (const uint4 *)(x + (size_t)(perm[r] / k) * C);
    uint4 *dst = (uint4 *)(xg + r * C);
    for (int c = threadIdx.x; c < C / 8; c += blockDim.x) dst[c] = src[c];
}

static __global__ void gather_backward_vec_kernel(bf16 *dx, const bf16 *dxg, const int32_t *inv,
                                                  int C, int k, int accumulate) {
    size_t t = blockIdx.x;
    for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) {
        float v[8], a[8];
        if (accumulate) ld8(dx + t * C + c, v);
        else
            for (int i = 0; i < 8; i++) v[i] = 0.0f;
        for (int j = 0; j < k; j++) {
            ld8(dxg + (size_t)inv[t * k + j] * C + c, a);
            for (int i = 0; i < 8; i++) v[i] += a[i];
        }
        st8(dx + t * C + c, v);
    }
}

static __global__ void combine_vec_kernel(bf16 *out, const bf16 *y, const float *top_w,
                                          const int32_t *inv, int C, int k) {
    size_t t = blockIdx.x;
    for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) {
        float v[8], a[8];
        for (int i = 0; i < 8; i++) v[i] = 0.0f;
        for (int j = 0; j < k; j++) {
            float w = top_w[t * k + j];
            ld8(y + (size_t)inv[t * k + j] * C + c, a);
            for (int i = 0; i < 8; i++) v[i] += w * a[i];
        }
        st8(out + t * C + c, v);
    }
}

/* One warp per assignment, as the scalar kernel, each lane on 8-element vectors. */
static __global__ void combine_backward_vec_kernel(bf16 *dy, float *d_w, const bf16 *dout,
                                                   const bf16 *y, const float *top_w,
                                                   const int32_t *inv, int nk, int C, int k) {
    int a = blockIdx.x * MOE_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (a >= nk) return;
    size_t t = (size_t)a / k, row = (size_t)inv[a];
    float w = top_w[a], dot = 0;
    for (int c = lane * 8; c < C; c += 32 * 8) {
        float g[8], yy[8], o[8];
        ld8(dout + t * C + c, g);
        ld8(y + row * C + c, yy);
        for (int i = 0; i < 8; i++) {
            o[i] = w * g[i];
            dot += g[i] * yy[i];
        }
        st8(dy + row * C + c, o);
    }
    dot = warp_sum(dot);
    if (lane == 0) d_w[a] = dot;
}

void mt_cuda_moe_gather(bf16 *xg, const bf16 *x, const int32_t *perm, int n, int C, int k,
                        cudaStream_t s) {
    size_t nkC = (size_t)n * k * C;
    if (nkC == 0) return;
    MT_CHECK(xg && x && perm, "moe_gather: NULL tensor");
    if (moe_vec_ok(C, xg, x)) {
        gather_vec_kernel<<<(unsigned)(n * k), MOE_ROW_THREADS, 0, s>>>(xg, x, perm, C, k);
        CUDA_LAUNCH_CHECK();
        return;
    }
    gather_kernel<<<mt_ew_blocks(nkC), MT_CUDA_EW_THREADS, 0, s>>>(xg, x, perm, nkC, C, k);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_moe_gather_backward(bf16 *dx, const bf16 *dxg, const int32_t *inv, int n, int C, int k,
                                 int accumulate, cudaStream_t s) {
    size_t nC = (size_t)n * C;
    if (nC == 0) return;
    MT_CHECK(dx && dxg && inv, "moe_gather_backward: NULL tensor");
    if (moe_vec_ok(C, dx, dxg)) {
        gather_backward_vec_kernel<<<(unsigned)n, MOE_ROW_THREADS, 0, s>>>(dx, dxg, inv, C, k,
                                                                           accumulate);
        CUDA_LAUNCH_CHECK();
        return;
    }
    gather_backward_kernel<<<mt_ew_blocks(nC), MT_CUDA_EW_THREADS, 0, s>>>(dx, dxg, inv, nC, C, k,
                                                                          accumulate);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_moe_combine(bf16 *out, const bf16 *y, const float *top_w, const int32_t *inv, int n,
                         int C, int k, cudaStream_t s) {
    size_t nC = (size_t)n * C;
    if (nC == 0) return;
    MT_CHECK(out && y && top_w && inv, "moe_combine: NULL tensor");
    if (moe_vec_ok(C, out, y)) {
        combine_vec_kernel<<<(unsigned)n, MOE_ROW_THREADS, 0, s>>>(out, y, top_w, inv, C, k);
        CUDA_LAUNCH_CHECK();
        return;
    }
    combine_kernel<<<mt_ew_blocks(nC), MT_CUDA_EW_THREADS, 0, s>>>(out, y, top_w, inv, nC, C, k);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_moe_combine_backward(bf16 *dy, float *d_w, const bf16 *dout, const bf16 *y,
                                  const float *top_w, const int32_t *inv, int n, int C, int k,
                                  cudaStream_t s) {
    int nk = n * k;
    if (nk <= 0) return;
    MT_CHECK(dy && d_w && dout && y && top_w && inv, "moe_combine_backward: NULL tensor");
    if (moe_vec_ok(C, dy, dout) && mt_aligned16(y)) {
        combine_backward_vec_kernel<<<token_blocks(nk), MOE_WARPS * 32, 0, s>>>(
            dy, d_w, dout, y, top_w, inv, nk, C, k);
        CUDA_LAUNCH_CHECK();
        return;
    }
    combine_backward_kernel<<<token_blocks(nk), MOE_WARPS * 32, 0, s>>>(dy, d_w, dout, y, top_w, inv,
                                                                       nk, C, k);
    CUDA_LAUNCH_CHECK();
}

/* ---- route backward: through the renormalisation and the softmax ---- */

static __global__ void route_backward_kernel(bf16 *d_logits, const float *d_w, const float *probs,
                                             const int32_t *top_idx, const float *top_w,
                                             const float *aux_grad, int n, int E, int k,
                                             int renorm) {
    int t = blockIdx.x * MOE_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (t >= n) return;
    const float *p = probs + (size_t)t * E;
    const int32_t *idx = top_idx + (size_t)t * k;
    const float *dw = d_w + (size_t)t * k, *w = top_w + (size_t)t * k;
    float S = 0, dot = 0;
    for (int j = 0; j < k; j++) { /* every lane the same few terms */
        S += p[idx[j]];
        dot += dw[j] * w[j];
    }
    float pd = 0;
    for (int e = lane; e < E; e += 32) {
        float dp = aux_grad ? aux_grad[e] : 0.0f;
        for (int j = 0; j < k; j++)
            if (idx[j] == e) dp += renorm ? (dw[j] - dot) / S : dw[j];
        pd += p[e] * dp;
    }
    pd = warp_sum(pd);
    for (int e = lane; e < E; e += 32) {
        float dp = aux_grad ? aux_grad[e] : 0.0f;
        for (int j = 0; j < k; j++)
            if (idx[j] == e) dp += renorm ? (dw[j] - dot) / S : dw[j];
        d_logits[(size_t)t * E + e] = __float2bfloat16_rn(p[e] * (dp - pd));
    }
}

void mt_cuda_moe_route_backward(bf16 *d_logits, const float *d_w, const float *probs,
                                const int32_t *top_idx, const float *top_w, const float *aux_grad,
                                int n, int E, int k, int renorm, cudaStream_t s) {
    if (n <= 0) return;
    MT_CHECK(d_logits && d_w && probs && top_idx && top_w, "moe_route_backward: NULL tensor");
    route_backward_kernel<<<token_blocks(n), MOE_WARPS * 32, 0, s>>>(d_logits, d_w, probs, top_idx,
                                                                     top_w, aux_grad, n, E, k, renorm);
    CUDA_LAUNCH_CHECK();
}
