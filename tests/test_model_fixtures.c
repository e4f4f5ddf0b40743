/* The whole model against transformers: for every fixture made by fixtures/make_fixtures.py
 * (dense) and fixtures/make_moe_fixtures.py (mixtures of experts, the load-balancing loss in the
 * loss when the config has it),
 * load the checkpoint through the real safetensors path, run the CPU backend on the recorded
 * batch, and compare logits, loss and the gradient of every parameter.
 * Metric per tensor: max|got - ref| / max|ref| <= 1e-4 (fp32); a gradient whose own fp32 noise
 * floor is larger is held to twice that floor (below). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "model/runner.h"
#include "util/fixture_io.h"
#include "util/testutil.h"

#define FIXTURE_TOL 1e-4

static const char *const fixtures[] = {
    "llama_gqa",     "llama3_rope_tied", "llama_bias",         "qwen2_bias_tied",
    "qwen3_qknorm",  "mistral_gqa",      "llama_bf16_sharded", "mixtral_moe",
    "qwen3_moe_norm", "qwen3_moe_step",   "qwen3_5_dense",      "qwen3_5_layers_tied",
    "qwen3_5_moe",    "qwen3_5_moe_noaux", "gpt_oss_tiny",        "gpt_oss_tiny_aux",
    "gemma3_tiny",    "gemma3_overflow",  "gemma4_tiny",         "gemma4_vl",
    "gemma4_moe",
};

/* The qwen3_5 fixtures' references are float64 runs of the fp32 weights (transformers' float32
 * casts kept at float64: make_qwen3_5_fixtures.py, Fp64Throughout), and each gradient carries
 * "fp32dist.grad.X": how far transformers' own fp32 run, or exact arithmetic on weights moved by
 * fp32 rounding, lands from that reference (relative to the tensor's max).
 *
 * A gradient's bound is the largest of 1e-4, 2 x fp32dist and 2 x its fp32 noise floor here: how
 * far our own fp32 gradient moves when every weight moves by at most one ulp (JITTERS runs, each
 * weight one ulp down, unchanged or one ulp up at random; the largest change). On the ten
 * Llama/Mistral/Qwen2/3/MoE fixtures that floor is at most 4e-6, so their bound stays 1e-4; on
 * qwen3_5_dense and qwen3_5_moe_noaux it is up to 2.6e-4 (layer 0's Gated DeltaNet and what feeds
 * it: at these tiny shapes the decays collapse and the backward cancels), i.e. 1e-4 there is below
 * what any fp32 evaluation can promise. The floor scales the bound only where the gradient itself
 * is that sensitive: a wrong formula still misses by orders of magnitude.
 * History: session 9 set a 2 x fp32dist rule against a reference that still had fp32 rounding in it;
 * session 12 made the reference float64 throughout and compared every qwen3_5 gradient, which then
 * failed on another machine (qwen3_5_moe_noaux layer-0 in_proj_qkv 1.7e-4, qwen3_5_dense layer-0
 * conv1d 1.45e-4, depending on the OpenBLAS kernel: Haswell, SkylakeX or Zen on one AMD EPYC),
 * which is how the floor was found; the floor's numbers above are from that machine. */

#define JITTERS 4

static double grad_tol(const mt_safetensors *ref, const char *gname, double floor) {
    char dname[160];
    snprintf(dname, sizeof dname, "fp32dist.%s", gname);
    const mt_st_tensor *t = mt_safetensors_find(ref, dname);
    double tol = FIXTURE_TOL;
    if (t) {
        float d;
        assert_int_equal(mt_st_tensor_to_f32(t, &d), MT_OK);
        if (2.0 * d > tol) tol = 2.0 * d;
    }
    return 2.0 * floor > tol ? 2.0 * floor : tol;
}

/* floor[i]: the largest max|g' - g|/max|g| of parameter i over JITTERS runs of the step on weights
 * each moved by at most one ulp, g the gradient of the unmoved weights. */
static void fp32_floor(mt_runner *r, const mt_param_table *table, const float *weights, const float *grads,
                       const int32_t *ids, const int32_t *targets, int B, double *floor) {
    float *w = mt_aligned_alloc((size_t)table->total * sizeof(float));
    float *g = mt_aligned_alloc((size_t)table->total * sizeof(float));
    for (int i = 0; i < table->n_params; i++) floor[i] = 0;
    for (int rep = 0; rep < JITTERS; rep++) {
        mt_test_rng rng;
        mt_test_rng_seed(&rng, 1000 + rep);
        for (int64_t j = 0; j < table->total; j++) {
            float u = mt_test_rng_uniform(&rng);
            w[j] = u < 1.0f / 3 ? nextafterf(weights[j], -INFINITY)
                 : u < 2.0f / 3 ? nextafterf(weights[j], INFINITY) : weights[j];
        }
        memset(g, 0, (size_t)table->total * sizeof(float));
        int64_t count = 0;
        mt_runner_step(r, w, g, ids, targets, B, 0, &count);
        for (int i = 0; i < table->n_params; i++) {
            const mt_param *p = &table->params[i];
            double e = mt_max_rel_err(g + p->offset, grads + p->offset, (size_t)p->numel);
            if (!(e <= floor[i])) floor[i] = e; /* NaN sticks */
        }
    }
    free(w), free(g);
}

