/* The CUDA backend's ops for Gemma 3 and gpt-oss against the fp32 CPU reference backend, op by op:
 * geglu_forward/backward, zero_rows_of_id, swiglu_clamped_forward/backward and
 * moe_matmul_io_forward/backward. Exits 77 (ctest: skipped) when no CUDA device is usable.
 *
 * As test_cuda_ops: inputs drawn in fp32 and rounded to bf16, the CPU fed the rounded values, so
 * the comparison measures the op. |gpu - cpu| <= atol + rtol*|cpu|, atol relative to `scale` =
 * the RMS of the reference tensor:
 *   bf16 outputs (one rounding to bf16 = 2^-9 relative):          atol 1e-2*scale, rtol 2e-2
 *   fp32 outputs from the same bf16 inputs (summation order only): atol 1e-4*scale, rtol 1e-3
 *   zero_rows_of_id: exact (bits).
 * Outputs written (=) are poisoned first (bf16 NaN 0x7fc0, fp32 NaN) so an unwritten element fails;
 * outputs accumulated (+=) are pre-filled and the fill is part of the reference.
 * geglu: gates with large |x| (tanh saturated both ways, up to |x| = 1000) beside normal ones, on
 * the vector and the scalar (odd n, misaligned) paths.
 * swiglu_clamped: gate/up spread so that gates exceed limit and ups exceed +-limit, plus values
 * exactly at the bounds; besides the tolerance, the gradient must be exactly 0 wherever a clamp
 * acted and non-zero at the bounds (they pass, as torch.clamp).
 * moe_matmul_io: E = 4 experts, one with no rows (its dweight / dbias slices must keep the fill's
 * bits), K and M multiples of 16 and not, bias and none; backward with accumulate 0 and 1 and
 * every NULL combination of dinp / dweight / dbias that the model can pass: a NULL output is left
 * alone, and each non-NULL one is bit for bit the full call's (the work does not depend on what
 * else is asked). */
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

static mt_backend *cpu, *gpu;

/* ---------------- checks (the buffers: util/dev_buffers.h) ---------------- */

static int same_bits(const char *what, const void *a, const void *b, size_t bytes) {
    int ok = memcmp(a, b, bytes) == 0;
    fprintf(stderr, "%-48s %s\n", what, ok ? "bit-identical" : "DIFFERS  FAIL");
    return ok;
}

/* ---------------- geglu ---------------- */

/* Large |g| at every 17th element: saturated tanh both ways (gelu(g) = g or -0, its slope 1 or 0),
 * and g = +-1000 where g^3 is 1e9. Where g >= 30, up and dout are about 1/g so that out and dup
 * stay at the tensor's scale and do not make the RMS-relative atol lax for the rest. */
static void geglu_case(size_t n, size_t offset, uint64_t seed) {
    static const float big[] = {8.0f, -8.0f, 12.0f, -12.0f, 30.0f, -30.0f, 90.0f, -90.0f,
                                -1000.0f, 1000.0f, 5.0f, -5.0f, -3.0f, 3.0f};
    const int nbig = (int)(sizeof big / sizeof big[0]);
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[96];
    size_t m = n + offset; /* `offset` elements in: misaligned pointers when odd */
    float *g = mt_test_randn_bf(&rng, m, 2.0f), *u = mt_test_randn_bf(&rng, m, 1.0f),
          *d = mt_test_randn_bf(&rng, m, 1.0f);
    for (size_t i = 0, j = 0; i < n; i += 17, j++) {
        float v = big[j % nbig];
        g[offset + i] = v;
        if (v >= 30.0f) u[offset + i] = d[offset + i] = mt_test_bf_round(1.0f / v);
    }
    void *dg = mt_test_up_bf(gpu, g, m), *du = mt_test_up_bf(gpu, u, m), *dd = mt_test_up_bf(gpu, d, m);
    size_t b = offset * sizeof(mt_bf16);
    void *G = (char *)dg + b, *U = (char *)du + b, *Dd = (char *)dd + b;

    float *out = mt_test_fnew(n), *rg = mt_test_fnew(n), *ru = mt_test_fnew(n);
    cpu->geglu_forward(cpu, out, g + offset, u + offset, n);
    void *d_out = mt_test_poison_bf(gpu, m);
    gpu->geglu_forward(gpu, (char *)d_out + b, G, U, n);
    float *got = mt_test_down_bf(gpu, d_out, m);
    snprintf(what, sizeof what, "geglu_fwd n=%zu off=%zu", n, offset);
    assert_true(mt_test_check_rms(what, got + offset, out, n, BF_ATOL, BF_RTOL));
    free(got);

    cpu->geglu_backward(cpu, rg, ru, d + offset, g + offset, u + offset, n);
    void *d_dg = mt_test_poison_bf(gpu, m), *d_du = mt_test_poison_bf(gpu, m);
    gpu->geglu_backward(gpu, (char *)d_dg + b, (char *)d_du + b, Dd, G, U, n);
    got = mt_test_down_bf(gpu, d_dg, m);
    snprintf(what, sizeof what, "geglu_bwd n=%zu off=%zu dgate", n, offset);
    assert_true(mt_test_check_rms(what, got + offset, rg, n, BF_ATOL, BF_RTOL));
    free(got);
    got = mt_test_down_bf(gpu, d_du, m);
    snprintf(what, sizeof what, "geglu_bwd n=%zu off=%zu dup", n, offset);
    assert_true(mt_test_check_rms(what, got + offset, ru, n, BF_ATOL, BF_RTOL));
    free(got);

    gpu->free(gpu, dg), gpu->free(gpu, du), gpu->free(gpu, dd), gpu->free(gpu, d_out);
    gpu->free(gpu, d_dg), gpu->free(gpu, d_du);
    free(g), free(u), free(d), free(out), free(rg), free(ru);
}

