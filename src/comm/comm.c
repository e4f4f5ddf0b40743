/* The comm's dispatch, argument checks, choice of implementation and the config check. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "comm/comm_impl.h"
#include "core/error.h"

int mt_comm_built_with_mpi(void) {
#ifdef MT_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

int mt_comm_built_with_nccl(void) {
#ifdef MT_HAVE_NCCL
    return 1;
#else
    return 0;
#endif
}

/* MT_COMM_TIMEOUT_S: seconds a collective waits for its peers; 0 waits forever. */
static int parse_timeout(double *out) {
    const char *s = getenv("MT_COMM_TIMEOUT_S");
    *out = 300.0;
    if (!s || !*s) return MT_OK;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < 0)
        return mt_error_set(
            "MT_COMM_TIMEOUT_S=%s: want seconds >= 0 (default 300; 0 waits forever)", s);
    *out = v;
    return MT_OK;
}

/* The rank count mpirun announced: OMPI_COMM_WORLD_SIZE or PMI_SIZE; 0 when started by a launcher
 * that does not say (PMIX_RANK alone); -1 when not started by a launcher. */
static int launcher_size(void) {
    const char *s = getenv("OMPI_COMM_WORLD_SIZE");
    if (!s) s = getenv("PMI_SIZE");
    if (s) return atoi(s);
    if (getenv("PMIX_RANK") || getenv("PMI_RANK")) return 0;
    return -1;
}

mt_comm *mt_comm_create_from_env(void) {
    double timeout_s;
    if (parse_timeout(&timeout_s) != MT_OK) return NULL;
    int n = launcher_size();
    if (n == -1 || n == 1) return mt_comm_create_local();
#ifdef MT_HAVE_MPI
    return mt_comm_mpi_create(timeout_s);
#else
    if (n > 1)
        mt_error_set("started by mpirun with %d ranks, but this build has no MPI: install "
                     "libopenmpi-dev (scripts/deps.sh) and rebuild, or run one process", n);
    else
        mt_error_set("started by an MPI launcher, but this build has no MPI: install "
                     "libopenmpi-dev (scripts/deps.sh) and rebuild, or run one process");
    return NULL;
#endif
}

#ifndef MT_HAVE_NCCL
mt_comm *mt_comm_nccl_create(mt_comm *boot, int device, double timeout_s) {
    mt_error_set("this build has no NCCL (it needs the CUDA backend and nccl.h / libnccl at build time)");
    return NULL;
}
#endif

mt_comm *mt_comm_create_nccl(mt_comm *boot, int device) {
    /* one rank needs no launcher: the local comm hands rank 0's id to itself */
    MT_CHECK(boot && (strcmp(boot->ops->name, "mpi") == 0 || boot->size == 1),
             "the nccl comm boots from an mpi comm or a single-rank one");
    double timeout_s; /* the GPU's collectives wait as long as the host's (comm_nccl.c) */
    if (parse_timeout(&timeout_s) != MT_OK) return NULL;
    return mt_comm_nccl_create(boot, device, timeout_s);
}

void mt_comm_destroy(mt_comm *comm) {
    if (!comm) return;
    if (comm->broken) mt_comm_abort(comm, 1);
    comm->ops->destroy(comm);
}

void mt_comm_abort(mt_comm *comm, int code) {
    fflush(stdout);
    fflush(stderr);
    comm->ops->abort(comm, code);
    exit(code);
}

const char *mt_comm_name(const mt_comm *comm) { return comm->ops->name; }
int mt_comm_rank(const mt_comm *comm) { return comm->rank; }
int mt_comm_size(const mt_comm *comm) { return comm->size; }
int mt_comm_local_rank(const mt_comm *comm) { return comm->local_rank; }
int mt_comm_local_size(const mt_comm *comm) { return comm->local_size; }

int mt_comm_cuda_device(int local_rank, int local_size, int n_devices, int one_each, int *device) {
    MT_CHECK(local_rank >= 0 && local_rank < local_size, "local rank %d of %d", local_rank, local_size);
    if (local_size <= n_devices) {
        *device = local_rank;
        return MT_OK;
    }
    if (one_each && n_devices == 1) { /* the launcher's CUDA_VISIBLE_DEVICES: a device a rank */
        *device = 0;
        return MT_OK;
    }
    if (n_devices <= 0)
        return mt_error_set("local rank %d: this host shows no CUDA device to its %d ranks; use "
                            "--device cpu, or run where the GPUs are", local_rank, local_size);
    return mt_error_set("local rank %d: %d ranks on this host but %d CUDA device%s visible (one GPU "
                        "a rank): start at most %d ranks a host (mpirun -npernode %d), or give each "
                        "rank its own device in CUDA_VISIBLE_DEVICES",
                        local_rank, local_size, n_devices, n_devices == 1 ? "" : "s", n_devices, n_devices);
}

double mt_comm_host_share(double available, int local_size) {
    if (available <= 0 || local_size <= 1) return available;
    return available / local_size;
}

int mt_comm_host_budget(mt_comm *comm, double available, double *budget) {
    double mine = mt_comm_host_share(available, comm->local_size);
    *budget = mine;
    if (comm->size == 1) return MT_OK;
    double *all = mt_malloc(sizeof(double) * (size_t)comm->size);
    int rc = mt_comm_all_gather_host(comm, all, &mine, sizeof mine);
    for (int r = 0; r < comm->size && rc == MT_OK; r++) {
        if (all[r] <= 0) {
            *budget = -1;
            break;
        }
        if (all[r] < *budget) *budget = all[r];
    }
    free(all);
    return rc;
}

