/* gpt-oss's clamped SwiGLU (transformers' GptOssExperts._apply_gate): gate and up interleaved in
 * one row (gate j at column 2j, up j at 2j+1), gate clamped above at limit, up to [-limit, limit],
 * out = (up + 1) * gate * sigmoid(alpha * gate). Not silu: alpha 1.702 makes it gelu-like. */
#include <math.h>
#include <stddef.h>

#include "cpu_ops.h"

void mt_cpu_swiglu_clamped_forward(float *out, const float *gate_up, int R, int F, float alpha,
                                   float limit) {
    size_t n = (size_t)R * F;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (size_t i = 0; i < n; i++) {
        float g = gate_up[2 * i], u = gate_up[2 * i + 1];
        g = g > limit ? limit : g;
        u = u > limit ? limit : u < -limit ? -limit : u;
        float sig = 1.0f / (1.0f + expf(-alpha * g));
        out[i] = (u + 1.0f) * g * sig;
    }
}

/* d/dg [g sigmoid(a g)] = sig (1 + a g (1 - sig)); a clamped value passes no gradient (torch.clamp:
 * the bounds themselves still pass it). */
void mt_cpu_swiglu_clamped_backward(float *dgate_up, const float *dout, const float *gate_up, int R,
                                    int F, float alpha, float limit) {
    size_t n = (size_t)R * F;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (size_t i = 0; i < n; i++) {
        float g0 = gate_up[2 * i], u0 = gate_up[2 * i + 1], d = dout[i];
        float g = g0 > limit ? limit : g0;
        float u = u0 > limit ? limit : u0 < -limit ? -limit : u0;
        float sig = 1.0f / (1.0f + expf(-alpha * g));
        float glu = g * sig;
        float dg = d * (u + 1.0f) * sig * (1.0f + alpha * g * (1.0f - sig));
        dgate_up[2 * i] = g0 > limit ? 0.0f : dg;
        dgate_up[2 * i + 1] = (u0 > limit || u0 < -limit) ? 0.0f : d * glu;
    }
}
