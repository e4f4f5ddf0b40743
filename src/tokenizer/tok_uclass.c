/* Unicode classes of tokenizer.json regexes, as Hugging Face `tokenizers` has them.
 *
 * `tokenizers` runs Split/ByteLevel patterns in Oniguruma (Unicode 16.0); PCRE2 10.42 (Debian
 * bookworm) has Unicode 14.0, so its \p{L} and \p{N} miss the letters and digits added since,
 * its \s holds U+180E, and its \w and \d are other sets. Before compiling, each \s \S \d \D \w \W
 * \p{X} \P{X} (X a general category) is replaced by PCRE2's own item for the part it gets right
 * plus explicit ranges for the rest (tok_uclass.h, measured on `tokenizers` by
 * tests/fixtures/tokenizers/make_unicode_classes.py).
 *
 * Speed: those ranges cost each character that fails the class a few dozen compares (the GPT-2
 * regex ran 1.4x slower with them). So each regex is compiled twice: with PCRE2's item alone
 * (and the few code points Unicode 14.0 already had: the fast form) and with all the ranges
 * (exact). Both match the same on text without any code point new since Unicode 14.0
 * (tok_uclass_is_new); tok_regex_next runs the exact form only where a match may reach one.
 *
 * Inside a bracket class a negated item ([^\S\r\n], [\P{L}x]) cannot be written as a union of
 * ranges, so such a class becomes an alternation of single-character matchers:
 *   [A \S]  -> (?:[A]|[^S])          [^A \S] -> (?:(?![A])[S])
 * Other escapes (\x{..}, \Q..\E, scripts like \p{Han}, POSIX [:alpha:]) are copied unchanged. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "tokenizer/tok_uclass.h"

#define N_UCLASS (sizeof TOK_UCLASS / sizeof *TOK_UCLASS)

/* The class escape at p[0] == '\\' (length *len, *neg for \S \P{..} \p{^..}), or NULL. */
static const tok_uclass *class_at(const char *p, size_t n, size_t *len, int *neg) {
    if (n < 2) return NULL;
    char c = p[1], name[32];
    size_t l;
    *neg = 0;
    if (c && strchr("sSdDwW", c)) {
        name[0] = (char)(c | 0x20); /* lower case */
        name[1] = 0;
        *neg = c < 'a';
        l = 2;
    } else if (c == 'p' || c == 'P') {
        *neg = c == 'P';
        if (n >= 3 && p[2] != '{') { /* \pL */
            snprintf(name, sizeof name, "p{%c}", p[2]);
            l = 3;
        } else {
            const char *close = memchr(p, '}', n < 24 ? n : 24);
            if (n < 4 || !close) return NULL;
            size_t s = 3, e = (size_t)(close - p);
            if (p[s] == '^') { /* \p{^L} */
                *neg = !*neg;
                s++;
            }
            snprintf(name, sizeof name, "p{%.*s}", (int)(e - s), p + s);
            l = e + 1;
        }
    } else {
        return NULL;
    }
    for (size_t i = 0; i < N_UCLASS; i++)
        if (!strcmp(TOK_UCLASS[i].name, name)) {
            *len = l;
            return &TOK_UCLASS[i];
        }
    return NULL;
}

static void put_s(tok_buf *b, const char *s) { tok_buf_put(b, s, strlen(s)); }

/* The class's members as bracket-class items; without exact, all but the code points new since
 * Unicode 14.0 (tok_uclass_is_new), which PCRE2's tables do not have at all. */
static void put_items(tok_buf *b, const tok_uclass *u, int exact) {
    put_s(b, u->native);
    unsigned end = (unsigned)u->first + u->count + (exact ? u->n_new : 0);
    for (unsigned i = u->first; i < end; i++) {
        char s[40];
        const uint32_t *r = TOK_UCLASS_RANGES[i];
        if (r[0] == r[1]) snprintf(s, sizeof s, "\\x{%X}", (unsigned)r[0]);
        else snprintf(s, sizeof s, "\\x{%X}-\\x{%X}", (unsigned)r[0], (unsigned)r[1]);
        put_s(b, s);
    }
}

