/* The CUDA launchers. Each mirrors the CPU op of the same name (src/backend/cpu/cpu_ops.h) and the
 * backend.h entry argument for argument, with bf16 for the compute dtype, plus an explicit stream
 * (and the context where a library handle or scratch is needed). Launchers check shapes, own the
 * grid maths and check the launch; kernels are static in their .cu file. Letters as in config.h. */
#ifndef MT_CUDA_OPS_CUH
#define MT_CUDA_OPS_CUH

#include "cuda_common.cuh"

/* embedding.cu */
void mt_cuda_embedding_forward(bf16 *out, const int32_t *ids, const bf16 *table, int N, int C,
                               cudaStream_t s);
void mt_cuda_embedding_backward(float *dtable, const bf16 *dout, const int32_t *ids, int N, int C,
                                cudaStream_t s);
/* x (N, C): rows n with ids[n] == id set to zero (backend.h's zero_rows_of_id) */
void mt_cuda_zero_rows_of_id(bf16 *x, const int32_t *ids, int32_t id, int N, int C, cudaStream_t s);

/* rmsnorm.cu (weight NULL: the unweighted norm, backend.h's rmsnorm_unweighted) */
void mt_cuda_rmsnorm_forward(bf16 *out, float *rstd, const bf16 *inp, const bf16 *weight, int R,
                             int C, float eps, float w_offset, cudaStream_t s);
void mt_cuda_rmsnorm_backward(bf16 *dinp, float *dweight, const bf16 *dout, const bf16 *inp,
                              const bf16 *weight, const float *rstd, int R, int C, int accumulate,
                              float w_offset, cudaStream_t s);

/* matmul.cu (cuBLASLt, bf16 in, fp32 accumulate) */
void mt_cuda_matmul_forward(mt_cuda_ctx *ctx, bf16 *out, const bf16 *inp, const bf16 *weight,
                            const bf16 *bias, int R, int K, int M, cudaStream_t s);
/* out += inp @ weight^T (backend.h's matmul_forward_add): the forward's GEMM with beta 1 */
void mt_cuda_matmul_forward_add(mt_cuda_ctx *ctx, bf16 *out, const bf16 *inp, const bf16 *weight,
                                int R, int K, int M, cudaStream_t s);
void mt_cuda_matmul_backward(mt_cuda_ctx *ctx, bf16 *dinp, float *dweight, float *dbias,
                             const bf16 *dout, const bf16 *inp, const bf16 *weight, int R, int K,
                             int M, int accumulate, cudaStream_t s);

/* rope.cu */
void mt_cuda_rope_forward(bf16 *x, const int32_t *pos, const float *inv_freq, int N, int nh, int D,
                          int rd, cudaStream_t s);
void mt_cuda_rope_backward(bf16 *dx, const int32_t *pos, const float *inv_freq, int N, int nh,
                           int D, int rd, cudaStream_t s);

/* Row-major C (M, N) = op(A) op(B) + beta C through cuBLASLt (matmul.cu's plans): A (M, K), or
 * stored (K, M) when ta; B (K, N), or stored (N, K) when tb; lda, ldb, ldc row strides in
 * elements; bf16 A and B, C of dtype (CUDA_R_32F or CUDA_R_16BF), fp32 accumulation. */
void mt_cuda_gemm_rm(mt_cuda_ctx *ctx, int ta, int tb, int M, int N, int K, const bf16 *A, int lda,
                     const bf16 *B, int ldb, void *C, cudaDataType dtype, int ldc, float beta,
                     cudaStream_t s);

/* attention_gemm.cu: attention as GEMMs over blocks of queries, for D > 128 (D % 8 == 0) where
 * neither the flash kernels nor cuDNN run (the file says why and how); scale resolved (not 0),
 * window 0 or < T, sinks NULL or (H) bf16. delta (B, H, T): rowsum(dout * out), as attention.cu's
 * backward computes it; the sinks' gradient is attention.cu's (it needs only lse and delta). */
