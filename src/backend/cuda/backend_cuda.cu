/* The CUDA backend: memory under a --gpu-mem budget, pinned host buffers, three non-blocking streams
 * ordered by timing-free events, and the ops as thin thunks to the launchers of ops.cuh on the
 * compute stream. Compute dtype bf16; statistics and weight gradients fp32.
 *
 * be->ctx points at a cuda_state whose first member is the shared mt_cuda_ctx, so
 * mt_cuda_ctx_of(be) works for every launcher; the rest (allocation sizes for the budget, a lock)
 * is private to this file. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_cudnn.h"
#include "cuda_memory.h"
#include "ops.cuh"
#include "pinned.h"

#define MIB(x) ((double)(x) / (1024.0 * 1024.0))

struct mt_event {
    cudaEvent_t ev;
};

/* Open-addressing map: device pointer -> size, so free() can give the bytes back to the budget. */
typedef struct {
    void *p;
    size_t bytes;
} alloc_slot;

typedef struct {
    mt_cuda_ctx base; /* must stay first: be->ctx is read as an mt_cuda_ctx */
    pthread_mutex_t mu;
    alloc_slot *slots;
    size_t nslots, nlive, ntomb;
    int64_t device_total; /* the device's memory, for messages */
} cuda_state;

#define TOMBSTONE ((void *)1)

static cuda_state *state_of(mt_backend *be) { return (cuda_state *)be->ctx; }

static size_t ptr_hash(void *p, size_t mask) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x & mask;
}

static void map_put(cuda_state *st, void *p, size_t bytes);

static void map_grow(cuda_state *st) {
    alloc_slot *old = st->slots;
    size_t n = st->nslots;
    st->nslots = n ? 2 * n : 256;
    st->slots = (alloc_slot *)mt_calloc(st->nslots, sizeof(alloc_slot));
    st->nlive = st->ntomb = 0;
    for (size_t i = 0; i < n; i++)
        if (old[i].p && old[i].p != TOMBSTONE) map_put(st, old[i].p, old[i].bytes);
    free(old);
}

static void map_put(cuda_state *st, void *p, size_t bytes) {
    if ((st->nlive + st->ntomb + 1) * 2 > st->nslots) map_grow(st);
    size_t mask = st->nslots - 1, i = ptr_hash(p, mask);
    while (st->slots[i].p && st->slots[i].p != TOMBSTONE) i = (i + 1) & mask;
    if (st->slots[i].p == TOMBSTONE) st->ntomb--;
    st->slots[i].p = p;
    st->slots[i].bytes = bytes;
    st->nlive++;
}

/* Removes p and returns its size; fatal when p was not allocated here. */
static size_t map_take(cuda_state *st, void *p) {
    size_t mask = st->nslots - 1, i = st->nslots ? ptr_hash(p, mask) : 0;
    for (size_t probes = 0; st->nslots && probes < st->nslots && st->slots[i].p; probes++) {
        if (st->slots[i].p == p) {
            size_t bytes = st->slots[i].bytes;
            st->slots[i].p = TOMBSTONE;
            st->nlive--;
            st->ntomb++;
            return bytes;
        }
        i = (i + 1) & mask;
    }
    mt_fatal(__FILE__, __LINE__, "cuda free: %p was not allocated by this backend", p);
}

/* cudaMalloc under the budget. `what` names the use in the error message. */
static void *device_alloc(cuda_state *st, size_t bytes, const char *what) {
    mt_cuda_ctx *c = &st->base;
    if (bytes == 0) bytes = 256; /* a distinct, freeable pointer */
    pthread_mutex_lock(&st->mu);
    if (c->used + (int64_t)bytes > c->budget) {
        int64_t used = c->used, budget = c->budget;
        pthread_mutex_unlock(&st->mu);
        mt_fatal(__FILE__, __LINE__,
                 "GPU memory budget exceeded: %s needs %.1f MiB, %.1f MiB are in use, the budget "
                 "(--gpu-mem) is %.1f MiB of the device's %.1f MiB. Raise --gpu-mem (0 = the whole "
                 "device), or lower --micro-batch / --seq, or keep fewer layers on the GPU.",
                 what, MIB(bytes), MIB(used), MIB(budget), MIB(st->device_total));
    }
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
        int64_t used = c->used, budget = c->budget;
        pthread_mutex_unlock(&st->mu);
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        mt_fatal(__FILE__, __LINE__,
                 "GPU out of memory: %s needs %.1f MiB (%s); %.1f MiB are in use by megatrain "
                 "(budget %.1f MiB), the device has %.1f MiB free of %.1f MiB. Another process may "
                 "hold GPU memory; lower --gpu-mem, --micro-batch or --seq.",
                 what, MIB(bytes), cudaGetErrorString(err), MIB(used), MIB(budget), MIB(free_b),
                 MIB(total_b));
    }
    c->used += (int64_t)bytes;
    map_put(st, p, bytes);
    pthread_mutex_unlock(&st->mu);
    return p;
}

static void device_free(cuda_state *st, void *p) {
    if (!p) return;
    pthread_mutex_lock(&st->mu);
    size_t bytes = map_take(st, p);
    st->base.used -= (int64_t)bytes;
    pthread_mutex_unlock(&st->mu);
    CUDA_CHECK(cudaFree(p));
}

