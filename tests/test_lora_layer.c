/* A layer with LoRA adapters (model/linear.h) is the layer with merged weights W' = W + scale B A:
 * its output and input gradient are the merged layer's, its base weight gradients are the merged
 * layer's (dL/dW = dL/dW'), and its adapter gradients are what the chain rule gives from the merged
 * layer's weight gradient G = dL/dW':
 *   dL/dB = scale G A^T,   dL/dA = scale B^T G   (computed here in double).
 * CPU backend, fp32, every layer type megatrain has (attention with biases, qwen3's q/k norm,
 * qwen3_5's gated attention and Gated DeltaNet, the MoE with a shared expert), every adaptable
 * projection targeted, tiled and untiled, adapters and inputs random (B non-zero, so every
 * gradient is non-zero). Bound: |got - ref| <= 1e-4 (max|ref| + |ref|) — the merged and adapted
 * forms round differently (x W'^T against x W^T + (s x A^T) B^T, sums of <= 128 fp32 products
 * regrouped, and the DeltaNet's ill-conditioned chunk solve passes those ulps on); the largest
 * relative difference seen is printed. Each adapted layer is run again as the engine runs it under
 * LoRA, with a gradient view holding the adapters' alone (every base weight, bias, norm, sink, router
 * and expert gradient NULL: frozen, no gradient work): output, input gradient and adapter gradients
 * bit for bit the same. gpt-oss (biased q/k/v/o, sinks, sliding window, the fused experts), Gemma 3
 * and Gemma 4 (keys as values, the v-norm, the layer scalar, the MoE block) are among the configs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "model/layer.h"
#include "model/lora.h"
#include "model/moe.h"
#include "util/testutil.h"
#include "util/tiny_config.h"

#define RTOL 1e-4

static double worst_seen;

/* |got - ref| <= RTOL (max|ref| + |ref|) everywhere; max|ref| > 0 (a zero reference tests nothing). */
static void close_to(const char *what, const float *got, const float *ref, size_t n) {
    double mx = 0, worst = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    if (!(mx > 0)) fail_msg("%s: the reference is all zero", what);
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]), tol = RTOL * (mx + fabs(ref[i]));
        if (!(d <= tol)) fail_msg("%s[%zu]: %.9g vs %.9g (max |ref| %.3g)", what, i, got[i], ref[i], mx);
        worst = fmax(worst, d / mx);
    }
    if (worst > worst_seen) worst_seen = worst;
}

typedef struct {
    mt_param_table t;
    mt_lora_table lt;
    mt_backend *be;
    mt_layer_ctx lc;
    float *arena, *merged, *adapters, *inv_freq, *inp, *dout;
    int32_t *pos;
    int B, T, N;
} lora_case;

/* out[i][j] += s * sum_k a[i][k] b[k][j] for a (m, r), b (r, n), in double. */
static void add_product(float *out, const float *a, const float *b, int m, int r, int n, double s) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double acc = 0;
            for (int k = 0; k < r; k++) acc += (double)a[(size_t)i * r + k] * b[(size_t)k * n + j];
            out[(size_t)i * n + j] += (float)(s * acc);
        }
}

