/* What the gated delta rule's forward (gated_delta.cu) and backward (gated_delta_backward.cu)
 * kernels share: the chunk algebra of src/backend/cpu/gated_delta_chunk.h on thread blocks.
 *
 * Work split, as flash-linear-attention splits chunk_gated_delta_rule: what a chunk needs from
 * itself alone (the (L, L) products K K^T and Q K^T, the triangular inverse Tm, the WY products
 * W = Tm diag(beta fe) K and U = Tm diag(beta) V) runs in kernels with one block per (chunk, row,
 * value head), all chunks at once; only the state recurrence is sequential, in a scan kernel with
 * one block per (row, value head, GD_BV value columns) that carries its Dk x GD_BV slice of the
 * state (forward) or of its gradient (backward) over the chunks. The state's columns are
 * independent in the recurrence (S[:, d] only ever meets v[:, d]), so the scan needs no (L, L)
 * work: per chunk Vn = U - W S and S = eL S + K^T diag(lam) Vn, two small products.
 *
 * Every matrix lives in shared memory in fp32 with rows padded by 4 floats (a row's first bank
 * moves by 4, so the fragment loads of wmma meet no bank conflicts). Products run on the tensor
 * cores as TF32 wmma (m16n16k8, fp32 accumulate); those through Tm and W are ill-conditioned when
 * keys are correlated (Tm's entries grow: see the CPU header), so they run as split TF32 (each
 * operand a + a_lo, three products: about fp32's 2^-22 against TF32's 2^-11). The state and every
 * sum stay in fp32. Rows (tokens) are padded to L = 64 with zeros and Dk, Dv to multiples of 16, so
 * a short last chunk or an odd head size needs no special case: a padded token has q = k = v = 0,
 * beta = 0 and lies in no document, which makes every mask zero on it.
 *
 * Long inputs run in ranges of chunks (gd_range_chunks) so that the fp32 scratch between the
 * kernels (W, U or dU, the backward's state gradients and per-column-block parts) stays under
 * MT_CUDA_GATED_DELTA_SCRATCH, which the planner counts (cuda_memory.h); the scans carry the
 * state (in chunk_states) and its gradient (in a carry buffer) from range to range.
 *
 * Speed, and what limits it (bench/RESULTS.md sessions 9-10, test_cuda_gated_delta --bench on the
 * Qwen3.6-35B-A3B layer): 5-7 TFLOP/s forward + backward, 2-8x slower than flash-linear-attention's
 * forward. Not the tensor cores: every product in plain TF32 (a third of split TF32's work) ran
 * only 17-20% faster (session 10, ba2ff12). The backward's chunk kernel takes ~70% of the backward; at 229 KB of shared
 * memory it runs one block (8 warps) an SM through ~20 barrier-separated phases, with fp32 tiles
 * streamed through shared memory and each of the GD_BV column blocks of a chunk redoing the
 * (L, L) x (L, Dk) products of dq and dk. What a faster design needs: operands kept in registers
 * across products (mma fragments, not shared-memory round trips), bf16 storage of the inputs
 * that are bf16 already (q, k, v, dO: exact, half the bytes), the chunk-wide products done once
 * a chunk rather than once a column block, and enough warps an SM to hide the latency.
 * gated_delta_gemm.cu (MT_GATED_DELTA_BWD=gemm, not yet run on a GPU) takes the last two: the chunk
 * backward's products once a chunk over all value columns, as cuBLAS batched GEMMs. */
#ifndef MT_CUDA_GATED_DELTA_CHUNK_CUH
#define MT_CUDA_GATED_DELTA_CHUNK_CUH

#include <climits>
#include <mma.h>
#include <type_traits>

#include "cuda_common.cuh"

