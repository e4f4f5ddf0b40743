#include "engine/step_time.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/cpu_isa.h"
#include "core/error.h"
#include "engine/flops.h"
#include "optim/state.h"

int mt_step_time_known(const mt_backend_memory *m) {
    return !m->host_ram && m->flops_rate > 0 && m->h2d_rate > 0 && m->d2h_rate > 0 && m->duplex_rate > 0;
}

/* Bytes of one element of the weights the forward loads: full's upload copy is the compute
 * dtype, the 8-bit formats upload their bf16 master. */
static double upload_elem(mt_state_format f, mt_dtype dtype) {
    return f == MT_STATE_FULL ? (double)mt_dtype_size(dtype) : 2.0;
}

/* Tokens in one call of a layer's MLP or experts: the micro-batch, or the layer's chunk. */
static double call_tokens(const mt_engine_opts *eo, double N) {
    double n = (double)eo->micro_batch * eo->T;
    if (eo->mlp_chunk > 0 && eo->mlp_chunk < n) n = eo->mlp_chunk;
    return n < N ? n : N;
}

/* An MoE layer's GPU time beyond its matmul FLOPs at flops_rate, for one pass over N tokens in
 * calls of n (backward 0: a forward; 1: the backward): each expert GEMM call's fixed cost, the
 * grouped call's own rate for the data products where the backend groups them (few rows an
 * expert), and the routing kernels' bytes (gather and combine C, SwiGLU Fe, bf16: 4C + 6Fe bytes a
 * routed row). The backend's moe_* numbers; 0 for a dense layer. */
static double moe_pass_extra_s(const mt_config *c, int l, double N, double n, const mt_backend_memory *m,
                               int backward) {
    if (!mt_config_layer_is_moe(c, l)) return 0;
    double E = c->n_experts, k = c->top_k, C = c->C, Fe = c->moe_F, rows = n * k / E;
    double data = 2.0 * n * k * 3.0 * C * Fe; /* gate, up, down; the backward's dinp the same */
    double t;
    if (m->moe_grouped_below > 0 && rows < m->moe_grouped_below && m->moe_grouped_rate > 0)
        t = data * (1 / m->moe_grouped_rate - 1 / m->flops_rate) + 3 * m->moe_call_s;
    else
        t = 3 * E * m->moe_call_s;
    if (backward) t += 3 * E * m->moe_call_s; /* weight gradients: one GEMM an expert in both modes */
    if (m->moe_route_rate > 0) t += n * k * (4 * C + 6 * Fe) / m->moe_route_rate;
    return t * N / n;
}

/* A Gated DeltaNet layer's recurrence, forward, in seconds beyond its FLOPs at flops_rate: the
 * chunked rule runs at its own rate (delta_rule_rate), far below the GEMMs'. 0 for attention. */
static double delta_extra_s(const mt_config *c, int l, double N, const mt_backend_memory *m) {
    if (mt_config_layer_mixer(c, l) != MT_MIXER_GATED_DELTANET || !(m->delta_rule_rate > 0)) return 0;
    return mt_flops_deltanet_core_forward(c, N) * (1 / m->delta_rule_rate - 1 / m->flops_rate);
}

/* A tiled call's Gated DeltaNet layer remakes its spans' mixer forward in the backward, all but
 * the last span's (model/mixer_deltanet.c): about one more forward of the mixer (its projections
 * and the delta rule), in seconds. 0 untiled or for attention. */
static double span_remake_s(const mt_config *c, int l, const mt_engine_opts *eo, double N,
                            const mt_backend_memory *m) {
    double n = (double)eo->micro_batch * eo->T;
    int tiled = eo->mlp_chunk > 0 && eo->mlp_chunk < n;
    if (mt_config_layer_mixer(c, l) != MT_MIXER_GATED_DELTANET || !tiled) return 0;
    double rule = m->delta_rule_rate > 0 ? m->delta_rule_rate : m->flops_rate;
    return mt_flops_layer_projections(c, l, N, 0) / m->flops_rate +
           mt_flops_deltanet_core_forward(c, N) / rule;
}

/* Layer l's forward in seconds (projections, MLP or experts, attention or the delta rule; an MoE
 * layer's extra). */
static double layer_forward_s(const mt_config *c, int l, const mt_engine_opts *eo, double N,
                              const mt_backend_memory *m) {
    return (mt_flops_layer_projections(c, l, N, 1) + mt_flops_layer_attention_forward(c, l, N, eo->T)) /
               m->flops_rate +
           moe_pass_extra_s(c, l, N, call_tokens(eo, N), m, 0) + delta_extra_s(c, l, N, m);
}

