/* The experts' GEMMs as a loop over experts: see backend.h's moe_matmul_forward. */
#include "backend.h"

/* Row r0 of a (rows, width) tensor of be's compute dtype. */
static char *rows_at(const mt_backend *be, const void *base, int r0, int width) {
    return (char *)base + (size_t)r0 * (size_t)width * mt_dtype_size(be->dtype);
}

void mt_backend_moe_matmul_loop_forward(mt_backend *be, void *out, const void *inp,
                                        const void *weight, size_t w_stride,
                                        const int32_t *offsets, const int32_t *offsets_host, int E,
                                        int K, int M) {
    size_t wsz = mt_dtype_size(be->dtype);
    for (int e = 0; e < E; e++) {
        int r0 = offsets_host[e], m = offsets_host[e + 1] - r0;
        if (m == 0) continue;
        be->matmul_forward(be, rows_at(be, out, r0, M), rows_at(be, inp, r0, K),
                           (const char *)weight + (size_t)e * w_stride * wsz, NULL, m, K, M);
    }
}

void mt_backend_moe_matmul_loop_backward(mt_backend *be, void *dinp, float *dweight,
                                         const void *dout, const void *inp, const void *weight,
                                         size_t w_stride, const int32_t *offsets,
                                         const int32_t *offsets_host, int E, int K, int M,
                                         int accumulate) {
    size_t wsz = mt_dtype_size(be->dtype);
    if (!dinp && !dweight) return;
    for (int e = 0; e < E; e++) {
        int r0 = offsets_host[e], m = offsets_host[e + 1] - r0;
        if (m == 0) continue; /* no token: no contribution to this expert's gradient */
        /* a NULL dinp or dweight (frozen experts) stays NULL: never offset */
        be->matmul_backward(be, dinp ? rows_at(be, dinp, r0, K) : NULL,
                            dweight ? dweight + (size_t)e * w_stride : NULL, NULL,
                            rows_at(be, dout, r0, M), rows_at(be, inp, r0, K),
                            (const char *)weight + (size_t)e * w_stride * wsz, m, K, M, accumulate);
    }
}
