/* LoRA on a quantized frozen base (engine/quant_base.h, --base-dtype fp8|nf4) is LoRA on the base
 * whose quantized tensors hold their quantization's round trip: on the CPU backend (fp32) the
 * engine dequantizes each layer into its slot before its GEMMs, so the two runs compute with the
 * same floats and must agree bit for bit: every step's loss and gradient norm, and the adapters
 * after the steps. The round trip is made here with quant/nf4.h and quant/fp8.h over each tensor's
 * numel rounded up to 128 (zeros past it), as quant_base.h says. Also: the state io gives the
 * dequantized values back; the GPU tier's layers (bf16, in the training state) and the embed and
 * head groups are not quantized; the engine's host state holds only the embed and head groups;
 * what the plan counts for the blobs is mt_quant_base_bytes. Models: the lora_llama base (dense,
 * GQA) and qwen3_5_moe (Gated DeltaNet and gated attention, experts and a shared expert:
 * the experts quantized, the router and the shared expert's gate kept), and for mxfp4 the
 * gpt_oss_mxfp4 fixture's config (its fused experts quantized, quant/mxfp4.h, and nothing else:
 * attention, biases, sinks and the router kept), with a GPU-tier layer too. mxfp4 is refused by
 * name for other families and for experts whose input dimension is no multiple of 32.
 * From an MXFP4 checkpoint (tests/fixtures/gpt_oss_mxfp4, transformers' format) the mxfp4 base
 * holds the checkpoint's blocks and scales byte for byte at the offsets quant_base.h's layout
 * gives, and LoRA on it is bit for bit LoRA on the bf16 base loaded (dequantized) from the same
 * checkpoint: the dequantized values are exact in fp32, the CPU computes in fp32. So is an mxfp4
 * base quantized from the dequantized fp32 values (MXFP4 values requantize to themselves). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/quant_base.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "model/lora.h"
#include "util/lora_run.h"
#include "util/testutil.h"

#define B_ROWS MT_TEST_LORA_B
#define T_LEN MT_TEST_LORA_T
#define STEPS MT_TEST_LORA_STEPS

static mt_config fixture_config(const char *rel) {
    char *path = mt_fixture_path(rel);
    mt_config cfg;
    if (mt_config_load(&cfg, path) != MT_OK) fail_msg("%s: %s", path, mt_error_message());
    free(path);
    return cfg;
}

static void check_model(const char *config, mt_base_format f, int gpu_layers) {
    mt_config cfg = fixture_config(config);
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    mt_lora_table lt;
    mt_lora_opts lo = {.rank = 4};
    assert_int_equal(mt_lora_table_init(&lt, &t, &lo), MT_OK);
    t.cfg.lora_rank = lt.rank;
    float *w = mt_aligned_alloc((size_t)t.total * sizeof(float));
    mt_param_init(&t, w, 0.3f, 3);
    /* the reference base: each quantized tensor of a streamed layer replaced by its round trip */
    int quantized, kept;
    float *ref = mt_test_quant_reference(&t, w, f, gpu_layers, &quantized, &kept);
    assert_true(quantized > 0 && kept > 0);
    int N = B_ROWS * T_LEN;
    int32_t *ids = malloc((size_t)N * sizeof(int32_t)), *tg = malloc((size_t)N * sizeof(int32_t));
    for (int i = 0; i < N; i++) ids[i] = (i * 31 + 7) % t.cfg.V, tg[i] = (i * 17 + 3) % t.cfg.V;
    float *back = mt_aligned_alloc((size_t)t.total * sizeof(float));
    mt_backend *be = mt_backend_cpu_create();
    mt_test_lora_result q = mt_test_lora_run(be, &t, &lt, w, f, gpu_layers, ids, tg, back);
    mt_test_lora_result r = mt_test_lora_run(be, &t, &lt, ref, MT_BASE_BF16, gpu_layers, ids, tg, NULL);
    for (int s = 0; s < STEPS; s++) {
        if (q.loss[s] != r.loss[s] || q.norm[s] != r.norm[s])
            fail_msg("%s %s step %d: loss %.9g vs %.9g, norm %.9g vs %.9g", config, mt_base_format_name(f),
                     s + 1, q.loss[s], r.loss[s], q.norm[s], r.norm[s]);
    }
    assert_memory_equal(q.adapters, r.adapters, (size_t)lt.total * sizeof(float));
    /* sparse checkpoints (odd layers' inputs remade in the backward through the quantized base's
     * loads): the same bits */
    mt_test_lora_checkpoint_every = 2;
    mt_test_lora_result sp = mt_test_lora_run(be, &t, &lt, w, f, gpu_layers, ids, tg, NULL);
    mt_test_lora_checkpoint_every = 0;
    for (int s = 0; s < STEPS; s++) assert_true(sp.loss[s] == q.loss[s] && sp.norm[s] == q.norm[s]);
    assert_memory_equal(sp.adapters, q.adapters, (size_t)lt.total * sizeof(float));
    free(sp.adapters);
    /* the quantization moved the loss, or the test would prove nothing */
    mt_test_lora_result plain = mt_test_lora_run(be, &t, &lt, w, MT_BASE_BF16, gpu_layers, ids, tg, NULL);
    be->destroy(be);
    assert_true(plain.loss[0] != q.loss[0]);
    for (int i = 0; i < t.n_params; i++) /* io: the dequantized values, the rest as set */
        assert_memory_equal(back + t.params[i].offset, ref + t.params[i].offset,
                            (size_t)t.params[i].numel * sizeof(float));
    mt_engine_opts o = {.batch = B_ROWS, .micro_batch = 1, .T = T_LEN, .n_slots = 2, .lora = &lt,
                        .base_format = f, .gpu_layers = gpu_layers};
    mt_engine_plan plan;
    mt_engine_plan_of(&t, MT_F32, &o, &plan);
    assert_true(plan.base_quant == mt_quant_base_bytes(&t, f, gpu_layers, NULL) && plan.base_quant > 0);
    printf("  %s %s (tier %d): %d tensors quantized, %d kept; %d steps bit for bit; loss %.6f (bf16 "
           "base %.6f); blobs %.0f bytes\n", config, mt_base_format_name(f), gpu_layers, quantized, kept,
           STEPS, q.loss[0], plain.loss[0], plan.base_quant);
    free(q.adapters), free(r.adapters), free(plain.adapters);
    free(ids), free(tg), free(w), free(ref), free(back);
    mt_lora_table_free(&lt);
    mt_param_table_free(&t);
}

