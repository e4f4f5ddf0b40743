/* What the comm implementations share (not for callers: they include comm.h). */
#ifndef MT_COMM_IMPL_H
#define MT_COMM_IMPL_H

#include "comm/comm.h"

typedef struct {
    const char *name;
    int (*all_reduce)(mt_comm *c, void *buf, size_t count, mt_dtype dtype, void *stream);
    int (*reduce_scatter)(mt_comm *c, void *recv, const void *send, size_t count, mt_dtype dtype,
                          void *stream);
    int (*all_gather)(mt_comm *c, void *recv, const void *send, size_t block, mt_dtype dtype,
                      void *stream);
    int (*barrier)(mt_comm *c);
    /* recv (size * bytes) = every rank's bytes on host memory, in rank order: what check_same
     * compares. */
    int (*gather_host)(mt_comm *c, void *recv, const void *send, size_t bytes);
    void (*destroy)(mt_comm *c);
    void (*abort)(mt_comm *c, int code); /* does not return */
} mt_comm_ops;

struct mt_comm {
    const mt_comm_ops *ops;
    int rank, size, local_rank, local_size;
    int broken; /* a collective failed: the ranks are out of step, only abort is left */
    void *ctx;
};

/* out (n) = sum over r < nblocks of blocks[r * stride + i], in fp32 in rank order; bf16 rounded
 * once at the end (the sum order comm.h promises). out may be block 0. */
void mt_comm_sum_blocks(void *out, const void *blocks, int nblocks, size_t stride, size_t n,
                        mt_dtype dtype);

/* The implementations' constructors (comm_mpi.c, comm_nccl.c exist only in builds with them). */
mt_comm *mt_comm_mpi_create(double timeout_s);
mt_comm *mt_comm_nccl_create(mt_comm *boot, int device, double timeout_s);

#endif
