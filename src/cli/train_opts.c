#include "train_opts.h"

#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "data/chat_pack.h"
#include "../model/lora.h"
#include "../optim/state.h"
#include "args.h"
#include "model_source.h"

void mt_train_opts_usage(FILE *out) {
    fprintf(out,
"usage: megatrain train (--model DIR | --init CONFIG.json) --data PATH --out DIR [options]\n"
"\n"
"Trains with fp32 master weights and Adam moments in host RAM, streaming each layer through the\n"
"compute device. Checkpoints (Hugging Face loadable) go to OUT/checkpoints/step_N/, one JSON line\n"
"per step to OUT/metrics.jsonl. Ctrl-C finishes the current step, saves, and exits 0.\n"
"\n"
"model and data\n"
"  --model DIR|ORG/NAME   Hugging Face directory (config.json + safetensors), or a model in the\n"
"                         Hugging Face hub cache by name (offline: $HF_HUB_CACHE, else\n"
"                         $HF_HOME/hub, else ~/.cache/huggingface/hub)\n"
"  --revision R           with --model ORG/NAME: the ref (default main) or commit hash\n"
"  --init CONFIG.json     random init (std = initializer_range, residual projections / sqrt(2L))\n"
"  --data PATH            token file (.bin: uint16; uint32 when the vocabulary needs it), or\n"
"                         text / JSONL (\"text\" field) tokenized with the model's tokenizer.json,\n"
"                         or as bytes (ids 0-255, end of document 256) for models without one;\n"
"                         cached in OUT as <name>.tokens.bin\n"
"  --doc-sep LINE         text data: a line equal to LINE ends a document (e.g. %% for fortunes)\n"
"                         chat data (JSONL whose first object has \"messages\": [{\"role\", \"content\"}]):\n"
"                         rendered in the model's chat format, packed into rows of --seq tokens\n"
"                         (documents kept apart, see --pack), cached in OUT as <name>.packed; a\n"
"                         file from `megatrain tokenize --chat` is used as is\n"
"  --loss-on W            chat data: assistant (default: the loss on the assistant replies only) | all\n"
"  --chat-format F        chat data: auto (default: from the tokenizer's chat template or special\n"
"                         tokens) | chatml | llama3 | llama2 | mistral | mistral-v3 | qwen3\n"
"  --long P               chat data: a conversation longer than --seq is truncated to --seq tokens\n"
"                         (truncate, the default) or skipped (skip); both counted in the log\n"
"  --pack P               chat data: whole (default: a conversation never straddles rows; when it\n"
"                         does not fit the rest of a row, that rest is padding without loss and it\n"
"                         starts the next row; the padding share is logged) | split (one stream cut\n"
"                         into rows: nothing padded but the last row, but a conversation cut by a\n"
"                         row's end goes on at the next row's start without its beginning)\n"
"  --eval-data PATH       held-out tokens, evaluated every --eval-every steps\n"
"  --eval-split F         hold out the fraction F (0 < F < 1) of --data as the eval set instead,\n"
"                         never trained on, picked by --seed (the same on every run and resume):\n"
"                         whole documents of text/JSONL data (a text file without --doc-sep is one\n"
"                         document), rows of packed/chat data, sequences of --seq tokens of a token\n"
"                         file\n"
"  --eval-every K         (default 0: only at the end when --eval-data or --eval-split is given)\n"
"  --eval-batches N       batches per evaluation (default 8)\n"
"  --out DIR              run directory (created); one train at a time (OUT/.lock)\n"
"shape of a step\n"
"  --steps N              optimizer steps (default 1000)\n"
"  --batch B              sequences per step (default 8)\n"
"  --seq T                tokens per sequence (default min(1024, max_position_embeddings))\n"
"  --micro-batch b|auto   sequences per micro-batch; B %% b == 0 (default auto: the largest that\n"
"                         fits the GPU budget, checkpoints offloaded only when none fits; on cpu B)\n"
"optimizer (torch.optim.AdamW semantics)\n"
"  --lr X                 peak learning rate (default 3e-4)\n"
"  --min-lr X             final learning rate (default lr/10)\n"
"  --warmup N             linear warmup steps (default min(100, steps/20))\n"
"  --schedule S           cosine | linear | constant (default cosine)\n"
"  --beta1 --beta2 --eps  (defaults 0.9, 0.95, 1e-8)\n"
"  --weight-decay X       on matrices and embeddings only (default 0.1)\n"
"  --clip X               global L2 norm clip, 0 = off (default 1.0)\n"
"  --state F              optimizer state format (default full):\n"
"                           full     fp32 master and moments, 14 B/param on the host (exact AdamW)\n"
"                           compact  bf16 master + 16-bit compensation (the fp32 value, exactly) and\n"
"                                    8-bit blockwise moments: 6.03 B/param\n"
"                           tight    bf16 master with stochastic rounding, 8-bit moments: 4.03 B/param\n"
"                         (bench/RESULTS.md gives the measured loss cost); --resume continues in\n"
"                         the checkpoint's format (another is refused)\n"
"  --gpu-layers N|auto    the first N layers keep their whole state on the GPU and are updated\n"
"                         there (no PCIe traffic for them); auto: the fewest that let the host\n"
"                         hold the rest (default auto)\n"
"LoRA (docs/USER_GUIDE.md, \"LoRA\"): adapters train, the base stays frozen (its weights alone\n"
"cross to the GPU: no master, moments or gradient for it; the adapters' state lives on the GPU)\n"
"  --lora R               rank-R adapters on every linear projection of attention, the Gated\n"
"                         DeltaNet and the MLPs (not the experts, router, embedding or LM head)\n"
"  --lora-alpha A         scale A / R (default 2R: scale 2)\n"
"  --lora-dropout P       only 0 (the default) yet\n"
"  --lora-targets L       PEFT's target_modules, comma-separated (q_proj,v_proj, ...); on\n"
"                         gpt_oss also gate_up_proj,down_proj: its experts (PEFT's\n"
"                         target_parameters; CPU only yet)\n"
"  --base-dtype F         the frozen layers bf16 (default) | fp8 (e4m3, a scale per 128: 1.03\n"
"                         B/param) | nf4 (QLoRA's 4-bit NormalFloat, an absmax per 64: 0.56\n"
"                         B/param) | mxfp4 (gpt-oss only: its experts in MXFP4, 0.53 B/param,\n"
"                         an MXFP4 checkpoint's copied as they are; the rest fp32), quantized\n"
"                         on load and dequantized on the GPU per layer;\n"
"                         they stay on the GPU where they fit after the activations and saved\n"
"                         internals (--resident-weights auto), else stream from pinned host memory\n"
"                         (yes / no force either)\n"
"  --base-cache DIR       keep the quantized base in DIR (one file a model and format, checked\n"
"                         against the model's files): a later run reads it instead of quantizing\n"
"                         the checkpoint again; a stale or damaged file is rebuilt, never used\n"
"  --adapter DIR          start from a PEFT adapter (adapter_config.json + adapter_model.safetensors;\n"
"                         its r, lora_alpha and target_modules, unless the --lora flags say the same)\n"
"                         Each checkpoint is a PEFT adapter directory (PeftModel.from_pretrained\n"
"                         loads it); `megatrain merge` folds one into the model\n"
"long context (docs/USER_GUIDE.md, \"Long context\"; `megatrain plan --seq T` shows the plan first)\n"
"  --seq T --batch 1      one long row a step (--micro-batch auto is 1 then). The planner tiles\n"
"                         the layer over token chunks (the largest of 32k..1k tokens that fits;\n"
"                         the LM head and loss always run over row chunks), keeps the layer\n"
"                         checkpoints on the GPU as far as they go and the first layers' in\n"
"                         pinned host memory (counted with the host state), and says what would\n"
"                         fit (--gpu-mem, --seq, --state) when nothing does. A --seq past the\n"
"                         config's max_position_embeddings is warned about: use a config set for\n"
"                         it (bench/configs/qwen2.5-7b-512k.json: 524288, rope_theta 1e7)\n"
"  --offload-checkpoints  keep every layer's checkpoint in host memory in any case (default:\n"
"                         the fewest layers' that make the plan fit, at any --seq)\n"
"  --checkpoint-every N   auto | 1 | 2: 2 keeps only every second layer's input and remakes the\n"
"                         others in the backward (one more forward of half the layers, ~1/8 more\n"
"                         compute, for about half the checkpoints' GPU memory); auto (default):\n"
"                         only when no plan fits otherwise, on the GPU or offloaded\n"
"  --state compact|tight  frees host RAM for offloaded checkpoints (6.03 or 4.03 B/param, not 14)\n"
"  MT_ATTENTION=auto|cudnn|own  (environment, CUDA) cuDNN's forward and its backward from 4096\n"
"                         tokens a row (default), cuDNN's fused attention wherever it applies,\n"
"                         or our flash kernels only; rows packing documents (chat data) take\n"
"                         cuDNN's variable-length attention both ways unless MT_ATTENTION=own\n"
"                         or MT_ATTENTION_DOCS=own (our kernels for them)\n"
"  throughput             the step line gives TFLOPS both as 6*N*tokens (\"6NT\") and \"with\n"
"                         attention\": + 7*L*H*D*n^2 for each causal document of n tokens (forward\n"
"                         2 products over the visible half, backward 2.5x); metrics.jsonl keys\n"
"                         tflops and tflops_attn\n"
"run\n"
"  --seed N               data order and init (default 1337)\n"
"  --no-shuffle           read the data in order (docs/DESIGN.md, \"Data\")\n"
"  --device D             auto | cpu | cuda (default auto)\n"
"  --gpu-mem SIZE         cap on GPU memory, e.g. 24G = 24 GiB (default: all); when the plan does\n"
"                         not fit, the layer checkpoints move to pinned host memory\n"
"  --saved-layers N|auto  layers whose internals stay on the GPU so that their backward skips the\n"
"                         recompute (same results, less work); auto: as many as the GPU memory\n"
"                         left after the plan holds (default auto; 0 with offloaded checkpoints)\n"
"  --resident-weights W   auto | yes | no: every layer's weights keep a GPU slot through the step,\n"
"                         so they cross PCIe once per step instead of twice (auto: when every\n"
"                         layer already keeps its internals and the slots still fit)\n"
"  --update-on W          host | gpu | auto: where the AdamW of the layers outside the GPU tier\n"
"                         runs (default host). gpu (--state compact|tight, gradients waiting on\n"
"                         the GPU): their state streams through the GPU piece by piece, the same\n"
"                         bits as the host update; auto: gpu where it applies and the plan's step\n"
"                         estimate is 5%% shorter with it (`plan` prints both)\n"
"  --threads N            optimizer threads (default: all cores)\n"
"  --save-every K         checkpoint every K steps (default 0: at the end only)\n"
"  --keep K               checkpoints kept (default 3); while steps are being skipped (non-finite),\n"
"                         the last checkpoint of a healthy step is kept too\n"
"  --resume               continue from the newest intact checkpoint in --out (checksums and values\n"
"                         verified: NaN/inf, |weight| or |exp_avg| > 1e8, exp_avg_sq < 0 or > 1e16\n"
"                         are damage; a damaged newer one is named and passed over; temporary\n"
"                         directories of a killed save are removed), with its\n"
"                         micro-batch unless --micro-batch is given; metrics.jsonl is cut back\n"
"                         to the checkpoint's step. Refused when the settings that shape the\n"
"                         math differ from the checkpoint's (--data --model --seed --no-shuffle\n"
"                         --batch --seq --doc-sep, the chat flags, --steps --schedule --warmup\n"
"                         --lr --min-lr --beta1 --beta2 --eps --weight-decay --clip); the error\n"
"                         lists each change. Refused as well when OUT has metrics but no checkpoint\n"
"  --resume-changed       with --resume: go on with the changed settings (a warning lists them)\n"
"  --overwrite            a run into an --out that already holds one (metrics.jsonl or\n"
"                         checkpoints/step_*) is refused without it; with it, OUT/metrics.jsonl,\n"
"                         OUT/checkpoints/step_* and OUT/tensorboard's event files are removed\n"
"                         first (data caches and other files in OUT stay)\n"
"  --on-nonfinite P       a step whose loss or gradient norm is NaN/inf never updates the weights;\n"
"                         skip (default): the run goes on with the next batch (the step counts as\n"
"                         skipped; AdamW's step count does not advance) | stop: the first one ends\n"
"                         the run. Either way no checkpoint is written for it and the run exits 1\n"
"                         naming the last good checkpoint when it stops\n"
"  --max-nonfinite N      skip: stop after N non-finite steps in a row (default 3), counted across\n"
"                         --resume (the count is part of the checkpoint)\n"
"  --no-save              write no checkpoint (benchmarks)\n"
"  --max-time SECONDS     stop (and save) after this much training time\n"
"  --stop-at N            stop (and save) after step N, keeping the schedule of --steps\n"
"  --no-tensorboard       no TensorBoard event files (default: OUT/tensorboard/, the scalars of\n"
"                         metrics.jsonl as train/* and eval/loss; `tensorboard --logdir OUT`;\n"
"                         a resume drops the steps after its checkpoint there too)\n"
"  --log FILE             also write the step lines to FILE (a failed write to it or to\n"
"                         metrics.jsonl ends the run: exit 1, no checkpoint replaced)\n"
"  --trace FILE           Chrome/Perfetto JSON timeline of the last two steps: when the host\n"
"                         issued each piece, when the compute/H2D/D2H streams ran it, and the\n"
"                         optimizer threads (open in ui.perfetto.dev)\n");
}

