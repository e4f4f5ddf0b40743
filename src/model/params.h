/* The parameter table: every tensor of the model, its Hugging Face name, shape and place.
 *
 * Weights live in one arena of elements laid out group by group:
 *   [embed][layer 0][layer 1]...[layer L-1][head]
 * The embed group holds model.embed_tokens.weight; the head group holds model.norm.weight and,
 * when untied, lm_head.weight. Each layer group has the same layout, so a layer's tensors are
 * found from the layer's base pointer and per-layer offsets alone (any layer in any slot).
 * Offsets are in elements (the same for an fp32 master arena and a bf16 upload arena) and
 * aligned to MT_PARAM_ALIGN elements: vectorized access, and the 256-value blocks of the 8-bit
 * optimizer states (optim/state.h: a block never spans two tensors).
 * Everything that walks parameters (I/O, init, optimizer, checksums) walks this table.
 */
#ifndef MT_PARAMS_H
#define MT_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

#define MT_PARAM_ALIGN 256
#define MT_GROUP_EMBED (-1) /* layer index of the embed group; the head group is L */

typedef enum {
    /* per layer */
    MT_W_INPUT_NORM = 0, /* (C)       input_layernorm.weight */
    MT_W_Q,              /* (H*D, C)  self_attn.q_proj.weight */
    MT_W_Q_BIAS,         /* (H*D)     self_attn.q_proj.bias */
    MT_W_K,              /* (G*D, C) */
    MT_W_K_BIAS,         /* (G*D) */
    MT_W_V,              /* (G*D, C) */
    MT_W_V_BIAS,         /* (G*D) */
    MT_W_O,              /* (C, H*D)  self_attn.o_proj.weight */
    MT_W_O_BIAS,         /* (C) */
    MT_W_Q_NORM,         /* (D)       self_attn.q_norm.weight (qwen3) */
    MT_W_K_NORM,         /* (D)       self_attn.k_norm.weight (qwen3) */
    MT_W_POST_NORM,      /* (C)       post_attention_layernorm.weight */
    MT_W_GATE,           /* (F, C)    mlp.gate_proj.weight */
    MT_W_GATE_BIAS,      /* (F) */
    MT_W_UP,             /* (F, C)    mlp.up_proj.weight */
    MT_W_UP_BIAS,        /* (F) */
    MT_W_DOWN,           /* (C, F)    mlp.down_proj.weight */
    MT_W_DOWN_BIAS,      /* (C) */
    /* MoE layers, in place of gate/up/down; names per model_type (mixtral's block_sparse_moe.gate,
     * experts.{e}.w1/w3/w2; qwen3_moe's mlp.gate, mlp.experts.{e}.gate_proj/up_proj/down_proj) */
    MT_W_ROUTER,         /* (E, C)    the router (gate) */
    MT_W_EXP_GATE,       /* (Fe, C)   one per expert, E of them back to back */
    MT_W_EXP_UP,         /* (Fe, C) */
    MT_W_EXP_DOWN,       /* (C, Fe) */
    /* Gated DeltaNet mixers (qwen3_5 linear_attention layers), in place of q/k/v/o and their
     * norms; Ch = 2*Hk*Dk + Hv*Dv, the convolved q, k, v channels */
    MT_W_LIN_QKV,        /* (Ch, C)      linear_attn.in_proj_qkv.weight */
    MT_W_LIN_Z,          /* (Hv*Dv, C)   linear_attn.in_proj_z.weight (the output gate) */
    MT_W_LIN_B,          /* (Hv, C)      linear_attn.in_proj_b.weight (beta) */
    MT_W_LIN_A,          /* (Hv, C)      linear_attn.in_proj_a.weight (the decay's input) */
    MT_W_LIN_CONV,       /* (Ch, 1, K)   linear_attn.conv1d.weight (depthwise, causal) */
    MT_W_LIN_DT_BIAS,    /* (Hv)         linear_attn.dt_bias */
    MT_W_LIN_A_LOG,      /* (Hv)         linear_attn.A_log */
    MT_W_LIN_NORM,       /* (Dv)         linear_attn.norm.weight (gated RMSNorm, plain w) */
    MT_W_LIN_OUT,        /* (C, Hv*Dv)   linear_attn.out_proj.weight */
    /* qwen3_5_moe's shared expert is gate/up/down of width F named mlp.shared_expert.*; its gate: */
    MT_W_SHARED_GATE,    /* (1, C)       mlp.shared_expert_gate.weight */
    /* gpt-oss: the attention's sinks, the router's bias, and the experts as the checkpoint fuses
     * them, [E, in, out] (used as x @ W[e]), gate and up columns interleaved (gate 2j, up 2j+1) */
    MT_W_SINKS,          /* (H)          self_attn.sinks */
    MT_W_ROUTER_BIAS,    /* (E)          mlp.router.bias */
    MT_W_EXP_GATE_UP,    /* (E, C, 2Fe)  mlp.experts.gate_up_proj */
    MT_W_EXP_GATE_UP_BIAS, /* (E, 2Fe)   mlp.experts.gate_up_proj_bias */
    MT_W_EXP_DOWN_IO,    /* (E, Fe, C)   mlp.experts.down_proj */
    MT_W_EXP_DOWN_BIAS,  /* (E, C)       mlp.experts.down_proj_bias */
    /* Gemma 3's sandwich norms: each branch's output normed before its residual add. There
     * MT_W_POST_NORM (the MLP's input norm) is named pre_feedforward_layernorm.weight and the
     * attention output's norm takes the name post_attention_layernorm.weight. */
    MT_W_ATTN_OUT_NORM,  /* (C)          post_attention_layernorm.weight (gemma3) */
    MT_W_MLP_OUT_NORM,   /* (C)          post_feedforward_layernorm.weight */
    /* Gemma 4: the layer's output scale, a buffer transformers loads and saves but never trains
     * (its gradient stays 0; as a 1-D tensor it takes no weight decay, so AdamW leaves it be) */
    MT_W_LAYER_SCALAR,   /* (1)          layer_scalar */
    /* Gemma 4's MoE block beside the dense MLP (model/moe_gemma4.c): MT_W_ROUTER is
     * router.proj.weight there, and the experts are fused [E, out, in] as nn.Linear weights */
    MT_W_ROUTER_SCALE,   /* (C)          router.scale */
    MT_W_EXPERT_SCALE,   /* (E)          router.per_expert_scale */
    MT_W_EXP_GATE_UP_OI, /* (E, 2Fe, C)  experts.gate_up_proj (gate rows, then up rows) */
    MT_W_EXP_DOWN_OI,    /* (E, C, Fe)   experts.down_proj */
    MT_W_PRE_NORM_2,     /* (C)          pre_feedforward_layernorm_2.weight (the experts' input) */
    MT_W_MLP_OUT_NORM_1, /* (C)          post_feedforward_layernorm_1.weight (the dense MLP's output) */
    MT_W_MLP_OUT_NORM_2, /* (C)          post_feedforward_layernorm_2.weight (the experts' output) */
    MT_LAYER_KINDS,
    /* model-level */
    MT_W_EMBED = MT_LAYER_KINDS, /* (V, C) model.embed_tokens.weight */
    MT_W_FINAL_NORM,             /* (C)    model.norm.weight */
    MT_W_LM_HEAD,                /* (V, C) lm_head.weight (untied only) */
    MT_PARAM_KINDS,
} mt_param_kind;

