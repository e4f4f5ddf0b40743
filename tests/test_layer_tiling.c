/* The layer tiled over chunks of tokens (mt_layer_ws_init_tiled: both halves, every per-token op
 * around the attention) computes what the untiled layer computes, in a workspace whose chunk rows
 * hold one chunk (CPU backend, fp32).
 *
 * Not bitwise, and why: the tiled layer runs the same row-wise norms, RoPE and elementwise ops,
 * but its GEMMs have R = chunk rows instead of N. The CPU backend's sgemm (OpenBLAS) gives a row
 * the same bits only when the row sits in the same place of its micro-kernel tiles and thread split
 * (for these shapes on the AMD EPYC here: chunks that are multiples of 12 rows single-threaded,
 * of 48 with 2 threads); elsewhere its edge kernels sum over K in another order, a few ulp apart
 * (1e-7 relative), and the attention passes q, k, v's ulps on. The weight gradients are also
 * reductions over the tokens, which the tiled layer adds one chunk's partial sum at a time (another
 * grouping of the fp32 sum). So every output, dinp and every weight gradient is compared with
 *   |got - ref| <= RTOL * (max|ref| + |ref|)
 * (a sum of K <= 176 or N <= 192 fp32 products regrouped: about 1e-7 of its magnitude, printed),
 * and bitwise where the calls are the same: chunk 0 or >= N in every backward mode, and a repeat
 * of the same chunk. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "model/layer.h"
#include "util/config_check.h"
#include "util/testutil.h"
#include "util/tiny_config.h"

#define RTOL 1e-5

typedef struct {
    mt_config cfg;
    mt_param_table table;
    mt_backend *be;
    mt_layer_ctx lc;
    float *w, *inv_freq, *inp, *dout, *grads0;
    int32_t *pos, *doc_start; /* doc_start NULL: one document a row */
    int B, T, N;
} layer_case;

/* What one forward and backward gave. */
typedef struct {
    float *out, *dinp, *grads;
} layer_result;

static size_t layer_floats(const layer_case *c) { return (size_t)c->table.layer_size; }
static size_t act_floats(const layer_case *c) { return (size_t)c->N * c->cfg.C; }

/* One layer (layer 0 of the table) with weights large enough that every gradient is non-zero:
 * matrices normal(0, 0.3), norm weights 1 + 0.1 n, biases 0.1 n; the layer input normal(0, 1),
 * the output gradient normal(0, 1), and non-zero gradients to accumulate onto. */
static void case_init(layer_case *c, mt_config cfg, int B, int T) {
    memset(c, 0, sizeof *c);
    c->cfg = cfg;
    c->cfg.L = 1;
    c->B = B;
    c->T = T;
    c->N = B * T;
    mt_param_table_init(&c->table, &c->cfg);
    c->be = mt_backend_cpu_create();
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 11);

    float *arena = mt_aligned_alloc((size_t)c->table.total * sizeof(float));
    mt_param_init(&c->table, arena, 0.3f, 5);
    for (int i = 0; i < c->table.n_params; i++) {
        const mt_param *p = &c->table.params[i];
        if (p->layer != 0 || p->ndim != 1) continue;
        float base = strstr(p->name, "norm") ? 1.0f : 0.0f;
        for (int64_t j = 0; j < p->numel; j++)
            arena[p->offset + j] = base + 0.1f * mt_test_rng_normal(&rng);
    }
    c->w = c->be->alloc(c->be, layer_floats(c) * sizeof(float));
    c->be->upload(c->be, c->w, arena + mt_group_offset(&c->table, 0),
                  layer_floats(c) * sizeof(float));
    free(arena);

    size_t rope = mt_config_rope_inv_freq_len(&c->cfg); /* gemma3: two tables */
    float *inv = malloc(rope * sizeof(float));
    mt_config_rope_inv_freq(&c->cfg, inv);
    c->inv_freq = c->be->alloc(c->be, rope * sizeof(float));
    c->be->upload(c->be, c->inv_freq, inv, rope * sizeof(float));
    free(inv);
    int32_t *pos = malloc((size_t)c->N * sizeof(int32_t));
    for (int i = 0; i < c->N; i++) pos[i] = i % T;
    c->pos = c->be->alloc(c->be, (size_t)c->N * sizeof(int32_t));
    c->be->upload(c->be, c->pos, pos, (size_t)c->N * sizeof(int32_t));
    free(pos);
    c->lc = (mt_layer_ctx){.cfg = &c->table.cfg, .be = c->be, .inv_freq = c->inv_freq};

    size_t act_bytes = act_floats(c) * sizeof(float);
    float *x = malloc(act_bytes);
    c->inp = c->be->alloc(c->be, act_bytes);
    c->dout = c->be->alloc(c->be, act_bytes);
    mt_test_fill_normal(&rng, x, act_floats(c), 1.0f);
    c->be->upload(c->be, c->inp, x, act_bytes);
    mt_test_fill_normal(&rng, x, act_floats(c), 1.0f);
    c->be->upload(c->be, c->dout, x, act_bytes);
    free(x);
    c->grads0 = malloc(layer_floats(c) * sizeof(float));
    mt_test_fill_normal(&rng, c->grads0, layer_floats(c), 0.1f);
}

