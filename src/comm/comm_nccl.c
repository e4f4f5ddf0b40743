/* The NCCL comm: GPU buffers, collectives enqueued on the caller's cudaStream_t.
 *
 * One rank (a local boot comm, no mpirun) is what tests/gpu/test_cuda_dp.c runs: the engine with it
 * gives the bits of the engine without a comm. More ranks are compiled, not run: before they are
 * relied on, a 2-GPU run of test_comm_mpi's checks with device buffers (results within bf16
 * rounding of the rank-order reference, not bitwise: NCCL's sum order is its own).
 *
 * NCCL's unique id goes from rank 0 to the others over the boot comm (mpi; local for one rank),
 * whose timeout covers a rank that never arrives; barrier and check_same run on the host over that
 * comm too. Left to
 * do: a watchdog for collectives that never finish on the GPU (poll ncclCommGetAsyncError and a
 * cudaEvent with MT_COMM_TIMEOUT_S, then ncclCommAbort). */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"

typedef struct {
    ncclComm_t nccl;
    mt_comm *boot;
} nccl_ctx;

static nccl_ctx *ctx_of(mt_comm *c) { return c->ctx; }

static ncclDataType_t nccl_type(mt_dtype dtype) {
    return dtype == MT_F32 ? ncclFloat32 : dtype == MT_U8 ? ncclUint8 : ncclBfloat16;
}

static int nccl_result(mt_comm *c, ncclResult_t rc, const char *what) {
    if (rc == ncclSuccess) return MT_OK;
    return mt_error_set("rank %d: NCCL failed in %s: %s (a peer may have died)", c->rank, what,
                        ncclGetErrorString(rc));
}

static int nccl_all_reduce(mt_comm *c, void *buf, size_t count, mt_dtype dtype, void *stream) {
    return nccl_result(c,
                       ncclAllReduce(buf, buf, count, nccl_type(dtype), ncclSum, ctx_of(c)->nccl,
                                     (cudaStream_t)stream),
                       "all_reduce");
}

static int nccl_reduce_scatter(mt_comm *c, void *recv, const void *send, size_t count,
                               mt_dtype dtype, void *stream) {
    return nccl_result(c,
                       ncclReduceScatter(send, recv, count / (size_t)c->size, nccl_type(dtype),
                                         ncclSum, ctx_of(c)->nccl, (cudaStream_t)stream),
                       "reduce_scatter");
}

static int nccl_all_gather(mt_comm *c, void *recv, const void *send, size_t block, mt_dtype dtype,
                           void *stream) {
    return nccl_result(c,
                       ncclAllGather(send, recv, block, nccl_type(dtype), ctx_of(c)->nccl,
                                     (cudaStream_t)stream),
                       "all_gather");
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
    ncclCommDestroy(ctx_of(c)->nccl);
    free(c->ctx);
    free(c);
}

static void nccl_abort(mt_comm *c, int code) {
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

mt_comm *mt_comm_nccl_create(mt_comm *boot, int device) {
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
    c->ops = &nccl_ops;
    c->ctx = n;
    c->rank = boot->rank;
    c->size = boot->size;
    c->local_rank = boot->local_rank;
    ncclResult_t rc = ncclCommInitRank(&n->nccl, c->size, id, c->rank);
    if (rc != ncclSuccess) {
        mt_error_set("rank %d: ncclCommInitRank on device %d: %s", c->rank, device,
                     ncclGetErrorString(rc));
        free(n);
        free(c);
        return NULL;
    }
    return c;
}
