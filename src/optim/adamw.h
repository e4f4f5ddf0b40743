/* CPU AdamW: torch.optim.AdamW (single-tensor path, foreach=False) on fp32 master weights and
 * moments in host RAM, fused with gradient scaling (the global-norm clip coefficient) and the
 * write of the upload copy (bf16 or fp32) the next forward pass streams to the GPU.
 *
 * Per element, all in fp32, each operation rounded as torch's CPU kernels round it:
 *   g  = grad * grad_scale                          (clip_grad_norm_'s g.mul_(coef))
 *   p  = p * f32(1 - lr*wd)                         (only when wd != 0)
 *   m  = fma(f32(1-beta1), g - m, m)                (m.lerp_(g, 1-beta1); fma(w-1, g-m, g)
 *                                                    when 1-beta1 >= 0.5, as torch's lerp)
 *   v  = fma(f32(1-beta2) * g, g, v * f32(beta2))   (v.mul_(beta2).addcmul_(g, g, 1-beta2))
 *   d  = sqrt(v) / f32(sqrt(1-beta2^step)) + f32(eps)
 *   p  = p + (f32(-lr/(1-beta1^step)) * m) / d      (p.addcdiv_(m, d, value=-step_size))
 * The scalar constants are computed in double from double hyperparameters, like torch's Python
 * floats, then rounded once to fp32. True (correctly rounded) sqrt and division everywhere, no
 * rsqrt/rcp, so the AVX-512, AVX2 and plain C paths give bitwise identical results, for any
 * thread count. Against torch 2.15 (x86, AVX2) the only difference is sqrt: torch's CPU sqrt is
 * MKL's vsSqrt, within 1 ulp but not correctly rounded, so ~1% of params differ by an ulp or so
 * after 10 steps; with a correctly rounded sqrt swapped in, torch's kernels match bitwise.
 */
#ifndef MT_ADAMW_H
#define MT_ADAMW_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "optim/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* lr, beta1, beta2, eps, weight_decay (the caller passes 0 for 1-D tensors), step (1-based),
 * grad_scale (fp32 clip coefficient, mt_adamw_clip_coef; 1 = none): state.h's mt_optim_step. */
typedef mt_optim_step mt_adamw_step_args;

/* The step's fp32 constants, computed in double from the double hyperparameters and rounded once
 * each, as torch's Python floats are: the one definition every AdamW kernel uses (full's here,
 * the 8-bit formats' in state.c, the GPU tier's in backend/cuda/optim.cu). */
typedef struct {
    float gs;         /* grad_scale */
    float decay;      /* f32(1 - lr*wd) */
    int do_decay;     /* wd != 0 (torch skips the multiply then) */
    float lerp_coef;  /* f32(1-beta1), or f32(1-beta1) - 1 when not "small" (torch's lerp) */
    int lerp_small;   /* |1-beta1| < 0.5: fma(w, g-m, m); else fma(w-1, g-m, g) */
    float b2, c2;     /* f32(beta2), f32(1-beta2) */
    float bc2s;       /* f32(sqrt(1 - beta2^step)) */
    float inv_bc2s;   /* f32(1 / sqrt(1 - beta2^step)): the 8-bit formats' (kernel.h) */
    float eps;
    float neg_step;   /* f32(-lr / (1 - beta1^step)) */
} mt_adamw_consts;

/* Fatal for step < 1 (1-based). */
mt_adamw_consts mt_adamw_consts_of(const mt_adamw_step_args *a);

/* One AdamW step over n elements. upload (may be NULL) receives the new param as bf16 (round to
 * nearest even, == mt_f32_to_bf16) when upload_dtype is MT_BF16, or an fp32 copy for MT_F32.
 * Aliasing: upload may be the very buffer grad points to (grad == upload, same element type:
 * fp32 grad with MT_F32 upload, or bf16 grad with MT_BF16 upload); each grad element is read
 * before its upload element is written. Any other overlap of the buffers is not allowed.
 * n_threads <= 0 means omp_get_max_threads(); threads take chunks of 256K elements, so n below
 * 512K runs on the calling thread. */
void mt_adamw_update(const mt_adamw_step_args *a, float *param, float *m, float *v,
                     const float *grad, size_t n, void *upload, mt_dtype upload_dtype,
                     int n_threads);
/* The same with a bf16 gradient: g = f32(grad) * grad_scale. */
void mt_adamw_update_bf16(const mt_adamw_step_args *a, float *param, float *m, float *v,
                          const mt_bf16 *grad, size_t n, void *upload, mt_dtype upload_dtype,
                          int n_threads);

/* clip_grad_norm_'s coefficient as torch computes it in fp32 from the fp32 total norm:
 * min(1, reciprocal(total_norm + 1e-6) * max_norm). max_norm <= 0 (clipping off) gives 1. */
float mt_adamw_clip_coef(float total_norm, double max_norm);

/* Instruction-set paths. The best the CPU supports is chosen on first use; the environment
 * variable MT_ADAMW_ISA=avx512|avx2|scalar overrides it (a path the CPU lacks is fatal). */
typedef enum { MT_ADAMW_SCALAR = 0, MT_ADAMW_AVX2 = 1, MT_ADAMW_AVX512 = 2 } mt_adamw_isa;

const char *mt_adamw_isa_name(mt_adamw_isa isa);
int mt_adamw_isa_supported(mt_adamw_isa isa);
mt_adamw_isa mt_adamw_isa_active(void);
/* For tests and benchmarks: switch the path used by later calls (not while updates run).
 * Returns MT_ERR (with a message) when the CPU lacks it. */
int mt_adamw_set_isa(mt_adamw_isa isa);

#ifdef __cplusplus
}
#endif

#endif
