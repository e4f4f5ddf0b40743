/* The tokenizer against Hugging Face `tokenizers` (tests/fixtures/tokenizers, made by
 * make_tokenizer_fixtures.py): for every case of every fixture kind, the same ids with and without
 * the post-processor's special tokens, the same decoded strings (with and without special tokens),
 * and decode(encode(x)) == x where tokenizers gives x back. Then what Python cannot check: bytes
 * that are not UTF-8 round-trip; concurrent encoding agrees with serial; bad files give errors
 * naming the type or field. */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "util/fixture_io.h"
#include "util/testutil.h"

static const char *const KINDS[] = {"gpt2", "llama3", "qwen2", "llama2", "mistral"};
#define N_KINDS 5

typedef struct {
    char *text;
    size_t len;
    int32_t *ids, *ids_special;
    size_t n_ids, n_special;
    char *dec, *dec_skip;
    size_t dec_len, dec_skip_len;
} tcase;

static char *dup_json_str(json_t *v, size_t *len) {
    assert_true(json_is_string(v));
    *len = json_string_length(v);
    char *p = malloc(*len + 1);
    memcpy(p, json_string_value(v), *len + 1);
    return p;
}

static int32_t *dup_json_ids(json_t *v, size_t *n) {
    assert_true(json_is_array(v));
    *n = json_array_size(v);
    int32_t *p = malloc((*n + 1) * sizeof *p);
    for (size_t i = 0; i < *n; i++) p[i] = (int32_t)json_integer_value(json_array_get(v, i));
    return p;
}

static tcase *load_cases(const char *kind, size_t *n_out) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizers/%s/cases.jsonl", kind);
    char *path = mt_fixture_path(rel);
    FILE *f = fopen(path, "rb");
    if (!f) print_error("cannot open %s\n", path);
    assert_non_null(f);
    size_t cap = 512, n = 0;
    tcase *cs = malloc(cap * sizeof *cs);
    char *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    while ((got = getline(&line, &lcap, f)) > 0) {
        json_error_t err;
        json_t *o = json_loadb(line, (size_t)got, JSON_ALLOW_NUL, &err);
        if (!o) print_error("%s: %s\n", path, err.text);
        assert_non_null(o);
        if (n == cap) cs = realloc(cs, (cap *= 2) * sizeof *cs);
        tcase *c = &cs[n++];
        c->text = dup_json_str(json_object_get(o, "text"), &c->len);
        c->ids = dup_json_ids(json_object_get(o, "ids"), &c->n_ids);
        c->ids_special = dup_json_ids(json_object_get(o, "ids_special"), &c->n_special);
        c->dec = dup_json_str(json_object_get(o, "decode"), &c->dec_len);
        c->dec_skip = dup_json_str(json_object_get(o, "decode_skip"), &c->dec_skip_len);
        json_decref(o);
    }
    free(line);
    fclose(f);
    free(path);
    *n_out = n;
    return cs;
}

static void free_cases(tcase *cs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(cs[i].text);
        free(cs[i].ids);
        free(cs[i].ids_special);
        free(cs[i].dec);
        free(cs[i].dec_skip);
    }
    free(cs);
}

static mt_tokenizer *load_kind(const char *kind) { return mt_test_tokenizer_load("tokenizers/%s", kind); }

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    print_message("    %-8s (%zu):", what, n);
    for (size_t i = 0; i < n && i < 40; i++) print_message(" %d", ids[i]);
    print_message("%s\n", n > 40 ? " ..." : "");
}

static int same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* ---- exactness against tokenizers ---- */

