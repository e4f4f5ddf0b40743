/* Mixtures of experts (model/moe.h): the mixtral / qwen3_moe config fields and refusals, the
 * parameter table's per-expert HF names and layer types, the HF round trip of a fixture, a
 * finite-difference gradcheck of the MoE block with the load-balancing loss, experts no token
 * chose, and the layer's tiling and recompute modes on an MoE layer.
 * (test_model_fixtures compares whole MoE models against transformers.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "model/moe.h"
#include "model/params.h"
#include "model/runner.h"
#include "util/config_check.h"
#include "util/fixture_io.h"
#include "util/state_snapshot.h"
#include "util/testutil.h"

static mt_config load_fixture_config(const char *dir) { return mt_test_config_load("%s/config.json", dir); }

/* ---- config ---- */

static void assert_moe_config_equal(const mt_config *a, const mt_config *b) {
    assert_int_equal(a->arch, b->arch);
    assert_int_equal(a->C, b->C);
    assert_int_equal(a->F, b->F);
    assert_int_equal(a->L, b->L);
    assert_int_equal(a->G, b->G);
    assert_int_equal(a->D, b->D);
    assert_int_equal(a->qk_norm, b->qk_norm);
    assert_int_equal(a->sliding_window, b->sliding_window);
    assert_int_equal(a->n_experts, b->n_experts);
    assert_int_equal(a->top_k, b->top_k);
    assert_int_equal(a->moe_F, b->moe_F);
    assert_int_equal(a->norm_topk_prob, b->norm_topk_prob);
    assert_int_equal(a->sparse_step, b->sparse_step);
    assert_int_equal(a->router_aux, b->router_aux);
    assert_true(a->router_aux_coef == b->router_aux_coef);
    assert_int_equal(memcmp(a->mlp_only, b->mlp_only, sizeof a->mlp_only), 0);
}

static void test_config_fields(void **state) {
    mt_config m = load_fixture_config("mixtral_moe");
    assert_int_equal(m.arch, MT_ARCH_MIXTRAL);
    assert_int_equal(m.n_experts, 4);
    assert_int_equal(m.top_k, 2);
    assert_int_equal(m.moe_F, m.F); /* mixtral's experts are intermediate_size wide */
    assert_int_equal(m.norm_topk_prob, 1);
    assert_int_equal(m.router_aux, 1);
    assert_true(m.router_aux_coef == 0.05f);
    assert_int_equal(m.qk_norm, 0);
    assert_int_equal(m.sliding_window, 0);
    assert_int_equal(mt_config_moe_layers(&m), 3);

    mt_config q = load_fixture_config("qwen3_moe_norm"); /* save_pretrained wrote num_local_experts */
    assert_int_equal(q.arch, MT_ARCH_QWEN3_MOE);
    assert_int_equal(q.n_experts, 6);
    assert_int_equal(q.moe_F, 24);
    assert_int_equal(q.F, 64);
    assert_int_equal(q.norm_topk_prob, 1);
    assert_int_equal(q.qk_norm, 1);
    assert_int_equal(q.D, 16);
    assert_int_equal(mt_config_layer_is_moe(&q, 0), 1);
    assert_int_equal(mt_config_layer_is_moe(&q, 1), 0); /* mlp_only_layers [1] */
    assert_int_equal(mt_config_layer_is_moe(&q, 2), 1);

    mt_config s = load_fixture_config("qwen3_moe_step");
    assert_int_equal(s.sparse_step, 2);
    assert_int_equal(s.norm_topk_prob, 0);
    assert_int_equal(s.router_aux, 0);
    int want[4] = {0, 1, 0, 1};
    for (int l = 0; l < 4; l++) assert_int_equal(mt_config_layer_is_moe(&s, l), want[l]);
}

