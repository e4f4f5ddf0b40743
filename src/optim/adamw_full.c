/* CPU AdamW: constants, ISA dispatch, the thread split and the plain C kernel.
 * The vector kernels live in full_avx2.c and full_avx512.c. */
#include "adamw.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_isa.h"
#include "core/error.h"
#include "full_kernel.h"

/* libgomp is not instrumented for ThreadSanitizer, which then sees no order between the caller and
 * the team. The annotations supply exactly that order (caller -> each worker -> caller) and no
 * order among the workers, so TSan still checks that the thread chunks never overlap; run() itself
 * (and so its outlined region, whose prologue reads the captured variables before any annotation
 * can run) is left uninstrumented. The kernels it calls are instrumented. */
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define MT_TSAN_RELEASE(x) __tsan_release(x)
#define MT_TSAN_ACQUIRE(x) __tsan_acquire(x)
#define MT_TSAN_SKIP __attribute__((no_sanitize_thread))
#else
#define MT_TSAN_RELEASE(x) ((void)(x))
#define MT_TSAN_ACQUIRE(x) ((void)(x))
#define MT_TSAN_SKIP
#endif


/* ---- the plain C kernel ---- */

void mt_adamw_kernel_scalar(const mt_adamw_consts *c, float *p, float *m, float *v,
                            const void *grad, int grad_bf16, void *upload, int upload_kind,
                            size_t n) {
    mt_adamw_elems(c, p, m, v, grad, grad_bf16, upload, upload_kind, 0, n);
}

/* ---- dispatch ---- */

const char *mt_adamw_isa_name(mt_adamw_isa isa) { return mt_isa_name((mt_isa)isa); }

int mt_adamw_isa_supported(mt_adamw_isa isa) { return mt_isa_supported((mt_isa)isa); }

mt_adamw_isa mt_adamw_isa_active(void) { return (mt_adamw_isa)mt_isa_active(); }

int mt_adamw_set_isa(mt_adamw_isa isa) { return mt_isa_set((mt_isa)isa); }

static mt_adamw_kernel_fn kernel_for(mt_adamw_isa isa) {
    switch (isa) {
    case MT_ADAMW_AVX512: return mt_adamw_kernel_avx512;
    case MT_ADAMW_AVX2: return mt_adamw_kernel_avx2;
    default: return mt_adamw_kernel_scalar;
    }
}

/* ---- constants and the thread split ---- */

mt_adamw_consts mt_adamw_consts_of(const mt_adamw_step_args *a) {
    MT_CHECK(a->step >= 1, "AdamW step is 1-based, got %lld", (long long)a->step);
    mt_adamw_consts c;
    memset(&c, 0, sizeof c);
    c.gs = a->grad_scale;
    c.do_decay = a->weight_decay != 0.0;
    c.decay = (float)(1.0 - a->lr * a->weight_decay);
    float w = (float)(1.0 - a->beta1);
    c.lerp_small = fabsf(w) < 0.5f;
    c.lerp_coef = c.lerp_small ? w : w - 1.0f;
    c.b2 = (float)a->beta2;
    c.c2 = (float)(1.0 - a->beta2);
    /* Python: beta**step with a float step, bias_correction2**0.5 */
    double bc1 = 1.0 - pow(a->beta1, (double)a->step);
    double bc2 = 1.0 - pow(a->beta2, (double)a->step);
    c.bc2s = (float)pow(bc2, 0.5);
    c.inv_bc2s = (float)(1.0 / pow(bc2, 0.5));
    c.eps = (float)a->eps;
    c.neg_step = (float)(-(a->lr / bc1));
    return c;
}

static int upload_kind(mt_dtype t, const void *upload) {
    if (!upload) return MT_ADAMW_UP_NONE;
    MT_CHECK(t == MT_BF16 || t == MT_F32, "AdamW upload dtype %s: expected BF16 or F32",
             mt_dtype_name(t));
    return t == MT_BF16 ? MT_ADAMW_UP_BF16 : MT_ADAMW_UP_F32;
}

static int overlaps(const void *a, size_t abytes, const void *b, size_t bbytes) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + bbytes && y < x + abytes;
}

MT_TSAN_SKIP static void run(const mt_adamw_step_args *a, float *param, float *m, float *v, const void *grad,
                int grad_bf16, size_t n, void *upload, mt_dtype upload_dtype, int n_threads) {
    if (n == 0) return;
    mt_adamw_consts c = mt_adamw_consts_of(a);
    int uk = upload_kind(upload_dtype, upload);
    size_t gsz = grad_bf16 ? 2 : 4, usz = uk == MT_ADAMW_UP_BF16 ? 2 : 4;
    /* Only exact grad == upload aliasing with one element size is safe under the thread split. */
    if (uk != MT_ADAMW_UP_NONE && overlaps(grad, n * gsz, upload, n * usz))
        MT_CHECK(grad == upload && gsz == usz,
                 "AdamW: upload overlaps grad other than exactly, with the same element type");
    mt_adamw_kernel_fn fn = kernel_for(mt_adamw_isa_active());

    /* Chunks of MT_ADAMW_CHUNK elements handed out dynamically: every element is computed the
     * same way wherever it lands, so results do not depend on the thread count or schedule. */
    size_t nchunks = (n + MT_ADAMW_CHUNK - 1) / MT_ADAMW_CHUNK;
    size_t nt = n_threads > 0 ? (size_t)n_threads : (size_t)omp_get_max_threads();
    if (nt > nchunks) nt = nchunks;
    if (nt <= 1) {
        fn(&c, param, m, v, grad, grad_bf16, upload, uk, n);
        return;
    }
    const char *gb = grad;
    char *ub = upload;
    char sync[2]; /* TSan sync objects: [0] team start, [1] team end */
    MT_TSAN_RELEASE(&sync[0]);
#pragma omp parallel for schedule(dynamic, 1) num_threads((int)nt)
    for (size_t k = 0; k < nchunks; k++) {
        MT_TSAN_ACQUIRE(&sync[0]);
        size_t lo = k * MT_ADAMW_CHUNK, hi = lo + MT_ADAMW_CHUNK < n ? lo + MT_ADAMW_CHUNK : n;
        fn(&c, param + lo, m + lo, v + lo, gb + lo * gsz, grad_bf16, ub ? ub + lo * usz : NULL, uk,
           hi - lo);
        MT_TSAN_RELEASE(&sync[1]);
    }
    MT_TSAN_ACQUIRE(&sync[1]);
}

void mt_adamw_update(const mt_adamw_step_args *a, float *param, float *m, float *v,
                     const float *grad, size_t n, void *upload, mt_dtype upload_dtype,
                     int n_threads) {
    run(a, param, m, v, grad, 0, n, upload, upload_dtype, n_threads);
}

void mt_adamw_update_bf16(const mt_adamw_step_args *a, float *param, float *m, float *v,
                          const mt_bf16 *grad, size_t n, void *upload, mt_dtype upload_dtype,
                          int n_threads) {
    run(a, param, m, v, grad, 1, n, upload, upload_dtype, n_threads);
}

float mt_adamw_clip_coef(float total_norm, double max_norm) {
    if (!(max_norm > 0.0)) return 1.0f;
    /* torch: clip_coef = max_norm / (total_norm + 1e-6) is Tensor.__rtruediv__, i.e.
     * reciprocal(total_norm + 1e-6) * max_norm, in fp32; then clamp(max=1), NaN passes through. */
    float d = total_norm + (float)1e-6;
    float r = 1.0f / d;
    float coef = r * (float)max_norm;
    return coef > 1.0f ? 1.0f : coef;
}
