/* The backend interface: the ops and memory calls the model and the schedule use.
 *
 * A backend is a struct of function pointers with a context (ggml's pattern). The CPU backend
 * (cpu/) computes in fp32 and is the reference; the CUDA backend (cuda/) computes in bf16 with
 * fp32 accumulation. Both implement the same signatures, so one test compares them op by op.
 *
 * Conventions for every op:
 *  - `void *` tensors (weights, activations and activation gradients) are in the backend's
 *    compute dtype (be->dtype: MT_F32 on cpu, MT_BF16 on cuda) and live on the compute side.
 *  - `float *` tensors are fp32 always: statistics (rstd, lse, losses) and weight gradients.
 *  - Weight gradients ACCUMULATE (+=) so that micro-batches sum; activation gradients are
 *    written (=) unless the op's `accumulate` flag says +=.
 *  - A NULL weight-gradient pointer (dweight, dbias, dA_log, ddt_bias) means that weight is
 *    frozen (LoRA): its gradient is skipped, work included (no GEMM, no reduction), and the
 *    activation gradients are the same bits as with it.
 *  - Shapes are row-major; letters as in config.h; N = B*T tokens, token-major (b, t).
 *  - Ops are enqueued in order on the backend's compute stream; be->sync waits for them.
 */
#ifndef MT_BACKEND_H
#define MT_BACKEND_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stddef.h>
#include <stdint.h>

#include "../core/dtype.h"
#include "../optim/state.h"

typedef struct mt_backend mt_backend;
typedef struct mt_event mt_event; /* opaque; one per backend kind */

/* What an attention call may change from the plain causal softmax(q k^T / sqrt(D)) v (NULL: all
 * defaults). A backend that lacks an option refuses a call that asks for it (mt_attention_opts_plain
 * says whether one does). */
typedef struct {
    float scale;       /* the scores' scale; 0: 1/sqrt(D) */
    int window;        /* 0: none; W > 0: query t sees keys t-W+1 .. t only (gpt-oss's sliding
                          layers; within its document still) */
    const void *sinks; /* (H) compute dtype, NULL: none: a learned logit per query head that joins
                          every row's softmax denominator (its value is zero), so a row's
                          probabilities sum to less than 1 (gpt-oss) */
    float *dsinks;     /* (H) fp32, += in the backward: the sinks' gradient (NULL: skipped) */
} mt_attention_opts;

/* 1 when opts asks for nothing beyond the plain causal attention with scale 1/sqrt(D). */
static inline int mt_attention_opts_plain(const mt_attention_opts *o) {
    return !o || (o->scale == 0 && o->window == 0 && !o->sinks);
}

/* The three queues of the streaming schedule. Work on one stream runs in the order enqueued;
 * streams are ordered against each other only through events. */
typedef enum {
    MT_STREAM_COMPUTE = 0, /* the ops below */
    MT_STREAM_H2D = 1,     /* host -> compute side copies */
    MT_STREAM_D2H = 2,     /* compute side -> host copies */
    MT_STREAMS = 3,
} mt_stream;

/* What a backend reports to the memory planner (engine/planner.h) about its compute side, beside
 * mem_budget: what it takes for itself, outside the engine's plan. */
typedef struct {
    int64_t scratch;  /* bytes it allocates for itself through alloc, counted in mem_budget
                         (cuda: the cuBLASLt workspace and the LM head's logits chunk) */
    int64_t headroom; /* bytes to leave free under mem_budget for temporaries it takes outside
                         alloc's accounting (cuda: the stream-ordered pool of the attention backward) */
    double attention_pool; /* bytes per element of q (token x head x D) that the attention backward
                              takes from that pool (cuda: cuDNN's workspace): the headroom grows to
                              it at long context */
    double attention_pool_docs; /* ... the same for rows that pack several documents, under the
                                   attention choice in force (cuda: cuDNN's variable-length graph,
                                   unless MT_ATTENTION_DOCS or MT_ATTENTION is own); the planner
                                   takes it for runs on packed rows (mt_plan_request.documents) */
    int host_ram;     /* the compute side is host RAM (cpu): its bytes count against the host's
                         memory, and moving the checkpoints to the host frees nothing */
    int64_t host_overhead; /* host RAM the process takes beside the plan's arrays (cuda: the driver,
                              runtime and libraries), kept free when fitting the host */
    int (*head_chunk_rows)(int N, int V); /* rows per chunk of lm_head_loss over N rows (the plan
                                             prints it; NULL: unknown) */
    /* Rates for the planner's step-time estimate (engine/step_time.h); 0: unknown, no estimate. */
    double flops_rate;  /* FLOP/s the step's matmuls (engine/flops.h's executed count) run at */
    double h2d_rate, d2h_rate; /* bytes/s of a pinned copy, one direction alone */
    double duplex_rate; /* bytes/s each way while both directions copy */
    /* An MoE layer's GPU time beyond its FLOPs at flops_rate (step_time.c; 0: not counted): */
    double moe_call_s;       /* the fixed cost of one expert GEMM call (a loop of small ones is
                                bound by it) */
    double moe_grouped_rate; /* FLOP/s of the grouped GEMM's data products (0: none) */
    int moe_grouped_below;   /* rows an expert under which the data products run grouped (0: never) */
    double moe_route_rate;   /* bytes/s of the routing kernels (gather, SwiGLU, combine) */
    /* FLOP/s of the Gated DeltaNet's chunked rule (engine/flops.h's count of it), forward and
     * backward alike (0: flops_rate) */
    double delta_rule_rate;
} mt_backend_memory;

