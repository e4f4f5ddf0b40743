/* Tokenizer helpers: byte buffers, hashing, UTF-8, a string->id map, PCRE2 regexes. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

/* ---- buffers ---- */

void tok_buf_reserve(tok_buf *b, size_t extra) {
    if (b->n + extra <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    MT_CHECK(p != NULL, "out of host memory growing a buffer to %zu bytes", cap);
    b->p = p;
    b->cap = cap;
}

void tok_buf_put(tok_buf *b, const void *s, size_t n) {
    if (!n) return;
    tok_buf_reserve(b, n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

void tok_buf_free(tok_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

void tok_vec_push(mt_token_vec *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        MT_CHECK(p != NULL, "out of host memory growing a token vector to %zu ids", cap);
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
}

void mt_token_vec_free(mt_token_vec *v) {
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

/* ---- hashing: 8 bytes at a time, multiply-xorshift mixing ---- */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ULL;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ULL;
    x ^= x >> 32;
    return x;
}

uint64_t tok_hash(const void *s, size_t n) {
    const unsigned char *p = s;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (n * 0xff51afd7ed558ccdULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = mix64(h ^ w) + 0x632be59bd9b4e019ULL;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
    return mix64(h ^ w ^ ((uint64_t)n << 59));
}

/* ---- UTF-8 ---- */

int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xC2 || c > 0xF4) return 0;
    if (c < 0xE0) {
        if (n < 2 || (s[1] & 0xC0) != 0x80) return 0;
        *cp = ((c & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (c < 0xF0) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && s[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
        *cp = ((c & 0x0F) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3F);
        return 3;
    }
    if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
    if (c == 0xF0 && s[1] < 0x90) return 0; /* overlong */
    if (c == 0xF4 && s[1] >= 0x90) return 0; /* > U+10FFFF */
    *cp = ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3F);
    return 4;
}

int tok_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = tok_utf8_next(p + i, n - i, &cp);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

/* Length of the maximal prefix of an ill-formed sequence at s (>= 1): the lead byte plus the
 * continuation bytes that could still have completed it (Unicode's "maximal subpart"). */
static size_t invalid_subpart(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 1;
    }
    size_t k = 1;
    for (; k <= need && k < n; k++) {
        unsigned b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) break;
    }
    return k;
}

void tok_utf8_lossy(tok_buf *out, const char *s, size_t n) {
    if (!n) return; /* s may be NULL (an empty buffer) */
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0;
    while (i < n) {
        uint32_t cp;
        int k = p[i] < 0x80 ? 1 : tok_utf8_next(p + i, n - i, &cp);
        if (k) {
            i += k;
            continue;
        }
        tok_buf_put(out, s + run, i - run);
        tok_buf_put(out, "\xEF\xBF\xBD", 3);
        i += invalid_subpart(p + i, n - i);
        run = i;
    }
    tok_buf_put(out, s + run, n - run);
}

size_t tok_utf8_put(char *out, uint32_t cp) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

int tok_is_whitespace(uint32_t cp) {
    /* White_Space = the separators Z* plus the C0 controls 9..13 and NEL. */
    if ((cp >= 9 && cp <= 13) || cp == 0x85) return 1;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

/* ---- string -> id map ---- */

void tok_strmap_init(tok_strmap *m, size_t expected, char *const *keys, const uint32_t *klens) {
    size_t cap = 64;
    while (cap < expected * 2) cap *= 2;
    m->slots = mt_calloc(cap, sizeof *m->slots);
    m->mask = (uint32_t)(cap - 1);
    m->count = 0;
    m->keys = keys;
    m->klens = klens;
}

int32_t tok_strmap_put(tok_strmap *m, int32_t id) {
    const char *k = m->keys[id];
    size_t n = m->klens[id];
    uint32_t i = (uint32_t)tok_hash(k, n) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        uint32_t s = m->slots[i];
        if (!s) break;
        int32_t o = (int32_t)(s - 1);
        if (m->klens[o] == n && memcmp(m->keys[o], k, n) == 0) return o;
    }
    MT_CHECK(m->count * 2 < (size_t)m->mask + 1, "string map over capacity");
    m->slots[i] = (uint32_t)id + 1;
    m->count++;
    return -1;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *s, size_t n) {
    uint32_t i = (uint32_t)tok_hash(s, n) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        uint32_t v = m->slots[i];
        if (!v) return -1;
        int32_t o = (int32_t)(v - 1);
        if (m->klens[o] == n && memcmp(m->keys[o], s, n) == 0) return o;
    }
}

void tok_strmap_free(tok_strmap *m) {
    free(m->slots);
    m->slots = NULL;
}

/* ---- regexes: PCRE2 with UTF, UCP (Unicode \s \d \w and properties) and JIT ---- */

/* Compiles pattern (as rewritten by tok_regex_unicode in the given form) into *code. */
static int compile_one(pcre2_code **code, const char *pattern, size_t len, int literal, int exact,
                       uint32_t jit, const char *where) {
    int err;
    PCRE2_SIZE off;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : 0);
    tok_buf re = {0};
    if (literal) tok_buf_put(&re, pattern, len);
    else tok_regex_unicode(pattern, len, exact, &re);
    *code = pcre2_compile((PCRE2_SPTR)(re.p ? re.p : ""), re.n, opts, &err, &off, NULL);
    tok_buf_free(&re);
    if (!*code) {
        /* The offset of the error in the pattern as written: compile that for the message. */
        pcre2_code *orig = pcre2_compile((PCRE2_SPTR)(len ? pattern : ""), len, opts, &err, &off, NULL);
        int orig_ok = orig != NULL;
        pcre2_code_free(orig);
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        if (orig_ok)
            return mt_error_set("%s: regex does not compile once its Unicode classes are rewritten "
                                "(%s): please report it", where, (const char *)msg);
        return mt_error_set("%s: regex does not compile at offset %zu: %s", where, (size_t)off,
                            (const char *)msg);
    }
    /* JIT is an optimisation: where it is unavailable the interpreter gives the same matches. */
    (void)pcre2_jit_compile(*code, jit);
    return MT_OK;
}

int tok_regex_compile(tok_regex *r, const char *pattern, size_t len, int literal, const char *where) {
    memset(r, 0, sizeof *r);
    tok_buf a = {0}, b = {0};
    if (!literal) {
        tok_regex_unicode(pattern, len, 0, &a);
        tok_regex_unicode(pattern, len, 1, &b);
    }
    /* The exact form only where it differs (a class with code points new since Unicode 14.0);
     * the fast one then also runs on text cut short before such a code point (partial matching). */
    int two = a.n != b.n || (a.n && memcmp(a.p, b.p, a.n) != 0);
    tok_buf_free(&a);
    tok_buf_free(&b);
    MT_TRY(compile_one(&r->code, pattern, len, literal, 0,
                       PCRE2_JIT_COMPLETE | (two ? PCRE2_JIT_PARTIAL_HARD : 0), where));
    if (two && compile_one(&r->exact, pattern, len, 0, 1, PCRE2_JIT_COMPLETE, where) != MT_OK) {
        tok_regex_free(r);
        return MT_ERR;
    }
    uint32_t lb = 0;
    pcre2_pattern_info(r->code, PCRE2_INFO_MAXLOOKBEHIND, &lb);
    r->lookbehind = lb > 0;
    return MT_OK;
}

void tok_regex_free(tok_regex *r) {
    pcre2_code_free(r->code);
    pcre2_code_free(r->exact);
    r->code = r->exact = NULL;
}

void tok_subject_init(tok_subject *sub, const tok_regex *r, const char *s, size_t n, int mode) {
    sub->s = s;
    sub->n = n;
    sub->mode = r->exact ? mode : TOK_RE_FAST;
    sub->past_new = 0;
    sub->next_new = sub->mode == TOK_RE_AUTO ? tok_uclass_next_new(s, n, 0) : n;
}

void tok_matcher_free(tok_matcher *m) {
    if (m->md) pcre2_match_data_free(m->md);
    if (m->mctx) pcre2_match_context_free(m->mctx);
    if (m->stack) pcre2_jit_stack_free(m->stack);
    memset(m, 0, sizeof *m);
}

/* pcre2_match, giving the JIT a larger stack when a long run outgrows the default one. */
static int match(const pcre2_code *code, tok_matcher *m, const char *s, size_t n, size_t from,
                 uint32_t opts) {
    for (;;) {
        int rc = pcre2_match(code, (PCRE2_SPTR)s, n, from, opts, m->md, m->mctx);
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT || m->stack) return rc;
        /* A long run (e.g. of spaces) outgrew the default 32 KiB JIT stack: give it 64 MiB. */
        m->stack = pcre2_jit_stack_create(1 << 16, 64 << 20, NULL);
        m->mctx = pcre2_match_context_create(NULL);
        MT_CHECK(m->stack && m->mctx, "out of host memory (pcre2 JIT stack)");
        pcre2_jit_stack_assign(m->mctx, NULL, m->stack);
    }
}

