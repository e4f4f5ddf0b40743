/* Internal to src/optim: the AdamW kernels of the 8-bit formats (compact, tight). The scalar
 * functions below are the definition every vector path reproduces op for op.
 *
 * Per block of <= 256 elements: dequantize m and v (code * scale, fp32), run the AdamW element
 * of adamw.h (torch's fp32 rounding of every op) on the fp32 weight, store the weight
 * (compact: split into bf16 + residual; tight: stochastic rounding), keep the new fp32 m, v in a
 * block buffer and their absmax (on the bits: order-free), then requantize the block.
 * Two ops differ from torch's AdamW on purpose, to spare the divider (the 8-bit kernels had
 * four divisions and a square root per element): sqrt(v) is multiplied by
 * 1/sqrt(1 - beta2^t) instead of divided by its square root, and the requantization multiplies
 * by the reciprocal of the block's scale instead of dividing by it; one rounding more or less in
 * numbers that are quantized to 8 bits next. full (full_kernel.h) keeps torch's divisions.
 * Only the explicit fmaf() may be fused: every rounding step is its own statement (full_kernel.h
 * says why), and the cross-ISA bitwise test catches a build that fuses anyway. */
#ifndef MT_OPTIM_KERNEL_H
#define MT_OPTIM_KERNEL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "bf16x.h"
#include "qmap.h"
#include "state.h"

typedef struct {
    float gs;         /* grad_scale */
    float decay;      /* f32(1 - lr*wd) */
    int do_decay;     /* wd != 0 */
    float lerp_coef;  /* f32(1-beta1), or f32(1-beta1) - 1 when not "small" (torch's lerp) */
    int lerp_small;   /* |1-beta1| < 0.5 */
    float b2, c2;     /* f32(beta2), f32(1-beta2) */
    float inv_bc2s;   /* f32(1 / sqrt(1 - beta2^step)): a multiply, not torch's divide (below) */
    float eps;
    float neg_step;   /* f32(-lr / (1 - beta1^step)) */
    int tight;        /* 0: compact (comp used), 1: tight (stochastic rounding) */
    mt_sr_key key;    /* tight: this step's random key */
    const mt_qmap *qm, *qv;
} mt_optim_consts;

/* A run of whole blocks (the last may be short): element 0 starts a block. */
typedef struct {
    mt_bf16 *w;
    uint16_t *comp;    /* compact only */
    uint8_t *mq, *vq;
    float *ms, *vs;    /* the scale of the first block */
    const void *grad;
    int grad_bf16;
    uint64_t index0;   /* arena index of element 0: tight's random counter */
} mt_optim_span;

typedef void (*mt_optim_kernel_fn)(const mt_optim_consts *c, const mt_optim_span *s, size_t n);

void mt_optim_kernel_scalar(const mt_optim_consts *c, const mt_optim_span *s, size_t n);
void mt_optim_kernel_avx2(const mt_optim_consts *c, const mt_optim_span *s, size_t n);
void mt_optim_kernel_avx512(const mt_optim_consts *c, const mt_optim_span *s, size_t n);

/* The vector kernels' dispatch to blocks(c, s, n, grad_bf16, tight, do_decay, small): one
 * specialised loop per (grad type, format, weight decay, lerp form), the four as constants so
 * that no test is left in the loop (with the last two as run-time flags GCC 12 kept both tests,
 * and reloads of spilled pointers, inside the AVX-512 loop; the speed of this form is not
 * measured yet). */
#define MT_OPTIM_DISPATCH(blocks, c, s, n)                                                        \
    switch ((s)->grad_bf16 * 8 + (c)->tight * 4 + ((c)->do_decay != 0) * 2 +                     \
            ((c)->lerp_small != 0)) {                                                             \
    case 0: blocks(c, s, n, 0, 0, 0, 0); break;                                                   \
    case 1: blocks(c, s, n, 0, 0, 0, 1); break;                                                   \
    case 2: blocks(c, s, n, 0, 0, 1, 0); break;                                                   \
    case 3: blocks(c, s, n, 0, 0, 1, 1); break;                                                   \
    case 4: blocks(c, s, n, 0, 1, 0, 0); break;                                                   \
    case 5: blocks(c, s, n, 0, 1, 0, 1); break;                                                   \
    case 6: blocks(c, s, n, 0, 1, 1, 0); break;                                                   \
    case 7: blocks(c, s, n, 0, 1, 1, 1); break;                                                   \
    case 8: blocks(c, s, n, 1, 0, 0, 0); break;                                                   \
    case 9: blocks(c, s, n, 1, 0, 0, 1); break;                                                   \
    case 10: blocks(c, s, n, 1, 0, 1, 0); break;                                                  \
    case 11: blocks(c, s, n, 1, 0, 1, 1); break;                                                  \
    case 12: blocks(c, s, n, 1, 1, 0, 0); break;                                                  \
    case 13: blocks(c, s, n, 1, 1, 0, 1); break;                                                  \
    case 14: blocks(c, s, n, 1, 1, 1, 0); break;                                                  \
    case 15: blocks(c, s, n, 1, 1, 1, 1); break;                                                  \
    default: break;                                                                               \
    }

