/* `megatrain train --lora` and `plan --lora` on the lora_llama fixture: the flags' refusals (each a
 * one-line error naming the flag, exit 1, nothing trained), a run on each base format (--base-dtype
 * bf16, fp8, nf4: the quantized ones say so in the plan and move the loss a little, not a lot:
 * within 5% of bf16's final loss on this fixture), evaluation during a LoRA run against `megatrain
 * eval --adapter` of its checkpoint, the plan's lines, and the quantized base's cache on disk
 * (--base-cache), and on gpt-oss and Gemma 4 `info --lora`'s count and the refusal of the experts
 * and the router as targets; --base-dtype mxfp4 on the MXFP4 gpt-oss checkpoint (gpt_oss_mxfp4): the same step
 * lines and adapter bytes as --base-dtype bf16 (the experts' values are exact either way on the
 * CPU), with --base-cache too, its plan line, and its refusal on another family. The math of each
 * is checked elsewhere (test_train_torch: PEFT; test_lora_quant: the
 * quantized base bit for bit). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/run_compare.h"
#include "util/testutil.h"

#define OUT_SIZE (1 << 16)

static mt_cli_env g_env;
static char g_out[OUT_SIZE];

static int setup(void **state) {
    *state = &g_env; /* for mt_cli_env_teardown */
    return mt_cli_env_init(&g_env, "lora_llama");
}

/* train on the fixture into OUT with extra flags; the exit code */
static int train(const char *out, const char *extra) {
    return mt_cli_run(&g_env, g_out, sizeof g_out,
                      "train --model '%s/base' --data '%s/data.bin' --steps 6 --batch 4 --seq 48 "
                      "--warmup 1 --lr 1e-2 --device cpu --out %s %s",
                      g_env.fixture, g_env.fixture, out, extra);
}

static void refused(const char *extra, const char *needle) {
    mt_cli_expect(train("refused", extra), 1, g_out, needle);
    char first[1024];
    assert_int_equal(mt_cli_error_lines(g_out, first, sizeof first), 1);
    assert_null(strstr(g_out, "step 1/"));
}

static void test_refusals(void **state) {
    refused("--lora 0", "--lora");
    refused("--lora 4 --lora-dropout 0.1", "--lora-dropout 0.1: only 0 is supported yet");
    refused("--lora 4 --lora-targets lm_head", "no module of this llama model is named \"lm_head\"");
    refused("--lora 4 --lora-targets q_proj,,v_proj", "an empty module name");
    refused("--lora 4 --state tight", "--state with LoRA");
    refused("--base-dtype nf4", "--base-dtype need --lora R");
    refused("--lora 4 --base-dtype int4", "--base-dtype");
    refused("--lora-alpha 16", "need --lora R");
    char extra[4400];
    snprintf(extra, sizeof extra, "--lora 8 --adapter '%s/adapter_init'", g_env.fixture);
    refused(extra, "the adapter");
    snprintf(extra, sizeof extra, "--adapter '%s/nowhere'", g_env.fixture);
    refused(extra, "nowhere");
}

/* the final loss a run printed ("final loss X (step N)") */
static double final_loss(void) {
    const char *at = strstr(g_out, "final loss ");
    assert_non_null(at);
    return atof(at + strlen("final loss "));
}

static void test_base_formats(void **state) {
    static const char *const formats[] = {"bf16", "fp8", "nf4"};
    double loss[3];
    for (int i = 0; i < 3; i++) {
        char out[32], extra[64];
        snprintf(out, sizeof out, "run_%s", formats[i]);
        snprintf(extra, sizeof extra, "--lora 4 --base-dtype %s", formats[i]);
        mt_cli_expect(train(out, extra), 0, g_out, "LoRA: rank 4, alpha 8");
        if (i) {
            char want[64];
            snprintf(want, sizeof want, "quantized %s", formats[i]);
            assert_non_null(strstr(g_out, want));
        }
        assert_non_null(strstr(g_out, "a PEFT adapter: PeftModel.from_pretrained loads it"));
        loss[i] = final_loss();
    }
    for (int i = 1; i < 3; i++) {
        double rel = fabs(loss[i] - loss[0]) / loss[0];
        printf("  --base-dtype %s: final loss %.4f, bf16 %.4f (%.2f%%)\n", formats[i], loss[i], loss[0], 100 * rel);
        assert_true(loss[i] != loss[0] && rel < 0.05);
    }
}

