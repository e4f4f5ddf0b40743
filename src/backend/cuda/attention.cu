/* Causal grouped-query flash attention (FlashAttention-2 style) for bf16, fp32 softmax statistics.
 *
 * Layout (backend.h): q (B*T, H, D), k and v (B*T, G, D), token-major; out like q; lse (B, H, T)
 * natural-log logsumexp of the scaled scores; scale 1/sqrt(D); query head h uses kv head h/(H/G).
 * With doc_start, query t of row b sees keys s with doc_start[b*T+t] <= s <= t (the value is clamped
 * to [0, t] on the device, so the diagonal is always visible and no row is ever fully masked).
 *
 * The options (backend.h's mt_attention_opts, as the CPU reference cpu/attention.c does them):
 *  - scale: only the factor passed to the kernels changes.
 *  - window W: query t's first key is also >= t - W + 1. Everything that already follows a row's
 *    first key (the tiles a forward CTA loads, the warps' tile skipping and masking, the query
 *    blocks a backward CTA visits, the fallback's loops) then keeps to the band, so a window costs
 *    O(T*W), not O(T^2). W >= T hides nothing and runs as no window.
 *  - sinks: one more logit per (row, head), of value zero, folded into each row's max and sum
 *    after the key loop (the lse includes it); in the backward it changes nothing but lse, and
 *    dsinks[h] -= sum over rows of exp(sink_h - lse) * Delta (its dP is 0), one CTA per head.
 * The tensor-core kernels take the window and sinks through a template flag (OPT), so the plain
 * instances are compiled exactly as without options.
 *
 * Fast path (D = 64 or 128, q/k/v/out/dout 16-byte aligned): tensor cores through mma.sync
 * m16n8k16 bf16 (inline PTX), ldmatrix from padded shared memory (row stride D+8: no bank
 * conflicts), cp.async double buffering.
 *  - Forward: one CTA per (b, h, block of 16*NW queries), NW warps, each warp owns 16 query rows
 *    with its Q fragments in registers; loops over 64-key tiles from the tile of the block's smallest
 *    doc_start up to the causal limit; online softmax in fp32 (exp2 domain); warps skip tiles that
 *    are fully masked for their rows; only tiles that cross the diagonal or a document start are
 *    masked element by element.
 *  - Backward: (1) Delta = rowsum(dO * O) (fp32, B x H x T) and a zeroed fp32 dQ accumulator, both
 *    in one cudaMallocAsync'd scratch on the stream; (2) one CTA per (b, kv head g, block of 128 keys),
 *    8 warps of 16 keys each, looping over the 64-query blocks of all H/G query heads of g that can
 *    see the key block (up to the end of the document of its last key); S^T = K Q^T and
 *    dP^T = V dO^T per warp, P^T and dS^T feed dV += P^T dO and dK += dS^T Q straight from registers
 *    (dK, dV accumulate in fp32 registers over the whole loop and are written once, no atomics);
 *    dS^T goes through shared memory for dQ = dS K, added with fp32 float2 atomicAdd into the
 *    accumulator; (3) the accumulator is converted to bf16 dq.
 * Heads wider than 128 (D % 8 == 0) that cuDNN does not take: attention_gemm.cu's blocked GEMMs
 * (which do materialize a block of queries x their keys).
 * Fallback (any other D, misaligned pointers, or no cuBLASLt context): simple correct kernels, one
 * warp per query row (forward, dq) or per key row (dk, dv), streaming 32 keys/queries at a time
 * with fp32 math. Nothing T x T is ever materialized.
 * cuDNN's fused flash attention (attention_cudnn.cu) runs instead where attention_cudnn.h's choice
 * (MT_ATTENTION, per shape) says so; the launchers below ask it first.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_cudnn.h"
#include "ops.cuh"

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

/* ----------------------------------------------------------------------------------------------
 * PTX helpers
 * -------------------------------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte async copy; when !pred the destination is zero-filled and nothing is read. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool pred) {
    int n = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* c (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col). */
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 2^x on the SFU (flushes denormal results to 0; -inf gives 0). */
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ int warp_min(int x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = min(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ int warp_max(int x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = max(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_maxf(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* First visible key of query t (doc_start clamped to [0, t]). */
__device__ __forceinline__ int first_key(const int32_t *doc, int b, int T, int t) {
    if (!doc) return 0;
    int s = doc[(size_t)b * T + t];
    return min(max(s, 0), t);
}

/* First visible key of query t with a window W > 0 (0: none) too: also >= t - W + 1. */
__device__ __forceinline__ int first_key_w(const int32_t *doc, int b, int T, int t, int window) {
    const int s = first_key(doc, b, T, t);
    return window > 0 ? max(s, t - window + 1) : s;
}
/* first_key_w in the kernels with the options (OPT), first_key itself in the plain ones. */
template <bool OPT>
__device__ __forceinline__ int first_key_opt(const int32_t *doc, int b, int T, int t, int window) {
    if constexpr (OPT) return first_key_w(doc, b, T, t, window);
    else return first_key(doc, b, T, t);
}

/* ROWS x D tile, rows row0.. of a matrix with leading dimension ld (elements), into shared memory
 * with row stride D+8; rows >= T are zero-filled. */
template <int D, int ROWS, int NT>
__device__ __forceinline__ void load_tile(bf16 *sm, const bf16 *g, size_t ld, int row0, int T,
                                          int tid) {
    constexpr int CH = D / 8, LDS = D + 8, TOTAL = ROWS * CH, ITERS = (TOTAL + NT - 1) / NT;
#pragma unroll
    for (int it = 0; it < ITERS; it++) {
        int i = tid + it * NT;
        if (TOTAL % NT == 0 || i < TOTAL) {
            int r = i / CH, c = (i % CH) * 8, t = row0 + r;
            bool ok = t < T;
            const bf16 *src = g + (size_t)(ok ? t : 0) * ld + c;
            cp_async16(smem_u32(sm + r * LDS + c), src, ok);
        }
    }
}

/* ----------------------------------------------------------------------------------------------
 * Forward, tensor cores
 * -------------------------------------------------------------------------------------------- */

constexpr int kFwdBK = 64;

template <int D, int NW> constexpr size_t fwd_smem_bytes() {
    return (size_t)(NW * 16 + 4 * kFwdBK) * (D + 8) * sizeof(bf16);
}

/* OPT: the window (window > 0) and the sinks (sinks not null, (H) bf16) are read; !OPT: neither. */
template <int D, int NW, bool OPT>
__global__ void __launch_bounds__(NW * 32)
    attn_fwd_kernel(bf16 *__restrict__ out, float *__restrict__ lse, const bf16 *__restrict__ q,
                    const bf16 *__restrict__ k, const bf16 *__restrict__ v,
                    const int32_t *__restrict__ doc, int T, int H, int G, float sl2, int window,
                    const bf16 *__restrict__ sinks) {
    constexpr int BQ = NW * 16, BK = kFwdBK, LDS = D + 8, NT = NW * 32, DT = D / 8, KS = D / 16;
    extern __shared__ __align__(16) unsigned char smraw[];
    bf16 *Qs = reinterpret_cast<bf16 *>(smraw);
    bf16 *Ks = Qs + BQ * LDS;     /* 2 stages */
    bf16 *Vs = Ks + 2 * BK * LDS; /* 2 stages */
    __shared__ int s_wmin[NW];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, cq = lane & 3;
    const int qb = gridDim.x - 1 - blockIdx.x; /* the widest blocks first */
    const int b = blockIdx.y / H, h = blockIdx.y - b * H, g = h / (H / G);
    const int t0 = qb * BQ;
    const size_t ldq = (size_t)H * D, ldk = (size_t)G * D;
    const bf16 *qg = q + (size_t)b * T * ldq + (size_t)h * D;
    const bf16 *kg = k + (size_t)b * T * ldk + (size_t)g * D;
    const bf16 *vg = v + (size_t)b * T * ldk + (size_t)g * D;

    const int rA = t0 + warp * 16 + gq, rB = rA + 8;
    const int dsA = rA < T ? first_key_opt<OPT>(doc, b, T, rA, window) : 0;
    const int dsB = rB < T ? first_key_opt<OPT>(doc, b, T, rB, window) : 0;
    const int wr0 = t0 + warp * 16, wr1 = min(wr0 + 15, T - 1);
    const bool wvalid = wr0 < T;
    int mn = INT_MAX, mx = 0;
    if (rA < T) mn = min(mn, dsA), mx = max(mx, dsA);
    if (rB < T) mn = min(mn, dsB), mx = max(mx, dsB);
    const int wdsmin = warp_min(mn), wdsmax = warp_max(mx);
    if (lane == 0) s_wmin[warp] = wdsmin;
    __syncthreads();
    int bmin = INT_MAX;
#pragma unroll
    for (int w = 0; w < NW; w++) bmin = min(bmin, s_wmin[w]);
    const int kstart = (bmin / BK) * BK;
    const int kend = min(t0 + BQ, T);
    const int ntiles = (kend - kstart + BK - 1) / BK;

    load_tile<D, BQ, NT>(Qs, qg, ldq, t0, T, tid);
    load_tile<D, BK, NT>(Ks, kg, ldk, kstart, T, tid);
    load_tile<D, BK, NT>(Vs, vg, ldk, kstart, T, tid);
    cp_async_commit();

    float o[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f;
    uint32_t qf[KS][4];

    for (int it = 0; it < ntiles; it++) {
        const int buf = it & 1, kt0 = kstart + it * BK;
        if (it + 1 < ntiles) {
            load_tile<D, BK, NT>(Ks + (buf ^ 1) * BK * LDS, kg, ldk, kt0 + BK, T, tid);
            load_tile<D, BK, NT>(Vs + (buf ^ 1) * BK * LDS, vg, ldk, kt0 + BK, T, tid);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < KS; kk++)
                ldsm_x4(qf[kk], smem_u32(Qs + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS +
                                         kk * 16 + (lane >> 4) * 8));
        }
        const bool active = wvalid && kt0 <= wr1 && kt0 + BK - 1 >= wdsmin;
        if (active) {
            const bf16 *Kb = Ks + buf * BK * LDS, *Vb = Vs + buf * BK * LDS;
            float s[8][4];
#pragma unroll
            for (int j = 0; j < 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
#pragma unroll
                for (int jp = 0; jp < 4; jp++) {
                    uint32_t bb[4];
                    ldsm_x4(bb, smem_u32(Kb + (jp * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + kk * 16 +
                                         ((lane >> 3) & 1) * 8));
                    mma_bf16(s[2 * jp], qf[kk], bb[0], bb[1]);
                    mma_bf16(s[2 * jp + 1], qf[kk], bb[2], bb[3]);
                }
            }
            if (kt0 + BK - 1 > wr0 || kt0 < wdsmax) {
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        int col = kt0 + j * 8 + 2 * cq + e;
                        if (col > rA || col < dsA) s[j][e] = -INFINITY;
                        if (col > rB || col < dsB) s[j][2 + e] = -INFINITY;
                    }
            }
            float tmA = -INFINITY, tmB = -INFINITY;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                tmA = fmaxf(tmA, fmaxf(s[j][0], s[j][1]));
                tmB = fmaxf(tmB, fmaxf(s[j][2], s[j][3]));
            }
            tmA = fmaxf(tmA, __shfl_xor_sync(0xffffffffu, tmA, 1));
            tmA = fmaxf(tmA, __shfl_xor_sync(0xffffffffu, tmA, 2));
            tmB = fmaxf(tmB, __shfl_xor_sync(0xffffffffu, tmB, 1));
            tmB = fmaxf(tmB, __shfl_xor_sync(0xffffffffu, tmB, 2));
            const float mnA = fmaxf(mA, tmA), mnB = fmaxf(mB, tmB);
            const float muA = mnA == -INFINITY ? 0.0f : mnA, muB = mnB == -INFINITY ? 0.0f : mnB;
            const float alA = ex2((mA - muA) * sl2), alB = ex2((mB - muB) * sl2);
            mA = mnA;
            mB = mnB;
            const float bA = muA * sl2, bB = muB * sl2;
            float sumA = 0.0f, sumB = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                s[j][0] = ex2(fmaf(s[j][0], sl2, -bA));
                s[j][1] = ex2(fmaf(s[j][1], sl2, -bA));
                s[j][2] = ex2(fmaf(s[j][2], sl2, -bB));
                s[j][3] = ex2(fmaf(s[j][3], sl2, -bB));
                sumA += s[j][0] + s[j][1];
                sumB += s[j][2] + s[j][3];
            }
            lA = lA * alA + sumA;
            lB = lB * alB + sumB;
#pragma unroll
            for (int j = 0; j < DT; j++) {
                o[j][0] *= alA;
                o[j][1] *= alA;
                o[j][2] *= alB;
                o[j][3] *= alB;
            }
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                uint32_t a[4];
                a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
                a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
                a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                for (int dp = 0; dp < D / 16; dp++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, smem_u32(Vb + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS +
                                           dp * 16 + (lane >> 4) * 8));
                    mma_bf16(o[2 * dp], a, bb[0], bb[1]);
                    mma_bf16(o[2 * dp + 1], a, bb[2], bb[3]);
                }
            }
        }
        __syncthreads();
    }

    lA += __shfl_xor_sync(0xffffffffu, lA, 1);
    lA += __shfl_xor_sync(0xffffffffu, lA, 2);
    lB += __shfl_xor_sync(0xffffffffu, lB, 1);
    lB += __shfl_xor_sync(0xffffffffu, lB, 2);
    /* fA, fB: o's factor to the final max; m2A, m2B: that max in log2 units (the sink may raise it) */
    float fA = 1.0f, fB = 1.0f, m2A = 0.0f, m2B = 0.0f;
    if constexpr (OPT) {
        m2A = mA * sl2, m2B = mB * sl2;
        if (sinks) { /* the sink's logit (nats) joins each row's max and sum; its value is zero */
            const float s2 = __bfloat162float(sinks[h]) * kLog2e;
            const float nA = fmaxf(m2A, s2), nB = fmaxf(m2B, s2);
            fA = ex2(m2A - nA), fB = ex2(m2B - nB);
            lA = lA * fA + ex2(s2 - nA);
            lB = lB * fB + ex2(s2 - nB);
            m2A = nA, m2B = nB;
        }
    }
    if (rA < T) {
        const float inv = fA / lA;
        bf16 *op = out + ((size_t)b * T + rA) * ldq + (size_t)h * D + 2 * cq;
#pragma unroll
        for (int j = 0; j < DT; j++)
            *reinterpret_cast<__nv_bfloat162 *>(op + j * 8) =
                __floats2bfloat162_rn(o[j][0] * inv, o[j][1] * inv);
        if (cq == 0)
            lse[((size_t)b * H + h) * T + rA] =
                OPT ? (m2A + log2f(lA)) * kLn2 : (mA * sl2 + log2f(lA)) * kLn2;
    }
    if (rB < T) {
        const float inv = fB / lB;
        bf16 *op = out + ((size_t)b * T + rB) * ldq + (size_t)h * D + 2 * cq;
#pragma unroll
        for (int j = 0; j < DT; j++)
            *reinterpret_cast<__nv_bfloat162 *>(op + j * 8) =
                __floats2bfloat162_rn(o[j][2] * inv, o[j][3] * inv);
        if (cq == 0)
            lse[((size_t)b * H + h) * T + rB] =
                OPT ? (m2B + log2f(lB)) * kLn2 : (mB * sl2 + log2f(lB)) * kLn2;
    }
}

/* ----------------------------------------------------------------------------------------------
 * Backward, tensor cores
 * -------------------------------------------------------------------------------------------- */

constexpr int kBwdBK = 128, kBwdBQ = 64, kBwdNW = 8;

template <int D> constexpr size_t bwd_smem_bytes() {
    return (size_t)(2 * kBwdBK + 4 * kBwdBQ) * (D + 8) * sizeof(bf16) /* K, V, 2x Q, 2x dO */
           + (size_t)kBwdBK * (kBwdBQ + 8) * sizeof(bf16)            /* dS^T */
           + (size_t)2 * kBwdBQ * (2 * sizeof(float) + sizeof(int)); /* lse2, Delta, doc start */
}

/* OPT: the window (window > 0) is read; !OPT: it is not. (The sinks only change lse here.) */
template <int D, bool OPT>
__global__ void __launch_bounds__(kBwdNW * 32, 1)
    attn_bwd_kernel(float *__restrict__ dqacc, bf16 *__restrict__ dk, bf16 *__restrict__ dv,
                    const bf16 *__restrict__ dout, const float *__restrict__ lse,
                    const float *__restrict__ delta, const bf16 *__restrict__ q,
                    const bf16 *__restrict__ k, const bf16 *__restrict__ v,
                    const int32_t *__restrict__ doc, int T, int H, int G, float scale, float sl2,
                    int window) {
    constexpr int NW = kBwdNW, NT = NW * 32, BK = kBwdBK, BQ = kBwdBQ, LDS = D + 8, LDSS = BQ + 8;
    constexpr int KS = D / 16, DT = D / 8;
    extern __shared__ __align__(16) unsigned char smraw[];
    bf16 *Ks = reinterpret_cast<bf16 *>(smraw);
    bf16 *Vs = Ks + BK * LDS;
    bf16 *Qs = Vs + BK * LDS;    /* 2 stages */
    bf16 *dOs = Qs + 2 * BQ * LDS; /* 2 stages */
    bf16 *dSs = dOs + 2 * BQ * LDS;
    float *lse2_s = reinterpret_cast<float *>(dSs + BK * LDSS); /* 2 stages */
    float *dl_s = lse2_s + 2 * BQ;                               /* 2 stages */
    int *ds_s = reinterpret_cast<int *>(dl_s + 2 * BQ);          /* 2 stages */
    __shared__ int s_qend;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, cq = lane & 3;
    const int kb = blockIdx.x, b = blockIdx.y / G, g = blockIdx.y - b * G, rep = H / G;
    const int k0 = kb * BK, klast = min(k0 + BK, T) - 1;
    const size_t ldq = (size_t)H * D, ldk = (size_t)G * D;
    const bf16 *kg = k + (size_t)b * T * ldk + (size_t)g * D;
    const bf16 *vg = v + (size_t)b * T * ldk + (size_t)g * D;

    /* Queries that may see this key block: [k0, qend], qend = the last t whose first key <= klast.
     * A window W ends the search at klast + W - 1, the last query whose band reaches klast. */
    int qend = T - 1;
    if constexpr (OPT)
        if (window > 0) qend = min(qend, klast + window - 1);
    if (doc) {
        if (tid == 0) s_qend = klast;
        __syncthreads();
        int loc = -1;
        const int tend = OPT ? qend + 1 : T;
        for (int t = klast + 1 + tid; t < tend; t += NT)
            if (first_key(doc, b, T, t) <= klast) loc = t;
        loc = warp_max(loc);
        if (lane == 0 && loc >= 0) atomicMax(&s_qend, loc);
        __syncthreads();
        qend = s_qend;
    }
    const int qb0 = k0 / BQ, nqb = qend / BQ - qb0 + 1, nitems = rep * nqb;

    auto load_item = [&](int i, int buf) {
        const int hh = i / nqb, t0 = (qb0 + i % nqb) * BQ, h = g * rep + hh;
        const size_t off = (size_t)b * T * ldq + (size_t)h * D;
        load_tile<D, BQ, NT>(Qs + buf * BQ * LDS, q + off, ldq, t0, T, tid);
        load_tile<D, BQ, NT>(dOs + buf * BQ * LDS, dout + off, ldq, t0, T, tid);
        if (tid < BQ) {
            const int t = t0 + tid;
            const size_t li = ((size_t)b * H + h) * T + t;
            lse2_s[buf * BQ + tid] = t < T ? lse[li] * kLog2e : 0.0f;
            dl_s[buf * BQ + tid] = t < T ? delta[li] : 0.0f;
            ds_s[buf * BQ + tid] = t < T ? first_key_opt<OPT>(doc, b, T, t, window) : 0;
        }
    };

    load_tile<D, BK, NT>(Ks, kg, ldk, k0, T, tid);
    load_tile<D, BK, NT>(Vs, vg, ldk, k0, T, tid);
    load_item(0, 0);
    cp_async_commit();

    float dK[DT][4], dV[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) dK[j][e] = dV[j][e] = 0.0f;

    const int kw0 = k0 + warp * 16, keyA = kw0 + gq, keyB = keyA + 8;

    for (int i = 0; i < nitems; i++) {
        const int buf = i & 1;
        const int hh = i / nqb, t0 = (qb0 + i % nqb) * BQ, h = g * rep + hh;
        if (i + 1 < nitems) {
            load_item(i + 1, buf ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16 *Qb = Qs + buf * BQ * LDS, *dOb = dOs + buf * BQ * LDS;
        const float *lse2b = lse2_s + buf * BQ, *dlb = dl_s + buf * BQ;
        const int *dsb = ds_s + buf * BQ;
        const int bdsmin = warp_min(min(dsb[lane], dsb[lane + 32]));
        const int bdsmax = warp_max(max(dsb[lane], dsb[lane + 32]));
        const int tq1 = min(t0 + BQ - 1, T - 1);
        const bool active = kw0 < T && tq1 >= kw0 && bdsmin <= kw0 + 15;
        if (active) {
            float S[8][4], P[8][4];
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) S[j][e] = P[j][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                uint32_t a[4], av[4];
                ldsm_x4(a, smem_u32(Ks + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS +
                                    kk * 16 + (lane >> 4) * 8));
                ldsm_x4(av, smem_u32(Vs + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS +
                                     kk * 16 + (lane >> 4) * 8));
#pragma unroll
                for (int jp = 0; jp < 4; jp++) {
                    uint32_t bb[4];
                    const int off = (jp * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + kk * 16 +
                                    ((lane >> 3) & 1) * 8;
                    ldsm_x4(bb, smem_u32(Qb + off));
                    mma_bf16(S[2 * jp], a, bb[0], bb[1]);
                    mma_bf16(S[2 * jp + 1], a, bb[2], bb[3]);
                    ldsm_x4(bb, smem_u32(dOb + off));
                    mma_bf16(P[2 * jp], av, bb[0], bb[1]);
                    mma_bf16(P[2 * jp + 1], av, bb[2], bb[3]);
                }
            }
            /* S -> P^T (in S), P (dP^T) -> dS^T */
            const bool needmask = t0 < kw0 + 15 || bdsmax > kw0 || t0 + BQ > T;
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int c = j * 8 + 2 * cq + e, t = t0 + c;
                    const float l2 = lse2b[c], dl = dlb[c];
                    float pa = ex2(fmaf(S[j][e], sl2, -l2));
                    float pb = ex2(fmaf(S[j][2 + e], sl2, -l2));
                    if (needmask) {
                        const int ds = dsb[c];
                        if (!(t < T && keyA <= t && ds <= keyA)) pa = 0.0f;
                        if (!(t < T && keyB <= t && ds <= keyB)) pb = 0.0f;
                    }
                    S[j][e] = pa;
                    S[j][2 + e] = pb;
                    P[j][e] = pa * (P[j][e] - dl);
                    P[j][2 + e] = pb * (P[j][2 + e] - dl);
                }
#pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) {
                uint32_t ap[4], as[4];
                ap[0] = pack_bf16(S[2 * kk][0], S[2 * kk][1]);
                ap[1] = pack_bf16(S[2 * kk][2], S[2 * kk][3]);
                ap[2] = pack_bf16(S[2 * kk + 1][0], S[2 * kk + 1][1]);
                ap[3] = pack_bf16(S[2 * kk + 1][2], S[2 * kk + 1][3]);
                as[0] = pack_bf16(P[2 * kk][0], P[2 * kk][1]);
                as[1] = pack_bf16(P[2 * kk][2], P[2 * kk][3]);
                as[2] = pack_bf16(P[2 * kk + 1][0], P[2 * kk + 1][1]);
                as[3] = pack_bf16(P[2 * kk + 1][2], P[2 * kk + 1][3]);
                /* dS^T to shared memory for dQ */
                bf16 *dsr = dSs + (warp * 16 + gq) * LDSS + kk * 16 + 2 * cq;
                *reinterpret_cast<uint32_t *>(dsr) = as[0];
                *reinterpret_cast<uint32_t *>(dsr + 8 * LDSS) = as[1];
                *reinterpret_cast<uint32_t *>(dsr + 8) = as[2];
                *reinterpret_cast<uint32_t *>(dsr + 8 * LDSS + 8) = as[3];
#pragma unroll
                for (int dp = 0; dp < D / 16; dp++) {
                    uint32_t bb[4];
                    const int off =
                        (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + dp * 16 + (lane >> 4) * 8;
                    ldsm_x4_t(bb, smem_u32(dOb + off));
                    mma_bf16(dV[2 * dp], ap, bb[0], bb[1]);
                    mma_bf16(dV[2 * dp + 1], ap, bb[2], bb[3]);
                    ldsm_x4_t(bb, smem_u32(Qb + off));
                    mma_bf16(dK[2 * dp], as, bb[0], bb[1]);
                    mma_bf16(dK[2 * dp + 1], as, bb[2], bb[3]);
                }
            }
        } else {
            bf16 *dsr = dSs + (warp * 16 + gq) * LDSS + 2 * cq;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                *reinterpret_cast<uint32_t *>(dsr + j * 8) = 0u;
                *reinterpret_cast<uint32_t *>(dsr + 8 * LDSS + j * 8) = 0u;
            }
        }
        const int any = __syncthreads_or(active);
        if (any) {
            /* dQ (BQ x D) = dS (BQ x BK) K (BK x D): warp -> 16 query rows x D/2 columns */
            const int mq = (warp & 3) * 16, nd0 = (warp >> 2) * (D / 2);
            float acc[D / 16][4];
#pragma unroll
            for (int j = 0; j < D / 16; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                uint32_t a[4];
                ldsm_x4_t(a, smem_u32(dSs + (kk * 16 + (lane & 7) + (lane >> 4) * 8) * LDSS + mq +
                                      ((lane >> 3) & 1) * 8));
#pragma unroll
                for (int dp = 0; dp < D / 32; dp++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, smem_u32(Ks + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS +
                                           nd0 + dp * 16 + (lane >> 4) * 8));
                    mma_bf16(acc[2 * dp], a, bb[0], bb[1]);
                    mma_bf16(acc[2 * dp + 1], a, bb[2], bb[3]);
                }
            }
            /* quad neighbours swap halves so that each thread adds 4 consecutive floats (one
             * float4 reduction instead of two float2: halves the L2 atomic operations) */
            const bool odd = cq & 1;
            const int trow = t0 + mq + gq + (odd ? 8 : 0);
            float *qa = dqacc + ((size_t)b * T + trow) * ldq + (size_t)h * D + nd0 + 2 * (cq & ~1);
#pragma unroll
            for (int j = 0; j < D / 16; j++) {
                const float s0 = odd ? acc[j][0] : acc[j][2], s1 = odd ? acc[j][1] : acc[j][3];
                const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1);
                const float r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
                const float4 val = odd ? make_float4(r0 * scale, r1 * scale, acc[j][2] * scale,
                                                     acc[j][3] * scale)
                                       : make_float4(acc[j][0] * scale, acc[j][1] * scale,
                                                     r0 * scale, r1 * scale);
                if (trow < T) atomicAdd(reinterpret_cast<float4 *>(qa + j * 8), val);
            }
        }
    }

    if (keyA < T) {
        const size_t off = ((size_t)b * T + keyA) * ldk + (size_t)g * D + 2 * cq;
#pragma unroll
        for (int j = 0; j < DT; j++) {
            *reinterpret_cast<__nv_bfloat162 *>(dk + off + j * 8) =
                __floats2bfloat162_rn(dK[j][0] * scale, dK[j][1] * scale);
            *reinterpret_cast<__nv_bfloat162 *>(dv + off + j * 8) =
                __floats2bfloat162_rn(dV[j][0], dV[j][1]);
        }
    }
    if (keyB < T) {
        const size_t off = ((size_t)b * T + keyB) * ldk + (size_t)g * D + 2 * cq;
#pragma unroll
        for (int j = 0; j < DT; j++) {
            *reinterpret_cast<__nv_bfloat162 *>(dk + off + j * 8) =
                __floats2bfloat162_rn(dK[j][2] * scale, dK[j][3] * scale);
            *reinterpret_cast<__nv_bfloat162 *>(dv + off + j * 8) =
                __floats2bfloat162_rn(dV[j][2], dV[j][3]);
        }
    }
}

