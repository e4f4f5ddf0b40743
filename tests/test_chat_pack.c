/* Chat JSONL -> packed rows (src/data/chat_pack.h), end to end:
 *  - the reference conversations of tests/fixtures/chat (rendered by jinja2, encoded by tokenizers)
 *    come out of the packed file with exactly their ids, and a target exactly where the next token
 *    is an assistant token of the same conversation (every token with --loss-on all), for every
 *    format; --pack split: whether a conversation fits in a row or is cut across rows;
 *  - --pack whole: no conversation crosses a row: walking every row, each document starts where
 *    the previous one ends, each conversation sits whole and contiguous in one row (ids, targets,
 *    document start), in file order, truncated ones as their first T tokens; the rest of a row is
 *    padding (pad id, no loss, its own document) exactly when the next conversation does not fit
 *    it; the padding counted equals the stats; T as small as the longest conversation and smaller;
 *  - every kind of bad input is counted exactly, with its first line; --long truncate / skip;
 *  - the file does not depend on the thread count;
 *  - packed rows of real conversations give the loss and gradients of their documents run one by
 *    one through the whole-model runner (attention inside documents, positions restarting), under
 *    both policies. */
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/error.h"
#include "data/chat_pack.h"
#include "data/packed.h"
#include "model/runner.h"
#include "util/fixture_io.h"
#include "util/testutil.h"
#include "util/tiny_config.h"

typedef struct {
    int32_t *ids;
    uint8_t *mask;
    size_t n;
    int has_assistant;
} ref_conv;

typedef struct {
    char tokdir[128], format[32];
    ref_conv convs[16];
    int n;
} ref_group;

/* The fixture cases of one tokenizer and format (no default system prompt), written as chat JSONL
 * to path, in file order. */
static void load_group(const char *tokdir, const char *format, const char *path, ref_group *g) {
    char *cases = mt_fixture_path("chat/cases.jsonl");
    FILE *in = fopen(cases, "rb"), *out = fopen(path, "wb");
    assert_non_null(in);
    assert_non_null(out);
    memset(g, 0, sizeof *g);
    snprintf(g->tokdir, sizeof g->tokdir, "%s", tokdir);
    snprintf(g->format, sizeof g->format, "%s", format);
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, in) > 0) {
        json_t *c = json_loads(line, 0, NULL);
        assert_non_null(c);
        if (!strcmp(json_string_value(json_object_get(c, "tokenizer")), tokdir) &&
            !strcmp(json_string_value(json_object_get(c, "format")), format) &&
            json_is_null(json_object_get(c, "default_system"))) {
            json_t *msgs = json_object_get(c, "messages"), *ids = json_object_get(c, "ids"),
                   *mask = json_object_get(c, "mask");
            json_t *obj = json_pack("{s:O}", "messages", msgs);
            char *s = json_dumps(obj, JSON_COMPACT);
            fprintf(out, "%s\n", s);
            free(s);
            json_decref(obj);
            ref_conv *r = &g->convs[g->n++];
            r->n = json_array_size(ids);
            r->ids = malloc(r->n * sizeof *r->ids), r->mask = malloc(r->n);
            for (size_t i = 0; i < r->n; i++) {
                r->ids[i] = (int32_t)json_integer_value(json_array_get(ids, i));
                r->mask[i] = (uint8_t)json_integer_value(json_array_get(mask, i));
            }
            for (size_t i = 0; i < json_array_size(msgs); i++)
                r->has_assistant |= !strcmp(json_string_value(json_object_get(json_array_get(msgs, i), "role")),
                                            "assistant");
        }
        json_decref(c);
    }
    free(line);
    fclose(in);
    fclose(out);
    free(cases);
    assert_true(g->n >= 5);
}

static void free_group(ref_group *g) {
    for (int i = 0; i < g->n; i++) free(g->convs[i].ids), free(g->convs[i].mask);
}

static mt_tokenizer *load_tok(const char *rel) { return mt_test_tokenizer_load("%s", rel); }

