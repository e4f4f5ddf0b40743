/* The MPI comm (Open MPI): host buffers, synchronous calls, every collective built from pairwise
 * nonblocking sends and receives so that a wait can time out and name the peer that never answered
 * (MPI's own collectives block with no deadline and no culprit).
 *
 * Traffic is that of a ring: reduce_scatter sends block p to rank p and receives every rank's copy
 * of its own block, (P-1)/P of the buffer each way; it then sums the P copies in rank order (the
 * sum order comm.h promises). all_gather sends its block to every rank. all_reduce is the two in
 * a row over ceil(count/P)-element blocks (the last ones shorter or empty), so any count works. */
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_impl.h"

/* One tag per collective, so that ranks calling different collectives (a schedule bug) never
 * match each other's messages: they time out naming the peer instead. */
enum {
    TAG_REDUCE_SCATTER = 1,
    TAG_ALL_GATHER,
    TAG_ALL_REDUCE_RS,
    TAG_ALL_REDUCE_AG,
    TAG_GATHER_HOST,
};

typedef struct {
    MPI_Comm comm;    /* a duplicate of MPI_COMM_WORLD: our messages never meet anyone else's */
    double timeout_s; /* MT_COMM_TIMEOUT_S; 0: wait forever */
    int own_init;     /* MPI_Init was ours, so MPI_Finalize is too */
    void *tmp;        /* reduce_scatter's P received copies of a block */
    size_t tmp_bytes;
    /* one exchange's requests: 2 per peer (receive, send) */
    MPI_Request *reqs;
    MPI_Status *stats;
    int *idx;
    int *req_peer;
    int *req_count; /* receives: the element count expected; sends: -1 */
} mpi_ctx;

/* What one rank sends to and receives from each peer in one exchange (elements of type). */
typedef struct {
    void *recv;
    const void *send;
    size_t recv_n, send_n;
} peer_io;

static mpi_ctx *ctx_of(mt_comm *c) { return c->ctx; }

static int mpi_fail(mt_comm *c, int rc, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", rc);
    return mt_error_set("rank %d: MPI failed in %s: %s (a peer may have died)", c->rank, what, s);
}

/* bf16 travels as opaque 16-bit words: only the sum looks inside. */
static MPI_Datatype mpi_type(mt_dtype dtype) {
    switch (dtype) {
    case MT_F32: return MPI_FLOAT;
    case MT_BF16: return MPI_UINT16_T;
    default: return MPI_BYTE; /* MT_U8: the host gathers */
    }
}

static void pause_poll(int polls) {
    if (polls < 100) {
        sched_yield();
    } else {
        struct timespec ts = {0, 100 * 1000}; /* 100 us: oversubscribed ranks leave the core */
        nanosleep(&ts, NULL);
    }
}

/* Names the peers still owed a receive (or, when none, a send) after the deadline. */
static int timed_out(mt_comm *c, int n, const char *what) {
    mpi_ctx *m = ctx_of(c);
    char list[200] = "";
    size_t len = 0;
    int want_recv = 0, npeers = 0;
    for (int i = 0; i < n; i++)
        if (m->reqs[i] != MPI_REQUEST_NULL && m->req_count[i] >= 0) want_recv = 1;
    for (int i = 0; i < n && len < sizeof list - 16; i++) {
        if (m->reqs[i] == MPI_REQUEST_NULL || (m->req_count[i] >= 0) != want_recv) continue;
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", len ? ", " : "",
                                m->req_peer[i]);
        npeers++;
    }
    const char *s = npeers > 1 ? "s" : "";
    if (want_recv)
        return mt_error_set("rank %d: no answer from rank%s %s within %g s in %s (died or hanging; "
                            "MT_COMM_TIMEOUT_S sets the wait)",
                            c->rank, s, list, m->timeout_s, what);
    return mt_error_set("rank %d: rank%s %s took nothing of what was sent within %g s in %s (died "
                        "or hanging; MT_COMM_TIMEOUT_S sets the wait)",
                        c->rank, s, list, m->timeout_s, what);
}

/* Posts a receive and a send for every peer with something to move, then waits for all of them.
 * The deadline counts from the last request that completed. */
