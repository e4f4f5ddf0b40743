/* The gated delta rule's chunked backward (backend.h's gated_delta_backward): the CPU op's algebra
 * (src/backend/cpu/gated_delta_backward.c) on one block per (row, value head, 32 value columns),
 * chunks in reverse, each recomputed from its saved incoming state, the block's slice dS (Dk x 32)
 * of the state's gradient carried. dv is column-local and written directly; dq, dk, dg and dbeta
 * sum over value columns (and dq, dk over the value heads of a key head), so each block writes its
 * part to fp32 scratch and gd_reduce_kernel adds the parts in a fixed order (deterministic).
 * Scratch: 2 N (Hv ceil(Dv/32)) (Dk + 1) floats (at Hv = 32, Dk = Dv = 128: 128 KiB a token). */
#include "gated_delta_chunk.cuh"
#include "ops.cuh"

static __device__ __forceinline__ float gd_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Parts (N, P, Dk) for dq and dk and (N, P) for dg and dbeta, P = Hv * nvb, part index
 * vh * nvb + vb. */
static __global__ void __launch_bounds__(GD_THREADS)
    gated_delta_backward_kernel(bf16 *dv, float *dq_part, float *dk_part, float *dg_part,
                                float *dbeta_part, const bf16 *dout, const float *chunk_states,
                                const bf16 *q, const bf16 *k, const bf16 *v, const float *g,
                                const float *beta, const int32_t *doc_start, int T, int Hk,
                                int Hv, int Dk, int Dv, int Dkp, float scale) {
    extern __shared__ __align__(128) float sm[];
    const int L = GD_L, BV = GD_BV, tid = threadIdx.x, nt = blockDim.x;
    const int lane = tid % 32, warp = tid / 32, nw = nt / 32;
    int b = blockIdx.x / Hv, vh = blockIdx.x % Hv, kh = vh / (Hv / Hk), v0 = blockIdx.y * BV;
    int P = Hv * gridDim.y, part = vh * gridDim.y + blockIdx.y;
    float *Qs = sm, *Kc = Qs + L * Dkp, *S0 = Kc + L * Dkp, *dS = S0 + Dkp * BV;
    float *KD = dS + Dkp * BV, *Tm = KD + L * L, *Pm = Tm + L * L, *dP = Pm + L * L;
    float *X = dP + L * L, *DO = X + L * BV, *U = DO + L * BV, *DR = U + L * BV, *DU = DR + L * BV;
    float *dG = DU + L * BV, *dB = dG + L, *tv = dB + L, *red = tv + L;
    float *LK = Tm; /* (L, Dkp) over Tm and Pm once both are dead */
    gd_stats *st = (gd_stats *)(red + 8);
    int nc = (T + L - 1) / L;
    for (int e = tid; e < Dkp * BV; e += nt) dS[e] = 0.0f;
    for (int ci = nc - 1; ci >= 0; ci--) {
        int c0 = ci * L, Lc = min(L, T - c0);
        size_t n0 = (size_t)b * T + c0;
        const float *cs = chunk_states + (((size_t)b * Hv + vh) * nc + ci) * Dk * Dv;
        float sd = 0.0f; /* <S0, dSn> for eL's dG */
        for (int e = tid; e < Dkp * BV; e += nt) {
            int r = e / BV, j = e % BV;
            float x = r < Dk && v0 + j < Dv ? cs[(size_t)r * Dv + v0 + j] : 0.0f;
            S0[e] = x;
            sd += x * dS[e];
        }
        sd = gd_warp_sum(sd);
        if (lane == 0) red[warp] = sd;
        gd_load_chunk(Qs, Kc, st, q, k, g, beta, doc_start, b, c0, Lc, kh, vh, T, Hk, Hv, Dk, Dkp,
                      scale);
        __syncthreads();
        gd_mm<false, true>(KD, L, Kc, Dkp, Kc, Dkp, L, L, Dkp, false, 0, 4);
        gd_mm<false, false>(X, BV, Kc, Dkp, S0, BV, L, BV, Dkp, false, 4, 4);
        __syncthreads();
        for (int e = tid; e < L * L; e += nt) {
            int i = e / L, j = e % L;
            KD[e] = j < i ? KD[e] * gd_dm(st, i, j) : 0.0f;
        }
        __syncthreads();
        gd_solve(Tm, KD, st, tid);
        gd_mm<false, true>(Pm, L, Qs, Dkp, Kc, Dkp, L, L, Dkp, false, 2, 6);
        __syncthreads();
        for (int e = tid; e < L * BV; e += nt) { /* R = diag(beta)(V - diag(fe) X), in DO's place */
            int i = e / BV, j = e % BV;
            float vv = 0.0f;
            if (i < Lc && v0 + j < Dv)
                vv = __bfloat162float(v[((n0 + i) * Hv + vh) * Dv + v0 + j]);
            DO[e] = st->beta[i] * (vv - st->fe[i] * X[e]);
        }
        for (int e = tid; e < L * L; e += nt) Pm[e] *= gd_dm(st, e / L, e % L);
        __syncthreads();
        gd_mm<false, false>(U, BV, Tm, L, DO, BV, L, BV, L, false, 0, 4);   /* U = Tm R */
        gd_mm<false, false>(DR, BV, Kc, Dkp, dS, BV, L, BV, Dkp, false, 4, 4); /* Z = K dSn */
        __syncthreads();
        for (int e = tid; e < L * BV; e += nt) {
            int i = e / BV, j = e % BV;
            DO[e] = i < Lc && v0 + j < Dv
                        ? __bfloat162float(dout[((n0 + i) * Hv + vh) * Dv + v0 + j])
                        : 0.0f;
        }
        __syncthreads();
        gd_mm<true, false>(DU, BV, Pm, L, DO, BV, L, BV, L, false, 0, 8); /* dU = P^T dO */
        __syncthreads();
        for (int e = tid; e < L * BV; e += nt) DU[e] += st->lam[e / BV] * DR[e];
        __syncthreads();
        gd_mm<true, false>(DR, BV, Tm, L, DU, BV, L, BV, L, false, 0, 8); /* dR = Tm^T dU */
        __syncthreads();
        /* dA = -(dR U^T) in Tm's place (stored un-negated), dP = dO U^T */
        gd_mm<false, true>(Tm, L, DR, BV, U, BV, L, L, BV, false, 0, 4);
        gd_mm<false, true>(dP, L, DO, BV, U, BV, L, L, BV, false, 4, 4);
        __syncthreads();
        /* the rows' dG (+ at G_i) and dbeta; w_ij kept in Pm for the columns' (- at G_j) */
        if (tid < L) {
            int i = tid;
            float rs = 0.0f, db = 0.0f, bi = st->beta[i];
            for (int j = 0; j < L; j++) {
                float w = 0.0f;
                if (j < i) {
                    float dA = -Tm[i * L + j];
                    w = dP[i * L + j] * Pm[i * L + j] + dA * bi * KD[i * L + j];
                    db += dA * KD[i * L + j];
                }
                rs += w;
                Pm[i * L + j] = w;
            }
            float fe = st->fe[i];
            for (int j = 0; j < BV; j++) {
                float vv = 0.0f;
                if (i < Lc && v0 + j < Dv)
                    vv = __bfloat162float(v[((n0 + i) * Hv + vh) * Dv + v0 + j]);
                db += (vv - fe * X[i * BV + j]) * DR[i * BV + j];
            }
            dG[i] = rs;
            dB[i] = db;
        }
        __syncthreads();
        if (tid < L) {
            int j = tid;
            float cs_ = 0.0f;
            for (int i = j + 1; i < L; i++) cs_ += Pm[i * L + j];
            dG[j] -= cs_;
        }
        /* M + M^T (M = diag(beta) dA o Dm, strict lower) in KD's place; dP o Dm in place */
        for (int e = tid; e < L * L; e += nt) {
            int i = e / L, j = e % L;
            float m = 0.0f;
            if (j < i) m = -Tm[i * L + j] * st->beta[i] * gd_dm(st, i, j);
            else if (i < j) m = -Tm[j * L + i] * st->beta[j] * gd_dm(st, j, i);
            KD[e] = m;
            dP[e] *= gd_dm(st, i, j);
        }
        __syncthreads();
        /* dQ = diag(fe) dO S0^T + (dP o Dm) K; its dG_i = fe_i Q_i . (S0 dO_i) */
        gd_mm<false, true>(LK, Dkp, DO, BV, S0, BV, L, Dkp, BV, false, 0, 8);
        __syncthreads();
        for (int i = warp; i < L; i += nw) {
            float d = 0.0f, fe = st->fe[i];
            for (int c = lane; c < Dkp; c += 32) {
                d += Qs[i * Dkp + c] * LK[i * Dkp + c];
                LK[i * Dkp + c] *= fe;
            }
            d = gd_warp_sum(d);
            if (lane == 0) dG[i] += fe * d;
        }
        __syncthreads();
        gd_mm<false, false>(LK, Dkp, dP, L, Kc, Dkp, L, Dkp, L, true, 0, 8);
        __syncthreads();
        for (int e = tid; e < L * Dkp; e += nt) {
            int i = e / Dkp, d = e % Dkp;
            if (i < Lc && d < Dk) dq_part[((n0 + i) * P + part) * Dk + d] = scale * LK[e];
        }
        /* dX = -diag(beta fe) dR (in dU's place), dv = diag(beta) dR */
        for (int e = tid; e < L * BV; e += nt) {
            int i = e / BV, j = e % BV;
            float r = DR[e], bi = st->beta[i];
            DU[e] = -bi * st->fe[i] * r;
            if (i < Lc && v0 + j < Dv)
                dv[((n0 + i) * Hv + vh) * Dv + v0 + j] = __float2bfloat16_rn(bi * r);
        }
        __syncthreads();
        for (int i = warp; i < L; i += nw) { /* BV == 32: a lane a column */
            float d = gd_warp_sum(X[i * BV + lane] * DU[i * BV + lane]);
            if (lane == 0) dG[i] += d;
        }
        /* dK = diag(lam) U dSn^T + dX S0^T + (dP o Dm)^T Q + (M + M^T) K */
        gd_mm<false, true>(LK, Dkp, U, BV, dS, BV, L, Dkp, BV, false, 0, 8);
        __syncthreads();
        for (int j = warp; j < L; j += nw) {
            float d = 0.0f, lam = st->lam[j];
            for (int c = lane; c < Dkp; c += 32) {
                d += Kc[j * Dkp + c] * LK[j * Dkp + c];
                LK[j * Dkp + c] *= lam;
            }
            d = gd_warp_sum(d);
            if (lane == 0) {
                dG[j] -= lam * d;
                tv[j] = lam * d;
            }
        }
        __syncthreads();
        gd_mm<false, true>(LK, Dkp, DU, BV, S0, BV, L, Dkp, BV, true, 0, 8);
        gd_mm<true, false>(LK, Dkp, dP, L, Qs, Dkp, L, Dkp, L, true, 0, 8);
        gd_mm<false, false>(LK, Dkp, KD, L, Kc, Dkp, L, Dkp, L, true, 0, 8);
        __syncthreads();
        for (int e = tid; e < L * Dkp; e += nt) {
            int i = e / Dkp, d = e % Dkp;
            if (i < Lc && d < Dk) dk_part[((n0 + i) * P + part) * Dk + d] = LK[e];
        }
        /* dS0 = eL dSn + Q^T diag(fe) dO + K^T dX */
        float eL = st->eL;
        for (int e = tid; e < Dkp * BV; e += nt) dS[e] *= eL;
        for (int e = tid; e < L * BV; e += nt) DO[e] *= st->fe[e / BV];
        if (tid == 0) {
            float last = 0.0f;
            for (int w = 0; w < nw; w++) last += red[w];
            last *= eL;
            for (int j = 0; j < L; j++) last += tv[j];
            dG[Lc - 1] += last;
            float acc = 0.0f; /* dg_m = sum over i >= m of dG_i */
            for (int i = Lc - 1; i >= 0; i--) {
                acc += dG[i];
                dg_part[(n0 + i) * P + part] = acc;
                dbeta_part[(n0 + i) * P + part] = dB[i];
            }
        }
        __syncthreads();
        gd_mm<true, false>(dS, BV, Qs, Dkp, DO, BV, Dkp, BV, L, true, 0, 8);
        gd_mm<true, false>(dS, BV, Kc, Dkp, DU, BV, Dkp, BV, L, true, 0, 8);
        __syncthreads();
    }
}

