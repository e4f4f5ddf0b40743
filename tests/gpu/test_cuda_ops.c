/* The CUDA backend (bf16) against the fp32 CPU reference backend, op by op, plus its memory,
 * stream/event and budget behaviour. Exits 77 (ctest: skipped) when no CUDA device is usable.
 *
 * Inputs are drawn in fp32, rounded to bf16, and the CPU is fed the rounded values, so the
 * comparison measures the op, not the input rounding. Tolerances, |gpu - cpu| <= atol + rtol*|cpu|
 * with atol relative to `scale` = the RMS of the reference tensor (the sqrt(K)-sized magnitudes of
 * matmul outputs included):
 *   bf16 outputs (one rounding to bf16 = 2^-9 relative):          atol 1e-2*scale, rtol 2e-2
 *   fp32 outputs from the same bf16 inputs (summation order only): atol 1e-4*scale, rtol 1e-3
 *   attention backward, LM head dinp/dweight (bf16 P / dlogits
 *     inside the kernels):                                          atol 3e-2*scale, rtol 5e-2
 *     where for attention dq/dk/dv `scale` is max(RMS of the (token, head) row of D values,
 *     half the tensor's RMS) (the floor: rows that are exactly zero in exact arithmetic, like the
 *     first query's dq, carry bf16 noise at the tensor's scale):
 *     rows differ in magnitude by orders (key 0's dv sums P*dO over every query), and a bf16-P
 *     error is a fraction of its own row, not of the tensor (an emulation of a correct FA2
 *     backward fails a tensor-RMS atol at T >= 1024); the tensor metric max|err|/max|ref| must
 *     also stay <= 3e-2
 *   attention lse (nats):                                           atol 5e-3, rtol 1e-3
 *   LM head losses (nats; bf16 logits inside):                      atol 2e-2, rtol 1e-2
 *   sumsq: rtol 1e-5 against the CPU's double sum; embedding forward, from_f32: exact (bits).
 * Outputs written (=) are poisoned first (bf16 NaN 0x7fc0, fp32 NaN) so an unwritten element
 * fails; outputs accumulated (+=) are pre-filled and the fill is part of the reference.
 * The deterministic ops (embedding backward, rmsnorm dweight, dbias, sumsq) are also run twice and
 * must give the same bits. Each check prints its max error and the percent of tolerance used.
 * A NULL weight gradient (a frozen weight: rmsnorm dweight, the LM head's dweight) leaves dinp bit
 * for bit the full call's. matmul_forward_add (out += inp @ W^T onto a bf16 out) against the CPU's
 * at the bf16 tolerance; scale bit for bit the bf16 rounding of the CPU's fp32 product.
 * dequant_nf4 / dequant_fp8 (a quantized frozen base, src/quant): bit for bit the CPU backend's fp32
 * products rounded once to bf16, on the vector and the scalar (misaligned) paths. dequant_mxfp4
 * (gpt-oss's experts, transposed into [E, in, out]): bit for bit the CPU backend's fp32 values in
 * bf16 (exact both), every scale byte 0..255 (subnormal, overflowing and s = 255 products), partial
 * tiles, past the grid cap, on the 16-byte and the byte (misaligned) paths. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cuda/matmul_plans.h"
#include "core/dtype.h"
#include "core/error.h"
#include "quant/fp8.h"
#include "quant/mxfp4.h"
#include "quant/nf4.h"
#include "util/dev_buffers.h"
#include "util/host_buffers.h"
#include "util/testutil.h"

#define BF_ATOL 1e-2
#define BF_RTOL 2e-2
#define F32_ATOL 1e-4
#define F32_RTOL 1e-3
#define LOOSE_ATOL 3e-2
#define LOOSE_RTOL 5e-2
#define LSE_ATOL 5e-3
#define LSE_RTOL 1e-3
#define LOSS_ATOL 2e-2
#define LOSS_RTOL 1e-2
#define SUMSQ_RTOL 1e-5

#define MIB ((size_t)1 << 20)
#define BUDGET_CHILD_ARG "--budget-child"

static mt_backend *cpu, *gpu;

/* ---------------- memory ---------------- */

static void test_memory(void **state) {
    size_t n = 3 * MIB + 5;
    unsigned char *h = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(i * 131 + 7);
    void *d = gpu->alloc(gpu, n);
    assert_true(((uintptr_t)d & 63) == 0);
    gpu->upload(gpu, d, h, n);
    gpu->download(gpu, back, d, n);
    assert_memory_equal(h, back, n);
    gpu->zero(gpu, d, n);
    gpu->download(gpu, back, d, n);
    for (size_t i = 0; i < n; i++) assert_int_equal(back[i], 0);
    gpu->free(gpu, d);
    gpu->free(gpu, NULL);
    void *z = gpu->alloc(gpu, 0); /* a valid, freeable pointer */
    gpu->free(gpu, z);
    void *ph = gpu->host_alloc(gpu, 1000);
    assert_true(((uintptr_t)ph & 63) == 0);
    memset(ph, 1, 1000);
    gpu->host_free(gpu, ph);
    free(h);
    free(back);
}

/* ---------------- embedding ---------------- */

static void embedding_case(int N, int C, int V, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[96];
    float *table = mt_test_randn_bf(&rng, (size_t)V * C, 1.0f);
    int32_t *ids = malloc(N * sizeof(int32_t));
    for (int n = 0; n < N; n++) ids[n] = (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)V);
    if (N > 3) ids[N - 1] = ids[0], ids[N / 2] = ids[0]; /* repeats */
    int32_t *d_ids = mt_test_up_i32(gpu, ids, N);
    void *d_table = mt_test_up_bf(gpu, table, (size_t)V * C);

    float *ref = mt_test_fnew((size_t)N * C);
    cpu->embedding_forward(cpu, ref, ids, table, N, C);
    void *d_out = mt_test_poison_bf(gpu, (size_t)N * C);
    gpu->embedding_forward(gpu, d_out, d_ids, d_table, N, C);
    snprintf(what, sizeof what, "embedding_fwd N=%d C=%d", N, C);
    assert_true(mt_test_check_bf(gpu, what, d_out, ref, (size_t)N * C, 0, 0));

    float *dout = mt_test_randn_bf(&rng, (size_t)N * C, 1.0f);
    float *fill = mt_test_randn(&rng, (size_t)V * C, 1.0f);
    float *dtab = mt_test_copyf(fill, (size_t)V * C);
    cpu->embedding_backward(cpu, dtab, dout, ids, N, C);
    void *d_dout = mt_test_up_bf(gpu, dout, (size_t)N * C);
    float *d_dtab = mt_test_up_f32(gpu, fill, (size_t)V * C);
    gpu->embedding_backward(gpu, d_dtab, d_dout, d_ids, N, C);
    snprintf(what, sizeof what, "embedding_bwd N=%d C=%d V=%d (+=)", N, C, V);
    assert_true(mt_test_check_f32(gpu, what, d_dtab, dtab, (size_t)V * C, F32_ATOL, F32_RTOL));
    /* determinism: the same start, the same bits */
    float *g1 = mt_test_down_f32(gpu, d_dtab, (size_t)V * C);
    gpu->upload(gpu, d_dtab, fill, (size_t)V * C * sizeof(float));
    gpu->embedding_backward(gpu, d_dtab, d_dout, d_ids, N, C);
    float *g2 = mt_test_down_f32(gpu, d_dtab, (size_t)V * C);
    assert_true(mt_test_same_bits(what, g1, g2, (size_t)V * C * sizeof(float)));

    gpu->free(gpu, d_ids), gpu->free(gpu, d_table), gpu->free(gpu, d_out);
    gpu->free(gpu, d_dout), gpu->free(gpu, d_dtab);
    free(table), free(ids), free(ref), free(dout), free(fill), free(dtab), free(g1), free(g2);
}