static void test_config_defaults(void **state) {
    const char *qj = "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, \"intermediate_size\": 128,"
                     " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 50}";
    mt_config q;
    assert_int_equal(mt_config_parse(&q, qj, "q.json"), MT_OK);
    /* Qwen3MoeConfig's defaults; head_dim C / H (Qwen3MoeAttention's getattr fallback) */
    assert_int_equal(q.n_experts, 128);
    assert_int_equal(q.top_k, 8);
    assert_int_equal(q.moe_F, 768);
    assert_int_equal(q.norm_topk_prob, 0);
    assert_int_equal(q.sparse_step, 1);
    assert_int_equal(q.router_aux, 0);
    assert_true(q.router_aux_coef == 0.001f);
    assert_int_equal(q.G, 4);
    assert_int_equal(q.D, 16);
    const char *mj = "{\"model_type\": \"mixtral\", \"hidden_size\": 64, \"intermediate_size\": 128,"
                     " \"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"vocab_size\": 50,"
                     " \"num_experts\": 3}"; /* attribute_map: num_experts is num_local_experts */
    mt_config m;
    assert_int_equal(mt_config_parse(&m, mj, "m.json"), MT_OK);
    assert_int_equal(m.n_experts, 3);
    assert_int_equal(m.top_k, 2);
    assert_int_equal(m.norm_topk_prob, 1);
    assert_int_equal(m.G, 8); /* MixtralConfig's num_key_value_heads */
    assert_int_equal(m.moe_F, 128);
    assert_int_equal(m.max_position_embeddings, 4096 * 32);
}

static void expect_refusal(const char *extra, const char *model_type, const char *needle) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"model_type\": \"%s\", \"hidden_size\": 64, \"intermediate_size\": 128, "
             "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
             "\"vocab_size\": 50%s}", model_type, extra);
    mt_config c;
    int r = mt_config_parse(&c, json, "c.json");
    if (r == MT_OK) fail_msg("accepted %s with %s", model_type, extra);
    if (!strstr(mt_error_message(), needle))
        fail_msg("error \"%s\" does not say \"%s\"", mt_error_message(), needle);
}

static void test_config_refusals(void **state) {
    expect_refusal(", \"router_jitter_noise\": 0.1", "mixtral", "router_jitter_noise");
    expect_refusal(", \"n_shared_experts\": 1", "qwen3_moe", "shared experts");
    expect_refusal(", \"shared_expert_intermediate_size\": 64", "qwen3_moe", "shared experts");
    expect_refusal(", \"num_experts\": 8", "llama", "mixtral and qwen3_moe only");
    expect_refusal(", \"num_experts\": 8, \"num_local_experts\": 4", "qwen3_moe", "disagree");
    expect_refusal(", \"num_experts\": 4, \"num_experts_per_tok\": 5", "qwen3_moe", "num_experts_per_tok");
    expect_refusal(", \"decoder_sparse_step\": 0", "qwen3_moe", "decoder_sparse_step");
    expect_refusal(", \"mlp_only_layers\": [2]", "qwen3_moe", "mlp_only_layers[0]");
    expect_refusal(", \"num_local_experts\": 0", "mixtral", "num_local_experts");
    expect_refusal("", "qwen2_moe", "model_type \"qwen2_moe\" is not supported");
}

static void test_config_save_roundtrip(void **state) {
    const char *names[] = {"mixtral_moe", "qwen3_moe_norm", "qwen3_moe_step"};
    char *dir = mt_test_tmpdir();
    for (int i = 0; i < 3; i++) {
        mt_config a = load_fixture_config(names[i]), b;
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", dir);
        assert_int_equal(mt_config_save(&a, path), MT_OK);
        assert_int_equal(mt_config_load(&b, path), MT_OK);
        assert_moe_config_equal(&a, &b);
    }
    mt_test_rmtree(dir);
    free(dir);
}

/* ---- parameter table ---- */

