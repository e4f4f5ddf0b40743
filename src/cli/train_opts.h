/* The flags of `megatrain train` (docs/DESIGN.md "Command line"), parsed and checked in one place. */
#ifndef MT_TRAIN_OPTS_H
#define MT_TRAIN_OPTS_H

#include <stdint.h>
#include <stdio.h>

typedef struct {
    const char *model_dir, *init_config, *data, *out_dir, *eval_data, *log_path, *trace_path;
    int64_t steps, batch, seq, micro_batch;
    double lr, min_lr;
    int64_t warmup;
    int schedule;               /* mt_lr_kind */
    double beta1, beta2, eps, weight_decay, clip;
    int64_t seed;
    int no_shuffle;
    int device;                 /* 0 auto, 1 cpu, 2 cuda */
    int64_t gpu_mem;            /* bytes; 0 = all */
    int64_t save_every, keep;
    int resume;
    int no_save;                /* benchmarks: no checkpoint at all */
    int no_tensorboard;         /* no OUT/tensorboard event files */
    const char *revision;       /* --revision: the hub cache ref of --model ORG/NAME (NULL: main) */
    int offload;                /* layer checkpoints in host memory (also chosen when --gpu-mem is short) */
    int64_t saved_layers;       /* layers that keep their internals (skip the recompute); -1 = auto */
    int resident;               /* --resident-weights: 0 auto, 1 yes, 2 no */
    int checkpoint_every;       /* --checkpoint-every: 0 auto, 1, 2 (sparse checkpoints) */
    int update_on;              /* --update-on: 0 host, 1 gpu, 2 auto */
    int state;                  /* --state: mt_state_format (0 full) */
    int64_t gpu_layers;         /* --gpu-layers: the GPU tier's layers; -1 = auto */
    int64_t eval_every, eval_batches;
    double eval_split;          /* --eval-split: the fraction of --data held out (0: none) */
    int64_t threads;            /* optimizer threads; 0 = all cores */
    const char *doc_sep;        /* byte-level text data: document separator line */
    int chat_format;            /* chat data: mt_chat_format (0 = auto) */
    int loss_on;                /* chat data: mt_chat_loss_on */
    int long_policy;            /* chat data: mt_long_policy */
    int pack_policy;            /* chat data: mt_pack_policy (0 = whole) */
    int have_chat_flags;        /* one of the four was given */
    int64_t max_ms;             /* stop after this many ms of training (0 = no limit) */
    int64_t stop_at;            /* stop (and save) once this many steps are done (0 = --steps) */
    int nonfinite_stop;         /* --on-nonfinite: 0 skip the step's update, 1 stop at the first */
    int64_t max_nonfinite;      /* skip: stop after this many non-finite steps in a row */
    int overwrite;              /* a fresh run may replace the run already in --out */
    int resume_changed;         /* --resume may go on with settings that differ from the checkpoint's */
    int64_t lora;               /* --lora R: rank-R adapters train on a frozen base (0: every parameter) */
    double lora_alpha;          /* --lora-alpha (0: 2R, PEFT's scale alpha / R = 2) */
    double lora_dropout;        /* --lora-dropout (only 0 yet) */
    const char *lora_targets;   /* --lora-targets: PEFT's target_modules (NULL: model/lora.h's default) */
    const char *adapter;        /* --adapter DIR: the adapters start from this PEFT adapter */
    int base_dtype;             /* --base-dtype: mt_base_format of the frozen layers (0 bf16) */
    const char *base_cache;     /* --base-cache DIR: the quantized base kept on disk (NULL: not) */
    /* set when the user gave the flag (defaults that depend on others are filled afterwards) */
    int have_min_lr, have_warmup, have_micro_batch, have_seq, have_state;
} mt_train_opts;

/* Parses argv (argv[0] = "train"); prints --help and sets *exit_now when asked. MT_OK/MT_ERR. */
int mt_train_opts_parse(mt_train_opts *o, int argc, char **argv, int *exit_now);
void mt_train_opts_usage(FILE *out);
/* The options as a JSON object (stored in checkpoints); malloc'd. */
char *mt_train_opts_json(const mt_train_opts *o);
/* The settings that shape the math of the remaining steps (data and its order, batch shape,
 * schedule, AdamW) whose values in o differ from those in stored_json (a checkpoint's args):
 * "--lr 0.0003 -> 0.001, --seed 1337 -> 5" into *list (malloc'd, "" when none). Keys that
 * stored_json lacks (older checkpoints) are not compared. Returns the count, -1 when stored_json
 * is not a JSON object. */
int mt_train_opts_changes(const mt_train_opts *o, const char *stored_json, char **list);

#endif
