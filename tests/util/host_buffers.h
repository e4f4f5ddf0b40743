/* Host arrays for the op tests: allocation, random inputs (plain fp32 or on the bf16 grid), copies,
 * NaN poisoning, double <-> float copies and central differences. Every returned array is malloc'd
 * (the caller frees); n = 0 allocates one element, so the result is never NULL for a valid n. */
#ifndef MT_TEST_HOST_BUFFERS_H
#define MT_TEST_HOST_BUFFERS_H

#include <stddef.h>

#include "util/testutil.h"

/* n floats, uninitialised. */
float *mt_test_fnew(size_t n);
/* n doubles, zeroed. */
double *mt_test_dnew(size_t n);
/* Every element NaN, so that an output the op does not write fails the check. */
void mt_test_nan_fill(float *x, size_t n);
/* normal(0, std) in fp32. */
float *mt_test_randn(mt_test_rng *rng, size_t n, float std);
/* normal(0, std) drawn in fp32 and rounded to the bf16 grid (what a bf16 backend stores exactly). */
float *mt_test_randn_bf(mt_test_rng *rng, size_t n, float std);
float *mt_test_copyf(const float *x, size_t n);
/* base[i] + k * g[i] in double, rounded once: the expected value of an accumulated output. */
float *mt_test_plus(const float *base, const float *g, float k, size_t n);
double *mt_test_to_double(const float *x, size_t n);
float *mt_test_to_float(const double *x, size_t n);

/* x rounded to bf16 (nearest even) and back; the array form rounds in place. */
float mt_test_bf_round(float x);
void mt_test_round_bf16(float *x, size_t n);

/* The gradient of loss(ctx) with respect to the n doubles at x by central differences of step h,
 * (loss(x + h) - loss(x - h)) / 2h; x is restored. The float form rounds it once. */
double *mt_test_fd_grad_d(double (*loss)(void *ctx), void *ctx, double *x, size_t n, double h);
float *mt_test_fd_grad(double (*loss)(void *ctx), void *ctx, double *x, size_t n, double h);

#endif
