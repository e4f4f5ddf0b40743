/* The quantized frozen base (engine/quant_base.h). */
#include "engine/quant_base.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "quant/fp8.h"
#include "quant/mxfp4.h"
#include "quant/nf4.h"

#define SEG_ALIGN 256
#define QUANT_PAD 128 /* nf4's and fp8's blocks (64, 128) divide it */

typedef enum {
    SEG_F32,   /* kept: fp32 values */
    SEG_BLOCK, /* nf4 / fp8: codes, then fp32 scales, over numel padded to QUANT_PAD */
    SEG_MXFP4, /* a gpt-oss expert tensor: the checkpoint's blocks, then its e8m0 scales */
} seg_kind;

typedef struct {
    int param;          /* index in the table */
    seg_kind kind;
    int64_t n;          /* elements stored: numel, rounded up to QUANT_PAD for SEG_BLOCK */
    size_t codes, scales; /* byte offsets in the blob (scales unused for fp32 segments) */
} segment;

typedef struct {
    segment *seg;
    int n_seg;
    size_t bytes;
    void *blob;
} layer_blob;

struct mt_quant_base {
    const mt_param_table *t;
    mt_backend *be;
    mt_base_format f;
    int first, on_device;
    layer_blob *layers; /* [l - first] */
    size_t largest;
};

const char *mt_base_format_name(mt_base_format f) {
    return f == MT_BASE_MXFP4 ? "mxfp4" : f == MT_BASE_NF4 ? "nf4" : f == MT_BASE_FP8 ? "fp8" : "bf16";
}

int mt_base_format_parse(const char *text, mt_base_format *out) {
    for (int f = MT_BASE_BF16; f <= MT_BASE_MXFP4; f++)
        if (strcmp(text, mt_base_format_name((mt_base_format)f)) == 0) {
            *out = (mt_base_format)f;
            return MT_OK;
        }
    return mt_error_set("--base-dtype %s: expected bf16, fp8, nf4 or mxfp4", text);
}

int mt_base_format_check(const mt_config *cfg, mt_base_format f) {
    if (f != MT_BASE_MXFP4) return MT_OK;
    if (cfg->arch != MT_ARCH_GPT_OSS)
        return mt_error_set("--base-dtype mxfp4: only gpt_oss models hold MXFP4 experts, and this is a %s "
                            "model (use --base-dtype nf4 or fp8)", cfg->model_type);
    if (cfg->C % MT_MXFP4_BLOCK != 0 || cfg->moe_F % MT_MXFP4_BLOCK != 0)
        return mt_error_set("--base-dtype mxfp4: the experts' input dimensions (hidden_size %d, "
                            "intermediate_size %d) must be multiples of %d, MXFP4's block (use nf4 or fp8)",
                            cfg->C, cfg->moe_F, MT_MXFP4_BLOCK);
    return MT_OK;
}

/* What format f makes of tensor p. */
static seg_kind kind_of(mt_base_format f, const mt_param *p) {
    if (f == MT_BASE_MXFP4)
        return p->kind == MT_W_EXP_GATE_UP || p->kind == MT_W_EXP_DOWN_IO ? SEG_MXFP4 : SEG_F32;
    /* gpt-oss's expert biases are 2-D ((E, width)) but biases: kept, as bitsandbytes keeps them */
    return p->ndim == 2 && p->kind != MT_W_ROUTER && p->kind != MT_W_SHARED_GATE &&
                   p->kind != MT_W_EXP_GATE_UP_BIAS && p->kind != MT_W_EXP_DOWN_BIAS
               ? SEG_BLOCK
               : SEG_F32;
}

int mt_quant_base_quantizes(mt_base_format f, const mt_param *p) { return kind_of(f, p) != SEG_F32; }

static size_t align_up(size_t n) { return (n + SEG_ALIGN - 1) / SEG_ALIGN * SEG_ALIGN; }
static int64_t pad_up(int64_t n) { return (n + QUANT_PAD - 1) / QUANT_PAD * QUANT_PAD; }

