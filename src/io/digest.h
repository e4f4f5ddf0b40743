/* File checksums: XXH3-64 (libxxhash) over a file's bytes, as 16 lowercase hex digits in
 * checkpoints. Fast (tens of GB/s), not cryptographic: it catches damage and a replaced file, not
 * an adversary. Writers get it for free from mt_atomic_file; readers check with mt_digest_file. */
#ifndef MT_DIGEST_H
#define MT_DIGEST_H

#include <stdint.h>

typedef struct {
    uint64_t bytes; /* the file's length */
    uint64_t xxh3;  /* XXH3_64bits of its contents (seed 0) */
} mt_file_digest;

#define MT_DIGEST_HEX 17 /* 16 digits and the terminating NUL */

void mt_digest_hex(uint64_t h, char out[MT_DIGEST_HEX]);
/* Exactly 16 hex digits (either case) -> *out; MT_ERR (no message) otherwise. */
int mt_digest_parse_hex(const char *s, uint64_t *out);

/* Digest of the whole file at PATH (mapped, read once). Returns 0, or an errno (no message is
 * recorded, so that it can run on worker threads). */
int mt_digest_file(const char *path, mt_file_digest *out);

#endif
