/* The CUDA backend's ops for Gemma 4 against the fp32 CPU reference backend, op by op: rmsnorm
 * with weight NULL (the v-norm), softcap, scale_by (the per-layer scalar), lm_head_loss_softcap
 * (the soft-capped LM head with its loss) and moe_expert_scale_forward/backward (the MoE block's
 * per-expert gate scale). Exits 77 (ctest: skipped) when no CUDA device is usable.
 *
 * As test_cuda_ops: inputs drawn in fp32 and rounded to bf16, the CPU fed the rounded values, so
 * the comparison measures the op. |gpu - cpu| <= atol + rtol*|cpu|, atol relative to `scale` =
 * the RMS of the reference tensor:
 *   bf16 outputs (one rounding to bf16 = 2^-9 relative):          atol 1e-2*scale, rtol 2e-2
 *   fp32 outputs from the same bf16 inputs (summation order only): atol 1e-4*scale, rtol 1e-3
 *   LM head dinp / dweight (bf16 dlogits inside the kernel):       atol 3e-2*scale, rtol 5e-2
 *   LM head losses (nats):                                         atol 2e-2, rtol 1e-2
 *   exact (bits): scale_by against the bf16 rounding of the CPU's fp32 product (a product of two
 *   bf16 values is exact in fp32), moe_expert_scale's w_out and d_w (one fp32 product each).
 * Outputs written (=) are poisoned first (bf16 NaN 0x7fc0, fp32 NaN) so an unwritten element fails;
 * outputs accumulated (+=) are pre-filled and the fill is part of the reference.
 *  - rmsnorm, weight NULL: out and rstd, the backward's dinp (= and +=, as the model's keys-as-values
 *    layers call it); a dweight passed beside weight NULL is left alone (the contract ignores it);
 *    and the GPU's unweighted op bit for bit its weighted op with a weight of ones (offset 0).
 *    Vector (C % 8 == 0) and scalar paths; C = the fixtures' 16 and 32 and the real 256 and 512.
 *  - softcap: in place, caps 2 and 30, x up to +-1000 (tanh saturated both ways), vector and scalar
 *    (odd n, misaligned) paths.
 *  - scale_by: out beside x and in place (the layer's forward and backward call it both ways).
 *    The scalar has no gradient in the contract: layer_scalar is a buffer transformers never trains
 *    (model/params.h), so its backward is this op again, dinp = dout * s.
 *  - lm_head_loss_softcap: losses, dinp, dweight (+=) against the CPU's, ignored targets; logits in
 *    the linear range (cap 30), in the fixtures' range (cap 2, |z| ~ 1) and saturated (cap 2,
 *    |z| ~ 20: 1 - tanh^2 reaches 0, the backward through the cap where it vanishes); V % 4 != 0
 *    (the scalar kernel); dweight NULL gives dinp the same bits; dinp NULL (losses only) gives the
 *    same losses; cap 0 is bit for bit the plain lm_head_loss.
 *  - moe_expert_scale: n*k assignments over E experts, some with none (their d_scale keeps the
 *    fill's bits); d_scale NULL (skipped: d_w the same bits); d_scale twice: the same bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "util/dev_buffers.h"
#include "util/host_buffers.h"
#include "util/testutil.h"

#define BF_ATOL 1e-2
#define BF_RTOL 2e-2
#define F32_ATOL 1e-4
#define F32_RTOL 1e-3
#define LOOSE_ATOL 3e-2
#define LOOSE_RTOL 5e-2
#define LOSS_ATOL 2e-2
#define LOSS_RTOL 1e-2

static mt_backend *cpu, *gpu;

/* n device bf16 values as their bits. */
static mt_bf16 *down_bits(const void *d, size_t n) {
    mt_bf16 *h = malloc((n ? n : 1) * sizeof(mt_bf16));
    gpu->download(gpu, h, d, n * sizeof(mt_bf16));
    return h;
}

