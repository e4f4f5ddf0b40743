/* The gated delta rule's chunked backward (backend.h's gated_delta_backward): the CPU op's algebra
 * (src/backend/cpu/gated_delta_backward.c) in four kernels a range of chunks, taken from the last
 * range to the first (gated_delta_chunk.cuh has the split, the precision and the ranges). With
 * dSn the gradient of the state after a chunk and dU that of the chunk's values Vn (= U):
 *   prep  (a block a chunk, row and value head):  W = Tm diag(beta fe) K and the chunk-local part
 *         of dU, P^T dO with P = (Q K^T) o Dm; stores KD, Tm and P (L x L fp32 each) for the
 *         chunk kernel, whose GD_BV column blocks would otherwise each redo them
 *   scan  (a block a row, value head and GD_BV value columns; chunks in reverse): stores dSn, then
 *         dU = P^T dO + diag(lam) K dSn,  dS0 = eL dSn + Q^T diag(fe) dO - W^T dU
 *   chunk (a block a chunk, row, value head and GD_BV value columns): the whole chunk backward
 *         from S0 (chunk_states), dSn (the scan's) and the prep's KD, Tm, P, as the CPU op does it; dv is
 *         column-local and written directly; dq, dk, dg and dbeta sum over value columns (and dq,
 *         dk over the value heads of a key head), so each block writes its part to fp32 scratch
 *   reduce: adds the parts in a fixed order (deterministic: no atomics, the same bits every run).
 */
#include "cuda_memory.h"
#include "gated_delta_chunk.cuh"
#include "ops.cuh"

template <int MODE>
static __global__ void __launch_bounds__(GD_THREADS)
    gd_bwd_prep_kernel(float *W, float *DUL, float *TKP, const bf16 *dout, const bf16 *q, const bf16 *k,
                       const float *g, const float *beta, const int32_t *doc_start, int T, int Hk,
                       int Hv, int Dk, int Dv, int Dkp, int Dvp, float scale, int c_begin, int R,
                       int t0) {
    extern __shared__ __align__(128) float sm[];
    const int L = GD_L, LDL = GD_LDL, tid = threadIdx.x, nt = blockDim.x;
    const int ldk = gd_ld(Dkp), ldv = gd_ld(Dvp), ldm = max(ldk, ldv);
    int lc = blockIdx.x, bh = blockIdx.y, b = bh / Hv, vh = bh % Hv, kh = vh / (Hv / Hk);
    int c0 = (c_begin + lc) * L, Lc = min(L, T - c0);
    float *Qs = sm, *Kc = Qs + L * ldm, *KD = Kc + L * ldk, *Tm = KD + L * LDL, *P = Tm + L * LDL;
    float *DO = Qs; /* once P is made */
    gd_stats *st = (gd_stats *)(P + L * LDL);
    gd_load_chunk(Qs, Kc, ldk, st, q, k, g, beta, doc_start, b, c0, Lc, kh, vh, T, Hk, Hv, Dk, Dkp,
                  scale, t0);
    __syncthreads();
    gd_kd(KD, Kc, ldk, Dkp, st);
    gd_mm<false, true, GD_ALL(MODE)>(P, LDL, Qs, ldk, Kc, ldk, L, L, Dkp, false, 0, 8);
    __syncthreads();
    gd_solve(Tm, KD, st, tid);
    if (tid >= L) { /* while threads 0-63 solve */
        for (int e = tid - L; e < L * L; e += nt - L) P[e / L * LDL + e % L] *= gd_dm(st, e / L, e % L);
        for (int e = tid - L; e < L * Dkp; e += nt - L) {
            int i = e / Dkp;
            Kc[i * ldk + e % Dkp] *= st->beta[i] * st->fe[i];
        }
    }
    gd_tile(DO, ldv, dout + (((size_t)b * T + c0) * Hv + vh) * Dv, (size_t)Hv * Dv, Lc, Dv, L, Dvp,
            1.0f, NULL, L, nt - L);
    __syncthreads();
    size_t row = gd_row(bh, R, lc, 0);
    gd_mm<false, false, GD_TM(MODE)>(W + row * Dkp, Dkp, Tm, LDL, Kc, ldk, L, Dkp, L, false, 0, 8);
    gd_mm<true, false, GD_ALL(MODE)>(DUL + row * Dvp, Dvp, P, LDL, DO, ldv, L, Dvp, L, false, 0, 8);
    float *tkp = TKP + gd_row(bh, R, lc, 0) * 3 * L; /* KD, Tm, P for the chunk kernel's blocks */
    for (int e = tid; e < L * L; e += nt) {
        int i = e / L, j = e % L;
        tkp[e] = KD[i * LDL + j], tkp[L * L + e] = Tm[i * LDL + j], tkp[2 * L * L + e] = P[i * LDL + j];
    }
}