/* Where a call of the gated delta rule sits in longer rows, for a layer that runs a long row in
 * spans of tokens (model/mixer_deltanet.c): the call's tokens are positions t0.. of their rows
 * (doc_start holds positions in the row, so a document begun before t0 continues into the call:
 * its tokens read the incoming state), and the state crosses from span to span. state_in (B, Hv,
 * Dk, Dv) fp32 is the state entering the call (NULL: zero); the forward writes the state after its
 * last token to state_out (NULL: not written); the backward takes that state's gradient from
 * dstate_out (NULL: zero) and writes state_in's to dstate_in (NULL: not written; it must not
 * alias dstate_out). A NULL span is whole rows: t0 0 and no states. */
typedef struct {
    int t0;
    const float *state_in;
    float *state_out;
    const float *dstate_out;
    float *dstate_in;
} mt_gated_delta_span;

struct mt_backend {
    const char *name;
    mt_dtype dtype; /* compute dtype of weights and activations */
    void *ctx;

    /* ---- memory on the compute side ---- */
    void *(*alloc)(mt_backend *be, size_t bytes);   /* fatal on failure; 64-byte aligned */
    void (*free)(mt_backend *be, void *p);
    void (*zero)(mt_backend *be, void *p, size_t bytes);
    void (*upload)(mt_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*download)(mt_backend *be, void *host_dst, const void *src, size_t bytes);
    /* Optional (NULL: not needed). Called after each upload of packed rows' document starts:
     * doc_start (B, T) on the compute side now holds host_doc_start's values (NULL: it holds
     * documents no longer). The attention ops may then lay out rows doc_start + b*T .. (any B' rows
     * inside) from the host copy without reading the device (cuda: cuDNN's ragged batch). */
    void (*note_documents)(mt_backend *be, const int32_t *doc_start, const int32_t *host_doc_start,
                           int B, int T);
    void (*sync)(mt_backend *be); /* waits for every stream */
    void (*destroy)(mt_backend *be);

    /* ---- host buffers the copy streams read and write (pinned on cuda) ---- */
    void *(*host_alloc)(mt_backend *be, size_t bytes); /* fatal on failure; 64-byte aligned */
    void (*host_free)(mt_backend *be, void *p);

    /* ---- asynchronous copies and events (the schedule's only synchronization) ---- */
    /* On MT_STREAM_H2D: host src -> compute-side dst; on MT_STREAM_D2H: compute-side src -> host
     * dst. The buffers must stay untouched until an event recorded after the copy completes. */
    void (*copy_async)(mt_backend *be, mt_stream s, void *dst, const void *src, size_t bytes);
    mt_event *(*event_create)(mt_backend *be);
    void (*event_destroy)(mt_backend *be, mt_event *ev);
    /* ev completes when everything enqueued on s before this call has completed. */
    void (*event_record)(mt_backend *be, mt_event *ev, mt_stream s);
    /* Work enqueued on s after this call starts after the last record of ev has completed. */
    void (*stream_wait)(mt_backend *be, mt_stream s, mt_event *ev);
    /* The calling thread blocks until the last record of ev has completed. */
    void (*event_sync)(mt_backend *be, mt_event *ev);
    /* Optional (NULL when unsupported), for measurements: milliseconds between the completions of
     * the last records of two completed events. */
    double (*event_elapsed_ms)(mt_backend *be, mt_event *start, mt_event *end);
    /* Optional (NULL on cpu): the native handle of stream s (cuda: its cudaStream_t), for a
     * library that enqueues its own work there in order with ours (the nccl comm, comm.h). Where
     * it is NULL, the compute stream is the calling thread. */
    void *(*native_stream)(mt_backend *be, mt_stream s);
    /* Optional: bytes allocated through alloc so far. */
    size_t (*mem_used)(mt_backend *be);
    int attention_options; /* the attention ops take every mt_attention_opts option (cpu, cuda);
                              0: the defaults only, and the layer check refuses the models that
                              need them */
    int rmsnorm_unweighted; /* rmsnorm_forward / _backward take weight NULL: no weight (Gemma 4's
                               v_norm) (cpu, cuda); 0: a weight always */
    int64_t mem_budget; /* bytes alloc may hand out in all (cuda: --gpu-mem or the free memory at
                           start); 0: no limit (cpu) */
    mt_backend_memory memory; /* what the memory planner must know of the compute side */