static void case_init(lora_case *c, const mt_config *cfg, int rank, int B, int T) {
    memset(c, 0, sizeof *c);
    mt_param_table_init(&c->t, cfg);
    c->t.cfg.lora_rank = rank;
    mt_lora_opts o = {.rank = rank, .alpha = 3.0 * rank}; /* scale 3: not 1, not the default 2 */
    assert_int_equal(mt_lora_table_init(&c->lt, &c->t, &o), MT_OK);
    assert_true(c->lt.n_modules > 0);
    c->be = mt_backend_cpu_create();
    c->B = B;
    c->T = T;
    c->N = B * T;
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 23);
    c->arena = mt_aligned_alloc((size_t)c->t.total * sizeof(float));
    mt_param_init(&c->t, c->arena, 0.3f, 7);
    for (int i = 0; i < c->t.n_params; i++) { /* vectors away from their init: every gradient counts */
        const mt_param *p = &c->t.params[i];
        if (p->ndim != 1 || p->kind == MT_W_LIN_A_LOG) continue;
        for (int64_t j = 0; j < p->numel; j++) c->arena[p->offset + j] += 0.1f * mt_test_rng_normal(&rng);
    }
    c->adapters = mt_aligned_alloc((size_t)c->lt.total * sizeof(float));
    memset(c->adapters, 0, (size_t)c->lt.total * sizeof(float));
    for (int i = 0; i < c->lt.n_params; i++) {
        const mt_lora_param *p = &c->lt.params[i];
        mt_test_fill_normal(&rng, c->adapters + p->offset, (size_t)p->numel, 0.2f);
    }
    c->merged = mt_aligned_alloc((size_t)c->t.total * sizeof(float));
    memcpy(c->merged, c->arena, (size_t)c->t.total * sizeof(float));
    for (int i = 0; i < c->lt.n_params; i += 2) { /* W' = W + s B A */
        const mt_lora_param *a = &c->lt.params[i], *b = &c->lt.params[i + 1];
        const mt_param *w = &c->t.params[a->base];
        add_product(c->merged + w->offset, c->adapters + b->offset, c->adapters + a->offset,
                    (int)b->shape[0], rank, (int)a->shape[1], c->lt.scale);
    }
    c->inv_freq = malloc(mt_config_rope_inv_freq_len(&c->t.cfg) * sizeof(float)); /* gemma3: two */
    mt_config_rope_inv_freq(&c->t.cfg, c->inv_freq);
    c->pos = malloc((size_t)c->N * sizeof(int32_t));
    for (int i = 0; i < c->N; i++) c->pos[i] = i % T;
    size_t act = (size_t)c->N * c->t.cfg.C;
    c->inp = malloc(act * sizeof(float));
    c->dout = malloc(act * sizeof(float));
    mt_test_fill_normal(&rng, c->inp, act, 1.0f);
    mt_test_fill_normal(&rng, c->dout, act, 1.0f);
    c->lc = (mt_layer_ctx){.cfg = &c->t.cfg, .be = c->be, .inv_freq = c->inv_freq};
}

static void case_free(lora_case *c) {
    free(c->arena);
    free(c->merged);
    free(c->adapters);
    free(c->inv_freq);
    free(c->pos);
    free(c->inp);
    free(c->dout);
    c->be->destroy(c->be);
    mt_lora_table_free(&c->lt);
    mt_param_table_free(&c->t);
}

typedef struct {
    float *out, *dinp, *grads, *lora_grads;
} run_result;

/* Forward and backward of layer l with the weights of `arena` and, when `adapters`, the adapters;
 * frozen: the gradient view has the adapters' gradients alone (r.grads stays zero). */
static run_result run_layer(lora_case *c, int l, const float *arena, float *adapters, int chunk,
                            int frozen) {
    size_t act = (size_t)c->N * c->t.cfg.C, ln = (size_t)c->t.layer_size;
    run_result r = {malloc(act * sizeof(float)), malloc(act * sizeof(float)),
                    calloc(ln, sizeof(float)), calloc((size_t)c->lt.total, sizeof(float))};
    float *lw_base = (float *)arena + mt_group_offset(&c->t, l);
    mt_layer_weights w = mt_layer_view_at(&c->t, l, lw_base, sizeof(float));
    mt_layer_weights g = mt_layer_view_at(&c->t, l, r.grads, sizeof(float));
    if (frozen) memset(&g, 0, sizeof g);
    mt_lora_view lv = mt_lora_view_at(&c->lt, l, adapters, sizeof(float));
    mt_lora_view lg = mt_lora_view_at(&c->lt, l, r.lora_grads, sizeof(float));
    if (adapters) {
        w.lora = &lv;
        g.lora = &lg;
    }
    mt_layer_ws ws;
    mt_layer_ws_init_tiled(&ws, &c->lc, c->N, chunk);
    mt_tokens tok = {c->B, c->T, c->pos, NULL};
    mt_moe_stats_reset(&c->lc, ws.moe_stats);
    mt_layer_forward(&c->lc, &tok, &w, c->inp, r.out, &ws);
    mt_layer_backward(&c->lc, &tok, &w, &g, c->inp, c->dout, r.dinp, &ws, MT_RECOMPUTE_ALL);
    mt_layer_ws_free(&ws, &c->lc);
    return r;
}