template <int MODE>
static __global__ void __launch_bounds__(GD_THREADS)
    gd_bwd_scan_kernel(float *dstates, float *carry, const float *dstate_out, float *dstate_in,
                       const float *W, const float *DUL,
                       const bf16 *dout, const bf16 *q, const bf16 *k, const float *g,
                       const float *beta, const int32_t *doc_start, int T, int Hk, int Hv, int Dk,
                       int Dv, int Dkp, int Dvp, float scale, int c_begin, int R, int nc, int t0) {
    extern __shared__ __align__(128) float sm[];
    const int L = GD_L, BV = GD_BV, LDB = GD_LDB, tid = threadIdx.x, nt = blockDim.x;
    const int ldk = gd_ld(Dkp);
    int v0 = blockIdx.x * BV, bh = blockIdx.y, b = bh / Hv, vh = bh % Hv, kh = vh / (Hv / Hk);
    float *dS = sm, *Qs = dS + Dkp * LDB, *Kc = Qs + L * ldk, *Ws = Kc + L * ldk;
    float *DU = Ws + L * ldk, *DO = DU + L * LDB, *X = DO + L * LDB;
    gd_stats *st = (gd_stats *)(X + L * LDB);
    float *cr = carry + (size_t)bh * Dk * Dv;
    /* the gradient entering the range's last chunk: the later range's, else the span's */
    const float *from = c_begin + R < nc ? cr
                        : dstate_out      ? dstate_out + (size_t)bh * Dk * Dv
                                          : NULL;
    for (int e = tid; e < Dkp * BV; e += nt) {
        int r = e / BV, j = e % BV;
        dS[r * LDB + j] = from && r < Dk && v0 + j < Dv ? from[(size_t)r * Dv + v0 + j] : 0.0f;
    }
    for (int lc = R - 1; lc >= 0; lc--) {
        int c0 = (c_begin + lc) * L, Lc = min(L, T - c0);
        float *dsn = dstates + ((size_t)bh * R + lc) * Dk * Dv;
        for (int e = tid; e < Dk * BV; e += nt) {
            int r = e / BV, j = e % BV;
            if (v0 + j < Dv) dsn[(size_t)r * Dv + v0 + j] = dS[r * LDB + j];
        }
        size_t row = gd_row(bh, R, lc, 0);
        gd_tile(Ws, ldk, W + row * Dkp, Dkp, L, Dkp, L, Dkp);
        gd_tile(DU, LDB, DUL + row * Dvp + v0, Dvp, L, min(BV, Dvp - v0), L, BV);
        gd_load_chunk(Qs, Kc, ldk, st, q, k, g, beta, doc_start, b, c0, Lc, kh, vh, T, Hk, Hv, Dk,
                      Dkp, scale, t0);
        __syncthreads();
        gd_tile(DO, LDB, dout + (((size_t)b * T + c0) * Hv + vh) * Dv + v0, (size_t)Hv * Dv, Lc,
                min(BV, Dv - v0), L, BV, 1.0f, st->fe); /* dO with its rows by fe */
        gd_mm<false, false, GD_ALL(MODE)>(X, LDB, Kc, ldk, dS, LDB, L, BV, Dkp, false, 0, 8); /* K dSn */
        __syncthreads();
        for (int e = tid; e < L * BV; e += nt) { /* -dU */
            int i = e / BV, j = e % BV;
            DU[i * LDB + j] = -(DU[i * LDB + j] + st->lam[i] * X[i * LDB + j]);
        }
        float eL = st->eL;
        for (int e = tid; e < Dkp * BV; e += nt) dS[e / BV * LDB + e % BV] *= eL;
        __syncthreads();
        gd_mm<true, false, GD_ALL(MODE)>(dS, LDB, Qs, ldk, DO, LDB, Dkp, BV, L, true, 0, 8);
        gd_mm<true, false, GD_TM(MODE)>(dS, LDB, Ws, ldk, DU, LDB, Dkp, BV, L, true, 0, 8);
        __syncthreads();
    }
    /* the range before starts from it; the first range's is the incoming state's gradient */
    float *to = c_begin > 0 ? cr : dstate_in ? dstate_in + (size_t)bh * Dk * Dv : NULL;
    if (to) {
        for (int e = tid; e < Dk * BV; e += nt) {
            int r = e / BV, j = e % BV;
            if (v0 + j < Dv) to[(size_t)r * Dv + v0 + j] = dS[r * LDB + j];
        }
    }
}