/* The fixture tokenizers and their formats. */
static const char *const k_setups[][2] = {{"tokenizers/qwen2", "chatml"},   {"tokenizers/llama3", "llama3"},
                                          {"tokenizers/llama2", "llama2"},  {"tokenizers/mistral", "mistral"},
                                          {"chat/mistral_inst", "mistral-v3"}};
#define N_SETUPS (sizeof k_setups / sizeof k_setups[0])

static int pack_as(const mt_tokenizer *tok, const char *in, const char *out, const char *format,
                   mt_chat_loss_on loss_on, int T, mt_long_policy lp, mt_pack_policy pp, mt_chat_pack_stats *s) {
    mt_chat_pack_opts o = {.loss_on = loss_on, .T = T, .long_policy = lp, .pack = pp};
    assert_int_equal(mt_chat_format_parse(format, &o.format), MT_OK);
    const char *paths[1] = {in};
    return mt_chat_pack(tok, paths, 1, out, &o, s);
}

static int pack(const mt_tokenizer *tok, const char *in, const char *out, const char *format,
                mt_chat_loss_on loss_on, int T, mt_long_policy lp, mt_chat_pack_stats *s) {
    return pack_as(tok, in, out, format, loss_on, T, lp, MT_PACK_WHOLE, s);
}

/* --pack split against the reference: the kept conversations, in order, form the stream. */
static void check_split(const char *path, const ref_group *g, int T, mt_chat_loss_on loss_on) {
    mt_packed_file f;
    if (mt_packed_open(&f, path, T, 0) != MT_OK) fail_msg("%s", mt_error_message());
    /* the expected stream: ids, conversation index, trained */
    size_t cap = 0, n = 0;
    for (int c = 0; c < g->n; c++) cap += g->convs[c].n;
    int32_t *ids = malloc(cap * 4);
    int *conv = malloc(cap * sizeof(int));
    uint8_t *trained = malloc(cap);
    int kept = 0;
    for (int c = 0; c < g->n; c++) {
        const ref_conv *r = &g->convs[c];
        if (loss_on == MT_CHAT_LOSS_ASSISTANT && !r->has_assistant) continue;
        for (size_t i = 0; i < r->n; i++, n++)
            ids[n] = r->ids[i], conv[n] = c, trained[n] = loss_on == MT_CHAT_LOSS_ALL || r->mask[i];
        kept++;
    }
    assert_int_equal(f.documents, kept);
    assert_int_equal(f.rows, (int64_t)(n - 1 + T - 1) / T);
    int32_t *in = malloc(T * 4), *tg = malloc(T * 4), *ds = malloc(T * 4);
    for (int64_t r = 0; r < f.rows; r++) {
        mt_packed_row(&f, r, in, tg, ds);
        for (int t = 0; t < T; t++) {
            size_t p = (size_t)r * T + t;
            if (p >= n) { /* padding: no loss, a document of its own from the first pad */
                assert_int_equal(tg[t], -1);
                assert_int_equal(ds[t], (int)(n > (size_t)r * T ? n - (size_t)r * T : 0));
                continue;
            }
            int32_t want_tg = p + 1 < n && conv[p + 1] == conv[p] && trained[p + 1] ? ids[p + 1] : -1;
            size_t start = p;
            while (start > (size_t)r * T && conv[start - 1] == conv[p]) start--;
            if (in[t] != ids[p] || tg[t] != want_tg || ds[t] != (int32_t)(start - (size_t)r * T))
                fail_msg("%s/%s T %d row %lld position %d: got id %d target %d start %d, want %d %d %d", g->tokdir,
                         g->format, T, (long long)r, t, in[t], tg[t], ds[t], ids[p], want_tg,
                         (int)(start - (size_t)r * T));
        }
    }
    free(in), free(tg), free(ds), free(ids), free(conv), free(trained);
    mt_packed_close(&f);
}

/* A check of one fixture group: its tokenizer, its conversations (written to in), the output path. */
typedef void (*group_check)(const mt_tokenizer *tok, const ref_group *g, const char *in, const char *out);