static void case_free(layer_case *c) {
    void *bufs[] = {c->w, c->inv_freq, c->pos, c->inp, c->dout, c->doc_start};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) c->be->free(c->be, bufs[i]);
    free(c->grads0);
    c->be->destroy(c->be);
    mt_param_table_free(&c->table);
}

static void result_free(layer_result *r) {
    free(r->out);
    free(r->dinp);
    free(r->grads);
}

/* Counts the attention forwards the layer runs. */
static int attention_calls;
static void (*cpu_attention_forward)(mt_backend *, void *, float *, const void *, const void *,
                                     const void *, const int32_t *, int, int, int, int, int,
                                     const mt_attention_opts *);
static void counting_attention_forward(mt_backend *be, void *out, float *lse, const void *q,
                                       const void *k, const void *v, const int32_t *doc_start,
                                       int B, int T, int H, int G, int D,
                                       const mt_attention_opts *opts) {
    attention_calls++;
    cpu_attention_forward(be, out, lse, q, k, v, doc_start, B, T, H, G, D, opts);
}

/* NaN over the n floats at p (the cpu's compute side is host memory). */
static void scribble(void *p, size_t n) {
    float *x = p;
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

enum { SAVE_NONE, SAVE_WHOLE, SAVE_ATTENTION };

/* Forward then backward of the case's layer in chunks of mlp_chunk tokens. With `saved`
 * SAVE_WHOLE, the forward writes the saved internals into a buffer of the layer's own and the
 * backward runs MT_RECOMPUTE_CHEAP from it; with SAVE_ATTENTION it writes att and lse there and
 * the backward runs MT_RECOMPUTE_KEEP_ATTENTION, and then the shared workspace's q, k, v, att,
 * lse and h are overwritten with NaN between the two calls (the backward must remake all but the
 * saved attention) and the backward must not run the attention forward; else the backward runs
 * `recompute` on the shared workspace. With `alias`, the forward's out is its inp (a copy) and
 * the backward's dinp its dout (a copy), as the streaming engine and the runner call them. */
static layer_result case_run(layer_case *c, int mlp_chunk, int saved, mt_recompute recompute,
                             int alias) {
    mt_backend *be = c->be;
    mt_layer_ws ws;
    mt_layer_ws_init_tiled(&ws, &c->lc, c->N, mlp_chunk);
    assert_int_equal(ws.mlp_chunk, mlp_chunk);
    void *saved_buf = NULL;
    mt_layer_ws run_ws = ws;
    if (saved == SAVE_WHOLE) {
        size_t bytes = mt_layer_saved_bytes_tiled(&c->cfg, be->dtype, c->N, mlp_chunk);
        saved_buf = be->alloc(be, bytes);
        run_ws = mt_layer_ws_with_saved(&ws, &c->cfg, be->dtype, c->N, saved_buf);
        recompute = MT_RECOMPUTE_CHEAP;
    } else if (saved == SAVE_ATTENTION) {
        size_t HD = (size_t)c->cfg.H * mt_config_max_head_dim(&c->cfg), bytes = mt_layer_attention_saved_bytes(&c->cfg, be->dtype, c->N);
        assert_true(bytes >= (size_t)c->N * (HD + c->cfg.H) * sizeof(float));
        assert_true(bytes < (size_t)c->N * (HD + c->cfg.H) * sizeof(float) + 512); /* 2 x 256 rounding */
        saved_buf = be->alloc(be, bytes);
        run_ws = mt_layer_ws_with_saved_attention(&ws, &c->cfg, be->dtype, c->N, saved_buf);
        assert_ptr_equal(run_ws.q, ws.q); /* only att and lse move */
        assert_ptr_not_equal(run_ws.att, ws.att);
        assert_ptr_not_equal(run_ws.lse, ws.lse);
        recompute = MT_RECOMPUTE_KEEP_ATTENTION;
    }
    mt_tokens tok = {.B = c->B, .T = c->T, .pos = c->pos, .doc_start = c->doc_start};
    mt_layer_weights w = mt_layer_view_of(&c->table, c->w, sizeof(float));
    float *grads = be->alloc(be, layer_floats(c) * sizeof(float));
    be->upload(be, grads, c->grads0, layer_floats(c) * sizeof(float));
    mt_layer_weights g = mt_layer_view_of(&c->table, grads, sizeof(float));
    size_t act_bytes = act_floats(c) * sizeof(float);
    float *out = be->alloc(be, act_bytes), *dinp = be->alloc(be, act_bytes);
    if (alias) {
        memcpy(out, c->inp, act_bytes); /* the cpu's compute side is host memory */
        memcpy(dinp, c->dout, act_bytes);
    }
    mt_layer_forward(&c->lc, &tok, &w, alias ? out : c->inp, out, &run_ws);
    if (saved == SAVE_ATTENTION) {
        size_t N = (size_t)c->N, HD = (size_t)c->cfg.H * c->cfg.D, GD = (size_t)c->cfg.G * c->cfg.D;
        scribble(ws.q, N * HD), scribble(ws.k, N * GD), scribble(ws.v, N * GD);
        scribble(ws.att, N * HD), scribble(ws.lse, N * c->cfg.H), scribble(ws.h, N * c->cfg.C);
        cpu_attention_forward = be->attention_forward;
        be->attention_forward = counting_attention_forward;
        attention_calls = 0;
    }
    mt_layer_backward(&c->lc, &tok, &w, &g, c->inp, alias ? dinp : c->dout, dinp, &run_ws,
                      recompute);
    if (saved == SAVE_ATTENTION) {
        be->attention_forward = cpu_attention_forward;
        assert_int_equal(attention_calls, 0);
    }

    layer_result r = {malloc(act_floats(c) * sizeof(float)), malloc(act_floats(c) * sizeof(float)),
                      malloc(layer_floats(c) * sizeof(float))};
    be->download(be, r.out, out, act_floats(c) * sizeof(float));
    be->download(be, r.dinp, dinp, act_floats(c) * sizeof(float));
    be->download(be, r.grads, grads, layer_floats(c) * sizeof(float));
    be->free(be, out);
    be->free(be, dinp);
    be->free(be, grads);
    if (saved_buf) be->free(be, saved_buf);
    mt_layer_ws_free(&ws, &c->lc);
    return r;
}

/* Fails naming the first element of got that is not bitwise ref's. */
static void expect_bitwise(const char *label, const char *what, const float *got, const float *ref,
                           size_t n) {
    if (!memcmp(got, ref, n * sizeof(float))) return;
    size_t i = 0;
    while (!memcmp(got + i, ref + i, sizeof(float))) i++;
    fail_msg("%s: %s[%zu] = %.9g, untiled %.9g (max rel err %.2e over %zu)", label, what, i,
             got[i], ref[i], mt_max_rel_err(got, ref, n), n);
}

/* got within RTOL * (max|part| + |ref|) of ref, with part = ref - base (this call's share of a
 * gradient that accumulated onto base; base NULL: 0). Returns the largest fraction of the
 * tolerance used; on failure mt_allclose prints the offending values. */
static double expect_close(const char *label, const char *what, const float *got, const float *ref,
                           const float *base, size_t n) {
    double mx = 0, used = 0;
    for (size_t j = 0; j < n; j++) mx = fmax(mx, fabs(ref[j] - (base ? base[j] : 0.0f)));
    assert_true(mx > 0); /* not trivially zero */
    for (size_t j = 0; j < n; j++) {
        double err = fabs((double)got[j] - ref[j]);
        used = fmax(used, isnan(err) ? INFINITY : err / (RTOL * (mx + fabs(ref[j]))));
    }
    if (used > 1) {
        char name[192];
        snprintf(name, sizeof name, "%s: %s", label, what);
        mt_allclose(name, got, ref, n, RTOL * mx, RTOL);
        fail();
    }
    return used;
}

/* Largest fractions of the tolerance used. */
typedef struct {
    double out, dinp, grads;
} errors;

/* got against ref: bitwise when `bitwise`, else every tensor within RTOL. */
static void expect_same(const layer_case *c, const layer_result *got, const layer_result *ref,
                        const char *label, int bitwise, errors *e) {
    if (bitwise) {
        expect_bitwise(label, "out", got->out, ref->out, act_floats(c));
        expect_bitwise(label, "dinp", got->dinp, ref->dinp, act_floats(c));
        expect_bitwise(label, "gradients", got->grads, ref->grads, layer_floats(c));
        return;
    }
    e->out = fmax(e->out, expect_close(label, "out", got->out, ref->out, NULL, act_floats(c)));
    e->dinp = fmax(e->dinp, expect_close(label, "dinp", got->dinp, ref->dinp, NULL, act_floats(c)));
    for (int i = 0; i < c->table.n_params; i++) {
        const mt_param *p = &c->table.params[i];
        if (p->layer != 0) continue;
        size_t at = (size_t)p->group_offset;
        if (p->kind == MT_W_LAYER_SCALAR) { /* gemma4's buffer: its gradient is never written */
            expect_bitwise(label, p->name, got->grads + at, c->grads0 + at, (size_t)p->numel);
            continue;
        }
        e->grads = fmax(e->grads, expect_close(label, p->name, got->grads + at, ref->grads + at,
                                               c->grads0 + at, (size_t)p->numel));
    }
}

/* For the case's layer: chunk sizes 0 (untiled), 1, 7, a divisor of N, a non-divisor, N and past N
 * against the untiled layer recomputing all, with each backward mode (recompute all, the workspace
 * as the forward left it, saved internals, in-place calls). */
static void check_chunks(layer_case *c, int divisor, int non_divisor) {
    assert_int_equal(c->N % divisor, 0);
    assert_true(c->N % non_divisor != 0);
    const int chunks[] = {0, 1, 7, divisor, non_divisor, c->N, c->N + 5};
    const struct {
        int saved;
        mt_recompute rc;
        int alias;
        const char *name;
    } modes[] = {{SAVE_NONE, MT_RECOMPUTE_ALL, 0, "recompute all"},
                 {SAVE_NONE, MT_RECOMPUTE_NONE, 0, "recompute none"},
                 {SAVE_WHOLE, MT_RECOMPUTE_CHEAP, 0, "saved"},
                 {SAVE_ATTENTION, MT_RECOMPUTE_KEEP_ATTENTION, 0, "saved attention"},
                 {SAVE_NONE, MT_RECOMPUTE_NONE, 1, "out = inp, dinp = dout"}};
    layer_result ref = case_run(c, 0, 0, MT_RECOMPUTE_ALL, 0);
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        errors e = {0};
        for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
            char label[64];
            snprintf(label, sizeof label, "%s, N %d, chunk %d", modes[m].name, c->N, chunks[k]);
            layer_result got =
                case_run(c, chunks[k], modes[m].saved, modes[m].rc, modes[m].alias);
            expect_same(c, &got, &ref, label, chunks[k] == 0 || chunks[k] >= c->N, &e);
            layer_result again =
                case_run(c, chunks[k], modes[m].saved, modes[m].rc, modes[m].alias);
            expect_same(c, &again, &got, label, 1, &e); /* deterministic */
            result_free(&again);
            result_free(&got);
        }
        fprintf(stderr, "%s, %s, N %d: tolerance used at most: out %.1f%%, dinp %.1f%%, weight "
                "gradients %.1f%%\n", c->cfg.model_type, modes[m].name, c->N, 100 * e.out,
                100 * e.dinp, 100 * e.grads);
    }
    result_free(&ref);
}