/* Threads take chunks of this many blocks (256K elements, as src/engine's AdamW). */
#define MT_OPTIM_CHUNK_BLOCKS 1024

/* Element i of a block: updates w (and comp), leaves the new fp32 moments in *mo, *vo.
 * sm, sv: the block's old scales. */
static inline void mt_optim_elem(const mt_optim_consts *c, const mt_optim_span *s, size_t i,
                                 float sm, float sv, float *mo, float *vo) {
    const float *gf = s->grad;
    const mt_bf16 *gh = s->grad;
    float g = s->grad_bf16 ? mt_bf16_to_f32(gh[i]) : gf[i];
    g = g * c->gs;
    float pp = c->tight ? mt_bf16_to_f32(s->w[i]) : mt_bf16c_join(s->w[i], s->comp[i]);
    if (c->do_decay) pp = pp * c->decay;
    float mm = c->qm->code[s->mq[i]] * sm;
    mm = fmaf(c->lerp_coef, g - mm, c->lerp_small ? mm : g);
    float vv = c->qv->code[s->vq[i]] * sv;
    vv = vv * c->b2;
    vv = fmaf(c->c2 * g, g, vv);
    float d = sqrtf(vv) * c->inv_bc2s;
    d = d + c->eps;
    float u = c->neg_step * mm;
    u = u / d;
    pp = pp + u;
    if (c->tight) s->w[i] = mt_bf16_round_sr(pp, mt_sr_bits16(c->key, s->index0 + i));
    else mt_bf16c_split(pp, &s->w[i], &s->comp[i]);
    *mo = mm;
    *vo = vv;
}

static inline uint32_t mt_optim_absbits(float x) { return mt_f32_bits(x) & 0x7fffffffu; }

/* What the block's values are multiplied by to quantize them: the reciprocal of its new scale
 * (amax's float), rounded once (1 for an all-zero block). */
static inline float mt_optim_recip(uint32_t amax) {
    return amax ? 1.0f / mt_f32_from_bits(amax) : 1.0f;
}

/* The span from element i on (i a multiple of MT_OPTIM_BLOCK). */
static inline mt_optim_span mt_optim_span_at(const mt_optim_span *s, size_t i) {
    mt_optim_span r = *s;
    r.w += i;
    if (r.comp) r.comp += i;
    r.mq += i;
    r.vq += i;
    r.ms += i / MT_OPTIM_BLOCK;
    r.vs += i / MT_OPTIM_BLOCK;
    r.grad = (const char *)s->grad + i * (s->grad_bf16 ? 2 : 4);
    r.index0 += i;
    return r;
}

/* Elements [i, nb) of one block, one by one: the plain C kernel, and the tails of the vector
 * paths. Folds the new moments' |bits| into *am, *av. */
static inline void mt_optim_block_elems(const mt_optim_consts *c, const mt_optim_span *s,
                                        size_t i, size_t nb, float *mb, float *vb, uint32_t *am,
                                        uint32_t *av) {
    float sm = s->ms[0], sv = s->vs[0];
    for (; i < nb; i++) {
        mt_optim_elem(c, s, i, sm, sv, &mb[i], &vb[i]);
        uint32_t a = mt_optim_absbits(mb[i]), b = mt_optim_absbits(vb[i]);
        if (a > *am) *am = a;
        if (b > *av) *av = b;
    }
}

/* Requantizes elements [i, nb) of one block from mb, vb times the reciprocals rm, rv of their
 * scales (mt_optim_recip). */
static inline void mt_optim_block_requant(const mt_optim_consts *c, const mt_optim_span *s,
                                          size_t i, size_t nb, const float *mb, const float *vb,
                                          float rm, float rv) {
    for (; i < nb; i++) {
        s->mq[i] = mt_qmap_quantize(c->qm, mb[i] * rm);
        s->vq[i] = mt_qmap_quantize(c->qv, vb[i] * rv);
    }
}

/* The AVX2 kernel's reads of the old moments' code values, elements [0, n) of one block, as plain
 * loads: on Zen 3 an 8-lane gather costs about twice its 8 loads. Inlined into the kernel, GCC -O2
 * vectorizes this loop by its cost model (loads inserted into vectors); called from a function
 * without a target attribute it stays a scalar loop. */
static inline void mt_optim_block_code_values(const mt_optim_consts *c, const mt_optim_span *s,
                                              size_t n, float *mb, float *vb) {
    const float *cm = c->qm->code, *cv = c->qv->code;
    for (size_t i = 0; i < n; i++) {
        mb[i] = cm[s->mq[i]];
        vb[i] = cv[s->vq[i]];
    }
}

#endif
