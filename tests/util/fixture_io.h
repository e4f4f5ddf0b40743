/* Reading the committed fixtures (tests/fixtures): reference tensors of a safetensors file, a
 * fixture model's weights, tokenizer and training flags, and a parameter table checked against a
 * fixture checkpoint. A missing tensor or a failed load fails the running cmocka test. */
#ifndef MT_TEST_FIXTURE_IO_H
#define MT_TEST_FIXTURE_IO_H

#include <stdint.h>

#include "io/safetensors.h"
#include "model/params.h"
#include "tokenizer/tokenizer.h"

/* For a cmocka group: the fixture file rel (a safetensors file) opened into *st and the group's
 * *state, 0; or -1 with the error on stderr after "who: ". mt_test_fixture_st_teardown (the
 * group's teardown) closes it. */
int mt_test_fixture_st_open(void **state, mt_safetensors **st, const char *rel, const char *who);
int mt_test_fixture_st_teardown(void **state);

/* Tensor `name` of st, which must hold numel elements, as fp32 (malloc'd). */
float *mt_test_st_f32(const mt_safetensors *st, const char *name, int64_t numel);
/* Tensor `name` of st, which must be a 2-d int32 (B, T), copied (malloc'd). */
int32_t *mt_test_st_i32(const mt_safetensors *st, const char *name, int *B, int *T);

/* The fixture model `name` (a directory under the fixtures): its config.json into t
 * (mt_param_table_init) and its weights, returned (t->total floats, mt_aligned_alloc'd). */
float *mt_test_fixture_weights(const char *name, mt_param_table *t);
/* The same, every weight rounded to bf16: what a bf16 backend and the fp32 reference both see. */
float *mt_test_fixture_weights_bf16(const char *name, mt_param_table *t);

/* The fixture tokenizer at mt_fixture_path(printf(fmt, ...)) (a directory or a tokenizer.json),
 * which must load. */
mt_tokenizer *mt_test_tokenizer_load(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The first line of dir/args.txt (a training fixture's flags), without its newline, into args. */
void mt_test_fixture_args(const char *dir, char *args, size_t size);

/* t's tensors are exactly those of the fixture's checkpoint (name/model.safetensors): as many,
 * each found by its name with its shape. */
void mt_test_table_matches_fixture(const mt_param_table *t, const char *name);

#endif