/* ---------------- memory ---------------- */

static void *cuda_alloc(mt_backend *be, size_t bytes) {
    return device_alloc(state_of(be), bytes, "an allocation");
}
static void cuda_free(mt_backend *be, void *p) {
    mt_cuda_attention_forget_documents(p); /* a later array at p holds no noted documents */
    device_free(state_of(be), p);
}

static void cuda_zero(mt_backend *be, void *p, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, mt_cuda_compute_stream(be)));
}

/* Synchronous with respect to the compute stream: ordered after the ops enqueued before. */
static void cuda_upload(mt_backend *be, void *dst, const void *host_src, size_t bytes) {
    if (!bytes) return;
    cudaStream_t s = mt_cuda_compute_stream(be);
    CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
}
static void cuda_download(mt_backend *be, void *host_dst, const void *src, size_t bytes) {
    if (!bytes) return;
    cudaStream_t s = mt_cuda_compute_stream(be);
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
}

static void cuda_sync(mt_backend *be) {
    CUDA_CHECK(cudaSetDevice(mt_cuda_ctx_of(be)->device));
    CUDA_CHECK(cudaDeviceSynchronize());
}

void *mt_cuda_scratch(mt_backend *be, size_t bytes) {
    cuda_state *st = state_of(be);
    mt_cuda_ctx *c = &st->base;
    if (bytes <= c->scratch_bytes && c->scratch) return c->scratch;
    if (c->scratch) {
        /* kernels enqueued before may still read the old buffer */
        CUDA_CHECK(cudaStreamSynchronize(c->streams[MT_STREAM_COMPUTE]));
        device_free(st, c->scratch);
        c->scratch = NULL;
        c->scratch_bytes = 0;
    }
    c->scratch = device_alloc(st, bytes, "the op scratch buffer");
    c->scratch_bytes = bytes;
    return c->scratch;
}

/* ---------------- host buffers, copies, events ---------------- */

/* pinned.cu: cudaHostAlloc, or with MT_PIN=register pages faulted first and then registered */
static void *cuda_host_alloc(mt_backend *be, size_t bytes) { return mt_cuda_pinned_alloc(bytes); }
static void cuda_host_free(mt_backend *be, void *p) { mt_cuda_pinned_free(p); }

static void cuda_copy_async(mt_backend *be, mt_stream s, void *dst, const void *src, size_t bytes) {
    MT_CHECK(s == MT_STREAM_H2D || s == MT_STREAM_D2H, "copies run on a copy stream, not %d", (int)s);
    if (!bytes) return;
    cudaMemcpyKind kind = s == MT_STREAM_H2D ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    /* other threads copy too (the optimizer's fetches): on a rank whose GPU is not device 0, a
     * thread's first runtime call would otherwise make a context on device 0 */
    CUDA_CHECK(cudaSetDevice(mt_cuda_ctx_of(be)->device));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, mt_cuda_ctx_of(be)->streams[s]));
}

static void *cuda_native_stream(mt_backend *be, mt_stream s) {
    MT_CHECK(s >= 0 && s < MT_STREAMS, "no stream %d", (int)s);
    return (void *)mt_cuda_ctx_of(be)->streams[s];
}

static mt_event *cuda_event_create(mt_backend *be) {
    mt_event *e = (mt_event *)mt_calloc(1, sizeof *e);
    /* timing stays enabled: the engine measures the compute stream's busy time with these */
    CUDA_CHECK(cudaEventCreateWithFlags(&e->ev, cudaEventDefault));
    return e;
}
static void cuda_event_destroy(mt_backend *be, mt_event *e) {
    if (!e) return;
    CUDA_CHECK(cudaEventDestroy(e->ev));
    free(e);
}
static void cuda_event_record(mt_backend *be, mt_event *e, mt_stream s) {
    MT_CHECK(s >= 0 && s < MT_STREAMS, "no stream %d", (int)s);
    CUDA_CHECK(cudaSetDevice(mt_cuda_ctx_of(be)->device)); /* as in cuda_copy_async */
    CUDA_CHECK(cudaEventRecord(e->ev, mt_cuda_ctx_of(be)->streams[s]));
}
static void cuda_stream_wait(mt_backend *be, mt_stream s, mt_event *e) {
    MT_CHECK(s >= 0 && s < MT_STREAMS, "no stream %d", (int)s);
    CUDA_CHECK(cudaSetDevice(mt_cuda_ctx_of(be)->device)); /* as in cuda_copy_async */
    CUDA_CHECK(cudaStreamWaitEvent(mt_cuda_ctx_of(be)->streams[s], e->ev, 0));
}
/* Called from other threads too (the optimizer): the runtime API is thread-safe; the device is made
 * current on the calling thread first. */
static void cuda_event_sync(mt_backend *be, mt_event *e) {
    CUDA_CHECK(cudaSetDevice(mt_cuda_ctx_of(be)->device));
    CUDA_CHECK(cudaEventSynchronize(e->ev));
}

static double cuda_event_elapsed_ms(mt_backend *be, mt_event *start, mt_event *end) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start->ev, end->ev));
    return ms;
}