static void check_kind(const char *kind) {
    mt_tokenizer *t = load_kind(kind);
    size_t n;
    tcase *cs = load_cases(kind, &n);
    assert_true(n > 300);
    size_t bad_ids = 0, bad_special = 0, bad_dec = 0, bad_skip = 0, bad_rt = 0, roundtrips = 0, tokens = 0;
    for (size_t i = 0; i < n; i++) {
        tcase *c = &cs[i];
        int32_t *ids;
        size_t ni;
        assert_int_equal(mt_tokenizer_encode(t, c->text, c->len, 0, &ids, &ni), MT_OK);
        tokens += ni;
        if (!same_ids(ids, ni, c->ids, c->n_ids)) {
            if (bad_ids++ < 3) {
                print_message("  %s case %zu: ids differ for \"%.80s\"\n", kind, i, c->text);
                print_ids("megatrain", ids, ni);
                print_ids("tokenizers", c->ids, c->n_ids);
            }
        }
        int32_t *ids2;
        size_t n2;
        assert_int_equal(mt_tokenizer_encode(t, c->text, c->len, 1, &ids2, &n2), MT_OK);
        if (!same_ids(ids2, n2, c->ids_special, c->n_special) && bad_special++ < 3) {
            print_message("  %s case %zu: ids (add_special) differ for \"%.80s\"\n", kind, i, c->text);
            print_ids("megatrain", ids2, n2);
            print_ids("tokenizers", c->ids_special, c->n_special);
        }
        /* decode the reference ids, so a decode bug is not hidden behind an encode bug */
        char *s;
        size_t sl;
        assert_int_equal(mt_tokenizer_decode(t, c->ids, c->n_ids, MT_TOK_HF_LOSSY, &s, &sl), MT_OK);
        if ((sl != c->dec_len || memcmp(s, c->dec, sl) != 0) && bad_dec++ < 3)
            print_message("  %s case %zu: decode \"%s\", tokenizers \"%s\"\n", kind, i, s, c->dec);
        free(s);
        assert_int_equal(mt_tokenizer_decode(t, c->ids_special, c->n_special,
                                             MT_TOK_HF_LOSSY | MT_TOK_SKIP_SPECIAL, &s, &sl), MT_OK);
        if ((sl != c->dec_skip_len || memcmp(s, c->dec_skip, sl) != 0) && bad_skip++ < 3)
            print_message("  %s case %zu: decode (skip special) \"%s\", tokenizers \"%s\"\n", kind, i, s,
                          c->dec_skip);
        free(s);
        /* round trip where tokenizers' own decode gives the text back */
        if (c->dec_len == c->len && memcmp(c->dec, c->text, c->len) == 0) {
            roundtrips++;
            assert_int_equal(mt_tokenizer_decode(t, ids, ni, 0, &s, &sl), MT_OK);
            if ((sl != c->len || memcmp(s, c->text, sl) != 0) && bad_rt++ < 3)
                print_message("  %s case %zu: decode(encode(x)) \"%s\" != x \"%s\"\n", kind, i, s, c->text);
            free(s);
        }
        free(ids);
        free(ids2);
    }
    print_message("%-8s %zu cases, %zu tokens: ids %zu wrong, ids+special %zu wrong, decode %zu wrong, "
                  "decode(skip special) %zu wrong, round trip %zu/%zu wrong\n",
                  kind, n, tokens, bad_ids, bad_special, bad_dec, bad_skip, bad_rt, roundtrips);
    free_cases(cs, n);
    mt_tokenizer_free(t);
    assert_int_equal(bad_ids + bad_special + bad_dec + bad_skip + bad_rt, 0);
}

static void test_gpt2(void **state) { check_kind("gpt2"); }
static void test_llama3(void **state) { check_kind("llama3"); }
static void test_qwen2(void **state) { check_kind("qwen2"); }
static void test_llama2(void **state) { check_kind("llama2"); }
static void test_mistral(void **state) { check_kind("mistral"); }

/* ---- bytes that are not UTF-8 ---- */

static const char *const INVALID[] = {
    "abc\xff" "def",
    "\x80\x81\x82 lone continuation bytes",
    "truncated \xe4\xb8 CJK and \xf0\x9f\x98 emoji",
    "overlong \xc0\xaf and surrogate \xed\xa0\x80 and \xf4\x90\x80\x80 past U+10FFFF",
    "caf\xe9 latin-1 \xe9t\xe9",
    "\xfe\xff\xfe\xff",
    "mixed \xff<|endoftext|>\xfe text",
    "\xff",
};

