/* The two bf16 master representations (state.h): compact's lossless split of an fp32 value into
 * an uploadable bf16 and a 16-bit residual, and tight's stochastic rounding with a counter-based
 * random source. Scalar definitions; the vector kernels reproduce them bit for bit. */
#ifndef MT_OPTIM_BF16X_H
#define MT_OPTIM_BF16X_H

#include <stdint.h>
#include <string.h>

#include "core/dtype.h"

/* Host and device: src/backend/cuda/optim.cu runs these same definitions on the GPU. */
#ifndef MT_HD
#ifdef __CUDACC__
#define MT_HD __host__ __device__
#else
#define MT_HD
#endif
#endif

MT_HD static inline uint32_t mt_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

MT_HD static inline float mt_f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* w = hi + residual, bit for bit: bits(w) = (hi << 16) + sign-extended comp, mod 2^32. */
MT_HD static inline float mt_bf16c_join(mt_bf16 hi, uint16_t comp) {
    uint32_t u = ((uint32_t)hi << 16) + comp - ((uint32_t)(comp & 0x8000u) << 1);
    return mt_f32_from_bits(u);
}

/* hi = bits rounded to nearest, ties away from zero; comp = bits(w) - (hi << 16) in
 * [-2^15, 2^15). A NaN becomes hi = its quiet bf16 NaN, comp = 0 (the payload is not kept). */
MT_HD static inline void mt_bf16c_split(float w, mt_bf16 *hi, uint16_t *comp) {
    uint32_t u = mt_f32_bits(w);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        *hi = (mt_bf16)((u >> 16) | 0x40u);
        *comp = 0;
        return;
    }
    uint32_t h = (u + 0x8000u) >> 16;
    *hi = (mt_bf16)h;
    *comp = (uint16_t)(u - (h << 16));
}

/* Stochastic rounding: up (in magnitude) when r16 < the 16 bits bf16 drops, with r16 uniform in
 * [0, 2^16), so E[result] = w exactly. NaN -> quiet NaN, as mt_f32_to_bf16. */
MT_HD static inline mt_bf16 mt_bf16_round_sr(float w, uint32_t r16) {
    uint32_t u = mt_f32_bits(w);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (mt_bf16)((u >> 16) | 0x40u);
    return (mt_bf16)((u + r16) >> 16);
}

/* The random 16 bits of element `index` in the step keyed by (seed, step): MurmurHash3's 32-bit
 * finalizer (a bijection with full avalanche) of the index's low half xored with a 32-bit key,
 * which mixes the step's key with the index's high half by the same finalizer. Stateless: any
 * element of any step can be recomputed. One finalizer per element: the high half is the same
 * for 2^32 consecutive indices, so the vector kernels mix it once a block (until 2026-12-01
 * both halves were mixed per element, two finalizers: other bits, the same statistics). */
typedef struct {
    uint32_t lo, hi;
} mt_sr_key;

MT_HD static inline uint32_t mt_sr_mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    x ^= x >> 16;
    return x;
}

static inline mt_sr_key mt_sr_key_make(uint64_t seed, int64_t step) {
    /* splitmix64 of seed and step: distinct steps get unrelated keys */
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t)(step + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    mt_sr_key k = {(uint32_t)z, (uint32_t)(z >> 32)};
    return k;
}

/* The 32-bit key of the indices whose high half is hi. */
MT_HD static inline uint32_t mt_sr_key_of_hi(mt_sr_key k, uint32_t hi) {
    return k.lo ^ mt_sr_mix32(hi ^ k.hi);
}

MT_HD static inline uint32_t mt_sr_bits16(mt_sr_key k, uint64_t index) {
    uint32_t kk = mt_sr_key_of_hi(k, (uint32_t)(index >> 32));
    return mt_sr_mix32((uint32_t)index ^ kk) >> 16;
}

#endif