/* An MXFP4 tensor's matrices: p is [E, in, out]; its blocks hold E matrices of `out` rows and `in`
 * columns (the checkpoint's [E, out, in / 32, 16]). */
static void mxfp4_dims(const mt_param *p, int64_t *mats, int64_t *rows, int64_t *cols) {
    *mats = p->shape[0], *cols = p->shape[1], *rows = p->shape[2];
}

static int block_of(mt_base_format f) { return f == MT_BASE_NF4 ? 64 : 128; }
static size_t code_bytes(mt_base_format f, int64_t n) {
    return f == MT_BASE_NF4 ? (size_t)n / 2 : (size_t)n;
}

/* Tensor p's segment in format f from byte `at` of the blob; returns where the next one starts. */
static size_t place(mt_base_format f, const mt_param *p, size_t at, segment *s) {
    s->kind = kind_of(f, p);
    s->codes = at;
    switch (s->kind) {
    case SEG_BLOCK:
        s->n = pad_up(p->numel);
        s->scales = align_up(at + code_bytes(f, s->n));
        return align_up(s->scales + (size_t)(s->n / block_of(f)) * sizeof(float));
    case SEG_MXFP4: {
        int64_t mats, rows, cols;
        mxfp4_dims(p, &mats, &rows, &cols);
        s->n = p->numel;
        s->scales = align_up(at + mt_mxfp4_bytes(mats * rows, cols));
        return align_up(s->scales + mt_mxfp4_scales(mats * rows, cols));
    }
    default:
        s->n = p->numel;
        return align_up(at + (size_t)s->n * sizeof(float));
    }
}

/* Layer l's segments and blob size. */
static layer_blob layout(const mt_param_table *t, mt_base_format f, int l) {
    layer_blob b = {0};
    int lo = t->layer_first[l], hi = t->layer_first[l + 1];
    b.seg = mt_calloc((size_t)(hi - lo + 1), sizeof(segment));
    size_t at = 0;
    for (int i = lo; i < hi; i++) {
        segment *s = &b.seg[b.n_seg++];
        s->param = i;
        at = place(f, &t->params[i], at, s);
    }
    b.bytes = at;
    return b;
}

/* layout(t, f, l).bytes without keeping the segments (the planner asks this many times a plan) */
static size_t blob_bytes(const mt_param_table *t, mt_base_format f, int l) {
    size_t at = 0;
    segment s;
    for (int i = t->layer_first[l]; i < t->layer_first[l + 1]; i++) at = place(f, &t->params[i], at, &s);
    return at;
}

/* The planner asks for every first layer of every candidate plan (O(L^2) calls a plan): the sums
 * from each layer to the end are kept for the last table and format asked about (identified by
 * its address, layer count, size and format; a table at a reused address with the same layer
 * count and size has the same layout). */
static struct {
    const mt_param_table *t;
    int L;
    int64_t total;
    mt_base_format f;
    double *suffix;  /* suffix[l]: bytes of layers l..L-1 */
    size_t *largest; /* largest[l]: the largest of them */
} memo;

static void memo_fill(const mt_param_table *t, mt_base_format f) {
    int L = t->cfg.L;
    if (memo.t == t && memo.L == L && memo.total == t->total && memo.f == f) return;
    free(memo.suffix), free(memo.largest);
    memo.suffix = mt_malloc((size_t)(L + 1) * sizeof(double));
    memo.largest = mt_malloc((size_t)(L + 1) * sizeof(size_t));
    memo.suffix[L] = 0, memo.largest[L] = 0;
    for (int l = L - 1; l >= 0; l--) {
        size_t bytes = blob_bytes(t, f, l);
        memo.suffix[l] = memo.suffix[l + 1] + (double)bytes;
        memo.largest[l] = bytes > memo.largest[l + 1] ? bytes : memo.largest[l + 1];
    }
    memo.t = t, memo.L = L, memo.total = t->total, memo.f = f;
}

