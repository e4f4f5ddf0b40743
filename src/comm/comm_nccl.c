/* The NCCL comm: GPU buffers, collectives enqueued on the caller's cudaStream_t.
 *
 * One rank (a local boot comm, no mpirun) is what tests/gpu/test_cuda_dp.c runs: the engine with it
 * gives the bits of the engine without a comm. Several ranks (an mpi boot comm, one GPU a rank:
 * `mpirun -np N megatrain train --device cuda`) are what tests/gpu/test_cuda_dp_ranks.c runs on a
 * machine with 2+ GPUs: results within bf16 rounding of one rank's, not bitwise (NCCL's sum order
 * is its own).
 *
 * NCCL's unique id goes from rank 0 to the others over the boot comm (mpi; local for one rank),
 * whose timeout covers a rank that never arrives; barrier and check_same run on the host over that
 * comm too.
 *
 * Fail-fast on the GPU: a collective whose peer died or hangs never finishes, and the host thread
 * that waits for its stream would wait forever, never reaching a host collective that times out.
 * So every enqueued collective records an event, and a watchdog thread polls, every 100 ms, NCCL's
 * asynchronous error (ncclCommGetAsyncError) and the oldest unfinished event: an error, or no
 * progress for MT_COMM_TIMEOUT_S seconds (default 300; 0: no deadline, errors still end the job)
 * since that collective became the oldest, prints one line naming the rank and the collective,
 * aborts the NCCL comm (which frees the GPU's waiting kernels) and ends the process with exit 1;
 * mpirun then ends the other ranks. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_impl.h"

#define WATCH_SLOTS 256 /* collectives in flight the watchdog tracks; more wait for a free slot */
#define WATCH_POLL_NS (100 * 1000 * 1000)

typedef struct {
    cudaEvent_t done;
    const char *what;
} watch_slot;

/* The watchdog's ring of enqueued collectives, oldest at head. */
typedef struct {
    pthread_t thread;
    pthread_mutex_t mu;
    int started, stop;
    watch_slot slot[WATCH_SLOTS];
    int head, n;
    double oldest_since; /* when slot[head] became the oldest (s, CLOCK_MONOTONIC) */
} watchdog;

typedef struct {
    ncclComm_t nccl;
    mt_comm *boot;
    int device;
    double timeout_s;
    watchdog w;
} nccl_ctx;

static nccl_ctx *ctx_of(mt_comm *c) { return c->ctx; }

static ncclDataType_t nccl_type(mt_dtype dtype) {
    return dtype == MT_F32 ? ncclFloat32 : dtype == MT_U8 ? ncclUint8 : ncclBfloat16;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The watchdog's verdict: one line, the GPU freed, the process ended (mpirun ends the rest; an
 * MPI call from this thread could meet the main thread's, MPI_THREAD_SERIALIZED). */
static void watchdog_fail(mt_comm *c, const char *why) {
    fprintf(stderr, "megatrain: rank %d: %s\n", c->rank, why);
    fflush(stderr);
    ncclCommAbort(ctx_of(c)->nccl);
    _exit(1);
}

/* One look: completed collectives leave the ring; an async error or a stalled oldest one fails. */
static void watchdog_poll(mt_comm *c) {
    nccl_ctx *x = ctx_of(c);
    watchdog *w = &x->w;
    char why[512];
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(x->nccl, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
        snprintf(why, sizeof why, "NCCL failed: %s (a peer may have died)", ncclGetErrorString(async));
        watchdog_fail(c, why);
    }
    pthread_mutex_lock(&w->mu);
    while (w->n > 0) {
        cudaError_t q = cudaEventQuery(w->slot[w->head].done);
        if (q == cudaErrorNotReady) break;
        if (q != cudaSuccess) {
            snprintf(why, sizeof why, "CUDA failed in NCCL's %s: %s", w->slot[w->head].what,
                     cudaGetErrorString(q));
            pthread_mutex_unlock(&w->mu);
            watchdog_fail(c, why);
        }
        w->head = (w->head + 1) % WATCH_SLOTS;
        w->n--;
        w->oldest_since = now_s();
    }
    if (w->n > 0 && x->timeout_s > 0 && now_s() - w->oldest_since > x->timeout_s) {
        snprintf(why, sizeof why, "NCCL's %s made no progress within %g s (a peer died or hangs; "
                 "MT_COMM_TIMEOUT_S sets the wait)", w->slot[w->head].what, x->timeout_s);
        pthread_mutex_unlock(&w->mu);
        watchdog_fail(c, why);
    }
    pthread_mutex_unlock(&w->mu);
}

static void *watchdog_main(void *arg) {
    mt_comm *c = arg;
    nccl_ctx *x = ctx_of(c);
    cudaSetDevice(x->device); /* the events' device, for this thread */
    for (;;) {
        struct timespec ts = {0, WATCH_POLL_NS};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&x->w.mu);
        int stop = x->w.stop;
        pthread_mutex_unlock(&x->w.mu);
        if (stop) return NULL;
        watchdog_poll(c);
    }
}

