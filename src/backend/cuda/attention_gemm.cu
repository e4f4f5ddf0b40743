/* Attention as cuBLASLt GEMMs over blocks of queries, for the head sizes our flash kernels lack
 * (D other than 64 and 128) where cuDNN does not take the call: Gemma 4's global layers (heads of
 * 512: cuDNN 9.19's frontend has a Hopper forward for them, no backward) and every D > 128 without
 * cuDNN. Before this, such calls ran attention.cu's fp32 fallback (one warp a query row), which
 * took ~1.2 s a layer's backward at 4096 tokens on the H100 (session 17): 10-100x off the GEMMs.
 *
 * Per row b, kv head g and block of nq queries [q0, q1): the r = H/G query heads of the group are
 * packed into one (r*nq, D) matrix (Qp; dOp likewise), so that each product is one GEMM over the
 * group, and the keys the block can see, [k0, q1) (k0 = q0 - W + 1 with a window W, else 0), are
 * read in place (K, V rows of stride G*D):
 *   forward   S = Qp K^T (fp32, (r*nq, nk));  P = exp(scale*S - lse) with the causal/window/
 *             document mask and the sink in lse (one warp a row);  O = P V, to out.
 *   backward  S again, dP = dOp V^T;  P as above, dS = P (dP - Delta) scale;  dQ = dS K (to dq);
 *             dK += dS^T Qp and dV += P^T dOp, in fp32 over the whole row (the sum over the
 *             group's heads is the GEMM's inner dimension), to dk, dv at the end.
 * P and dS feed the GEMMs as bf16 pairs hi + lo (lo = the rounding error of hi), two GEMMs each,
 * so they carry ~16 bits: with P alone in bf16, O misses the fp32 reference's bar where a few
 * large values of v cancel (attention_cudnn.h says how often), and this path is tested to that bar.
 * The masked part of each block (keys past the block's queries, before a window) is computed and
 * zeroed: with a window, blocks of about W queries keep that to about half the work; without one,
 * at most half of the diagonal block. Each block's key count is rounded up to a multiple of
 * kKeyStep (the extra keys masked), so that the GEMMs come in few shapes for matmul.cu's plan cache
 * (else a long row would make a new shape a block). Packed documents: a block's keys start at its
 * first query's document start when the host copy of the starts is at hand (noted to the backend,
 * attention_cudnn.h), since a row's starts never decrease; without it, at 0 (masked, wasted).
 * Scratch (stream-ordered pool, outside the planner's budget like the flash backward's): per block
 * 2 fp32 and 4 bf16 (r*nq, nk) buffers and the packed rows, sized to about g_block_bytes by the
 * choice of nq (at least 16 queries, which long rows of many heads can push past it); dK, dV
 * accumulators (T, D) fp32. */
#include "attention_cudnn.h"
#include "ops.cuh"

