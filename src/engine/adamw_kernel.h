/* Internal to the AdamW files: the per-call fp32 constants and the per-ISA kernel signature.
 * The scalar element function below is the definition every vector path reproduces op for op. */
#ifndef MT_ADAMW_KERNEL_H
#define MT_ADAMW_KERNEL_H

#include <math.h>
#include <stddef.h>

#include "../core/dtype.h"

/* Contracting a*b+c into an FMA would change rounding; only the explicit fmaf() may be fused.
 * GCC contracts only under -ffp-contract=fast, which -std=c11 (our build) turns off; clang
 * contracts within one expression, so every rounding step below is its own statement. The
 * cross-ISA bitwise test catches a build that fuses anyway. */

typedef struct {
    float gs;         /* grad_scale */
    float decay;      /* f32(1 - lr*wd) */
    int do_decay;     /* wd != 0 (torch skips the multiply then) */
    float lerp_coef;  /* f32(1-beta1), or f32(1-beta1) - 1 when not "small" (torch's lerp) */
    int lerp_small;   /* |1-beta1| < 0.5: fma(w, g-m, m); else fma(w-1, g-m, g) */
    float b2, c2;     /* f32(beta2), f32(1-beta2) */
    float bc2s;       /* f32(sqrt(1 - beta2^step)) */
    float eps;
    float neg_step;   /* f32(-lr / (1 - beta1^step)) */
} mt_adamw_consts;

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

#endif
