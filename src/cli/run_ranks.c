#include "run_ranks.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../core/error.h"

mt_comm *mt_ranks_start(void) {
    mt_comm *comm = mt_comm_create_from_env();
    if (!comm) return NULL;
    if (mt_comm_rank(comm) > 0 && !freopen("/dev/null", "w", stdout)) {
        mt_comm_destroy(comm);
        mt_error_set("rank %d: cannot send stdout to /dev/null", mt_comm_rank(comm));
        return NULL;
    }
    return comm;
}

int mt_ranks_nccl_from_env(mt_comm *comm, int device, int n_gpus, mt_comm **out) {
    *out = NULL;
    const char *v = getenv("MT_COMM");
    int asked = v && *v, P = mt_comm_size(comm);
    if (asked && strcmp(v, "nccl") != 0)
        return mt_error_set("MT_COMM=%s: want nccl (the NCCL comm on the GPUs) or unset", v);
    if (asked && device == 1)
        return mt_error_set("MT_COMM=nccl: the NCCL comm runs on the cuda backend, not --device cpu");
    int cuda = device != 1 && n_gpus > 0; /* --device cuda without a GPU: the backend says so */
    if (P == 1 ? !asked : !cuda) return MT_OK;
    int gpu = 0;
    if (P > 1) {
        const char *visible = getenv("CUDA_VISIBLE_DEVICES");
        MT_TRY(mt_comm_cuda_device(mt_comm_local_rank(comm), mt_comm_local_size(comm), n_gpus,
                                   visible && *visible, &gpu));
    }
    *out = mt_comm_create_nccl(comm, gpu);
    if (!*out) {
        char why[1024]; /* the message is the error buffer itself */
        snprintf(why, sizeof why, "%s", mt_error_message());
        return asked ? mt_error_set("MT_COMM=nccl: %s", why)
                     : mt_error_set("rank %d: %d ranks on the cuda backend need the NCCL comm: %s",
                                    mt_comm_rank(comm), P, why);
    }
    return MT_OK;
}

int mt_ranks_agree(mt_comm *comm, int rc) {
    int P = mt_comm_size(comm), me = mt_comm_rank(comm);
    if (P == 1) return rc;
    /* each rank: failed?, and its message's hash (so the same message prints once) */
    const char *msg = mt_error_message();
    uint64_t mine[2] = {rc != MT_OK, rc != MT_OK ? XXH3_64bits(msg, strlen(msg)) : 0};
    uint64_t *all = mt_malloc(sizeof mine * (size_t)P);
    if (mt_comm_all_gather_host(comm, all, mine, sizeof mine) != MT_OK) {
        fprintf(stderr, "megatrain: %s\n", mt_error_message());
        mt_comm_abort(comm, 1);
    }
    int any = 0, shown = 0;
    for (int r = 0; r < P; r++) {
        if (!all[2 * r]) continue;
        any = 1;
        if (r < me && all[2 * r + 1] == mine[1]) shown = 1;
    }
    free(all);
    if (!any) return MT_OK;
    return rc != MT_OK && !shown ? MT_ERR : MT_RANKS_QUIET;
}

int mt_ranks_max(mt_comm *comm, int v) {
    int P = mt_comm_size(comm);
    if (P == 1) return v;
    int *all = mt_malloc(sizeof(int) * (size_t)P);
    if (mt_comm_all_gather_host(comm, all, &v, sizeof v) != MT_OK) {
        fprintf(stderr, "megatrain: %s\n", mt_error_message());
        mt_comm_abort(comm, 1);
    }
    int m = v;
    for (int r = 0; r < P; r++) m = all[r] > m ? all[r] : m;
    free(all);
    return m;
}

void mt_ranks_share(mt_comm *comm, void *buf, size_t n) {
    int P = mt_comm_size(comm);
    if (P == 1) return;
    char *all = mt_malloc(n * (size_t)P);
    if (mt_comm_all_gather_host(comm, all, buf, n) != MT_OK) {
        fprintf(stderr, "megatrain: %s\n", mt_error_message());
        mt_comm_abort(comm, 1);
    }
    memcpy(buf, all, n);
    free(all);
}

int mt_ranks_check_same(mt_comm *comm, const void *bytes, size_t n, const char *what) {
    if (mt_comm_size(comm) == 1) return MT_OK;
    return mt_comm_check_same(comm, bytes, n, what);
}

int mt_ranks_check_text(mt_comm *comm, const char *what, const char *fmt, ...) {
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return mt_ranks_check_same(comm, text, strlen(text), what);
}
