/* Training checkpoints: the fp32 weights, the optimizer's state of every tensor (in the run's
 * format: full, compact or tight, optim/state.h) and the trainer's position.
 *
 * Layout of OUT/checkpoints/step_%08lld/ (one directory per saved step):
 *   config.json              the model's config (transformers loads the directory as is)
 *   model.safetensors        fp32 weights, Hugging Face names, table order (exact in every format:
 *                            compact's bf16 + residual is the fp32 master, tight's bf16 widens)
 *   optimizer.safetensors    per tensor, each part of mt_optim_parts_layout(format, numel) as
 *                            "<part>.<HF name>":
 *                              full:           exp_avg F32, exp_avg_sq F32 (the tensor's shape)
 *                              compact, tight: exp_avg U8 (shape), exp_avg_scale F32 [nb],
 *                                              exp_avg_sq U8 (shape), exp_avg_sq_scale F32 [nb]
 *                            (nb = ceil(numel / 256); a part of numel elements has the tensor's
 *                            shape, any other part is 1-D)
 *   trainer_state.json       {"format": 3, "state": "full"|"compact"|"tight", "sr_seed": "DIGITS"
 *                             (tight only: its rounding seed, a u64 as a decimal string),
 *                             "step": S, "seed": N, "loss": X, "updates": U, "skipped": K,
 *                             "nonfinite_in_a_row": R (the last R of the K skipped steps came in
 *                             a row, up to S: 0 when step S was healthy; absent in older
 *                             checkpoints: 0), "args": {...},
 *                             "files": {"model.safetensors": {"bytes": B, "xxh3_64": "16 hex"},
 *                                       ... every other file of the directory}}
 *   tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json
 *                            copies, when a tokenizer directory was given and holds them
 * Formats 1 and 2 have no "state": they hold full state (format 2's files are format 3's full).
 *
 * The state is read and written through mt_state_io (optim/state_io.h), one tensor at a time:
 * the checkpoint code holds one tensor's weights and parts (buffers of the largest tensor), never
 * a copy of the model.
 *
 * A checkpoint is written into a fresh OUT/checkpoints/.tmp-step_%08lld.XXXXXX/, every file
 * fsync'd, the directory fsync'd, then renamed to step_%08lld and OUT/checkpoints fsync'd: a crash
 * at any moment never leaves a half checkpoint under a step_ name. Directories named .tmp-* are
 * leftovers of an interrupted save or prune; readers ignore them and the next save removes them
 * (the caller holds OUT's lock, so no other process is writing there).
 *
 * Integrity: the checksum (XXH3-64, io/digest.h) of every file is computed while it is written and
 * recorded in trainer_state.json (which is itself validated by parsing); a load checks every one
 * before it trusts the bytes. Format 1 (no "files") still loads, with a warning that it cannot be
 * verified. NaN/inf (in weights, fp32 moments, scales) is never written and never loaded.
 *
 * Sanity at load: a checksum only proves the bytes are the ones written; a broken writer or a hand
 * edit can record absurd values that are finite. Refused, naming the tensor and the file:
 *   weights            |w| > MT_CKPT_MAX_WEIGHT (1e8)
 *   exp_avg, its scale |m| > MT_CKPT_MAX_MOMENT (1e8); a scale < 0
 *   exp_avg_sq, scale  v < 0 or v > MT_CKPT_MAX_MOMENT^2 (1e16)
 * Why these: trained LLM weights stay small (the largest ones known are norm weights of some
 * models, in the hundreds), so 1e8 leaves five orders of magnitude of headroom, and a model whose
 * weights come near it has already overflowed its activations (a 2-layer model drawn at 1e6 has:
 * loss ln(vocab), gradient norm 0, nothing learnt). The first moment is an average of (clipped, by default to norm 1) gradients: a gradient element of
 * 1e8 means a diverged run. The second moment is an average of squared gradients: never negative,
 * at most the square of the first's bound. 8-bit moments decode to code x scale with codes in
 * [-1, 1] (exp_avg) and [0, 1] (exp_avg_sq), so their block scales take the same bounds and are
 * never negative (0: an all-zero block). One pass of integer compares on the float bits, as fast
 * as the finiteness check it replaces.
 *
 * A LoRA run's checkpoints (io/lora_checkpoint.h) share OUT/checkpoints, the trainer_state.json
 * format and the rules above (publish, --keep, checksums, bounds); theirs records "lora" and lists
 * the adapter's three files instead of config.json and the two safetensors. Neither kind resumes
 * the other: each refuses it by name (not damage: no fallback past it).
 *
 * A run that skips steps (--max-nonfinite) never loses its last healthy checkpoint to --keep: a
 * save whose nonfinite_in_a_row > 0 keeps, besides the keep_last newest, the newest checkpoint
 * whose trainer_state.json records nonfinite_in_a_row 0 (written after a healthy step), until a
 * later healthy one is saved.
 */
