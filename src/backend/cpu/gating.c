/* Sigmoid gates and column splits, fp32: qwen3_5's gated attention (attention output times
 * sigmoid of a per-head gate that q_proj yields beside the queries) and its MoE's shared expert
 * (one gate a token). */
#include <math.h>
#include <string.h>

#include "../../core/error.h"
#include "cpu_ops.h"

static float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

static void check_gate(int R, int C, int Cg) {
    MT_CHECK(R >= 0 && C > 0 && (Cg == C || Cg == 1), "sigmoid_gate: R=%d C=%d gate columns %d", R,
             C, Cg);
}

void mt_cpu_sigmoid_gate_forward(float *out, const float *x, const float *g, int R, int C, int Cg) {
    check_gate(R, C, Cg);
#pragma omp parallel for schedule(static) if ((size_t)R * C > 32768)
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)r * C + c;
            out[i] = x[i] * sigmoid(g[(size_t)r * Cg + (Cg == 1 ? 0 : c)]);
        }
}

/* With s = sigmoid(g): dx = dout * s, dg = dout * x * s * (1 - s), summed over the row when one
 * gate serves it. dx may alias dout (each element is read before it is written). */
void mt_cpu_sigmoid_gate_backward(float *dx, float *dg, const float *dout, const float *x,
                                  const float *g, int R, int C, int Cg) {
    check_gate(R, C, Cg);
#pragma omp parallel for schedule(static) if ((size_t)R * C > 32768)
    for (int r = 0; r < R; r++) {
        float row = 0.0f;
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)r * C + c, j = (size_t)r * Cg + (Cg == 1 ? 0 : c);
            float s = sigmoid(g[j]), d = dout[i];
            float d_g = d * x[i] * s * (1.0f - s);
            dx[i] = d * s;
            if (Cg == 1) row += d_g;
            else dg[j] = d_g;
        }
        if (Cg == 1) dg[r] = row;
    }
}

void mt_cpu_cols_split(float *a, float *b, const float *in, int R, int wa, int wb) {
    MT_CHECK(R >= 0 && wa > 0 && wb > 0, "cols_split: R=%d widths %d, %d", R, wa, wb);
    for (int r = 0; r < R; r++) {
        const float *row = in + (size_t)r * (wa + wb);
        memcpy(a + (size_t)r * wa, row, (size_t)wa * sizeof(float));
        memcpy(b + (size_t)r * wb, row + wa, (size_t)wb * sizeof(float));
    }
}

void mt_cpu_cols_join(float *out, const float *a, const float *b, int R, int wa, int wb) {
    MT_CHECK(R >= 0 && wa > 0 && wb > 0, "cols_join: R=%d widths %d, %d", R, wa, wb);
    for (int r = 0; r < R; r++) {
        float *row = out + (size_t)r * (wa + wb);
        memcpy(row, a + (size_t)r * wa, (size_t)wa * sizeof(float));
        memcpy(row + wa, b + (size_t)r * wb, (size_t)wb * sizeof(float));
    }
}