static void test_geglu(void **state) {
    geglu_case(1000, 0, 51);
    geglu_case(1001, 0, 52);              /* odd n: scalar path */
    geglu_case((size_t)4096 * 11, 1, 53); /* misaligned: scalar path */
    geglu_case((size_t)512 * 10240, 0, 54); /* a Gemma 3 MLP's width, 512 tokens */
    geglu_case(1, 0, 55);
}

/* ---------------- zero_rows_of_id ---------------- */

static void zero_rows_case(int N, int C, int32_t id, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[96];
    size_t n = (size_t)N * C;
    float *x = mt_test_randn_bf(&rng, n, 1.0f);
    int32_t *ids = malloc((N ? N : 1) * sizeof(int32_t));
    int hits = 0;
    for (int i = 0; i < N; i++) {
        ids[i] = (int32_t)(mt_test_rng_u64(&rng) % 5); /* id 0..4: many rows of each */
        hits += ids[i] == id;
    }
    void *d_x = mt_test_up_bf(gpu, x, n);
    int32_t *d_ids = mt_test_up_i32(gpu, ids, N);
    cpu->zero_rows_of_id(cpu, x, ids, id, N, C);
    gpu->zero_rows_of_id(gpu, d_x, d_ids, id, N, C);
    float *got = mt_test_down_bf(gpu, d_x, n);
    snprintf(what, sizeof what, "zero_rows_of_id N=%d C=%d id=%d (%d rows)", N, C, id, hits);
    assert_true(mt_test_check_rms(what, got, x, n, 0, 0)); /* exact */
    assert_memory_equal(got, x, n * sizeof(float)); /* +0, not -0 or the old value */
    gpu->free(gpu, d_x), gpu->free(gpu, d_ids);
    free(x), free(ids), free(got);
}

static void test_zero_rows_of_id(void **state) {
    zero_rows_case(37, 24, 0, 61);
    zero_rows_case(333, 2560, 3, 62); /* Gemma 3 4B's width */
    zero_rows_case(64, 101, 4, 63);
    zero_rows_case(50, 16, 7, 64); /* an id no token has: nothing changes */
}

/* ---------------- swiglu_clamped ---------------- */

/* gate_up ~ normal(0, 5) with limit 7: about 8% of gates above the limit and 16% of ups outside
 * +-limit; plus gate = limit, up = -limit and up = +limit exactly (the bounds, which pass the
 * gradient), gate just above and up just below (which do not). */