#ifndef MT_CHECKPOINT_H
#define MT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "model/params.h"
#include "optim/state_io.h"

#define MT_CKPT_FORMAT 3 /* 3: "state"; 2: "files" checksums (loads as full); 1: unverified */

/* mt_checkpoint_resume: OUT has no checkpoint at all (not an error: the run starts fresh). */
#define MT_CKPT_NONE 1

#define MT_CKPT_MAX_WEIGHT 1e8f /* load: |weight| beyond this is refused (see above) */
#define MT_CKPT_MAX_MOMENT 1e8f /* load: |exp_avg| beyond this, exp_avg_sq beyond its square */

typedef struct {
    int64_t step;  /* optimizer steps completed (training resumes at this step index) */
    uint64_t seed; /* the run's seed (data order and init are functions of seed and step) */
    double loss;   /* last step's loss, for the record (NaN/inf are stored as null -> NaN) */
    int64_t updates; /* optimizer updates applied (AdamW's step count t); step minus the skipped
                        steps. A checkpoint without the field loads as updates = step. */
    int64_t skipped; /* steps whose update was skipped (non-finite loss or gradient norm) */
    char *args_json; /* load: trainer_state.json's "args" as compact JSON with sorted keys
                        (malloc'd, NULL when absent; mt_ckpt_state_free); save: ignored */
    mt_state_format state; /* load: the optimizer state's format (full when not recorded);
                              save: ignored (io->format is saved) */
    uint64_t sr_seed;      /* load: tight's rounding seed (0 for the others); save: ignored
                              (io->sr_seed) */
    int64_t in_a_row;      /* of the skipped steps, the last ones in a row up to step (0: step
                              was healthy); from 0 to skipped. Absent in older checkpoints: 0 */
    int lora;              /* load: 1 for a LoRA run's checkpoint (trainer_state.json has "lora":
                              io/lora_checkpoint.h), 0 for a full-parameter one; save: ignored */
} mt_ckpt_state;

/* CKPT/trainer_state.json alone into *st (args_json malloc'd): what a run recorded, read before
 * the model's memory is planned (the micro-batch and state format to resume with, the settings
 * to compare). Nothing else of the checkpoint is read or verified. */
int mt_checkpoint_read_state(const char *ckpt_dir, mt_ckpt_state *st);

/* Frees what mt_checkpoint_load allocated in *st (args_json). */
void mt_ckpt_state_free(mt_ckpt_state *st);

/* Saves OUT/checkpoints/step_%08lld/ (st->step) as described above: the weights and parts of
 * every tensor of t from io (get_weights, get_parts; format io->format, tight's seed io->sr_seed).
 * args_json (may be NULL) must be valid JSON; it is embedded as trainer_state.json's "args".
 * tokenizer_dir (may be NULL) must be a directory; the tokenizer files it holds are copied,
 * absent ones skipped. A checkpoint of the same step is replaced atomically (renameat2 exchange).
 * Afterwards only the keep_last highest step_ directories are kept (keep_last <= 0: all; the one
 * just written is never removed, nor, while st->in_a_row > 0, the newest one saved after a
 * healthy step) and stale .tmp-* directories are removed (not one that a save in
 * progress holds locked: the temporary directory is flock'd while it is filled); each removal
 * renames first, so it too is crash safe.
 * Weights and fp32 parts must be finite: each tensor is checked as it is written, and a NaN/inf is
 * MT_ERR naming what holds it (the weights, exp_avg, ...) and the first such tensor; the
 * temporary directory is then removed: no new step_ directory and no older checkpoint pruned.
 * Returns MT_OK, or MT_ERR (the message names the path) leaving no new step_ directory behind. */
int mt_checkpoint_save(const char *out_dir, const mt_param_table *t, const mt_state_io *io,
                       const mt_ckpt_state *st, const char *args_json, const char *tokenizer_dir,
                       int keep_last);

