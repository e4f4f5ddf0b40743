/* compact/tight AdamW kernel, AVX-512 (F, BW, VL), 16 lanes: the operations of mt_optim_elem and
 * mt_optim_block_requant (kernel.h) in the same order, so the results are bitwise the plain C
 * path's. The AVX2 kernel's structure, but the table lookups (the old moments' code values, the
 * new ones' quantization cells by their top 16 bits) are gathers. On the Intel host (Xeon, 16
 * threads, megatrain bench adamw --grad bf16, 1e9 params) they ran compact 5.99, tight 5.36
 * Gparam/s (4.47 with tight's old two hashes); the scalar-load forms AVX2 prefers on Zen 3 were
 * 1.8-2.2x slower there (port 5's extracts and inserts, the buffers' stores): both lookups
 * through block buffers 2.74, 2.76 (250M), the cells out of the register 3.37, 3.14. AVX2 on that
 * host: compact 3.59, tight 3.33 (250M); the full-state AVX-512 kernel 5.41.
 * Compiled with a target attribute; used only when the CPU has AVX-512 F, BW and VL (cpu_isa.c;
 * no AVX512_BF16, DQ or VBMI instruction is used). */
#include "kernel.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define MT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define MT_AVX512_INLINE \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"), always_inline)) static inline

MT_AVX512_INLINE __m512 load_bf16(const mt_bf16 *s) {
    __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)s));
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}

/* 16 lanes holding 16-bit values (either sign): keep each lane's low 16 bits */
MT_AVX512_INLINE void store_16(void *dst, __m512i x) {
    _mm256_storeu_si256((__m256i *)dst, _mm512_cvtepi32_epi16(x));
}

MT_AVX512_INLINE __m512i mix32(__m512i x) {
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32((int)0x85ebca6bu));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 13));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32((int)0xc2b2ae35u));
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

/* mt_sr_bits16 of the block's indices i .. i+15: blo is the low half of the block's first index,
 * k0 and k1 the keys of its high half and the next (mt_sr_key_of_hi) */
MT_AVX512_INLINE __m512i sr_bits(__m512i blo, __m512i k0, __m512i k1, size_t i) {
    const __m512i lanes =
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i lo = _mm512_add_epi32(blo, _mm512_add_epi32(_mm512_set1_epi32((int)i), lanes));
    /* lanes whose low half wrapped (unsigned lo < blo) have the next high half */
    __mmask16 wrap = _mm512_cmplt_epu32_mask(lo, blo);
    __m512i kk = _mm512_mask_blend_epi32(wrap, k0, k1);
    return _mm512_srli_epi32(mix32(_mm512_xor_si512(lo, kk)), 16);
}

/* mt_qmap_quantize of 16 lanes from x's bits u and its cell entry e -> their codes, one per
 * 32-bit lane (the AVX2 kernel's quantize_k, with masks) */
MT_AVX512_INLINE __m512i quantize_k(__m512i u, __m512i e) {
    const __m512i one = _mm512_set1_epi32(1);
    __mmask16 neg = _mm512_cmplt_epi32_mask(u, _mm512_setzero_si512());
    __m512i k = _mm512_and_si512(e, _mm512_set1_epi32(0xff));
    __m512i t = _mm512_srli_epi32(e, 8);
    __m512i low = _mm512_and_si512(u, _mm512_set1_epi32(0xffff));
    /* values < 2^17: signed compares. Above zero one up when low >= t, below one down when
     * low > t */
    __mmask16 up = _mm512_mask_cmpge_epi32_mask((__mmask16)~neg, low, t);
    __mmask16 dn = _mm512_mask_cmpgt_epi32_mask(neg, low, t);
    k = _mm512_mask_add_epi32(k, up, k, one);
    return _mm512_mask_sub_epi32(k, dn, k, one);
}

/* 16 codes in [0, 255], one per 32-bit lane -> 16 bytes */
MT_AVX512_INLINE void store_codes(uint8_t *dst, __m512i k) {
    _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(k));
}

MT_AVX512_INLINE __m512 gather_codes(const float *code, const uint8_t *q) {
    __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
    return _mm512_i32gather_ps(idx, code, 4);
}

MT_AVX512_INLINE __m512i gather_cells(const mt_qmap *q, __m512i u) {
    return _mm512_i32gather_epi32(_mm512_srli_epi32(u, 16), (const int *)q->cell_by_top, 4);
}

/* Codes of elements [0, n16) of a block (n16 a multiple of 16; mt_optim_block_requant) */
MT_AVX512_INLINE void requant(const mt_optim_consts *c, const mt_optim_span *s, size_t n16,
                              const float *mb, const float *vb, float rm, float rv) {
    const __m512 rm16 = _mm512_set1_ps(rm), rv16 = _mm512_set1_ps(rv);
    for (size_t i = 0; i < n16; i += 16) {
        __m512i um = _mm512_castps_si512(_mm512_mul_ps(_mm512_load_ps(mb + i), rm16));
        __m512i uv = _mm512_castps_si512(_mm512_mul_ps(_mm512_load_ps(vb + i), rv16));
        store_codes(s->mq + i, quantize_k(um, gather_cells(c->qm, um)));
        store_codes(s->vq + i, quantize_k(uv, gather_cells(c->qv, uv)));
    }
}

