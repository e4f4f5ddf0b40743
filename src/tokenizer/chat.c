/* Chat formats: see chat.h (Gemma and Harmony are rendered in chat_more.c). */
#define MT_CHAT_INTERNAL
#include "tokenizer/chat.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* ---- small growable buffers ---- */

static void ids_push(mt_token_vec *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 256;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        MT_CHECK(p != NULL, "out of memory");
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
}

static void mask_push(mt_chat_mask *m, uint8_t x) {
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 256;
        uint8_t *p = realloc(m->v, cap);
        MT_CHECK(p != NULL, "out of memory");
        m->v = p;
        m->cap = cap;
    }
    m->v[m->n++] = x;
}

void mt_chat_mask_free(mt_chat_mask *m) {
    free(m->v);
    m->v = NULL;
    m->n = m->cap = 0;
}

typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t len) {
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + len + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        MT_CHECK(p != NULL, "out of memory");
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = 0;
}

/* ---- formats ---- */

mt_chat_format mt_chat_format_for(const mt_tokenizer *t) {
    int inst_token = mt_tokenizer_token_id(t, "[INST]") >= 0;
    const char *tmpl = mt_tokenizer_chat_template(t);
    if (tmpl) {
        /* the markers each family's template writes (never executed, only recognised) */
        if (strstr(tmpl, "<|im_start|>")) {
            int qwen3 = strstr(tmpl, "reasoning_content") && strstr(tmpl, "<think>");
            return qwen3 ? MT_CHAT_QWEN3 : MT_CHAT_CHATML;
        }
        if (strstr(tmpl, "<|start_header_id|>")) return MT_CHAT_LLAMA3;
        if (strstr(tmpl, "<<SYS>>")) return MT_CHAT_LLAMA2;
        if (strstr(tmpl, "[INST]")) return inst_token ? MT_CHAT_MISTRAL_V3 : MT_CHAT_MISTRAL;
        if (strstr(tmpl, "<start_of_turn>")) return MT_CHAT_GEMMA;
        if (strstr(tmpl, "<|start|>") && strstr(tmpl, "<|channel|>")) return MT_CHAT_HARMONY;
    }
    if (mt_tokenizer_token_id(t, "<|im_start|>") >= 0) return MT_CHAT_CHATML;
    if (mt_tokenizer_token_id(t, "<|eot_id|>") >= 0) return MT_CHAT_LLAMA3;
    if (inst_token) return MT_CHAT_MISTRAL_V3;
    if (mt_tokenizer_token_id(t, "<|start|>") >= 0 && mt_tokenizer_token_id(t, "<|channel|>") >= 0)
        return MT_CHAT_HARMONY;
    /* Gemma 4's template (<|turn>...<turn|>) is another format: not Gemma 3's by its tokens */
    if (mt_tokenizer_token_id(t, "<start_of_turn>") >= 0 && !(tmpl && strstr(tmpl, "<|turn>")))
        return MT_CHAT_GEMMA;
    return MT_CHAT_LLAMA2;
}

#define N_FORMATS (MT_CHAT_HARMONY + 1)
static const char *const FORMAT_NAMES[N_FORMATS] = {"auto",       "chatml", "llama3", "llama2",  "mistral",
                                                    "mistral-v3", "qwen3",  "gemma",  "harmony"};

const char *mt_chat_format_name(mt_chat_format f) {
    if ((int)f < 0 || (int)f >= N_FORMATS) return "?";
    return FORMAT_NAMES[f];
}

int mt_chat_format_parse(const char *s, mt_chat_format *out) {
    for (int i = 0; i < N_FORMATS; i++)
        if (s && strcmp(s, FORMAT_NAMES[i]) == 0) {
            *out = (mt_chat_format)i;
            return MT_OK;
        }
    return mt_error_set("unknown chat format \"%s\" (expected auto, chatml, llama3, llama2, mistral, "
                        "mistral-v3, qwen3, gemma or harmony)", s ? s : "(null)");
}