int tok_regex_next(const tok_regex *r, tok_subject *sub, tok_matcher *m, size_t from, size_t *ms,
                   size_t *me) {
    const char *s = sub->s;
    size_t n = sub->n;
    if (!m->md) {
        m->md = pcre2_match_data_create(1, NULL);
        MT_CHECK(m->md != NULL, "out of host memory (pcre2 match data)");
    }
    while (from < n) {
        int rc;
        if (sub->mode == TOK_RE_EXACT) {
            rc = match(r->exact, m, s, n, from, 0);
        } else if (sub->mode == TOK_RE_FAST) {
            rc = match(r->code, m, s, n, from, 0);
        } else {
            if (sub->next_new < from) { /* passed it: find the next one */
                sub->past_new = 1;
                sub->next_new = tok_uclass_next_new(s, n, from);
            }
            if (sub->past_new && r->lookbehind) { /* it could look back at one already passed */
                rc = match(r->exact, m, s, n, from, 0);
            } else if (sub->next_new >= n) {
                rc = match(r->code, m, s, n, from, 0);
            } else {
                /* The fast form on the text cut before the new code point: a complete match there
                 * never looked at it (else it is partial), so the exact form finds the same one. */
                rc = match(r->code, m, s, sub->next_new, from, PCRE2_PARTIAL_HARD);
                if (rc < 0) rc = match(r->exact, m, s, n, from, 0);
            }
        }
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        MT_CHECK(rc >= 0, "pcre2_match failed with code %d", rc); /* 0: ovector too small for the groups */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
        if (ov[1] > ov[0]) {
            *ms = ov[0];
            *me = ov[1];
            return 1;
        }
        /* empty match: step over one character (as tokenizers' find_iter does) */
        size_t p = ov[0] + 1;
        while (p < n && ((unsigned char)s[p] & 0xC0) == 0x80) p++;
        from = p;
    }
    return 0;
}
