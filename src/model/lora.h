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
 * ends with ".NAME". The router, the embedding and the LM head are never targets (refused by name).
 *
 * gpt-oss's experts: fused 3-D parameters gate_up_proj (E, C, 2 Fe) and down_proj (E, Fe, C), each
 * (E, in, out), which PEFT adapts through target_parameters (lora.ParamWrapper): lora_A (r E, in),
 * lora_B (out, r E), expert e's A_e the rows e r .. e r + r - 1 of lora_A and its B_e (out, r) the
 * columns k E + e (k < r) of lora_B, and W[e] (in, out) += scale * A_e^T B_e^T. Here the targets
 * "gate_up_proj" and "down_proj" (or "experts.X", "mlp.experts.X": PEFT's names match the same way)
 * in --lora-targets, and PEFT's target_parameters of an adapter directory, select them (the
 * default list does not). Keys as PEFT nests the wrappers (gate_up_proj's inside down_proj's when
 * both are adapted): base_model.model.model.layers.N.mlp.experts.base_layer.lora_A.weight for
 * gate_up_proj then, else ...mlp.experts.lora_A.weight. In the arena lora_A is as PEFT's and
 * lora_B is held expert by expert, (E, out, r), so that each expert's B_e is one (out, r) matrix
 * for the grouped expert GEMMs; mt_lora_peft_layout converts at the files. Other families'
 * experts are never targets (a target naming them is refused saying gpt_oss only).
 *
 * On gpt-oss the attention projections (MT_LORA_GPT_OSS_TARGETS; their biases stay frozen with
 * the sinks) and the experts (MT_LORA_GPT_OSS_EXPERTS) are adapted: a target naming the router or
 * "experts" itself, or the dense MLP's gate_proj, up_proj, is refused saying so. On gemma4 every projection of
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
/* gpt-oss's expert targets (PEFT's target_parameters; not in the default list). */
#define MT_LORA_GPT_OSS_EXPERTS "gate_up_proj,down_proj"
/* What LoRA on gemma4 adapts (v_proj where a layer has one), and what the default list matches
 * there; with the MoE block, gate/up/down are the dense MLP's. */
#define MT_LORA_GEMMA4_TARGETS "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"

typedef struct {
    int rank;              /* r >= 1 */
    double alpha;          /* scale = alpha / r; <= 0: 2r (alpha 2r, scale 2) */
    const char *targets;   /* comma-separated target_modules; NULL: the default */
    const char *parameters; /* comma-separated target_parameters (gpt-oss's experts); NULL: none */
} mt_lora_opts;

typedef struct {
    char name[160];        /* base_model.model.<module>.lora_A.weight / lora_B */
    int base;              /* index in the parameter table of the wrapped weight */
    int layer;
    mt_param_kind kind;
    int is_b;              /* 0: lora_A (r, in); 1: lora_B (out, r) */
    int experts;           /* E for a fused experts' adapter (shape (r E, in) / (out, r E)), else 0 */
    int64_t shape[2];
    int64_t numel;
    int64_t offset;        /* in the adapter arena, elements */
} mt_lora_param;

typedef struct {
    int rank;
    double alpha;
    float scale;           /* alpha / rank, as PEFT computes it (a Python float, used in fp32) */
    char targets[512];     /* the target_modules that matched, comma-separated, in the order given */
    char parameters[128];  /* target_parameters adapted (mlp.experts.gate_up_proj, ...down_proj,
                              in that order), comma-separated; "" none */
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

/* What the adapter targets, as --lora-targets names it: target_modules then the experts' parameters
 * by their last names (q_proj,k_proj,v_proj,o_proj,gate_up_proj,down_proj). Returns buf. */
const char *mt_lora_targets_text(const mt_lora_table *lt, char *buf, size_t size);

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
 * in) += scale * B (out, r) @ A (r, in) for every adapted module (an expert's W[e] (in, out) +=
 * scale * A_e^T B_e^T), each row's sums in fp64, rounded once into W. `adapters`: lt->total fp32
 * (lt made over t). */
void mt_lora_merge(const mt_lora_table *lt, const float *adapters, const mt_param_table *t,
                   float *weights);

/* Adapter tensor p between the arena's order (src) and PEFT's (dst), numel floats: a copy except
 * for an experts' lora_B, (E, out, r) in the arena and (out, r E) in PEFT's files (to_peft 0: the
 * other way). */
void mt_lora_peft_layout(const mt_lora_param *p, const float *src, float *dst, int to_peft);

/* PEFT's default init into an fp32 arena of lt->total: lora_A uniform in [-1/sqrt(in), 1/sqrt(in)]
 * (kaiming_uniform with a = sqrt(5), what PEFT calls), lora_B zero (the adapted model starts as the
 * base), padding zero. Deterministic in seed (not torch's stream). */
void mt_lora_init(const mt_lora_table *lt, float *arena, uint64_t seed);

#endif
