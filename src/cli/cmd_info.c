/* megatrain info: what a model is and what training it will hold in memory. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "../core/error.h"
#include "../engine/planner.h"
#include "../io/hf_layout.h"
#include "../model/lora.h"
#include "args.h"
#include "commands.h"
#include "model_source.h"


static void print_usage(FILE *out) {
    fprintf(out,
            "usage: megatrain info (--model DIR|ORG/NAME | --init CONFIG.json) [--tensors]\n"
            "                      [--lora R [--lora-targets NAMES]]\n"
            "  Prints the model's shape, parameter count and the host memory training needs.\n"
            "  --model DIR         Hugging Face directory (config.json + safetensors); weights are\n"
            "                      validated but not kept; a multimodal checkpoint's tensors outside\n"
            "                      the language model (vision, mtp) are counted as carried\n"
            "  --init CONFIG.json  a config.json alone\n"
            "  --tensors           list every tensor: name, shape, owning layer\n"
            "  --lora R            count the parameters rank-R LoRA adapters train, as PEFT counts\n"
            "                      them (r x (in + out) a module)\n"
            "  --lora-targets L    PEFT's target_modules, comma-separated (default: every linear\n"
            "                      projection of attention, the Gated DeltaNet and the MLPs, shared\n"
            "                      experts included; not the router, the experts or the LM head: on\n"
            "                      gpt_oss the attention's q_proj, k_proj, v_proj, o_proj; name\n"
            "                      gate_up_proj and down_proj there to adapt its experts too, PEFT's\n"
            "                      target_parameters)\n"
            "  --model ORG/NAME [--revision R]: a model in the Hugging Face hub cache, offline\n"
            "  ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub; R: ref or commit,\n"
            "  default main)\n");
}

/* The mixers of a hybrid model: how many of each and the shortest repeating pattern of
 * layer_types, e.g. "[linear, linear, linear, full] x 16". */
static void print_layer_types(const mt_config *cfg) {
    int period = cfg->L;
    for (int p = 1; p < cfg->L; p++) {
        if (cfg->L % p) continue;
        int same = 1;
        for (int l = p; same && l < cfg->L; l++)
            same = mt_config_layer_mixer(cfg, l) == mt_config_layer_mixer(cfg, l - p);
        if (same) { period = p; break; }
    }
    printf("layer types: %d %s (linear_attention), %d %s (full_attention); [",
           mt_config_mixer_layers(cfg, MT_MIXER_GATED_DELTANET), mt_mixer_name(MT_MIXER_GATED_DELTANET),
           mt_config_mixer_layers(cfg, MT_MIXER_ATTENTION), mt_mixer_name(MT_MIXER_ATTENTION));
    for (int l = 0; l < period && l < 16; l++)
        printf("%s%s", l ? ", " : "", mt_config_layer_mixer(cfg, l) == MT_MIXER_GATED_DELTANET ? "linear" : "full");
    printf("%s] x %d\n", period > 16 ? ", ..." : "", cfg->L / period);
    printf("gated deltanet: %d key heads x %d, %d value heads x %d, conv kernel %d; attention: "
           "output gate, RoPE on %d of %d dims; norms (1 + w)\n", cfg->lin_Hk, cfg->lin_Dk,
           cfg->lin_Hv, cfg->lin_Dv, cfg->lin_K, mt_config_rotary_dim(cfg), cfg->D);
}

/* Which layers slide (their window) and which attend to the whole row: the first 16 listed. */
static void print_sliding_layers(const mt_config *cfg) {
    int sliding = 0;
    for (int l = 0; l < cfg->L; l++) sliding += mt_config_layer_window(cfg, l) > 0;
    printf("layer types: %d sliding_attention (window %d keys), %d full_attention; [", sliding,
           cfg->attn_window, cfg->L - sliding);
    for (int l = 0; l < cfg->L && l < 16; l++)
        printf("%s%s", l ? ", " : "", mt_config_layer_window(cfg, l) > 0 ? "sliding" : "full");
    printf("%s]\n", cfg->L > 16 ? ", ..." : "");
}