    /* ---- ops ---- */

    /* out (N, C) = table[ids[n]] with table (V, C). */
    void (*embedding_forward)(mt_backend *be, void *out, const int32_t *ids, const void *table,
                              int N, int C);
    /* dtable (V, C) += scatter of dout (N, C) rows by ids. */
    void (*embedding_backward)(mt_backend *be, float *dtable, const void *dout, const int32_t *ids,
                               int N, int C);

    /* Over R rows of width C: rstd[r] = 1/sqrt(mean(inp[r]^2) + eps), out = inp * rstd *
     * (weight + w_offset): w_offset 0 for Llama's norm, 1 for the (1 + w) norms of qwen3_5 (the
     * sum taken in fp32, so a small w keeps its bits). weight NULL (where rmsnorm_unweighted):
     * out = inp * rstd, and the backward's dweight is ignored. */
    void (*rmsnorm_forward)(mt_backend *be, void *out, float *rstd, const void *inp,
                            const void *weight, int R, int C, float eps, float w_offset);
    /* dinp (=, or += when accumulate) and dweight (+=) from dout; rstd from the forward. Either
     * may be NULL (skipped). */
    void (*rmsnorm_backward)(mt_backend *be, void *dinp, float *dweight, const void *dout,
                             const void *inp, const void *weight, const float *rstd, int R, int C,
                             int accumulate, float w_offset);

    /* out (R, M) = inp (R, K) @ weight (M, K)^T (+ bias (M) when not NULL). */
    void (*matmul_forward)(mt_backend *be, void *out, const void *inp, const void *weight,
                           const void *bias, int R, int K, int M);
    /* dinp (R, K) = (or += when accumulate) dout @ weight; dweight (M, K) += dout^T @ inp;
     * dbias (M) += column sums of dout. Any of dinp, dweight, dbias may be NULL (skipped). */
    void (*matmul_backward)(mt_backend *be, void *dinp, float *dweight, float *dbias,
                            const void *dout, const void *inp, const void *weight, int R, int K,
                            int M, int accumulate);
    /* out (R, M) += inp (R, K) @ weight (M, K)^T: a product added onto what out holds (LoRA's
     * low-rank term, model/linear.h). */
    void (*matmul_forward_add)(mt_backend *be, void *out, const void *inp, const void *weight,
                               int R, int K, int M);

    /* In place on x (N, nh, D): the first rd dims of each head vector (rd even, <= D; rd < D is
     * partial RoPE) have their pairs (i, i + rd/2), i < rd/2, rotated by the angle pos[n] *
     * inv_freq[i] (computed in fp32), as transformers' rotate_half does; dims rd.. are kept. */
    void (*rope_forward)(mt_backend *be, void *x, const int32_t *pos, const float *inv_freq, int N,
                         int nh, int D, int rd);
    /* The gradient: rotation by the opposite angle, in place on dx (N, nh, D). */
    void (*rope_backward)(mt_backend *be, void *dx, const int32_t *pos, const float *inv_freq,
                          int N, int nh, int D, int rd);