/* Delta[b, h, t] = sum_d dO * O, one warp per (token, head) row. */
__global__ void attn_bwd_delta_kernel(float *__restrict__ delta, const bf16 *__restrict__ dout,
                                      const bf16 *__restrict__ out, int B, int T, int H, int D) {
    const size_t row = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= (size_t)B * T * H) return;
    const bf16 *a = dout + row * D, *o = out + row * D;
    float acc = 0.0f;
    for (int d = lane; d < D; d += 32) acc += __bfloat162float(a[d]) * __bfloat162float(o[d]);
    acc = warp_sum(acc);
    if (lane == 0) {
        const int h = (int)(row % H);
        const size_t bt = row / H;
        const int t = (int)(bt % T), b = (int)(bt / T);
        delta[((size_t)b * H + h) * T + t] = acc;
    }
}

/* dsinks[h] += sum over rows (b, t) of the sink's dS = p_sink * (dP_sink - Delta), where
 * p_sink = exp(sink_h - lse) and dP_sink = dO . (its value, zero) = 0: -= p_sink * Delta (as
 * cpu/attention.c). One CTA per head, fp64 partial sums in a fixed order: deterministic. */
constexpr int kSinkThreads = 512;

__global__ void __launch_bounds__(kSinkThreads)
    attn_bwd_dsinks_kernel(float *__restrict__ dsinks, const bf16 *__restrict__ sinks,
                           const float *__restrict__ lse, const float *__restrict__ delta, int B,
                           int T, int H) {
    __shared__ double part[kSinkThreads / 32];
    const int h = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float sink = __bfloat162float(sinks[h]);
    double acc = 0.0;
    for (int b = 0; b < B; b++) {
        const size_t row = ((size_t)b * H + h) * T;
        for (int t = threadIdx.x; t < T; t += kSinkThreads)
            acc += (double)(expf(sink - lse[row + t]) * delta[row + t]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) part[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double sum = 0.0;
        for (int w = 0; w < kSinkThreads / 32; w++) sum += part[w];
        dsinks[h] -= (float)sum;
    }
}

__global__ void attn_f32_to_bf16_kernel(bf16 *__restrict__ dst, const float *__restrict__ src,
                                        size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i + 3 < n) {
        float4 x = *reinterpret_cast<const float4 *>(src + i);
        *reinterpret_cast<__nv_bfloat162 *>(dst + i) = __floats2bfloat162_rn(x.x, x.y);
        *reinterpret_cast<__nv_bfloat162 *>(dst + i + 2) = __floats2bfloat162_rn(x.z, x.w);
    } else {
        for (; i < n; i++) dst[i] = __float2bfloat16(src[i]);
    }
}