/* gpt-oss: which layers slide (their window) and which attend to the whole row, the sinks, YaRN
 * and the experts' SwiGLU. */
static void print_gpt_oss(const mt_config *cfg) {
    print_sliding_layers(cfg);
    printf("attention: a learned sink per head; rope: yarn factor %g, original %d, beta %g/%g%s, "
           "cos/sin x %.6g; experts: clamped SwiGLU (alpha %g, limit %g), biases\n", cfg->rope_factor,
           cfg->rope_original_max_pos, cfg->rope_beta_fast, cfg->rope_beta_slow,
           cfg->rope_truncate ? ", truncated" : "", mt_config_rope_attention_scaling(cfg),
           cfg->swiglu_alpha, cfg->swiglu_limit);
}

/* gemma3: which layers slide (their window) and their RoPE, the full layers' RoPE, the scores'
 * scale, the sandwich norms, GeGLU and the scaled embedding. */
static void print_gemma3(const mt_config *cfg) {
    print_sliding_layers(cfg);
    printf("rope: full layers theta %g%s, sliding layers theta %g; scores x query_pre_attn_scalar^-0.5 "
           "(%d); norms (1 + w), sandwich; MLP GeGLU (gelu_pytorch_tanh); embedding x sqrt(%d)%s\n",
           cfg->rope_theta, cfg->rope_type == MT_ROPE_LINEAR ? ", linear scaling" : "",
           cfg->rope_local_theta, cfg->query_pre_attn_scalar, cfg->C,
           cfg->embed_pad_no_grad ? ", pad row frozen in the lookup" : "");
    if (cfg->rope_type == MT_ROPE_LINEAR)
        printf("rope scaling: linear factor %g (full layers only)\n", cfg->rope_factor);
}

/* gemma4: which layers slide (their window), the full layers' own shape and RoPE, the values'
 * norm, the unscaled scores, the norms, GeGLU, the scaled embedding, the per-layer scalar and the
 * logits' soft-cap. */
static void print_gemma4(const mt_config *cfg) {
    print_sliding_layers(cfg);
    printf("full layers: head dim %d, kv heads %d%s; rope: full layers theta %g, ", cfg->global_D,
           cfg->global_G, cfg->k_eq_v ? ", values = keys (no v_proj)" : "", cfg->rope_theta);
    if (cfg->rope_type == MT_ROPE_PROPORTIONAL)
        printf("proportional (%d of %d frequencies rotate%s)", (int)(cfg->rope_partial * cfg->global_D / 2),
               cfg->global_D / 2, cfg->rope_factor != 1.0 ? ", / factor" : "");
    else printf("default");
    printf(", sliding layers theta %g\n", cfg->rope_local_theta);
    printf("scores unscaled (q/k norm), values RMS-normed without a weight; norms w, sandwich; MLP GeGLU "
           "(gelu_pytorch_tanh); embedding x sqrt(%d)%s; each layer's output x its layer_scalar (a "
           "buffer: loaded, saved, not trained); logits %s",
           cfg->C, cfg->embed_pad_no_grad ? ", pad row frozen in the lookup" : "",
           cfg->final_softcap > 0 ? "soft-capped: cap x tanh(logits / cap), cap " : "not soft-capped\n");
    if (cfg->final_softcap > 0) printf("%g\n", cfg->final_softcap);
}

