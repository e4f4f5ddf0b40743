/* Decoding, as tokenizers' Tokenizer::decode: ids -> token strings (added tokens first, special ones
 * dropped on request), then the decoder chain over the list of strings, then concatenation.
 * Without MT_TOK_HF_LOSSY the chain keeps bytes that are not UTF-8 (so decode(encode(x)) == x for
 * any bytes); with it, U+FFFD appears exactly where tokenizers' decoders put it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

typedef struct {
    tok_buf bytes;   /* the strings, back to back */
    size_t *off, *len;
    size_t n, cap;
} tok_list;

static void list_add(tok_list *l, const char *s, size_t n) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->off = realloc(l->off, l->cap * sizeof *l->off);
        l->len = realloc(l->len, l->cap * sizeof *l->len);
        MT_CHECK(l->off && l->len, "out of host memory (decode list)");
    }
    l->off[l->n] = l->bytes.n;
    l->len[l->n] = n;
    l->n++;
    tok_buf_reserve(&l->bytes, n ? n : 1); /* so that STR() never offsets a NULL buffer */
    tok_buf_put(&l->bytes, s, n);
}

/* Starts a new string that is then written with tok_buf_put(&l->bytes, ...) + list_end(). */
static void list_begin(tok_list *l) { list_add(l, "", 0); }
static void list_end(tok_list *l) { l->len[l->n - 1] = l->bytes.n - l->off[l->n - 1]; }

static void list_clear(tok_list *l) {
    l->n = 0;
    l->bytes.n = 0;
}

static void list_free(tok_list *l) {
    tok_buf_free(&l->bytes);
    free(l->off);
    free(l->len);
}

#define STR(l, i) ((l)->bytes.p + (l)->off[i])

static int16_t byte_of_char[512];
static pthread_once_t byte_of_char_once = PTHREAD_ONCE_INIT;

static void byte_of_char_init(void) { /* inverse of GPT-2's bytes_to_unicode (see bpe.c) */
    for (int c = 0; c < 512; c++) byte_of_char[c] = -1;
    int k = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_of_char[printable ? b : 256 + k++] = (int16_t)b;
    }
}

static inline int16_t char_to_byte(uint32_t cp) { return cp < 512 ? byte_of_char[cp] : -1; }

static void dec_bytelevel(const tok_list *in, tok_list *out, int lossy) {
    tok_buf all = {0};
    for (size_t i = 0; i < in->n; i++) {
        const unsigned char *s = (const unsigned char *)STR(in, i);
        size_t n = in->len[i], start = all.n, j = 0;
        int ok = 1;
        while (j < n) {
            uint32_t cp;
            int k = tok_utf8_next(s + j, n - j, &cp);
            int16_t b = k ? char_to_byte(cp) : -1;
            if (b < 0) {
                ok = 0;
                break;
            }
            tok_buf_putc(&all, (char)b);
            j += (size_t)k;
        }
        if (!ok) { /* a character outside the alphabet: the token's own bytes */
            all.n = start;
            tok_buf_put(&all, s, n);
        }
    }
    list_begin(out);
    if (lossy) tok_utf8_lossy(&out->bytes, all.p, all.n);
    else tok_buf_put(&out->bytes, all.p, all.n);
    list_end(out);
    tok_buf_free(&all);
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void flush_bytes(tok_buf *pending, tok_list *out, int lossy) {
    if (!pending->n) return;
    if (!lossy || tok_utf8_valid(pending->p, pending->n)) {
        list_add(out, pending->p, pending->n);
    } else {
        for (size_t i = 0; i < pending->n; i++) list_add(out, "\xEF\xBF\xBD", 3);
    }
    pending->n = 0;
}

static void dec_bytefallback(const tok_list *in, tok_list *out, int lossy) {
    tok_buf pending = {0};
    for (size_t i = 0; i < in->n; i++) {
        const char *s = STR(in, i);
        size_t n = in->len[i];
        int hi, lo;
        if (n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && (hi = hex_digit(s[3])) >= 0 &&
            (lo = hex_digit(s[4])) >= 0) {
            tok_buf_putc(&pending, (char)(hi * 16 + lo));
            continue;
        }
        flush_bytes(&pending, out, lossy);
        list_add(out, s, n);
    }
    flush_bytes(&pending, out, lossy);
    tok_buf_free(&pending);
}

static void dec_replace(const tok_list *in, tok_list *out, const tok_decoder *d) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = STR(in, i);
        size_t n = in->len[i], j = 0, run = 0;
        list_begin(out);
        while (d->alen && j + d->alen <= n) {
            const char *f = memmem(s + j, n - j, d->a, d->alen);
            if (!f) break;
            j = (size_t)(f - s);
            tok_buf_put(&out->bytes, s + run, j - run);
            tok_buf_put(&out->bytes, d->b, d->blen);
            j += d->alen;
            run = j;
        }
        tok_buf_put(&out->bytes, s + run, n - run);
        list_end(out);
    }
}