    /* Causal grouped-query attention with scale 1/sqrt(D) (or opts->scale). q (N, H, D); k, v
     * (N, G, D); query head h uses kv head h / (H / G). out (N, H, D); lse (B, H, T) = log-sum-exp
     * of the scaled scores of each query (the sink's logit included when opts has sinks). When
     * doc_start is not NULL, token t of row b attends only to tokens s with
     * doc_start[b*T + t] <= s <= t (documents packed in one row do not see each other); with
     * opts->window W, also only to s > t - W. opts NULL: the defaults (mt_attention_opts). Both
     * backends take every option (cuda: its own kernels then, cuDNN only without options). */
    void (*attention_forward)(mt_backend *be, void *out, float *lse, const void *q, const void *k,
                              const void *v, const int32_t *doc_start, int B, int T, int H, int G,
                              int D, const mt_attention_opts *opts);
    /* dq (N, H, D), dk and dv (N, G, D), all written (=); opts->dsinks (H) += the sinks' gradient.
     * opts as the forward's. */
    void (*attention_backward)(mt_backend *be, void *dq, void *dk, void *dv, const void *dout,
                               const void *out, const float *lse, const void *q, const void *k,
                               const void *v, const int32_t *doc_start, int B, int T, int H, int G,
                               int D, const mt_attention_opts *opts);

    /* ---- the Gated DeltaNet (Qwen3.5's linear-attention layers; model/ drives them) ----
     * Letters: Hk key heads of Dk, Hv value heads of Dv (Hv a multiple of Hk: value head h uses key
     * head h / (Hv/Hk)), Ch = 2*Hk*Dk + Hv*Dv conv channels, K taps. g, beta and every statistic
     * are fp32 (N, Hv). doc_start as attention's: packed documents never see each other.
     * Optional: NULL on a backend without them. The cuda backend's (src/backend/cuda/ops.cuh) take
     * K <= 8 taps and Dk <= 128, TF32 tensor-core products in the gated delta rule. */
    /* out (N, Ch) = silu(causal depthwise conv over each row's time of inp (N, Ch) with weight
     * (Ch, K), no bias): out[t, c] = silu(sum_j weight[c, j] * inp[t - (K-1) + j, c]), the taps
     * before the token's document (or the call's row) start reading zero. The call's tokens are
     * positions t0.. of their rows (doc_start holds positions in the row: a document begun before
     * t0 reads from the call's first token on); t0 is 0 for whole rows. */
    void (*causal_conv1d_forward)(mt_backend *be, void *out, const void *inp, const void *weight,
                                  const int32_t *doc_start, int B, int T, int C, int K, int t0);
    /* dinp (N, Ch) written (=), dweight (Ch, K) += (NULL: skipped), from dout; the pre-activation
     * recomputed. */
    void (*causal_conv1d_backward)(mt_backend *be, void *dinp, float *dweight, const void *dout,
                                   const void *inp, const void *weight, const int32_t *doc_start,
                                   int B, int T, int C, int K, int t0);
    /* Over R rows of width D (R = N*heads): rinv[r] = 1/sqrt(sum(inp[r]^2) + eps) (eps 1e-6 in
     * Qwen3.5), out = inp * rinv. */
    void (*l2norm_forward)(mt_backend *be, void *out, float *rinv, const void *inp, int R, int D,
                           float eps);
    /* dinp (R, D) written (=) from dout; rinv from the forward. */
    void (*l2norm_backward)(mt_backend *be, void *dinp, const void *dout, const void *inp,
                            const float *rinv, int R, int D);
    /* g (N, Hv) = -exp(A_log[h]) * softplus(a + dt_bias[h]) (softplus as torch's, threshold 20),
     * beta (N, Hv) = sigmoid(b); a, b (N, Hv) and A_log, dt_bias (Hv) in the compute dtype. */
    void (*gdn_gates_forward)(mt_backend *be, float *g, float *beta, const void *a, const void *b,
                              const void *A_log, const void *dt_bias, int N, int Hv);
    /* da, db (N, Hv, compute dtype) written (=); dA_log, ddt_bias (Hv) += (each may be NULL:
     * skipped); from dg, dbeta. */
    void (*gdn_gates_backward)(mt_backend *be, void *da, void *db, float *dA_log, float *ddt_bias,
                               const float *dg, const float *dbeta, const void *a, const void *b,
                               const void *A_log, const void *dt_bias, int N, int Hv);
    /* The gated delta rule, per (row b, value head) with the fp32 state S (Dk, Dv) zero at the
     * row's start and at every document start:
     *   S_t = exp(g_t) S_{t-1};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T;  out_t = S_t^T (scale q_t)
     * q, k (N, Hk, Dk) (already L2-normalised; the op multiplies q by scale, Qwen3.5: Dk^-0.5),
     * v, out (N, Hv, Dv). Computed in chunks of MT_GATED_DELTA_CHUNK tokens of each row (the
     * WY/UT form of flash-linear-attention's chunk_gated_delta_rule: an intra-chunk triangular
     * solve, the state scanned over chunks, a document start inside a chunk masked within it).
     * chunk_states (B, Hv, nchunks, Dk, Dv) fp32, nchunks = ceil(T / MT_GATED_DELTA_CHUNK): the
     * state entering each chunk (before the reset of a document starting at the chunk's first
     * token), written for the backward. span: where the call sits in longer rows (NULL: whole
     * rows; mt_gated_delta_span). */
    void (*gated_delta_forward)(mt_backend *be, void *out, float *chunk_states, const void *q,
                                const void *k, const void *v, const float *g, const float *beta,
                                const int32_t *doc_start, int B, int T, int Hk, int Hv, int Dk,
                                int Dv, float scale, const mt_gated_delta_span *span);
    /* The chunked backward (fla's: each chunk recomputed from its saved incoming state, chunks in
     * reverse): dq, dk (N, Hk, Dk), dv (N, Hv, Dv) and dg, dbeta (N, Hv) fp32, all written (=),
     * from dout (N, Hv, Dv) and the forward's chunk_states; span as the forward's. */
    void (*gated_delta_backward)(mt_backend *be, void *dq, void *dk, void *dv, float *dg,
                                 float *dbeta, const void *dout, const float *chunk_states,
                                 const void *q, const void *k, const void *v, const float *g,
                                 const float *beta, const int32_t *doc_start, int B, int T, int Hk,
                                 int Hv, int Dk, int Dv, float scale,
                                 const mt_gated_delta_span *span);
    /* Over R rows of width C (R = N*Hv, C = Dv), as transformers' Qwen3_5RMSNormGated (a plain
     * weight, not 1 + weight): rstd[r] = 1/sqrt(mean(inp[r]^2) + eps),
     * out = weight * inp * rstd * silu(gate). */
    void (*gated_rmsnorm_forward)(mt_backend *be, void *out, float *rstd, const void *inp,
                                  const void *gate, const void *weight, int R, int C, float eps);
    /* dinp, dgate (R, C) written (=), dweight (C) += (NULL: skipped); rstd from the forward. */
    void (*gated_rmsnorm_backward)(mt_backend *be, void *dinp, void *dgate, float *dweight,
                                   const void *dout, const void *inp, const void *gate,
                                   const void *weight, const float *rstd, int R, int C);