static void test_param_names(void **state) {
    const char *names[] = {"mixtral_moe", "qwen3_moe_norm", "qwen3_moe_step"};
    for (int i = 0; i < 3; i++) {
        mt_config c = load_fixture_config(names[i]);
        mt_param_table t;
        mt_param_table_init(&t, &c);
        char *dir = mt_fixture_path(names[i]);
        mt_safetensors *st = NULL;
        if (mt_safetensors_open_dir(&st, dir) != MT_OK) fail_msg("%s", mt_error_message());
        /* the table's names are exactly the checkpoint's, and each finds itself */
        assert_int_equal(mt_safetensors_count(st), t.n_params);
        for (int j = 0; j < t.n_params; j++) {
            assert_non_null(mt_safetensors_find(st, t.params[j].name));
            assert_ptr_equal(mt_param_find(&t, t.params[j].name), &t.params[j]);
        }
        assert_int_equal(t.n_real, mt_config_param_count(&c));
        /* active: the router and k experts of each MoE layer instead of E */
        int64_t expert = 3LL * c.moe_F * c.C;
        assert_int_equal(mt_config_param_count(&c) - mt_config_active_param_count(&c),
                         (int64_t)mt_config_moe_layers(&c) * (c.n_experts - c.top_k) * expert);
        /* a layer's view follows its type */
        float *arena = calloc((size_t)t.total, sizeof(float));
        for (int l = 0; l < c.L; l++) {
            mt_layer_view v = mt_layer_view_at(&t, l, arena + mt_group_offset(&t, l), sizeof(float));
            int moe = mt_config_layer_is_moe(&c, l);
            assert_int_equal(v.router != NULL, moe);
            assert_int_equal(v.gate != NULL, !moe);
            if (moe) { /* expert 1's w1 / gate_proj sits one stride after expert 0's */
                char want[128];
                snprintf(want, sizeof want, c.arch == MT_ARCH_MIXTRAL
                         ? "model.layers.%d.block_sparse_moe.experts.1.w1.weight"
                         : "model.layers.%d.mlp.experts.1.gate_proj.weight", l);
                const mt_param *p = mt_param_find(&t, want);
                assert_non_null(p);
                assert_ptr_equal((char *)v.exp_gate + v.exp_stride, arena + p->offset);
                assert_int_equal(p->expert, 1);
            }
        }
        free(arena);
        mt_safetensors_close(st);
        mt_param_table_free(&t);
        free(dir);
    }
}

/* Load a fixture, save it, and read both back: the same names, shapes and bytes. */
static void test_hf_roundtrip(void **state) {
    const char *names[] = {"mixtral_moe", "qwen3_moe_norm", "qwen3_moe_step"};
    for (int i = 0; i < 3; i++) {
        mt_config c = load_fixture_config(names[i]);
        mt_param_table t;
        mt_param_table_init(&t, &c);
        float *w = mt_aligned_alloc((size_t)t.total * sizeof(float));
        char *src = mt_fixture_path(names[i]), *out = mt_test_tmpdir();
        if (mt_model_load(&t, w, src) != MT_OK) fail_msg("%s", mt_error_message());
        assert_int_equal(mt_model_save(&t, w, out, MT_F32, 0), MT_OK);
        mt_safetensors *a = NULL, *b = NULL;
        assert_int_equal(mt_safetensors_open_dir(&a, src), MT_OK);
        assert_int_equal(mt_safetensors_open_dir(&b, out), MT_OK);
        assert_int_equal(mt_safetensors_count(a), mt_safetensors_count(b));
        for (int j = 0; j < mt_safetensors_count(a); j++) {
            const mt_st_tensor *x = mt_safetensors_at(a, j), *y = mt_safetensors_find(b, x->name);
            if (!y) fail_msg("%s: %s not written", names[i], x->name);
            assert_int_equal(x->ndim, y->ndim);
            for (int d = 0; d < x->ndim; d++) assert_int_equal(x->shape[d], y->shape[d]);
            assert_int_equal(x->nbytes, y->nbytes);
            assert_int_equal(memcmp(x->data, y->data, x->nbytes), 0);
        }
        char cfg_path[4096];
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", out);
        mt_config back;
        assert_int_equal(mt_config_load(&back, cfg_path), MT_OK);
        assert_moe_config_equal(&c, &back);
        mt_safetensors_close(a);
        mt_safetensors_close(b);
        mt_test_rmtree(out);
        free(out), free(src), free(w);
        mt_param_table_free(&t);
    }
}

/* ---- the block: gradcheck ---- */

typedef struct {
    mt_config cfg;
    mt_param_table t;
    mt_backend *be;
    mt_layer_ctx lc;
    mt_layer_ws ws;
    int n;
    float *w, *x, *proj; /* arena, input (n, C), the fixed projection of the output (n, C) */
} block;