static void each_group(group_check check) {
    char *dir = mt_test_tmpdir(), in[4096], out[4096];
    snprintf(in, sizeof in, "%s/chat.jsonl", dir);
    snprintf(out, sizeof out, "%s/chat.packed", dir);
    for (size_t k = 0; k < N_SETUPS; k++) {
        ref_group g;
        load_group(k_setups[k][0], k_setups[k][1], in, &g);
        mt_tokenizer *tok = load_tok(k_setups[k][0]);
        check(tok, &g, in, out);
        mt_tokenizer_free(tok);
        free_group(&g);
    }
    mt_test_rmtree(dir);
    free(dir);
}

/* --pack split: one row for all; and rows that cut conversations (every one fits: no truncation) */
static void reference_split(const mt_tokenizer *tok, const ref_group *g, const char *in, const char *out) {
    const int Ts[] = {4096, 111};
    for (int loss = 0; loss < 2; loss++)
        for (size_t ti = 0; ti < 2; ti++) {
            mt_chat_pack_stats s;
            if (pack_as(tok, in, out, g->format, (mt_chat_loss_on)loss, Ts[ti], MT_LONG_TRUNCATE, MT_PACK_SPLIT, &s) !=
                MT_OK)
                fail_msg("%s", mt_error_message());
            mt_chat_format want;
            assert_int_equal(mt_chat_format_parse(g->format, &want), MT_OK);
            assert_int_equal(s.format, want);
            assert_int_equal(s.long_truncated.n + s.long_untrained.n, 0);
            assert_int_equal(s.no_assistant.n, loss == MT_CHAT_LOSS_ASSISTANT ? 1 : 0);
            check_split(out, g, Ts[ti], (mt_chat_loss_on)loss);
        }
    printf("%s %s: %d conversations match the reference, both loss modes\n", g->tokdir, g->format, g->n);
}

static void test_reference_conversations(void **state) {
    (void)state;
    each_group(reference_split);
}

/* The kept conversations of g, in file order, as packing T should keep them: longer than T,
 * truncated to their first T tokens, and dropped when no target is left among them. */
typedef struct {
    const int32_t *ids;
    uint8_t trained[512]; /* token i is a target */
    int n;
} kept_conv;

static int keep_conversations(const ref_group *g, int T, mt_chat_loss_on loss_on, kept_conv *out) {
    int kept = 0;
    for (int c = 0; c < g->n; c++) {
        const ref_conv *r = &g->convs[c];
        if (loss_on == MT_CHAT_LOSS_ASSISTANT && !r->has_assistant) continue;
        kept_conv *k = &out[kept];
        k->ids = r->ids;
        k->n = (int)r->n < T ? (int)r->n : T;
        assert_true(k->n <= (int)sizeof k->trained);
        int targets = 0;
        for (int i = 0; i < k->n; i++) {
            k->trained[i] = loss_on == MT_CHAT_LOSS_ALL || r->mask[i];
            targets += i > 0 && k->trained[i];
        }
        kept += targets > 0;
    }
    return kept;
}

/* Conversation k must sit at position t of row r, whole: its ids (the last one may be the row's
 * target slot T), a target exactly on its trained tokens and none out of it, one document start. */
static void expect_conversation(const char *what, int64_t r, int t, const kept_conv *k, int T, const int32_t *in,
                                const int32_t *tg, const int32_t *ds, int32_t last_slot) {
    for (int i = 0; i < k->n; i++) {
        int p = t + i;
        int32_t id = p < T ? in[p] : last_slot;
        int ok = id == k->ids[i];
        if (p < T) {
            int32_t want_tg = i + 1 < k->n && k->trained[i + 1] ? k->ids[i + 1] : -1;
            ok &= tg[p] == want_tg && ds[p] == t;
        }
        if (!ok)
            fail_msg("%s row %lld: the conversation at %d, token %d of %d: got id %d target %d start %d (want id %d, "
                     "start %d)", what, (long long)r, t, i, k->n, id, p < T ? tg[p] : 0, p < T ? ds[p] : 0, k->ids[i], t);
    }
}

