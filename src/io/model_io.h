/* Model weights <-> a Hugging Face model directory (config.json + safetensors, single or sharded).
 * The parameter table says what to expect; the arena holds fp32 weights at the table's offsets. */
#ifndef MT_MODEL_IO_H
#define MT_MODEL_IO_H

#include <stdint.h>

#include "core/dtype.h"
#include "model/params.h"

/* Loads DIR's safetensors (model.safetensors or an index + shards) into arena (t->total floats).
 * Every tensor the table expects must be present with exactly its shape (F32, BF16 or F16 on disk);
 * any other tensor is refused by name, except "*rotary_emb.inv_freq" (ignored) and, for a tied
 * model, "lm_head.weight" (ignored with a warning on stderr). A multimodal checkpoint (nested
 * config) has the language model under "model.language_model." and carries the rest (vision
 * tower, mtp.*: not loaded); MoE experts may be fused, gpt-oss's may be MXFP4 (read dequantized;
 * io/hf_layout.h, io/mxfp4_tensor.h). All checks run before the arena is written, so on MT_ERR it
 * is untouched. Padding between tensors is zeroed. */
int mt_model_load(const mt_param_table *t, float *arena, const char *dir);
/* The same checks, then each tensor as fp32 (a buffer of the largest tensor) handed to sink in
 * table order: loading without a copy of the whole model. A sink error stops the load. */
int mt_model_load_tensors(const mt_param_table *t, const char *dir,
                          int (*sink)(void *ctx, const mt_param *p, const float *w), void *ctx);
/* The same, but a tensor for which want(ctx, p) is 0 is checked (present, its shape) and neither
 * read nor handed to sink (a quantized base read from its cache). */
int mt_model_load_tensors_where(const mt_param_table *t, const char *dir,
                                int (*want)(void *ctx, const mt_param *p),
                                int (*sink)(void *ctx, const mt_param *p, const float *w), void *ctx);
/* The same, and a tensor stored as an MXFP4 pair (gpt-oss's experts, io/mxfp4_tensor.h) is first
 * offered to mxfp4 as it lies on disk: blocks [E, out, in / 32, 16] and scales [E, out, in / 32]
 * for p's [E, in, out], byte for byte (a quantized base keeps them so: engine/quant_base.h). mxfp4
 * returns 1 when it took them, 0 to have them dequantized and handed to sink, MT_ERR to stop. */
int mt_model_load_tensors_mxfp4(const mt_param_table *t, const char *dir,
                                int (*want)(void *ctx, const mt_param *p),
                                int (*sink)(void *ctx, const mt_param *p, const float *w),
                                int (*mxfp4)(void *ctx, const mt_param *p, const uint8_t *blocks,
                                             const uint8_t *scales),
                                void *ctx);

/* Writes DIR/config.json (mt_hf_config_save: a nested config is t->hf's original text) and the
 * weights in table order, as dtype (MT_F32 or MT_BF16, round-to-nearest-even), named and laid out
 * as t->hf's source had them (language-model prefix, fused experts), then t->hf's carried tensors
 * byte for byte, with metadata {"format": "pt"}: DIR/model.safetensors, or, when
 * max_shard_bytes > 0 and the tensors exceed it, model-0000i-of-0000K.safetensors shards plus
 * model.safetensors.index.json. Creates DIR (and parents) when missing. Each file is replaced
 * atomically; files of an earlier save in the other layout are removed after the new one is
 * complete. Memory: a 4 MiB conversion buffer, never a copy of the model. */
int mt_model_save(const mt_param_table *t, const float *arena, const char *dir, mt_dtype dtype,
                  int64_t max_shard_bytes);

#endif
