#include "train_log.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../core/error.h"

/* The error recorded (by io/tfevents) as a warning; then cleared, as it ends nothing. */
static void tb_warn(void) {
    fprintf(stderr, "megatrain: warning: %s; no more TensorBoard events (metrics.jsonl goes on)\n",
            mt_error_message());
    mt_error_clear();
}

/* Failures here are warnings: TensorBoard is a view of metrics.jsonl, not worth a run. */
static void tb_open(mt_train_log *lg, const char *out_dir, int64_t start_step) {
    char dir[4200];
    int64_t dropped = 0;
    snprintf(dir, sizeof dir, "%s/tensorboard", out_dir);
    if (mt_tfevents_cut(dir, start_step, &dropped) != MT_OK) { /* none rather than steps twice */
        tb_warn();
        return;
    }
    if (dropped) printf("tensorboard: %lld later events dropped from %s\n", (long long)dropped, dir);
    if (mt_tfevents_open(&lg->tb, dir, start_step > 0 ? start_step + 1 : 0) != MT_OK) tb_warn();
}

int mt_train_log_open(mt_train_log *lg, const char *out_dir, const char *log_path, int64_t steps,
                      int64_t start_step, int tensorboard) {
    int append = start_step > 0;
    memset(lg, 0, sizeof *lg);
    snprintf(lg->metrics_name, sizeof lg->metrics_name, "%s/metrics.jsonl", out_dir);
    lg->metrics = fopen(lg->metrics_name, append ? "a" : "w");
    if (!lg->metrics) return mt_error_set("%s: cannot write: %s", lg->metrics_name, strerror(errno));
    if (log_path) {
        snprintf(lg->log_name, sizeof lg->log_name, "--log %s", log_path);
        lg->log = fopen(log_path, append ? "a" : "w");
        if (!lg->log) {
            fclose(lg->metrics);
            lg->metrics = NULL;
            return mt_error_set("--log %s: cannot write: %s", log_path, strerror(errno));
        }
    }
    lg->tty = isatty(STDOUT_FILENO);
    lg->steps = steps;
    if (tensorboard) tb_open(lg, out_dir, start_step);
    return MT_OK;
}

/* The sticky error: the first failure's message, repeated by every later call. */
static int failed(mt_train_log *lg) {
    return lg->failed ? mt_error_set("%s", lg->error) : MT_OK;
}

static int write_failed(mt_train_log *lg, const char *name, int err) {
    if (!lg->failed) snprintf(lg->error, sizeof lg->error, "%s: write failed: %s", name, strerror(err));
    lg->failed = 1;
    return failed(lg);
}

/* One line to f, flushed: an error shows now, not at a later buffer flush. */
static int put_line(mt_train_log *lg, FILE *f, const char *name, const char *line) {
    if (lg->failed) return failed(lg);
    if (!f) return MT_OK; /* a log never opened: a quiet rank of a data-parallel run */
    errno = 0;
    if (fputs(line, f) < 0 || fputc('\n', f) == EOF || fflush(f) != 0)
        return write_failed(lg, name, errno ? errno : EIO);
    return MT_OK;
}

int mt_train_log_close(mt_train_log *lg) {
    if (lg->open_line) fputc('\n', stdout);
    mt_tfevents_close(&lg->tb);
    int rc = failed(lg);
    FILE *files[2] = {lg->metrics, lg->log};
    const char *names[2] = {lg->metrics_name, lg->log_name};
    for (int i = 0; i < 2; i++) {
        if (!files[i]) continue;
        errno = 0;
        if (fclose(files[i]) != 0 && rc == MT_OK) rc = write_failed(lg, names[i], errno ? errno : EIO);
    }
    char keep[sizeof lg->error];
    memcpy(keep, lg->error, sizeof keep);
    memset(lg, 0, sizeof *lg);
    if (rc != MT_OK) mt_error_set("%s", keep);
    return rc;
}

static void end_bar(mt_train_log *lg) {
    if (lg->open_line) {
        fputc('\n', stdout);
        lg->open_line = 0;
    }
}

/* Text appended at *len of buf (size n), snprintf style; a full buffer keeps what fits. */
static void add(char *buf, size_t n, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void add(char *buf, size_t n, size_t *len, const char *fmt, ...) {
    if (*len >= n) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *len, n - *len, fmt, ap);
    va_end(ap);
    if (k > 0) *len = *len + (size_t)k < n ? *len + (size_t)k : n - 1;
}

/* Values this large are printed in exponent form: a fixed-point loss of 6e30 is 31 digits that
 * nobody reads as a number (a diverged run shows them). */
