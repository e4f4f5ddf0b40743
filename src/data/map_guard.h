/* Guards for the read-only mappings of data files (token files, packed rows).
 *
 * Data is read through mmap (data/tokens.c, data/packed.c). When a mapped file is truncated under a
 * running command (rewritten in place: `> file`, `truncate`, a tool that does not write a new file
 * and rename it), reading a page past the new end raises SIGBUS, which by default kills the
 * process without a word (exit 135). This module turns that into the tool's one-line error:
 *  - each reader registers its mapping with the file's still-open descriptor;
 *  - mt_map_guard_check() fstat()s that descriptor before a batch is read: a file shorter than
 *    its mapping is MT_ERR, naming the file and both sizes;
 *  - mt_map_guard_install() (the commands that read data) installs a SIGBUS handler for the race
 *    between that check and the read: a fault inside a registered mapping writes one fixed line
 *    naming the file (write(2): async-signal-safe) and _exit(1)s; a SIGBUS anywhere else is
 *    re-raised with the default action, so a bug stays a crash.
 * At most MT_MAP_GUARD_SLOTS mappings are guarded at once; one more is mapped unguarded (its check
 * always passes). Register and unregister may run on any thread (a mutex); the handler reads the
 * table without locking (each slot is published by a flag set last and cleared first).
 */
#ifndef MT_MAP_GUARD_H
#define MT_MAP_GUARD_H

#include <stddef.h>

#define MT_MAP_GUARD_SLOTS 32

/* Guards [addr, addr + len), the mapping of path through fd. Takes fd: it is closed by
 * mt_map_guard_unregister (or here, when every slot is taken). */
void mt_map_guard_register(const void *addr, size_t len, int fd, const char *path);
/* Ends the guard of the mapping at addr and closes its fd; an unknown addr is a no-op. */
void mt_map_guard_unregister(const void *addr);

/* MT_OK while the file mapped at addr is at least as long as its mapping (or addr is unguarded);
 * else MT_ERR: "PATH: the data file shrank from X to Y bytes while being read ...". */
int mt_map_guard_check(const void *addr);

/* Installs the SIGBUS handler (idempotent). */
void mt_map_guard_install(void);

#endif