static void test_invalid_utf8_roundtrip(void **state) {
    for (int k = 0; k < N_KINDS; k++) {
        mt_tokenizer *t = load_kind(KINDS[k]);
        for (size_t i = 0; i < sizeof INVALID / sizeof *INVALID; i++) {
            const char *x = INVALID[i];
            size_t n = strlen(x);
            int32_t *ids;
            size_t ni;
            assert_int_equal(mt_tokenizer_encode(t, x, n, 0, &ids, &ni), MT_OK);
            assert_true(ni > 0);
            char *s;
            size_t sl;
            assert_int_equal(mt_tokenizer_decode(t, ids, ni, 0, &s, &sl), MT_OK);
            /* mistral's Metaspace decoder drops every ▁ of the first token: the text here starts
             * without a space, so the round trip holds for it too */
            if (sl != n || memcmp(s, x, n) != 0) {
                print_error("%s: invalid-UTF-8 case %zu does not round-trip: got \"%s\"\n", KINDS[k], i, s);
                fail();
            }
            /* lossy decode is valid UTF-8 with U+FFFD in place of the bad bytes */
            free(s);
            assert_int_equal(mt_tokenizer_decode(t, ids, ni, MT_TOK_HF_LOSSY, &s, &sl), MT_OK);
            assert_non_null(strstr(s, "\xEF\xBF\xBD"));
            free(s);
            free(ids);
        }
        mt_tokenizer_free(t);
    }
}

/* Llama 2's byte fallback: an invalid byte is <0xXX>, as a character missing from the vocab is. */
static void test_byte_fallback_tokens(void **state) {
    mt_tokenizer *t = load_kind("llama2");
    int32_t *ids;
    size_t n;
    assert_int_equal(mt_tokenizer_encode(t, "\xff", 1, 0, &ids, &n), MT_OK);
    /* "▁" then <0xFF> */
    assert_int_equal(n, 2);
    assert_int_equal(ids[1], mt_tokenizer_token_id(t, "<0xFF>"));
    assert_int_equal(ids[1], 3 + 0xFF);
    free(ids);
    mt_tokenizer_free(t);
}

/* ---- special tokens and queries ---- */

static void test_bos_eos(void **state) {
    struct { const char *kind, *bos, *eos; } want[] = {
        {"gpt2", "<|endoftext|>", "<|endoftext|>"},
        {"llama3", "<|begin_of_text|>", "<|end_of_text|>"},
        {"qwen2", NULL, "<|im_end|>"},
        {"llama2", "<s>", "</s>"},
        {"mistral", "<s>", "</s>"},
    };
    for (int k = 0; k < N_KINDS; k++) {
        mt_tokenizer *t = load_kind(want[k].kind);
        int bos = mt_tokenizer_bos(t), eos = mt_tokenizer_eos(t);
        assert_int_equal(bos, want[k].bos ? mt_tokenizer_token_id(t, want[k].bos) : -1);
        assert_true(eos >= 0);
        assert_int_equal(eos, mt_tokenizer_token_id(t, want[k].eos));
        assert_true(mt_tokenizer_is_special(t, eos));
        size_t len;
        const char *s = mt_tokenizer_token(t, eos, &len);
        assert_non_null(s);
        assert_int_equal(len, strlen(want[k].eos));
        assert_true(mt_tokenizer_vocab_size(t) > 1000);
        assert_null(mt_tokenizer_token(t, mt_tokenizer_vocab_size(t), NULL));
        assert_int_equal(mt_tokenizer_token_id(t, "no such token at all"), -1);
        mt_tokenizer_free(t);
    }
}

static void test_decode_bad_id(void **state) {
    mt_tokenizer *t = load_kind("gpt2");
    int32_t ids[] = {5, mt_tokenizer_vocab_size(t)};
    char *s;
    size_t n;
    assert_int_equal(mt_tokenizer_decode(t, ids, 2, 0, &s, &n), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "position 1"));
    int32_t neg = -1;
    assert_int_equal(mt_tokenizer_decode(t, &neg, 1, 0, &s, &n), MT_ERR);
    assert_int_equal(mt_tokenizer_decode(t, ids, 0, 0, &s, &n), MT_OK); /* empty */
    assert_int_equal(n, 0);
    assert_string_equal(s, "");
    free(s);
    mt_tokenizer_free(t);
}

