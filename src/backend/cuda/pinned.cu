/* Pinned host memory for the CUDA backend (its host_alloc / host_free), two ways:
 *   MT_PIN=alloc     (default) cudaHostAlloc: the driver maps, faults and pins the pages itself,
 *                    one thread; on the H200 host setting up ~100 GiB of plan took 85 s (7B
 *                    full) and ~77 GiB 145 s (Qwen3-30B-A3B tight, bench/RESULTS.md session 7).
 *   MT_PIN=register  buffers of 64 MiB and more (smaller ones as alloc): an anonymous mapping of
 *                    whole 2 MiB pages, transparent huge pages asked for (MADV_HUGEPAGE), its
 *                    pages faulted by several threads at once, then
 *                    cudaHostRegister pins what is already there; others report this to be about
 *                    2x faster than cudaHostAlloc at tens of GB. NOT YET MEASURED here: the
 *                    `set up in` line of train prints the time of either.
 * Either way the memory is portable: every context may copy from it. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "cuda_common.cuh"
#include "pinned.h"

namespace {

enum pin_mode { PIN_ALLOC, PIN_REGISTER };

pin_mode mode_from_env() {
    const char *e = getenv("MT_PIN");
    if (!e || !*e || strcmp(e, "alloc") == 0) return PIN_ALLOC;
    if (strcmp(e, "register") == 0) return PIN_REGISTER;
    mt_fatal(__FILE__, __LINE__, "MT_PIN=%s: expected alloc or register", e);
    return PIN_ALLOC;
}

pin_mode current_mode() {
    static const pin_mode m = mode_from_env();
    return m;
}

/* The registered mappings, so that host_free (which gets the pointer alone) unmaps the length
 * it mapped. Few entries (the engine's arenas and buffers); a linear table under a lock. */
struct mapping {
    void *p;
    size_t bytes;
};
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
mapping *g_maps = NULL;
size_t g_n = 0, g_cap = 0;

void remember(void *p, size_t bytes) {
    pthread_mutex_lock(&g_lock);
    if (g_n == g_cap) {
        g_cap = g_cap ? 2 * g_cap : 64;
        g_maps = (mapping *)realloc(g_maps, g_cap * sizeof *g_maps);
        if (!g_maps) mt_fatal(__FILE__, __LINE__, "out of memory for the pinned mappings' table");
    }
    g_maps[g_n++] = {p, bytes};
    pthread_mutex_unlock(&g_lock);
}

/* The mapped length of p, forgotten; 0 when p was not registered here (cudaHostAlloc's). */
size_t forget(void *p) {
    size_t bytes = 0;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_n; i++)
        if (g_maps[i].p == p) {
            bytes = g_maps[i].bytes;
            g_maps[i] = g_maps[--g_n];
            break;
        }
    pthread_mutex_unlock(&g_lock);
    return bytes;
}

struct fault_job {
    char *base;
    size_t from, to;
};

void *fault_pages(void *arg) {
    const fault_job *j = (const fault_job *)arg;
    /* one write a 4 KiB page faults it in (zeroed by the kernel); with huge pages most of these
     * writes land in pages already there */
    for (size_t o = j->from; o < j->to; o += 4096) j->base[o] = 0;
    return NULL;
}

/* Faults [p, p + bytes) in with up to 16 threads (the page faults, not the bandwidth, bound it):
 * shares 0 .. n-2 on new threads, the last (and any whose thread did not start) on this one. */
void fault_in(char *p, size_t bytes) {
    const size_t MAX_THREADS = 16;
    const size_t min_share = (size_t)256 << 20; /* small buffers: one thread */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t n = cpus > 1 ? ((size_t)cpus < MAX_THREADS ? (size_t)cpus : MAX_THREADS) : 1;
    if (bytes / n < min_share) n = bytes / min_share ? bytes / min_share : 1;
    size_t share = (bytes / n + 4095) & ~(size_t)4095;
    pthread_t th[MAX_THREADS];
    fault_job jobs[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (size_t i = 0; i < n; i++) {
        size_t from = i * share < bytes ? i * share : bytes;
        size_t to = from + share < bytes ? from + share : bytes;
        jobs[i] = {p, from, to};
        if (i + 1 < n) started[i] = pthread_create(&th[i], NULL, fault_pages, &jobs[i]) == 0;
    }
    for (size_t i = 0; i < n; i++)
        if (!started[i]) fault_pages(&jobs[i]);
    for (size_t i = 0; i < n; i++)
        if (started[i]) pthread_join(th[i], NULL);
}

void *register_alloc(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    size_t len = (bytes + huge - 1) & ~(huge - 1);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        mt_fatal(__FILE__, __LINE__, "cannot map %.1f MiB of host memory (mmap: %s); the host may be short of RAM",
                 len / 1048576.0, strerror(errno));
    madvise(p, len, MADV_HUGEPAGE); /* a hint: without THP the pages are 4 KiB, still correct */
    fault_in((char *)p, len);
    cudaError_t err = cudaHostRegister(p, len, cudaHostRegisterPortable);
    if (err != cudaSuccess) {
        munmap(p, len);
        mt_fatal(__FILE__, __LINE__,
                 "cannot pin %.1f MiB of host memory (cudaHostRegister: %s); the host may be short of "
                 "RAM or the locked-memory limit (ulimit -l) too low; MT_PIN=alloc uses cudaHostAlloc",
                 len / 1048576.0, cudaGetErrorString(err));
    }
    remember(p, len);
    return p;
}

} // namespace

void *mt_cuda_pinned_alloc(size_t bytes) {
    if (!bytes) bytes = 64;
    /* small buffers stay with cudaHostAlloc: a mapping of whole 2 MiB pages would waste most of it */
    if (current_mode() == PIN_REGISTER && bytes >= ((size_t)64 << 20)) return register_alloc(bytes);
    void *p = NULL;
    cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (err != cudaSuccess)
        mt_fatal(__FILE__, __LINE__,
                 "cannot pin %.1f MiB of host memory (cudaHostAlloc: %s); the host may be short of "
                 "RAM or the locked-memory limit (ulimit -l) too low",
                 bytes / 1048576.0, cudaGetErrorString(err));
    return p;
}

void mt_cuda_pinned_free(void *p) {
    if (!p) return;
    size_t len = forget(p);
    if (!len) {
        CUDA_CHECK(cudaFreeHost(p));
        return;
    }
    CUDA_CHECK(cudaHostUnregister(p));
    munmap(p, len);
}
