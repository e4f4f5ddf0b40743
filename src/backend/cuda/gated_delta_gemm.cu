/* The gated delta rule's backward prep and chunk backward (gated_delta_backward.cu's prep, chunk
 * and reduce kernels; its scan stays) as batched GEMMs (MT_GATED_DELTA_BWD=gemm): the same algebra
 * as the CPU op
 * (src/backend/cpu/gated_delta_backward.c), but each product runs once a chunk over all Dv value
 * columns, as a cuBLAS strided-batched GEMM over every (row, value head, chunk) of a range at once,
 * with small kernels for the masks, the row sums and the decays' gradient between them.
 *
 * Why: the fused chunk kernel holds 229 KB of shared memory (one block of 8 warps an SM, ~20
 * barrier-separated phases) and redoes the chunk-wide (L, L) x (L, Dk) products once per column
 * block of 32; it runs ~100 us a block, 58% of the rule's time at 128k (bench/RESULTS.md, session
 * 16). Here the products are memory-bound batched GEMMs and every intermediate crosses HBM once.
 *
 * A problem p = bh R + lc (bh = b Hv + vh, lc the range's chunk) has its operands in the scratch
 * at a fixed stride (gdg_layout): Q (scaled) and K of its key head, V and dO as fp32 rows (zero past
 * the chunk's tokens), S0 (the chunk's incoming state). The prep makes K K^T and Q K^T, then
 * (gdg_prep_kernel) KD, Tm = (I + diag(beta) KD)^-1 and P, and W = Tm diag(beta fe) K and DUL =
 * P^T dO in the layout the scan reads; after the scan, the intermediates
 *   X = K S0, R = diag(beta)(V - diag(fe) X), U = Tm R, DU = DUL + diag(lam) K dSn,
 *   DR = Tm^T DU, A' = DR U^T (dA = -A'), dP = dO U^T, LQ = dO S0^T, LK = U dSn^T
 * then (gdg_mid_kernel) dG, dbeta, dv, dX = -diag(beta fe) DR, M + M^T, dP o Dm and the rows' fe,
 * lam scalings, and finally
 *   dQ/scale = LQ + (dP o Dm) K,  dK = LK + dX S0^T + (dP o Dm)^T Q + (M + M^T) K
 * summed over the value heads of a key head into dq, dk (gdg_out_kernel, fixed order). Precision:
 * fp32 GEMMs (CUDA cores) in the default mode; MT_GATED_DELTA_TF32=1 makes them TF32, =tm makes the
 * products that do not meet Tm TF32 (gated_delta_chunk.cuh's modes). */
#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_memory.h"
#include "gated_delta_chunk.cuh"
#include "ops.cuh"

struct mt_cuda_gd_blas {
    cublasHandle_t h;
};

void mt_cuda_gd_blas_free(mt_cuda_ctx *ctx) {
    if (!ctx->gd_blas) return;
    cublasDestroy(ctx->gd_blas->h);
    free(ctx->gd_blas);
    ctx->gd_blas = NULL;
}

int mt_cuda_gd_bwd_gemm(void) {
    const char *e = getenv("MT_GATED_DELTA_BWD");
    return e && strcmp(e, "gemm") == 0;
}

static cublasHandle_t blas_of(mt_backend *be, cudaStream_t s) {
    mt_cuda_ctx *ctx = mt_cuda_ctx_of(be);
    if (!ctx->gd_blas) {
        mt_cuda_gd_blas *g = (mt_cuda_gd_blas *)mt_calloc(1, sizeof *g);
        CUBLAS_CHECK(cublasCreate(&g->h));
        /* the compute stream, then the cuBLASLt workspace (in the budget, in stream order) */
        CUBLAS_CHECK(cublasSetStream(g->h, s));
        CUBLAS_CHECK(cublasSetWorkspace(g->h, ctx->lt_workspace, ctx->lt_workspace_bytes));
        ctx->gd_blas = g;
    }
    return ctx->gd_blas->h;
}

