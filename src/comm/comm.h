/* Communication between the ranks of a data-parallel job (issue 12): one process per GPU, launched
 * by `mpirun -np N megatrain ...`. It sits beside the backend: the schedule reduce-scatters a
 * layer's gradient and all-gathers a layer's weights through it, and never knows which it got.
 *
 * Three implementations behind one struct of function pointers (the backend's pattern):
 *  - local (comm_local.c): one rank, every collective a copy or nothing. What a process started
 *    without mpirun gets, so everything works as with no comm at all.
 *  - mpi (comm_mpi.c, builds with Open MPI): buffers in host memory (the CPU backend's compute
 *    side). SYNCHRONOUS: a call returns when its result is in the output buffer, and the input may
 *    be reused; `stream` is ignored. The caller makes sure the buffers are ready (on the CPU
 *    backend the ops are done when they return; after copy_async, event_sync first).
 *  - nccl (comm_nccl.c, builds with CUDA + NCCL; several ranks boot over MPI): buffers in GPU
 *    memory, the collective is ENQUEUED on `stream` (a cudaStream_t) and ordered with the rest
 *    of that stream's work; the call returns at once. Every rank must enqueue the same
 *    collectives in the same order (across streams too: NCCL runs one comm's kernels in that
 *    order). Checked at one rank (tests/gpu/test_cuda_dp.c); several ranks, one GPU each, by
 *    tests/gpu/test_cuda_dp_ranks.c (run under mpirun when 2+ GPUs are visible).
 *
 * Conventions for every collective:
 *  - count is in elements of dtype: MT_F32 or MT_BF16 (others are a fatal error); the reduction is
 *    a sum. all_gather, which sums nothing, also takes MT_U8.
 *  - Blocks: reduce_scatter and all_gather split a buffer of count = size * block elements into
 *    `size` equal blocks, block r belonging to rank r. count must be a multiple of size (a fatal
 *    error otherwise): the caller pads to mt_comm_padded(count, size) elements, zeros in the pad
 *    (zeros sum to zeros, and the gathered pad is ignored). all_reduce takes any count.
 *  - Sum order (local and mpi): every element is summed in fp32 in rank order,
 *    ((x_0 + x_1) + x_2) + ..., the same on every rank, whatever the block split; bf16 is converted
 *    exactly to fp32, summed, and rounded to bf16 once (nearest even). So results are bitwise
 *    deterministic and equal to that reference, and all_reduce = all_gather(reduce_scatter).
 *    nccl: NCCL's order (ring/tree), deterministic for a fixed topology, count and NCCL version,
 *    but not bitwise equal to the rank-order sum.
 *  - Errors: MT_OK, or MT_ERR with one line in mt_error_message() ("rank R: ..."). After an MT_ERR
 *    from a collective the comm is broken: the job cannot go on, and the caller prints the message
 *    and calls mt_comm_abort(), which ends every rank (a peer left waiting would hang otherwise).
 *  - Fail-fast (mpi): a collective whose peers do not all answer within MT_COMM_TIMEOUT_S seconds
 *    (environment; default 300, 0 = wait forever) is MT_ERR "rank R: no answer from rank P within
 *    N s in <collective> ...". A peer that dies is usually noticed by mpirun first, which then ends
 *    the whole job itself; the timeout covers a peer that hangs or dies unnoticed. The wait counts
 *    from the last message that arrived, so it must exceed the longest time one rank works alone
 *    while the others wait in a collective (e.g. rank 0 checksumming a checkpoint: it reads the
 *    files back, some seconds per 10 GB).
 *  - Fail-fast (nccl): the collectives are enqueued, so a dead or hanging peer shows on the GPU,
 *    where the host would wait for the stream forever; a watchdog thread (comm_nccl.c) ends the
 *    process (exit 1, mpirun then ends the rest), printing the rank and the collective, on an
 *    NCCL asynchronous error or when the oldest unfinished collective made no progress for
 *    MT_COMM_TIMEOUT_S (read by mt_comm_create_nccl; 0: errors only).
 *  - Threads: one thread at a time calls a comm (MPI_THREAD_SERIALIZED).
 */
#ifndef MT_COMM_H
#define MT_COMM_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stddef.h>

#include "core/dtype.h"
#include "core/error.h"

typedef struct mt_comm mt_comm; /* opaque */

/* The comm this process should use: mpi when it was started by mpirun (OMPI_COMM_WORLD_SIZE,
 * PMIX_RANK or PMI_RANK in the environment) with more than one rank and the build has MPI, else
 * local. NULL with mt_error_set when mpirun started several ranks but the build has no MPI (they
 * would each train alone into the same run), or when MPI fails to start. MT_COMM_TIMEOUT_S is read
 * here (a bad value is an error naming it). */
