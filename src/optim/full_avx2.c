/* AdamW kernel, AVX2 + FMA, 8 floats a vector. The same operations in the same order as
 * mt_adamw_elem (full_kernel.h), so the results are bitwise those of the plain C path.
 * Compiled with a target attribute: no special flags; used only when the CPU has AVX2 and FMA. */
#include "full_kernel.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define MT_AVX2 __attribute__((target("avx2,fma")))
#define MT_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) static inline

/* bf16 <-> fp32 with mt_f32_to_bf16's rounding: nearest even, NaN stays a quiet NaN. */
MT_AVX2_INLINE __m256 load_bf16(const mt_bf16 *s) {
    __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)s));
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}

MT_AVX2_INLINE __m128i to_bf16(__m256 f) {
    __m256i u = _mm256_castps_si256(f);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    __m256i qnan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    __m256 isnan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
    r = _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(isnan));
    /* values fit 16 bits: pack within lanes, then gather the two low quarters */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

MT_AVX2_INLINE void body(const mt_adamw_consts *c, float *p, float *m, float *v, const void *grad,
                         const int grad_bf16, void *upload, const int upload_kind, size_t n) {
    const float *gf = grad;
    const mt_bf16 *gh = grad;
    float *uf = upload;
    mt_bf16 *uh = upload;
    const __m256 gs = _mm256_set1_ps(c->gs), decay = _mm256_set1_ps(c->decay),
                 lc = _mm256_set1_ps(c->lerp_coef), b2 = _mm256_set1_ps(c->b2),
                 c2 = _mm256_set1_ps(c->c2), bc2s = _mm256_set1_ps(c->bc2s),
                 eps = _mm256_set1_ps(c->eps), ns = _mm256_set1_ps(c->neg_step);
    const int do_decay = c->do_decay, small = c->lerp_small;
    /* streaming upload stores when the upload is its own buffer: peel to 64-byte alignment */
    size_t i = mt_adamw_stream_peel(grad, upload, upload_kind, n);
    const int stream = upload_kind != MT_ADAMW_UP_NONE && i < n;
    if (!stream) i = 0;
    mt_adamw_elems(c, p, m, v, grad, grad_bf16, upload, upload_kind, 0, i);
    const int pf = MT_ADAMW_PREFETCH;
    for (; i + 8 <= n; i += 8) {
        if (!(i & 15)) { /* once per 64-byte line of the fp32 streams */
            _mm_prefetch((const char *)(p + i) + pf, _MM_HINT_T0);
            _mm_prefetch((const char *)(m + i) + pf, _MM_HINT_T0);
            _mm_prefetch((const char *)(v + i) + pf, _MM_HINT_T0);
            if (grad_bf16) _mm_prefetch((const char *)(gh + i) + pf / 2, _MM_HINT_T0);
            else _mm_prefetch((const char *)(gf + i) + pf, _MM_HINT_T0);
        }
        __m256 g = grad_bf16 ? load_bf16(gh + i) : _mm256_loadu_ps(gf + i);
        g = _mm256_mul_ps(g, gs);
        __m256 pp = _mm256_loadu_ps(p + i);
        if (do_decay) pp = _mm256_mul_ps(pp, decay);
        __m256 mm = _mm256_loadu_ps(m + i);
        mm = _mm256_fmadd_ps(lc, _mm256_sub_ps(g, mm), small ? mm : g);
        __m256 vv = _mm256_mul_ps(_mm256_loadu_ps(v + i), b2);
        vv = _mm256_fmadd_ps(_mm256_mul_ps(c2, g), g, vv);
        __m256 d = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), bc2s), eps);
        pp = _mm256_add_ps(pp, _mm256_div_ps(_mm256_mul_ps(ns, mm), d));
        _mm256_storeu_ps(p + i, pp);
        _mm256_storeu_ps(m + i, mm);
        _mm256_storeu_ps(v + i, vv);
        if (upload_kind == MT_ADAMW_UP_BF16) {
            if (stream) _mm_stream_si128((__m128i *)(uh + i), to_bf16(pp));
            else _mm_storeu_si128((__m128i *)(uh + i), to_bf16(pp));
        } else if (upload_kind == MT_ADAMW_UP_F32) {
            if (stream) _mm256_stream_ps(uf + i, pp);
            else _mm256_storeu_ps(uf + i, pp);
        }
    }
    mt_adamw_elems(c, p, m, v, grad, grad_bf16, upload, upload_kind, i, n);
    if (stream) _mm_sfence(); /* streaming stores are weakly ordered: drain before returning */
}

MT_AVX2 void mt_adamw_kernel_avx2(const mt_adamw_consts *c, float *p, float *m, float *v,
                                  const void *grad, int grad_bf16, void *upload, int upload_kind,
                                  size_t n) {
    /* One specialised loop per (grad type, upload kind): no per-vector branching on them. */
    switch (grad_bf16 * 3 + upload_kind) {
    case 0: body(c, p, m, v, grad, 0, upload, MT_ADAMW_UP_NONE, n); break;
    case 1: body(c, p, m, v, grad, 0, upload, MT_ADAMW_UP_BF16, n); break;
    case 2: body(c, p, m, v, grad, 0, upload, MT_ADAMW_UP_F32, n); break;
    case 3: body(c, p, m, v, grad, 1, upload, MT_ADAMW_UP_NONE, n); break;
    case 4: body(c, p, m, v, grad, 1, upload, MT_ADAMW_UP_BF16, n); break;
    default: body(c, p, m, v, grad, 1, upload, MT_ADAMW_UP_F32, n); break;
    }
}

#else
void mt_adamw_kernel_avx2(const mt_adamw_consts *c, float *p, float *m, float *v,
                          const void *grad, int grad_bf16, void *upload, int upload_kind,
                          size_t n) {
    mt_adamw_kernel_scalar(c, p, m, v, grad, grad_bf16, upload, upload_kind, n);
}
#endif