/* Padding from t to the row's end: the pad id, no loss, one document of its own. */
static void expect_padding(const char *what, int64_t r, int t, int T, int pad, const int32_t *in, const int32_t *tg,
                           const int32_t *ds, int32_t last_slot) {
    for (int p = t; p < T; p++)
        if (in[p] != pad || tg[p] != -1 || ds[p] != t)
            fail_msg("%s row %lld: padding from %d, position %d: got id %d target %d start %d", what, (long long)r, t,
                     p, in[p], tg[p], ds[p]);
    if (last_slot != pad) fail_msg("%s row %lld: padding from %d, the last slot holds %d", what, (long long)r, t, last_slot);
}

/* The row's id T (the last target slot; not an input, so read from the file itself). */
static int32_t last_slot_of(const mt_packed_file *f, int64_t r) {
    const unsigned char *p = f->data + MT_PACKED_HEADER + (size_t)r * f->row_bytes + (size_t)f->T * f->id_size;
    return f->id_size == 2 ? (int32_t)(p[0] | p[1] << 8) : (int32_t)(p[0] | p[1] << 8 | p[2] << 16 | p[3] << 24);
}

/* --pack whole against the reference, walking every row: a document starts at 0; each is the next
 * kept conversation, whole, when it fits the ids left (t + n <= T+1, t < T), else padding to the
 * row's end (and then the next conversation really did not fit). Every conversation is found, the
 * padding counted is the stats'. */
static void check_whole(const char *path, const ref_group *g, int T, mt_chat_loss_on loss_on, int pad,
                        const mt_chat_pack_stats *s) {
    char what[256];
    snprintf(what, sizeof what, "%s/%s T %d loss on %s", g->tokdir, g->format, T, loss_on ? "all" : "assistant");
    mt_packed_file f;
    if (mt_packed_open(&f, path, T, 0) != MT_OK) fail_msg("%s", mt_error_message());
    kept_conv kept[16];
    int n_kept = keep_conversations(g, T, loss_on, kept), c = 0;
    assert_int_equal(f.documents, n_kept);
    assert_int_equal(s->conversations, n_kept);
    int32_t *in = malloc(T * 4), *tg = malloc(T * 4), *ds = malloc(T * 4);
    int64_t padding = 0;
    for (int64_t r = 0; r < f.rows; r++) {
        mt_packed_row(&f, r, in, tg, ds);
        int32_t last = last_slot_of(&f, r);
        int t = 0;
        while (t <= T) {
            if (c < n_kept && t < T && t + kept[c].n <= T + 1) { /* the next conversation fits: here, whole */
                expect_conversation(what, r, t, &kept[c], T, in, tg, ds, last);
                t += kept[c++].n;
                continue;
            }
            if (t == 0) fail_msg("%s row %lld: no conversation starts the row", what, (long long)r);
            if (t < T) padding += T - t;
            expect_padding(what, r, t, T, pad, in, tg, ds, last);
            break;
        }
    }
    if (c != n_kept) fail_msg("%s: %d of %d conversations found in the rows", what, c, n_kept);
    assert_int_equal(padding, s->padded);
    assert_int_equal(f.rows, s->rows);
    free(in), free(tg), free(ds);
    mt_packed_close(&f);
}

static int longest(const ref_group *g) {
    int n = 0;
    for (int c = 0; c < g->n; c++) n = (int)g->convs[c].n > n ? (int)g->convs[c].n : n;
    return n;
}

/* --pack whole: every fixture conversation whole in one row, for T from the longest conversation
 * (nearly one a row) up, and below it (the long ones truncated to T, filling a row alone). */
static void reference_whole(const mt_tokenizer *tok, const ref_group *g, const char *in, const char *out) {
    int pad = mt_tokenizer_eos(tok) >= 0 ? mt_tokenizer_eos(tok) : 0, L = longest(g);
    int64_t padded = 0;
    const int Ts[] = {L, L + 1, L + 23, 2 * L - 1, L - 9, 40};
    for (int loss = 0; loss < 2; loss++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            mt_chat_pack_stats s;
            if (pack_as(tok, in, out, g->format, (mt_chat_loss_on)loss, Ts[ti], MT_LONG_TRUNCATE, MT_PACK_WHOLE, &s) !=
                MT_OK)
                fail_msg("%s", mt_error_message());
            assert_int_equal(s.long_truncated.n > 0, Ts[ti] < L);
            check_whole(out, g, Ts[ti], (mt_chat_loss_on)loss, pad, &s);
            printf("  T %d loss on %s: %lld rows, %lld padding\n", Ts[ti], loss ? "all" : "assistant",
                   (long long)s.rows, (long long)s.padded);
            assert_true(s.rows >= 2);
            padded += s.padded;
        }
    assert_true(padded > 0); /* rows were really left part empty */
    printf("%s %s: %d conversations whole in their rows, T 40 .. %d, both loss modes\n", g->tokdir, g->format, g->n,
           2 * L - 1);
}

