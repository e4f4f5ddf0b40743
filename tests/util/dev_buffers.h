/* Device buffers for the tests that compare a backend (bf16 storage) against the fp32 CPU
 * reference: uploads and downloads with the bf16 <-> fp32 conversion, outputs poisoned with NaN
 * (bf16 0x7fc0, fp32 NaN) so that an element the op does not write fails, and checks of a device
 * result against a host reference. Only the mt_backend interface is called (no CUDA here), so the
 * helpers build in CPU-only builds too. Device buffers are be->alloc'd (be->free); host arrays
 * malloc'd (free). */
#ifndef MT_TEST_DEV_BUFFERS_H
#define MT_TEST_DEV_BUFFERS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* A device copy of `bytes` bytes of host memory. */
void *mt_test_up_raw(mt_backend *be, const void *x, size_t bytes);
/* n fp32 values rounded to bf16 (nearest even) on the device. */
void *mt_test_up_bf(mt_backend *be, const float *x, size_t n);
float *mt_test_up_f32(mt_backend *be, const float *x, size_t n);
int32_t *mt_test_up_i32(mt_backend *be, const int32_t *x, size_t n);
/* n device bf16 values (d) or fp32 values (f32) as a host fp32 array. */
float *mt_test_down_bf(mt_backend *be, const void *d, size_t n);
float *mt_test_down_f32(mt_backend *be, const void *d, size_t n);
/* n device elements of NaN. */
void *mt_test_poison_bf(mt_backend *be, size_t n);
float *mt_test_poison_f32(mt_backend *be, size_t n);

/* A device bf16 (bf) or fp32 (f32) result against the host reference by mt_test_check_rms. */
int mt_test_check_bf(mt_backend *be, const char *what, const void *d, const float *ref, size_t n,
                     double atol_rel, double rtol);
int mt_test_check_f32(mt_backend *be, const char *what, const void *d, const float *ref, size_t n,
                      double atol_rel, double rtol);
/* A device bf16 result of `rows` rows of `width` by mt_test_check_rows. */
int mt_test_check_rows_bf(mt_backend *be, const char *what, const void *d, const float *ref, size_t rows,
                          size_t width, double atol_rel, double rtol, double tensor_tol);

/* bytes at a and b are equal; prints "bit-identical on rerun" or a failure. */
int mt_test_same_bits(const char *what, const void *a, const void *b, size_t bytes);

#endif
