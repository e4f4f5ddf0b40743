#include "dev_trace.h"

#include <stdlib.h>

#include "../core/error.h"

typedef struct {
    mt_event *start, *end;
    mt_stream stream;
    mt_span_kind kind;
    int step, group, ended;
} dev_span;

struct mt_dev_trace {
    mt_backend *be;
    mt_trace *t;
    mt_event *anchor;
    double anchor_us;  /* trace time of the anchor event */
    dev_span *spans;   /* [0, n) pending; [n, cap) events kept for reuse */
    int n, cap;
};

static const mt_trace_lane lane_of[MT_STREAMS] = {MT_LANE_DEV_COMPUTE, MT_LANE_DEV_H2D,
                                                  MT_LANE_DEV_D2H};

static void anchor(mt_dev_trace *d) {
    /* the compute stream is idle, so the event completes as soon as it is recorded */
    d->anchor_us = mt_trace_now(d->t);
    d->be->event_record(d->be, d->anchor, MT_STREAM_COMPUTE);
    d->be->event_sync(d->be, d->anchor);
}

mt_dev_trace *mt_dev_trace_create(mt_backend *be, mt_trace *t) {
    if (!t || !be->event_elapsed_ms) return NULL;
    mt_dev_trace *d = mt_calloc(1, sizeof *d);
    d->be = be;
    d->t = t;
    d->anchor = be->event_create(be);
    anchor(d);
    return d;
}

void mt_dev_trace_free(mt_dev_trace *d) {
    if (!d) return;
    d->be->sync(d->be);
    for (int i = 0; i < d->cap; i++) {
        d->be->event_destroy(d->be, d->spans[i].start);
        d->be->event_destroy(d->be, d->spans[i].end);
    }
    d->be->event_destroy(d->be, d->anchor);
    free(d->spans);
    free(d);
}

int mt_dev_trace_begin(mt_dev_trace *d, mt_stream s) {
    if (!d) return -1;
    if (d->n == d->cap) {
        int cap = d->cap ? 2 * d->cap : 256;
        dev_span *grown = realloc(d->spans, (size_t)cap * sizeof *grown);
        MT_CHECK(grown != NULL, "out of memory growing the device trace to %d spans", cap);
        for (int i = d->cap; i < cap; i++)
            grown[i] = (dev_span){.start = d->be->event_create(d->be), .end = d->be->event_create(d->be)};
        d->spans = grown;
        d->cap = cap;
    }
    dev_span *sp = &d->spans[d->n];
    sp->stream = s;
    sp->ended = 0;
    d->be->event_record(d->be, sp->start, s);
    return d->n++;
}

void mt_dev_trace_end(mt_dev_trace *d, int handle, mt_stream s, mt_span_kind kind, int step,
                      int group) {
    if (!d) return;
    MT_CHECK(handle >= 0 && handle < d->n && d->spans[handle].stream == s && !d->spans[handle].ended,
             "device trace: span %d ended on the wrong stream or twice", handle);
    dev_span *sp = &d->spans[handle];
    sp->kind = kind;
    sp->step = step;
    sp->group = group;
    sp->ended = 1;
    d->be->event_record(d->be, sp->end, s);
}

void mt_dev_trace_flush(mt_dev_trace *d) {
    if (!d) return;
    for (int i = 0; i < d->n; i++) {
        dev_span *sp = &d->spans[i];
        if (!sp->ended) continue; /* begun but never ended: nothing to show */
        d->be->event_sync(d->be, sp->end);
        double t0 = d->anchor_us + 1e3 * d->be->event_elapsed_ms(d->be, d->anchor, sp->start);
        double t1 = d->anchor_us + 1e3 * d->be->event_elapsed_ms(d->be, d->anchor, sp->end);
        mt_trace_add(d->t, sp->kind, lane_of[sp->stream], sp->step, sp->group, t0, t1);
    }
    d->n = 0;
    anchor(d);
}