static void test_embedding(void **state) {
    embedding_case(37, 24, 50, 1);
    embedding_case(33, 100, 7, 2); /* C % 8 != 0: scalar path; many repeats */
    embedding_case(64, 4096, 1000, 3);
    embedding_case(2048, 4096, 3, 4); /* long runs of one id */
}

/* ---------------- rmsnorm ---------------- */

/* offset 1: qwen3_5's (1 + w) norm, w small (zero-initialised and trained) */
static void rmsnorm_case(int R, int C, float eps, uint64_t seed, float offset) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[96];
    size_t n = (size_t)R * C;
    float *inp = mt_test_randn_bf(&rng, n, 1.5f), *w = mt_test_randn_bf(&rng, C, 0.2f);
    for (int c = 0; c < C; c++) w[c] = mt_bf16_to_f32(mt_f32_to_bf16((1.0f - offset) + w[c]));
    void *d_inp = mt_test_up_bf(gpu, inp, n), *d_w = mt_test_up_bf(gpu, w, C);

    float *out = mt_test_fnew(n), *rstd = mt_test_fnew(R);
    cpu->rmsnorm_forward(cpu, out, rstd, inp, w, R, C, eps, offset);
    void *d_out = mt_test_poison_bf(gpu, n);
    float *d_rstd = mt_test_poison_f32(gpu, R);
    gpu->rmsnorm_forward(gpu, d_out, d_rstd, d_inp, d_w, R, C, eps, offset);
    snprintf(what, sizeof what, "rmsnorm_fwd R=%d C=%d out", R, C);
    assert_true(mt_test_check_bf(gpu, what, d_out, out, n, BF_ATOL, BF_RTOL));
    snprintf(what, sizeof what, "rmsnorm_fwd R=%d C=%d rstd", R, C);
    assert_true(mt_test_check_f32(gpu, what, d_rstd, rstd, R, F32_ATOL, F32_RTOL));

    /* the backward of both gets the CPU's rstd */
    gpu->upload(gpu, d_rstd, rstd, R * sizeof(float));
    float *dout = mt_test_randn_bf(&rng, n, 1.0f);
    void *d_dout = mt_test_up_bf(gpu, dout, n);
    for (int acc = 0; acc <= 1; acc++) {
        float *fill_x = mt_test_randn_bf(&rng, n, 1.0f), *fill_w = mt_test_randn(&rng, C, 3.0f);
        float *dinp = mt_test_copyf(fill_x, n), *dw = mt_test_copyf(fill_w, C);
        if (!acc) mt_test_nan_fill(dinp, n);
        cpu->rmsnorm_backward(cpu, dinp, dw, dout, inp, w, rstd, R, C, acc, offset);
        void *d_dinp = acc ? mt_test_up_bf(gpu, fill_x, n) : mt_test_poison_bf(gpu, n);
        float *d_dw = mt_test_up_f32(gpu, fill_w, C);
        gpu->rmsnorm_backward(gpu, d_dinp, d_dw, d_dout, d_inp, d_w, d_rstd, R, C, acc, offset);
        snprintf(what, sizeof what, "rmsnorm_bwd R=%d C=%d dinp (%s)", R, C, acc ? "+=" : "=");
        assert_true(mt_test_check_bf(gpu, what, d_dinp, dinp, n, BF_ATOL, BF_RTOL));
        snprintf(what, sizeof what, "rmsnorm_bwd R=%d C=%d dweight (+=)", R, C);
        assert_true(mt_test_check_f32(gpu, what, d_dw, dw, C, F32_ATOL, F32_RTOL));
        if (acc) { /* dweight alone (dinp NULL), twice: same bits */
            float *g1 = mt_test_down_f32(gpu, d_dw, C);
            gpu->upload(gpu, d_dw, fill_w, C * sizeof(float));
            gpu->rmsnorm_backward(gpu, NULL, d_dw, d_dout, d_inp, d_w, d_rstd, R, C, 0, offset);
            float *g2 = mt_test_down_f32(gpu, d_dw, C);
            assert_true(mt_test_same_bits(what, g1, g2, C * sizeof(float)));
            free(g1), free(g2);
        }
        { /* dweight NULL (a frozen norm): dinp the same bits as with it */
            void *d_frozen = acc ? mt_test_up_bf(gpu, fill_x, n) : mt_test_poison_bf(gpu, n);
            gpu->rmsnorm_backward(gpu, d_frozen, NULL, d_dout, d_inp, d_w, d_rstd, R, C, acc, offset);
            mt_bf16 *h1 = malloc(n * sizeof(mt_bf16)), *h2 = malloc(n * sizeof(mt_bf16));
            gpu->download(gpu, h1, d_dinp, n * sizeof(mt_bf16));
            gpu->download(gpu, h2, d_frozen, n * sizeof(mt_bf16));
            snprintf(what, sizeof what, "rmsnorm_bwd R=%d C=%d dinp, dweight NULL (%s)", R, C,
                     acc ? "+=" : "=");
            assert_true(mt_test_same_bits(what, h1, h2, n * sizeof(mt_bf16)));
            free(h1), free(h2);
            gpu->free(gpu, d_frozen);
        }
        gpu->free(gpu, d_dinp), gpu->free(gpu, d_dw);
        free(fill_x), free(fill_w), free(dinp), free(dw);
    }
    gpu->free(gpu, d_inp), gpu->free(gpu, d_w), gpu->free(gpu, d_out), gpu->free(gpu, d_rstd);
    gpu->free(gpu, d_dout);
    free(inp), free(w), free(out), free(rstd), free(dout);
}

static void test_rmsnorm(void **state) {
    rmsnorm_case(37, 24, 1e-5f, 11, 0.0f);
    rmsnorm_case(19, 100, 1e-6f, 12, 0.0f); /* scalar path */
    rmsnorm_case(5, 4096, 1e-5f, 13, 0.0f);
    rmsnorm_case(300, 4096, 1e-6f, 14, 0.0f);  /* several column-sum parts */
    rmsnorm_case(20000, 64, 1e-6f, 15, 0.0f); /* more rows than the part cap */
    rmsnorm_case(300, 2048, 1e-6f, 16, 1.0f); /* (1 + w) */
    rmsnorm_case(19, 100, 1e-6f, 17, 1.0f);   /* (1 + w), scalar path */
}

/* ---------------- matmul ---------------- */

