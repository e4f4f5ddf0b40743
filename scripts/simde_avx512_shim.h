/* scripts/avx512-emulated.sh only: the AVX-512 intrinsics our kernels use that SIMDe 0.7.4
 * (Debian 12) lacks or aliases wrongly, written from Intel's definitions lane by lane. Included
 * after <simde/x86/avx512.h> with SIMDE_ENABLE_NATIVE_ALIASES. */
#ifndef MT_SIMDE_AVX512_SHIM_H
#define MT_SIMDE_AVX512_SHIM_H

#include <stdint.h>
#include <string.h>

typedef simde__mmask16 __mmask16;

#define SHIM static inline __attribute__((unused))

/* vpmovzxwd, vpmovsxwd, vpmovzxbd: widen 16 lanes to 32 bits */
SHIM __m512i _mm512_cvtepu16_epi32(__m256i a) {
    uint16_t x[16];
    uint32_t r[16];
    memcpy(x, &a, sizeof x);
    for (int i = 0; i < 16; i++) r[i] = x[i];
    __m512i o;
    memcpy(&o, r, sizeof o);
    return o;
}

SHIM __m512i _mm512_cvtepi16_epi32(__m256i a) {
    int16_t x[16];
    int32_t r[16];
    memcpy(x, &a, sizeof x);
    for (int i = 0; i < 16; i++) r[i] = x[i];
    __m512i o;
    memcpy(&o, r, sizeof o);
    return o;
}

SHIM __m512i _mm512_cvtepu8_epi32(__m128i a) {
    uint8_t x[16];
    uint32_t r[16];
    memcpy(x, &a, sizeof x);
    for (int i = 0; i < 16; i++) r[i] = x[i];
    __m512i o;
    memcpy(&o, r, sizeof o);
    return o;
}

/* vpmovdw, vpmovdb: narrow 16 lanes by truncation */
SHIM __m256i _mm512_cvtepi32_epi16(__m512i a) {
    uint32_t x[16];
    uint16_t r[16];
    memcpy(x, &a, sizeof x);
    for (int i = 0; i < 16; i++) r[i] = (uint16_t)x[i];
    __m256i o;
    memcpy(&o, r, sizeof o);
    return o;
}

SHIM __m128i _mm512_cvtepi32_epi8(__m512i a) {
    uint32_t x[16];
    uint8_t r[16];
    memcpy(x, &a, sizeof x);
    for (int i = 0; i < 16; i++) r[i] = (uint8_t)x[i];
    __m128i o;
    memcpy(&o, r, sizeof o);
    return o;
}

/* vpcmpd / vpcmpud less-than: bit i of the mask for lane i */
SHIM __mmask16 _mm512_cmplt_epi32_mask(__m512i a, __m512i b) {
    int32_t x[16], y[16];
    memcpy(x, &a, sizeof x);
    memcpy(y, &b, sizeof y);
    unsigned m = 0;
    for (int i = 0; i < 16; i++) m |= (unsigned)(x[i] < y[i]) << i;
    return (__mmask16)m;
}

SHIM __mmask16 _mm512_cmplt_epu32_mask(__m512i a, __m512i b) {
    uint32_t x[16], y[16];
    memcpy(x, &a, sizeof x);
    memcpy(y, &b, sizeof y);
    unsigned m = 0;
    for (int i = 0; i < 16; i++) m |= (unsigned)(x[i] < y[i]) << i;
    return (__mmask16)m;
}

SHIM unsigned _mm512_reduce_max_epu32(__m512i a) {
    uint32_t x[16], m = 0;
    memcpy(x, &a, sizeof x);
    for (int i = 0; i < 16; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* vpgatherdd: lane i = 32 bits at base + idx[i] * scale (no mask) */
SHIM __m512i shim_gather32(__m512i idx, const void *base, int scale) {
    int32_t x[16];
    uint32_t r[16];
    memcpy(x, &idx, sizeof x);
    for (int i = 0; i < 16; i++) memcpy(&r[i], (const char *)base + (int64_t)x[i] * scale, 4);
    __m512i o;
    memcpy(&o, r, sizeof o);
    return o;
}
#define _mm512_i32gather_epi32(i, b, s) shim_gather32((i), (b), (s))
#define _mm512_i32gather_ps(i, b, s) simde_mm512_castsi512_ps(shim_gather32((i), (b), (s)))

/* SIMDe 0.7.4's alias takes four arguments; the intrinsic takes three */
#undef _mm512_mask_cmpge_epi32_mask
#define _mm512_mask_cmpge_epi32_mask(k, a, b) simde_mm512_mask_cmpge_epi32_mask((k), (a), (b))

/* a non-temporal store is a store (full_avx512.c's upload) */
#define _mm512_stream_ps(p, a) _mm512_store_ps((p), (a))

#endif