    /* gpt-oss's clamped SwiGLU over R rows: gate_up (R, 2F) holds gate j in column 2j and up j in
     * 2j+1; g = min(gate, limit), u = clamp(up, -limit, limit), out (R, F) = (u + 1) * g *
     * sigmoid(alpha * g). Backward: dgate_up (R, 2F) written (=), zero where a clamp acted (the
     * bounds themselves pass, as torch.clamp). Optional (NULL: a backend without them). */
    void (*swiglu_clamped_forward)(mt_backend *be, void *out, const void *gate_up, int R, int F,
                                   float alpha, float limit);
    void (*swiglu_clamped_backward)(mt_backend *be, void *dgate_up, const void *dout,
                                    const void *gate_up, int R, int F, float alpha, float limit);

    /* out[i] = silu(gate[i]) * up[i] over n elements. */
    void (*swiglu_forward)(mt_backend *be, void *out, const void *gate, const void *up, size_t n);
    /* dgate, dup (=) from dout. */
    void (*swiglu_backward)(mt_backend *be, void *dgate, void *dup, const void *dout,
                            const void *gate, const void *up, size_t n);
    /* GeGLU (Gemma): out[i] = gelu_tanh(gate[i]) * up[i], gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi)
     * (x + 0.044715 x^3))) (torch's gelu approximate="tanh"); backward as swiglu's. Optional (NULL:
     * a backend without them). */
    void (*geglu_forward)(mt_backend *be, void *out, const void *gate, const void *up, size_t n);
    void (*geglu_backward)(mt_backend *be, void *dgate, void *dup, const void *dout,
                           const void *gate, const void *up, size_t n);
    /* x (N, C): the rows n with ids[n] == id set to zero (nn.Embedding's padding_idx: the lookup
     * gives that row no gradient). Optional (NULL: a backend without it). */
    void (*zero_rows_of_id)(mt_backend *be, void *x, const int32_t *ids, int32_t id, int N, int C);