/* The next forward after the backward (step_time.h), simulated layer by layer: when it ends with
 * the host at host_rate (instant 0) or with an instant host (instant 1), from the same start. */
static double forward_end(const mt_param_table *t, const mt_engine_opts *eo, double el,
                          const mt_backend_memory *m, double host_rate, double start, int instant) {
    const mt_config *c = &t->cfg;
    const double N = (double)eo->batch * eo->T;
    int L = c->L, k = eo->gpu_layers;
    double compute = start, h2d = start, host = (double)mt_group_size(t, MT_GROUP_EMBED) / host_rate;
    for (int l = 0; l < k; l++) compute += layer_forward_s(c, l, eo, N, m);
    for (int l = k; l <= L; l++) { /* the streamed layers, then the head */
        double n = (double)mt_group_size(t, l);
        host += n / host_rate;
        h2d = (instant || h2d > host ? h2d : host) + n * el / m->h2d_rate;
        double f = l < L ? layer_forward_s(c, l, eo, N, m) : mt_flops_head_forward(c, N) / m->flops_rate;
        compute = (compute > h2d ? compute : h2d) + f;
    }
    return compute;
}

int mt_step_time_waits(const mt_step_time *st) { return st->wait_s > MT_STEP_WAIT_SHARE * st->forward_s; }

double mt_step_time_total(const mt_step_time *st) {
    double est = st->compute_s + st->start_s + st->wait_s;
    return est > st->pcie_s ? est : st->pcie_s;
}

void mt_step_time_of(const mt_param_table *t, mt_dtype dtype, const mt_engine_opts *eo,
                     const mt_backend_memory *m, double host_rate, mt_step_time *st) {
    const mt_config *c = &t->cfg;
    const int L = c->L, k = eo->gpu_layers;
    const double N = (double)eo->batch * eo->T, el = upload_elem(eo->state, dtype),
                 grad_el = (double)mt_dtype_size(dtype), set = N * c->C * (double)mt_dtype_size(dtype);
    *st = (mt_step_time){0};
    st->streamed = mt_engine_streams_update(eo);
    if (st->streamed) {
        /* the update runs at the pace of its state's crossings, up and back at the duplex rate;
         * the next forward's weights follow each group's update up the same link (el a param),
         * so the uplink carries state + weights while the update runs: 30.5 Gparam of tight
         * (4.03 + 2 B up) took 3.9-4.0 s on the H100 host (session 17), 46.2 GB/s; the state alone
         * would have been 2.7 s */
        st->state_bytes = mt_optim_bytes_per_param(eo->state);
        host_rate = m->duplex_rate / (st->state_bytes + el);
    }
    st->flops = mt_flops_executed(c, N, eo->T, eo->saved_layers, eo->saved_attention);
    st->forward_s = mt_flops_head_forward(c, N) / m->flops_rate;
    for (int l = 0; l < L; l++) st->forward_s += layer_forward_s(c, l, eo, N, m);
    /* MoE layers: a forward, its recompute unless saved (mt_flops_executed's rule), the backward */
    const double call = call_tokens(eo, N);
    for (int l = 0; l < L; l++) {
        double f = moe_pass_extra_s(c, l, N, call, m, 0), recompute = l < L - eo->saved_layers;
        st->moe_s += f * (1 + recompute) + moe_pass_extra_s(c, l, N, call, m, 1);
    }
    /* DeltaNet layers: the recurrence's forward, its recompute unless saved, the backward (2.5x) */
    for (int l = 0; l < L; l++) st->delta_s += delta_extra_s(c, l, N, m) * (1 + (l < L - eo->saved_layers) + 2.5);
    /* sparse checkpoints: the layer before each odd one runs its forward again in the backward
     * (its time in remake_s; its FLOPs join the executed ones after) */
    for (int l = 1; eo->checkpoint_every == 2 && l < L; l += 2) st->remake_s += layer_forward_s(c, l - 1, eo, N, m);
    for (int l = 0; l < L; l++) st->span_s += span_remake_s(c, l, eo, N, m);
    st->compute_s = st->flops / m->flops_rate + st->moe_s + st->delta_s + st->remake_s + st->span_s;
    st->flops += mt_flops_remade(c, N, eo->T, eo->checkpoint_every);

    /* the host groups: embed, the streamed layers, head */
    double embed = (double)mt_group_size(t, MT_GROUP_EMBED), head = (double)mt_group_size(t, L), layers = 0;
    for (int l = k; l < L; l++) layers += (double)mt_group_size(t, l);
    st->host_params = embed + layers + head;
    st->host_s = st->host_params / host_rate;
    int passes = eo->resident ? 1 : 2;
    st->h2d_bytes = (passes * layers + embed + head) * el + (eo->offload > 1 ? eo->offload - 1 : 0) * set +
                    8.0 * N; /* ids and targets */
    st->d2h_bytes = st->host_params * (st->streamed ? st->state_bytes : grad_el) + eo->offload * set;
    if (st->streamed) st->h2d_bytes += st->host_params * st->state_bytes;
    double up = st->h2d_bytes / m->h2d_rate, down = st->d2h_bytes / m->d2h_rate,
           both = (st->h2d_bytes + st->d2h_bytes) / (2 * m->duplex_rate);
    st->pcie_s = up > down ? up : down;
    if (both > st->pcie_s) st->pcie_s = both;

    /* each mixer's first layer (hybrid models: their layers differ in size and cost) */
    for (int l = 0; l < L; l++) {
        int mx = (int)mt_config_layer_mixer(c, l);
        if (st->mixer_layers[mx]++) continue;
        for (int i = t->layer_first[l]; i < t->layer_first[l + 1]; i++) st->mixer_params[mx] += (double)t->params[i].numel;
        st->mixer_forward_s[mx] = layer_forward_s(c, l, eo, N, m);
    }

    /* the largest layer's numbers (MoE models may mix dense and expert layers) */
    for (int l = 0; l < L; l++) {
        double n = (double)mt_group_size(t, l);
        if (n * el <= st->layer_bytes) continue;
        st->layer_bytes = n * el;
        st->layer_forward_s = layer_forward_s(c, l, eo, N, m);
        st->layer_host_s = n / host_rate;
    }

    st->start_s = embed / host_rate + (k < L ? (double)mt_group_size(t, k) / host_rate : 0);
    st->wait_s = forward_end(t, eo, el, m, host_rate, st->start_s, 0) -
                 forward_end(t, eo, el, m, host_rate, st->start_s, 1);
    if (st->wait_s < 0) st->wait_s = 0;
    if (st->pcie_s > st->compute_s + st->start_s + st->wait_s) st->bound = MT_BOUND_PCIE;
    else if (mt_step_time_waits(st)) st->bound = MT_BOUND_HOST;
    else st->bound = MT_BOUND_COMPUTE;
}

