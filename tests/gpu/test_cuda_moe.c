/* The CUDA mixture-of-experts ops against the CPU ones (src/backend/cpu/moe.c), op by op on the
 * same inputs, then whole MoE models (the committed fixtures' shapes and weights, rounded to bf16)
 * through the runner. Exits 77 (skipped) without a GPU.
 * Op metrics: routing choices, the grouping (perm, inv, offsets) and the selection counts exactly
 * equal; probabilities, gates, gathers and combines within 1e-5 relative of max (fp32 math on
 * bf16 inputs; bf16 outputs within 1e-2). Whole models: the router's weights are scaled up so that
 * bf16 rounding flips no top-k choice (a flip moves a token to another expert: a real difference,
 * not rounding), then per tensor relative L2 <= 2e-2 for logits and loss, <= 3e-2 for gradients,
 * as test_cuda_model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "io/model_io.h"
#include "model/runner.h"
#include "util/testutil.h"

static mt_backend *cpu, *gpu;

static void *dev_copy(const void *host, size_t bytes) {
    void *d = gpu->alloc(gpu, bytes);
    gpu->upload(gpu, d, host, bytes);
    return d;
}

static void *dev_bf16(const float *x, size_t n) {
    mt_bf16 *h = malloc(n * sizeof(mt_bf16));
    mt_convert_f32_to_bf16(h, x, n);
    void *d = dev_copy(h, n * sizeof(mt_bf16));
    free(h);
    return d;
}

static float *host_f32_of_bf16(const void *dev, size_t n) {
    mt_bf16 *h = malloc(n * sizeof(mt_bf16));
    gpu->download(gpu, h, dev, n * sizeof(mt_bf16));
    float *f = malloc(n * sizeof(float));
    mt_convert_bf16_to_f32(f, h, n);
    free(h);
    return f;
}

/* A bf16 result on the device against the fp32 reference (max-relative metric). */
static void check_bf16(const char *what, const void *dev, const float *ref, size_t n, double tol) {
    float *h = host_f32_of_bf16(dev, n);
    int ok = mt_check_rel(what, h, ref, n, tol);
    free(h);
    assert_true(ok);
}

static void round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = mt_bf16_to_f32(mt_f32_to_bf16(x[i]));
}

