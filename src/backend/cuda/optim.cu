/* The optimizer update of a state whose arenas live on the GPU (the GPU tier; backend.h's
 * optim_update), bit for bit the host's mt_optim_arenas_update, and from_bf16.
 *
 * Same bits as the CPU because every step is the CPU's own:
 *  - the fp32 constants are computed here on the host exactly as src/optim/state.c and
 *    adamw_full.c compute them (double hyperparameters, one rounding each);
 *  - the AdamW element is mt_optim_elem (kernel.h) / mt_adamw_elem (full_kernel.h) op for op,
 *    each op an IEEE round-to-nearest intrinsic (__fmul_rn, __fdiv_rn, __fsqrt_rn, ...): nvcc
 *    never contracts those into an FMA (its default --fmad=true would contract a plain a*b+c)
 *    and they are exact whatever -prec-div/-prec-sqrt say; only the explicit __fmaf_rn is
 *    fused, where the CPU calls fmaf. Subnormals are kept (no --use_fast_math or -ftz in the
 *    build; the intrinsics' PTX has no .ftz);
 *  - the bit-level parts (compact's split and join, tight's stochastic rounding and its hash, the
 *    qmap lookup) are the very definitions of src/optim/bf16x.h and qmap.h, compiled for the
 *    device (MT_HD); the qmap tables are copies of mt_qmap_signed() / mt_qmap_unsigned().
 * compact and tight: one CUDA block of MT_OPTIM_BLOCK threads per quantization block, one thread
 * per element. Each dequantizes with the block's old scales, updates its element, then the block
 * takes the absmax of the new moments on their bits (order-free, as the CPU) and every thread
 * requantizes its own x times the reciprocal of the new scale. NaN payloads are the exception: x86 and the GPU make different
 * NaN bits from non-NaN operands (0 * inf), so a NaN moment or weight may differ in its bits. */
#include <math.h>

#include "cuda_vec.cuh"
#include "ops.cuh"

extern "C" {
#include "optim/bf16x.h"
#include "optim/qmap.h"
#include "optim/adamw.h"
}

#define OPTIM_WARPS (MT_OPTIM_BLOCK / 32)

/* The fp32 constants of one step (the fields of src/optim/kernel.h's mt_optim_consts that the
 * arithmetic reads). */
/* The two qmaps in device memory (one copy per device, uploaded at backend creation). */
static __device__ mt_qmap d_qmaps[2]; /* [0] signed (exp_avg), [1] unsigned (exp_avg_sq) */

void mt_cuda_optim_init(void) {
    CUDA_CHECK(cudaMemcpyToSymbol(d_qmaps, mt_qmap_signed(), sizeof(mt_qmap), 0));
    CUDA_CHECK(cudaMemcpyToSymbol(d_qmaps, mt_qmap_unsigned(), sizeof(mt_qmap), sizeof(mt_qmap)));
}

static __device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
    return mt_f32_from_bits((uint32_t)h << 16);
}

/* mt_f32_to_bf16 (core/dtype.h): round to nearest even, NaN -> its quiet bf16 NaN. */
static __device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
    uint32_t u = mt_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static __device__ __forceinline__ float load_grad(const void *grad, int grad_bf16, size_t i) {
    return grad_bf16 ? bf16_bits_to_f32(((const uint16_t *)grad)[i]) : ((const float *)grad)[i];
}

/* The AdamW element of mt_optim_elem / mt_adamw_elem on the fp32 weight p and moments *m, *v;
 * returns the new weight. */
static __device__ __forceinline__ float adamw_elem(const mt_adamw_consts &c, float graw, float p,
                                                   float *m, float *v, int q8) {
    float g = __fmul_rn(graw, c.gs);
    if (c.do_decay) p = __fmul_rn(p, c.decay);
    float mm = *m;
    mm = __fmaf_rn(c.lerp_coef, __fsub_rn(g, mm), c.lerp_small ? mm : g);
    float vv = __fmul_rn(*v, c.b2);
    vv = __fmaf_rn(__fmul_rn(c.c2, g), g, vv);
    /* the 8-bit formats multiply by the reciprocal (kernel.h); full divides, as torch */
    float d = q8 ? __fmul_rn(__fsqrt_rn(vv), c.inv_bc2s) : __fdiv_rn(__fsqrt_rn(vv), c.bc2s);
    d = __fadd_rn(d, c.eps);
    float u = __fmul_rn(c.neg_step, mm);
    u = __fdiv_rn(u, d);
    p = __fadd_rn(p, u);
    *m = mm;
    *v = vv;
    return p;
}

/* ---------------- full: fp32 master and moments, the upload copy ---------------- */

/* Arena pointers at the range's first element; grad may be the upload copy's own range (each
 * element's gradient is read before its upload element is written, by the same thread). */
