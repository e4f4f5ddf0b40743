/* GeGLU's elementwise part, gelu_tanh(gate) * up (Gemma's MLP: gelu_pytorch_tanh). */
#include <math.h>

#include "cpu_ops.h"

/* Below this many elements a parallel region costs more than the loop. */
#define ELEMWISE_PAR_MIN 32768

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* out = gelu_tanh(g) * u, gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), as
 * torch.nn.functional.gelu(approximate="tanh"). */
void mt_cpu_geglu_forward(float *out, const float *gate, const float *up, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > ELEMWISE_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        float t = tanhf(GELU_K * (g + GELU_C * g * g * g));
        out[i] = 0.5f * g * (1.0f + t) * up[i];
    }
}

/* d gelu_tanh/dg = 0.5 (1 + t) + 0.5 g (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 g^2).
 * dgate, dup written (=). */
void mt_cpu_geglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                           const float *up, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > ELEMWISE_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], d = dout[i];
        float t = tanhf(GELU_K * (g + GELU_C * g * g * g));
        float gelu = 0.5f * g * (1.0f + t);
        float dgelu = 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * g * g);
        dgate[i] = d * up[i] * dgelu;
        dup[i] = d * gelu;
    }
}