namespace {

size_t g_block_bytes = (size_t)256 << 20; /* the (r*nq, nk) buffers of one block (tests: less) */
constexpr int kRowsPerCta = 8;            /* one warp a row */
constexpr int kKeyStep = 256;             /* keys a block reads: a multiple of this (or to T) */
int g_last_ran[2];                        /* the latest forward / backward ran here */

__device__ __forceinline__ int first_key(const int32_t *doc, int b, int T, int t, int window) {
    const int s = doc ? doc[(size_t)b * T + t] : 0;
    return window > 0 ? max(s, t - window + 1) : s;
}

/* dst (r*nq, D) <- rows q0.. of the group's heads in src (B*T, H, D). 16-byte pieces: D % 8 == 0. */
__global__ void pack_rows_kernel(bf16 *__restrict__ dst, const bf16 *__restrict__ src, int b, int T,
                                 int H, int D, int g, int r, int q0, int nq) {
    const int row = blockIdx.x, j = row / nq, i = row % nq;
    const uint4 *s = (const uint4 *)(src + (((size_t)b * T + q0 + i) * H + g * r + j) * D);
    uint4 *d = (uint4 *)(dst + (size_t)row * D);
    for (int c = threadIdx.x; c < D / 8; c += blockDim.x) d[c] = s[c];
}

/* The group's heads' rows q0.. of dst (B*T, H, D) <- src (r*nq, D) fp32, rounded to bf16. */
__global__ void unpack_rows_kernel(bf16 *__restrict__ dst, const float *__restrict__ src, int b,
                                   int T, int H, int D, int g, int r, int q0, int nq) {
    const int row = blockIdx.x, j = row / nq, i = row % nq;
    bf16 *d = dst + (((size_t)b * T + q0 + i) * H + g * r + j) * D;
    const float *s = src + (size_t)row * D;
    for (int c = threadIdx.x; c < D; c += blockDim.x) d[c] = __float2bfloat16(s[c]);
}

/* Rows of kv head g in dst (B*T, G, D) <- acc (T, D) fp32. */
__global__ void unpack_kv_kernel(bf16 *__restrict__ dst, const float *__restrict__ acc, int b,
                                 int T, int G, int D, int g) {
    const int t = blockIdx.x;
    bf16 *d = dst + (((size_t)b * T + t) * G + g) * D;
    const float *s = acc + (size_t)t * D;
    for (int c = threadIdx.x; c < D; c += blockDim.x) d[c] = __float2bfloat16(s[c]);
}

__device__ __forceinline__ void split_bf16(float x, bf16 *hi, bf16 *lo) {
    const bf16 h = __float2bfloat16(x);
    *hi = h;
    *lo = __float2bfloat16(x - __bfloat162float(h));
}

__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

struct block_geom {
    int b, T, H, g, r, q0, nq, k0, nk, ld, window;
    const int32_t *doc;
    float scale;
};

/* Forward: row (j, i) of S -> lse and P = exp(scale*S - lse) (masked: 0) as hi + lo. */
__global__ void softmax_rows_kernel(bf16 *__restrict__ p_hi, bf16 *__restrict__ p_lo,
                                    float *__restrict__ lse, const float *__restrict__ S,
                                    const bf16 *__restrict__ sinks, block_geom k) {
    const int row = blockIdx.x * kRowsPerCta + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= k.r * k.nq) return;
    const int j = row / k.nq, t = k.q0 + row % k.nq, h = k.g * k.r + j;
    const int lo = first_key(k.doc, k.b, k.T, t, k.window) - k.k0, hi = t - k.k0; /* columns */
    const float *s = S + (size_t)row * k.ld;
    float m = -INFINITY;
    for (int c = max(lo, 0) + lane; c <= hi; c += 32) m = fmaxf(m, s[c] * k.scale);
    m = warp_max(m);
    const float sink = sinks ? __bfloat162float(sinks[h]) : -INFINITY;
    const float mx = fmaxf(m, sink);
    float l = 0;
    for (int c = max(lo, 0) + lane; c <= hi; c += 32) l += expf(s[c] * k.scale - mx);
    l = warp_sum(l);
    if (sinks) l += expf(sink - mx);
    const float L = mx + logf(l);
    if (lane == 0) lse[((size_t)k.b * k.H + h) * k.T + t] = L;
    bf16 *ph = p_hi + (size_t)row * k.ld, *pl = p_lo + (size_t)row * k.ld;
    for (int c = lane; c < k.nk; c += 32) {
        const float p = c >= lo && c <= hi ? expf(s[c] * k.scale - L) : 0.0f;
        split_bf16(p, &ph[c], &pl[c]);
    }
}

/* Backward: row (j, i): P from S and lse, dS = P (dP - Delta) scale; both as hi + lo. */
__global__ void grad_rows_kernel(bf16 *__restrict__ p_hi, bf16 *__restrict__ p_lo,
                                 bf16 *__restrict__ ds_hi, bf16 *__restrict__ ds_lo,
                                 const float *__restrict__ S, const float *__restrict__ dP,
                                 const float *__restrict__ lse, const float *__restrict__ delta,
                                 block_geom k) {
    const int row = blockIdx.x * kRowsPerCta + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= k.r * k.nq) return;
    const int j = row / k.nq, t = k.q0 + row % k.nq, h = k.g * k.r + j;
    const int lo = first_key(k.doc, k.b, k.T, t, k.window) - k.k0, hi = t - k.k0;
    const size_t li = ((size_t)k.b * k.H + h) * k.T + t;
    const float L = lse[li], Dl = delta[li];
    const size_t o = (size_t)row * k.ld;
    for (int c = lane; c < k.nk; c += 32) {
        float p = 0, ds = 0;
        if (c >= lo && c <= hi) {
            p = expf(S[o + c] * k.scale - L);
            ds = p * (dP[o + c] - Dl) * k.scale;
        }
        split_bf16(p, &p_hi[o + c], &p_lo[o + c]);
        split_bf16(ds, &ds_hi[o + c], &ds_lo[o + c]);
    }
}