static void swiglu_clamped_case(int R, int F, size_t offset, uint64_t seed) {
    const float alpha = 1.702f, limit = 7.0f;
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[128];
    size_t n = (size_t)R * F, m2 = 2 * n + 2 * offset, md = n + offset;
    float *gu = mt_test_randn_bf(&rng, m2, 5.0f), *d = mt_test_randn_bf(&rng, md, 1.0f);
    float *x = gu + 2 * offset; /* (R, 2F) as the op sees it */
    if (n >= 3) {
        x[0] = limit;             /* gate 0 at the bound: passes */
        x[1] = -limit;            /* up 0 at the lower bound: passes */
        x[2] = limit + 0.0625f;   /* gate 1 just above: clamped */
        x[3] = limit;             /* up 1 at the upper bound: passes */
        x[4] = 1.0f;
        x[5] = -(limit + 0.0625f); /* up 2 just below: clamped */
    }
    for (size_t i = 0; i < md; i++)
        if (d[i] == 0.0f) d[i] = 1.0f; /* a zero dout would hide a wrong zero gradient */
    void *d_gu = mt_test_up_bf(gpu, gu, m2), *d_d = mt_test_up_bf(gpu, d, md);
    size_t b = offset * sizeof(mt_bf16); /* `offset` outputs in: misaligned pointers when odd */
    void *X = (char *)d_gu + 2 * b, *Dd = (char *)d_d + b;

    float *out = mt_test_fnew(n), *dx = mt_test_fnew(2 * n);
    cpu->swiglu_clamped_forward(cpu, out, x, R, F, alpha, limit);
    void *d_out = mt_test_poison_bf(gpu, md);
    gpu->swiglu_clamped_forward(gpu, (char *)d_out + b, X, R, F, alpha, limit);
    float *got = mt_test_down_bf(gpu, d_out, md);
    snprintf(what, sizeof what, "swiglu_clamped_fwd R=%d F=%d off=%zu", R, F, offset);
    assert_true(mt_test_check_rms(what, got + offset, out, n, BF_ATOL, BF_RTOL));
    free(got);

    cpu->swiglu_clamped_backward(cpu, dx, d + offset, x, R, F, alpha, limit);
    void *d_dx = mt_test_poison_bf(gpu, m2);
    gpu->swiglu_clamped_backward(gpu, (char *)d_dx + 2 * b, Dd, X, R, F, alpha, limit);
    got = mt_test_down_bf(gpu, d_dx, m2);
    float *gx = got + 2 * offset;
    snprintf(what, sizeof what, "swiglu_clamped_bwd R=%d F=%d off=%zu", R, F, offset);
    assert_true(mt_test_check_rms(what, gx, dx, 2 * n, BF_ATOL, BF_RTOL));
    /* the clamps: exactly 0 where one acted, the bounds themselves pass */
    size_t gates_clamped = 0, ups_clamped = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        float g0 = x[2 * i], u0 = x[2 * i + 1];
        if (g0 > limit) {
            gates_clamped++;
            if (gx[2 * i] != 0.0f) bad++;
        }
        if (u0 > limit || u0 < -limit) {
            ups_clamped++;
            if (gx[2 * i + 1] != 0.0f) bad++;
        }
    }
    fprintf(stderr, "%-48s %zu gates, %zu ups clamped; %zu non-zero gradients there%s\n", what,
            gates_clamped, ups_clamped, bad, bad ? "  FAIL" : "");
    assert_int_equal(bad, 0);
    if (n >= 3) {
        assert_true(gx[0] != 0.0f && gx[1] != 0.0f && gx[3] != 0.0f); /* at the bounds */
        assert_true(gx[2] == 0.0f && gx[5] == 0.0f);
        assert_true(dx[2] == 0.0f && dx[5] == 0.0f && dx[0] != 0.0f && dx[3] != 0.0f);
    }
    if (n >= 1000) assert_true(gates_clamped > 0 && ups_clamped > 0);
    free(got);

    gpu->free(gpu, d_gu), gpu->free(gpu, d_d), gpu->free(gpu, d_out), gpu->free(gpu, d_dx);
    free(gu), free(d), free(out), free(dx);
}

static void test_swiglu_clamped(void **state) {
    swiglu_clamped_case(64, 96, 0, 71);
    swiglu_clamped_case(7, 13, 0, 72);    /* odd R*F: scalar path */
    swiglu_clamped_case(33, 40, 1, 73);   /* misaligned: scalar path */
    swiglu_clamped_case(512, 2880, 0, 74); /* gpt-oss-20b's expert width */
    swiglu_clamped_case(1, 1, 0, 75);
}

/* ---------------- moe_matmul_io ---------------- */

#define IO_E 4

/* Which outputs of the backward a call asks for. */
typedef struct {
    int dinp, dw, db;
} io_ask;

