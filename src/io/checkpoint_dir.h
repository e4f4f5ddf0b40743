/* What the checkpoint's save (checkpoint_save.c) and load (checkpoint_load.c) halves share.
 * Internal to src/io; the public interface is checkpoint.h. */
#ifndef MT_CHECKPOINT_DIR_H
#define MT_CHECKPOINT_DIR_H

#include <stddef.h>
#include <stdint.h>

#include "io/checkpoint.h"
#include "io/digest.h"
#include "io/hf_layout.h"
#include "io/safetensors.h"
#include "model/params.h"
#include "optim/state.h"

#define CKPT_SUBDIR "checkpoints"
#define STEP_PREFIX "step_"
#define TMP_PREFIX ".tmp-"
#define MAX_FILES 16 /* entries of trainer_state.json's "files" */
#define CKPT_PART_NAME 128 /* "<part>.<HF name>" (HF names are < 96) */
/* A LoRA run's checkpoint (io/lora_checkpoint.h): its files, all three required in "files" */
#define CKPT_LORA_CONFIG "adapter_config.json"
#define CKPT_LORA_WEIGHTS "adapter_model.safetensors"
#define CKPT_LORA_OPTIM "adapter_optimizer.safetensors"

/* ---- small file-system helpers ---- */

char *ckpt_path_join(const char *dir, const char *name);

int ckpt_is_dir(const char *path);

/* "step_<digits>" -> step; -1 for any other name. */
int64_t ckpt_parse_step_name(const char *name);

typedef struct {
    int64_t *steps;
    int n, cap;
} ckpt_step_list;

/* The step_N directories of CKDIR, highest first. errno-style result in *err (0 when listed). */
ckpt_step_list ckpt_list_steps(const char *ckdir, int *err);

void ckpt_step_name(char *buf, size_t size, const char *prefix, int64_t step);

/* The files of a checkpoint with their digests, as trainer_state.json records them. */
typedef struct {
    char name[64];
    mt_file_digest d;
} ckpt_file_entry;

typedef struct {
    ckpt_file_entry e[MAX_FILES];
    int n;
} ckpt_file_list;

void ckpt_add_file(ckpt_file_list *l, const char *name, const mt_file_digest *d);

/* ---- one tensor's state at a time ---- */

/* Host buffers for one tensor's fp32 weights and its optimizer parts in format f, sized for the
 * table's largest tensor: the most the checkpoint code ever holds. */
typedef struct {
    mt_state_format f;
    float *w;
    unsigned char *block; /* every part of the largest tensor, each 64-byte aligned */
    mt_optim_tensor part[MT_OPTIM_MAX_TENSORS]; /* ckpt_buf_layout's */
    int n_parts;
} ckpt_tensor_buf;

void ckpt_buf_init(ckpt_tensor_buf *b, const mt_param_table *t, mt_state_format f);
void ckpt_buf_free(ckpt_tensor_buf *b);
/* b->part = p's parts (mt_optim_parts_layout), data pointing into b's buffers. */
void ckpt_buf_layout(ckpt_tensor_buf *b, const mt_param *p);

/* The file's name of part x of tensor p: "<part>.<HF name>". */
void ckpt_part_name(char *buf, size_t size, const mt_optim_tensor *x, const mt_param *p);
/* Its shape: p's when it has p's numel (the moments), else 1-D [numel] (the scales). */
int ckpt_part_shape(const mt_optim_tensor *x, const mt_param *p, int64_t shape[3]);

/* The tensors of model.safetensors (ckpt_weight_list: F32, mt_hf_plan's items) or
 * optimizer.safetensors (ckpt_part_list, format f) in file order: names, dtypes and shapes, data
 * NULL; for the optimizer's, param_of[j] and part_of[j] say whose part file tensor j is. Every writer of a checkpoint builds its files from these,
 * so the one-writer and the per-rank saves make the same header. */
typedef struct {
    mt_st_write_tensor *w;
    char (*names)[CKPT_PART_NAME];
    int *param_of, *part_of; /* the optimizer's list only */
    int n;
    mt_hf_plan *hf; /* the weights' list: model.safetensors as a model directory has it (io/hf_layout.h:
                       names, fused experts, carried tensors); w[j] is hf->items[j].w */
} ckpt_tensor_list;

void ckpt_weight_list(const mt_param_table *t, ckpt_tensor_list *l);
void ckpt_part_list(const mt_param_table *t, mt_state_format f, ckpt_tensor_list *l);
void ckpt_tensor_list_free(ckpt_tensor_list *l);

/* What a NaN/inf is reported in: "the master weights hold", or part `part`'s description. */
const char *ckpt_part_what(const char *part);