static void matmul_case(int R, int K, int M, int with_bias, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[128];
    size_t nin = (size_t)R * K, nw = (size_t)M * K, nout = (size_t)R * M;
    float *inp = mt_test_randn_bf(&rng, nin, 1.0f), *w = mt_test_randn_bf(&rng, nw, 1.0f / sqrtf((float)K));
    float *bias = with_bias ? mt_test_randn_bf(&rng, M + 1, 0.5f) : NULL;
    void *d_inp = mt_test_up_bf(gpu, inp, nin), *d_w = mt_test_up_bf(gpu, w, nw), *d_bias_mem = NULL,
         *d_bias = NULL;
    if (bias) { /* with_bias 2: a bias 2 bytes past an aligned address (not the epilogue path) */
        d_bias_mem = mt_test_up_bf(gpu, bias, M + 1);
        d_bias = (char *)d_bias_mem + (with_bias == 2 ? sizeof(mt_bf16) : 0);
        if (with_bias == 2) memmove(bias, bias + 1, M * sizeof(float));
    }

    float *out = mt_test_fnew(nout);
    cpu->matmul_forward(cpu, out, inp, w, bias, R, K, M);
    void *d_out = mt_test_poison_bf(gpu, nout);
    gpu->matmul_forward(gpu, d_out, d_inp, d_w, d_bias, R, K, M);
    snprintf(what, sizeof what, "matmul_fwd R=%d K=%d M=%d%s", R, K, M,
             with_bias == 2 ? " +bias (unaligned)" : bias ? " +bias" : "");
    assert_true(mt_test_check_bf(gpu, what, d_out, out, nout, BF_ATOL, BF_RTOL));

    float *dout = mt_test_randn_bf(&rng, nout, 1.0f);
    void *d_dout = mt_test_up_bf(gpu, dout, nout);
    float gscale = sqrtf((float)R); /* dweight's magnitude: a sum of R unit products */
    for (int acc = 0; acc <= 1; acc++) {
        float *fill_x = mt_test_randn_bf(&rng, nin, 1.0f), *fill_w = mt_test_randn(&rng, nw, gscale);
        float *fill_b = mt_test_randn(&rng, M, gscale);
        float *dinp = mt_test_copyf(fill_x, nin), *dw = mt_test_copyf(fill_w, nw),
              *db = mt_test_copyf(fill_b, M);
        if (!acc) mt_test_nan_fill(dinp, nin);
        cpu->matmul_backward(cpu, dinp, dw, bias ? db : NULL, dout, inp, w, R, K, M, acc);
        void *d_dinp = acc ? mt_test_up_bf(gpu, fill_x, nin) : mt_test_poison_bf(gpu, nin);
        float *d_dw = mt_test_up_f32(gpu, fill_w, nw), *d_db = mt_test_up_f32(gpu, fill_b, M);
        gpu->matmul_backward(gpu, d_dinp, d_dw, bias ? d_db : NULL, d_dout, d_inp, d_w, R, K, M,
                             acc);
        snprintf(what, sizeof what, "matmul_bwd R=%d K=%d M=%d dinp (%s)", R, K, M,
                 acc ? "+=" : "=");
        assert_true(mt_test_check_bf(gpu, what, d_dinp, dinp, nin, BF_ATOL, BF_RTOL));
        snprintf(what, sizeof what, "matmul_bwd R=%d K=%d M=%d dweight (+=)", R, K, M);
        assert_true(mt_test_check_f32(gpu, what, d_dw, dw, nw, F32_ATOL, F32_RTOL));
        if (acc) { /* dweight alone (dinp NULL) again from the fill: the same bits */
            float *g1 = mt_test_down_f32(gpu, d_dw, nw);
            gpu->upload(gpu, d_dw, fill_w, nw * sizeof(float));
            gpu->matmul_backward(gpu, NULL, d_dw, NULL, d_dout, d_inp, d_w, R, K, M, acc);
            float *g2 = mt_test_down_f32(gpu, d_dw, nw);
            assert_true(mt_test_same_bits(what, g1, g2, nw * sizeof(float)));
            free(g1), free(g2);
        }
        if (bias) {
            snprintf(what, sizeof what, "matmul_bwd R=%d K=%d M=%d dbias (+=)", R, K, M);
            assert_true(mt_test_check_f32(gpu, what, d_db, db, M, F32_ATOL, F32_RTOL));
            float *g1 = mt_test_down_f32(gpu, d_db, M);
            gpu->upload(gpu, d_db, fill_b, M * sizeof(float));
            gpu->matmul_backward(gpu, NULL, NULL, d_db, d_dout, d_inp, d_w, R, K, M, acc);
            float *g2 = mt_test_down_f32(gpu, d_db, M);
            assert_true(mt_test_same_bits(what, g1, g2, M * sizeof(float)));
            free(g1), free(g2);
        }
        gpu->free(gpu, d_dinp), gpu->free(gpu, d_dw), gpu->free(gpu, d_db);
        free(fill_x), free(fill_w), free(fill_b), free(dinp), free(dw), free(db);
    }
    gpu->free(gpu, d_inp), gpu->free(gpu, d_w), gpu->free(gpu, d_out), gpu->free(gpu, d_dout);
    if (d_bias_mem) gpu->free(gpu, d_bias_mem);
    free(inp), free(w), free(bias), free(out), free(dout);
}

static void test_matmul(void **state) {
    matmul_case(37, 24, 40, 0, 21);
    matmul_case(37, 24, 40, 1, 22);
    matmul_case(5, 7, 13, 1, 23); /* nothing aligned */
    matmul_case(64, 64, 128, 1, 24);
    matmul_case(64, 64, 128, 2, 29);
    matmul_case(300, 128, 64, 1, 25);
    matmul_case(512, 4096, 11008, 0, 26); /* a 7B MLP up projection */
    matmul_case(512, 11008, 4096, 0, 27); /* and its down projection */
    matmul_case(256, 4096, 4096, 1, 28);
}

/* out += inp @ W^T onto a bf16 out (LoRA's B @ (A @ x) added onto the base product): the CPU's
 * op from the same bf16 values of out, inp and W; one bf16 rounding. K = 0 and R = 0 leave out
 * as it was. */
static void matmul_forward_add_case(int R, int K, int M, size_t offset, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[128];
    size_t nin = (size_t)R * K, nw = (size_t)M * K, nout = (size_t)R * M;
    float *inp = mt_test_randn_bf(&rng, nin, 1.0f), *w = mt_test_randn_bf(&rng, nw, 1.0f / sqrtf((float)K));
    float *base = mt_test_randn_bf(&rng, nout + offset, 1.0f); /* offset: out not 16-byte aligned */
    void *d_inp = mt_test_up_bf(gpu, inp, nin), *d_w = mt_test_up_bf(gpu, w, nw),
         *d_mem = mt_test_up_bf(gpu, base, nout + offset);
    void *d_out = (char *)d_mem + offset * sizeof(mt_bf16);
    float *ref = mt_test_copyf(base + offset, nout);
    cpu->matmul_forward_add(cpu, ref, inp, w, R, K, M);
    gpu->matmul_forward_add(gpu, d_out, d_inp, d_w, R, K, M);
    float *got = mt_test_down_bf(gpu, d_mem, nout + offset);
    snprintf(what, sizeof what, "matmul_fwd_add R=%d K=%d M=%d off=%zu", R, K, M, offset);
    assert_true(mt_test_check_rms(what, got + offset, ref, nout, BF_ATOL, BF_RTOL));
    free(got);
    /* nothing to add: out keeps its bits */
    void *d_keep = mt_test_up_bf(gpu, base, nout + offset);
    mt_bf16 *h0 = malloc((nout + offset) * sizeof(mt_bf16)), *h1 = malloc((nout + offset) * sizeof(mt_bf16));
    gpu->download(gpu, h0, d_keep, (nout + offset) * sizeof(mt_bf16));
    gpu->matmul_forward_add(gpu, (char *)d_keep + offset * sizeof(mt_bf16), d_inp, d_w, R, 0, M);
    gpu->matmul_forward_add(gpu, (char *)d_keep + offset * sizeof(mt_bf16), d_inp, d_w, 0, K, M);
    gpu->download(gpu, h1, d_keep, (nout + offset) * sizeof(mt_bf16));
    snprintf(what, sizeof what, "matmul_fwd_add K=0 / R=0 (out kept)");
    assert_true(mt_test_same_bits(what, h0, h1, (nout + offset) * sizeof(mt_bf16)));
    free(h0), free(h1);
    gpu->free(gpu, d_inp), gpu->free(gpu, d_w), gpu->free(gpu, d_mem), gpu->free(gpu, d_keep);
    free(inp), free(w), free(base), free(ref);
}

static void test_matmul_forward_add(void **state) {
    matmul_forward_add_case(37, 24, 40, 0, 81);
    matmul_forward_add_case(5, 7, 13, 1, 82);      /* nothing aligned: the plain kernel may run */
    matmul_forward_add_case(512, 4096, 16, 0, 83); /* LoRA's A product (rank 16) */
    matmul_forward_add_case(512, 16, 4096, 0, 84); /* and B's, added onto the base output */
    matmul_forward_add_case(300, 8, 11008, 0, 85);
}

/* x *= s: the fp32 product of each bf16 element, rounded once: the bits of mt_f32_to_bf16 of
 * the CPU's fp32 product, on the 16-byte path and the scalar one (odd n, misaligned x). */
