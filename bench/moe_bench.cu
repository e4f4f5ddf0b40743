/* Where the MoE block's GPU time goes, and the experts' GEMMs as one grouped call (one H200 run
 * gives both).
 *
 * Build: the CMake target moe_bench in CUDA builds (links mtcore: the real CUDA backend, the real
 * src/model/moe.c); scripts/moe-bench.sh builds and runs it. Run: build/moe_bench [--iters N]
 * [--only qwen3|mixtral] [--quick] (--quick: the smallest case only, 2 iterations). Run it from
 * the repository root (it reads the two configs in bench/configs). Exit 1 when a check fails,
 * 0 otherwise.
 *
 * Cases: the layer shapes of bench/configs/qwen3-30b-a3b.json (E 128, top-8, C 2048, Fe 768) at
 * n = 4096, 16384, 65536 tokens per call and bench/configs/mixtral-8x7b-16l.json (E 8, top-2,
 * C 4096, Fe 14336) at n = 16384, 65536. Inputs are random bf16 (x ~ N(0,1), the router
 * N(0, 1/C) so logits ~ N(0,1): random, near-balanced routing; the rows per expert are printed),
 * expert weights N(0, 0.02), dout N(0,1).
 *
 * 1. The block piece by piece through the backend ops (be->...), in the order and with the
 *    arguments of mt_moe_forward / mt_moe_backward (src/model/moe.c), the experts' GEMMs through
 *    be->moe_matmul_forward / moe_matmul_backward in the mode MT_MOE_GEMM picks (loop: one
 *    cuBLASLt call per expert; grouped: one cuBLAS grouped GEMM per product; auto, the default:
 *    grouped below 512 rows an expert, src/backend/moe_gemm_choice.h); the
 *    one difference: the backward's moe_matmul_backward(dinp, dweight) runs as a dinp call then a
 *    dweight call, so each gets its own line. Between pieces a cudaEvent on the compute stream:
 *    "GPU ms" is the time the stream took from the previous piece's end to this one's (the GPU
 *    idles in it while it waits for the host: a loop of small GEMMs that the host enqueues slower
 *    than the GPU runs them is launch-bound, and the line shows it); "host ms" the host's time to
 *    enqueue the piece (the download piece: the sync and the copy). When host ms ~ GPU ms on a
 *    GEMM line, it is bound by launches, not by the GPU. Means over --iters iterations after one
 *    warm-up. FLOPs: matmuls only, as engine/flops.c counts them (forward 2n(CE + 3kCFe),
 *    backward twice that); TFLOP/s per piece is its FLOPs over its GPU ms; "share" its part of
 *    the forward + backward time.
 *    Then mt_moe_forward and mt_moe_backward themselves (the code that trains), timed whole in
 *    each mode: the pieces' mode should match the pieces' totals (else the pieces no longer
 *    mirror moe.c). In training a layer's backward first remakes the block's forward
 *    (checkpointing), so a step costs about 2 forwards + 1 backward per MoE layer per micro-batch.
 *    Then the aux loss's step-end downloads (mt_moe_aux_finish: once per step, and only with
 *    output_router_logits, which both configs leave off).
 * 2. The experts' GEMMs per product, loop against grouped: the same backend op in its two modes
 *    (the bench flips the context's MT_MOE_GEMM choice). Grouped is ONE cublasGemmGroupedBatchedEx
 *    per product (src/backend/cuda/moe_gemm.cu; cuBLAS >= 12.5; every expert with rows a group of
 *    one problem, since the row counts differ; a one-thread kernel writes the device pointer
 *    arrays from the device offsets, its time included). The host still needs the offsets (the
 *    grouped API takes m, n, k as host arrays), so the download's sync stays in both modes.
 *    Weight gradients accumulate into fp32 (beta 1) as matmul_backward's dweight does (cuBLASLt,
 *    D fp32, beta 1). A probe at the start says whether this cuBLAS does bf16 x bf16 -> bf16 and
 *    -> fp32 (beta 0 and beta 1) in the grouped call; where it refuses fp32, the op runs the
 *    weight gradients as zero-padded strided batches (moe_gemm.cu; it says so once on stderr) and
 *    those rows read "padded".
 *    Beside them, "dense": the same FLOPs as one be->matmul_* over all n*k rows with expert 0's
 *    weights, what a dense layer of that width reaches (the ceiling a grouped GEMM aims at).
 *    Check: on the same inputs, max |grouped - loop| / max |loop| per output tensor, against
 *      bf16 outputs 8e-3: each side sums in fp32 (in another order: split-K, tile shapes) and
 *        rounds once to bf16, so an element differs by at most 1 bf16 ulp, at most 2^-7 of itself
 *        (8 significant bits): 7.8e-3 of max|loop|; 1.6e-2 where beta 1 adds onto a rounded bf16
 *        (up's dinp onto gate's: 2 ulps);
 *      fp32 weight gradients (accumulated onto the same random fp32 prefill) 1e-4: the fp32 sums of
 *        m_e bf16 products in another order differ by ~sqrt(m_e) fp32 ulps (~1e-5 at 65536 rows).
 *    A wrong pointer, expert or offset gives errors of order 1 against both.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/matmul_plans.h"
#include "core/error.h"
extern "C" {
#include "model/config.h"
#include "model/layer.h"
#include "model/moe.h"
}

#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120500
#define HAVE_GROUPED 1
#else
#define HAVE_GROUPED 0
#endif

static mt_backend *be;
static cudaStream_t g_stream;
static int g_iters = 5, g_failed = 0;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* ---------------------------------------------------------------- random fills on the device */

__device__ static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

