/* Device-side spans for the trace: what the compute, H2D and D2H streams actually did and when,
 * as opposed to when the host issued it. Each span is a pair of events recorded on its stream;
 * the pairs are read back (mt_dev_trace_flush) once complete and added to the trace on the
 * stream's lane, in the trace's clock: an anchor event, recorded on an idle compute stream and
 * waited for, ties the device clock to the host's at every flush. */
#ifndef MT_DEV_TRACE_H
#define MT_DEV_TRACE_H

#include "../backend/backend.h"
#include "trace.h"

typedef struct mt_dev_trace mt_dev_trace;

/* NULL (every call below then does nothing) when t is NULL or the backend cannot time events.
 * Call with the compute stream idle. */
mt_dev_trace *mt_dev_trace_create(mt_backend *be, mt_trace *t);
void mt_dev_trace_free(mt_dev_trace *d);

/* Marks the start of a span on stream s (at the point the stream reaches it); returns a handle
 * for mt_dev_trace_end (-1 when d is NULL). */
int mt_dev_trace_begin(mt_dev_trace *d, mt_stream s);
void mt_dev_trace_end(mt_dev_trace *d, int handle, mt_stream s, mt_span_kind kind, int step,
                      int group);

/* Waits for the pending spans, adds them to the trace, and re-anchors the clocks. Call with the
 * compute stream idle (between steps). */
void mt_dev_trace_flush(mt_dev_trace *d);

#endif