static void scale_case(size_t n, size_t offset, float sc, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[96];
    size_t m = n + offset;
    float *x = mt_test_randn_bf(&rng, m, 2.0f), *ref = mt_test_copyf(x, m);
    cpu->scale(cpu, ref + offset, sc, n);
    mt_bf16 *want = malloc(m * sizeof(mt_bf16)), *got = malloc(m * sizeof(mt_bf16));
    for (size_t i = 0; i < m; i++) want[i] = mt_f32_to_bf16(ref[i]); /* the head: x itself */
    void *d_x = mt_test_up_bf(gpu, x, m);
    gpu->scale(gpu, (char *)d_x + offset * sizeof(mt_bf16), sc, n);
    gpu->download(gpu, got, d_x, m * sizeof(mt_bf16));
    snprintf(what, sizeof what, "scale n=%zu off=%zu s=%g", n, offset, sc);
    int ok = memcmp(got, want, m * sizeof(mt_bf16)) == 0;
    fprintf(stderr, "%-40s %s\n", what, ok ? "bit for bit the rounded fp32 product" : "DIFFERS  FAIL");
    assert_true(ok);
    gpu->free(gpu, d_x);
    free(x), free(ref), free(want), free(got);
}

static void test_scale(void **state) {
    scale_case(1000, 0, 0.5f, 91);
    scale_case(1001, 0, -3.7f, 92);
    scale_case(4096, 1, 1.0f / 3.0f, 93); /* misaligned: scalar path */
    scale_case(((size_t)1 << 20) + 8, 0, 0.125f, 94);
    scale_case(64, 0, 0.0f, 95);
    scale_case(1, 0, 2.0f, 96);
}

/* dequant_nf4 / dequant_fp8: codes and scales from the host's quantizers (random normal weights
 * and, for FP8, every non-NaN byte as a code), uploaded at byte offset `qoff` and written to a
 * poisoned bf16 output at element offset `doff` (either non-zero: the scalar kernel); the result is
 * the CPU backend's fp32 output rounded once, bit for bit. */
static void dequant_case(int fp8, size_t n, size_t qoff, size_t doff, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    float *x = mt_test_randn(&rng, n, 0.02f), *ref = mt_test_fnew(n);
    size_t qbytes = fp8 ? n : mt_nf4_bytes((int64_t)n);
    size_t nsc = n / (fp8 ? MT_FP8_BLOCK : MT_NF4_BLOCK);
    uint8_t *q = malloc(qbytes);
    float *sc = mt_test_fnew(nsc);
    if (fp8) {
        assert_int_equal(mt_fp8_quantize(x, (int64_t)n, q, sc), MT_OK);
        for (size_t i = 0; i < n && i < 254 * 4; i++) { /* every non-NaN byte, a few scales */
            uint8_t b = (uint8_t)(i % 254);
            q[i] = b >= 0x7f ? (uint8_t)(b + 1) : b;
        }
        cpu->dequant_fp8(cpu, ref, q, sc, n);
    } else {
        assert_int_equal(mt_nf4_quantize(x, (int64_t)n, q, sc), MT_OK);
        cpu->dequant_nf4(cpu, ref, q, sc, n);
    }
    mt_bf16 *want = malloc(n * sizeof(mt_bf16)), *got = malloc(n * sizeof(mt_bf16));
    for (size_t i = 0; i < n; i++) want[i] = mt_f32_to_bf16(ref[i]);

    uint8_t *d_q = gpu->alloc(gpu, qbytes + qoff);
    gpu->upload(gpu, d_q + qoff, q, qbytes);
    float *d_sc = mt_test_up_f32(gpu, sc, nsc);
    mt_bf16 *d_out = mt_test_poison_bf(gpu, n + doff);
    if (fp8) gpu->dequant_fp8(gpu, d_out + doff, d_q + qoff, d_sc, n);
    else gpu->dequant_nf4(gpu, d_out + doff, d_q + qoff, d_sc, n);
    gpu->download(gpu, got, d_out + doff, n * sizeof(mt_bf16));
    char what[96];
    snprintf(what, sizeof what, "dequant_%s n=%zu qoff=%zu doff=%zu", fp8 ? "fp8" : "nf4", n, qoff,
             doff);
    int ok = memcmp(got, want, n * sizeof(mt_bf16)) == 0;
    fprintf(stderr, "%-40s %s\n", what, ok ? "bit for bit the CPU's fp32 rounded once" : "DIFFERS  FAIL");
    assert_true(ok);
    gpu->free(gpu, d_q), gpu->free(gpu, d_sc), gpu->free(gpu, d_out);
    free(x), free(ref), free(q), free(sc), free(want), free(got);
}

static void test_dequant(void **state) {
    (void)state;
    for (int fp8 = 0; fp8 < 2; fp8++) {
        dequant_case(fp8, 128, 0, 0, 101);
        dequant_case(fp8, 128 * 1001, 0, 0, 102);
        dequant_case(fp8, ((size_t)1 << 22) + 128 * 3, 0, 0, 103); /* past the grid cap */
        dequant_case(fp8, 128 * 50, 1, 0, 104);                  /* codes misaligned */
        dequant_case(fp8, 128 * 50, 0, 1, 105);                  /* output misaligned */
    }
}

/* dequant_mxfp4: M matrices of R x C (the checkpoint's [E, out, in]) from random code bytes and
 * scales, the first 256 scales every byte 0..255, the codes uploaded at byte offset qoff (non-zero:
 * the byte-load kernel) and written to a poisoned bf16 output at element offset doff: the CPU
 * backend's fp32 result in bf16 (exact, infinities included), bit for bit, every element written. */
static void dequant_mxfp4_case(int64_t M, int64_t R, int64_t C, size_t qoff, size_t doff, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    size_t n = (size_t)(M * R * C), nb = n / MT_MXFP4_BLOCK;
    uint8_t *blocks = malloc(n / 2), *scales = malloc(nb);
    for (size_t i = 0; i < n / 2; i++) blocks[i] = (uint8_t)mt_test_rng_u64(&rng);
    for (size_t i = 0; i < nb; i++) scales[i] = i < 256 ? (uint8_t)i : (uint8_t)(100 + mt_test_rng_u64(&rng) % 60);
    float *ref = mt_test_fnew(n);
    cpu->dequant_mxfp4(cpu, ref, blocks, scales, M, R, C);
    mt_bf16 *want = malloc(n * sizeof(mt_bf16)), *got = malloc(n * sizeof(mt_bf16));
    for (size_t i = 0; i < n; i++) want[i] = mt_f32_to_bf16(ref[i]);
    uint8_t *d_b = gpu->alloc(gpu, n / 2 + qoff), *d_s = gpu->alloc(gpu, nb);
    gpu->upload(gpu, d_b + qoff, blocks, n / 2);
    gpu->upload(gpu, d_s, scales, nb);
    mt_bf16 *d_out = mt_test_poison_bf(gpu, n + doff);
    gpu->dequant_mxfp4(gpu, d_out + doff, d_b + qoff, d_s, M, R, C);
    gpu->download(gpu, got, d_out + doff, n * sizeof(mt_bf16));
    char what[96];
    snprintf(what, sizeof what, "dequant_mxfp4 %lldx%lldx%lld qoff=%zu doff=%zu", (long long)M, (long long)R,
             (long long)C, qoff, doff);
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i] && bad++ == 0) first = i;
    if (bad)
        fprintf(stderr, "%-40s DIFFERS  FAIL: %zu of %zu, first at %zu: got 0x%04x, want 0x%04x\n", what, bad, n,
                first, got[first], want[first]);
    else
        fprintf(stderr, "%-40s bit for bit the CPU's values in bf16\n", what);
    assert_true(bad == 0);
    gpu->free(gpu, d_b), gpu->free(gpu, d_s), gpu->free(gpu, d_out);
    free(blocks), free(scales), free(ref), free(want), free(got);
}