static int exchange(mt_comm *c, const peer_io *io, MPI_Datatype type, int tag, const char *what) {
    mpi_ctx *m = ctx_of(c);
    int n = 0;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank || io[p].recv_n == 0) continue;
        MT_CHECK(io[p].recv_n <= INT_MAX, "%s: %zu elements in one message", what, io[p].recv_n);
        m->req_peer[n] = p;
        m->req_count[n] = (int)io[p].recv_n;
        int rc = MPI_Irecv(io[p].recv, (int)io[p].recv_n, type, p, tag, m->comm, &m->reqs[n++]);
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, what);
    }
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank || io[p].send_n == 0) continue;
        MT_CHECK(io[p].send_n <= INT_MAX, "%s: %zu elements in one message", what, io[p].send_n);
        m->req_peer[n] = p;
        m->req_count[n] = -1;
        int rc = MPI_Isend(io[p].send, (int)io[p].send_n, type, p, tag, m->comm, &m->reqs[n++]);
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, what);
    }
    double last = MPI_Wtime();
    int left = n, polls = 0;
    while (left > 0) {
        int out = 0;
        int rc = MPI_Testsome(n, m->reqs, &out, m->idx, m->stats);
        if (rc == MPI_ERR_IN_STATUS) {
            for (int k = 0; k < out; k++)
                if (m->stats[k].MPI_ERROR != MPI_SUCCESS) rc = m->stats[k].MPI_ERROR;
        }
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, what);
        if (out == MPI_UNDEFINED) break;
        for (int k = 0; k < out; k++) {
            int i = m->idx[k], got = 0;
            if (m->req_count[i] < 0) continue;
            MPI_Get_count(&m->stats[k], type, &got);
            if (got != m->req_count[i])
                return mt_error_set("rank %d: rank %d sent %d elements in %s where %d were due "
                                    "(the ranks disagree about the buffer)",
                                    c->rank, m->req_peer[i], got, what, m->req_count[i]);
        }
        if (out > 0) {
            left -= out;
            polls = 0;
            last = MPI_Wtime();
            continue;
        }
        if (m->timeout_s > 0 && MPI_Wtime() - last > m->timeout_s) return timed_out(c, n, what);
        pause_poll(polls++);
    }
    return MT_OK;
}

static void *tmp_buffer(mt_comm *c, size_t bytes) {
    mpi_ctx *m = ctx_of(c);
    if (bytes > m->tmp_bytes) {
        free(m->tmp);
        m->tmp = mt_aligned_alloc(bytes);
        m->tmp_bytes = bytes;
    }
    return m->tmp;
}

static peer_io *peer_table(mt_comm *c) {
    peer_io *io = mt_calloc((size_t)c->size, sizeof *io);
    return io;
}

/* Block lengths of all_reduce: ceil(count/P) each, the last ones shorter or empty. */
static size_t block_len(size_t count, size_t B, int r) {
    size_t lo = (size_t)r * B;
    if (lo >= count) return 0;
    return count - lo < B ? count - lo : B;
}

/* The reduce-scatter step over blocks of stride B and lengths block_len: rank me's block
 * (length L) ends up in out, summed in rank order from tmp, where copy r came from rank r. */
static int reduce_blocks(mt_comm *c, void *out, const void *send, size_t count, size_t B,
                         mt_dtype dtype, int tag, const char *what) {
    size_t es = mt_dtype_size(dtype);
    int P = c->size, me = c->rank;
    size_t L = block_len(count, B, me);
    char *tmp = tmp_buffer(c, (size_t)P * B * es);
    peer_io *io = peer_table(c);
    for (int p = 0; p < P; p++) {
        io[p].recv = tmp + (size_t)p * B * es;
        io[p].recv_n = L;
        io[p].send = (const char *)send + (size_t)p * B * es;
        io[p].send_n = block_len(count, B, p);
    }
    memcpy(tmp + (size_t)me * B * es, (const char *)send + (size_t)me * B * es, L * es);
    int rc = exchange(c, io, mpi_type(dtype), tag, what);
    free(io);
    if (rc == MT_OK && L > 0) mt_comm_sum_blocks(out, tmp, P, B, L, dtype);
    return rc;
}

/* The all-gather step: block me of buf (already there) to every rank, block p from rank p. */
static int gather_blocks(mt_comm *c, void *buf, size_t count, size_t B, mt_dtype dtype, int tag,
                         const char *what) {
    size_t es = mt_dtype_size(dtype);
    peer_io *io = peer_table(c);
    for (int p = 0; p < c->size; p++) {
        io[p].recv = (char *)buf + (size_t)p * B * es;
        io[p].recv_n = block_len(count, B, p);
        io[p].send = (const char *)buf + (size_t)c->rank * B * es;
        io[p].send_n = block_len(count, B, c->rank);
    }
    int rc = exchange(c, io, mpi_type(dtype), tag, what);
    free(io);
    return rc;
}