/* Two device bf16 tensors hold the same bits. */
static int same_bf(const char *what, const void *a, const void *b, size_t n) {
    mt_bf16 *ha = down_bits(a, n), *hb = down_bits(b, n);
    int ok = mt_test_same_elems(what, ha, hb, n, sizeof(mt_bf16));
    free(ha), free(hb);
    return ok;
}

/* Host fp32 arrays with the same bits. */
static int same_f32(const char *what, const float *a, const float *b, size_t n) {
    return mt_test_same_elems(what, a, b, n, sizeof(float));
}

/* ---------------- rmsnorm, weight NULL ---------------- */

static void rmsnorm_unweighted_case(int R, int C, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[128];
    const float eps = 1e-6f;
    size_t n = (size_t)R * C;
    float *inp = mt_test_randn_bf(&rng, n, 1.5f), *ones = mt_test_fnew(C);
    for (int c = 0; c < C; c++) ones[c] = 1.0f;
    void *d_inp = mt_test_up_bf(gpu, inp, n), *d_ones = mt_test_up_bf(gpu, ones, C);

    float *out = mt_test_fnew(n), *rstd = mt_test_fnew(R);
    cpu->rmsnorm_forward(cpu, out, rstd, inp, NULL, R, C, eps, 0);
    void *d_out = mt_test_poison_bf(gpu, n), *d_out1 = mt_test_poison_bf(gpu, n);
    float *d_rstd = mt_test_poison_f32(gpu, R), *d_rstd1 = mt_test_poison_f32(gpu, R);
    gpu->rmsnorm_forward(gpu, d_out, d_rstd, d_inp, NULL, R, C, eps, 0);
    snprintf(what, sizeof what, "rmsnorm unweighted fwd R=%d C=%d out", R, C);
    assert_true(mt_test_check_bf(gpu, what, d_out, out, n, BF_ATOL, BF_RTOL));
    snprintf(what, sizeof what, "rmsnorm unweighted fwd R=%d C=%d rstd", R, C);
    assert_true(mt_test_check_f32(gpu, what, d_rstd, rstd, R, F32_ATOL, F32_RTOL));
    gpu->rmsnorm_forward(gpu, d_out1, d_rstd1, d_inp, d_ones, R, C, eps, 0);
    snprintf(what, sizeof what, "rmsnorm R=%d C=%d NULL vs ones: out", R, C);
    assert_true(same_bf(what, d_out, d_out1, n));

    /* the backward of both gets the CPU's rstd */
    gpu->upload(gpu, d_rstd, rstd, R * sizeof(float));
    float *dout = mt_test_randn_bf(&rng, n, 1.0f);
    void *d_dout = mt_test_up_bf(gpu, dout, n);
    for (int acc = 0; acc <= 1; acc++) {
        float *fill_x = mt_test_randn_bf(&rng, n, 1.0f), *fill_w = mt_test_randn(&rng, C, 3.0f);
        float *dinp = mt_test_copyf(fill_x, n);
        if (!acc) mt_test_nan_fill(dinp, n);
        cpu->rmsnorm_backward(cpu, dinp, NULL, dout, inp, NULL, rstd, R, C, acc, 0);
        void *d_dinp = acc ? mt_test_up_bf(gpu, fill_x, n) : mt_test_poison_bf(gpu, n);
        float *d_dw = mt_test_up_f32(gpu, fill_w, C); /* passed, and ignored */
        gpu->rmsnorm_backward(gpu, d_dinp, d_dw, d_dout, d_inp, NULL, d_rstd, R, C, acc, 0);
        snprintf(what, sizeof what, "rmsnorm unweighted bwd R=%d C=%d dinp (%s)", R, C, acc ? "+=" : "=");
        assert_true(mt_test_check_bf(gpu, what, d_dinp, dinp, n, BF_ATOL, BF_RTOL));
        float *g_dw = mt_test_down_f32(gpu, d_dw, C);
        snprintf(what, sizeof what, "rmsnorm unweighted bwd R=%d C=%d dweight untouched", R, C);
        assert_true(same_f32(what, g_dw, fill_w, C));
        /* the weighted op with ones: the same dinp bits */
        void *d_dinp1 = acc ? mt_test_up_bf(gpu, fill_x, n) : mt_test_poison_bf(gpu, n);
        gpu->rmsnorm_backward(gpu, d_dinp1, NULL, d_dout, d_inp, d_ones, d_rstd, R, C, acc, 0);
        snprintf(what, sizeof what, "rmsnorm R=%d C=%d NULL vs ones: dinp (%s)", R, C, acc ? "+=" : "=");
        assert_true(same_bf(what, d_dinp, d_dinp1, n));
        gpu->free(gpu, d_dinp), gpu->free(gpu, d_dinp1), gpu->free(gpu, d_dw);
        free(fill_x), free(fill_w), free(dinp), free(g_dw);
    }
    gpu->free(gpu, d_inp), gpu->free(gpu, d_ones), gpu->free(gpu, d_out), gpu->free(gpu, d_out1);
    gpu->free(gpu, d_rstd), gpu->free(gpu, d_rstd1), gpu->free(gpu, d_dout);
    free(inp), free(ones), free(out), free(rstd), free(dout);
}