/* Floats a problem takes in each array of the scratch, rounded to 64 (256-byte aligned). */
typedef struct {
    size_t q, v, s, l2, st; /* (L, Dk), (L, Dv), (Dk, Dv), (L, L), the stats (in floats) */
} gdg_sizes;

static size_t r64(size_t n) { return (n + 63) / 64 * 64; }

static gdg_sizes sizes_of(int Dk, int Dv) {
    gdg_sizes z = {r64((size_t)GD_L * Dk), r64((size_t)GD_L * Dv), r64((size_t)Dk * Dv),
                   (size_t)GD_L * GD_L, r64((sizeof(gd_stats) + 3) / 4)};
    return z;
}

/* The arrays, each P problems of its size. */
typedef struct {
    float *Q, *K, *V, *dO, *S0, *X, *R, *U, *DU, *DR, *A, *dP, *LQ, *LK;
    gd_stats *st;
} gdg_layout;

size_t mt_cuda_gd_gemm_bytes_per_problem(int Dk, int Dv) {
    gdg_sizes z = sizes_of(Dk, Dv);
    return (4 * z.q + 7 * z.v + z.s + 2 * z.l2 + z.st) * sizeof(float);
}

static gdg_layout layout_of(float *base, size_t P, gdg_sizes z) {
    gdg_layout a;
    float **qs[] = {&a.Q, &a.K, &a.LQ, &a.LK}, **vs[] = {&a.V, &a.dO, &a.X, &a.R, &a.U, &a.DU, &a.DR};
    for (float **p : qs) *p = base, base += P * z.q;
    for (float **p : vs) *p = base, base += P * z.v;
    a.S0 = base, base += P * z.s;
    a.A = base, base += P * z.l2;
    a.dP = base, base += P * z.l2;
    a.st = (gd_stats *)base;
    return a;
}

/* The block's threads copy a chunk's scalars (a gd_stats, word by word); the caller syncs. */
static __device__ __forceinline__ void gdg_copy_stats(gd_stats *dst, const gd_stats *src) {
    const int *from = (const int *)src, n = (int)(sizeof(gd_stats) / sizeof(int));
    for (int e = threadIdx.x; e < n; e += blockDim.x) ((int *)dst)[e] = from[e];
}

/* Per problem: its chunk's scalars (gd_load_chunk), Q scaled, K, V, dO as fp32 rows and S0. */
static __global__ void __launch_bounds__(GD_THREADS)
    gdg_load_kernel(gdg_layout a, gdg_sizes z, const float *chunk_states, const bf16 *q,
                    const bf16 *k, const bf16 *v, const bf16 *dout, const float *g,
                    const float *beta, const int32_t *doc_start, int T, int Hk, int Hv, int Dk,
                    int Dv, float scale, int c_begin, int R, int nc, int t0, int Dkp) {
    extern __shared__ __align__(128) float sm[];
    const int L = GD_L, ldk = gd_ld(Dkp);
    int p = blockIdx.x, bh = p / R, lc = p % R, b = bh / Hv, vh = bh % Hv, kh = vh / (Hv / Hk);
    int c0 = (c_begin + lc) * L, Lc = min(L, T - c0);
    float *Kc = sm;
    gd_stats *st = (gd_stats *)(Kc + L * ldk);
    gd_load_chunk(NULL, Kc, ldk, st, NULL, k, g, beta, doc_start, b, c0, Lc, kh, vh, T, Hk, Hv, Dk,
                  Dkp, 1.0f, t0);
    size_t n0 = (size_t)b * T + c0;
    float *Q = a.Q + p * z.q, *V = a.V + p * z.v, *dO = a.dO + p * z.v;
    for (int e = threadIdx.x; e < L * Dk; e += blockDim.x) {
        int i = e / Dk, d = e % Dk;
        Q[e] = i < Lc ? scale * __bfloat162float(q[((n0 + i) * Hk + kh) * Dk + d]) : 0.0f;
    }
    for (int e = threadIdx.x; e < L * Dv; e += blockDim.x) {
        int i = e / Dv, d = e % Dv;
        size_t o = ((n0 + i) * Hv + vh) * Dv + d;
        V[e] = i < Lc ? __bfloat162float(v[o]) : 0.0f;
        dO[e] = i < Lc ? __bfloat162float(dout[o]) : 0.0f;
    }
    const float *S0 = chunk_states + ((size_t)bh * nc + c_begin + lc) * Dk * Dv;
    for (int e = threadIdx.x; e < Dk * Dv; e += blockDim.x) a.S0[p * z.s + e] = S0[e];
    __syncthreads();
    float *K = a.K + p * z.q;
    for (int e = threadIdx.x; e < L * Dk; e += blockDim.x) K[e] = Kc[e / Dk * ldk + e % Dk];
    gdg_copy_stats(a.st + p, st);
}

