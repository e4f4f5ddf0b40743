/* Model configuration: what a Hugging Face config.json says about a Llama-family decoder.
 *
 * Letters used across the code base: B batch, T time, C channels (hidden), H query heads,
 * G kv heads, D head dim, F MLP width, V vocab, L layers, N = B*T tokens; for mixtures of
 * experts E experts, k experts per token, Fe an expert's MLP width.
 */
#ifndef MT_CONFIG_H
#define MT_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define MT_CONFIG_MAX_LAYERS (1 << 14)
#define MT_CONFIG_LAYER_BITS (MT_CONFIG_MAX_LAYERS / 8)

typedef enum {
    MT_ARCH_LLAMA = 0,
    MT_ARCH_MISTRAL = 1,
    MT_ARCH_QWEN2 = 2,
    MT_ARCH_QWEN3 = 3,
    MT_ARCH_MIXTRAL = 4,   /* mixture of experts: every layer's MLP is E experts, top-k routed */
    MT_ARCH_QWEN3_MOE = 5, /* qwen3 attention (q/k norm) + experts; dense layers among them */
    MT_ARCH_QWEN3_5 = 6,   /* hybrid: Gated DeltaNet and gated-attention layers, (1 + w) norms */
    MT_ARCH_QWEN3_5_MOE = 7, /* the same with experts and a gated shared expert in every layer */
    MT_ARCH_GPT_OSS = 8,   /* sliding/full attention with sinks, YaRN, biased experts with the
                              clamped SwiGLU in every layer (config_gpt_oss.c) */
    MT_ARCH_GEMMA3 = 9,    /* Gemma 3 text: sliding/full attention with their own RoPE, sandwich
                              norms, GeGLU, a scaled embedding (config_gemma3.c) */
    MT_ARCH_GEMMA4 = 10,   /* Gemma 4 text: Gemma 3's layer with plain-w norms, v-norm, full layers
                              of their own head dim and kv heads (keys = values there), a per-layer
                              scalar, final logit soft-capping (config_gemma4.c) */
} mt_arch;

/* A dense MLP's activation: down(act(gate x) * up x). */
typedef enum {
    MT_MLP_SWIGLU = 0,    /* silu(gate) * up */
    MT_MLP_GEGLU = 1,     /* gelu_tanh(gate) * up (Gemma's gelu_pytorch_tanh) */
} mt_mlp_act;

/* A layer's token mixer, chosen per layer from the config (layer_types). */
typedef enum {
    MT_MIXER_ATTENTION = 0,       /* softmax attention over the row (full_attention) */
    MT_MIXER_GATED_DELTANET = 1,  /* the gated delta rule (qwen3_5's linear_attention) */
} mt_mixer;

typedef enum {
    MT_ROPE_DEFAULT = 0,
    MT_ROPE_LLAMA3 = 1,
    MT_ROPE_YARN = 2,     /* gpt-oss: rope_factor, rope_original_max_pos, beta_fast/slow, truncate */
    MT_ROPE_LINEAR = 3,   /* positions / rope_factor (Gemma 3's full layers) */
    MT_ROPE_PROPORTIONAL = 4, /* Gemma 4's full layers: the first rope_partial of a head's D/2
                                 frequencies 1/theta^(2i/D) / rope_factor, the rest 0 (unrotated) */
} mt_rope_type;