/* Parts (N_r, P, Dk) for dq and dk and (N_r, P) for dg and dbeta, N_r = B R L the range's tokens
 * (local index (b R + lc) L + i), P = Hv * nvb, part index vh * nvb + vb. */
template <int MODE>
static __global__ void __launch_bounds__(GD_THREADS)
    gd_bwd_chunk_kernel(bf16 *dv, float *dq_part, float *dk_part, float *dg_part,
                        float *dbeta_part, const float *dstates, const float *TKP, const bf16 *dout,
                        const float *chunk_states, const bf16 *q, const bf16 *k, const bf16 *v,
                        const float *g, const float *beta, const int32_t *doc_start, int T, int Hk,
                        int Hv, int Dk, int Dv, int Dkp, float scale, int c_begin, int R, int nc,
                        int t0) {
    extern __shared__ __align__(128) float sm[];
    const int L = GD_L, BV = GD_BV, LDB = GD_LDB, LDL = GD_LDL, tid = threadIdx.x, nt = blockDim.x;
    const int lane = tid % 32, warp = tid / 32, nw = nt / 32, ldk = gd_ld(Dkp);
    int lc = blockIdx.x, bh = blockIdx.y, b = bh / Hv, vh = bh % Hv, kh = vh / (Hv / Hk);
    int v0 = blockIdx.z * BV, P = Hv * gridDim.z, part = vh * gridDim.z + blockIdx.z;
    float *Qs = sm, *Kc = Qs + L * ldk, *S0 = Kc + L * ldk, *dS = S0 + Dkp * LDB;
    float *KD = dS + Dkp * LDB, *Tm = KD + L * LDL, *Pm = Tm + L * LDL, *dP = Pm + L * LDL;
    float *X = dP + L * LDL, *DO = X + L * LDB, *U = DO + L * LDB, *DR = U + L * LDB;
    float *DU = DR + L * LDB, *Vt = DU + L * LDB;
    float *dG = Vt + L * LDB, *dB = dG + L, *tv = dB + L, *red = tv + L;
    float *LK = Tm; /* (L, ldk) over Tm and Pm once both are dead */
    gd_stats *st = (gd_stats *)(red + 8);
    int ci = c_begin + lc, c0 = ci * L, Lc = min(L, T - c0);
    size_t n0 = (size_t)b * T + c0, p0 = ((size_t)b * R + lc) * L;
    const float *cs = chunk_states + ((size_t)bh * nc + ci) * Dk * Dv;
    const float *dsn = dstates + ((size_t)bh * R + lc) * Dk * Dv;
    int bv = min(BV, Dv - v0);
    gd_tile(S0, LDB, cs + v0, Dv, Dk, bv, Dkp, BV);
    gd_tile(dS, LDB, dsn + v0, Dv, Dk, bv, Dkp, BV);
    gd_tile(Vt, LDB, v + (n0 * Hv + vh) * Dv + v0, (size_t)Hv * Dv, Lc, bv, L, BV);
    const float *tkp = TKP + gd_row(bh, R, lc, 0) * 3 * L; /* the prep kernel's KD, Tm, P */
    gd_tile(KD, LDL, tkp, L, L, L, L, L);
    gd_tile(Tm, LDL, tkp + L * L, L, L, L, L, L);
    gd_tile(Pm, LDL, tkp + 2 * L * L, L, L, L, L, L);
    gd_load_chunk(Qs, Kc, ldk, st, q, k, g, beta, doc_start, b, c0, Lc, kh, vh, T, Hk, Hv, Dk, Dkp,
                  scale, t0);
    __syncthreads();
    float sd = 0.0f; /* <S0, dSn> for eL's dG */
    for (int e = tid; e < Dkp * BV; e += nt) sd += S0[e / BV * LDB + e % BV] * dS[e / BV * LDB + e % BV];
    sd = gd_warp_sum(sd);
    if (lane == 0) red[warp] = sd;
    gd_mm<false, false, GD_TM(MODE)>(X, LDB, Kc, ldk, S0, LDB, L, BV, Dkp, false, 0, 8);
    __syncthreads();
    for (int e = tid; e < L * BV; e += nt) { /* R = diag(beta)(V - diag(fe) X), in DO's place */
        int i = e / BV, j = e % BV;
        DO[i * LDB + j] = st->beta[i] * (Vt[i * LDB + j] - st->fe[i] * X[i * LDB + j]);
    }
    __syncthreads();
    gd_mm<false, false, GD_TM(MODE)>(U, LDB, Tm, LDL, DO, LDB, L, BV, L, false, 0, 4);    /* U = Tm R */
    gd_mm<false, false, GD_ALL(MODE)>(DR, LDB, Kc, ldk, dS, LDB, L, BV, Dkp, false, 4, 4); /* K dSn */
    __syncthreads();
    gd_tile(DO, LDB, dout + (n0 * Hv + vh) * Dv + v0, (size_t)Hv * Dv, Lc, bv, L, BV);
    __syncthreads();
    gd_mm<true, false, GD_ALL(MODE)>(DU, LDB, Pm, LDL, DO, LDB, L, BV, L, false, 0, 8); /* dU = P^T dO */
    __syncthreads();
    for (int e = tid; e < L * BV; e += nt) DU[e / BV * LDB + e % BV] += st->lam[e / BV] * DR[e / BV * LDB + e % BV];
    __syncthreads();
    gd_mm<true, false, GD_TM(MODE)>(DR, LDB, Tm, LDL, DU, LDB, L, BV, L, false, 0, 8); /* dR = Tm^T dU */
    __syncthreads();
    /* dA = -(dR U^T) in Tm's place (stored un-negated), dP = dO U^T */
    gd_mm<false, true, GD_TM(MODE)>(Tm, LDL, DR, LDB, U, LDB, L, L, BV, false, 0, 4);
    gd_mm<false, true, GD_ALL(MODE)>(dP, LDL, DO, LDB, U, LDB, L, L, BV, false, 4, 4);
    __syncthreads();
    /* the rows' dG (+ at G_i) and dbeta; w_ij kept in Pm for the columns' (- at G_j) */
    if (tid < L) {
        int i = tid;
        float rs = 0.0f, db = 0.0f, bi = st->beta[i];
        for (int j = 0; j < L; j++) {
            float w = 0.0f;
            if (j < i) {
                float dA = -Tm[i * LDL + j];
                w = dP[i * LDL + j] * Pm[i * LDL + j] + dA * bi * KD[i * LDL + j];
                db += dA * KD[i * LDL + j];
            }
            rs += w;
            Pm[i * LDL + j] = w;
        }
        float fe = st->fe[i];
        for (int j = 0; j < BV; j++) db += (Vt[i * LDB + j] - fe * X[i * LDB + j]) * DR[i * LDB + j];
        dG[i] = rs;
        dB[i] = db;
    }
    __syncthreads();
    if (tid < L) {
        int j = tid;
        float cs_ = 0.0f;
        for (int i = j + 1; i < L; i++) cs_ += Pm[i * LDL + j];
        dG[j] -= cs_;
    }
    /* M + M^T (M = diag(beta) dA o Dm, strict lower) in KD's place; dP o Dm in place */
    for (int e = tid; e < L * L; e += nt) {
        int i = e / L, j = e % L;
        float m = 0.0f;
        if (j < i) m = -Tm[i * LDL + j] * st->beta[i] * gd_dm(st, i, j);
        else if (i < j) m = -Tm[j * LDL + i] * st->beta[j] * gd_dm(st, j, i);
        KD[i * LDL + j] = m;
        dP[i * LDL + j] *= gd_dm(st, i, j);
    }
    __syncthreads();
    /* dQ = diag(fe) dO S0^T + (dP o Dm) K; its dG_i = fe_i Q_i . (S0 dO_i) */
    gd_mm<false, true, GD_ALL(MODE)>(LK, ldk, DO, LDB, S0, LDB, L, Dkp, BV, false, 0, 8);
    __syncthreads();
    for (int i = warp; i < L; i += nw) {
        float d = 0.0f, fe = st->fe[i];
        for (int c = lane; c < Dkp; c += 32) {
            d += Qs[i * ldk + c] * LK[i * ldk + c];
            LK[i * ldk + c] *= fe;
        }
        d = gd_warp_sum(d);
        if (lane == 0) dG[i] += fe * d;
    }
    __syncthreads();
    gd_mm<false, false, GD_ALL(MODE)>(LK, ldk, dP, LDL, Kc, ldk, L, Dkp, L, true, 0, 8);
    __syncthreads();
    for (int e = tid; e < L * Dkp; e += nt) {
        int i = e / Dkp, d = e % Dkp;
        if (i < Lc && d < Dk) dq_part[((p0 + i) * P + part) * Dk + d] = scale * LK[i * ldk + d];
    }
    /* dX = -diag(beta fe) dR (in dU's place), dv = diag(beta) dR */
    for (int e = tid; e < L * BV; e += nt) {
        int i = e / BV, j = e % BV;
        float r = DR[i * LDB + j], bi = st->beta[i];
        DU[i * LDB + j] = -bi * st->fe[i] * r;
        if (i < Lc && v0 + j < Dv) dv[((n0 + i) * Hv + vh) * Dv + v0 + j] = __float2bfloat16_rn(bi * r);
    }
    __syncthreads();
    for (int i = warp; i < L; i += nw) { /* BV == 32: a lane a column */
        float d = gd_warp_sum(X[i * LDB + lane] * DU[i * LDB + lane]);
        if (lane == 0) dG[i] += d;
    }
    /* dK = diag(lam) U dSn^T + dX S0^T + (dP o Dm)^T Q + (M + M^T) K */
    gd_mm<false, true, GD_ALL(MODE)>(LK, ldk, U, LDB, dS, LDB, L, Dkp, BV, false, 0, 8);
    __syncthreads();
    for (int j = warp; j < L; j += nw) {
        float d = 0.0f, lam = st->lam[j];
        for (int c = lane; c < Dkp; c += 32) {
            d += Kc[j * ldk + c] * LK[j * ldk + c];
            LK[j * ldk + c] *= lam;
        }
        d = gd_warp_sum(d);
        if (lane == 0) {
            dG[j] -= lam * d;
            tv[j] = lam * d;
        }
    }
    __syncthreads();
    gd_mm<false, true, GD_ALL(MODE)>(LK, ldk, DU, LDB, S0, LDB, L, Dkp, BV, true, 0, 8);
    gd_mm<true, false, GD_ALL(MODE)>(LK, ldk, dP, LDL, Qs, ldk, L, Dkp, L, true, 0, 8);
    gd_mm<false, false, GD_ALL(MODE)>(LK, ldk, KD, LDL, Kc, ldk, L, Dkp, L, true, 0, 8);
    __syncthreads();
    for (int e = tid; e < L * Dkp; e += nt) {
        int i = e / Dkp, d = e % Dkp;
        if (i < Lc && d < Dk) dk_part[((p0 + i) * P + part) * Dk + d] = LK[i * ldk + d];
    }
    if (tid == 0) {
        float last = 0.0f;
        for (int w = 0; w < nw; w++) last += red[w];
        last *= st->eL;
        for (int j = 0; j < L; j++) last += tv[j];
        dG[Lc - 1] += last;
        float acc = 0.0f; /* dg_m = sum over i >= m of dG_i */
        for (int i = Lc - 1; i >= 0; i--) {
            acc += dG[i];
            dg_part[(p0 + i) * P + part] = acc;
            dbeta_part[(p0 + i) * P + part] = dB[i];
        }
    }
}