static void dec_strip(const tok_list *in, tok_list *out, const tok_decoder *d) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = STR(in, i);
        size_t n = in->len[i], b = 0, e = n;
        /* up to `start` leading and `stop` trailing copies of the character */
        for (int k = 0; k < d->start && e - b >= d->alen && memcmp(s + b, d->a, d->alen) == 0; k++)
            b += d->alen;
        for (int k = 0; k < d->stop && e - b >= d->alen && memcmp(s + e - d->alen, d->a, d->alen) == 0; k++)
            e -= d->alen;
        list_add(out, s + b, e - b);
    }
}

static void dec_metaspace(const tok_list *in, tok_list *out, const tok_decoder *d) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = STR(in, i);
        size_t n = in->len[i], j = 0, run = 0;
        int drop = i == 0 && d->prepend_scheme != PREPEND_NEVER; /* every one in the first token */
        list_begin(out);
        while (d->alen && j + d->alen <= n) {
            const char *f = memmem(s + j, n - j, d->a, d->alen);
            if (!f) break;
            j = (size_t)(f - s);
            tok_buf_put(&out->bytes, s + run, j - run);
            if (!drop) tok_buf_putc(&out->bytes, ' ');
            j += d->alen;
            run = j;
        }
        tok_buf_put(&out->bytes, s + run, n - run);
        list_end(out);
    }
}

int mt_tokenizer_decode(const mt_tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                        char **text, size_t *len) {
    int lossy = (flags & MT_TOK_HF_LOSSY) != 0;
    pthread_once(&byte_of_char_once, byte_of_char_init);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n_ids || !t->id_tok[ids[i]])
            return mt_error_set("decode: id %d (position %zu) is not in the vocabulary of %s",
                                (int)ids[i], i, t->path);
    tok_list a = {0}, b = {0};
    for (size_t i = 0; i < n; i++) {
        if ((flags & MT_TOK_SKIP_SPECIAL) && t->id_special[ids[i]]) continue;
        list_add(&a, t->id_tok[ids[i]], t->id_len[ids[i]]);
    }
    tok_buf res = {0};
    if (!t->has_decoder) { /* tokenizers joins with spaces */
        for (size_t i = 0; i < a.n; i++) {
            if (i) tok_buf_putc(&res, ' ');
            tok_buf_put(&res, STR(&a, i), a.len[i]);
        }
    } else {
        tok_list *in = &a, *out = &b;
        for (int k = 0; k < t->n_decs; k++) {
            const tok_decoder *d = &t->decs[k];
            list_clear(out);
            switch (d->kind) {
            case TD_BYTELEVEL: dec_bytelevel(in, out, lossy); break;
            case TD_BYTEFALLBACK: dec_bytefallback(in, out, lossy); break;
            case TD_REPLACE: dec_replace(in, out, d); break;
            case TD_STRIP: dec_strip(in, out, d); break;
            case TD_METASPACE: dec_metaspace(in, out, d); break;
            case TD_FUSE:
                list_begin(out);
                for (size_t i = 0; i < in->n; i++) tok_buf_put(&out->bytes, STR(in, i), in->len[i]);
                list_end(out);
                break;
            }
            tok_list *sw = in;
            in = out;
            out = sw;
        }
        for (size_t i = 0; i < in->n; i++) tok_buf_put(&res, STR(in, i), in->len[i]);
    }
    tok_buf_putc(&res, 0);
    *len = res.n - 1;
    *text = res.p;
    list_free(&a);
    list_free(&b);
    return MT_OK;
}
