/* The ranks of a data-parallel run (issue 12): `mpirun -np N megatrain train ...` starts N
 * processes; what the CLI does about them, in one place.
 *
 *  - The comm comes from the environment (comm.h): without mpirun it is the local one and every
 *    command behaves exactly as before.
 *  - Rank 0 alone speaks: the others' stdout goes to /dev/null at start; they write no run file.
 *    Errors still reach stderr, each distinct message once (mt_ranks_agree).
 *  - Phases end in agreement: every rank calls mt_ranks_agree with its result, so a rank that
 *    failed (a bad file on one host, a full disk on rank 0) ends every rank at that point instead
 *    of leaving them waiting in a collective.
 *  - Settings: mt_ranks_check_same refuses, naming it, a flag or file that differs between ranks. */
#ifndef MT_RUN_RANKS_H
#define MT_RUN_RANKS_H

#include <stddef.h>
#include <stdint.h>

#include "../comm/comm.h"

/* What mt_ranks_agree returns when another rank failed, or this rank's failure is a message a
 * lower rank prints already: end with exit 1, printing nothing. */
#define MT_RANKS_QUIET 2

/* The comm of this process (mt_comm_create_from_env); on ranks > 0 stdout is sent to /dev/null.
 * NULL with the error set. */
mt_comm *mt_ranks_start(void);

/* The engine's comm on the cuda backend: the nccl comm, booted from comm, on this rank's GPU.
 *  - One rank: only when MT_COMM=nccl (environment) asks for it, on CUDA device 0, so that the
 *    engine runs its collectives on the GPU (the same bits as without). Unset or empty: *out =
 *    NULL, no comm at one rank.
 *  - Several ranks whose backend is cuda (device 2, or 0 with a GPU: n_gpus devices visible):
 *    always, on device mt_comm_cuda_device(local rank, local size, n_gpus); MT_COMM may say nccl.
 *    On the cpu backend *out = NULL (the ranks' mpi comm is the engine's).
 * MT_ERR naming MT_COMM for another value and for --device cpu (device 1, run_setup.h); naming
 * the counts when a host's ranks outnumber its GPUs; when the build has no NCCL or NCCL fails to
 * start. Call before the backend is made: the backend takes the device NCCL made current, and
 * its memory budget sees what NCCL took. */
int mt_ranks_nccl_from_env(mt_comm *comm, int device, int n_gpus, mt_comm **out);

/* Every rank's rc (MT_OK / MT_ERR, its message in mt_error_message) gathered: MT_OK when all are
 * MT_OK; MT_ERR when this rank failed and no lower rank failed with the same message (print it);
 * MT_RANKS_QUIET otherwise. A failure of the comm itself ends the job (mt_comm_abort). */
int mt_ranks_agree(mt_comm *comm, int rc);

/* The largest of every rank's v (the same on every rank): a signal that reached some ranks. */
int mt_ranks_max(mt_comm *comm, int v);

/* Rank 0's n bytes into buf on every rank (a path only rank 0 knows). A failure of the comm
 * ends the job (mt_comm_abort). */
void mt_ranks_share(mt_comm *comm, void *buf, size_t n);

/* mt_comm_check_same on n bytes, named `what` ("--batch"): MT_ERR on every rank when any rank's
 * bytes differ from rank 0's. */
int mt_ranks_check_same(mt_comm *comm, const void *bytes, size_t n, const char *what);

/* The same for a printf-formatted text. */
int mt_ranks_check_text(mt_comm *comm, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