#define GD_L MT_GATED_DELTA_CHUNK /* tokens a chunk (64) */
#define GD_BV 32                  /* value columns a scan block */
#define GD_THREADS 256
#define GD_MAX_DK 128
#define GD_LDL (GD_L + 4)         /* row stride of (L, L) matrices */
#define GD_LDB (GD_BV + 4)        /* row stride of (., GD_BV) matrices */
#define GD_PAD INT_MIN            /* gd_stats.ds of a padding token */

static inline int gd_round16(int x) { return (x + 15) / 16 * 16; }
static inline size_t gd_round64(size_t x) { return (x + 63) / 64 * 64; }
/* Row stride of a matrix of width Dp (a multiple of 16) in shared memory. */
static inline __host__ __device__ int gd_ld(int Dp) { return Dp + 4; }

/* The per-token scalars of the chunk being processed. */
struct gd_stats {
    double G[GD_L]; /* cumulative g from the chunk's start */
    float beta[GD_L], fe[GD_L], lam[GD_L];
    int ds[GD_L];   /* document start relative to the call's first token (< 0: begun before it,
                       mt_gated_delta_span; GD_PAD: padding) */
    float eL;
    int Lc;         /* valid tokens */
};

/* C (M x N, ldc) = (or += when acc) op(A) op(B), op(A) (M x K), op(B) (K x N); TA: A is stored
 * K x M (lda), TB: B stored N x K (ldb). M, N multiples of 16, K of 8; C may be global memory
 * (fp32, 32-byte aligned tiles). Warps w0 .. w0+nw-1 of the block take the 16x16 tiles
 * round-robin, so two calls with the same shape and warps give each tile to the same warp
 * (accumulating calls need no barrier between them). C aliases neither A nor B. The caller
 * synchronises after. SPLIT: split TF32 (a = hi + lo, hi lo' + lo hi' + hi hi'), ~fp32 accuracy
 * at three times the tensor work. */
template <bool TA, bool TB, bool SPLIT = false>
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
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LA> a, alo;
            wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LB> b, blo;
            wmma::load_matrix_sync(a, TA ? A + (size_t)k0 * lda + i0 : A + (size_t)i0 * lda + k0, lda);
            wmma::load_matrix_sync(b, TB ? B + (size_t)j0 * ldb + k0 : B + (size_t)k0 * ldb + j0, ldb);
            if (SPLIT) {
#pragma unroll
                for (int e = 0; e < a.num_elements; e++) {
                    float x = a.x[e], hi = wmma::__float_to_tf32(x);
                    a.x[e] = hi;
                    alo.x[e] = wmma::__float_to_tf32(x - hi);
                }
#pragma unroll
                for (int e = 0; e < b.num_elements; e++) {
                    float x = b.x[e], hi = wmma::__float_to_tf32(x);
                    b.x[e] = hi;
                    blo.x[e] = wmma::__float_to_tf32(x - hi);
                }
                wmma::mma_sync(c, alo, b, c);
                wmma::mma_sync(c, a, blo, c);
            } else {
#pragma unroll
                for (int e = 0; e < a.num_elements; e++) a.x[e] = wmma::__float_to_tf32(a.x[e]);
#pragma unroll
                for (int e = 0; e < b.num_elements; e++) b.x[e] = wmma::__float_to_tf32(b.x[e]);
            }
            wmma::mma_sync(c, a, b, c);
        }
        wmma::store_matrix_sync(C + (size_t)i0 * ldc + j0, c, ldc, wmma::mem_row_major);
    }
}

/* Loads a tile of a row-major global matrix into shared memory as fp32: dst[i ldd + c] =
 * src[i srow + c] * mul (* rowmul[i] when given) for i < rows, c < cols, and 0 elsewhere up to
 * rowsp x colsp (colsp a multiple of 16), by threads tid0 .. tid0+nt-1. A thread issues GD_BATCH
 * loads, 16 bytes each where the rows allow it, before it stores any: these tiles are small and
 * the kernels latency-bound, and with one load in flight a thread (the element loops this
 * replaced) MT_GATED_DELTA_PROFILE showed the scans waiting ~35 us a chunk on global memory.
 * The caller synchronises after. */