static void test_llama(void **state) {
    check_model("lora_llama/base/config.json", MT_BASE_NF4, 0);
    check_model("lora_llama/base/config.json", MT_BASE_FP8, 0);
    check_model("lora_llama/base/config.json", MT_BASE_NF4, 1); /* layer 0 in the GPU tier */
}

static void test_qwen3_5_moe(void **state) {
    check_model("qwen3_5_moe/config.json", MT_BASE_NF4, 0);
    check_model("qwen3_5_moe/config.json", MT_BASE_FP8, 0);
}

static void test_gpt_oss_mxfp4(void **state) {
    check_model("gpt_oss_mxfp4/config.json", MT_BASE_MXFP4, 0);
    check_model("gpt_oss_mxfp4/config.json", MT_BASE_MXFP4, 1); /* layer 0 in the GPU tier */
    check_model("gpt_oss_mxfp4/config.json", MT_BASE_NF4, 0);   /* there: attention alone */
}

/* The engine's weights from the fixture's checkpoint as `megatrain train` loads them (cli/
 * cached_base.c, mt_base_weights_load): fp32 tensors through the state io, MXFP4 pairs offered to
 * the quantized base first. */
typedef struct {
    const mt_param_table *t;
    const char *dir;
    mt_engine *e;
    const mt_state_io *io;
    int taken; /* pairs the base took as they are */
} checkpoint_load;
static int sink_f32(void *ctx, const mt_param *p, const float *w) {
    const checkpoint_load *c = ctx;
    return c->io->set_weights(c->io->ctx, p, w);
}
static int sink_mxfp4(void *ctx, const mt_param *p, const uint8_t *blocks, const uint8_t *scales) {
    checkpoint_load *c = ctx;
    int took = mt_quant_base_take_mxfp4(mt_engine_quant_base(c->e), p, blocks, scales);
    c->taken += took == 1;
    return took;
}
static int load_checkpoint(mt_engine *e, void *ctx) {
    checkpoint_load *c = ctx;
    c->e = e, c->io = mt_engine_state_io(e), c->taken = 0;
    return mt_model_load_tensors_mxfp4(c->t, c->dir, NULL, sink_f32, sink_mxfp4, c);
}

/* Layer l's blob bytes of tensor p's codes and scales, at the offsets quant_base.h's layout says
 * (the layer's tensors in table order, each segment 256-aligned: fp32 values, or an mxfp4 tensor's
 * numel / 2 code bytes then numel / 32 scales), found here without the base's own bookkeeping. */
static void mxfp4_offsets(const mt_param_table *t, const mt_param *p, size_t *codes, size_t *scales) {
    size_t at = 0;
    for (int i = t->layer_first[p->layer]; i < t->layer_first[p->layer + 1]; i++) {
        const mt_param *x = &t->params[i];
        if (x == p) *codes = at;
        if (mt_quant_base_quantizes(MT_BASE_MXFP4, x)) {
            at = (at + (size_t)x->numel / 2 + 255) / 256 * 256;
            if (x == p) *scales = at;
            at = (at + (size_t)x->numel / 32 + 255) / 256 * 256;
        } else {
            at = (at + (size_t)x->numel * 4 + 255) / 256 * 256;
        }
    }
}

