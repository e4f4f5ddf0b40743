/* Chat JSONL -> packed rows (see chat_pack.h). Lines are parsed and checked in order, rendered in
 * parallel batches, and packed in order. */
#include "data/chat_pack.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "io/lines.h"
#include "data/packed.h"
#include "data/text_data.h"
#include "data/tokens.h"

#define CP_MAX_BATCH 16384 /* conversations rendered per parallel batch (or MT_TEXT_BATCH_BYTES) */
#define CP_DETECT_LINES 10000

int mt_long_policy_parse(const char *s, mt_long_policy *out) {
    if (s && strcmp(s, "truncate") == 0) *out = MT_LONG_TRUNCATE;
    else if (s && strcmp(s, "skip") == 0) *out = MT_LONG_SKIP;
    else return mt_error_set("unknown --long \"%s\" (expected truncate or skip)", s ? s : "(null)");
    return MT_OK;
}

const char *mt_long_policy_name(mt_long_policy p) { return p == MT_LONG_SKIP ? "skip" : "truncate"; }

/* What became of a line (the kinds of chat_pack.h), decided in the parallel phase. */
typedef enum {
    CP_KEEP = 0, CP_INVALID_UTF8, CP_BAD_JSON, CP_NO_MESSAGES, CP_EMPTY, CP_BAD_MESSAGE, CP_UNKNOWN_ROLE,
    CP_BAD_ORDER, CP_NO_ASSISTANT,
} cp_kind;

typedef struct {
    char *text; /* the line (owned) */
    size_t len;
    const char *path;
    int64_t line;
    cp_kind kind;
    json_t *root; /* owns the strings msgs point into */
    mt_chat_message *msgs;
    size_t n;
    mt_token_vec ids;
    mt_chat_mask mask;
    char err[256]; /* jansson's or the renderer's message */
} cp_conv;

typedef struct {
    const mt_tokenizer *tok;
    mt_chat_opts copts;
    const mt_chat_pack_opts *o;
    mt_chat_pack_stats *s;
    mt_packed_writer w;
    cp_conv *convs;
    int n_convs;
    size_t batch_bytes;
    int64_t total_bytes;
    double t0;
} cp_run;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void note(mt_chat_issue *i, const char *path, int64_t line) {
    if (i->n++ == 0) i->path = path, i->line = line;
}

/* ---- one line: checked and rendered (in parallel: reads only shared state) ---- */

static cp_kind check_messages(json_t *msgs, mt_chat_message *m, mt_chat_loss_on loss_on) {
    size_t n = json_array_size(msgs);
    int has_assistant = 0, has_text = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(msgs, i);
        json_t *role = json_object_get(e, "role"), *content = json_object_get(e, "content");
        if (!json_is_object(e) || !json_is_string(role) || !json_is_string(content)) return CP_BAD_MESSAGE;
        m[i].role = json_string_value(role);
        m[i].content = json_string_value(content);
        int assistant = strcmp(m[i].role, "assistant") == 0;
        if (!assistant && strcmp(m[i].role, "user") != 0 && strcmp(m[i].role, "system") != 0)
            return CP_UNKNOWN_ROLE;
        has_assistant |= assistant;
        has_text |= !mt_text_only_space(m[i].content, json_string_length(content));
    }
    if (!has_text) return CP_EMPTY;
    if (loss_on == MT_CHAT_LOSS_ASSISTANT && !has_assistant) return CP_NO_ASSISTANT;
    return CP_KEEP;
}

static cp_kind parse_line(cp_conv *c, mt_chat_loss_on loss_on) {
    if (!mt_text_utf8_valid((const unsigned char *)c->text, c->len)) return CP_INVALID_UTF8;
    json_error_t err;
    c->root = json_loadb(c->text, c->len, 0, &err);
    if (!json_is_object(c->root)) {
        snprintf(c->err, sizeof c->err, "%s", c->root ? "not a JSON object" : err.text);
        return CP_BAD_JSON;
    }
    json_t *msgs = json_object_get(c->root, "messages");
    if (!json_is_array(msgs)) return CP_NO_MESSAGES;
    if (json_array_size(msgs) == 0) return CP_EMPTY;
    c->n = json_array_size(msgs);
    c->msgs = mt_malloc(c->n * sizeof *c->msgs);
    return check_messages(msgs, c->msgs, loss_on);
}

