#include "docs.h"

#include "../core/error.h"

int mt_docs_check(const int32_t *doc_start, int B, int T) {
    for (int b = 0; b < B; b++) {
        const int32_t *d = doc_start + (size_t)b * T;
        for (int t = 0; t < T; t++) {
            int ok = d[t] >= 0 && d[t] <= t && (d[t] == t || (t > 0 && d[t] == d[t - 1]));
            if (!ok)
                return mt_error_set("document starts: row %d position %d has start %d (must be %d or the "
                                    "previous token's)", b, t, d[t], t);
        }
    }
    return MT_OK;
}

void mt_docs_positions(const int32_t *doc_start, int B, int T, int32_t *pos) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)b * T + t;
            pos[i] = doc_start ? t - doc_start[i] : t;
        }
}
