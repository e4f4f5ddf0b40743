/* What the gated delta rule's forward (gated_delta.cu) and backward (gated_delta_backward.cu)
 * kernels share: the chunk algebra of src/backend/cpu/gated_delta_chunk.h on one thread block.
 *
 * Work split: one block per (row b, value head h, block of GD_BV = 32 value columns). The state's
 * columns are independent in the recurrence (S[:, d] only ever meets v[:, d]), so a block scans
 * its Dk x 32 slice of S over the chunks alone; the (L, L) chunk matrices (K K^T, Q K^T, the
 * triangular inverse) depend on no column and are recomputed by each of the ceil(Dv/32) blocks of
 * a head (a quarter of the work at Dk = Dv = 128, for four times the blocks). In the backward,
 * everything that sums over value columns (dq, dk, dg, dbeta) is a sum of per-block parts, written
 * to fp32 scratch and added in a fixed order by a second kernel: no atomics, the same bits every
 * run.
 *
 * Every matrix lives in shared memory in fp32; products run on the tensor cores as TF32 wmma
 * (m16n16k8, fp32 accumulate): 10 mantissa bits per operand against bf16's 7 for the inputs, the
 * state and every sum kept in fp32. Rows (tokens) are padded to L = 64 with zeros and Dk to a
 * multiple of 16, so a short last chunk or an odd head size needs no special case: a padded token
 * has q = k = v = 0, beta = 0 and lies in no document, which makes every mask zero on it.
 *
 * Expected rate (not yet measured when written; test_cuda_gated_delta --bench measures it): a
 * block's chunk is ~15 barrier-separated steps, the 64-step triangular solve on two warps the
 * longest (~2-4 us), the products ~4.2 MFLOP a block and chunk (1.6x the counted FLOPs of
 * mt_gated_delta_flops, for the recomputed (L, L) products). At ~8-10 us a chunk forward and
 * ~2x that backward with B*Hv*ceil(Dv/32) = 128 blocks (B = 1, Qwen3.6-35B-A3B) on 132 SMs:
 * about 20-40 TFLOP/s of counted FLOPs, flat in T (the chunks of a head are sequential; more rows
 * or heads fill the GPU, not longer rows). Next steps, as flash-linear-attention does: the (L, L)
 * intra-chunk work of all chunks in parallel in a first kernel, only the state scan sequential;
 * the backward's dq/dk parts reduced across a thread-block cluster (DSMEM) instead of scratch. */
#ifndef MT_CUDA_GATED_DELTA_CHUNK_CUH
#define MT_CUDA_GATED_DELTA_CHUNK_CUH

#include <mma.h>
#include <type_traits>

#include "cuda_common.cuh"

#define GD_L MT_GATED_DELTA_CHUNK /* tokens a chunk (64) */
#define GD_BV 32                  /* value columns a block */
#define GD_THREADS 256
#define GD_MAX_DK 128

static inline int gd_round16(int x) { return (x + 15) / 16 * 16; }

/* The per-token scalars of the chunk being processed. */
struct gd_stats {
    double G[GD_L]; /* cumulative g from the chunk's start */
    float beta[GD_L], fe[GD_L], lam[GD_L];
    int ds[GD_L];   /* document start (-1: padding) */
    float eL;
    int Lc;         /* valid tokens */
};

/* C (M x N, ldc) = (or += when acc) op(A) op(B), op(A) (M x K), op(B) (K x N); TA: A is stored
 * K x M (lda), TB: B stored N x K (ldb). M, N multiples of 16, K of 8. Warps w0 .. w0+nw-1 of the
 * block take the 16x16 tiles round-robin, so two calls with the same shape and warps give each
 * tile to the same warp (accumulating calls need no barrier between them). C aliases neither A
 * nor B. The caller synchronises after. */
template <bool TA, bool TB>
static __device__ __forceinline__ void gd_mm(float *C, int ldc, const float *A, int lda,
                                             const float *B, int ldb, int M, int N, int K,
                                             bool acc, int w0, int nw) {
    using namespace nvcuda;
    typedef typename std::conditional<TA, wmma::col_major, wmma::row_major>::type LA;
    typedef typename std::conditional<TB, wmma::col_major, wmma::row_major>::type LB;
    int warp = threadIdx.x / 32 - w0;
    if (warp < 0 || warp >= nw) return;
    int tn = N / 16, tiles = (M / 16) * tn;
    for (int t = warp; t < tiles; t += nw) {
        int i0 = t / tn * 16, j0 = t % tn * 16;
        wmma::fragment<wmma::accumulator, 16, 16, 8, float> c;
        if (acc) wmma::load_matrix_sync(c, C + (size_t)i0 * ldc + j0, ldc, wmma::mem_row_major);
        else wmma::fill_fragment(c, 0.0f);
        for (int k0 = 0; k0 < K; k0 += 8) {
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LA> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LB> b;
            wmma::load_matrix_sync(a, TA ? A + (size_t)k0 * lda + i0 : A + (size_t)i0 * lda + k0, lda);
            wmma::load_matrix_sync(b, TB ? B + (size_t)j0 * ldb + k0 : B + (size_t)k0 * ldb + j0, ldb);
#pragma unroll
            for (int e = 0; e < a.num_elements; e++) a.x[e] = wmma::__float_to_tf32(a.x[e]);
#pragma unroll
            for (int e = 0; e < b.num_elements; e++) b.x[e] = wmma::__float_to_tf32(b.x[e]);
            wmma::mma_sync(c, a, b, c);
        }
        wmma::store_matrix_sync(C + (size_t)i0 * ldc + j0, c, ldc, wmma::mem_row_major);
    }
}

