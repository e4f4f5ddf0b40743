/* --eval-split of text / JSONL data: whole documents held out (data/split.h, with documents as the
 * units).
 *
 * Text and JSONL data are tokenized with a document index (text_data.h, mt_text_opts.doc_index):
 * where each document ends in the token file. Document i (0-based, in file order) is held out when
 * mt_data_split_held_out(seed, F, i). Each side is then read as a stream of its own: its documents
 * whole (eos included), concatenated in file order, so no row of one side holds a token of the
 * other's:
 *  - training: the train stream of n tokens is cut into W = max(1, n / T) windows as tokens.h cuts a
 *    token file (window k: the T+1 tokens from k*T, wrapping within the stream), read in the order
 *    of split.h (global row g: epoch g / W, slot g mod W, permuted by mt_tokens_perm under shuffle):
 *    each epoch visits every window once;
 *  - eval: rows k = 0 .. max(1, ceil((n - 1) / T)) - 1 of the eval stream, row k from k*T, the last
 *    one padded past the end (inputs 0, targets -1): every held-out token but the stream's first is
 *    a target exactly once, so the eval set is the held-out documents, whole.
 */
#ifndef MT_DATA_DOC_SPLIT_H
#define MT_DATA_DOC_SPLIT_H

#include <stdint.h>

#include "data/tokens.h"

typedef struct {
    int64_t n_docs;
    int64_t *start;  /* n_docs: where each document starts in the token file */
    int64_t *vstart; /* n_docs + 1: where it starts in the stream; vstart[n_docs] = n_tokens */
    int64_t n_tokens;
} mt_doc_stream;

/* Reads the index PATH of token file f into *ends (malloc'd, *n_docs of them). MT_ERR, one line
 * naming PATH, when it does not fit f (not whole int64s, empty, not ascending, or its last end is
 * not f's token count). */
int mt_doc_index_load(const char *path, const mt_token_file *f, int64_t **ends, int64_t *n_docs);

/* The stream of documents docs[0..n) (ascending, n >= 1), ends from the index. */
void mt_doc_stream_make(mt_doc_stream *s, const int64_t *ends, const int64_t *docs, int64_t n);
void mt_doc_stream_free(mt_doc_stream *s); /* a zeroed or freed *s is fine */

/* Training row of global row g (>= 0) into inputs and targets (T each). */
void mt_doc_stream_train_row(const mt_doc_stream *s, const mt_token_file *f, const mt_batch_order *o, int64_t g,
                             int T, int32_t *inputs, int32_t *targets);

/* Eval rows, and row k (k at or past the count: padding, inputs 0 and targets -1). */
int64_t mt_doc_stream_eval_rows(const mt_doc_stream *s, int T);
void mt_doc_stream_eval_row(const mt_doc_stream *s, const mt_token_file *f, int64_t k, int T, int32_t *inputs,
                            int32_t *targets);

#endif
