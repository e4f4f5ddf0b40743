#include "streams.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../core/error.h"

/* An event counts records (tickets) and the highest ticket completed. An event is recorded on one
 * stream only; a waiter waits for the ticket current when it started waiting, as CUDA does. */
struct mt_event {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t recorded;
    uint64_t completed;
    struct timespec when; /* completion time of the highest ticket */
};

typedef enum { TASK_COPY, TASK_SIGNAL, TASK_WAIT, TASK_STOP } task_kind;

typedef struct task {
    task_kind kind;
    void *dst;
    const void *src;
    size_t bytes;
    mt_event *ev;
    uint64_t ticket;
    struct task *next;
} task;

typedef struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    task *head, *tail;
    mt_event *idle; /* private event for sync */
} worker;

struct mt_cpu_streams {
    worker workers[MT_STREAMS]; /* [MT_STREAM_COMPUTE] unused: compute is the caller */
};

static void event_complete(mt_event *ev, uint64_t ticket) {
    pthread_mutex_lock(&ev->mu);
    if (ticket > ev->completed) {
        ev->completed = ticket;
        clock_gettime(CLOCK_MONOTONIC, &ev->when);
    }
    pthread_cond_broadcast(&ev->cv);
    pthread_mutex_unlock(&ev->mu);
}

static uint64_t event_issue(mt_event *ev) {
    pthread_mutex_lock(&ev->mu);
    uint64_t t = ++ev->recorded;
    pthread_mutex_unlock(&ev->mu);
    return t;
}

static uint64_t event_current(mt_event *ev) {
    pthread_mutex_lock(&ev->mu);
    uint64_t t = ev->recorded;
    pthread_mutex_unlock(&ev->mu);
    return t;
}

static void event_wait_ticket(mt_event *ev, uint64_t ticket) {
    pthread_mutex_lock(&ev->mu);
    while (ev->completed < ticket) pthread_cond_wait(&ev->cv, &ev->mu);
    pthread_mutex_unlock(&ev->mu);
}

static mt_event *event_new(void) {
    mt_event *ev = mt_calloc(1, sizeof *ev);
    pthread_mutex_init(&ev->mu, NULL);
    pthread_cond_init(&ev->cv, NULL);
    return ev;
}

static void event_free(mt_event *ev) {
    pthread_mutex_destroy(&ev->mu);
    pthread_cond_destroy(&ev->cv);
    free(ev);
}

static void *worker_main(void *arg) {
    worker *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (!w->head) pthread_cond_wait(&w->cv, &w->mu);
        task *t = w->head;
        w->head = t->next;
        if (!w->head) w->tail = NULL;
        pthread_mutex_unlock(&w->mu);
        task_kind kind = t->kind;
        switch (kind) {
        case TASK_COPY: if (t->bytes) memcpy(t->dst, t->src, t->bytes); break;
        case TASK_SIGNAL: event_complete(t->ev, t->ticket); break;
        case TASK_WAIT: event_wait_ticket(t->ev, t->ticket); break;
        case TASK_STOP: break;
        }
        free(t);
        if (kind == TASK_STOP) return NULL;
    }
}

static void worker_push(worker *w, task t) {
    task *p = mt_malloc(sizeof *p);
    *p = t;
    p->next = NULL;
    pthread_mutex_lock(&w->mu);
    if (w->tail) w->tail->next = p;
    else w->head = p;
    w->tail = p;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

mt_cpu_streams *mt_cpu_streams_create(void) {
    mt_cpu_streams *s = mt_calloc(1, sizeof *s);
    for (int i = MT_STREAM_H2D; i < MT_STREAMS; i++) {
        worker *w = &s->workers[i];
        pthread_mutex_init(&w->mu, NULL);
        pthread_cond_init(&w->cv, NULL);
        w->idle = event_new();
        MT_CHECK(pthread_create(&w->thread, NULL, worker_main, w) == 0, "cannot start a copy thread");
    }
    return s;
}

void mt_cpu_streams_destroy(mt_cpu_streams *s) {
    if (!s) return;
    for (int i = MT_STREAM_H2D; i < MT_STREAMS; i++) {
        worker *w = &s->workers[i];
        worker_push(w, (task){.kind = TASK_STOP});
        pthread_join(w->thread, NULL);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        event_free(w->idle);
    }
    free(s);
}

static mt_cpu_streams *streams_of(mt_backend *be) { return (mt_cpu_streams *)be->ctx; }

static void *cpu_host_alloc(mt_backend *be, size_t bytes) { return mt_aligned_alloc(bytes); }
static void cpu_host_free(mt_backend *be, void *p) { free(p); }

static void cpu_copy_async(mt_backend *be, mt_stream s, void *dst, const void *src, size_t bytes) {
    MT_CHECK(s == MT_STREAM_H2D || s == MT_STREAM_D2H, "copies run on a copy stream, not %d", (int)s);
    worker_push(&streams_of(be)->workers[s],
                (task){.kind = TASK_COPY, .dst = dst, .src = src, .bytes = bytes});
}

static mt_event *cpu_event_create(mt_backend *be) { return event_new(); }
static void cpu_event_destroy(mt_backend *be, mt_event *ev) {
    if (ev) event_free(ev);
}

static void cpu_event_record(mt_backend *be, mt_event *ev, mt_stream s) {
    uint64_t ticket = event_issue(ev);
    if (s == MT_STREAM_COMPUTE) { /* everything enqueued on compute has already run */
        event_complete(ev, ticket);
        return;
    }
    worker_push(&streams_of(be)->workers[s], (task){.kind = TASK_SIGNAL, .ev = ev, .ticket = ticket});
}

static void cpu_stream_wait(mt_backend *be, mt_stream s, mt_event *ev) {
    uint64_t ticket = event_current(ev);
    if (s == MT_STREAM_COMPUTE) {
        event_wait_ticket(ev, ticket);
        return;
    }
    worker_push(&streams_of(be)->workers[s], (task){.kind = TASK_WAIT, .ev = ev, .ticket = ticket});
}

static void cpu_event_sync(mt_backend *be, mt_event *ev) { event_wait_ticket(ev, event_current(ev)); }

static double cpu_event_elapsed_ms(mt_backend *be, mt_event *start, mt_event *end) {
    pthread_mutex_lock(&start->mu);
    struct timespec a = start->when;
    pthread_mutex_unlock(&start->mu);
    pthread_mutex_lock(&end->mu);
    struct timespec b = end->when;
    pthread_mutex_unlock(&end->mu);
    return (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) * 1e-6;
}

static void cpu_streams_sync(mt_backend *be) {
    mt_cpu_streams *s = streams_of(be);
    for (int i = MT_STREAM_H2D; i < MT_STREAMS; i++) {
        cpu_event_record(be, s->workers[i].idle, (mt_stream)i);
        cpu_event_sync(be, s->workers[i].idle);
    }
}

void mt_cpu_streams_install(mt_backend *be) {
    be->host_alloc = cpu_host_alloc;
    be->host_free = cpu_host_free;
    be->copy_async = cpu_copy_async;
    be->event_create = cpu_event_create;
    be->event_destroy = cpu_event_destroy;
    be->event_record = cpu_event_record;
    be->stream_wait = cpu_stream_wait;
    be->event_sync = cpu_event_sync;
    be->event_elapsed_ms = cpu_event_elapsed_ms;
    be->sync = cpu_streams_sync;
}
