/* A LoRA run's frozen base held quantized (QLoRA-class, --base-dtype fp8|nf4|mxfp4): the streamed
 * layer groups' weights as one byte blob a layer, quantized once when they are set (from the
 * checkpoint's fp32 or bf16 values) and dequantized into the layer's weight slot on the compute
 * side each time the layer is loaded, right before its GEMMs.
 *
 * What fp8 and nf4 quantize: every 2-D projection weight of a layer (attention's, the Gated
 * DeltaNet's, the MLP's, the shared expert's and every expert's), as bitsandbytes' QLoRA
 * quantizes every Linear module. Kept in fp32 (small, and sensitive): the norms, biases, the
 * DeltaNet's convolution, A_log and dt_bias, the MoE router and the shared expert's gate.
 * gpt-oss's fused 3-D experts are not Linear modules (nor does bitsandbytes quantize them): fp8
 * and nf4 keep them in fp32, so only its attention projections are quantized there. The embed and
 * head groups and the GPU tier's layers are not held here (the training state keeps them in the
 * compute dtype).
 *
 * mxfp4 (gpt_oss only: mt_base_format_check) is the format gpt-oss publishes its experts in, and
 * it quantizes exactly those: each layer's mlp.experts.gate_up_proj and down_proj (the fused 3-D
 * tensors: 91% of gpt-oss-20b's parameters, 98% of the 120b's), NOT their biases. Everything else
 * stays fp32, as fp8 and nf4 keep their unquantized tensors, the attention projections included.
 * Why not bf16 for those: the blob would need one more segment kind for ~3% of the base
 * (gpt-oss-120b: 0.96B attention parameters, 3.8 GB in fp32 against 1.9 GB in bf16, beside ~61 GB
 * of MXFP4 experts), while fp32 keeps the CPU backend's fp32 compute bit for bit on the
 * checkpoint's values (an fp32 checkpoint's too) and, on the GPU, from_f32 rounds once to the
 * bf16 a bf16 blob would hold. From an MXFP4 checkpoint the experts' blocks and scales are copied
 * in byte for byte (mt_quant_base_set_mxfp4: no dequantize / requantize round trip); from fp32
 * values (a bf16 or fp32 checkpoint, a random init) they are quantized as quant/mxfp4.h says (a
 * power-of-two scale per 32 inputs from the block's amax, round to nearest even onto the e2m1
 * grid).
 *
 * Formats (quant/nf4.h, quant/fp8.h, quant/mxfp4.h), bytes per quantized weight:
 *   nf4    4-bit NormalFloat in blocks of 64 with an fp32 absmax each: 0.5 + 4/64 = 0.5625
 *   fp8    e4m3 in blocks of 128 with an fp32 scale (amax / 448) each:  1 + 4/128 = 1.03125
 *   mxfp4  e2m1 in blocks of 32 with an e8m0 scale (a power of two):   0.5 + 1/32 = 0.53125
 * An nf4 or fp8 tensor is quantized over its numel rounded up to 128 (zeros past its end), which
 * its place in the arena has room for (tensors start at multiples of MT_PARAM_ALIGN = 256), so the
 * dequantized values land in the slot's padding there and a block never spans two tensors. An
 * mxfp4 tensor needs no padding (its input dimension is a multiple of 32).
 *
 * Blob layout of a layer: for each of its tensors in table order, 256-byte aligned, either the
 * codes then the scales (quantized), or the fp32 values. An mxfp4 tensor's codes and scales are
 * the checkpoint's own bytes and layout, [E, out, in / 32, 16] and [E, out, in / 32] (blocks
 * along the input dimension of each output row: quant/mxfp4.h), not the table's [E, in, out]: a
 * byte for byte copy of the checkpoint, and the dequantization writes the transpose, one e8m0
 * scale and 16 code bytes a thread, a warp's 32 threads 32 consecutive output rows, so that each
 * of its 32 stores is 32 adjacent outputs of the table's layout (backend.h's dequant_mxfp4).
 *
 * The blobs live in pinned host memory and cross PCIe per load (on_device 0), or stay on the
 * compute side for the whole run (on_device 1: a 70B's nf4 base is ~40 GB, which an H200 holds;
 * no PCIe traffic for weights then). */
#ifndef MT_QUANT_BASE_H
#define MT_QUANT_BASE_H

#include <stddef.h>
#include <stdint.h>

#include "../backend/backend.h"
#include "../model/config.h"
#include "../model/params.h"

typedef enum { MT_BASE_BF16 = 0, MT_BASE_FP8 = 1, MT_BASE_NF4 = 2, MT_BASE_MXFP4 = 3 } mt_base_format;

const char *mt_base_format_name(mt_base_format f);
/* "bf16" | "fp8" | "nf4" | "mxfp4"; MT_ERR naming the value otherwise. */
int mt_base_format_parse(const char *text, mt_base_format *out);
/* Whether a model of config cfg can hold its base in format f: mxfp4 only for gpt_oss (with input
 * dimensions that are multiples of 32); MT_ERR with a one-line message otherwise. */
int mt_base_format_check(const mt_config *cfg, mt_base_format f);

/* Whether tensor p is quantized (else held in fp32) in a base of format f (fp8, nf4 or mxfp4). */
int mt_quant_base_quantizes(mt_base_format f, const mt_param *p);

/* Bytes of layers [first, L) of t held in format f (fp8, nf4 or mxfp4), and of the largest one. */
double mt_quant_base_bytes(const mt_param_table *t, mt_base_format f, int first, size_t *largest);

typedef struct mt_quant_base mt_quant_base;

/* Layers [first, L) of t in format f (fp8, nf4 or mxfp4, which mt_base_format_check allows for t),
 * every weight zero until set; the blobs on the compute side (on_device) or in pinned host memory. */
mt_quant_base *mt_quant_base_create(const mt_param_table *t, mt_backend *be, mt_base_format f,
                                    int first, int on_device);
void mt_quant_base_free(mt_quant_base *q);

int mt_quant_base_on_device(const mt_quant_base *q);
/* Whether q holds tensor p (its layer is one of q's). */
int mt_quant_base_holds(const mt_quant_base *q, const mt_param *p);

/* Tensor p from fp32 values (quantized, or kept), and back (dequantized): host calls. */
int mt_quant_base_set(mt_quant_base *q, const mt_param *p, const float *w);
int mt_quant_base_get(mt_quant_base *q, const mt_param *p, float *w);
/* An mxfp4 base's expert tensor p from an MXFP4 checkpoint's pair as it lies on disk
 * (io/mxfp4_tensor.h: blocks [E, out, in / 32, 16], scales [E, out, in / 32] for p's [E, in, out]),
 * copied byte for byte. MT_ERR when q does not hold p in MXFP4. Host call. */
int mt_quant_base_set_mxfp4(mt_quant_base *q, const mt_param *p, const uint8_t *blocks,
                            const uint8_t *scales);
/* A loader's MXFP4 sink (io/model_io.h, ctx a mt_quant_base or NULL): 1 when q holds p in MXFP4
 * and took the pair (mt_quant_base_set_mxfp4), 0 when it does not (the loader dequantizes the pair
 * and hands p on as fp32), MT_ERR. */
int mt_quant_base_take_mxfp4(void *ctx, const mt_param *p, const uint8_t *blocks, const uint8_t *scales);

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