static void test_whole_rows(void **state) {
    (void)state;
    each_group(reference_whole);
}

/* --pack split, conversations cut across rows: the stream of a small T is the stream of a large one. */
static void test_rows_cut_conversations(void **state) {
    (void)state;
    char *dir = mt_test_tmpdir(), in[4096], a[4096], b[4096];
    snprintf(in, sizeof in, "%s/chat.jsonl", dir);
    snprintf(a, sizeof a, "%s/a.packed", dir);
    snprintf(b, sizeof b, "%s/b.packed", dir);
    ref_group g;
    load_group("tokenizers/llama3", "llama3", in, &g);
    mt_tokenizer *tok = load_tok("tokenizers/llama3");
    /* T 128 >= every conversation (no truncation) but cuts the stream of ~500 tokens into rows */
    mt_chat_pack_stats s;
    assert_int_equal(pack_as(tok, in, a, "llama3", MT_CHAT_LOSS_ASSISTANT, 128, MT_LONG_TRUNCATE, MT_PACK_SPLIT, &s),
                     MT_OK);
    assert_int_equal(s.long_truncated.n + s.long_skipped.n + s.long_untrained.n, 0);
    assert_true(s.rows >= 3);
    check_split(a, &g, 128, MT_CHAT_LOSS_ASSISTANT);
    /* one thread or two: the same bytes, under either policy */
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
    for (int pp = 0; pp < 2; pp++) {
        assert_int_equal(pack_as(tok, in, a, "llama3", MT_CHAT_LOSS_ASSISTANT, 128, MT_LONG_TRUNCATE,
                                 (mt_pack_policy)pp, &s), MT_OK);
        omp_set_num_threads(1);
        assert_int_equal(pack_as(tok, in, b, "llama3", MT_CHAT_LOSS_ASSISTANT, 128, MT_LONG_TRUNCATE,
                                 (mt_pack_policy)pp, &s), MT_OK);
        omp_set_num_threads(2);
        assert_int_equal(system(cmd), 0);
    }
    mt_tokenizer_free(tok);
    free_group(&g);
    mt_test_rmtree(dir);
    free(dir);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

#define GOOD "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n"

static void expect_issue(const mt_chat_issue *i, int64_t n, int64_t first_line, const char *what) {
    if (i->n != n || (n && i->line != first_line))
        fail_msg("%s: %lld (first line %lld), want %lld (first line %lld)", what, (long long)i->n,
                 (long long)i->line, (long long)n, (long long)first_line);
}

static void test_bad_input_counted(void **state) {
    (void)state;
    char *dir = mt_test_tmpdir(), in[4096], out[4096];
    snprintf(in, sizeof in, "%s/bad.jsonl", dir);
    snprintf(out, sizeof out, "%s/bad.packed", dir);
    write_file(in, GOOD                                                                      /* 1 */
               "not json at all\n"                                                           /* 2 bad_json */
               "{\"text\": \"a plain text line\"}\n"                                         /* 3 no_messages */
               "{\"messages\": []}\n"                                                        /* 4 empty */
               "{\"messages\": [{\"role\": \"user\", \"content\": \"  \"}, "
               "{\"role\": \"assistant\", \"content\": \"\"}]}\n"                            /* 5 empty */
               "{\"messages\": [{\"role\": \"user\"}]}\n"                                    /* 6 bad_message */
               "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}\n"                    /* 7 bad_message */
               "{\"messages\": [\"x\"]}\n"                                                   /* 8 bad_message */
               "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}, "
               "{\"role\": \"assistant\", \"content\": \"y\"}]}\n"                           /* 9 unknown_role */
               "{\"messages\": [{\"role\": \"user\", \"content\": \"only a question\"}]}\n"  /* 10 no_assistant */
               "{\"messages\": [{\"role\": \"user\", \"content\": \"caf\xff\"}]}\n"          /* 11 invalid_utf8 */
               "   \n"                                                                       /* 12 blank: not data */
               "[1, 2]\n"                                                                    /* 13 bad_json */
               "{\"messages\": [{\"role\": \"user\", \"content\": \"a\\u0000b\"}, "
               "{\"role\": \"assistant\", \"content\": \"c\"}]}\n"                           /* 14 bad_json (NUL) */
               GOOD                                                                          /* 15 */
               "{\"messages\": \"str\"}\n"                                                   /* 16 no_messages */
               "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, "
               "{\"role\": \"assistant\", \"content\": \"y\", \"extra\": 1}], \"id\": 7}\n"  /* 17 good, extras */
               "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, "
               "{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}"); /* 18 */
    mt_tokenizer *qwen = load_tok("tokenizers/qwen2"), *llama2 = load_tok("tokenizers/llama2");
    mt_chat_pack_stats s;
    assert_int_equal(pack(qwen, in, out, "chatml", MT_CHAT_LOSS_ASSISTANT, 64, MT_LONG_TRUNCATE, &s), MT_OK);
    expect_issue(&s.bad_json, 3, 2, "not JSON");
    expect_issue(&s.no_messages, 2, 3, "no messages");
    expect_issue(&s.empty, 2, 4, "empty");
    expect_issue(&s.bad_message, 3, 6, "bad message");
    expect_issue(&s.unknown_role, 1, 9, "unknown role");
    expect_issue(&s.no_assistant, 1, 10, "no assistant");
    expect_issue(&s.invalid_utf8, 1, 11, "invalid UTF-8");
    expect_issue(&s.bad_order, 0, 0, "bad order"); /* ChatML writes any order */
    assert_int_equal(s.conversations, 4);
    /* the report: one line per kind, naming the file and the first line */
    char *rep = NULL;
    size_t rep_len = 0;
    FILE *m = open_memstream(&rep, &rep_len);
    mt_chat_pack_report(&s, "W: ", m);
    fclose(m);
    printf("%s", rep);
    char want[4200];
    snprintf(want, sizeof want, "W: 3 line(s) that are not a JSON object skipped (first: %s line 2: ", in);
    assert_non_null(strstr(rep, want));
    snprintf(want, sizeof want, "W: 1 line(s) that are not valid UTF-8 skipped (first: %s line 11)", in);
    assert_non_null(strstr(rep, want));
    int lines = 0;
    for (char *p = rep; *p; p++) lines += *p == '\n';
    assert_int_equal(lines, 7);
    free(rep);

    /* loss on all: the conversation without an assistant reply is kept */
    assert_int_equal(pack(qwen, in, out, "chatml", MT_CHAT_LOSS_ALL, 64, MT_LONG_TRUNCATE, &s), MT_OK);
    expect_issue(&s.no_assistant, 0, 0, "no assistant (loss on all)");
    assert_int_equal(s.conversations, 5);
    /* Llama 2 cannot write two user turns in a row */
    assert_int_equal(pack(llama2, in, out, "llama2", MT_CHAT_LOSS_ASSISTANT, 64, MT_LONG_TRUNCATE, &s), MT_OK);
    expect_issue(&s.bad_order, 1, 18, "bad order");
    assert_non_null(strstr(s.bad_order_error, "message 1: role \"user\""));
    assert_int_equal(s.conversations, 3);

    /* nothing usable: an error naming the output, and no file */
    write_file(in, "nope\n{\"messages\": []}\n");
    unlink(out);
    assert_int_equal(pack(qwen, in, out, "chatml", MT_CHAT_LOSS_ASSISTANT, 64, MT_LONG_TRUNCATE, &s), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "no conversation to train on"));
    assert_non_null(strstr(mt_error_message(), "1 not JSON"));
    assert_int_equal(access(out, F_OK), -1);
    /* a tokenizer without the format's special tokens: one error, not a count per line */
    write_file(in, GOOD);
    assert_int_equal(pack(qwen, in, out, "llama3", MT_CHAT_LOSS_ASSISTANT, 64, MT_LONG_TRUNCATE, &s), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "chat format llama3"));
    assert_non_null(strstr(mt_error_message(), "<|begin_of_text|>"));
    /* detection */
    assert_true(mt_chat_jsonl_detect(in));
    write_file(in, "\n  \nnot json\n{\"text\": \"x\"}\n" GOOD);
    assert_false(mt_chat_jsonl_detect(in));
    write_file(in, "not json\n" GOOD);
    assert_true(mt_chat_jsonl_detect(in));
    mt_tokenizer_free(qwen);
    mt_tokenizer_free(llama2);
    mt_test_rmtree(dir);
    free(dir);
}

