/* Packed rows: several documents in one row of T tokens. doc_start (B, T) gives, for each token,
 * the position in its row where its document starts; attention stays inside a document and RoPE
 * positions restart at each document (as transformers does with position_ids for packed data). */
#ifndef MT_DOCS_H
#define MT_DOCS_H

#include <stdint.h>

/* MT_OK when every doc_start[b][t] lies in [0, t] and equals t or doc_start[b][t-1] (documents are
 * contiguous runs); MT_ERR naming the first bad (row, position) otherwise. */
int mt_docs_check(const int32_t *doc_start, int B, int T);

/* pos[b][t] = t - doc_start[b][t], or t when doc_start is NULL (one document per row). */
void mt_docs_positions(const int32_t *doc_start, int B, int T, int32_t *pos);

#endif
