/* Text / JSONL -> token file through a tokenizer (see text_data.h). Reads documents in batches of
 * about MT_TEXT_BATCH_BYTES, encodes a batch in parallel and writes it in input order. */
#include "data/text_data.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/lines.h"
#include "data/tokens.h"

#define TD_MAX_BATCH_DOCS 65536
#define TD_OUT_TOKENS 65536
#define TD_INDEX_DOCS 8192

/* What became of a document, decided in the parallel phase. */
typedef enum { TD_KEEP = 0, TD_EMPTY, TD_BAD_JSON, TD_NO_TEXT } td_kind;

typedef struct {
    char *text;   /* the document, or (json) its JSONL line */
    size_t len;
    const char *path;
    int64_t line; /* first line of the document (1-based) */
    int json;     /* text is a JSONL line: its "text" field is the document */
    int cont;     /* byte-level pieces of one long document: this one continues the last one */
    int more;     /* ... and another follows (no eos after this one) */
    td_kind kind;
    char err[160]; /* jansson's message for a bad line */
    int32_t *ids; /* filled by the encoder */
    size_t n_ids;
    int invalid_utf8;
} td_doc;

typedef struct {
    const mt_tokenizer *tok;
    const mt_text_opts *o;
    int eos, elem_size;
    mt_text_stats *s;
    int64_t total_bytes;
    double t0;
    mt_atomic_file af;
    unsigned char *out;
    int n_out;
    td_doc *docs;
    int n_docs;
    size_t batch_bytes;
    int utf8_noted; /* the document in pieces being written was counted as invalid UTF-8 */
    mt_atomic_file ix; /* o->doc_index: the document ends */
    unsigned char *ix_out;
    int n_ix;
} td_run;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int mt_text_is_jsonl(const char *path) {
    size_t n = strlen(path);
    return n >= 6 && strcmp(path + n - 6, ".jsonl") == 0;
}

mt_text_opts mt_text_opts_default(void) {
    return (mt_text_opts){.doc_sep = NULL, .elem_size = 0, .eos_id = -1, .add_special = 1};
}

int mt_text_utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        unsigned lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) k = 1;
        else if (c >= 0xe0 && c <= 0xef) {
            k = 2;
            if (c == 0xe0) lo = 0xa0;
            if (c == 0xed) hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 3;
            if (c == 0xf0) lo = 0x90;
            if (c == 0xf4) hi = 0x8f;
        } else return 0;
        if (i + k >= n) return 0; /* truncated */
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t j = 2; j <= k; j++)
            if ((s[i + j] & 0xc0) != 0x80) return 0;
        i += k + 1;
    }
    return 1;
}

int mt_text_only_space(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!(c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f')) return 0;
    }
    return 1;
}

/* ---- output ---- */

static int put_token(td_run *r, int32_t id) {
    unsigned char *p = r->out + (size_t)r->n_out * r->elem_size;
    uint32_t u = (uint32_t)id;
    p[0] = (unsigned char)u, p[1] = (unsigned char)(u >> 8);
    if (r->elem_size == 4) p[2] = (unsigned char)(u >> 16), p[3] = (unsigned char)(u >> 24);
    r->s->tokens++;
    if (++r->n_out < TD_OUT_TOKENS) return MT_OK;
    r->n_out = 0;
    return mt_atomic_write(&r->af, r->out, (size_t)TD_OUT_TOKENS * r->elem_size);
}

/* The end of the document just written (o->doc_index only). */
static int put_doc_end(td_run *r) {
    if (!r->ix_out) return MT_OK;
    uint64_t u = (uint64_t)r->s->tokens;
    unsigned char *p = r->ix_out + (size_t)r->n_ix * 8;
    for (int b = 0; b < 8; b++) p[b] = (unsigned char)(u >> (8 * b));
    if (++r->n_ix < TD_INDEX_DOCS) return MT_OK;
    r->n_ix = 0;
    return mt_atomic_write(&r->ix, r->ix_out, (size_t)TD_INDEX_DOCS * 8);
}

/* A JSONL line -> its "text" (replacing d->text), or the kind of problem. */
static td_kind parse_json(td_doc *d) {
    json_error_t err;
    json_t *j = json_loadb(d->text, d->len, JSON_ALLOW_NUL, &err);
    json_t *text = json_is_object(j) ? json_object_get(j, "text") : NULL;
    td_kind k = TD_KEEP;
    if (!json_is_object(j)) {
        snprintf(d->err, sizeof d->err, "%s", j ? "not a JSON object" : err.text);
        k = TD_BAD_JSON;
    } else if (!json_is_string(text)) {
        k = TD_NO_TEXT;
    } else {
        free(d->text);
        d->len = json_string_length(text);
        d->text = mt_malloc(d->len + 1);
        memcpy(d->text, json_string_value(text), d->len);
    }
    json_decref(j);
    return k;
}

