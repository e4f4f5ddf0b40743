/* What training prints: the step line (llm.c style), a progress bar on a terminal, and the
 * machine-readable metrics.jsonl beside it.
 *
 * Every write to metrics.jsonl and to the --log file is checked (and flushed, so that a full disk
 * shows at once): the first failure makes that call and every later one return MT_ERR with
 * "PATH: write failed: <the system's reason>", and nothing more is written to either file.
 * metrics.jsonl stays JSON Lines: a non-finite number is written as null.
 *
 * TensorBoard (io/tfevents.h): every number of a metrics line also goes to OUT/tensorboard as a
 * float32 scalar (train/<key>, eval/loss), the value of the JSON text exactly (a JSON null: NaN or
 * inf). A TensorBoard failure is a warning, once, and the event file stops; training goes on. */
#ifndef MT_TRAIN_LOG_H
#define MT_TRAIN_LOG_H

#include <stdint.h>
#include <stdio.h>

#include "io/tfevents.h"

typedef struct {
    FILE *metrics;   /* OUT/metrics.jsonl */
    FILE *log;       /* --log FILE or NULL */
    char metrics_name[4200], log_name[4200]; /* how errors name them */
    int tty;         /* stdout is a terminal: progress bar */
    int64_t steps;
    double flops, flops_attn, step_s; /* summed over the steps logged: both counts, seconds */
    int attn_docs;   /* some step counted attention within documents */
    int open_line;   /* the bar line is not terminated yet */
    int failed;      /* a write failed; error holds the message */
    mt_tfevents tb;  /* OUT/tensorboard's event file (tb.fd < 0: none) */
    char error[4400];
} mt_train_log;

typedef struct {
    int64_t step;    /* steps completed (1-based) */
    double loss, lr, grad_norm, clip_coef, ms, tok_per_s;
    /* the step's FLOPs both ways (engine/flops.h): 6·N·tokens, and with the causal attention
     * counted; attn_docs: within the packed rows' documents (else over full causal rows) */
    double flops, flops_attn;
    int attn_docs;
    int64_t tokens;  /* tokens processed so far (B*T positions per step) */
    int64_t targets; /* targets with a loss in this step (what the loss is averaged over) */
    int skipped;     /* the loss or the norm was not finite: the update was not applied */
    double eta_s;    /* estimated seconds to the last step of this run (negative: not yet known) */
    /* measurements: the GPU ones only when gpu (a backend with its own memory) */
    int gpu;
    double mfu;      /* executed matmul FLOP/s over the 800 TFLOP/s bf16 GEMM rate measured on the H200 */
    double h2d_gbs, d2h_gbs, gpu_busy, opt_ms, gpu_gib;
    double host_gib;  /* resident set of the process now (GiB) */
} mt_step_line;

/* start_step > 0: a resumed run adds to both files, a fresh one starts them. MT_ERR names the file.
 * tensorboard: a new event file in OUT/tensorboard, after the older files there lost their steps
 * past start_step (as metrics.jsonl did), beginning with a restart at start_step + 1. */
int mt_train_log_open(mt_train_log *lg, const char *out_dir, const char *log_path, int64_t steps,
                      int64_t start_step, int tensorboard);
/* Closes both files; MT_ERR when a close fails (the last buffered bytes did not reach the disk) or
 * a write had failed before. */
int mt_train_log_close(mt_train_log *lg);
int mt_train_log_step(mt_train_log *lg, const mt_step_line *s);
int mt_train_log_eval(mt_train_log *lg, int64_t step, double eval_loss, int64_t tokens);
/* The throughput of the steps logged so far, both ways, for the summary: "X TFLOPS 6NT, Y with
 * attention (causal over full rows | within documents)" over their step time; "" before a step. */
void mt_train_log_throughput(const mt_train_log *lg, char *buf, size_t n);
/* A free-form line (to stdout and the log file), after ending the bar line if open. */
int mt_train_log_note(mt_train_log *lg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
