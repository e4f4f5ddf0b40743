/* Packed rows as a ragged batch: the documents of B rows of T tokens (doc_start, model/docs.h) as
 * the sequences of one variable-length attention call (cuDNN's padding mask + ragged offsets,
 * attention_cudnn.cu), with the sequence count and the longest length rounded up to buckets so that
 * a graph built for one step serves the next ones. Pure C (no device), so the CPU build tests it.
 *
 * Sequence i is the i-th document in token order (row by row, left to right); since documents tile
 * every row, its first token (global index b*T + t) is the number of tokens before it: the
 * offsets are the cumulative lengths (THD's cu_seqlens). Sequences n..S-1 are padding: length 0,
 * starting at B*T. */
#ifndef MT_ATTENTION_DOCS_H
#define MT_ATTENTION_DOCS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The smallest length bucket (cuDNN's tiles are 64 and 128 rows; 1-token sequences alone would
 * make s_q = s_kv = 1, which its backward refuses). */
#define MT_ATTENTION_DOCS_MIN_LEN 64

typedef struct {
    int n;       /* documents in the rows */
    int max_len; /* the longest of them */
    int S;       /* sequences of the graph: n rounded up to a power of two */
    int s_max;   /* the graph's sequence length: max_len rounded up to a power of two, at least
                    MT_ATTENTION_DOCS_MIN_LEN, at most T */
} mt_attention_docs_shape;

/* The shape of doc_start (B, T), which must pass mt_docs_check. B, T >= 1. */
mt_attention_docs_shape mt_attention_docs_shape_of(const int32_t *doc_start, int B, int T);
/* The same without buckets: S = n, s_max = max_len (at least 2 where T allows: cuDNN's backward
 * refuses s_q = s_kv = 1). A graph per distinct shape: for diagnosis (MT_CUDNN_DOCS_BUCKETS=exact,
 * attention_cudnn.h), should padding sequences ever be the problem. */
mt_attention_docs_shape mt_attention_docs_shape_exact(const int32_t *doc_start, int B, int T);

/* The smallest power of two >= n (n >= 1), or -1 past 2^30. */
int mt_attention_docs_bucket(int n);

/* seq_len (S) the length of each sequence and tok_off (S + 1) its first token (tok_off[S] = B*T);
 * S >= the documents in doc_start. Returns the number of documents, or -1 (nothing written past
 * what fits) when there are more than S. */
int mt_attention_docs_layout(const int32_t *doc_start, int B, int T, int S, int32_t *seq_len,
                             int64_t *tok_off);

#ifdef __cplusplus
}
#endif

#endif