static void result_free(run_result *r) {
    free(r->out);
    free(r->dinp);
    free(r->grads);
    free(r->lora_grads);
}

/* Every layer of cfg, each adaptable projection targeted, against the merged layer. */
static void check_config(const char *label, const mt_config *cfg, int rank, int chunk) {
    double before = worst_seen;
    worst_seen = 0;
    lora_case c;
    case_init(&c, cfg, rank, 2, 9);
    size_t act = (size_t)c.N * c.t.cfg.C;
    char what[160];
    for (int l = 0; l < c.t.cfg.L; l++) {
        run_result got = run_layer(&c, l, c.arena, c.adapters, chunk, 0);
        run_result ref = run_layer(&c, l, c.merged, NULL, chunk, 0);
        run_result fz = run_layer(&c, l, c.arena, c.adapters, chunk, 1);
        size_t ln = (size_t)c.t.layer_size;
        for (size_t j = 0; j < ln; j++)
            if (fz.grads[j] != 0) fail_msg("%s layer %d: a frozen base weight got a gradient", label, l);
        if (memcmp(fz.out, got.out, act * sizeof(float)) != 0 ||
            memcmp(fz.dinp, got.dinp, act * sizeof(float)) != 0 ||
            memcmp(fz.lora_grads, got.lora_grads, (size_t)c.lt.total * sizeof(float)) != 0)
            fail_msg("%s layer %d: the frozen base's run differs from the full gradient view's", label, l);
        result_free(&fz);
        snprintf(what, sizeof what, "%s layer %d out", label, l);
        close_to(what, got.out, ref.out, act);
        snprintf(what, sizeof what, "%s layer %d dinp", label, l);
        close_to(what, got.dinp, ref.dinp, act);
        int adapted = 0;
        for (int i = c.t.layer_first[l]; i < c.t.layer_first[l + 1]; i++) {
            const mt_param *p = &c.t.params[i];
            int64_t go = p->group_offset;
            double mx = 0;
            for (int64_t j = 0; j < p->numel; j++) mx = fmax(mx, fabs(ref.grads[go + j]));
            if (mx == 0) continue; /* a tensor this input does not reach (an unchosen expert) */
            snprintf(what, sizeof what, "%s %s grad", label, p->name);
            close_to(what, got.grads + go, ref.grads + go, (size_t)p->numel);
            const mt_lora_param *a = mt_lora_find(&c.lt, l, p->kind);
            if (!a || p->expert >= 0) continue;
            const mt_lora_param *b = a + 1;
            int out = (int)b->shape[0], in = (int)a->shape[1];
            /* dB = s G A^T (out, r); dA = s B^T G (r, in) */
            float *at = malloc((size_t)rank * in * sizeof(float)), *bt = malloc((size_t)out * rank * sizeof(float));
            for (int i2 = 0; i2 < rank; i2++)
                for (int j = 0; j < in; j++) at[(size_t)j * rank + i2] = c.adapters[a->offset + (size_t)i2 * in + j];
            for (int i2 = 0; i2 < out; i2++)
                for (int j = 0; j < rank; j++) bt[(size_t)j * out + i2] = c.adapters[b->offset + (size_t)i2 * rank + j];
            float *db = calloc((size_t)out * rank, sizeof(float)), *da = calloc((size_t)rank * in, sizeof(float));
            add_product(db, ref.grads + go, at, out, in, rank, c.lt.scale);
            add_product(da, bt, ref.grads + go, rank, out, in, c.lt.scale);
            snprintf(what, sizeof what, "%s %s lora_B grad", label, p->name);
            close_to(what, got.lora_grads + b->offset, db, (size_t)b->numel);
            snprintf(what, sizeof what, "%s %s lora_A grad", label, p->name);
            close_to(what, got.lora_grads + a->offset, da, (size_t)a->numel);
            free(at);
            free(bt);
            free(db);
            free(da);
            adapted++;
        }
        assert_true(adapted > 0);
        result_free(&got);
        result_free(&ref);
    }
    printf("  %-24s largest difference %.2e\n", label, worst_seen);
    worst_seen = fmax(worst_seen, before);
    case_free(&c);
}