static void test_dequant_mxfp4(void **state) {
    (void)state;
    dequant_mxfp4_case(1, 32, 32, 0, 0, 111);
    dequant_mxfp4_case(3, 45, 32 * 11, 0, 0, 112);       /* partial tiles: rows and groups */
    dequant_mxfp4_case(4, 64, 2880, 0, 0, 113);         /* gpt-oss's input width */
    dequant_mxfp4_case(80, 1000, 32 * 17, 0, 0, 114);   /* 7680 tiles: past the grid cap */
    dequant_mxfp4_case(3, 45, 32 * 11, 1, 0, 115);       /* codes misaligned: byte loads */
    dequant_mxfp4_case(3, 45, 32 * 11, 0, 1, 116);       /* output misaligned */
}

/* The plan cache holds an MoE model's variety of shapes: 3000 row counts of one product (as many
 * as the per-expert GEMMs of a layer meet over a run) build 3000 plans and evict none, and the
 * same calls again build nothing. (1024 slots, before session 8, evicted here.) */
static void test_matmul_plan_cache(void **state) {
    (void)state;
    enum { ROWS = 3000, K = 72, M = 40 };
    void *inp = gpu->alloc(gpu, (size_t)ROWS * K * 2), *w = gpu->alloc(gpu, (size_t)M * K * 2);
    void *out = gpu->alloc(gpu, (size_t)ROWS * M * 2);
    gpu->zero(gpu, inp, (size_t)ROWS * K * 2), gpu->zero(gpu, w, (size_t)M * K * 2);
    long long built0, evicted0, built1, evicted1, built2, evicted2;
    mt_cuda_matmul_plan_counts(&built0, &evicted0);
    for (int pass = 0; pass < 2; pass++) {
        for (int r = 1; r <= ROWS; r++) gpu->matmul_forward(gpu, out, inp, w, NULL, r, K, M);
        gpu->sync(gpu);
        mt_cuda_matmul_plan_counts(pass ? &built2 : &built1, pass ? &evicted2 : &evicted1);
    }
    fprintf(stderr, "plan cache: %lld plans built by %d shapes, %lld evicted; again: %lld built\n",
            built1 - built0, ROWS, evicted1 - evicted0, built2 - built1);
    assert_int_equal(built1 - built0, ROWS);
    assert_int_equal(evicted1 - evicted0, 0);
    assert_int_equal(built2 - built1, 0);
    assert_int_equal(evicted2 - evicted1, 0);
    gpu->free(gpu, inp), gpu->free(gpu, w), gpu->free(gpu, out);
}

/* ---------------- rope ---------------- */

/* rd < D: partial RoPE over the first rd dims of each head */
static void rope_case(int N, int nh, int D, int rd, int maxpos, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[96];
    size_t n = (size_t)N * nh * D;
    int32_t *pos = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) pos[i] = (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)maxpos);
    pos[0] = 0, pos[N - 1] = maxpos - 1;
    float *inv = mt_test_fnew(rd / 2);
    for (int i = 0; i < rd / 2; i++) inv[i] = (float)pow(500000.0, -2.0 * i / rd);
    int32_t *d_pos = mt_test_up_i32(gpu, pos, N);
    float *d_inv = mt_test_up_f32(gpu, inv, rd / 2);
    float *x = mt_test_randn_bf(&rng, n, 1.0f);
    void *d_x = mt_test_up_bf(gpu, x, n);
    float *ref = mt_test_copyf(x, n);
    cpu->rope_forward(cpu, ref, pos, inv, N, nh, D, rd);
    gpu->rope_forward(gpu, d_x, d_pos, d_inv, N, nh, D, rd);
    snprintf(what, sizeof what, "rope_fwd N=%d nh=%d D=%d rd=%d maxpos=%d", N, nh, D, rd, maxpos);
    assert_true(mt_test_check_bf(gpu, what, d_x, ref, n, BF_ATOL, BF_RTOL));
    /* the backward from the same input */
    free(ref);
    ref = mt_test_copyf(x, n);
    gpu->free(gpu, d_x);
    d_x = mt_test_up_bf(gpu, x, n);
    cpu->rope_backward(cpu, ref, pos, inv, N, nh, D, rd);
    gpu->rope_backward(gpu, d_x, d_pos, d_inv, N, nh, D, rd);
    snprintf(what, sizeof what, "rope_bwd N=%d nh=%d D=%d rd=%d maxpos=%d", N, nh, D, rd, maxpos);
    assert_true(mt_test_check_bf(gpu, what, d_x, ref, n, BF_ATOL, BF_RTOL));
    /* forward after backward: back to x within two roundings */
    gpu->rope_forward(gpu, d_x, d_pos, d_inv, N, nh, D, rd);
    snprintf(what, sizeof what, "rope_bwd_then_fwd D=%d (= input)", D);
    assert_true(mt_test_check_bf(gpu, what, d_x, x, n, BF_ATOL, BF_RTOL));
    gpu->free(gpu, d_x), gpu->free(gpu, d_pos), gpu->free(gpu, d_inv);
    free(pos), free(inv), free(x), free(ref);
}

static void test_rope(void **state) {
    rope_case(37, 4, 64, 64, 4096, 31);
    rope_case(16, 3, 128, 128, 131072, 32);
    rope_case(11, 2, 24, 24, 1000, 33); /* D % 16 != 0: scalar path */
    rope_case(64, 8, 128, 128, 1000000, 34); /* large positions: accurate sincosf */
    rope_case(37, 4, 256, 64, 262144, 35);   /* qwen3_5's partial RoPE: a quarter of the head */
    rope_case(11, 2, 24, 8, 1000, 36);       /* partial, scalar path (rd % 16 != 0) */
}

/* ---------------- swiglu, add ---------------- */

static void swiglu_case(size_t n, size_t offset, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[96];
    size_t m = n + offset; /* `offset` elements in: misaligned pointers when odd */
    float *g = mt_test_randn_bf(&rng, m, 2.0f), *u = mt_test_randn_bf(&rng, m, 1.0f),
          *d = mt_test_randn_bf(&rng, m, 1.0f);
    g[offset] = mt_bf16_to_f32(mt_f32_to_bf16(-90.0f)); /* exp overflow side */
    if (n > 1) g[offset + 1] = 30.0f;
    void *dg = mt_test_up_bf(gpu, g, m), *du = mt_test_up_bf(gpu, u, m), *dd = mt_test_up_bf(gpu, d, m);
    size_t b = offset * sizeof(mt_bf16);
    void *G = (char *)dg + b, *U = (char *)du + b, *Dd = (char *)dd + b;

    float *out = mt_test_fnew(n), *rg = mt_test_fnew(n), *ru = mt_test_fnew(n), *sum = mt_test_fnew(n);
    cpu->swiglu_forward(cpu, out, g + offset, u + offset, n);
    void *d_out = mt_test_poison_bf(gpu, m);
    gpu->swiglu_forward(gpu, (char *)d_out + b, G, U, n);
    float *got = mt_test_down_bf(gpu, d_out, m);
    snprintf(what, sizeof what, "swiglu_fwd n=%zu off=%zu", n, offset);
    assert_true(mt_test_check_rms(what, got + offset, out, n, BF_ATOL, BF_RTOL));
    free(got);

    cpu->swiglu_backward(cpu, rg, ru, d + offset, g + offset, u + offset, n);
    void *d_dg = mt_test_poison_bf(gpu, m), *d_du = mt_test_poison_bf(gpu, m);
    gpu->swiglu_backward(gpu, (char *)d_dg + b, (char *)d_du + b, Dd, G, U, n);
    got = mt_test_down_bf(gpu, d_dg, m);
    snprintf(what, sizeof what, "swiglu_bwd n=%zu off=%zu dgate", n, offset);
    assert_true(mt_test_check_rms(what, got + offset, rg, n, BF_ATOL, BF_RTOL));
    free(got);
    got = mt_test_down_bf(gpu, d_du, m);
    snprintf(what, sizeof what, "swiglu_bwd n=%zu off=%zu dup", n, offset);
    assert_true(mt_test_check_rms(what, got + offset, ru, n, BF_ATOL, BF_RTOL));
    free(got);

    cpu->add(cpu, sum, u + offset, d + offset, n);
    void *d_sum = mt_test_poison_bf(gpu, m);
    gpu->add(gpu, (char *)d_sum + b, U, Dd, n);
    got = mt_test_down_bf(gpu, d_sum, m);
    snprintf(what, sizeof what, "add n=%zu off=%zu", n, offset);
    assert_true(mt_test_check_rms(what, got + offset, sum, n, BF_ATOL, BF_RTOL));
    free(got);
    gpu->add(gpu, U, U, Dd, n); /* out aliases a */
    got = mt_test_down_bf(gpu, du, m);
    snprintf(what, sizeof what, "add n=%zu off=%zu (out = a)", n, offset);
    assert_true(mt_test_check_rms(what, got + offset, sum, n, BF_ATOL, BF_RTOL));
    free(got);

    gpu->free(gpu, dg), gpu->free(gpu, du), gpu->free(gpu, dd), gpu->free(gpu, d_out);
    gpu->free(gpu, d_dg), gpu->free(gpu, d_du), gpu->free(gpu, d_sum);
    free(g), free(u), free(d), free(out), free(rg), free(ru), free(sum);
}