int mt_chat_loss_on_parse(const char *s, mt_chat_loss_on *out) {
    if (s && strcmp(s, "assistant") == 0) *out = MT_CHAT_LOSS_ASSISTANT;
    else if (s && strcmp(s, "all") == 0) *out = MT_CHAT_LOSS_ALL;
    else return mt_error_set("unknown loss-on \"%s\" (expected assistant or all)", s ? s : "(null)");
    return MT_OK;
}

/* ---- Python str.strip(): Unicode whitespace (str.isspace) at both ends ---- */

static int is_py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Decodes one UTF-8 character at s[0..n) into *c; returns its length (1 for an invalid byte,
 * which is never whitespace). */
static size_t utf8_at(const unsigned char *s, size_t n, uint32_t *c) {
    unsigned b = s[0];
    size_t len;
    uint32_t v;
    if (b < 0x80) { *c = b; return 1; }
    if ((b & 0xE0) == 0xC0) { len = 2; v = b & 0x1F; }
    else if ((b & 0xF0) == 0xE0) { len = 3; v = b & 0x0F; }
    else if ((b & 0xF8) == 0xF0) { len = 4; v = b & 0x07; }
    else { *c = 0xFFFFFFFF; return 1; }
    if (len > n) { *c = 0xFFFFFFFF; return 1; }
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) { *c = 0xFFFFFFFF; return 1; }
        v = (v << 6) | (s[i] & 0x3F);
    }
    *c = v;
    return len;
}

#define py_strip mt_chat_py_strip
void py_strip(const char *s, size_t n, size_t *start, size_t *end) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, e = n;
    while (a < e) {
        uint32_t c;
        size_t l = utf8_at(u + a, e - a, &c);
        if (!is_py_space(c)) break;
        a += l;
    }
    while (e > a) {
        size_t b = e - 1;
        while (b > a && (u[b] & 0xC0) == 0x80 && e - b < 4) b--;
        uint32_t c;
        size_t l = utf8_at(u + b, e - b, &c);
        if (b + l != e || !is_py_space(c)) break;
        e = b;
    }
    *start = a;
    *end = e;
}

/* ---- rendering: a sequence of items, each a special token or a text run ---- */

typedef struct {
    int special;         /* token id, or -1 for a text run */
    size_t off, len;     /* text run: bytes in the builder's text buffer */
    size_t assist_start; /* text run: offset in the run where assistant text starts; SIZE_MAX: none */
    int assist;          /* special: trained under LOSS_ASSISTANT */
} item;

typedef struct mt_chat_builder {
    const mt_tokenizer *t;
    sbuf text;
    item *items;
    size_t n, cap;
    int open; /* the last item is a text run still being written */
} builder;

static item *b_new(builder *b) {
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 32;
        b->items = realloc(b->items, b->cap * sizeof *b->items);
        MT_CHECK(b->items != NULL, "out of memory");
    }
    item *it = &b->items[b->n++];
    memset(it, 0, sizeof *it);
    return it;
}

#define b_text mt_chat_b_text
#define b_str mt_chat_b_str
#define b_special mt_chat_b_special

void b_text(builder *b, const char *s, size_t len, int assist) {
    if (len == 0) return;
    if (!b->open) {
        item *it = b_new(b);
        it->special = -1;
        it->off = b->text.n;
        it->assist_start = SIZE_MAX;
        b->open = 1;
    }
    item *it = &b->items[b->n - 1];
    if (assist && it->assist_start == SIZE_MAX) it->assist_start = it->len;
    MT_CHECK(assist || it->assist_start == SIZE_MAX, "non-assistant text after assistant text");
    sb_add(&b->text, s, len);
    it->len += len;
}

void b_str(builder *b, const char *s, int assist) { b_text(b, s, strlen(s), assist); }

int b_special(builder *b, const char *name, int assist) {
    int id = mt_tokenizer_token_id(b->t, name);
    if (id < 0) return mt_error_set("chat format needs the special token %s, which the tokenizer lacks", name);
    item *it = b_new(b);
    it->special = id;
    it->assist = assist;
    b->open = 0;
    return MT_OK;
}