/* Keys a block of nq queries reads: the visible span rounded up to kKeyStep, within [k0, T). */
int keys_read(int span, int k0, int T) { return min(T - k0, (span + kKeyStep - 1) / kKeyStep * kKeyStep); }

/* The widest block's row stride: every key (no window), or nq + W - 1 keys rounded as read. */
int widest_row(int nq, int T, int window) {
    const int nk = window > 0 ? keys_read(nq + window - 1, 0, T) : T;
    return (nk + 7) / 8 * 8;
}

/* Queries a block: a multiple of 16, at least 16, at most T (and about W with a window W: more
 * would compute keys no query of the block sees), with the (r*nq, widest row) buffers within
 * g_block_bytes (16 bytes an element). */
int block_queries(int r, int T, int window) {
    int cap = T;
    if (window > 0) cap = min(T, max(64, (window + 15) / 16 * 16));
    int nq = cap / 16 * 16;
    if (nq < 16) nq = min(16, T);
    while (nq > 16 && (size_t)r * nq * widest_row(nq, T, window) * 16 > g_block_bytes) nq -= 16;
    return nq;
}

struct scratch {
    void *base = nullptr;
    float *S = nullptr, *dP = nullptr, *out = nullptr, *dk = nullptr, *dv = nullptr;
    bf16 *p_hi = nullptr, *p_lo = nullptr, *ds_hi = nullptr, *ds_lo = nullptr;
    bf16 *qp = nullptr, *dop = nullptr;
};

size_t up256(size_t x) { return (x + 255) & ~(size_t)255; }

/* One allocation for every buffer (backward: the gradient ones too). */
scratch scratch_alloc(int r, int nq, int ld, int T, int D, bool backward, cudaStream_t s) {
    const size_t mn = (size_t)r * nq * ld, rows = (size_t)r * nq * D;
    size_t sizes[11] = {mn * 4, backward ? mn * 4 : 0, rows * 4, backward ? (size_t)T * D * 4 : 0,
                        backward ? (size_t)T * D * 4 : 0, mn * 2, mn * 2, backward ? mn * 2 : 0,
                        backward ? mn * 2 : 0, rows * 2, backward ? rows * 2 : 0};
    size_t total = 0;
    for (size_t x : sizes) total += up256(x);
    scratch sc;
    CUDA_CHECK(cudaMallocAsync(&sc.base, total, s));
    char *p = (char *)sc.base;
    void *ptrs[11];
    for (int i = 0; i < 11; i++) {
        ptrs[i] = sizes[i] ? p : nullptr;
        p += up256(sizes[i]);
    }
    sc.S = (float *)ptrs[0], sc.dP = (float *)ptrs[1], sc.out = (float *)ptrs[2];
    sc.dk = (float *)ptrs[3], sc.dv = (float *)ptrs[4];
    sc.p_hi = (bf16 *)ptrs[5], sc.p_lo = (bf16 *)ptrs[6], sc.ds_hi = (bf16 *)ptrs[7];
    sc.ds_lo = (bf16 *)ptrs[8], sc.qp = (bf16 *)ptrs[9], sc.dop = (bf16 *)ptrs[10];
    return sc;
}

/* The keys queries [q0, q0 + nq) read: [k0, k0 + nk), covering their visible ones [k0, q0 + nq)
 * (rounded: keys_read), and the buffers' row stride. host_doc: the row's document starts (B*T,
 * host), or NULL. */
void block_keys(int q0, int nq, int window, const int32_t *host_doc, block_geom *k) {
    k->q0 = q0, k->nq = nq;
    k->k0 = window > 0 ? max(0, q0 - window + 1) : 0;
    if (host_doc) k->k0 = max(k->k0, (int)host_doc[(size_t)k->b * k->T + q0]);
    k->nk = keys_read(q0 + nq - k->k0, k->k0, k->T);
    k->ld = (k->nk + 7) / 8 * 8; /* 16-byte rows for the bf16 operands */
}

/* What every block of a call shares. */
struct gemm_call {
    int T, H, G, D, r, nq_max, window;
    const int32_t *doc, *host_doc;
    float scale;
    const bf16 *k, *v;
};