double mt_quant_base_bytes(const mt_param_table *t, mt_base_format f, int first, size_t *largest) {
    memo_fill(t, f);
    double sum = memo.suffix[first];
    size_t big = memo.largest[first];
    if (largest) *largest = big;
    return sum;
}

mt_quant_base *mt_quant_base_create(const mt_param_table *t, mt_backend *be, mt_base_format f,
                                    int first, int on_device) {
    MT_CHECK(f == MT_BASE_NF4 || f == MT_BASE_FP8 || f == MT_BASE_MXFP4,
             "a quantized base is fp8, nf4 or mxfp4 (got %s)", mt_base_format_name(f));
    MT_CHECK(mt_base_format_check(&t->cfg, f) == MT_OK, "%s", mt_error_message());
    MT_CHECK(first >= 0 && first <= t->cfg.L, "quantized base from layer %d of %d", first, t->cfg.L);
    mt_quant_base *q = mt_calloc(1, sizeof *q);
    q->t = t;
    q->be = be;
    q->f = f;
    q->first = first;
    q->on_device = on_device;
    int n = t->cfg.L - first;
    q->layers = mt_calloc((size_t)(n ? n : 1), sizeof(layer_blob));
    for (int i = 0; i < n; i++) {
        layer_blob *b = &q->layers[i];
        *b = layout(t, f, first + i);
        b->blob = on_device ? be->alloc(be, b->bytes) : be->host_alloc(be, b->bytes);
        if (on_device) be->zero(be, b->blob, b->bytes);
        else memset(b->blob, 0, b->bytes);
        if (b->bytes > q->largest) q->largest = b->bytes;
    }
    return q;
}

void mt_quant_base_free(mt_quant_base *q) {
    if (!q) return;
    for (int i = 0; i < q->t->cfg.L - q->first; i++) {
        layer_blob *b = &q->layers[i];
        if (q->on_device) q->be->free(q->be, b->blob);
        else q->be->host_free(q->be, b->blob);
        free(b->seg);
    }
    free(q->layers);
    free(q);
}

int mt_quant_base_on_device(const mt_quant_base *q) { return q->on_device; }

int mt_quant_base_holds(const mt_quant_base *q, const mt_param *p) {
    return p->layer >= q->first && p->layer < q->t->cfg.L;
}

static const segment *segment_of(const mt_quant_base *q, const mt_param *p, layer_blob **lb) {
    MT_CHECK(mt_quant_base_holds(q, p), "%s: not in the quantized base", p->name);
    *lb = &q->layers[p->layer - q->first];
    int i = (int)(p - q->t->params) - q->t->layer_first[p->layer];
    const segment *s = &(*lb)->seg[i];
    MT_CHECK(s->param == (int)(p - q->t->params), "quantized base out of step at %s", p->name);
    return s;
}

/* bytes at the blob's offset off from / into host memory. */
static void store(const mt_quant_base *q, layer_blob *b, size_t off, const void *src, size_t bytes) {
    if (q->on_device) q->be->upload(q->be, (char *)b->blob + off, src, bytes);
    else memcpy((char *)b->blob + off, src, bytes);
}
static void fetch(const mt_quant_base *q, const layer_blob *b, size_t off, void *dst, size_t bytes) {
    if (q->on_device) q->be->download(q->be, dst, (const char *)b->blob + off, bytes);
    else memcpy(dst, (const char *)b->blob + off, bytes);
}

/* Where a quantizer writes a segment's codes or scales (bytes at byte `off` of the blob): in place
 * in a host blob, so there are no temporaries to fault in and copy (a gpt-oss-120b expert tensor's
 * are 1.1 GB); a temporary for a blob on the device, which codes_done stores and frees. */
static void *codes_at(const mt_quant_base *q, layer_blob *b, size_t off, size_t bytes) {
    return q->on_device ? mt_aligned_alloc(bytes) : (char *)b->blob + off;
}
static void codes_done(const mt_quant_base *q, layer_blob *b, const segment *s, void *codes, size_t cb,
                       void *scales, size_t sb, int rc) {
    if (!q->on_device) return;
    if (rc == MT_OK) {
        store(q, b, s->codes, codes, cb);
        store(q, b, s->scales, scales, sb);
    }
    free(codes);
    free(scales);
}