int mt_chat_role_kind(const char *r) {
    if (strcmp(r, "system") == 0) return 0;
    if (strcmp(r, "user") == 0) return 1;
    if (strcmp(r, "assistant") == 0) return 2;
    if (strcmp(r, "developer") == 0) return 3;
    return -1;
}
#define role_kind mt_chat_role_kind

static int render_chatml(builder *b, const mt_chat_opts *o, const mt_chat_message *m, size_t n) {
    if (o->default_system && role_kind(m[0].role) != 0) {
        MT_TRY(b_special(b, "<|im_start|>", 0));
        b_str(b, "system\n", 0);
        b_str(b, o->default_system, 0);
        MT_TRY(b_special(b, "<|im_end|>", 0));
        b_str(b, "\n", 0);
    }
    for (size_t i = 0; i < n; i++) {
        int a = role_kind(m[i].role) == 2;
        MT_TRY(b_special(b, "<|im_start|>", 0));
        b_str(b, m[i].role, 0);
        b_str(b, "\n", 0);
        b_str(b, m[i].content, a);
        MT_TRY(b_special(b, "<|im_end|>", a));
        b_str(b, "\n", 0);
    }
    return MT_OK;
}

/* Qwen3's template on string contents (see chat.h): Python's s.lstrip('\n') / s.rstrip('\n'). */
static void lstrip_nl(const char **s, size_t *n) {
    while (*n > 0 && **s == '\n') (*s)++, (*n)--;
}
static void rstrip_nl(const char *s, size_t *n) {
    while (*n > 0 && s[*n - 1] == '\n') (*n)--;
}

/* Offset of the last occurrence of pat in s[0..n), or SIZE_MAX. */
static size_t last_of(const char *s, size_t n, const char *pat) {
    size_t pl = strlen(pat);
    for (size_t i = n >= pl ? n - pl + 1 : 0; i-- > 0;)
        if (memcmp(s + i, pat, pl) == 0) return i;
    return SIZE_MAX;
}

/* content with "</think>": content = after the last "</think>", lstrip('\n'); reasoning = before the
 * first "</think>", rstrip('\n'), after the last "<think>" in that, lstrip('\n'). */
int mt_chat_split_think(const char *c, const char **reason, size_t *reason_len, const char **content,
                        size_t *content_len) {
    *content = c;
    *content_len = strlen(c);
    *reason = "";
    *reason_len = 0;
    const char *close = strstr(c, "</think>");
    if (!close) return 0;
    size_t last = last_of(c, *content_len, "</think>") + strlen("</think>");
    *content = c + last;
    *content_len -= last;
    lstrip_nl(content, content_len);
    size_t rl = (size_t)(close - c);
    rstrip_nl(c, &rl);
    size_t open = last_of(c, rl, "<think>");
    *reason = open == SIZE_MAX ? c : c + open + strlen("<think>");
    *reason_len = rl - (size_t)(*reason - c);
    lstrip_nl(reason, reason_len);
    return 1;
}

/* The template's last_query_index: the last user message whose content is not wrapped as
 * "<tool_response>...</tool_response>"; n - 1 when there is none. */
static size_t qwen3_last_query(const mt_chat_message *m, size_t n) {
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    for (size_t i = n; i-- > 0;) {
        if (role_kind(m[i].role) != 1) continue;
        const char *c = m[i].content;
        size_t cl = strlen(c);
        int wrapped = strncmp(c, open, sizeof open - 1) == 0 && cl >= sizeof close - 1 &&
                      strcmp(c + cl - (sizeof close - 1), close) == 0;
        if (!wrapped) return i;
    }
    return n - 1;
}

