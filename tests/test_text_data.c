/* mt_text_to_tokens (src/data/text_data.h) against the tokenizer fixtures:
 *  - JSONL: tokenizing the fixture's own cases.jsonl (355 texts, each a {"text": ...} object) gives
 *    exactly the ids Python's tokenizers gave for each text with add_special_tokens=True
 *    ("ids_special"), each followed by the eos id; whitespace-only texts are encoded too (as
 *    tokenizer(text) encodes them: they used to be skipped), only the empty text is skipped and
 *    counted;
 *  - text: the same texts as files (one document each, and with --doc-sep) give the ids of
 *    encoding each document separately + eos;
 *  - bad input: lines that are not JSON, objects without a string "text", empty documents are
 *    counted with the first line number; invalid UTF-8 is counted and round-trips through decode;
 *  - uint32 output (forced) holds the same ids; the thread count and batch boundaries (more
 *    documents than one parallel batch holds) do not change the output; errors leave no file;
 *  - the document index (opts.doc_index): one end per kept document (skipped lines have none), each
 *    just past that document's eos, the last the token count; none left on an error. */
#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "data/text_data.h"
#include "tokenizer/tokenizer.h"
#include "util/fixture_io.h"
#include "util/testutil.h"

static char *g_tmp;

typedef struct {
    char *text;
    size_t len;
    int32_t *ids; /* ids_special */
    size_t n;
} tcase;

static tcase *load_cases(const char *kind, size_t *n_out) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizers/%s/cases.jsonl", kind);
    char *path = mt_fixture_path(rel);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    tcase *cs = NULL;
    size_t n = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, f)) > 0) {
        json_error_t err;
        json_t *o = json_loadb(line, (size_t)got, JSON_ALLOW_NUL, &err);
        assert_non_null(o);
        cs = realloc(cs, (n + 1) * sizeof *cs);
        tcase *c = &cs[n++];
        json_t *t = json_object_get(o, "text"), *ids = json_object_get(o, "ids_special");
        c->len = json_string_length(t);
        c->text = malloc(c->len + 1);
        memcpy(c->text, json_string_value(t), c->len + 1);
        c->n = json_array_size(ids);
        c->ids = malloc((c->n + 1) * sizeof(int32_t));
        for (size_t i = 0; i < c->n; i++) c->ids[i] = (int32_t)json_integer_value(json_array_get(ids, i));
        json_decref(o);
    }
    free(line);
    fclose(f);
    free(path);
    *n_out = n;
    return cs;
}

static void free_cases(tcase *cs, size_t n) {
    for (size_t i = 0; i < n; i++) free(cs[i].text), free(cs[i].ids);
    free(cs);
}

static mt_tokenizer *load_tok(const char *kind) { return mt_test_tokenizer_load("tokenizers/%s", kind); }

/* Reads a token file of elem_size into a malloc'd int32 array. */
static int32_t *read_tokens(const char *path, int elem_size, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    assert_int_equal(bytes % elem_size, 0);
    unsigned char *raw = malloc((size_t)bytes + 1);
    assert_int_equal(fread(raw, 1, (size_t)bytes, f), (size_t)bytes);
    fclose(f);
    *n = (size_t)bytes / elem_size;
    int32_t *ids = malloc((*n + 1) * sizeof(int32_t));
    for (size_t i = 0; i < *n; i++) {
        const unsigned char *p = raw + i * elem_size;
        ids[i] = elem_size == 2 ? (int32_t)(p[0] | p[1] << 8)
                                : (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                            (uint32_t)p[3] << 24);
    }
    free(raw);
    return ids;
}

/* A growable list of expected ids. */
typedef struct {
    int32_t *p;
    size_t n, cap;
} ivec;

static void ivec_put(ivec *v, const int32_t *ids, size_t n) {
    if (v->n + n > v->cap) {
        v->cap = 2 * (v->n + n) + 16;
        v->p = realloc(v->p, v->cap * sizeof(int32_t));
    }
    memcpy(v->p + v->n, ids, n * sizeof(int32_t));
    v->n += n;
}

static void check_ids(const char *what, const int32_t *got, size_t n_got, const ivec *want) {
    size_t n = n_got < want->n ? n_got : want->n;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want->p[i]) fail_msg("%s: token %zu is %d, expected %d", what, i, got[i], want->p[i]);
    if (n_got != want->n) fail_msg("%s: %zu tokens, expected %zu", what, n_got, want->n);
}