/* dq, dk (N, Hk, Dk) bf16 = the sums of their rep * nvb parts in order; dg, dbeta (N, Hv) fp32 =
 * the sums of their nvb parts; for the tokens of the range [c_begin L, (c_begin + R) L) of each
 * row that lie before T. */
static __global__ void gd_reduce_kernel(bf16 *dq, bf16 *dk, float *dg, float *dbeta,
                                        const float *dq_part, const float *dk_part,
                                        const float *dg_part, const float *dbeta_part, int B,
                                        int T, int Hk, int Hv, int Dk, int nvb, int c_begin, int R) {
    int P = Hv * nvb, per = P / Hk, Rt = R * GD_L;
    size_t Nr = (size_t)B * Rt, nq = Nr * Hk * Dk, total = nq + Nr * Hv;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t r = e < nq ? e / ((size_t)Hk * Dk) : (e - nq) / Hv; /* local token */
        int b = (int)(r / Rt), t = c_begin * GD_L + (int)(r % Rt);
        if (t >= T) continue;
        size_t n = (size_t)b * T + t;
        if (e < nq) {
            int kh = (int)(e / Dk % Hk), d = (int)(e % Dk);
            const float *a = dq_part + (r * P + (size_t)kh * per) * Dk + d;
            const float *c = dk_part + (r * P + (size_t)kh * per) * Dk + d;
            float sa = 0.0f, sc = 0.0f;
            for (int p = 0; p < per; p++) sa += a[(size_t)p * Dk], sc += c[(size_t)p * Dk];
            size_t o = (n * Hk + kh) * Dk + d;
            dq[o] = __float2bfloat16_rn(sa);
            dk[o] = __float2bfloat16_rn(sc);
        } else {
            int vh = (int)((e - nq) % Hv);
            float sa = 0.0f, sc = 0.0f;
            for (int p = 0; p < nvb; p++) {
                sa += dg_part[r * P + vh * nvb + p];
                sc += dbeta_part[r * P + vh * nvb + p];
            }
            dg[n * Hv + vh] = sa;
            dbeta[n * Hv + vh] = sc;
        }
    }
}

