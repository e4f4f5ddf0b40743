/* What training prints: the step line (llm.c style), a progress bar on a terminal, and the
 * machine-readable metrics.jsonl beside it. */
#ifndef MT_TRAIN_LOG_H
#define MT_TRAIN_LOG_H

#include <stdint.h>
#include <stdio.h>

typedef struct {
    FILE *metrics;   /* OUT/metrics.jsonl */
    FILE *log;       /* --log FILE or NULL */
    int tty;         /* stdout is a terminal: progress bar */
    int64_t steps;
    int open_line;   /* the bar line is not terminated yet */
} mt_train_log;

typedef struct {
    int64_t step;    /* steps completed (1-based) */
    double loss, lr, grad_norm, clip_coef, ms, tflops, tok_per_s;
    int64_t tokens;  /* tokens processed so far (B*T positions per step) */
    int64_t targets; /* targets with a loss in this step (what the loss is averaged over) */
    /* measurements (negative: unknown) */
    double mfu;      /* executed matmul FLOP/s over the 800 TFLOP/s bf16 GEMM rate measured on the H200 */
    double h2d_gbs, d2h_gbs, gpu_busy, opt_ms, gpu_gb;
    double host_gb;  /* resident set of the process now (GB) */
} mt_step_line;

int mt_train_log_open(mt_train_log *lg, const char *out_dir, const char *log_path, int64_t steps,
                      int append);
void mt_train_log_close(mt_train_log *lg);
void mt_train_log_step(mt_train_log *lg, const mt_step_line *s);
void mt_train_log_eval(mt_train_log *lg, int64_t step, double eval_loss, int64_t tokens);
/* A free-form line (to stdout and the log file), after ending the bar line if open. */
void mt_train_log_note(mt_train_log *lg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
