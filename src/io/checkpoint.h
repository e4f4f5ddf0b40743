/* Training checkpoints: the fp32 master weights, the Adam moments and the trainer's position.
 *
 * Layout of OUT/checkpoints/step_%08lld/ (one directory per saved step):
 *   config.json              the model's config (transformers loads the directory as is)
 *   model.safetensors        fp32 master weights, Hugging Face names, table order
 *   optimizer.safetensors    fp32 "exp_avg.<HF name>" and "exp_avg_sq.<HF name>" for every tensor
 *   trainer_state.json       {"format": 1, "step": S, "seed": N, "loss": X, "updates": U,
 *                             "skipped": K, "args": {...}}
 *   tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json
 *                            copies, when a tokenizer directory was given and holds them
 * A checkpoint is written into OUT/checkpoints/.tmp-step_%08lld/, every file fsync'd, the directory
 * fsync'd, then renamed to step_%08lld and OUT/checkpoints fsync'd: a crash at any moment never
 * leaves a half checkpoint under a step_ name. Directories named .tmp-* are leftovers of an
 * interrupted save or prune; readers ignore them and the next save removes them.
 */
#ifndef MT_CHECKPOINT_H
#define MT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "model/params.h"

#define MT_CKPT_FORMAT 1

typedef struct {
    int64_t step;  /* optimizer steps completed (training resumes at this step index) */
    uint64_t seed; /* the run's seed (data order and init are functions of seed and step) */
    double loss;   /* last step's loss, for the record (NaN/inf are stored as null -> NaN) */
    int64_t updates; /* optimizer updates applied (AdamW's step count t); step minus the skipped
                        steps. A checkpoint without the field loads as updates = step. */
    int64_t skipped; /* steps whose update was skipped (non-finite loss or gradient norm) */
    char *args_json; /* load: trainer_state.json's "args" as compact JSON with sorted keys
                        (malloc'd, NULL when absent; mt_ckpt_state_free); save: ignored */
} mt_ckpt_state;

/* Frees what mt_checkpoint_load allocated in *st (args_json). */
void mt_ckpt_state_free(mt_ckpt_state *st);

/* Saves OUT/checkpoints/step_%08lld/ (st->step) as described above. master, m1 and m2 are arenas
 * of t->total floats (m1 = exp_avg, m2 = exp_avg_sq). args_json (may be NULL) must be valid JSON;
 * it is embedded as trainer_state.json's "args". tokenizer_dir (may be NULL) must be a directory;
 * the tokenizer files it holds are copied, absent ones skipped. A checkpoint of the same step is
 * replaced atomically (renameat2 exchange). Afterwards only the keep_last highest step_
 * directories are kept (keep_last <= 0: all; the one just written is never removed) and stale
 * .tmp-* directories are removed; each removal renames first, so it too is crash safe.
 * Returns MT_OK, or MT_ERR (the message names the path) leaving no new step_ directory behind. */
int mt_checkpoint_save(const char *out_dir, const mt_param_table *t, const float *master,
                       const float *m1, const float *m2, const mt_ckpt_state *st,
                       const char *args_json, const char *tokenizer_dir, int keep_last);

/* The newest checkpoint (highest step_ number) in OUT/checkpoints → path
 * (OUT/checkpoints/step_N).
 * MT_ERR "OUT: no checkpoint to resume from ..." when there is none. */
int mt_checkpoint_latest(const char *out_dir, char *path, size_t path_size);

/* Loads a checkpoint directory into the arenas (t->total floats each; padding zeroed) and *st.
 * Everything is validated before anything is written, so on MT_ERR the arenas and *st are
 * untouched: config.json describes the same model as t->cfg (every field that shapes the table;
 * the error names the field), model and optimizer tensors all present, F32 (optimizer) and of the
 * right shapes, nothing extra, trainer_state.json well formed with format 1 and step >= 0. */
int mt_checkpoint_load(const char *ckpt_dir, const mt_param_table *t, float *master, float *m1,
                       float *m2, mt_ckpt_state *st);

#endif