/* ---------------- sigmoid gates, column split and join (qwen3_5) ---------------- */

static void gate_case(int R, int C, int Cg, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[96];
    size_t n = (size_t)R * C, ng = (size_t)R * Cg;
    float *x = mt_test_randn_bf(&rng, n, 1.0f), *g = mt_test_randn_bf(&rng, ng, 3.0f),
          *d = mt_test_randn_bf(&rng, n, 1.0f);
    void *dx_ = mt_test_up_bf(gpu, x, n), *dg_ = mt_test_up_bf(gpu, g, ng), *dd_ = mt_test_up_bf(gpu, d, n);
    float *out = mt_test_fnew(n), *rx = mt_test_fnew(n), *rg = mt_test_fnew(ng);
    cpu->sigmoid_gate_forward(cpu, out, x, g, R, C, Cg);
    void *d_out = mt_test_poison_bf(gpu, n);
    gpu->sigmoid_gate_forward(gpu, d_out, dx_, dg_, R, C, Cg);
    snprintf(what, sizeof what, "sigmoid_gate_fwd R=%d C=%d Cg=%d", R, C, Cg);
    assert_true(mt_test_check_bf(gpu, what, d_out, out, n, BF_ATOL, BF_RTOL));
    cpu->sigmoid_gate_backward(cpu, rx, rg, d, x, g, R, C, Cg);
    void *d_dx = mt_test_poison_bf(gpu, n), *d_dg = mt_test_poison_bf(gpu, ng);
    gpu->sigmoid_gate_backward(gpu, d_dx, d_dg, dd_, dx_, dg_, R, C, Cg);
    snprintf(what, sizeof what, "sigmoid_gate_bwd R=%d C=%d Cg=%d dx", R, C, Cg);
    assert_true(mt_test_check_bf(gpu, what, d_dx, rx, n, BF_ATOL, BF_RTOL));
    snprintf(what, sizeof what, "sigmoid_gate_bwd R=%d C=%d Cg=%d dg", R, C, Cg);
    assert_true(mt_test_check_bf(gpu, what, d_dg, rg, ng, BF_ATOL, BF_RTOL));
    /* split then join: the exact bytes back */
    int wa = C / 3 + 1, wb = C - wa;
    void *a = mt_test_poison_bf(gpu, (size_t)R * wa), *b = mt_test_poison_bf(gpu, (size_t)R * wb),
         *back = mt_test_poison_bf(gpu, n);
    gpu->cols_split(gpu, a, b, dx_, R, wa, wb);
    gpu->cols_join(gpu, back, a, b, R, wa, wb);
    float *got = mt_test_down_bf(gpu, back, n), *xa = mt_test_down_bf(gpu, a, (size_t)R * wa);
    assert_memory_equal(got, x, n * sizeof(float));
    for (int r = 0; r < R; r++) assert_memory_equal(xa + (size_t)r * wa, x + (size_t)r * C, wa * sizeof(float));
    gpu->free(gpu, dx_), gpu->free(gpu, dg_), gpu->free(gpu, dd_), gpu->free(gpu, d_out);
    gpu->free(gpu, d_dx), gpu->free(gpu, d_dg), gpu->free(gpu, a), gpu->free(gpu, b), gpu->free(gpu, back);
    free(x), free(g), free(d), free(out), free(rx), free(rg), free(got), free(xa);
}

static void test_gates_split(void **state) {
    gate_case(64, 256, 256, 41); /* the attention gate: one an element */
    gate_case(333, 2048, 1, 42); /* the shared expert's: one a row */
    gate_case(7, 5, 1, 43);
}

static void test_swiglu_add(void **state) {
    swiglu_case(1000, 0, 41);
    swiglu_case(1001, 0, 42);
    swiglu_case(4096 * 11, 1, 43); /* misaligned: scalar path */
    swiglu_case((size_t)512 * 11008, 0, 44);
    swiglu_case(1, 0, 45);
}

/* ---------------- sumsq, from_f32 ---------------- */

static void test_sumsq_from_f32(void **state) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 51);
    size_t sizes[] = {1, 1003, ((size_t)1 << 20) + 3, (size_t)16 << 20};
    for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
        size_t n = sizes[t];
        char what[96];
        float *x = mt_test_randn(&rng, n, 0.01f);
        float *d_x = mt_test_up_f32(gpu, x, n);
        float ref = 1.5f, start = 1.5f;
        cpu->sumsq(cpu, &ref, x, n);
        float *d_out = mt_test_up_f32(gpu, &start, 1);
        gpu->sumsq(gpu, d_out, d_x, n);
        float got1, got2;
        gpu->download(gpu, &got1, d_out, sizeof got1);
        snprintf(what, sizeof what, "sumsq n=%zu (+=)", n);
        assert_true(mt_allclose(what, &got1, &ref, 1, 0, SUMSQ_RTOL));
        gpu->upload(gpu, d_out, &start, sizeof start);
        gpu->sumsq(gpu, d_out, d_x, n);
        gpu->download(gpu, &got2, d_out, sizeof got2);
        assert_true(mt_test_same_bits(what, &got1, &got2, sizeof got1));

        /* from_f32: bits as mt_f32_to_bf16 (round to nearest even); specials and ties too */
        float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, 1e-40f, 3.0e38f, 1.00390625f,
                            1.01171875f, -1.00390625f, 65504.0f};
        size_t ns = sizeof specials / sizeof specials[0];
        for (size_t i = 0; i < ns && i < n; i++) x[i] = specials[i];
        if (n > ns) x[ns] = NAN;
        gpu->upload(gpu, d_x, x, n * sizeof(float));
        void *d_b = mt_test_poison_bf(gpu, n + 1);
        gpu->from_f32(gpu, d_b, d_x, n);
        mt_bf16 *hb = malloc((n + 1) * sizeof(mt_bf16));
        gpu->download(gpu, hb, d_b, (n + 1) * sizeof(mt_bf16));
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            mt_bf16 want = mt_f32_to_bf16(x[i]);
            int ok = isnan(x[i]) ? isnan(mt_bf16_to_f32(hb[i])) : hb[i] == want;
            if (!ok && bad++ < 5)
                fprintf(stderr, "  from_f32[%zu]: %.9g -> 0x%04x, want 0x%04x\n", i, x[i], hb[i],
                        want);
        }
        fprintf(stderr, "%-40s n=%zu %zu mismatches%s\n", "from_f32 (bits)", n, bad,
                bad ? "  FAIL" : "");
        assert_int_equal(bad, 0);
        assert_int_equal(hb[n], 0x7fc0); /* nothing past the end */
        gpu->free(gpu, d_x), gpu->free(gpu, d_out), gpu->free(gpu, d_b);
        free(x), free(hb);
    }
}

/* ---------------- attention ---------------- */