template <int MODE>
static void backward_ranges(mt_backend *be, bf16 *dq, bf16 *dk, bf16 *dv, float *dg, float *dbeta,
                            const bf16 *dout, const float *chunk_states, const bf16 *q,
                            const bf16 *k, const bf16 *v, const float *g, const float *beta,
                            const int32_t *doc_start, int B, int T, int Hk, int Hv, int Dk, int Dv,
                            float scale, const mt_gated_delta_span *span, cudaStream_t s) {
    int t0 = span ? span->t0 : 0;
    const float *dstate_out = span ? span->dstate_out : NULL;
    float *dstate_in = span ? span->dstate_in : NULL;
    int L = GD_L, nc = (T + L - 1) / L, Dkp = gd_round16(Dk), Dvp = gd_round16(Dv);
    int BH = B * Hv, nvb = (Dv + GD_BV - 1) / GD_BV, P = Hv * nvb;
    size_t sdkv = (size_t)Dk * Dv;
    /* a chunk of all rows: W and P^T dO, the scan's dSn, KD, Tm and P, and the chunk kernel's
     * parts, or the batched GEMMs' operands (gated_delta_gemm.cu); 3 x 64 floats of alignment */
    int gemm = mt_cuda_gd_bwd_gemm();
    size_t tail = gemm ? (size_t)BH * mt_cuda_gd_gemm_bytes_per_problem(Dk, Dv) / sizeof(float)
                       : (size_t)B * L * P * (2 * (size_t)Dk + 2);
    size_t per_chunk = ((size_t)BH * L * (Dkp + Dvp + 3 * L) + BH * sdkv + 192 + tail) * sizeof(float);
    /* W and DUL after the carry are written by wmma tiles (32-byte aligned): pad the carry */
    size_t carry_floats = ((size_t)BH * sdkv + 63) / 64 * 64, carry_bytes = carry_floats * sizeof(float);
    int R = mt_cuda_gd_range_chunks(per_chunk, nc);
    float *carry = (float *)mt_cuda_scratch(be, carry_bytes + per_chunk * R);
    size_t sp = mt_cuda_gated_delta_smem_of(MT_GD_BWD_PREP, Dk, Dv);
    size_t ss = mt_cuda_gated_delta_smem_of(MT_GD_BWD_SCAN, Dk, Dv);
    size_t sc = mt_cuda_gated_delta_smem_of(MT_GD_BWD_CHUNK, Dk, Dv);
    mt_cuda_gd_set_smem((const void *)gd_bwd_prep_kernel<MODE>, sp);
    mt_cuda_gd_set_smem((const void *)gd_bwd_scan_kernel<MODE>, ss);
    mt_cuda_gd_set_smem((const void *)gd_bwd_chunk_kernel<MODE>, sc);
    mt_cuda_gd_prof_start(s);
    for (int end = nc; end > 0;) {
        int Rr = min(R, end), c = end - Rr;
        size_t Nr = (size_t)B * Rr * L;
        float *W = carry + carry_floats, *DUL = W + (size_t)BH * Rr * L * Dkp;
        float *dstates = DUL + (size_t)BH * Rr * L * Dvp;
        float *TKP = carry + gd_round64((size_t)(dstates + BH * Rr * sdkv - carry));
        float *dq_part = carry + gd_round64((size_t)(TKP + (size_t)BH * Rr * 3 * L * L - carry));
        float *dk_part = dq_part + Nr * P * Dk, *dg_part = dk_part + Nr * P * Dk;
        float *dbeta_part = dg_part + Nr * P;
        if (gemm) { /* the operands into dq_part's room, then the prep as batched GEMMs */
            mt_cuda_gd_gemm_prep(be, dq_part, W, DUL, TKP, dout, chunk_states, q, k, v, g, beta,
                                 doc_start, B, T, Hk, Hv, Dk, Dv, scale, c, Rr, nc, t0, MODE, s);
        } else {
            gd_bwd_prep_kernel<MODE><<<dim3(Rr, BH), GD_THREADS, sp, s>>>(
                W, DUL, TKP, dout, q, k, g, beta, doc_start, T, Hk, Hv, Dk, Dv, Dkp, Dvp, scale, c,
                Rr, t0);
            CUDA_LAUNCH_CHECK();
        }
        mt_cuda_gd_prof_mark(s, MT_GD_BWD_PREP);
        gd_bwd_scan_kernel<MODE><<<dim3(nvb, BH), GD_THREADS, ss, s>>>(
            dstates, carry, dstate_out, dstate_in, W, DUL, dout, q, k, g, beta, doc_start, T, Hk,
            Hv, Dk, Dv, Dkp, Dvp, scale, c, Rr, nc, t0);
        CUDA_LAUNCH_CHECK();
        mt_cuda_gd_prof_mark(s, MT_GD_BWD_SCAN);
        if (gemm) { /* the chunk backward and the sums as batched GEMMs, over dq_part's room */
            mt_cuda_gd_gemm_backward(be, dq_part, dq, dk, dv, dg, dbeta, dstates, TKP, DUL, B, T,
                                     Hk, Hv, Dk, Dv, scale, c, Rr, MODE, s);
            mt_cuda_gd_prof_mark(s, MT_GD_BWD_CHUNK);
            end = c;
            continue;
        }
        gd_bwd_chunk_kernel<MODE><<<dim3(Rr, BH, nvb), GD_THREADS, sc, s>>>(
            dv, dq_part, dk_part, dg_part, dbeta_part, dstates, TKP, dout, chunk_states, q, k, v, g,
            beta, doc_start, T, Hk, Hv, Dk, Dv, Dkp, scale, c, Rr, nc, t0);
        CUDA_LAUNCH_CHECK();
        mt_cuda_gd_prof_mark(s, MT_GD_BWD_CHUNK);
        size_t total = Nr * Hk * Dk + Nr * Hv, blocks = (total + 255) / 256;
        if (blocks > 8192) blocks = 8192;
        gd_reduce_kernel<<<(unsigned)blocks, 256, 0, s>>>(dq, dk, dg, dbeta, dq_part, dk_part,
                                                          dg_part, dbeta_part, B, T, Hk, Hv, Dk,
                                                          nvb, c, Rr);
        CUDA_LAUNCH_CHECK();
        mt_cuda_gd_prof_mark(s, MT_GD_REDUCE);
        end = c;
    }
    mt_cuda_gd_prof_print("backward");
}