/* R = diag(beta)(V - diag(fe) X) (DUL NULL), or DU = DUL + diag(lam) DR (DUL the prep's P^T dO,
 * rows of Dvp), over every problem. */
static __global__ void gdg_rows_kernel(gdg_layout a, gdg_sizes z, int Dv, size_t P,
                                       const float *DUL, int Dvp) {
    size_t n = P * GD_L * Dv;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t p = e / ((size_t)GD_L * Dv);
        int r = (int)(e % ((size_t)GD_L * Dv)), i = r / Dv;
        size_t o = p * z.v + r;
        const gd_stats *st = a.st + p;
        if (DUL) a.DU[o] = DUL[(p * GD_L + i) * Dvp + r % Dv] + st->lam[i] * a.DR[o];
        else a.R[o] = st->beta[i] * (a.V[o] - st->fe[i] * a.X[o]);
    }
}

/* Per problem, the prep (gated_delta_backward.cu's prep kernel): from KK = K K^T (in A's room) and
 * QK = Q K^T (in dP's), KD = strict_lower(KK o Dm), Tm = (I + diag(beta) KD)^-1 and P = QK o Dm
 * into TKP (KD, Tm, P a problem), and Kb = diag(beta fe) K into LQ's room for W = Tm Kb. */
static __global__ void __launch_bounds__(GD_THREADS)
    gdg_prep_kernel(gdg_layout a, gdg_sizes z, float *TKP, int Dk) {
    __shared__ float KD[GD_L * GD_LDL], Tm[GD_L * GD_LDL];
    __shared__ gd_stats st;
    const int L = GD_L, LDL = GD_LDL, tid = threadIdx.x;
    size_t p = blockIdx.x;
    gdg_copy_stats(&st, a.st + p);
    __syncthreads();
    const float *KK = a.A + p * z.l2, *QK = a.dP + p * z.l2;
    float *tkp = TKP + p * 3 * L * L;
    for (int e = tid; e < L * L; e += blockDim.x) {
        int i = e / L, j = e % L;
        float dm = gd_dm(&st, i, j);
        KD[i * LDL + j] = j < i ? KK[e] * dm : 0.0f;
        tkp[2 * L * L + e] = QK[e] * dm;
    }
    __syncthreads();
    gd_solve(Tm, KD, &st, tid);
    __syncthreads();
    for (int e = tid; e < L * L; e += blockDim.x) {
        int i = e / L, j = e % L;
        tkp[e] = KD[i * LDL + j];
        tkp[L * L + e] = Tm[i * LDL + j];
    }
    const float *K = a.K + p * z.q;
    float *Kb = a.LQ + p * z.q;
    for (int e = tid; e < L * Dk; e += blockDim.x) {
        int i = e / Dk;
        Kb[e] = st.beta[i] * st.fe[i] * K[e];
    }
}

/* Per problem, between the GEMMs (the chunk kernel's middle): from A' = DR U^T, dP, KD and P,
 * the decays' gradient dG (rows, columns, the scalings' rows, eL's) and dbeta; dv = diag(beta) DR
 * and dg, dbeta written; A' becomes M + M^T (M = diag(beta) dA o Dm, strict lower), dP becomes
 * dP o Dm, DU becomes dX = -diag(beta fe) DR, LQ's rows scaled by fe and LK's by lam. */