static void encode_doc(const mt_tokenizer *tok, int add_special, td_doc *d) {
    d->kind = d->json ? parse_json(d) : TD_KEEP;
    /* Only a document without a byte is skipped: whitespace is text to tokenizer(text) too. */
    if (d->kind == TD_KEEP && d->len == 0 && !d->cont) d->kind = TD_EMPTY;
    if (d->kind != TD_KEEP) return;
    d->invalid_utf8 = !mt_text_utf8_valid((const unsigned char *)d->text, d->len);
    if (tok) {
        mt_tokenizer_encode(tok, d->text, d->len, add_special, &d->ids, &d->n_ids);
        return;
    }
    d->ids = mt_malloc((d->len ? d->len : 1) * sizeof(int32_t));
    for (size_t i = 0; i < d->len; i++) d->ids[i] = (unsigned char)d->text[i];
    d->n_ids = d->len;
}

static void note(int64_t *count, const char **path, int64_t *line, const td_doc *d) {
    if ((*count)++ == 0) *path = d->path, *line = d->line;
}

/* Counts a skipped document, or writes a kept one followed by eos. */
static int write_doc(td_run *r, const td_doc *d) {
    mt_text_stats *s = r->s;
    switch (d->kind) {
    case TD_EMPTY: note(&s->empty_docs, &s->empty_path, &s->empty_line, d); return MT_OK;
    case TD_BAD_JSON:
        if (s->bad_json == 0) snprintf(s->bad_json_error, sizeof s->bad_json_error, "%s", d->err);
        note(&s->bad_json, &s->bad_json_path, &s->bad_json_line, d);
        return MT_OK;
    case TD_NO_TEXT: note(&s->missing_text, &s->missing_text_path, &s->missing_text_line, d); return MT_OK;
    case TD_KEEP: break;
    }
    /* a document in pieces is counted once, as one document */
    if (d->invalid_utf8 && !r->utf8_noted)
        note(&s->invalid_utf8, &s->invalid_utf8_path, &s->invalid_utf8_line, d);
    r->utf8_noted = d->more && (r->utf8_noted || d->invalid_utf8);
    for (size_t k = 0; k < d->n_ids; k++) MT_TRY(put_token(r, d->ids[k]));
    if (d->more) return MT_OK;
    MT_TRY(put_token(r, r->eos));
    s->documents++;
    return put_doc_end(r);
}

/* Parses (JSONL) and encodes the pending documents in parallel, writes them in order, frees them. */
static int flush_batch(td_run *r) {
    int n = r->n_docs, add_special = r->o->add_special;
    td_doc *docs = r->docs;
    const mt_tokenizer *tok = r->tok;
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
    for (int i = 0; i < n; i++) encode_doc(tok, add_special, &docs[i]);
    int rc = MT_OK;
    for (int i = 0; i < n; i++) {
        if (rc == MT_OK) rc = write_doc(r, &docs[i]);
        free(docs[i].text);
        free(docs[i].ids);
    }
    r->n_docs = 0;
    r->batch_bytes = 0;
    r->s->seconds = now_s() - r->t0;
    if (rc == MT_OK && r->o->progress) r->o->progress(r->s, r->total_bytes, 0, r->o->progress_user);
    return rc;
}

/* Takes ownership of text: a document (or a piece of one: cont, more), or (json) a JSONL line. */
static int add_doc(td_run *r, char *text, size_t len, const char *path, int64_t line, int json, int cont,
                   int more) {
    r->docs[r->n_docs++] = (td_doc){.text = text, .len = len, .path = path, .line = line, .json = json,
                                    .cont = cont, .more = more};
    r->batch_bytes += len;
    if (r->n_docs == TD_MAX_BATCH_DOCS || r->batch_bytes >= MT_TEXT_BATCH_BYTES) return flush_batch(r);
    return MT_OK;
}

/* ---- readers ---- */

static int is_sep_line(const char *line, size_t n, const char *sep, size_t sep_len) {
    if (n && line[n - 1] == '\n') n--;
    if (n && line[n - 1] == '\r') n--;
    return n == sep_len && memcmp(line, sep, n) == 0;
}