#define GD_BATCH 4
template <int V> static __device__ __forceinline__ void gd_ld(float *r, const bf16 *p) {
    if (V == 8) {
        uint4 raw = *(const uint4 *)p;
        const __nv_bfloat162 *h = (const __nv_bfloat162 *)&raw;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 f = __bfloat1622float2(h[k]);
            r[2 * k] = f.x, r[2 * k + 1] = f.y;
        }
    } else {
        r[0] = __bfloat162float(*p);
    }
}
template <int V> static __device__ __forceinline__ void gd_ld(float *r, const float *p) {
    if (V == 4) {
        float4 f = *(const float4 *)p;
        r[0] = f.x, r[1] = f.y, r[2] = f.z, r[3] = f.w;
    } else {
        r[0] = *p;
    }
}

template <int V, typename T>
static __device__ __forceinline__ void gd_tile_v(float *dst, int ldd, const T *src, size_t srow,
                                                 int rows, int cols, int rowsp, int colsp,
                                                 float mul, const float *rowmul, int tid0, int nt) {
    const int per_row = colsp / V, n = rowsp * per_row;
    for (int base = threadIdx.x - tid0; base < n; base += GD_BATCH * nt) {
        float r[GD_BATCH][V];
#pragma unroll
        for (int u = 0; u < GD_BATCH; u++) {
            int e = base + u * nt, i = e / per_row, c = e % per_row * V;
            if (e < n && i < rows && c < cols) gd_ld<V>(r[u], src + (size_t)i * srow + c);
            else
#pragma unroll
                for (int x = 0; x < V; x++) r[u][x] = 0.0f;
        }
#pragma unroll
        for (int u = 0; u < GD_BATCH; u++) {
            int e = base + u * nt, i = e / per_row, c = e % per_row * V;
            if (e >= n) break;
            float m = rowmul && i < rows ? mul * rowmul[i] : mul;
#pragma unroll
            for (int x = 0; x < V; x++) dst[i * ldd + c + x] = r[u][x] * m;
        }
    }
}

template <typename T>
static __device__ __forceinline__ void gd_tile(float *dst, int ldd, const T *src, size_t srow,
                                               int rows, int cols, int rowsp, int colsp,
                                               float mul = 1.0f, const float *rowmul = NULL,
                                               int tid0 = 0, int nt = GD_THREADS) {
    if (threadIdx.x < tid0 || threadIdx.x >= tid0 + nt) return;
    constexpr int V = 16 / sizeof(T); /* 8 bf16 or 4 fp32 a load */
    if (cols % V == 0 && srow % V == 0 && ((size_t)src & 15) == 0)
        gd_tile_v<V>(dst, ldd, src, srow, rows, cols, rowsp, colsp, mul, rowmul, tid0, nt);
    else
        gd_tile_v<1>(dst, ldd, src, srow, rows, cols, rowsp, colsp, mul, rowmul, tid0, nt);
}

/* Loads the chunk [c0, c0+Lc) of row b: Qs = scale q (unless Qs is NULL) and K, (L x Dkp, row
 * stride ldk, zero-padded) for key head kh, and the scalars of value head vh (as
 * gated_delta_chunk.h's mt_gd_chunk_load), these by warp 0: two tokens a lane, G by a shuffle scan
 * in double. doc_start is trusted to be a run of documents (the CPU op checks it; the layer hands
 * both backends the same array); its positions are the row's, the call's first token at t0
 * (mt_gated_delta_span). The caller synchronises after. */