/* An MXFP4 segment from fp32 values in p's [E, in, out] layout: quantized (quant/mxfp4.h). */
static int set_mxfp4_f32(mt_quant_base *q, layer_blob *b, const segment *s, const mt_param *p,
                         const float *w) {
    int64_t mats, rows, cols;
    mxfp4_dims(p, &mats, &rows, &cols);
    size_t cb = mt_mxfp4_bytes(mats * rows, cols), sb = mt_mxfp4_scales(mats * rows, cols);
    uint8_t *blocks = codes_at(q, b, s->codes, cb), *scales = codes_at(q, b, s->scales, sb);
    int rc = mt_mxfp4_quantize_transposed(w, mats, rows, cols, blocks, scales);
    if (rc != MT_OK) mt_error_set("%s: %s", p->name, mt_error_message());
    codes_done(q, b, s, blocks, cb, scales, sb, rc);
    return rc;
}

int mt_quant_base_set(mt_quant_base *q, const mt_param *p, const float *w) {
    layer_blob *b;
    const segment *s = segment_of(q, p, &b);
    if (s->kind == SEG_F32) {
        store(q, b, s->codes, w, (size_t)p->numel * sizeof(float));
        return MT_OK;
    }
    if (s->kind == SEG_MXFP4) return set_mxfp4_f32(q, b, s, p, w);
    /* the values padded with zeros to the segment's length; most tensors need no padding, and
     * a copy of each (a 70B's 280 GB of fp32, on one thread) was a third of its setup */
    float *x = NULL;
    if (s->n > p->numel) {
        x = mt_aligned_alloc((size_t)s->n * sizeof(float));
        memcpy(x, w, (size_t)p->numel * sizeof(float));
        memset(x + p->numel, 0, (size_t)(s->n - p->numel) * sizeof(float));
    }
    const float *src = x ? x : w;
    size_t cb = code_bytes(q->f, s->n), sb = (size_t)(s->n / block_of(q->f)) * sizeof(float);
    uint8_t *codes = codes_at(q, b, s->codes, cb);
    float *scales = codes_at(q, b, s->scales, sb);
    int rc = q->f == MT_BASE_NF4 ? mt_nf4_quantize(src, s->n, codes, scales)
                                 : mt_fp8_quantize(src, s->n, codes, scales);
    if (rc != MT_OK) mt_error_set("%s: %s", p->name, mt_error_message());
    codes_done(q, b, s, codes, cb, scales, sb, rc);
    free(x);
    return rc;
}

int mt_quant_base_set_mxfp4(mt_quant_base *q, const mt_param *p, const uint8_t *blocks,
                            const uint8_t *scales) {
    layer_blob *b;
    const segment *s = segment_of(q, p, &b);
    if (s->kind != SEG_MXFP4)
        return mt_error_set("%s: held as %s in this %s base, not MXFP4", p->name,
                            s->kind == SEG_F32 ? "fp32" : mt_base_format_name(q->f), mt_base_format_name(q->f));
    int64_t mats, rows, cols;
    mxfp4_dims(p, &mats, &rows, &cols);
    store(q, b, s->codes, blocks, mt_mxfp4_bytes(mats * rows, cols));
    store(q, b, s->scales, scales, mt_mxfp4_scales(mats * rows, cols));
    return MT_OK;
}

int mt_quant_base_take_mxfp4(void *ctx, const mt_param *p, const uint8_t *blocks, const uint8_t *scales) {
    mt_quant_base *q = ctx;
    if (!q || q->f != MT_BASE_MXFP4 || !mt_quant_base_holds(q, p) || !mt_quant_base_quantizes(q->f, p)) return 0;
    MT_TRY(mt_quant_base_set_mxfp4(q, p, blocks, scales));
    return 1;
}

