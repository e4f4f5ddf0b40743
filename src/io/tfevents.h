/* TensorBoard event files (what `tensorboard --logdir` and TensorBoard importers read), written
 * without TensorFlow or a protobuf library: the three small messages are encoded by hand.
 *
 * File: a sequence of records, each uint64 length, uint32 masked CRC32C of those 8 bytes, the
 * data, uint32 masked CRC32C of the data (all little-endian); masked = ((crc >> 15) | (crc << 17))
 * + 0xa282ead8. Each record's data is one tensorboard.Event: wall_time (1, double), step (2,
 * int64), file_version (3, string: "brain.Event:2" in the first record), summary (5: Summary{value
 * (1): Value{tag (1), simple_value (2, float)}}), session_log (7: SessionLog{status (1): START = 1}).
 *
 * Lives in io/ (not cli/) because it is a file format with no knowledge of training: the tests
 * link it directly. The writer appends each step's event with one write() and, should that fail
 * part way, cuts the file back to its last whole record; after the first failure it writes nothing
 * more (the caller warns once and training goes on). */
#ifndef MT_TFEVENTS_H
#define MT_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

uint32_t mt_crc32c(const void *data, size_t n);
uint32_t mt_tfevents_masked_crc(const void *data, size_t n);

typedef struct {
    const char *tag;
    float value;
} mt_tb_scalar;

typedef struct {
    int open;        /* fd is this writer's (a zeroed struct is a closed writer) */
    int fd;
    int failed;      /* a write failed: nothing more is written */
    char path[4400];
} mt_tfevents;

/* Opens a new DIR/events.out.tfevents.<unix time>.<host>.<pid>.<n> (DIR is made when missing)
 * and writes the file_version event; start_step > 0 adds a SessionLog START event at start_step
 * (a restart: TensorBoard drops what it saw at that step and later). The time in the name is
 * made later than every events file already in DIR, so that readers, which take the files in name
 * order, read this one last. MT_ERR names the path. */
int mt_tfevents_open(mt_tfevents *w, const char *dir, int64_t start_step);
/* One event: the n scalars at step. MT_ERR (naming the file and the system's reason) on the first
 * failed write, MT_OK without writing on every call after it. */
int mt_tfevents_scalars(mt_tfevents *w, int64_t step, double wall_time, const mt_tb_scalar *v, int n);
void mt_tfevents_close(mt_tfevents *w);

/* A resume from step: every events file in dir loses its records of later steps (and a torn or
 * corrupt tail), rewritten atomically; files with nothing to drop are left alone. *dropped counts
 * the records dropped. A missing dir is no error. */
int mt_tfevents_cut(const char *dir, int64_t step, int64_t *dropped);

/* Reading, for the cut and the tests. One record's data into *buf (grown as needed): 1 read, 0 at
 * the clean end of the file, -1 a torn or corrupt record (a bad length or CRC). */
int mt_tfevents_read_record(FILE *f, uint8_t **buf, size_t *cap, size_t *n);
/* The step field of an encoded Event (0 when absent); MT_ERR when it does not parse. */
int mt_tfevents_event_step(const uint8_t *data, size_t n, int64_t *step);
/* The bytes of one Event (wall_time, step, the scalars) as written: *out malloc'd. */
size_t mt_tfevents_encode_scalars(int64_t step, double wall_time, const mt_tb_scalar *v, int n, uint8_t **out);

#endif