static void attention_case(int B, int T, int H, int G, int D, int packed, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[128];
    int N = B * T;
    size_t nq = (size_t)N * H * D, nk = (size_t)N * G * D, nl = (size_t)B * H * T;
    float *q = mt_test_randn_bf(&rng, nq, 1.0f), *k = mt_test_randn_bf(&rng, nk, 1.0f),
          *v = mt_test_randn_bf(&rng, nk, 1.0f);
    int32_t *doc = NULL, *d_doc = NULL;
    if (packed) { /* documents of random lengths 1..T/3+1 packed in each row */
        doc = malloc(N * sizeof(int32_t));
        for (int b = 0; b < B; b++) {
            int start = 0;
            for (int t = 0; t < T; t++) {
                if (t > start && mt_test_rng_uniform(&rng) < 3.0f / T) start = t;
                doc[b * T + t] = start;
            }
        }
        d_doc = mt_test_up_i32(gpu, doc, N);
    }
    void *d_q = mt_test_up_bf(gpu, q, nq), *d_k = mt_test_up_bf(gpu, k, nk), *d_v = mt_test_up_bf(gpu, v, nk);
    float *out = mt_test_fnew(nq), *lse = mt_test_fnew(nl);
    cpu->attention_forward(cpu, out, lse, q, k, v, doc, B, T, H, G, D, NULL);
    void *d_out = mt_test_poison_bf(gpu, nq);
    float *d_lse = mt_test_poison_f32(gpu, nl);
    gpu->attention_forward(gpu, d_out, d_lse, d_q, d_k, d_v, d_doc, B, T, H, G, D, NULL);
    const char *kind = packed ? "packed" : "causal";
    snprintf(what, sizeof what, "attn_fwd B=%d T=%d H=%d G=%d D=%d %s out", B, T, H, G, D, kind);
    assert_true(mt_test_check_bf(gpu, what, d_out, out, nq, BF_ATOL, BF_RTOL));
    float *glse = mt_test_down_f32(gpu, d_lse, nl);
    snprintf(what, sizeof what, "attn_fwd B=%d T=%d H=%d G=%d D=%d %s lse", B, T, H, G, D, kind);
    assert_true(mt_allclose(what, glse, lse, nl, LSE_ATOL, LSE_RTOL));
    free(glse);

    /* the backward of both from the CPU's out (bf16-rounded) and lse */
    for (size_t i = 0; i < nq; i++) out[i] = mt_bf16_to_f32(mt_f32_to_bf16(out[i]));
    gpu->free(gpu, d_out);
    d_out = mt_test_up_bf(gpu, out, nq);
    gpu->upload(gpu, d_lse, lse, nl * sizeof(float));
    float *dout = mt_test_randn_bf(&rng, nq, 1.0f);
    void *d_dout = mt_test_up_bf(gpu, dout, nq);
    float *dq = mt_test_fnew(nq), *dk = mt_test_fnew(nk), *dv = mt_test_fnew(nk);
    cpu->attention_backward(cpu, dq, dk, dv, dout, out, lse, q, k, v, doc, B, T, H, G, D, NULL);
    void *d_dq = mt_test_poison_bf(gpu, nq), *d_dk = mt_test_poison_bf(gpu, nk),
         *d_dv = mt_test_poison_bf(gpu, nk);
    gpu->attention_backward(gpu, d_dq, d_dk, d_dv, d_dout, d_out, d_lse, d_q, d_k, d_v, d_doc, B,
                            T, H, G, D, NULL);
    snprintf(what, sizeof what, "attn_bwd B=%d T=%d H=%d G=%d D=%d %s dq", B, T, H, G, D, kind);
    assert_true(mt_test_check_rows_bf(gpu, what, d_dq, dq, nq / D, D, LOOSE_ATOL, LOOSE_RTOL,
                                      LOOSE_ATOL));
    snprintf(what, sizeof what, "attn_bwd B=%d T=%d H=%d G=%d D=%d %s dk", B, T, H, G, D, kind);
    assert_true(mt_test_check_rows_bf(gpu, what, d_dk, dk, nk / D, D, LOOSE_ATOL, LOOSE_RTOL,
                                      LOOSE_ATOL));
    snprintf(what, sizeof what, "attn_bwd B=%d T=%d H=%d G=%d D=%d %s dv", B, T, H, G, D, kind);
    assert_true(mt_test_check_rows_bf(gpu, what, d_dv, dv, nk / D, D, LOOSE_ATOL, LOOSE_RTOL,
                                      LOOSE_ATOL));

    gpu->free(gpu, d_q), gpu->free(gpu, d_k), gpu->free(gpu, d_v), gpu->free(gpu, d_out);
    gpu->free(gpu, d_lse), gpu->free(gpu, d_dout), gpu->free(gpu, d_dq), gpu->free(gpu, d_dk);
    gpu->free(gpu, d_dv);
    if (d_doc) gpu->free(gpu, d_doc);
    free(q), free(k), free(v), free(doc), free(out), free(lse), free(dout), free(dq), free(dk);
    free(dv);
}

static void test_attention(void **state) {
    attention_case(2, 37, 4, 2, 64, 0, 61);
    attention_case(2, 100, 4, 1, 128, 1, 62);
    attention_case(1, 256, 8, 8, 64, 0, 63);
    attention_case(2, 300, 8, 2, 128, 1, 64);
    attention_case(1, 1024, 4, 2, 128, 0, 65);
}

/* ---------------- LM head + cross-entropy ---------------- */

static void lm_head_case(int N, int C, int V, int with_dinp, int with_dw, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[128];
    size_t ni = (size_t)N * C, nw = (size_t)V * C;
    float *inp = mt_test_randn_bf(&rng, ni, 1.0f), *w = mt_test_randn_bf(&rng, nw, 1.0f / sqrtf((float)C));
    int32_t *tg = malloc(N * sizeof(int32_t));
    int valid = 0;
    for (int n = 0; n < N; n++) {
        tg[n] = n % 7 == 3 ? -1 : (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)V);
        valid += tg[n] >= 0;
    }
    float scale = 1.0f / (float)(valid ? valid : 1);
    void *d_inp = mt_test_up_bf(gpu, inp, ni), *d_w = mt_test_up_bf(gpu, w, nw);
    int32_t *d_tg = mt_test_up_i32(gpu, tg, N);
    float *fill_w = mt_test_randn(&rng, nw, 0.01f);
    float *losses = mt_test_fnew(N), *dinp = with_dinp ? mt_test_fnew(ni) : NULL;
    float *dw = with_dw ? mt_test_copyf(fill_w, nw) : NULL;
    if (dinp) mt_test_nan_fill(dinp, ni);
    cpu->lm_head_loss(cpu, losses, dinp, dw, inp, w, tg, N, C, V, scale);
    float *d_losses = mt_test_poison_f32(gpu, N);
    void *d_dinp = with_dinp ? mt_test_poison_bf(gpu, ni) : NULL;
    float *d_dw = with_dw ? mt_test_up_f32(gpu, fill_w, nw) : NULL;
    gpu->lm_head_loss(gpu, d_losses, d_dinp, d_dw, d_inp, d_w, d_tg, N, C, V, scale);
    const char *mode = with_dinp ? (with_dw ? "fwd+bwd" : "fwd+dinp") : "losses";
    float *gl = mt_test_down_f32(gpu, d_losses, N);
    snprintf(what, sizeof what, "lm_head N=%d C=%d V=%d %s losses", N, C, V, mode);
    assert_true(mt_allclose(what, gl, losses, N, LOSS_ATOL, LOSS_RTOL));
    free(gl);
    if (with_dinp) {
        snprintf(what, sizeof what, "lm_head N=%d C=%d V=%d %s dinp", N, C, V, mode);
        assert_true(mt_test_check_bf(gpu, what, d_dinp, dinp, ni, LOOSE_ATOL, LOOSE_RTOL));
    }
    if (with_dinp && with_dw) { /* dweight NULL (a frozen head): dinp the same bits */
        void *d_frozen = mt_test_poison_bf(gpu, ni);
        gpu->lm_head_loss(gpu, d_losses, d_frozen, NULL, d_inp, d_w, d_tg, N, C, V, scale);
        mt_bf16 *h1 = malloc(ni * sizeof(mt_bf16)), *h2 = malloc(ni * sizeof(mt_bf16));
        gpu->download(gpu, h1, d_dinp, ni * sizeof(mt_bf16));
        gpu->download(gpu, h2, d_frozen, ni * sizeof(mt_bf16));
        snprintf(what, sizeof what, "lm_head N=%d C=%d V=%d dinp, dweight NULL", N, C, V);
        assert_true(mt_test_same_bits(what, h1, h2, ni * sizeof(mt_bf16)));
        free(h1), free(h2);
        gpu->free(gpu, d_frozen);
    }
    if (with_dw) { /* compare the increment: the fill is tiny against nothing */
        float *g = mt_test_down_f32(gpu, d_dw, nw);
        for (size_t i = 0; i < nw; i++) g[i] -= fill_w[i], dw[i] -= fill_w[i];
        snprintf(what, sizeof what, "lm_head N=%d C=%d V=%d %s dweight (+=)", N, C, V, mode);
        assert_true(mt_test_check_rms(what, g, dw, nw, LOOSE_ATOL, LOOSE_RTOL));
        free(g);
    }
    gpu->free(gpu, d_inp), gpu->free(gpu, d_w), gpu->free(gpu, d_tg), gpu->free(gpu, d_losses);
    if (d_dinp) gpu->free(gpu, d_dinp);
    if (d_dw) gpu->free(gpu, d_dw);
    free(inp), free(w), free(tg), free(fill_w), free(losses), free(dinp), free(dw);
}