enum { O_LOSS_ON = 900, O_CHAT_FORMAT, O_LONG, O_PACK }; /* chat data */
enum {
    O_MODEL = 1000, O_INIT, O_DATA, O_OUT, O_STEPS, O_BATCH, O_SEQ, O_MICRO, O_LR, O_MIN_LR,
    O_WARMUP, O_SCHEDULE, O_BETA1, O_BETA2, O_EPS, O_WD, O_CLIP, O_SEED, O_NO_SHUFFLE, O_DEVICE,
    O_GPU_MEM, O_SAVE_EVERY, O_KEEP, O_RESUME, O_EVAL_DATA, O_EVAL_SPLIT, O_EVAL_EVERY, O_EVAL_BATCHES, O_LOG,
    O_TRACE, O_THREADS, O_DOC_SEP, O_MAX_TIME, O_STOP_AT, O_NO_SAVE, O_OFFLOAD, O_SAVED_LAYERS, O_RESIDENT, O_UPDATE_ON, O_HELP, O_CKPT_EVERY,
    O_ON_NONFINITE, O_MAX_NONFINITE, O_OVERWRITE, O_RESUME_CHANGED, O_STATE, O_GPU_LAYERS,
    O_NO_TENSORBOARD, O_REVISION, O_LORA, O_LORA_ALPHA, O_LORA_DROPOUT, O_LORA_TARGETS, O_ADAPTER,
    O_BASE_DTYPE, O_BASE_CACHE,
};