/* Decoding no ids gives "" through every decoder chain and flag (UBSan: no offset of a NULL buffer). */
static void test_decode_empty(void **state) {
    const unsigned flags[] = {0, MT_TOK_SKIP_SPECIAL, MT_TOK_HF_LOSSY, MT_TOK_SKIP_SPECIAL | MT_TOK_HF_LOSSY};
    for (int k = 0; k < N_KINDS; k++) {
        mt_tokenizer *t = load_kind(KINDS[k]);
        int32_t one = mt_tokenizer_bos(t) >= 0 ? mt_tokenizer_bos(t) : mt_tokenizer_eos(t);
        for (int f = 0; f < 4; f++) {
            char *s = NULL;
            size_t n = 99;
            assert_int_equal(mt_tokenizer_decode(t, NULL, 0, flags[f], &s, &n), MT_OK);
            assert_int_equal(n, 0);
            assert_string_equal(s, "");
            free(s);
            /* only a special token, skipped: the chain runs on an empty list too */
            assert_int_equal(mt_tokenizer_decode(t, &one, 1, flags[f] | MT_TOK_SKIP_SPECIAL, &s, &n), MT_OK);
            assert_int_equal(n, 0);
            free(s);
        }
        mt_tokenizer_free(t);
    }
}

/* The real Llama 2 / Mistral tokenizer_config.json (model_max_length = 1e30 as an integer) loads,
 * with its bos/eos, and encodes as the same tokenizer.json without it. */
static void test_real_config(void **state) {
    mt_tokenizer *t = load_kind("mistral_real_config"), *ref = load_kind("mistral");
    assert_int_equal(mt_tokenizer_bos(t), mt_tokenizer_token_id(t, "<s>"));
    assert_int_equal(mt_tokenizer_eos(t), mt_tokenizer_token_id(t, "</s>"));
    assert_int_equal(mt_tokenizer_bos(t), 1);
    const char *text = "Hello world, training models with streaming layers";
    int32_t *a, *b;
    size_t na, nb;
    assert_int_equal(mt_tokenizer_encode(t, text, strlen(text), 1, &a, &na), MT_OK);
    assert_int_equal(mt_tokenizer_encode(ref, text, strlen(text), 1, &b, &nb), MT_OK);
    assert_true(na > 3);
    assert_int_equal(a[0], 1);
    assert_true(same_ids(a, na, b, nb));
    free(a);
    free(b);
    mt_tokenizer_free(t);
    mt_tokenizer_free(ref);
}

/* The .json file given directly (tokenizer_config.json found beside it) loads the same. */
static void test_load_file_path(void **state) {
    char *p = mt_fixture_path("tokenizers/llama3/tokenizer.json");
    mt_tokenizer *t = NULL;
    assert_int_equal(mt_tokenizer_load(&t, p), MT_OK);
    assert_int_equal(mt_tokenizer_eos(t), mt_tokenizer_token_id(t, "<|end_of_text|>"));
    int32_t *ids;
    size_t n;
    assert_int_equal(mt_tokenizer_encode(t, "", 0, 1, &ids, &n), MT_OK);
    assert_int_equal(n, 1); /* just <|begin_of_text|> */
    assert_int_equal(ids[0], mt_tokenizer_bos(t));
    free(ids);
    mt_tokenizer_free(t);
    free(p);
}

/* ---- concurrency: the word cache under several threads ---- */

typedef struct {
    const mt_tokenizer *t;
    const tcase *cs;
    size_t n;
    int ok;
} thr_arg;

static void *thr_encode(void *p) {
    thr_arg *a = p;
    a->ok = 1;
    mt_token_vec v = {0};
    for (int rep = 0; rep < 3; rep++)
        for (size_t i = 0; i < a->n; i++) {
            v.n = 0;
            mt_tokenizer_encode_into(a->t, a->cs[i].text, a->cs[i].len, 0, &v);
            if (!same_ids(v.ids, v.n, a->cs[i].ids, a->cs[i].n_ids)) a->ok = 0;
        }
    mt_token_vec_free(&v);
    return NULL;
}

static void test_threads(void **state) {
    mt_tokenizer *t = load_kind("qwen2");
    size_t n;
    tcase *cs = load_cases("qwen2", &n);
    pthread_t th[4];
    thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg){t, cs, n, 0};
        assert_int_equal(pthread_create(&th[i], NULL, thr_encode, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(args[i].ok);
    }
    free_cases(cs, n);
    mt_tokenizer_free(t);
}