/* dq, dk (N, Hk, Dk) bf16 = the sums of their rep * nvb parts in order; dg, dbeta (N, Hv) fp32 =
 * the sums of their nvb parts. */
static __global__ void gd_reduce_kernel(bf16 *dq, bf16 *dk, float *dg, float *dbeta,
                                        const float *dq_part, const float *dk_part,
                                        const float *dg_part, const float *dbeta_part, size_t N,
                                        int Hk, int Hv, int Dk, int nvb) {
    int P = Hv * nvb, per = P / Hk;
    size_t nq = N * Hk * Dk, total = nq + N * Hv;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        if (e < nq) {
            size_t n = e / ((size_t)Hk * Dk);
            int kh = (int)(e / Dk % Hk), d = (int)(e % Dk);
            const float *a = dq_part + (n * P + (size_t)kh * per) * Dk + d;
            const float *c = dk_part + (n * P + (size_t)kh * per) * Dk + d;
            float sa = 0.0f, sc = 0.0f;
            for (int p = 0; p < per; p++) sa += a[(size_t)p * Dk], sc += c[(size_t)p * Dk];
            dq[e] = __float2bfloat16_rn(sa);
            dk[e] = __float2bfloat16_rn(sc);
        } else {
            size_t r = e - nq, n = r / Hv;
            int vh = (int)(r % Hv);
            float sa = 0.0f, sc = 0.0f;
            for (int p = 0; p < nvb; p++) {
                sa += dg_part[n * P + vh * nvb + p];
                sc += dbeta_part[n * P + vh * nvb + p];
            }
            dg[r] = sa;
            dbeta[r] = sc;
        }
    }
}