typedef struct {
    mt_arch arch;
    char model_type[24];      /* as written in config.json: "llama", "mistral", "qwen2", "qwen3",
                                 "mixtral", "qwen3_moe", "qwen3_5", "qwen3_5_text", "qwen3_5_moe",
                                 "qwen3_5_moe_text" */
    int nested;               /* the model's fields sit in config.json's text_config (a multimodal
                                 checkpoint: ...ForConditionalGeneration) */
    int C;                    /* hidden_size */
    int F;                    /* intermediate_size */
    int L;                    /* num_hidden_layers */
    int H;                    /* num_attention_heads */
    int G;                    /* num_key_value_heads (defaults to H) */
    int D;                    /* head_dim (defaults to C / H) */
    int V;                    /* vocab_size */
    float rms_norm_eps;
    double rope_theta;
    mt_rope_type rope_type;
    /* llama3 rope scaling (rope_type == MT_ROPE_LLAMA3) */
    double rope_factor;
    double rope_low_freq_factor;
    double rope_high_freq_factor;
    int rope_original_max_pos;
    /* YaRN (rope_type == MT_ROPE_YARN; factor and original_max_position_embeddings above) */
    double rope_beta_fast, rope_beta_slow;
    int rope_truncate;        /* the correction range floored / ceiled */
    int max_position_embeddings;
    int tie_word_embeddings;
    int qkv_bias;             /* q/k/v projections carry a bias (qwen2 always; llama/qwen3 attention_bias) */
    int o_bias;               /* o_proj carries a bias (llama/qwen3 attention_bias) */
    int mlp_bias;             /* gate/up/down carry biases (llama mlp_bias) */
    int qk_norm;              /* per-head RMSNorm of q and k before RoPE (qwen3) */
    int sliding_window;       /* 0 = none; else sequences longer than this are refused */
    float initializer_range;
    int bos_token_id;         /* -1 when absent */
    int eos_token_id;         /* -1 when absent; the first one when config.json gives a list */
    /* Mixture of experts (mixtral, qwen3_moe); n_experts 0: a dense model. A layer is an MoE layer
     * when mt_config_layer_is_moe says so; the others keep the dense MLP of width F. */
    int n_experts;            /* E: num_local_experts (mixtral) / num_experts (qwen3_moe) */
    int top_k;                /* k: num_experts_per_tok */
    int moe_F;                /* Fe: moe_intermediate_size (qwen3_moe); intermediate_size (mixtral) */
    int norm_topk_prob;       /* the top-k gates renormalised to sum 1 (mixtral: always) */
    int sparse_step;          /* decoder_sparse_step (qwen3_moe; 1 otherwise) */
    int router_aux;           /* output_router_logits: the load-balancing loss joins the training loss */
    float router_aux_coef;    /* router_aux_loss_coef */
    uint8_t mlp_only[MT_CONFIG_LAYER_BITS]; /* bit l set: layer l is dense (qwen3_moe mlp_only_layers) */
    /* qwen3_5: a shared expert of width F (no intermediate_size of its own: F is
     * shared_expert_intermediate_size) beside the routed experts, scaled by sigmoid(x . w_g) */
    int shared_expert;
    /* qwen3_5's norms and attention */
    int norm_offset;          /* RMSNorm multiplies by (1 + w), weights zero-initialised */
    int attn_gate;            /* q_proj yields, per head, D query values then D gate values: the
                                 attention output is multiplied by sigmoid(gate) before o_proj */
    int rotary_dim;           /* RoPE rotates the first rotary_dim dims of each head (D *
                                 partial_rotary_factor); 0 (or D): the whole head */
    /* Gated DeltaNet layers (qwen3_5 linear_attention): key heads Hk of width Dk (queries share
     * them), value heads Hv of width Dv (Hv a multiple of Hk), causal conv kernel K */
    int lin_Hk, lin_Hv, lin_Dk, lin_Dv, lin_K;
    uint8_t deltanet[MT_CONFIG_LAYER_BITS]; /* bit l set: layer l's mixer is a Gated DeltaNet */
    /* gpt-oss (config_gpt_oss.c): banded attention on the sliding layers, learned sinks, and the
     * experts' own form (fused [E, in, out] tensors with biases, the clamped SwiGLU) */
    int attn_window;          /* W: a sliding layer's query sees its W last keys, itself included */
    uint8_t sliding[MT_CONFIG_LAYER_BITS]; /* bit l set: layer l is a sliding_attention layer */
    int attn_sinks;           /* one learned sink logit per query head (self_attn.sinks) */
    double swiglu_alpha, swiglu_limit; /* the experts' clamped SwiGLU (config.json's values) */
    /* Gemma 3 (config_gemma3.c); zero elsewhere */
    mt_mlp_act mlp_act;       /* the dense MLP's activation */
    int query_pre_attn_scalar; /* > 0: the scores' scale is its ^-0.5 instead of D^-0.5 */
    double rope_local_theta;  /* > 0: the sliding layers' own RoPE (default type, this base); the
                                 rope_* fields above are then the full layers' */
    int sandwich_norm;        /* each branch's output is normed before its residual add
                                 (post_attention_layernorm, post_feedforward_layernorm) */
    int embed_scale;          /* the embedding output is multiplied by sqrt(C) (rounded to the
                                 compute dtype, as transformers' embed_scale buffer) */
    int pad_token_id;         /* -1 when absent */
    int embed_pad_no_grad;    /* the lookup adds no gradient to row pad_token_id (padding_idx) */
    /* Gemma 4 (config_gemma4.c, which also sets the Gemma 3 fields above); zero elsewhere */
    int global_D, global_G;   /* > 0: the full_attention layers' head dim and kv heads
                                 (global_head_dim, num_global_key_value_heads / per_layer_config) */
    int k_eq_v;               /* the full layers have no v_proj: values are k_proj's output, normed
                                 on their own (attention_k_eq_v) */
    int v_norm;               /* values RMS-normed per head, without a weight */
    double rope_partial;      /* MT_ROPE_PROPORTIONAL's share of rotated frequencies */
    double final_softcap;     /* > 0: logits = cap * tanh(logits / cap) (final_logit_softcapping) */
    int layer_scalar;         /* each layer's output times its layer_scalar (a checkpoint buffer,
                                 loaded and saved, never trained: its gradient stays 0) */
    int moe_beside_dense;     /* an MoE layer keeps its dense MLP of width F beside the experts, the
                                 router reading the residual (Gemma 4's enable_moe_block: moe.h) */
    /* Not the checkpoint's: set by the trainer when LoRA adapters of this rank train (model/lora.h;
     * 0: none), so that the layer's workspace and the planner count the adapters' scratch */
    int lora_rank;
    int lora_experts;         /* the trainer's too: the adapters include gpt-oss's experts */
} mt_config;