/* Copies \Q...\E (or to the end) starting at p[0] == '\\', p[1] == 'Q'; returns its length. */
static size_t quoted_len(const char *p, size_t n) {
    for (size_t i = 2; i + 1 < n; i++)
        if (p[i] == '\\' && p[i + 1] == 'E') return i + 2;
    return n;
}

/* The bracket class starting at p[0] == '['; returns its length (to the end if unterminated). */
static size_t put_bracket(tok_buf *out, const char *p, size_t n, int exact) {
    size_t j = 1;
    int negated = j < n && p[j] == '^';
    if (negated) j++;
    tok_buf pos = {0}, negs[8];
    int n_negs = 0;
    if (j < n && p[j] == ']') { /* a leading ] is a literal */
        tok_buf_put(&pos, "\\]", 2);
        j++;
    }
    while (j < n && p[j] != ']') {
        size_t len;
        int neg;
        const tok_uclass *u;
        if (p[j] == '[' && j + 1 < n && p[j + 1] == ':') { /* [:alpha:] */
            const char *e = memmem(p + j, n - j, ":]", 2);
            size_t k = e ? (size_t)(e - p) + 2 : n;
            tok_buf_put(&pos, p + j, k - j);
            j = k;
        } else if (p[j] == '\\' && j + 1 < n && p[j + 1] == 'Q') {
            size_t k = quoted_len(p + j, n - j);
            tok_buf_put(&pos, p + j, k);
            j += k;
        } else if (p[j] == '\\' && (u = class_at(p + j, n - j, &len, &neg)) != NULL &&
                   (!neg || n_negs < 8)) {
            if (neg) {
                negs[n_negs] = (tok_buf){0};
                put_items(&negs[n_negs++], u, exact);
            } else {
                put_items(&pos, u, exact);
            }
            j += len;
            /* A '-' after a class item is a literal hyphen; after explicit ranges it would
             * start a range. */
            if (j + 1 < n && p[j] == '-' && p[j + 1] != ']') {
                tok_buf_put(&pos, "\\-", 2);
                j++;
            }
        } else if (p[j] == '\\' && j + 1 < n) {
            tok_buf_put(&pos, p + j, 2);
            j += 2;
        } else {
            tok_buf_putc(&pos, p[j++]);
        }
    }
    if (j >= n) { /* unterminated: as written, PCRE2 reports it */
        tok_buf_put(out, p, n);
        tok_buf_free(&pos);
        for (int i = 0; i < n_negs; i++) tok_buf_free(&negs[i]);
        return n;
    }
    j++; /* the ] */
    if (!n_negs) {
        put_s(out, negated ? "[^" : "[");
        tok_buf_put(out, pos.p, pos.n);
        tok_buf_putc(out, ']');
    } else if (!negated) { /* any of pos, or outside one of the negated items */
        put_s(out, "(?:");
        if (pos.n) {
            tok_buf_putc(out, '[');
            tok_buf_put(out, pos.p, pos.n);
            put_s(out, "]|");
        }
        for (int i = 0; i < n_negs; i++) {
            put_s(out, i ? "|[^" : "[^");
            tok_buf_put(out, negs[i].p, negs[i].n);
            tok_buf_putc(out, ']');
        }
        tok_buf_putc(out, ')');
    } else { /* none of pos, and inside every negated item */
        put_s(out, "(?:");
        if (pos.n) {
            put_s(out, "(?![");
            tok_buf_put(out, pos.p, pos.n);
            put_s(out, "])");
        }
        for (int i = 0; i < n_negs; i++) {
            put_s(out, i + 1 < n_negs ? "(?=[" : "[");
            tok_buf_put(out, negs[i].p, negs[i].n);
            put_s(out, i + 1 < n_negs ? "])" : "]");
        }
        tok_buf_putc(out, ')');
    }
    tok_buf_free(&pos);
    for (int i = 0; i < n_negs; i++) tok_buf_free(&negs[i]);
    return j;
}