static __device__ void gd_load_chunk(float *Qs, float *Kc, int ldk, gd_stats *st, const bf16 *q,
                                     const bf16 *k, const float *g, const float *beta,
                                     const int32_t *doc_start, int b, int c0, int Lc, int kh,
                                     int vh, int T, int Hk, int Hv, int Dk, int Dkp, float scale,
                                     int t0) {
    size_t off = ((size_t)b * T + c0) * Hk * Dk + (size_t)kh * Dk, srow = (size_t)Hk * Dk;
    if (Qs) gd_tile(Qs, ldk, q + off, srow, Lc, Dk, GD_L, Dkp, scale);
    gd_tile(Kc, ldk, k + off, srow, Lc, Dk, GD_L, Dkp);
    if (threadIdx.x >= 32) return;
    int lane = threadIdx.x;
    double gi[2], part = 0.0;
#pragma unroll
    for (int u = 0; u < 2; u++) {
        int i = 2 * lane + u;
        size_t n = (size_t)b * T + c0 + i;
        gi[u] = i < Lc ? (double)g[n * Hv + vh] : 0.0;
        st->beta[i] = i < Lc ? beta[n * Hv + vh] : 0.0f;
        st->ds[i] = i < Lc ? (doc_start ? doc_start[n] : 0) - t0 : GD_PAD;
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

/* The sum of v over the warp's 32 lanes, in every lane. */
static __device__ __forceinline__ float gd_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The decay mask Dm_ij: exp(G_i - G_j) for j <= i in the same document, else 0. */
static __device__ __forceinline__ float gd_dm(const gd_stats *st, int i, int j) {
    return j <= i && st->ds[i] != GD_PAD && st->ds[j] == st->ds[i]
               ? expf((float)(st->G[i] - st->G[j]))
                                                               : 0.0f;
}

/* KD = strict lower part of (K K^T) o Dm, (L x L, stride GD_LDL), by all warps. Kc and st loaded
 * and synchronised; ends synchronised. */
static __device__ __forceinline__ void gd_kd(float *KD, const float *Kc, int ldk, int Dkp,
                                             const gd_stats *st) {
    gd_mm<false, true>(KD, GD_LDL, Kc, ldk, Kc, ldk, GD_L, GD_L, Dkp, false, 0, GD_THREADS / 32);
    __syncthreads();
    for (int e = threadIdx.x; e < GD_L * GD_L; e += blockDim.x) {
        int i = e / GD_L, j = e % GD_L;
        KD[i * GD_LDL + j] = j < i ? KD[i * GD_LDL + j] * gd_dm(st, i, j) : 0.0f;
    }
    __syncthreads();
}

/* Tm = (I + diag(beta) KD)^-1 (unit lower triangular) from KD (strict lower, L x L, stride
 * GD_LDL): one thread a column j (threads 0..63 of the warps given), forward substitution with the
 * column in registers (fully unrolled: the 64 values never leave them). */
static __device__ __forceinline__ void gd_solve(float *Tm, const float *KD, const gd_stats *st,
                                                int tid) {
    if (tid >= GD_L) return;
    int j = tid;
    float t[GD_L];
#pragma unroll
    for (int m = 0; m < GD_L; m++) {
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* four chains: a quarter of the FMA latency */
#pragma unroll
        for (int p = 0; p < m; p++) s[p % 4] += KD[m * GD_LDL + p] * t[p];
        t[m] = m == j ? 1.0f : (m < j ? 0.0f : -st->beta[m] * ((s[0] + s[1]) + (s[2] + s[3])));
    }
#pragma unroll
    for (int m = 0; m < GD_L; m++) Tm[m * GD_LDL + j] = t[m];
}

/* The scratch of one range of chunks: W (B Hv, R L, Dkp) then (B Hv, R L, Dvp) fp32, R chunks
 * a range, as both directions lay them out. Index of token i of local chunk lc of (b, vh). */
static __device__ __forceinline__ size_t gd_row(int bh, int R, int lc, int i) {
    return ((size_t)bh * R + lc) * GD_L + i;
}

/* The kernels, for mt_cuda_gated_delta_smem_of. */
enum { MT_GD_FWD_PREP, MT_GD_FWD_SCAN, MT_GD_FWD_OUT, MT_GD_BWD_PREP, MT_GD_BWD_SCAN, MT_GD_BWD_CHUNK };
size_t mt_cuda_gated_delta_smem_of(int kernel, int Dk, int Dv);
/* The products' precision, MT_GATED_DELTA_TF32 (a diagnostic, to measure what the split costs
 * and buys; the default is GD_SPLIT_ALL):
 *   GD_PLAIN      "1"      every product plain TF32
 *   GD_SPLIT_TM   "tm"     split TF32 where Tm or W is an operand, or where a product's result
 *                          next meets Tm (the backward's K S0, whose error U = Tm R amplifies);
 *                          the rest plain
 *   GD_SPLIT_ALL  "split"  every product of the prep, scan and backward-chunk kernels split (the
 *                          forward's output kernel is plain in every mode)
 * A kernel's MODE template argument is one of these; GD_TM(MODE) and GD_ALL(MODE) are the SPLIT
 * arguments of gd_mm for the two kinds of product. */
enum { GD_PLAIN = 0, GD_SPLIT_TM = 1, GD_SPLIT_ALL = 2 };
#define GD_TM(MODE) ((MODE) >= GD_SPLIT_TM)
#define GD_ALL(MODE) ((MODE) >= GD_SPLIT_ALL)
int mt_cuda_gd_mode(void);
void mt_cuda_gd_set_smem(const void *kernel, size_t smem);

/* The backward's prep and chunk kernels as batched GEMMs (gated_delta_gemm.cu),
 * MT_GATED_DELTA_BWD=gemm: its scratch a (row, value head, chunk), and for one range the prep (the
 * operands loaded into the scratch; W, DUL and TKP as the prep kernel writes them, for the scan)
 * and, after the scan, the chunk backward (writes dq, dk, dv, dg, dbeta for the range's tokens);
 * mode one of GD_*. */
int mt_cuda_gd_bwd_gemm(void);
size_t mt_cuda_gd_gemm_bytes_per_problem(int Dk, int Dv);
void mt_cuda_gd_gemm_prep(mt_backend *be, void *scratch, float *W, float *DUL, float *TKP,
                          const bf16 *dout, const float *chunk_states, const bf16 *q,
                          const bf16 *k, const bf16 *v, const float *g, const float *beta,
                          const int32_t *doc_start, int B, int T, int Hk, int Hv, int Dk, int Dv,
                          float scale, int c_begin, int R, int nc, int t0, int mode,
                          cudaStream_t s);
void mt_cuda_gd_gemm_backward(mt_backend *be, void *scratch, bf16 *dq, bf16 *dk, bf16 *dv,
                              float *dg, float *dbeta, const float *dstates, const float *TKP,
                              const float *DUL, int B, int T, int Hk, int Hv, int Dk, int Dv,
                              float scale, int c_begin, int R, int mode, cudaStream_t s);

/* Chunks a range so that `per_chunk` bytes of scratch a chunk (all rows and heads) stay under
 * MT_CUDA_GATED_DELTA_SCRATCH; MT_GATED_DELTA_RANGE (a test's knob) sets it. */
int mt_cuda_gd_range_chunks(size_t per_chunk, int nc);

/* MT_GATED_DELTA_PROFILE=1 (a diagnostic, to see where the time goes): after each kernel the
 * stream is waited for and the kernel's wall time summed (mt_cuda_gd_prof_mark, kernel one of
 * MT_GD_* or MT_GD_REDUCE); mt_cuda_gd_prof_print writes one line a call to stderr. Off, both
 * cost nothing. */
enum { MT_GD_REDUCE = MT_GD_BWD_CHUNK + 1, MT_GD_NKERNELS };
void mt_cuda_gd_prof_start(cudaStream_t s);
void mt_cuda_gd_prof_mark(cudaStream_t s, int kernel);
void mt_cuda_gd_prof_print(const char *what);

#endif