/* ----------------------------------------------------------------------------------------------
 * Fallback kernels (any D): one warp per query row or key row, fp32, 32 keys/queries per step.
 * Shared memory: per warp two vectors of D floats. OPT as for the tensor-core kernels: only those
 * instances read the window and the sinks.
 * -------------------------------------------------------------------------------------------- */

constexpr int kFbWarps = 4;

template <bool OPT>
__global__ void attn_fwd_fallback(bf16 *__restrict__ out, float *__restrict__ lse,
                                  const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                                  const bf16 *__restrict__ v, const int32_t *__restrict__ doc,
                                  int B, int T, int H, int G, int D, float scale, int window,
                                  const bf16 *__restrict__ sinks) {
    extern __shared__ float fsm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * kFbWarps + warp; /* (b, t, h) */
    if (row >= (size_t)B * T * H) return;
    float *qs = fsm + warp * 2 * D, *os = qs + D;
    const int h = (int)(row % H), t = (int)((row / H) % T), b = (int)(row / H / T);
    const int g = h / (H / G);
    const size_t ldk = (size_t)G * D;
    const bf16 *qp = q + row * D;
    for (int d = lane; d < D; d += 32) qs[d] = __bfloat162float(qp[d]), os[d] = 0.0f;
    __syncwarp();
    const bf16 *kb = k + (size_t)b * T * ldk + (size_t)g * D;
    const bf16 *vb = v + (size_t)b * T * ldk + (size_t)g * D;
    const int lo = first_key_opt<OPT>(doc, b, T, t, window);
    float m = -INFINITY, l = 0.0f;
    for (int s0 = lo; s0 <= t; s0 += 32) {
        const int s = s0 + lane;
        float sc = -INFINITY;
        if (s <= t) {
            const bf16 *kp = kb + (size_t)s * ldk;
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc += qs[d] * __bfloat162float(kp[d]);
            sc = acc * scale;
        }
        const float mn = fmaxf(m, warp_maxf(sc)); /* finite: s0 <= t */
        const float al = expf(m - mn);
        const float p = s <= t ? expf(sc - mn) : 0.0f;
        l = l * al + warp_sum(p);
        m = mn;
        const int n = min(32, t - s0 + 1);
        for (int d0 = 0; d0 < D; d0 += 32) { /* every lane runs the shuffles */
            const int d = d0 + lane;
            float acc = 0.0f;
            for (int j = 0; j < n; j++) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
                if (d < D) acc += pj * __bfloat162float(vb[(size_t)(s0 + j) * ldk + d]);
            }
            if (d < D) os[d] = os[d] * al + acc;
        }
    }
    float f = 1.0f; /* os's factor to the final max */
    if constexpr (OPT) {
        if (sinks) { /* the sink's logit joins the max and the sum; its value is zero */
            const float sink = __bfloat162float(sinks[h]), mn = fmaxf(m, sink);
            f = expf(m - mn);
            l = l * f + expf(sink - mn);
            m = mn;
        }
    }
    const float inv = f / l;
    bf16 *op = out + row * D;
    for (int d = lane; d < D; d += 32) op[d] = __float2bfloat16(os[d] * inv);
    if (lane == 0) lse[((size_t)b * H + h) * T + t] = m + logf(l);
}

