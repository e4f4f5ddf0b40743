/* Streams and events of the CPU backend. The compute stream is the calling thread (ops run as
 * they are called); each copy stream is a worker thread running its queue in order, so the
 * schedule's ordering is real and ordering bugs show up (under ThreadSanitizer too). */
#ifndef MT_CPU_STREAMS_H
#define MT_CPU_STREAMS_H

#include "../backend.h"

typedef struct mt_cpu_streams mt_cpu_streams;

mt_cpu_streams *mt_cpu_streams_create(void);
void mt_cpu_streams_destroy(mt_cpu_streams *s);

/* Fills the stream, event and host-buffer entries of be; be->ctx must be the mt_cpu_streams. */
void mt_cpu_streams_install(mt_backend *be);

#endif