template <typename T>
__global__ static void fill_normal_kernel(T *p, size_t n, uint64_t seed, float sd) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = mix64(seed ^ mix64(i));
        float u1 = ((float)(h >> 40) + 0.5f) / 16777216.0f;
        float u2 = ((float)(h & 0xffffff) + 0.5f) / 16777216.0f;
        p[i] = (T)(sd * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2));
    }
}

static uint64_t g_seed = 1;
template <typename T> static T *dev_normal(size_t n, float sd) {
    T *p = (T *)be->alloc(be, n * sizeof(T));
    fill_normal_kernel<T><<<1024, 256, 0, g_stream>>>(p, n, g_seed++ * 0x1234567ull, sd);
    CUDA_CHECK(cudaGetLastError());
    return p;
}
template <typename T> static T *dev_alloc(size_t n) { return (T *)be->alloc(be, n * sizeof(T)); }

/* ---------------------------------------------------------------- comparisons */

/* out[0] = max |a - r|, out[1] = max |r| as float bits (non-negative floats order as their bits),
 * out[2] = 1 when any difference is NaN. */
template <typename T>
__global__ static void diff_kernel(const T *a, const T *r, size_t n, unsigned *out) {
    float me = 0, mr = 0;
    unsigned nan = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = (float)a[i], y = (float)r[i], e = fabsf(x - y);
        if (!(e == e)) nan = 1;
        else me = fmaxf(me, e);
        mr = fmaxf(mr, fabsf(y));
    }
    atomicMax(&out[0], __float_as_uint(me));
    atomicMax(&out[1], __float_as_uint(mr));
    if (nan) atomicOr(&out[2], 1u);
}

/* max |a - r| / max |r| over n elements of two device tensors (NaN anywhere: NaN) */
static double rel_diff(const void *a, const void *r, size_t n, int is_bf16) {
    unsigned *d, h[3];
    CUDA_CHECK(cudaMalloc(&d, sizeof h));
    CUDA_CHECK(cudaMemsetAsync(d, 0, sizeof h, g_stream));
    if (is_bf16)
        diff_kernel<bf16><<<1024, 256, 0, g_stream>>>((const bf16 *)a, (const bf16 *)r, n, d);
    else
        diff_kernel<float><<<1024, 256, 0, g_stream>>>((const float *)a, (const float *)r, n, d);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, g_stream));
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
    CUDA_CHECK(cudaFree(d));
    if (h[2]) return NAN;
    float me, mr;
    memcpy(&me, &h[0], 4), memcpy(&mr, &h[1], 4);
    return me / (mr > 0 ? mr : 1);
}

/* ---------------------------------------------------------------- a timeline of pieces */

#define MAX_PIECES 24
typedef struct {
    int n;
    cudaEvent_t ev[MAX_PIECES + 1];
    double host[MAX_PIECES + 1];
    const char *name[MAX_PIECES];
    double flops[MAX_PIECES];
    double gpu_sum[MAX_PIECES], host_sum[MAX_PIECES];
    int runs;
} timeline;

static void tl_init(timeline *t) {
    memset(t, 0, sizeof *t);
    for (int i = 0; i <= MAX_PIECES; i++) CUDA_CHECK(cudaEventCreate(&t->ev[i]));
}
static void tl_free(timeline *t) {
    for (int i = 0; i <= MAX_PIECES; i++) cudaEventDestroy(t->ev[i]);
}
static void tl_begin(timeline *t) {
    t->n = 0;
    CUDA_CHECK(cudaEventRecord(t->ev[0], g_stream));
    t->host[0] = now_ms();
}
static void tl_mark(timeline *t, const char *name, double flops) {
    int i = t->n++;
    if (t->n > MAX_PIECES) {
        fprintf(stderr, "moe_bench: more than %d pieces\n", MAX_PIECES);
        exit(1);
    }
    CUDA_CHECK(cudaEventRecord(t->ev[i + 1], g_stream));
    t->host[i + 1] = now_ms();
    t->name[i] = name;
    t->flops[i] = flops;
}
/* After a run: waits for it, adds its times (count: whether the run counts, not a warm-up). */
static void tl_end(timeline *t, int count) {
    CUDA_CHECK(cudaEventSynchronize(t->ev[t->n]));
    if (!count) return;
    for (int i = 0; i < t->n; i++) {
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, t->ev[i], t->ev[i + 1]));
        t->gpu_sum[i] += ms;
        t->host_sum[i] += t->host[i + 1] - t->host[i];
    }
    t->runs++;
}

static void print_row(const char *name, double gpu, double host, double flops, double whole) {
    if (flops > 0)
        printf("  %-40s %9.3f %9.3f %9.1f %8.1f %6.1f%%\n", name, gpu, host, flops * 1e-9,
               flops / (gpu * 1e-3) * 1e-12, 100 * gpu / whole);
    else
        printf("  %-40s %9.3f %9.3f %9s %8s %6.1f%%\n", name, gpu, host, "-", "-",
               100 * gpu / whole);
}

/* Prints the pieces [lo, hi) and their total; returns the total GPU ms. */
static double tl_print(const timeline *t, int lo, int hi, const char *total_name, double whole) {
    double g = 0, h = 0, f = 0;
    for (int i = lo; i < hi; i++) {
        double gi = t->gpu_sum[i] / t->runs, hi_ = t->host_sum[i] / t->runs;
        print_row(t->name[i], gi, hi_, t->flops[i], whole);
        g += gi, h += hi_, f += t->flops[i];
    }
    print_row(total_name, g, h, f, whole);
    return g;
}

/* ---------------------------------------------------------------- one case's tensors */

typedef struct {
    mt_config cfg;
    mt_layer_ctx lc;
    int n, C, E, k, Fe;
    size_t nk;
    mt_layer_weights w, g; /* bf16 weights, fp32 gradients */
    bf16 *x, *out, *dout, *dx;
    mt_layer_ws ws;
} moe_case;

