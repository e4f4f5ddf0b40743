/* Token embedding: a row gather forward, a row scatter-add backward. */
#include <string.h>

#include "cpu_ops.h"

/* Columns per block of the backward: a whole cache line's multiple, so threads never share one. */
#define EMB_COL_BLOCK 64

/* out (N, C) = table (V, C) [ids[n]]. V is not passed, so ids are trusted (checked by the loader). */
void mt_cpu_embedding_forward(float *out, const int32_t *ids, const float *table, int N, int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C > 65536)
    for (int n = 0; n < N; n++)
        memcpy(out + (size_t)n * C, table + (size_t)ids[n] * C, (size_t)C * sizeof(float));
}

/* dtable (V, C) += scatter of dout (N, C) by ids. Repeated ids would race if threads split the
 * tokens, so threads split the columns instead: each owns a column block of every table row and
 * walks all tokens in order, which is race-free and deterministic. */
void mt_cpu_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int N, int C) {
    int nblocks = (C + EMB_COL_BLOCK - 1) / EMB_COL_BLOCK;
#pragma omp parallel for schedule(static) if ((size_t)N * C > 65536)
    for (int cb = 0; cb < nblocks; cb++) {
        int c0 = cb * EMB_COL_BLOCK;
        int c1 = c0 + EMB_COL_BLOCK < C ? c0 + EMB_COL_BLOCK : C;
        for (int n = 0; n < N; n++) {
            float *dst = dtable + (size_t)ids[n] * C;
            const float *src = dout + (size_t)n * C;
#pragma omp simd
            for (int c = c0; c < c1; c++) dst[c] += src[c];
        }
    }
}

/* Rows of the token id `id` zeroed: the pad token's row then gets nothing from the scatter. */
void mt_cpu_zero_rows_of_id(float *x, const int32_t *ids, int32_t id, int N, int C) {
    for (int n = 0; n < N; n++)
        if (ids[n] == id) memset(x + (size_t)n * C, 0, (size_t)C * sizeof(float));
}
