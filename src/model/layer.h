/* One decoder layer as a stateless template: forward and hand-written backward of
 *   h   = x + o_proj(attention(rope(qk_norm(q_proj(n1))), rope(qk_norm(k_proj(n1))), v_proj(n1)))
 *   out = h + down_proj(silu(gate_proj(n2)) * up_proj(n2)),  n1 = rmsnorm(x), n2 = rmsnorm(h)
 * (in an MoE layer, out = h + moe(n2): model/moe.h)
 * for whatever layer's weights the caller points at. Nothing about a layer is kept between calls
 * except what the caller passes in: the backward recomputes the internals from the saved layer
 * input alone (activation checkpointing), which is what the streaming engine relies on.
 */
#ifndef MT_LAYER_H
#define MT_LAYER_H

#include <stdint.h>

#include "../backend/backend.h"
#include "config.h"
#include "params.h"

typedef struct mt_moe_stats mt_moe_stats; /* model/moe.h */

/* The gated delta rule's chunk states (B, Hv, chunks, Dk, Dv) fp32 on the compute side, which the
 * forward writes and the backward reads: one buffer for every copy of a workspace (a copy with
 * saved fields shares it), taken on the first call that needs more (its size depends on B and T,
 * not on N alone). */
/* The Gated DeltaNet mixer's fp32 states on the compute side (model/mixer_deltanet.c), each grown
 * on demand: the delta rule's chunk states of a call (or span), and for a tiled layer the state
 * entering each span after a row's first, the state's gradient between spans (two), and the
 * conv's context-row gradients between spans (K-1 rows of the compute dtype). */
typedef struct mt_lin_states {
    float *p;
    size_t bytes;
    float *spans, *dstates;
    size_t span_bytes, dstate_bytes;
    void *conv_tail;
    size_t conv_tail_bytes;
} mt_lin_states;

/* What every layer call shares. inv_freq (D/2 fp32) lives on the compute side. */
typedef struct {
    const mt_config *cfg;
    mt_backend *be;
    const float *inv_freq;
} mt_layer_ctx;

/* Where the N = B*T tokens of one micro-batch sit: RoPE positions (N) and, for packed rows, the
 * position of each token's document start inside its row (N) or NULL. Both on the compute side. */
typedef struct {
    int B, T;
    const int32_t *pos;
    const int32_t *doc_start;
} mt_tokens;

/* Weights of one layer in the compute dtype, or the fp32 gradients of one layer. */
typedef mt_layer_view mt_layer_weights;

/* Working activations for one layer and up to max_N tokens (compute dtype unless noted).
 *
 * Tiling: with 0 < mlp_chunk < N, a call over N tokens runs every per-token op over chunks of at
 * most mlp_chunk tokens, in token order: in the attention half the input norm, the q/k/v
 * projections (biases, qwen3's q/k norm, RoPE at each token's own position), the o projection and
 * the residual add; in the MLP half the post-attention norm, gate/up, SwiGLU, down and its add.
 * (The knob kept the MLP's name of the first step; it tiles both halves.) Only the attention sees
 * all N tokens at once, so its inputs and outputs (q, k, v, att, lse, their gradients d_att, dq,
 * dk, dv) and h, the MLP's input, stay (N, .); a Gated DeltaNet mixer runs each row in spans of
 * the chunk (at least 64 tokens), its state carried between them, so all its fields (lin_*) hold
 * one span and the conv's K-1 context rows (model/mixer_deltanet.c); the fields marked "chunk
 * rows" hold one chunk:
 * min(mlp_chunk, max_N) rows instead of max_N. The backward then remakes each chunk's xn1 (and
 * qwen3's q_raw, k_raw and their rstd) from inp and each chunk's hn, gate, up and act from h
 * before their gradients, whatever `recompute` says (it still governs q, k, v, att, lse and h).
 * Weight gradients accumulate chunk by chunk in token order. Deterministic for a given chunk, but
 * not the untiled call's bits: the weight gradients' fp32 sums over tokens are grouped by chunk,
 * and a GEMM over fewer rows may sum a row's K products in another order (OpenBLAS's edge kernels;
 * cuBLASLt picks kernels by shape): a few ulp apart (tests/test_layer_tiling.c). mlp_chunk 0 (or
 * >= N) is the untiled call, the same ops in the same order as before tiling existed.
 *
 * The gradient of h has no field: the backward keeps it in dinp's rows until the input norm's
 * gradient is added onto it. */