bool mt_cuda_attention_gemm_applies(const mt_cuda_ctx *ctx, int D);
/* attention.cu notes what each call ran (mt_cuda_attention_gemm_ran, attention_cudnn.h). */
void mt_cuda_attention_gemm_note(int backward, int ran);
void mt_cuda_attention_gemm_forward(mt_cuda_ctx *ctx, bf16 *out, float *lse, const bf16 *q,
                                    const bf16 *k, const bf16 *v, const int32_t *doc_start, int B,
                                    int T, int H, int G, int D, float scale, int window,
                                    const bf16 *sinks, cudaStream_t s);
void mt_cuda_attention_gemm_backward(mt_cuda_ctx *ctx, bf16 *dq, bf16 *dk, bf16 *dv,
                                     const bf16 *dout, const float *lse, const float *delta,
                                     const bf16 *q, const bf16 *k, const bf16 *v,
                                     const int32_t *doc_start, int B, int T, int H, int G, int D,
                                     float scale, int window, cudaStream_t s);

/* attention.cu (flash attention: never materializes T x T). opts as backend.h's (sinks bf16 on
 * the device, dsinks fp32 on the device), after the stream so that callers of the plain op (NULL,
 * the default) need not pass it. ctx NULL: no cuBLASLt, so heads other than 64 and 128 that cuDNN
 * does not take run the fp32 fallback kernels rather than attention_gemm.cu. */
void mt_cuda_attention_forward(mt_cuda_ctx *ctx, bf16 *out, float *lse, const bf16 *q,
                               const bf16 *k, const bf16 *v, const int32_t *doc_start, int B,
                               int T, int H, int G, int D, cudaStream_t s, const mt_attention_opts *opts = nullptr);
void mt_cuda_attention_backward(mt_cuda_ctx *ctx, bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout,
                                const bf16 *out, const float *lse, const bf16 *q, const bf16 *k,
                                const bf16 *v, const int32_t *doc_start, int B, int T, int H,
                                int G, int D, cudaStream_t s,
                                const mt_attention_opts *opts = nullptr);

/* gating.cu */
void mt_cuda_sigmoid_gate_forward(bf16 *out, const bf16 *x, const bf16 *g, int R, int C, int Cg,
                                  cudaStream_t s);
void mt_cuda_sigmoid_gate_backward(bf16 *dx, bf16 *dg, const bf16 *dout, const bf16 *x,
                                   const bf16 *g, int R, int C, int Cg, cudaStream_t s);
void mt_cuda_cols_split(bf16 *a, bf16 *b, const bf16 *in, int R, int wa, int wb, cudaStream_t s);
void mt_cuda_cols_join(bf16 *out, const bf16 *a, const bf16 *b, int R, int wa, int wb,
                       cudaStream_t s);

/* The Gated DeltaNet (qwen3_5's linear-attention layers): causal_conv1d.cu, l2norm.cu,
 * gdn_gates.cu, gated_rmsnorm.cu, and the chunked gated delta rule in gated_delta.cu (forward) and
 * gated_delta_backward.cu (gated_delta_chunk.cuh: chunk-local work in parallel over chunks, the
 * state recurrence in a scan a (row, value head, 32 value columns), TF32 tensor-core products,
 * split TF32 where they meet the triangular inverse, fp32 state). Limits the CPU ops do not have:
 * K <= 8 taps, Dk, Dv <= 128; both directions take mt_cuda_scratch, at most
 * MT_CUDA_GATED_DELTA_SCRATCH (long inputs run in ranges of chunks). doc_start is not
 * re-validated on the device. */
void mt_cuda_causal_conv1d_forward(bf16 *out, const bf16 *inp, const bf16 *weight,
                                   const int32_t *doc_start, int B, int T, int C, int K, int t0,
                                   cudaStream_t s);