static const struct option long_opts[] = {
    {"loss-on", required_argument, 0, O_LOSS_ON},   {"chat-format", required_argument, 0, O_CHAT_FORMAT},
    {"long", required_argument, 0, O_LONG},         {"pack", required_argument, 0, O_PACK},
    {"model", required_argument, 0, O_MODEL},       {"init", required_argument, 0, O_INIT},
    {"data", required_argument, 0, O_DATA},         {"out", required_argument, 0, O_OUT},
    {"steps", required_argument, 0, O_STEPS},       {"batch", required_argument, 0, O_BATCH},
    {"seq", required_argument, 0, O_SEQ},           {"micro-batch", required_argument, 0, O_MICRO},
    {"lr", required_argument, 0, O_LR},             {"min-lr", required_argument, 0, O_MIN_LR},
    {"warmup", required_argument, 0, O_WARMUP},     {"schedule", required_argument, 0, O_SCHEDULE},
    {"beta1", required_argument, 0, O_BETA1},       {"beta2", required_argument, 0, O_BETA2},
    {"eps", required_argument, 0, O_EPS},           {"weight-decay", required_argument, 0, O_WD},
    {"clip", required_argument, 0, O_CLIP},         {"seed", required_argument, 0, O_SEED},
    {"no-shuffle", no_argument, 0, O_NO_SHUFFLE},   {"device", required_argument, 0, O_DEVICE},
    {"gpu-mem", required_argument, 0, O_GPU_MEM},   {"save-every", required_argument, 0, O_SAVE_EVERY},
    {"keep", required_argument, 0, O_KEEP},         {"resume", no_argument, 0, O_RESUME},
    {"eval-data", required_argument, 0, O_EVAL_DATA}, {"eval-every", required_argument, 0, O_EVAL_EVERY},
    {"eval-split", required_argument, 0, O_EVAL_SPLIT},
    {"eval-batches", required_argument, 0, O_EVAL_BATCHES}, {"log", required_argument, 0, O_LOG},
    {"trace", required_argument, 0, O_TRACE},       {"threads", required_argument, 0, O_THREADS},
    {"doc-sep", required_argument, 0, O_DOC_SEP},   {"max-time", required_argument, 0, O_MAX_TIME},
    {"stop-at", required_argument, 0, O_STOP_AT},   {"no-save", no_argument, 0, O_NO_SAVE},
    {"no-tensorboard", no_argument, 0, O_NO_TENSORBOARD}, {"revision", required_argument, 0, O_REVISION},
    {"offload-checkpoints", no_argument, 0, O_OFFLOAD}, {"saved-layers", required_argument, 0, O_SAVED_LAYERS},
    {"resident-weights", required_argument, 0, O_RESIDENT}, {"update-on", required_argument, 0, O_UPDATE_ON},
    {"checkpoint-every", required_argument, 0, O_CKPT_EVERY}, {"help", no_argument, 0, O_HELP},
    {"on-nonfinite", required_argument, 0, O_ON_NONFINITE}, {"max-nonfinite", required_argument, 0, O_MAX_NONFINITE},
    {"overwrite", no_argument, 0, O_OVERWRITE},     {"resume-changed", no_argument, 0, O_RESUME_CHANGED},
    {"state", required_argument, 0, O_STATE},       {"gpu-layers", required_argument, 0, O_GPU_LAYERS},
    {"lora", required_argument, 0, O_LORA},         {"lora-alpha", required_argument, 0, O_LORA_ALPHA},
    {"lora-dropout", required_argument, 0, O_LORA_DROPOUT},
    {"lora-targets", required_argument, 0, O_LORA_TARGETS}, {"adapter", required_argument, 0, O_ADAPTER},
    {"base-dtype", required_argument, 0, O_BASE_DTYPE}, {"base-cache", required_argument, 0, O_BASE_CACHE},
    {0, 0, 0, 0},
};