static void test_rmsnorm_unweighted(void **state) {
    rmsnorm_unweighted_case(37 * 2, 16, 11);  /* gemma4_tiny's sliding layers: G 2, D 16 */
    rmsnorm_unweighted_case(37, 32, 12);      /* its full layers: G 1, D 32 */
    rmsnorm_unweighted_case(19, 20, 13);      /* C % 8 != 0: scalar path */
    rmsnorm_unweighted_case(512 * 8, 256, 14); /* real sliding layers: D 256 */
    rmsnorm_unweighted_case(512 * 2, 512, 15); /* real full layers: D 512 */
}

/* ---------------- softcap ---------------- */

/* x ~ normal(0, 2 cap) and, every 13th element, a large value: tanh saturated both ways. */
static void softcap_case(size_t n, size_t offset, float cap, uint64_t seed) {
    static const float big[] = {1000.0f, -1000.0f, 300.0f, -300.0f, 60.0f, -60.0f, 0.0f, -0.0f};
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[96];
    size_t m = n + offset; /* `offset` elements in: misaligned pointers when odd */
    float *x = mt_test_randn_bf(&rng, m, 2.0f * cap);
    for (size_t i = 0, j = 0; i < n; i += 13, j++) x[offset + i] = big[j % 8];
    void *d_x = mt_test_up_bf(gpu, x, m);
    cpu->softcap(cpu, x + offset, cap, n);
    gpu->softcap(gpu, (char *)d_x + offset * sizeof(mt_bf16), cap, n);
    float *got = mt_test_down_bf(gpu, d_x, m);
    snprintf(what, sizeof what, "softcap n=%zu off=%zu cap=%g", n, offset, cap);
    assert_true(mt_test_check_rms(what, got + offset, x + offset, n, BF_ATOL, BF_RTOL));
    for (size_t i = 0; i < n; i++) assert_true(fabsf(got[offset + i]) <= cap); /* never past it */
    assert_memory_equal(got, x, offset * sizeof(float)); /* before the range: untouched */
    gpu->free(gpu, d_x);
    free(x), free(got);
}

static void test_softcap(void **state) {
    softcap_case(96 * 80, 0, 2.0f, 21);      /* gemma4_tiny's logits */
    softcap_case(1001, 0, 30.0f, 22);        /* odd n: scalar path */
    softcap_case(4096 + 8, 1, 30.0f, 23);    /* misaligned: scalar path */
    softcap_case((size_t)64 * 262144, 0, 30.0f, 24); /* 64 rows of a 262k vocabulary */
    softcap_case(1, 0, 2.0f, 25);
}

/* ---------------- scale_by ---------------- */

