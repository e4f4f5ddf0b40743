/* Mixture-of-experts routing on the CPU: the router's softmax and top-k, the grouping of the
 * (token, choice) assignments by expert, the gather of expert inputs and the gate-weighted
 * combine, with their backward. The experts' SwiGLU itself is the ordinary matmul and swiglu
 * ops on each expert's rows. Letters: n tokens, E experts, k choices per token; assignment
 * a = t * k + j is token t's j-th choice; "grouped" order sorts assignments by expert, then by a.
 */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"

/* Below this many tokens a parallel region costs more than the loop. */
#define MOE_PAR_MIN 256

/* probs = softmax(logits) in fp32 (max-subtracted, as torch); the k largest in descending order,
 * ties to the lower expert (torch.topk leaves their order unspecified); top_w the chosen
 * probabilities, divided by their sum when renorm. counts (+= selections per expert) and
 * prob_sum (+= probabilities per expert) are the load-balancing loss's statistics, skipped when
 * NULL. */
void mt_cpu_moe_route(float *probs, int32_t *top_idx, float *top_w, int32_t *counts,
                      float *prob_sum, const float *logits, int n, int E, int k, int renorm) {
#pragma omp parallel for schedule(static) if (n > MOE_PAR_MIN)
    for (int t = 0; t < n; t++) {
        const float *z = logits + (size_t)t * E;
        float *p = probs + (size_t)t * E;
        float mx = z[0];
        for (int e = 1; e < E; e++) mx = z[e] > mx ? z[e] : mx;
        double sum = 0;
        for (int e = 0; e < E; e++) {
            p[e] = expf(z[e] - mx);
            sum += p[e];
        }
        float inv = (float)(1.0 / sum);
        for (int e = 0; e < E; e++) p[e] *= inv;
        int32_t *idx = top_idx + (size_t)t * k;
        float *w = top_w + (size_t)t * k;
        for (int j = 0; j < k; j++) { /* k passes: k is small (2..8) */
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= idx[i] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            idx[j] = best;
            w[j] = p[best];
        }
        if (renorm) {
            float s = 0;
            for (int j = 0; j < k; j++) s += w[j];
            for (int j = 0; j < k; j++) w[j] /= s;
        }
    }
    if (!counts) return;
    /* serial, in token order: the sums do not depend on the thread count */
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) counts[top_idx[(size_t)t * k + j]]++;
    for (int e = 0; e < E; e++) {
        double s = 0;
        for (int t = 0; t < n; t++) s += probs[(size_t)t * E + e];
        prob_sum[e] += (float)s;
    }
}

/* offsets (E + 1): expert e's assignments are grouped rows offsets[e] .. offsets[e+1]-1;
 * perm[row] = the assignment there, inv[assignment] = its row (a counting sort, stable in a). */
void mt_cpu_moe_group(int32_t *perm, int32_t *inv, int32_t *offsets, const int32_t *top_idx, int n,
                      int E, int k) {
    int nk = n * k;
    for (int e = 0; e <= E; e++) offsets[e] = 0;
    for (int a = 0; a < nk; a++) offsets[top_idx[a] + 1]++;
    for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
    /* a fill cursor per expert: offsets[e] advanced, then restored */
    for (int a = 0; a < nk; a++) {
        int row = offsets[top_idx[a]]++;
        perm[row] = a;
        inv[a] = row;
    }
    for (int e = E; e > 0; e--) offsets[e] = offsets[e - 1];
    offsets[0] = 0;
}

/* xg (n*k, C): grouped row r = x[perm[r] / k]. */
void mt_cpu_moe_gather(float *xg, const float *x, const int32_t *perm, int n, int C, int k) {
    int nk = n * k;
#pragma omp parallel for schedule(static) if (nk > MOE_PAR_MIN)
    for (int r = 0; r < nk; r++)
        memcpy(xg + (size_t)r * C, x + (size_t)(perm[r] / k) * C, (size_t)C * sizeof(float));
}