/* After a collective is enqueued on stream: its event into the ring (waiting for a free slot). */
static int watch(mt_comm *c, void *stream, const char *what) {
    watchdog *w = &ctx_of(c)->w;
    pthread_mutex_lock(&w->mu);
    while (w->n == WATCH_SLOTS) { /* the watchdog frees slots as collectives finish */
        pthread_mutex_unlock(&w->mu);
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&w->mu);
    }
    watch_slot *s = &w->slot[(w->head + w->n) % WATCH_SLOTS];
    cudaError_t e = cudaEventRecord(s->done, (cudaStream_t)stream);
    if (e == cudaSuccess) {
        s->what = what;
        if (w->n++ == 0) w->oldest_since = now_s();
    }
    pthread_mutex_unlock(&w->mu);
    if (e != cudaSuccess)
        return mt_error_set("rank %d: cudaEventRecord after %s: %s", c->rank, what, cudaGetErrorString(e));
    return MT_OK;
}

static int nccl_result(mt_comm *c, ncclResult_t rc, const char *what, void *stream) {
    if (rc == ncclSuccess) return watch(c, stream, what);
    return mt_error_set("rank %d: NCCL failed in %s: %s (a peer may have died)", c->rank, what,
                        ncclGetErrorString(rc));
}

static void watchdog_stop(mt_comm *c) {
    watchdog *w = &ctx_of(c)->w;
    if (!w->started) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    w->started = 0;
}

static void watchdog_free(mt_comm *c) {
    watchdog *w = &ctx_of(c)->w;
    watchdog_stop(c);
    for (int i = 0; i < WATCH_SLOTS; i++)
        if (w->slot[i].done) cudaEventDestroy(w->slot[i].done);
    pthread_mutex_destroy(&w->mu);
}

static int watchdog_start(mt_comm *c) {
    watchdog *w = &ctx_of(c)->w;
    pthread_mutex_init(&w->mu, NULL);
    for (int i = 0; i < WATCH_SLOTS; i++) {
        cudaError_t e = cudaEventCreateWithFlags(&w->slot[i].done, cudaEventDisableTiming);
        if (e != cudaSuccess)
            return mt_error_set("rank %d: cudaEventCreate: %s", c->rank, cudaGetErrorString(e));
    }
    if (pthread_create(&w->thread, NULL, watchdog_main, c) != 0)
        return mt_error_set("rank %d: cannot start the NCCL watchdog thread", c->rank);
    w->started = 1;
    return MT_OK;
}

static int nccl_all_reduce(mt_comm *c, void *buf, size_t count, mt_dtype dtype, void *stream) {
    return nccl_result(c,
                       ncclAllReduce(buf, buf, count, nccl_type(dtype), ncclSum, ctx_of(c)->nccl,
                                     (cudaStream_t)stream),
                       "all_reduce", stream);
}