/* ---- the steps of a load (checkpoint_load.c), shared by the LoRA checkpoint ---- */

/* trainer_state.json's "lora" (the checkpoint of a LoRA run): the adapter it holds. */
typedef struct {
    int r;
    double alpha;      /* lora_alpha */
    char targets[512]; /* target_modules as the run listed them, comma-separated */
} ckpt_lora_info;

/* CKPT/trainer_state.json validated into *st (args_json malloc'd; st->lora set), *format and
 * (format >= 2) the recorded files: with "lora", the three LoRA files are the required ones and
 * *lora (may be NULL) gets the adapter. */
int ckpt_read_state(const char *ckpt_dir, mt_ckpt_state *st, int *format, ckpt_file_list *files,
                    ckpt_lora_info *lora);
/* Every file of l has its recorded length and XXH3-64 (else MT_ERR "DIR/FILE: checksum mismatch"). */
int ckpt_verify_files(const char *dir, const ckpt_file_list *l);

/* What a tensor may hold (checkpoint.h, "Sanity at load"): |x| <= max_abs, and nonneg. */
typedef struct {
    float max_abs;
    int nonneg;
    const char *what; /* for the message */
} ckpt_value_bound;

/* The bound of "weight" or of an optimizer part by name (exp_avg, exp_avg_sq, their scales). */
ckpt_value_bound ckpt_bound_of(const char *part);
/* The n floats at x (possibly unaligned) within b; else MT_ERR naming FILE's tensor NAME, the
 * element and its value. */
int ckpt_check_values(const char *file, const char *name, const void *x, int64_t n, ckpt_value_bound b);

/* Resume's walk: load(ctx, DIR, &stop) on OUT's step_ directories, newest first, until one loads
 * (it alone writes the caller's state); path gets its directory. A failure with stop set (not
 * damage: another kind of checkpoint) ends the walk with its message; the others are damage,
 * warned about as checkpoint.h's mt_checkpoint_resume says. Returns what that one returns. */
typedef int (*ckpt_load_fn)(void *ctx, const char *dir, int *stop);
int ckpt_resume_newest(const char *out_dir, ckpt_load_fn load, void *ctx, char *path,
                       size_t path_size);

/* ---- the steps of a save (checkpoint_save.c), shared by the per-rank save ---- */

struct json_t;

/* A checkpoint being filled: OUT/checkpoints/.tmp-step_N.XXXXXX, flock'd until it is published
 * or removed. */
typedef struct {
    char *ckdir, *tmp;
    char name[64]; /* step_N */
    int64_t step;
    int lock;
} ckpt_tmp_dir;

/* Checks args_json (NULL: none; else *args, the parsed JSON, owned by the caller) and
 * tokenizer_dir, then makes the temporary directory. */
int ckpt_tmp_open(const char *out_dir, int64_t step, const char *args_json, const char *tokenizer_dir,
                  struct json_t **args, ckpt_tmp_dir *d);
/* Renames it to step_N (atomically exchanged with an existing step_N), then prunes to keep_last
 * (in_a_row: the new one's nonfinite_in_a_row; > 0 keeps the last healthy one too); on MT_ERR the
 * directory is removed. Frees d either way. */
int ckpt_tmp_publish(ckpt_tmp_dir *d, int keep_last, int64_t in_a_row);
/* Removes the directory (a failed save), keeping the error message; frees d. */
void ckpt_tmp_abort(ckpt_tmp_dir *d);
/* DIR/config.json, its digest into files. */
int ckpt_save_config(const char *dir, const mt_param_table *t, ckpt_file_list *files);
/* The last files: the tokenizer's copies, trainer_state.json (recording files' digests), then an
 * fsync of DIR. */
int ckpt_save_last(const char *dir, const mt_ckpt_state *st, const mt_state_io *io,
                   struct json_t *args, const char *tok_dir, ckpt_file_list *files);
/* ckpt_save_last with trainer_state.json's "lora" (an object, not NULL) after "files". */
int ckpt_save_last_lora(const char *dir, const mt_ckpt_state *st, const mt_state_io *io,
                        struct json_t *args, struct json_t *lora, ckpt_file_list *files);

/* 1 when any of the n floats at x (possibly unaligned: a mapped file) is NaN or inf; threaded. */
int ckpt_any_nonfinite(const void *x, int64_t n);

/* The first of the n floats at x (possibly unaligned) that is NaN, inf, |x| > max_abs or (nonneg)
 * negative (-0 is fine); -1 when none. One threaded pass of integer compares; only a failure scans
 * again for the index. */
int64_t ckpt_first_out_of_range(const void *x, int64_t n, float max_abs, int nonneg);

#endif