void mt_cuda_causal_conv1d_backward(bf16 *dinp, float *dweight, const bf16 *dout, const bf16 *inp,
                                    const bf16 *weight, const int32_t *doc_start, int B, int T,
                                    int C, int K, int t0, cudaStream_t s);
void mt_cuda_l2norm_forward(bf16 *out, float *rinv, const bf16 *inp, int R, int D, float eps,
                            cudaStream_t s);
void mt_cuda_l2norm_backward(bf16 *dinp, const bf16 *dout, const bf16 *inp, const float *rinv,
                             int R, int D, cudaStream_t s);
void mt_cuda_gdn_gates_forward(float *g, float *beta, const bf16 *a, const bf16 *b,
                               const bf16 *A_log, const bf16 *dt_bias, int N, int Hv,
                               cudaStream_t s);
void mt_cuda_gdn_gates_backward(bf16 *da, bf16 *db, float *dA_log, float *ddt_bias,
                                const float *dg, const float *dbeta, const bf16 *a, const bf16 *b,
                                const bf16 *A_log, const bf16 *dt_bias, int N, int Hv,
                                cudaStream_t s);
void mt_cuda_gated_rmsnorm_forward(bf16 *out, float *rstd, const bf16 *inp, const bf16 *gate,
                                   const bf16 *weight, int R, int C, float eps, cudaStream_t s);
void mt_cuda_gated_rmsnorm_backward(bf16 *dinp, bf16 *dgate, float *dweight, const bf16 *dout,
                                    const bf16 *inp, const bf16 *gate, const bf16 *weight,
                                    const float *rstd, int R, int C, cudaStream_t s);
void mt_cuda_gated_delta_forward(mt_backend *be, bf16 *out, float *chunk_states, const bf16 *q, const bf16 *k,
                                 const bf16 *v, const float *g, const float *beta,
                                 const int32_t *doc_start, int B, int T, int Hk, int Hv, int Dk,
                                 int Dv, float scale, const mt_gated_delta_span *span,
                                 cudaStream_t s);
void mt_cuda_gated_delta_backward(mt_backend *be, bf16 *dq, bf16 *dk, bf16 *dv, float *dg,
                                  float *dbeta, const bf16 *dout, const float *chunk_states,
                                  const bf16 *q, const bf16 *k, const bf16 *v, const float *g,
                                  const float *beta, const int32_t *doc_start, int B, int T,
                                  int Hk, int Hv, int Dk, int Dv, float scale,
                                  const mt_gated_delta_span *span, cudaStream_t s);
/* Shared by the two: the shape checks. */
void mt_cuda_gated_delta_check(const char *op, int B, int T, int Hk, int Hv, int Dk, int Dv);

/* swiglu.cu */
void mt_cuda_swiglu_forward(bf16 *out, const bf16 *gate, const bf16 *up, size_t n, cudaStream_t s);
void mt_cuda_swiglu_backward(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate,
                             const bf16 *up, size_t n, cudaStream_t s);
void mt_cuda_add(bf16 *out, const bf16 *a, const bf16 *b, size_t n, cudaStream_t s);
void mt_cuda_scale(bf16 *x, float s, size_t n, cudaStream_t st);

/* geglu.cu (Gemma's gelu_tanh(gate) * up) */
void mt_cuda_geglu_forward(bf16 *out, const bf16 *gate, const bf16 *up, size_t n, cudaStream_t s);
void mt_cuda_geglu_backward(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate,
                            const bf16 *up, size_t n, cudaStream_t s);

/* softcap.cu (Gemma 4: the logits' cap * tanh(x / cap) in place; out = x * s[0], s one bf16 on
 * the device, out may alias x) */
void mt_cuda_softcap(bf16 *x, float cap, size_t n, cudaStream_t s);
void mt_cuda_scale_by(bf16 *out, const bf16 *x, const bf16 *sc, size_t n, cudaStream_t s);