typedef struct {
    int max_N;
    int mlp_chunk;      /* tokens per chunk, both halves; 0 = untiled */
    void *xn1;          /* (N, C)   rmsnorm(x)              chunk rows */
    void *q_raw, *k_raw;/* (N, H*D), (N, G*D) before the q/k norm (qwen3 only); chunk rows */
    void *q, *k, *v;    /* (N, H*D), (N, G*D), (N, G*D) after norm and rope */
    void *att;          /* (N, H*D) attention output */
    void *h;            /* (N, C)   residual after attention */
    void *hn;           /* (N, C)   rmsnorm(h)              chunk rows */
    void *gate, *up;    /* (N, F)                           chunk rows */
    void *act;          /* (N, F)   silu(gate) * up         chunk rows */
    float *rstd1, *rstd2;         /* (N)                    chunk rows */
    float *q_rstd, *k_rstd;       /* (N*H), (N*G) qwen3 only; chunk rows */
    void *v_raw, *dv_raw;         /* (N, G*D) gemma4's values before their norm (v_proj's output;
                                     unused where keys are values) and its gradient; chunk rows */
    float *v_rstd;                /* (N*G) their norm's statistics; chunk rows */
    float *lse;                   /* (B, H, T) */
    /* backward scratch */
    void *d_act, *d_gate, *d_up;  /* (N, F)                 chunk rows */
    void *d_hn, *d_xn1;           /* (N, C)                 chunk rows */
    void *d_att, *dq, *dq_raw;    /* (N, H*D); dq_raw: chunk rows */
    void *dk, *dv, *dk_raw;       /* (N, G*D); dk_raw: chunk rows */
    /* qwen3_5's output gate (attn_gate): q_proj's output, the gate heads and their gradient, the
     * gated attention output o_proj reads */
    void *q_gate, *d_q_gate;      /* (N, 2*H*D)             chunk rows */
    void *gate_att, *d_gate_att;  /* (N, H*D) */
    void *att_g;                  /* (N, H*D)               chunk rows */
    /* gemma3's sandwich norms: each branch's output before its norm and the norm's statistics,
     * which the norms' backward reads; saved, the MLP's (chunk rows) only when untiled: a tiled
     * backward remakes them with the chunk's gate and up (one more matmul, down's) */
    void *attn_o;                 /* (N, C)   o_proj's output */
    float *rstd_ao;               /* (N) */
    void *mlp_y;                  /* (N, C)   down_proj's output   chunk rows */
    float *rstd_mo;               /* (N)                           chunk rows */
    /* Mixture of experts (model/moe.h), in models with experts; chunk rows of n tokens, n*k
     * grouped rows (k experts per token), none saved (an MoE layer's backward remakes its block
     * from hn whatever `recompute` says, except MT_RECOMPUTE_NONE untiled). */
    void *moe_logits, *moe_d_logits; /* (n, E) */
    float *moe_probs;                /* (n, E) */
    int32_t *moe_idx;                /* (n, k) chosen experts */
    float *moe_w, *moe_dw;           /* (n, k) their gates and the gates' gradient */
    int32_t *moe_perm, *moe_inv;     /* (n*k) grouped row -> assignment, assignment -> grouped row */
    void *moe_x, *moe_y;             /* (n*k, C) gathered inputs, expert outputs */
    void *moe_gate, *moe_up, *moe_act;            /* (n*k, Fe) */
    void *moe_d_y, *moe_d_x;                      /* (n*k, C) */
    void *moe_d_act, *moe_d_gate, *moe_d_up;      /* (n*k, Fe) */
    /* Gated DeltaNet mixers (model/mixer_deltanet.c), whole calls of N tokens (not tiled, none
     * saved: its backward remakes its forward unless MT_RECOMPUTE_NONE). KD = Hk*Dk, VD = Hv*Dv,
     * Ch = 2*KD + VD. */
    void *lin_xn, *lin_d_xn, *lin_d_x;          /* (N, C) the input norm, its gradient, scratch */
    float *lin_rstd1;                           /* (N) */
    void *lin_qkv_pre, *lin_qkv, *lin_d_qkv;    /* (N, Ch) in_proj_qkv, after the conv; gradient */
    void *lin_d_qkv_pre;                        /* (N, Ch) */
    void *lin_rest, *lin_d_rest;                /* (N, KD + VD) k and v before their split */
    void *lin_q_raw, *lin_k_raw, *lin_q, *lin_k; /* (N, KD) before and after the L2 norm */
    void *lin_dq, *lin_dk, *lin_dq_raw, *lin_dk_raw; /* (N, KD) */
    float *lin_rq, *lin_rk;                     /* (N, Hk) the L2 norms' inverses */
    void *lin_v, *lin_dv, *lin_z, *lin_d_z;     /* (N, VD) */
    void *lin_o, *lin_on, *lin_d_o, *lin_d_on;  /* (N, VD) the rule's output, gated-normed */
    float *lin_rstd;                            /* (N, Hv) the gated norm's */
    void *lin_a, *lin_b, *lin_da, *lin_db;      /* (N, Hv) */
    float *lin_g, *lin_beta, *lin_dg, *lin_dbeta; /* (N, Hv) */
    mt_lin_states *lin_states;                  /* the delta rule's chunk states: shared by every
                                                   copy of ws, as moe_stats */
    void *shared_y, *shared_g;       /* (n, C) the shared expert's output, then gated (qwen3_5_moe) */
    void *shared_logit, *d_shared_logit; /* (n, 1) its gate's logit and the logit's gradient */
    /* Gemma 4's MoE block beside the dense MLP (model/moe_gemma4.c; chunk rows, none saved): down's
     * output y1 and the experts' y2 before their norms (mlp_y then holds their normed sum, the
     * post-feedforward norm's input), y2 normed, the router's input rx and the experts' x2, their
     * norms' statistics; the gates times per_expert_scale and that product's gradient; the gate
     * half of the experts' fused gate_up (moe_up holds the up half) and its gradient; scratch */
    void *g4_y1, *g4_y2, *g4_y2n, *g4_rx, *g4_x2, *g4_d1, *g4_d2, *g4_d3; /* (n, C) */
    float *g4_rstd1, *g4_rstd2, *g4_rstd_rx, *g4_rstd_x2;                 /* (n) */
    float *g4_w, *g4_dw;                                                   /* (n, k) */
    void *g4_gate, *g4_d_gate;                                             /* (n*k, Fe) */
    int32_t *moe_offsets;            /* (E + 1) compute side: each expert's first grouped row */
    int32_t *moe_offsets_host;       /* (E + 1) host copy the per-expert GEMMs are sized from */
    mt_moe_stats *moe_stats;         /* the step's router statistics, shared by every copy of ws */
    /* LoRA (cfg->lora_rank > 0): scale * x A^T of the adapter being applied, and its gradient;
     * (N, rank), remade per projection in the backward (model/linear.h) */
    void *lora_u, *lora_du;
    /* LoRA on gpt-oss's experts: scale * x A_e^T over the grouped rows and its gradient, (n*k, rank),
     * remade in the backward (model/moe.c) */
    void *lora_moe_u, *lora_moe_du;
} mt_layer_ws;