int mt_quant_base_get(mt_quant_base *q, const mt_param *p, float *w) {
    layer_blob *b;
    const segment *s = segment_of(q, p, &b);
    if (s->kind == SEG_F32) {
        fetch(q, b, s->codes, w, (size_t)p->numel * sizeof(float));
        return MT_OK;
    }
    if (s->kind == SEG_MXFP4) {
        int64_t mats, rows, cols;
        mxfp4_dims(p, &mats, &rows, &cols);
        size_t cb = mt_mxfp4_bytes(mats * rows, cols), sb = mt_mxfp4_scales(mats * rows, cols);
        uint8_t *blocks = mt_aligned_alloc(cb), *scales = mt_aligned_alloc(sb);
        fetch(q, b, s->codes, blocks, cb);
        fetch(q, b, s->scales, scales, sb);
        int rc = mt_mxfp4_dequantize_transposed(blocks, scales, mats, rows, cols, w);
        free(blocks);
        free(scales);
        return rc;
    }
    size_t cb = code_bytes(q->f, s->n), sb = (size_t)(s->n / block_of(q->f)) * sizeof(float);
    uint8_t *codes = mt_aligned_alloc(cb);
    float *scales = mt_aligned_alloc(sb), *x = mt_aligned_alloc((size_t)s->n * sizeof(float));
    fetch(q, b, s->codes, codes, cb);
    fetch(q, b, s->scales, scales, sb);
    if (q->f == MT_BASE_NF4) mt_nf4_dequantize(codes, scales, s->n, x);
    else mt_fp8_dequantize(codes, scales, s->n, x);
    memcpy(w, x, (size_t)p->numel * sizeof(float));
    free(codes);
    free(scales);
    free(x);
    return MT_OK;
}

const void *mt_quant_base_blob(const mt_quant_base *q, int l) { return q->layers[l - q->first].blob; }
size_t mt_quant_base_blob_bytes(const mt_quant_base *q, int l) { return q->layers[l - q->first].bytes; }
size_t mt_quant_base_largest_blob(const mt_quant_base *q) { return q->largest; }

void mt_quant_base_blob_store(mt_quant_base *q, int l, const void *src) {
    layer_blob *b = &q->layers[l - q->first];
    store(q, b, 0, src, b->bytes);
}
void mt_quant_base_blob_fetch(const mt_quant_base *q, int l, void *dst) {
    const layer_blob *b = &q->layers[l - q->first];
    fetch(q, b, 0, dst, b->bytes);
}
mt_base_format mt_quant_base_format(const mt_quant_base *q) { return q->f; }
int mt_quant_base_first(const mt_quant_base *q) { return q->first; }
int mt_quant_base_n_layers(const mt_quant_base *q) { return q->t->cfg.L - q->first; }

void mt_quant_base_expand(const mt_quant_base *q, int l, void *dst, const void *blob) {
    mt_backend *be = q->be;
    const layer_blob *b = &q->layers[l - q->first];
    size_t elem = mt_dtype_size(be->dtype);
    for (int i = 0; i < b->n_seg; i++) {
        const segment *s = &b->seg[i];
        const mt_param *p = &q->t->params[s->param];
        void *out = (char *)dst + (size_t)p->group_offset * elem;
        const char *src = (const char *)blob + s->codes;
        if (s->kind == SEG_F32) {
            be->from_f32(be, out, (const float *)src, (size_t)s->n);
        } else if (s->kind == SEG_MXFP4) {
            int64_t mats, rows, cols;
            mxfp4_dims(p, &mats, &rows, &cols);
            be->dequant_mxfp4(be, out, (const uint8_t *)src, (const uint8_t *)blob + s->scales, mats, rows, cols);
        } else if (q->f == MT_BASE_NF4) {
            be->dequant_nf4(be, out, (const uint8_t *)src, (const float *)((const char *)blob + s->scales),
                            (size_t)s->n);
        } else {
            be->dequant_fp8(be, out, (const uint8_t *)src, (const float *)((const char *)blob + s->scales),
                            (size_t)s->n);
        }
    }
}