typedef struct {
    float *master, *m, *v;
    void *w; /* the upload copy, bf16 or fp32 */
    int w_bf16;
    const void *grad;
    int grad_bf16;
} full_span;

static __global__ void full_kernel(mt_adamw_consts c, full_span s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = load_grad(s.grad, s.grad_bf16, i);
        float m = s.m[i], v = s.v[i];
        float p = adamw_elem(c, g, s.master[i], &m, &v, 0);
        s.master[i] = p;
        s.m[i] = m;
        s.v[i] = v;
        if (s.w_bf16) ((uint16_t *)s.w)[i] = f32_to_bf16_bits(p);
        else ((float *)s.w)[i] = p;
    }
}

/* ---------------- compact and tight: bf16 master, 8-bit moments ---------------- */

/* Arena pointers at the range's first element (a block start) and its first scale. */
typedef struct {
    uint16_t *w;
    uint16_t *comp; /* compact */
    uint8_t *mq, *vq;
    float *ms, *vs;
    const void *grad;
    int grad_bf16;
    int tight;
    mt_sr_key key;   /* tight: this step's random key */
    uint64_t index0; /* tight: arena index (index_base included) of element 0 */
} q8_span;

/* The max of x over the CUDA block, in every thread (all threads must call it). */
static __device__ __forceinline__ uint32_t block_max(uint32_t x, uint32_t *sh) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    x = __reduce_max_sync(0xffffffffu, x);
    if (lane == 0) sh[warp] = x;
    __syncthreads();
    x = lane < OPTIM_WARPS ? sh[lane] : 0u;
    return __reduce_max_sync(0xffffffffu, x);
}

static __global__ void __launch_bounds__(MT_OPTIM_BLOCK)
    q8_kernel(mt_adamw_consts c, q8_span s, size_t n) {
    __shared__ uint32_t sh_m[OPTIM_WARPS], sh_v[OPTIM_WARPS];
    const mt_qmap *qm = &d_qmaps[0], *qv = &d_qmaps[1];
    size_t b = blockIdx.x, i = b * MT_OPTIM_BLOCK + threadIdx.x;
    int live = i < n;
    float sm = s.ms[b], sv = s.vs[b]; /* the old scales: read before thread 0 writes the new */
    float mm = 0.0f, vv = 0.0f;
    uint32_t am = 0, av = 0;
    if (live) {
        float g = load_grad(s.grad, s.grad_bf16, i);
        float p = s.tight ? bf16_bits_to_f32(s.w[i]) : mt_bf16c_join(s.w[i], s.comp[i]);
        mm = __fmul_rn(qm->code[s.mq[i]], sm);
        vv = __fmul_rn(qv->code[s.vq[i]], sv);
        p = adamw_elem(c, g, p, &mm, &vv, 1);
        if (s.tight) s.w[i] = mt_bf16_round_sr(p, mt_sr_bits16(s.key, s.index0 + i));
        else mt_bf16c_split(p, &s.w[i], &s.comp[i]);
        am = mt_f32_bits(mm) & 0x7fffffffu;
        av = mt_f32_bits(vv) & 0x7fffffffu;
    }
    am = block_max(am, sh_m);
    av = block_max(av, sh_v);
    if (live) {
        /* mt_optim_recip */
        float rm = am ? __fdiv_rn(1.0f, mt_f32_from_bits(am)) : 1.0f;
        float rv = av ? __fdiv_rn(1.0f, mt_f32_from_bits(av)) : 1.0f;
        s.mq[i] = mt_qmap_quantize(qm, __fmul_rn(mm, rm));
        s.vq[i] = mt_qmap_quantize(qv, __fmul_rn(vv, rv));
    }
    if (threadIdx.x == 0) {
        s.ms[b] = mt_f32_from_bits(am);
        s.vs[b] = mt_f32_from_bits(av);
    }
}

/* ---------------- launchers ---------------- */

static int overlaps(const void *a, size_t abytes, const void *b, size_t bbytes) {
    if (!a || !b) return 0;
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + bbytes && y < x + abytes;
}

/* mt_optim_arenas_update's checks (state.c), fatal here: the op has no error return, and bad
 * arguments are the caller's bug. */
