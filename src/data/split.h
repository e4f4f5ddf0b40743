/* --eval-split F: a deterministic fraction of the data held out as the eval set, never trained on.
 *
 * The data is cut into units: a token file's windows of T tokens (window k is the row of T+1 tokens
 * from k*T, its targets the positions k*T+1 .. k*T+T, as the shuffle's windows in tokens.h), a
 * packed file's rows (chat data packed whole: whole conversations). Unit u is held out when
 * hash(seed, u) / 2^64 < F, so which units are held out depends only on the data (its unit count),
 * T and --seed: the same on every run and resume, and independent of the batch order. Two windows
 * never share a target position, so no eval target is ever a training target.
 *
 * Training rows go over the train units only, in the order of tokens.h: global row g = step*B + r
 * belongs to epoch e = g / n_train and reads train unit slot g mod n_train, permuted by
 * mt_tokens_perm(seed, e, n_train, .) under shuffle; each epoch visits every train unit once. The
 * eval order is the held-out units in ascending order.
 */
#ifndef MT_DATA_SPLIT_H
#define MT_DATA_SPLIT_H

#include <stdint.h>

#include "data/tokens.h"

typedef struct {
    int64_t units;           /* 0: no split */
    int64_t n_train, n_eval; /* both >= 1 */
    int64_t *train, *eval;   /* unit indices, ascending */
} mt_data_split;

/* 1 when unit u is held out for fraction (0 < fraction < 1) and seed. */
int mt_data_split_held_out(uint64_t seed, double fraction, int64_t u);

/* Splits units (>= 1) units. MT_ERR, one line naming what ("DATA: 40 packed rows") when a side is
 * left empty, or when fraction is not in (0, 1). */
int mt_data_split_make(mt_data_split *s, int64_t units, double fraction, uint64_t seed, const char *what);
void mt_data_split_free(mt_data_split *s); /* a zeroed or freed *s is fine */

/* The unit that global training row g (>= 0) reads. */
int64_t mt_data_split_train_unit(const mt_data_split *s, const mt_batch_order *o, int64_t g);

#endif
