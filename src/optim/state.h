/* The optimizer state of one format: master weights and Adam moments in host RAM, the AdamW
 * update over one group (offset, n) of it, and the list of its tensors for checkpoints.
 *
 * Formats, bytes per parameter (B = MT_OPTIM_BLOCK = 256 values share one fp32 scale):
 *   full     fp32 master 4 + fp32 exp_avg 4 + fp32 exp_avg_sq 4 + bf16 upload copy 2   = 14
 *            (torch-exact: the AdamW of adamw.h, in this module; an fp32 upload copy, for the
 *            cpu backend, is 2 B more)
 *   compact  bf16 master 2 + 16-bit compensation 2 + exp_avg 1 + exp_avg_sq 1
 *            + 2 fp32 scales per 256 (8/256 = 0.03125)                                 = 6.03125
 *   tight    bf16 master 2 + exp_avg 1 + exp_avg_sq 1 + 8/256                          = 4.03125
 *   frozen   the upload copy only: bf16 2 (the cuda backend) or fp32 4 (the cpu backend)   = 2
 *            (a LoRA base model: weights that the forward uploads and nothing else, no master, no
 *            moments, no update; the engine picks it, --state cannot: see mt_state_format_parse)
 * The scales put both 8-bit formats 1/32 B over the round 6 and 4 (a 7B model: +0.2 GB);
 * blocks of 256 are the paper's choice and keep the per-block error small. In compact and tight
 * the bf16 master IS the upload copy: no separate one.
 *
 * compact's 16 bits: the fp32 master w, split without loss. hi = w's bits rounded to 16 (to
 * nearest, ties away from zero: (bits + 0x8000) >> 16), an ordinary bf16 that is uploaded; the
 * compensation is the signed residual bits(w) - (hi << 16), in [-2^15, 2^15), i.e. what bf16
 * rounding lost, counted in units of w's fp32 last place. hi + residual is w bit for bit, so
 * the weight accumulates updates exactly as an fp32 master would (no update is lost to bf16
 * rounding, however small against the weight, down to fp32's own half ulp); the upload copy is
 * the nearest bf16 (it differs from round-to-even only on the 1-in-65536 exact ties).
 *
 * tight: the fp32 result of each update is rounded to bf16 stochastically: up with probability
 * (the 16 lost bits)/65536, so the expected stored value is the fp32 value exactly. The random
 * 16 bits are a hash of (seed, step, arena index): a resumed run reproduces them.
 *
 * Moments (compact, tight): 8-bit blockwise dynamic quantization (Dettmers et al., 8-bit
 * optimizers): per block of 256, scale = max |x| (fp32), each x/scale stored as the nearest of
 * 256 codes of a dynamic tree map, signed for exp_avg, unsigned for exp_avg_sq (qmap.h).
 *
 * Every tensor is in the chosen format: the engine keeps ONE state over the whole model, norm
 * weights and biases included (there is no second, full state for the 1-D tensors; they differ
 * only in having no weight decay, the caller's per-group weight_decay 0). Keeping them fp32
 * would not be worth a second state: they are ~C per tensor against C*C for matrices, in a
 * Llama-3 8B 0.27M of 8.0B parameters (0.003%), 8 B x 0.27M = 2 MB over compact. Group offsets
 * of compact and tight must be multiples of 256 (a block never spans two update calls), so
 * their tensors are laid out at 256-element boundaries.
 *
 * Every path (AVX-512, AVX2, plain C; MT_ADAMW_ISA=avx512|avx2|scalar overrides the choice, as
 * for adamw.h) gives bitwise identical results, for any thread count. */
#ifndef MT_OPTIM_STATE_H
#define MT_OPTIM_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_OPTIM_BLOCK 256

/* FROZEN: the weights of a model that does not train (LoRA's base), stored as the upload arena
 * itself in the alloc's upload dtype. Its update is a no-op, it has no optimizer parts, and a
 * checkpoint refuses it (io/checkpoint.h). */
typedef enum {
    MT_STATE_FULL = 0,
    MT_STATE_COMPACT = 1,
    MT_STATE_TIGHT = 2,
    MT_STATE_FROZEN = 3
} mt_state_format;