static int render_qwen3(builder *b, const mt_chat_message *m, size_t n) {
    size_t last_query = qwen3_last_query(m, n);
    for (size_t i = 0; i < n; i++) {
        const char *c = m[i].content;
        MT_TRY(b_special(b, "<|im_start|>", 0));
        b_str(b, m[i].role, 0);
        b_str(b, "\n", 0);
        if (role_kind(m[i].role) != 2) {
            b_str(b, c, 0);
            MT_TRY(b_special(b, "<|im_end|>", 0));
            b_str(b, "\n", 0);
            continue;
        }
        const char *content, *reason;
        size_t content_len, reason_len;
        mt_chat_split_think(c, &reason, &reason_len, &content, &content_len);
        if (i > last_query && (i == n - 1 || reason_len > 0)) {
            rstrip_nl(reason, &reason_len); /* reasoning_content.strip('\n') */
            lstrip_nl(&content, &content_len);
            b_str(b, "<think>\n", 1);
            b_text(b, reason, reason_len, 1);
            b_str(b, "\n</think>\n\n", 1);
        }
        b_text(b, content, content_len, 1);
        MT_TRY(b_special(b, "<|im_end|>", 1));
        b_str(b, "\n", 0);
    }
    return MT_OK;
}

static int render_llama3(builder *b, const mt_chat_message *m, size_t n) {
    MT_TRY(b_special(b, "<|begin_of_text|>", 0));
    for (size_t i = 0; i < n; i++) {
        int a = role_kind(m[i].role) == 2;
        MT_TRY(b_special(b, "<|start_header_id|>", 0));
        b_str(b, m[i].role, 0);
        MT_TRY(b_special(b, "<|end_header_id|>", 0));
        b_str(b, "\n\n", 0);
        size_t s, e;
        py_strip(m[i].content, strlen(m[i].content), &s, &e);
        b_text(b, m[i].content + s, e - s, a);
        MT_TRY(b_special(b, "<|eot_id|>", a));
    }
    return MT_OK;
}

/* Llama 2, Mistral and Gemma: an optional first system message, then user/assistant alternating. */
static int check_alternating(const mt_chat_message *m, size_t n, mt_chat_format f) {
    size_t first = role_kind(m[0].role) == 0 ? 1 : 0;
    for (size_t i = first; i < n; i++) {
        int want = (i - first) % 2 == 0 ? 1 : 2;
        if (role_kind(m[i].role) != want)
            return mt_error_set("message %zu: role \"%s\" where %s expects \"%s\" (%s: an optional first "
                                "system message, then user/assistant alternating)",
                                i, m[i].role, mt_chat_format_name(f), want == 1 ? "user" : "assistant",
                                mt_chat_format_name(f));
    }
    return MT_OK;
}

static int render_llama2(builder *b, const mt_chat_message *m, size_t n) {
    size_t first = role_kind(m[0].role) == 0 ? 1 : 0;
    sbuf tmp = {0};
    int rc = MT_OK;
    for (size_t i = first; i < n && rc == MT_OK; i++) {
        tmp.n = 0;
        if (i == first && first == 1) {
            sb_add(&tmp, "<<SYS>>\n", 8);
            sb_add(&tmp, m[0].content, strlen(m[0].content));
            sb_add(&tmp, "\n<</SYS>>\n\n", 11);
        }
        sb_add(&tmp, m[i].content, strlen(m[i].content));
        size_t s, e;
        py_strip(tmp.p, tmp.n, &s, &e);
        if (role_kind(m[i].role) == 1) {
            if ((rc = b_special(b, "<s>", 0)) != MT_OK) break;
            b_str(b, "[INST] ", 0);
            b_text(b, tmp.p + s, e - s, 0);
            b_str(b, " [/INST]", 0);
        } else {
            b_str(b, " ", 1);
            b_text(b, tmp.p + s, e - s, 1);
            b_str(b, " ", 1);
            rc = b_special(b, "</s>", 1);
        }
    }
    free(tmp.p);
    return rc;
}