#define EXP_FORM_AT 1e6
#define EXP_FORM_JSON_AT 1e15

/* The TensorBoard scalars of one metrics line (tags: string literals). */
typedef struct {
    mt_tb_scalar v[24];
    int n;
} tb_line;

/* A JSON number, or null when it is not finite (JSON has no NaN), a huge one as %.9e; with tag,
 * also the float32 of exactly that text (as a reader of the JSON gets it) into tb. */
static void add_num(char *buf, size_t n, size_t *len, const char *key, const char *fmt, double x,
                    tb_line *tb, const char *tag) {
    char text[400]; /* %.1f of the largest double */
    if (fabs(x) >= EXP_FORM_JSON_AT) snprintf(text, sizeof text, "%.9e", x);
    else snprintf(text, sizeof text, fmt, x);
    add(buf, n, len, ", \"%s\": %s", key, isfinite(x) ? text : "null");
    if (!tag || tb->n == (int)(sizeof tb->v / sizeof tb->v[0])) return;
    tb->v[tb->n++] = (mt_tb_scalar){.tag = tag, .value = isfinite(x) ? (float)strtod(text, NULL) : (float)x};
}

static void tb_write(mt_train_log *lg, int64_t step, const tb_line *tb) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (mt_tfevents_scalars(&lg->tb, step, (double)ts.tv_sec + ts.tv_nsec * 1e-9, tb->v, tb->n) != MT_OK)
        tb_warn();
}

