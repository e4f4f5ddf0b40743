/* The fp32 CPU reference ops.
 *
 * Each function mirrors the op of the same name in backend.h argument for argument, minus the
 * backend pointer, with every tensor typed as float (the CUDA launcher takes the same arguments
 * plus a stream). The semantics, shapes and (=) versus (+=) rules are those of backend.h.
 * Matmuls go through cblas_sgemm; loops are OpenMP. Letters as in config.h.
 *
 * Row sums: the norms' sums of squares and their backward dot products accumulate in double. In
 * fp32 their result hung on whether the compiler vectorised the sum: the same source built with and
 * without sanitizers put qwen3_5_moe_noaux's layer-0 in_proj_qkv gradient at 1.5e-4 and 3.9e-5 from
 * an fp64 reference (the chunked delta rule amplifies a norm's rounding); the reference pays.
 * The total is rounded to fp32 before the rest of the fp32 arithmetic, so a sum past FLT_MAX is
 * inf as in fp32 (a norm of overflowing activations gives 0 and its backward NaN, as torch's).
 */
#ifndef MT_CPU_OPS_H
#define MT_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "../backend.h" /* mt_gated_delta_span */

/* Rows of the fused LM head handled per chunk (the (chunk, V) logits are the only scratch). */
#define MT_CPU_LM_HEAD_CHUNK 256
/* Query rows per attention tile (the scratch is two (tile, T) blocks per thread). */
#define MT_CPU_ATTN_TILE 64

void mt_cpu_embedding_forward(float *out, const int32_t *ids, const float *table, int N, int C);
void mt_cpu_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int N, int C);

void mt_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int R,
                            int C, float eps, float w_offset);
void mt_cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int R, int C, int accumulate,
                             float w_offset);

void mt_cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                           int R, int K, int M);
/* out (R, M) += inp (R, K) @ weight (M, K)^T. */
void mt_cpu_matmul_forward_add(float *out, const float *inp, const float *weight, int R, int K,
                               int M);
void mt_cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int R, int K, int M,
                            int accumulate);

void mt_cpu_rope_forward(float *x, const int32_t *pos, const float *inv_freq, int N, int nh, int D,
                         int rd);
void mt_cpu_rope_backward(float *dx, const int32_t *pos, const float *inv_freq, int N, int nh,
                          int D, int rd);

/* The options (backend.h's mt_attention_opts) as arguments: scale (0: 1/sqrt(D)), window (0:
 * none), sinks (H) or NULL, dsinks (H, +=) or NULL. */
void mt_cpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                              const float *v, const int32_t *doc_start, int B, int T, int H, int G,
                              int D, float scale, int window, const float *sinks);
void mt_cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                               const float *lse, const float *q, const float *k, const float *v,
                               const int32_t *doc_start, int B, int T, int H, int G, int D,
                               float scale, int window, const float *sinks, float *dsinks);

/* gpt-oss's clamped SwiGLU (backend.h swiglu_clamped_*). */
void mt_cpu_swiglu_clamped_forward(float *out, const float *gate_up, int R, int F, float alpha,
                                   float limit);
void mt_cpu_swiglu_clamped_backward(float *dgate_up, const float *dout, const float *gate_up, int R,
                                    int F, float alpha, float limit);
/* gpt-oss's [E, in, out] experts with biases (backend.h moe_matmul_io_*). */
void mt_cpu_moe_matmul_io_forward(float *out, const float *inp, const float *weight,
                                  const float *bias, const int32_t *offsets, int E, int K, int M);
void mt_cpu_moe_matmul_io_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                   const float *inp, const float *weight, const int32_t *offsets,
                                   int E, int K, int M, int accumulate);

void mt_cpu_sigmoid_gate_forward(float *out, const float *x, const float *g, int R, int C, int Cg);
void mt_cpu_sigmoid_gate_backward(float *dx, float *dg, const float *dout, const float *x,
                                  const float *g, int R, int C, int Cg);
void mt_cpu_cols_split(float *a, float *b, const float *in, int R, int wa, int wb);
void mt_cpu_cols_join(float *out, const float *a, const float *b, int R, int wa, int wb);
/* The Gated DeltaNet's ops (causal_conv1d.c, l2norm.c, gdn_gates.c, gated_delta.c,
 * gated_delta_backward.c, gated_rmsnorm.c); scale multiplies q inside the delta rule. */
void mt_cpu_causal_conv1d_forward(float *out, const float *inp, const float *weight,
                                  const int32_t *doc_start, int B, int T, int C, int K, int t0);
void mt_cpu_causal_conv1d_backward(float *dinp, float *dweight, const float *dout,
                                   const float *inp, const float *weight, const int32_t *doc_start,
                                   int B, int T, int C, int K, int t0);
void mt_cpu_l2norm_forward(float *out, float *rinv, const float *inp, int R, int D, float eps);
void mt_cpu_l2norm_backward(float *dinp, const float *dout, const float *inp, const float *rinv,
                            int R, int D);
void mt_cpu_gdn_gates_forward(float *g, float *beta, const float *a, const float *b,
                              const float *A_log, const float *dt_bias, int N, int H);
void mt_cpu_gdn_gates_backward(float *da, float *db, float *dA_log, float *ddt_bias,
                               const float *dg, const float *dbeta, const float *a, const float *b,
                               const float *A_log, const float *dt_bias, int N, int H);