static void scale_by_case(size_t n, size_t offset, float s, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[96];
    size_t m = n + offset, b = offset * sizeof(mt_bf16);
    float sv = mt_test_bf_round(s);
    float *x = mt_test_randn_bf(&rng, m, 3.0f), *want = mt_test_fnew(n);
    cpu->scale_by(cpu, want, x + offset, &sv, n);
    mt_test_round_bf16(want, n); /* the exact fp32 product, rounded once */
    void *d_x = mt_test_up_bf(gpu, x, m), *d_s = mt_test_up_bf(gpu, &sv, 1);
    void *d_out = mt_test_poison_bf(gpu, m);
    gpu->scale_by(gpu, (char *)d_out + b, (char *)d_x + b, d_s, n);
    float *got = mt_test_down_bf(gpu, d_out, m);
    snprintf(what, sizeof what, "scale_by n=%zu off=%zu s=%g out", n, offset, sv);
    assert_true(same_f32(what, got + offset, want, n));
    free(got);
    gpu->scale_by(gpu, (char *)d_x + b, (char *)d_x + b, d_s, n); /* in place */
    got = mt_test_down_bf(gpu, d_x, m);
    snprintf(what, sizeof what, "scale_by n=%zu off=%zu s=%g in place", n, offset, sv);
    assert_true(same_f32(what, got + offset, want, n));
    assert_memory_equal(got, x, offset * sizeof(float));
    gpu->free(gpu, d_x), gpu->free(gpu, d_s), gpu->free(gpu, d_out);
    free(x), free(want), free(got);
}

static void test_scale_by(void **state) {
    scale_by_case(80 * 32, 0, 0.34375f, 31);      /* gemma4_tiny's residual */
    scale_by_case(1001, 0, 0.0224609375f, 32);    /* odd n: scalar path */
    scale_by_case(4096 * 3, 1, 1.5f, 33);         /* misaligned: scalar path */
    scale_by_case((size_t)2048 * 5376, 0, 0.6f, 34); /* 2048 tokens of a 31B model's width */
    scale_by_case(7, 0, -2.0f, 35);
}

/* ---------------- lm_head_loss_softcap ---------------- */

