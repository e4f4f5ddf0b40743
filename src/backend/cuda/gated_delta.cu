/* The gated delta rule's chunked forward (backend.h's gated_delta_forward), the CPU op's algebra
 * (src/backend/cpu/gated_delta_chunk.h) in three kernels a range of chunks (gated_delta_chunk.cuh
 * has the split, the precision and the ranges):
 *   prep (a block a chunk, row and value head):  KD = strict_lower(K K^T o Dm),
 *        Tm = (I + diag(beta) KD)^-1,  W = Tm diag(beta fe) K,  U = Tm diag(beta) V
 *   scan (a block a row, value head and GD_BV value columns; chunks in order):
 *        chunk_states[c] = S;  Vn = U - W S (over U);  S = eL S + K^T diag(lam) Vn
 *   out  (a block a chunk, row and value head):  O = diag(fe) Q S + ((Q K^T) o Dm) Vn
 * which is the CPU op's U = Tm R with R = diag(beta)(V - diag(fe) K S), split into its parts that
 * do not depend on the state (U, W) and the one that does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_memory.h"
#include "gated_delta_chunk.cuh"
#include "ops.cuh"

template <int MODE>
static __global__ void __launch_bounds__(GD_THREADS)
    gd_fwd_prep_kernel(float *W, float *U, const bf16 *k, const bf16 *v, const float *g,
                       const float *beta, const int32_t *doc_start, int T, int Hk, int Hv, int Dk,
                       int Dv, int Dkp, int Dvp, int c_begin, int R, int t0) {
    extern __shared__ __align__(128) float sm[];
    const int L = GD_L, tid = threadIdx.x, nt = blockDim.x, ldk = gd_ld(Dkp), ldv = gd_ld(Dvp);
    int lc = blockIdx.x, bh = blockIdx.y, b = bh / Hv, vh = bh % Hv, kh = vh / (Hv / Hk);
    int c0 = (c_begin + lc) * L, Lc = min(L, T - c0);
    float *Kc = sm, *Vs = Kc + L * ldk, *KD = Vs + L * ldv, *Tm = KD + L * GD_LDL;
    gd_stats *st = (gd_stats *)(Tm + L * GD_LDL);
    gd_load_chunk(NULL, Kc, ldk, st, NULL, k, g, beta, doc_start, b, c0, Lc, kh, vh, T, Hk, Hv, Dk,
                  Dkp, 1.0f, t0);
    gd_tile(Vs, ldv, v + (((size_t)b * T + c0) * Hv + vh) * Dv, (size_t)Hv * Dv, Lc, Dv, L, Dvp);
    __syncthreads();
    gd_kd(KD, Kc, ldk, Dkp, st);
    gd_solve(Tm, KD, st, tid);
    if (tid >= L) { /* while threads 0-63 solve: K rows by beta fe, V rows by beta */
        for (int e = tid - L; e < L * Dkp; e += nt - L) {
            int i = e / Dkp;
            Kc[i * ldk + e % Dkp] *= st->beta[i] * st->fe[i];
        }
        for (int e = tid - L; e < L * Dvp; e += nt - L) {
            int i = e / Dvp;
            Vs[i * ldv + e % Dvp] *= st->beta[i];
        }
    }
    __syncthreads();
    size_t row = gd_row(bh, R, lc, 0);
    gd_mm<false, false, GD_TM(MODE)>(W + row * Dkp, Dkp, Tm, GD_LDL, Kc, ldk, L, Dkp, L, false, 0, 8);
    gd_mm<false, false, GD_TM(MODE)>(U + row * Dvp, Dvp, Tm, GD_LDL, Vs, ldv, L, Dvp, L, false, 0, 8);
}

