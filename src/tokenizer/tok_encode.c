/* Encoding, in the order of tokenizers' Tokenizer::encode:
 *   1. added tokens whose "normalized" is false are split out of the raw text;
 *   2. each remaining segment is normalized, and the normalized added tokens are split out of it;
 *   3. each remaining piece goes through the pre-tokenizers (a stage at a time, recursively, so no
 *      list of pieces is ever built for the whole text);
 *   4. each pre-token goes through the BPE model;
 *   5. with add_special, the post-processor's template wraps the ids. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

#define TOK_MAX_STAGES 16 /* pre-tokenizers in a Sequence; the loader refuses more */

typedef struct {
    size_t s, e;
    int match;
} tok_span;

typedef struct {
    tok_span *v;
    size_t n, cap;
} tok_spans;

static void spans_push(tok_spans *l, size_t s, size_t e, int match) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        MT_CHECK(l->v != NULL, "out of host memory (split list)");
    }
    l->v[l->n++] = (tok_span){s, e, match};
}

typedef struct {
    const mt_tokenizer *t;
    mt_token_vec *out;
    tok_matcher matcher;
    tok_buf stage_buf[TOK_MAX_STAGES];
    tok_spans spans[TOK_MAX_STAGES], pieces[TOK_MAX_STAGES];
    tok_buf norm, norm_tmp;
} enc_ctx;

/* ---- normalizers ---- */

static void unicode_normalize(int options, const char *s, size_t n, tok_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    /* Fast path: NFC leaves every code point below U+0300 (lead byte < 0xCC) as it is (they are
     * NFC_QC=Yes and nothing composes with them without a mark at or above U+0300); the
     * decompositions and compatibility forms leave ASCII as it is. */
    unsigned limit = (options == (UTF8PROC_STABLE | UTF8PROC_COMPOSE)) ? 0xCC : 0x80;
    size_t i = 0;
    while (i < n && u[i] < limit) i++;
    if (i == n) {
        tok_buf_put(out, s, n);
        return;
    }
    /* utf8proc needs valid UTF-8: normalize each valid run, pass invalid bytes through. */
    i = 0;
    while (i < n) {
        size_t j = i;
        uint32_t cp;
        int k;
        while (j < n && (k = u[j] < 0x80 ? 1 : tok_utf8_next(u + j, n - j, &cp)) > 0) j += (size_t)k;
        if (j > i) {
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t m = utf8proc_map(u + i, (utf8proc_ssize_t)(j - i), &dst,
                                              (utf8proc_option_t)options);
            if (m >= 0) tok_buf_put(out, dst, (size_t)m);
            else tok_buf_put(out, s + i, j - i); /* utf8proc refused it: leave it as it is */
            free(dst);
        }
        if (j < n) tok_buf_putc(out, s[j++]);
        i = j;
    }
}

static void replace_all(const char *s, size_t n, const char *a, size_t an, const char *b, size_t bn,
                        tok_buf *out) {
    size_t i = 0, run = 0;
    while (an && i + an <= n) {
        const char *f = memmem(s + i, n - i, a, an);
        if (!f) break;
        i = (size_t)(f - s);
        tok_buf_put(out, s + run, i - run);
        tok_buf_put(out, b, bn);
        i += an;
        run = i;
    }
    tok_buf_put(out, s + run, n - run);
}

static void normalize_into(const mt_tokenizer *t, const char *s, size_t n, tok_buf *out, tok_buf *tmp) {
    out->n = 0;
    tok_buf_put(out, s, n);
    for (int k = 0; k < t->n_norms; k++) {
        const tok_norm *nm = &t->norms[k];
        tmp->n = 0;
        switch (nm->kind) {
        case TN_UNICODE:
            unicode_normalize(nm->uform, out->p, out->n, tmp);
            break;
        case TN_PREPEND:
            if (out->n) tok_buf_put(tmp, nm->a, nm->alen);
            tok_buf_put(tmp, out->p, out->n);
            break;
        case TN_REPLACE:
            replace_all(out->p, out->n, nm->a, nm->alen, nm->b, nm->blen, tmp);
            break;
        }
        tok_buf swap = *out;
        *out = *tmp;
        *tmp = swap;
    }
}