void mt_cuda_gated_delta_backward(mt_backend *be, bf16 *dq, bf16 *dk, bf16 *dv, float *dg,
                                  float *dbeta, const bf16 *dout, const float *chunk_states,
                                  const bf16 *q, const bf16 *k, const bf16 *v, const float *g,
                                  const float *beta, const int32_t *doc_start, int B, int T,
                                  int Hk, int Hv, int Dk, int Dv, float scale, cudaStream_t s) {
    mt_cuda_gated_delta_check("gated_delta_backward", B, T, Hk, Hv, Dk, Dv);
    if (B == 0 || T == 0) return;
    MT_CHECK(dq && dk && dv && dg && dbeta && dout && chunk_states && q && k && v && g && beta,
             "gated_delta_backward: NULL tensor");
    int nvb = (Dv + GD_BV - 1) / GD_BV;
    size_t N = (size_t)B * T, P = (size_t)Hv * nvb;
    size_t nkd = N * P * Dk, nsc = N * P;
    float *scratch = (float *)mt_cuda_scratch(be, (2 * nkd + 2 * nsc) * sizeof(float));
    float *dq_part = scratch, *dk_part = dq_part + nkd, *dg_part = dk_part + nkd;
    float *dbeta_part = dg_part + nsc;
    size_t smem = mt_cuda_gated_delta_smem(Dk, 1);
    CUDA_CHECK(cudaFuncSetAttribute(gated_delta_backward_kernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)(B * Hv), (unsigned)nvb);
    gated_delta_backward_kernel<<<grid, GD_THREADS, smem, s>>>(
        dv, dq_part, dk_part, dg_part, dbeta_part, dout, chunk_states, q, k, v, g, beta, doc_start,
        T, Hk, Hv, Dk, Dv, gd_round16(Dk), scale);
    CUDA_LAUNCH_CHECK();
    size_t total = N * Hk * Dk + N * Hv;
    size_t blocks = (total + 255) / 256;
    if (blocks > 8192) blocks = 8192;
    gd_reduce_kernel<<<(unsigned)blocks, 256, 0, s>>>(dq, dk, dg, dbeta, dq_part, dk_part, dg_part,
                                                      dbeta_part, N, Hk, Hv, Dk, nvb);
    CUDA_LAUNCH_CHECK();
}
