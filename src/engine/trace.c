#include "trace.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/error.h"

struct mt_trace {
    pthread_mutex_t mu;
    struct timespec start;
    mt_span *spans;
    int n, cap;
};

mt_trace *mt_trace_create(void) {
    mt_trace *t = mt_calloc(1, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t->start);
    return t;
}

void mt_trace_free(mt_trace *t) {
    if (!t) return;
    pthread_mutex_destroy(&t->mu);
    free(t->spans);
    free(t);
}

double mt_trace_now(const mt_trace *t) {
    if (!t) return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (ts.tv_sec - t->start.tv_sec) * 1e6 + (ts.tv_nsec - t->start.tv_nsec) * 1e-3;
}

void mt_trace_add(mt_trace *t, mt_span_kind kind, mt_trace_lane lane, int step, int group,
                  double t0, double t1) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 1024;
        mt_span *grown = realloc(t->spans, (size_t)t->cap * sizeof *grown);
        MT_CHECK(grown != NULL, "out of memory growing the trace to %d spans", t->cap);
        t->spans = grown;
    }
    t->spans[t->n++] = (mt_span){kind, lane, step, group, t0, t1};
    pthread_mutex_unlock(&t->mu);
}

mt_span *mt_trace_spans(mt_trace *t, int *n) {
    pthread_mutex_lock(&t->mu);
    *n = t->n;
    mt_span *copy = mt_malloc((size_t)(t->n ? t->n : 1) * sizeof *copy);
    if (t->n) memcpy(copy, t->spans, (size_t)t->n * sizeof *copy);
    pthread_mutex_unlock(&t->mu);
    return copy;
}

void mt_trace_clear(mt_trace *t) {
    pthread_mutex_lock(&t->mu);
    t->n = 0;
    pthread_mutex_unlock(&t->mu);
}

void mt_trace_drop_before(mt_trace *t, int step) {
    pthread_mutex_lock(&t->mu);
    int kept = 0;
    for (int i = 0; i < t->n; i++)
        if (t->spans[i].step >= step) t->spans[kept++] = t->spans[i];
    t->n = kept;
    pthread_mutex_unlock(&t->mu);
}

static const char *const span_names[MT_SPAN_KINDS] = {
    "forward", "backward", "head", "load", "grad out", "adamw", "wait optimizer", "checkpoint out",
    "checkpoint in", "remake",
};
static const char *const lane_names[MT_LANES] = {
    "host: compute issued", "host: H2D issued", "host: D2H issued", "optimizer threads",
    "stream: compute (device time)", "stream: H2D (device time)", "stream: D2H (device time)"};

const char *mt_span_name(mt_span_kind kind) { return span_names[kind]; }

double mt_trace_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

int mt_trace_write_json(mt_trace *t, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return mt_error_set("%s: cannot write the trace: %s", path, strerror(errno));
    int n;
    mt_span *s = mt_trace_spans(t, &n);
    fprintf(f, "{\"traceEvents\":[\n");
    for (int i = 0; i < MT_LANES; i++)
        fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":\"%s\"}},\n",
                i, lane_names[i]);
    for (int i = 0; i < n; i++) {
        char group[16];
        if (s[i].group < 0) snprintf(group, sizeof group, "embed");
        else snprintf(group, sizeof group, "%d", s[i].group);
        fprintf(f, "{\"ph\":\"X\",\"name\":\"%s %s\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                   "\"args\":{\"step\":%d}}%s\n",
                span_names[s[i].kind], group, (int)s[i].lane, s[i].t0, s[i].t1 - s[i].t0, s[i].step,
                i + 1 < n ? "," : "");
    }
    fprintf(f, "]}\n");
    free(s);
    if (fclose(f) != 0) return mt_error_set("%s: cannot write the trace: %s", path, strerror(errno));
    return MT_OK;
}