/* --long: a 12-token row; conversations of known length */
static void test_long_policy(void **state) {
    (void)state;
    char *dir = mt_test_tmpdir(), in[4096], out[4096];
    snprintf(in, sizeof in, "%s/long.jsonl", dir);
    snprintf(out, sizeof out, "%s/long.packed", dir);
    mt_tokenizer *tok = load_tok("tokenizers/llama3");
    /* llama3: bos + 2 x (header 3 tokens + content + eot): "a"/"b" is 11 tokens */
    write_file(in, GOOD /* short */
               "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": "
               "\"a long answer with quite a few words in it\"}]}\n" /* long, trained early */
               "{\"messages\": [{\"role\": \"user\", \"content\": \"a long question with quite a few words in "
               "it before any answer comes\"}, {\"role\": \"assistant\", \"content\": \"ok\"}]}\n" /* long, trained late */);
    mt_token_vec ids = {0};
    mt_chat_mask mask = {0};
    mt_chat_message short_conv[] = {{"user", "hi"}, {"assistant", "yo"}};
    assert_int_equal(mt_chat_render(tok, NULL, short_conv, 2, &ids, &mask), MT_OK);
    size_t short_n = ids.n;
    const int T = (int)short_n + 4; /* the short one fits, the others do not */
    printf("short conversation: %zu tokens, T %d\n", short_n, T);
    mt_chat_pack_stats s;
    assert_int_equal(pack(tok, in, out, "llama3", MT_CHAT_LOSS_ASSISTANT, T, MT_LONG_TRUNCATE, &s), MT_OK);
    expect_issue(&s.long_truncated, 1, 2, "truncated");
    expect_issue(&s.long_untrained, 1, 3, "truncated to nothing trained");
    expect_issue(&s.long_skipped, 0, 0, "skipped");
    assert_int_equal(s.conversations, 2);
    assert_int_equal(s.tokens, (int64_t)short_n + T);
    assert_int_equal(pack(tok, in, out, "llama3", MT_CHAT_LOSS_ASSISTANT, T, MT_LONG_SKIP, &s), MT_OK);
    expect_issue(&s.long_skipped, 2, 2, "skipped");
    expect_issue(&s.long_truncated, 0, 0, "truncated (skip)");
    assert_int_equal(s.conversations, 1);
    assert_int_equal(s.tokens, (int64_t)short_n);
    mt_long_policy lp;
    assert_int_equal(mt_long_policy_parse("skip", &lp), MT_OK);
    assert_int_equal(lp, MT_LONG_SKIP);
    assert_int_equal(mt_long_policy_parse("cut", &lp), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "--long \"cut\""));
    mt_token_vec_free(&ids);
    mt_chat_mask_free(&mask);
    mt_tokenizer_free(tok);
    mt_test_rmtree(dir);
    free(dir);
}