/* The last "eval_loss" of a run's metrics.jsonl (full precision). */
static double last_eval(const char *out) {
    char path[4200], line[4096];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", g_env.tmp, out);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    double v = NAN;
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "\"eval_loss\": ");
        if (at) v = atof(at + strlen("\"eval_loss\": "));
    }
    fclose(f);
    return v;
}

/* Evaluation during a LoRA run (the engine's forward with the adapters) gives what `megatrain eval
 * --adapter` of the run's checkpoint gives on the same rows (1e-5: the engine computes the adapted
 * projections, eval the merged weights). */
static void test_eval(void **state) {
    char extra[4400];
    snprintf(extra, sizeof extra, "--lora 4 --eval-data '%s/data.bin' --eval-every 6 --eval-batches 1", g_env.fixture);
    mt_cli_expect(train("run_eval", extra), 0, g_out, "eval loss");
    double during = last_eval("run_eval");
    mt_cli_expect(mt_cli_run(&g_env, g_out, sizeof g_out,
                             "eval --model '%s/base' --adapter run_eval/checkpoints/step_00000006 --data "
                             "'%s/data.bin' --batch 4 --seq 48 --batches 1",
                             g_env.fixture, g_env.fixture),
                  0, g_out, "adapter run_eval/checkpoints/step_00000006: rank 4");
    const char *at = strstr(g_out, ": loss ");
    assert_non_null(at);
    double after = atof(at + strlen(": loss "));
    printf("  eval during the run %.6f, megatrain eval --adapter %.6f\n", during, after);
    assert_true(fabs(during - after) <= 1e-5 * after);
}

static void test_plan(void **state) {
    mt_cli_expect(mt_cli_run(&g_env, g_out, sizeof g_out,
                             "plan --init '%s/base/config.json' --batch 16 --seq 4096 --device cuda "
                             "--gpu-mem 139G --host-mem 116G --lora 16 --base-dtype nf4",
                             g_env.fixture),
                  0, g_out, "quantized nf4");
    assert_non_null(strstr(g_out, "LoRA: rank 16, alpha 32 (scale 2)"));
    assert_non_null(strstr(g_out, "fits"));
    mt_cli_expect(mt_cli_run(&g_env, g_out, sizeof g_out, "plan --init '%s/base/config.json' --base-dtype nf4",
                             g_env.fixture),
                  1, g_out, "need --lora R");
}

/* "largest base of this shape that fits": N layers in bf16 fit (the plan of that config exits 0),
 * N + 1 do not (exit 1); fp8 and nf4 hold at least as many layers as bf16 */
static void test_largest_base(void **state) {
    const char *flags = "--batch 16 --seq 4096 --device cuda --gpu-mem 79G --host-mem 40G --lora 16";
    mt_cli_expect(mt_cli_run(&g_env, g_out, sizeof g_out, "plan --init '%s/../../../bench/configs/llama-3.1-8b.json' %s",
                             g_env.fixture, flags),
                  0, g_out, "largest base of this shape that fits");
    const char *line = strstr(g_out, "largest base of this shape that fits");
    int n_bf16 = 0, n_fp8 = 0, n_nf4 = 0;
    const char *at = strstr(line, "bf16 ");
    assert_non_null(at);
    assert_int_equal(sscanf(at, "bf16 %d layers", &n_bf16), 1);
    assert_int_equal(sscanf(strstr(line, "fp8 "), "fp8 %d layers", &n_fp8), 1);
    assert_int_equal(sscanf(strstr(line, "nf4 "), "nf4 %d layers", &n_nf4), 1);
    printf("  largest 8B-shaped base in 40 GiB of host RAM: bf16 %d, fp8 %d, nf4 %d layers\n", n_bf16, n_fp8, n_nf4);
    assert_true(n_bf16 > 32 && n_fp8 >= n_bf16 && n_nf4 >= n_fp8); /* the 8B itself (32 layers) fits */
    for (int extra = 0; extra <= 1; extra++) {
        mt_test_sh("sed 's/\"num_hidden_layers\": *[0-9]*/\"num_hidden_layers\": %d/' "
                   "'%s/../../../bench/configs/llama-3.1-8b.json' > '%s/deep.json'",
                   n_bf16 + extra, g_env.fixture, g_env.tmp);
        mt_cli_expect(mt_cli_run(&g_env, g_out, sizeof g_out, "plan --init deep.json %s", flags), extra ? 1 : 0,
                      g_out, NULL);
    }
}

/* --base-cache: the first run quantizes the base and writes the cache, the second reads it (and not
 * the checkpoint's layers); both train bit for bit as a run without the cache. A damaged cache file
 * and one made before the model's files changed are named in a warning and rebuilt, never used. */