static int nccl_reduce_scatter(mt_comm *c, void *recv, const void *send, size_t count,
                               mt_dtype dtype, void *stream) {
    return nccl_result(c,
                       ncclReduceScatter(send, recv, count / (size_t)c->size, nccl_type(dtype),
                                         ncclSum, ctx_of(c)->nccl, (cudaStream_t)stream),
                       "reduce_scatter", stream);
}

static int nccl_all_gather(mt_comm *c, void *recv, const void *send, size_t block, mt_dtype dtype,
                           void *stream) {
    return nccl_result(c,
                       ncclAllGather(send, recv, block, nccl_type(dtype), ctx_of(c)->nccl,
                                     (cudaStream_t)stream),
                       "all_gather", stream);
}

static int nccl_barrier(mt_comm *c) {
    mt_comm *boot = ctx_of(c)->boot;
    return boot->ops->barrier(boot);
}

static int nccl_gather_host(mt_comm *c, void *recv, const void *send, size_t bytes) {
    mt_comm *boot = ctx_of(c)->boot;
    return boot->ops->gather_host(boot, recv, send, bytes);
}

static void nccl_destroy(mt_comm *c) {
    watchdog_free(c);
    ncclCommDestroy(ctx_of(c)->nccl);
    free(c->ctx);
    free(c);
}

static void nccl_abort(mt_comm *c, int code) {
    watchdog_stop(c);
    ncclCommAbort(ctx_of(c)->nccl); /* frees the GPU from collectives that wait for a dead peer */
    mt_comm_abort(ctx_of(c)->boot, code);
}

static const mt_comm_ops nccl_ops = {
    .name = "nccl",
    .all_reduce = nccl_all_reduce,
    .reduce_scatter = nccl_reduce_scatter,
    .all_gather = nccl_all_gather,
    .barrier = nccl_barrier,
    .gather_host = nccl_gather_host,
    .destroy = nccl_destroy,
    .abort = nccl_abort,
};

mt_comm *mt_comm_nccl_create(mt_comm *boot, int device, double timeout_s) {
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess) {
        mt_error_set("rank %d: CUDA device %d: %s", boot->rank, device, cudaGetErrorString(ce));
        return NULL;
    }
    /* every rank sends its id, every rank keeps rank 0's: a broadcast over the host gather */
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (boot->rank == 0) {
        ncclResult_t rc = ncclGetUniqueId(&id);
        if (rc != ncclSuccess) {
            mt_error_set("rank 0: ncclGetUniqueId: %s", ncclGetErrorString(rc));
            return NULL; /* the others time out in the gather, naming rank 0 */
        }
    }
    ncclUniqueId *all = mt_malloc(sizeof id * (size_t)boot->size);
    if (boot->ops->gather_host(boot, all, &id, sizeof id) != MT_OK) {
        free(all);
        return NULL;
    }
    id = all[0];
    free(all);
    mt_comm *c = mt_calloc(1, sizeof *c);
    nccl_ctx *n = mt_calloc(1, sizeof *n);
    n->boot = boot;
    n->device = device;
    n->timeout_s = timeout_s;
    c->ops = &nccl_ops;
    c->ctx = n;
    c->rank = boot->rank;
    c->size = boot->size;
    c->local_rank = boot->local_rank;
    c->local_size = boot->local_size;
    ncclResult_t rc = ncclCommInitRank(&n->nccl, c->size, id, c->rank);
    if (rc != ncclSuccess) {
        mt_error_set("rank %d: ncclCommInitRank on device %d: %s", c->rank, device,
                     ncclGetErrorString(rc));
        free(n);
        free(c);
        return NULL;
    }
    if (watchdog_start(c) != MT_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", mt_error_message());
        nccl_destroy(c);
        mt_error_set("%s", why);
        return NULL;
    }
    return c;
}
