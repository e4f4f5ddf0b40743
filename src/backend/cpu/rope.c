/* Rotary position embedding as transformers' rotate_half: pairs (i, i + rd/2) of the first rd
 * dims of each head (rd = D: the whole head; rd < D: partial RoPE, the rest passed through). */
#include <math.h>

#include "../../core/error.h"
#include "cpu_ops.h"

#define ROPE_MAX_HALF 512 /* D up to 1024 */

/* Rotates each head vector of x (N, nh, D) in place by angle pos[n] * inv_freq[i] (times `sign`).
 * The angle is the fp32 product, as transformers computes it; cos/sin are taken of that fp32
 * value, once per (token, i) and shared by the nh heads. */
static void rope_rotate(float *x, const int32_t *pos, const float *inv_freq, int N, int nh, int D,
                        int rd, float sign) {
    MT_CHECK(D % 2 == 0 && D / 2 <= ROPE_MAX_HALF, "rope: head dim D=%d must be even and <= %d", D,
             2 * ROPE_MAX_HALF);
    MT_CHECK(rd > 0 && rd <= D && rd % 2 == 0, "rope: %d rotary dims of head dim %d", rd, D);
    int half = rd / 2;
#pragma omp parallel for schedule(static) if ((size_t)N * nh * D > 32768)
    for (int n = 0; n < N; n++) {
        float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
        float p = (float)pos[n];
        for (int i = 0; i < half; i++) {
            float angle = p * inv_freq[i];
            cs[i] = cosf(angle);
            sn[i] = sign * sinf(angle);
        }
        for (int h = 0; h < nh; h++) {
            float *a = x + ((size_t)n * nh + h) * D, *b = a + half;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                float x1 = a[i], x2 = b[i];
                a[i] = x1 * cs[i] - x2 * sn[i];
                b[i] = x2 * cs[i] + x1 * sn[i];
            }
        }
    }
}

void mt_cpu_rope_forward(float *x, const int32_t *pos, const float *inv_freq, int N, int nh, int D,
                         int rd) {
    rope_rotate(x, pos, inv_freq, N, nh, D, rd, 1.0f);
}

/* The rotation is orthogonal, so its gradient is the rotation by the opposite angle. */
void mt_cpu_rope_backward(float *dx, const int32_t *pos, const float *inv_freq, int N, int nh,
                          int D, int rd) {
    rope_rotate(dx, pos, inv_freq, N, nh, D, rd, -1.0f);
}
