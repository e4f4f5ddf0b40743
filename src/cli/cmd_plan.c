/* megatrain plan: the memory plan of a training run, whether it fits and how long its step should
 * take (on a GPU), without training. */
#include <getopt.h>
#include <stdio.h>

#include "../core/error.h"
#include "../model/lora.h"
#include "args.h"
#include "commands.h"
#include "model_source.h"
#include "run_setup.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: megatrain plan (--model DIR|ORG/NAME | --init CONFIG.json) [--batch B] [--seq T]\n"
            "                      [--micro-batch auto|b] [--device auto|cpu|cuda] [--gpu-mem SIZE]\n"
            "                      [--state full|compact|tight] [--gpu-layers auto|N] [--host-mem SIZE]\n"
            "                      [--packed] [--lora R [--lora-targets L] [--base-dtype bf16|fp8|nf4|mxfp4]]\n"
            "                      [--resident-weights auto|yes|no] [--update-on host|gpu|auto]\n"
            "                      [--checkpoint-every auto|1|2]\n"
            "  Prints what training would hold in host RAM and on the compute device, the tiles (the\n"
            "  layer's token chunk, the LM head's row chunk) and which layers' checkpoints wait in\n"
            "  pinned host memory, and exits 0 when it fits this machine, 1 when it does not (with\n"
            "  what to change, and what would fit: the GPU memory, the longest --seq, a lighter\n"
            "  --state). Long context: docs/USER_GUIDE.md, \"Long context\". Defaults as in\n"
            "  train: --batch %d, --seq min(1024, max_position_embeddings), --micro-batch auto (the\n"
            "  largest dividing B that fits). Sizes are GiB (2^30 bytes): --gpu-mem 24G = 24 GiB.\n"
            "  Without a CUDA device here, --device cuda or --gpu-mem plans the GPU side for one.\n"
            "  --state and --gpu-layers as in train; --host-mem plans for a host with that much RAM\n"
            "  free for training (default: this machine's, unless planning for another GPU).\n"
            "  --packed plans rows that pack several documents (chat data, *.packed files), whose\n"
            "  attention backward on a GPU takes more pool memory (cuDNN's variable-length graph;\n"
            "  not with MT_ATTENTION_DOCS=own or MT_ATTENTION=own); the default plans rows of a\n"
            "  token stream, as train does for token and text data. The pool line says which.\n"
            "  On a GPU it also estimates the step: compute, PCIe and host AdamW time, what bounds\n"
            "  it, the smallest compute-bound --batch; MT_HOST_ADAMW=G sets the host AdamW rate in\n"
            "  Gparam/s (default: the format's, measured in training on the H200 host).\n"
            "  --update-on gpu plans (and estimates) the streamed update of train --update-on gpu;\n"
            "  auto plans both and keeps the faster estimate (as train --update-on auto).\n"
            "  --checkpoint-every as in train: 2 keeps every second layer's input and remakes the\n"
            "  others in the backward; auto only when nothing fits otherwise.\n"
            "  --lora R plans LoRA training (train --lora): the frozen base's weights alone on the\n"
            "  host (2 B/param in bf16), the adapters' weights, master, moments and gradient on the\n"
            "  GPU, no base gradient; --lora-targets, --base-dtype and --resident-weights as in train;\n"
            "  it also says the largest base of the model's shape (its layer count scaled, the layer\n"
            "  pattern repeated) that the same plan holds, in each of bf16, fp8 and nf4 (and mxfp4 on\n"
            "  gpt-oss).\n"
            "  --model ORG/NAME [--revision R]: a model in the Hugging Face hub cache, offline\n"
            "  ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub; R: ref or commit,\n"
            "  default main)\n",
            MT_PLAN_DEFAULT_BATCH);
}

static int cuda_here(void) {
#ifdef MT_HAVE_CUDA
    return mt_backend_cuda_available();
#else
    return 0;
#endif
}

/* The model's config with L layers: the per-layer choices (Gated DeltaNet or attention, dense or
 * MoE) repeat the model's own pattern. */
static mt_config with_layers(const mt_config *c, int L) {
    mt_config d = *c;
    d.L = L;
    for (int l = 0; l < L; l++) {
        int s = l % c->L;
#define COPY_BIT(bits) \
        if (bits[s / 8] >> (s % 8) & 1) bits[l / 8] |= (uint8_t)(1u << (l % 8)); \
        else bits[l / 8] &= (uint8_t)~(1u << (l % 8));
        COPY_BIT(d.mlp_only)
        COPY_BIT(d.deltanet)
#undef COPY_BIT
    }
    return d;
}

/* Whether the plan of rq fits with the model deepened (or made shallower) to L layers; its
 * parameter count in *n_params. */