static void case_init(moe_case *c, const char *config, int n) {
    memset(c, 0, sizeof *c);
    if (mt_config_load(&c->cfg, config) != MT_OK) {
        fprintf(stderr, "moe_bench: %s (run from the repository root)\n", mt_error_message());
        exit(1);
    }
    c->lc.cfg = &c->cfg;
    c->lc.be = be;
    c->n = n, c->C = c->cfg.C, c->E = c->cfg.n_experts, c->k = c->cfg.top_k, c->Fe = c->cfg.moe_F;
    int C = c->C, E = c->E, Fe = c->Fe;
    size_t nk = c->nk = (size_t)n * c->k, eFC = (size_t)E * Fe * C;
    c->w.router = dev_normal<bf16>((size_t)E * C, 1.0f / sqrtf((float)C));
    c->w.exp_gate = dev_normal<bf16>(eFC, 0.02f);
    c->w.exp_up = dev_normal<bf16>(eFC, 0.02f);
    c->w.exp_down = dev_normal<bf16>(eFC, 0.02f);
    c->w.exp_stride = (size_t)Fe * C * sizeof(bf16);
    c->g.router = dev_normal<float>((size_t)E * C, 0.01f);
    c->g.exp_gate = dev_normal<float>(eFC, 0.01f);
    c->g.exp_up = dev_normal<float>(eFC, 0.01f);
    c->g.exp_down = dev_normal<float>(eFC, 0.01f);
    c->g.exp_stride = (size_t)Fe * C * sizeof(float);
    c->x = dev_normal<bf16>((size_t)n * C, 1.0f);
    c->dout = dev_normal<bf16>((size_t)n * C, 1.0f);
    c->out = dev_alloc<bf16>((size_t)n * C);
    c->dx = dev_alloc<bf16>((size_t)n * C);
    mt_layer_ws *ws = &c->ws;
    ws->max_N = n;
    ws->moe_logits = dev_alloc<bf16>((size_t)n * E);
    ws->moe_d_logits = dev_alloc<bf16>((size_t)n * E);
    ws->moe_probs = dev_alloc<float>((size_t)n * E);
    ws->moe_idx = dev_alloc<int32_t>(nk);
    ws->moe_w = dev_alloc<float>(nk);
    ws->moe_dw = dev_alloc<float>(nk);
    ws->moe_perm = dev_alloc<int32_t>(nk);
    ws->moe_inv = dev_alloc<int32_t>(nk);
    void **rowsC[] = {&ws->moe_x, &ws->moe_y, &ws->moe_d_y, &ws->moe_d_x};
    for (void **p : rowsC) *p = dev_alloc<bf16>(nk * C);
    void **rowsF[] = {&ws->moe_gate, &ws->moe_up, &ws->moe_act, &ws->moe_d_act, &ws->moe_d_gate,
                      &ws->moe_d_up};
    for (void **p : rowsF) *p = dev_alloc<bf16>(nk * Fe);
    mt_moe_ws_init(ws, &c->lc);
}

static void case_free(moe_case *c) {
    mt_layer_ws *ws = &c->ws;
    void *ps[] = {c->w.router, c->w.exp_gate, c->w.exp_up, c->w.exp_down, c->g.router,
                  c->g.exp_gate, c->g.exp_up, c->g.exp_down, c->x, c->dout, c->out, c->dx,
                  ws->moe_logits, ws->moe_d_logits, ws->moe_probs, ws->moe_idx, ws->moe_w,
                  ws->moe_dw, ws->moe_perm, ws->moe_inv, ws->moe_x, ws->moe_y, ws->moe_d_y,
                  ws->moe_d_x, ws->moe_gate, ws->moe_up, ws->moe_act, ws->moe_d_act,
                  ws->moe_d_gate, ws->moe_d_up};
    for (void *p : ps) be->free(be, p);
    mt_moe_ws_free(ws, &c->lc);
}

/* ---------------------------------------------------------------- the experts' GEMMs (moe.c's) */

/* The backend's choice of expert GEMMs (ops.cuh's context field that MT_MOE_GEMM sets). */
static void set_mode(int mode) { mt_cuda_ctx_of(be)->moe_gemm_mode = mode; }
static void set_grouped(int grouped) { set_mode(grouped ? MT_MOE_GEMM_GROUPED : MT_MOE_GEMM_LOOP); }

