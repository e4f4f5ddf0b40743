/* The parameter table: layout, names and shapes per family, lookup, views, random init. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/params.h"
#include "util/testutil.h"

/* Small models of each variant; sizes chosen so that no tensor is a multiple of the alignment. */
static mt_config make_config(const char *model_type, const char *extra) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"model_type\": \"%s\", \"hidden_size\": 48, \"intermediate_size\": 100,"
             " \"num_hidden_layers\": 3, \"num_attention_heads\": 6, \"num_key_value_heads\": 2,"
             " \"vocab_size\": 77%s}", model_type, extra);
    mt_config c;
    int r = mt_config_parse(&c, json, "test");
    if (r != MT_OK) print_error("%s\n", mt_error_message());
    assert_int_equal(r, MT_OK);
    return c;
}

static mt_config cfg_llama(void) { return make_config("llama", ""); }
static mt_config cfg_llama_bias(void) {
    return make_config("llama", ", \"attention_bias\": true, \"mlp_bias\": true");
}
static mt_config cfg_qwen2_tied(void) { return make_config("qwen2", ", \"tie_word_embeddings\": true"); }
static mt_config cfg_qwen3(void) { return make_config("qwen3", ", \"head_dim\": 10"); }
static mt_config cfg_mistral(void) { return make_config("mistral", ""); }

static int64_t shape_numel(const mt_param *p) {
    return p->ndim == 2 ? p->shape[0] * p->shape[1] : p->shape[0];
}

/* Every structural promise of params.h, for any config. */
static void check_layout(const mt_param_table *t) {
    const mt_config *c = &t->cfg;
    assert_int_equal(t->embed_offset, 0);
    assert_int_equal(t->layer_offset0, t->embed_offset + t->embed_size);
    assert_int_equal(t->head_offset, t->layer_offset0 + (int64_t)c->L * t->layer_size);
    assert_int_equal(t->total, t->head_offset + t->head_size);
    assert_int_equal(t->embed_size % MT_PARAM_ALIGN, 0);
    assert_int_equal(t->layer_size % MT_PARAM_ALIGN, 0);
    assert_int_equal(t->head_size % MT_PARAM_ALIGN, 0);
    assert_int_equal(t->n_real, mt_config_param_count(c));
    assert_true(t->total - t->n_real < (int64_t)t->n_params * MT_PARAM_ALIGN);

    int64_t prev_end = 0, real = 0;
    int prev_layer = MT_GROUP_EMBED;
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        assert_int_equal(p->offset % MT_PARAM_ALIGN, 0);
        assert_true(p->offset >= prev_end); /* arena order, no overlap */
        assert_int_equal(p->numel, shape_numel(p));
        assert_true(p->layer >= prev_layer && p->layer <= prev_layer + 1); /* groups in order */
        int64_t g0 = mt_group_offset(t, p->layer);
        assert_int_equal(p->group_offset, p->offset - g0);
        assert_true(p->offset + p->numel <= g0 + mt_group_size(t, p->layer));
        if (p->layer >= 0 && p->layer < c->L) {
            assert_true(p->kind < MT_LAYER_KINDS);
            assert_int_equal(p->group_offset, t->kind_offset[0][p->kind]);
        } else {
            assert_true(p->kind >= MT_LAYER_KINDS);
        }
        assert_ptr_equal(mt_param_find(t, p->name), p);
        prev_end = p->offset + p->numel;
        prev_layer = p->layer;
        real += p->numel;
    }
    assert_int_equal(real, t->n_real);
    assert_true(prev_end <= t->total);
    assert_int_equal(mt_group_offset(t, MT_GROUP_EMBED), t->embed_offset);
    assert_int_equal(mt_group_offset(t, c->L), t->head_offset);
    assert_int_equal(mt_group_offset(t, 1), t->layer_offset0 + t->layer_size);
}

static const mt_param *need(const mt_param_table *t, const char *name, int64_t r, int64_t cols) {
    const mt_param *p = mt_param_find(t, name);
    if (!p) print_error("missing %s\n", name);
    assert_non_null(p);
    assert_string_equal(p->name, name);
    assert_int_equal(p->ndim, cols ? 2 : 1);
    assert_int_equal(p->shape[0], r);
    if (cols) assert_int_equal(p->shape[1], cols);
    return p;
}

static void absent(const mt_param_table *t, const char *name) {
    if (mt_param_find(t, name)) print_error("unexpected %s\n", name);
    assert_null(mt_param_find(t, name));
}