/* Every op on one routing problem: n tokens, E experts, top-k. */
static void check_ops(int n, int E, int k, int C, int renorm) {
    fprintf(stderr, "--- ops n %d E %d k %d C %d renorm %d\n", n, E, k, C, renorm);
    mt_test_rng r;
    mt_test_rng_seed(&r, (uint64_t)(n * 131 + E * 7 + k));
    size_t nE = (size_t)n * E, nk = (size_t)n * k, nC = (size_t)n * C, nkC = nk * C;
    float *logits = malloc(nE * sizeof(float));
    mt_test_fill_normal(&r, logits, nE, 3.0f);
    round_bf16(logits, nE); /* both backends see the same values */
    float *probs = malloc(nE * 4), *w = malloc(nk * 4), *ps = calloc((size_t)E, 4);
    int32_t *idx = malloc(nk * 4), *cnt = calloc((size_t)E, 4);
    cpu->moe_route(cpu, probs, idx, w, cnt, ps, logits, n, E, k, renorm);
    void *d_logits = dev_bf16(logits, nE);
    float *dp = gpu->alloc(gpu, nE * 4), *dw = gpu->alloc(gpu, nk * 4), *dps = gpu->alloc(gpu, (size_t)E * 4);
    int32_t *didx = gpu->alloc(gpu, nk * 4), *dcnt = gpu->alloc(gpu, (size_t)E * 4);
    gpu->zero(gpu, dps, (size_t)E * 4);
    gpu->zero(gpu, dcnt, (size_t)E * 4);
    gpu->moe_route(gpu, dp, didx, dw, dcnt, dps, d_logits, n, E, k, renorm);
    float *gp = malloc(nE * 4), *gw = malloc(nk * 4), *gps = malloc((size_t)E * 4);
    int32_t *gidx = malloc(nk * 4), *gcnt = malloc((size_t)E * 4);
    gpu->download(gpu, gp, dp, nE * 4);
    gpu->download(gpu, gw, dw, nk * 4);
    gpu->download(gpu, gps, dps, (size_t)E * 4);
    gpu->download(gpu, gidx, didx, nk * 4);
    gpu->download(gpu, gcnt, dcnt, (size_t)E * 4);
    assert_memory_equal(gidx, idx, nk * 4);
    assert_memory_equal(gcnt, cnt, (size_t)E * 4);
    assert_true(mt_check_rel("route probs", gp, probs, nE, 1e-5));
    assert_true(mt_check_rel("route gates", gw, w, nk, 1e-5));
    assert_true(mt_check_rel("route prob_sum", gps, ps, (size_t)E, 1e-5));

    int32_t *perm = malloc(nk * 4), *inv = malloc(nk * 4), *off = malloc(((size_t)E + 1) * 4);
    cpu->moe_group(cpu, perm, inv, off, idx, n, E, k);
    int32_t *dperm = gpu->alloc(gpu, nk * 4), *dinv = gpu->alloc(gpu, nk * 4);
    int32_t *doff = gpu->alloc(gpu, ((size_t)E + 1) * 4);
    gpu->moe_group(gpu, dperm, dinv, doff, didx, n, E, k);
    int32_t *g32 = malloc((nk + (size_t)E + 1) * 4);
    gpu->download(gpu, g32, dperm, nk * 4);
    assert_memory_equal(g32, perm, nk * 4);
    gpu->download(gpu, g32, dinv, nk * 4);
    assert_memory_equal(g32, inv, nk * 4);
    gpu->download(gpu, g32, doff, ((size_t)E + 1) * 4);
    assert_memory_equal(g32, off, ((size_t)E + 1) * 4);

    /* gather, combine and their backward on bf16-exact data */
    float *x = malloc(nC * 4), *y = malloc(nkC * 4), *dout = malloc(nC * 4), *dxg = malloc(nkC * 4);
    mt_test_fill_normal(&r, x, nC, 1.0f), round_bf16(x, nC);
    mt_test_fill_normal(&r, y, nkC, 1.0f), round_bf16(y, nkC);
    mt_test_fill_normal(&r, dout, nC, 1.0f), round_bf16(dout, nC);
    mt_test_fill_normal(&r, dxg, nkC, 1.0f), round_bf16(dxg, nkC);
    float *xg = malloc(nkC * 4), *out = malloc(nC * 4), *dy = malloc(nkC * 4), *d_w = malloc(nk * 4);
    float *dx = malloc(nC * 4), *dz = malloc(nE * 4), *aux = malloc((size_t)E * 4);
    mt_test_fill_normal(&r, aux, (size_t)E, 0.1f);
    cpu->moe_gather(cpu, xg, x, perm, n, C, k);
    cpu->moe_combine(cpu, out, y, w, inv, n, C, k);
    cpu->moe_combine_backward(cpu, dy, d_w, dout, y, w, inv, n, C, k);
    cpu->moe_gather_backward(cpu, dx, dxg, inv, n, C, k, 0);
    cpu->moe_route_backward(cpu, dz, d_w, probs, idx, w, aux, n, E, k, renorm);
    void *dx_ = dev_bf16(x, nC), *dy_ = dev_bf16(y, nkC), *ddout = dev_bf16(dout, nC), *ddxg = dev_bf16(dxg, nkC);
    void *dxg_out = gpu->alloc(gpu, nkC * 2), *dout_ = gpu->alloc(gpu, nC * 2), *ddy = gpu->alloc(gpu, nkC * 2);
    void *ddx = gpu->alloc(gpu, nC * 2), *ddz = gpu->alloc(gpu, nE * 2);
    float *dd_w = gpu->alloc(gpu, nk * 4), *daux = dev_copy(aux, (size_t)E * 4);
    gpu->moe_gather(gpu, dxg_out, dx_, dperm, n, C, k);
    gpu->moe_combine(gpu, dout_, dy_, dw, dinv, n, C, k);
    gpu->moe_combine_backward(gpu, ddy, dd_w, ddout, dy_, dw, dinv, n, C, k);
    gpu->moe_gather_backward(gpu, ddx, ddxg, dinv, n, C, k, 0);
    gpu->moe_route_backward(gpu, ddz, dd_w, dp, didx, dw, daux, n, E, k, renorm);
    check_bf16("gather (a copy: exact)", dxg_out, xg, nkC, 0);
    check_bf16("combine", dout_, out, nC, 1e-2);
    check_bf16("combine_backward dy", ddy, dy, nkC, 1e-2);
    check_bf16("gather_backward", ddx, dx, nC, 1e-2);
    check_bf16("route_backward", ddz, dz, nE, 1e-2);
    float *gdw = malloc(nk * 4);
    gpu->download(gpu, gdw, dd_w, nk * 4);
    assert_true(mt_check_rel("combine_backward d_w", gdw, d_w, nk, 1e-4));

    void *devs[] = {d_logits, dp, dw, dps, didx, dcnt, dperm, dinv, doff, dx_, dy_, ddout, ddxg,
                    dxg_out, dout_, ddy, ddx, ddz, dd_w, daux};
    for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++) gpu->free(gpu, devs[i]);
    void *hosts[] = {logits, probs, w, ps, idx, cnt, gp, gw, gps, gidx, gcnt, perm, inv, off, g32, x,
                     y, dout, dxg, xg, out, dy, d_w, dx, dz, aux, gdw};
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) free(hosts[i]);
}