/* z = inp @ weight^T has std about zstd: the weight drawn with std zstd / sqrt(C). */
static void lm_head_softcap_case(int N, int C, int V, float cap, float zstd, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[192], shape[128];
    snprintf(shape, sizeof shape, "lm_head_softcap N=%d C=%d V=%d cap=%g |z|~%g", N, C, V, cap, zstd);
    size_t ni = (size_t)N * C, nw = (size_t)V * C;
    float *inp = mt_test_randn_bf(&rng, ni, 1.0f), *w = mt_test_randn_bf(&rng, nw, zstd / sqrtf((float)C));
    int32_t *tg = malloc(N * sizeof(int32_t));
    int valid = 0;
    for (int n = 0; n < N; n++) {
        tg[n] = n % 7 == 3 ? -100 : (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)V);
        valid += tg[n] >= 0;
    }
    float scale = 1.0f / (float)(valid ? valid : 1);
    void *d_inp = mt_test_up_bf(gpu, inp, ni), *d_w = mt_test_up_bf(gpu, w, nw);
    int32_t *d_tg = mt_test_up_i32(gpu, tg, N);
    float *fill_w = mt_test_randn(&rng, nw, 0.01f);

    /* the full call: losses, dinp, dweight */
    float *losses = mt_test_fnew(N), *dinp = mt_test_fnew(ni), *dw = mt_test_copyf(fill_w, nw);
    mt_test_nan_fill(dinp, ni);
    cpu->lm_head_loss_softcap(cpu, losses, dinp, dw, inp, w, tg, N, C, V, scale, cap);
    float *d_losses = mt_test_poison_f32(gpu, N);
    void *d_dinp = mt_test_poison_bf(gpu, ni);
    float *d_dw = mt_test_up_f32(gpu, fill_w, nw);
    gpu->lm_head_loss_softcap(gpu, d_losses, d_dinp, d_dw, d_inp, d_w, d_tg, N, C, V, scale, cap);
    float *gl = mt_test_down_f32(gpu, d_losses, N);
    snprintf(what, sizeof what, "%s losses", shape);
    assert_true(mt_allclose(what, gl, losses, N, LOSS_ATOL, LOSS_RTOL));
    for (int n = 0; n < N; n++)
        if (tg[n] < 0) assert_true(gl[n] == 0.0f); /* ignored: loss 0 */
    snprintf(what, sizeof what, "%s dinp", shape);
    assert_true(mt_test_check_bf(gpu, what, d_dinp, dinp, ni, LOOSE_ATOL, LOOSE_RTOL));
    { /* ignored rows: dinp exactly zero */
        float *g = mt_test_down_bf(gpu, d_dinp, ni);
        for (int n = 0; n < N; n++)
            if (tg[n] < 0)
                for (int c = 0; c < C; c++) assert_true(g[(size_t)n * C + c] == 0.0f);
        free(g);
    }
    { /* dweight: the increment (the fill is tiny against nothing) */
        float *g = mt_test_down_f32(gpu, d_dw, nw), *r = mt_test_copyf(dw, nw);
        for (size_t i = 0; i < nw; i++) g[i] -= fill_w[i], r[i] -= fill_w[i];
        snprintf(what, sizeof what, "%s dweight (+=)", shape);
        assert_true(mt_test_check_rms(what, g, r, nw, LOOSE_ATOL, LOOSE_RTOL));
        free(g), free(r);
    }

    /* dweight NULL (a frozen head): dinp the same bits */
    void *d_frozen = mt_test_poison_bf(gpu, ni);
    gpu->lm_head_loss_softcap(gpu, d_losses, d_frozen, NULL, d_inp, d_w, d_tg, N, C, V, scale, cap);
    snprintf(what, sizeof what, "%s dinp, dweight NULL", shape);
    assert_true(same_bf(what, d_dinp, d_frozen, ni));
    /* dinp NULL (losses only, eval): the same losses */
    float *d_losses2 = mt_test_poison_f32(gpu, N);
    gpu->lm_head_loss_softcap(gpu, d_losses2, NULL, NULL, d_inp, d_w, d_tg, N, C, V, scale, cap);
    float *gl2 = mt_test_down_f32(gpu, d_losses2, N);
    snprintf(what, sizeof what, "%s losses, dinp NULL", shape);
    assert_true(same_f32(what, gl2, gl, N));
    /* cap 0: the plain op, bit for bit */
    void *d_plain = mt_test_poison_bf(gpu, ni), *d_cap0 = mt_test_poison_bf(gpu, ni);
    gpu->lm_head_loss(gpu, d_losses, d_plain, NULL, d_inp, d_w, d_tg, N, C, V, scale);
    gpu->lm_head_loss_softcap(gpu, d_losses2, d_cap0, NULL, d_inp, d_w, d_tg, N, C, V, scale, 0.0f);
    float *p1 = mt_test_down_f32(gpu, d_losses, N), *p2 = mt_test_down_f32(gpu, d_losses2, N);
    snprintf(what, sizeof what, "%s cap 0 = plain: losses", shape);
    assert_true(same_f32(what, p2, p1, N));
    snprintf(what, sizeof what, "%s cap 0 = plain: dinp", shape);
    assert_true(same_bf(what, d_cap0, d_plain, ni));

    gpu->free(gpu, d_inp), gpu->free(gpu, d_w), gpu->free(gpu, d_tg), gpu->free(gpu, d_losses);
    gpu->free(gpu, d_dinp), gpu->free(gpu, d_dw), gpu->free(gpu, d_frozen), gpu->free(gpu, d_losses2);
    gpu->free(gpu, d_plain), gpu->free(gpu, d_cap0);
    free(inp), free(w), free(tg), free(fill_w), free(losses), free(dinp), free(dw), free(gl);
    free(gl2), free(p1), free(p2);
}