static void test_tiny_variants_match_untiled(void **state) {
    (void)state;
    const char *variants[] = {"llama_bias", "qwen2_bias_tied", "qwen3_qknorm"};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        layer_case c;
        case_init(&c, mt_test_tiny_config(variants[v]), 3, 13); /* N 39 */
        check_chunks(&c, 13, 10);
        case_free(&c);
    }
}

/* Wider than the tiny configs (C 64, F 176, N 192), so the GEMMs take BLAS's blocked paths too;
 * with qwen3's q/k norm (D 16: H*D = 128 wider than C) and without. */
static void test_wider_layer_matches_untiled(void **state) {
    (void)state;
    const char *variants[] = {"llama_bias", "qwen3_qknorm"};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        mt_config cfg = mt_test_tiny_config(variants[v]);
        cfg.C = 64;
        cfg.F = 176;
        cfg.H = 8;
        cfg.G = 2;
        cfg.D = cfg.qk_norm ? 16 : 8;
        layer_case c;
        case_init(&c, cfg, 2, 96);
        check_chunks(&c, 64, 50);
        case_free(&c);
    }
}

/* gemma3's layer (fixture gemma3_tiny's config, one layer): the sandwich norms' backward reads
 * o_proj's and down's outputs, saved or remade per mode and chunk; a sliding layer (window 8 < T,
 * its own RoPE table) and a full one. */
