/* Token embedding: a row gather forward; a deterministic scatter-add backward; zero_rows_of_id
 * (the pad token's gradient rows zeroed before the scatter, Gemma).
 *
 * Backward: the (id, n) pairs are radix-sorted by id (cub, stable, so each id's tokens stay in
 * token order); one block per run of equal ids and column slab sums that run's dout rows in fp32 in
 * token order and adds the sum into dtable once. No atomics: the same bits on every run, and the
 * same summation order as the CPU reference. Temporaries come from the stream-ordered pool. */
#include <cub/device/device_radix_sort.cuh>

#include "cuda_vec.cuh"
#include "ops.cuh"

#define EMB_THREADS 128

/* out (N, C) = table[ids[n]]: one block per token row. */
template <int VEC>
static __global__ void embedding_forward_kernel(bf16 *out, const int32_t *ids, const bf16 *table,
                                                int C) {
    int n = blockIdx.x;
    const bf16 *src = table + (size_t)ids[n] * C;
    bf16 *dst = out + (size_t)n * C;
    if (VEC == 8) {
        for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8)
            *reinterpret_cast<uint4 *>(dst + c) = *reinterpret_cast<const uint4 *>(src + c);
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
    }
}

/* Block (i, slab): when sorted position i starts a run of equal ids, sums the run's rows for the
 * slab's columns and adds the sum into dtable[id]. */
template <int VEC>
static __global__ void embedding_backward_kernel(float *dtable, const bf16 *dout,
                                                 const int32_t *sorted_ids,
                                                 const int32_t *sorted_n, int N, int C) {
    int i = blockIdx.x;
    int id = sorted_ids[i];
    if (i > 0 && sorted_ids[i - 1] == id) return; /* not the head of its run */
    int c = (blockIdx.y * blockDim.x + threadIdx.x) * VEC;
    if (c >= C) return;
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; j++) acc[j] = 0.0f;
    for (int k = i; k < N && sorted_ids[k] == id; k++) {
        const bf16 *src = dout + (size_t)sorted_n[k] * C + c;
        if (VEC == 8) {
            float a[8];
            ld8(src, a);
#pragma unroll
            for (int j = 0; j < 8; j++) acc[j] += a[j];
        } else {
            acc[0] += __bfloat162float(src[0]);
        }
    }
    float *dst = dtable + (size_t)id * C + c;
#pragma unroll
    for (int j = 0; j < VEC; j++) dst[j] += acc[j];
}

static __global__ void iota_kernel(int32_t *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = i;
}

void mt_cuda_embedding_forward(bf16 *out, const int32_t *ids, const bf16 *table, int N, int C,
                               cudaStream_t s) {
    MT_CHECK(N >= 0 && C >= 0, "embedding_forward: N=%d C=%d", N, C);
    MT_CHECK(N == 0 || (out && ids && table), "embedding_forward: NULL tensor");
    if (N == 0 || C == 0) return;
    int vec = C % 8 == 0 && mt_aligned16(out) && mt_aligned16(table);
    if (vec) embedding_forward_kernel<8><<<N, EMB_THREADS, 0, s>>>(out, ids, table, C);
    else embedding_forward_kernel<1><<<N, EMB_THREADS, 0, s>>>(out, ids, table, C);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_embedding_backward(float *dtable, const bf16 *dout, const int32_t *ids, int N, int C,
                                cudaStream_t s) {
    MT_CHECK(N >= 0 && C >= 0, "embedding_backward: N=%d C=%d", N, C);
    MT_CHECK(N == 0 || (dtable && dout && ids), "embedding_backward: NULL tensor");
    if (N == 0 || C == 0) return;
    /* 4 int32 arrays of N, then cub's temporary storage */
    size_t temp_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, temp_bytes, (const int32_t *)NULL,
                                               (int32_t *)NULL, (const int32_t *)NULL,
                                               (int32_t *)NULL, N, 0, 32, s));
    size_t arr = ((size_t)N * sizeof(int32_t) + 255) & ~(size_t)255;
    char *buf = NULL;
    CUDA_CHECK(cudaMallocAsync((void **)&buf, 3 * arr + temp_bytes, s));
    int32_t *n_in = (int32_t *)buf, *ids_out = (int32_t *)(buf + arr),
            *n_out = (int32_t *)(buf + 2 * arr);
    void *temp = buf + 3 * arr;
    iota_kernel<<<(N + 255) / 256, 256, 0, s>>>(n_in, N);
    CUDA_LAUNCH_CHECK();
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids, ids_out, n_in, n_out, N, 0,
                                               32, s));
    int vec = C % 8 == 0 && mt_aligned16(dout) && mt_aligned16(dtable) ? 8 : 1;
    int cols_per_block = EMB_THREADS * vec;
    dim3 grid((unsigned)N, (unsigned)((C + cols_per_block - 1) / cols_per_block));
    if (vec == 8)
        embedding_backward_kernel<8><<<grid, EMB_THREADS, 0, s>>>(dtable, dout, ids_out, n_out, N, C);
    else
        embedding_backward_kernel<1><<<grid, EMB_THREADS, 0, s>>>(dtable, dout, ids_out, n_out, N, C);
    CUDA_LAUNCH_CHECK();
    CUDA_CHECK(cudaFreeAsync(buf, s));
}

/* Rows of token `id` zeroed (nn.Embedding's padding_idx: the pad token's row then gets nothing
 * from the scatter): one block a row, the ones of other ids leave at once. */
static __global__ void zero_rows_of_id_kernel(bf16 *x, const int32_t *ids, int32_t id, int C) {
    int n = blockIdx.x;
    if (ids[n] != id) return;
    bf16 *row = x + (size_t)n * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) row[c] = __float2bfloat16_rn(0.0f);
}

void mt_cuda_zero_rows_of_id(bf16 *x, const int32_t *ids, int32_t id, int N, int C,
                             cudaStream_t s) {
    MT_CHECK(N >= 0 && C >= 0, "zero_rows_of_id: N=%d C=%d", N, C);
    if (N == 0 || C == 0) return;
    MT_CHECK(x && ids, "zero_rows_of_id: NULL tensor");
    zero_rows_of_id_kernel<<<N, EMB_THREADS, 0, s>>>(x, ids, id, C);
    CUDA_LAUNCH_CHECK();
}
