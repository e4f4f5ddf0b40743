/* Checkpoints of a LoRA run (train --lora R): the adapters' fp32 master and Adam moments
 * (engine/lora_state.h) and the trainer's position; the base model is frozen and not saved.
 *
 * OUT/checkpoints/step_%08lld/ of a LoRA run: a PEFT adapter directory (PeftModel.from_pretrained
 * loads it, --adapter starts from it) plus what resumes the run bit for bit:
 *   adapter_config.json, adapter_model.safetensors   as mt_lora_save_dir writes them, F32 (exact)
 *   adapter_optimizer.safetensors   exp_avg.<PEFT key>, exp_avg_sq.<PEFT key> (F32, each the
 *                                   tensor's shape), tensor by tensor in the adapter table's order
 *   trainer_state.json   as a full checkpoint's (io/checkpoint.h; format 3: step, seed, loss,
 *                        updates, skipped, nonfinite_in_a_row, args, files with bytes + xxh3_64 of
 *                        the three files above), "state": "full", plus
 *                        "lora": {"r": R, "lora_alpha": A, "target_modules": "q_proj,..."}
 *                        (target_modules: the names that matched, as the run listed them)
 * Written into the .tmp- directory and published atomically, pruned to keep_last as checkpoint.h
 * says (the same rules: the newest healthy one is kept while steps are skipped). Full and LoRA
 * checkpoints share OUT/checkpoints; neither kind resumes the other. */
#ifndef MT_LORA_CHECKPOINT_H
#define MT_LORA_CHECKPOINT_H

#include <stddef.h>

#include "io/checkpoint.h"
#include "model/lora.h"
#include "model/params.h"

/* Saves OUT/checkpoints/step_%08lld/ (st->step) as above from the adapter arenas w, exp_avg and
 * exp_avg_sq (lt->total floats each, the table's offsets; padding is not read). args_json (may be
 * NULL) must be valid JSON; base_model (may be NULL) is adapter_config.json's
 * base_model_name_or_path. NaN/inf in any of the three is refused before anything is written:
 * MT_ERR naming what holds it and the tensor, no new step_ directory, nothing pruned. */
int mt_lora_checkpoint_save(const char *out_dir, const mt_lora_table *lt, const float *w,
                            const float *exp_avg, const float *exp_avg_sq, const mt_ckpt_state *st,
                            const char *args_json, const char *base_model, int keep_last);

/* The newest intact LoRA checkpoint of OUT/checkpoints (checksums verified; every tensor F32 of
 * its shape, nothing extra; finite and within checkpoint.h's bounds: |w|, |exp_avg| <= 1e8,
 * 0 <= exp_avg_sq <= 1e16) into w, exp_avg and exp_avg_sq (lt->total floats each, at the table's
 * offsets, padding zero) and *st (args_json malloc'd: mt_ckpt_state_free; lora = 1); path = its
 * directory. A damaged newer one is named in a warning on stderr and passed over, as
 * mt_checkpoint_resume does; only the one that loads writes the arenas and *st.
 * Returns MT_OK; MT_CKPT_NONE when OUT has no checkpoint; MT_ERR when none loads, when the newest
 * is a full-parameter checkpoint ("CK: a full-parameter checkpoint, not a LoRA run's: ..."), or
 * when its r / lora_alpha / target_modules (compared as a set) differ from lt's, the adapter table
 * of the run (the message names CK and each field that differs); these two are not damage: no
 * fallback past them. */
int mt_lora_checkpoint_resume(const char *out_dir, const mt_param_table *t, const mt_lora_table *lt,
                              float *w, float *exp_avg, float *exp_avg_sq, mt_ckpt_state *st,
                              char *path, size_t path_size);

#endif
