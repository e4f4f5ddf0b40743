/* A LoRA run's frozen base held quantized (QLoRA-class, --base-dtype fp8|nf4): the streamed layer
 * groups' weights as one byte blob a layer, quantized once when they are set (from the
 * checkpoint's fp32 or bf16 values) and dequantized into the layer's weight slot on the compute
 * side each time the layer is loaded, right before its GEMMs.
 *
 * What is quantized: every 2-D projection weight of a layer (attention's, the Gated DeltaNet's,
 * the MLP's, the shared expert's and every expert's), as bitsandbytes' QLoRA quantizes every Linear
 * module. Kept in fp32 (small, and sensitive): the norms, biases, the DeltaNet's convolution,
 * A_log and dt_bias, the MoE router and the shared expert's gate. gpt-oss's fused 3-D experts are
 * not Linear modules (nor does bitsandbytes quantize them): kept in fp32, so only its attention
 * projections are quantized there. The embed and head groups and
 * the GPU tier's layers are not held here (the training state keeps them in the compute dtype).
 *
 * Formats (quant/nf4.h, quant/fp8.h), bytes per quantized weight:
 *   nf4  4-bit NormalFloat in blocks of 64 with an fp32 absmax each: 0.5 + 4/64 = 0.5625
 *   fp8  e4m3 in blocks of 128 with an fp32 scale (amax / 448) each:  1 + 4/128 = 1.03125
 * A tensor is quantized over its numel rounded up to 128 (zeros past its end), which its place in
 * the arena has room for (tensors start at multiples of MT_PARAM_ALIGN = 256), so the dequantized
 * values land in the slot's padding there and a block never spans two tensors.
 *
 * Blob layout of a layer: for each of its tensors in table order, 256-byte aligned, either the
 * codes then the scales (quantized), or the fp32 values. The blobs live in pinned host memory and
 * cross PCIe per load (on_device 0), or stay on the compute side for the whole run (on_device 1:
 * a 70B's nf4 base is ~40 GB, which an H200 holds; no PCIe traffic for weights then). */
#ifndef MT_QUANT_BASE_H
#define MT_QUANT_BASE_H

#include <stddef.h>
#include <stdint.h>

#include "../backend/backend.h"
#include "../model/params.h"

typedef enum { MT_BASE_BF16 = 0, MT_BASE_FP8 = 1, MT_BASE_NF4 = 2 } mt_base_format;

const char *mt_base_format_name(mt_base_format f);
/* "bf16" | "fp8" | "nf4"; MT_ERR naming the value otherwise. */
int mt_base_format_parse(const char *text, mt_base_format *out);

/* Whether tensor p is quantized (else held in fp32) in a quantized base. */
int mt_quant_base_quantizes(const mt_param *p);

/* Bytes of layers [first, L) of t held in format f (fp8 or nf4), and of the largest one. */
double mt_quant_base_bytes(const mt_param_table *t, mt_base_format f, int first, size_t *largest);

typedef struct mt_quant_base mt_quant_base;

/* Layers [first, L) of t in format f (fp8 or nf4), every weight zero until set; the blobs on the
 * compute side (on_device) or in pinned host memory. */
mt_quant_base *mt_quant_base_create(const mt_param_table *t, mt_backend *be, mt_base_format f,
                                    int first, int on_device);
void mt_quant_base_free(mt_quant_base *q);

int mt_quant_base_on_device(const mt_quant_base *q);
/* Whether q holds tensor p (its layer is one of q's). */
int mt_quant_base_holds(const mt_quant_base *q, const mt_param *p);

/* Tensor p from fp32 values (quantized, or kept), and back (dequantized): host calls. */
int mt_quant_base_set(mt_quant_base *q, const mt_param *p, const float *w);
int mt_quant_base_get(mt_quant_base *q, const mt_param *p, float *w);

/* Layer l's blob (host or compute side, as on_device says), its bytes, and the largest blob's. */
const void *mt_quant_base_blob(const mt_quant_base *q, int l);
size_t mt_quant_base_blob_bytes(const mt_quant_base *q, int l);
size_t mt_quant_base_largest_blob(const mt_quant_base *q);

/* Layer l's whole blob from / into host memory (mt_quant_base_blob_bytes(q, l) bytes): the base
 * on disk (engine/quant_base_cache.h). Host calls. */
void mt_quant_base_blob_store(mt_quant_base *q, int l, const void *src);
void mt_quant_base_blob_fetch(const mt_quant_base *q, int l, void *dst);
/* Its format, first layer and number of layers (first .. first + n - 1). */
mt_base_format mt_quant_base_format(const mt_quant_base *q);
int mt_quant_base_first(const mt_quant_base *q);
int mt_quant_base_n_layers(const mt_quant_base *q);

/* On the compute stream: layer l's weights into dst (a layer group of the compute dtype, table
 * layout) from `blob`, a compute-side copy of its blob (the blob itself when on_device). */
void mt_quant_base_expand(const mt_quant_base *q, int l, void *dst, const void *blob);

#endif