static void moe_io_case(const int rows[IO_E], int K, int M, int with_bias, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    char what[256];
    int32_t off[IO_E + 1] = {0};
    int empty = -1;
    for (int e = 0; e < IO_E; e++) {
        off[e + 1] = off[e] + rows[e];
        if (rows[e] == 0) empty = e;
    }
    int R = off[IO_E];
    size_t nin = (size_t)R * K, nout = (size_t)R * M, nw = (size_t)IO_E * K * M,
           nb = (size_t)IO_E * M;
    float *inp = mt_test_randn_bf(&rng, nin, 1.0f), *w = mt_test_randn_bf(&rng, nw, 1.0f / sqrtf((float)K));
    float *bias = with_bias ? mt_test_randn_bf(&rng, nb, 0.5f) : NULL;
    float *dout = mt_test_randn_bf(&rng, nout, 1.0f);
    void *d_inp = mt_test_up_bf(gpu, inp, nin), *d_w = mt_test_up_bf(gpu, w, nw),
         *d_dout = mt_test_up_bf(gpu, dout, nout);
    void *d_bias = bias ? mt_test_up_bf(gpu, bias, nb) : NULL;
    int32_t *d_off = mt_test_up_i32(gpu, off, IO_E + 1);
    char shape[96];
    snprintf(shape, sizeof shape, "moe_io rows %d,%d,%d,%d K=%d M=%d%s", rows[0], rows[1], rows[2],
             rows[3], K, M, bias ? " +bias" : "");

    /* forward */
    float *out = mt_test_fnew(nout);
    cpu->moe_matmul_io_forward(cpu, out, inp, w, bias, off, off, IO_E, K, M);
    void *d_out = mt_test_poison_bf(gpu, nout);
    gpu->moe_matmul_io_forward(gpu, d_out, d_inp, d_w, d_bias, d_off, off, IO_E, K, M);
    float *got = mt_test_down_bf(gpu, d_out, nout);
    snprintf(what, sizeof what, "%s fwd", shape);
    assert_true(mt_test_check_rms(what, got, out, nout, BF_ATOL, BF_RTOL));
    free(got);

    /* backward: fills for the += outputs (dweight's magnitude: a sum of rows unit products) */
    float gscale = sqrtf((float)(R > 0 ? R : 1));
    static const io_ask asks[] = {{1, 1, 1}, {1, 0, 0}, {0, 1, 1}, {1, 0, 1}, {0, 1, 0}, {0, 0, 1}};
    const int nasks = (int)(sizeof asks / sizeof asks[0]);
    for (int acc = 0; acc <= 1; acc++) {
        float *fill_x = mt_test_randn_bf(&rng, nin, 1.0f), *fill_w = mt_test_randn(&rng, nw, gscale);
        float *fill_b = mt_test_randn(&rng, nb, gscale);
        float *full_dinp = NULL, *full_dw = NULL, *full_db = NULL; /* asks[0]'s GPU results */
        for (int a = 0; a < nasks; a++) {
            io_ask q = asks[a];
            float *dinp = mt_test_copyf(fill_x, nin), *dw = mt_test_copyf(fill_w, nw),
                  *db = mt_test_copyf(fill_b, nb);
            if (!acc) mt_test_nan_fill(dinp, nin);
            cpu->moe_matmul_io_backward(cpu, q.dinp ? dinp : NULL, q.dw ? dw : NULL,
                                        q.db ? db : NULL, dout, inp, w, off, off, IO_E, K, M, acc);
            void *d_dinp = acc ? mt_test_up_bf(gpu, fill_x, nin) : mt_test_poison_bf(gpu, nin);
            float *d_dw = mt_test_up_f32(gpu, fill_w, nw), *d_db = mt_test_up_f32(gpu, fill_b, nb);
            gpu->moe_matmul_io_backward(gpu, q.dinp ? d_dinp : NULL, q.dw ? d_dw : NULL,
                                        q.db ? d_db : NULL, d_dout, d_inp, d_w, d_off, off, IO_E,
                                        K, M, acc);
            float *g_dinp = mt_test_down_bf(gpu, d_dinp, nin), *g_dw = mt_test_down_f32(gpu, d_dw, nw);
            float *g_db = mt_test_down_f32(gpu, d_db, nb);
            char ask[48];
            snprintf(ask, sizeof ask, "dinp %s, dweight %s, dbias %s", q.dinp ? "set" : "NULL",
                     q.dw ? "set" : "NULL", q.db ? "set" : "NULL");
            if (q.dinp) {
                snprintf(what, sizeof what, "%s bwd dinp (%s) [%s]", shape, acc ? "+=" : "=", ask);
                assert_true(mt_test_check_rms(what, g_dinp, dinp, nin, BF_ATOL, BF_RTOL));
            } else if (acc) { /* not asked: untouched (the poison of acc 0 is not compared) */
                snprintf(what, sizeof what, "%s bwd dinp untouched [%s]", shape, ask);
                assert_true(same_bits(what, g_dinp, fill_x, nin * sizeof(float)));
            }
            if (q.dw) {
                snprintf(what, sizeof what, "%s bwd dweight (+=) [%s]", shape, ask);
                assert_true(mt_test_check_rms(what, g_dw, dw, nw, F32_ATOL, F32_RTOL));
            } else { /* not asked: untouched */
                snprintf(what, sizeof what, "%s bwd dweight untouched [%s]", shape, ask);
                assert_true(same_bits(what, g_dw, fill_w, nw * sizeof(float)));
            }
            if (q.db) {
                snprintf(what, sizeof what, "%s bwd dbias (+=) [%s]", shape, ask);
                assert_true(mt_test_check_rms(what, g_db, db, nb, F32_ATOL, F32_RTOL));
            } else {
                snprintf(what, sizeof what, "%s bwd dbias untouched [%s]", shape, ask);
                assert_true(same_bits(what, g_db, fill_b, nb * sizeof(float)));
            }
            if (empty >= 0) { /* the expert without rows: its gradients keep the fill's bits */
                size_t wo = (size_t)empty * K * M, bo = (size_t)empty * M;
                snprintf(what, sizeof what, "%s expert %d (no rows) dweight, dbias", shape, empty);
                size_t wb = (size_t)K * M * sizeof(float), bb = (size_t)M * sizeof(float);
                assert_true(same_bits(what, g_dw + wo, fill_w + wo, wb) &&
                            same_bits(what, g_db + bo, fill_b + bo, bb));
            }
            if (a == 0) {
                full_dinp = g_dinp, full_dw = g_dw, full_db = g_db;
            } else { /* what is asked does not change the bits of what is computed */
                snprintf(what, sizeof what, "%s acc=%d [%s] vs all set", shape, acc, ask);
                if (q.dinp) assert_true(same_bits(what, g_dinp, full_dinp, nin * sizeof(float)));
                if (q.dw) assert_true(same_bits(what, g_dw, full_dw, nw * sizeof(float)));
                if (q.db) assert_true(same_bits(what, g_db, full_db, nb * sizeof(float)));
                free(g_dinp), free(g_dw), free(g_db);
            }
            gpu->free(gpu, d_dinp), gpu->free(gpu, d_dw), gpu->free(gpu, d_db);
            free(dinp), free(dw), free(db);
        }
        free(full_dinp), free(full_dw), free(full_db);
        free(fill_x), free(fill_w), free(fill_b);
    }

    gpu->free(gpu, d_inp), gpu->free(gpu, d_w), gpu->free(gpu, d_dout), gpu->free(gpu, d_out);
    gpu->free(gpu, d_off);
    if (d_bias) gpu->free(gpu, d_bias);
    free(inp), free(w), free(bias), free(dout), free(out);
}