static void block_init(block *b, int E, int k, int renorm, int aux, int n, uint64_t seed) {
    memset(b, 0, sizeof *b);
    const char *json = "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 8, \"intermediate_size\": 16,"
                       " \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
                       " \"vocab_size\": 10, \"moe_intermediate_size\": 6}";
    assert_int_equal(mt_config_parse(&b->cfg, json, "block.json"), MT_OK);
    b->cfg.n_experts = E;
    b->cfg.top_k = k;
    b->cfg.norm_topk_prob = renorm;
    b->cfg.router_aux = aux;
    b->cfg.router_aux_coef = 0.5f; /* large, so that its gradient shows */
    mt_param_table_init(&b->t, &b->cfg);
    b->be = mt_backend_cpu_create();
    b->lc = (mt_layer_ctx){.cfg = &b->t.cfg, .be = b->be, .inv_freq = NULL};
    mt_layer_ws_init(&b->ws, &b->lc, n);
    b->n = n;
    mt_test_rng r;
    mt_test_rng_seed(&r, seed);
    b->w = calloc((size_t)b->t.total, sizeof(float));
    mt_test_fill_normal(&r, b->w, (size_t)b->t.total, 0.5f);
    b->x = malloc((size_t)n * 8 * sizeof(float));
    b->proj = malloc((size_t)n * 8 * sizeof(float));
    mt_test_fill_normal(&r, b->x, (size_t)n * 8, 1.0f);
    mt_test_fill_normal(&r, b->proj, (size_t)n * 8, 1.0f);
}

static void block_free(block *b) {
    mt_layer_ws_free(&b->ws, &b->lc);
    b->be->destroy(b->be);
    mt_param_table_free(&b->t);
    free(b->w), free(b->x), free(b->proj);
}

static mt_layer_view block_view(block *b, float *arena) {
    return mt_layer_view_at(&b->t, 0, arena + mt_group_offset(&b->t, 0), sizeof(float));
}

/* loss = sum(out * proj) + coef * aux, in double */
static double block_loss(block *b) {
    mt_layer_view v = block_view(b, b->w);
    float *out = malloc((size_t)b->n * 8 * sizeof(float));
    mt_moe_stats_reset(&b->lc, b->ws.moe_stats);
    mt_moe_forward(&b->lc, &v, b->x, out, b->n, &b->ws, 1);
    double loss = mt_moe_aux_finish(&b->lc, b->ws.moe_stats, NULL);
    for (int i = 0; i < b->n * 8; i++) loss += (double)out[i] * b->proj[i];
    free(out);
    return loss;
}

/* Analytic gradients of block_loss: g (arena layout) and dx (n, C). */
static void block_grad(block *b, float *g, float *dx) {
    (void)block_loss(b); /* forward + stats */
    mt_layer_view v = block_view(b, b->w), gv = block_view(b, g);
    mt_moe_backward(&b->lc, &v, &gv, b->proj, b->x, dx, b->n, &b->ws);
}

/* The experts chosen by the last forward, for comparing two forwards' choices. */
static int same_choice(const block *b, const int32_t *idx) {
    return memcmp(idx, b->ws.moe_idx, (size_t)b->n * b->cfg.top_k * sizeof(int32_t)) == 0;
}

/* Central difference of block_loss along one element; 0 (skipped) when the perturbation changes
 * a top-k choice (the loss is not differentiable there). */
static int central(block *b, float *v, const int32_t *idx, double h, double *fd) {
    float keep = *v;
    *v = keep + (float)h;
    double up = block_loss(b);
    int same = same_choice(b, idx);
    *v = keep - (float)h;
    double dn = block_loss(b);
    same &= same_choice(b, idx);
    *v = keep;
    *fd = (up - dn) / (2 * h);
    return same;
}

/* Central differences (fp32 forward, so h 1e-2 and the error measured against the largest
 * gradient of the tensor) on every router and expert weight and every input element. */