/* moe.c's calls of be->moe_matmul_forward / moe_matmul_backward, one function per product. */
static size_t stride(const moe_case *c) { return (size_t)c->Fe * c->C; }
static void x_fwd_gate_up(moe_case *c, void *gate, void *up) {
    mt_layer_ws *ws = &c->ws;
    be->moe_matmul_forward(be, gate, ws->moe_x, c->w.exp_gate, stride(c), ws->moe_offsets,
                           ws->moe_offsets_host, c->E, c->C, c->Fe);
    be->moe_matmul_forward(be, up, ws->moe_x, c->w.exp_up, stride(c), ws->moe_offsets,
                           ws->moe_offsets_host, c->E, c->C, c->Fe);
}
static void x_fwd_down(moe_case *c, void *y) {
    mt_layer_ws *ws = &c->ws;
    be->moe_matmul_forward(be, y, ws->moe_act, c->w.exp_down, stride(c), ws->moe_offsets,
                           ws->moe_offsets_host, c->E, c->Fe, c->C);
}
static void x_bwd_down_dinp(moe_case *c, void *d_act) {
    mt_layer_ws *ws = &c->ws;
    be->moe_matmul_backward(be, d_act, NULL, ws->moe_d_y, ws->moe_act, c->w.exp_down, stride(c),
                            ws->moe_offsets, ws->moe_offsets_host, c->E, c->Fe, c->C, 0);
}
static void x_bwd_down_dw(moe_case *c, float *gdown) {
    mt_layer_ws *ws = &c->ws;
    be->moe_matmul_backward(be, NULL, gdown, ws->moe_d_y, ws->moe_act, c->w.exp_down, stride(c),
                            ws->moe_offsets, ws->moe_offsets_host, c->E, c->Fe, c->C, 0);
}
static void x_bwd_gate_up_dinp(moe_case *c, void *d_x) {
    mt_layer_ws *ws = &c->ws;
    be->moe_matmul_backward(be, d_x, NULL, ws->moe_d_gate, ws->moe_x, c->w.exp_gate, stride(c),
                            ws->moe_offsets, ws->moe_offsets_host, c->E, c->C, c->Fe, 0);
    be->moe_matmul_backward(be, d_x, NULL, ws->moe_d_up, ws->moe_x, c->w.exp_up, stride(c),
                            ws->moe_offsets, ws->moe_offsets_host, c->E, c->C, c->Fe, 1);
}
static void x_bwd_gate_up_dw(moe_case *c, float *ggate, float *gup) {
    mt_layer_ws *ws = &c->ws;
    be->moe_matmul_backward(be, NULL, ggate, ws->moe_d_gate, ws->moe_x, c->w.exp_gate, stride(c),
                            ws->moe_offsets, ws->moe_offsets_host, c->E, c->C, c->Fe, 0);
    be->moe_matmul_backward(be, NULL, gup, ws->moe_d_up, ws->moe_x, c->w.exp_up, stride(c),
                            ws->moe_offsets, ws->moe_offsets_host, c->E, c->C, c->Fe, 0);
}

/* ---------------------------------------------------------------- 1. the block piece by piece */

static void run_pieces(moe_case *c, timeline *t) {
    mt_layer_ws *ws = &c->ws;
    int n = c->n, C = c->C, E = c->E, k = c->k, Fe = c->Fe;
    double nk = (double)c->nk, f_exp = 2.0 * nk * C * Fe, f_router = 2.0 * n * (double)C * E;
    int renorm = c->cfg.norm_topk_prob;
    tl_begin(t);
    be->matmul_forward(be, ws->moe_logits, c->x, c->w.router, NULL, n, C, E);
    tl_mark(t, "fwd router matmul", f_router);
    be->moe_route(be, ws->moe_probs, ws->moe_idx, ws->moe_w, NULL, NULL, ws->moe_logits, n, E, k,
                  renorm);
    tl_mark(t, "fwd route (softmax, top-k)", 0);
    be->moe_group(be, ws->moe_perm, ws->moe_inv, ws->moe_offsets, ws->moe_idx, n, E, k);
    tl_mark(t, "fwd group (sort by expert)", 0);
    be->moe_gather(be, ws->moe_x, c->x, ws->moe_perm, n, C, k);
    tl_mark(t, "fwd gather x rows", 0);
    be->download(be, ws->moe_offsets_host, ws->moe_offsets, ((size_t)E + 1) * sizeof(int32_t));
    tl_mark(t, "fwd offsets download (sync)", 0);
    x_fwd_gate_up(c, ws->moe_gate, ws->moe_up);
    tl_mark(t, "fwd experts gate+up GEMMs", 2 * f_exp);
    be->swiglu_forward(be, ws->moe_act, ws->moe_gate, ws->moe_up, c->nk * Fe);
    tl_mark(t, "fwd swiglu", 0);
    x_fwd_down(c, ws->moe_y);
    tl_mark(t, "fwd experts down GEMMs", f_exp);
    be->moe_combine(be, c->out, ws->moe_y, ws->moe_w, ws->moe_inv, n, C, k);
    tl_mark(t, "fwd combine", 0);

    be->moe_combine_backward(be, ws->moe_d_y, ws->moe_dw, c->dout, ws->moe_y, ws->moe_w,
                             ws->moe_inv, n, C, k);
    tl_mark(t, "bwd combine", 0);
    x_bwd_down_dinp(c, ws->moe_d_act);
    tl_mark(t, "bwd experts down dinp", f_exp);
    x_bwd_down_dw(c, (float *)c->g.exp_down);
    tl_mark(t, "bwd experts down dweight", f_exp);
    be->swiglu_backward(be, ws->moe_d_gate, ws->moe_d_up, ws->moe_d_act, ws->moe_gate, ws->moe_up,
                        c->nk * Fe);
    tl_mark(t, "bwd swiglu", 0);
    x_bwd_gate_up_dinp(c, ws->moe_d_x);
    tl_mark(t, "bwd experts gate+up dinp", 2 * f_exp);
    x_bwd_gate_up_dw(c, (float *)c->g.exp_gate, (float *)c->g.exp_up);
    tl_mark(t, "bwd experts gate+up dweight", 2 * f_exp);
    be->moe_gather_backward(be, c->dx, ws->moe_d_x, ws->moe_inv, n, C, k, 0);
    tl_mark(t, "bwd gather (sum k rows)", 0);
    be->moe_route_backward(be, ws->moe_d_logits, ws->moe_dw, ws->moe_probs, ws->moe_idx, ws->moe_w,
                           NULL, n, E, k, renorm);
    tl_mark(t, "bwd route", 0);
    be->matmul_backward(be, c->dx, (float *)c->g.router, NULL, ws->moe_d_logits, c->x, c->w.router,
                        n, C, E, 1);
    tl_mark(t, "bwd router matmul (dinp += , dweight)", 2 * f_router);
}

/* ---------------------------------------------------------------- 2. loop against grouped */