typedef struct {
    char *p;
    size_t n, cap;
} td_buf;

static void buf_put(td_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n + 1);
        b->p = realloc(b->p, b->cap);
        MT_CHECK(b->p, "out of memory holding a document of %zu bytes", b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

/* Hands the buffer's text over as a document (an empty buffer still counts as an empty one), or,
 * more = 1, as a piece of one that goes on; cont: the buffer continues an earlier piece. */
static int emit_buf(td_run *r, td_buf *b, const char *path, int64_t line, int cont, int more) {
    char *text = b->p ? b->p : mt_malloc(1);
    size_t len = b->n;
    *b = (td_buf){0};
    return add_doc(r, text, len, path, line, 0, cont, more);
}

static int read_text(td_run *r, mt_lines *L) {
    const char *sep = r->o->doc_sep, *line;
    size_t sep_len = sep ? strlen(sep) : 0, len;
    td_buf doc = {0};
    int64_t doc_line = 1;
    int rc = MT_OK, got, cont = 0;
    while (rc == MT_OK && (got = mt_lines_next(L, &line, &len)) > 0) {
        r->s->bytes += (int64_t)len;
        if (sep && is_sep_line(line, len, sep, sep_len)) {
            /* a separator right after another (or at the start) ends no lines: not a document */
            if (doc.n || cont) rc = emit_buf(r, &doc, L->path, doc_line, cont, 0);
            cont = 0;
            doc_line = L->lineno + 1;
        } else {
            buf_put(&doc, line, len);
            /* Byte-level ids do not depend on where a document is cut, so a long one goes in
             * pieces (at line ends) and memory stays bounded; a tokenizer needs it whole. */
            if (!r->tok && doc.n >= MT_TEXT_BATCH_BYTES) {
                rc = emit_buf(r, &doc, L->path, doc_line, cont, 1);
                cont = 1;
            }
        }
    }
    if (rc == MT_OK && got < 0) rc = MT_ERR;
    if (rc == MT_OK && (doc.n || cont || !sep)) rc = emit_buf(r, &doc, L->path, doc_line, cont, 0);
    free(doc.p);
    return rc;
}

/* Lines are only collected here; parsing them is part of the parallel work. */
static int read_jsonl(td_run *r, mt_lines *L) {
    const char *line;
    size_t len;
    int rc = MT_OK, got;
    while (rc == MT_OK && (got = mt_lines_next(L, &line, &len)) > 0) {
        r->s->bytes += (int64_t)len;
        if (mt_text_only_space(line, len)) continue;
        char *copy = mt_malloc(len + 1);
        memcpy(copy, line, len);
        rc = add_doc(r, copy, len, L->path, L->lineno, 1, 0, 0);
    }
    return rc == MT_OK && got < 0 ? MT_ERR : rc;
}

/* ---- driver ---- */

static int setup(td_run *r, const char *const *paths, int n, const char *out_path) {
    const mt_text_opts *o = r->o;
    if (n < 1) return mt_error_set("%s: no input files given", out_path);
    int vocab = r->tok ? mt_tokenizer_vocab_size(r->tok) : 256;
    r->eos = o->eos_id >= 0 ? o->eos_id : r->tok ? mt_tokenizer_eos(r->tok) : -1;
    if (r->eos < 0 && !r->tok)
        return mt_error_set("%s: byte-level tokens need an eos id (>= 256)", out_path);
    if (r->eos < 0)
        return mt_error_set("%s: the tokenizer has no end-of-text token (no eos_token in "
                            "tokenizer_config.json and none of <|endoftext|>, </s>, <|end_of_text|>, "
                            "<|im_end|>, <|eot_id|>); documents cannot be separated",
                            out_path);
    if (!r->tok && r->eos < 256)
        return mt_error_set("%s: byte-level eos id %d must be >= 256", out_path, r->eos);
    if (r->eos >= vocab) vocab = r->eos + 1;
    int need = mt_tokens_elem_size_for_vocab(vocab);
    r->elem_size = o->elem_size ? o->elem_size : need;
    if (r->elem_size != 2 && r->elem_size != 4)
        return mt_error_set("%s: element size %d must be 2 (uint16) or 4 (uint32)", out_path, r->elem_size);
    if (r->elem_size < need)
        return mt_error_set("%s: ids go up to %d, past uint16; use uint32 (--dtype u32)", out_path, vocab - 1);
    MT_TRY(mt_lines_total_bytes(paths, n, &r->total_bytes));
    r->s->elem_size = r->elem_size;
    r->s->eos_id = r->eos;
    return MT_OK;
}

int mt_text_to_tokens(const mt_tokenizer *tok, const char *const *paths, int n, const char *out_path,
                      const mt_text_opts *opts, mt_text_stats *stats) {
    mt_text_opts def = mt_text_opts_default();
    mt_text_stats local;
    td_run r = {.tok = tok, .o = opts ? opts : &def, .s = stats ? stats : &local, .t0 = now_s()};
    memset(r.s, 0, sizeof *r.s);
    MT_TRY(setup(&r, paths, n, out_path));
    MT_TRY(mt_atomic_open(&r.af, out_path));
    if (r.o->doc_index && mt_atomic_open(&r.ix, r.o->doc_index) != MT_OK) {
        mt_atomic_abort(&r.af);
        return MT_ERR;
    }
    if (r.o->doc_index) r.ix_out = mt_malloc((size_t)TD_INDEX_DOCS * 8);
    r.out = mt_malloc((size_t)TD_OUT_TOKENS * r.elem_size);
    r.docs = mt_malloc(TD_MAX_BATCH_DOCS * sizeof(td_doc));
    int rc = MT_OK;
    for (int i = 0; rc == MT_OK && i < n; i++) {
        mt_lines L;
        if ((rc = mt_lines_open(&L, paths[i])) != MT_OK) break;
        rc = mt_text_is_jsonl(paths[i]) ? read_jsonl(&r, &L) : read_text(&r, &L);
        mt_lines_close(&L);
    }
    if (rc == MT_OK && r.n_docs) rc = flush_batch(&r);
    for (int i = 0; i < r.n_docs; i++) free(r.docs[i].text); /* left by an error */
    if (rc == MT_OK && r.s->documents == 0)
        rc = mt_error_set("%s: no text: the %d input file(s) (first %s) hold no non-empty document "
                          "(%lld empty, %lld lines not JSON, %lld without a string \"text\")",
                          out_path, n, paths[0], (long long)r.s->empty_docs, (long long)r.s->bad_json,
                          (long long)r.s->missing_text);
    if (rc == MT_OK && r.n_out) rc = mt_atomic_write(&r.af, r.out, (size_t)r.n_out * r.elem_size);
    if (r.ix_out) { /* the index first: a token file is never newer than its index */
        if (rc == MT_OK && r.n_ix) rc = mt_atomic_write(&r.ix, r.ix_out, (size_t)r.n_ix * 8);
        if (rc == MT_OK) rc = mt_atomic_commit(&r.ix);
        else mt_atomic_abort(&r.ix);
    }
    if (rc == MT_OK) rc = mt_atomic_commit(&r.af);
    else mt_atomic_abort(&r.af);
    r.s->seconds = now_s() - r.t0;
    if (rc == MT_OK && r.o->progress) r.o->progress(r.s, r.total_bytes, 1, r.o->progress_user);
    free(r.out);
    free(r.ix_out);
    free(r.docs);
    return rc;
}

/* ---- reporting ---- */

void mt_text_stats_report(const mt_text_stats *s, const char *prefix, FILE *out) {
    if (s->empty_docs)
        fprintf(out, "%s%lld empty document(s) skipped (first: %s line %lld)\n", prefix,
                (long long)s->empty_docs, s->empty_path, (long long)s->empty_line);
    if (s->bad_json)
        fprintf(out, "%s%lld line(s) that are not a JSON object skipped (first: %s line %lld: %s)\n",
                prefix, (long long)s->bad_json, s->bad_json_path, (long long)s->bad_json_line,
                s->bad_json_error);
    if (s->missing_text)
        fprintf(out, "%s%lld JSON object(s) without a string \"text\" skipped (first: %s line %lld)\n",
                prefix, (long long)s->missing_text, s->missing_text_path, (long long)s->missing_text_line);
    if (s->invalid_utf8)
        fprintf(out, "%s%lld document(s) with invalid UTF-8 encoded as raw bytes (first: %s line %lld)\n",
                prefix, (long long)s->invalid_utf8, s->invalid_utf8_path, (long long)s->invalid_utf8_line);
}

void mt_text_progress_stderr(const mt_text_stats *s, int64_t total_bytes, int done, void *user) {
    (void)user;
    mt_lines_progress("tokenize", s->bytes, total_bytes, s->documents, "documents", s->tokens, s->seconds, done);
}