static int render_mistral(builder *b, const mt_chat_message *m, size_t n) {
    size_t first = role_kind(m[0].role) == 0 ? 1 : 0;
    MT_TRY(b_special(b, "<s>", 0));
    for (size_t i = first; i < n; i++) {
        if (role_kind(m[i].role) == 1) {
            b_str(b, " [INST] ", 0);
            if (i == first && first == 1) {
                b_str(b, m[0].content, 0);
                b_str(b, "\n\n", 0);
            }
            b_str(b, m[i].content, 0);
            b_str(b, " [/INST]", 0);
        } else {
            b_str(b, " ", 1);
            b_str(b, m[i].content, 1);
            MT_TRY(b_special(b, "</s>", 1));
        }
    }
    return MT_OK;
}

/* Mistral v0.3: [INST] and [/INST] are tokens; the system message goes before the last user
 * message's text; the assistant text is trimmed. */
static int render_mistral_v3(builder *b, const mt_chat_message *m, size_t n) {
    size_t first = role_kind(m[0].role) == 0 ? 1 : 0, last_user = first;
    for (size_t i = first; i < n; i++)
        if (role_kind(m[i].role) == 1) last_user = i;
    MT_TRY(b_special(b, "<s>", 0));
    for (size_t i = first; i < n; i++) {
        if (role_kind(m[i].role) == 1) {
            MT_TRY(b_special(b, "[INST]", 0));
            b_str(b, " ", 0);
            if (i == last_user && first == 1) {
                b_str(b, m[0].content, 0);
                b_str(b, "\n\n", 0);
            }
            b_str(b, m[i].content, 0);
            MT_TRY(b_special(b, "[/INST]", 0));
        } else {
            size_t s, e;
            py_strip(m[i].content, strlen(m[i].content), &s, &e);
            b_str(b, " ", 1);
            b_text(b, m[i].content + s, e - s, 1);
            MT_TRY(b_special(b, "</s>", 1));
        }
    }
    return MT_OK;
}

/* ---- encoding ---- */

/* Encodes run text with the neighbouring special tokens as context (so that the tokenizer sees the
 * run exactly as inside the whole rendered string) and appends the run's own ids to out. */
static int encode_run(const mt_tokenizer *t, sbuf *ctx, int prev, const char *s, size_t len, int next,
                      mt_token_vec *tmp, mt_token_vec *out) {
    size_t pl = 0, nl = 0;
    const char *ps = prev >= 0 ? mt_tokenizer_token(t, prev, &pl) : NULL;
    const char *ns = next >= 0 ? mt_tokenizer_token(t, next, &nl) : NULL;
    ctx->n = 0;
    if (ps) sb_add(ctx, ps, pl);
    sb_add(ctx, s, len);
    if (ns) sb_add(ctx, ns, nl);
    tmp->n = 0;
    MT_TRY(mt_tokenizer_encode_into(t, ctx->p, ctx->n, 0, tmp));
    size_t a = 0, e = tmp->n;
    if (ps) {
        if (e == 0 || tmp->ids[0] != prev)
            return mt_error_set("chat: the tokenizer does not keep %.*s as one token before text", (int)pl, ps);
        a = 1;
    }
    if (ns) {
        if (e <= a || tmp->ids[e - 1] != next)
            return mt_error_set("chat: the tokenizer does not keep %.*s as one token after text", (int)nl, ns);
        e--;
    }
    for (size_t i = a; i < e; i++) ids_push(out, tmp->ids[i]);
    return MT_OK;
}

