/* The Unicode classes of tokenizer.json regexes against Hugging Face `tokenizers`' own (Oniguruma,
 * Unicode 16.0): tests/fixtures/tokenizers/unicode_classes.json holds, for \s \d \w and every
 * \p{general category}, the code points `tokenizers` matches (made by make_unicode_classes.py).
 * For each, over every code point, through the linked PCRE2 as the tokenizer compiles patterns:
 * the escape alone, inside a bracket class, negated (\S, \P{..}), in a negated class, and with a
 * negated item inside a class ([^\S\r\n], [a\S]), which the rewrite turns into alternations.
 * Then the rewrite itself on patterns whose text it must keep (\Q..\E, \x{..}, scripts, POSIX
 * classes, a '-' after a class item); the characters added tokens' single_word and lstrip/rstrip
 * see as word characters and whitespace; and that matching with the fast form up to each code
 * point new since Unicode 14.0 gives exactly the exact form's pieces. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"
#include "util/testutil.h"

/* Every code point (no surrogates) as UTF-8, with the code point at each byte offset. */
static char *g_text;
static size_t g_len;
static uint32_t *g_cp_at; /* byte offset -> code point */
static json_t *g_truth;
static uint8_t *g_new; /* tok_uclass_is_new, by code point */

static int setup(void **st) {
    (void)st;
    g_text = malloc(0x110000 * 4);
    g_cp_at = malloc(0x110000 * 4 * sizeof *g_cp_at);
    for (uint32_t c = 0; c < 0x110000; c++) {
        if (c >= 0xD800 && c < 0xE000) continue;
        size_t k = tok_utf8_put(g_text + g_len, c);
        for (size_t i = 0; i < k; i++) g_cp_at[g_len + i] = c;
        g_len += k;
    }
    g_new = malloc(0x110000);
    for (uint32_t c = 0; c < 0x110000; c++) g_new[c] = (uint8_t)tok_uclass_is_new(c);
    char *path = mt_fixture_path("tokenizers/unicode_classes.json");
    json_error_t err;
    g_truth = json_load_file(path, 0, &err);
    if (!g_truth) fprintf(stderr, "%s: %s\n", path, err.text);
    free(path);
    return g_truth ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    free(g_text);
    free(g_cp_at);
    free(g_new);
    json_decref(g_truth);
    return 0;
}

/* 1 for each code point the pattern (compiled as the tokenizer does, in the exact or the fast
 * form) matches as a run member. */
static uint8_t *members(const char *pattern, int exact, int *one_form) {
    tok_regex re;
    if (tok_regex_compile(&re, pattern, strlen(pattern), 0, "test") != MT_OK)
        fail_msg("%s: %s", pattern, mt_error_message());
    *one_form = re.exact == NULL;
    uint8_t *in = calloc(0x110000, 1);
    tok_matcher m = {0};
    tok_subject sub;
    tok_subject_init(&sub, &re, g_text, g_len, exact ? TOK_RE_EXACT : TOK_RE_FAST);
    size_t from = 0, ms, me;
    while (tok_regex_next(&re, &sub, &m, from, &ms, &me)) {
        for (size_t i = ms; i < me; i++) in[g_cp_at[i]] = 1;
        from = me;
    }
    tok_matcher_free(&m);
    tok_regex_free(&re);
    return in;
}

/* The truth of one class ("classes") or added-token set ("added_token"): 1 for its members. */
static uint8_t *truth_of(const char *group, const char *name) {
    json_t *list = json_object_get(json_object_get(g_truth, group), name);
    if (!json_is_array(list)) fail_msg("unicode_classes.json has no class %s", name);
    uint8_t *in = calloc(0x110000, 1);
    size_t i;
    json_t *r;
    json_array_foreach(list, i, r) {
        for (json_int_t c = json_integer_value(json_array_get(r, 0)); c <= json_integer_value(json_array_get(r, 1)); c++)
            in[c] = 1;
    }
    return in;
}

static uint8_t *truth(const char *name) { return truth_of("classes", name); }