/* dq row (b, t, h): sum over visible keys of dS * k * scale. */
template <bool OPT>
__global__ void attn_bwd_dq_fallback(bf16 *__restrict__ dq, const bf16 *__restrict__ dout,
                                     const float *__restrict__ lse, const float *__restrict__ delta,
                                     const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                                     const bf16 *__restrict__ v, const int32_t *__restrict__ doc,
                                     int B, int T, int H, int G, int D, float scale, int window) {
    extern __shared__ float fsm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * kFbWarps + warp;
    if (row >= (size_t)B * T * H) return;
    float *qs = fsm + warp * 3 * D, *dos = qs + D, *acc_s = dos + D;
    const int h = (int)(row % H), t = (int)((row / H) % T), b = (int)(row / H / T);
    const int g = h / (H / G);
    const size_t ldk = (size_t)G * D;
    for (int d = lane; d < D; d += 32) {
        qs[d] = __bfloat162float(q[row * D + d]);
        dos[d] = __bfloat162float(dout[row * D + d]);
        acc_s[d] = 0.0f;
    }
    __syncwarp();
    const bf16 *kb = k + (size_t)b * T * ldk + (size_t)g * D;
    const bf16 *vb = v + (size_t)b * T * ldk + (size_t)g * D;
    const size_t li = ((size_t)b * H + h) * T + t;
    const float L = lse[li], Dl = delta[li];
    const int lo = first_key_opt<OPT>(doc, b, T, t, window);
    for (int s0 = lo; s0 <= t; s0 += 32) {
        const int s = s0 + lane;
        float dsv = 0.0f;
        if (s <= t) {
            const bf16 *kp = kb + (size_t)s * ldk, *vp = vb + (size_t)s * ldk;
            float sc = 0.0f, dp = 0.0f;
            for (int d = 0; d < D; d++) {
                sc += qs[d] * __bfloat162float(kp[d]);
                dp += dos[d] * __bfloat162float(vp[d]);
            }
            const float p = expf(sc * scale - L);
            dsv = p * (dp - Dl);
        }
        const int n = min(32, t - s0 + 1);
        for (int d0 = 0; d0 < D; d0 += 32) {
            const int d = d0 + lane;
            float a = 0.0f;
            for (int j = 0; j < n; j++) {
                const float c = __shfl_sync(0xffffffffu, dsv, j);
                if (d < D) a += c * __bfloat162float(kb[(size_t)(s0 + j) * ldk + d]);
            }
            if (d < D) acc_s[d] += a;
        }
    }
    for (int d = lane; d < D; d += 32) dq[row * D + d] = __float2bfloat16(acc_s[d] * scale);
}