/* ---- bad files ---- */

/* Loaded three times: LeakSanitizer misses a leaked block whose address still lies in a dead stack
 * slot, which the next load overwrites, so a leak on the error path shows up in the ASan build. */
static void expect_error(const char *rel, const char *const *needles) {
    char *p = mt_fixture_path(rel);
    for (int rep = 0; rep < 3; rep++) {
        mt_tokenizer *t = (mt_tokenizer *)1;
        mt_error_clear();
        int rc = mt_tokenizer_load(&t, p);
        if (rep == 0) print_message("  %s -> %s\n", rel, mt_error_message());
        assert_int_equal(rc, MT_ERR);
        assert_null(t);
        for (int i = 0; needles[i]; i++)
            if (!strstr(mt_error_message(), needles[i])) {
                print_error("error \"%s\" lacks \"%s\"\n", mt_error_message(), needles[i]);
                fail();
            }
    }
    free(p);
}

static void test_bad_files(void **state) {
    expect_error("tokenizers/bad/malformed.json", (const char *[]){"malformed.json", "malformed JSON", NULL});
    expect_error("tokenizers/bad/not_object.json", (const char *[]){"must be a JSON object", NULL});
    expect_error("tokenizers/bad/wordpiece.json", (const char *[]){"model.type", "\"WordPiece\"", "not supported", NULL});
    expect_error("tokenizers/bad/unigram.json", (const char *[]){"model.type", "\"Unigram\"", NULL});
    expect_error("tokenizers/bad/pretok_whitespace.json",
                 (const char *[]){"pre_tokenizer", "\"Whitespace\"", "not supported", NULL});
    expect_error("tokenizers/bad/normalizer_lowercase.json",
                 (const char *[]){"normalizer.normalizers[1]", "\"Lowercase\"", NULL});
    expect_error("tokenizers/bad/decoder_wordpiece.json", (const char *[]){"decoder", "\"WordPiece\"", NULL});
    expect_error("tokenizers/bad/merge_oov.json", (const char *[]){"model.merges[5]", "zzzq", "not in model.vocab", NULL});
    expect_error("tokenizers/bad/no_vocab.json", (const char *[]){"model.vocab must be an object", NULL});
    /* an id of 2^30 sized its tables at 8 GB (fuzz_tokenizer_load): ids stop at megatrain's
     * vocabulary limit */
    expect_error("tokenizers/bad/vocab_huge_id.json", (const char *[]){"must be an id in 0..2^24", NULL});
    /* failures after parts were built: the error, and (ASan build) nothing leaked */
    expect_error("tokenizers/bad/merge_bad_string.json",
                 (const char *[]){"model.merges[5]", "\"a b c\"", "two tokens separated by one space", NULL});
    expect_error("tokenizers/bad/merge_bad_pair.json",
                 (const char *[]){"model.merges[5]", "must be \"a b\" or [\"a\", \"b\"]", NULL});
    expect_error("tokenizers/bad/decoder_metaspace_scheme.json",
                 (const char *[]){"decoder.decoders[0].prepend_scheme", "\"sometimes\"", NULL});
    expect_error("tokenizers/bad/pretok_split_behavior.json",
                 (const char *[]){"pre_tokenizer.pretokenizers[1].behavior", NULL});
    expect_error("tokenizers/bad/pretok_split_regex.json",
                 (const char *[]){"pre_tokenizer.pattern", "regex does not compile", NULL});
    expect_error("tokenizers/no_such_dir", (const char *[]){"no such file", NULL});
    /* a directory without tokenizer.json */
    expect_error("tokenizers/bad", (const char *[]){"tokenizer.json", "no such file", NULL});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_invalid_utf8_roundtrip),
        cmocka_unit_test(test_byte_fallback_tokens),
        cmocka_unit_test(test_bos_eos),
        cmocka_unit_test(test_decode_bad_id),
        cmocka_unit_test(test_decode_empty),
        cmocka_unit_test(test_real_config),
        cmocka_unit_test(test_load_file_path),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