template <int MODE>
static __global__ void __launch_bounds__(GD_THREADS)
    gd_fwd_scan_kernel(float *chunk_states, const float *state_in, float *state_out, float *U,
                       const float *W, const bf16 *k,
                       const float *g, const float *beta, const int32_t *doc_start, int T, int Hk,
                       int Hv, int Dk, int Dv, int Dkp, int Dvp, int c_begin, int R, int nc,
                       int t0) {
    extern __shared__ __align__(128) float sm[];
    const int L = GD_L, BV = GD_BV, LDB = GD_LDB, tid = threadIdx.x, nt = blockDim.x;
    const int ldk = gd_ld(Dkp);
    int v0 = blockIdx.x * BV, bh = blockIdx.y, b = bh / Hv, vh = bh % Hv, kh = vh / (Hv / Hk);
    float *S = sm, *Ws = S + Dkp * LDB, *Kc = Ws + L * ldk, *X = Kc + L * ldk, *Us = X + L * LDB;
    gd_stats *st = (gd_stats *)(Us + L * LDB);
    /* the state entering the range: the range before's, else the span's (or zero) */
    const float *start = c_begin > 0 ? chunk_states + ((size_t)bh * nc + c_begin) * Dk * Dv
                         : state_in  ? state_in + (size_t)bh * Dk * Dv
                                     : NULL;
    for (int e = tid; e < Dkp * BV; e += nt) {
        int r = e / BV, j = e % BV;
        S[r * LDB + j] = start && r < Dk && v0 + j < Dv ? start[(size_t)r * Dv + v0 + j] : 0.0f;
    }
    for (int lc = 0; lc < R; lc++) {
        int c0 = (c_begin + lc) * L, Lc = min(L, T - c0);
        float *cs = chunk_states + ((size_t)bh * nc + c_begin + lc) * Dk * Dv;
        for (int e = tid; e < Dk * BV; e += nt) {
            int r = e / BV, j = e % BV;
            if (v0 + j < Dv) cs[(size_t)r * Dv + v0 + j] = S[r * LDB + j];
        }
        float *Ug = U + gd_row(bh, R, lc, 0) * Dvp;
        gd_tile(Ws, ldk, W + gd_row(bh, R, lc, 0) * Dkp, Dkp, L, Dkp, L, Dkp);
        gd_tile(Us, LDB, Ug + v0, Dvp, L, min(BV, Dvp - v0), L, BV);
        gd_load_chunk(NULL, Kc, ldk, st, NULL, k, g, beta, doc_start, b, c0, Lc, kh, vh, T, Hk, Hv,
                      Dk, Dkp, 1.0f, t0);
        __syncthreads();
        gd_mm<false, false, GD_TM(MODE)>(X, LDB, Ws, ldk, S, LDB, L, BV, Dkp, false, 0, 8); /* W S */
        __syncthreads();
        for (int e = tid; e < L * BV; e += nt) { /* Vn = U - W S over U; X = diag(lam) Vn */
            int i = e / BV, j = e % BV;
            float vn = 0.0f;
            if (v0 + j < Dvp) {
                vn = Us[i * LDB + j] - X[i * LDB + j];
                if (v0 + j < Dv) Ug[(size_t)i * Dvp + v0 + j] = vn;
            }
            X[i * LDB + j] = st->lam[i] * vn;
        }
        float eL = st->eL;
        for (int e = tid; e < Dkp * BV; e += nt) S[e / BV * LDB + e % BV] *= eL;
        __syncthreads();
        gd_mm<true, false, GD_ALL(MODE)>(S, LDB, Kc, ldk, X, LDB, Dkp, BV, L, true, 0, 8);
        __syncthreads();
    }
    /* the next range starts from it; after the last, it is the span's outgoing state */
    float *cs = c_begin + R < nc ? chunk_states + ((size_t)bh * nc + c_begin + R) * Dk * Dv
                : state_out ? state_out + (size_t)bh * Dk * Dv
                            : NULL;
    if (cs) {
        for (int e = tid; e < Dk * BV; e += nt) {
            int r = e / BV, j = e % BV;
            if (v0 + j < Dv) cs[(size_t)r * Dv + v0 + j] = S[r * LDB + j];
        }
    }
}

