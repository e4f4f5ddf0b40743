/* The gated delta rule's chunked forward (backend.h's gated_delta_forward), the CPU op's algebra
 * (src/backend/cpu/gated_delta_chunk.h) on one block per (row, value head, 32 value columns):
 * see gated_delta_chunk.cuh for the split and the precision. Per chunk, for the block's slice S
 * (Dk x 32) of the fp32 state:
 *   KD = strict_lower(K K^T o Dm);  Tm = (I + diag(beta) KD)^-1        (warps 0-1, while 2-7 do
 *   X = K S;  R = diag(beta)(V - diag(fe) X);  U = Tm R                   X = K S)
 *   O = diag(fe) Q S + (Q K^T o Dm) U;  S = eL S + K^T diag(lam) U
 * chunk_states gets S before each chunk, as the CPU op writes it. */
#include "gated_delta_chunk.cuh"
#include "ops.cuh"

static __global__ void __launch_bounds__(GD_THREADS)
    gated_delta_forward_kernel(bf16 *out, float *chunk_states, const bf16 *q, const bf16 *k,
                               const bf16 *v, const float *g, const float *beta,
                               const int32_t *doc_start, int T, int Hk, int Hv, int Dk, int Dv,
                               int Dkp, float scale) {
    extern __shared__ __align__(128) float sm[];
    const int L = GD_L, BV = GD_BV, tid = threadIdx.x, nt = blockDim.x;
    int b = blockIdx.x / Hv, vh = blockIdx.x % Hv, kh = vh / (Hv / Hk), v0 = blockIdx.y * BV;
    float *Qs = sm, *Kc = Qs + L * Dkp, *S = Kc + L * Dkp, *KD = S + Dkp * BV, *Tm = KD + L * L;
    float *X = Tm + L * L, *U = X + L * BV;
    gd_stats *st = (gd_stats *)(U + L * BV);
    int nc = (T + L - 1) / L;
    for (int e = tid; e < Dkp * BV; e += nt) S[e] = 0.0f;
    for (int ci = 0; ci < nc; ci++) {
        int c0 = ci * L, Lc = min(L, T - c0);
        float *cs = chunk_states + (((size_t)b * Hv + vh) * nc + ci) * Dk * Dv;
        for (int e = tid; e < Dk * BV; e += nt) {
            int r = e / BV, j = e % BV;
            if (v0 + j < Dv) cs[(size_t)r * Dv + v0 + j] = S[r * BV + j];
        }
        gd_load_chunk(Qs, Kc, st, q, k, g, beta, doc_start, b, c0, Lc, kh, vh, T, Hk, Hv, Dk, Dkp,
                      scale);
        __syncthreads();
        gd_mm<false, true>(KD, L, Kc, Dkp, Kc, Dkp, L, L, Dkp, false, 0, 8);
        __syncthreads();
        for (int e = tid; e < L * L; e += nt) {
            int i = e / L, j = e % L;
            KD[e] = j < i ? KD[e] * gd_dm(st, i, j) : 0.0f;
        }
        __syncthreads();
        gd_solve(Tm, KD, st, tid);
        gd_mm<false, false>(X, BV, Kc, Dkp, S, BV, L, BV, Dkp, false, 2, 6);
        __syncthreads();
        /* R = diag(beta) (V - diag(fe) X), in X's place */
        for (int e = tid; e < L * BV; e += nt) {
            int i = e / BV, j = e % BV;
            float vv = 0.0f;
            if (i < Lc && v0 + j < Dv)
                vv = __bfloat162float(v[(((size_t)b * T + c0 + i) * Hv + vh) * Dv + v0 + j]);
            X[e] = st->beta[i] * (vv - st->fe[i] * X[e]);
        }
        __syncthreads();
        gd_mm<false, false>(U, BV, Tm, L, X, BV, L, BV, L, false, 0, 8);
        __syncthreads();
        /* P = Q K^T (in KD's place) and Q S (in X's) */
        gd_mm<false, true>(KD, L, Qs, Dkp, Kc, Dkp, L, L, Dkp, false, 0, 4);
        gd_mm<false, false>(X, BV, Qs, Dkp, S, BV, L, BV, Dkp, false, 4, 4);
        __syncthreads();
        for (int e = tid; e < L * L; e += nt) KD[e] *= gd_dm(st, e / L, e % L);
        for (int e = tid; e < L * BV; e += nt) X[e] *= st->fe[e / BV];
        __syncthreads();
        gd_mm<false, false>(X, BV, KD, L, U, BV, L, BV, L, true, 0, 8);
        __syncthreads();
        for (int e = tid; e < L * BV; e += nt) {
            int i = e / BV, j = e % BV;
            if (i < Lc && v0 + j < Dv)
                out[(((size_t)b * T + c0 + i) * Hv + vh) * Dv + v0 + j] = __float2bfloat16_rn(X[e]);
        }
        float eL = st->eL;
        for (int e = tid; e < Dkp * BV; e += nt) S[e] *= eL;
        for (int e = tid; e < L * Dkp; e += nt) Kc[e] *= st->lam[e / Dkp];
        __syncthreads();
        gd_mm<true, false>(S, BV, Kc, Dkp, U, BV, Dkp, BV, L, true, 0, 8);
        __syncthreads();
    }
}

size_t mt_cuda_gated_delta_smem(int Dk, int backward) {
    size_t L = GD_L, BV = GD_BV, Dkp = (size_t)gd_round16(Dk);
    size_t f = backward ? 2 * L * Dkp + 2 * Dkp * BV + 4 * L * L + 5 * L * BV + 4 * L + 8
                        : 2 * L * Dkp + Dkp * BV + 2 * L * L + 2 * L * BV;
    return f * sizeof(float) + sizeof(gd_stats);
}

void mt_cuda_gated_delta_check(const char *op, int B, int T, int Hk, int Hv, int Dk, int Dv) {
    MT_CHECK(B >= 0 && T >= 0, "%s: B=%d T=%d", op, B, T);
    MT_CHECK(Hk > 0 && Hv > 0 && Hv % Hk == 0, "%s: Hv=%d is not a multiple of Hk=%d", op, Hv, Hk);
    MT_CHECK(Dk > 0 && Dk <= GD_MAX_DK && Dv > 0,
             "%s: head sizes Dk=%d Dv=%d (the CUDA kernels take Dk <= %d)", op, Dk, Dv, GD_MAX_DK);
}

void mt_cuda_gated_delta_forward(bf16 *out, float *chunk_states, const bf16 *q, const bf16 *k,
                                 const bf16 *v, const float *g, const float *beta,
                                 const int32_t *doc_start, int B, int T, int Hk, int Hv, int Dk,
                                 int Dv, float scale, cudaStream_t s) {
    mt_cuda_gated_delta_check("gated_delta_forward", B, T, Hk, Hv, Dk, Dv);
    if (B == 0 || T == 0) return;
    MT_CHECK(out && chunk_states && q && k && v && g && beta, "gated_delta_forward: NULL tensor");
    size_t smem = mt_cuda_gated_delta_smem(Dk, 0);
    CUDA_CHECK(cudaFuncSetAttribute(gated_delta_forward_kernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)(B * Hv), (unsigned)((Dv + GD_BV - 1) / GD_BV));
    gated_delta_forward_kernel<<<grid, GD_THREADS, smem, s>>>(out, chunk_states, q, k, v, g, beta,
                                                              doc_start, T, Hk, Hv, Dk, Dv,
                                                              gd_round16(Dk), scale);
    CUDA_LAUNCH_CHECK();
}