/* The untiled workspace (mlp_chunk 0), and one whose chunk rows hold mlp_chunk (>= 0) tokens. */
void mt_layer_ws_init(mt_layer_ws *ws, const mt_layer_ctx *lc, int max_N);
void mt_layer_ws_init_tiled(mt_layer_ws *ws, const mt_layer_ctx *lc, int max_N, int mlp_chunk);
void mt_layer_ws_free(mt_layer_ws *ws, const mt_layer_ctx *lc);
/* Bytes mt_layer_ws_init (_tiled) allocates on the compute side for max_N tokens. */
size_t mt_layer_ws_bytes(const mt_config *cfg, mt_dtype dtype, int max_N);
size_t mt_layer_ws_bytes_tiled(const mt_config *cfg, mt_dtype dtype, int max_N, int mlp_chunk);
/* The same for calls of B rows of T tokens (what the engine makes): the Gated DeltaNet's chunk
 * states, taken at the first call, counted as that call takes them (B x ceil(T / 64) of them), not
 * bounded over any row length as above (2 x ceil(N / 64): 6 GiB too many for the Qwen3.5-27B
 * shape at 128k). */
size_t mt_layer_ws_bytes_rows(const mt_config *cfg, mt_dtype dtype, int B, int T, int mlp_chunk);

