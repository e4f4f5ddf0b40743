#include "train_log.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

#include "../core/error.h"

int mt_train_log_open(mt_train_log *lg, const char *out_dir, const char *log_path, int64_t steps,
                      int append) {
    memset(lg, 0, sizeof *lg);
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    lg->metrics = fopen(path, append ? "a" : "w");
    if (!lg->metrics) return mt_error_set("%s: cannot write: %s", path, strerror(errno));
    if (log_path) {
        lg->log = fopen(log_path, append ? "a" : "w");
        if (!lg->log) {
            fclose(lg->metrics);
            lg->metrics = NULL;
            return mt_error_set("--log %s: cannot write: %s", log_path, strerror(errno));
        }
    }
    lg->tty = isatty(STDOUT_FILENO);
    lg->steps = steps;
    return MT_OK;
}

void mt_train_log_close(mt_train_log *lg) {
    if (lg->open_line) fputc('\n', stdout);
    if (lg->metrics) fclose(lg->metrics);
    if (lg->log) fclose(lg->log);
    memset(lg, 0, sizeof *lg);
}

static void end_bar(mt_train_log *lg) {
    if (lg->open_line) {
        fputc('\n', stdout);
        lg->open_line = 0;
    }
}

static void format_step(char *buf, size_t n, const mt_step_line *s, int64_t steps) {
    int len = snprintf(buf, n,
                       "step %lld/%lld | loss %.4f | norm %.3f%s | lr %.2e | %.0f ms | %.0f tok/s | %.3f TFLOPS",
                       (long long)s->step, (long long)steps, s->loss, s->grad_norm,
                       s->clip_coef < 1.0 ? " (clipped)" : "", s->lr, s->ms, s->tok_per_s, s->tflops);
    if (s->gpu_gb >= 0 && len > 0 && (size_t)len < n) /* GPU runs: where the time goes */
        snprintf(buf + len, n - len,
                 " | MFU %.0f%% | GPU busy %.0f%% | H2D %.1f D2H %.1f GB/s | opt %.0f ms | GPU %.1f host %.1f GB",
                 100 * s->mfu, 100 * s->gpu_busy, s->h2d_gbs, s->d2h_gbs, s->opt_ms, s->gpu_gb, s->host_gb);
}

void mt_train_log_step(mt_train_log *lg, const mt_step_line *s) {
    char line[512];
    format_step(line, sizeof line, s, lg->steps);
    if (lg->tty) {
        int width = 20, done = (int)(width * s->step / (lg->steps ? lg->steps : 1));
        char bar[32];
        for (int i = 0; i < width; i++) bar[i] = i < done ? '#' : '.';
        bar[width] = '\0';
        printf("\r[%s] %s\033[K", bar, line);
        lg->open_line = 1;
        int64_t every = lg->steps / 20 > 0 ? lg->steps / 20 : 1;
        if (s->step % every == 0 || s->step == lg->steps) end_bar(lg);
    } else {
        printf("%s\n", line);
    }
    fflush(stdout);
    if (lg->log) {
        fprintf(lg->log, "%s\n", line);
        fflush(lg->log);
    }
    fprintf(lg->metrics,
            "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, \"clip\": %.6f, "
            "\"tokens\": %lld, \"targets\": %lld, \"ms\": %.3f, \"tflops\": %.6f, \"tok_s\": %.1f, \"mfu\": %.4f, "
            "\"h2d_gbs\": %.3f, \"d2h_gbs\": %.3f, \"gpu_busy\": %.4f, \"opt_ms\": %.1f, "
            "\"gpu_gb\": %.3f, \"host_gb\": %.3f}\n",
            (long long)s->step, s->loss, s->lr, s->grad_norm, s->clip_coef, (long long)s->tokens,
            (long long)s->targets,
            s->ms, s->tflops, s->tok_per_s, s->mfu, s->h2d_gbs, s->d2h_gbs, s->gpu_busy, s->opt_ms,
            s->gpu_gb, s->host_gb);
    fflush(lg->metrics);
}

void mt_train_log_eval(mt_train_log *lg, int64_t step, double eval_loss, int64_t tokens) {
    mt_train_log_note(lg, "eval at step %lld: loss %.4f over %lld tokens", (long long)step,
                      eval_loss, (long long)tokens);
    fprintf(lg->metrics, "{\"step\": %lld, \"eval_loss\": %.6f, \"eval_tokens\": %lld}\n",
            (long long)step, eval_loss, (long long)tokens);
    fflush(lg->metrics);
}

void mt_train_log_note(mt_train_log *lg, const char *fmt, ...) {
    end_bar(lg);
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    printf("%s\n", line);
    fflush(stdout);
    if (lg->log) {
        fprintf(lg->log, "%s\n", line);
        fflush(lg->log);
    }
}