/* "full" | "compact" | "tight" | "frozen". */
const char *mt_state_format_name(mt_state_format f);
/* "full" | "compact" | "tight" (what --state takes); MT_ERR with a message naming the value
 * otherwise. "frozen" is refused too: the engine chooses it for a LoRA base, a user cannot. */
int mt_state_format_parse(const char *text, mt_state_format *out);

/* Host bytes of a state of n parameters (arenas and scales), for the planner, with a bf16 upload
 * copy (the cuda backend): full 14 B, frozen 2 B per parameter. */
size_t mt_optim_state_bytes(mt_state_format f, size_t n);
/* The same per parameter, for large n (14, 6.03125, 4.03125, 2). */
double mt_optim_bytes_per_param(mt_state_format f);
/* Both with the upload copy in upload_dtype (MT_BF16 or MT_F32: the cpu backend): full 14 or
 * 16, frozen 2 or 4; compact and tight upload their bf16 master whatever upload_dtype says. */
size_t mt_optim_state_bytes_up(mt_state_format f, size_t n, mt_dtype upload_dtype);
double mt_optim_bytes_per_param_up(mt_state_format f, mt_dtype upload_dtype);

typedef struct mt_optim_state mt_optim_state;

typedef struct {
    double lr, beta1, beta2, eps; /* double: torch's hyperparameters are Python floats */
    double weight_decay;          /* decoupled; 0 = no decay (the caller's mask: 1-D tensors) */
    int64_t step;                 /* 1-based number of the step being taken */
    float grad_scale;             /* fp32 clip coefficient, 1 = none */
} mt_optim_step;

/* Where the upload-able arena (the bf16 master, or full's and frozen's upload copy) is
 * allocated: pinned memory in the engine. alloc NULL: mt_aligned_alloc / free. upload_dtype:
 * full's and frozen's upload copy, MT_BF16 (the cuda backend) or MT_F32 (the cpu backend, which
 * computes in fp32); compact and tight require MT_BF16 (their master is the upload copy; F32 is fatal, naming it). alloc NULL
 * means BF16; in a struct upload_dtype is taken as set, and MT_F32 is 0: a zeroed struct means
 * F32, so set it. */
typedef struct {
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *p);
    void *ctx;
    mt_dtype upload_dtype;
    int all;          /* every arena through alloc (a state whose parts stream to the compute
                         side: pinned, so that the copies run asynchronously) */
} mt_optim_alloc;

/* One tensor of the state, for checkpoints: saving `bytes` from `data` and restoring them into
 * a state of the same format and n reproduces it bit for bit. */
typedef struct {
    const char *name; /* "master", "master_comp", "exp_avg", "exp_avg_scale", ... */
    mt_dtype dtype;   /* master_comp is U16 holding the int16 residual's two's complement */
    size_t numel, bytes;
    void *data;
} mt_optim_tensor;

#define MT_OPTIM_MAX_TENSORS 8

/* A state of n parameters in format f, weights and moments zero. seed: tight's rounding. */
mt_optim_state *mt_optim_state_create(mt_state_format f, size_t n, uint64_t seed,
                                      const mt_optim_alloc *alloc);
void mt_optim_state_free(mt_optim_state *s);

mt_state_format mt_optim_state_format(const mt_optim_state *s);
size_t mt_optim_state_numel(const mt_optim_state *s);
/* tight: element k's random bits are those of model-arena index base + k (default 0), so a
 * state holding a slice of the model (a GPU-tier layer, say) rounds as a whole-model one. */
void mt_optim_state_set_index_base(mt_optim_state *s, uint64_t base);
/* tight: the rounding seed (a resumed run takes the saved one). */
void mt_optim_state_set_seed(mt_optim_state *s, uint64_t seed);

/* Sets weights [offset, offset+n) from fp32 values (the upload copy follows); moments stay.
 * frozen: stored in the upload dtype (bf16: rounded to nearest even, as full's upload copy). */
void mt_optim_state_set_weights(mt_optim_state *s, size_t offset, const float *w, size_t n);
/* The master weights [offset, offset+n) as fp32 (compact: exact; tight: the bf16 value; frozen:
 * the upload copy widened). */
void mt_optim_state_get_weights(const mt_optim_state *s, size_t offset, float *w, size_t n);
/* The arena the forward uploads: the bf16 master itself (compact, tight), the copy (full,
 * frozen: in the alloc's upload_dtype). */