static int mpi_reduce_scatter(mt_comm *c, void *recv, const void *send, size_t count,
                              mt_dtype dtype, void *stream) {
    return reduce_blocks(c, recv, send, count, count / (size_t)c->size, dtype, TAG_REDUCE_SCATTER,
                         "reduce_scatter");
}

static int mpi_all_gather(mt_comm *c, void *recv, const void *send, size_t block, mt_dtype dtype,
                          void *stream) {
    size_t es = mt_dtype_size(dtype);
    memmove((char *)recv + (size_t)c->rank * block * es, send, block * es);
    return gather_blocks(c, recv, block * (size_t)c->size, block, dtype, TAG_ALL_GATHER,
                         "all_gather");
}

static int mpi_all_reduce(mt_comm *c, void *buf, size_t count, mt_dtype dtype, void *stream) {
    size_t B = (count + (size_t)c->size - 1) / (size_t)c->size;
    char *mine = (char *)buf + (size_t)c->rank * B * mt_dtype_size(dtype);
    MT_TRY(reduce_blocks(c, mine, buf, count, B, dtype, TAG_ALL_REDUCE_RS, "all_reduce"));
    return gather_blocks(c, buf, count, B, dtype, TAG_ALL_REDUCE_AG, "all_reduce");
}

static int mpi_gather_host(mt_comm *c, void *recv, const void *send, size_t bytes) {
    memmove((char *)recv + (size_t)c->rank * bytes, send, bytes);
    return gather_blocks(c, recv, bytes * (size_t)c->size, bytes, MT_U8, TAG_GATHER_HOST,
                         "a host gather");
}

static int mpi_barrier(mt_comm *c) {
    unsigned char *all = mt_calloc((size_t)c->size, 1);
    int rc = gather_blocks(c, all, (size_t)c->size, 1, MT_U8, TAG_GATHER_HOST, "barrier");
    free(all);
    return rc;
}

static void free_ctx(mpi_ctx *m) {
    free(m->tmp);
    free(m->reqs);
    free(m->stats);
    free(m->idx);
    free(m->req_peer);
    free(m->req_count);
    free(m);
}

static void mpi_destroy(mt_comm *c) {
    mpi_ctx *m = ctx_of(c);
    MPI_Comm_free(&m->comm);
    if (m->own_init) MPI_Finalize();
    free_ctx(m);
    free(c);
}

static void mpi_abort(mt_comm *c, int code) {
    MPI_Abort(MPI_COMM_WORLD, code);
}

static const mt_comm_ops mpi_ops = {
    .name = "mpi",
    .all_reduce = mpi_all_reduce,
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .barrier = mpi_barrier,
    .gather_host = mpi_gather_host,
    .destroy = mpi_destroy,
    .abort = mpi_abort,
};

mt_comm *mt_comm_mpi_create(double timeout_s) {
    mpi_ctx *m = mt_calloc(1, sizeof *m);
    m->timeout_s = timeout_s;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
            free_ctx(m);
            mt_error_set("MPI_Init failed (was the process started by mpirun?)");
            return NULL;
        }
        m->own_init = 1;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    mt_comm *c = mt_calloc(1, sizeof *c);
    c->ops = &mpi_ops;
    c->ctx = m;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(m->comm, &c->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(m->comm, &c->size);
    MPI_Comm node = MPI_COMM_NULL;
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(node, &c->local_rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(node, &c->local_size);
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    if (rc != MPI_SUCCESS) {
        mpi_fail(c, rc, "setting up the comm");
        fprintf(stderr, "megatrain: %s\n", mt_error_message());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    size_t P = (size_t)c->size;
    m->reqs = mt_calloc(2 * P, sizeof *m->reqs);
    m->stats = mt_calloc(2 * P, sizeof *m->stats);
    m->idx = mt_calloc(2 * P, sizeof *m->idx);
    m->req_peer = mt_calloc(2 * P, sizeof *m->req_peer);
    m->req_count = mt_calloc(2 * P, sizeof *m->req_count);
    return c;
}