static int encode_items(const mt_tokenizer *t, const builder *b, mt_chat_loss_on loss_on, mt_token_vec *ids,
                        mt_chat_mask *mask) {
    sbuf ctx = {0};
    mt_token_vec tmp = {0}, run = {0}, head = {0};
    int rc = MT_OK;
    for (size_t i = 0; i < b->n && rc == MT_OK; i++) {
        const item *it = &b->items[i];
        if (it->special >= 0) {
            ids_push(ids, it->special);
            mask_push(mask, loss_on == MT_CHAT_LOSS_ALL || it->assist);
            continue;
        }
        int prev = i > 0 ? b->items[i - 1].special : -1;
        int next = i + 1 < b->n ? b->items[i + 1].special : -1;
        const char *s = b->text.p + it->off;
        run.n = 0;
        if ((rc = encode_run(t, &ctx, prev, s, it->len, next, &tmp, &run)) != MT_OK) break;
        size_t k = run.n; /* first assistant token */
        if (loss_on == MT_CHAT_LOSS_ALL || it->assist_start == 0) {
            k = 0;
        } else if (it->assist_start != SIZE_MAX) {
            head.n = 0;
            if ((rc = encode_run(t, &ctx, prev, s, it->assist_start, -1, &tmp, &head)) != MT_OK) break;
            k = 0;
            while (k < head.n && k < run.n && head.ids[k] == run.ids[k]) k++;
        }
        for (size_t j = 0; j < run.n; j++) {
            ids_push(ids, run.ids[j]);
            mask_push(mask, j >= k);
        }
    }
    free(ctx.p);
    free(tmp.ids);
    free(run.ids);
    free(head.ids);
    return rc;
}

int mt_chat_render(const mt_tokenizer *t, const mt_chat_opts *opts, const mt_chat_message *msgs, size_t n,
                   mt_token_vec *ids, mt_chat_mask *mask) {
    mt_chat_opts o = {MT_CHAT_AUTO, MT_CHAT_LOSS_ASSISTANT, NULL, NULL};
    if (opts) o = *opts;
    if (n == 0 || !msgs) return mt_error_set("empty conversation (no messages)");
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role) return mt_error_set("message %zu has no role", i);
        if (!msgs[i].content) return mt_error_set("message %zu (%s) has no content", i, msgs[i].role);
        if (role_kind(msgs[i].role) < 0)
            return mt_error_set("message %zu: unknown role \"%s\" (expected system, user or assistant)", i,
                                msgs[i].role);
    }
    mt_chat_format f = o.format == MT_CHAT_AUTO ? mt_chat_format_for(t) : o.format;
    for (size_t i = 0; i < n && f != MT_CHAT_HARMONY; i++)
        if (role_kind(msgs[i].role) == 3)
            return mt_error_set("message %zu: role \"developer\" in %s (only harmony has it; expected "
                                "system, user or assistant)", i, mt_chat_format_name(f));
    if (f == MT_CHAT_LLAMA2 || f == MT_CHAT_MISTRAL || f == MT_CHAT_MISTRAL_V3 || f == MT_CHAT_GEMMA) {
        MT_TRY(check_alternating(msgs, n, f));
        if (role_kind(msgs[0].role) == 0 && n == 1)
            return mt_error_set("conversation has only a system message (%s)", mt_chat_format_name(f));
    }
    builder b = {.t = t};
    int rc;
    switch (f) {
    case MT_CHAT_CHATML: rc = render_chatml(&b, &o, msgs, n); break;
    case MT_CHAT_LLAMA3: rc = render_llama3(&b, msgs, n); break;
    case MT_CHAT_LLAMA2: rc = render_llama2(&b, msgs, n); break;
    case MT_CHAT_MISTRAL: rc = render_mistral(&b, msgs, n); break;
    case MT_CHAT_MISTRAL_V3: rc = render_mistral_v3(&b, msgs, n); break;
    case MT_CHAT_QWEN3: rc = render_qwen3(&b, msgs, n); break;
    case MT_CHAT_GEMMA: rc = mt_chat_render_gemma(&b, msgs, n); break;
    case MT_CHAT_HARMONY: rc = mt_chat_render_harmony(&b, &o, msgs, n); break;
    default: rc = mt_error_set("unknown chat format %d", (int)f); break;
    }
    size_t n0 = ids->n, m0 = mask->n;
    if (rc == MT_OK) rc = encode_items(t, &b, o.loss_on, ids, mask);
    if (rc != MT_OK) {
        ids->n = n0;
        mask->n = m0;
    }
    MT_CHECK(rc != MT_OK || ids->n - n0 == mask->n - m0, "ids and mask out of step");
    free(b.text.p);
    free(b.items);
    return rc;
}