    /* Sigmoid gates (qwen3_5: the gated attention's per-head gate, the shared expert's per-token
     * one). out (R, C) = x * sigmoid(g), g (R, Cg) with Cg = C (one gate an element) or 1 (one a
     * row). Backward: dx = dout * sigmoid(g) and dg = dout * x * s * (1 - s) (summed over the row
     * when Cg = 1), both written (=); dx may alias dout. */
    void (*sigmoid_gate_forward)(mt_backend *be, void *out, const void *x, const void *g, int R,
                                 int C, int Cg);
    void (*sigmoid_gate_backward)(mt_backend *be, void *dx, void *dg, const void *dout,
                                  const void *x, const void *g, int R, int C, int Cg);
    /* in (R, wa + wb) -> a (R, wa), b (R, wb): the columns split in two; join is the inverse. */
    void (*cols_split)(mt_backend *be, void *a, void *b, const void *in, int R, int wa, int wb);
    void (*cols_join)(mt_backend *be, void *out, const void *a, const void *b, int R, int wa,
                      int wb);

    /* out = a + b over n elements (out may alias a or b). */
    void (*add)(mt_backend *be, void *out, const void *a, const void *b, size_t n);
    /* x[i] *= s over n elements of the compute dtype (in fp32, rounded once). */
    void (*scale)(mt_backend *be, void *x, float s, size_t n);
    /* out[i] = x[i] * s[0] over n elements, s one value of the compute dtype on the compute side
     * (Gemma 4's layer_scalar); out may alias x. Optional (NULL: a backend without it). */
    void (*scale_by)(mt_backend *be, void *out, const void *x, const void *s, size_t n);
    /* x[i] = cap * tanh(x[i] / cap) over n elements, in place (Gemma's final logit soft-capping).
     * Optional (NULL: a backend without it). */
    void (*softcap)(mt_backend *be, void *x, float cap, size_t n);

    /* out[0] += sum of x[i]^2 over n fp32 elements (accumulated in fp32 or better). */
    void (*sumsq)(mt_backend *be, float *out, const float *x, size_t n);
    /* dst (compute dtype) = src (fp32) over n elements (rounded to nearest even for bf16). */
    void (*from_f32)(mt_backend *be, void *dst, const float *src, size_t n);
    /* dst (compute dtype) = src (bf16) over n elements, both on the compute side (exact). */
    void (*from_bf16)(mt_backend *be, void *dst, const mt_bf16 *src, size_t n);
    /* A frozen base weight stored quantized (src/quant) -> dst (compute dtype, n elements), on
     * the compute stream, every input on the compute side. Each value is the fp32 product of its
     * code's value and its block's scale, rounded once to the compute dtype. NF4 (quant/nf4.h):
     * codes (n / 2 bytes, element 2j in byte j's high nibble), absmax (n / 64 fp32), n a multiple
     * of 64. FP8 e4m3 (quant/fp8.h): q (n bytes), scales (n / 128 fp32), n a multiple of 128. */
    void (*dequant_nf4)(mt_backend *be, void *dst, const uint8_t *codes, const float *absmax,
                        size_t n);
    void (*dequant_fp8)(mt_backend *be, void *dst, const uint8_t *q, const float *scales,
                        size_t n);
    /* MXFP4 (quant/mxfp4.h; gpt-oss's experts, engine/quant_base.h): blocks (mats * rows * cols / 2
     * bytes) and e8m0 scales (mats * rows * cols / 32 bytes) of mats row-major rows x cols
     * matrices, 32 columns a block (the checkpoint's [E, out, in / 32, 16]); dst gets each matrix
     * transposed, [mats, cols, rows] (the table's [E, in, out]), each value e2m1 * 2^(s - 127),
     * exact (+-inf past the compute dtype's range). cols a multiple of 32. */
    void (*dequant_mxfp4)(mt_backend *be, void *dst, const uint8_t *blocks, const uint8_t *scales,
                          int64_t mats, int64_t rows, int64_t cols);

    /* One AdamW step of an optimizer state whose arenas live on the compute side (the GPU tier:
     * optim/state.h's mt_optim_arenas with compute-side pointers) over [offset, offset+n), with
     * the gradient grad (compute side, grad_dtype MT_F32 or MT_BF16): the same bits as
     * mt_optim_arenas_update computes on the host, for every format. On the compute stream. */
    void (*optim_update)(mt_backend *be, const mt_optim_arenas *s, const mt_optim_step *a,
                         size_t offset, size_t n, const void *grad, mt_dtype grad_dtype);