static void check_args(const mt_optim_arenas *s, const mt_optim_step *a, size_t offset, size_t n,
                       const void *grad, mt_dtype grad_dtype) {
    const char *fname = mt_state_format_name(s->f);
    MT_CHECK(s->f >= MT_STATE_FULL && s->f <= MT_STATE_TIGHT, "optimizer update: format %d",
             (int)s->f);
    if (s->f == MT_STATE_FULL)
        MT_CHECK(s->w && (s->w_dtype == MT_BF16 || s->w_dtype == MT_F32) && s->master && s->m &&
                     s->v,
                 "optimizer update: full arenas incomplete (w of dtype BF16 or F32, master, m, v)");
    else
        MT_CHECK(s->w && s->w_dtype == MT_BF16 && (s->f == MT_STATE_TIGHT || s->comp) && s->mq &&
                     s->vq && s->ms && s->vs,
                 "optimizer update: %s arenas incomplete", fname);
    MT_CHECK(n <= s->n && offset <= s->n - n, "optimizer update [%zu, %zu) outside the state's "
             "%zu parameters", offset, offset + n, s->n);
    MT_CHECK(grad_dtype == MT_F32 || grad_dtype == MT_BF16, "optimizer update: gradient dtype "
             "%s, expected F32 or BF16", mt_dtype_name(grad_dtype));
    MT_CHECK(a->step >= 1, "optimizer update: step is 1-based, got %lld", (long long)a->step);
    if (n == 0) return;
    MT_CHECK(s->f == MT_STATE_FULL || offset % MT_OPTIM_BLOCK == 0, "optimizer update at offset "
             "%zu: %s state groups start at multiples of %d", offset, fname, MT_OPTIM_BLOCK);
    MT_CHECK(grad, "optimizer update: NULL gradient");
    size_t gbytes = n * mt_dtype_size(grad_dtype), wsz = mt_dtype_size(s->w_dtype);
    int own = s->f == MT_STATE_FULL && grad_dtype == s->w_dtype &&
              grad == (const char *)s->w + offset * wsz;
    MT_CHECK(own || !overlaps(grad, gbytes, s->w, s->n * wsz),
             "optimizer update: the gradient overlaps w other than as full's own range");
    const void *other[] = {s->master, s->m, s->v, s->comp, s->mq, s->vq, s->ms, s->vs};
    size_t bytes[] = {s->n * 4, s->n * 4, s->n * 4, s->n * 2, s->n, s->n, s->nblocks * 4,
                      s->nblocks * 4};
    for (int k = 0; k < 8; k++)
        MT_CHECK(!overlaps(grad, gbytes, other[k], bytes[k]),
                 "optimizer update: the gradient overlaps arena %d of the state", k);
}

void mt_cuda_optim_update(const mt_optim_arenas *s, const mt_optim_step *a, size_t offset,
                          size_t n, const void *grad, mt_dtype grad_dtype, cudaStream_t st) {
    if (s->f == MT_STATE_FROZEN) return; /* a LoRA base: no update, no gradient (state.c's rule) */
    check_args(s, a, offset, n, grad, grad_dtype);
    if (n == 0) return;
    mt_adamw_consts c = mt_adamw_consts_of(a);
    int gbf = grad_dtype == MT_BF16;
    if (s->f == MT_STATE_FULL) {
        full_span sp;
        sp.master = s->master + offset;
        sp.m = s->m + offset;
        sp.v = s->v + offset;
        sp.w_bf16 = s->w_dtype == MT_BF16;
        sp.w = (char *)s->w + offset * mt_dtype_size(s->w_dtype);
        sp.grad = grad;
        sp.grad_bf16 = gbf;
        full_kernel<<<mt_ew_blocks(n), MT_CUDA_EW_THREADS, 0, st>>>(c, sp, n);
        CUDA_LAUNCH_CHECK();
        return;
    }
    int tight = s->f == MT_STATE_TIGHT;
    size_t nblocks = (n + MT_OPTIM_BLOCK - 1) / MT_OPTIM_BLOCK;
    MT_CHECK(nblocks <= 0x7fffffffu, "optimizer update of %zu elements: too many blocks", n);
    q8_span sp;
    sp.w = (uint16_t *)s->w + offset;
    sp.comp = tight ? NULL : s->comp + offset;
    sp.mq = s->mq + offset;
    sp.vq = s->vq + offset;
    sp.ms = s->ms + offset / MT_OPTIM_BLOCK;
    sp.vs = s->vs + offset / MT_OPTIM_BLOCK;
    sp.grad = grad;
    sp.grad_bf16 = gbf;
    sp.tight = tight;
    sp.key = mt_sr_key_make(s->seed, a->step);
    sp.index0 = s->index_base + offset;
    q8_kernel<<<(unsigned)nblocks, MT_OPTIM_BLOCK, 0, st>>>(c, sp, n);
    CUDA_LAUNCH_CHECK();
}

void mt_cuda_from_bf16(bf16 *dst, const bf16 *src, size_t n, cudaStream_t s) {
    if (n == 0 || dst == src) return;
    MT_CHECK(dst && src, "from_bf16: NULL tensor");
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(bf16), cudaMemcpyDeviceToDevice, s));
}