/* dk, dv row (b, s, g): over the query heads of g and the queries that see key s. */
template <bool OPT>
__global__ void attn_bwd_dkdv_fallback(bf16 *__restrict__ dk, bf16 *__restrict__ dv,
                                       const bf16 *__restrict__ dout, const float *__restrict__ lse,
                                       const float *__restrict__ delta, const bf16 *__restrict__ q,
                                       const bf16 *__restrict__ k, const bf16 *__restrict__ v,
                                       const int32_t *__restrict__ doc, int B, int T, int H, int G,
                                       int D, float scale, int window) {
    extern __shared__ float fsm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * kFbWarps + warp; /* (b, s, g) */
    if (row >= (size_t)B * T * G) return;
    float *ks = fsm + warp * 4 * D, *vs = ks + D, *dks = vs + D, *dvs = dks + D;
    const int g = (int)(row % G), s = (int)((row / G) % T), b = (int)(row / G / T);
    const int rep = H / G;
    const size_t ldq = (size_t)H * D;
    for (int d = lane; d < D; d += 32) {
        ks[d] = __bfloat162float(k[row * D + d]);
        vs[d] = __bfloat162float(v[row * D + d]);
        dks[d] = dvs[d] = 0.0f;
    }
    __syncwarp();
    const int tend = OPT && window > 0 ? min(T, s + window) : T; /* later queries miss key s */
    for (int h = g * rep; h < (g + 1) * rep; h++) {
        const bf16 *qb = q + (size_t)b * T * ldq + (size_t)h * D;
        const bf16 *db = dout + (size_t)b * T * ldq + (size_t)h * D;
        for (int t0 = s; t0 < tend; t0 += 32) {
            const int t = t0 + lane;
            float p = 0.0f, dsv = 0.0f;
            if (t < tend && first_key(doc, b, T, t) <= s) {
                const bf16 *qp = qb + (size_t)t * ldq, *dp_ = db + (size_t)t * ldq;
                float sc = 0.0f, dp = 0.0f;
                for (int d = 0; d < D; d++) {
                    sc += __bfloat162float(qp[d]) * ks[d];
                    dp += __bfloat162float(dp_[d]) * vs[d];
                }
                const size_t li = ((size_t)b * H + h) * T + t;
                p = expf(sc * scale - lse[li]);
                dsv = p * (dp - delta[li]);
            }
            if (!__any_sync(0xffffffffu, p != 0.0f || dsv != 0.0f)) continue;
            const int n = min(32, tend - t0);
            for (int d0 = 0; d0 < D; d0 += 32) {
                const int d = d0 + lane;
                float a = 0.0f, c2 = 0.0f;
                for (int j = 0; j < n; j++) {
                    const float pj = __shfl_sync(0xffffffffu, p, j);
                    const float sj = __shfl_sync(0xffffffffu, dsv, j);
                    if (d < D) {
                        a += pj * __bfloat162float(db[(size_t)(t0 + j) * ldq + d]);
                        c2 += sj * __bfloat162float(qb[(size_t)(t0 + j) * ldq + d]);
                    }
                }
                if (d < D) dvs[d] += a, dks[d] += c2;
            }
        }
    }
    for (int d = lane; d < D; d += 32) {
        dk[row * D + d] = __float2bfloat16(dks[d] * scale);
        dv[row * D + d] = __float2bfloat16(dvs[d]);
    }
}

