/* Rotary position embedding as transformers' rotate_half: pairs (i, i + rd/2) of the first rd dims
 * of each head (rd < D: partial RoPE, the other dims untouched), in place.
 * One block per token: the block first takes cos/sin of the fp32 angle (float)pos * inv_freq[i]
 * with the accurate sincosf (not __sincosf: positions reach 10^5..10^6 radians, where the fast
 * intrinsic loses every digit) into shared memory, then rotates all nh heads of the token. The
 * backward is the rotation by the opposite angle. 16-byte accesses when rd % 16 == 0 and D % 8
 * == 0 (every head and both halves start on 16 bytes). */
#include "cuda_vec.cuh"
#include "ops.cuh"

#define ROPE_THREADS 128
#define ROPE_MAX_HALF 512 /* D up to 1024, as the CPU op */

template <int VEC>
static __global__ void __launch_bounds__(ROPE_THREADS)
    rope_kernel(bf16 *x, const int32_t *pos, const float *inv_freq, int nh, int D, int rd, float sign) {
    __shared__ float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
    int n = blockIdx.x, half = rd / 2;
    float p = (float)pos[n];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float angle = p * inv_freq[i];
        float sv, cv;
        sincosf(angle, &sv, &cv);
        cs[i] = cv;
        sn[i] = sign * sv;
    }
    __syncthreads();
    bf16 *row = x + (size_t)n * nh * D;
    int per_head = half / VEC; /* work items per head */
    for (int w = threadIdx.x; w < nh * per_head; w += blockDim.x) {
        int h = w / per_head, i = (w % per_head) * VEC;
        bf16 *a = row + (size_t)h * D + i, *b = a + half;
        if (VEC == 8) {
            float x1[8], x2[8], o1[8], o2[8];
            ld8(a, x1);
            ld8(b, x2);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                o1[j] = x1[j] * cs[i + j] - x2[j] * sn[i + j];
                o2[j] = x2[j] * cs[i + j] + x1[j] * sn[i + j];
            }
            st8(a, o1);
            st8(b, o2);
        } else {
            float x1 = __bfloat162float(a[0]), x2 = __bfloat162float(b[0]);
            a[0] = __float2bfloat16_rn(x1 * cs[i] - x2 * sn[i]);
            b[0] = __float2bfloat16_rn(x2 * cs[i] + x1 * sn[i]);
        }
    }
}

static void rope_launch(bf16 *x, const int32_t *pos, const float *inv_freq, int N, int nh, int D,
                        int rd, float sign, cudaStream_t s) {
    MT_CHECK(N >= 0 && nh > 0, "rope: N=%d nh=%d", N, nh);
    MT_CHECK(D > 0 && D % 2 == 0 && D / 2 <= ROPE_MAX_HALF,
             "rope: head dim D=%d must be even and <= %d", D, 2 * ROPE_MAX_HALF);
    MT_CHECK(rd > 0 && rd <= D && rd % 2 == 0, "rope: %d rotary dims of head dim %d", rd, D);
    MT_CHECK(N == 0 || (x && pos && inv_freq), "rope: NULL tensor");
    if (N == 0) return;
    if (rd % 16 == 0 && D % 8 == 0 && mt_aligned16(x))
        rope_kernel<8><<<N, ROPE_THREADS, 0, s>>>(x, pos, inv_freq, nh, D, rd, sign);
    else
        rope_kernel<1><<<N, ROPE_THREADS, 0, s>>>(x, pos, inv_freq, nh, D, rd, sign);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_rope_forward(bf16 *x, const int32_t *pos, const float *inv_freq, int N, int nh, int D,
                          int rd, cudaStream_t s) {
    rope_launch(x, pos, inv_freq, N, nh, D, rd, 1.0f, s);
}

void mt_cuda_rope_backward(bf16 *dx, const int32_t *pos, const float *inv_freq, int N, int nh,
                           int D, int rd, cudaStream_t s) {
    rope_launch(dx, pos, inv_freq, N, nh, D, rd, -1.0f, s);
}