/* Loads the chunk [c0, c0+Lc) of row b: Qs = scale q and K (L x Dkp, zero-padded) for key head
 * kh, and the scalars of value head vh (as gated_delta_chunk.h's mt_gd_chunk_load), these by
 * warp 0: two tokens a lane, G by a shuffle scan in double. doc_start is trusted to be a run of
 * documents (the CPU op checks it; the layer hands both backends the same array). */
static __device__ void gd_load_chunk(float *Qs, float *Kc, gd_stats *st, const bf16 *q,
                                     const bf16 *k, const float *g, const float *beta,
                                     const int32_t *doc_start, int b, int c0, int Lc, int kh,
                                     int vh, int T, int Hk, int Hv, int Dk, int Dkp, float scale) {
    for (int e = threadIdx.x; e < GD_L * Dkp; e += blockDim.x) {
        int i = e / Dkp, d = e % Dkp;
        float qv = 0.0f, kv = 0.0f;
        if (i < Lc && d < Dk) {
            size_t off = (((size_t)b * T + c0 + i) * Hk + kh) * Dk + d;
            qv = __bfloat162float(q[off]) * scale;
            kv = __bfloat162float(k[off]);
        }
        Qs[e] = qv;
        Kc[e] = kv;
    }
    if (threadIdx.x >= 32) return;
    int lane = threadIdx.x;
    double gi[2], part = 0.0;
#pragma unroll
    for (int u = 0; u < 2; u++) {
        int i = 2 * lane + u;
        size_t n = (size_t)b * T + c0 + i;
        gi[u] = i < Lc ? (double)g[n * Hv + vh] : 0.0;
        st->beta[i] = i < Lc ? beta[n * Hv + vh] : 0.0f;
        st->ds[i] = i < Lc ? (doc_start ? doc_start[n] : 0) : -1;
        part += gi[u];
    }
    double incl = part; /* inclusive scan of the lanes' pair sums */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        double y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    double excl = incl - part;
    st->G[2 * lane] = excl + gi[0];
    st->G[2 * lane + 1] = excl + gi[0] + gi[1];
    __syncwarp();
    double Gl = st->G[Lc - 1];
    int dl = st->ds[Lc - 1];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        int i = 2 * lane + u, valid = i < Lc;
        st->fe[i] = valid && st->ds[i] < c0 ? (float)exp(st->G[i]) : 0.0f;
        st->lam[i] = valid && st->ds[i] == dl ? (float)exp(Gl - st->G[i]) : 0.0f;
    }
    if (lane == 0) {
        st->eL = dl < c0 ? (float)exp(Gl) : 0.0f;
        st->Lc = Lc;
    }
}

/* The decay mask Dm_ij: exp(G_i - G_j) for j <= i in the same document, else 0. */
static __device__ __forceinline__ float gd_dm(const gd_stats *st, int i, int j) {
    return j <= i && st->ds[i] >= 0 && st->ds[j] == st->ds[i] ? expf((float)(st->G[i] - st->G[j]))
                                                               : 0.0f;
}

/* Tm = (I + diag(beta) KD)^-1 (unit lower triangular) from KD (strict lower, L x L): one thread
 * a column j (threads 0..63 of the warps given), forward substitution with the column in
 * registers (fully unrolled: the 64 values never leave them). */
static __device__ __forceinline__ void gd_solve(float *Tm, const float *KD, const gd_stats *st,
                                                int tid) {
    if (tid >= GD_L) return;
    int j = tid;
    float t[GD_L];
#pragma unroll
    for (int m = 0; m < GD_L; m++) {
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* four chains: a quarter of the FMA latency */
#pragma unroll
        for (int p = 0; p < m; p++) s[p % 4] += KD[m * GD_L + p] * t[p];
        t[m] = m == j ? 1.0f : (m < j ? 0.0f : -st->beta[m] * ((s[0] + s[1]) + (s[2] + s[3])));
    }
#pragma unroll
    for (int m = 0; m < GD_L; m++) Tm[m * GD_L + j] = t[m];
}

#endif