static void test_gemma3_layer_matches_untiled(void **state) {
    (void)state;
    mt_config cfg = mt_test_config_load("gemma3_tiny/config.json");
    for (int sliding = 1; sliding >= 0; sliding--) {
        if (!sliding) cfg.sliding[0] = 0;
        layer_case c;
        case_init(&c, cfg, 3, 13); /* N 39 */
        check_chunks(&c, 13, 10);
        case_free(&c);
    }
}

/* gemma4's layers (fixtures gemma4_tiny, gemma4_vl and gemma4_moe, one layer): the v-norm's input
 * (v_proj's output, or k_raw where keys are values) and statistics saved or remade per mode and
 * chunk, the full layers' own head dim and kv heads, the layer_scalar on the output and its
 * gradient, the MoE block beside the dense MLP (always remade from h, chunk by chunk); a sliding
 * layer and a full one of each. */
static void test_gemma4_layer_matches_untiled(void **state) {
    (void)state;
    const char *names[] = {"gemma4_tiny/config.json", "gemma4_vl/config.json", "gemma4_moe/config.json"};
    for (int f = 0; f < 3; f++) {
        mt_config cfg = mt_test_config_load("%s", names[f]);
        for (int sliding = 1; sliding >= 0; sliding--) {
            if (!sliding) cfg.sliding[0] = 0;
            layer_case c;
            case_init(&c, cfg, 3, 13); /* N 39 */
            mt_layer_view v = mt_layer_view_at(&c.table, 0, c.w, sizeof(float));
            assert_non_null(v.layer_scalar);
            assert_int_equal(v.head_dim, sliding ? cfg.D : cfg.global_D);
            assert_true((v.v == NULL) == (!sliding && cfg.k_eq_v));
            check_chunks(&c, 13, 10);
            case_free(&c);
        }
    }
}