static int parse_chat_flag(mt_train_opts *o, int c, const char *arg) {
    o->have_chat_flags = 1;
    mt_chat_loss_on loss;
    mt_chat_format format;
    mt_long_policy lp;
    mt_pack_policy pack;
    if (c == O_LOSS_ON) {
        MT_TRY(mt_arg_named("--loss-on", mt_chat_loss_on_parse(arg, &loss)));
        o->loss_on = (int)loss;
    } else if (c == O_CHAT_FORMAT) {
        MT_TRY(mt_arg_named("--chat-format", mt_chat_format_parse(arg, &format)));
        o->chat_format = (int)format;
    } else if (c == O_LONG) {
        MT_TRY(mt_arg_named("--long", mt_long_policy_parse(arg, &lp)));
        o->long_policy = (int)lp;
    } else {
        MT_TRY(mt_arg_named("--pack", mt_pack_policy_parse(arg, &pack)));
        o->pack_policy = (int)pack;
    }
    return MT_OK;
}

static int parse_one(mt_train_opts *o, int c, const char *arg) {
    const int64_t big = (int64_t)1 << 40;
    double seconds;
    switch (c) {
    case O_LOSS_ON: case O_CHAT_FORMAT: case O_LONG: case O_PACK: return parse_chat_flag(o, c, arg);
    case O_MODEL: o->model_dir = arg; return MT_OK;
    case O_INIT: o->init_config = arg; return MT_OK;
    case O_DATA: o->data = arg; return MT_OK;
    case O_OUT: o->out_dir = arg; return MT_OK;
    case O_EVAL_DATA: o->eval_data = arg; return MT_OK;
    case O_EVAL_SPLIT:
        MT_TRY(mt_arg_float("--eval-split", arg, 0, 1, &o->eval_split));
        if (o->eval_split <= 0 || o->eval_split >= 1)
            return mt_error_set("--eval-split %s: must be more than 0 and less than 1 (the fraction of --data "
                                "held out, e.g. 0.01)", arg);
        return MT_OK;
    case O_LOG: o->log_path = arg; return MT_OK;
    case O_TRACE: o->trace_path = arg; return MT_OK;
    case O_DOC_SEP: o->doc_sep = arg; return MT_OK;
    case O_STEPS: return mt_arg_int("--steps", arg, 1, big, &o->steps);
    case O_BATCH: return mt_arg_int("--batch", arg, 1, 1 << 20, &o->batch);
    case O_SEQ: o->have_seq = 1; return mt_arg_int("--seq", arg, 1, 1 << 24, &o->seq);
    case O_MICRO: o->have_micro_batch = 1; return mt_arg_int_or_auto("--micro-batch", arg, 1, 1 << 20, &o->micro_batch);
    case O_LR: return mt_arg_float("--lr", arg, 0, 10, &o->lr);
    case O_MIN_LR: o->have_min_lr = 1; return mt_arg_float("--min-lr", arg, 0, 10, &o->min_lr);
    case O_WARMUP: o->have_warmup = 1; return mt_arg_int("--warmup", arg, 0, big, &o->warmup);
    case O_SCHEDULE: return mt_arg_choice("--schedule", arg, "cosine|linear|constant", &o->schedule);
    case O_BETA1: return mt_arg_float("--beta1", arg, 0, 0.999999, &o->beta1);
    case O_BETA2: return mt_arg_float("--beta2", arg, 0, 0.999999999, &o->beta2);
    case O_EPS: return mt_arg_float("--eps", arg, 1e-30, 1, &o->eps);
    case O_WD: return mt_arg_float("--weight-decay", arg, 0, 10, &o->weight_decay);
    case O_CLIP: return mt_arg_float("--clip", arg, 0, 1e30, &o->clip);
    case O_SEED: return mt_arg_int("--seed", arg, 0, INT64_MAX, &o->seed);
    case O_NO_SHUFFLE: o->no_shuffle = 1; return MT_OK;
    case O_DEVICE: return mt_arg_choice("--device", arg, "auto|cpu|cuda", &o->device);
    case O_GPU_MEM: return mt_arg_size("--gpu-mem", arg, &o->gpu_mem);
    case O_SAVE_EVERY: return mt_arg_int("--save-every", arg, 0, big, &o->save_every);
    case O_KEEP: return mt_arg_int("--keep", arg, 0, 1 << 20, &o->keep);
    case O_RESUME: o->resume = 1; return MT_OK;
    case O_RESUME_CHANGED: o->resume_changed = 1; return MT_OK;
    case O_STATE:
        o->have_state = 1;
        return mt_arg_choice("--state", arg, "full|compact|tight", &o->state);
    case O_GPU_LAYERS:
        if (strcmp(arg, "auto") == 0) return o->gpu_layers = -1, MT_OK;
        return mt_arg_int("--gpu-layers", arg, 0, 1 << 20, &o->gpu_layers);
    case O_OVERWRITE: o->overwrite = 1; return MT_OK;
    case O_ON_NONFINITE: return mt_arg_choice("--on-nonfinite", arg, "skip|stop", &o->nonfinite_stop);
    case O_MAX_NONFINITE: return mt_arg_int("--max-nonfinite", arg, 1, 1 << 30, &o->max_nonfinite);
    case O_NO_SAVE: o->no_save = 1; return MT_OK;
    case O_NO_TENSORBOARD: o->no_tensorboard = 1; return MT_OK;
    case O_REVISION: o->revision = arg; return MT_OK;
    case O_LORA: return mt_arg_int("--lora", arg, 1, MT_LORA_MAX_RANK, &o->lora);
    case O_LORA_ALPHA: return mt_arg_float("--lora-alpha", arg, 1e-6, 1e6, &o->lora_alpha);
    case O_LORA_DROPOUT:
        MT_TRY(mt_arg_float("--lora-dropout", arg, 0, 1, &o->lora_dropout));
        if (o->lora_dropout != 0)
            return mt_error_set("--lora-dropout %s: only 0 is supported yet (PEFT's dropout on the "
                                "adapters' input needs a mask kept for the backward, not built)", arg);
        return MT_OK;
    case O_LORA_TARGETS: o->lora_targets = arg; return MT_OK;
    case O_ADAPTER: o->adapter = arg; return MT_OK;
    case O_BASE_DTYPE: return mt_arg_choice("--base-dtype", arg, "bf16|fp8|nf4|mxfp4", &o->base_dtype);
    case O_BASE_CACHE: o->base_cache = arg; return MT_OK;
    case O_OFFLOAD: o->offload = 1; return MT_OK;
    case O_RESIDENT: return mt_arg_choice("--resident-weights", arg, "auto|yes|no", &o->resident);
    case O_CKPT_EVERY: return mt_arg_choice("--checkpoint-every", arg, "auto|1|2", &o->checkpoint_every);
    case O_UPDATE_ON: return mt_arg_choice("--update-on", arg, "host|gpu|auto", &o->update_on);
    case O_SAVED_LAYERS:
        if (strcmp(arg, "auto") == 0) return o->saved_layers = -1, MT_OK;
        return mt_arg_int("--saved-layers", arg, 0, 1 << 20, &o->saved_layers);
    case O_EVAL_EVERY: return mt_arg_int("--eval-every", arg, 0, big, &o->eval_every);
    case O_EVAL_BATCHES: return mt_arg_int("--eval-batches", arg, 1, big, &o->eval_batches);
    case O_STOP_AT: return mt_arg_int("--stop-at", arg, 1, big, &o->stop_at);
    case O_THREADS: return mt_arg_int("--threads", arg, 0, 4096, &o->threads);
    case O_MAX_TIME:
        MT_TRY(mt_arg_float("--max-time", arg, 0, 1e9, &seconds));
        o->max_ms = (int64_t)(seconds * 1000);
        return MT_OK;
    }
    return mt_error_set("unknown option");
}