/* A layer's type: its token mixer, whether its MLP is the experts, and whether its attention has
 * the full layers' own shape (Gemma 4: their head dim and kv heads, no v_proj with k = v). Layers
 * of different types hold different tensors; a layer group is as large as the largest type any
 * layer has. */
#define MT_LAYER_TYPES 8
/* 4 * (Gemma 4 full layer) + 2 * (mixer is a DeltaNet) + (MLP is MoE) */
int mt_layer_type_of(const mt_config *cfg, int l);

typedef struct {
    char name[96];       /* Hugging Face tensor name */
    mt_param_kind kind;
    int layer;           /* MT_GROUP_EMBED, 0..L-1, or L for the head group */
    int expert;          /* 0..E-1 for an expert's tensor, -1 otherwise */
    int ndim;            /* 1, 2, or 3 (a convolution's (channels, 1, kernel)) */
    int64_t shape[3];
    int64_t numel;
    int64_t offset;      /* element offset in the whole arena */
    int64_t group_offset;/* element offset inside its group (for layers: the per-layer offset) */
} mt_param;

typedef struct {
    mt_config cfg;
    mt_param *params;    /* in arena order */
    int n_params;
    int64_t total;       /* elements in the arena (padding included) */
    int64_t n_real;      /* parameters (padding excluded) */
    int64_t embed_offset, embed_size;  /* group extents, in elements */
    int64_t layer_offset0, layer_size; /* layer l starts at layer_offset0 + l * layer_size */
    int64_t head_offset, head_size;
    /* offset of each kind inside a layer group of each type (mt_layer_type_of), -1 when absent;
     * for the expert kinds, expert 0's tensor (expert e's is expert_stride elements further) */
    int64_t kind_offset[MT_LAYER_TYPES][MT_LAYER_KINDS];
    int64_t expert_stride;
    int *layer_first;    /* (L + 1) index in params of each layer's first tensor; [L]: the head's */
    const struct mt_hf_source *hf; /* how the checkpoint it came from lays tensors out and what it
                                      carries (io/hf_layout.h); NULL: none. Not owned: the host
                                      model holds it */
} mt_param_table;

