/* The CPU backend: host memory is the compute side, ops are the fp32 mt_cpu_* functions.
 * Every op entry is a thin thunk that only casts the void tensors to float. The copy streams and
 * events come from streams.c (worker threads), whose state is be->ctx. */
#include <stdlib.h>
#include <string.h>

#include "../../core/error.h"
#include "../../quant/fp8.h"
#include "../../quant/mxfp4.h"
#include "../../quant/nf4.h"
#include "../backend.h"
#include "cpu_ops.h"
#include "streams.h"

static void *cpu_alloc(mt_backend *be, size_t bytes) { return mt_aligned_alloc(bytes); }
static void cpu_free(mt_backend *be, void *p) { free(p); }
static void cpu_zero(mt_backend *be, void *p, size_t bytes) {
    if (bytes) memset(p, 0, bytes);
}
static void cpu_copy(mt_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
}
static void cpu_destroy(mt_backend *be) {
    mt_cpu_streams_destroy(be->ctx);
    free(be);
}

static void cpu_embedding_forward(mt_backend *be, void *out, const int32_t *ids, const void *table,
                                  int N, int C) {
    mt_cpu_embedding_forward(out, ids, table, N, C);
}
static void cpu_embedding_backward(mt_backend *be, float *dtable, const void *dout,
                                   const int32_t *ids, int N, int C) {
    mt_cpu_embedding_backward(dtable, dout, ids, N, C);
}
static void cpu_rmsnorm_forward(mt_backend *be, void *out, float *rstd, const void *inp,
                                const void *weight, int R, int C, float eps, float w_offset) {
    mt_cpu_rmsnorm_forward(out, rstd, inp, weight, R, C, eps, w_offset);
}
static void cpu_rmsnorm_backward(mt_backend *be, void *dinp, float *dweight, const void *dout,
                                 const void *inp, const void *weight, const float *rstd, int R,
                                 int C, int accumulate, float w_offset) {
    mt_cpu_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, R, C, accumulate, w_offset);
}
static void cpu_matmul_forward(mt_backend *be, void *out, const void *inp, const void *weight,
                               const void *bias, int R, int K, int M) {
    mt_cpu_matmul_forward(out, inp, weight, bias, R, K, M);
}
static void cpu_matmul_forward_add(mt_backend *be, void *out, const void *inp, const void *weight,
                                   int R, int K, int M) {
    mt_cpu_matmul_forward_add(out, inp, weight, R, K, M);
}
static void cpu_scale(mt_backend *be, void *x, float s, size_t n) { mt_cpu_scale(x, s, n); }
static void cpu_scale_by(mt_backend *be, void *out, const void *x, const void *s, size_t n) {
    mt_cpu_scale_by(out, x, s, n);
}
static void cpu_softcap(mt_backend *be, void *x, float cap, size_t n) { mt_cpu_softcap(x, cap, n); }
static void cpu_matmul_backward(mt_backend *be, void *dinp, float *dweight, float *dbias,
                                const void *dout, const void *inp, const void *weight, int R,
                                int K, int M, int accumulate) {
    mt_cpu_matmul_backward(dinp, dweight, dbias, dout, inp, weight, R, K, M, accumulate);
}
static void cpu_rope_forward(mt_backend *be, void *x, const int32_t *pos, const float *inv_freq,
                             int N, int nh, int D, int rd) {
    mt_cpu_rope_forward(x, pos, inv_freq, N, nh, D, rd);
}
static void cpu_rope_backward(mt_backend *be, void *dx, const int32_t *pos, const float *inv_freq,
                              int N, int nh, int D, int rd) {
    mt_cpu_rope_backward(dx, pos, inv_freq, N, nh, D, rd);
}
static const mt_attention_opts no_opts = {0};
static void cpu_attention_forward(mt_backend *be, void *out, float *lse, const void *q,
                                  const void *k, const void *v, const int32_t *doc_start, int B,
                                  int T, int H, int G, int D, const mt_attention_opts *opts) {
    const mt_attention_opts *o = opts ? opts : &no_opts;
    mt_cpu_attention_forward(out, lse, q, k, v, doc_start, B, T, H, G, D, o->scale, o->window,
                             o->sinks);
}
static void cpu_attention_backward(mt_backend *be, void *dq, void *dk, void *dv, const void *dout,
                                   const void *out, const float *lse, const void *q, const void *k,
                                   const void *v, const int32_t *doc_start, int B, int T, int H,
                                   int G, int D, const mt_attention_opts *opts) {
    const mt_attention_opts *o = opts ? opts : &no_opts;
    mt_cpu_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, doc_start, B, T, H, G, D,
                              o->scale, o->window, o->sinks, o->dsinks);
}
static void cpu_swiglu_clamped_forward(mt_backend *be, void *out, const void *gate_up, int R, int F,
                                       float alpha, float limit) {
    mt_cpu_swiglu_clamped_forward(out, gate_up, R, F, alpha, limit);
}
static void cpu_swiglu_clamped_backward(mt_backend *be, void *dgate_up, const void *dout,
                                        const void *gate_up, int R, int F, float alpha, float limit) {
    mt_cpu_swiglu_clamped_backward(dgate_up, dout, gate_up, R, F, alpha, limit);
}
static void cpu_moe_matmul_io_forward(mt_backend *be, void *out, const void *inp, const void *weight,
                                      const void *bias, const int32_t *offsets,
                                      const int32_t *offsets_host, int E, int K, int M) {
    mt_cpu_moe_matmul_io_forward(out, inp, weight, bias, offsets_host, E, K, M);
}
static void cpu_moe_matmul_io_backward(mt_backend *be, void *dinp, float *dweight, float *dbias,
                                       const void *dout, const void *inp, const void *weight,
                                       const int32_t *offsets, const int32_t *offsets_host, int E,
                                       int K, int M, int accumulate) {
    mt_cpu_moe_matmul_io_backward(dinp, dweight, dbias, dout, inp, weight, offsets_host, E, K, M,
                                  accumulate);
}
static void cpu_sigmoid_gate_forward(mt_backend *be, void *out, const void *x, const void *g,
                                     int R, int C, int Cg) {
    mt_cpu_sigmoid_gate_forward(out, x, g, R, C, Cg);
}
static void cpu_sigmoid_gate_backward(mt_backend *be, void *dx, void *dg, const void *dout,
                                      const void *x, const void *g, int R, int C, int Cg) {
    mt_cpu_sigmoid_gate_backward(dx, dg, dout, x, g, R, C, Cg);
}
static void cpu_cols_split(mt_backend *be, void *a, void *b, const void *in, int R, int wa, int wb) {
    mt_cpu_cols_split(a, b, in, R, wa, wb);
}
static void cpu_cols_join(mt_backend *be, void *out, const void *a, const void *b, int R, int wa,
                          int wb) {
    mt_cpu_cols_join(out, a, b, R, wa, wb);
}
static void cpu_causal_conv1d_forward(mt_backend *be, void *out, const void *inp,
                                      const void *weight, const int32_t *doc_start, int B, int T,
                                      int C, int K, int t0) {
    mt_cpu_causal_conv1d_forward(out, inp, weight, doc_start, B, T, C, K, t0);
}
static void cpu_causal_conv1d_backward(mt_backend *be, void *dinp, float *dweight,
                                       const void *dout, const void *inp, const void *weight,
                                       const int32_t *doc_start, int B, int T, int C, int K,
                                       int t0) {
    mt_cpu_causal_conv1d_backward(dinp, dweight, dout, inp, weight, doc_start, B, T, C, K, t0);
}
static void cpu_l2norm_forward(mt_backend *be, void *out, float *rinv, const void *inp, int R,
                               int D, float eps) {
    mt_cpu_l2norm_forward(out, rinv, inp, R, D, eps);
}
static void cpu_l2norm_backward(mt_backend *be, void *dinp, const void *dout, const void *inp,
                                const float *rinv, int R, int D) {
    mt_cpu_l2norm_backward(dinp, dout, inp, rinv, R, D);
}
static void cpu_gdn_gates_forward(mt_backend *be, float *g, float *beta, const void *a,
                                  const void *b, const void *A_log, const void *dt_bias, int N,
                                  int Hv) {
    mt_cpu_gdn_gates_forward(g, beta, a, b, A_log, dt_bias, N, Hv);
}
static void cpu_gdn_gates_backward(mt_backend *be, void *da, void *db, float *dA_log,
                                   float *ddt_bias, const float *dg, const float *dbeta,
                                   const void *a, const void *b, const void *A_log,
                                   const void *dt_bias, int N, int Hv) {
    mt_cpu_gdn_gates_backward(da, db, dA_log, ddt_bias, dg, dbeta, a, b, A_log, dt_bias, N, Hv);
}
static void cpu_gated_delta_forward(mt_backend *be, void *out, float *chunk_states, const void *q,
                                    const void *k, const void *v, const float *g,
                                    const float *beta, const int32_t *doc_start, int B, int T,
                                    int Hk, int Hv, int Dk, int Dv, float scale,
                                    const mt_gated_delta_span *span) {
    mt_cpu_gated_delta_forward(out, chunk_states, q, k, v, g, beta, doc_start, B, T, Hk, Hv, Dk, Dv,
                               scale, span);
}
static void cpu_gated_delta_backward(mt_backend *be, void *dq, void *dk, void *dv, float *dg,
                                     float *dbeta, const void *dout, const float *chunk_states,
                                     const void *q, const void *k, const void *v, const float *g,
                                     const float *beta, const int32_t *doc_start, int B, int T,
                                     int Hk, int Hv, int Dk, int Dv, float scale,
                                     const mt_gated_delta_span *span) {
    mt_cpu_gated_delta_backward(dq, dk, dv, dg, dbeta, dout, chunk_states, q, k, v, g, beta,
                                doc_start, B, T, Hk, Hv, Dk, Dv, scale, span);
}
static void cpu_gated_rmsnorm_forward(mt_backend *be, void *out, float *rstd, const void *inp,
                                      const void *gate, const void *weight, int R, int C,
                                      float eps) {
    mt_cpu_gated_rmsnorm_forward(out, rstd, inp, gate, weight, R, C, eps);
}
static void cpu_gated_rmsnorm_backward(mt_backend *be, void *dinp, void *dgate, float *dweight,
                                       const void *dout, const void *inp, const void *gate,
                                       const void *weight, const float *rstd, int R, int C) {
    mt_cpu_gated_rmsnorm_backward(dinp, dgate, dweight, dout, inp, gate, weight, rstd, R, C);
}
static void cpu_swiglu_forward(mt_backend *be, void *out, const void *gate, const void *up,
                               size_t n) {
    mt_cpu_swiglu_forward(out, gate, up, n);
}
static void cpu_swiglu_backward(mt_backend *be, void *dgate, void *dup, const void *dout,
                                const void *gate, const void *up, size_t n) {
    mt_cpu_swiglu_backward(dgate, dup, dout, gate, up, n);
}
static void cpu_geglu_forward(mt_backend *be, void *out, const void *gate, const void *up,
                              size_t n) {
    mt_cpu_geglu_forward(out, gate, up, n);
}
static void cpu_geglu_backward(mt_backend *be, void *dgate, void *dup, const void *dout,
                               const void *gate, const void *up, size_t n) {
    mt_cpu_geglu_backward(dgate, dup, dout, gate, up, n);
}
static void cpu_zero_rows_of_id(mt_backend *be, void *x, const int32_t *ids, int32_t id, int N, int C) {
    mt_cpu_zero_rows_of_id(x, ids, id, N, C);
}
static void cpu_add(mt_backend *be, void *out, const void *a, const void *b, size_t n) {
    mt_cpu_add(out, a, b, n);
}
static void cpu_sumsq(mt_backend *be, float *out, const float *x, size_t n) {
    mt_cpu_sumsq(out, x, n);
}
static void cpu_from_f32(mt_backend *be, void *dst, const float *src, size_t n) {
    mt_cpu_from_f32(dst, src, n);
}
static void cpu_from_bf16(mt_backend *be, void *dst, const mt_bf16 *src, size_t n) {
    mt_cpu_from_bf16(dst, src, n);
}
static void cpu_dequant_nf4(mt_backend *be, void *dst, const uint8_t *codes, const float *absmax,
                            size_t n) {
    mt_nf4_dequantize(codes, absmax, (int64_t)n, dst);
}
static void cpu_dequant_fp8(mt_backend *be, void *dst, const uint8_t *q, const float *scales,
                            size_t n) {
    mt_fp8_dequantize(q, scales, (int64_t)n, dst);
}
static void cpu_dequant_mxfp4(mt_backend *be, void *dst, const uint8_t *blocks, const uint8_t *scales,
                              int64_t mats, int64_t rows, int64_t cols) {
    /* bad sizes are the caller's bug (the op has no error return) */
    MT_CHECK(mt_mxfp4_dequantize_transposed(blocks, scales, mats, rows, cols, dst) == MT_OK, "dequant_mxfp4: %s",
             mt_error_message());
}
/* The arenas are host memory here: the state's own update. A bad range or dtype is the caller's
 * bug (the op has no error return). */