void tok_normalize(const mt_tokenizer *t, const char *s, size_t n, tok_buf *out) {
    tok_buf tmp = {0};
    normalize_into(t, s, n, out, &tmp);
    tok_buf_free(&tmp);
}

/* ---- pre-tokenizers ---- */

static void pretok_run(enc_ctx *c, int stage, const char *p, size_t n, int at_start);

/* tokenizers' SplitDelimiterBehavior applied to a list of spans covering the piece. */
static void apply_behavior(const tok_spans *in, int behavior, tok_spans *out) {
    out->n = 0;
    int prev = 0;
    switch (behavior) {
    case SPLIT_REMOVED:
        for (size_t i = 0; i < in->n; i++)
            if (!in->v[i].match) spans_push(out, in->v[i].s, in->v[i].e, 0);
        break;
    case SPLIT_ISOLATED:
        for (size_t i = 0; i < in->n; i++) spans_push(out, in->v[i].s, in->v[i].e, 0);
        break;
    case SPLIT_MERGED_PREV:
        for (size_t i = 0; i < in->n; i++) {
            if (in->v[i].match && !prev && out->n) out->v[out->n - 1].e = in->v[i].e;
            else spans_push(out, in->v[i].s, in->v[i].e, 0);
            prev = in->v[i].match;
        }
        break;
    case SPLIT_MERGED_NEXT: /* tokenizers folds from the end */
        for (size_t i = in->n; i-- > 0;) {
            if (in->v[i].match && !prev && out->n) out->v[out->n - 1].s = in->v[i].s;
            else spans_push(out, in->v[i].s, in->v[i].e, 0);
            prev = in->v[i].match;
        }
        for (size_t i = 0; i < out->n / 2; i++) {
            tok_span x = out->v[i];
            out->v[i] = out->v[out->n - 1 - i];
            out->v[out->n - 1 - i] = x;
        }
        break;
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < in->n; i++) {
            if (in->v[i].match == prev && out->n) out->v[out->n - 1].e = in->v[i].e;
            else spans_push(out, in->v[i].s, in->v[i].e, 0);
            prev = in->v[i].match;
        }
        break;
    }
}

/* Matches of re (or of the literal lit when re is NULL) and the gaps between them. */
static void collect_spans(enc_ctx *c, const tok_regex *re, const char *lit, size_t lit_len,
                          int invert, const char *p, size_t n, tok_spans *l) {
    l->n = 0;
    size_t pos = 0, ms, me;
    tok_subject sub;
    if (re) tok_subject_init(&sub, re, p, n, TOK_RE_AUTO);
    for (;;) {
        int found;
        if (re) {
            found = tok_regex_next(re, &sub, &c->matcher, pos, &ms, &me);
        } else {
            const char *f = pos < n ? memmem(p + pos, n - pos, lit, lit_len) : NULL;
            found = f != NULL;
            if (found) {
                ms = (size_t)(f - p);
                me = ms + lit_len;
            }
        }
        if (!found) break;
        if (ms > pos) spans_push(l, pos, ms, invert);
        spans_push(l, ms, me, !invert);
        pos = me;
    }
    if (pos < n) spans_push(l, pos, n, invert);
}

