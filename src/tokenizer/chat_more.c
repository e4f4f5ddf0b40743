/* Chat formats Gemma (Gemma 3) and Harmony (gpt-oss): see chat.h. The role order is checked by
 * mt_chat_render before these run (Gemma: optional first system, then user/assistant alternating). */
#define MT_CHAT_INTERNAL
#include "tokenizer/chat.h"

#include <string.h>

#include "core/error.h"

/* google/gemma-3-*-it: <bos>, the system message + "\n\n" before the first user text, contents
 * trimmed, "assistant" written "model". */
int mt_chat_render_gemma(mt_chat_builder *b, const mt_chat_message *m, size_t n) {
    size_t first = mt_chat_role_kind(m[0].role) == 0 ? 1 : 0;
    MT_TRY(mt_chat_b_special(b, "<bos>", 0));
    for (size_t i = first; i < n; i++) {
        int a = mt_chat_role_kind(m[i].role) == 2;
        MT_TRY(mt_chat_b_special(b, "<start_of_turn>", 0));
        mt_chat_b_str(b, a ? "model" : m[i].role, 0);
        mt_chat_b_str(b, "\n", 0);
        if (i == first && first == 1) {
            mt_chat_b_str(b, m[0].content, 0);
            mt_chat_b_str(b, "\n\n", 0);
        }
        size_t s, e;
        mt_chat_py_strip(m[i].content, strlen(m[i].content), &s, &e);
        mt_chat_b_text(b, m[i].content + s, e - s, a);
        MT_TRY(mt_chat_b_special(b, "<end_of_turn>", a));
        mt_chat_b_str(b, "\n", 0);
    }
    return MT_OK;
}

/* The system message gpt-oss's template writes by default (model_identity, reasoning_effort and
 * builtin_tools not given, no tools), around the date. */
static const char HARMONY_SYSTEM_HEAD[] =
    "You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: ";
static const char HARMONY_SYSTEM_TAIL[] =
    "\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for "
    "every message.";

static int is_date(const char *d) {
    if (strlen(d) != 10 || d[4] != '-' || d[7] != '-') return 0;
    for (int i = 0; i < 10; i++)
        if (i != 4 && i != 7 && (d[i] < '0' || d[i] > '9')) return 0;
    return 1;
}

static int has_channel_tags(const char *s, size_t len) {
    static const char *const tags[] = {"<|channel|>analysis<|message|>", "<|channel|>final<|message|>"};
    for (int k = 0; k < 2; k++) {
        size_t tl = strlen(tags[k]);
        for (size_t i = 0; i + tl <= len; i++)
            if (memcmp(s + i, tags[k], tl) == 0) return 1;
    }
    return 0;
}

static int harmony_header(mt_chat_builder *b, const char *role, const char *channel) {
    MT_TRY(mt_chat_b_special(b, "<|start|>", 0));
    mt_chat_b_str(b, role, 0);
    if (channel) {
        MT_TRY(mt_chat_b_special(b, "<|channel|>", 0));
        mt_chat_b_str(b, channel, 0);
    }
    return mt_chat_b_special(b, "<|message|>", 0);
}

/* openai/gpt-oss-20b chat_template.jinja (no tools, add_generation_prompt false). */
int mt_chat_render_harmony(mt_chat_builder *b, const mt_chat_opts *o, const mt_chat_message *m, size_t n) {
    const char *date = o->date ? o->date : MT_CHAT_HARMONY_DEFAULT_DATE;
    if (!is_date(date)) return mt_error_set("harmony: date \"%s\" is not YYYY-MM-DD", date);
    for (size_t i = 0; i < n; i++) {
        int k = mt_chat_role_kind(m[i].role);
        if (i > 0 && (k == 0 || k == 3))
            return mt_error_set("message %zu: role \"%s\" after the first message (harmony writes only a first "
                                "system/developer message; gpt-oss's template drops later ones)",
                                i, m[i].role);
        if (k == 2 && has_channel_tags(m[i].content, strlen(m[i].content)))
            return mt_error_set("message %zu: assistant content holds <|channel|> tags (harmony: put the "
                                "reasoning in <think>...</think>, the final answer after it)", i);
    }
    MT_TRY(harmony_header(b, "system", NULL));
    mt_chat_b_str(b, HARMONY_SYSTEM_HEAD, 0);
    mt_chat_b_str(b, date, 0);
    mt_chat_b_str(b, HARMONY_SYSTEM_TAIL, 0);
    MT_TRY(mt_chat_b_special(b, "<|end|>", 0));
    size_t first = 0;
    int k0 = mt_chat_role_kind(m[0].role);
    if (k0 == 0 || k0 == 3) {
        first = 1;
        if (m[0].content[0]) { /* the template tests the content's truth: "" writes no developer message */
            MT_TRY(harmony_header(b, "developer", NULL));
            mt_chat_b_str(b, "# Instructions\n\n", 0);
            mt_chat_b_str(b, m[0].content, 0);
            mt_chat_b_str(b, "\n\n", 0);
            MT_TRY(mt_chat_b_special(b, "<|end|>", 0));
        }
    }
    for (size_t i = first; i < n; i++) {
        if (mt_chat_role_kind(m[i].role) == 1) {
            MT_TRY(harmony_header(b, "user", NULL));
            mt_chat_b_str(b, m[i].content, 0);
            MT_TRY(mt_chat_b_special(b, "<|end|>", 0));
            continue;
        }
        const char *content, *reason;
        size_t content_len, reason_len;
        int thinking = mt_chat_split_think(m[i].content, &reason, &reason_len, &content, &content_len);
        int last = i == n - 1;
        if (last && thinking) { /* earlier turns' analysis is dropped, as the template does */
            if (has_channel_tags(reason, reason_len))
                return mt_error_set("message %zu: reasoning holds <|channel|> tags", i);
            MT_TRY(harmony_header(b, "assistant", "analysis"));
            mt_chat_b_text(b, reason, reason_len, 0);
            MT_TRY(mt_chat_b_special(b, "<|end|>", 0));
        }
        MT_TRY(harmony_header(b, "assistant", "final"));
        mt_chat_b_text(b, content, content_len, 1);
        MT_TRY(mt_chat_b_special(b, last ? "<|return|>" : "<|end|>", 1));
    }
    return MT_OK;
}