/* Layer l's token mixer (transformers' layer_types[l]). */
mt_mixer mt_config_layer_mixer(const mt_config *cfg, int l);
/* Number of layers whose mixer is `m`. */
int mt_config_mixer_layers(const mt_config *cfg, mt_mixer m);
/* Short name of a mixer for messages and `info` ("attention", "gated_deltanet"). */
const char *mt_mixer_name(mt_mixer m);

/* Layer l's attention geometry: head dim, kv heads, dims RoPE rotates (Gemma 4's full layers have
 * their own), and whether its values are k_proj's output (no v_proj). */
int mt_config_layer_head_dim(const mt_config *cfg, int l);
int mt_config_layer_kv_heads(const mt_config *cfg, int l);
int mt_config_layer_rotary_dim(const mt_config *cfg, int l);
int mt_config_layer_k_eq_v(const mt_config *cfg, int l);
/* The widest any layer has: head dim, H * head dim, kv heads, kv heads * head dim. */
int mt_config_max_head_dim(const mt_config *cfg);
int mt_config_max_kv_heads(const mt_config *cfg);
int mt_config_max_kv_width(const mt_config *cfg);

/* Layer l's attention window in keys (0: the whole causal row). */
int mt_config_layer_window(const mt_config *cfg, int l);
/* The factor RoPE multiplies cos and sin by (YaRN's attention scaling; 1 otherwise). */
double mt_config_rope_attention_scaling(const mt_config *cfg);

/* Whether layer l's MLP is the experts (transformers' rule: not in mlp_only_layers, E > 0, and
 * (l + 1) % decoder_sparse_step == 0). */
int mt_config_layer_is_moe(const mt_config *cfg, int l);
/* Number of MoE layers. */
int mt_config_moe_layers(const mt_config *cfg);

/* Parses config.json text; `path` names the file in error messages. Refuses by name every field
 * the runtime cannot honour. Returns MT_OK or MT_ERR (mt_error_message() says why). */
int mt_config_parse(mt_config *cfg, const char *json_text, const char *path);
int mt_config_load(mt_config *cfg, const char *path);

/* Writes a config.json that transformers loads as the same model (atomic: temp file + rename). */
int mt_config_save(const mt_config *cfg, const char *path);

/* Upper bounds of the shaping fields and of the parameter count (inclusive). With them every
 * tensor's element count and the arena's size fit in int64 with room to spare. */
#define MT_CONFIG_MAX_WIDTH (1 << 20)     /* hidden_size, intermediate_size, H * D */
#define MT_CONFIG_MAX_HEADS (1 << 14)
#define MT_CONFIG_MAX_HEAD_DIM (1 << 14)
#define MT_CONFIG_MAX_VOCAB (1 << 24)
#define MT_CONFIG_MAX_POSITIONS (1 << 28) /* max_position_embeddings */
#define MT_CONFIG_MAX_PARAMS (1LL << 40)
#define MT_CONFIG_MAX_EXPERTS 4096        /* num_experts (published: 512 at most) */

/* Checks the derived constraints (H % G == 0, D even, sizes > 0 and within the bounds above,
 * at most MT_CONFIG_MAX_PARAMS parameters); MT_ERR names the field. */
int mt_config_validate(const mt_config *cfg, const char *path);

/* The attention scores' scale: query_pre_attn_scalar^-0.5 (Gemma 3), else 0 (the op's 1/sqrt(D)). */
double mt_config_attn_scale(const mt_config *cfg);

/* Number of parameters of the whole model, and those one token computes with (the router and
 * its k experts instead of all E; = the total for a dense model): 6 * active * tokens is an MoE
 * step's matmul FLOPs as the anchors count them. */
int64_t mt_config_param_count(const mt_config *cfg);
int64_t mt_config_active_param_count(const mt_config *cfg);

/* What an RMSNorm adds to its weights (rmsnorm ops' w_offset): 1 for the (1 + w) norms, else 0. */
float mt_config_norm_offset(const mt_config *cfg);
/* Dims of each head RoPE rotates (rotary_dim, or D). */
int mt_config_rotary_dim(const mt_config *cfg);

/* RoPE inverse frequencies in fp32, computed as transformers does (llama3, linear, YaRN,
 * proportional): one table of mt_config_rope_stride floats per RoPE set (mt_config_rope_sets), a
 * layer's rotary dim / 2 values used in each; set 0 the model's (Gemma 3/4: the full layers'), set
 * 1 the Gemma sliding layers'. */
void mt_config_rope_inv_freq(const mt_config *cfg, float *inv_freq);
/* Number of RoPE tables (1, or 2 with rope_local_theta), the floats from one table to the next
 * (the widest head dim / 2), and the floats of all of them. */
int mt_config_rope_sets(const mt_config *cfg);
int mt_config_rope_stride(const mt_config *cfg);
size_t mt_config_rope_inv_freq_len(const mt_config *cfg);
/* The table layer l rotates with. */
int mt_config_layer_rope_set(const mt_config *cfg, int l);

#endif
