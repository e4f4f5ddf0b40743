/* The run directory (--out): one training process at a time, a fresh run never mixed into an old
 * one, and a resumed run's metrics.jsonl starting where its checkpoint ends.
 *
 * What megatrain train itself writes in OUT: metrics.jsonl, checkpoints/step_N/ (and
 * checkpoints/.tmp-* while saving), .lock. Data caches (<data>.tokens.bin, <data>.packed) are
 * derived from --data and checked against it where they are read; they are not part of a run. */
#ifndef MT_RUN_DIR_H
#define MT_RUN_DIR_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int fd; /* OUT/.lock, flock'ed; -1 when not held */
} mt_run_lock;

/* Takes an exclusive flock on OUT/.lock without waiting and writes "pid P, host H, started T"
 * into it, for the life of the process (or mt_run_unlock). MT_ERR when another process holds it,
 * naming that process from what it wrote. The file stays after the run: the flock, not the
 * file's existence, is the lock, so a killed run never leaves OUT locked. */
int mt_run_lock_take(mt_run_lock *l, const char *out_dir);
void mt_run_unlock(mt_run_lock *l);

/* 1 when OUT holds a run (a non-empty metrics.jsonl or an entry checkpoints/step_*), else 0;
 * a short description ("metrics.jsonl and checkpoints/step_00000010") goes to what. */
int mt_run_dir_used(const char *out_dir, char *what, size_t what_size);

/* A fresh run (no --resume): MT_ERR naming --resume and --overwrite when OUT holds a run; with
 * overwrite, removes OUT/metrics.jsonl and OUT/checkpoints/step_* and .tmp-* first (checkpoints/
 * too when that leaves it empty), and nothing else. */
int mt_run_dir_prepare_fresh(const char *out_dir, int overwrite);

/* --resume from a checkpoint of step `step`: OUT/metrics.jsonl loses the lines of later steps
 * (step and eval lines) and a torn last line (no newline: a crash while writing it), so that the
 * re-run steps are not listed twice. Rewritten atomically, and only when something goes; *dropped
 * = the lines removed. A missing metrics.jsonl is no error. */
int mt_run_dir_cut_metrics(const char *out_dir, int64_t step, int64_t *dropped);

#endif