/* Data parallel (issue 12): every rank writes the elements its shard holds into the one
 * checkpoint, so no rank gathers the state. Three phases, each ended by an agreement of the ranks
 * (the caller's: src/io knows no comm), the directory's path going from rank 0 to the others:
 *   1. rank 0: mt_checkpoint_begin makes the temporary directory as mt_checkpoint_save does, with
 *      config.json and model.safetensors and optimizer.safetensors at their full lengths with
 *      their headers (the data a hole); *w holds it, mt_checkpoint_writer_dir names it.
 *   2. every rank: mt_checkpoint_write_shard writes its elements (io->owned: a shard may start and
 *      end inside a tensor) converted to the files' dtypes at their offsets, and fsyncs. NaN/inf
 *      is refused as by mt_checkpoint_save. A rank that does not see the directory (OUT is not on
 *      a file system every rank shares) fails naming it.
 *   3. rank 0: mt_checkpoint_finish (every rank succeeded) reads the two files back for their
 *      checksums, writes the tokenizer copies and trainer_state.json, and publishes and prunes as
 *      mt_checkpoint_save; mt_checkpoint_abort (any rank failed) removes the directory. Both free w.
 * The directory is a step_ one only after phase 3: a crash at any moment leaves no half checkpoint.
 * Its files are byte for byte those mt_checkpoint_save writes of the same state (so it loads, and
 * resumes, on any number of ranks). */
typedef struct mt_ckpt_writer mt_ckpt_writer;

int mt_checkpoint_begin(const char *out_dir, const mt_param_table *t, mt_state_format format,
                        int64_t step, const char *args_json, const char *tokenizer_dir,
                        mt_ckpt_writer **w);
const char *mt_checkpoint_writer_dir(const mt_ckpt_writer *w);
int mt_checkpoint_write_shard(const char *tmp_dir, const mt_param_table *t, const mt_state_io *io,
                              const char *out_dir, int64_t step);
int mt_checkpoint_finish(mt_ckpt_writer *w, const mt_state_io *io, const mt_ckpt_state *st,
                         int keep_last);
void mt_checkpoint_abort(mt_ckpt_writer *w);

/* Removes OUT/checkpoints/.tmp-* directories that no save holds (each save flocks its own): the
 * leftovers of a save that was killed. The caller holds OUT's lock, so no other run is saving
 * there. Returns how many were removed; failures only warn. */
int mt_checkpoint_clean_temps(const char *out_dir);

/* The newest checkpoint (highest step_ number) in OUT/checkpoints → path
 * (OUT/checkpoints/step_N).
 * MT_ERR "OUT: no checkpoint to resume from ..." when there is none. */
int mt_checkpoint_latest(const char *out_dir, char *path, size_t path_size);

/* Loads a checkpoint directory into the state behind io (set_weights and set_parts of every
 * tensor of t, then set_sr_seed for tight) and *st. Everything is validated before io is called,
 * so on MT_ERR the state and *st are untouched. In this order: trainer_state.json well formed
 * (format 1 to 3, step >= 0 and, when the directory is named step_N, step == N; "state" a format
 * name, tight with its "sr_seed"); the state's format that of io, else "CK: holds compact
 * optimizer state, this run uses --state full: resume with --state compact (converting between
 * formats is not supported)"; model weights all F32 (else "CK/model.safetensors holds bf16
 * weights: an exported model, not a training checkpoint ..."); format >= 2: every file of "files"
 * has its recorded length and XXH3-64 (else "CK/FILE: checksum mismatch ..."), format 1: one
 * warning line on stderr that it cannot be verified; config.json describes the same model as
 * t->cfg (every field that shapes the table; the error names the field); model and optimizer
 * tensors all present, of the right dtypes and shapes, nothing extra; every weight, fp32 moment
 * and scale finite and within the bounds above (the error names the tensor, the element and its
 * value). What lies outside the table's tensors (padding)
 * is not written. An error of io itself (a device copy failing) comes back as MT_ERR after some
 * tensors were set. */
int mt_checkpoint_load(const char *ckpt_dir, const mt_param_table *t, const mt_state_io *io,
                       mt_ckpt_state *st);

/* Resume: loads the newest intact checkpoint of OUT/checkpoints (mt_checkpoint_load on the step_
 * directories, newest first; the state is written only by the one that loads) and puts its
 * directory into path. Each newer one that failed gets one line on stderr:
 *   megatrain: warning: OUT/checkpoints/step_X is damaged (REASON); resuming from step_Y instead
 * A checkpoint of another state format is not damage: MT_ERR with its message (above), no
 * fallback to an older one, the state untouched; nor is a LoRA run's: MT_ERR "CK: a LoRA
 * checkpoint (an adapter of rank R): resume it with the same --lora flags" (mt_checkpoint_load
 * refuses it likewise).
 * Returns MT_OK; MT_CKPT_NONE when there is no step_ directory at all (the message says so; the
 * caller starts fresh); MT_ERR when none loads (the message names the newest and its damage), when
 * OUT/checkpoints cannot be listed, or when a path does not fit path_size. */
int mt_checkpoint_resume(const char *out_dir, const mt_param_table *t, const mt_state_io *io,
                         mt_ckpt_state *st, char *path, size_t path_size);

#endif