static void split_run(enc_ctx *c, int stage, const tok_regex *re, const char *lit, size_t lit_len,
                      int behavior, int invert, const char *p, size_t n, int at_start) {
    if (behavior == SPLIT_ISOLATED && re) { /* the common case, streamed */
        size_t pos = 0, ms, me;
        tok_subject sub;
        tok_subject_init(&sub, re, p, n, TOK_RE_AUTO);
        while (tok_regex_next(re, &sub, &c->matcher, pos, &ms, &me)) {
            if (ms > pos) pretok_run(c, stage + 1, p + pos, ms - pos, at_start && pos == 0);
            pretok_run(c, stage + 1, p + ms, me - ms, at_start && ms == 0);
            pos = me;
        }
        if (pos < n) pretok_run(c, stage + 1, p + pos, n - pos, at_start && pos == 0);
        return;
    }
    tok_spans *l = &c->spans[stage], *pieces = &c->pieces[stage];
    collect_spans(c, re, lit, lit_len, invert, p, n, l);
    apply_behavior(l, behavior, pieces);
    for (size_t i = 0; i < pieces->n; i++) {
        tok_span s = pieces->v[i];
        pretok_run(c, stage + 1, p + s.s, s.e - s.s, at_start && s.s == 0);
    }
}

static void pretok_run(enc_ctx *c, int stage, const char *p, size_t n, int at_start) {
    const mt_tokenizer *t = c->t;
    if (n == 0) return;
    if (stage == t->n_pretoks) {
        tok_bpe_encode_word((tok_bpe *)&t->bpe, p, n, c->out);
        return;
    }
    const tok_pretok *pt = &t->pretoks[stage];
    tok_buf *b = &c->stage_buf[stage];
    switch (pt->kind) {
    case TP_SPLIT:
        split_run(c, stage, &pt->re, NULL, 0, pt->behavior, pt->invert, p, n, at_start);
        break;
    case TP_BYTELEVEL:
        if (pt->add_prefix_space && p[0] != ' ') {
            b->n = 0;
            tok_buf_putc(b, ' ');
            tok_buf_put(b, p, n);
            p = b->p;
            n = b->n;
        }
        /* The byte -> character mapping is implicit: the model works on raw bytes. */
        if (pt->use_regex) split_run(c, stage, &pt->re, NULL, 0, SPLIT_ISOLATED, 0, p, n, at_start);
        else pretok_run(c, stage + 1, p, n, at_start);
        break;
    case TP_METASPACE: {
        b->n = 0;
        tok_buf_reserve(b, n + pt->repl_len);
        replace_all(p, n, " ", 1, pt->repl, pt->repl_len, b);
        int starts = b->n >= pt->repl_len && memcmp(b->p, pt->repl, pt->repl_len) == 0;
        int prepend = pt->prepend_scheme == PREPEND_ALWAYS || (pt->prepend_scheme == PREPEND_FIRST && at_start);
        if (prepend && !starts) {
            tok_buf_reserve(b, pt->repl_len);
            memmove(b->p + pt->repl_len, b->p, b->n);
            memcpy(b->p, pt->repl, pt->repl_len);
            b->n += pt->repl_len;
        }
        if (pt->split)
            split_run(c, stage, NULL, pt->repl, pt->repl_len, SPLIT_MERGED_NEXT, 0, b->p, b->n, at_start);
        else
            pretok_run(c, stage + 1, b->p, b->n, at_start);
        break;
    }
    }
}

/* ---- added tokens ---- */

/* Start of the run of whitespace that ends at s[end] (tokenizers' \s*$). */
static size_t whitespace_start_before(const char *s, size_t end) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = end;
    while (i > 0) {
        size_t j = i - 1;
        while (j > 0 && (u[j] & 0xC0) == 0x80 && i - j < 4) j--;
        uint32_t cp;
        if (tok_utf8_next(u + j, i - j, &cp) != (int)(i - j) || !tok_is_whitespace(cp)) break;
        i = j;
    }
    return i;
}

static size_t whitespace_len_at(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int k = tok_utf8_next(u + i, n - i, &cp);
        if (!k || !tok_is_whitespace(cp)) break;
        i += (size_t)k;
    }
    return i;
}

static int word_before(const char *s, size_t end) {
    const unsigned char *u = (const unsigned char *)s;
    if (end == 0) return 0;
    size_t j = end - 1;
    while (j > 0 && (u[j] & 0xC0) == 0x80 && end - j < 4) j--;
    uint32_t cp;
    return tok_utf8_next(u + j, end - j, &cp) == (int)(end - j) && tok_is_word(cp);
}