static void test_gpt_oss_checkpoint(void **state) {
    char *dir = mt_fixture_path("gpt_oss_mxfp4");
    mt_config cfg = fixture_config("gpt_oss_mxfp4/config.json");
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    mt_lora_table lt;
    mt_lora_opts lo = {.rank = 4};
    assert_int_equal(mt_lora_table_init(&lt, &t, &lo), MT_OK);
    t.cfg.lora_rank = lt.rank;
    float *w = mt_aligned_alloc((size_t)t.total * sizeof(float)), *back = mt_aligned_alloc((size_t)t.total * sizeof(float));
    assert_int_equal(mt_model_load(&t, w, dir), MT_OK); /* the dequantized checkpoint, fp32 */
    int N = B_ROWS * T_LEN;
    int32_t *ids = malloc((size_t)N * sizeof(int32_t)), *tg = malloc((size_t)N * sizeof(int32_t));
    for (int i = 0; i < N; i++) ids[i] = (i * 31 + 7) % t.cfg.V, tg[i] = (i * 17 + 3) % t.cfg.V;
    mt_backend *be = mt_backend_cpu_create();
    mt_test_lora_result r = mt_test_lora_run(be, &t, &lt, w, MT_BASE_BF16, 0, ids, tg, NULL);

    /* the blob: the checkpoint's bytes (an engine whose base stays for the comparison) */
    checkpoint_load c = {&t, dir};
    mt_engine_opts o = {.batch = B_ROWS, .micro_batch = 1, .T = T_LEN, .n_slots = 2, .opt_threads = 1,
                        .lora = &lt, .base_format = MT_BASE_MXFP4, .seed = 9};
    mt_engine *e = mt_engine_create(&t, be, &o, NULL);
    assert_int_equal(load_checkpoint(e, &c), MT_OK);
    assert_int_equal(c.taken, 2 * t.cfg.L);
    mt_safetensors *st;
    assert_int_equal(mt_safetensors_open_dir(&st, dir), MT_OK);
    const mt_quant_base *q = mt_engine_quant_base(e);
    size_t compared = 0;
    for (int i = 0; i < t.n_params; i++) {
        const mt_param *p = &t.params[i];
        if (!mt_quant_base_quantizes(MT_BASE_MXFP4, p)) continue;
        char name[256];
        size_t codes = 0, scales = 0, bytes = mt_quant_base_blob_bytes(q, p->layer);
        mxfp4_offsets(&t, p, &codes, &scales);
        uint8_t *blob = malloc(bytes);
        mt_quant_base_blob_fetch(q, p->layer, blob);
        snprintf(name, sizeof name, "%s_blocks", p->name);
        const mt_st_tensor *b = mt_safetensors_find(st, name);
        snprintf(name, sizeof name, "%s_scales", p->name);
        const mt_st_tensor *sc = mt_safetensors_find(st, name);
        assert_non_null(b), assert_non_null(sc);
        assert_true(b->nbytes == (size_t)p->numel / 2 && sc->nbytes == (size_t)p->numel / 32);
        assert_true(scales + sc->nbytes <= bytes);
        assert_memory_equal(blob + codes, b->data, b->nbytes);
        assert_memory_equal(blob + scales, sc->data, sc->nbytes);
        compared += b->nbytes + sc->nbytes;
        free(blob);
    }
    mt_safetensors_close(st);
    mt_engine_destroy(e);
    printf("  gpt_oss_mxfp4 checkpoint: the blobs hold its %d MXFP4 pairs byte for byte (%zu bytes)\n", c.taken,
           compared);

    /* LoRA on it: bit for bit LoRA on the bf16 base of the dequantized checkpoint */
    for (int tier = 0; tier <= 1; tier++) { /* tier 1: layer 0 dequantized into the GPU tier */
        mt_test_lora_result m = mt_test_lora_run_loaded(be, &t, &lt, load_checkpoint, &c, MT_BASE_MXFP4, tier,
                                                        ids, tg, back);
        assert_int_equal(c.taken, 2 * (t.cfg.L - tier));
        /* quantized from the fp32 values instead (the path of a bf16 checkpoint): the same values */
        mt_test_lora_result f = mt_test_lora_run(be, &t, &lt, w, MT_BASE_MXFP4, tier, ids, tg, NULL);
        mt_test_lora_result b0 = tier ? mt_test_lora_run(be, &t, &lt, w, MT_BASE_BF16, tier, ids, tg, NULL) : r;
        for (int s = 0; s < STEPS; s++)
            if (m.loss[s] != b0.loss[s] || m.norm[s] != b0.norm[s] || f.loss[s] != b0.loss[s] || f.norm[s] != b0.norm[s])
                fail_msg("gpt_oss_mxfp4 (tier %d) step %d: loss %.9g (requantized %.9g) vs bf16 base %.9g, norm %.9g "
                         "(%.9g) vs %.9g", tier, s + 1, m.loss[s], f.loss[s], b0.loss[s], m.norm[s], f.norm[s], b0.norm[s]);
        assert_memory_equal(m.adapters, b0.adapters, (size_t)lt.total * sizeof(float));
        assert_memory_equal(f.adapters, b0.adapters, (size_t)lt.total * sizeof(float));
        assert_memory_equal(back, w, (size_t)t.total * sizeof(float)); /* io: the dequantized checkpoint */
        printf("  gpt_oss_mxfp4 checkpoint (tier %d): %d MXFP4 pairs taken as they are; %d steps bit for bit the "
               "bf16 base's, and the requantized base's (loss %.6f)\n", tier, c.taken, STEPS, m.loss[0]);
        free(m.adapters), free(f.adapters);
        if (tier) free(b0.adapters);
    }
    be->destroy(be);
    free(r.adapters);
    free(ids), free(tg), free(w), free(back), free(dir);
    mt_lora_table_free(&lt);
    mt_param_table_free(&t);
}