static __global__ void __launch_bounds__(GD_THREADS)
    gdg_mid_kernel(gdg_layout a, gdg_sizes z, const float *TKP, const float *dstates, bf16 *dv,
                   float *dg, float *dbeta, int T, int Hv, int Dk, int Dv, int c_begin, int R) {
    __shared__ float W[GD_L][GD_L + 1], M[GD_L][GD_L + 1];
    __shared__ float dG[GD_L], dB[GD_L], tv[GD_L], red[GD_THREADS / 32];
    __shared__ gd_stats st;
    const int L = GD_L, tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nw = blockDim.x / 32;
    size_t p = blockIdx.x;
    int bh = (int)(p / R), lc = (int)(p % R), b = bh / Hv, vh = bh % Hv;
    gdg_copy_stats(&st, a.st + p);
    const float *KD = TKP + p * 3 * L * L, *Pm = KD + 2 * L * L;
    float *Ap = a.A + p * z.l2, *dP = a.dP + p * z.l2;
    __syncthreads();
    /* w_ij = dP_ij P_ij + dA_ij beta_i KD_ij (j < i), dA = -A'; M_ij = dA_ij beta_i Dm_ij */
    for (int e = tid; e < L * L; e += blockDim.x) {
        int i = e / L, j = e % L;
        float w = 0.0f, m = 0.0f;
        if (j < i) {
            float dA = -Ap[e];
            w = dP[e] * Pm[e] + dA * st.beta[i] * KD[e];
            m = dA * st.beta[i] * gd_dm(&st, i, j);
        }
        W[i][j] = w;
        M[i][j] = m;
    }
    __syncthreads();
    for (int i = warp; i < L; i += nw) { /* a warp a row: its dG (+ at G_i), dbeta's lower part */
        float rs = 0.0f, db = 0.0f;
        for (int j = lane; j < i; j += 32) {
            rs += W[i][j];
            db -= Ap[i * L + j] * KD[i * L + j];
        }
        rs = gd_warp_sum(rs), db = gd_warp_sum(db);
        if (lane == 0) dG[i] = rs, dB[i] = db;
    }
    if (tid < L) { /* the columns' (- at G_j) */
        int j = tid;
        float cs = 0.0f;
        for (int i = j + 1; i < L; i++) cs += W[i][j];
        tv[j] = cs;
    }
    __syncthreads();
    if (tid < L) dG[tid] -= tv[tid];
    /* M + M^T into A'; dP o Dm in place */
    for (int e = tid; e < L * L; e += blockDim.x) {
        int i = e / L, j = e % L;
        Ap[e] = M[i][j] + M[j][i];
        dP[e] *= gd_dm(&st, i, j);
    }
    __syncthreads();
    /* a warp a row: the rows' products with the state and the scalings */
    const float *X = a.X + p * z.v, *Vr = a.V + p * z.v, *DR = a.DR + p * z.v, *Qr = a.Q + p * z.q;
    const float *Kr = a.K + p * z.q;
    float *DX = a.DU + p * z.v, *LQ = a.LQ + p * z.q, *LK = a.LK + p * z.q;
    int c0 = (c_begin + lc) * L;
    for (int i = warp; i < L; i += nw) {
        float beta = st.beta[i], fe = st.fe[i], lam = st.lam[i];
        float db = 0.0f, xdx = 0.0f, q = 0.0f, kk = 0.0f;
        for (int d = lane; d < Dv; d += 32) {
            size_t o = (size_t)i * Dv + d;
            float r = DR[o], x = X[o], dx = -beta * fe * r;
            db += (Vr[o] - fe * x) * r;
            xdx += x * dx;
            DX[o] = dx;
            if (i < st.Lc) dv[(((size_t)b * T + c0 + i) * Hv + vh) * Dv + d] = __float2bfloat16_rn(beta * r);
        }
        for (int d = lane; d < Dk; d += 32) {
            size_t o = (size_t)i * Dk + d;
            q += Qr[o] * LQ[o];
            kk += Kr[o] * LK[o];
            LQ[o] *= fe;
            LK[o] *= lam;
        }
        db = gd_warp_sum(db), xdx = gd_warp_sum(xdx), q = gd_warp_sum(q), kk = gd_warp_sum(kk);
        if (lane == 0) {
            dB[i] += db;
            dG[i] += fe * q + xdx - lam * kk;
            tv[i] = lam * kk;
        }
    }
    /* <S0, dSn> for eL's dG at the last token */
    const float *S0 = a.S0 + p * z.s, *dS = dstates + p * (size_t)Dk * Dv;
    float sd = 0.0f;
    for (int e = tid; e < Dk * Dv; e += blockDim.x) sd += S0[e] * dS[e];
    sd = gd_warp_sum(sd);
    if (lane == 0) red[warp] = sd;
    __syncthreads();
    if (tid == 0) {
        float last = 0.0f;
        for (int w = 0; w < nw; w++) last += red[w];
        last *= st.eL;
        for (int j = 0; j < L; j++) last += tv[j];
        dG[st.Lc - 1] += last;
        float acc = 0.0f; /* dg_m = sum over i >= m of dG_i */
        for (int i = st.Lc - 1; i >= 0; i--) {
            acc += dG[i];
            size_t n = ((size_t)b * T + c0 + i) * Hv + vh;
            dg[n] = acc;
            dbeta[n] = dB[i];
        }
    }
}