static void test_ops(void **state) {
    check_ops(37, 4, 2, 16, 1);
    check_ops(300, 8, 2, 64, 0);
    check_ops(1000, 128, 8, 40, 1); /* Qwen3-30B-A3B's E and k; C not a multiple of 8 */
    check_ops(5, 64, 3, 8, 0);       /* most experts get no token */
}

/* A fixture's model on both backends. */
static void compare_fixture(const char *name) {
    fprintf(stderr, "--- model %s\n", name);
    char *dir = mt_fixture_path(name), path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mt_config cfg;
    if (mt_config_load(&cfg, path) != MT_OK) fail_msg("%s", mt_error_message());
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    size_t n = (size_t)t.total;
    float *w = mt_aligned_alloc(n * sizeof(float));
    if (mt_model_load(&t, w, dir) != MT_OK) fail_msg("%s", mt_error_message());
    for (int i = 0; i < t.n_params; i++) /* clear-cut routing: see the file comment */
        if (t.params[i].kind == MT_W_ROUTER)
            for (int64_t j = 0; j < t.params[i].numel; j++) w[t.params[i].offset + j] *= 8.0f;
    round_bf16(w, n);
    int B = 2, T = 12, N = B * T;
    int32_t ids[24], tg[24];
    for (int i = 0; i < N; i++) ids[i] = (i * 29 + 3) % cfg.V, tg[i] = i % 7 == 3 ? -100 : (i * 41 + 1) % cfg.V;
    mt_runner rc, rg;
    mt_runner_init(&rc, &t, cpu, B, T);
    float *g_ref = mt_aligned_alloc(n * 4);
    memset(g_ref, 0, n * 4);
    int64_t count;
    float loss_ref = (float)(mt_runner_step(&rc, w, g_ref, ids, tg, B, 0, &count) / count + rc.aux_loss);
    mt_runner_free(&rc);
    mt_runner_init(&rg, &t, gpu, B, T);
    void *wd = dev_bf16(w, n);
    float *gd = gpu->alloc(gpu, n * 4);
    gpu->zero(gpu, gd, n * 4);
    float loss = (float)(mt_runner_step(&rg, wd, gd, ids, tg, B, 0, &count) / count + rg.aux_loss);
    float *g = malloc(n * 4);
    gpu->download(gpu, g, gd, n * 4);
    mt_runner_free(&rg);
    int ok = mt_check_rel_l2("loss (with the aux loss)", &loss, &loss_ref, 1, 2e-2);
    for (int i = 0; i < t.n_params; i++) {
        const mt_param *p = &t.params[i];
        char gname[160];
        snprintf(gname, sizeof gname, "grad %s", p->name);
        ok &= mt_check_rel_l2(gname, g + p->offset, g_ref + p->offset, (size_t)p->numel, 3e-2);
    }
    gpu->free(gpu, wd);
    gpu->free(gpu, gd);
    free(w), free(g_ref), free(g), free(dir);
    mt_param_table_free(&t);
    if (!ok) fail_msg("%s: CUDA differs from the CPU reference (see above)", name);
}

static void test_models(void **state) {
    compare_fixture("mixtral_moe");
    compare_fixture("qwen3_moe_norm");
    compare_fixture("qwen3_moe_step");
}

int main(void) {
    if (!mt_backend_cuda_available()) {
        fprintf(stderr, "no CUDA device: skipped\n");
        return 77;
    }
    cpu = mt_backend_cpu_create();
    gpu = mt_backend_cuda_create(0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops),
        cmocka_unit_test(test_models),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    return rc;
}