/* swiglu_clamped.cu (gpt-oss's clamped SwiGLU over interleaved gate/up columns) */
void mt_cuda_swiglu_clamped_forward(bf16 *out, const bf16 *gate_up, int R, int F, float alpha,
                                    float limit, cudaStream_t s);
void mt_cuda_swiglu_clamped_backward(bf16 *dgate_up, const bf16 *dout, const bf16 *gate_up, int R,
                                     int F, float alpha, float limit, cudaStream_t s);

/* vector.cu */
void mt_cuda_sumsq(float *out, const float *x, size_t n, cudaStream_t s);
void mt_cuda_from_f32(bf16 *dst, const float *src, size_t n, cudaStream_t s);

/* optim.cu: the AdamW update of a state on the device (bit for bit mt_optim_arenas_update), and
 * from_bf16 (a device copy). mt_cuda_optim_init uploads the qmaps to the current device, once
 * per backend before its first update. */
void mt_cuda_optim_init(void);
void mt_cuda_optim_update(const mt_optim_arenas *s, const mt_optim_step *a, size_t offset,
                          size_t n, const void *grad, mt_dtype grad_dtype, cudaStream_t st);
void mt_cuda_from_bf16(bf16 *dst, const bf16 *src, size_t n, cudaStream_t s);

/* dequant.cu: a quantized frozen base weight (src/quant: NF4, FP8 e4m3) -> bf16, each value the
 * fp32 product code value * block scale rounded once, as backend.h's dequant_nf4 / dequant_fp8 */
void mt_cuda_dequant_nf4(bf16 *dst, const uint8_t *codes, const float *absmax, size_t n,
                         cudaStream_t s);
void mt_cuda_dequant_fp8(bf16 *dst, const uint8_t *q, const float *scales, size_t n,
                         cudaStream_t s);
/* MXFP4 (gpt-oss's experts): mats row-major rows x cols matrices of e2m1 blocks (32 columns, an
 * e8m0 scale each) -> dst [mats, cols, rows] bf16, each matrix transposed, as backend.h's
 * dequant_mxfp4 */
void mt_cuda_dequant_mxfp4(bf16 *dst, const uint8_t *blocks, const uint8_t *scales, int64_t mats,
                           int64_t rows, int64_t cols, cudaStream_t s);

/* moe.cu (mixture-of-experts routing; the experts' GEMMs: moe_gemm.cu, or matmul per expert) */
void mt_cuda_moe_route(float *probs, int32_t *top_idx, float *top_w, int32_t *counts,
                       float *prob_sum, const bf16 *logits, int n, int E, int k, int renorm,
                       cudaStream_t s);
void mt_cuda_moe_group(int32_t *perm, int32_t *inv, int32_t *offsets, const int32_t *top_idx, int n,
                       int E, int k, cudaStream_t s);
void mt_cuda_moe_gather(bf16 *xg, const bf16 *x, const int32_t *perm, int n, int C, int k,
                        cudaStream_t s);
void mt_cuda_moe_gather_backward(bf16 *dx, const bf16 *dxg, const int32_t *inv, int n, int C, int k,
                                 int accumulate, cudaStream_t s);
void mt_cuda_moe_combine(bf16 *out, const bf16 *y, const float *top_w, const int32_t *inv, int n,
                         int C, int k, cudaStream_t s);
void mt_cuda_moe_combine_backward(bf16 *dy, float *d_w, const bf16 *dout, const bf16 *y,
                                  const float *top_w, const int32_t *inv, int n, int C, int k,
                                  cudaStream_t s);
void mt_cuda_moe_route_backward(bf16 *d_logits, const float *d_w, const float *probs,
                                const int32_t *top_idx, const float *top_w, const float *aux_grad,
                                int n, int E, int k, int renorm, cudaStream_t s);

/* moe_scale.cu (Gemma 4's per-expert gate scale, backend.h's moe_expert_scale_*; d_scale NULL:
 * skipped; deterministic sums without float atomics) */