/* dx (n, C) = (or += when accumulate) the sum of token t's k grouped rows of dxg, in choice order. */
void mt_cpu_moe_gather_backward(float *dx, const float *dxg, const int32_t *inv, int n, int C,
                                int k, int accumulate) {
#pragma omp parallel for schedule(static) if (n > MOE_PAR_MIN)
    for (int t = 0; t < n; t++) {
        float *d = dx + (size_t)t * C;
        if (!accumulate) memset(d, 0, (size_t)C * sizeof(float));
        for (int j = 0; j < k; j++) {
            const float *s = dxg + (size_t)inv[(size_t)t * k + j] * C;
            for (int c = 0; c < C; c++) d[c] += s[c];
        }
    }
}

/* out (n, C) = sum over j of top_w[t, j] * y[inv[t*k + j]] (=), in choice order. */
void mt_cpu_moe_combine(float *out, const float *y, const float *top_w, const int32_t *inv, int n,
                        int C, int k) {
#pragma omp parallel for schedule(static) if (n > MOE_PAR_MIN)
    for (int t = 0; t < n; t++) {
        float *o = out + (size_t)t * C;
        memset(o, 0, (size_t)C * sizeof(float));
        for (int j = 0; j < k; j++) {
            float w = top_w[(size_t)t * k + j];
            const float *s = y + (size_t)inv[(size_t)t * k + j] * C;
            for (int c = 0; c < C; c++) o[c] += w * s[c];
        }
    }
}

/* dy (grouped rows) = top_w * dout of the row's token; d_w[t, j] = dout[t] . y[its row]. */
void mt_cpu_moe_combine_backward(float *dy, float *d_w, const float *dout, const float *y,
                                 const float *top_w, const int32_t *inv, int n, int C, int k) {
#pragma omp parallel for schedule(static) if (n > MOE_PAR_MIN)
    for (int t = 0; t < n; t++) {
        const float *g = dout + (size_t)t * C;
        for (int j = 0; j < k; j++) {
            size_t a = (size_t)t * k + j, row = (size_t)inv[a];
            float w = top_w[a];
            const float *s = y + row * C;
            float *d = dy + row * C;
            double dot = 0;
            for (int c = 0; c < C; c++) {
                d[c] = w * g[c];
                dot += (double)g[c] * s[c];
            }
            d_w[a] = (float)dot;
        }
    }
}

/* d_logits (n, E) (=) from the gates' gradient d_w (n, k) and, when aux_grad is not NULL, a
 * gradient aux_grad (E) on every probability (the load-balancing loss's): through the
 * renormalisation (w_j = v_j / S: dv_j = (dw_j - sum_i dw_i w_i) / S), then the softmax
 * (dz = p * (dp - p . dp)). */
void mt_cpu_moe_route_backward(float *d_logits, const float *d_w, const float *probs,
                               const int32_t *top_idx, const float *top_w, const float *aux_grad,
                               int n, int E, int k, int renorm) {
#pragma omp parallel for schedule(static) if (n > MOE_PAR_MIN)
    for (int t = 0; t < n; t++) {
        const float *p = probs + (size_t)t * E;
        const int32_t *idx = top_idx + (size_t)t * k;
        const float *dw = d_w + (size_t)t * k, *w = top_w + (size_t)t * k;
        float *dz = d_logits + (size_t)t * E; /* holds dp first */
        for (int e = 0; e < E; e++) dz[e] = aux_grad ? aux_grad[e] : 0.0f;
        if (renorm) {
            float S = 0, dot = 0;
            for (int j = 0; j < k; j++) {
                S += p[idx[j]];
                dot += dw[j] * w[j];
            }
            for (int j = 0; j < k; j++) dz[idx[j]] += (dw[j] - dot) / S;
        } else {
            for (int j = 0; j < k; j++) dz[idx[j]] += dw[j];
        }
        double pd = 0;
        for (int e = 0; e < E; e++) pd += (double)p[e] * dz[e];
        for (int e = 0; e < E; e++) dz[e] = p[e] * (dz[e] - (float)pd);
    }
}