int mt_cmd_info(int argc, char **argv) {
    const char *model_dir = NULL, *init = NULL;
    const char *revision = NULL;
    int tensors = 0, lora = 0;
    const char *lora_targets = NULL;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"revision", required_argument, 0, 'R'},
                                         {"init", required_argument, 0, 'i'},
                                         {"tensors", no_argument, 0, 't'},
                                         {"lora", required_argument, 0, 'l'},
                                         {"lora-targets", required_argument, 0, 'L'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'R': revision = optarg; break;
        case 'i': init = optarg; break;
        case 't': tensors = 1; break;
        case 'l': {
            int64_t r;
            if (mt_arg_int("--lora", optarg, 1, 1 << 16, &r) != MT_OK) return mt_cli_fail();
            lora = (int)r;
            break;
        }
        case 'L': lora_targets = optarg; break;
        case 'h': print_usage(stdout); return 0;
        default: print_usage(stderr); return 1;
        }
    }
    if (lora_targets && !lora) {
        fprintf(stderr, "megatrain info: --lora-targets needs --lora R\n");
        return 1;
    }
    if (optind < argc) {
        fprintf(stderr, "megatrain info: unexpected argument '%s'\n", argv[optind]);
        return 1;
    }
    mt_host_model m;
    if (mt_model_resolve(model_dir, revision, &model_dir) != MT_OK) return mt_cli_fail();
    if (mt_host_model_open(&m, model_dir, init, 0, model_dir != NULL) != MT_OK) return mt_cli_fail();
    const mt_config *cfg = &m.table.cfg;
    double n = (double)m.table.n_real;
    mt_lora_table lt; /* bad --lora values fail before anything is printed */
    mt_lora_opts lo = {.rank = lora, .targets = lora_targets};
    if (lora && mt_lora_table_init(&lt, &m.table, &lo) != MT_OK) {
        mt_host_model_free(&m);
        return mt_cli_fail();
    }
    printf("%s: %d layers, hidden %d, MLP %d, heads %d (kv %d, head dim %d), vocab %d%s\n",
           cfg->model_type, cfg->L, cfg->C, cfg->F, cfg->H, cfg->G, cfg->D, cfg->V,
           cfg->tie_word_embeddings ? ", tied head" : "");
    printf("rope: theta %g%s; rms_norm_eps %g%s%s%s\n", cfg->rope_theta,
           cfg->rope_type == MT_ROPE_LLAMA3 ? ", llama3 scaling"
           : cfg->rope_type == MT_ROPE_YARN ? ", yarn scaling"
           : cfg->rope_type == MT_ROPE_LINEAR ? ", linear scaling"
           : cfg->rope_type == MT_ROPE_PROPORTIONAL ? ", proportional" : "", cfg->rms_norm_eps,
           cfg->qkv_bias ? "; q/k/v bias" : "", cfg->o_bias ? "; o bias" : "",
           cfg->qk_norm ? "; q/k norm" : "");
    printf("parameters: %.0f (%.3f B); one layer %lld\n", n, n / 1e9,
           (long long)m.table.layer_size);
    if (mt_config_mixer_layers(cfg, MT_MIXER_GATED_DELTANET) > 0) print_layer_types(cfg);
    if (cfg->arch == MT_ARCH_GPT_OSS) print_gpt_oss(cfg);
    if (cfg->arch == MT_ARCH_GEMMA3) print_gemma3(cfg);
    if (cfg->arch == MT_ARCH_GEMMA4) print_gemma4(cfg);
    if (cfg->n_experts > 0) {
        double a = (double)mt_config_active_param_count(cfg);
        printf("experts: %d MoE layers of %d experts (width %d), top %d%s%s%s%s; active parameters "
               "%.0f (%.3f B)\n", mt_config_moe_layers(cfg), cfg->n_experts, cfg->moe_F, cfg->top_k,
               cfg->norm_topk_prob ? ", gates renormalised" : "",
               cfg->moe_beside_dense ? " x per_expert_scale, beside the dense MLP (router on the residual)" : "",
               cfg->shared_expert ? ", a gated shared expert" : "",
               cfg->router_aux ? ", load-balancing loss" : "", a, a / 1e9);
    }
    /* the planner's numbers, as `megatrain plan --device cuda` prints them for the same shape */
    mt_backend gpu = {.name = "cuda", .dtype = MT_BF16, .memory = mt_backend_cuda_memory()};
    mt_plan_request rq = {.batch = MT_PLAN_DEFAULT_BATCH, .T = mt_plan_default_seq(cfg),
                          .micro_batch = MT_AUTO, .offload = MT_AUTO, .saved_layers = MT_AUTO,
                          .resident = MT_AUTO, .n_slots = 2};
    mt_plan plan;
    if (mt_plan_resolve(&m.table, &gpu, &rq, &plan) != MT_OK) {
        if (lora) mt_lora_table_free(&lt);
        mt_host_model_free(&m);
        return mt_cli_fail();
    }
    printf("training on a GPU at --batch %d --seq %d (megatrain plan for others and the GPU side):\n  ",
           rq.batch, rq.T);
    mt_plan_print_host(&plan, stdout);
    printf("\n  (checkpoints offloaded by a short --gpu-mem add L x B x T x hidden x 2 bytes; on\n"
           "  --device cpu the upload copy is fp32 and the compute side is host RAM too)\n");
    if (model_dir) printf("weights: all %d tensors present and valid\n", m.table.n_params);
    if (lora) { /* the names that matched: what a default list resolves to on this family */
        char names[sizeof lt.targets + sizeof lt.parameters];
        printf("lora: rank %d on %d modules (%s): %lld trainable parameters (%.3f%% of %.0f), as PEFT "
               "counts them\n", lora, lt.n_modules, mt_lora_targets_text(&lt, names, sizeof names),
               (long long)lt.n_real,
               100.0 * (double)lt.n_real / n, n);
        mt_lora_table_free(&lt);
    }
    if (m.hf && m.hf->n_carried > 0) /* a multimodal checkpoint's vision tower, mtp layer, ... */
        printf("carried: %d tensors not trained, copied unchanged into every save (%d vision, %d mtp, %d "
               "other)\n", m.hf->n_carried, m.hf->n_visual, m.hf->n_mtp,
               m.hf->n_carried - m.hf->n_visual - m.hf->n_mtp);
    if (m.hf && m.hf->fused_experts) printf("experts: fused on disk (mlp.experts.gate_up_proj, down_proj); saved so\n");
    if (m.hf && m.hf->n_mxfp4 > 0)
        printf("experts: MXFP4 on disk (%d tensors as mlp.experts.*_blocks + _scales): dequantized at load, "
               "trained unquantized, saved unquantized (fp32 checkpoints, bf16 from megatrain convert) "
               "without quantization_config\n", m.hf->n_mxfp4);
    if (mt_base_format_check(cfg, MT_BASE_MXFP4) == MT_OK) { /* what a LoRA base in MXFP4 holds */
        int64_t experts = 0;
        for (int i = 0; i < m.table.n_params; i++)
            if (mt_quant_base_quantizes(MT_BASE_MXFP4, &m.table.params[i])) experts += m.table.params[i].numel;
        printf("LoRA base --base-dtype mxfp4: the experts' gate_up_proj and down_proj (%.4g B parameters) held "
               "in MXFP4 (%s), the layers' other tensors in fp32: %.4g GiB for all %d layers\n",
               (double)experts / 1e9,
               m.hf && m.hf->n_mxfp4 > 0 ? "this checkpoint's blocks and scales as they are"
                                        : "quantized on load: a power-of-two scale per 32 inputs",
               mt_quant_base_bytes(&m.table, MT_BASE_MXFP4, 0, NULL) / 1073741824.0, cfg->L);
    } else {
        mt_error_clear();
    }
    if (tensors) {
        for (int i = 0; i < m.table.n_params; i++) {
            const mt_param *p = &m.table.params[i];
            char shape[64];
            if (p->ndim == 1) snprintf(shape, sizeof shape, "(%lld)", (long long)p->shape[0]);
            else if (p->ndim == 2)
                snprintf(shape, sizeof shape, "(%lld, %lld)", (long long)p->shape[0], (long long)p->shape[1]);
            else
                snprintf(shape, sizeof shape, "(%lld, %lld, %lld)", (long long)p->shape[0],
                         (long long)p->shape[1], (long long)p->shape[2]);
            const char *group = p->layer == MT_GROUP_EMBED ? "embed" : p->layer == cfg->L ? "head" : "layer";
            printf("  %-56s %-16s %s", p->name, shape, group);
            if (p->layer >= 0 && p->layer < cfg->L) printf(" %d", p->layer);
            printf("\n");
        }
    }
    mt_host_model_free(&m);
    return 0;
}