gemm_call call_of(const bf16 *k, const bf16 *v, const int32_t *doc_start, int B, int T, int H,
                  int G, int D, float scale, int window) {
    const int r = H / G;
    return {T, H, G, D, r, block_queries(r, T, window), window, doc_start,
            doc_start ? mt_cuda_attention_noted_rows(doc_start, B, T) : nullptr, scale, k, v};
}

/* Block (b, g, q0) of c: its geometry, and where its keys and values start. */
struct block {
    block_geom geo;
    int M;
    const bf16 *k, *v;
};

block block_at(const gemm_call &c, int b, int g, int q0) {
    block bl;
    bl.geo = {b, c.T, c.H, g, c.r, 0, 0, 0, 0, 0, c.window, c.doc, c.scale};
    const int nq = min(c.nq_max, c.T - q0);
    block_keys(q0, nq, c.window, c.host_doc, &bl.geo);
    bl.M = c.r * nq;
    const size_t at = (((size_t)b * c.T + bl.geo.k0) * c.G + g) * c.D;
    bl.k = c.k + at, bl.v = c.v + at;
    return bl;
}

} // namespace

extern "C" void mt_cuda_attention_gemm_set_block_bytes(size_t bytes) {
    g_block_bytes = bytes ? bytes : (size_t)256 << 20;
}

extern "C" int mt_cuda_attention_gemm_ran(int backward) { return g_last_ran[backward ? 1 : 0]; }

void mt_cuda_attention_gemm_note(int backward, int ran) { g_last_ran[backward ? 1 : 0] = ran; }

bool mt_cuda_attention_gemm_applies(const mt_cuda_ctx *ctx, int D) {
    return ctx && D % 8 == 0 && D > 128;
}

void mt_cuda_attention_gemm_forward(mt_cuda_ctx *ctx, bf16 *out, float *lse, const bf16 *q,
                                    const bf16 *k, const bf16 *v, const int32_t *doc_start, int B,
                                    int T, int H, int G, int D, float scale, int window,
                                    const bf16 *sinks, cudaStream_t s) {
    const gemm_call c = call_of(k, v, doc_start, B, T, H, G, D, scale, window);
    const int r = c.r, nq_max = c.nq_max;
    scratch sc = scratch_alloc(r, nq_max, widest_row(nq_max, T, window), T, D, false, s);
    const int threads = D / 8 < 128 ? 64 : 128;
    for (int b = 0; b < B; b++)
        for (int g = 0; g < G; g++)
            for (int q0 = 0; q0 < T; q0 += nq_max) {
                const block bl = block_at(c, b, g, q0);
                const block_geom &geo = bl.geo;
                const int M = bl.M, nq = geo.nq;
                const bf16 *kb = bl.k, *vb = bl.v;
                pack_rows_kernel<<<M, threads, 0, s>>>(sc.qp, q, b, T, H, D, g, r, q0, nq);
                CUDA_LAUNCH_CHECK();
                mt_cuda_gemm_rm(ctx, 0, 1, M, geo.nk, D, sc.qp, D, kb, G * D, sc.S, CUDA_R_32F,
                                geo.ld, 0.0f, s);
                softmax_rows_kernel<<<(M + kRowsPerCta - 1) / kRowsPerCta, kRowsPerCta * 32, 0,
                                      s>>>(sc.p_hi, sc.p_lo, lse, sc.S, sinks, geo);
                CUDA_LAUNCH_CHECK();
                mt_cuda_gemm_rm(ctx, 0, 0, M, D, geo.nk, sc.p_hi, geo.ld, vb, G * D, sc.out,
                                CUDA_R_32F, D, 0.0f, s);
                mt_cuda_gemm_rm(ctx, 0, 0, M, D, geo.nk, sc.p_lo, geo.ld, vb, G * D, sc.out,
                                CUDA_R_32F, D, 1.0f, s);
                unpack_rows_kernel<<<M, threads, 0, s>>>(out, sc.out, b, T, H, D, g, r, q0, nq);
                CUDA_LAUNCH_CHECK();
            }
    CUDA_CHECK(cudaFreeAsync(sc.base, s));
}

