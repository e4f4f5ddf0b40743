/* compact/tight AdamW kernel, AVX2 + FMA, 8 lanes: the operations of mt_optim_elem and
 * mt_optim_block_requant (kernel.h) in the same order, so the results are bitwise the plain C
 * path's. Table lookups (codes, the quantization cells) are scalar loads, not gathers (kernel.h,
 * mt_optim_block_code_values). Compiled with a target attribute; used only when the CPU has AVX2
 * and FMA. */
#include "kernel.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define MT_AVX2 __attribute__((target("avx2,fma")))
#define MT_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) static inline

MT_AVX2_INLINE __m256 load_bf16(const mt_bf16 *s) {
    __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)s));
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}

/* 8 lanes holding 16-bit values -> 8 uint16 (unsigned: packus; signed: packs) */
MT_AVX2_INLINE void store_u16(void *dst, __m256i x) {
    __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(x, x), 0x08);
    _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(p));
}

MT_AVX2_INLINE void store_i16(void *dst, __m256i x) {
    __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(x, x), 0x08);
    _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(p));
}

/* The quantization cells of 8 lanes by scalar loads, their indices picked out of the register in
 * 64-bit pairs: on Zen 3 3-5% faster than through a block buffer (on Intel both lose to
 * gathers: kernel_avx512.c). The code values' loop (mt_optim_block_code_values) is inlined here,
 * where GCC pairs its loads: 5-8% faster than the same loop kept scalar. */
MT_AVX2_INLINE __m256i lookup_cells(const uint32_t *cell, __m256i idx) {
    __m128i lo = _mm256_castsi256_si128(idx), hi = _mm256_extracti128_si256(idx, 1);
    uint64_t a0 = (uint64_t)_mm_cvtsi128_si64(lo), a1 = (uint64_t)_mm_extract_epi64(lo, 1);
    uint64_t a2 = (uint64_t)_mm_cvtsi128_si64(hi), a3 = (uint64_t)_mm_extract_epi64(hi, 1);
    return _mm256_setr_epi32((int)cell[(uint32_t)a0], (int)cell[a0 >> 32],
                             (int)cell[(uint32_t)a1], (int)cell[a1 >> 32],
                             (int)cell[(uint32_t)a2], (int)cell[a2 >> 32],
                             (int)cell[(uint32_t)a3], (int)cell[a3 >> 32]);
}

MT_AVX2_INLINE __m256i mix32(__m256i x) {
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x85ebca6bu));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 13));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0xc2b2ae35u));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

/* mt_sr_bits16 of the block's indices i .. i+7: blo is the low half of the block's first index,
 * k0 and k1 the keys of its high half and the next (mt_sr_key_of_hi) */
MT_AVX2_INLINE __m256i sr_bits(__m256i blo, __m256i k0, __m256i k1, size_t i) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i flip = _mm256_set1_epi32((int)0x80000000u);
    __m256i lo = _mm256_add_epi32(blo, _mm256_add_epi32(_mm256_set1_epi32((int)i), lanes));
    /* lanes whose low half wrapped (unsigned lo < blo) have the next high half */
    __m256i wrap = _mm256_cmpgt_epi32(_mm256_xor_si256(blo, flip), _mm256_xor_si256(lo, flip));
    __m256i kk = _mm256_blendv_epi8(k0, k1, wrap);
    return _mm256_srli_epi32(mix32(_mm256_xor_si256(lo, kk)), 16);
}

/* mt_qmap_quantize of 8 lanes (x's bits u) -> their codes, one per 32-bit lane */
MT_AVX2_INLINE __m256i quantize_k(const mt_qmap *q, __m256i u) {
    __m256i neg = _mm256_srai_epi32(u, 31);
    __m256i e = lookup_cells(q->cell_by_top, _mm256_srli_epi32(u, 16));
    __m256i k = _mm256_and_si256(e, _mm256_set1_epi32(0xff));
    __m256i t = _mm256_srli_epi32(e, 8);
    __m256i low = _mm256_and_si256(u, _mm256_set1_epi32(0xffff));
    /* values < 2^17: signed compares; masks are -1 */
    __m256i up = _mm256_cmpgt_epi32(_mm256_add_epi32(low, _mm256_set1_epi32(1)), t);
    __m256i dn = _mm256_cmpgt_epi32(low, t);
    return _mm256_blendv_epi8(_mm256_sub_epi32(k, up), _mm256_add_epi32(k, dn), neg);
}

MT_AVX2_INLINE void store_codes(uint8_t *dst, __m256i k) {
    __m128i p16 = _mm_packus_epi32(_mm256_castsi256_si128(k), _mm256_extracti128_si256(k, 1));
    _mm_storel_epi64((__m128i *)dst, _mm_packus_epi16(p16, p16));
}

/* Codes of x[0..n8) * r, n8 a multiple of 8 (mt_optim_block_requant). */
MT_AVX2_INLINE void requant(const mt_qmap *q, const float *x, size_t n8, float r, uint8_t *dst) {
    const __m256 r8 = _mm256_set1_ps(r);
    for (size_t i = 0; i < n8; i += 8)
        store_codes(dst + i, quantize_k(q, _mm256_castps_si256(
                                               _mm256_mul_ps(_mm256_load_ps(x + i), r8))));
}

MT_AVX2_INLINE uint32_t hmax(__m256i x) {
    uint32_t l[8], m = 0;
    _mm256_storeu_si256((__m256i *)l, x);
    for (int j = 0; j < 8; j++) m = l[j] > m ? l[j] : m;
    return m;
}

