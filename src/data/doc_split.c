/* --eval-split by document: the index, and each side's documents read as one stream (see doc_split.h). */
#include "data/doc_split.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

int mt_doc_index_load(const char *path, const mt_token_file *f, int64_t **ends, int64_t *n_docs) {
    *ends = NULL, *n_docs = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return mt_error_set("%s: cannot open the document index: %s", path, strerror(errno));
    long size = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
    if (size <= 0 || size % 8 != 0 || fseek(fp, 0, SEEK_SET) != 0) {
        fclose(fp);
        return mt_error_set("%s: not a document index of %s (%ld bytes, not a whole number of int64 ends); "
                            "remove both to have them made again", path, f->path, size);
    }
    int64_t n = size / 8;
    unsigned char *raw = mt_malloc((size_t)size);
    size_t got = fread(raw, 1, (size_t)size, fp);
    fclose(fp);
    if (got != (size_t)size) {
        free(raw);
        return mt_error_set("%s: cannot read the document index", path);
    }
    int64_t *e = mt_malloc((size_t)n * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) {
        uint64_t u = 0;
        for (int b = 7; b >= 0; b--) u = u << 8 | raw[i * 8 + b];
        e[i] = (int64_t)u;
    }
    free(raw);
    for (int64_t i = 0; i < n; i++) {
        int64_t prev = i ? e[i - 1] : 0;
        if (e[i] <= prev || e[i] > f->n_tokens || (i == n - 1 && e[i] != f->n_tokens)) {
            long long end = (long long)e[i];
            free(e);
            return mt_error_set("%s: does not fit %s (%lld tokens): document %lld ends at %lld; remove both to "
                                "have them made again", path, f->path, (long long)f->n_tokens, (long long)i, end);
        }
    }
    *ends = e, *n_docs = n;
    return MT_OK;
}

void mt_doc_stream_make(mt_doc_stream *s, const int64_t *ends, const int64_t *docs, int64_t n) {
    MT_CHECK(n >= 1, "documents %lld", (long long)n);
    s->n_docs = n;
    s->start = mt_malloc((size_t)n * sizeof(int64_t));
    s->vstart = mt_malloc((size_t)(n + 1) * sizeof(int64_t));
    int64_t v = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t d = docs[i], start = d ? ends[d - 1] : 0;
        s->start[i] = start;
        s->vstart[i] = v;
        v += ends[d] - start;
    }
    s->vstart[n] = v;
    s->n_tokens = v;
}

void mt_doc_stream_free(mt_doc_stream *s) {
    free(s->start);
    free(s->vstart);
    memset(s, 0, sizeof *s);
}

/* The document holding stream position p (0 <= p < n_tokens): the last i with vstart[i] <= p. */
static int64_t doc_at(const mt_doc_stream *s, int64_t p) {
    int64_t lo = 0, hi = s->n_docs - 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (s->vstart[mid] <= p) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* count tokens of the stream from position p (wrapping at its end) into out. */
static void read_stream(const mt_doc_stream *s, const mt_token_file *f, int64_t p, int count, int32_t *out) {
    p %= s->n_tokens;
    int64_t i = doc_at(s, p);
    for (int k = 0; k < count; k++) {
        out[k] = mt_tokens_at(f, s->start[i] + (p - s->vstart[i]));
        if (++p == s->vstart[i + 1]) {
            if (++i == s->n_docs) i = 0, p = 0;
        }
    }
}

/* The row of T+1 stream tokens from p: inputs the first T, targets the last T. */
static void stream_row(const mt_doc_stream *s, const mt_token_file *f, int64_t p, int T, int32_t *inputs,
                       int32_t *targets) {
    read_stream(s, f, p, T, inputs);
    memcpy(targets, inputs + 1, (size_t)(T - 1) * sizeof(int32_t));
    read_stream(s, f, p + T, 1, targets + T - 1);
}

void mt_doc_stream_train_row(const mt_doc_stream *s, const mt_token_file *f, const mt_batch_order *o, int64_t g,
                             int T, int32_t *inputs, int32_t *targets) {
    MT_CHECK(s->n_tokens >= 1 && T >= 1 && g >= 0, "stream of %lld tokens, T %d, row %lld", (long long)s->n_tokens,
             T, (long long)g);
    int64_t W = s->n_tokens / T > 1 ? s->n_tokens / T : 1;
    int64_t k = g % W;
    if (o->shuffle) k = mt_tokens_perm(o->seed, g / W, W, k);
    stream_row(s, f, k * T, T, inputs, targets);
}

int64_t mt_doc_stream_eval_rows(const mt_doc_stream *s, int T) {
    int64_t rows = (s->n_tokens - 1 + T - 1) / T;
    return rows > 1 ? rows : 1;
}

void mt_doc_stream_eval_row(const mt_doc_stream *s, const mt_token_file *f, int64_t k, int T, int32_t *inputs,
                            int32_t *targets) {
    int64_t rows = mt_doc_stream_eval_rows(s, T), p = k * T;
    if (k >= rows) {
        for (int t = 0; t < T; t++) inputs[t] = 0, targets[t] = -1;
        return;
    }
    stream_row(s, f, p, T, inputs, targets);
    /* past the stream's end: padding, so no token is counted twice (a one-token stream keeps its
     * wrapped row: the only one it has) */
    if (s->n_tokens < 2) return;
    for (int t = 0; t < T; t++) {
        if (p + t >= s->n_tokens) inputs[t] = 0;
        if (p + t + 1 >= s->n_tokens) targets[t] = -1;
    }
}
