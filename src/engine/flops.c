#include "engine/flops.h"

#include <stddef.h>

double mt_flops_6nt(double n_params, double tokens) { return 6.0 * n_params * tokens; }

/* Twice the (query, key) pairs of a causal document of n tokens under a window of W keys (0:
 * none), in the n² convention of the rest: n² without a window (or n <= W), else each of the n - W
 * later queries sees W keys: W² + 2 (n - W) W. */
static double window_square(double n, int W) {
    if (W <= 0 || n <= W) return n * n;
    return (double)W * W + 2.0 * (n - W) * W;
}

/* doc_square_sum under a window of W keys (mt_flops_doc_square_sum when W is 0). */
static double doc_square_sum_window(const int32_t *doc_start, int B, int T, int W) {
    if (!doc_start) return (double)B * window_square(T, W);
    double sum = 0;
    for (int b = 0; b < B; b++) {
        const int32_t *row = doc_start + (size_t)b * T;
        int start = 0;
        for (int t = 1; t <= T; t++)
            if (t == T || row[t] == t) {
                sum += window_square(t - start, W);
                start = t;
            }
    }
    return sum;
}

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
    /* per attention layer: forward 2 products of 2·H·D FLOPs per visible (query, key) pair, n²/2
     * pairs a document; backward 2.5x: 3.5 · 4 · H · D · n² / 2 = 7 · H · D · n². A Gated
     * DeltaNet layer's recurrence is linear in n: its forward and backward, 3.5x the forward */
    double attn = 0; /* gpt-oss's sliding layers see only their window's pairs */
    for (int l = 0; l < c->L; l++)
        if (mt_config_layer_mixer(c, l) == MT_MIXER_ATTENTION)
            attn += 7.0 * c->H * (double)mt_config_layer_head_dim(c, l) *
                    doc_square_sum_window(doc_start, B, T, mt_config_layer_window(c, l));
    return attn + 3.5 * mt_config_mixer_layers(c, MT_MIXER_GATED_DELTANET) *
                      mt_flops_deltanet_core_forward(c, (double)B * T);
}

double mt_flops_deltanet_core_forward(const mt_config *c, double tokens) {
    /* per token and value head, chunk size n = 64 (the chunked form): k·k^T and q·k^T inside the
     * chunk (2 · 2n·Dk), the triangular solve applied to v and the decayed k (n·(Dv + Dk)), the
     * masked attention times the corrected values (2n·Dv), and three products with the Dk x Dv
     * state: the decayed keys' read, the queries' read, the state update (3 · 2·Dk·Dv) */
    const double n = 64;
    double Dk = c->lin_Dk, Dv = c->lin_Dv;
    return tokens * c->lin_Hv * (4 * n * Dk + n * (Dv + Dk) + 2 * n * Dv + 6 * Dk * Dv);
}

double mt_flops_layer_mlp(const mt_config *c, int l, double tokens) {
    double C = c->C, shared = c->shared_expert ? 3.0 * C * c->F + C : 0;
    if (c->moe_beside_dense) shared = 3.0 * C * c->F; /* gemma4: the dense MLP beside the experts */
    if (mt_config_layer_is_moe(c, l))
        return tokens * 2.0 * (C * c->n_experts + (double)c->top_k * 3.0 * C * c->moe_F + shared);
    return tokens * 2.0 * 3.0 * C * c->F;
}

double mt_flops_layer_projections(const mt_config *c, int l, double tokens, int with_mlp) {
    double mlp = with_mlp ? mt_flops_layer_mlp(c, l, tokens) : 0, C = c->C;
    if (mt_config_layer_mixer(c, l) == MT_MIXER_GATED_DELTANET) {
        double Hv = c->lin_Hv, VD = Hv * c->lin_Dv, Ch = 2.0 * c->lin_Hk * c->lin_Dk + VD;
        return tokens * 2.0 * (C * (Ch + VD + 2 * Hv) + VD * C) + mlp; /* qkv, z, b, a in; out */
    }
    double D = mt_config_layer_head_dim(c, l), HD = (double)c->H * D, q = c->attn_gate ? 2 : 1;
    double GD = (double)mt_config_layer_kv_heads(c, l) * D, kv = mt_config_layer_k_eq_v(c, l) ? 1 : 2;
    return tokens * 2.0 * ((q + 1) * C * HD + kv * C * GD) + mlp; /* gemma4: the full layers' own */
}

double mt_flops_layer_attention_forward(const mt_config *c, int l, double tokens, int T) {
    if (mt_config_layer_mixer(c, l) == MT_MIXER_GATED_DELTANET) return mt_flops_deltanet_core_forward(c, tokens);
    double keys = T > 0 ? window_square(T, mt_config_layer_window(c, l)) / (2.0 * T) : 0; /* a query's mean */
    return tokens * 4.0 * keys * c->H * mt_config_layer_head_dim(c, l);
}

double mt_flops_head_forward(const mt_config *c, double tokens) { return tokens * 2.0 * c->C * c->V; }

static double executed(const mt_config *c, double tokens, int T, int saved_layers, int saved_attention,
                       double backward) {
    double sum = 0;
    int first_saved = c->L - saved_layers, first_att = first_saved - saved_attention;
    for (int l = 0; l < c->L; l++) {
        double attn = mt_flops_layer_attention_forward(c, l, tokens, T);
        double layer = mt_flops_layer_projections(c, l, tokens, 1);
        sum += layer * (1 + backward) + attn * 3.5; /* forward, backward */
        if (l < first_att) sum += layer + attn;  /* the recompute of a checkpointed layer */
        else if (l < first_saved) sum += layer;  /* saved attention: all but the attention */
    }
    return sum + mt_flops_head_forward(c, tokens) * (1 + backward);
}

double mt_flops_executed(const mt_config *c, double tokens, int T, int saved_layers, int saved_attention) {
    return executed(c, tokens, T, saved_layers, saved_attention, 2);
}

double mt_flops_executed_frozen(const mt_config *c, double tokens, int T, int saved_layers,
                                int saved_attention) {
    return executed(c, tokens, T, saved_layers, saved_attention, 1);
}

double mt_flops_remade(const mt_config *c, double tokens, int T, int every) {
    double sum = 0;
    for (int l = 1; every == 2 && l < c->L; l += 2)
        sum += mt_flops_layer_projections(c, l - 1, tokens, 1) + mt_flops_layer_attention_forward(c, l - 1, tokens, T);
    return sum;
}