void tok_regex_unicode(const char *p, size_t n, int exact, tok_buf *out) {
    size_t i = 0;
    while (i < n) {
        size_t len;
        int neg;
        const tok_uclass *u;
        if (p[i] == '\\' && i + 1 < n && p[i + 1] == 'Q') {
            len = quoted_len(p + i, n - i);
            tok_buf_put(out, p + i, len);
            i += len;
        } else if (p[i] == '\\' && (u = class_at(p + i, n - i, &len, &neg)) != NULL) {
            put_s(out, neg ? "[^" : "[");
            put_items(out, u, exact);
            tok_buf_putc(out, ']');
            i += len;
        } else if (p[i] == '\\' && i + 1 < n) {
            tok_buf_put(out, p + i, 2);
            i += 2;
        } else if (p[i] == '[') {
            i += put_bracket(out, p + i, n - i, exact);
        } else if (p[i] == '(' && i + 2 < n && p[i + 1] == '?' && p[i + 2] == '#') { /* comment */
            const char *e = memchr(p + i, ')', n - i);
            len = e ? (size_t)(e - (p + i)) + 1 : n - i;
            tok_buf_put(out, p + i, len);
            i += len;
        } else {
            tok_buf_putc(out, p[i++]);
        }
    }
}

/* ---- code points where the fast form may differ: new since Unicode 14.0 ---- */

static uint8_t g_new[0x110000 / 8];
static uint8_t g_lead[256]; /* first UTF-8 bytes of those */
static pthread_once_t g_new_once = PTHREAD_ONCE_INIT;

static void new_init(void) {
    for (size_t i = 0; i < N_UCLASS; i++) {
        const tok_uclass *u = &TOK_UCLASS[i];
        for (unsigned k = (unsigned)u->first + u->count; k < (unsigned)u->first + u->count + u->n_new; k++)
            for (uint32_t c = TOK_UCLASS_RANGES[k][0]; c <= TOK_UCLASS_RANGES[k][1]; c++) {
                g_new[c >> 3] |= (uint8_t)(1u << (c & 7));
                char b[4];
                tok_utf8_put(b, c);
                g_lead[(unsigned char)b[0]] = 1;
            }
    }
}

int tok_uclass_is_new(uint32_t cp) {
    pthread_once(&g_new_once, new_init);
    return cp < 0x110000 && (g_new[cp >> 3] >> (cp & 7) & 1);
}

/* Every byte that could start such a code point is decoded where it stands: a lead byte is never
 * a continuation byte, so no valid sequence is missed whatever invalid bytes come before it. */
size_t tok_uclass_next_new(const char *s, size_t n, size_t from) {
    pthread_once(&g_new_once, new_init);
    const unsigned char *u = (const unsigned char *)s;
    size_t i = from;
    for (;;) {
        while (i + 4 <= n && !(g_lead[u[i]] | g_lead[u[i + 1]] | g_lead[u[i + 2]] | g_lead[u[i + 3]])) i += 4;
        while (i < n && !g_lead[u[i]]) i++;
        if (i >= n) return n;
        uint32_t cp;
        if (tok_utf8_next(u + i, n - i, &cp) && (g_new[cp >> 3] >> (cp & 7) & 1)) return i;
        i++;
    }
}

/* ---- single_word added tokens ---- */

/* tokenizers asks Rust's regex-syntax (\w: Alphabetic, marks, Nd, Pc, Join_Control; Unicode 16.0);
 * the set is measured on tokenizers itself, as the classes are. */
int tok_is_word(uint32_t cp) {
    size_t lo = 0, hi = sizeof TOK_WORD_RANGES / sizeof *TOK_WORD_RANGES;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < TOK_WORD_RANGES[mid][0]) hi = mid;
        else if (cp > TOK_WORD_RANGES[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}