static size_t cuda_mem_used(mt_backend *be) { return (size_t)mt_cuda_ctx_of(be)->used; }

static void cuda_destroy(mt_backend *be) {
    cuda_state *st = state_of(be);
    mt_cuda_ctx *c = &st->base;
    CUDA_CHECK(cudaSetDevice(c->device));
    CUDA_CHECK(cudaDeviceSynchronize());
    mt_cuda_moe_gemm_free(c);
    mt_cuda_gd_blas_free(c);
    if (c->scratch) device_free(st, c->scratch);
    device_free(st, c->lt_workspace);
    CUBLAS_CHECK(cublasLtDestroy(c->lt));
    for (int i = 0; i < MT_STREAMS; i++) CUDA_CHECK(cudaStreamDestroy(c->streams[i]));
    pthread_mutex_destroy(&st->mu);
    free(st->slots);
    free(st);
    free(be);
}

/* ---------------- ops: thunks to the launchers ---------------- */

#define S(be) mt_cuda_compute_stream(be)

static void cu_embedding_forward(mt_backend *be, void *out, const int32_t *ids, const void *table,
                                 int N, int C) {
    mt_cuda_embedding_forward((bf16 *)out, ids, (const bf16 *)table, N, C, S(be));
}
static void cu_embedding_backward(mt_backend *be, float *dtable, const void *dout,
                                  const int32_t *ids, int N, int C) {
    mt_cuda_embedding_backward(dtable, (const bf16 *)dout, ids, N, C, S(be));
}
static void cu_rmsnorm_forward(mt_backend *be, void *out, float *rstd, const void *inp,
                               const void *weight, int R, int C, float eps, float w_offset) {
    mt_cuda_rmsnorm_forward((bf16 *)out, rstd, (const bf16 *)inp, (const bf16 *)weight, R, C, eps,
                            w_offset, S(be));
}
static void cu_rmsnorm_backward(mt_backend *be, void *dinp, float *dweight, const void *dout,
                                const void *inp, const void *weight, const float *rstd, int R,
                                int C, int accumulate, float w_offset) {
    mt_cuda_rmsnorm_backward((bf16 *)dinp, dweight, (const bf16 *)dout, (const bf16 *)inp,
                             (const bf16 *)weight, rstd, R, C, accumulate, w_offset, S(be));
}
static void cu_matmul_forward(mt_backend *be, void *out, const void *inp, const void *weight,
                              const void *bias, int R, int K, int M) {
    mt_cuda_matmul_forward(mt_cuda_ctx_of(be), (bf16 *)out, (const bf16 *)inp,
                           (const bf16 *)weight, (const bf16 *)bias, R, K, M, S(be));
}
static void cu_matmul_forward_add(mt_backend *be, void *out, const void *inp, const void *weight,
                                  int R, int K, int M) {
    mt_cuda_matmul_forward_add(mt_cuda_ctx_of(be), (bf16 *)out, (const bf16 *)inp,
                               (const bf16 *)weight, R, K, M, S(be));
}
static void cu_matmul_backward(mt_backend *be, void *dinp, float *dweight, float *dbias,
                               const void *dout, const void *inp, const void *weight, int R, int K,
                               int M, int accumulate) {
    mt_cuda_matmul_backward(mt_cuda_ctx_of(be), (bf16 *)dinp, dweight, dbias, (const bf16 *)dout,
                            (const bf16 *)inp, (const bf16 *)weight, R, K, M, accumulate, S(be));
}
static void cu_rope_forward(mt_backend *be, void *x, const int32_t *pos, const float *inv_freq,
                            int N, int nh, int D, int rd) {
    mt_cuda_rope_forward((bf16 *)x, pos, inv_freq, N, nh, D, rd, S(be));
}
static void cu_rope_backward(mt_backend *be, void *dx, const int32_t *pos, const float *inv_freq,
                             int N, int nh, int D, int rd) {
    mt_cuda_rope_backward((bf16 *)dx, pos, inv_freq, N, nh, D, rd, S(be));
}
/* Every mt_attention_opts option (attention.cu; cuDNN only for the plain attention). */
static void cu_attention_forward(mt_backend *be, void *out, float *lse, const void *q,
                                 const void *k, const void *v, const int32_t *doc_start, int B,
                                 int T, int H, int G, int D, const mt_attention_opts *opts) {
    mt_cuda_attention_forward(mt_cuda_ctx_of(be), (bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v,
                              doc_start, B, T, H, G, D, S(be), opts);
}
static void cu_attention_backward(mt_backend *be, void *dq, void *dk, void *dv, const void *dout,
                                  const void *out, const float *lse, const void *q, const void *k,
                                  const void *v, const int32_t *doc_start, int B, int T, int H,
                                  int G, int D, const mt_attention_opts *opts) {
    mt_cuda_attention_backward(mt_cuda_ctx_of(be), (bf16 *)dq, (bf16 *)dk, (bf16 *)dv,
                               (const bf16 *)dout, (const bf16 *)out, lse, (const bf16 *)q,
                               (const bf16 *)k, (const bf16 *)v, doc_start, B, T, H, G, D, S(be),
                               opts);
}
static void cu_note_documents(mt_backend *be, const int32_t *doc_start,
                              const int32_t *host_doc_start, int B, int T) {
    mt_cuda_attention_note_documents(doc_start, host_doc_start, B, T);
}
static void cu_moe_route(mt_backend *be, float *probs, int32_t *top_idx, float *top_w,
                         int32_t *counts, float *prob_sum, const void *logits, int n, int E, int k,
                         int renorm) {
    mt_cuda_moe_route(probs, top_idx, top_w, counts, prob_sum, (const bf16 *)logits, n, E, k, renorm,
                      S(be));
}
static void cu_moe_group(mt_backend *be, int32_t *perm, int32_t *inv, int32_t *offsets,
                         const int32_t *top_idx, int n, int E, int k) {
    mt_cuda_moe_group(perm, inv, offsets, top_idx, n, E, k, S(be));
}
static void cu_moe_gather(mt_backend *be, void *xg, const void *x, const int32_t *perm, int n, int C,
                          int k) {
    mt_cuda_moe_gather((bf16 *)xg, (const bf16 *)x, perm, n, C, k, S(be));
}
static void cu_moe_gather_backward(mt_backend *be, void *dx, const void *dxg, const int32_t *inv,
                                   int n, int C, int k, int accumulate) {
    mt_cuda_moe_gather_backward((bf16 *)dx, (const bf16 *)dxg, inv, n, C, k, accumulate, S(be));
}
static void cu_moe_combine(mt_backend *be, void *out, const void *y, const float *top_w,
                           const int32_t *inv, int n, int C, int k) {
    mt_cuda_moe_combine((bf16 *)out, (const bf16 *)y, top_w, inv, n, C, k, S(be));
}
static void cu_moe_combine_backward(mt_backend *be, void *dy, float *d_w, const void *dout,
                                    const void *y, const float *top_w, const int32_t *inv, int n,
                                    int C, int k) {
    mt_cuda_moe_combine_backward((bf16 *)dy, d_w, (const bf16 *)dout, (const bf16 *)y, top_w, inv, n,
                                 C, k, S(be));
}
static void cu_moe_route_backward(mt_backend *be, void *d_logits, const float *d_w,
                                  const float *probs, const int32_t *top_idx, const float *top_w,
                                  const float *aux_grad, int n, int E, int k, int renorm) {
    mt_cuda_moe_route_backward((bf16 *)d_logits, d_w, probs, top_idx, top_w, aux_grad, n, E, k,
                               renorm, S(be));
}
static void cu_moe_matmul_forward(mt_backend *be, void *out, const void *inp, const void *weight,
                                  size_t w_stride, const int32_t *offsets,
                                  const int32_t *offsets_host, int E, int K, int M) {
    mt_cuda_ctx *c = mt_cuda_ctx_of(be);
    if (!mt_moe_gemm_use_grouped((mt_moe_gemm_mode)c->moe_gemm_mode, offsets_host[E], E)) {
        mt_backend_moe_matmul_loop_forward(be, out, inp, weight, w_stride, offsets, offsets_host,
                                           E, K, M);
        return;
    }
    mt_cuda_moe_matmul_forward(c, (bf16 *)out, (const bf16 *)inp, (const bf16 *)weight, w_stride,
                               offsets, offsets_host, E, K, M, S(be));
}
static void cu_moe_matmul_backward(mt_backend *be, void *dinp, float *dweight, const void *dout,
                                   const void *inp, const void *weight, size_t w_stride,
                                   const int32_t *offsets, const int32_t *offsets_host, int E,
                                   int K, int M, int accumulate) {
    mt_cuda_ctx *c = mt_cuda_ctx_of(be);
    if (!mt_moe_gemm_use_grouped((mt_moe_gemm_mode)c->moe_gemm_mode, offsets_host[E], E)) {
        mt_backend_moe_matmul_loop_backward(be, dinp, dweight, dout, inp, weight, w_stride, offsets,
                                            offsets_host, E, K, M, accumulate);
        return;
    }
    if (!mt_cuda_moe_matmul_backward(c, (bf16 *)dinp, dweight, (const bf16 *)dout,
                                     (const bf16 *)inp, (const bf16 *)weight, w_stride, offsets,
                                     offsets_host, E, K, M, accumulate, S(be)) &&
        !mt_cuda_moe_dweight_padded(be, dweight, (const bf16 *)dout, (const bf16 *)inp, w_stride,
                                    offsets, offsets_host, E, K, M, S(be)))
        mt_backend_moe_matmul_loop_backward(be, NULL, dweight, dout, inp, weight, w_stride, offsets,
                                            offsets_host, E, K, M, 0);
}
static void cu_moe_matmul_io_forward(mt_backend *be, void *out, const void *inp,
                                     const void *weight, const void *bias, const int32_t *offsets,
                                     const int32_t *offsets_host, int E, int K, int M) {
    mt_cuda_moe_matmul_io_forward(mt_cuda_ctx_of(be), (bf16 *)out, (const bf16 *)inp,
                                  (const bf16 *)weight, (const bf16 *)bias, offsets, offsets_host,
                                  E, K, M, S(be));
}
static void cu_moe_matmul_io_backward(mt_backend *be, void *dinp, float *dweight, float *dbias,
                                      const void *dout, const void *inp, const void *weight,
                                      const int32_t *offsets, const int32_t *offsets_host, int E,
                                      int K, int M, int accumulate) {
    mt_cuda_moe_matmul_io_backward(mt_cuda_ctx_of(be), (bf16 *)dinp, dweight, dbias,
                                   (const bf16 *)dout, (const bf16 *)inp, (const bf16 *)weight,
                                   offsets, offsets_host, E, K, M, accumulate, S(be));
}
static void cu_sigmoid_gate_forward(mt_backend *be, void *out, const void *x, const void *g, int R,
                                    int C, int Cg) {
    mt_cuda_sigmoid_gate_forward((bf16 *)out, (const bf16 *)x, (const bf16 *)g, R, C, Cg, S(be));
}
static void cu_sigmoid_gate_backward(mt_backend *be, void *dx, void *dg, const void *dout,
                                     const void *x, const void *g, int R, int C, int Cg) {
    mt_cuda_sigmoid_gate_backward((bf16 *)dx, (bf16 *)dg, (const bf16 *)dout, (const bf16 *)x,
                                  (const bf16 *)g, R, C, Cg, S(be));
}
static void cu_cols_split(mt_backend *be, void *a, void *b, const void *in, int R, int wa, int wb) {
    mt_cuda_cols_split((bf16 *)a, (bf16 *)b, (const bf16 *)in, R, wa, wb, S(be));
}
static void cu_cols_join(mt_backend *be, void *out, const void *a, const void *b, int R, int wa,
                         int wb) {
    mt_cuda_cols_join((bf16 *)out, (const bf16 *)a, (const bf16 *)b, R, wa, wb, S(be));
}
static void cu_causal_conv1d_forward(mt_backend *be, void *out, const void *inp, const void *weight,
                                     const int32_t *doc_start, int B, int T, int C, int K, int t0) {
    mt_cuda_causal_conv1d_forward((bf16 *)out, (const bf16 *)inp, (const bf16 *)weight, doc_start, B,
                                  T, C, K, t0, S(be));
}
static void cu_causal_conv1d_backward(mt_backend *be, void *dinp, float *dweight, const void *dout,
                                      const void *inp, const void *weight,
                                      const int32_t *doc_start, int B, int T, int C, int K,
                                      int t0) {
    mt_cuda_causal_conv1d_backward((bf16 *)dinp, dweight, (const bf16 *)dout, (const bf16 *)inp,
                                   (const bf16 *)weight, doc_start, B, T, C, K, t0, S(be));
}
static void cu_l2norm_forward(mt_backend *be, void *out, float *rinv, const void *inp, int R, int D,
                              float eps) {
    mt_cuda_l2norm_forward((bf16 *)out, rinv, (const bf16 *)inp, R, D, eps, S(be));
}
static void cu_l2norm_backward(mt_backend *be, void *dinp, const void *dout, const void *inp,
                               const float *rinv, int R, int D) {
    mt_cuda_l2norm_backward((bf16 *)dinp, (const bf16 *)dout, (const bf16 *)inp, rinv, R, D, S(be));
}
static void cu_gdn_gates_forward(mt_backend *be, float *g, float *beta, const void *a, const void *b,
                                 const void *A_log, const void *dt_bias, int N, int Hv) {
    mt_cuda_gdn_gates_forward(g, beta, (const bf16 *)a, (const bf16 *)b, (const bf16 *)A_log,
                              (const bf16 *)dt_bias, N, Hv, S(be));
}
static void cu_gdn_gates_backward(mt_backend *be, void *da, void *db, float *dA_log, float *ddt_bias,
                                  const float *dg, const float *dbeta, const void *a, const void *b,
                                  const void *A_log, const void *dt_bias, int N, int Hv) {
    mt_cuda_gdn_gates_backward((bf16 *)da, (bf16 *)db, dA_log, ddt_bias, dg, dbeta, (const bf16 *)a,
                               (const bf16 *)b, (const bf16 *)A_log, (const bf16 *)dt_bias, N, Hv,
                               S(be));
}
static void cu_gated_delta_forward(mt_backend *be, void *out, float *chunk_states, const void *q,
                                   const void *k, const void *v, const float *g, const float *beta,
                                   const int32_t *doc_start, int B, int T, int Hk, int Hv, int Dk,
                                   int Dv, float scale, const mt_gated_delta_span *span) {
    mt_cuda_gated_delta_forward(be, (bf16 *)out, chunk_states, (const bf16 *)q, (const bf16 *)k,
                                (const bf16 *)v, g, beta, doc_start, B, T, Hk, Hv, Dk, Dv, scale,
                                span, S(be));
}
static void cu_gated_delta_backward(mt_backend *be, void *dq, void *dk, void *dv, float *dg,
                                    float *dbeta, const void *dout, const float *chunk_states,
                                    const void *q, const void *k, const void *v, const float *g,
                                    const float *beta, const int32_t *doc_start, int B, int T,
                                    int Hk, int Hv, int Dk, int Dv, float scale,
                                    const mt_gated_delta_span *span) {
    mt_cuda_gated_delta_backward(be, (bf16 *)dq, (bf16 *)dk, (bf16 *)dv, dg, dbeta,
                                 (const bf16 *)dout, chunk_states, (const bf16 *)q, (const bf16 *)k,
                                 (const bf16 *)v, g, beta, doc_start, B, T, Hk, Hv, Dk, Dv, scale,
                                 span, S(be));
}
static void cu_gated_rmsnorm_forward(mt_backend *be, void *out, float *rstd, const void *inp,
                                     const void *gate, const void *weight, int R, int C, float eps) {
    mt_cuda_gated_rmsnorm_forward((bf16 *)out, rstd, (const bf16 *)inp, (const bf16 *)gate,
                                  (const bf16 *)weight, R, C, eps, S(be));
}
static void cu_gated_rmsnorm_backward(mt_backend *be, void *dinp, void *dgate, float *dweight,
                                      const void *dout, const void *inp, const void *gate,
                                      const void *weight, const float *rstd, int R, int C) {
    mt_cuda_gated_rmsnorm_backward((bf16 *)dinp, (bf16 *)dgate, dweight, (const bf16 *)dout,
                                   (const bf16 *)inp, (const bf16 *)gate, (const bf16 *)weight, rstd,
                                   R, C, S(be));
}
static void cu_swiglu_forward(mt_backend *be, void *out, const void *gate, const void *up,
                              size_t n) {
    mt_cuda_swiglu_forward((bf16 *)out, (const bf16 *)gate, (const bf16 *)up, n, S(be));
}
static void cu_swiglu_backward(mt_backend *be, void *dgate, void *dup, const void *dout,
                               const void *gate, const void *up, size_t n) {
    mt_cuda_swiglu_backward((bf16 *)dgate, (bf16 *)dup, (const bf16 *)dout, (const bf16 *)gate,
                            (const bf16 *)up, n, S(be));
}
static void cu_geglu_forward(mt_backend *be, void *out, const void *gate, const void *up,
                             size_t n) {
    mt_cuda_geglu_forward((bf16 *)out, (const bf16 *)gate, (const bf16 *)up, n, S(be));
}
static void cu_geglu_backward(mt_backend *be, void *dgate, void *dup, const void *dout,
                              const void *gate, const void *up, size_t n) {
    mt_cuda_geglu_backward((bf16 *)dgate, (bf16 *)dup, (const bf16 *)dout, (const bf16 *)gate,
                           (const bf16 *)up, n, S(be));
}
static void cu_swiglu_clamped_forward(mt_backend *be, void *out, const void *gate_up, int R, int F,
                                      float alpha, float limit) {
    mt_cuda_swiglu_clamped_forward((bf16 *)out, (const bf16 *)gate_up, R, F, alpha, limit, S(be));
}
static void cu_swiglu_clamped_backward(mt_backend *be, void *dgate_up, const void *dout,
                                       const void *gate_up, int R, int F, float alpha,
                                       float limit) {
    mt_cuda_swiglu_clamped_backward((bf16 *)dgate_up, (const bf16 *)dout, (const bf16 *)gate_up, R,
                                    F, alpha, limit, S(be));
}
static void cu_zero_rows_of_id(mt_backend *be, void *x, const int32_t *ids, int32_t id, int N,
                               int C) {
    mt_cuda_zero_rows_of_id((bf16 *)x, ids, id, N, C, S(be));
}
static void cu_add(mt_backend *be, void *out, const void *a, const void *b, size_t n) {
    mt_cuda_add((bf16 *)out, (const bf16 *)a, (const bf16 *)b, n, S(be));
}
static void cu_scale(mt_backend *be, void *x, float s, size_t n) {
    mt_cuda_scale((bf16 *)x, s, n, S(be));
}
static void cu_scale_by(mt_backend *be, void *out, const void *x, const void *s, size_t n) {
    mt_cuda_scale_by((bf16 *)out, (const bf16 *)x, (const bf16 *)s, n, S(be));
}
static void cu_softcap(mt_backend *be, void *x, float cap, size_t n) {
    mt_cuda_softcap((bf16 *)x, cap, n, S(be));
}
static void cu_sumsq(mt_backend *be, float *out, const float *x, size_t n) {
    mt_cuda_sumsq(out, x, n, S(be));
}
static void cu_from_f32(mt_backend *be, void *dst, const float *src, size_t n) {
    mt_cuda_from_f32((bf16 *)dst, src, n, S(be));
}
static void cu_from_bf16(mt_backend *be, void *dst, const mt_bf16 *src, size_t n) {
    mt_cuda_from_bf16((bf16 *)dst, (const bf16 *)src, n, S(be));
}
static void cu_dequant_nf4(mt_backend *be, void *dst, const uint8_t *codes, const float *absmax,
                           size_t n) {
    mt_cuda_dequant_nf4((bf16 *)dst, codes, absmax, n, S(be));
}
static void cu_dequant_fp8(mt_backend *be, void *dst, const uint8_t *q, const float *scales,
                           size_t n) {
    mt_cuda_dequant_fp8((bf16 *)dst, q, scales, n, S(be));
}
static void cu_dequant_mxfp4(mt_backend *be, void *dst, const uint8_t *blocks, const uint8_t *scales,
                             int64_t mats, int64_t rows, int64_t cols) {
    mt_cuda_dequant_mxfp4((bf16 *)dst, blocks, scales, mats, rows, cols, S(be));
}
static void cu_optim_update(mt_backend *be, const mt_optim_arenas *s, const mt_optim_step *a,
                            size_t offset, size_t n, const void *grad, mt_dtype grad_dtype) {
    mt_cuda_optim_update(s, a, offset, n, grad, grad_dtype, S(be));
}
static void cu_lm_head_loss(mt_backend *be, float *losses, void *dinp, float *dweight,
                            const void *inp, const void *weight, const int32_t *targets, int N,
                            int C, int V, float loss_scale) {
    mt_cuda_lm_head_loss(be, losses, (bf16 *)dinp, dweight, (const bf16 *)inp,
                         (const bf16 *)weight, targets, N, C, V, loss_scale, S(be));
}
static void cu_lm_head_loss_softcap(mt_backend *be, float *losses, void *dinp, float *dweight,
                                    const void *inp, const void *weight, const int32_t *targets,
                                    int N, int C, int V, float loss_scale, float cap) {
    mt_cuda_lm_head_loss_softcap(be, losses, (bf16 *)dinp, dweight, (const bf16 *)inp,
                                 (const bf16 *)weight, targets, N, C, V, loss_scale, cap, S(be));
}
static void cu_moe_expert_scale_forward(mt_backend *be, float *w_out, const float *w,
                                        const int32_t *top_idx, const void *scale, int n, int k) {
    mt_cuda_moe_expert_scale_forward(w_out, w, top_idx, (const bf16 *)scale, n, k, S(be));
}
static void cu_moe_expert_scale_backward(mt_backend *be, float *d_w, float *d_scale,
                                         const float *d_out, const float *w,
                                         const int32_t *top_idx, const void *scale, int n, int k) {
    mt_cuda_moe_expert_scale_backward(d_w, d_scale, d_out, w, top_idx, (const bf16 *)scale, n, k,
                                      S(be));
}

#undef S

/* ---------------- creation ---------------- */

/* MT_MOE_GEMM: the experts' GEMMs one cuBLASLt call per expert (loop), one cuBLAS grouped GEMM
 * per product (grouped), or per call by the rows per expert (auto, the default:
 * moe_gemm_choice.h). Without a grouped GEMM in this cuBLAS, auto is the loop. */
static mt_moe_gemm_mode moe_gemm_mode_from_env(void) {
    const char *e = getenv("MT_MOE_GEMM");
    mt_moe_gemm_mode mode;
    if (!mt_moe_gemm_mode_parse(e, &mode)) {
        fprintf(stderr, "megatrain: MT_MOE_GEMM=%s: expected auto, loop or grouped\n", e);
        exit(1);
    }
    if (mt_cuda_moe_gemm_available() || mode == MT_MOE_GEMM_LOOP) return mode;
    if (mode == MT_MOE_GEMM_AUTO) return MT_MOE_GEMM_LOOP;
    fprintf(stderr, "megatrain: MT_MOE_GEMM=grouped: this build's cuBLAS has no grouped GEMM "
            "(12.5 or newer has); use MT_MOE_GEMM=loop\n");
    exit(1);
}

int mt_backend_cuda_device_count(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error so later calls start clean */
        return 0;
    }
    return n;
}

