/* Element types and the bf16/fp16 <-> fp32 conversions every part shares. */
#ifndef MT_DTYPE_H
#define MT_DTYPE_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    MT_F32 = 0,
    MT_BF16 = 1,
    MT_F16 = 2,
    MT_I32 = 3,
    MT_I64 = 4,
    MT_U16 = 5,
    MT_U8 = 6,
} mt_dtype;

size_t mt_dtype_size(mt_dtype t);
/* safetensors spelling: "F32", "BF16", "F16", "I32", "I64", "U16", "U8". */
const char *mt_dtype_name(mt_dtype t);
/* Returns 0 and sets *out when the safetensors name is known, -1 otherwise. */
int mt_dtype_parse(const char *name, mt_dtype *out);

typedef uint16_t mt_bf16;

static inline float mt_bf16_to_f32(mt_bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as torch's .to(torch.bfloat16); NaN stays a (quiet) NaN. */
static inline mt_bf16 mt_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (mt_bf16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (mt_bf16)(u >> 16);
}

float mt_f16_to_f32(uint16_t h);
uint16_t mt_f32_to_f16(float f);

/* Bulk conversions, threaded (OpenMP) for large n. */
void mt_convert_bf16_to_f32(float *dst, const mt_bf16 *src, size_t n);
void mt_convert_f32_to_bf16(mt_bf16 *dst, const float *src, size_t n);
void mt_convert_f16_to_f32(float *dst, const uint16_t *src, size_t n);
void mt_convert_f32_to_f16(uint16_t *dst, const float *src, size_t n);

#ifdef __cplusplus
}
#endif

#endif
