/* gpt-oss's MXFP4 experts read as the parameter table's fp32 tensors (quant/mxfp4.h has the format).
 *
 * A published gpt-oss checkpoint (transformers 5.25 `gpt_oss`, config.json quantization_config
 * quant_method "mxfp4") holds each layer's mlp.experts.gate_up_proj and down_proj, the parameters
 * megatrain keeps as [E, in, out] (params.h: (E, C, 2Fe) and (E, Fe, C)), as two tensors:
 *   NAME_blocks U8 [E, out, in / 32, 16]  two e2m1 codes a byte, the low nibble first
 *   NAME_scales U8 [E, out, in / 32]      one e8m0 exponent per 32 inputs
 * i.e. each expert matrix row-major [out, in] as an nn.Linear weight, the 32-value groups running
 * along the input dimension. transformers' loader dequantizes them and transposes each matrix into
 * [E, in, out] (integrations/mxfp4.py convert_moe_packed_tensors: `out.transpose(1, 2)`); so does
 * mt_mxfp4_tensor_to_f32 (mt_mxfp4_dequantize_transposed, bit for bit: tests/test_mxfp4.c, and
 * the whole model: tests/test_gpt_oss_mxfp4.c). Every other tensor of such a checkpoint is plain
 * (bf16) and read as usual. */
#ifndef MT_IO_MXFP4_TENSOR_H
#define MT_IO_MXFP4_TENSOR_H

#include "io/safetensors.h"
#include "model/params.h"

/* Whether name ends in "_blocks" or "_scales" (an MXFP4 half, for messages about strays). */
int mt_mxfp4_tensor_is_half(const char *name);

/* Param p, named `name` on disk, as an MXFP4 pair in st: 1 with *blocks and *scales set when st
 * holds NAME_blocks or NAME_scales (and p is a gpt-oss expert tensor), both checked: U8, shapes
 * [E, out, in/32, 16] and [E, out, in/32] for p's [E, in, out]; 0 when st holds neither or p is
 * another kind; MT_ERR with one line naming the tensor when one half is missing, the plain NAME
 * is there too, or a dtype or shape disagrees with p. */
int mt_mxfp4_tensor_find(const mt_safetensors *st, const char *name, const mt_param *p,
                         const mt_st_tensor **blocks, const mt_st_tensor **scales);

/* The pair found above dequantized into dst: p->numel fp32 values in p's [E, in, out] layout. */
int mt_mxfp4_tensor_to_f32(const mt_st_tensor *blocks, const mt_st_tensor *scales, const mt_param *p,
                           float *dst);

#endif