/* dq = scale * (sum over the value heads of each key head of LQ), dk the same of LK (no scale),
 * bf16, for the range's tokens before T. */
static __global__ void gdg_out_kernel(bf16 *dq, bf16 *dk, gdg_layout a, gdg_sizes z, int B, int T,
                                      int Hk, int Hv, int Dk, float scale, int c_begin, int R) {
    int rep = Hv / Hk, Rt = R * GD_L;
    size_t n = (size_t)B * Rt * Hk * Dk;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(e % Dk), kh = (int)(e / Dk % Hk);
        size_t r = e / ((size_t)Hk * Dk); /* the range's token */
        int b = (int)(r / Rt), tl = (int)(r % Rt), lc = tl / GD_L, i = tl % GD_L;
        int t = c_begin * GD_L + tl;
        if (t >= T) continue;
        float sq = 0.0f, sk = 0.0f;
        for (int u = 0; u < rep; u++) {
            size_t p = ((size_t)b * Hv + kh * rep + u) * R + lc, o = p * z.q + (size_t)i * Dk + d;
            sq += a.LQ[o];
            sk += a.LK[o];
        }
        size_t o = (((size_t)b * T + t) * Hk + kh) * Dk + d;
        dq[o] = __float2bfloat16_rn(scale * sq);
        dk[o] = __float2bfloat16_rn(sk);
    }
}

/* Row-major C (M x N, ldc) = alpha op(A) op(B) + beta C over `batch` problems at the strides
 * given (floats), op(A) M x K: cuBLAS's column-major C^T = op(B)^T op(A)^T. */
typedef struct {
    const float *p;
    int ld;
    size_t stride;
    bool t;
} gdg_mat;

static void gemm(cublasHandle_t h, cublasComputeType_t ct, int M, int N, int K, gdg_mat A,
                 gdg_mat B, float beta, float *C, int ldc, size_t strideC, size_t batch) {
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        h, B.t ? CUBLAS_OP_T : CUBLAS_OP_N, A.t ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B.p,
        CUDA_R_32F, B.ld, (long long)B.stride, A.p, CUDA_R_32F, A.ld, (long long)A.stride, &beta, C,
        CUDA_R_32F, ldc, (long long)strideC, (int)batch, ct, CUBLAS_GEMM_DEFAULT));
}

static unsigned ew_blocks(size_t n) {
    size_t b = (n + 255) / 256;
    return (unsigned)(b > 8192 ? 8192 : b);
}

/* The precisions of a mode: fp32 where a product meets Tm (or its result next does) unless
 * plain, and TF32 elsewhere in the tm and plain modes. */
typedef struct {
    cublasComputeType_t tm, rest;
} gdg_precision;