static void test_parse(void **state) {
    mt_base_format f;
    assert_int_equal(mt_base_format_parse("nf4", &f), MT_OK);
    assert_int_equal(f, MT_BASE_NF4);
    assert_int_equal(mt_base_format_parse("mxfp4", &f), MT_OK);
    assert_int_equal(f, MT_BASE_MXFP4);
    assert_int_equal(mt_base_format_parse("int4", &f), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "expected bf16, fp8, nf4 or mxfp4"));
    /* mxfp4: gpt-oss alone, with input dimensions of whole blocks */
    mt_config llama = fixture_config("lora_llama/base/config.json"),
              oss = fixture_config("gpt_oss_mxfp4/config.json"),
              narrow = fixture_config("lora_gpt_oss/base/config.json"); /* intermediate_size 8 */
    assert_int_equal(mt_base_format_check(&llama, MT_BASE_NF4), MT_OK);
    assert_int_equal(mt_base_format_check(&oss, MT_BASE_MXFP4), MT_OK);
    assert_int_equal(mt_base_format_check(&llama, MT_BASE_MXFP4), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "--base-dtype mxfp4: only gpt_oss models hold MXFP4 experts, and this is a llama model"));
    assert_int_equal(mt_base_format_check(&narrow, MT_BASE_MXFP4), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "intermediate_size 8) must be multiples of 32"));
    /* what each format quantizes of a gpt-oss layer */
    mt_param_table t;
    mt_param_table_init(&t, &oss);
    int n_mx = 0, n_nf4 = 0;
    for (int i = 0; i < t.n_params; i++) {
        const mt_param *p = &t.params[i];
        if (p->layer < 0 || p->layer >= t.cfg.L) continue; /* the embed and head groups: not held */
        int mx = mt_quant_base_quantizes(MT_BASE_MXFP4, p);
        assert_int_equal(mx, p->kind == MT_W_EXP_GATE_UP || p->kind == MT_W_EXP_DOWN_IO);
        n_mx += mx;
        n_nf4 += mt_quant_base_quantizes(MT_BASE_NF4, p);
        assert_false(mx && mt_quant_base_quantizes(MT_BASE_NF4, p)); /* nf4: 2-D only */
    }
    assert_int_equal(n_mx, 2 * t.cfg.L);
    assert_int_equal(n_nf4, 4 * t.cfg.L); /* q, k, v, o */
    /* bytes: an expert tensor's codes (numel / 2) and scales (numel / 32), each segment 256-aligned */
    double bytes = mt_quant_base_bytes(&t, MT_BASE_MXFP4, 0, NULL), want = 0;
    for (int i = 0; i < t.n_params; i++) {
        const mt_param *p = &t.params[i];
        if (p->layer < 0 || p->layer >= t.cfg.L) continue;
        if (mt_quant_base_quantizes(MT_BASE_MXFP4, p))
            want += (double)((p->numel / 2 + 255) / 256 * 256 + (p->numel / 32 + 255) / 256 * 256);
        else
            want += (double)((p->numel * 4 + 255) / 256 * 256);
    }
    assert_true(bytes == want);
    mt_param_table_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_qwen3_5_moe),
        cmocka_unit_test(test_gpt_oss_mxfp4),
        cmocka_unit_test(test_gpt_oss_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