void mt_cuda_gated_delta_backward(mt_backend *be, bf16 *dq, bf16 *dk, bf16 *dv, float *dg,
                                  float *dbeta, const bf16 *dout, const float *chunk_states,
                                  const bf16 *q, const bf16 *k, const bf16 *v, const float *g,
                                  const float *beta, const int32_t *doc_start, int B, int T,
                                  int Hk, int Hv, int Dk, int Dv, float scale,
                                  const mt_gated_delta_span *span, cudaStream_t s) {
    mt_cuda_gated_delta_check("gated_delta_backward", B, T, Hk, Hv, Dk, Dv);
    if (B == 0 || T == 0) return;
    MT_CHECK(dq && dk && dv && dg && dbeta && dout && chunk_states && q && k && v && g && beta,
             "gated_delta_backward: NULL tensor");
    MT_CHECK(!span || !span->dstate_in || span->dstate_in != span->dstate_out,
             "gated_delta_backward: dstate_in aliases dstate_out");
    switch (mt_cuda_gd_mode()) {
    case GD_PLAIN:
        backward_ranges<GD_PLAIN>(be, dq, dk, dv, dg, dbeta, dout, chunk_states, q, k, v, g, beta,
                                  doc_start, B, T, Hk, Hv, Dk, Dv, scale, span, s);
        break;
    case GD_SPLIT_TM:
        backward_ranges<GD_SPLIT_TM>(be, dq, dk, dv, dg, dbeta, dout, chunk_states, q, k, v, g,
                                     beta, doc_start, B, T, Hk, Hv, Dk, Dv, scale, span, s);
        break;
    default:
        backward_ranges<GD_SPLIT_ALL>(be, dq, dk, dv, dg, dbeta, dout, chunk_states, q, k, v, g,
                                      beta, doc_start, B, T, Hk, Hv, Dk, Dv, scale, span, s);
    }
}