/* Gives the case's rows documents starting at the positions `starts` (each row the same; the
 * first must be 0), and positions counted from each document's start. */
static void case_documents(layer_case *c, const int *starts, int n) {
    int32_t *ds = malloc((size_t)c->N * sizeof(int32_t));
    int32_t *pos = malloc((size_t)c->N * sizeof(int32_t));
    for (int b = 0; b < c->B; b++)
        for (int t = 0, d = 0; t < c->T; t++) {
            while (d + 1 < n && starts[d + 1] <= t) d++;
            ds[b * c->T + t] = starts[d];
            pos[b * c->T + t] = t - starts[d];
        }
    c->doc_start = c->be->alloc(c->be, (size_t)c->N * sizeof(int32_t));
    c->be->upload(c->be, c->doc_start, ds, (size_t)c->N * sizeof(int32_t));
    c->be->upload(c->be, c->pos, pos, (size_t)c->N * sizeof(int32_t));
    free(ds);
    free(pos);
}

/* Qwen3.5's Gated DeltaNet layer (fixtures qwen3_5_dense and qwen3_5_moe, layer 0) tiled: each row
 * runs in spans of max(chunk, 64) tokens with the delta rule's state carried between them (and
 * saved at each span start for the backward, which remakes each span's forward), the conv reading
 * the K-1 tokens before a span; rows of 150 tokens make 2-3 spans, whole rows one at a time past
 * that. Then with packed documents: one starting inside a span, one at a span's first token (64),
 * one in the conv's context of the next span (126-128: its conv must not read across it). */