static void format_eta(char *buf, size_t n, double s) {
    long long t = (long long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%lldh%02lldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(buf, n, "%lldm%02llds", t / 60, t % 60);
    else snprintf(buf, n, "%llds", t);
}

/* x with printf's fmt (from 1e6 on in exponent form, %.4e), or "nan" / "inf" (printf may write
 * -nan). */
static const char *num(char *buf, size_t n, const char *fmt, double x) {
    if (isnan(x)) snprintf(buf, n, "nan");
    else if (isinf(x)) snprintf(buf, n, "%sinf", x < 0 ? "-" : "");
    else if (fabs(x) >= EXP_FORM_AT) snprintf(buf, n, "%.4e", x);
    else snprintf(buf, n, fmt, x);
    return buf;
}

static void format_step(char *buf, size_t n, const mt_step_line *s, int64_t steps) {
    size_t len = 0;
    char loss[32], norm[32];
    double sec = s->ms / 1e3;
    add(buf, n, &len, "step %lld/%lld | loss %s | norm %s%s | lr %.2e | %.0f ms | %.0f tok/s | "
        "%.3f TFLOPS 6NT, %.3f with attention%s",
        (long long)s->step, (long long)steps, num(loss, sizeof loss, "%.4f", s->loss),
        num(norm, sizeof norm, "%.3f", s->grad_norm), s->clip_coef < 1.0 ? " (clipped)" : "", s->lr, s->ms,
        s->tok_per_s, s->flops / sec / 1e12, s->flops_attn / sec / 1e12, s->attn_docs ? " (in documents)" : "");
    if (s->gpu) /* GPU runs: where the time goes */
        add(buf, n, &len, " | MFU %.0f%% | GPU busy %.0f%% | H2D %.1f D2H %.1f GB/s | opt %.0f ms | GPU %.1f host %.1f GiB",
            100 * s->mfu, 100 * s->gpu_busy, s->h2d_gbs, s->d2h_gbs, s->opt_ms, s->gpu_gib, s->host_gib);
    if (s->eta_s >= 0) {
        char eta[32];
        format_eta(eta, sizeof eta, s->eta_s);
        add(buf, n, &len, " | ETA %s", eta);
    }
    if (s->skipped) add(buf, n, &len, " | non-finite: update skipped");
}

static void metrics_step(char *buf, size_t n, const mt_step_line *s, tb_line *tb) {
    size_t len = 0;
    add(buf, n, &len, "{\"step\": %lld", (long long)s->step);
    add_num(buf, n, &len, "loss", "%.6f", s->loss, tb, "train/loss");
    add_num(buf, n, &len, "lr", "%.6e", s->lr, tb, "train/lr");
    add_num(buf, n, &len, "grad_norm", "%.6f", s->grad_norm, tb, "train/grad_norm");
    add_num(buf, n, &len, "clip", "%.6f", s->clip_coef, tb, "train/clip");
    add(buf, n, &len, ", \"tokens\": %lld, \"targets\": %lld", (long long)s->tokens, (long long)s->targets);
    add_num(buf, n, &len, "ms", "%.3f", s->ms, tb, "train/step_ms");
    add_num(buf, n, &len, "tflops", "%.6f", s->flops / (s->ms / 1e3) / 1e12, tb, "train/tflops"); /* 6NT */
    add_num(buf, n, &len, "tflops_attn", "%.6f", s->flops_attn / (s->ms / 1e3) / 1e12, tb, "train/tflops_attn");
    if (s->attn_docs) add(buf, n, &len, ", \"attn_docs\": true");
    add_num(buf, n, &len, "tok_s", "%.1f", s->tok_per_s, tb, "train/tokens_per_s");
    if (s->gpu) {
        add_num(buf, n, &len, "mfu", "%.4f", s->mfu, tb, "train/mfu");
        add_num(buf, n, &len, "h2d_gbs", "%.3f", s->h2d_gbs, tb, "train/h2d_gbs");
        add_num(buf, n, &len, "d2h_gbs", "%.3f", s->d2h_gbs, tb, "train/d2h_gbs");
        add_num(buf, n, &len, "gpu_busy", "%.4f", s->gpu_busy, tb, "train/gpu_busy");
        add_num(buf, n, &len, "opt_ms", "%.1f", s->opt_ms, tb, "train/opt_ms");
        add_num(buf, n, &len, "gpu_gib", "%.3f", s->gpu_gib, tb, "train/gpu_gib");
    }
    add_num(buf, n, &len, "host_gib", "%.3f", s->host_gib, tb, "train/host_gib");
    if (s->skipped) add(buf, n, &len, ", \"nonfinite\": true, \"skipped\": true");
    add(buf, n, &len, "}");
}

int mt_train_log_step(mt_train_log *lg, const mt_step_line *s) {
    lg->flops += s->flops;
    lg->flops_attn += s->flops_attn;
    lg->step_s += s->ms / 1e3;
    lg->attn_docs |= s->attn_docs;
    char line[768];
    format_step(line, sizeof line, s, lg->steps);
    if (lg->tty) {
        int width = 20, done = (int)(width * s->step / (lg->steps ? lg->steps : 1));
        char bar[32];
        for (int i = 0; i < width; i++) bar[i] = i < done ? '#' : '.';
        bar[width] = '\0';
        printf("\r[%s] %s\033[K", bar, line);
        lg->open_line = 1;
        int64_t every = lg->steps / 20 > 0 ? lg->steps / 20 : 1;
        if (s->step % every == 0 || s->step == lg->steps || s->skipped) end_bar(lg);
    } else {
        printf("%s\n", line);
    }
    fflush(stdout);
    if (lg->log) MT_TRY(put_line(lg, lg->log, lg->log_name, line));
    char json[1024];
    tb_line tb = {.n = 0};
    metrics_step(json, sizeof json, s, &tb);
    MT_TRY(put_line(lg, lg->metrics, lg->metrics_name, json));
    tb_write(lg, s->step, &tb);
    return MT_OK;
}

int mt_train_log_eval(mt_train_log *lg, int64_t step, double eval_loss, int64_t tokens) {
    char loss[32];
    MT_TRY(mt_train_log_note(lg, "eval at step %lld: loss %s over %lld tokens", (long long)step,
                             num(loss, sizeof loss, "%.4f", eval_loss), (long long)tokens));
    char json[256];
    size_t len = 0;
    add(json, sizeof json, &len, "{\"step\": %lld", (long long)step);
    tb_line tb = {.n = 0};
    add_num(json, sizeof json, &len, "eval_loss", "%.6f", eval_loss, &tb, "eval/loss");
    add(json, sizeof json, &len, ", \"eval_tokens\": %lld}", (long long)tokens);
    MT_TRY(put_line(lg, lg->metrics, lg->metrics_name, json));
    tb_write(lg, step, &tb);
    return MT_OK;
}

void mt_train_log_throughput(const mt_train_log *lg, char *buf, size_t n) {
    if (lg->step_s <= 0) {
        snprintf(buf, n, "%s", "");
        return;
    }
    snprintf(buf, n, "%.3f TFLOPS 6NT, %.3f with attention (causal, %s) over %.1f s of steps",
             lg->flops / lg->step_s / 1e12, lg->flops_attn / lg->step_s / 1e12,
             lg->attn_docs ? "within documents" : "over full rows", lg->step_s);
}

int mt_train_log_note(mt_train_log *lg, const char *fmt, ...) {
    end_bar(lg);
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    printf("%s\n", line);
    fflush(stdout);
    return lg->log ? put_line(lg, lg->log, lg->log_name, line) : failed(lg);
}