/* Packed rows of real conversations (several per row; split: some cut across rows; whole: padding)
 * through the runner: the summed loss and every gradient equal those of each document run alone. */
static void rows_equal_documents(mt_pack_policy pp) {
    char *dir = mt_test_tmpdir(), in[4096], out[4096];
    snprintf(in, sizeof in, "%s/chat.jsonl", dir);
    snprintf(out, sizeof out, "%s/chat.packed", dir);
    ref_group g;
    load_group("tokenizers/qwen2", "chatml", in, &g);
    mt_tokenizer *tok = load_tok("tokenizers/qwen2");
    const int T = 64;
    mt_chat_pack_stats s;
    assert_int_equal(pack_as(tok, in, out, "chatml", MT_CHAT_LOSS_ASSISTANT, T, MT_LONG_TRUNCATE, pp, &s), MT_OK);
    mt_packed_file f;
    assert_int_equal(mt_packed_open(&f, out, T, 0), MT_OK);
    int B = (int)f.rows;
    int32_t *in_ids = malloc((size_t)B * T * 4), *tg = malloc((size_t)B * T * 4), *ds = malloc((size_t)B * T * 4);
    mt_packed_eval_batch(&f, 0, B, in_ids, tg, ds);
    int multi = 0, total = 0;
    for (int i = 0; i < B * T; i++) multi += i % T > 0 && ds[i] == i % T, total += tg[i] >= 0;
    assert_true(multi >= 2 && total > 0); /* rows that really hold several documents */

    mt_config cfg = mt_test_tiny_config("qwen2_bias_tied");
    cfg.V = mt_tokenizer_vocab_size(tok);
    cfg.max_position_embeddings = T;
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    float *w = mt_aligned_alloc((size_t)t.total * sizeof(float));
    mt_param_init(&t, w, 0.3f, 11);
    size_t nb = (size_t)t.total * sizeof(float);
    float *g_packed = mt_aligned_alloc(nb), *g_sep = mt_aligned_alloc(nb);
    memset(g_packed, 0, nb), memset(g_sep, 0, nb);
    float scale = 1.0f / (float)total;
    mt_backend *be = mt_backend_cpu_create();
    mt_runner r;
    mt_runner_init(&r, &t, be, B, T);
    assert_int_equal(mt_runner_set_documents(&r, ds), MT_OK);
    int64_t count;
    double packed = mt_runner_step(&r, w, g_packed, in_ids, tg, B, scale, &count);
    mt_runner_free(&r);
    double separate = 0;
    int docs = 0;
    for (int i = 0; i < B * T;) {
        int j = i + 1;
        while (j < B * T && j % T != 0 && ds[j] == ds[i]) j++;
        mt_runner_init(&r, &t, be, 1, j - i);
        separate += mt_runner_step(&r, w, g_sep, in_ids + i, tg + i, 1, scale, &count);
        mt_runner_free(&r);
        docs++;
        i = j;
    }
    printf("--pack %s, %d rows of %d, %d documents: summed loss packed %.8f, one by one %.8f\n",
           mt_pack_policy_name(pp), B, T, docs, packed, separate);
    assert_true(fabs(packed - separate) <= 1e-5 * fabs(separate));
    int ok = 1;
    for (int i = 0; i < t.n_params; i++) {
        const mt_param *p = &t.params[i];
        ok &= mt_check_rel(p->name, g_packed + p->offset, g_sep + p->offset, (size_t)p->numel, 1e-5);
    }
    assert_true(ok);
    be->destroy(be);
    free(w), free(g_packed), free(g_sep), free(in_ids), free(tg), free(ds);
    mt_param_table_free(&t);
    mt_packed_close(&f);
    mt_tokenizer_free(tok);
    free_group(&g);
    mt_test_rmtree(dir);
    free(dir);
}

static void test_rows_equal_documents_whole(void **state) {
    (void)state;
    rows_equal_documents(MT_PACK_WHOLE);
}

static void test_rows_equal_documents_split(void **state) {
    (void)state;
    rows_equal_documents(MT_PACK_SPLIT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_conversations),
        cmocka_unit_test(test_whole_rows),
        cmocka_unit_test(test_rows_cut_conversations),
        cmocka_unit_test(test_bad_input_counted),
        cmocka_unit_test(test_long_policy),
        cmocka_unit_test(test_rows_equal_documents_whole),
        cmocka_unit_test(test_rows_equal_documents_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