static __global__ void __launch_bounds__(GD_THREADS)
    gd_fwd_out_kernel(bf16 *out, const float *chunk_states, const float *Vn, const bf16 *q,
                      const bf16 *k, const float *g, const float *beta,
                      const int32_t *doc_start, int T, int Hk, int Hv, int Dk, int Dv, int Dkp,
                      int Dvp, float scale, int c_begin, int R, int nc, int t0) {
    extern __shared__ __align__(128) float sm[];
    const int L = GD_L, tid = threadIdx.x, nt = blockDim.x, ldk = gd_ld(Dkp), ldv = gd_ld(Dvp);
    int lc = blockIdx.x, bh = blockIdx.y, b = bh / Hv, vh = bh % Hv, kh = vh / (Hv / Hk);
    int c0 = (c_begin + lc) * L, Lc = min(L, T - c0);
    float *Qs = sm, *Kc = Qs + L * ldk, *Ss = Kc + L * max(ldk, ldv), *P = Ss + Dkp * ldv;
    float *X = P + L * GD_LDL;
    float *Vs = Kc; /* once P is made */
    gd_stats *st = (gd_stats *)(X + L * ldv);
    gd_load_chunk(Qs, Kc, ldk, st, q, k, g, beta, doc_start, b, c0, Lc, kh, vh, T, Hk, Hv, Dk, Dkp,
                  scale, t0);
    gd_tile(Ss, ldv, chunk_states + ((size_t)bh * nc + c_begin + lc) * Dk * Dv, Dv, Dk, Dv, Dkp, Dvp);
    __syncthreads();
    gd_mm<false, true>(P, GD_LDL, Qs, ldk, Kc, ldk, L, L, Dkp, false, 0, 4);
    gd_mm<false, false>(X, ldv, Qs, ldk, Ss, ldv, L, Dvp, Dkp, false, 4, 4);
    __syncthreads();
    for (int e = tid; e < L * L; e += nt) P[e / L * GD_LDL + e % L] *= gd_dm(st, e / L, e % L);
    for (int e = tid; e < L * Dvp; e += nt) X[e / Dvp * ldv + e % Dvp] *= st->fe[e / Dvp];
    gd_tile(Vs, ldv, Vn + gd_row(bh, R, lc, 0) * Dvp, Dvp, L, Dvp, L, Dvp);
    __syncthreads();
    gd_mm<false, false>(X, ldv, P, GD_LDL, Vs, ldv, L, Dvp, L, true, 0, 8);
    __syncthreads();
    for (int e = tid; e < L * Dvp; e += nt) {
        int i = e / Dvp, d = e % Dvp;
        if (i < Lc && d < Dv)
            out[(((size_t)b * T + c0 + i) * Hv + vh) * Dv + d] = __float2bfloat16_rn(X[i * ldv + d]);
    }
}

/* Dynamic shared memory of each kernel (gated_delta_backward.cu's too), in bytes. */
size_t mt_cuda_gated_delta_smem_of(int kernel, int Dk, int Dv) {
    size_t L = GD_L, LDB = GD_LDB, LDL = GD_LDL, Dkp = gd_round16(Dk), Dvp = gd_round16(Dv);
    size_t ldk = gd_ld((int)Dkp), ldv = gd_ld((int)Dvp), ldm = ldk > ldv ? ldk : ldv, f = 0;
    switch (kernel) {
    case MT_GD_FWD_PREP: f = L * ldk + L * ldv + 2 * L * LDL; break;
    case MT_GD_FWD_SCAN: f = Dkp * LDB + 2 * L * ldk + 2 * L * LDB; break;
    case MT_GD_FWD_OUT: f = L * ldk + L * ldm + Dkp * ldv + L * LDL + L * ldv; break;
    case MT_GD_BWD_PREP: f = L * ldm + L * ldk + 3 * L * LDL; break;
    case MT_GD_BWD_SCAN: f = Dkp * LDB + 3 * L * ldk + 3 * L * LDB; break;
    case MT_GD_BWD_CHUNK:
        f = 2 * L * ldk + 2 * Dkp * LDB + 4 * L * LDL + 6 * L * LDB + 4 * L + 8;
        break;
    }
    return f * sizeof(float) + sizeof(gd_stats);
}