static void gradcheck(int E, int k, int renorm, int aux) {
    block b;
    block_init(&b, E, k, renorm, aux, 7, 11 + E * 4 + k * 2 + renorm);
    float *g = calloc((size_t)b.t.total, sizeof(float)), *dx = malloc((size_t)b.n * 8 * sizeof(float));
    block_grad(&b, g, dx);
    int32_t *idx = malloc((size_t)b.n * k * sizeof(int32_t));
    memcpy(idx, b.ws.moe_idx, (size_t)b.n * k * sizeof(int32_t));
    const double h = 1e-2;
    double worst = 0;
    int checked = 0, skipped = 0;
    for (int i = 0; i <= b.t.n_params; i++) { /* i == n_params: the input */
        const mt_param *p = i < b.t.n_params ? &b.t.params[i] : NULL;
        if (p && p->kind < MT_W_ROUTER) continue;
        float *val = p ? b.w + p->offset : b.x, *an = p ? g + p->offset : dx;
        int64_t n = p ? p->numel : b.n * 8;
        double gmax = 0, emax = 0;
        for (int64_t j = 0; j < n; j++) gmax = fabs(an[j]) > gmax ? fabs(an[j]) : gmax;
        for (int64_t j = 0; j < n; j++) {
            double fd;
            if (!central(&b, &val[j], idx, h, &fd)) { skipped++; continue; }
            double err = fabs(fd - an[j]);
            emax = err > emax ? err : emax;
            checked++;
        }
        double rel = emax / (gmax > 1e-3 ? gmax : 1e-3);
        if (rel > worst) worst = rel;
        if (rel > 1e-3) fprintf(stderr, "  %s: max error %.3g of max |grad| %.3g\n", p ? p->name : "input", emax, gmax);
    }
    fprintf(stderr, "gradcheck E %d k %d renorm %d aux %d: %d elements (%d skipped at a top-k change), "
            "worst error / max|grad| %.2e\n", E, k, renorm, aux, checked, skipped, worst);
    assert_true(worst < 1e-3);
    assert_true(skipped * 20 < checked);
    free(g), free(dx), free(idx);
    block_free(&b);
}

static void test_gradcheck_renorm_aux(void **state) { gradcheck(5, 2, 1, 1); }
static void test_gradcheck_raw_aux(void **state) { gradcheck(5, 2, 0, 1); }
static void test_gradcheck_raw_k3(void **state) { gradcheck(4, 3, 0, 0); }

/* The aux gradient is not zero: without it the router gradient differs (a check that the
 * gradcheck above would catch its omission). */
static void test_aux_changes_router_grad(void **state) {
    block a, b;
    block_init(&a, 5, 2, 1, 1, 7, 3);
    block_init(&b, 5, 2, 1, 0, 7, 3);
    float *ga = calloc((size_t)a.t.total, sizeof(float)), *gb = calloc((size_t)b.t.total, sizeof(float));
    float *dx = malloc((size_t)7 * 8 * sizeof(float));
    block_grad(&a, ga, dx);
    block_grad(&b, gb, dx);
    mt_layer_view va = block_view(&a, ga), vb = block_view(&b, gb);
    double diff = 0;
    for (int i = 0; i < 5 * 8; i++) diff += fabs(((float *)va.router)[i] - ((float *)vb.router)[i]);
    assert_true(diff > 1e-3);
    free(ga), free(gb), free(dx);
    block_free(&a);
    block_free(&b);
}

/* 3 tokens, top-1 of 8 experts: at least 5 experts get no token, and exactly zero gradient,
 * while the router's gradient reaches every expert's row through the softmax. */
static void test_unused_experts_zero_grad(void **state) {
    block b;
    block_init(&b, 8, 1, 0, 1, 3, 5);
    float *g = calloc((size_t)b.t.total, sizeof(float)), *dx = malloc((size_t)3 * 8 * sizeof(float));
    block_grad(&b, g, dx);
    int32_t idx[3];
    memcpy(idx, b.ws.moe_idx, sizeof idx);
    int unused = 0;
    for (int i = 0; i < b.t.n_params; i++) {
        const mt_param *p = &b.t.params[i];
        if (p->expert < 0) continue;
        int chosen = idx[0] == p->expert || idx[1] == p->expert || idx[2] == p->expert;
        double s = 0;
        for (int64_t j = 0; j < p->numel; j++) s += fabs(g[p->offset + j]);
        if (chosen) assert_true(s > 0);
        else assert_true(s == 0);
        unused += !chosen && p->kind == MT_W_EXP_GATE;
    }
    assert_true(unused >= 5);
    mt_layer_view v = block_view(&b, g);
    for (int e = 0; e < 8; e++) {
        double s = 0;
        for (int c = 0; c < 8; c++) s += fabs(((float *)v.router)[e * 8 + c]);
        assert_true(s > 0);
    }
    free(g), free(dx);
    block_free(&b);
}