static void parse_and_render(const cp_run *r, cp_conv *c) {
    c->kind = parse_line(c, r->copts.loss_on);
    if (c->kind != CP_KEEP) return;
    if (mt_chat_render(r->tok, &r->copts, c->msgs, c->n, &c->ids, &c->mask) != MT_OK) {
        snprintf(c->err, sizeof c->err, "%s", mt_error_message());
        c->kind = CP_BAD_ORDER;
    }
}

/* ---- a batch: rendered in parallel, packed in order ---- */

static int has_trained(const uint8_t *mask, size_t n) {
    for (size_t i = 1; i < n; i++)
        if (mask[i]) return 1;
    return 0;
}

static mt_chat_issue *issue_of(mt_chat_pack_stats *s, cp_kind k) {
    switch (k) {
    case CP_INVALID_UTF8: return &s->invalid_utf8;
    case CP_BAD_JSON: return &s->bad_json;
    case CP_NO_MESSAGES: return &s->no_messages;
    case CP_EMPTY: return &s->empty;
    case CP_BAD_MESSAGE: return &s->bad_message;
    case CP_UNKNOWN_ROLE: return &s->unknown_role;
    case CP_BAD_ORDER: return &s->bad_order;
    case CP_NO_ASSISTANT: return &s->no_assistant;
    default: MT_CHECK(0, "kind %d", (int)k);
    }
}

static int pack_one(cp_run *r, cp_conv *c) {
    mt_chat_pack_stats *s = r->s;
    if (c->kind != CP_KEEP) {
        mt_chat_issue *i = issue_of(s, c->kind);
        if (i->n == 0 && c->kind == CP_BAD_JSON) snprintf(s->bad_json_error, sizeof s->bad_json_error, "%s", c->err);
        if (i->n == 0 && c->kind == CP_BAD_ORDER) snprintf(s->bad_order_error, sizeof s->bad_order_error, "%s", c->err);
        note(i, c->path, c->line);
        return MT_OK;
    }
    size_t n = c->ids.n;
    if (n > (size_t)r->o->T) {
        if (r->o->long_policy == MT_LONG_SKIP) return note(&s->long_skipped, c->path, c->line), MT_OK;
        n = (size_t)r->o->T;
        if (!has_trained(c->mask.v, n)) return note(&s->long_untrained, c->path, c->line), MT_OK;
        note(&s->long_truncated, c->path, c->line);
    }
    MT_TRY(mt_packed_writer_add(&r->w, c->ids.ids, c->mask.v, n));
    s->conversations++;
    s->tokens += (int64_t)n;
    return MT_OK;
}

static void free_conv(cp_conv *c) {
    mt_token_vec_free(&c->ids);
    mt_chat_mask_free(&c->mask);
    free(c->msgs);
    json_decref(c->root);
    free(c->text);
}

static int flush_batch(cp_run *r) {
    cp_conv *convs = r->convs;
    int n = r->n_convs;
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
    for (int i = 0; i < n; i++) parse_and_render(r, &convs[i]);
    int rc = MT_OK;
    for (int i = 0; i < n; i++) {
        if (rc == MT_OK) rc = pack_one(r, &convs[i]);
        free_conv(&convs[i]);
    }
    r->n_convs = 0;
    r->batch_bytes = 0;
    r->s->seconds = now_s() - r->t0;
    if (rc == MT_OK && r->o->progress) r->o->progress(r->s, r->total_bytes, 0, r->o->progress_user);
    return rc;
}

