#include "util/host_buffers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"

float *mt_test_fnew(size_t n) { return malloc((n ? n : 1) * sizeof(float)); }

double *mt_test_dnew(size_t n) { return calloc(n ? n : 1, sizeof(double)); }

void mt_test_nan_fill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

float *mt_test_randn(mt_test_rng *rng, size_t n, float std) {
    float *x = mt_test_fnew(n);
    mt_test_fill_normal(rng, x, n, std);
    return x;
}

float *mt_test_randn_bf(mt_test_rng *rng, size_t n, float std) {
    float *x = mt_test_randn(rng, n, std);
    mt_test_round_bf16(x, n);
    return x;
}

float *mt_test_copyf(const float *x, size_t n) {
    float *y = mt_test_fnew(n);
    memcpy(y, x, n * sizeof(float));
    return y;
}

float *mt_test_plus(const float *base, const float *g, float k, size_t n) {
    float *r = mt_test_fnew(n);
    for (size_t i = 0; i < n; i++) r[i] = (float)((double)base[i] + k * (double)g[i]);
    return r;
}

double *mt_test_to_double(const float *x, size_t n) {
    double *d = mt_test_dnew(n);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

float *mt_test_to_float(const double *x, size_t n) {
    float *f = mt_test_fnew(n);
    for (size_t i = 0; i < n; i++) f[i] = (float)x[i];
    return f;
}

float mt_test_bf_round(float x) { return mt_bf16_to_f32(mt_f32_to_bf16(x)); }

void mt_test_round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = mt_test_bf_round(x[i]);
}

double *mt_test_fd_grad_d(double (*loss)(void *ctx), void *ctx, double *x, size_t n, double h) {
    double *g = mt_test_dnew(n);
    for (size_t i = 0; i < n; i++) {
        double save = x[i];
        x[i] = save + h;
        double lp = loss(ctx);
        x[i] = save - h;
        double lm = loss(ctx);
        x[i] = save;
        g[i] = (lp - lm) / (2 * h);
    }
    return g;
}

float *mt_test_fd_grad(double (*loss)(void *ctx), void *ctx, double *x, size_t n, double h) {
    double *gd = mt_test_fd_grad_d(loss, ctx, x, n, h);
    float *g = mt_test_to_float(gd, n);
    free(gd);
    return g;
}
