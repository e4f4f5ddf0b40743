/* The Gated DeltaNet's decay and write strength (backend.h's gdn_gates_*; the CPU op:
 * src/backend/cpu/gdn_gates.c): g = -exp(A_log) softplus(a + dt_bias) (torch's softplus,
 * threshold 20), beta = sigmoid(b), fp32 out, computed in double as the CPU does.
 * Backward: da, db elementwise; dA_log[h] += sum_n dg g and ddt_bias[h] += sum_n da, summed by
 * parts of GATES_ROWS rows (a thread a head and a fixed row subset, the block's sub-sums in order)
 * and the parts added in order by a second kernel: no atomics, the same bits every run.
 * dA_log or ddt_bias NULL (frozen) is skipped; both NULL: no partials, no second kernel. da and db
 * are the same bits either way. */
#include "cuda_vec.cuh"
#include "ops.cuh"

#define GATES_TY 8
#define GATES_ROWS 256 /* rows a part (at least) */
#define GATES_MAX_PARTS 1024

static __device__ __forceinline__ double softplus_(double x) { return x > 20.0 ? x : log1p(exp(x)); }
static __device__ __forceinline__ double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

static __global__ void gates_forward_kernel(float *g, float *beta, const bf16 *a, const bf16 *b,
                                            const bf16 *A_log, const bf16 *dt_bias, size_t total,
                                            int H) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int h = (int)(i % H);
        double x = (double)__bfloat162float(a[i]) + (double)__bfloat162float(dt_bias[h]);
        g[i] = (float)(-exp((double)__bfloat162float(A_log[h])) * softplus_(x));
        beta[i] = (float)sigmoid_d((double)__bfloat162float(b[i]));
    }
}

/* part (parts, 2, H): the part's sums of dg g and of da for each head; part NULL: none (the
 * branches on it are uniform over the grid). */
static __global__ void __launch_bounds__(32 * GATES_TY)
    gates_backward_kernel(bf16 *da, bf16 *db, float *part, const float *dg, const float *dbeta,
                          const bf16 *a, const bf16 *b, const bf16 *A_log, const bf16 *dt_bias,
                          int N, int H, int rows_per_part) {
    __shared__ double red[2][GATES_TY][32];
    int tx = threadIdx.x, ty = threadIdx.y, h = blockIdx.x * 32 + tx;
    int r0 = blockIdx.y * rows_per_part, r1 = min(N, r0 + rows_per_part);
    double sA = 0.0, sdt = 0.0;
    if (h < H) {
        double eA = exp((double)__bfloat162float(A_log[h])), bias = __bfloat162float(dt_bias[h]);
        for (int n = r0 + ty; n < r1; n += GATES_TY) {
            size_t i = (size_t)n * H + h;
            double x = (double)__bfloat162float(a[i]) + bias;
            double dai = dg[i] * -eA * sigmoid_d(x);
            da[i] = __float2bfloat16_rn((float)dai);
            if (part) {
                sA += dg[i] * (-eA * softplus_(x));
                sdt += dai;
            }
            double s = sigmoid_d((double)__bfloat162float(b[i]));
            db[i] = __float2bfloat16_rn((float)(dbeta[i] * s * (1.0 - s)));
        }
    }
    if (!part) return;
    red[0][ty][tx] = sA;
    red[1][ty][tx] = sdt;
    __syncthreads();
    if (ty == 0 && h < H) {
        double a0 = 0.0, a1 = 0.0;
        for (int t = 0; t < GATES_TY; t++) a0 += red[0][t][tx], a1 += red[1][t][tx];
        part[((size_t)blockIdx.y * 2) * H + h] = (float)a0;
        part[((size_t)blockIdx.y * 2 + 1) * H + h] = (float)a1;
    }
}

static __global__ void gates_finish_kernel(float *dA_log, float *ddt_bias, const float *part,
                                           int parts, int H) {
    int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= H) return;
    double a0 = 0.0, a1 = 0.0;
    for (int p = 0; p < parts; p++) {
        a0 += part[((size_t)p * 2) * H + h];
        a1 += part[((size_t)p * 2 + 1) * H + h];
    }
    if (dA_log) dA_log[h] += (float)a0;
    if (ddt_bias) ddt_bias[h] += (float)a1;
}

void mt_cuda_gdn_gates_forward(float *g, float *beta, const bf16 *a, const bf16 *b,
                               const bf16 *A_log, const bf16 *dt_bias, int N, int Hv,
                               cudaStream_t s) {
    MT_CHECK(N >= 0 && Hv > 0, "gdn_gates_forward: N=%d Hv=%d", N, Hv);
    size_t total = (size_t)N * Hv;
    if (!total) return;
    MT_CHECK(g && beta && a && b && A_log && dt_bias, "gdn_gates_forward: NULL tensor");
    gates_forward_kernel<<<mt_ew_blocks(total), MT_CUDA_EW_THREADS, 0, s>>>(g, beta, a, b, A_log,
                                                                           dt_bias, total, Hv);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_gdn_gates_backward(bf16 *da, bf16 *db, float *dA_log, float *ddt_bias,
                                const float *dg, const float *dbeta, const bf16 *a, const bf16 *b,
                                const bf16 *A_log, const bf16 *dt_bias, int N, int Hv,
                                cudaStream_t s) {
    MT_CHECK(N >= 0 && Hv > 0, "gdn_gates_backward: N=%d Hv=%d", N, Hv);
    if (N == 0) return;
    MT_CHECK(da && db && dg && dbeta && a && b && A_log && dt_bias,
             "gdn_gates_backward: NULL tensor");
    int sums = dA_log || ddt_bias; /* both frozen: da and db only */
    int rows = (N + GATES_MAX_PARTS - 1) / GATES_MAX_PARTS;
    if (rows < GATES_ROWS) rows = GATES_ROWS;
    int parts = (N + rows - 1) / rows;
    float *part = NULL;
    if (sums) CUDA_CHECK(cudaMallocAsync((void **)&part, (size_t)parts * 2 * Hv * sizeof(float), s));
    dim3 grid((unsigned)((Hv + 31) / 32), (unsigned)parts), block(32, GATES_TY);
    gates_backward_kernel<<<grid, block, 0, s>>>(da, db, part, dg, dbeta, a, b, A_log, dt_bias, N,
                                                 Hv, rows);
    CUDA_LAUNCH_CHECK();
    if (!sums) return;
    gates_finish_kernel<<<(Hv + 255) / 256, 256, 0, s>>>(dA_log, ddt_bias, part, parts, Hv);
    CUDA_LAUNCH_CHECK();
    CUDA_CHECK(cudaFreeAsync(part, s));
}