/* ---- the layer: tiling and recompute modes on MoE layers ---- */

static void run_layer(const mt_param_table *t, mt_backend *be, const float *w, int l, int chunk,
                      mt_recompute rc, const float *x, int B, int T, float *out, float *dinp,
                      float *g) {
    const mt_config *cfg = &t->cfg;
    int N = B * T;
    float *inv_freq = malloc((size_t)cfg->D / 2 * sizeof(float));
    mt_config_rope_inv_freq(cfg, inv_freq);
    int32_t *pos = malloc((size_t)N * sizeof(int32_t));
    for (int i = 0; i < N; i++) pos[i] = i % T;
    mt_layer_ctx lc = {.cfg = cfg, .be = be, .inv_freq = inv_freq};
    mt_layer_ws ws;
    mt_layer_ws_init_tiled(&ws, &lc, N, chunk);
    mt_tokens tok = {.B = B, .T = T, .pos = pos, .doc_start = NULL};
    mt_layer_view lw = mt_layer_view_at(t, l, (float *)w + mt_group_offset(t, l), sizeof(float));
    mt_layer_view lg = mt_layer_view_at(t, l, g + mt_group_offset(t, l), sizeof(float));
    mt_layer_forward(&lc, &tok, &lw, x, out, &ws);
    float *dout = malloc((size_t)N * cfg->C * sizeof(float));
    for (int i = 0; i < N * cfg->C; i++) dout[i] = sinf(0.37f * (float)i);
    mt_layer_backward(&lc, &tok, &lw, &lg, x, dout, dinp, &ws, rc);
    mt_layer_ws_free(&ws, &lc);
    free(inv_freq), free(pos), free(dout);
}