void mt_cuda_attention_gemm_backward(mt_cuda_ctx *ctx, bf16 *dq, bf16 *dk, bf16 *dv,
                                     const bf16 *dout, const float *lse, const float *delta,
                                     const bf16 *q, const bf16 *k, const bf16 *v,
                                     const int32_t *doc_start, int B, int T, int H, int G, int D,
                                     float scale, int window, cudaStream_t s) {
    const gemm_call c = call_of(k, v, doc_start, B, T, H, G, D, scale, window);
    const int r = c.r, nq_max = c.nq_max;
    scratch sc = scratch_alloc(r, nq_max, widest_row(nq_max, T, window), T, D, true, s);
    const int threads = D / 8 < 128 ? 64 : 128;
    for (int b = 0; b < B; b++)
        for (int g = 0; g < G; g++) {
            CUDA_CHECK(cudaMemsetAsync(sc.dk, 0, (size_t)T * D * sizeof(float), s));
            CUDA_CHECK(cudaMemsetAsync(sc.dv, 0, (size_t)T * D * sizeof(float), s));
            for (int q0 = 0; q0 < T; q0 += nq_max) {
                const block bl = block_at(c, b, g, q0);
                const block_geom &geo = bl.geo;
                const int M = bl.M, nq = geo.nq, nk = geo.nk, ld = geo.ld;
                const bf16 *kb = bl.k, *vb = bl.v;
                pack_rows_kernel<<<M, threads, 0, s>>>(sc.qp, q, b, T, H, D, g, r, q0, nq);
                CUDA_LAUNCH_CHECK();
                pack_rows_kernel<<<M, threads, 0, s>>>(sc.dop, dout, b, T, H, D, g, r, q0, nq);
                CUDA_LAUNCH_CHECK();
                mt_cuda_gemm_rm(ctx, 0, 1, M, nk, D, sc.qp, D, kb, G * D, sc.S, CUDA_R_32F, ld,
                                0.0f, s);
                mt_cuda_gemm_rm(ctx, 0, 1, M, nk, D, sc.dop, D, vb, G * D, sc.dP, CUDA_R_32F, ld,
                                0.0f, s);
                grad_rows_kernel<<<(M + kRowsPerCta - 1) / kRowsPerCta, kRowsPerCta * 32, 0, s>>>(
                    sc.p_hi, sc.p_lo, sc.ds_hi, sc.ds_lo, sc.S, sc.dP, lse, delta, geo);
                CUDA_LAUNCH_CHECK();
                /* dQ (M, D) = dS K: complete for these queries, so straight to dq */
                mt_cuda_gemm_rm(ctx, 0, 0, M, D, nk, sc.ds_hi, ld, kb, G * D, sc.out, CUDA_R_32F,
                                D, 0.0f, s);
                mt_cuda_gemm_rm(ctx, 0, 0, M, D, nk, sc.ds_lo, ld, kb, G * D, sc.out, CUDA_R_32F,
                                D, 1.0f, s);
                unpack_rows_kernel<<<M, threads, 0, s>>>(dq, sc.out, b, T, H, D, g, r, q0, nq);
                CUDA_LAUNCH_CHECK();
                /* dK[k0..] += dS^T Qp, dV[k0..] += P^T dOp: the group's heads summed by the GEMM */
                float *dkb = sc.dk + (size_t)geo.k0 * D, *dvb = sc.dv + (size_t)geo.k0 * D;
                mt_cuda_gemm_rm(ctx, 1, 0, nk, D, M, sc.ds_hi, ld, sc.qp, D, dkb, CUDA_R_32F, D,
                                1.0f, s);
                mt_cuda_gemm_rm(ctx, 1, 0, nk, D, M, sc.ds_lo, ld, sc.qp, D, dkb, CUDA_R_32F, D,
                                1.0f, s);
                mt_cuda_gemm_rm(ctx, 1, 0, nk, D, M, sc.p_hi, ld, sc.dop, D, dvb, CUDA_R_32F, D,
                                1.0f, s);
                mt_cuda_gemm_rm(ctx, 1, 0, nk, D, M, sc.p_lo, ld, sc.dop, D, dvb, CUDA_R_32F, D,
                                1.0f, s);
            }
            unpack_kv_kernel<<<T, threads, 0, s>>>(dk, sc.dk, b, T, G, D, g);
            CUDA_LAUNCH_CHECK();
            unpack_kv_kernel<<<T, threads, 0, s>>>(dv, sc.dv, b, T, G, D, g);
            CUDA_LAUNCH_CHECK();
        }
    CUDA_CHECK(cudaFreeAsync(sc.base, s));
}