static char *tmp_path(const char *name) {
    char *p = malloc(strlen(g_tmp) + strlen(name) + 2);
    sprintf(p, "%s/%s", g_tmp, name);
    return p;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void run_ok(const mt_tokenizer *t, const char *const *paths, int n, const char *out,
                   const mt_text_opts *o, mt_text_stats *s) {
    if (mt_text_to_tokens(t, paths, n, out, o, s) != MT_OK) fail_msg("%s", mt_error_message());
}

/* cases.jsonl itself as input: ids_special + eos per non-empty text (whitespace-only ones included),
 * against Python tokenizers. */
static void check_jsonl_fixture(const char *kind) {
    size_t nc;
    tcase *cs = load_cases(kind, &nc);
    mt_tokenizer *t = load_tok(kind);
    int eos = mt_tokenizer_eos(t);
    assert_true(eos >= 0);
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizers/%s/cases.jsonl", kind);
    char *in = mt_fixture_path(rel), *out = tmp_path("cases.bin");
    mt_text_stats s;
    const char *paths[1] = {in};
    run_ok(t, paths, 1, out, NULL, &s);
    ivec want = {0};
    int64_t docs = 0, empty = 0, space = 0;
    for (size_t i = 0; i < nc; i++) {
        space += cs[i].len && strspn(cs[i].text, " \t\n\r\v\f") == cs[i].len;
        if (cs[i].len == 0) {
            empty++;
            continue;
        }
        ivec_put(&want, cs[i].ids, cs[i].n);
        ivec_put(&want, &eos, 1);
        docs++;
    }
    size_t n;
    int32_t *got = read_tokens(out, 2, &n);
    check_ids(kind, got, n, &want);
    assert_int_equal(s.documents, docs);
    assert_int_equal(s.empty_docs, empty);
    assert_int_equal(s.tokens, (int64_t)want.n);
    assert_int_equal(s.bad_json + s.missing_text + s.invalid_utf8, 0);
    assert_int_equal(s.elem_size, 2);
    assert_true(space >= 5); /* the fixture holds whitespace-only texts, and they were checked */
    printf("%s: cases.jsonl -> %zu tokens, %lld documents (%lld whitespace-only), %lld empty: identical "
           "to tokenizers\n", kind, n, (long long)docs, (long long)space, (long long)empty);

    /* the same texts as text: one file per document, and one file with --doc-sep */
    char **files = malloc(nc * sizeof(char *));
    int nf = 0;
    char *sep_path = tmp_path("sep.txt");
    FILE *sf = fopen(sep_path, "wb");
    ivec want_files = {0}, want_sep = {0};
    for (size_t i = 0; i < nc; i++) {
        char name[64];
        snprintf(name, sizeof name, "doc%04zu.txt", i);
        files[nf] = tmp_path(name);
        write_file(files[nf++], cs[i].text, cs[i].len);
        fwrite(cs[i].text, 1, cs[i].len, sf);
        fputs("\n@@SEP@@\r\n", sf);
        if (cs[i].len) { /* an empty file is the one skipped document */
            ivec_put(&want_files, cs[i].ids, cs[i].n);
            ivec_put(&want_files, &eos, 1);
        }
        int32_t *ids;
        size_t ni;
        char *doc = malloc(cs[i].len + 2);
        memcpy(doc, cs[i].text, cs[i].len);
        doc[cs[i].len] = '\n';
        mt_tokenizer_encode(t, doc, cs[i].len + 1, 1, &ids, &ni);
        ivec_put(&want_sep, ids, ni);
        ivec_put(&want_sep, &eos, 1);
        free(ids), free(doc);
    }
    fclose(sf);
    run_ok(t, (const char *const *)files, nf, out, NULL, &s);
    free(got);
    got = read_tokens(out, 2, &n);
    check_ids("one file per document", got, n, &want_files);
    assert_int_equal(s.documents, docs);
    assert_int_equal(s.empty_docs, empty);

    mt_text_opts o = mt_text_opts_default();
    o.doc_sep = "@@SEP@@";
    paths[0] = sep_path;
    run_ok(t, paths, 1, out, &o, &s);
    free(got);
    got = read_tokens(out, 2, &n);
    check_ids("--doc-sep", got, n, &want_sep);
    assert_int_equal(s.documents, (int64_t)nc); /* each with its "\n": none is empty */
    assert_int_equal(s.empty_docs, 0);

    /* forced uint32: same ids, 4 bytes each */
    o = mt_text_opts_default();
    o.elem_size = 4;
    paths[0] = in;
    run_ok(t, paths, 1, out, &o, &s);
    assert_int_equal(s.elem_size, 4);
    free(got);
    got = read_tokens(out, 4, &n);
    check_ids("uint32", got, n, &want);

    for (int i = 0; i < nf; i++) unlink(files[i]), free(files[i]);
    free(files), free(sep_path), free(got), free(want.p), free(want_files.p), free(want_sep.p);
    free(in), free(out);
    mt_tokenizer_free(t);
    free_cases(cs, nc);
}

static void test_gpt2(void **st) { (void)st, check_jsonl_fixture("gpt2"); }
static void test_llama3(void **st) { (void)st, check_jsonl_fixture("llama3"); }
static void test_qwen2(void **st) { (void)st, check_jsonl_fixture("qwen2"); }
static void test_llama2(void **st) { (void)st, check_jsonl_fixture("llama2"); }
static void test_mistral(void **st) { (void)st, check_jsonl_fixture("mistral"); }

/* Every kind of bad line is counted with its first line number; nothing else is lost. */
static void test_bad_jsonl(void **st) {
    (void)st;
    mt_tokenizer *t = load_tok("llama3");
    int eos = mt_tokenizer_eos(t);
    const char *text =
        "{\"text\": \"first document\"}\n"    /* 1 */
        "\n"                                  /* 2: blank, not data */
        "not json at all\n"                   /* 3: bad */
        "{\"title\": \"no text\"}\n"          /* 4: missing */
        "{\"text\": \"\"}\n"                  /* 5: empty */
        "{\"text\": 42}\n"                    /* 6: missing (not a string) */
        "[\"an\", \"array\"]\n"               /* 7: bad (not an object) */
        "{\"text\": \"   \\n\"}\n"            /* 8: whitespace only: a document */
        "{\"text\": \"second\", \"x\": 1}\n"  /* 9 */
        "{\"text\": \"trunc\n"                /* 10: bad */
        "{\"text\": \"last \\u00e9\"}";       /* 11, no final newline */
    char *in = tmp_path("bad.jsonl"), *out = tmp_path("bad.bin");
    write_file(in, text, strlen(text));
    mt_text_stats s;
    const char *paths[1] = {in};
    run_ok(t, paths, 1, out, NULL, &s);
    assert_int_equal(s.documents, 4);
    assert_int_equal(s.bad_json, 3);
    assert_int_equal(s.bad_json_line, 3);
    assert_int_equal(s.missing_text, 2);
    assert_int_equal(s.missing_text_line, 4);
    assert_int_equal(s.empty_docs, 1);
    assert_int_equal(s.empty_line, 5);
    assert_int_equal(s.bytes, (int64_t)strlen(text));
    assert_string_equal(s.bad_json_path, in);
    ivec want = {0};
    const char *docs[] = {"first document", "   \n", "second", "last \xc3\xa9"};
    for (int i = 0; i < 4; i++) {
        int32_t *ids;
        size_t n;
        mt_tokenizer_encode(t, docs[i], strlen(docs[i]), 1, &ids, &n);
        ivec_put(&want, ids, n);
        ivec_put(&want, &eos, 1);
        free(ids);
    }
    size_t n;
    int32_t *got = read_tokens(out, 2, &n);
    check_ids("bad.jsonl", got, n, &want);
    char report[2048] = "";
    FILE *mem = fmemopen(report, sizeof report, "w");
    mt_text_stats_report(&s, "W: ", mem);
    fclose(mem);
    printf("%s", report);
    assert_non_null(strstr(report, "3 line(s) that are not a JSON object"));
    assert_non_null(strstr(report, "line 4"));

    /* nothing usable at all: MT_ERR, and no output file */
    const char *junk = "nope\n{\"a\": 1}\n{\"text\": \"\"}\n";
    write_file(in, junk, strlen(junk));
    unlink(out);
    assert_int_equal(mt_text_to_tokens(t, paths, 1, out, NULL, &s), MT_ERR);
    printf("expected error: %s\n", mt_error_message());
    assert_non_null(strstr(mt_error_message(), "no text"));
    assert_int_equal(access(out, F_OK), -1);
    char *tmp = tmp_path("bad.bin.tmp");
    assert_int_equal(access(tmp, F_OK), -1);
    free(tmp), free(got), free(want.p), free(in), free(out);
    mt_tokenizer_free(t);
}

/* Invalid UTF-8 is encoded, counted, and decodes to the same bytes. */
static void test_invalid_utf8(void **st) {
    (void)st;
    const char *kinds[] = {"gpt2", "llama3", "llama2"};
    const char text[] = "caf\xc3\xa9 \xff\xfe broken \xe2\x82 tail \xed\xa0\x80 surrogate\n";
    for (int k = 0; k < 3; k++) {
        mt_tokenizer *t = load_tok(kinds[k]);
        char *in = tmp_path("bad_utf8.txt"), *out = tmp_path("bad_utf8.bin");
        write_file(in, text, sizeof text - 1);
        mt_text_stats s;
        const char *paths[1] = {in};
        run_ok(t, paths, 1, out, NULL, &s);
        assert_int_equal(s.documents, 1);
        assert_int_equal(s.invalid_utf8, 1);
        assert_int_equal(s.invalid_utf8_line, 1);
        size_t n;
        int32_t *got = read_tokens(out, 2, &n);
        assert_true(n >= 2);
        assert_int_equal(got[n - 1], mt_tokenizer_eos(t));
        char *dec;
        size_t len;
        assert_int_equal(mt_tokenizer_decode(t, got, n - 1, MT_TOK_SKIP_SPECIAL, &dec, &len), MT_OK);
        if (len != sizeof text - 1 || memcmp(dec, text, len) != 0)
            fail_msg("%s: invalid UTF-8 did not round-trip: got %zu bytes '%s'", kinds[k], len, dec);
        free(dec), free(got), free(in), free(out);
        mt_tokenizer_free(t);
    }
}

/* More documents than one parallel batch holds, 1 thread vs 2: identical files; byte-level mode. */
static void test_batches_threads(void **st) {
    (void)st;
    mt_tokenizer *t = load_tok("gpt2");
    char *in = tmp_path("many.jsonl"), *out1 = tmp_path("many1.bin"), *out2 = tmp_path("many2.bin");
    FILE *f = fopen(in, "wb");
    int ndocs = 70000; /* > 65536 documents per batch */
    for (int i = 0; i < ndocs; i++) fprintf(f, "{\"text\": \"document %d says h\\u00e9llo %d\"}\n", i, i * 7);
    fclose(f);
    const char *paths[1] = {in};
    mt_text_stats s1, s2;
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    run_ok(t, paths, 1, out1, NULL, &s1);
    omp_set_num_threads(threads > 1 ? threads : 2);
    run_ok(t, paths, 1, out2, NULL, &s2);
    omp_set_num_threads(threads);
    assert_int_equal(s1.documents, ndocs);
    assert_int_equal(s1.tokens, s2.tokens);
    size_t n1, n2;
    int32_t *a = read_tokens(out1, 2, &n1), *b = read_tokens(out2, 2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1 * sizeof(int32_t));
    /* spot check the last document against a direct encode */
    char last[128];
    int len = snprintf(last, sizeof last, "document %d says h\xc3\xa9llo %d", ndocs - 1, (ndocs - 1) * 7);
    int32_t *ids;
    size_t ni;
    mt_tokenizer_encode(t, last, (size_t)len, 1, &ids, &ni);
    assert_true(n1 > ni + 1);
    assert_memory_equal(a + n1 - 1 - ni, ids, ni * sizeof(int32_t));
    printf("%d documents, %lld tokens in %.2f s (1 thread) / %.2f s (%d threads)\n", ndocs,
           (long long)s1.tokens, s1.seconds, s2.seconds, threads > 1 ? threads : 2);
    free(ids), free(a), free(b);

    /* byte-level (tok NULL): bytes + eos 256 per document */
    const char *small = "{\"text\": \"ab\"}\n{\"text\": \"\\u00e9\"}\n";
    write_file(in, small, strlen(small));
    mt_text_opts o = mt_text_opts_default();
    o.eos_id = 256;
    run_ok(NULL, paths, 1, out1, &o, &s1);
    a = read_tokens(out1, 2, &n1);
    int32_t want[] = {'a', 'b', 256, 0xc3, 0xa9, 256};
    assert_int_equal(n1, 6);
    assert_memory_equal(a, want, sizeof want);
    free(a), free(in), free(out1), free(out2);
    mt_tokenizer_free(t);
}

/* Errors: no eos for byte-level, uint16 too small for an eos id, unreadable input; no file left. */
static void test_errors(void **st) {
    (void)st;
    mt_tokenizer *t = load_tok("gpt2");
    char *in = tmp_path("e.txt"), *out = tmp_path("e.bin"), *missing = tmp_path("missing.txt");
    write_file(in, "hello\n", 6);
    const char *paths[2] = {in, missing};
    mt_text_stats s;
    unlink(out);
    assert_int_equal(mt_text_to_tokens(t, paths, 2, out, NULL, &s), MT_ERR);
    printf("expected error: %s\n", mt_error_message());
    assert_non_null(strstr(mt_error_message(), "missing.txt"));
    assert_int_equal(access(out, F_OK), -1);

    mt_text_opts o = mt_text_opts_default();
    o.eos_id = 70000;
    o.elem_size = 2;
    assert_int_equal(mt_text_to_tokens(t, paths, 1, out, &o, &s), MT_ERR);
    printf("expected error: %s\n", mt_error_message());
    assert_non_null(strstr(mt_error_message(), "u32"));
    o.elem_size = 0; /* auto: uint32 */
    run_ok(t, paths, 1, out, &o, &s);
    assert_int_equal(s.elem_size, 4);

    o = mt_text_opts_default(); /* byte-level needs an explicit eos */
    assert_int_equal(mt_text_to_tokens(NULL, paths, 1, out, &o, &s), MT_ERR);
    printf("expected error: %s\n", mt_error_message());
    assert_int_equal(mt_text_to_tokens(t, paths, 0, out, NULL, &s), MT_ERR);
    free(in), free(out), free(missing);
    mt_tokenizer_free(t);
}

/* The index ends of PATH. */
static int64_t *read_index(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    assert_true(size >= 0 && size % 8 == 0);
    *n = (size_t)size / 8;
    int64_t *e = malloc((size_t)size + 8);
    for (size_t i = 0; i < *n; i++) {
        unsigned char b[8];
        assert_int_equal(fread(b, 1, 8, f), 8);
        uint64_t u = 0;
        for (int k = 7; k >= 0; k--) u = u << 8 | b[k];
        e[i] = (int64_t)u;
    }
    fclose(f);
    return e;
}

static void test_doc_index(void **st) {
    (void)st;
    mt_tokenizer *t = load_tok("gpt2");
    char *in = tmp_path("ix.jsonl"), *out = tmp_path("ix.bin"), *index = tmp_path("ix.bin.docs");
    /* more documents than one index buffer (8192), with lines that are no document among them */
    enum { N = 20000 };
    FILE *f = fopen(in, "w");
    assert_non_null(f);
    for (int i = 0; i < N; i++) {
        if (i % 1000 == 7) fputs("not json\n{\"text\": \"\"}\n{\"other\": 1}\n\n", f);
        fprintf(f, "{\"text\": \"doc %d%s\"}\n", i, i % 3 ? " and some more words" : "");
    }
    assert_int_equal(fclose(f), 0);
    const char *paths[1] = {in};
    mt_text_opts o = mt_text_opts_default();
    o.doc_index = index;
    mt_text_stats s;
    run_ok(t, paths, 1, out, &o, &s);
    assert_int_equal(s.documents, N);
    assert_true(s.bad_json > 0 && s.empty_docs > 0 && s.missing_text > 0);
    size_t n, nt;
    int64_t *ends = read_index(index, &n);
    int32_t *tok = read_tokens(out, 2, &nt);
    assert_int_equal(n, N);
    assert_int_equal(ends[N - 1], (int64_t)nt);
    int eos = mt_tokenizer_eos(t);
    for (int i = 0; i < N; i++) {
        int64_t start = i ? ends[i - 1] : 0;
        char text[64];
        snprintf(text, sizeof text, "doc %d%s", i, i % 3 ? " and some more words" : "");
        int32_t *ids;
        size_t ni;
        mt_tokenizer_encode(t, text, strlen(text), 1, &ids, &ni);
        if (ends[i] - start != (int64_t)ni + 1)
            fail_msg("document %d: %lld tokens, want %zu + eos", i, (long long)(ends[i] - start), ni);
        assert_memory_equal(tok + start, ids, ni * sizeof(int32_t));
        assert_int_equal(tok[ends[i] - 1], eos);
        free(ids);
    }
    free(ends), free(tok);
    /* an error (no document at all) leaves neither file */
    unlink(out), unlink(index);
    write_file(in, "{\"text\": \"\"}\n", 13);
    assert_int_equal(mt_text_to_tokens(t, paths, 1, out, &o, &s), MT_ERR);
    assert_int_equal(access(out, F_OK), -1);
    assert_int_equal(access(index, F_OK), -1);
    free(in), free(out), free(index);
    mt_tokenizer_free(t);
}

static int setup(void **st) {
    (void)st;
    g_tmp = mt_test_tmpdir();
    return 0;
}

static int teardown(void **st) {
    (void)st;
    mt_test_rmtree(g_tmp);
    free(g_tmp);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),         cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_qwen2),        cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_mistral),      cmocka_unit_test(test_bad_jsonl),
        cmocka_unit_test(test_invalid_utf8), cmocka_unit_test(test_batches_threads),
        cmocka_unit_test(test_errors),       cmocka_unit_test(test_doc_index),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