size_t mt_comm_padded(size_t count, int size) {
    MT_CHECK(size > 0, "size %d", size);
    return (count + (size_t)size - 1) / (size_t)size * (size_t)size;
}

static void check_dtype(mt_dtype dtype) {
    MT_CHECK(dtype == MT_F32 || dtype == MT_BF16, "comm collectives take F32 or BF16, not %s",
             mt_dtype_name(dtype));
}

/* A collective's result: an MT_ERR breaks the comm for good (its peers are out of step). */
static int done(mt_comm *comm, int rc) {
    if (rc != MT_OK) comm->broken = 1;
    return rc;
}

static int usable(mt_comm *comm) {
    if (!comm->broken) return MT_OK;
    return mt_error_set("rank %d: the comm failed earlier (%s); the job must end", comm->rank,
                        comm->ops->name);
}

int mt_comm_all_reduce(mt_comm *comm, void *buf, size_t count, mt_dtype dtype, void *stream) {
    check_dtype(dtype);
    MT_TRY(usable(comm));
    if (count == 0) return MT_OK;
    return done(comm, comm->ops->all_reduce(comm, buf, count, dtype, stream));
}

int mt_comm_reduce_scatter(mt_comm *comm, void *recv, const void *send, size_t count,
                           mt_dtype dtype, void *stream) {
    check_dtype(dtype);
    MT_CHECK(count % (size_t)comm->size == 0,
             "reduce_scatter: count %zu is not a multiple of %d ranks (pad to mt_comm_padded)",
             count, comm->size);
    MT_TRY(usable(comm));
    if (count == 0) return MT_OK;
    return done(comm, comm->ops->reduce_scatter(comm, recv, send, count, dtype, stream));
}

int mt_comm_all_gather(mt_comm *comm, void *recv, const void *send, size_t block, mt_dtype dtype,
                       void *stream) {
    /* nothing is summed: bytes too (the 8-bit moments of a checkpoint) */
    MT_CHECK(dtype == MT_F32 || dtype == MT_BF16 || dtype == MT_U8,
             "all_gather takes F32, BF16 or U8, not %s", mt_dtype_name(dtype));
    MT_TRY(usable(comm));
    if (block == 0) return MT_OK;
    return done(comm, comm->ops->all_gather(comm, recv, send, block, dtype, stream));
}

int mt_comm_all_gather_host(mt_comm *comm, void *recv, const void *send, size_t bytes) {
    MT_TRY(usable(comm));
    if (bytes == 0) return MT_OK;
    return done(comm, comm->ops->gather_host(comm, recv, send, bytes));
}

int mt_comm_barrier(mt_comm *comm) {
    MT_TRY(usable(comm));
    return done(comm, comm->ops->barrier(comm));
}

/* Each rank's length and XXH3-64 of its bytes, gathered; a difference from rank 0's fails every
 * rank alike, since every rank sees every record. */
int mt_comm_check_same(mt_comm *comm, const void *bytes, size_t n, const char *what) {
    MT_TRY(usable(comm));
    uint64_t mine[2] = {(uint64_t)n, XXH3_64bits(bytes, n)};
    uint64_t *all = mt_malloc(sizeof mine * (size_t)comm->size);
    int rc = done(comm, comm->ops->gather_host(comm, all, mine, sizeof mine));
    if (rc != MT_OK) {
        free(all);
        return rc;
    }
    char list[256] = "";
    size_t len = 0;
    int ndiff = 0;
    for (int r = 1; r < comm->size; r++) {
        if (all[2 * r] == all[0] && all[2 * r + 1] == all[1]) continue;
        if (ndiff++ < 8 && len < sizeof list - 16)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", len ? ", " : "", r);
    }
    free(all);
    if (ndiff == 0) return MT_OK;
    return mt_error_set("rank %d: the ranks differ in %s: rank%s %s%s %s from rank 0's (start "
                        "every rank with the same settings and files)",
                        comm->rank, what, ndiff > 1 ? "s" : "", list, ndiff > 8 ? ", ..." : "",
                        ndiff > 1 ? "differ" : "differs");
}

void mt_comm_sum_blocks(void *out, const void *blocks, int nblocks, size_t stride, size_t n,
                        mt_dtype dtype) {
    if (dtype == MT_F32) {
        float *o = out;
        const float *b = blocks;
#pragma omp parallel for schedule(static) if (n > (1u << 16))
        for (size_t i = 0; i < n; i++) {
            float s = b[i];
            for (int r = 1; r < nblocks; r++) s += b[(size_t)r * stride + i];
            o[i] = s;
        }
    } else {
        mt_bf16 *o = out;
        const mt_bf16 *b = blocks;
#pragma omp parallel for schedule(static) if (n > (1u << 16))
        for (size_t i = 0; i < n; i++) {
            float s = mt_bf16_to_f32(b[i]);
            for (int r = 1; r < nblocks; r++) s += mt_bf16_to_f32(b[(size_t)r * stride + i]);
            o[i] = mt_f32_to_bf16(s);
        }
    }
}
