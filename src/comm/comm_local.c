/* The single-rank comm: a sum over one rank is the buffer itself, a gather of one block is that
 * block. What every process started without mpirun gets. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"

static int local_all_reduce(mt_comm *c, void *buf, size_t count, mt_dtype dtype, void *stream) {
    return MT_OK;
}

static int local_reduce_scatter(mt_comm *c, void *recv, const void *send, size_t count,
                                mt_dtype dtype, void *stream) {
    memcpy(recv, send, count * mt_dtype_size(dtype));
    return MT_OK;
}

static int local_all_gather(mt_comm *c, void *recv, const void *send, size_t block, mt_dtype dtype,
                            void *stream) {
    memmove(recv, send, block * mt_dtype_size(dtype)); /* send may be recv (in place) */
    return MT_OK;
}

static int local_barrier(mt_comm *c) { return MT_OK; }

static int local_gather_host(mt_comm *c, void *recv, const void *send, size_t bytes) {
    memmove(recv, send, bytes);
    return MT_OK;
}

static void local_destroy(mt_comm *c) { free(c); }

static void local_abort(mt_comm *c, int code) { exit(code); }

static const mt_comm_ops local_ops = {
    .name = "local",
    .all_reduce = local_all_reduce,
    .reduce_scatter = local_reduce_scatter,
    .all_gather = local_all_gather,
    .barrier = local_barrier,
    .gather_host = local_gather_host,
    .destroy = local_destroy,
    .abort = local_abort,
};

mt_comm *mt_comm_create_local(void) {
    mt_comm *c = mt_calloc(1, sizeof *c);
    c->ops = &local_ops;
    c->size = 1;
    c->local_size = 1;
    return c;
}