int mt_train_opts_parse(mt_train_opts *o, int argc, char **argv, int *exit_now) {
    *o = (mt_train_opts){.steps = 1000, .batch = 8, .lr = 3e-4, .schedule = 0, .beta1 = 0.9,
                         .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .clip = 1.0,
                         .seed = 1337, .keep = 3, .eval_batches = 8, .saved_layers = -1, .gpu_layers = -1,
                         .max_nonfinite = 3};
    *exit_now = 0;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":", long_opts, NULL)) != -1) {
        if (c == O_HELP) {
            mt_train_opts_usage(stdout);
            *exit_now = 1;
            return MT_OK;
        }
        if (c == '?') return mt_error_set("train: unknown option '%s' (see megatrain train --help)", argv[optind - 1]);
        if (c == ':') return mt_error_set("train: option '%s' needs a value", argv[optind - 1]);
        MT_TRY(parse_one(o, c, optarg));
    }
    if (optind < argc) return mt_error_set("train: unexpected argument '%s'", argv[optind]);
    if (!o->model_dir == !o->init_config) return mt_error_set("train: give exactly one of --model DIR and --init CONFIG.json");
    MT_TRY(mt_model_resolve(o->model_dir, o->revision, &o->model_dir)); /* ORG/NAME: the hub cache's snapshot */
    if (!o->data) return mt_error_set("train: --data PATH is required");
    if (!o->out_dir) return mt_error_set("train: --out DIR is required");
    if (!o->have_micro_batch) o->micro_batch = -1; /* auto: the memory planner picks it */
    if (o->micro_batch > 0 && o->batch % o->micro_batch)
        return mt_error_set("--micro-batch: %lld does not divide --batch %lld", (long long)o->micro_batch, (long long)o->batch);
    if (!o->have_min_lr) o->min_lr = o->lr / 10;
    if (!o->have_warmup) o->warmup = o->steps / 20 < 100 ? o->steps / 20 : 100;
    if (o->warmup > o->steps) return mt_error_set("--warmup: %lld is more than --steps %lld", (long long)o->warmup, (long long)o->steps);
    if (o->eval_split && o->eval_data)
        return mt_error_set("--eval-split and --eval-data: give one (the eval set held out of --data, or a file "
                            "of its own)");
    if (o->eval_every && !o->eval_data && !o->eval_split)
        return mt_error_set("--eval-every needs --eval-data or --eval-split");
    if (o->no_save && (o->save_every || o->resume)) return mt_error_set("--no-save contradicts --save-every and --resume");
    if (o->overwrite && o->resume) return mt_error_set("--overwrite starts the run in --out again; it contradicts --resume");
    if (o->resume_changed && !o->resume) return mt_error_set("--resume-changed needs --resume");
    if ((o->lora_alpha || o->lora_targets || o->base_dtype) && !o->lora && !o->adapter)
        return mt_error_set("--lora-alpha, --lora-targets and --base-dtype need --lora R (or --adapter DIR): "
                            "only a frozen base is stored quantized");
    if (o->base_cache && !o->base_dtype)
        return mt_error_set("--base-cache keeps a quantized base on disk: it needs --base-dtype fp8, nf4 or mxfp4");
    if (o->base_cache && !o->model_dir)
        return mt_error_set("--base-cache needs --model DIR (the cache is made from, and checked against, "
                            "the model's files)");
    if ((o->lora || o->adapter) && o->have_state)
        return mt_error_set("--state with LoRA: the frozen base keeps its weights alone and the adapters "
                            "their fp32 state; there is no optimizer format to choose");
    return MT_OK;
}