static gdg_precision precision_of(int mode) {
    gdg_precision c = {mode == GD_PLAIN ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                       mode == GD_SPLIT_ALL ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32};
    return c;
}

void mt_cuda_gd_gemm_prep(mt_backend *be, void *scratch, float *W, float *DUL, float *TKP,
                          const bf16 *dout, const float *chunk_states, const bf16 *q,
                          const bf16 *k, const bf16 *v, const float *g, const float *beta,
                          const int32_t *doc_start, int B, int T, int Hk, int Hv, int Dk, int Dv,
                          float scale, int c_begin, int R, int nc, int t0, int mode,
                          cudaStream_t s) {
    const int L = GD_L, Dkp = gd_round16(Dk), Dvp = gd_round16(Dv);
    size_t P = (size_t)B * Hv * R, tkp = 3 * (size_t)L * L;
    gdg_sizes z = sizes_of(Dk, Dv);
    gdg_layout a = layout_of((float *)scratch, P, z);
    cublasHandle_t h = blas_of(be, s);
    gdg_precision pr = precision_of(mode);
    size_t smem = (size_t)L * gd_ld(Dkp) * sizeof(float) + sizeof(gd_stats);
    mt_cuda_gd_set_smem((const void *)gdg_load_kernel, smem);
    gdg_load_kernel<<<(unsigned)P, GD_THREADS, smem, s>>>(a, z, chunk_states, q, k, v, dout, g,
                                                          beta, doc_start, T, Hk, Hv, Dk, Dv, scale,
                                                          c_begin, R, nc, t0, Dkp);
    CUDA_LAUNCH_CHECK();
    gdg_mat Km = {a.K, Dk, z.q, false}, KT = Km, Qm = {a.Q, Dk, z.q, false};
    KT.t = true;
    gemm(h, pr.rest, L, L, Dk, Km, KT, 0.0f, a.A, L, z.l2, P);             /* K K^T */
    gemm(h, pr.rest, L, L, Dk, Qm, KT, 0.0f, a.dP, L, z.l2, P);            /* Q K^T */
    gdg_prep_kernel<<<(unsigned)P, GD_THREADS, 0, s>>>(a, z, TKP, Dk);     /* KD, Tm, P; Kb */
    CUDA_LAUNCH_CHECK();
    /* the scan reads W and DUL's padded columns (zero S rows meet them): zero them first */
    if (Dkp != Dk) CUDA_CHECK(cudaMemsetAsync(W, 0, P * L * Dkp * sizeof(float), s));
    if (Dvp != Dv) CUDA_CHECK(cudaMemsetAsync(DUL, 0, P * L * Dvp * sizeof(float), s));
    gdg_mat Tmm = {TKP + L * L, L, tkp, false}, Kb = {a.LQ, Dk, z.q, false};
    gdg_mat PT = {TKP + 2 * L * L, L, tkp, true}, dOm = {a.dO, Dv, z.v, false};
    gemm(h, pr.tm, L, Dk, L, Tmm, Kb, 0.0f, W, Dkp, (size_t)L * Dkp, P);   /* W = Tm Kb */
    gemm(h, pr.rest, L, Dv, L, PT, dOm, 0.0f, DUL, Dvp, (size_t)L * Dvp, P); /* P^T dO */
}