void mt_cuda_gated_delta_check(const char *op, int B, int T, int Hk, int Hv, int Dk, int Dv) {
    MT_CHECK(B >= 0 && T >= 0, "%s: B=%d T=%d", op, B, T);
    MT_CHECK(Hk > 0 && Hv > 0 && Hv % Hk == 0, "%s: Hv=%d is not a multiple of Hk=%d", op, Hv, Hk);
    MT_CHECK(Dk > 0 && Dk <= GD_MAX_DK && Dv > 0 && Dv <= GD_MAX_DK,
             "%s: head sizes Dk=%d Dv=%d (the CUDA kernels take Dk, Dv <= %d)", op, Dk, Dv,
             GD_MAX_DK);
}

int mt_cuda_gd_range_chunks(size_t per_chunk, int nc) {
    const char *e = getenv("MT_GATED_DELTA_RANGE");
    long r = e && *e ? strtol(e, NULL, 10) : 0;
    if (r <= 0) r = (long)(MT_CUDA_GATED_DELTA_SCRATCH / (per_chunk ? per_chunk : 1));
    if (r < 1) r = 1;
    return r > nc ? nc : (int)r;
}

int mt_cuda_gd_mode(void) {
    const char *e = getenv("MT_GATED_DELTA_TF32");
    if (e && strcmp(e, "1") == 0) return GD_PLAIN;
    if (e && strcmp(e, "tm") == 0) return GD_SPLIT_TM;
    return GD_SPLIT_ALL;
}

static int gd_prof_on = -1;
static double gd_prof_ms[MT_GD_NKERNELS], gd_prof_t;

static double gd_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

void mt_cuda_gd_prof_start(cudaStream_t s) {
    if (gd_prof_on < 0) {
        const char *e = getenv("MT_GATED_DELTA_PROFILE");
        gd_prof_on = e && e[0] == '1';
    }
    if (!gd_prof_on) return;
    CUDA_CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < MT_GD_NKERNELS; i++) gd_prof_ms[i] = 0;
    gd_prof_t = gd_now_ms();
}

void mt_cuda_gd_prof_mark(cudaStream_t s, int kernel) {
    if (gd_prof_on != 1) return;
    CUDA_CHECK(cudaStreamSynchronize(s));
    double t = gd_now_ms();
    gd_prof_ms[kernel] += t - gd_prof_t;
    gd_prof_t = t;
}

void mt_cuda_gd_prof_print(const char *what) {
    if (gd_prof_on != 1) return;
    static const char *names[MT_GD_NKERNELS] = {"fwd_prep", "fwd_scan", "fwd_out", "bwd_prep",
                                                "bwd_scan", "bwd_chunk", "reduce"};
    fprintf(stderr, "gated_delta profile %s:", what);
    for (int i = 0; i < MT_GD_NKERNELS; i++)
        if (gd_prof_ms[i] > 0) fprintf(stderr, " %s %.3f ms", names[i], gd_prof_ms[i]);
    fprintf(stderr, "\n");
}

void mt_cuda_gd_set_smem(const void *kernel, size_t smem) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
}

