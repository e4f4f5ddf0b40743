/* Which implementation the CUDA attention op runs: our flash kernels (attention.cu) or cuDNN's fused
 * flash attention (attention_cudnn.cu). Plain C, so tests and benches can choose; the CUDA backend
 * itself needs nothing of this (the op picks per shape, see attention_cudnn.cu).
 *
 * MT_ATTENTION=own|cudnn|auto (default auto) sets the choice at the first attention call. On the
 * H200 cuDNN is 2.1-3.0x faster than ours both ways (bench/RESULTS.md, session 3; the 7B at 16 x
 * 4096 trains 10% faster with auto, session 5). Its forward is the textbook bf16 flash forward (P
 * rounded to bf16 before the PV product): test_cudnn_vs_cpu measures it against an emulation of
 * that algorithm, whose own misses of our fp32-reference bar it reproduces element for element
 * (11 of 2M, 158%), and test_cuda_model's 50-step curve with cuDNN stays inside the spread that
 * bf16-sized nudges of the weights cause (session 5). Ours keeps P more precisely and remains for
 * short rows' backward (D 64 and 128 only: for other D ours is the fp32 fallback),
 * MT_ATTENTION_DOCS=own (below), `own`, and every call with options (a scale, a window, sinks)
 * unless MT_EXPERIMENTAL_ATTENTION=1 (below), whatever the choice.
 *   own    our kernels always (packed rows included);
 *   cudnn  cuDNN for every case it supports (documents packed in a row as MT_ATTENTION_DOCS says,
 *          16-byte aligned tensors, a shape cuDNN has a plan for), our kernels for the rest;
 *   auto   cuDNN's forward where cudnn would use it; cuDNN's backward only from
 *          MT_CUDNN_BWD_MIN_T tokens a row (below that our backward is as fast or faster).
 * MT_ATTENTION_DOCS=own|cudnn|auto (default auto, which is cudnn) is the choice for rows that pack
 * several documents (doc_start):
 *   own    our kernels, whatever MT_ATTENTION says;
 *   cudnn  cuDNN's variable-length attention (each document one sequence of a ragged batch, see
 *          attention_cudnn.cu), forward and backward at every T, unless MT_ATTENTION=own; it needs
 *          D % 16 == 0 and the document starts noted to the backend (mt_backend.note_documents,
 *          which the engine and the runner call when they upload them), else our kernels run.
 *   MT_CUDNN_DOCS_BUCKETS=pow2|exact (default pow2): the graph's sequence count and length are
 *   the documents' rounded up to powers of two (padding sequences of length 0), or exactly theirs
 *   (a graph per distinct shape; to tell a padding problem apart on the GPU).
 *   The default since session 7: on the H200 test_cuda_attention's packed cases and
 *   test_cudnn_graph pass, and attention_bench's packed rows (28/4 heads of 128) measured cuDNN
 *   faster than ours at every shape, TFLOP/s forward / backward: B4 T4096 4 documents a row 407
 *   vs 200 / 253 vs 128; B16 T4096 8 a row 304 vs 153 / 161 vs 111; B1 T32768 8 577 vs 259 / 442
 *   vs 179; B1 T131072 16 592 vs 279 / 460 vs 205 (bench/logs/2026-12-01-session7). Its backward
 *   takes more pool memory than the plain one: MT_CUDA_ATTENTION_DOCS_POOL_PER_ELEM
 *   (cuda_memory.h), which the planner counts for runs on packed rows.
 * Without cuDNN at run time (libcudnn.so.9 not loadable, older than 9.0) or in a build without it
 * (MT_HAVE_CUDNN=0) every choice runs our kernels; a note on stderr says so once. */
#ifndef MT_CUDA_ATTENTION_CUDNN_H
#define MT_CUDA_ATTENTION_CUDNN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MT_ATTENTION_AUTO = 0,
    MT_ATTENTION_OWN = 1,
    MT_ATTENTION_CUDNN = 2,
} mt_attention_impl;

/* The backward's T from which auto takes cuDNN. Chosen from PyTorch's numbers (cuDNN's backward
 * 205 TFLOP/s against our 182 at T = 4096); our own bench since measured cuDNN's backward faster at
 * every T it ran, 28/4 heads of 128: 293 vs 132 TFLOP/s at 1024, 398 vs 146 at 2048, 475 vs 160
 * at 4096, 531 vs 216 at 32768 (bench/RESULTS.md), so this can go to 0 once cuDNN is the default. */
#define MT_CUDNN_BWD_MIN_T 4096

/* Overrides MT_ATTENTION_DOCS for the following calls (OWN, or CUDNN; AUTO is CUDNN; tests,
 * benches). */
void mt_cuda_attention_set_docs_impl(mt_attention_impl impl);
/* The choice in force for packed rows (MT_ATTENTION_DOCS's value until set). Fatal on a bad value. */
mt_attention_impl mt_cuda_attention_get_docs_impl(void);
/* The number of documents of the latest forward (backward = 1: backward) call when it ran cuDNN's
 * variable-length graph, with the graph's sequences (S) and their padded length (s_max); 0 when
 * that call did not (our kernels, or the plain graph). Either pointer may be NULL. */
int mt_cuda_attention_last_docs(int backward, int *S, int *s_max);
/* doc_start (B, T) on the device holds host_doc_start's values from now on (a copy is kept);
 * host_doc_start NULL forgets it. The CUDA backend's note_documents. */
void mt_cuda_attention_note_documents(const int32_t *doc_start, const int32_t *host_doc_start,
                                      int B, int T);