static void test_deltanet_layer_matches_untiled(void **state) {
    (void)state;
    const char *names[] = {"qwen3_5_dense/config.json", "qwen3_5_moe/config.json"};
    for (int f = 0; f < 2; f++) {
        mt_config cfg = mt_test_config_load("%s", names[f]);
        assert_int_equal(mt_config_layer_mixer(&cfg, 0), MT_MIXER_GATED_DELTANET);
        for (int docs = 0; docs < 2; docs++) {
            layer_case c;
            case_init(&c, cfg, 2, 150); /* N 300 */
            if (docs) {
                const int starts[] = {0, 40, 64, 127, 140};
                case_documents(&c, starts, 5);
            }
            check_chunks(&c, 100, 128);
            case_free(&c);
        }
    }
}

/* Counts what the workspace allocates through the backend. */
static size_t alloc_count;
static void *(*cpu_alloc)(mt_backend *be, size_t bytes);
static void *counting_alloc(mt_backend *be, size_t bytes) {
    alloc_count += bytes;
    return cpu_alloc(be, bytes);
}

/* Elements a token takes in the fields that stay (N, .) when tiled: the attention's inputs and
 * outputs q, k, v, att, lse, their gradients d_att, dq, dk, dv, and h, the MLP's input. */
static size_t whole_per_token(const mt_config *cfg) {
    size_t HD = (size_t)cfg->H * cfg->D, GD = (size_t)cfg->G * cfg->D;
    return 4 * HD + 4 * GD + (size_t)cfg->C + (size_t)cfg->H;
}

/* Elements a token takes in the chunk rows: the MLP's hn, d_hn (C), gate, up, act and their
 * gradients (F), rstd2; the attention half's xn1, d_xn1 (C), rstd1; qwen3's q_raw, dq_raw (H*D),
 * k_raw, dk_raw (G*D), q_rstd (H), k_rstd (G). */
static size_t chunk_per_token(const mt_config *cfg) {
    size_t HD = (size_t)cfg->H * cfg->D, GD = (size_t)cfg->G * cfg->D;
    size_t n = 6 * (size_t)cfg->F + 4 * (size_t)cfg->C + 2;
    if (cfg->qk_norm) n += 2 * HD + 2 * GD + (size_t)cfg->H + (size_t)cfg->G;
    return n;
}

/* Saved internals a token takes, elements: q, k, v, att, h, lse; untiled also gate, up and
 * qwen3's q_raw, k_raw, q_rstd, k_rstd. */
static size_t saved_per_token(const mt_config *cfg, int tiled) {
    size_t HD = (size_t)cfg->H * cfg->D, GD = (size_t)cfg->G * cfg->D;
    size_t n = 2 * HD + 2 * GD + (size_t)cfg->C + (size_t)cfg->H;
    if (!tiled) n += 2 * (size_t)cfg->F + (cfg->qk_norm ? HD + GD + cfg->H + cfg->G : 0);
    return n;
}

