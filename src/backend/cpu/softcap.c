/* Gemma 4's elementwise ops: the final logits' soft-cap, cap * tanh(x / cap), and the scale by a
 * per-layer scalar held as a tensor (layer_scalar). */
#include <math.h>

#include "cpu_ops.h"

/* Below this many elements a parallel region costs more than the loop. */
#define ELEMWISE_PAR_MIN 32768

/* x = cap * tanh(x / cap) in place, as transformers' logits / cap, tanh, * cap. */
void mt_cpu_softcap(float *x, float cap, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > ELEMWISE_PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

/* out = x * s[0]; out may alias x. */
void mt_cpu_scale_by(float *out, const float *x, const float *s, size_t n) {
    float k = s[0];
#pragma omp parallel for simd schedule(static) if (n > ELEMWISE_PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = x[i] * k;
}