static void cpu_optim_update(mt_backend *be, const mt_optim_arenas *s, const mt_optim_step *a,
                             size_t offset, size_t n, const void *grad, mt_dtype grad_dtype) {
    if (mt_optim_arenas_update(s, a, offset, n, grad, grad_dtype, 0) != MT_OK)
        mt_fatal(__FILE__, __LINE__, "%s", mt_error_message());
}
static void cpu_lm_head_loss(mt_backend *be, float *losses, void *dinp, float *dweight,
                             const void *inp, const void *weight, const int32_t *targets, int N,
                             int C, int V, float loss_scale) {
    mt_cpu_lm_head_loss(losses, dinp, dweight, inp, weight, targets, N, C, V, loss_scale);
}
static void cpu_lm_head_loss_softcap(mt_backend *be, float *losses, void *dinp, float *dweight,
                                     const void *inp, const void *weight, const int32_t *targets,
                                     int N, int C, int V, float loss_scale, float cap) {
    mt_cpu_lm_head_loss_softcap(losses, dinp, dweight, inp, weight, targets, N, C, V, loss_scale, cap);
}

static void cpu_moe_route(mt_backend *be, float *probs, int32_t *top_idx, float *top_w,
                          int32_t *counts, float *prob_sum, const void *logits, int n, int E, int k,
                          int renorm) {
    mt_cpu_moe_route(probs, top_idx, top_w, counts, prob_sum, logits, n, E, k, renorm);
}
static void cpu_moe_group(mt_backend *be, int32_t *perm, int32_t *inv, int32_t *offsets,
                          const int32_t *top_idx, int n, int E, int k) {
    mt_cpu_moe_group(perm, inv, offsets, top_idx, n, E, k);
}
static void cpu_moe_gather(mt_backend *be, void *xg, const void *x, const int32_t *perm, int n,
                           int C, int k) {
    mt_cpu_moe_gather(xg, x, perm, n, C, k);
}
static void cpu_moe_gather_backward(mt_backend *be, void *dx, const void *dxg, const int32_t *inv,
                                    int n, int C, int k, int accumulate) {
    mt_cpu_moe_gather_backward(dx, dxg, inv, n, C, k, accumulate);
}
static void cpu_moe_combine(mt_backend *be, void *out, const void *y, const float *top_w,
                            const int32_t *inv, int n, int C, int k) {
    mt_cpu_moe_combine(out, y, top_w, inv, n, C, k);
}
static void cpu_moe_combine_backward(mt_backend *be, void *dy, float *d_w, const void *dout,
                                     const void *y, const float *top_w, const int32_t *inv, int n,
                                     int C, int k) {
    mt_cpu_moe_combine_backward(dy, d_w, dout, y, top_w, inv, n, C, k);
}
static void cpu_moe_route_backward(mt_backend *be, void *d_logits, const float *d_w,
                                   const float *probs, const int32_t *top_idx, const float *top_w,
                                   const float *aux_grad, int n, int E, int k, int renorm) {
    mt_cpu_moe_route_backward(d_logits, d_w, probs, top_idx, top_w, aux_grad, n, E, k, renorm);
}

