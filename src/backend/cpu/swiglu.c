/* SwiGLU's elementwise part, silu(gate) * up, and the residual add. */
#include <math.h>

#include "cpu_ops.h"

/* Below this many elements a parallel region costs more than the loop. */
#define ELEMWISE_PAR_MIN 32768

/* out = silu(g) * u with silu(g) = g * sigmoid(g), as torch.nn.functional.silu. */
void mt_cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > ELEMWISE_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        float sig = 1.0f / (1.0f + expf(-g));
        out[i] = g * sig * up[i];
    }
}

/* d silu(g)/dg = sig * (1 + g * (1 - sig)). dgate, dup written (=). */
void mt_cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > ELEMWISE_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], d = dout[i];
        float sig = 1.0f / (1.0f + expf(-g));
        float silu = g * sig;
        dgate[i] = d * up[i] * sig * (1.0f + g * (1.0f - sig));
        dup[i] = d * silu;
    }
}

/* out may alias a or b: each element is read before it is written. */
void mt_cpu_add(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > ELEMWISE_PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void mt_cpu_scale(float *x, float s, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}