MT_AVX512_INLINE void block(const mt_optim_consts *c, const mt_optim_span *s, size_t nb,
                            const int grad_bf16, const int tight, const int do_decay,
                            const int small) {
    float mb[MT_OPTIM_BLOCK] __attribute__((aligned(64)));
    float vb[MT_OPTIM_BLOCK] __attribute__((aligned(64)));
    const float *gf = s->grad;
    const mt_bf16 *gh = s->grad;
    const __m512 gs = _mm512_set1_ps(c->gs), decay = _mm512_set1_ps(c->decay),
                 lc = _mm512_set1_ps(c->lerp_coef), b2 = _mm512_set1_ps(c->b2),
                 c2 = _mm512_set1_ps(c->c2), ibc2s = _mm512_set1_ps(c->inv_bc2s),
                 eps = _mm512_set1_ps(c->eps), ns = _mm512_set1_ps(c->neg_step),
                 sm = _mm512_set1_ps(s->ms[0]), sv = _mm512_set1_ps(s->vs[0]);
    const __m512i absm = _mm512_set1_epi32(0x7fffffff), q40 = _mm512_set1_epi32(0x40),
                  half = _mm512_set1_epi32(0x8000);
    __m512i am16 = _mm512_setzero_si512(), av16 = _mm512_setzero_si512();
    __m512i sblo = _mm512_setzero_si512(), sk0 = sblo, sk1 = sblo;
    if (tight) {
        uint32_t hi = (uint32_t)(s->index0 >> 32);
        sblo = _mm512_set1_epi32((int)(uint32_t)s->index0);
        sk0 = _mm512_set1_epi32((int)mt_sr_key_of_hi(c->key, hi));
        sk1 = _mm512_set1_epi32((int)mt_sr_key_of_hi(c->key, hi + 1));
    }
    size_t i = 0, n16 = nb & ~(size_t)15;
    for (; i < n16; i += 16) {
        __m512 g = grad_bf16 ? load_bf16(gh + i) : _mm512_loadu_ps(gf + i);
        g = _mm512_mul_ps(g, gs);
        __m512 pp;
        if (tight) {
            pp = load_bf16(s->w + i);
        } else {
            __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s->w + i)));
            __m512i cp =
                _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)(s->comp + i)));
            pp = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(hi, 16), cp));
        }
        if (do_decay) pp = _mm512_mul_ps(pp, decay);
        __m512 mm = _mm512_mul_ps(gather_codes(c->qm->code, s->mq + i), sm);
        mm = _mm512_fmadd_ps(lc, _mm512_sub_ps(g, mm), small ? mm : g);
        __m512 vv = _mm512_mul_ps(gather_codes(c->qv->code, s->vq + i), sv);
        vv = _mm512_mul_ps(vv, b2);
        vv = _mm512_fmadd_ps(_mm512_mul_ps(c2, g), g, vv);
        __m512 d = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(vv), ibc2s), eps);
        pp = _mm512_add_ps(pp, _mm512_div_ps(_mm512_mul_ps(ns, mm), d));
        __m512i u = _mm512_castps_si512(pp);
        __mmask16 isnan = _mm512_cmp_ps_mask(pp, pp, _CMP_UNORD_Q);
        __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(u, 16), q40);
        if (tight) {
            __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, sr_bits(sblo, sk0, sk1, i)), 16);
            store_16(s->w + i, _mm512_mask_blend_epi32(isnan, r, qnan));
        } else {
            __m512i h = _mm512_srli_epi32(_mm512_add_epi32(u, half), 16);
            __m512i cp = _mm512_sub_epi32(u, _mm512_slli_epi32(h, 16));
            store_16(s->w + i, _mm512_mask_blend_epi32(isnan, h, qnan));
            store_16(s->comp + i, _mm512_maskz_mov_epi32((__mmask16)~isnan, cp));
        }
        _mm512_store_ps(mb + i, mm);
        _mm512_store_ps(vb + i, vv);
        am16 = _mm512_max_epu32(am16, _mm512_and_si512(_mm512_castps_si512(mm), absm));
        av16 = _mm512_max_epu32(av16, _mm512_and_si512(_mm512_castps_si512(vv), absm));
    }
    uint32_t am = (uint32_t)_mm512_reduce_max_epu32(am16);
    uint32_t av = (uint32_t)_mm512_reduce_max_epu32(av16);
    mt_optim_block_elems(c, s, i, nb, mb, vb, &am, &av);
    float rm = mt_optim_recip(am), rv = mt_optim_recip(av);
    requant(c, s, n16, mb, vb, rm, rv);
    mt_optim_block_requant(c, s, n16, nb, mb, vb, rm, rv);
    s->ms[0] = mt_f32_from_bits(am);
    s->vs[0] = mt_f32_from_bits(av);
}

MT_AVX512_INLINE void blocks(const mt_optim_consts *c, const mt_optim_span *s, size_t n,
                             const int grad_bf16, const int tight, const int do_decay,
                             const int small) {
    for (size_t b0 = 0; b0 < n; b0 += MT_OPTIM_BLOCK) {
        mt_optim_span sb = mt_optim_span_at(s, b0);
        block(c, &sb, n - b0 < MT_OPTIM_BLOCK ? n - b0 : MT_OPTIM_BLOCK, grad_bf16, tight,
              do_decay, small);
    }
}

MT_AVX512 void mt_optim_kernel_avx512(const mt_optim_consts *c, const mt_optim_span *s,
                                      size_t n) {
    MT_OPTIM_DISPATCH(blocks, c, s, n)
}

#else
void mt_optim_kernel_avx512(const mt_optim_consts *c, const mt_optim_span *s, size_t n) {
    mt_optim_kernel_scalar(c, s, n);
}
#endif