/* ----------------------------------------------------------------------------------------------
 * Launch helpers
 * -------------------------------------------------------------------------------------------- */

/* Forward warps per CTA for the fast path (8: 128 queries per CTA, measured faster than 4 on H200);
 * the bench may change it. */
int g_attn_fwd_warps = 8;

/* The OPT instance only when a window or sinks are asked for: plain calls run the plain one. */
template <int D, int NW>
void launch_fwd(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                const int32_t *doc, int B, int T, int H, int G, float sl2, int window,
                const bf16 *sinks, cudaStream_t s) {
    constexpr size_t smem = fwd_smem_bytes<D, NW>();
    const bool opt = window > 0 || sinks;
    auto kernel = opt ? attn_fwd_kernel<D, NW, true> : attn_fwd_kernel<D, NW, false>;
    static bool attr_set[2] = {false, false}; /* per instance; idempotent, so a race is harmless */
    if (!attr_set[opt]) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem));
        attr_set[opt] = true;
    }
    dim3 grid((T + NW * 16 - 1) / (NW * 16), B * H);
    kernel<<<grid, NW * 32, smem, s>>>(out, lse, q, k, v, doc, T, H, G, sl2, window, sinks);
    CUDA_LAUNCH_CHECK();
}

template <int D>
void launch_bwd(float *dqacc, bf16 *dk, bf16 *dv, const bf16 *dout, const float *lse,
                const float *delta, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *doc,
                int B, int T, int H, int G, float scale, int window, cudaStream_t s) {
    constexpr size_t smem = bwd_smem_bytes<D>();
    const bool opt = window > 0;
    auto kernel = opt ? attn_bwd_kernel<D, true> : attn_bwd_kernel<D, false>;
    static bool attr_set[2] = {false, false};
    if (!attr_set[opt]) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem));
        attr_set[opt] = true;
    }
    dim3 grid((T + kBwdBK - 1) / kBwdBK, B * G);
    kernel<<<grid, kBwdNW * 32, smem, s>>>(dqacc, dk, dv, dout, lse, delta, q, k, v, doc, T, H, G,
                                           scale, scale * kLog2e, window);
    CUDA_LAUNCH_CHECK();
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* MT_ATTN_FORCE_FALLBACK=1 (diagnostic): the fallback kernels (fp32 P and dS) for every D, to tell
 * the fast path's bf16 P / dS rounding apart from the rest of a model's bf16 error. */