/* Names and shapes present in every family: C 48, F 100, L 3, H 6, G 2, V 77. */
static void check_common(const mt_param_table *t, int D) {
    int64_t C = 48, F = 100, V = 77, QD = 6 * D, KD = 2 * D;
    need(t, "model.embed_tokens.weight", V, C);
    for (int l = 0; l < 3; l++) {
        char n[128];
#define NAME(s) (snprintf(n, sizeof n, "model.layers.%d.%s", l, s), n)
        need(t, NAME("input_layernorm.weight"), C, 0);
        need(t, NAME("self_attn.q_proj.weight"), QD, C);
        need(t, NAME("self_attn.k_proj.weight"), KD, C);
        need(t, NAME("self_attn.v_proj.weight"), KD, C);
        need(t, NAME("self_attn.o_proj.weight"), C, QD);
        need(t, NAME("post_attention_layernorm.weight"), C, 0);
        need(t, NAME("mlp.gate_proj.weight"), F, C);
        need(t, NAME("mlp.up_proj.weight"), F, C);
        need(t, NAME("mlp.down_proj.weight"), C, F);
#undef NAME
    }
    const mt_param *norm = need(t, "model.norm.weight", C, 0);
    assert_int_equal(norm->layer, 3);
    assert_int_equal(norm->kind, MT_W_FINAL_NORM);
}

static void test_llama_layout(void **state) {
    mt_config c = cfg_llama();
    mt_param_table t;
    mt_param_table_init(&t, &c);
    check_layout(&t);
    check_common(&t, 8);
    assert_int_equal(t.n_params, 1 + 3 * 9 + 2);
    const mt_param *head = need(&t, "lm_head.weight", 77, 48);
    assert_int_equal(head->layer, 3);
    assert_int_equal(head->kind, MT_W_LM_HEAD);
    absent(&t, "model.layers.0.self_attn.q_proj.bias");
    absent(&t, "model.layers.0.self_attn.o_proj.bias");
    absent(&t, "model.layers.0.self_attn.q_norm.weight");
    absent(&t, "model.layers.0.mlp.down_proj.bias");
    for (int k = 0; k < MT_LAYER_KINDS; k++) {
        int present = k == MT_W_INPUT_NORM || k == MT_W_Q || k == MT_W_K || k == MT_W_V ||
                      k == MT_W_O || k == MT_W_POST_NORM || k == MT_W_GATE || k == MT_W_UP ||
                      k == MT_W_DOWN;
        assert_int_equal(t.kind_offset[0][k] >= 0, present);
    }
    mt_param_table_free(&t);
}

static void test_llama_bias_layout(void **state) {
    mt_config c = cfg_llama_bias();
    mt_param_table t;
    mt_param_table_init(&t, &c);
    check_layout(&t);
    check_common(&t, 8);
    assert_int_equal(t.n_params, 1 + 3 * 16 + 2);
    need(&t, "model.layers.2.self_attn.q_proj.bias", 48, 0);
    need(&t, "model.layers.2.self_attn.k_proj.bias", 16, 0);
    need(&t, "model.layers.2.self_attn.v_proj.bias", 16, 0);
    need(&t, "model.layers.2.self_attn.o_proj.bias", 48, 0);
    need(&t, "model.layers.2.mlp.gate_proj.bias", 100, 0);
    need(&t, "model.layers.2.mlp.up_proj.bias", 100, 0);
    need(&t, "model.layers.2.mlp.down_proj.bias", 48, 0);
    mt_param_table_free(&t);
}

static void test_qwen2_tied_layout(void **state) {
    mt_config c = cfg_qwen2_tied();
    mt_param_table t;
    mt_param_table_init(&t, &c);
    check_layout(&t);
    check_common(&t, 8);
    assert_int_equal(t.n_params, 1 + 3 * 12 + 1);
    need(&t, "model.layers.1.self_attn.q_proj.bias", 48, 0);
    need(&t, "model.layers.1.self_attn.k_proj.bias", 16, 0);
    need(&t, "model.layers.1.self_attn.v_proj.bias", 16, 0);
    absent(&t, "model.layers.1.self_attn.o_proj.bias");
    absent(&t, "lm_head.weight");
    assert_int_equal(t.head_size, 256); /* just the final norm (48), aligned to 256 */
    mt_param_table_free(&t);
}

static void test_qwen3_layout(void **state) {
    mt_config c = cfg_qwen3();
    mt_param_table t;
    mt_param_table_init(&t, &c);
    check_layout(&t);
    check_common(&t, 10); /* H * D = 60 != C */
    assert_int_equal(t.n_params, 1 + 3 * 11 + 2);
    need(&t, "model.layers.0.self_attn.q_norm.weight", 10, 0);
    need(&t, "model.layers.0.self_attn.k_norm.weight", 10, 0);
    absent(&t, "model.layers.0.self_attn.q_proj.bias");
    mt_param_table_free(&t);
}

