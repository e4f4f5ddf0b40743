/* Atomic file replacement: write PATH.tmp, flush, fsync, rename over PATH, fsync the directory.
 * A crash or an error never leaves a half-written file under PATH. Internal to src/io. */
#ifndef MT_ATOMIC_FILE_H
#define MT_ATOMIC_FILE_H

#include <stddef.h>
#include <stdio.h>

typedef struct {
    FILE *f;
    char *path;
    char *tmp;
} mt_atomic_file;

/* MT_ERR names PATH.tmp and the system error. */
int mt_atomic_open(mt_atomic_file *af, const char *path);
int mt_atomic_write(mt_atomic_file *af, const void *data, size_t n);
/* Overwrites n bytes at offset (already written) and returns to the end: a header whose counts are
 * known only at the end. */
int mt_atomic_write_at(mt_atomic_file *af, long offset, const void *data, size_t n);
/* Flush, fsync, close, rename; on MT_ERR the temporary is already removed. */
int mt_atomic_commit(mt_atomic_file *af);
/* Close and remove the temporary (after an error elsewhere). Safe after a failed commit. */
void mt_atomic_abort(mt_atomic_file *af);

/* Whole buffer in one go (open + write + commit, abort on error). */
int mt_atomic_write_file(const char *path, const void *data, size_t n);

#endif