static void test_lm_head(void **state) {
    lm_head_case(37, 64, 1000, 0, 0, 71);
    lm_head_case(37, 64, 1000, 1, 1, 72);
    lm_head_case(300, 128, 5003, 1, 1, 73);
    lm_head_case(300, 128, 5003, 1, 0, 74);
    lm_head_case(512, 2048, 32000, 1, 1, 75);
}

/* ---------------- streams and events ---------------- */

typedef struct {
    mt_backend *be;
    mt_event *ev;
} sync_arg;

static void *event_sync_thread(void *p) {
    sync_arg *a = p;
    a->be->event_sync(a->be, a->ev); /* as the optimizer thread does */
    return NULL;
}

static void test_streams(void **state) {
    size_t n = (size_t)32 << 20; /* 64 MB each way: long enough for a missing wait to show */
    size_t bytes = n * sizeof(mt_bf16);
    mt_bf16 *h_in = gpu->host_alloc(gpu, bytes), *h_out = gpu->host_alloc(gpu, bytes);
    void *d_in = gpu->alloc(gpu, bytes), *d_out = gpu->alloc(gpu, bytes);
    mt_event *loaded = gpu->event_create(gpu), *computed = gpu->event_create(gpu);
    mt_event *stored = gpu->event_create(gpu), *never = gpu->event_create(gpu);
    gpu->event_sync(gpu, never); /* never recorded: complete */
    for (int iter = 0; iter < 4; iter++) {
        for (size_t i = 0; i < n; i++) h_in[i] = mt_f32_to_bf16((float)((i + iter) % 61));
        memset(h_out, 0xff, bytes);
        gpu->copy_async(gpu, MT_STREAM_H2D, d_in, h_in, bytes);
        gpu->event_record(gpu, loaded, MT_STREAM_H2D);
        gpu->stream_wait(gpu, MT_STREAM_COMPUTE, loaded);
        gpu->add(gpu, d_out, d_in, d_in, n);
        gpu->event_record(gpu, computed, MT_STREAM_COMPUTE);
        gpu->stream_wait(gpu, MT_STREAM_D2H, computed);
        gpu->copy_async(gpu, MT_STREAM_D2H, h_out, d_out, bytes);
        gpu->event_record(gpu, stored, MT_STREAM_D2H);
        pthread_t th;
        sync_arg a = {gpu, stored};
        assert_int_equal(pthread_create(&th, NULL, event_sync_thread, &a), 0);
        pthread_join(th, NULL);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            if (h_out[i] != mt_f32_to_bf16((float)(2 * ((i + iter) % 61)))) bad++;
        fprintf(stderr, "%-40s iter %d: %zu of %zu wrong%s\n", "streams H2D -> add -> D2H", iter,
                bad, n, bad ? "  FAIL" : "");
        assert_int_equal(bad, 0);
        gpu->zero(gpu, d_in, bytes); /* the next copy must also wait for nothing stale */
        gpu->sync(gpu);
    }
    gpu->event_destroy(gpu, loaded), gpu->event_destroy(gpu, computed);
    gpu->event_destroy(gpu, stored), gpu->event_destroy(gpu, never);
    gpu->free(gpu, d_in), gpu->free(gpu, d_out);
    gpu->host_free(gpu, h_in), gpu->host_free(gpu, h_out);
}

/* ---------------- the memory budget (a child process) ---------------- */

static int budget_child(void) {
    mt_backend *be = mt_backend_cuda_create((int64_t)256 * MIB); /* 64 MiB go to cuBLASLt */
    void *a = be->alloc(be, 100 * MIB);
    be->free(be, a); /* freed bytes return to the budget */
    void *b = be->alloc(be, 150 * MIB);
    fprintf(stderr, "budget child: 150 MiB allocated, now asking for 100 MiB more\n");
    void *c = be->alloc(be, 100 * MIB); /* 64 + 150 + 100 > 256: fatal */
    fprintf(stderr, "budget child: NOT STOPPED (%p %p)\n", b, c);
    return 0;
}

static void test_budget(void **state) {
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    assert_true(len > 0);
    exe[len] = '\0';
    char cmd[4200], out[8192];
    snprintf(cmd, sizeof cmd, "'%s' %s", exe, BUDGET_CHILD_ARG);
    int rc = mt_test_run(cmd, out, sizeof out); /* fork + exec: the child starts CUDA afresh */
    fprintf(stderr, "budget child exit %d, said:\n%s", rc, out);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(out, "budget"));
    assert_non_null(strstr(out, "--gpu-mem"));
    assert_non_null(strstr(out, "256.0 MiB")); /* the budget */
    assert_non_null(strstr(out, "100.0 MiB")); /* the request */
    assert_non_null(strstr(out, "214.0 MiB")); /* in use: workspace + 150 */
    assert_null(strstr(out, "NOT STOPPED"));
}

int main(int argc, char **argv) {
    if (!mt_backend_cuda_available()) {
        fprintf(stderr, "test_cuda_ops: no usable CUDA device, skipped\n");
        return 77;
    }
    if (argc > 1 && strcmp(argv[1], BUDGET_CHILD_ARG) == 0) return budget_child();
    cpu = mt_backend_cpu_create();
    gpu = mt_backend_cuda_create(0);
    if (gpu->dtype != MT_BF16 || strcmp(gpu->name, "cuda") != 0) {
        fprintf(stderr, "test_cuda_ops: the cuda backend reports %s / dtype %d\n", gpu->name,
                (int)gpu->dtype);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory),    cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rmsnorm),   cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_plan_cache),
        cmocka_unit_test(test_matmul_forward_add), cmocka_unit_test(test_scale),
        cmocka_unit_test(test_dequant),
        cmocka_unit_test(test_dequant_mxfp4),
        cmocka_unit_test(test_rope),      cmocka_unit_test(test_swiglu_add),
        cmocka_unit_test(test_gates_split),
        cmocka_unit_test(test_sumsq_from_f32), cmocka_unit_test(test_attention),
        cmocka_unit_test(test_lm_head),   cmocka_unit_test(test_streams),
        cmocka_unit_test(test_budget),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    return failed ? 1 : 0;
}
