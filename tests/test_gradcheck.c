/* Finite differences against the hand-written backward, for every parameter tensor of a tiny
 * model of each family variant (CPU backend, fp32).
 *
 * For each tensor two directions are checked: u = the analytic gradient normalized (so the
 * directional derivative is |g|, large and well conditioned) and a random unit vector r. The
 * central difference c(h) = (L(w + h u) - L(w - h u)) / 2h in fp32, Richardson-extrapolated
 * fd = (4 c(h/2) - c(h)) / 3 with h = 1e-2 to cancel the h^2 curvature term, is compared with g.u:
 *   |fd - g.u| <= GC_ATOL + GC_RTOL * |g|
 * (fp32 rounding leaves ~1e-5 absolute here; a wrong gradient is off by O(|g|)). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "model/runner.h"
#include "util/testutil.h"
#include "util/tiny_config.h"

#define GC_STEP 1e-2
#define GC_ATOL 2e-4
#define GC_RTOL 2e-3

typedef struct {
    mt_param_table table;
    mt_backend *be;
    mt_runner runner;
    float *w, *g;
    int32_t *ids, *targets;
    int B, T;
} gc_model;

/* Weights large enough that every gradient is clearly non-zero: matrices normal(0, 0.3), norm
 * weights 1 + 0.1 n, biases 0.1 n. */
static void init_weights(gc_model *m, mt_test_rng *rng) {
    mt_param_init(&m->table, m->w, 0.3f, 7);
    for (int i = 0; i < m->table.n_params; i++) {
        const mt_param *p = &m->table.params[i];
        if (p->ndim == 1) {
            float base = strstr(p->name, "norm") ? 1.0f : 0.0f;
            for (int64_t j = 0; j < p->numel; j++) m->w[p->offset + j] = base + 0.1f * mt_test_rng_normal(rng);
        }
    }
}

static double loss_at(gc_model *m) {
    int64_t count;
    double sum = mt_runner_step(&m->runner, m->w, NULL, m->ids, m->targets, m->B, 0, &count);
    return sum / (double)count;
}

static int dir_check(gc_model *m, const mt_param *p, const float *dir, const char *label) {
    float *w = m->w + p->offset;
    float *saved = malloc((size_t)p->numel * sizeof(float));
    memcpy(saved, w, (size_t)p->numel * sizeof(float));
    double analytic = 0, gnorm = 0;
    for (int64_t j = 0; j < p->numel; j++) {
        analytic += (double)m->g[p->offset + j] * dir[j];
        gnorm += (double)m->g[p->offset + j] * m->g[p->offset + j];
    }
    gnorm = sqrt(gnorm);
    double c[2];
    for (int k = 0; k < 2; k++) {
        double h = GC_STEP / (1 << k);
        for (int64_t j = 0; j < p->numel; j++) w[j] = saved[j] + (float)h * dir[j];
        double lp = loss_at(m);
        for (int64_t j = 0; j < p->numel; j++) w[j] = saved[j] - (float)h * dir[j];
        double lm = loss_at(m);
        c[k] = (lp - lm) / (2 * h);
    }
    memcpy(w, saved, (size_t)p->numel * sizeof(float));
    free(saved);
    double fd = (4 * c[1] - c[0]) / 3;
    double err = fabs(fd - analytic), tol = GC_ATOL + GC_RTOL * gnorm;
    fprintf(stderr, "  %-44s %-6s g.u % .6e fd % .6e err %.2e (%.0f%% of tol)%s\n", p->name, label,
            analytic, fd, err, 100 * err / tol, err <= tol ? "" : "  FAIL");
    return err <= tol;
}

static void check_variant(const char *variant) {
    fprintf(stderr, "--- %s\n", variant);
    gc_model m;
    memset(&m, 0, sizeof m);
    mt_config cfg = mt_test_tiny_config(variant);
    mt_param_table_init(&m.table, &cfg);
    m.B = 2;
    m.T = 7;
    int N = m.B * m.T;
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 11);
    m.w = mt_aligned_alloc((size_t)m.table.total * sizeof(float));
    m.g = mt_aligned_alloc((size_t)m.table.total * sizeof(float));
    init_weights(&m, &rng);
    m.ids = malloc((size_t)N * sizeof(int32_t));
    m.targets = malloc((size_t)N * sizeof(int32_t));
    for (int i = 0; i < N; i++) {
        m.ids[i] = (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)cfg.V);
        m.targets[i] = (i % 5 == 3) ? -100 : (int32_t)(mt_test_rng_u64(&rng) % (uint64_t)cfg.V);
    }
    m.be = mt_backend_cpu_create();
    mt_runner_init(&m.runner, &m.table, m.be, m.B, m.T);
    memset(m.g, 0, (size_t)m.table.total * sizeof(float));
    int64_t count;
    mt_runner_step(&m.runner, m.w, m.g, m.ids, m.targets, m.B, 0, &count);

    int ok = 1;
    for (int i = 0; i < m.table.n_params; i++) {
        const mt_param *p = &m.table.params[i];
        float *dir = malloc((size_t)p->numel * sizeof(float));
        double norm = 0;
        for (int64_t j = 0; j < p->numel; j++) norm += (double)m.g[p->offset + j] * m.g[p->offset + j];
        assert_true(norm > 0); /* every parameter must receive a gradient */
        for (int64_t j = 0; j < p->numel; j++) dir[j] = (float)(m.g[p->offset + j] / sqrt(norm));
        ok &= dir_check(&m, p, dir, "grad");
        mt_test_fill_normal(&rng, dir, (size_t)p->numel, 1.0f);
        norm = 0;
        for (int64_t j = 0; j < p->numel; j++) norm += (double)dir[j] * dir[j];
        for (int64_t j = 0; j < p->numel; j++) dir[j] = (float)(dir[j] / sqrt(norm));
        ok &= dir_check(&m, p, dir, "random");
        free(dir);
    }
    mt_runner_free(&m.runner);
    m.be->destroy(m.be);
    free(m.w), free(m.g), free(m.ids), free(m.targets);
    mt_param_table_free(&m.table);
    if (!ok) fail_msg("%s: finite differences disagree with the backward (see above)", variant);
}

static void test_variant(void **state) { check_variant((const char *)*state); }

int main(void) {
    static const char *const variants[] = {"llama_gqa", "llama3_tied", "llama_bias",
                                           "qwen2_bias_tied", "qwen3_qknorm", "mistral"};
    struct CMUnitTest tests[sizeof variants / sizeof variants[0]];
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        struct CMUnitTest t = {variants[i], test_variant, NULL, NULL, (void *)variants[i]};
        tests[i] = t;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