char *mt_train_opts_json(const mt_train_opts *o) {
    static const char *const schedules[] = {"cosine", "linear", "constant"};
    static const char *const devices[] = {"auto", "cpu", "cuda"};
    json_t *j = json_object();
    json_object_set_new(j, "model", o->model_dir ? json_string(o->model_dir) : json_null());
    json_object_set_new(j, "init", o->init_config ? json_string(o->init_config) : json_null());
    json_object_set_new(j, "data", json_string(o->data));
    json_object_set_new(j, "steps", json_integer(o->steps));
    json_object_set_new(j, "batch", json_integer(o->batch));
    json_object_set_new(j, "seq", json_integer(o->seq));
    json_object_set_new(j, "micro_batch", json_integer(o->micro_batch));
    json_object_set_new(j, "lr", json_real(o->lr));
    json_object_set_new(j, "min_lr", json_real(o->min_lr));
    json_object_set_new(j, "warmup", json_integer(o->warmup));
    json_object_set_new(j, "schedule", json_string(schedules[o->schedule]));
    json_object_set_new(j, "beta1", json_real(o->beta1));
    json_object_set_new(j, "beta2", json_real(o->beta2));
    json_object_set_new(j, "eps", json_real(o->eps));
    json_object_set_new(j, "weight_decay", json_real(o->weight_decay));
    json_object_set_new(j, "clip", json_real(o->clip));
    json_object_set_new(j, "seed", json_integer(o->seed));
    json_object_set_new(j, "shuffle", json_boolean(!o->no_shuffle));
    json_object_set_new(j, "eval_split", o->eval_split > 0 ? json_real(o->eval_split) : json_null());
    json_object_set_new(j, "device", json_string(devices[o->device]));
    json_object_set_new(j, "state", json_string(mt_state_format_name((mt_state_format)o->state)));
    json_object_set_new(j, "doc_sep", o->doc_sep ? json_string(o->doc_sep) : json_null());
    /* written also when not given (defaults), so that a resume can tell a change from an omission */
    json_object_set_new(j, "loss_on", json_string(o->loss_on == MT_CHAT_LOSS_ALL ? "all" : "assistant"));
    json_object_set_new(j, "chat_format", json_string(mt_chat_format_name((mt_chat_format)o->chat_format)));
    json_object_set_new(j, "long", json_string(mt_long_policy_name((mt_long_policy)o->long_policy)));
    json_object_set_new(j, "pack", json_string(mt_pack_policy_name((mt_pack_policy)o->pack_policy)));
    if (o->lora || o->adapter) { /* only then: a full-parameter run's arguments stay as they were */
        json_object_set_new(j, "lora", json_integer(o->lora));
        json_object_set_new(j, "lora_alpha", json_real(o->lora_alpha));
        json_object_set_new(j, "lora_targets", o->lora_targets ? json_string(o->lora_targets) : json_null());
        json_object_set_new(j, "adapter", o->adapter ? json_string(o->adapter) : json_null());
        static const char *const base[] = {"bf16", "fp8", "nf4", "mxfp4"};
        json_object_set_new(j, "base_dtype", json_string(base[o->base_dtype]));
    }
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    return s;
}