static void test_lm_head_softcap(void **state) {
    lm_head_softcap_case(80, 32, 96, 2.0f, 1.0f, 41);      /* gemma4_tiny's head */
    lm_head_softcap_case(80, 32, 64, 2.0f, 1.0f, 42);      /* gemma4_moe's */
    lm_head_softcap_case(37, 64, 1001, 2.0f, 1.0f, 43);    /* V % 4 != 0: scalar kernel */
    lm_head_softcap_case(300, 128, 5000, 30.0f, 3.0f, 44); /* cap 30, logits well inside it */
    lm_head_softcap_case(300, 128, 5000, 2.0f, 20.0f, 45); /* saturated: 1 - tanh^2 down to 0 */
    lm_head_softcap_case(37, 64, 1003, 2.0f, 20.0f, 46);   /* saturated, scalar kernel */
    lm_head_softcap_case(512, 1024, 32000, 30.0f, 30.0f, 47); /* a larger head, |z| ~ cap */
}

/* ---------------- moe_expert_scale ---------------- */

/* n tokens choose k distinct experts of E, drawn from the first `used` (so E - used have none). */
static void moe_scale_case(int n, int k, int E, int used, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[128], shape[64];
    snprintf(shape, sizeof shape, "moe_expert_scale n=%d k=%d E=%d (%d used)", n, k, E, used);
    size_t nk = (size_t)n * k;
    int32_t *idx = malloc((nk ? nk : 1) * sizeof(int32_t));
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            int32_t e, dup;
            do { /* distinct within the token, as top-k gives */
                e = (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)used);
                dup = 0;
                for (int i = 0; i < j; i++) dup |= idx[(size_t)t * k + i] == e;
            } while (dup);
            idx[(size_t)t * k + j] = e;
        }
    float *w = mt_test_randn(&rng, nk, 0.3f), *scale = mt_test_randn_bf(&rng, E, 1.0f);
    float *d_out = mt_test_randn(&rng, nk, 1.0f), *fill = mt_test_randn(&rng, E, 2.0f);
    for (size_t a = 0; a < nk; a++) w[a] = fabsf(w[a]); /* gates are probabilities */
    int32_t *g_idx = mt_test_up_i32(gpu, idx, nk);
    float *g_w = mt_test_up_f32(gpu, w, nk), *g_dout = mt_test_up_f32(gpu, d_out, nk);
    void *g_scale = mt_test_up_bf(gpu, scale, E);

    /* forward: exact */
    float *w_out = mt_test_fnew(nk);
    cpu->moe_expert_scale_forward(cpu, w_out, w, idx, scale, n, k);
    float *g_wout = mt_test_poison_f32(gpu, nk);
    gpu->moe_expert_scale_forward(gpu, g_wout, g_w, g_idx, g_scale, n, k);
    float *got = mt_test_down_f32(gpu, g_wout, nk);
    snprintf(what, sizeof what, "%s fwd", shape);
    assert_true(same_f32(what, got, w_out, nk));
    free(got);

    /* backward: d_w exact, d_scale (+=) in fp32 */
    float *d_w = mt_test_fnew(nk), *d_scale = mt_test_copyf(fill, E);
    mt_test_nan_fill(d_w, nk);
    cpu->moe_expert_scale_backward(cpu, d_w, d_scale, d_out, w, idx, scale, n, k);
    float *g_dw = mt_test_poison_f32(gpu, nk), *g_ds = mt_test_up_f32(gpu, fill, E);
    gpu->moe_expert_scale_backward(gpu, g_dw, g_ds, g_dout, g_w, g_idx, g_scale, n, k);
    float *h_dw = mt_test_down_f32(gpu, g_dw, nk), *h_ds = mt_test_down_f32(gpu, g_ds, E);
    snprintf(what, sizeof what, "%s bwd d_w", shape);
    assert_true(same_f32(what, h_dw, d_w, nk));
    { /* the increment against the CPU's (the fill is part of neither) */
        float *gi = mt_test_copyf(h_ds, E), *ri = mt_test_copyf(d_scale, E);
        for (int e = 0; e < E; e++) gi[e] -= fill[e], ri[e] -= fill[e];
        snprintf(what, sizeof what, "%s bwd d_scale (+=)", shape);
        assert_true(mt_test_check_rms(what, gi, ri, E, F32_ATOL, F32_RTOL));
        free(gi), free(ri);
    }
    if (used < E) { /* experts nobody chose: the fill's bits */
        snprintf(what, sizeof what, "%s bwd d_scale of unused experts", shape);
        assert_true(same_f32(what, h_ds + used, fill + used, E - used));
    }
    { /* again from the fill: the same bits (no float atomics) */
        gpu->upload(gpu, g_ds, fill, E * sizeof(float));
        gpu->moe_expert_scale_backward(gpu, g_dw, g_ds, g_dout, g_w, g_idx, g_scale, n, k);
        float *again = mt_test_down_f32(gpu, g_ds, E);
        snprintf(what, sizeof what, "%s bwd d_scale rerun", shape);
        assert_true(same_f32(what, again, h_ds, E));
        free(again);
    }
    { /* d_scale NULL (a frozen router): d_w the same bits */
        float *g_dw2 = mt_test_poison_f32(gpu, nk);
        gpu->moe_expert_scale_backward(gpu, g_dw2, NULL, g_dout, g_w, g_idx, g_scale, n, k);
        float *h = mt_test_down_f32(gpu, g_dw2, nk);
        snprintf(what, sizeof what, "%s bwd d_w, d_scale NULL", shape);
        assert_true(same_f32(what, h, d_w, nk));
        free(h);
        gpu->free(gpu, g_dw2);
    }
    gpu->free(gpu, g_idx), gpu->free(gpu, g_w), gpu->free(gpu, g_dout), gpu->free(gpu, g_scale);
    gpu->free(gpu, g_wout), gpu->free(gpu, g_dw), gpu->free(gpu, g_ds);
    free(idx), free(w), free(scale), free(d_out), free(fill), free(w_out), free(d_w), free(d_scale);
    free(h_dw), free(h_ds);
}