    /* ---- mixture of experts (model/moe.h drives them) ----
     * n tokens, E experts, k choices per token; assignment a = t*k + j is token t's j-th choice;
     * "grouped rows" hold the n*k assignments sorted by expert, then by a. Index tensors are int32.
     * Optional: NULL on a backend without them (cuda, today), which then refuses MoE models. */
    /* probs (n, E) fp32 = softmax(logits (n, E)) in fp32; top_idx (n, k) the k most probable in
     * descending order (ties to the lower index), top_w (n, k) their probabilities, divided by their
     * sum when renorm. counts (E) += selections and prob_sum (E) += probabilities, unless NULL. */
    void (*moe_route)(mt_backend *be, float *probs, int32_t *top_idx, float *top_w, int32_t *counts,
                      float *prob_sum, const void *logits, int n, int E, int k, int renorm);
    /* offsets (E + 1): expert e's grouped rows are offsets[e] .. offsets[e+1]-1; perm (n*k) the
     * assignment of each grouped row, inv (n*k) the grouped row of each assignment. */
    void (*moe_group)(mt_backend *be, int32_t *perm, int32_t *inv, int32_t *offsets,
                      const int32_t *top_idx, int n, int E, int k);
    /* xg (n*k, C): grouped row r = x[perm[r] / k] of x (n, C). */
    void (*moe_gather)(mt_backend *be, void *xg, const void *x, const int32_t *perm, int n, int C,
                       int k);
    /* dx (n, C) = (or += when accumulate) the sum of each token's k grouped rows of dxg. */
    void (*moe_gather_backward)(mt_backend *be, void *dx, const void *dxg, const int32_t *inv, int n,
                                int C, int k, int accumulate);
    /* out (n, C) = sum over j of top_w[t, j] * y[inv[t*k + j]] (=), y grouped rows (n*k, C). */
    void (*moe_combine)(mt_backend *be, void *out, const void *y, const float *top_w,
                        const int32_t *inv, int n, int C, int k);
    /* dy (grouped rows, =) = top_w * dout of the row's token; d_w (n, k) fp32 = dout[t] . y[row]. */
    void (*moe_combine_backward)(mt_backend *be, void *dy, float *d_w, const void *dout,
                                 const void *y, const float *top_w, const int32_t *inv, int n, int C,
                                 int k);
    /* d_logits (n, E) (=) from d_w (n, k) through the renormalisation (when renorm) and the
     * softmax, plus aux_grad (E) on every probability when not NULL. */
    void (*moe_route_backward)(mt_backend *be, void *d_logits, const float *d_w, const float *probs,
                               const int32_t *top_idx, const float *top_w, const float *aux_grad,
                               int n, int E, int k, int renorm);

    /* Gemma 4's per-expert gate scale: w_out (n, k) = w * scale[top_idx] (scale (E) compute dtype,
     * router.per_expert_scale). Backward: d_w (n, k) = d_out * scale[top_idx] (=), d_scale (E) +=
     * the sum of d_out * w over each expert's assignments (NULL: skipped). Optional (NULL: a
     * backend without them, which refuses Gemma 4's MoE block). */
    void (*moe_expert_scale_forward)(mt_backend *be, float *w_out, const float *w,
                                     const int32_t *top_idx, const void *scale, int n, int k);
    void (*moe_expert_scale_backward)(mt_backend *be, float *d_w, float *d_scale, const float *d_out,
                                      const float *w, const int32_t *top_idx, const void *scale, int n,
                                      int k);

    /* The experts' linear layers over grouped rows (no bias): for every expert e with rows
     * offsets[e] .. offsets[e+1]-1 (none: skipped, its gradient untouched), what matmul_forward /
     * matmul_backward compute on those rows with weight (M, K) = weight + e * w_stride elements
     * (dweight's the same offset of dweight; dinp or dweight NULL: skipped, never offset).
     * offsets_host is the host's copy of the compute side's offsets (sizes come from it); both
     * must hold the same values. The cpu backend runs the per-expert loop
     * (mt_backend_moe_matmul_loop_*); cuda runs it too, or one cuBLAS grouped GEMM per product
     * (moe_gemm.cu), as MT_MOE_GEMM says (auto, the default: grouped with few rows an expert;
     * moe_gemm_choice.h). */
    void (*moe_matmul_forward)(mt_backend *be, void *out, const void *inp, const void *weight,
                               size_t w_stride, const int32_t *offsets,
                               const int32_t *offsets_host, int E, int K, int M);
    void (*moe_matmul_backward)(mt_backend *be, void *dinp, float *dweight, const void *dout,
                                const void *inp, const void *weight, size_t w_stride,
                                const int32_t *offsets, const int32_t *offsets_host, int E, int K,
                                int M, int accumulate);
    /* gpt-oss's experts, stored fused as [E, in, out]: for every expert e with rows (as above),
     * out (rows, M) = inp (rows, K) @ weight[e] (K, M) + bias[e] (M), weight (E, K, M) and bias
     * (E, M) contiguous. Backward: dinp = (or += when accumulate) dout @ weight[e]^T, dweight[e]
     * (K, M) += inp^T @ dout, dbias[e] += column sums of dout (each NULL: skipped). Optional (NULL:
     * a backend without them, which refuses gpt_oss). */
    void (*moe_matmul_io_forward)(mt_backend *be, void *out, const void *inp, const void *weight,
                                  const void *bias, const int32_t *offsets,
                                  const int32_t *offsets_host, int E, int K, int M);
    void (*moe_matmul_io_backward)(mt_backend *be, void *dinp, float *dweight, float *dbias,
                                   const void *dout, const void *inp, const void *weight,
                                   const int32_t *offsets, const int32_t *offsets_host, int E,
                                   int K, int M, int accumulate);