static int fits_with_layers(const mt_param_table *t, const mt_backend *be, mt_plan_request rq,
                            const mt_lora_opts *lo, int L, double *n_params) {
    mt_config cfg = with_layers(&t->cfg, L);
    mt_param_table t2;
    mt_param_table_init(&t2, &cfg);
    t2.hf = t->hf;
    mt_lora_table lt;
    int ok = 0;
    if (mt_lora_table_init(&lt, &t2, lo) == MT_OK) {
        t2.cfg.lora_rank = lt.rank;
        rq.lora = &lt;
        rq.no_suggest = 1;
        mt_plan p;
        ok = mt_plan_resolve(&t2, be, &rq, &p) == MT_OK && mt_plan_check(&p) == MT_OK;
        mt_lora_table_free(&lt);
    }
    *n_params = (double)t2.n_real;
    t2.hf = NULL;
    mt_param_table_free(&t2);
    mt_error_clear();
    return ok;
}

/* LoRA: the largest base of this shape (its layer count scaled, the layer pattern repeated) that
 * the same plan holds, per base format. The planner decides each, so it is as exact as the plan. */
static void print_largest_base(const mt_param_table *t, const mt_backend *be, const mt_plan_request *rq,
                               const mt_lora_opts *lo) {
    printf("largest base of this shape that fits (the same plan, the layer count scaled):");
    for (int f = MT_BASE_BF16; f <= MT_BASE_MXFP4; f++) {
        if (mt_base_format_check(&t->cfg, (mt_base_format)f) != MT_OK) continue; /* mxfp4: gpt-oss */
        mt_plan_request r = *rq;
        r.base_format = (mt_base_format)f;
        double n = 0;
        int lo_L = 0, hi_L = 1; /* lo_L fits (0: none); hi_L does not, once lo_L < hi_L */
        while (fits_with_layers(t, be, r, lo, hi_L, &n)) {
            lo_L = hi_L;
            if (hi_L == MT_CONFIG_MAX_LAYERS) break;
            hi_L = 2 * hi_L < MT_CONFIG_MAX_LAYERS ? 2 * hi_L : MT_CONFIG_MAX_LAYERS;
        }
        while (hi_L - lo_L > 1) {
            int mid = lo_L + (hi_L - lo_L) / 2;
            if (fits_with_layers(t, be, r, lo, mid, &n)) lo_L = mid;
            else hi_L = mid;
        }
        if (lo_L == 0) {
            printf("%s %s none", f ? "," : "", mt_base_format_name((mt_base_format)f));
        } else {
            fits_with_layers(t, be, r, lo, lo_L, &n);
            printf("%s %s %s%d layers (%.1fB parameters)", f ? "," : "", mt_base_format_name((mt_base_format)f),
                   lo_L == MT_CONFIG_MAX_LAYERS ? "at least " : "", lo_L, n / 1e9);
        }
    }
    printf("%s\n", rq->host_available > 0 ? "" : " (host RAM not checked: give --host-mem)");
}