void mt_param_table_init(mt_param_table *t, const mt_config *cfg);
void mt_param_table_free(mt_param_table *t);

/* Looks up a tensor by Hugging Face name; NULL when the model has no such tensor. */
const mt_param *mt_param_find(const mt_param_table *t, const char *name);

/* Element offset of a group's start: layer -1 embed, 0..L-1 layers, L head. */
int64_t mt_group_offset(const mt_param_table *t, int layer);
int64_t mt_group_size(const mt_param_table *t, int layer);
/* The largest group's size (embed, a layer or head). */
int64_t mt_group_max_size(const mt_param_table *t);

/* Pointers to one layer's tensors inside a layer block whose elements are `elem_size` bytes.
 * Absent tensors (biases, q/k norms; gate/up/down in an MoE layer, router and experts in a dense
 * one) are NULL. */
typedef struct {
    void *input_norm, *q, *q_bias, *k, *k_bias, *v, *v_bias, *o, *o_bias;
    void *q_norm, *k_norm, *post_norm;
    void *attn_out_norm, *mlp_out_norm; /* gemma3's norms of the branch outputs, else NULL */
    void *gate, *gate_bias, *up, *up_bias, *down, *down_bias;
    void *router;                    /* non-NULL: an MoE layer (with a shared expert: gate, up,
                                        down are the shared expert's, shared_gate its gate) */
    void *shared_gate;
    /* a Gated DeltaNet mixer in place of q..o (model/config.h mt_mixer) */
    void *lin_qkv, *lin_z, *lin_b, *lin_a, *lin_conv, *lin_dt_bias, *lin_a_log, *lin_norm, *lin_out;
    void *exp_gate, *exp_up, *exp_down; /* expert 0's; expert e's is e * exp_stride bytes further */
    size_t exp_stride;
    /* gpt-oss: the sinks, the router's bias and the fused [E, in, out] experts with their biases */
    void *sinks, *router_bias, *exp_gate_up, *exp_gate_up_bias, *exp_down_io, *exp_down_bias;
    int window; /* the layer's attention window (mt_config_layer_window; 0: none); not a tensor */
    int rope_set; /* the RoPE table it rotates with (mt_config_layer_rope_set); not a tensor */
    /* its attention's shape (mt_config_layer_head_dim, _kv_heads, _rotary_dim; 0: the config's D,
     * G and rotary dim); not tensors. A layer without v (v NULL) takes its values from k_proj */
    int head_dim, kv_heads, rotary_dim;
    void *layer_scalar; /* (1) gemma4's output scale, NULL elsewhere; its gradient is never written */
    /* gemma4's MoE block (router is router.proj there): NULL elsewhere */
    void *router_scale, *expert_scale, *exp_gate_up_oi, *exp_down_oi;
    void *pre_norm_2, *mlp_out_norm_1, *mlp_out_norm_2;
    /* the layer's LoRA adapters (model/lora.h; their weights, or their fp32 gradients in a
     * gradient view), NULL: none. Set by the caller; mt_layer_view_at leaves it NULL */
    const struct mt_lora_view *lora;
} mt_layer_view;

/* Layer l's view (its type decides the layout; mixer and mlp say what it holds). */
mt_layer_view mt_layer_view_at(const mt_param_table *t, int l, void *layer_base, size_t elem_size);
/* The same for a model whose layers are all of one type (fatal otherwise: use _at). */
mt_layer_view mt_layer_view_of(const mt_param_table *t, void *layer_base, size_t elem_size);

/* Pointers to the embed and head tensors in a whole arena (lm_head == embed when tied). */
typedef struct {
    void *embed, *final_norm, *lm_head;
} mt_model_view;

mt_model_view mt_model_view_of(const mt_param_table *t, void *arena_base, size_t elem_size);

/* Random init as the contract says: normal(0, std) for matrices and embeddings, residual
 * projections (o_proj, down_proj) scaled by 1/sqrt(2 L), norms 1, biases 0. Padding is zeroed.
 * Deterministic in `seed`. */
void mt_param_init(const mt_param_table *t, float *arena, float std, uint64_t seed);
/* The same for tensor i alone into x (its numel floats): mt_param_init's values, one tensor at a
 * time (a model too big for one fp32 arena). */
void mt_param_init_tensor(const mt_param_table *t, int i, float *x, float std, uint64_t seed);

#endif