void mt_cpu_gated_delta_forward(float *out, float *chunk_states, const float *q, const float *k,
                                const float *v, const float *g, const float *beta,
                                const int32_t *doc_start, int B, int T, int Hk, int Hv, int Dk,
                                int Dv, float scale, const mt_gated_delta_span *span);
void mt_cpu_gated_delta_backward(float *dq, float *dk, float *dv, float *dg, float *dbeta,
                                 const float *dout, const float *chunk_states, const float *q,
                                 const float *k, const float *v, const float *g, const float *beta,
                                 const int32_t *doc_start, int B, int T, int Hk, int Hv, int Dk,
                                 int Dv, float scale, const mt_gated_delta_span *span);
void mt_cpu_gated_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *gate,
                                  const float *weight, int R, int C, float eps);
void mt_cpu_gated_rmsnorm_backward(float *dinp, float *dgate, float *dweight, const float *dout,
                                   const float *inp, const float *gate, const float *weight,
                                   const float *rstd, int R, int C);

void mt_cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
/* GeGLU (backend.h geglu_*; geglu.c). */
void mt_cpu_geglu_forward(float *out, const float *gate, const float *up, size_t n);
void mt_cpu_geglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                           const float *up, size_t n);
/* backend.h zero_rows_of_id (embedding.c). */
void mt_cpu_zero_rows_of_id(float *x, const int32_t *ids, int32_t id, int N, int C);
void mt_cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t n);
void mt_cpu_add(float *out, const float *a, const float *b, size_t n);
void mt_cpu_scale(float *x, float s, size_t n);
/* Gemma 4's (softcap.c): backend.h softcap and scale_by. */
void mt_cpu_softcap(float *x, float cap, size_t n);
void mt_cpu_scale_by(float *out, const float *x, const float *s, size_t n);

/* out[0] += sum of x[i]^2 (accumulated in double); dst = src (the compute dtype is fp32). */
void mt_cpu_sumsq(float *out, const float *x, size_t n);
void mt_cpu_from_f32(float *dst, const float *src, size_t n);
/* dst = src widened to fp32 (exact). */
void mt_cpu_from_bf16(float *dst, const uint16_t *src, size_t n);

/* Mixture-of-experts routing (moe.c); the arguments of backend.h's moe_* ops. */
void mt_cpu_moe_route(float *probs, int32_t *top_idx, float *top_w, int32_t *counts,
                      float *prob_sum, const float *logits, int n, int E, int k, int renorm);
void mt_cpu_moe_group(int32_t *perm, int32_t *inv, int32_t *offsets, const int32_t *top_idx, int n,
                      int E, int k);
void mt_cpu_moe_gather(float *xg, const float *x, const int32_t *perm, int n, int C, int k);
void mt_cpu_moe_gather_backward(float *dx, const float *dxg, const int32_t *inv, int n, int C,
                                int k, int accumulate);
void mt_cpu_moe_combine(float *out, const float *y, const float *top_w, const int32_t *inv, int n,
                        int C, int k);
void mt_cpu_moe_combine_backward(float *dy, float *d_w, const float *dout, const float *y,
                                 const float *top_w, const int32_t *inv, int n, int C, int k);
void mt_cpu_moe_route_backward(float *d_logits, const float *d_w, const float *probs,
                               const int32_t *top_idx, const float *top_w, const float *aux_grad,
                               int n, int E, int k, int renorm);
/* Gemma 4's per-expert gate scale (moe_scale.c; backend.h moe_expert_scale_*). */
void mt_cpu_moe_expert_scale_forward(float *w_out, const float *w, const int32_t *idx,
                                     const float *scale, int n, int k);
void mt_cpu_moe_expert_scale_backward(float *d_w, float *d_scale, const float *d_out, const float *w,
                                      const int32_t *idx, const float *scale, int n, int k);

/* dinp == NULL: losses only. dweight may be NULL with dinp set (a frozen head). */
/* Rows per chunk of mt_cpu_lm_head_loss over N rows (its logits under 256 MB, at most 256 rows). */
int mt_cpu_lm_head_chunk_rows(int N, int V);
void mt_cpu_lm_head_loss(float *losses, float *dinp, float *dweight, const float *inp,
                         const float *weight, const int32_t *targets, int N, int C, int V,
                         float loss_scale);
/* The same with an explicit chunk of rows (tests use small chunks to cover the chunk seams). */
void mt_cpu_lm_head_loss_chunked(float *losses, float *dinp, float *dweight, const float *inp,
                                 const float *weight, const int32_t *targets, int N, int C, int V,
                                 float loss_scale, int chunk);
/* backend.h lm_head_loss_softcap (cap > 0; 0 is the plain op), and with an explicit chunk. */
void mt_cpu_lm_head_loss_softcap(float *losses, float *dinp, float *dweight, const float *inp,
                                 const float *weight, const int32_t *targets, int N, int C, int V,
                                 float loss_scale, float cap);
void mt_cpu_lm_head_loss_softcap_chunked(float *losses, float *dinp, float *dweight,
                                         const float *inp, const float *weight,
                                         const int32_t *targets, int N, int C, int V,
                                         float loss_scale, float cap, int chunk);

#endif
