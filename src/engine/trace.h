/* A timeline of what the schedule did: named spans on named lanes (the main thread, the copy
 * streams as issued, the optimizer threads), with microsecond timestamps. The tests read it to
 * prove ordering and overlap; --trace writes it as Chrome/Perfetto JSON. Thread-safe. */
#ifndef MT_TRACE_H
#define MT_TRACE_H

#include <stdint.h>

typedef enum {
    MT_LANE_MAIN = 0,   /* the thread that issues compute */
    MT_LANE_H2D = 1,
    MT_LANE_D2H = 2,
    MT_LANE_OPT = 3,    /* the optimizer thread */
    /* when the streams ran the work (dev_trace.h), not when it was issued */
    MT_LANE_DEV_COMPUTE = 4,
    MT_LANE_DEV_H2D = 5,
    MT_LANE_DEV_D2H = 6,
    MT_LANES = 7,
} mt_trace_lane;

typedef enum {
    MT_SPAN_FORWARD = 0, /* group = layer */
    MT_SPAN_BACKWARD,
    MT_SPAN_HEAD,
    MT_SPAN_LOAD,        /* weights of a group issued to the compute side */
    MT_SPAN_GRAD_OUT,    /* gradients of a group issued to the host */
    MT_SPAN_OPTIMIZER,   /* AdamW of one group */
    MT_SPAN_WAIT_OPT,    /* the main thread waiting for the optimizer */
    MT_SPAN_CKPT_OUT,    /* offload: a layer checkpoint to host memory */
    MT_SPAN_CKPT_IN,     /* offload: a layer checkpoint back */
    MT_SPAN_REMAKE,      /* sparse checkpoints: a layer's forward again in the backward, to remake
                            the next layer's input (group = the layer run) */
    MT_SPAN_KINDS,
} mt_span_kind;

typedef struct {
    mt_span_kind kind;
    mt_trace_lane lane;
    int step;
    int group;           /* layer index; -1 embed; L head */
    double t0, t1;       /* microseconds since the trace started */
} mt_span;

typedef struct mt_trace mt_trace;

mt_trace *mt_trace_create(void);
void mt_trace_free(mt_trace *t);
double mt_trace_now(const mt_trace *t);
/* Appends a span (t may be NULL: nothing recorded). */
void mt_trace_add(mt_trace *t, mt_span_kind kind, mt_trace_lane lane, int step, int group,
                  double t0, double t1);
/* A snapshot copy of the spans so far; the caller frees it. */
mt_span *mt_trace_spans(mt_trace *t, int *n);
void mt_trace_clear(mt_trace *t);
/* Drops the spans of steps before `step` (a long run keeps only the last steps' timeline). */
void mt_trace_drop_before(mt_trace *t, int step);
const char *mt_span_name(mt_span_kind kind);
/* A monotonic wall clock in milliseconds (for measurements outside a trace). */
double mt_trace_wall_ms(void);
/* Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev). MT_OK or MT_ERR naming the file. */
int mt_trace_write_json(mt_trace *t, const char *path);

#endif