/* Counts the code points where got != (want XOR flip), for the fast form only those it must get
 * right (not tok_uclass_is_new); prints the first few. */
static size_t diff(const char *pattern, const uint8_t *got, const uint8_t *want, int flip, int exact) {
    size_t bad = 0;
    for (uint32_t c = 0; c < 0x110000; c++) {
        if ((c >= 0xD800 && c < 0xE000) || (!exact && g_new[c])) continue;
        if (got[c] != (want[c] ^ flip) && bad++ < 5)
            print_message("  %s (%s): U+%04X %s by megatrain, %s by tokenizers\n", pattern, exact ? "exact" : "fast", c,
                          got[c] ? "matched" : "not matched", (want[c] ^ flip) ? "matched" : "not matched");
    }
    return bad;
}

static size_t check(const char *pattern, const uint8_t *want, int flip) {
    size_t bad = 0;
    for (int exact = 0; exact < 2; exact++) {
        int one_form;
        uint8_t *got = members(pattern, exact, &one_form);
        bad += diff(pattern, got, want, flip, exact || one_form);
        free(got);
        if (one_form) break;
    }
    return bad;
}

static void test_every_class(void **st) {
    (void)st;
    const char *name;
    json_t *v;
    size_t bad = 0, n = 0;
    json_object_foreach(json_object_get(g_truth, "classes"), name, v) {
        uint8_t *want = truth(name);
        char pat[160], neg[80];
        snprintf(neg, sizeof neg, "%s", name);
        neg[0] = (char)(neg[0] - 0x20); /* s -> S, p{L} -> P{L} */
        snprintf(pat, sizeof pat, "\\%s+", name);
        bad += check(pat, want, 0);
        if (!strcmp(name, "p{C}") || !strcmp(name, "p{Cn}")) { /* 700+ ranges: slow sweeps */
            snprintf(pat, sizeof pat, "\\%s+", neg);
            bad += check(pat, want, 1);
            free(want);
            n++;
            continue;
        }
        snprintf(pat, sizeof pat, "[\\%s]+", name);
        bad += check(pat, want, 0);
        snprintf(pat, sizeof pat, "\\%s+", neg);
        bad += check(pat, want, 1);
        snprintf(pat, sizeof pat, "[^\\%s]+", name);
        bad += check(pat, want, 1);
        snprintf(pat, sizeof pat, "[^\\%s]+", neg); /* a negated item inside a negated class */
        bad += check(pat, want, 0);
        free(want);
        n++;
    }
    print_message("%zu classes, %zu code points differ\n", n, bad);
    assert_true(n >= 30);
    assert_int_equal(bad, 0);
}

/* Unions as the real patterns write them, and negated items beside others. */
static void test_combined(void **st) {
    (void)st;
    uint8_t *s = truth("s"), *l = truth("p{L}"), *nn = truth("p{N}");
    uint8_t *want = calloc(0x110000, 1);
    size_t bad = 0;
    /* [^\s\p{L}\p{N}] (GPT-2, Llama 3) */
    for (uint32_t c = 0; c < 0x110000; c++) want[c] = !(s[c] || l[c] || nn[c]);
    bad += check("[^\\s\\p{L}\\p{N}]+", want, 0);
    /* [^\r\n\p{L}\p{N}] */
    for (uint32_t c = 0; c < 0x110000; c++) want[c] = !(c == '\r' || c == '\n' || l[c] || nn[c]);
    bad += check("[^\\r\\n\\p{L}\\p{N}]+", want, 0);
    /* [^\S\r\n]: whitespace but CR and LF */
    for (uint32_t c = 0; c < 0x110000; c++) want[c] = s[c] && c != '\r' && c != '\n';
    bad += check("[^\\S\\r\\n]+", want, 0);
    /* [x\S\d]: x, or not whitespace (then \d adds nothing) */
    for (uint32_t c = 0; c < 0x110000; c++) want[c] = c == 'x' || !s[c];
    bad += check("[x\\S\\d]+", want, 0);
    /* [^\P{L}\P{N}]: both a letter and a number: none */
    memset(want, 0, 0x110000);
    bad += check("[^\\P{L}\\P{N}]+", want, 0);
    free(s), free(l), free(nn), free(want);
    assert_int_equal(bad, 0);
}

