/* Internal to the AdamW files: the per-ISA kernel signature (the fp32 constants are adamw.h's).
 * The scalar element function below is the definition every vector path reproduces op for op. */
#ifndef MT_ADAMW_KERNEL_H
#define MT_ADAMW_KERNEL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "optim/adamw.h"

/* Contracting a*b+c into an FMA would change rounding; only the explicit fmaf() may be fused.
 * GCC contracts only under -ffp-contract=fast, which -std=c11 (our build) turns off; clang
 * contracts within one expression, so every rounding step below is its own statement. The
 * cross-ISA bitwise test catches a build that fuses anyway. */

enum { MT_ADAMW_UP_NONE = 0, MT_ADAMW_UP_BF16 = 1, MT_ADAMW_UP_F32 = 2 };

/* Updates n elements; grad is fp32 or bf16 (grad_bf16), upload as upload_kind. grad and upload
 * may be the same buffer: every path reads grad[i] before it writes upload[i]. */
typedef void (*mt_adamw_kernel_fn)(const mt_adamw_consts *c, float *p, float *m, float *v,
                                   const void *grad, int grad_bf16, void *upload, int upload_kind,
                                   size_t n);

void mt_adamw_kernel_scalar(const mt_adamw_consts *c, float *p, float *m, float *v,
                            const void *grad, int grad_bf16, void *upload, int upload_kind,
                            size_t n);
void mt_adamw_kernel_avx2(const mt_adamw_consts *c, float *p, float *m, float *v,
                          const void *grad, int grad_bf16, void *upload, int upload_kind,
                          size_t n);
void mt_adamw_kernel_avx512(const mt_adamw_consts *c, float *p, float *m, float *v,
                            const void *grad, int grad_bf16, void *upload, int upload_kind,
                            size_t n);

/* Tunables, measured with `megatrain bench adamw` (256M params) on the 16-core AVX-512 Xeon:
 * - threads take chunks of MT_ADAMW_CHUNK elements dynamically: 3.6 -> 4.3 Gparam/s against one
 *   static block per thread (cores of the VM do not all stream equally fast);
 * - software prefetch MT_ADAMW_PREFETCH bytes ahead in every stream: +10%;
 * - streaming (non-temporal) stores for the upload when it is a separate, write-only buffer:
 *   +5% (no read-for-ownership). When the upload is the gradient buffer its lines are already
 *   cached and streaming stores cost 13%; for param/m/v (read, then written) they cost 10-20%. */
#define MT_ADAMW_CHUNK ((size_t)1 << 18)
#define MT_ADAMW_PREFETCH 1536

/* One element; returns the new param. Also the tail of the vector paths. */
static inline float mt_adamw_elem(const mt_adamw_consts *c, float *p, float *m, float *v,
                                  float graw) {
    float g = graw * c->gs;
    float pp = *p;
    if (c->do_decay) pp = pp * c->decay;
    float mm = *m;
    mm = fmaf(c->lerp_coef, g - mm, c->lerp_small ? mm : g);
    float vv = *v * c->b2;
    vv = fmaf(c->c2 * g, g, vv); /* torch's addcmul: fmadd(value * t1, t2, self) */
    float d = sqrtf(vv) / c->bc2s;
    d = d + c->eps;
    float u = c->neg_step * mm;
    u = u / d;
    pp = pp + u;
    *p = pp;
    *m = mm;
    *v = vv;
    return pp;
}

/* The scalar path for elements [i, n): the plain C kernel, and the peel and tail of the vector
 * paths. */
static inline void mt_adamw_elems(const mt_adamw_consts *c, float *p, float *m, float *v,
                                  const void *grad, int grad_bf16, void *upload, int upload_kind,
                                  size_t i, size_t n) {
    const float *gf = grad;
    const mt_bf16 *gh = grad;
    mt_bf16 *uh = upload;
    float *uf = upload;
    for (; i < n; i++) {
        float g = grad_bf16 ? mt_bf16_to_f32(gh[i]) : gf[i]; /* read before upload[i] is written */
        float np = mt_adamw_elem(c, p + i, m + i, v + i, g);
        if (upload_kind == MT_ADAMW_UP_BF16) uh[i] = mt_f32_to_bf16(np);
        else if (upload_kind == MT_ADAMW_UP_F32) uf[i] = np;
    }
}

/* Elements to handle one by one so that upload + i is 64-byte aligned for streaming stores
 * (all of n when the upload is absent, aliases grad, or is not element-aligned). */
static inline size_t mt_adamw_stream_peel(const void *grad, const void *upload, int upload_kind,
                                          size_t n) {
    size_t esz = upload_kind == MT_ADAMW_UP_BF16 ? 2 : 4;
    uintptr_t u = (uintptr_t)upload;
    if (!upload || upload == grad || u % esz) return n;
    size_t peel = ((64 - (u & 63)) & 63) / esz;
    return peel < n ? peel : n;
}

#endif
