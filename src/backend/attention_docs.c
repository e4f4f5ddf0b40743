#include "attention_docs.h"

#include <stddef.h>

int mt_attention_docs_bucket(int n) {
    int p = 1;
    while (p < n) {
        if (p > (1 << 29)) return -1;
        p <<= 1;
    }
    return p;
}

mt_attention_docs_shape mt_attention_docs_shape_of(const int32_t *doc_start, int B, int T) {
    mt_attention_docs_shape sh = {0, 0, 0, 0};
    for (int b = 0; b < B; b++) {
        const int32_t *d = doc_start + (size_t)b * T;
        for (int t = 0; t < T; t++) {
            /* a document ends at t when the next token starts another one (or the row ends) */
            if (t + 1 < T && d[t + 1] != t + 1) continue;
            int len = t + 1 - d[t];
            sh.n++;
            if (len > sh.max_len) sh.max_len = len;
        }
    }
    sh.S = mt_attention_docs_bucket(sh.n);
    int s = mt_attention_docs_bucket(sh.max_len);
    if (s < MT_ATTENTION_DOCS_MIN_LEN) s = MT_ATTENTION_DOCS_MIN_LEN;
    sh.s_max = s > T ? T : s;
    return sh;
}

mt_attention_docs_shape mt_attention_docs_shape_exact(const int32_t *doc_start, int B, int T) {
    mt_attention_docs_shape sh = mt_attention_docs_shape_of(doc_start, B, T);
    sh.S = sh.n;
    sh.s_max = sh.max_len < 2 && T >= 2 ? 2 : sh.max_len;
    return sh;
}

int mt_attention_docs_layout(const int32_t *doc_start, int B, int T, int S, int32_t *seq_len,
                             int64_t *tok_off) {
    int n = 0;
    for (int b = 0; b < B; b++) {
        const int32_t *d = doc_start + (size_t)b * T;
        for (int t = 0; t < T; t++) {
            if (t + 1 < T && d[t + 1] != t + 1) continue;
            if (n == S) return -1;
            seq_len[n] = t + 1 - d[t];
            tok_off[n] = (int64_t)b * T + d[t];
            n++;
        }
    }
    for (int i = n; i < S; i++) seq_len[i] = 0, tok_off[i] = (int64_t)B * T;
    tok_off[S] = (int64_t)B * T;
    return n;
}
