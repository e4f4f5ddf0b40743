/* Where the parameter table's tensors lie in a Hugging Face checkpoint, beyond their table names:
 *
 *  - A multimodal checkpoint (cfg.nested: Qwen3_5ForConditionalGeneration, the text config under
 *    "text_config") names the language model "model.language_model.*" for the table's "model.*"
 *    (lm_head.weight keeps its name). Every tensor outside the language model (model.visual.*,
 *    mtp.*, anything else) is "carried": megatrain does not train it, remembers where it lies and
 *    copies it byte for byte into every model directory it writes, beside the original
 *    config.json text. A text-only checkpoint still refuses any tensor it does not know.
 *  - MoE experts with the "mlp.experts." names (qwen3_moe, qwen3_5_moe) are per expert
 *    ("mlp.experts.{e}.gate_proj.weight", ...) or fused, as transformers' Qwen3_5MoeExperts holds
 *    them: "mlp.experts.gate_up_proj" (E, 2 Fe, C), per expert its Fe gate rows then its Fe up
 *    rows (gate, up = linear(x, gate_up_proj[e]).chunk(2)), and "mlp.experts.down_proj"
 *    (E, C, Fe). Either loads; a save writes the layout the source had.
 *  - gpt-oss's experts (mlp.experts.gate_up_proj, down_proj) may be MXFP4, as the published
 *    checkpoints hold them: NAME_blocks + NAME_scales in place of NAME (io/mxfp4_tensor.h).
 *    They load dequantized, are trained as the plain tensors they become, and every save writes
 *    them plain (unquantized, the dtype of the save), with a config.json that has no
 *    quantization_config (mt_config_save writes none): what transformers loads as a dequantized
 *    gpt-oss.
 *
 * The host model keeps an mt_hf_source (read from --model's directory) and points the table's
 * `hf` at it; every writer of a model directory (mt_model_save, the training checkpoints) lays its
 * model.safetensors out by mt_hf_plan and writes config.json by mt_hf_config_save. */
#ifndef MT_HF_LAYOUT_H
#define MT_HF_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "io/safetensors.h"
#include "model/params.h"

#define MT_HF_NAME 160                   /* room for any disk name of a table tensor */
#define MT_HF_LM_PREFIX "model.language_model."

/* A tensor megatrain does not train, copied through from where it was loaded. */
typedef struct {
    char *name, *path;   /* its name; the file it lives in */
    uint64_t offset;     /* byte offset of its data in path */
    uint64_t file_bytes; /* path's length when loaded (a file changed since is refused at save) */
    mt_dtype dtype;
    int ndim;
    int64_t shape[MT_ST_MAX_DIMS];
    uint64_t nbytes;
} mt_hf_carried;

struct mt_hf_source {
    char *config_text; /* config.json as read (a nested one is written back unchanged); NULL: none */
    size_t config_len;
    int fused_experts; /* some layer's experts were fused on disk: saves write them fused */
    mt_hf_carried *carried; /* in file order */
    int n_carried;
    int n_visual, n_mtp;    /* of the carried: model.visual.*, mtp.* */
    int n_mxfp4;            /* table tensors read from MXFP4 pairs (dequantized; saved plain) */
};
typedef struct mt_hf_source mt_hf_source;

/* DIR/config.json's text, and, when DIR has weights (model.safetensors or an index), what table
 * t finds there (mt_hf_resolve: the carried tensors, the experts' layout; a bad checkpoint is
 * MT_ERR). Nothing is loaded into memory but names and places. */
int mt_hf_source_open(mt_hf_source **out, const mt_param_table *t, const char *dir);
/* CONFIG's text alone (a model from --init: nothing to carry). */
int mt_hf_source_config(mt_hf_source **out, const char *config_path);
void mt_hf_source_free(mt_hf_source *s); /* NULL is fine */

/* Tensor p's name on disk: "model.X" is "model.language_model.X" in a nested checkpoint. */
void mt_hf_name(const mt_param_table *t, const mt_param *p, char *buf, size_t size);

/* Where the table finds tensor i on disk: x's elements [elem, elem + numel). */
typedef struct {
    const mt_st_tensor *x;
    int64_t elem;                /* 0 but for a fused expert */
    const mt_st_tensor *scales;  /* non-NULL: x is the _blocks of an MXFP4 pair (mxfp4_tensor.h) */
} mt_hf_ref;

/* Finds every tensor of t in st (refs: t->n_params entries), each with exactly its shape (F32,
 * BF16 or F16 on disk; a gpt-oss expert tensor may be an MXFP4 pair instead), and accounts for
 * every other tensor of st: a "*rotary_emb.inv_freq" (ignored), lm_head.weight of a tied model
 * (ignored, warned on stderr), in a nested checkpoint anything outside "model.language_model."
 * (carried: into src when src is not NULL, with src->fused_experts and src->n_mxfp4); any other
 * is MT_ERR naming it. */
int mt_hf_resolve(const mt_param_table *t, const mt_safetensors *st, mt_hf_ref *refs, mt_hf_source *src);

/* The referenced elements as one tensor (numel of them): for checks of plain tensors (an MXFP4
 * pair has no such view: a bug to ask). */
mt_st_tensor mt_hf_ref_view(const mt_hf_ref *r, int64_t numel);

/* Param p's values from its reference as fp32 (p->numel into dst): converted from F32/BF16/F16,
 * or dequantized from MXFP4. Every reader of model weights goes through here. */
int mt_hf_ref_to_f32(const mt_hf_ref *r, const mt_param *p, float *dst);

/* DIR/config.json for t: mt_config_save's for a text-only config; a nested one needs t->hf's
 * original text, written unchanged (atomic). */
int mt_hf_config_save(const mt_param_table *t, const char *path);

/* ---- the tensors of a model directory's safetensors, in write order ---- */

typedef struct {
    char name[MT_HF_NAME];
    mt_st_write_tensor w;   /* name, dtype, shape; data NULL (produced by mt_hf_fill) */
    int first, n;           /* its params: pieces[first .. first + n), back to back */
    const mt_hf_carried *carried; /* or this, copied through */
} mt_hf_item;

typedef struct {
    mt_hf_item *items;
    int n;
    int *pieces;      /* param indices */
    int *item_of;     /* [param] the item holding it */
    int64_t *elem_of; /* [param] its first element in that item */
} mt_hf_plan;

/* t's tensors in table order as dtype (a fused layer's experts as its two fused tensors, when
 * t->hf says the source had them), then t->hf's carried tensors in their own dtypes. */
void mt_hf_plan_init(mt_hf_plan *pl, const mt_param_table *t, mt_dtype dtype);
void mt_hf_plan_free(mt_hf_plan *pl);

/* An open carried file (fd -1: none). */
typedef struct {
    int fd;
    const char *path;
} mt_hf_reader;
void mt_hf_reader_init(mt_hf_reader *r);
void mt_hf_reader_close(mt_hf_reader *r);

/* Produces param p's elements [begin, begin + n) in the item's dtype into dst. */
typedef int (*mt_hf_piece_fn)(void *ctx, int p, int64_t begin, int64_t n, void *dst);

/* Elements [begin, begin + n) of item i into dst: a carried tensor's bytes read from its file
 * (refused when the file changed length since it was loaded), a params' through piece. */
int mt_hf_fill(const mt_hf_plan *pl, int i, int64_t begin, int64_t n, void *dst, mt_hf_piece_fn piece,
               void *ctx, mt_hf_reader *rd);

#endif
