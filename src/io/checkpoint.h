/* Training checkpoints: the fp32 master weights, the Adam moments and the trainer's position.
 *
 * Layout of OUT/checkpoints/step_%08lld/ (one directory per saved step):
 *   config.json              the model's config (transformers loads the directory as is)
 *   model.safetensors        fp32 master weights, Hugging Face names, table order
 *   optimizer.safetensors    fp32 "exp_avg.<HF name>" and "exp_avg_sq.<HF name>" for every tensor
 *   trainer_state.json       {"format": 2, "step": S, "seed": N, "loss": X, "updates": U,
 *                             "skipped": K, "args": {...},
 *                             "files": {"model.safetensors": {"bytes": B, "xxh3_64": "16 hex"},
 *                                       ... every other file of the directory}}
 *   tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json
 *                            copies, when a tokenizer directory was given and holds them
 * A checkpoint is written into a fresh OUT/checkpoints/.tmp-step_%08lld.XXXXXX/, every file
 * fsync'd, the directory fsync'd, then renamed to step_%08lld and OUT/checkpoints fsync'd: a crash
 * at any moment never leaves a half checkpoint under a step_ name. Directories named .tmp-* are
 * leftovers of an interrupted save or prune; readers ignore them and the next save removes them
 * (the caller holds OUT's lock, so no other process is writing there).
 *
 * Integrity: the checksum (XXH3-64, io/digest.h) of every file is computed while it is written and
 * recorded in trainer_state.json (which is itself validated by parsing); a load checks every one
 * before it trusts the bytes. Format 1 (no "files") still loads, with a warning that it cannot be
 * verified. NaN/inf is never written and never loaded.
 */
#ifndef MT_CHECKPOINT_H
#define MT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "model/params.h"

#define MT_CKPT_FORMAT 2 /* 2: "files" checksums; 1 still loads, unverified */

/* mt_checkpoint_resume: OUT has no checkpoint at all (not an error: the run starts fresh). */
#define MT_CKPT_NONE 1

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

/* CKPT/trainer_state.json alone into *st (args_json malloc'd): what a run recorded, read before
 * the model's memory is planned (the micro-batch to resume with, the settings to compare). Nothing
 * else of the checkpoint is read or verified. */
int mt_checkpoint_read_state(const char *ckpt_dir, mt_ckpt_state *st);

/* Frees what mt_checkpoint_load allocated in *st (args_json). */
void mt_ckpt_state_free(mt_ckpt_state *st);

/* Saves OUT/checkpoints/step_%08lld/ (st->step) as described above. master, m1 and m2 are arenas
 * of t->total floats (m1 = exp_avg, m2 = exp_avg_sq). args_json (may be NULL) must be valid JSON;
 * it is embedded as trainer_state.json's "args". tokenizer_dir (may be NULL) must be a directory;
 * the tokenizer files it holds are copied, absent ones skipped. A checkpoint of the same step is
 * replaced atomically (renameat2 exchange). Afterwards only the keep_last highest step_
 * directories are kept (keep_last <= 0: all; the one just written is never removed) and stale
 * .tmp-* directories are removed (not one that a save in progress holds locked: the temporary
 * directory is flock'd while it is filled); each removal renames first, so it too is crash safe.
 * Master, m1 and m2 must be finite: a NaN/inf in any parameter is MT_ERR naming the arena and the
 * first such tensor, with nothing written and no older checkpoint pruned.
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
 * untouched. In this order: trainer_state.json well formed (format 1 or 2, step >= 0 and, when
 * the directory is named step_N, step == N); model weights all F32 (else "CK/model.safetensors
 * holds bf16 weights: an exported model, not a training checkpoint ..."); format 2: every file of
 * "files" has its recorded length and XXH3-64 (else "CK/FILE: checksum mismatch ..."), format 1:
 * one warning line on stderr that it cannot be verified; config.json describes the same model as
 * t->cfg (every field that shapes the table; the error names the field); model and optimizer
 * tensors all present, of the right shapes, nothing extra; every weight and moment finite (the
 * error names the tensor). */
int mt_checkpoint_load(const char *ckpt_dir, const mt_param_table *t, float *master, float *m1,
                       float *m2, mt_ckpt_state *st);

/* Resume: loads the newest intact checkpoint of OUT/checkpoints (mt_checkpoint_load on the step_
 * directories, newest first; the arenas are written only by the one that loads) and puts its
 * directory into path. Each newer one that failed gets one line on stderr:
 *   megatrain: warning: OUT/checkpoints/step_X is damaged (REASON); resuming from step_Y instead
 * Returns MT_OK; MT_CKPT_NONE when there is no step_ directory at all (the message says so; the
 * caller starts fresh); MT_ERR when none loads (the message names the newest and its damage), when
 * OUT/checkpoints cannot be listed, or when a path does not fit path_size. */
int mt_checkpoint_resume(const char *out_dir, const mt_param_table *t, float *master, float *m1,
                         float *m2, mt_ckpt_state *st, char *path, size_t path_size);

#endif
