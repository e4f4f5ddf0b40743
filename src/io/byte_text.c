/* Byte-level text -> uint16 token file (see byte_text.h). Streams line by line, so inputs of any
 * size need only one line plus the leading whitespace of the current document in memory. */
#include "io/byte_text.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/atomic_file.h"

#define MT_BT_BUF_TOKENS 65536

typedef struct {
    mt_atomic_file af;
    unsigned char buf[2 * MT_BT_BUF_TOKENS]; /* little-endian uint16 */
    int nbuf;
    int64_t n_tokens;
    /* The current document: bytes are held back only until its first non-whitespace byte, so that
     * whitespace-only documents can be dropped without buffering whole documents. */
    int has_content;
    char *pending;
    size_t n_pending, cap_pending;
} bt_writer;

static int flush_tokens(bt_writer *w) {
    int rc = mt_atomic_write(&w->af, w->buf, (size_t)w->nbuf * 2);
    w->nbuf = 0;
    return rc;
}

static int push_token(bt_writer *w, int id) {
    w->buf[2 * w->nbuf] = (unsigned char)(id & 0xff);
    w->buf[2 * w->nbuf + 1] = (unsigned char)(id >> 8);
    w->n_tokens++;
    if (++w->nbuf == MT_BT_BUF_TOKENS) return flush_tokens(w);
    return MT_OK;
}

static int push_bytes(bt_writer *w, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) MT_TRY(push_token(w, (unsigned char)s[i]));
    return MT_OK;
}

static int is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static int doc_bytes(bt_writer *w, const char *s, size_t n) {
    if (w->has_content) return push_bytes(w, s, n);
    size_t i = 0;
    while (i < n && is_space((unsigned char)s[i])) i++;
    if (i == n) { /* still only whitespace: hold it back */
        if (w->n_pending + n > w->cap_pending) {
            w->cap_pending = 2 * (w->n_pending + n);
            char *p = realloc(w->pending, w->cap_pending);
            MT_CHECK(p, "out of memory holding %zu bytes of whitespace", w->cap_pending);
            w->pending = p;
        }
        memcpy(w->pending + w->n_pending, s, n);
        w->n_pending += n;
        return MT_OK;
    }
    w->has_content = 1;
    MT_TRY(push_bytes(w, w->pending, w->n_pending));
    w->n_pending = 0;
    return push_bytes(w, s, n);
}

static int end_doc(bt_writer *w, int eos_id) {
    int rc = w->has_content ? push_token(w, eos_id) : MT_OK;
    w->has_content = 0;
    w->n_pending = 0;
    return rc;
}

/* Line without its "\n" / "\r\n" equals sep. */
static int is_sep_line(const char *line, size_t n, const char *sep, size_t sep_len) {
    if (n && line[n - 1] == '\n') n--;
    if (n && line[n - 1] == '\r') n--;
    return n == sep_len && memcmp(line, sep, n) == 0;
}

static int convert_file(bt_writer *w, const char *path, const char *sep, int eos_id) {
    FILE *in = fopen(path, "rb");
    if (!in) return mt_error_set("%s: cannot open text file: %s", path, strerror(errno));
    size_t sep_len = sep ? strlen(sep) : 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = MT_OK;
    while (rc == MT_OK && (len = getline(&line, &cap, in)) >= 0) {
        if (sep && is_sep_line(line, (size_t)len, sep, sep_len)) rc = end_doc(w, eos_id);
        else rc = doc_bytes(w, line, (size_t)len);
    }
    if (rc == MT_OK && ferror(in))
        rc = mt_error_set("%s: read failed: %s", path, strerror(errno));
    free(line);
    fclose(in);
    if (rc == MT_OK) rc = end_doc(w, eos_id); /* a file end always ends the document */
    return rc;
}

int mt_byte_text_to_tokens(const char *const *text_paths, int n_paths, const char *out_path,
                           const char *doc_sep_line, int eos_id, int64_t *n_tokens_out) {
    if (n_tokens_out) *n_tokens_out = 0;
    if (eos_id < 256 || eos_id > 65535)
        return mt_error_set("%s: eos id %d must be in [256, 65535] (above the byte ids, within "
                            "uint16)", out_path, eos_id);
    if (n_paths < 1) return mt_error_set("%s: no input text files given", out_path);

    bt_writer *w = mt_calloc(1, sizeof *w);
    int rc = mt_atomic_open(&w->af, out_path);
    for (int i = 0; rc == MT_OK && i < n_paths; i++)
        rc = convert_file(w, text_paths[i], doc_sep_line, eos_id);
    if (rc == MT_OK && w->n_tokens == 0)
        rc = mt_error_set("%s: no text: the %d input file(s) (first %s) hold no non-empty document",
                          out_path, n_paths, text_paths[0]);
    if (rc == MT_OK) rc = flush_tokens(w);
    if (rc == MT_OK) rc = mt_atomic_commit(&w->af); /* removes the temporary itself on failure */
    else if (w->af.f) mt_atomic_abort(&w->af);
    if (rc == MT_OK && n_tokens_out) *n_tokens_out = w->n_tokens;
    free(w->pending);
    free(w);
    return rc;
}

int mt_byte_text_decode(const int32_t *ids, int n, char *out, size_t out_size) {
    if (out_size == 0) return 0;
    size_t k = 0;
    for (int i = 0; i < n && k + 1 < out_size; i++) {
        if (ids[i] < 0) continue;
        out[k++] = ids[i] < 256 ? (char)(unsigned char)ids[i] : '\n';
    }
    out[k] = '\0';
    return (int)k;
}
