/* Weights nudged by a small relative amount: the GPU tests' noise envelopes (how far runs from
 * bf16-sized perturbations of the same weights move, against which CUDA-vs-CPU gaps are judged). */
#ifndef MT_TEST_NUDGE_H
#define MT_TEST_NUDGE_H

#include <stdint.h>

#include "model/params.h"

/* A copy of w (t->total floats, aligned; the caller frees) with every element of every tensor
 * scaled by 1 + u, u uniform in (-rel, rel), drawn per tensor from (seed, the tensor's index), so
 * the table's padding does not move the draws. */
float *mt_test_nudged(const mt_param_table *t, const float *w, uint64_t seed, double rel);

#endif