int mt_cmd_plan(int argc, char **argv) {
    const char *model_dir = NULL, *init = NULL;
    const char *revision = NULL;
    int64_t B = MT_PLAN_DEFAULT_BATCH, T = 0, b = MT_AUTO, gpu_mem = 0;
    int device = 0, state = 0, packed = 0;
    int64_t gpu_layers = MT_AUTO, host_mem = 0, lora = 0;
    const char *lora_targets = NULL;
    int base_dtype = 0, resident = 0, update_on = 0, every = 0;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"revision", required_argument, 0, 'R'},
                                         {"init", required_argument, 0, 'i'},
                                         {"batch", required_argument, 0, 'b'},
                                         {"seq", required_argument, 0, 't'},
                                         {"micro-batch", required_argument, 0, 'u'},
                                         {"device", required_argument, 0, 'd'},
                                         {"gpu-mem", required_argument, 0, 'g'},
                                         {"state", required_argument, 0, 's'},
                                         {"gpu-layers", required_argument, 0, 'l'},
                                         {"host-mem", required_argument, 0, 'H'},
                                         {"packed", no_argument, 0, 'p'},
                                         {"lora", required_argument, 0, 'r'},
                                         {"lora-targets", required_argument, 0, 'T'},
                                         {"base-dtype", required_argument, 0, 'B'},
                                         {"resident-weights", required_argument, 0, 'W'},
                                         {"update-on", required_argument, 0, 'U'},
                                         {"checkpoint-every", required_argument, 0, 'C'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int rc = MT_OK;
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'R': revision = optarg; break;
        case 'i': init = optarg; break;
        case 'b': rc = mt_arg_int("--batch", optarg, 1, 1 << 20, &B); break;
        case 't': rc = mt_arg_int("--seq", optarg, 1, 1 << 24, &T); break;
        case 'u': rc = mt_arg_int_or_auto("--micro-batch", optarg, 1, 1 << 20, &b); break;
        case 'd': rc = mt_arg_choice("--device", optarg, "auto|cpu|cuda", &device); break;
        case 'g': rc = mt_arg_size("--gpu-mem", optarg, &gpu_mem); break;
        case 's': rc = mt_arg_choice("--state", optarg, "full|compact|tight", &state); break;
        case 'l': rc = mt_arg_int_or_auto("--gpu-layers", optarg, 0, 1 << 20, &gpu_layers); break;
        case 'H': rc = mt_arg_size("--host-mem", optarg, &host_mem); break;
        case 'p': packed = 1; break;
        case 'r': rc = mt_arg_int("--lora", optarg, 1, MT_LORA_MAX_RANK, &lora); break;
        case 'T': lora_targets = optarg; break;
        case 'B': rc = mt_arg_choice("--base-dtype", optarg, "bf16|fp8|nf4|mxfp4", &base_dtype); break;
        case 'W': rc = mt_arg_choice("--resident-weights", optarg, "auto|yes|no", &resident); break;
        case 'U': rc = mt_arg_choice("--update-on", optarg, "host|gpu|auto", &update_on); break;
        case 'C': rc = mt_arg_choice("--checkpoint-every", optarg, "auto|1|2", &every); break;
        case 'h': print_usage(stdout); return 0;
        default: print_usage(stderr); return 1;
        }
        if (rc != MT_OK) return mt_cli_fail();
    }
    if (b != MT_AUTO && B % b) {
        mt_error_set("--micro-batch: %lld does not divide --batch %lld", (long long)b, (long long)B);
        return mt_cli_fail();
    }
    mt_host_model m;
    if (mt_model_resolve(model_dir, revision, &model_dir) != MT_OK) return mt_cli_fail();
    if (mt_host_model_open(&m, model_dir, init, 0, 0) != MT_OK) return mt_cli_fail();
    if (!T) T = mt_plan_default_seq(&m.table.cfg);
    mt_lora_table lt = {0};
    if ((lora_targets || base_dtype) && !lora) {
        mt_error_set("--lora-targets and --base-dtype need --lora R");
        mt_host_model_free(&m);
        return mt_cli_fail();
    }
    if (mt_base_format_check(&m.table.cfg, (mt_base_format)base_dtype) != MT_OK) {
        mt_host_model_free(&m);
        return mt_cli_fail();
    }
    if (lora) {
        mt_lora_opts lo = {.rank = (int)lora, .targets = lora_targets};
        if (mt_lora_table_init(&lt, &m.table, &lo) != MT_OK) {
            mt_host_model_free(&m);
            return mt_cli_fail();
        }
        m.table.cfg.lora_rank = lt.rank;
    }
    mt_backend *be = NULL, planned = {.name = "cuda", .dtype = MT_BF16, .mem_budget = gpu_mem,
                                      .memory = mt_backend_cuda_memory()};
    int rc = mt_run_check_seq(&m.table.cfg, (int)T, "--seq");
    if (rc == MT_OK && !cuda_here() && (device == 2 || (device == 0 && gpu_mem))) {
        /* the GPU side of the plan is arithmetic: plan it for a GPU this machine does not have */
        printf("no CUDA device here: planning for one%s\n",
               gpu_mem ? " with the --gpu-mem budget" : " (give --gpu-mem SIZE to plan what its memory buys)");
        be = &planned;
    } else if (rc == MT_OK) {
        rc = mt_run_backend(&be, device, gpu_mem);
    }
    if (rc == MT_OK) {
        mt_plan_request rq = {.batch = (int)B, .T = (int)T, .micro_batch = (int)b, .offload = MT_AUTO,
                              .saved_layers = MT_AUTO, .checkpoint_every = every ? every : MT_AUTO,
                              .resident = resident == 1 ? 1 : resident == 2 ? 0 : MT_AUTO, .n_slots = 2,
                              .gpu_mem = gpu_mem,
                              /* another machine will train: this one's RAM says nothing */
                              .host_available = host_mem ? (double)host_mem
                                                : be == &planned ? 0 : mt_run_host_available(),
                              .state = (mt_state_format)state, .gpu_layers = (int)gpu_layers,
                              .documents = packed, .lora = lora ? &lt : NULL,
                              .base_format = (mt_base_format)base_dtype,
                              .update_on_device = update_on == 2 ? MT_AUTO : update_on};
        mt_engine_opts eo;
        printf("%.1fM parameters, %lld x %lld tokens per step%s, %s backend%s\n", m.table.n_real / 1e6,
               (long long)B, (long long)T, packed ? " (packed rows)" : "", be->name,
               be == &planned && !host_mem ? " (host RAM not checked: this machine does not train it)" : "");
        rc = mt_run_check_memory(&m.table, be, &rq, &eo);
        if (rc == MT_OK) printf("fits\n");
        if (lora) {
            mt_lora_opts lo = {.rank = (int)lora, .targets = lora_targets};
            char why[512];
            snprintf(why, sizeof why, "%s", mt_error_message()); /* the plan's verdict, kept for below */
            print_largest_base(&m.table, be, &rq, &lo);
            if (rc != MT_OK) mt_error_set("%s", why);
        }
        if (be != &planned) be->destroy(be);
    }
    if (lora) mt_lora_table_free(&lt);
    mt_host_model_free(&m);
    return rc == MT_OK ? 0 : mt_cli_fail();
}
