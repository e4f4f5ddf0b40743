/* An mt_state_io over one host mt_optim_state that covers a whole parameter table (tensor p at
 * p->offset): the state as a checkpoint sees it, for the checkpoint tests. */
#ifndef MT_TEST_STATE_IO_H
#define MT_TEST_STATE_IO_H

#include <stdint.h>

#include "model/params.h"
#include "optim/state_io.h"

typedef struct {
    mt_optim_state *s;
    mt_state_io io;   /* ctx: this struct */
    uint64_t sr_seed; /* the state's seed, then what set_sr_seed last received */
    int n_sets;       /* calls of set_weights, set_parts and set_sr_seed */
} mt_test_state;

/* A state of t->total parameters in format f (weights and moments zero), seed: tight's. */
mt_test_state *mt_test_state_create(mt_state_format f, const mt_param_table *t, uint64_t seed);
void mt_test_state_free(mt_test_state *ts);

/* Random values in every tensor of t, through io: weights normal(0, 0.05) (the format's rounding),
 * full's moments normal(0, 0.05) and squares of normal(0, 1e-3), 8-bit codes uniform bytes and
 * scales uniform in [1e-4, 1). Deterministic in seed. */
void mt_test_state_fill_random(mt_test_state *ts, const mt_param_table *t, uint64_t seed);

/* 1 when every tensor of t has bitwise the same weights and parts in a and b (read through their
 * io); else prints the first difference and returns 0. */
int mt_test_state_equal(mt_test_state *a, mt_test_state *b, const mt_param_table *t);

/* dir's Hugging Face model (model.safetensors + config.json) loads into t with ts's weights, bit
 * for bit. */
void mt_test_state_model_dir(mt_test_state *ts, const mt_param_table *t, const char *dir);

/* Every byte of the state's arenas (mt_optim_state_arenas, the upload copy included) set to byte,
 * and the check that they all still are (a refused load wrote nothing). */
void mt_test_state_poison(mt_test_state *ts, unsigned char byte);
int mt_test_state_poisoned(const mt_test_state *ts, unsigned char byte);

#endif
