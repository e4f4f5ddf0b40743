/* Editing a saved checkpoint in tests: its trainer_state.json, and re-recording a file's length
 * and checksum after a test rewrote the file on purpose (to test what comes after the checksum). */
#ifndef MT_TEST_CKPT_EDIT_H
#define MT_TEST_CKPT_EDIT_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

/* DIR/trainer_state.json parsed (fails the test when it is not JSON). */
json_t *mt_test_ckpt_load_state(const char *dir);
/* Writes o as DIR/trainer_state.json and releases it. */
void mt_test_ckpt_store_state(const char *dir, json_t *o);
/* Records DIR/FILE's current length and XXH3-64 in DIR/trainer_state.json. */
void mt_test_ckpt_restamp(const char *dir, const char *file);

/* The JSON header of the safetensors file path, open at f and read from its start: its length goes
 * to *n (the data start at byte 8 + *n). Fails the test when it is not JSON. */
json_t *mt_test_st_read_header(FILE *f, const char *path, uint64_t *n);

/* Sets elements [first, first + count) (count < 0: to the end) of every F32 tensor of DIR/FILE (a
 * safetensors file) whose name contains name_part to value, in place, and re-records the file's
 * checksum: a finite but absurd value "as a broken writer or a hand edit would" leave. Returns the
 * number of tensors changed (fails the test when none matches). */
int mt_test_ckpt_fill_f32(const char *dir, const char *file, const char *name_part, long first, long count,
                          float value);

#endif
