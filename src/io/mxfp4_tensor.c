/* gpt-oss's MXFP4 expert tensors -> fp32 parameters (mxfp4_tensor.h has the layout). */
#include "io/mxfp4_tensor.h"

#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "quant/mxfp4.h"

#define HALF_NAME 256 /* a disk name plus "_blocks" */

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

int mt_mxfp4_tensor_is_half(const char *name) {
    return ends_with(name, "_blocks") || ends_with(name, "_scales");
}

static const char *fmt_shape(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < size) snprintf(buf + k, size - k, "]");
    return buf;
}

static int same_shape(const mt_st_tensor *x, int ndim, const int64_t *shape) {
    int same = x->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = x->shape[d] == shape[d];
    return same;
}

int mt_mxfp4_tensor_find(const mt_safetensors *st, const char *name, const mt_param *p,
                         const mt_st_tensor **blocks, const mt_st_tensor **scales) {
    /* only gpt-oss's fused experts are published as MXFP4 (their [E, in, out] is what the
     * transposed dequantization writes) */
    if (p->kind != MT_W_EXP_GATE_UP && p->kind != MT_W_EXP_DOWN_IO) return 0;
    char bn[HALF_NAME], sn[HALF_NAME];
    snprintf(bn, sizeof bn, "%s_blocks", name);
    snprintf(sn, sizeof sn, "%s_scales", name);
    const mt_st_tensor *b = mt_safetensors_find(st, bn), *s = mt_safetensors_find(st, sn);
    if (!b && !s) return 0;
    if (!b || !s) {
        const mt_st_tensor *x = b ? b : s;
        return mt_error_set("%s: tensor %s has no %s beside it: an MXFP4 tensor is its _blocks and "
                            "its _scales (the checkpoint is incomplete)", x->path, x->name, b ? sn : bn);
    }
    const mt_st_tensor *plain = mt_safetensors_find(st, name);
    if (plain)
        return mt_error_set("%s: tensor %s is there twice: plain and as MXFP4 (%s, %s)", plain->path, name,
                            bn, sn);
    const mt_st_tensor *half[2] = {b, s};
    for (int k = 0; k < 2; k++)
        if (half[k]->dtype != MT_U8)
            return mt_error_set("%s: tensor %s: dtype %s; MXFP4 blocks and scales are U8", half[k]->path,
                                half[k]->name, mt_dtype_name(half[k]->dtype));
    char want[96], got_b[160], got_s[160], want_b[96], want_s[96];
    int64_t E = p->shape[0], in = p->shape[1], out = p->shape[2];
    fmt_shape(want, sizeof want, p->ndim, p->shape);
    if (in % MT_MXFP4_BLOCK != 0)
        return mt_error_set("%s: tensor %s: the model holds %s as %s ([E, in, out]), and MXFP4 needs "
                            "its input dimension %lld to be a multiple of %d (check config.json's sizes)",
                            b->path, b->name, name, want, (long long)in, MT_MXFP4_BLOCK);
    /* [E, out, in / 32, 16] and [E, out, in / 32]: each expert's [out, in] in groups of 32 inputs */
    int64_t groups = in / MT_MXFP4_BLOCK;
    int64_t wb[4] = {E, out, groups, MT_MXFP4_BLOCK_BYTES}, ws[3] = {E, out, groups};
    if (!same_shape(b, 4, wb) || !same_shape(s, 3, ws))
        return mt_error_set("%s: tensors %s %s and %s %s on disk; the model holds %s as %s ([E, in, "
                            "out]), which needs %s and %s (check config.json's sizes)", b->path, bn,
                            fmt_shape(got_b, sizeof got_b, b->ndim, b->shape), sn,
                            fmt_shape(got_s, sizeof got_s, s->ndim, s->shape), name, want,
                            fmt_shape(want_b, sizeof want_b, 4, wb), fmt_shape(want_s, sizeof want_s, 3, ws));
    *blocks = b;
    *scales = s;
    return 1;
}

int mt_mxfp4_tensor_to_f32(const mt_st_tensor *blocks, const mt_st_tensor *scales, const mt_param *p,
                           float *dst) {
    int64_t E = p->shape[0], in = p->shape[1], out = p->shape[2];
    MT_CHECK(blocks->nbytes == mt_mxfp4_bytes(E * out, in) && scales->nbytes == mt_mxfp4_scales(E * out, in),
             "%s: MXFP4 pair not checked against %s (mt_mxfp4_tensor_find)", blocks->name, p->name);
    /* E matrices of `out` rows and `in` columns, each written transposed: [E, in, out] */
    return mt_mxfp4_dequantize_transposed(blocks->data, scales->data, E, out, in, dst);
}