    /* LM head fused with cross-entropy, in chunks of rows so that (N, V) logits never exist:
     * logits = inp (N, C) @ weight (V, C)^T; losses[n] = logsumexp(logits[n]) - logits[n][targets[n]],
     * and 0 where targets[n] < 0 (ignored). When dinp is not NULL, also the backward of
     * loss_scale * sum(losses): dinp (N, C) = dlogits @ weight (=), dweight (V, C) += dlogits^T @ inp
     * (NULL: skipped, a frozen head), dlogits = loss_scale * (softmax(logits) - onehot(target)),
     * zero rows where ignored. */
    void (*lm_head_loss)(mt_backend *be, float *losses, void *dinp, float *dweight, const void *inp,
                         const void *weight, const int32_t *targets, int N, int C, int V,
                         float loss_scale);
    /* The same with the logits soft-capped first (Gemma 4's final_logit_softcapping, cap > 0):
     * logits = cap * tanh((inp @ weight^T) / cap), the backward through the cap (dlogits times
     * 1 - tanh^2). Optional (NULL: a backend without it). */
    void (*lm_head_loss_softcap)(mt_backend *be, float *losses, void *dinp, float *dweight,
                                 const void *inp, const void *weight, const int32_t *targets, int N,
                                 int C, int V, float loss_scale, float cap);
};

/* moe_matmul_forward / moe_matmul_backward as one be->matmul_forward / matmul_backward per expert
 * with rows (moe_loop.c): the cpu backend's ops, and the cuda backend's when it loops. */
void mt_backend_moe_matmul_loop_forward(mt_backend *be, void *out, const void *inp,
                                        const void *weight, size_t w_stride,
                                        const int32_t *offsets, const int32_t *offsets_host, int E,
                                        int K, int M);
void mt_backend_moe_matmul_loop_backward(mt_backend *be, void *dinp, float *dweight,
                                         const void *dout, const void *inp, const void *weight,
                                         size_t w_stride, const int32_t *offsets,
                                         const int32_t *offsets_host, int E, int K, int M,
                                         int accumulate);

/* Tokens per chunk of the gated delta rule (gated_delta_forward's chunk_states). */
#define MT_GATED_DELTA_CHUNK 64

/* FLOPs of gated_delta_forward and _backward as the chunked form executes them (gated_delta_flops.c
 * has the count per chunk): every product counted 2 per multiply-add over full (L, L) blocks, the
 * masks' zeros included; elementwise work not counted. Documents do not change it. */
void mt_gated_delta_flops(int B, int T, int Hv, int Dk, int Dv, double *fwd, double *bwd);

/* The fp32 CPU reference backend (BLAS matmuls, OpenMP). */
mt_backend *mt_backend_cpu_create(void);

/* The CUDA backend (bf16 compute, cuBLASLt matmuls) on the current device; only in builds with
 * MT_HAVE_CUDA. mem_budget_bytes caps what be->alloc hands out, scratch and the cuBLASLt workspace
 * included (--gpu-mem; 0 = the device's free memory); going past it is a fatal error that says so. */
mt_backend *mt_backend_cuda_create(int64_t mem_budget_bytes);
/* 1 when a CUDA device is usable (0 in builds without CUDA support is the caller's #ifdef). */
int mt_backend_cuda_available(void);
/* The CUDA devices this process sees (CUDA_VISIBLE_DEVICES applied); 0 when none. The backend
 * takes the current one: cudaSetDevice before mt_backend_cuda_create picks a rank's GPU. */
int mt_backend_cuda_device_count(void);
/* The CUDA backend's be->memory, in every build and without a GPU (megatrain plan --device cuda
 * plans for a GPU it does not have). */
mt_backend_memory mt_backend_cuda_memory(void);

#ifdef __cplusplus
}
#endif

#endif