/* A value as the user would type it (strings bare, null as "(none)"); numbers with `digits`
 * significant digits. */
static void value_text(const json_t *v, int digits, char *buf, size_t n) {
    if (!v || json_is_null(v)) snprintf(buf, n, "(none)");
    else if (json_is_string(v)) snprintf(buf, n, "%s", json_string_value(v));
    else if (json_is_true(v) || json_is_false(v)) snprintf(buf, n, "%s", json_is_true(v) ? "true" : "false");
    else if (json_is_integer(v)) snprintf(buf, n, "%lld", (long long)json_integer_value(v));
    else snprintf(buf, n, "%.*g", digits, json_number_value(v));
}

/* Old and new value as text: 6 significant digits, more when those read the same. */
static void values_text(const char *key, const json_t *a, const json_t *b, char *va, char *vb, size_t n) {
    if (!strcmp(key, "shuffle")) { /* the flag says the opposite of the key */
        snprintf(va, n, "%s", json_is_true(a) ? "shuffled" : "in order");
        snprintf(vb, n, "%s", json_is_true(b) ? "shuffled" : "in order");
        return;
    }
    for (int digits = 6; digits <= 17; digits++) {
        value_text(a, digits, va, n);
        value_text(b, digits, vb, n);
        if (strcmp(va, vb) != 0) break;
    }
}

