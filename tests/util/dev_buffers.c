#include "util/dev_buffers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "util/host_buffers.h"
#include "util/testutil.h"

void *mt_test_up_raw(mt_backend *be, const void *x, size_t bytes) {
    void *d = be->alloc(be, bytes);
    be->upload(be, d, x, bytes);
    return d;
}

void *mt_test_up_bf(mt_backend *be, const float *x, size_t n) {
    mt_bf16 *h = malloc((n ? n : 1) * sizeof(mt_bf16));
    mt_convert_f32_to_bf16(h, x, n);
    void *d = mt_test_up_raw(be, h, n * sizeof(mt_bf16));
    free(h);
    return d;
}

float *mt_test_up_f32(mt_backend *be, const float *x, size_t n) {
    return mt_test_up_raw(be, x, n * sizeof(float));
}

int32_t *mt_test_up_i32(mt_backend *be, const int32_t *x, size_t n) {
    return mt_test_up_raw(be, x, n * sizeof(int32_t));
}

float *mt_test_down_bf(mt_backend *be, const void *d, size_t n) {
    mt_bf16 *h = malloc((n ? n : 1) * sizeof(mt_bf16));
    be->download(be, h, d, n * sizeof(mt_bf16));
    float *x = mt_test_fnew(n);
    mt_convert_bf16_to_f32(x, h, n);
    free(h);
    return x;
}

float *mt_test_down_f32(mt_backend *be, const void *d, size_t n) {
    float *x = mt_test_fnew(n);
    be->download(be, x, d, n * sizeof(float));
    return x;
}

void *mt_test_poison_bf(mt_backend *be, size_t n) {
    mt_bf16 *h = malloc((n ? n : 1) * sizeof(mt_bf16));
    for (size_t i = 0; i < n; i++) h[i] = 0x7fc0; /* bf16 NaN */
    void *d = mt_test_up_raw(be, h, n * sizeof(mt_bf16));
    free(h);
    return d;
}

float *mt_test_poison_f32(mt_backend *be, size_t n) {
    float *h = mt_test_fnew(n);
    mt_test_nan_fill(h, n);
    float *d = mt_test_up_f32(be, h, n);
    free(h);
    return d;
}

/* mt_test_check_rms of got, which it frees. */
static int check_owned(const char *what, float *got, const float *ref, size_t n, double atol_rel,
                       double rtol) {
    int ok = mt_test_check_rms(what, got, ref, n, atol_rel, rtol);
    free(got);
    return ok;
}

int mt_test_check_bf(mt_backend *be, const char *what, const void *d, const float *ref, size_t n,
                     double atol_rel, double rtol) {
    return check_owned(what, mt_test_down_bf(be, d, n), ref, n, atol_rel, rtol);
}

int mt_test_check_f32(mt_backend *be, const char *what, const void *d, const float *ref, size_t n,
                      double atol_rel, double rtol) {
    return check_owned(what, mt_test_down_f32(be, d, n), ref, n, atol_rel, rtol);
}

int mt_test_check_rows_bf(mt_backend *be, const char *what, const void *d, const float *ref, size_t rows,
                          size_t width, double atol_rel, double rtol, double tensor_tol) {
    float *g = mt_test_down_bf(be, d, rows * width);
    int ok = mt_test_check_rows(what, g, ref, rows, width, atol_rel, rtol, tensor_tol);
    free(g);
    return ok;
}

int mt_test_same_bits(const char *what, const void *a, const void *b, size_t bytes) {
    int ok = memcmp(a, b, bytes) == 0;
    fprintf(stderr, "%-40s %s\n", what, ok ? "bit-identical on rerun" : "DIFFERS on rerun  FAIL");
    return ok;
}