static void rewrite_is(const char *pattern, const char *want) {
    tok_buf b = {0};
    tok_regex_unicode(pattern, strlen(pattern), 1, &b);
    tok_buf_putc(&b, 0);
    if (strcmp(b.p, want) != 0) fail_msg("%s -> %s, want %s", pattern, b.p, want);
    tok_buf_free(&b);
}

static void test_rewrite_keeps_the_rest(void **st) {
    (void)st;
    rewrite_is("\\p{Han}+|\\x{1F600}|[[:alpha:]]|\\Q\\s\\E|\\\\s|(?#\\s)|\\p{Lt}", "\\p{Han}+|\\x{1F600}|[[:alpha:]]|\\Q\\s\\E|\\\\s|(?#\\s)|[\\p{Lt}]");
    tok_buf b = {0};
    const char *lead = "[\\]\\pL-]"; /* a leading ], \pL, a trailing - */
    tok_regex_unicode(lead, strlen(lead), 1, &b);
    tok_buf_putc(&b, 0);
    assert_int_equal(strncmp(b.p, "[\\]\\p{L}\\x{1C89}-\\x{1C8A}", 22), 0);
    assert_string_equal(b.p + strlen(b.p) - 2, "-]");
    b.n = 0;
    const char *p = "[\\s-x]";
    tok_regex_unicode(p, strlen(p), 1, &b);
    tok_buf_putc(&b, 0);
    assert_non_null(strstr(b.p, "\\x{3000}\\-x]")); /* the hyphen stays a literal */
    tok_buf_free(&b);
    /* unterminated: left for PCRE2 to report, at the offset in the pattern as written */
    rewrite_is("a[\\s", "a[\\s");
    tok_regex re;
    assert_int_equal(tok_regex_compile(&re, "ab(\\p{L}", 8, 0, "tokenizer.json: pre_tokenizer.pattern"), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "at offset 8"));
}

/* Word characters beside a single_word added token and whitespace for lstrip/rstrip, as
 * tokenizers' AddedVocabulary has them (Rust's tables, Unicode 16.0). */
static void test_added_token_chars(void **st) {
    (void)st;
    uint8_t *word = truth_of("added_token", "word"), *space = truth_of("added_token", "whitespace");
    size_t bad = 0;
    for (uint32_t c = 0; c < 0x110000; c++) {
        if (c >= 0xD800 && c < 0xE000) continue;
        if (tok_is_word(c) != word[c] && bad++ < 5)
            print_message("  U+%04X: word character %d, tokenizers %d\n", c, tok_is_word(c), word[c]);
        if (tok_is_whitespace(c) != space[c] && bad++ < 5)
            print_message("  U+%04X: whitespace %d, tokenizers %d\n", c, tok_is_whitespace(c), space[c]);
    }
    free(word);
    free(space);
    assert_int_equal(bad, 0);
}

/* Where the new code points are, and which patterns get two forms. */
static void test_new_code_points(void **st) {
    (void)st;
    const char *plain = "plain ASCII, caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80";
    assert_int_equal(tok_uclass_next_new(plain, strlen(plain), 0), strlen(plain));
    assert_int_equal(tok_uclass_next_new("\xe1\xa0\x8e", 3, 0), 3); /* U+180E: \s is ranges in both */
    assert_int_equal(tok_uclass_next_new("\xff\xf0\x91", 3, 0), 3);  /* invalid, truncated */
    /* Kawi U+11F04 after an invalid lead byte, found where it starts */
    assert_int_equal(tok_uclass_next_new("ab\xe4\xf0\x91\xbc\x84 \xf0\x91\xbc\x84", 12, 0), 3);
    assert_int_equal(tok_uclass_next_new("ab\xe4\xf0\x91\xbc\x84 \xf0\x91\xbc\x84", 12, 4), 8);
    assert_true(tok_uclass_is_new(0x31350) && tok_uclass_is_new(0x11F50) && !tok_uclass_is_new('a'));
    assert_false(tok_uclass_is_new(0xB2)); /* superscript two: \w to tokenizers, assigned in 14.0 */
    tok_regex re;
    const char *p = "\\p{L}+";
    assert_int_equal(tok_regex_compile(&re, p, strlen(p), 0, "test"), MT_OK);
    assert_non_null(re.exact);
    assert_false(re.lookbehind);
    tok_regex_free(&re);
    p = "\\s+|x"; /* no class with new code points: one form */
    assert_int_equal(tok_regex_compile(&re, p, strlen(p), 0, "test"), MT_OK);
    assert_null(re.exact);
    tok_regex_free(&re);
}