void mt_cuda_moe_expert_scale_forward(float *w_out, const float *w, const int32_t *top_idx,
                                      const bf16 *scale, int n, int k, cudaStream_t s);
void mt_cuda_moe_expert_scale_backward(float *d_w, float *d_scale, const float *d_out,
                                       const float *w, const int32_t *top_idx, const bf16 *scale,
                                       int n, int k, cudaStream_t s);

/* moe_gemm.cu (the experts' GEMMs as cuBLAS grouped GEMMs; backend.h's moe_matmul_*, whose
 * arguments they take). _backward returns 0 when cuBLAS refused the fp32 weight gradient (nothing
 * enqueued for it: the caller runs it per expert), 1 otherwise. _available: 0 when this cuBLAS
 * has no grouped GEMM (before 12.5). _free: at the backend's destruction. */
int mt_cuda_moe_gemm_available(void);
void mt_cuda_moe_matmul_forward(mt_cuda_ctx *ctx, bf16 *out, const bf16 *inp, const bf16 *weight,
                                size_t w_stride, const int32_t *offsets,
                                const int32_t *offsets_host, int E, int K, int M, cudaStream_t s);
int mt_cuda_moe_matmul_backward(mt_cuda_ctx *ctx, bf16 *dinp, float *dweight, const bf16 *dout,
                                const bf16 *inp, const bf16 *weight, size_t w_stride,
                                const int32_t *offsets, const int32_t *offsets_host, int E, int K,
                                int M, int accumulate, cudaStream_t s);
void mt_cuda_moe_gemm_free(mt_cuda_ctx *ctx);
void mt_cuda_gd_blas_free(mt_cuda_ctx *ctx); /* gated_delta_gemm.cu */
/* The weight gradients of moe_matmul_backward as zero-padded strided batches through the op
 * scratch (when cuBLAS refuses the grouped fp32 D). Returns 0 with nothing enqueued when padding
 * would cost over 4x the rows or one expert's slab exceeds MT_CUDA_MOE_PAD_SCRATCH (the caller
 * loops), 1 when enqueued. */
int mt_cuda_moe_dweight_padded(mt_backend *be, float *dweight, const bf16 *dout, const bf16 *inp,
                               size_t w_stride, const int32_t *offsets,
                               const int32_t *offsets_host, int E, int K, int M, cudaStream_t s);

/* moe_io.cu (gpt-oss's experts stored [E, in, out] with biases; backend.h's moe_matmul_io_*, whose
 * arguments they take): one GEMM per expert with rows through matmul.cu's launchers */
void mt_cuda_moe_matmul_io_forward(mt_cuda_ctx *ctx, bf16 *out, const bf16 *inp,
                                   const bf16 *weight, const bf16 *bias, const int32_t *offsets,
                                   const int32_t *offsets_host, int E, int K, int M,
                                   cudaStream_t s);
void mt_cuda_moe_matmul_io_backward(mt_cuda_ctx *ctx, bf16 *dinp, float *dweight, float *dbias,
                                    const bf16 *dout, const bf16 *inp, const bf16 *weight,
                                    const int32_t *offsets, const int32_t *offsets_host, int E,
                                    int K, int M, int accumulate, cudaStream_t s);

/* lm_head_loss.cu (chunked: the (N, V) logits never exist); _softcap with Gemma 4's soft-capped
 * logits (cap > 0; 0 is the plain op) */
void mt_cuda_lm_head_loss(mt_backend *be, float *losses, bf16 *dinp, float *dweight,
                          const bf16 *inp, const bf16 *weight, const int32_t *targets, int N,
                          int C, int V, float loss_scale, cudaStream_t s);
void mt_cuda_lm_head_loss_softcap(mt_backend *be, float *losses, bf16 *dinp, float *dweight,
                                  const bf16 *inp, const bf16 *weight, const int32_t *targets,
                                  int N, int C, int V, float loss_scale, float cap,
                                  cudaStream_t s);

#endif