static int cache_run(const char *out, const char *extra) {
    return mt_cli_run(&g_env, g_out, sizeof g_out,
                      "train --model base_copy --data '%s/data.bin' --steps 4 --batch 4 --seq 48 --warmup 1 "
                      "--lr 1e-2 --device cpu --lora 4 --base-dtype nf4 --out %s %s",
                      g_env.fixture, out, extra);
}

static void same_adapter(const char *a, const char *b) {
    mt_test_sh("cd '%s' && cmp %s/checkpoints/step_00000004/adapter_model.safetensors "
               "%s/checkpoints/step_00000004/adapter_model.safetensors",
               g_env.tmp, a, b);
}

static void test_base_cache(void **state) {
    mt_test_sh("cp -r '%s/base' '%s/base_copy'", g_env.fixture, g_env.tmp);
    mt_cli_expect(cache_run("cache_none", ""), 0, g_out, "quantized nf4");
    assert_null(strstr(g_out, "base cache"));
    mt_cli_expect(cache_run("cache_first", "--base-cache qc"), 0, g_out, "written (");
    mt_cli_expect(cache_run("cache_second", "--base-cache qc"), 0, g_out, "read (");
    assert_non_null(strstr(g_out, "the checkpoint's quantized layers not read"));
    same_adapter("cache_none", "cache_first");
    same_adapter("cache_none", "cache_second");
    /* a byte of layer 0's blob flipped (its header is 4 KiB) */
    mt_test_sh("cd '%s' && printf '\\377' | dd of=\"$(ls qc/*.mtq)\" bs=1 seek=5000 conv=notrunc 2>/dev/null",
               g_env.tmp);
    mt_cli_expect(cache_run("cache_damaged", "--base-cache qc"), 0, g_out, "damaged (checksum); quantizing the checkpoint again");
    assert_non_null(strstr(g_out, "written ("));
    same_adapter("cache_none", "cache_damaged");
    mt_cli_expect(cache_run("cache_again", "--base-cache qc"), 0, g_out, "read (");
    /* the model's weights file replaced (here: its modification time) */
    mt_test_sh("touch -d '2001-01-01 00:00' '%s/base_copy/model.safetensors'", g_env.tmp);
    mt_cli_expect(cache_run("cache_changed", "--base-cache qc"), 0, g_out, "made from another model");
    assert_non_null(strstr(g_out, "written ("));
    same_adapter("cache_none", "cache_changed");
    mt_test_sh("test $(ls '%s/qc' | wc -l) -eq 1", g_env.tmp); /* one file a model and format */
    refused("--lora 4 --base-cache qc", "--base-cache keeps a quantized base on disk: it needs --base-dtype");
    mt_cli_expect(mt_cli_run(&g_env, g_out, sizeof g_out,
                             "train --init '%s/base/config.json' --data '%s/data.bin' --steps 1 --batch 4 --seq 48 "
                             "--device cpu --lora 4 --base-dtype nf4 --base-cache qc --out cache_init",
                             g_env.fixture, g_env.fixture),
                  1, g_out, "--base-cache needs --model DIR");
}

/* gpt-oss (the lora_gpt_oss fixture's base): `info --lora` counts what PEFT trains there (the default
 * list resolves to the attention projections: 2560, as PEFT's get_nb_trainable_parameters; with the
 * experts' gate_up_proj and down_proj, PEFT's target_parameters, 5376 as PEFT counts
 * lora_gpt_oss_experts), and a target naming the experts' module, the dense MLP's names or the router
 * is refused in one line saying what is supported; fused experts on another family are refused. */