/* The pieces of a whole subject. */
static size_t pieces(const tok_regex *re, const char *s, size_t n, int mode, size_t *out) {
    tok_matcher m = {0};
    tok_subject sub;
    tok_subject_init(&sub, re, s, n, mode);
    size_t k = 0, from = 0, ms, me;
    while (tok_regex_next(re, &sub, &m, from, &ms, &me)) {
        out[k++] = ms;
        out[k++] = me;
        from = me;
    }
    tok_matcher_free(&m);
    return k;
}

/* The automatic choice (fast form up to each new code point, exact around it) gives exactly the
 * exact form's pieces: real pre-tokenizer patterns and ones that look ahead, back and at the end. */
static void test_auto_equals_exact(void **st) {
    (void)st;
    const char *const pats[] = {
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
        "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|\\p{N}{1,3}|"
        " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        "\\p{L}+(?=\\p{N})|\\p{N}+$|\\p{L}{2}|.",
        "(?<=\\p{L})\\p{N}+|\\b\\w+|\\s+|.",
    };
    /* ASCII words with code points new in Unicode 15-16 here and there, and every code point */
    tok_buf t = {0};
    const char *bits[] = {"the quick 12345 brown", "\xf0\x91\xbc\x84", " fox's 9", "\xf0\x91\xbd\x90",
                          "1234 jumps", "  \xe1\xa0\x8e ", "\xf0\x9e\x93\x90x7", "\n\n", "\xf0\x9d\x8b\x80"};
    for (int rep = 0; rep < 300; rep++) tok_buf_put(&t, bits[(rep * 7) % 9], strlen(bits[(rep * 7) % 9]));
    /* and every code point of U+0000..U+1FFFF (where most new ones are): AUTO switches forms
     * thousands of times there */
    size_t upto = 0;
    while (upto < g_len && g_cp_at[upto] < 0x20000) upto++;
    const char *texts[] = {t.p, g_text};
    size_t lens[] = {t.n, upto};
    size_t *a = malloc(2 * (g_len + 1) * sizeof *a), *b = malloc(2 * (g_len + 1) * sizeof *b);
    for (size_t i = 0; i < sizeof pats / sizeof *pats; i++) {
        tok_regex re;
        assert_int_equal(tok_regex_compile(&re, pats[i], strlen(pats[i]), 0, "test"), MT_OK);
        assert_non_null(re.exact);
        for (int k = 0; k < 2; k++) {
            size_t na = pieces(&re, texts[k], lens[k], TOK_RE_AUTO, a), nb = pieces(&re, texts[k], lens[k], TOK_RE_EXACT, b);
            if (na != nb || memcmp(a, b, na * sizeof *a) != 0) fail_msg("pattern %zu, text %d: pieces differ", i, k);
        }
        tok_regex_free(&re);
    }
    free(a);
    free(b);
    tok_buf_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_class),
        cmocka_unit_test(test_combined),
        cmocka_unit_test(test_rewrite_keeps_the_rest),
        cmocka_unit_test(test_added_token_chars),
        cmocka_unit_test(test_new_code_points),
        cmocka_unit_test(test_auto_equals_exact),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