MT_AVX2_INLINE void block(const mt_optim_consts *c, const mt_optim_span *s, size_t nb,
                          const int grad_bf16, const int tight, const int do_decay,
                          const int small) {
    float mb[MT_OPTIM_BLOCK] __attribute__((aligned(32)));
    float vb[MT_OPTIM_BLOCK] __attribute__((aligned(32)));
    const float *gf = s->grad;
    const mt_bf16 *gh = s->grad;
    const __m256 gs = _mm256_set1_ps(c->gs), decay = _mm256_set1_ps(c->decay),
                 lc = _mm256_set1_ps(c->lerp_coef), b2 = _mm256_set1_ps(c->b2),
                 c2 = _mm256_set1_ps(c->c2), ibc2s = _mm256_set1_ps(c->inv_bc2s),
                 eps = _mm256_set1_ps(c->eps), ns = _mm256_set1_ps(c->neg_step),
                 sm = _mm256_set1_ps(s->ms[0]), sv = _mm256_set1_ps(s->vs[0]);
    const __m256i absm = _mm256_set1_epi32(0x7fffffff), q40 = _mm256_set1_epi32(0x40),
                  half = _mm256_set1_epi32(0x8000);
    __m256i am8 = _mm256_setzero_si256(), av8 = _mm256_setzero_si256();
    __m256i sblo = _mm256_setzero_si256(), sk0 = sblo, sk1 = sblo;
    if (tight) {
        uint32_t hi = (uint32_t)(s->index0 >> 32);
        sblo = _mm256_set1_epi32((int)(uint32_t)s->index0);
        sk0 = _mm256_set1_epi32((int)mt_sr_key_of_hi(c->key, hi));
        sk1 = _mm256_set1_epi32((int)mt_sr_key_of_hi(c->key, hi + 1));
    }
    size_t i = 0, n8 = nb & ~(size_t)7;
    mt_optim_block_code_values(c, s, n8, mb, vb);
    for (; i < n8; i += 8) {
        __m256 g = grad_bf16 ? load_bf16(gh + i) : _mm256_loadu_ps(gf + i);
        g = _mm256_mul_ps(g, gs);
        __m256 pp;
        if (tight) {
            pp = load_bf16(s->w + i);
        } else {
            __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s->w + i)));
            __m256i cp = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)(s->comp + i)));
            pp = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(hi, 16), cp));
        }
        if (do_decay) pp = _mm256_mul_ps(pp, decay);
        __m256 mm = _mm256_mul_ps(_mm256_load_ps(mb + i), sm);
        mm = _mm256_fmadd_ps(lc, _mm256_sub_ps(g, mm), small ? mm : g);
        __m256 vv = _mm256_mul_ps(_mm256_load_ps(vb + i), sv);
        vv = _mm256_mul_ps(vv, b2);
        vv = _mm256_fmadd_ps(_mm256_mul_ps(c2, g), g, vv);
        __m256 d = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vv), ibc2s), eps);
        pp = _mm256_add_ps(pp, _mm256_div_ps(_mm256_mul_ps(ns, mm), d));
        __m256i u = _mm256_castps_si256(pp);
        __m256i isnan = _mm256_castps_si256(_mm256_cmp_ps(pp, pp, _CMP_UNORD_Q));
        __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), q40);
        if (tight) {
            __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, sr_bits(sblo, sk0, sk1, i)), 16);
            store_u16(s->w + i, _mm256_blendv_epi8(r, qnan, isnan));
        } else {
            __m256i h = _mm256_srli_epi32(_mm256_add_epi32(u, half), 16);
            __m256i cp = _mm256_sub_epi32(u, _mm256_slli_epi32(h, 16));
            store_u16(s->w + i, _mm256_blendv_epi8(h, qnan, isnan));
            store_i16(s->comp + i, _mm256_andnot_si256(isnan, cp));
        }
        _mm256_store_ps(mb + i, mm);
        _mm256_store_ps(vb + i, vv);
        am8 = _mm256_max_epi32(am8, _mm256_and_si256(_mm256_castps_si256(mm), absm));
        av8 = _mm256_max_epi32(av8, _mm256_and_si256(_mm256_castps_si256(vv), absm));
    }
    uint32_t am = hmax(am8), av = hmax(av8);
    mt_optim_block_elems(c, s, i, nb, mb, vb, &am, &av);
    float rm = mt_optim_recip(am), rv = mt_optim_recip(av);
    requant(c->qm, mb, n8, rm, s->mq);
    requant(c->qv, vb, n8, rv, s->vq);
    mt_optim_block_requant(c, s, n8, nb, mb, vb, rm, rv);
    s->ms[0] = mt_f32_from_bits(am);
    s->vs[0] = mt_f32_from_bits(av);
}

MT_AVX2_INLINE void blocks(const mt_optim_consts *c, const mt_optim_span *s, size_t n,
                           const int grad_bf16, const int tight, const int do_decay,
                           const int small) {
    for (size_t b0 = 0; b0 < n; b0 += MT_OPTIM_BLOCK) {
        mt_optim_span sb = mt_optim_span_at(s, b0);
        block(c, &sb, n - b0 < MT_OPTIM_BLOCK ? n - b0 : MT_OPTIM_BLOCK, grad_bf16, tight,
              do_decay, small);
    }
}

MT_AVX2 void mt_optim_kernel_avx2(const mt_optim_consts *c, const mt_optim_span *s, size_t n) {
    MT_OPTIM_DISPATCH(blocks, c, s, n)
}

#else
void mt_optim_kernel_avx2(const mt_optim_consts *c, const mt_optim_span *s, size_t n) {
    mt_optim_kernel_scalar(c, s, n);
}
#endif