static void test_mistral_layout(void **state) {
    mt_config c = cfg_mistral();
    mt_param_table t;
    mt_param_table_init(&t, &c);
    check_layout(&t);
    check_common(&t, 8);
    assert_int_equal(t.n_params, 1 + 3 * 9 + 2);
    mt_param_table_free(&t);
}

static void test_find_unknown(void **state) {
    mt_config c = cfg_llama();
    mt_param_table t;
    mt_param_table_init(&t, &c);
    static const char *bad[] = {
        "", "model", "model.layers.", "model.layers.0", "model.layers.0.",
        "model.layers.3.input_layernorm.weight",   /* L = 3 */
        "model.layers.-1.input_layernorm.weight",
        "model.layers.01.input_layernorm.weight",
        "model.layers.1.input_layernorm.weightx",
        "model.layers.1.input_layernorm",
        "model.layers.1x.input_layernorm.weight",
        "model.layers.99999999999999999999.input_layernorm.weight",
        "model.embed_tokens", "lm_head.bias", "model.norm.bias", "layers.0.input_layernorm.weight",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) absent(&t, bad[i]);
    assert_null(mt_param_find(&t, NULL));
    mt_param_table_free(&t);
}

static void check_views(const mt_param_table *t, size_t es) {
    char *arena = malloc((size_t)t->total * es);
    mt_model_view mv = mt_model_view_of(t, arena, es);
    assert_ptr_equal(mv.embed, arena + mt_param_find(t, "model.embed_tokens.weight")->offset * es);
    assert_ptr_equal(mv.final_norm, arena + mt_param_find(t, "model.norm.weight")->offset * es);
    const mt_param *head = mt_param_find(t, "lm_head.weight");
    assert_ptr_equal(mv.lm_head, head ? arena + head->offset * es : (char *)mv.embed);
    for (int l = 0; l < t->cfg.L; l++) {
        char *base = arena + mt_group_offset(t, l) * es;
        mt_layer_view v = mt_layer_view_of(t, base, es);
        void *got[MT_LAYER_KINDS] = {
            [MT_W_INPUT_NORM] = v.input_norm, [MT_W_Q] = v.q, [MT_W_Q_BIAS] = v.q_bias,
            [MT_W_K] = v.k, [MT_W_K_BIAS] = v.k_bias, [MT_W_V] = v.v, [MT_W_V_BIAS] = v.v_bias,
            [MT_W_O] = v.o, [MT_W_O_BIAS] = v.o_bias, [MT_W_Q_NORM] = v.q_norm,
            [MT_W_K_NORM] = v.k_norm, [MT_W_POST_NORM] = v.post_norm, [MT_W_GATE] = v.gate,
            [MT_W_GATE_BIAS] = v.gate_bias, [MT_W_UP] = v.up, [MT_W_UP_BIAS] = v.up_bias,
            [MT_W_DOWN] = v.down, [MT_W_DOWN_BIAS] = v.down_bias,
        };
        for (int k = 0; k < MT_LAYER_KINDS; k++) {
            if (t->kind_offset[0][k] < 0) { assert_null(got[k]); continue; }
            assert_non_null(got[k]);
        }
        for (int i = 0; i < t->n_params; i++) {
            const mt_param *p = &t->params[i];
            if (p->layer == l) assert_ptr_equal(got[p->kind], arena + p->offset * es);
        }
    }
    free(arena);
}

static void test_views(void **state) {
    mt_config cs[] = {cfg_llama(), cfg_llama_bias(), cfg_qwen2_tied(), cfg_qwen3(), cfg_mistral()};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        mt_param_table t;
        mt_param_table_init(&t, &cs[i]);
        check_views(&t, sizeof(float));
        check_views(&t, 2); /* a bf16 arena: same element offsets */
        mt_param_table_free(&t);
    }
}

/* ---- init ---- */

/* Big enough for statistics and for the parallel path (tensors > 65536 elements):
 * embed 2051 x 520, q 520 x 520, o 520 x 520, down 520 x 1000, with every bias (520 and 1000 are
 * not multiples of the alignment, so there is padding). */
static mt_config cfg_big(void) {
    const char *json =
        "{\"model_type\": \"llama\", \"hidden_size\": 520, \"intermediate_size\": 1000,"
        " \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
        " \"vocab_size\": 2051, \"attention_bias\": true, \"mlp_bias\": true}";
    mt_config c;
    assert_int_equal(mt_config_parse(&c, json, "test"), MT_OK);
    return c;
}

static float *init_arena(const mt_param_table *t, uint64_t seed) {
    float *a = malloc((size_t)t->total * sizeof(float));
    for (int64_t i = 0; i < t->total; i++) a[i] = NAN; /* init must write every element */
    mt_param_init(t, a, 0.02f, seed);
    return a;
}

