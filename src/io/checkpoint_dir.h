/* What the checkpoint's save (checkpoint_save.c) and load (checkpoint_load.c) halves share.
 * Internal to src/io; the public interface is checkpoint.h. */
#ifndef MT_CHECKPOINT_DIR_H
#define MT_CHECKPOINT_DIR_H

#include <stddef.h>
#include <stdint.h>

#include "io/digest.h"

#define CKPT_SUBDIR "checkpoints"
#define STEP_PREFIX "step_"
#define TMP_PREFIX ".tmp-"
#define MAX_FILES 16 /* entries of trainer_state.json's "files" */

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

/* 1 when any of the n floats at x (possibly unaligned: a mapped file) is NaN or inf; threaded. */
int ckpt_any_nonfinite(const void *x, int64_t n);

#endif