void mt_cuda_gd_gemm_backward(mt_backend *be, void *scratch, bf16 *dq, bf16 *dk, bf16 *dv,
                              float *dg, float *dbeta, const float *dstates, const float *TKP,
                              const float *DUL, int B, int T, int Hk, int Hv, int Dk, int Dv,
                              float scale, int c_begin, int R, int mode, cudaStream_t s) {
    const int L = GD_L;
    size_t P = (size_t)B * Hv * R;
    gdg_sizes z = sizes_of(Dk, Dv);
    gdg_layout a = layout_of((float *)scratch, P, z);
    cublasHandle_t h = blas_of(be, s);
    gdg_precision pr = precision_of(mode);
    cublasComputeType_t tm = pr.tm, rest = pr.rest;
    size_t sl = (size_t)Dk * Dv, tkp = 3 * (size_t)L * L;
    gdg_mat Km = {a.K, Dk, z.q, false}, Qm = {a.Q, Dk, z.q, false}, S0m = {a.S0, Dv, z.s, false};
    gdg_mat dSm = {dstates, Dv, sl, false}, Tmm = {TKP + L * L, L, tkp, false};
    gdg_mat dOm = {a.dO, Dv, z.v, false};
    gdg_mat Um = {a.U, Dv, z.v, false};

    gemm(h, tm, L, Dv, Dk, Km, S0m, 0.0f, a.X, Dv, z.v, P);                 /* X = K S0 */
    gdg_rows_kernel<<<ew_blocks(P * L * Dv), 256, 0, s>>>(a, z, Dv, P, NULL, 0); /* R */
    CUDA_LAUNCH_CHECK();
    gdg_mat Rm = {a.R, Dv, z.v, false};
    gemm(h, tm, L, Dv, L, Tmm, Rm, 0.0f, a.U, Dv, z.v, P);                  /* U = Tm R */
    gemm(h, rest, L, Dv, Dk, Km, dSm, 0.0f, a.DR, Dv, z.v, P);              /* K dSn */
    gdg_rows_kernel<<<ew_blocks(P * L * Dv), 256, 0, s>>>(a, z, Dv, P, DUL, gd_round16(Dv));
    CUDA_LAUNCH_CHECK();                                                   /* DU = P^T dO + lam K dSn */
    gdg_mat TmT = Tmm, DUm = {a.DU, Dv, z.v, false};
    TmT.t = true;
    gemm(h, tm, L, Dv, L, TmT, DUm, 0.0f, a.DR, Dv, z.v, P);                /* DR = Tm^T DU */
    gdg_mat DRm = {a.DR, Dv, z.v, false}, UT = Um;
    UT.t = true;
    gemm(h, tm, L, L, Dv, DRm, UT, 0.0f, a.A, L, z.l2, P);                  /* A' = DR U^T */
    gemm(h, rest, L, L, Dv, dOm, UT, 0.0f, a.dP, L, z.l2, P);               /* dP = dO U^T */
    gdg_mat S0T = S0m, dST = dSm;
    S0T.t = dST.t = true;
    gemm(h, rest, L, Dk, Dv, dOm, S0T, 0.0f, a.LQ, Dk, z.q, P);             /* LQ = dO S0^T */
    gemm(h, rest, L, Dk, Dv, Um, dST, 0.0f, a.LK, Dk, z.q, P);              /* LK = U dSn^T */
    gdg_mid_kernel<<<(unsigned)P, GD_THREADS, 0, s>>>(a, z, TKP, dstates, dv, dg, dbeta, T, Hv, Dk,
                                                      Dv, c_begin, R);
    CUDA_LAUNCH_CHECK();
    gdg_mat dPm = {a.dP, L, z.l2, false}, dPT = dPm, Mm = {a.A, L, z.l2, false};
    gdg_mat dXm = {a.DU, Dv, z.v, false};
    dPT.t = true;
    gemm(h, rest, L, Dk, L, dPm, Km, 1.0f, a.LQ, Dk, z.q, P);               /* LQ += dPm K */
    gemm(h, rest, L, Dk, Dv, dXm, S0T, 1.0f, a.LK, Dk, z.q, P);             /* LK += dX S0^T */
    gemm(h, rest, L, Dk, L, dPT, Qm, 1.0f, a.LK, Dk, z.q, P);               /* LK += dPm^T Q */
    gemm(h, rest, L, Dk, L, Mm, Km, 1.0f, a.LK, Dk, z.q, P);                /* LK += (M+M^T) K */
    gdg_out_kernel<<<ew_blocks((size_t)B * R * L * Hk * Dk), 256, 0, s>>>(dq, dk, a, z, B, T, Hk,
                                                                         Hv, Dk, scale, c_begin, R);
    CUDA_LAUNCH_CHECK();
}