template <int MODE>
static void forward_ranges(mt_backend *be, bf16 *out, float *chunk_states, const bf16 *q,
                           const bf16 *k, const bf16 *v, const float *g, const float *beta,
                           const int32_t *doc_start, int B, int T, int Hk, int Hv, int Dk, int Dv,
                           float scale, const mt_gated_delta_span *span, cudaStream_t s) {
    int t0 = span ? span->t0 : 0;
    const float *state_in = span ? span->state_in : NULL;
    float *state_out = span ? span->state_out : NULL;
    int L = GD_L, nc = (T + L - 1) / L, Dkp = gd_round16(Dk), Dvp = gd_round16(Dv);
    int BH = B * Hv, nvb = (Dv + GD_BV - 1) / GD_BV;
    size_t per_chunk = (size_t)BH * L * (Dkp + Dvp) * sizeof(float);
    int R = mt_cuda_gd_range_chunks(per_chunk, nc);
    float *W = (float *)mt_cuda_scratch(be, per_chunk * R);
    size_t sp = mt_cuda_gated_delta_smem_of(MT_GD_FWD_PREP, Dk, Dv);
    size_t ss = mt_cuda_gated_delta_smem_of(MT_GD_FWD_SCAN, Dk, Dv);
    size_t so = mt_cuda_gated_delta_smem_of(MT_GD_FWD_OUT, Dk, Dv);
    mt_cuda_gd_set_smem((const void *)gd_fwd_prep_kernel<MODE>, sp);
    mt_cuda_gd_set_smem((const void *)gd_fwd_scan_kernel<MODE>, ss);
    mt_cuda_gd_set_smem((const void *)gd_fwd_out_kernel, so);
    mt_cuda_gd_prof_start(s);
    for (int c = 0; c < nc; c += R) {
        int Rr = min(R, nc - c);
        float *U = W + (size_t)BH * Rr * L * Dkp;
        gd_fwd_prep_kernel<MODE><<<dim3(Rr, BH), GD_THREADS, sp, s>>>(
            W, U, k, v, g, beta, doc_start, T, Hk, Hv, Dk, Dv, Dkp, Dvp, c, Rr, t0);
        CUDA_LAUNCH_CHECK();
        mt_cuda_gd_prof_mark(s, MT_GD_FWD_PREP);
        gd_fwd_scan_kernel<MODE><<<dim3(nvb, BH), GD_THREADS, ss, s>>>(
            chunk_states, state_in, state_out, U, W, k, g, beta, doc_start, T, Hk, Hv, Dk, Dv, Dkp,
            Dvp, c, Rr, nc, t0);
        CUDA_LAUNCH_CHECK();
        mt_cuda_gd_prof_mark(s, MT_GD_FWD_SCAN);
        gd_fwd_out_kernel<<<dim3(Rr, BH), GD_THREADS, so, s>>>(out, chunk_states, U, q, k, g, beta,
                                                                doc_start, T, Hk, Hv, Dk, Dv, Dkp,
                                                                Dvp, scale, c, Rr, nc, t0);
        CUDA_LAUNCH_CHECK();
        mt_cuda_gd_prof_mark(s, MT_GD_FWD_OUT);
    }
    mt_cuda_gd_prof_print("forward");
}

void mt_cuda_gated_delta_forward(mt_backend *be, bf16 *out, float *chunk_states, const bf16 *q,
                                 const bf16 *k, const bf16 *v, const float *g, const float *beta,
                                 const int32_t *doc_start, int B, int T, int Hk, int Hv, int Dk,
                                 int Dv, float scale, const mt_gated_delta_span *span,
                                 cudaStream_t s) {
    mt_cuda_gated_delta_check("gated_delta_forward", B, T, Hk, Hv, Dk, Dv);
    if (B == 0 || T == 0) return;
    MT_CHECK(out && chunk_states && q && k && v && g && beta, "gated_delta_forward: NULL tensor");
    switch (mt_cuda_gd_mode()) {
    case GD_PLAIN:
        forward_ranges<GD_PLAIN>(be, out, chunk_states, q, k, v, g, beta, doc_start, B, T, Hk, Hv,
                                 Dk, Dv, scale, span, s);
        break;
    case GD_SPLIT_TM:
        forward_ranges<GD_SPLIT_TM>(be, out, chunk_states, q, k, v, g, beta, doc_start, B, T, Hk,
                                    Hv, Dk, Dv, scale, span, s);
        break;
    default:
        forward_ranges<GD_SPLIT_ALL>(be, out, chunk_states, q, k, v, g, beta, doc_start, B, T, Hk,
                                     Hv, Dk, Dv, scale, span, s);
    }
}
