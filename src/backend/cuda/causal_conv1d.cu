/* The Gated DeltaNet's short convolution (backend.h's causal_conv1d_*; the CPU op:
 * src/backend/cpu/causal_conv1d.c): causal, depthwise, K taps, then SiLU, taps before the
 * token's document (or the call's row) start reading zero (a call at position t0 of longer rows
 * reads nothing before its first token). bf16 storage, fp32 math.
 * Forward: one thread an element. Backward: one thread a channel of a part of CONV_ROWS tokens,
 * which walks its tokens in order: dinp[s] from the pre-activation gradients of the K tokens
 * that read s (recomputed), and its K weight-gradient sums in registers, written as the part's
 * partials; a second kernel adds the parts in order (no atomics: the same bits every run).
 * dweight NULL (a frozen conv): no partials, no second kernel; dinp is the same bits. */
#include "cuda_vec.cuh"
#include "ops.cuh"

#define CONV_MAX_K 8
#define CONV_ROWS 128      /* tokens a part of the backward (at least) */
#define CONV_MAX_PARTS 1024
#define CONV_THREADS 128   /* channels a block of the backward */

static __device__ __forceinline__ float sigmoid_(float x) { return 1.0f / (1.0f + expf(-x)); }

/* First token of the call's row that its token n may read: the document's start, or the call's
 * first token (position t0 of the row) for a document begun before it. */
static __device__ __forceinline__ int conv_lo(const int32_t *doc_start, size_t n, int t0) {
    int s = doc_start ? doc_start[n] - t0 : 0;
    return s > 0 ? s : 0;
}

/* The pre-activation of token n (t in its row, first readable token lo), channel c. */
static __device__ __forceinline__ float conv_pre(const bf16 *inp, const bf16 *weight, size_t n,
                                                 int t, int lo, int c, int C, int K) {
    float acc = 0.0f;
    for (int j = 0; j < K; j++) {
        int back = K - 1 - j;
        if (t - back >= lo)
            acc += __bfloat162float(weight[(size_t)c * K + j]) *
                   __bfloat162float(inp[(n - back) * C + c]);
    }
    return acc;
}

static __global__ void conv_forward_kernel(bf16 *out, const bf16 *inp, const bf16 *weight,
                                           const int32_t *doc_start, int T, int C, int K,
                                           int t0, size_t total) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t n = e / C;
        int c = (int)(e % C), t = (int)(n % T);
        float p = conv_pre(inp, weight, n, t, conv_lo(doc_start, n, t0), c, C, K);
        out[e] = __float2bfloat16_rn(p * sigmoid_(p));
    }
}

static __global__ void __launch_bounds__(CONV_THREADS)
    conv_backward_kernel(bf16 *dinp, float *dw_part, const bf16 *dout, const bf16 *inp,
                         const bf16 *weight, const int32_t *doc_start, int T, int C, int K,
                         int t0, size_t N, size_t rows_per_part) {
    int c = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (c >= C) return;
    size_t r0 = (size_t)blockIdx.y * rows_per_part, r1 = min(N, r0 + rows_per_part);
    float dw[CONV_MAX_K];
    for (int j = 0; j < CONV_MAX_K; j++) dw[j] = 0.0f;
    for (size_t s = r0; s < r1; s++) {
        int ts = (int)(s % T);
        float di = 0.0f;
        /* the tokens t = s .. s+K-1 of the row that read s (stop at a later document) */
        for (int u = 0; u < K && ts + u < T; u++) {
            size_t nt = s + u;
            int lo = conv_lo(doc_start, nt, t0);
            if (lo > ts) break;
            float p = conv_pre(inp, weight, nt, ts + u, lo, c, C, K), sg = sigmoid_(p);
            float d = __bfloat162float(dout[nt * C + c]) * sg * (1.0f + p * (1.0f - sg));
            di += d * __bfloat162float(weight[(size_t)c * K + K - 1 - u]);
            if (u == 0 && dw_part) /* dweight[c, j] += dpre[s] * x[s - (K-1) + j], the taps s reads */
                for (int j = 0; j < K; j++) {
                    int back = K - 1 - j;
                    if (ts - back >= lo) dw[j] += d * __bfloat162float(inp[(s - back) * C + c]);
                }
        }
        dinp[s * C + c] = __float2bfloat16_rn(di);
    }
    if (dw_part)
        for (int j = 0; j < K; j++) dw_part[((size_t)blockIdx.y * C + c) * K + j] = dw[j];
}

/* dweight (C*K) += the parts' sums, in part order. */
static __global__ void conv_dw_finish_kernel(float *dweight, const float *dw_part, int parts,
                                             int CK) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= CK) return;
    float s = 0.0f;
    for (int p = 0; p < parts; p++) s += dw_part[(size_t)p * CK + e];
    dweight[e] += s;
}

static void conv_check(const char *op, int B, int T, int C, int K) {
    MT_CHECK(B >= 0 && T >= 0 && C > 0 && K > 0 && K <= CONV_MAX_K,
             "%s: B=%d T=%d C=%d K=%d (the CUDA kernel takes 1 <= K <= %d)", op, B, T, C, K,
             CONV_MAX_K);
}

void mt_cuda_causal_conv1d_forward(bf16 *out, const bf16 *inp, const bf16 *weight,
                                   const int32_t *doc_start, int B, int T, int C, int K, int t0,
                                   cudaStream_t s) {
    conv_check("causal_conv1d_forward", B, T, C, K);
    size_t total = (size_t)B * T * C;
    if (!total) return;
    MT_CHECK(out && inp && weight, "causal_conv1d_forward: NULL tensor");
    conv_forward_kernel<<<mt_ew_blocks(total), MT_CUDA_EW_THREADS, 0, s>>>(out, inp, weight,
                                                                          doc_start, T, C, K, t0,
                                                                          total);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_causal_conv1d_backward(bf16 *dinp, float *dweight, const bf16 *dout, const bf16 *inp,
                                    const bf16 *weight, const int32_t *doc_start, int B, int T,
                                    int C, int K, int t0, cudaStream_t s) {
    conv_check("causal_conv1d_backward", B, T, C, K);
    size_t N = (size_t)B * T;
    if (!N) return;
    MT_CHECK(dinp && dout && inp && weight, "causal_conv1d_backward: NULL tensor");
    size_t rows = (N + CONV_MAX_PARTS - 1) / CONV_MAX_PARTS;
    if (rows < CONV_ROWS) rows = CONV_ROWS;
    int parts = (int)((N + rows - 1) / rows);
    float *part = NULL; /* stays NULL without dweight: the kernel then sums no weight gradient */
    if (dweight)
        CUDA_CHECK(cudaMallocAsync((void **)&part, (size_t)parts * C * K * sizeof(float), s));
    dim3 grid((unsigned)((C + CONV_THREADS - 1) / CONV_THREADS), (unsigned)parts);
    conv_backward_kernel<<<grid, CONV_THREADS, 0, s>>>(dinp, part, dout, inp, weight, doc_start, T,
                                                       C, K, t0, N, rows);
    CUDA_LAUNCH_CHECK();
    if (!dweight) return;
    conv_dw_finish_kernel<<<(C * K + 255) / 256, 256, 0, s>>>(dweight, part, parts, C * K);
    CUDA_LAUNCH_CHECK();
    CUDA_CHECK(cudaFreeAsync(part, s));
}