static int word_at(const char *s, size_t n) {
    uint32_t cp;
    return n > 0 && tok_utf8_next((const unsigned char *)s, n, &cp) > 0 && tok_is_word(cp);
}

typedef void (*gap_fn)(enc_ctx *c, const char *p, size_t n, int at_start);

/* tokenizers' AddedVocabulary::find_matches: leftmost-longest matches, non-overlapping, with the
 * single_word / lstrip / rstrip adjustments; text between them goes to gap(). */
static void added_split(enc_ctx *c, const tok_addset *set, const char *s, size_t n, int at_start,
                        gap_fn gap) {
    const mt_tokenizer *t = c->t;
    if (!set->n) {
        gap(c, s, n, at_start);
        return;
    }
    const unsigned char *u = (const unsigned char *)s;
    size_t start_offset = 0, pos = 0;
    while (pos < n) {
        const tok_added *best = NULL;
        size_t i = pos;
        for (; i < n && !best; i++) {
            if (!set->any[u[i]]) continue;
            for (int k = set->first[u[i]]; k < set->first[u[i] + 1]; k++) { /* longest first */
                const tok_added *a = &t->added[set->idx[k]];
                if (a->plen <= n - i && memcmp(s + i, a->pattern, a->plen) == 0) {
                    best = a;
                    break;
                }
            }
        }
        if (!best) break;
        size_t ms = i - 1, me = ms + best->plen;
        pos = me;
        if (best->single_word && (word_before(s, ms) || word_at(s + me, n - me))) continue;
        if (best->lstrip) {
            size_t ns = whitespace_start_before(s, ms);
            ms = ns > start_offset ? ns : start_offset;
        }
        if (best->rstrip) me += whitespace_len_at(s + me, n - me);
        if (start_offset < ms) gap(c, s + start_offset, ms - start_offset, at_start && start_offset == 0);
        tok_vec_push(c->out, best->id);
        start_offset = me;
    }
    if (start_offset < n) gap(c, s + start_offset, n - start_offset, at_start && start_offset == 0);
}

static void normalized_gap(enc_ctx *c, const char *p, size_t n, int at_start) {
    pretok_run(c, 0, p, n, at_start);
}

static void raw_gap(enc_ctx *c, const char *p, size_t n, int at_start) {
    const mt_tokenizer *t = c->t;
    if (t->n_norms) {
        normalize_into(t, p, n, &c->norm, &c->norm_tmp);
        p = c->norm.p;
        n = c->norm.n;
    }
    if (n) added_split(c, &t->set_norm, p, n, at_start, normalized_gap);
}

int mt_tokenizer_encode_into(const mt_tokenizer *t, const char *text, size_t len, int add_special,
                             mt_token_vec *out) {
    enc_ctx c;
    memset(&c, 0, sizeof c);
    c.t = t;
    c.out = out;
    if (add_special)
        for (int i = 0; i < t->n_prefix; i++) tok_vec_push(out, t->prefix_ids[i]);
    if (len) added_split(&c, &t->set_raw, text, len, 1, raw_gap);
    if (add_special)
        for (int i = 0; i < t->n_suffix; i++) tok_vec_push(out, t->suffix_ids[i]);
    tok_matcher_free(&c.matcher);
    for (int i = 0; i < TOK_MAX_STAGES; i++) {
        tok_buf_free(&c.stage_buf[i]);
        free(c.spans[i].v);
        free(c.pieces[i].v);
    }
    tok_buf_free(&c.norm);
    tok_buf_free(&c.norm_tmp);
    return MT_OK;
}

int mt_tokenizer_encode(const mt_tokenizer *t, const char *text, size_t len, int add_special,
                        int32_t **ids, size_t *n) {
    mt_token_vec v = {0};
    int rc = mt_tokenizer_encode_into(t, text, len, add_special, &v);
    if (!v.ids) v.ids = mt_malloc(sizeof(int32_t));
    *ids = v.ids;
    *n = v.n;
    return rc;
}