/* Saved internals: the fields of mt_layer_ws that cost a matmul or the attention to remake (q, k,
 * v, att, h, gate, up, lse, qwen3's q_raw, k_raw, q_rstd, k_rstd, gemma4's v_raw, v_rstd,
 * gemma3's attn_o, mlp_y and their rstd). A layer whose forward wrote
 * them into buffers of its own skips the recompute in its backward (MT_RECOMPUTE_CHEAP): only
 * xn1, hn (and their rstd) and act are remade, by elementwise kernels, bit for bit as the forward
 * made them. Tiled (0 < mlp_chunk < N), the chunk-row fields among them (gate, up, and qwen3's
 * q_raw, k_raw, q_rstd, k_rstd) are not saved: they exist one chunk at a time, and the backward
 * remakes each chunk's (two matmuls a chunk for gate and up, two for q_raw and k_raw); q, k, v,
 * att, lse and h, whose remaking costs the attention's O(T^2), are still saved. Bytes for N
 * tokens: */
size_t mt_layer_saved_bytes(const mt_config *cfg, mt_dtype dtype, int N);
size_t mt_layer_saved_bytes_tiled(const mt_config *cfg, mt_dtype dtype, int N, int mlp_chunk);
/* A copy of ws whose saved fields point into `base` (mt_layer_saved_bytes_tiled(cfg, dtype, N,
 * ws->mlp_chunk) bytes on the compute side); the other fields stay ws's (shared scratch). */
mt_layer_ws mt_layer_ws_with_saved(const mt_layer_ws *ws, const mt_config *cfg, mt_dtype dtype,
                                   int N, void *base);

/* Saved attention: only the attention's output and statistics (att, lse), kept per layer where
 * its whole internals cost too much memory. Its backward remakes everything else from the layer
 * input (MT_RECOMPUTE_KEEP_ATTENTION), the projections' O(N) work, but not the attention's
 * O(N*T): at long context nearly all of a recompute's time for a few percent of its bytes
 * (planner.c weighs the two kinds of save). Bytes for N tokens, and a copy of ws whose att and
 * lse point into `base` (that many bytes on the compute side): */
size_t mt_layer_attention_saved_bytes(const mt_config *cfg, mt_dtype dtype, int N);
mt_layer_ws mt_layer_ws_with_saved_attention(const mt_layer_ws *ws, const mt_config *cfg,
                                             mt_dtype dtype, int N, void *base);

typedef enum {
    MT_RECOMPUTE_NONE = 0,  /* ws still holds this forward's internals (nothing ran in between) */
    MT_RECOMPUTE_ALL = 1,   /* remake every internal from the layer input */
    MT_RECOMPUTE_CHEAP = 2, /* ws's saved fields hold this forward's: remake xn1, hn, act only */
    MT_RECOMPUTE_KEEP_ATTENTION = 3, /* ws's att and lse hold this forward's: remake the rest */
} mt_recompute;

/* MT_OK when every layer's mixer and MLP can run; MT_ERR naming the first that cannot. */
int mt_layer_check_runnable(const mt_config *cfg);
/* MT_OK when backend `be` has the ops of every layer's mixer (the Gated DeltaNet's: the CPU
 * backend only, today); MT_ERR naming the backend and what to use instead. */
int mt_layer_backend_check(const mt_config *cfg, const mt_backend *be);

/* out (N, C) = layer(inp (N, C)); out may alias inp. Leaves the internals in ws. */
void mt_layer_forward(const mt_layer_ctx *lc, const mt_tokens *tok, const mt_layer_weights *w,
                      const void *inp, void *out, mt_layer_ws *ws);

/* Backward from the gradient of the layer output dout (N, C): dinp (N, C) is written (it may
 * alias dout), the fp32 gradients in `grads` accumulate (+=). `recompute` says what of the
 * forward's internals must be remade from inp first (see mt_recompute). */
void mt_layer_backward(const mt_layer_ctx *lc, const mt_tokens *tok, const mt_layer_weights *w,
                       const mt_layer_weights *grads, const void *inp, const void *dout, void *dinp,
                       mt_layer_ws *ws, mt_recompute recompute);

#endif