static void cpu_moe_expert_scale_forward(mt_backend *be, float *w_out, const float *w,
                                         const int32_t *top_idx, const void *scale, int n, int k) {
    mt_cpu_moe_expert_scale_forward(w_out, w, top_idx, scale, n, k);
}
static void cpu_moe_expert_scale_backward(mt_backend *be, float *d_w, float *d_scale,
                                          const float *d_out, const float *w, const int32_t *top_idx,
                                          const void *scale, int n, int k) {
    mt_cpu_moe_expert_scale_backward(d_w, d_scale, d_out, w, top_idx, scale, n, k);
}

mt_backend *mt_backend_cpu_create(void) {
    mt_backend *be = mt_calloc(1, sizeof *be);
    be->name = "cpu";
    be->dtype = MT_F32;
    /* the compute side is host RAM, allocated as the engine asks; the LM head's per-call logits
     * chunk (at most 256 MiB, lm_head_loss.c) is left uncounted */
    be->memory = (mt_backend_memory){.scratch = 0, .headroom = 0, .host_ram = 1,
                                     .head_chunk_rows = mt_cpu_lm_head_chunk_rows};
    be->ctx = mt_cpu_streams_create();
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->zero = cpu_zero;
    be->upload = cpu_copy;
    be->download = cpu_copy;
    be->destroy = cpu_destroy;
    be->embedding_forward = cpu_embedding_forward;
    be->embedding_backward = cpu_embedding_backward;
    be->rmsnorm_forward = cpu_rmsnorm_forward;
    be->rmsnorm_backward = cpu_rmsnorm_backward;
    be->matmul_forward = cpu_matmul_forward;
    be->matmul_backward = cpu_matmul_backward;
    be->matmul_forward_add = cpu_matmul_forward_add;
    be->rope_forward = cpu_rope_forward;
    be->rope_backward = cpu_rope_backward;
    be->attention_forward = cpu_attention_forward;
    be->attention_backward = cpu_attention_backward;
    be->sigmoid_gate_forward = cpu_sigmoid_gate_forward;
    be->sigmoid_gate_backward = cpu_sigmoid_gate_backward;
    be->cols_split = cpu_cols_split;
    be->cols_join = cpu_cols_join;
    be->causal_conv1d_forward = cpu_causal_conv1d_forward;
    be->causal_conv1d_backward = cpu_causal_conv1d_backward;
    be->l2norm_forward = cpu_l2norm_forward;
    be->l2norm_backward = cpu_l2norm_backward;
    be->gdn_gates_forward = cpu_gdn_gates_forward;
    be->gdn_gates_backward = cpu_gdn_gates_backward;
    be->gated_delta_forward = cpu_gated_delta_forward;
    be->gated_delta_backward = cpu_gated_delta_backward;
    be->gated_rmsnorm_forward = cpu_gated_rmsnorm_forward;
    be->gated_rmsnorm_backward = cpu_gated_rmsnorm_backward;
    be->swiglu_forward = cpu_swiglu_forward;
    be->swiglu_backward = cpu_swiglu_backward;
    be->geglu_forward = cpu_geglu_forward;
    be->geglu_backward = cpu_geglu_backward;
    be->zero_rows_of_id = cpu_zero_rows_of_id;
    be->add = cpu_add;
    be->scale = cpu_scale;
    be->scale_by = cpu_scale_by;
    be->softcap = cpu_softcap;
    be->sumsq = cpu_sumsq;
    be->from_f32 = cpu_from_f32;
    be->from_bf16 = cpu_from_bf16;
    be->dequant_nf4 = cpu_dequant_nf4;
    be->dequant_fp8 = cpu_dequant_fp8;
    be->dequant_mxfp4 = cpu_dequant_mxfp4;
    be->optim_update = cpu_optim_update;
    be->lm_head_loss = cpu_lm_head_loss;
    be->lm_head_loss_softcap = cpu_lm_head_loss_softcap;
    be->moe_route = cpu_moe_route;
    be->moe_group = cpu_moe_group;
    be->moe_gather = cpu_moe_gather;
    be->moe_gather_backward = cpu_moe_gather_backward;
    be->moe_combine = cpu_moe_combine;
    be->moe_combine_backward = cpu_moe_combine_backward;
    be->moe_route_backward = cpu_moe_route_backward;
    be->moe_expert_scale_forward = cpu_moe_expert_scale_forward;
    be->moe_expert_scale_backward = cpu_moe_expert_scale_backward;
    be->moe_matmul_forward = mt_backend_moe_matmul_loop_forward;
    be->moe_matmul_backward = mt_backend_moe_matmul_loop_backward;
    be->attention_options = 1;
    be->rmsnorm_unweighted = 1;
    be->moe_matmul_io_forward = cpu_moe_matmul_io_forward;
    be->moe_matmul_io_backward = cpu_moe_matmul_io_backward;
    be->swiglu_clamped_forward = cpu_swiglu_clamped_forward;
    be->swiglu_clamped_backward = cpu_swiglu_clamped_backward;
    mt_cpu_streams_install(be); /* host buffers, copy_async, events, sync */
    return be;
}