static void test_layer_tiling_recompute(void **state) {
    mt_config c = load_fixture_config("qwen3_moe_norm");
    mt_param_table t;
    mt_param_table_init(&t, &c);
    float *w = mt_aligned_alloc((size_t)t.total * sizeof(float));
    char *dir = mt_fixture_path("qwen3_moe_norm");
    if (mt_model_load(&t, w, dir) != MT_OK) fail_msg("%s", mt_error_message());
    mt_backend *be = mt_backend_cpu_create();
    int B = 2, T = 9, N = B * T, C = c.C;
    float *x = malloc((size_t)N * C * sizeof(float));
    mt_test_rng r;
    mt_test_rng_seed(&r, 9);
    mt_test_fill_normal(&r, x, (size_t)N * C, 1.0f);
    size_t tb = (size_t)t.total * sizeof(float), ab = (size_t)N * C * sizeof(float);
    float *out0 = malloc(ab), *d0 = malloc(ab), *g0 = calloc(1, tb);
    run_layer(&t, be, w, 0, 0, MT_RECOMPUTE_ALL, x, B, T, out0, d0, g0);
    struct { int chunk; mt_recompute rc; } cases[] = {
        {0, MT_RECOMPUTE_NONE}, {0, MT_RECOMPUTE_CHEAP}, {5, MT_RECOMPUTE_ALL}, {4, MT_RECOMPUTE_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float *out = malloc(ab), *d = malloc(ab), *g = calloc(1, tb);
        run_layer(&t, be, w, 0, cases[i].chunk, cases[i].rc, x, B, T, out, d, g);
        char what[64];
        snprintf(what, sizeof what, "chunk %d recompute %d out", cases[i].chunk, (int)cases[i].rc);
        assert_true(mt_check_rel(what, out, out0, (size_t)N * C, 1e-6));
        assert_true(mt_check_rel("  dinp", d, d0, (size_t)N * C, 1e-6));
        assert_true(mt_check_rel("  grads", g, g0, (size_t)t.total, 1e-6));
        free(out), free(d), free(g);
    }
    free(out0), free(d0), free(g0), free(x), free(w), free(dir);
    be->destroy(be);
    mt_param_table_free(&t);
}

/* ---- the streaming engine on an MoE model ---- */

#define EB 4
#define ET 8

/* qwen3_moe_norm's weights (a dense layer between two MoE layers, the aux loss) on EB rows of ET
 * tokens: the engine's first step equals the runner's loss (aux included) and gradient norm for
 * every micro-batching (state full: fp32 weights), and its memory modes (checkpoints on the host, saved internals, resident
 * weights, the GPU tier, gradients on the device) change no bit over 3 steps, for each state
 * format. Tiled layers: the same numbers to rounding. */
static void test_engine_modes(void **state) {
    mt_config c = load_fixture_config("qwen3_moe_norm");
    mt_param_table t;
    mt_param_table_init(&t, &c);
    float *w = mt_aligned_alloc((size_t)t.total * sizeof(float));
    char *dir = mt_fixture_path("qwen3_moe_norm");
    if (mt_model_load(&t, w, dir) != MT_OK) fail_msg("%s", mt_error_message());
    int32_t ids[EB * ET], tg[EB * ET];
    for (int i = 0; i < EB * ET; i++) {
        ids[i] = (i * 37 + 5) % c.V;
        tg[i] = i % 9 == 4 ? -100 : (i * 53 + 11) % c.V;
    }
    mt_backend *be = mt_backend_cpu_create();
    mt_runner r;
    mt_runner_init(&r, &t, be, EB, ET);
    float *g = mt_aligned_alloc((size_t)t.total * sizeof(float));
    memset(g, 0, (size_t)t.total * sizeof(float));
    int64_t count;
    double sum = mt_runner_step(&r, w, g, ids, tg, EB, 0, &count);
    double want_loss = sum / count + r.aux_loss, sq = 0;
    assert_true(r.aux_loss > 0);
    for (int64_t i = 0; i < t.total; i++) sq += (double)g[i] * g[i];
    mt_runner_free(&r);
    be->destroy(be);
    const mt_adamw_hparams hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

    enum { MODES = 9 };
    const struct { int micro, offload, saved, resident, tier, grads_dev, chunk; } mode[MODES] = {
        {2, 0, 0, 0, 0, 0, 0}, {2, 3, 0, 0, 0, 0, 0}, {2, 0, 3, 0, 0, 0, 0}, {2, 0, 1, 1, 0, 0, 0},
        {2, 0, 0, 0, 2, 1, 0}, {2, 2, 0, 1, 1, 1, 0}, {4, 0, 0, 0, 0, 0, 0}, {1, 0, 0, 0, 0, 0, 0},
        {2, 0, 2, 0, 0, 0, 3}};
    for (int f = MT_STATE_FULL; f <= MT_STATE_TIGHT; f++) {
        double loss[MODES][3], norm[MODES][3];
        mt_test_snapshot snap[MODES];
        for (int k = 0; k < MODES; k++) {
            be = mt_backend_cpu_create();
            mt_engine_opts o = {.batch = EB, .micro_batch = mode[k].micro, .T = ET, .n_slots = 2,
                                .opt_threads = 1, .offload = mode[k].offload,
                                .saved_layers = mode[k].saved, .resident = mode[k].resident,
                                .state = (mt_state_format)f, .gpu_layers = mode[k].tier,
                                .grads_on_device = mode[k].grads_dev, .seed = 77,
                                .mlp_chunk = mode[k].chunk};
            mt_engine *e = mt_engine_create(&t, be, &o, w);
            for (int step = 0; step < 3; step++) {
                mt_step_result res;
                mt_engine_step(e, ids, tg, &hp, step + 1, 1.0, &res);
                loss[k][step] = res.loss;
                norm[k][step] = res.grad_norm;
            }
            mt_test_snapshot_state(&snap[k], e, &t);
            mt_engine_destroy(e);
            be->destroy(be);
            fprintf(stderr, "%s micro %d offload %d saved %d resident %d tier %d grads_dev %d chunk %d: "
                    "losses %.7f %.7f %.7f\n", mt_state_format_name((mt_state_format)f), mode[k].micro,
                    mode[k].offload, mode[k].saved, mode[k].resident, mode[k].tier, mode[k].grads_dev,
                    mode[k].chunk, loss[k][0], loss[k][1], loss[k][2]);
            if (f == MT_STATE_FULL) { /* step 1 (fp32 weights, before any update) is the runner's */
                assert_true(fabs(loss[k][0] - want_loss) <= 1e-6 * want_loss);
                assert_true(fabs(norm[k][0] - sqrt(sq)) <= 1e-5 * sqrt(sq));
            }
        }
        assert_true(loss[0][2] < loss[0][0]);
        for (int k = 1; k < MODES; k++) {
            int exact = mode[k].micro == mode[0].micro && mode[k].chunk == 0;
            for (int step = 0; step < 3; step++) {
                if (exact) {
                    assert_true(loss[k][step] == loss[0][step]);
                    assert_true(norm[k][step] == norm[0][step]);
                } else {
                    assert_true(fabs(loss[k][step] - loss[0][step]) <= 1e-5 * loss[0][step]);
                }
            }
            if (exact) mt_test_snapshot_equal(&snap[0], &snap[k]);
        }
        for (int k = 0; k < MODES; k++) mt_test_snapshot_free(&snap[k]);
    }
    free(g), free(w), free(dir);
    mt_param_table_free(&t);
}

/* `megatrain info` states the experts and the active parameters; `train` refuses a config field
 * it cannot honour by name, exit 1. */
static void test_cli(void **state) {
    const char *bin = getenv("MT_BIN");
    assert_non_null(bin);
    char *dir = mt_fixture_path("qwen3_moe_norm"), cmd[8192], out[16384];
    snprintf(cmd, sizeof cmd, "'%s' info --model '%s' 2>&1", bin, dir);
    assert_int_equal(mt_test_run(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "experts: 2 MoE layers of 6 experts (width 24), top 2, gates "
                                "renormalised, load-balancing loss; active parameters 40640"));
    char *tmp = mt_test_tmpdir();
    mt_test_sh("cp '%s'/* '%s'/ && sed -i 's/\"norm_topk_prob\"/\"router_jitter_noise\": 0.5, \"norm_topk_prob\"/' '%s/config.json'",
               dir, tmp, tmp);
    snprintf(cmd, sizeof cmd, "'%s' train --model '%s' --data '%s/model.safetensors' --out '%s/run' "
             "--steps 1 --seq 8 --batch 1 --device cpu 2>&1", bin, tmp, tmp, tmp);
    int rc = mt_test_run(cmd, out, sizeof out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "router_jitter_noise = 0.5 is not supported (must be 0)"));
    mt_test_rmtree(tmp);
    free(tmp), free(dir);
}