static void test_gpt_oss(void **state) {
    mt_cli_expect(mt_cli_run(&g_env, g_out, sizeof g_out, "info --model '%s/../lora_gpt_oss/base' --lora 4",
                             g_env.fixture),
                  0, g_out, "lora: rank 4 on 8 modules (q_proj,k_proj,v_proj,o_proj): 2560 trainable parameters");
    mt_cli_expect(mt_cli_run(&g_env, g_out, sizeof g_out,
                             "info --model '%s/../lora_gpt_oss/base' --lora 4 --lora-targets "
                             "q_proj,k_proj,v_proj,o_proj,mlp.experts.gate_up_proj,down_proj", g_env.fixture),
                  0, g_out, "lora: rank 4 on 12 modules (q_proj,k_proj,v_proj,o_proj,gate_up_proj,down_proj): "
                            "5376 trainable parameters");
    mt_cli_expect(mt_cli_run(&g_env, g_out, sizeof g_out,
                             "info --model '%s/../lora_qwen3_moe/base' --lora 4 --lora-targets q_proj,gate_up_proj",
                             g_env.fixture),
                  1, g_out, "is supported on gpt_oss only, not qwen3_moe");
    static const char *const refusals[][2] = {
        {"q_proj,v_proj,gate_proj", "gpt_oss's MLP is only its experts"},
        {"experts", "gpt_oss's MLP is only its experts"},
        {"router", "gpt_oss's router (mlp.router) is not a Linear module"},
    };
    for (int i = 0; i < 3; i++) {
        mt_cli_expect(mt_cli_run(&g_env, g_out, sizeof g_out,
                                 "train --model '%s/../lora_gpt_oss/base' --data '%s/../lora_gpt_oss/data.bin' "
                                 "--steps 2 --batch 4 --seq 24 --device cpu --out gpt_oss_refused --lora 4 "
                                 "--lora-targets %s",
                                 g_env.fixture, g_env.fixture, refusals[i][0]),
                      1, g_out, refusals[i][1]);
        char first[1024];
        assert_int_equal(mt_cli_error_lines(g_out, first, sizeof first), 1);
        assert_non_null(strstr(first, "LoRA on gpt_oss adapts the attention projections "
                                      "(q_proj,k_proj,v_proj,o_proj) and the experts (gate_up_proj,down_proj)"));
        assert_null(strstr(g_out, "step 1/"));
    }
}

/* Gemma 4 (the lora_gemma4 and lora_gemma4_moe fixtures' bases): `info --lora` counts what PEFT
 * trains there (every projection, v_proj only on the sliding layers, the dense MLP beside the
 * experts: 5184 and 3840, as PEFT's get_nb_trainable_parameters), and on the MoE model a target
 * naming the router or the experts is refused in one line saying what is supported. */
static void test_gemma4(void **state) {
    static const char *const counts[][2] = {
        {"lora_gemma4", "lora: rank 4 on 26 modules (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj): "
                        "5184 trainable parameters"},
        {"lora_gemma4_moe", "lora: rank 4 on 20 modules (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj): "
                            "3840 trainable parameters"},
    };
    for (int i = 0; i < 2; i++)
        mt_cli_expect(mt_cli_run(&g_env, g_out, sizeof g_out, "info --model '%s/../%s/base' --lora 4",
                                 g_env.fixture, counts[i][0]),
                      0, g_out, counts[i][1]);
    static const char *const refusals[][2] = {
        {"q_proj,router", "the router of gemma4's MoE block (router.proj) stays frozen"},
        {"proj", "the router of gemma4's MoE block (router.proj) stays frozen"},
        {"experts", "gemma4's experts are fused 3-D parameters"},
    };
    for (int i = 0; i < 3; i++) {
        mt_cli_expect(mt_cli_run(&g_env, g_out, sizeof g_out,
                                 "train --model '%s/../lora_gemma4_moe/base' --data '%s/../lora_gemma4_moe/data.bin' "
                                 "--steps 2 --batch 4 --seq 24 --device cpu --out gemma4_refused --lora 4 "
                                 "--lora-targets %s",
                                 g_env.fixture, g_env.fixture, refusals[i][0]),
                      1, g_out, refusals[i][1]);
        char first[1024];
        assert_int_equal(mt_cli_error_lines(g_out, first, sizeof first), 1);
        assert_non_null(strstr(first, "LoRA on gemma4 adapts the attention and the dense MLP: "
                                      "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"));
        assert_null(strstr(g_out, "step 1/"));
    }
}

/* --base-dtype mxfp4 on the MXFP4 gpt-oss fixture: the checkpoint's experts kept as they are, and
 * the run's step lines (as printed, full precision) and adapter the bytes of a bf16 base's run;
 * the base cache (format mxfp4 in its name) read back gives them too. */
static int oss_run(const char *out, const char *extra) {
    return mt_cli_run(&g_env, g_out, sizeof g_out,
                      "train --model '%s/../gpt_oss_mxfp4' --data '%s/../lora_gpt_oss/data.bin' --steps 4 --batch 2 "
                      "--seq 24 --warmup 1 --lr 1e-2 --device cpu --lora 4 --out %s %s",
                      g_env.fixture, g_env.fixture, out, extra);
}