/* Two values are the same setting: equal JSON, equal numbers (1 and 1.0), or two spellings of
 * one path that exists (relative and absolute; the stored one resolved from here). */
static int same_value(const json_t *a, const json_t *b, int is_path) {
    if (json_equal((json_t *)a, (json_t *)b)) return 1;
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    if (!is_path || !json_is_string(a) || !json_is_string(b)) return 0;
    char *ra = realpath(json_string_value(a), NULL), *rb = realpath(json_string_value(b), NULL);
    int same = ra && rb && strcmp(ra, rb) == 0;
    free(ra), free(rb);
    return same;
}

int mt_train_opts_changes(const mt_train_opts *o, const char *stored_json, char **list) {
    /* the math of the remaining steps: what is read (--eval-split: which part of --data) and in
     * which order, the batch shape, the schedule (its length and warmup shape every lr) and AdamW's
     * hyper-parameters (each update's step; a changed beta mixes two averages in one moment). Not compared: --micro-batch (the
     * summation order only), the device and memory flags, threads, logging, saving, stopping. */
    static const struct { const char *key, *flag; int is_path; } keys[] = {
        {"data", "--data", 1}, {"model", "--model", 1}, {"seed", "--seed"}, {"shuffle", "--no-shuffle"},
        {"eval_split", "--eval-split"}, {"doc_sep", "--doc-sep"}, {"loss_on", "--loss-on"}, {"chat_format", "--chat-format"},
        {"long", "--long"}, {"pack", "--pack"}, {"batch", "--batch"}, {"seq", "--seq"},
        {"steps", "--steps"}, {"schedule", "--schedule"}, {"warmup", "--warmup"}, {"lr", "--lr"},
        {"min_lr", "--min-lr"}, {"beta1", "--beta1"}, {"beta2", "--beta2"}, {"eps", "--eps"},
        {"weight_decay", "--weight-decay"}, {"clip", "--clip"},
    };
    *list = NULL;
    json_error_t err;
    json_t *old = json_loads(stored_json, 0, &err);
    if (!json_is_object(old)) {
        json_decref(old);
        return -1;
    }
    char *now_text = mt_train_opts_json(o);
    json_t *now = json_loads(now_text, 0, &err);
    free(now_text);
    enum { ITEM = 1200 };
    size_t len = 0;
    char *out = mt_malloc(sizeof keys / sizeof keys[0] * ITEM + 1);
    out[0] = '\0';
    int count = 0;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const json_t *a = json_object_get(old, keys[i].key), *b = json_object_get(now, keys[i].key);
        if (!a || same_value(a, b, keys[i].is_path)) continue;
        char va[512], vb[512], item[ITEM];
        values_text(keys[i].key, a, b, va, vb, sizeof va);
        int n = snprintf(item, sizeof item, "%s%s %s -> %s", count ? ", " : "", keys[i].flag, va, vb);
        if (n >= ITEM) n = ITEM - 1; /* truncated by snprintf */
        memcpy(out + len, item, (size_t)n + 1);
        len += (size_t)n;
        count++;
    }
    json_decref(old);
    json_decref(now);
    *list = out;
    return count;
}