/* Training an MoE model stopped at step 6 and resumed gives the uninterrupted run's weights, bit
 * for bit (the router statistics are per step: nothing of them needs saving). */
static void test_cli_resume(void **state) {
    const char *bin = getenv("MT_BIN");
    assert_non_null(bin);
    char *dir = mt_fixture_path("train_qwen3_moe"), *tmp = mt_test_tmpdir(), args[1024];
    mt_test_fixture_args(dir, args, sizeof args);
    mt_test_sh("cd '%s' && '%s' train --model . --out '%s/a' --device cpu %s >/dev/null 2>&1", dir, bin,
               tmp, args);
    mt_test_sh("cd '%s' && '%s' train --model . --out '%s/b' --device cpu %s --stop-at 6 >/dev/null 2>&1",
               dir, bin, tmp, args);
    mt_test_sh("cd '%s' && '%s' train --model . --out '%s/b' --device cpu %s --resume >/dev/null 2>&1",
               dir, bin, tmp, args);
    mt_test_sh("cmp '%s/a/checkpoints/step_00000012/model.safetensors' "
               "'%s/b/checkpoints/step_00000012/model.safetensors'", tmp, tmp);
    mt_test_rmtree(tmp);
    free(tmp), free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_fields),
        cmocka_unit_test(test_config_defaults),
        cmocka_unit_test(test_config_refusals),
        cmocka_unit_test(test_config_save_roundtrip),
        cmocka_unit_test(test_param_names),
        cmocka_unit_test(test_hf_roundtrip),
        cmocka_unit_test(test_gradcheck_renorm_aux),
        cmocka_unit_test(test_gradcheck_raw_aux),
        cmocka_unit_test(test_gradcheck_raw_k3),
        cmocka_unit_test(test_aux_changes_router_grad),
        cmocka_unit_test(test_unused_experts_zero_grad),
        cmocka_unit_test(test_layer_tiling_recompute),
        cmocka_unit_test(test_engine_modes),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_cli_resume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