/* The workspace's chunk rows shrink to the chunk, in both halves: mt_layer_ws_init_tiled allocates
 * what mt_layer_ws_bytes_tiled reports, N tokens' worth of the whole fields plus min(chunk, N)
 * tokens' of the chunk rows (all fp32 here; chunks of 64 tokens and more make every field a
 * multiple of the 256-byte rounding), and the saved internals drop the chunk fields when tiled. */
static void test_workspace_shrinks_with_chunk(void **state) {
    (void)state;
    const char *variants[] = {"llama_bias", "qwen3_qknorm"};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        mt_config cfg = mt_test_tiny_config(variants[v]);
        mt_backend *be = mt_backend_cpu_create();
        cpu_alloc = be->alloc;
        be->alloc = counting_alloc;
        mt_layer_ctx lc = {.cfg = &cfg, .be = be, .inv_freq = NULL};
        const int N = 256, chunks[] = {0, 300, 256, 128, 64, 7, 1};
        size_t prev = 0;
        for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
            int tiled = chunks[k] > 0 && chunks[k] < N, rows = tiled ? chunks[k] : N;
            mt_layer_ws ws;
            alloc_count = 0;
            mt_layer_ws_init_tiled(&ws, &lc, N, chunks[k]);
            size_t bytes = mt_layer_ws_bytes_tiled(&cfg, be->dtype, N, chunks[k]);
            assert_int_equal(alloc_count, bytes);
            mt_layer_ws_free(&ws, &lc);
            if (rows >= 64)
                assert_int_equal(bytes, 4 * ((size_t)N * whole_per_token(&cfg) +
                                             (size_t)rows * chunk_per_token(&cfg)));
            if (tiled) assert_true(bytes < prev);
            else assert_int_equal(bytes, mt_layer_ws_bytes(&cfg, be->dtype, N));
            assert_int_equal(mt_layer_saved_bytes_tiled(&cfg, be->dtype, N, chunks[k]),
                             4 * (size_t)N * saved_per_token(&cfg, tiled));
            prev = bytes;
        }
        assert_int_equal(mt_layer_saved_bytes(&cfg, be->dtype, N),
                         4 * (size_t)N * saved_per_token(&cfg, 0));
        be->alloc = cpu_alloc;
        be->destroy(be);
    }
}

/* The config at rel (a fixture path, mt_fixture_path's). */
static mt_config config_at(const char *rel) {
    char *path = mt_fixture_path(rel);
    mt_config cfg;
    assert_int_equal(mt_config_load(&cfg, path), MT_OK);
    free(path);
    return cfg;
}

/* The Gated DeltaNet's chunk states as the engine's calls take them: B rows of T tokens take
 * B x ceil(T / 64) states (mixer_deltanet.c), which mt_layer_ws_bytes_rows counts; the bound over
 * any row length (mt_layer_ws_bytes_tiled) counts 2 x ceil(N / 64). Nothing else differs, and a
 * model without DeltaNet layers counts no state either way. */