static mt_config fixture_config(const char *dir) {
    char rel[128];
    snprintf(rel, sizeof rel, "%s/config.json", dir);
    char *path = mt_fixture_path(rel);
    mt_config cfg;
    if (mt_config_load(&cfg, path) != MT_OK) fail_msg("%s: %s", path, mt_error_message());
    free(path);
    return cfg;
}

static void test_attention_mlp(void **state) {
    (void)state;
    mt_config bias = mt_test_tiny_config("llama_bias"), qk = mt_test_tiny_config("qwen3_qknorm");
    check_config("llama_bias", &bias, 4, 0);
    check_config("llama_bias tiled", &bias, 4, 5);
    check_config("qwen3_qknorm", &qk, 3, 0);
}

static void test_qwen3_5(void **state) {
    (void)state;
    mt_config dense = fixture_config("qwen3_5_dense"), moe = fixture_config("qwen3_5_moe");
    check_config("qwen3_5_dense", &dense, 4, 0);
    check_config("qwen3_5_moe", &moe, 2, 0);
    check_config("qwen3_5_moe tiled", &moe, 2, 7);
}

static void test_mixtral(void **state) {
    (void)state;
    mt_config mix = fixture_config("mixtral_moe");
    check_config("mixtral_moe", &mix, 4, 0);
}

/* gpt-oss: q/k/v/o with biases, the sinks, a sliding layer (window 8, then 5, < T 9) and a full one,
 * the fused experts with the clamped SwiGLU; Gemma 3: its sandwich norms, q/k norms, GeGLU */
static void test_gpt_oss_gemma3(void **state) {
    (void)state;
    mt_config oss = fixture_config("gpt_oss_tiny"), aux = fixture_config("gpt_oss_tiny_aux"),
              g3 = fixture_config("gemma3_tiny");
    check_config("gpt_oss_tiny", &oss, 4, 0);
    check_config("gpt_oss_tiny tiled", &oss, 4, 5);
    check_config("gpt_oss_tiny_aux", &aux, 2, 0);
    check_config("gemma3_tiny", &g3, 4, 0);
}

/* Gemma 4: the full layers' own head dim and kv heads with keys as values (k_proj's adapter feeds
 * the values through the v-norm as well), the per-layer scalar; the MoE block's router and fused
 * experts beside the adapted dense MLP */
static void test_gemma4(void **state) {
    (void)state;
    mt_config g4 = fixture_config("gemma4_tiny"), moe = fixture_config("gemma4_moe");
    check_config("gemma4_tiny", &g4, 4, 0);
    check_config("gemma4_tiny tiled", &g4, 4, 7);
    check_config("gemma4_moe", &moe, 2, 0);
    check_config("gemma4_moe tiled", &moe, 2, 7);
    printf("largest difference seen, relative to max|ref|: %.2e (bound %.0e)\n", worst_seen, RTOL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_mlp),
        cmocka_unit_test(test_qwen3_5),
        cmocka_unit_test(test_mixtral),
        cmocka_unit_test(test_gpt_oss_gemma3),
        cmocka_unit_test(test_gemma4),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