mt_comm *mt_comm_create_from_env(void);
/* The single-rank comm; never fails. */
mt_comm *mt_comm_create_local(void);
/* An NCCL comm over the same ranks as boot (an mpi comm, which bootstraps NCCL's unique id and
 * serves check_same and barrier; or, for one rank, the local comm: no mpirun needed), on CUDA
 * device `device` (mt_comm_cuda_device), which becomes this thread's current device. NULL with
 * mt_error_set on failure or when the build has no NCCL. boot must outlive it. */
mt_comm *mt_comm_create_nccl(mt_comm *boot, int device);
/* Frees the comm; for mpi, also finalizes MPI (after an MT_ERR: mt_comm_abort instead). */
void mt_comm_destroy(mt_comm *comm);
/* Ends the whole job with exit code code (mpi: MPI_Abort on every rank; local: exit). */
MT_NORETURN void mt_comm_abort(mt_comm *comm, int code);

const char *mt_comm_name(const mt_comm *comm); /* "local", "mpi", "nccl" */
int mt_comm_rank(const mt_comm *comm);         /* 0 .. size-1 */
int mt_comm_size(const mt_comm *comm);
int mt_comm_local_rank(const mt_comm *comm);   /* rank among the ranks on this host (its GPU) */
int mt_comm_local_size(const mt_comm *comm);   /* ranks on this host (they share its RAM) */

/* The ranks of a host: mpi takes them from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) (ranks that
 * share memory: one host), so local rank and size need no launcher variables and hold for any
 * launcher and for several hosts. */

/* The CUDA device of a rank: its local rank, one GPU each, when the host shows at least
 * local_size devices; device 0 when the launcher gave each rank a device of its own
 * (one_each: CUDA_VISIBLE_DEVICES set and one device visible). MT_ERR naming the counts (and what
 * to do) when the host's ranks outnumber its devices. *device unset on MT_ERR. */
int mt_comm_cuda_device(int local_rank, int local_size, int n_devices, int one_each, int *device);

/* One rank's share of the host RAM available (bytes; <= 0: unknown, returned as is): the ranks of
 * a host divide it evenly. */
double mt_comm_host_share(double available, int local_size);
/* The host RAM budget of every rank: the smallest mt_comm_host_share over the ranks (each reads
 * its own host, at its own moment), the same on every rank, so that every rank plans alike.
 * Unknown (<= 0) on any rank: unknown. COLLECTIVE (a host gather); MT_ERR if it fails. */
int mt_comm_host_budget(mt_comm *comm, double available, double *budget);

/* Whether this build has the mpi / nccl implementations. */
int mt_comm_built_with_mpi(void);
int mt_comm_built_with_nccl(void);

/* count rounded up to a multiple of size: the padded length for reduce_scatter / all_gather. */
size_t mt_comm_padded(size_t count, int size);

/* buf (count) = the sum over ranks of buf, on every rank. */
int mt_comm_all_reduce(mt_comm *comm, void *buf, size_t count, mt_dtype dtype, void *stream);
/* recv (count / size) = block `rank` of the sum over ranks of send (count). recv must not overlap
 * send, except on nccl, which also works in place: recv = send + rank * (count / size). */
int mt_comm_reduce_scatter(mt_comm *comm, void *recv, const void *send, size_t count,
                           mt_dtype dtype, void *stream);
/* recv (size * block) = the send buffers (block each) of ranks 0, 1, ... in order. send may be
 * recv's own block `rank` (in place). */
int mt_comm_all_gather(mt_comm *comm, void *recv, const void *send, size_t block, mt_dtype dtype,
                       void *stream);
/* recv (size * bytes) = every rank's `bytes` bytes, in rank order, on every rank; host memory
 * always (nccl: over its boot comm). For small host values that must add up exactly (a step's
 * target count, its loss sum in double). */
int mt_comm_all_gather_host(mt_comm *comm, void *recv, const void *send, size_t bytes);
/* Returns when every rank has called it (nccl: over its boot comm, on the host). */
int mt_comm_barrier(mt_comm *comm);
/* MT_ERR on every rank, naming what and the ranks that differ from rank 0, when the ranks' bytes
 * (n may differ too) are not all the same; host memory always. The config check at start. */
int mt_comm_check_same(mt_comm *comm, const void *bytes, size_t n, const char *what);

#ifdef __cplusplus
}
#endif

#endif