void *mt_optim_state_upload(const mt_optim_state *s);
mt_dtype mt_optim_state_upload_dtype(const mt_optim_state *s);

/* One AdamW step over [offset, offset+n) with the gradient grad (MT_F32 or MT_BF16, n values;
 * it must not overlap the state, except that in full it may be the upload copy's own
 * [offset, offset+n) when grad_dtype is the upload dtype: each gradient element is read before
 * its upload element is written — the engine's full path keeps the gradient there). Also
 * writes the upload copy. n_threads <= 0: all of OpenMP's; threads take chunks of 1024 blocks
 * (full: of 256K elements). MT_ERR (with a message) for a range outside the state, an offset of
 * compact/tight off a 256 boundary, a bad grad dtype or step, or a forbidden overlap.
 * frozen: nothing, MT_OK, no checks (a frozen model has no gradient: grad may be NULL). */
int mt_optim_state_update(mt_optim_state *s, const mt_optim_step *a, size_t offset, size_t n,
                          const void *grad, mt_dtype grad_dtype, int n_threads);

/* The tensors to checkpoint, in a fixed order; returns their count (<= MT_OPTIM_MAX_TENSORS).
 * The upload copy of full is not listed (it is the master in the upload dtype). frozen: one,
 * "weights", the upload copy in its dtype (no moments). */
int mt_optim_state_tensors(const mt_optim_state *s, mt_optim_tensor *out);

/* The arenas of a state as plain pointers (NULL where the format has none), for what works on
 * them outside this module: a backend updating a state that lives in its own memory (the GPU
 * tier: the same arenas allocated there, mt_backend.optim_update), and copies to and from it.
 * Sizes: master, m, v: n floats (full); w: n elements of w_dtype; comp: n uint16; mq, vq: n
 * bytes; ms, vs: nblocks floats (compact, tight). frozen: w only. */
typedef struct {
    mt_state_format f;
    size_t n, nblocks;
    uint64_t seed, index_base; /* tight's rounding: seed and arena index of element 0 */
    float *master, *m, *v;
    void *w;
    mt_dtype w_dtype;
    uint16_t *comp;
    uint8_t *mq, *vq;
    float *ms, *vs;
} mt_optim_arenas;

mt_optim_arenas mt_optim_state_arenas(const mt_optim_state *s);

/* mt_optim_state_update on arenas in host memory (the cpu backend's optim_update; the state's
 * own update is this on its arenas). Same checks and errors (frozen: a no-op, MT_OK). */
int mt_optim_arenas_update(const mt_optim_arenas *s, const mt_optim_step *a, size_t offset,
                           size_t n, const void *grad, mt_dtype grad_dtype, int n_threads);

/* The optimizer's own parts of one tensor at [offset, offset+numel) — what a checkpoint stores
 * beside the tensor's fp32 weights (which, from mt_optim_state_get_weights, are exact for every
 * format: compact's bf16 + residual is the fp32 value, tight's bf16 widens exactly), in a fixed
 * order, names without the tensor's:
 *   full:           exp_avg F32 [numel], exp_avg_sq F32 [numel]
 *   compact, tight: exp_avg U8 [numel], exp_avg_scale F32 [nb], exp_avg_sq U8 [numel],
 *                   exp_avg_sq_scale F32 [nb]            (nb = ceil(numel / 256))
 *   frozen:         none (count 0: a frozen tensor is its weights only; any offset)
 * plus, for tight, the rounding seed, which is the state's (mt_optim_arenas.seed), not a part.
 * data points into the arenas (offset must be a multiple of 256 for compact and tight). Returns
 * the count (<= MT_OPTIM_MAX_TENSORS), or -1 with an error set for a bad range. Writing the same
 * bytes back through the pointers restores the tensor's state bit for bit. */
int mt_optim_arenas_parts(const mt_optim_arenas *s, size_t offset, size_t numel,
                          mt_optim_tensor *out);
/* The same list with data NULL: what a tensor of numel elements stores in format f. */
int mt_optim_parts_layout(mt_state_format f, size_t numel, mt_optim_tensor *out);

/* The instruction-set path of every format's kernel is adamw.h's (mt_adamw_isa_active,
 * mt_adamw_set_isa; MT_ADAMW_ISA overrides it). */

#ifdef __cplusplus
}
#endif

#endif