bool force_fallback() {
    static const int v = [] {
        const char *e = getenv("MT_ATTN_FORCE_FALLBACK");
        return e && *e && strcmp(e, "0") != 0 ? 1 : 0;
    }();
    return v != 0;
}

bool fast_path(int D, const void *a, const void *b, const void *c, const void *d, const void *e) {
    return (D == 64 || D == 128) && !force_fallback() && aligned16(a) && aligned16(b) &&
           aligned16(c) && aligned16(d) && aligned16(e);
}

/* attention_gemm.cu's blocked GEMMs: heads the flash kernels lack, where cuBLASLt is at hand;
 * a, b, c: the tensors its 16-byte row copies read or write (cuBLASLt takes any alignment). */
bool gemm_path(const mt_cuda_ctx *ctx, int D, const void *a, const void *b, const void *c) {
    return mt_cuda_attention_experimental() && mt_cuda_attention_gemm_applies(ctx, D) &&
           !force_fallback() && aligned16(a) && aligned16(b) && aligned16(c);
}

/* Once a process: the fp32 fallback kernels run a model's attention, which costs 10-100x the
 * tensor-core paths (a Gemma 4 step took 297 s on the H100, session 17), so the user hears why. */
void note_fallback(int D) {
    static bool said = false;
    if (said) return;
    said = true;
    fprintf(stderr,
            "megatrain: attention with heads of %d runs the fp32 fallback kernels (one warp a query "
            "row), which are 10-100x slower than the tensor-core paths (heads of 64 or 128, or cuDNN "
            "where it applies)%s\n",
            D,
            D > 128 && D % 8 == 0 && !mt_cuda_attention_experimental()
                ? "; MT_EXPERIMENTAL_ATTENTION=1 runs them as GEMMs (not yet verified on a GPU)"
                : "");
}

/* delta (B, H, T) = rowsum(dout * out); then, with dsinks, dsinks += the sinks' gradient (from
 * lse and delta). */
void delta_and_dsinks(float *delta, float *dsinks, const bf16 *sinks, const bf16 *dout,
                      const bf16 *out, const float *lse, int B, int T, int H, int D,
                      cudaStream_t s) {
    const size_t rows = (size_t)B * T * H;
    attn_bwd_delta_kernel<<<(unsigned)((rows + 7) / 8), 256, 0, s>>>(delta, dout, out, B, T, H, D);
    CUDA_LAUNCH_CHECK();
    if (!dsinks) return;
    attn_bwd_dsinks_kernel<<<H, kSinkThreads, 0, s>>>(dsinks, sinks, lse, delta, B, T, H);
    CUDA_LAUNCH_CHECK();
}

/* opts->dsinks += the sinks' gradient, for a backward that did not compute it (cuDNN's, whose
 * graph needs no sinks). */
void sinks_grad(const mt_attention_opts *opts, const bf16 *dout, const bf16 *out, const float *lse,
                int B, int T, int H, int D, cudaStream_t s) {
    float *delta = nullptr;
    CUDA_CHECK(cudaMallocAsync((void **)&delta, (size_t)B * T * H * sizeof(float), s));
    delta_and_dsinks(delta, opts->dsinks, (const bf16 *)opts->sinks, dout, out, lse, B, T, H, D, s);
    CUDA_CHECK(cudaFreeAsync(delta, s));
}

void check_shapes(int B, int T, int H, int G, int D) {
    MT_CHECK(B >= 0 && T >= 0 && H >= 0 && D > 0, "attention: B=%d T=%d H=%d D=%d", B, T, H, D);
    MT_CHECK(G > 0 && H % G == 0, "attention: H=%d is not a multiple of G=%d", H, G);
    MT_CHECK((long long)B * H <= 65535 && (long long)B * G <= 65535,
             "attention: B*H=%lld exceeds the grid limit", (long long)B * H);
}

/* The options as the kernels take them: the scale (0: 1/sqrt(D)), the window (0 where none, or
 * where W >= T hides no key: then the plain kernels run) and the sinks (null: none). */
struct attn_options {
    float scale;
    int window;
    const bf16 *sinks;
};

attn_options resolve_options(const mt_attention_opts *opts, int T, int D) {
    attn_options o = {1.0f / sqrtf((float)D), 0, nullptr};
    if (!opts) return o;
    MT_CHECK(opts->window >= 0, "attention: window %d must be >= 0", opts->window);
    /* the tensor-core kernels mask raw scores with -inf before scaling */
    MT_CHECK(opts->scale >= 0, "attention: scale %g must be >= 0 (0: 1/sqrt(D))",
             (double)opts->scale);
    if (opts->scale != 0) o.scale = opts->scale;
    o.window = opts->window < T ? opts->window : 0;
    o.sinks = (const bf16 *)opts->sinks;
    return o;
}

} // namespace

