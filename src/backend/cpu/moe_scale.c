/* Gemma 4's per-expert gate scale on the CPU: each token's k routing weights times its chosen
 * experts' per_expert_scale, and the backward (backend.h moe_expert_scale_*). Letters as moe.c. */
#include <string.h>

#include "cpu_ops.h"

/* w_out (n, k) = w * scale[idx]. */
void mt_cpu_moe_expert_scale_forward(float *w_out, const float *w, const int32_t *idx,
                                     const float *scale, int n, int k) {
    for (size_t a = 0; a < (size_t)n * k; a++) w_out[a] = w[a] * scale[idx[a]];
}

/* d_w (n, k) = d_out * scale[idx] (=); d_scale[e] += d_out * w over expert e's assignments, in
 * assignment order (one thread: the same bits every run; n * k is small). */
void mt_cpu_moe_expert_scale_backward(float *d_w, float *d_scale, const float *d_out, const float *w,
                                      const int32_t *idx, const float *scale, int n, int k) {
    for (size_t a = 0; a < (size_t)n * k; a++) {
        d_w[a] = d_out[a] * scale[idx[a]];
        if (d_scale) d_scale[idx[a]] += d_out[a] * w[a];
    }
}