/* mean within 5 standard errors of 0, std within `rel` of the target, and normal-looking. */
static void check_normal(const char *name, const float *x, int64_t n, double std, double rel) {
    double s = 0, s2 = 0, within = 0, maxz = 0;
    for (int64_t i = 0; i < n; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
        within += fabs(x[i]) < std;
        if (fabs(x[i]) / std > maxz) maxz = fabs(x[i]) / std;
    }
    double mean = s / n, sd = sqrt(s2 / n - mean * mean), frac = within / n;
    print_message("%-40s n %8lld mean %+.2e std %.5f (want %.5f) P(|z|<1) %.4f max|z| %.2f\n", name,
                  (long long)n, mean, sd, std, frac, maxz);
    assert_true(fabs(mean) < 5 * std / sqrt((double)n));
    assert_true(fabs(sd / std - 1) < rel);
    assert_true(fabs(frac - 0.682689) < 5 * sqrt(0.2166 / n) + 1e-3);
    assert_true(maxz < 7.0); /* P(|z| > 7) = 2.6e-12 per value */
}

static void test_init_values(void **state) {
    mt_config c = cfg_big();
    mt_param_table t;
    mt_param_table_init(&t, &c);
    float *a = init_arena(&t, 1234);
    double resid = 0.02 / sqrt(2.0 * c.L);
    for (int i = 0; i < t.n_params; i++) {
        const mt_param *p = &t.params[i];
        const float *x = a + p->offset;
        switch (p->kind) {
        case MT_W_INPUT_NORM: case MT_W_POST_NORM: case MT_W_FINAL_NORM:
            for (int64_t j = 0; j < p->numel; j++) assert_true(x[j] == 1.0f);
            break;
        case MT_W_Q_BIAS: case MT_W_K_BIAS: case MT_W_V_BIAS: case MT_W_O_BIAS:
        case MT_W_GATE_BIAS: case MT_W_UP_BIAS: case MT_W_DOWN_BIAS:
            for (int64_t j = 0; j < p->numel; j++) assert_true(x[j] == 0.0f);
            break;
        case MT_W_O: case MT_W_DOWN:
            /* residual projections: 1/sqrt(2 L); std of a sample std ~ 1/sqrt(2n) = 0.14% */
            check_normal(p->name, x, p->numel, resid, 0.01);
            break;
        default:
            assert_int_equal(p->ndim, 2);
            check_normal(p->name, x, p->numel, 0.02, 0.01);
        }
    }
    /* padding is zero: walk the gaps between tensors */
    int64_t end = 0, pad = 0;
    for (int i = 0; i <= t.n_params; i++) {
        int64_t next = i < t.n_params ? t.params[i].offset : t.total;
        for (int64_t j = end; j < next; j++, pad++) assert_true(a[j] == 0.0f);
        if (i < t.n_params) end = t.params[i].offset + t.params[i].numel;
    }
    assert_int_equal(pad, t.total - t.n_real);
    assert_true(pad > 0);
    /* distinct tensors and distinct seeds give distinct values */
    const mt_param *q0 = mt_param_find(&t, "model.layers.0.self_attn.q_proj.weight");
    const mt_param *q1 = mt_param_find(&t, "model.layers.1.self_attn.q_proj.weight");
    assert_true(memcmp(a + q0->offset, a + q1->offset, 64 * sizeof(float)) != 0);
    float *b = init_arena(&t, 1235);
    assert_true(memcmp(a + q0->offset, b + q0->offset, 64 * sizeof(float)) != 0);
    free(b);
    free(a);
    mt_param_table_free(&t);
}

static void test_init_deterministic_across_threads(void **state) {
    mt_config c = cfg_big();
    mt_param_table t;
    mt_param_table_init(&t, &c);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    float *a = init_arena(&t, 42);
    omp_set_num_threads(2);
    float *b = init_arena(&t, 42);
    omp_set_num_threads(3);
    float *d = init_arena(&t, 42);
    omp_set_num_threads(saved);
    size_t bytes = (size_t)t.total * sizeof(float);
    assert_int_equal(memcmp(a, b, bytes), 0);
    assert_int_equal(memcmp(a, d, bytes), 0);
    free(a);
    free(b);
    free(d);
    mt_param_table_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_layout),
        cmocka_unit_test(test_llama_bias_layout),
        cmocka_unit_test(test_qwen2_tied_layout),
        cmocka_unit_test(test_qwen3_layout),
        cmocka_unit_test(test_mistral_layout),
        cmocka_unit_test(test_find_unknown),
        cmocka_unit_test(test_views),
        cmocka_unit_test(test_init_values),
        cmocka_unit_test(test_init_deterministic_across_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
