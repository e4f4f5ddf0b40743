/* LoRA adapters <-> a PEFT adapter directory, as PEFT's save_pretrained writes one and
 * PeftModel.from_pretrained reads it:
 *   adapter_config.json        the LoraConfig (peft_type "LORA", r, lora_alpha, target_modules, ...)
 *   adapter_model.safetensors  lora_A (r, in) and lora_B (out, r) of each wrapped module, named
 *                              base_model.model.<module>.lora_A.weight (no adapter name in keys),
 *                              metadata {"format": "pt"}
 * The adapter table (model/lora.h) says which tensors; the arena holds them in fp32.
 *
 * Reading takes plain LoRA only: scale = lora_alpha / r on whole modules named in a list. Anything
 * that would change what the tensors mean or which modules carry them (DoRA, rsLoRA, a LoRA bias,
 * fan_in_fan_out, modules_to_save, per-module rank/alpha patterns, layers_to_transform,
 * exclude_modules, a regex target_modules, ...) is refused naming the field, never ignored. */
#ifndef MT_LORA_IO_H
#define MT_LORA_IO_H

#include "core/dtype.h"
#include "model/lora.h"
#include "model/params.h"

/* Writes DIR/adapter_model.safetensors (dtype MT_F32 or MT_BF16, round-to-nearest-even) and
 * DIR/adapter_config.json (sorted keys, indent 2, as PEFT writes it; base_model_name_or_path =
 * base_model_name, may be NULL: null). target_modules is the sorted list of names; for a
 * multimodal checkpoint's language model (lt->nested) the regular expression
 * .*language_model\..*\.(a|b|...) of them, PEFT's own form for gemma4, so that
 * PeftModel.from_pretrained of the multimodal model adapts the language model alone (a plain list
 * would also match the vision tower's q_proj, ...). A DIR that does not exist is made as
 * DIR.tmp.XXXXXX beside it and renamed into place once both files are complete (parents are
 * created); into an existing directory each file is replaced atomically, the tensors first. MT_ERR
 * names the file. */
int mt_lora_save_dir(const mt_lora_table *lt, const float *arena, const char *dir,
                     const char *base_model_name, mt_dtype dtype);

/* Reads DIR's adapter for the model of table t: *lt_out built by mt_lora_table_init (rank r, alpha
 * lora_alpha, targets target_modules joined by commas), *arena_out (lt_out->total floats, aligned,
 * padding zero; the caller frees both) filled from F32, BF16 or F16 tensors. Every adapter tensor
 * must be there with its shape and no other tensor may be; in a multimodal (nested) model, whose
 * keys are "base_model.model.model.language_model.X" as PEFT names them there, a key may also be
 * the text model's "base_model.model.model.X", and target_modules may be the regular expression
 * mt_lora_save_dir writes there. On MT_ERR (one line naming the file and the field or
 * tensor) *lt_out is zeroed and *arena_out NULL. */
int mt_lora_load_dir(const char *dir, const mt_param_table *t, mt_lora_table *lt_out,
                     float **arena_out);

#endif