static void test_moe_expert_scale(void **state) {
    moe_scale_case(80, 2, 4, 4, 51);       /* gemma4_moe's router */
    moe_scale_case(37, 2, 4, 3, 52);       /* one expert unused (the last) */
    moe_scale_case(300, 8, 128, 100, 53);  /* 26B-A4B's E and k, 28 experts unused */
    moe_scale_case(8192, 8, 128, 128, 54); /* 65536 assignments */
    moe_scale_case(1, 1, 2, 1, 55);
}

int main(void) {
    if (!mt_backend_cuda_available()) {
        fprintf(stderr, "test_cuda_gemma4_ops: no usable CUDA device, skipped\n");
        return 77;
    }
    cpu = mt_backend_cpu_create();
    gpu = mt_backend_cuda_create(0);
    if (!gpu->rmsnorm_unweighted || !gpu->softcap || !gpu->scale_by || !gpu->lm_head_loss_softcap ||
        !gpu->moe_expert_scale_forward || !gpu->moe_expert_scale_backward) {
        fprintf(stderr, "test_cuda_gemma4_ops: the cuda backend lacks one of the ops\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm_unweighted),
        cmocka_unit_test(test_softcap),
        cmocka_unit_test(test_scale_by),
        cmocka_unit_test(test_lm_head_softcap),
        cmocka_unit_test(test_moe_expert_scale),
    };
    /* MT_TEST_FILTER: run the tests whose names match it (cmocka's pattern) */
    const char *filter = getenv("MT_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    return failed ? 1 : 0;
}