static void check_fixture(const char *name) {
    fprintf(stderr, "--- fixture %s\n", name);
    char *dir = mt_fixture_path(name);
    char cfg_path[4096], ref_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    snprintf(ref_path, sizeof ref_path, "%s/reference.safetensors", dir);

    mt_config cfg;
    if (mt_config_load(&cfg, cfg_path) != MT_OK) fail_msg("%s", mt_error_message());
    mt_param_table table;
    mt_param_table_init(&table, &cfg);
    float *weights = mt_aligned_alloc((size_t)table.total * sizeof(float));
    if (mt_model_load(&table, weights, dir) != MT_OK) fail_msg("%s", mt_error_message());
    mt_safetensors *ref = NULL;
    if (mt_safetensors_open_file(&ref, ref_path) != MT_OK) fail_msg("%s", mt_error_message());

    int B, T, B2, T2;
    int32_t *ids = mt_test_st_i32(ref, "input_ids", &B, &T);
    int32_t *targets = mt_test_st_i32(ref, "targets", &B2, &T2);
    assert_int_equal(B, B2);
    assert_int_equal(T, T2);
    int N = B * T;

    mt_backend *be = mt_backend_cpu_create();
    mt_runner r;
    mt_runner_init(&r, &table, be, B, T);
    int ok = 1;

    float *logits = malloc((size_t)N * cfg.V * sizeof(float));
    mt_runner_logits(&r, weights, ids, B, logits);
    float *ref_logits = mt_test_st_f32(ref, "logits", (int64_t)N * cfg.V);
    ok &= mt_check_rel("logits", logits, ref_logits, (size_t)N * cfg.V, FIXTURE_TOL);

    float *grads = mt_aligned_alloc((size_t)table.total * sizeof(float));
    memset(grads, 0, (size_t)table.total * sizeof(float));
    int64_t count = 0;
    double sum = mt_runner_step(&r, weights, grads, ids, targets, B, 0, &count);
    float loss = (float)(sum / (double)count + r.aux_loss);
    float *ref_loss = mt_test_st_f32(ref, "loss", 1);
    ok &= mt_check_rel("loss", &loss, ref_loss, 1, FIXTURE_TOL);
    if (cfg.router_aux) { /* the load-balancing term on its own */
        float *ref_aux = mt_test_st_f32(ref, "aux_loss", 1);
        float aux = (float)(r.aux_loss / cfg.router_aux_coef);
        ok &= mt_check_rel("aux_loss", &aux, ref_aux, 1, FIXTURE_TOL);
        free(ref_aux);
    } else {
        assert_true(r.aux_loss == 0);
    }

    double *floor = malloc((size_t)table.n_params * sizeof(double));
    fp32_floor(&r, &table, weights, grads, ids, targets, B, floor);
    int n_grads = 0;
    for (int i = 0; i < table.n_params; i++) {
        const mt_param *p = &table.params[i];
        char gname[128];
        snprintf(gname, sizeof gname, "grad.%s", p->name);
        float *g_ref = mt_test_st_f32(ref, gname, p->numel);
        ok &= mt_check_rel(gname, grads + p->offset, g_ref, (size_t)p->numel, grad_tol(ref, gname, floor[i]));
        int ref_zero = 1, got_zero = 1; /* an expert no token chose: exactly 0, as in torch */
        for (int64_t j = 0; j < p->numel; j++) {
            ref_zero &= g_ref[j] == 0;
            got_zero &= grads[p->offset + j] == 0;
        }
        if (ref_zero && !got_zero) {
            fprintf(stderr, "%s: reference is exactly 0, got non-zero  FAIL\n", gname);
            ok = 0;
        }
        free(g_ref);
        n_grads++;
    }
    /* the reference must not hold gradients of tensors the table does not know */
    int ref_grads = 0;
    for (int i = 0; i < mt_safetensors_count(ref); i++)
        ref_grads += strncmp(mt_safetensors_at(ref, i)->name, "grad.", 5) == 0;
    assert_int_equal(ref_grads, n_grads);

    mt_runner_free(&r);
    be->destroy(be);
    mt_safetensors_close(ref);
    free(ids), free(targets), free(logits), free(ref_logits), free(ref_loss), free(grads), free(floor);
    free(weights);
    mt_param_table_free(&table);
    free(dir);
    if (!ok) fail_msg("fixture %s: a tensor is out of tolerance (see above)", name);
}

static void test_fixture(void **state) { check_fixture((const char *)*state); }

int main(void) {
    struct CMUnitTest tests[sizeof fixtures / sizeof fixtures[0]];
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        struct CMUnitTest t = {fixtures[i], test_fixture, NULL, NULL, (void *)fixtures[i]};
        tests[i] = t;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
