/* LoRA adapters (Hu et al. 2021) as PEFT lays them out: a rank-r adapter on a linear module of
 * in features and out features holds lora_A (r, in) and lora_B (out, r); the module computes
 *   y = x W^T (+ b) + scale * (x A^T) B^T,   scale = alpha / r
 * with W frozen. Names are PEFT's: base_model.model.<module>.lora_A.weight, where <module> is the
 * Hugging Face tensor name less ".weight" (model.layers.3.self_attn.q_proj; in a multimodal
 * checkpoint model.language_model.layers.3.self_attn.q_proj, as PEFT names it there).
 *
 * The adapter table lists every adapter tensor and its place in one adapter arena, layer by layer
 * in the parameter table's order, lora_A then lora_B of each module; offsets are aligned to
 * MT_LORA_ALIGN elements. Targets are PEFT's target_modules names: a module matches when its name
 * ends with ".NAME". The experts are never targets (transformers 5 holds them as fused parameters,
 * not Linear modules), nor the router, the embedding or the LM head (refused by name). On gpt-oss
 * that leaves the attention projections (MT_LORA_GPT_OSS_TARGETS; their biases stay frozen with
 * the sinks): its MLP is only the router and the fused experts, and a target naming them (or the
 * dense MLP's gate_proj, up_proj, down_proj) is refused saying so. On gemma4 every projection of
 * attention and the dense MLP (MT_LORA_GEMMA4_TARGETS), v_proj where a layer has one (the full
 * layers with attention_k_eq_v have none: their values are k_proj's output, adapter included);
 * its MoE block's router (router.proj) and fused experts are refused by name. */
#ifndef MT_LORA_H
#define MT_LORA_H

#include <stdint.h>

#include "model/params.h"

#define MT_LORA_ALIGN 64
#define MT_LORA_MAX_RANK 65536

/* The default targets: every linear projection of the token mixers and the MLPs (attention's
 * q/k/v/o, the Gated DeltaNet's in_proj_qkv/z/b/a and out_proj, gate/up/down, which includes a
 * shared expert's). A model has what its family has of them. */
#define MT_LORA_DEFAULT_TARGETS \
    "q_proj,k_proj,v_proj,o_proj,in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,out_proj,gate_proj,up_proj,down_proj"
/* What LoRA on gpt-oss adapts, and what the default list matches there. */
#define MT_LORA_GPT_OSS_TARGETS "q_proj,k_proj,v_proj,o_proj"
/* What LoRA on gemma4 adapts (v_proj where a layer has one), and what the default list matches
 * there; with the MoE block, gate/up/down are the dense MLP's. */
#define MT_LORA_GEMMA4_TARGETS "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"

typedef struct {
    int rank;              /* r >= 1 */
    double alpha;          /* scale = alpha / r; <= 0: 2r (alpha 2r, scale 2) */
    const char *targets;   /* comma-separated target_modules; NULL: the default */
} mt_lora_opts;

typedef struct {
    char name[160];        /* base_model.model.<module>.lora_A.weight / lora_B */
    int base;              /* index in the parameter table of the wrapped weight */
    int layer;
    mt_param_kind kind;
    int is_b;              /* 0: lora_A (r, in); 1: lora_B (out, r) */
    int64_t shape[2];
    int64_t numel;
    int64_t offset;        /* in the adapter arena, elements */
} mt_lora_param;

typedef struct {
    int rank;
    double alpha;
    float scale;           /* alpha / rank, as PEFT computes it (a Python float, used in fp32) */
    char targets[512];     /* the target_modules that matched, comma-separated, in the order given */
    mt_lora_param *params; /* lora_A, lora_B of each module, in parameter table order */
    int n_params;
    int n_modules;
    int64_t total;         /* elements of the adapter arena (padding included) */
    int64_t n_real;        /* adapter parameters (padding excluded) */
    int L;
    int64_t *a_index;      /* (L * MT_LAYER_KINDS) index in params of a module's lora_A, -1 none */
    int nested;            /* a multimodal checkpoint's language model (config.json's text_config):
                              transformers names its modules model.language_model.X, so the names
                              are base_model.model.model.language_model.X.lora_A.weight */
} mt_lora_table;

/* The adapters of o->rank over table t. MT_ERR naming a given target that matches no module of the
 * model (PEFT refuses those too), one that is not a linear projection megatrain adapts (embed_tokens,
 * lm_head, the router, the experts: named with what is supported), an empty name, or a bad rank. */
int mt_lora_table_init(mt_lora_table *lt, const mt_param_table *t, const mt_lora_opts *o);
void mt_lora_table_free(mt_lora_table *lt);

/* The lora_A entry of layer l's module `kind`, NULL when it has no adapter (lora_B is the next). */
const mt_lora_param *mt_lora_find(const mt_lora_table *lt, int l, mt_param_kind kind);
/* An adapter tensor by PEFT name; NULL when none. */
const mt_lora_param *mt_lora_find_name(const mt_lora_table *lt, const char *name);

/* One layer's adapters inside an arena of elements of elem_size bytes: a[kind], b[kind] NULL where
 * the module has none. */
typedef struct mt_lora_view {
    int rank;
    float scale;
    void *a[MT_LAYER_KINDS], *b[MT_LAYER_KINDS];
} mt_lora_view;

mt_lora_view mt_lora_view_at(const mt_lora_table *lt, int l, void *arena, size_t elem_size);

/* The adapters folded into an fp32 arena of table t's weights, as PEFT's merge_and_unload: W (out,
 * in) += scale * B (out, r) @ A (r, in) for every adapted module, each row's sums in fp64, rounded
 * once into W. `adapters`: lt->total fp32 (lt made over t). */
void mt_lora_merge(const mt_lora_table *lt, const float *adapters, const mt_param_table *t,
                   float *weights);

/* PEFT's default init into an fp32 arena of lt->total: lora_A uniform in [-1/sqrt(in), 1/sqrt(in)]
 * (kaiming_uniform with a = sqrt(5), what PEFT calls), lora_B zero (the adapted model starts as the
 * base), padding zero. Deterministic in seed (not torch's stream). */
void mt_lora_init(const mt_lora_table *lt, float *arena, uint64_t seed);

#endif
