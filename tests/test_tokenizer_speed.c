/* Tokenizer speed, and the driver of bench/tokenizer_bench.sh.
 *
 * Under ctest (no arguments): encodes ~2 MB of mixed text in one call with every fixture
 * tokenizer, checks decode(encode(x)) == NFC(x) on it for qwen2, and prints tokens/s.
 * No speed threshold: machines differ.
 *
 * test_tokenizer_speed --bench TOKENIZER FILE [--repeat N] [--ids-out PATH] [--lines 0|1]
 *   encodes FILE whole (or, with --lines 1, each line with its "\n" as a document of its own, the
 *   ids appended), N times (default 3), on the calling thread; prints the token count and the best
 *   and first times; writes the ids as little-endian uint32 when asked (to compare with
 *   Python's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "util/testutil.h"

static char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)sz + 1);
    *n = fread(p, 1, (size_t)sz, f);
    fclose(f);
    return p;
}

static int bench(int argc, char **argv) {
    const char *tok_path = argv[2], *file = argv[3], *ids_out = NULL;
    int repeat = 3, lines = 0;
    for (int i = 4; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--repeat")) repeat = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--lines")) lines = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ids-out")) ids_out = argv[i + 1];
    }
    if (repeat < 1) repeat = 1;
    mt_tokenizer *t;
    if (mt_tokenizer_load(&t, tok_path) != MT_OK) {
        fprintf(stderr, "%s\n", mt_error_message());
        return 1;
    }
    size_t n;
    char *text = read_file(file, &n);
    if (!text) {
        fprintf(stderr, "cannot read %s\n", file);
        return 1;
    }
    mt_token_vec v = {0};
    double best = 1e30, first = 0;
    for (int r = 0; r < repeat; r++) {
        v.n = 0;
        double t0 = mt_test_now_s();
        if (lines) {
            for (size_t a = 0; a < n;) {
                const char *nl = memchr(text + a, '\n', n - a);
                size_t b = nl ? (size_t)(nl - text) + 1 : n;
                mt_tokenizer_encode_into(t, text + a, b - a, 0, &v);
                a = b;
            }
        } else {
            mt_tokenizer_encode_into(t, text, n, 0, &v);
        }
        double dt = mt_test_now_s() - t0;
        if (r == 0) first = dt;
        if (dt < best) best = dt;
    }
    printf("megatrain: %zu bytes, %zu tokens, first %.3f s, best %.3f s, %.0f tokens/s, %.1f MB/s\n", n,
           v.n, first, best, (double)v.n / best, (double)n / best / 1e6);
    if (ids_out) {
        FILE *f = fopen(ids_out, "wb");
        for (size_t i = 0; i < v.n; i++) {
            uint32_t x = (uint32_t)v.ids[i];
            unsigned char b[4] = {(unsigned char)x, (unsigned char)(x >> 8), (unsigned char)(x >> 16),
                                  (unsigned char)(x >> 24)};
            fwrite(b, 1, 4, f);
        }
        fclose(f);
    }
    mt_token_vec_free(&v);
    free(text);
    mt_tokenizer_free(t);
    return 0;
}

/* ~2 MB of text from the fixture cases of one kind, repeated with variations. */
static char *make_text(const char *kind, size_t *n) {
    char rel[128];
    snprintf(rel, sizeof rel, "tokenizers/%s/cases.jsonl", kind);
    char *path = mt_fixture_path(rel);
    size_t fn;
    char *src = read_file(path, &fn);
    assert_non_null(src);
    free(path);
    size_t cap = 2u << 20, len = 0;
    char *out = malloc(cap + fn + 64);
    for (int rep = 0; len < cap; rep++) {
        len += (size_t)sprintf(out + len, "Document %d: ", rep);
        memcpy(out + len, src, fn); /* JSON lines: escapes, quotes, brackets, digits, every script */
        len += fn;
    }
    free(src);
    *n = len;
    return out;
}

static void test_speed(void **state) {
    const char *kinds[] = {"gpt2", "llama3", "qwen2", "llama2", "mistral"};
    for (int k = 0; k < 5; k++) {
        char rel[128];
        snprintf(rel, sizeof rel, "tokenizers/%s", kinds[k]);
        char *dir = mt_fixture_path(rel);
        mt_tokenizer *t;
        assert_int_equal(mt_tokenizer_load(&t, dir), MT_OK);
        free(dir);
        size_t n;
        char *text = make_text(kinds[k], &n);
        mt_token_vec v = {0};
        double t0 = mt_test_now_s();
        mt_tokenizer_encode_into(t, text, n, 0, &v);
        double dt = mt_test_now_s() - t0;
        print_message("%-8s %.1f MB -> %zu tokens in %.3f s: %.2f M tokens/s\n", kinds[k], n / 1e6, v.n, dt,
                      v.n / dt / 1e6);
        char *back;
        size_t bn;
        assert_int_equal(mt_tokenizer_decode(t, v.ids, v.n, 0, &back, &bn), MT_OK);
        /* qwen2: byte-level and no lstrip/rstrip added token (gpt2's <mask> and llama3's [TOOL]
         * swallow spaces, as in tokenizers), so the text comes back as its NFC normalizer wrote it */
        if (!strcmp(kinds[k], "qwen2")) {
            utf8proc_uint8_t *nfc = NULL;
            utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)n, &nfc,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            assert_true(m > 0);
            assert_int_equal(bn, (size_t)m);
            assert_memory_equal(back, nfc, bn);
            free(nfc);
        }
        free(back);
        mt_token_vec_free(&v);
        free(text);
        mt_tokenizer_free(t);
    }
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "--bench")) return bench(argc, argv);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_speed)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