void mt_cuda_attention_forward(mt_cuda_ctx *ctx, bf16 *out, float *lse, const bf16 *q,
                               const bf16 *k, const bf16 *v, const int32_t *doc_start, int B,
                               int T, int H, int G, int D, cudaStream_t s,
                               const mt_attention_opts *opts) {
    check_shapes(B, T, H, G, D);
    mt_cuda_attention_gemm_note(0, 0);
    if (B == 0 || T == 0 || H == 0) return;
    if (mt_cuda_attention_cudnn_forward(out, lse, q, k, v, doc_start, B, T, H, G, D, opts, s))
        return;
    const attn_options o = resolve_options(opts, T, D);
    const float scale = o.scale, sl2 = scale * kLog2e;
    if (fast_path(D, out, q, k, v, q)) {
        const bool w8 = g_attn_fwd_warps == 8;
        const int W = o.window;
        if (D == 64) {
            if (w8) launch_fwd<64, 8>(out, lse, q, k, v, doc_start, B, T, H, G, sl2, W, o.sinks, s);
            else launch_fwd<64, 4>(out, lse, q, k, v, doc_start, B, T, H, G, sl2, W, o.sinks, s);
        } else {
            if (w8) launch_fwd<128, 8>(out, lse, q, k, v, doc_start, B, T, H, G, sl2, W, o.sinks, s);
            else launch_fwd<128, 4>(out, lse, q, k, v, doc_start, B, T, H, G, sl2, W, o.sinks, s);
        }
        return;
    }
    if (gemm_path(ctx, D, q, k, v)) {
        mt_cuda_attention_gemm_note(0, 1);
        mt_cuda_attention_gemm_forward(ctx, out, lse, q, k, v, doc_start, B, T, H, G, D, scale,
                                       o.window, o.sinks, s);
        return;
    }
    const size_t rows = (size_t)B * T * H;
    const size_t smem = (size_t)kFbWarps * 2 * D * sizeof(float);
    MT_CHECK(smem <= 48 * 1024, "attention: D=%d too large for the fallback kernel", D);
    note_fallback(D);
    auto fallback = o.window > 0 || o.sinks ? attn_fwd_fallback<true> : attn_fwd_fallback<false>;
    fallback<<<(unsigned)((rows + kFbWarps - 1) / kFbWarps), kFbWarps * 32, smem, s>>>(
        out, lse, q, k, v, doc_start, B, T, H, G, D, scale, o.window, o.sinks);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_attention_backward(mt_cuda_ctx *ctx, bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout,
                                const bf16 *out, const float *lse, const bf16 *q, const bf16 *k,
                                const bf16 *v, const int32_t *doc_start, int B, int T, int H,
                                int G, int D, cudaStream_t s, const mt_attention_opts *opts) {
    check_shapes(B, T, H, G, D);
    mt_cuda_attention_gemm_note(1, 0);
    if (B == 0 || T == 0 || H == 0) return;
    if (mt_cuda_attention_cudnn_backward(dq, dk, dv, dout, out, lse, q, k, v, doc_start, B, T, H, G,
                                         D, opts, s)) {
        if (opts && opts->sinks && opts->dsinks) sinks_grad(opts, dout, out, lse, B, T, H, D, s);
        return;
    }
    const attn_options o = resolve_options(opts, T, D);
    const float scale = o.scale;
    float *dsinks = opts && o.sinks ? opts->dsinks : nullptr;
    const size_t rows = (size_t)B * T * H;
    const bool fast = fast_path(D, dout, q, k, v, dq);
    /* scratch: Delta (B*H*T floats), then for the fast path the fp32 dQ accumulator */
    const size_t delta_bytes = (rows * sizeof(float) + 255) & ~(size_t)255;
    const size_t bytes = delta_bytes + (fast ? rows * D * sizeof(float) : 0);
    void *scratch = nullptr;
    CUDA_CHECK(cudaMallocAsync(&scratch, bytes, s));
    float *delta = (float *)scratch;
    float *dqacc = (float *)((char *)scratch + delta_bytes);

    delta_and_dsinks(delta, dsinks, o.sinks, dout, out, lse, B, T, H, D, s);
    if (fast) {
        CUDA_CHECK(cudaMemsetAsync(dqacc, 0, rows * D * sizeof(float), s));
        if (D == 64)
            launch_bwd<64>(dqacc, dk, dv, dout, lse, delta, q, k, v, doc_start, B, T, H, G, scale,
                           o.window, s);
        else
            launch_bwd<128>(dqacc, dk, dv, dout, lse, delta, q, k, v, doc_start, B, T, H, G, scale,
                            o.window, s);
        const size_t n = rows * D;
        attn_f32_to_bf16_kernel<<<(unsigned)((n / 4 + 255) / 256 + 1), 256, 0, s>>>(dq, dqacc, n);
        CUDA_LAUNCH_CHECK();
    } else if (gemm_path(ctx, D, dout, q, dq)) {
        mt_cuda_attention_gemm_note(1, 1);
        mt_cuda_attention_gemm_backward(ctx, dq, dk, dv, dout, lse, delta, q, k, v, doc_start, B, T,
                                        H, G, D, scale, o.window, s);
    } else {
        const size_t smem_q = (size_t)kFbWarps * 3 * D * sizeof(float);
        const size_t smem_k = (size_t)kFbWarps * 4 * D * sizeof(float);
        MT_CHECK(smem_k <= 48 * 1024, "attention: D=%d too large for the fallback kernel", D);
        const bool opt = o.window > 0;
        auto dq_kernel = opt ? attn_bwd_dq_fallback<true> : attn_bwd_dq_fallback<false>;
        auto dkdv_kernel = opt ? attn_bwd_dkdv_fallback<true> : attn_bwd_dkdv_fallback<false>;
        dq_kernel<<<(unsigned)((rows + kFbWarps - 1) / kFbWarps), kFbWarps * 32, smem_q, s>>>(
            dq, dout, lse, delta, q, k, v, doc_start, B, T, H, G, D, scale, o.window);
        CUDA_LAUNCH_CHECK();
        const size_t krows = (size_t)B * T * G;
        dkdv_kernel<<<(unsigned)((krows + kFbWarps - 1) / kFbWarps), kFbWarps * 32, smem_k, s>>>(
            dk, dv, dout, lse, delta, q, k, v, doc_start, B, T, H, G, D, scale, o.window);
        CUDA_LAUNCH_CHECK();
    }
    CUDA_CHECK(cudaFreeAsync(scratch, s));
}