static int compute_bound(const mt_param_table *t, mt_dtype dtype, const mt_engine_opts *eo, int B,
                         const mt_backend_memory *m, double host_rate) {
    mt_engine_opts o = *eo;
    o.batch = B;
    /* neither the FLOPs nor the bytes depend on the micro-batch; an MoE layer's calls do (kept) */
    mt_step_time st;
    mt_step_time_of(t, dtype, &o, m, host_rate, &st);
    return st.pcie_s <= st.compute_s && !mt_step_time_waits(&st);
}

int mt_step_time_compute_batch(const mt_param_table *t, mt_dtype dtype, const mt_engine_opts *eo,
                               const mt_backend_memory *m, double host_rate) {
    /* more rows add compute and forward time faster than bytes: the smallest by bisection */
    int lo = 1, hi = 1 << 20;
    if (!compute_bound(t, dtype, eo, hi, m, host_rate)) return 0;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (compute_bound(t, dtype, eo, mid, m, host_rate)) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

int mt_step_time_host_rate(mt_state_format f, double *rate, char *source, size_t n) {
    const char *env = getenv("MT_HOST_ADAMW");
    if (env && *env) {
        char *end;
        double g = strtod(env, &end);
        if (end == env || *end || !(g > 0) || g > 1e4)
            return mt_error_set("MT_HOST_ADAMW: '%s' is not a rate; give the host AdamW's Gparam/s, "
                                "e.g. MT_HOST_ADAMW=3.8", env);
        *rate = g * 1e9;
        snprintf(source, n, "MT_HOST_ADAMW");
        return MT_OK;
    }
    static const double avx512[3] = {4.5e9, 3.8e9, 3.4e9}; /* full, compact, tight: step_time.h */
    static const double isa_factor[3] = {0.45, 0.6, 1.0}; /* scalar, avx2, avx512 */
    mt_isa isa = mt_isa_active();
    *rate = avx512[f] * isa_factor[isa];
    snprintf(source, n, "%s on %s, measured in training on the H200 host%s", mt_state_format_name(f),
             mt_isa_name(isa), isa == MT_ISA_AVX512 ? "" : ", scaled from avx512");
    return MT_OK;
}