/* Lines are only collected here; parsing them is part of the parallel work. */
static int read_file(cp_run *r, mt_lines *L) {
    const char *line;
    size_t len;
    int rc = MT_OK, got;
    while (rc == MT_OK && (got = mt_lines_next(L, &line, &len)) > 0) {
        r->s->bytes += (int64_t)len;
        if (mt_text_only_space(line, len)) continue;
        char *text = mt_malloc(len + 1);
        memcpy(text, line, len);
        text[len] = 0;
        r->convs[r->n_convs++] = (cp_conv){.text = text, .len = len, .path = L->path, .line = L->lineno};
        r->batch_bytes += len;
        if (r->n_convs == CP_MAX_BATCH || r->batch_bytes >= MT_TEXT_BATCH_BYTES) rc = flush_batch(r);
    }
    return rc == MT_OK && got < 0 ? MT_ERR : rc;
}

/* ---- driver ---- */

static int setup(cp_run *r, const char *const *paths, int n, const char *out_path) {
    const mt_chat_pack_opts *o = r->o;
    if (n < 1) return mt_error_set("%s: no input files given", out_path);
    if (o->T < 1) return mt_error_set("%s: --seq %d is not a sequence length", out_path, o->T);
    mt_chat_format f = o->format == MT_CHAT_AUTO ? mt_chat_format_for(r->tok) : o->format;
    r->copts = (mt_chat_opts){.format = f, .loss_on = o->loss_on, .default_system = NULL};
    r->s->format = f;
    /* the format's special tokens, once, rather than a failure on every line */
    mt_chat_message probe[] = {{"user", "a"}, {"assistant", "b"}};
    mt_token_vec ids = {0};
    mt_chat_mask mask = {0};
    int rc = mt_chat_render(r->tok, &r->copts, probe, 2, &ids, &mask);
    mt_token_vec_free(&ids);
    mt_chat_mask_free(&mask);
    if (rc != MT_OK) {
        char why[512]; /* a copy: the message buffer is rewritten below */
        snprintf(why, sizeof why, "%s", mt_error_message());
        return mt_error_set("%s: chat format %s: %s (choose another with --chat-format)", out_path,
                            mt_chat_format_name(f), why);
    }
    return mt_lines_total_bytes(paths, n, &r->total_bytes);
}

static int no_conversation(const cp_run *r, const char *const *paths, int n, const char *out_path) {
    const mt_chat_pack_stats *s = r->s;
    return mt_error_set("%s: no conversation to train on in the %d input file(s) (first %s): %lld not JSON, "
                        "%lld invalid UTF-8, %lld without \"messages\", %lld empty, %lld bad messages, %lld "
                        "unknown roles, %lld not renderable, %lld without an assistant reply, %lld too long",
                        out_path, n, paths[0], (long long)s->bad_json.n, (long long)s->invalid_utf8.n,
                        (long long)s->no_messages.n, (long long)s->empty.n, (long long)s->bad_message.n,
                        (long long)s->unknown_role.n, (long long)s->bad_order.n, (long long)s->no_assistant.n,
                        (long long)(s->long_skipped.n + s->long_untrained.n));
}

int mt_chat_pack(const mt_tokenizer *tok, const char *const *paths, int n, const char *out_path,
                 const mt_chat_pack_opts *opts, mt_chat_pack_stats *stats) {
    mt_chat_pack_stats local;
    cp_run r = {.tok = tok, .o = opts, .s = stats ? stats : &local, .t0 = now_s()};
    memset(r.s, 0, sizeof *r.s);
    MT_TRY(setup(&r, paths, n, out_path));
    int vocab = mt_tokenizer_vocab_size(tok), eos = mt_tokenizer_eos(tok);
    MT_TRY(mt_packed_writer_open(&r.w, out_path, opts->T, vocab, mt_tokens_elem_size_for_vocab(vocab),
                                 eos >= 0 ? eos : 0, opts->pack));
    r.convs = mt_malloc(CP_MAX_BATCH * sizeof *r.convs);
    int rc = MT_OK;
    for (int i = 0; rc == MT_OK && i < n; i++) {
        mt_lines L;
        if ((rc = mt_lines_open(&L, paths[i])) != MT_OK) break;
        rc = read_file(&r, &L);
        mt_lines_close(&L);
    }
    if (rc == MT_OK && r.n_convs) rc = flush_batch(&r);
    for (int i = 0; i < r.n_convs; i++) free_conv(&r.convs[i]); /* left by an error */
    free(r.convs);
    if (rc == MT_OK && r.s->conversations == 0) rc = no_conversation(&r, paths, n, out_path);
    if (rc == MT_OK) {
        rc = mt_packed_writer_commit(&r.w);
        r.s->trained = r.w.trained, r.s->rows = r.w.rows, r.s->padded = r.w.padded;
    } else {
        mt_packed_writer_abort(&r.w);
    }
    r.s->seconds = now_s() - r.t0;
    if (rc == MT_OK && opts->progress) opts->progress(r.s, r.total_bytes, 1, opts->progress_user);
    return rc;
}