static void test_moe_matmul_io(void **state) {
    moe_io_case((const int[]){5, 0, 17, 9}, 40, 24, 1, 81);   /* K, M multiples of 8, not 16 */
    moe_io_case((const int[]){0, 7, 3, 12}, 37, 21, 1, 82);   /* nothing aligned; empty first */
    moe_io_case((const int[]){13, 6, 1, 0}, 64, 128, 1, 83);  /* multiples of 16; empty last */
    moe_io_case((const int[]){9, 0, 4, 11}, 48, 80, 0, 84);   /* no bias */
    moe_io_case((const int[]){100, 0, 300, 37}, 256, 512, 1, 85);
    moe_io_case((const int[]){64, 0, 128, 33}, 2880, 5760, 1, 86); /* gpt-oss-20b's gate_up */
    moe_io_case((const int[]){64, 0, 128, 33}, 2880, 2880, 1, 87); /* and its down */
}

int main(void) {
    if (!mt_backend_cuda_available()) {
        fprintf(stderr, "test_cuda_gemma_gptoss_ops: no usable CUDA device, skipped\n");
        return 77;
    }
    cpu = mt_backend_cpu_create();
    gpu = mt_backend_cuda_create(0);
    if (!gpu->geglu_forward || !gpu->geglu_backward || !gpu->zero_rows_of_id ||
        !gpu->swiglu_clamped_forward || !gpu->swiglu_clamped_backward ||
        !gpu->moe_matmul_io_forward || !gpu->moe_matmul_io_backward) {
        fprintf(stderr, "test_cuda_gemma_gptoss_ops: the cuda backend lacks one of the ops\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geglu),
        cmocka_unit_test(test_zero_rows_of_id),
        cmocka_unit_test(test_swiglu_clamped),
        cmocka_unit_test(test_moe_matmul_io),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    return failed ? 1 : 0;
}
