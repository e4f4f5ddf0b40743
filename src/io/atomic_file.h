/* Atomic file replacement: write a temporary PATH.tmp.XXXXXX unique to this writer (in PATH's
 * directory), flush, fsync, rename over PATH, fsync the directory. A crash or an error never leaves
 * a half-written file under PATH, and two writers of one PATH never share a temporary: PATH ends
 * up as one of their complete results. Used by src/io and by mt_config_save.
 *
 * The writer holds an flock on its temporary until the rename, so a leftover of a killed writer
 * is recognisable: mt_atomic_open removes PATH.tmp.* files that nobody holds, never another live
 * writer's. The bytes written are hashed on the way (XXH3-64, io/digest.h). */
#ifndef MT_ATOMIC_FILE_H
#define MT_ATOMIC_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/digest.h"

struct XXH3_state_s;

typedef struct {
    FILE *f;
    char *path;
    char *tmp;
    struct XXH3_state_s *hash; /* of the bytes written so far */
    uint64_t bytes;
    int hashed; /* 0 after mt_atomic_write_at: the digest is then unknown */
} mt_atomic_file;

/* MT_ERR names the temporary and the system error. The file gets the mode fopen would give it. */
int mt_atomic_open(mt_atomic_file *af, const char *path);
int mt_atomic_write(mt_atomic_file *af, const void *data, size_t n);
/* Overwrites n bytes at offset (already written) and returns to the end: a header whose counts are
 * known only at the end. The file's digest is not tracked after this. */
int mt_atomic_write_at(mt_atomic_file *af, long offset, const void *data, size_t n);
/* Flush, fsync, rename, close; on MT_ERR the temporary is already removed and the message has the
 * system's reason (errno text). */
int mt_atomic_commit(mt_atomic_file *af);
/* As mt_atomic_commit, and *digest = the committed file's length and XXH3-64 (not after
 * mt_atomic_write_at). */
int mt_atomic_commit_digest(mt_atomic_file *af, mt_file_digest *digest);
/* Close and remove the temporary (after an error elsewhere). Safe after a failed commit. */
void mt_atomic_abort(mt_atomic_file *af);

/* Whole buffer in one go (open + write + commit, abort on error); digest may be NULL. */
int mt_atomic_write_file(const char *path, const void *data, size_t n);
int mt_atomic_write_file_digest(const char *path, const void *data, size_t n,
                                mt_file_digest *digest);

/* Creates the directory PREFIX.XXXXXX (a fresh unique name, mode 0777 less the umask) -> *path
 * (malloc'd). MT_ERR names it and the system error. */
int mt_make_temp_dir(const char *prefix, char **path);

/* fsync of a directory (its entries made durable). MT_ERR names it. */
int mt_fsync_dir(const char *dir);

/* A new flat directory DIR that appears whole: fill(tmp, ctx) writes its files into a fresh
 * DIR.tmp.XXXXXX beside it (DIR's parents are made), which is fsync'd and renamed to DIR (an
 * existing empty DIR is replaced, as rename(2) does), then DIR's parent fsync'd (a failure there
 * only warns: DIR is complete). On MT_ERR (fill's, or naming the rename) the temporary directory
 * and its files are removed and DIR is as it was. */
int mt_atomic_dir_write(const char *dir, int (*fill)(const char *tmp, void *ctx), void *ctx);

/* The system error text, with " (disk full)" for ENOSPC and EDQUOT. */
const char *mt_io_errtext(int e);

#endif
