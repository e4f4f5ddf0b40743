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

double mt_flops_layer_mlp(const mt_config *c, int l, double tokens) {
    double C = c->C;
    if (mt_config_layer_is_moe(c, l))
        return tokens * 2.0 * (C * c->n_experts + (double)c->top_k * 3.0 * C * c->moe_F);
    return tokens * 2.0 * 3.0 * C * c->F;
}

double mt_flops_layer_projections(const mt_config *c, int l, double tokens, int with_mlp) {
    double HD = (double)c->H * c->D, GD = (double)c->G * c->D;
    return tokens * 2.0 * (2 * c->C * HD + 2 * c->C * GD) + (with_mlp ? mt_flops_layer_mlp(c, l, tokens) : 0);
}

double mt_flops_layer_attention_forward(const mt_config *c, double tokens, int T) {
    return tokens * 4.0 * (T / 2.0) * c->H * c->D;
}

double mt_flops_head_forward(const mt_config *c, double tokens) { return tokens * 2.0 * c->C * c->V; }

double mt_flops_executed(const mt_config *c, double tokens, int T, int saved_layers, int saved_attention) {
    double attn = mt_flops_layer_attention_forward(c, tokens, T), sum = 0;
    int first_saved = c->L - saved_layers, first_att = first_saved - saved_attention;
    for (int l = 0; l < c->L; l++) {
        double layer = mt_flops_layer_projections(c, l, tokens, 1);
        sum += layer * 3 + attn * 3.5; /* forward, backward */
        if (l < first_att) sum += layer + attn;  /* the recompute of a checkpointed layer */
        else if (l < first_saved) sum += layer;  /* saved attention: all but the attention */
    }
    return sum + mt_flops_head_forward(c, tokens) * 3;
}