static void same_steps(const char *a, const char *b) {
    char pa[4200], pb[4200], ta[8][256], tb[8][256];
    double la[8], na[8], lb[8], nb[8];
    snprintf(pa, sizeof pa, "%s/%s/metrics.jsonl", g_env.tmp, a);
    snprintf(pb, sizeof pb, "%s/%s/metrics.jsonl", g_env.tmp, b);
    int n = mt_test_read_step_metrics(pa, 8, la, na, ta);
    assert_int_equal(n, 4);
    assert_int_equal(mt_test_read_step_metrics(pb, 8, lb, nb, tb), n);
    for (int i = 0; i < n; i++)
        if (strcmp(ta[i], tb[i]) != 0) fail_msg("step %d: %s: %s, %s: %s", i + 1, a, ta[i], b, tb[i]);
}

static void test_gpt_oss_mxfp4(void **state) {
    mt_cli_expect(oss_run("oss_bf16", "--base-dtype bf16"), 0, g_out, "experts loaded from MXFP4 (dequantized)");
    assert_non_null(strstr(g_out, "--base-dtype mxfp4 keeps them in MXFP4"));
    mt_cli_expect(oss_run("oss_mxfp4", "--base-dtype mxfp4"), 0, g_out, "experts kept in MXFP4 in the frozen base");
    assert_non_null(strstr(g_out, "quantized mxfp4"));
    same_steps("oss_bf16", "oss_mxfp4");
    same_adapter("oss_bf16", "oss_mxfp4");
    /* adapters on the experts over the MXFP4 experts: the bf16 base's run too (the MXFP4 values
     * dequantize exactly on the CPU) */
    const char *experts = "--lora-targets q_proj,k_proj,v_proj,o_proj,gate_up_proj,down_proj";
    char extra[256];
    snprintf(extra, sizeof extra, "--base-dtype bf16 %s", experts);
    mt_cli_expect(oss_run("oss_bf16_experts", extra), 0, g_out, "gate_up_proj,down_proj)");
    snprintf(extra, sizeof extra, "--base-dtype mxfp4 %s", experts);
    mt_cli_expect(oss_run("oss_mxfp4_experts", extra), 0, g_out, "experts kept in MXFP4 in the frozen base");
    same_steps("oss_bf16_experts", "oss_mxfp4_experts");
    same_adapter("oss_bf16_experts", "oss_mxfp4_experts");
    mt_cli_expect(oss_run("oss_cache1", "--base-dtype mxfp4 --base-cache oq"), 0, g_out, "written (");
    mt_cli_expect(oss_run("oss_cache2", "--base-dtype mxfp4 --base-cache oq"), 0, g_out, "read (");
    mt_test_sh("ls '%s/oq/' | grep -q '^gpt_oss_mxfp4\\.mxfp4\\..*\\.mtq$'", g_env.tmp);
    same_adapter("oss_bf16", "oss_cache1");
    same_adapter("oss_bf16", "oss_cache2");
    /* the plan says so, and counts the format among the largest bases */
    mt_cli_expect(mt_cli_run(&g_env, g_out, sizeof g_out,
                             "plan --model '%s/../gpt_oss_mxfp4' --batch 2 --seq 24 --device cuda --gpu-mem 8G "
                             "--host-mem 8G --lora 4 --base-dtype mxfp4", g_env.fixture),
                  0, g_out, "quantized mxfp4");
    assert_non_null(strstr(strstr(g_out, "largest base of this shape that fits"), ", mxfp4 "));
    mt_cli_expect(mt_cli_run(&g_env, g_out, sizeof g_out, "info --model '%s/../gpt_oss_mxfp4'", g_env.fixture), 0,
                  g_out, "--base-dtype mxfp4");
    /* another family: refused by name, in one line */
    refused("--lora 4 --base-dtype mxfp4", "--base-dtype mxfp4: only gpt_oss models hold MXFP4 experts, and this is a llama model");
    mt_cli_expect(mt_cli_run(&g_env, g_out, sizeof g_out, "plan --init '%s/base/config.json' --lora 4 --base-dtype mxfp4",
                             g_env.fixture),
                  1, g_out, "only gpt_oss models hold MXFP4 experts");
    assert_null(strstr(g_out, ", mxfp4 ")); /* nor counted among a llama's largest bases */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_base_formats),
        cmocka_unit_test(test_eval),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_largest_base),
        cmocka_unit_test(test_base_cache),
        cmocka_unit_test(test_gpt_oss),
        cmocka_unit_test(test_gemma4),
        cmocka_unit_test(test_gpt_oss_mxfp4),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