int mt_chat_jsonl_detect(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int found = -1;
    for (int i = 0; found < 0 && i < CP_DETECT_LINES && (len = getline(&line, &cap, f)) >= 0; i++) {
        json_t *j = json_loadb(line, (size_t)len, 0, NULL);
        if (json_is_object(j)) found = json_object_get(j, "messages") != NULL;
        json_decref(j);
    }
    free(line);
    fclose(f);
    return found == 1;
}

/* ---- reporting ---- */

static void report_one(FILE *out, const char *prefix, const mt_chat_issue *i, const char *what,
                       const char *detail) {
    if (!i->n) return;
    fprintf(out, "%s%lld %s (first: %s line %lld%s%s)\n", prefix, (long long)i->n, what, i->path,
            (long long)i->line, detail ? ": " : "", detail ? detail : "");
}

void mt_chat_pack_report(const mt_chat_pack_stats *s, const char *prefix, FILE *out) {
    report_one(out, prefix, &s->invalid_utf8, "line(s) that are not valid UTF-8 skipped", NULL);
    report_one(out, prefix, &s->bad_json, "line(s) that are not a JSON object skipped", s->bad_json_error);
    report_one(out, prefix, &s->no_messages, "object(s) without a \"messages\" array skipped", NULL);
    report_one(out, prefix, &s->empty, "empty conversation(s) (no message, or only empty content) skipped", NULL);
    report_one(out, prefix, &s->bad_message, "conversation(s) with a message lacking a string \"role\" or "
               "\"content\" skipped", NULL);
    report_one(out, prefix, &s->unknown_role, "conversation(s) with a role other than system, user and "
               "assistant skipped", NULL);
    report_one(out, prefix, &s->bad_order, "conversation(s) the chat format cannot write skipped",
               s->bad_order_error);
    report_one(out, prefix, &s->no_assistant, "conversation(s) without an assistant reply skipped "
               "(--loss-on assistant: nothing to train)", NULL);
    report_one(out, prefix, &s->long_skipped, "conversation(s) longer than --seq skipped (--long skip)", NULL);
    report_one(out, prefix, &s->long_truncated, "conversation(s) longer than --seq truncated to --seq "
               "tokens (--long truncate)", NULL);
    report_one(out, prefix, &s->long_untrained, "conversation(s) longer than --seq with no trained token "
               "in the first --seq tokens skipped", NULL);
}

void mt_chat_pack_summary(const mt_chat_pack_stats *s, const mt_chat_pack_opts *o, const char *in,
                          const char *out, FILE *f) {
    double positions = (double)s->rows * o->T, share = positions > 0 ? 100.0 / positions : 0.0;
    fprintf(f, "%s: %lld conversations (%s, loss on %s) -> %lld rows of %d tokens (--pack %s: %lld padding tokens, "
            "%.1f%% of the positions), %lld trained targets (%.1f%% of the positions) -> %s (%.0f tokens/s)\n", in,
            (long long)s->conversations, mt_chat_format_name(s->format),
            o->loss_on == MT_CHAT_LOSS_ALL ? "all" : "assistant", (long long)s->rows, o->T,
            mt_pack_policy_name(o->pack), (long long)s->padded, share * s->padded, (long long)s->trained,
            share * s->trained, out, s->seconds > 0 ? s->tokens / s->seconds : 0.0);
}

void mt_chat_progress_stderr(const mt_chat_pack_stats *s, int64_t total_bytes, int done, void *user) {
    (void)user;
    mt_lines_progress("pack", s->bytes, total_bytes, s->conversations, "conversations", s->tokens, s->seconds, done);
}