int mt_backend_cuda_available(void) { return mt_backend_cuda_device_count() > 0; }

mt_backend *mt_backend_cuda_create(int64_t mem_budget_bytes) {
    MT_CHECK(mem_budget_bytes >= 0, "negative GPU memory budget %lld", (long long)mem_budget_bytes);
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0)
        mt_fatal(__FILE__, __LINE__, "no usable CUDA device (%s); use --device cpu",
                 err != cudaSuccess ? cudaGetErrorString(err) : "device count 0");

    mt_moe_gemm_mode moe_mode = moe_gemm_mode_from_env(); /* a bad value stops before any allocation */
    cuda_state *st = (cuda_state *)mt_calloc(1, sizeof *st);
    mt_cuda_ctx *c = &st->base;
    c->moe_gemm_mode = moe_mode;
    pthread_mutex_init(&st->mu, NULL);
    CUDA_CHECK(cudaGetDevice(&c->device));
    CUDA_CHECK(cudaSetDevice(c->device));
    CUDA_CHECK(cudaGetDeviceProperties(&c->prop, c->device));
    MT_CHECK(c->prop.major >= 8, "the CUDA backend needs bf16 tensor cores (compute capability >= "
             "8.0); device %d (%s) is %d.%d", c->device, c->prop.name, c->prop.major,
             c->prop.minor);
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    st->device_total = (int64_t)total_b;
    c->budget = mem_budget_bytes > 0 ? mem_budget_bytes : (int64_t)free_b;
    c->used = 0;

    for (int i = 0; i < MT_STREAMS; i++)
        CUDA_CHECK(cudaStreamCreateWithFlags(&c->streams[i], cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasLtCreate(&c->lt));
    c->lt_workspace_bytes = MT_CUDA_LT_WORKSPACE;
    c->lt_workspace = device_alloc(st, c->lt_workspace_bytes, "the cuBLASLt workspace");

    /* Ops take small temporaries (reduction partials, sort buffers) from the stream-ordered pool;
     * keep some of it between calls instead of returning it at every synchronization. */
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, c->device));
    uint64_t keep = MT_CUDA_POOL_KEEP;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    mt_cuda_optim_init(); /* the optimizer's qmaps, ~53 KB of module memory outside the budget */

    mt_backend *be = (mt_backend *)mt_calloc(1, sizeof *be);
    be->name = "cuda";
    be->dtype = MT_BF16;
    be->ctx = st;
    be->alloc = cuda_alloc;
    be->free = cuda_free;
    be->zero = cuda_zero;
    be->upload = cuda_upload;
    be->download = cuda_download;
    be->note_documents = cu_note_documents;
    be->sync = cuda_sync;
    be->destroy = cuda_destroy;
    be->host_alloc = cuda_host_alloc;
    be->host_free = cuda_host_free;
    be->copy_async = cuda_copy_async;
    be->event_create = cuda_event_create;
    be->event_destroy = cuda_event_destroy;
    be->event_record = cuda_event_record;
    be->stream_wait = cuda_stream_wait;
    be->event_sync = cuda_event_sync;
    be->event_elapsed_ms = cuda_event_elapsed_ms;
    be->native_stream = cuda_native_stream;
    be->mem_used = cuda_mem_used;
    be->mem_budget = c->budget;
    be->memory = mt_backend_cuda_memory();
    be->embedding_forward = cu_embedding_forward;
    be->embedding_backward = cu_embedding_backward;
    be->rmsnorm_forward = cu_rmsnorm_forward;
    be->rmsnorm_backward = cu_rmsnorm_backward;
    /* weight NULL (Gemma 4's v_norm); Gemma 4's ops against the CPU: tests/gpu/
     * test_cuda_gemma4_ops, whole models: test_cuda_model test_gemma4_models */
    be->rmsnorm_unweighted = 1;
    be->matmul_forward = cu_matmul_forward;
    be->matmul_backward = cu_matmul_backward;
    be->matmul_forward_add = cu_matmul_forward_add;
    be->rope_forward = cu_rope_forward;
    be->rope_backward = cu_rope_backward;
    be->attention_forward = cu_attention_forward;
    be->attention_backward = cu_attention_backward;
    /* the scale, window and sinks (tests/gpu/test_cuda_attention); whole gpt-oss and Gemma 3
     * models against the CPU: test_cuda_moe test_gpt_oss_models, test_cuda_model
     * test_gemma3_models (bench/RESULTS.md, session 14) */
    be->attention_options = 1;
    be->sigmoid_gate_forward = cu_sigmoid_gate_forward;
    be->sigmoid_gate_backward = cu_sigmoid_gate_backward;
    be->cols_split = cu_cols_split;
    be->cols_join = cu_cols_join;
    be->causal_conv1d_forward = cu_causal_conv1d_forward;
    be->causal_conv1d_backward = cu_causal_conv1d_backward;
    be->l2norm_forward = cu_l2norm_forward;
    be->l2norm_backward = cu_l2norm_backward;
    be->gdn_gates_forward = cu_gdn_gates_forward;
    be->gdn_gates_backward = cu_gdn_gates_backward;
    be->gated_delta_forward = cu_gated_delta_forward;
    be->gated_delta_backward = cu_gated_delta_backward;
    be->gated_rmsnorm_forward = cu_gated_rmsnorm_forward;
    be->gated_rmsnorm_backward = cu_gated_rmsnorm_backward;
    be->swiglu_forward = cu_swiglu_forward;
    be->swiglu_backward = cu_swiglu_backward;
    be->geglu_forward = cu_geglu_forward;
    be->geglu_backward = cu_geglu_backward;
    be->swiglu_clamped_forward = cu_swiglu_clamped_forward;
    be->swiglu_clamped_backward = cu_swiglu_clamped_backward;
    be->zero_rows_of_id = cu_zero_rows_of_id;
    be->add = cu_add;
    be->scale = cu_scale;
    be->scale_by = cu_scale_by;
    be->softcap = cu_softcap;
    be->sumsq = cu_sumsq;
    be->from_f32 = cu_from_f32;
    be->from_bf16 = cu_from_bf16;
    be->dequant_nf4 = cu_dequant_nf4;
    be->dequant_fp8 = cu_dequant_fp8;
    be->dequant_mxfp4 = cu_dequant_mxfp4;
    be->optim_update = cu_optim_update;
    be->lm_head_loss = cu_lm_head_loss;
    be->lm_head_loss_softcap = cu_lm_head_loss_softcap;
    be->moe_route = cu_moe_route;
    be->moe_group = cu_moe_group;
    be->moe_gather = cu_moe_gather;
    be->moe_gather_backward = cu_moe_gather_backward;
    be->moe_combine = cu_moe_combine;
    be->moe_combine_backward = cu_moe_combine_backward;
    be->moe_route_backward = cu_moe_route_backward;
    be->moe_expert_scale_forward = cu_moe_expert_scale_forward;
    be->moe_expert_scale_backward = cu_moe_expert_scale_backward;
    be->moe_matmul_forward = cu_moe_matmul_forward;
    be->moe_matmul_backward = cu_moe_matmul_backward;
    be->moe_matmul_io_forward = cu_moe_matmul_io_forward;
    be->moe_matmul_io_backward = cu_moe_matmul_io_backward;
    return be;
}