/* Whether the grouped call takes bf16 x bf16 -> dtype with fp32 compute here (two tiny problems
 * of different sizes, checked against a host product). Prints what it finds. */
static int probe_grouped(cudaDataType dtype, const char *what) {
#if !HAVE_GROUPED
    printf("probe: cublasGemmGroupedBatchedEx is not in this cuBLAS (%d < 12.5): %s unavailable\n",
           (int)CUBLAS_VERSION, what);
    return 0;
#else
    const int M = 16, N = 8, K = 32;
    std::vector<bf16> ha(2 * M * K), hb(2 * K * N);
    for (size_t i = 0; i < ha.size(); i++) ha[i] = __float2bfloat16((float)((i * 7) % 5) - 2.0f);
    for (size_t i = 0; i < hb.size(); i++) hb[i] = __float2bfloat16((float)((i * 3) % 7) - 3.0f);
    size_t dsz = dtype == CUDA_R_32F ? 4 : 2;
    bf16 *a, *b;
    char *d;
    CUDA_CHECK(cudaMalloc(&a, ha.size() * 2));
    CUDA_CHECK(cudaMalloc(&b, hb.size() * 2));
    CUDA_CHECK(cudaMalloc(&d, 2 * M * N * dsz));
    CUDA_CHECK(cudaMemcpy(a, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
    { /* D starts at 1 everywhere: problem 0 (beta 0) must ignore it, problem 1 (beta 1) add it */
        std::vector<float> one32(2 * M * N, 1.0f);
        std::vector<bf16> one16(2 * M * N, __float2bfloat16(1.0f));
        CUDA_CHECK(cudaMemcpy(d, dsz == 4 ? (void *)one32.data() : (void *)one16.data(), 2 * M * N * dsz,
                      cudaMemcpyHostToDevice));
    }
    const void *pa[2] = {a, a + M * K}, *pb[2] = {b, b + K * N};
    void *pd[2] = {d, d + M * N * dsz};
    const void **dpa, **dpb;
    void **dpd;
    CUDA_CHECK(cudaMalloc((void **)&dpa, sizeof pa));
    CUDA_CHECK(cudaMalloc((void **)&dpb, sizeof pb));
    CUDA_CHECK(cudaMalloc((void **)&dpd, sizeof pd));
    CUDA_CHECK(cudaMemcpy(dpa, pa, sizeof pa, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dpb, pb, sizeof pb, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dpd, pd, sizeof pd, cudaMemcpyHostToDevice));
    cublasHandle_t h;
    CUBLAS_CHECK(cublasCreate(&h));
    /* problem 0: M x N x K, beta 0; problem 1: M x (N/2) x K, beta 1 */
    cublasOperation_t ta[2] = {CUBLAS_OP_N, CUBLAS_OP_N}, tb[2] = {CUBLAS_OP_N, CUBLAS_OP_N};
    int m[2] = {M, M}, n[2] = {N, N / 2}, k[2] = {K, K}, lda[2] = {M, M}, ldb[2] = {K, K},
        ldc[2] = {M, M}, gs[2] = {1, 1};
    float al[2] = {1, 1}, bt[2] = {0, 1};
    cublasStatus_t st = cublasGemmGroupedBatchedEx(h, ta, tb, m, n, k, al, dpa, CUDA_R_16BF, lda,
                                                   dpb, CUDA_R_16BF, ldb, bt, dpd, dtype, ldc, 2,
                                                   gs, CUBLAS_COMPUTE_32F);
    int ok = st == CUBLAS_STATUS_SUCCESS;
    double err = 0;
    if (ok) {
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<char> hd(2 * M * N * dsz);
        CUDA_CHECK(cudaMemcpy(hd.data(), d, hd.size(), cudaMemcpyDeviceToHost));
        for (int p = 0; p < 2; p++)
            for (int j = 0; j < n[p]; j++)
                for (int i = 0; i < M; i++) {
                    double ref = p; /* problem 1 adds the 1 it starts from */
                    for (int l = 0; l < K; l++)
                        ref += (double)__bfloat162float(ha[p * M * K + i + l * M]) *
                               __bfloat162float(hb[p * K * N + l + j * K]);
                    size_t at = (size_t)p * M * N + i + (size_t)j * M;
                    double got = dsz == 4 ? ((float *)hd.data())[at]
                                          : __bfloat162float(((bf16 *)hd.data())[at]);
                    err = fmax(err, fabs(got - ref) / fmax(1.0, fabs(ref)));
                }
        ok = err < 1e-2; /* small integers (|ref| <= 193): exact in fp32 and in bf16 */
    }
    printf("probe: cublasGemmGroupedBatchedEx bf16 x bf16 -> %s, compute 32F: %s (status %d, "
           "max rel err %.2g)\n", what,
           ok ? "works" : st == CUBLAS_STATUS_SUCCESS ? "WRONG RESULTS" : "refused", (int)st, err);
    cublasDestroy(h);
    cudaFree(a), cudaFree(b), cudaFree(d), cudaFree(dpa), cudaFree(dpb), cudaFree(dpd);
    cudaGetLastError(); /* a refused call leaves nothing pending */
    return ok;
#endif
}

static int g_grouped_bf16, g_grouped_f32, g_env_mode;

typedef struct {
    const char *name;
    double flops, loop_ms, grouped_ms, dense_ms;
} gemm_row;

/* Times fn over --iters runs after one warm-up; mean GPU ms. */
template <typename F> static double time_gpu(F fn) {
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    fn();
    CUDA_CHECK(cudaEventRecord(a, g_stream));
    for (int i = 0; i < g_iters; i++) fn();
    CUDA_CHECK(cudaEventRecord(b, g_stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ms / g_iters;
}

static void check(const char *what, double diff, double tol) {
    int ok = diff <= tol; /* NaN fails */
    printf("  check %-46s max rel diff %.3g (tol %.2g, %5.1f%% of it)%s\n", what, diff, tol,
           100 * diff / tol, ok ? "" : "  FAIL");
    if (!ok) g_failed = 1;
}

/* Loop against grouped (the backend's two modes of the same op) on the inputs the last run left
 * in ws (routing, x, act, d_y, d_gate, d_up); prints the checks and the table. */
static void run_grouped(moe_case *c, double *loop_total, double *grouped_total) {
    *loop_total = *grouped_total = 0;
    if (!g_grouped_bf16) {
        printf("  (grouped GEMM unavailable: loop only, see the probe)\n");
        return;
    }
    int C = c->C, Fe = c->Fe;
    size_t nk = c->nk, eFC = (size_t)c->E * Fe * C;
    /* each mode's outputs; the weight gradients from the same random fp32 prefill */
    bf16 *lg = dev_alloc<bf16>(nk * Fe), *lu = dev_alloc<bf16>(nk * Fe);
    bf16 *gg = dev_alloc<bf16>(nk * Fe), *gu = dev_alloc<bf16>(nk * Fe);
    bf16 *ly = dev_alloc<bf16>(nk * C), *gy = dev_alloc<bf16>(nk * C);
    float *lw[3], *gw[3];
    for (int i = 0; i < 3; i++) {
        lw[i] = dev_normal<float>(eFC, 0.01f);
        gw[i] = dev_alloc<float>(eFC);
        CUDA_CHECK(cudaMemcpyAsync(gw[i], lw[i], eFC * 4, cudaMemcpyDeviceToDevice, g_stream));
    }
    /* grouped's weight gradients, when cuBLAS refuses fp32 D: the op's own per-expert loop */
    const char *wnote = g_grouped_f32 ? "fp32, beta 1" : "refused by cuBLAS: padded batches";

    /* checks: one run of each mode on the same inputs */
    set_grouped(0), x_fwd_gate_up(c, lg, lu), set_grouped(1), x_fwd_gate_up(c, gg, gu);
    check("fwd gate (bf16)", rel_diff(gg, lg, nk * Fe, 1), 8e-3);
    check("fwd up (bf16)", rel_diff(gu, lu, nk * Fe, 1), 8e-3);
    set_grouped(0), x_fwd_down(c, ly), set_grouped(1), x_fwd_down(c, gy);
    check("fwd down (bf16)", rel_diff(gy, ly, nk * C, 1), 8e-3);
    set_grouped(0), x_bwd_down_dinp(c, lg), set_grouped(1), x_bwd_down_dinp(c, gg);
    check("bwd down dinp (bf16)", rel_diff(gg, lg, nk * Fe, 1), 8e-3);
    set_grouped(0), x_bwd_gate_up_dinp(c, ly), set_grouped(1), x_bwd_gate_up_dinp(c, gy);
    check("bwd gate+up dinp (bf16, up's beta 1)", rel_diff(gy, ly, nk * C, 1), 1.6e-2);
    set_grouped(0), x_bwd_down_dw(c, lw[2]), set_grouped(1), x_bwd_down_dw(c, gw[2]);
    char name[96];
    snprintf(name, sizeof name, "bwd down dweight (%s)", wnote);
    check(name, rel_diff(gw[2], lw[2], eFC, 0), 1e-4);
    set_grouped(0), x_bwd_gate_up_dw(c, lw[0], lw[1]), set_grouped(1);
    x_bwd_gate_up_dw(c, gw[0], gw[1]);
    snprintf(name, sizeof name, "bwd gate dweight (%s)", wnote);
    check(name, rel_diff(gw[0], lw[0], eFC, 0), 1e-4);
    snprintf(name, sizeof name, "bwd up dweight (%s)", wnote);
    check(name, rel_diff(gw[1], lw[1], eFC, 0), 1e-4);

    /* timings: each mode alone, after a warm-up; and, for scale, "dense": the same FLOPs as one
     * be->matmul_* over all n*k rows with expert 0's weights (what a dense layer of that width
     * reaches: the ceiling for a grouped GEMM) */
    double f = 2.0 * (double)nk * C * Fe;
    mt_layer_ws *ws = &c->ws;
    int R = (int)nk;
    auto three = [&](const char *nm, double fl, auto fn_loop, auto fn_grouped, auto fn_dense) {
        set_grouped(0);
        double l = time_gpu(fn_loop);
        set_grouped(1);
        double g = time_gpu(fn_grouped);
        return gemm_row{nm, fl, l, g, time_gpu(fn_dense)};
    };
    gemm_row r[6] = {
        three("fwd gate+up", 2 * f, [&] { x_fwd_gate_up(c, lg, lu); },
              [&] { x_fwd_gate_up(c, gg, gu); },
              [&] {
                  be->matmul_forward(be, gg, ws->moe_x, c->w.exp_gate, NULL, R, C, Fe);
                  be->matmul_forward(be, gu, ws->moe_x, c->w.exp_up, NULL, R, C, Fe);
              }),
        three("fwd down", f, [&] { x_fwd_down(c, ly); }, [&] { x_fwd_down(c, gy); },
              [&] { be->matmul_forward(be, gy, ws->moe_act, c->w.exp_down, NULL, R, Fe, C); }),
        three("bwd down dinp", f, [&] { x_bwd_down_dinp(c, lg); },
              [&] { x_bwd_down_dinp(c, gg); },
              [&] {
                  be->matmul_backward(be, gg, NULL, NULL, ws->moe_d_y, ws->moe_act, c->w.exp_down,
                                      R, Fe, C, 0);
              }),
        three(g_grouped_f32 ? "bwd down dweight" : "bwd down dweight (padded)", f,
              [&] { x_bwd_down_dw(c, lw[2]); }, [&] { x_bwd_down_dw(c, gw[2]); },
              [&] {
                  be->matmul_backward(be, NULL, gw[2], NULL, ws->moe_d_y, ws->moe_act,
                                      c->w.exp_down, R, Fe, C, 0);
              }),
        three("bwd gate+up dinp", 2 * f, [&] { x_bwd_gate_up_dinp(c, ly); },
              [&] { x_bwd_gate_up_dinp(c, gy); },
              [&] {
                  be->matmul_backward(be, gy, NULL, NULL, ws->moe_d_gate, ws->moe_x,
                                      c->w.exp_gate, R, C, Fe, 0);
                  be->matmul_backward(be, gy, NULL, NULL, ws->moe_d_up, ws->moe_x, c->w.exp_up, R,
                                      C, Fe, 1);
              }),
        three(g_grouped_f32 ? "bwd gate+up dweight" : "bwd gate+up dweight (padded)",
              2 * f, [&] { x_bwd_gate_up_dw(c, lw[0], lw[1]); },
              [&] { x_bwd_gate_up_dw(c, gw[0], gw[1]); },
              [&] {
                  be->matmul_backward(be, NULL, gw[0], NULL, ws->moe_d_gate, ws->moe_x,
                                      c->w.exp_gate, R, C, Fe, 0);
                  be->matmul_backward(be, NULL, gw[1], NULL, ws->moe_d_up, ws->moe_x,
                                      c->w.exp_up, R, C, Fe, 0);
              }),
    };
    set_mode(g_env_mode);
    printf("  %-36s %8s %7s %10s %7s %7s %8s %7s\n", "expert GEMMs (offsets on the host)",
           "loop ms", "TFLOP/s", "grouped ms", "TFLOP/s", "speedup", "dense ms", "TFLOP/s");
    double fl = 0, dense = 0;
    for (const gemm_row &x : r) {
        printf("  %-36s %8.3f %7.1f %10.3f %7.1f %6.2fx %8.3f %7.1f\n", x.name, x.loop_ms,
               x.flops / x.loop_ms * 1e-9, x.grouped_ms, x.flops / x.grouped_ms * 1e-9,
               x.loop_ms / x.grouped_ms, x.dense_ms, x.flops / x.dense_ms * 1e-9);
        *loop_total += x.loop_ms, *grouped_total += x.grouped_ms, fl += x.flops;
        dense += x.dense_ms;
    }
    printf("  %-36s %8.3f %7.1f %10.3f %7.1f %6.2fx %8.3f %7.1f\n", "all expert GEMMs",
           *loop_total, fl / *loop_total * 1e-9, *grouped_total, fl / *grouped_total * 1e-9,
           *loop_total / *grouped_total, dense, fl / dense * 1e-9);

    void *ps[] = {lg, lu, gg, gu, ly, gy, lw[0], lw[1], lw[2], gw[0], gw[1], gw[2]};
    for (void *p : ps) be->free(be, p);
}

/* ---------------------------------------------------------------- one case */

/* mt_moe_forward then mt_moe_backward (what a layer's training runs, recompute aside): mean GPU
 * ms of each over --iters runs after one warm-up. */
static void whole_block(moe_case *c, double *fwd, double *bwd) {
    cudaEvent_t e0, e1, e2;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventCreate(&e2));
    double fsum = 0, bsum = 0;
    for (int i = 0; i <= g_iters; i++) {
        CUDA_CHECK(cudaEventRecord(e0, g_stream));
        mt_moe_forward(&c->lc, &c->w, c->x, c->out, c->n, &c->ws, 0);
        CUDA_CHECK(cudaEventRecord(e1, g_stream));
        mt_moe_backward(&c->lc, &c->w, &c->g, c->dout, c->x, c->dx, c->n, &c->ws);
        CUDA_CHECK(cudaEventRecord(e2, g_stream));
        CUDA_CHECK(cudaEventSynchronize(e2));
        float a, b;
        CUDA_CHECK(cudaEventElapsedTime(&a, e0, e1));
        CUDA_CHECK(cudaEventElapsedTime(&b, e1, e2));
        if (i > 0) fsum += a, bsum += b;
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1), cudaEventDestroy(e2);
    *fwd = fsum / g_iters, *bwd = bsum / g_iters;
}

static void run_case(const char *label, const char *config, int n) {
    moe_case c;
    case_init(&c, config, n);
    double fwd_flops = 2.0 * n * ((double)c.C * c.E + 3.0 * c.k * c.C * c.Fe);
    printf("\n== %s: n %d tokens, E %d, top-%d, C %d, Fe %d; matmul GFLOP fwd %.1f, bwd %.1f\n",
           label, n, c.E, c.k, c.C, c.Fe, fwd_flops * 1e-9, 2 * fwd_flops * 1e-9);

    timeline t;
    tl_init(&t);
    run_pieces(&c, &t); /* warm-up: cuBLASLt plans, the first routing */
    tl_end(&t, 0);
    for (int i = 0; i < g_iters; i++) {
        run_pieces(&c, &t);
        tl_end(&t, 1);
    }
    const int32_t *off = c.ws.moe_offsets_host;
    int mn = 1 << 30, mx = 0, empty = 0;
    for (int e = 0; e < c.E; e++) {
        int m = off[e + 1] - off[e];
        mn = m < mn ? m : mn, mx = m > mx ? m : mx, empty += m == 0;
    }
    printf("  rows per expert: min %d, mean %.0f, max %d, empty experts %d; planner rate %.0f "
           "TFLOP/s\n", mn, (double)c.nk / c.E, mx, empty, be->memory.flops_rate * 1e-12);
    double whole = 0;
    for (int i = 0; i < t.n; i++) whole += t.gpu_sum[i] / t.runs;
    int env_grouped = mt_moe_gemm_use_grouped((mt_moe_gemm_mode)g_env_mode, c.nk, c.E);
    char head[64];
    snprintf(head, sizeof head, "piece (MT_MOE_GEMM=%s%s)", mt_moe_gemm_mode_name((mt_moe_gemm_mode)g_env_mode),
             g_env_mode == MT_MOE_GEMM_AUTO ? (env_grouped ? ": grouped" : ": loop") : "");
    printf("  %-40s %9s %9s %9s %8s %7s\n", head, "GPU ms", "host ms", "GFLOP", "TFLOP/s", "share");
    double fwd = tl_print(&t, 0, 9, "forward total", whole);
    double bwd = tl_print(&t, 9, t.n, "backward total", whole);
    double rate = be->memory.flops_rate > 0 ? be->memory.flops_rate : 600e12;
    printf("  %-40s %9.3f ms = %.1f TFLOP/s; at the planner's %.0f TFLOP/s: %.3f ms (%.0f%%)\n",
           "forward + backward", fwd + bwd, 3 * fwd_flops / ((fwd + bwd) * 1e-3) * 1e-12,
           rate * 1e-12, 3 * fwd_flops / rate * 1e3,
           100 * 3 * fwd_flops / rate * 1e3 / (fwd + bwd));
    tl_free(&t);

    /* the code that trains, whole, in each mode */
    for (int grouped = 0; grouped <= g_grouped_bf16; grouped++) {
        set_grouped(grouped);
        double f, b;
        whole_block(&c, &f, &b);
        const char *mode = grouped ? "grouped" : "loop";
        char lf[64], lb[64], lt[64];
        snprintf(lf, sizeof lf, "mt_moe_forward, MT_MOE_GEMM=%s", mode);
        snprintf(lb, sizeof lb, "mt_moe_backward, MT_MOE_GEMM=%s", mode);
        snprintf(lt, sizeof lt, "  forward + backward, %s", mode);
        printf("  %-40s %9.3f ms%s\n", lf, f,
               grouped == env_grouped ? " (the pieces' mode)" : "");
        printf("  %-40s %9.3f ms\n", lb, b);
        printf("  %-40s %9.3f ms = %.1f TFLOP/s\n", lt, f + b,
               3 * fwd_flops / ((f + b) * 1e-3) * 1e-12);
    }
    set_mode(g_env_mode);

    /* the aux loss's step-end downloads (once per step, not per layer; only with
     * output_router_logits, off in both configs) */
    mt_moe_stats *st = c.ws.moe_stats;
    st->collect = 1, st->rows = n;
    be->sync(be);
    double h0 = now_ms();
    mt_moe_aux_finish(&c.lc, st, NULL);
    printf("  %-40s %9.3f ms host (2 downloads + 1 upload)\n", "aux-loss finish, once per step",
           now_ms() - h0);

    /* the mt_moe_* calls left ws as a forward + backward would: the grouped section's inputs */
    double lt, gt;
    run_grouped(&c, &lt, &gt);
    case_free(&c);
}

int main(int argc, char **argv) {
    const char *only = NULL;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            g_iters = atoi(argv[++i]);
            if (g_iters < 1 || g_iters > 1000) {
                fprintf(stderr, "moe_bench: --iters takes 1..1000\n");
                return 1;
            }
        } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            only = argv[++i];
            if (strcmp(only, "qwen3") && strcmp(only, "mixtral")) {
                fprintf(stderr, "moe_bench: --only takes qwen3 or mixtral\n");
                return 1;
            }
        } else if (!strcmp(argv[i], "--quick")) {
            quick = 1, g_iters = 2;
        } else {
            fprintf(stderr, "usage: moe_bench [--iters N] [--only qwen3|mixtral] [--quick]\n");
            return 1;
        }
    }
    if (!mt_backend_cuda_available()) {
        fprintf(stderr, "moe_bench: no CUDA device\n");
        return 1;
    }
    be = mt_backend_cuda_create(0);
    g_stream = (cudaStream_t)be->native_stream(be, MT_STREAM_COMPUTE);
    g_env_mode = mt_cuda_ctx_of(be)->moe_gemm_mode;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("moe_bench: %s, cuBLAS %d, %d iterations after 1 warm-up\n", prop.name,
           (int)CUBLAS_VERSION, g_iters);
    g_grouped_bf16 = probe_grouped(CUDA_R_16BF, "bf16");
    g_grouped_f32 = g_grouped_bf16 && probe_grouped(CUDA_R_32F, "fp32");
    const char *q = "bench/configs/qwen3-30b-a3b.json", *m = "bench/configs/mixtral-8x7b-16l.json";
    if (!only || !strcmp(only, "qwen3")) {
        run_case("qwen3-30b-a3b layer", q, 4096);
        if (!quick) {
            run_case("qwen3-30b-a3b layer", q, 16384);
            run_case("qwen3-30b-a3b layer", q, 65536);
        }
    }
    if (!quick && (!only || !strcmp(only, "mixtral"))) {
        run_case("mixtral-8x7b layer", m, 16384);
        run_case("mixtral-8x7b layer", m, 65536);
    }
    be->destroy(be);
    long long built = 0, evicted = 0;
    mt_cuda_matmul_plan_counts(&built, &evicted);
    printf("\nmatmul plans (cuBLASLt, one per shape): %lld built, %lld evicted\n", built, evicted);
    printf("moe_bench: %s\n", g_failed ? "a check FAILED (see above)" : "all checks passed");
    return g_failed;
}