static void test_delta_states_by_rows(void **state) {
    (void)state;
    mt_config cfg = config_at("qwen3_5_dense/config.json");
    const size_t one = (size_t)cfg.lin_Hv * cfg.lin_Dk * cfg.lin_Dv * sizeof(float);
    const struct { int B, T; } shapes[] = {{2, 300}, {1, 64}, {4, 65}, {3, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int B = shapes[i].B, T = shapes[i].T, N = B * T;
        size_t rows = mt_layer_ws_bytes_rows(&cfg, MT_F32, B, T, 0);
        size_t bound = mt_layer_ws_bytes_tiled(&cfg, MT_F32, N, 0);
        /* rows under 64 tokens (3 x 1): the bound counted fewer states than the call takes */
        long long want = (2LL * ((N + 63) / 64) - (long long)B * ((T + 63) / 64)) * (long long)one;
        fprintf(stderr, "qwen3_5_dense B=%d T=%d: %zu bytes by rows, %zu bounded\n", B, T, rows, bound);
        assert_true((long long)bound - (long long)rows == want);
    }
    mt_config plain = mt_test_tiny_config("llama_bias");
    assert_int_equal(mt_layer_ws_bytes_rows(&plain, MT_F32, 2, 300, 0),
                     mt_layer_ws_bytes_tiled(&plain, MT_F32, 600, 0));
    /* tiled (the 27B shape, one row of 128k in chunks of 1024): one span's 16 chunk states, 127
     * saved span starts, the two gradients between spans and the conv's 3 context rows; the bound
     * counts 128 starts (N / span). The DeltaNet fields hold a span: the workspace drops by tens
     * of GiB from the untiled one. */
    cfg = config_at("../../configs/qwen3.5-27b.json");
    const size_t one27 = (size_t)cfg.lin_Hv * cfg.lin_Dk * cfg.lin_Dv * sizeof(float);
    size_t untiled = mt_layer_ws_bytes_rows(&cfg, MT_BF16, 1, 131072, 0);
    size_t tiled = mt_layer_ws_bytes_rows(&cfg, MT_BF16, 1, 131072, 1024);
    assert_int_equal(mt_layer_ws_bytes_tiled(&cfg, MT_BF16, 131072, 1024) - tiled, one27);
    fprintf(stderr, "qwen3.5-27b, 1 x 131072: workspace %.2f GiB untiled, %.2f GiB tiled at 1024\n",
            untiled / 1073741824.0, tiled / 1073741824.0);
    assert_true(untiled - tiled > (size_t)30 << 30);
}

/* configs/qwen2.5-7b.json at N = 512k tokens in bf16 (no q/k norm): the whole fields cost
 * 4 H*D + 4 G*D + C elements and 4 H bytes (lse) a token, the chunk rows 6F + 4C elements and 8
 * bytes (rstd1, rstd2) a token, `chunk` tokens' worth. */
static void test_qwen7b_long_context_bytes(void **state) {
    (void)state;
    mt_config cfg = config_at("../../configs/qwen2.5-7b.json");
    assert_false(cfg.qk_norm);
    const int N = 524288, chunks[] = {32768, 8192};
    size_t HD = (size_t)cfg.H * cfg.D, GD = (size_t)cfg.G * cfg.D;
    size_t whole = (4 * HD + 4 * GD + cfg.C) * 2 + 4 * (size_t)cfg.H;
    size_t per_chunk_row = (6 * (size_t)cfg.F + 4 * (size_t)cfg.C) * 2 + 8;
    size_t untiled = mt_layer_ws_bytes(&cfg, MT_BF16, N);
    assert_int_equal(untiled, (size_t)N * (whole + per_chunk_row));
    for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
        size_t tiled = mt_layer_ws_bytes_tiled(&cfg, MT_BF16, N, chunks[k]);
        fprintf(stderr, "qwen2.5-7b, N %d, bf16: layer workspace %.2f GiB untiled, %.2f GiB with "
                "chunk %d (%.2f GiB of it the attention's whole-N fields and h); saved internals "
                "%.2f -> %.2f GiB a layer\n", N, untiled / 1073741824.0, tiled / 1073741824.0,
                chunks[k], (double)N * whole / 1073741824.0,
                mt_layer_saved_bytes(&cfg, MT_BF16, N) / 1073741824.0,
                mt_layer_saved_bytes_tiled(&cfg, MT_BF16, N, chunks[k]) / 1073741824.0);
        assert_int_equal(tiled, (size_t)N * whole + (size_t)chunks[k] * per_chunk_row);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_variants_match_untiled),
        cmocka_unit_test(test_wider_layer_matches_untiled),
        cmocka_unit_test(test_gemma3_layer_matches_untiled),
        cmocka_unit_test(test_gemma4_layer_matches_untiled),
        cmocka_unit_test(test_deltanet_layer_matches_untiled),
        cmocka_unit_test(test_workspace_shrinks_with_chunk),
        cmocka_unit_test(test_qwen7b_long_context_bytes), cmocka_unit_test(test_delta_states_by_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