/* Forgets what was noted at device address p (the backend frees p). */
void mt_cuda_attention_forget_documents(const void *p);
/* The host copy of rows doc_start .. + B*T as last noted (valid until the next note of that
 * array), or NULL when none was (or the build has no cuDNN: notes are its only use). */
const int32_t *mt_cuda_attention_noted_rows(const int32_t *doc_start, int B, int T);
/* How many (direction, shape) plans are cached, those cuDNN refused included: graph caching's
 * count, for the tests. */
int mt_cuda_attention_cudnn_plan_count(void);
/* The workspace bytes of the plan the latest successful cuDNN forward (0) / backward (1) ran, or
 * -1 before one. For the bench. */
long long mt_cuda_attention_cudnn_last_workspace(int backward);
/* As mt_cuda_attention_cudnn_validate, for the variable-length graph of S sequences padded to
 * s_max tokens over B rows of T (attention_docs.h's shape of the rows). */
int mt_cuda_attention_cudnn_validate_docs(int backward, int S, int s_max, int B, int T, int H,
                                          int G, int D, int sm_version, char *why,
                                          size_t why_size);
/* The same with a call's options (scale, window, the forward's sinks), as the plain graphs take them. */
int mt_cuda_attention_cudnn_validate_docs_opts(int backward, int S, int s_max, int B, int T, int H,
                                               int G, int D, float scale, int window, int sinks,
                                               int sm_version, char *why, size_t why_size);
/* MT_EXPERIMENTAL_ATTENTION=1 (default 0) turns on the session-17 paths that have not yet passed
 * test_cuda_attention on a GPU: cuDNN's graphs with a call's scale, window and sinks, cuDNN's short-row
 * backward for heads other than 64 and 128, and attention_gemm.cu for heads wider than 128 (Gemma
 * 4's 256 and 512, which otherwise run the fp32 fallback, 10-100x slower). Off, every such call
 * runs as before. set_experimental overrides the variable (tests). */
int mt_cuda_attention_experimental(void);
void mt_cuda_attention_set_experimental(int on);
/* 1 when the latest forward (backward = 0) or backward call ran attention_gemm.cu's GEMMs (tests:
 * "own" covers it, the flash kernels and the fallback). set_block_bytes caps the scratch of one
 * block of queries (0: the default, 256 MiB): small values make tests span many blocks. */
int mt_cuda_attention_gemm_ran(int backward);
void mt_cuda_attention_gemm_set_block_bytes(size_t bytes);
/* Overrides MT_ATTENTION for the following calls (tests, benches). */
void mt_cuda_attention_set_impl(mt_attention_impl impl);
/* The choice in force (MT_ATTENTION's value until set_impl). Fatal on a bad MT_ATTENTION. */
mt_attention_impl mt_cuda_attention_get_impl(void);
/* What the latest forward (backward = 0) or backward (backward = 1) call ran: MT_ATTENTION_OWN or
 * MT_ATTENTION_CUDNN (MT_ATTENTION_AUTO before the first call). */
mt_attention_impl mt_cuda_attention_last(int backward);
/* Loads cuDNN (once) and, where a device is current, makes its handle. 1 when it is usable, with
 * its version (e.g. 91900); 0 with why it is not (valid until the next call) otherwise. Either
 * pointer may be NULL. */
int mt_cuda_cudnn_status(const char **why, long *version);
/* The workspace bytes of the cached cuDNN plan for this shape (taken from the stream-ordered pool
 * at each call), or -1 when there is none (not run yet, or cuDNN cannot run it). For the bench. */
long long mt_cuda_attention_cudnn_workspace(int backward, int B, int T, int H, int G, int D);
/* Checks, without a device, that the graph the op would build for this shape passes the cuDNN
 * frontend's validation for compute capability sm_version (90: Hopper). 1 when it does; 0 when it
 * does not, with the frontend's reason in why; -1 when cuDNN is not usable or not built in. */
int mt_cuda_attention_cudnn_validate(int backward, int B, int T, int H, int G, int D,
                                     int sm_version, char *why, size_t why_size);
/* As mt_cuda_attention_cudnn_validate, with a call's options: scale (0: 1/sqrt(D)), window W
 * (0: none; W >= T: none) and sinks (1: the forward's sink tensor; the backward has none). */
int mt_cuda_attention_cudnn_validate_opts(int backward, int B, int T, int H, int G, int D,
                                          float scale, int window, int sinks, int sm_version,
                                          char *why, size_t why_size);

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include "cuda_common.cuh"

/* Run by attention.cu's launchers first: when the choice and the case allow cuDNN, enqueue cuDNN's
 * forward / backward on s and return true; otherwise return false (the caller runs our kernels).
 * Arguments as mt_cuda_attention_forward / _backward (ops.cuh). cuDNN runs only the plain
 * attention (mt_attention_opts_plain): a call with a scale, a window or sinks returns false. */
bool mt_cuda_attention_cudnn_forward(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                                     const bf16 *v, const int32_t *doc_start, int B, int T, int H,
                                     int G, int D, const mt_attention_opts *opts, cudaStream_t s);
bool mt_cuda_attention_cudnn_backward(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout,
                                      const bf16 *out, const float *lse, const bf16 *q,
                                      const bf16 *k, const bf16 *v, const int32_t *doc_start,
                                      int B, int T, int H, int G, int D,
                                      const mt_attention_opts *opts, cudaStream_t s);
#endif

#endif
