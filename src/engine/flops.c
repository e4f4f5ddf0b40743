#include "engine/flops.h"

#include <stddef.h>

double mt_flops_6nt(double n_params, double tokens) { return 6.0 * n_params * tokens; }

double mt_flops_doc_square_sum(const int32_t *doc_start, int B, int T) {
    if (!doc_start) return (double)B * T * T;
    double sum = 0;
    for (int b = 0; b < B; b++) {
        const int32_t *row = doc_start + (size_t)b * T;
        int start = 0; /* the current document's first position */
        for (int t = 1; t <= T; t++)
            if (t == T || row[t] == t) {
                double n = t - start;
                sum += n * n;
                start = t;
            }
    }
    return sum;
}

double mt_flops_attention(const mt_config *c, const int32_t *doc_start, int B, int T) {
    /* per layer: forward 2 products of 2·H·D FLOPs per visible (query, key) pair, n²/2 pairs a
     * document; backward 2.5x: 3.5 · 4 · H · D · n² / 2 = 7 · H · D · n² */
    return 7.0 * c->L * c->H * (double)c->D * mt_flops_doc_square_sum(doc_start, B, T);
}

double mt_flops_layer_projections(const mt_config *c, double tokens, int with_mlp) {
    double HD = (double)c->H * c->D, GD = (double)c->G * c->D;
    return tokens * 2.0 * (2 * c->C * HD + 2 * c->C * GD + (with_mlp ? 3.0 * c->C * c->F : 0));
}

double mt_flops_layer_attention_forward(const mt_config *c, double tokens, int T) {
    return tokens * 4.0 * (T / 2.0) * c->H * c->D;
}

double mt_flops_executed(const mt_config *c, double tokens, int T, int saved_layers, int saved_attention) {
    double layer = mt_flops_layer_projections(c, tokens, 1);
    double attn = mt_flops_layer_attention_forward(c, tokens, T);
    int recomputed = c->L - saved_layers - saved_attention;
    return c->L * (layer * 3 + attn * 3.5) + recomputed * (layer + attn) + saved_attention * layer +
           tokens * 2.0 * c->C * c->V * 3;
}
