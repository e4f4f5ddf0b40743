/* Chat fine-tuning data: a conversation rendered into token ids plus a per-token loss mask, in the
 * chat formats of the Llama-family models (implemented directly, no Jinja engine). Each format is
 * the model's own chat template as transformers renders it (add_generation_prompt=False); the
 * template sources are named in tests/fixtures/chat/README.md, which holds the reference renderings.
 *
 *   MT_CHAT_CHATML   (Qwen 2 / 2.5)  per message  <|im_start|>{role}\n{content}<|im_end|>\n
 *                    opts.default_system: when set and the first message is not a system message,
 *                    <|im_start|>system\n{default_system}<|im_end|>\n comes first (Qwen2.5's template
 *                    does this with MT_CHAT_QWEN25_DEFAULT_SYSTEM; the default here is none).
 *   MT_CHAT_LLAMA3   (Llama 3 Instruct) <|begin_of_text|> then per message
 *                    <|start_header_id|>{role}<|end_header_id|>\n\n{trim(content)}<|eot_id|>
 *   MT_CHAT_LLAMA2   (Llama 2 chat) [system +] user/assistant alternating:
 *                    <s>[INST] {strip(<<SYS>>\n{system}\n<</SYS>>\n\n{user})} [/INST] {strip(assistant)} </s>
 *                    (the <<SYS>> block only in the first user turn), then <s>[INST] ... per turn
 *   MT_CHAT_MISTRAL  (Mistral 7B Instruct v0.1 / v0.2, Mixtral 8x7B; [INST] is text)
 *                    <s> then per turn  " [INST] {user} [/INST]" " {assistant}</s>"; a system
 *                    message becomes "{system}\n\n" before the FIRST user text
 *   MT_CHAT_MISTRAL_V3 (Mistral 7B Instruct v0.3; [INST] and [/INST] are tokens)
 *                    <s> then per turn  [INST] " {user}" [/INST] " {trim(assistant)}</s>"; a system
 *                    message becomes "{system}\n\n" before the LAST user text
 *   MT_CHAT_QWEN3    (Qwen3; Qwen/Qwen3-* chat_template, string contents, no tools) ChatML without a
 *                    default system, per message <|im_start|>{role}\n ... <|im_end|>\n where ... is
 *                    {content} for system and user and, for an assistant message:
 *                      content with "</think>": {c} = after its last "</think>", lstrip('\n');
 *                        {r} = before its first "</think>", rstrip('\n'), after the last "<think>"
 *                        there (all of it when none), lstrip('\n');  else {c} = content, {r} = "".
 *                      After the last user query (the last user message not of the form
 *                      "<tool_response>...</tool_response>"; with none, no turn is after it) and
 *                      either the last message or {r} non-empty:  <think>\n{strip_nl(r)}\n</think>\n\n{lstrip_nl(c)}
 *                      (so the final reply always has a think block, empty without reasoning);
 *                      otherwise {c} (an earlier turn's reasoning is dropped).
 *                    strip_nl / lstrip_nl / rstrip_nl: Python's .strip('\n') etc., newlines only.
 *   MT_CHAT_GEMMA    (Gemma 3 instruction models; google/gemma-3-*-it chat_template) <bos> then an
 *                    optional first system message and user/assistant alternating from user, per
 *                    message  <start_of_turn>{user|model}\n{trim(content)}<end_of_turn>\n  ("assistant"
 *                    is written "model"); the system message becomes "{system}\n\n" (not trimmed)
 *                    before the first user text. (Gemma 4 has another template, <|turn>...<turn|> with
 *                    a system turn: not this format, and not detected as it.)
 *   MT_CHAT_HARMONY  (OpenAI gpt-oss; openai/gpt-oss-20b chat_template.jinja, no tools)
 *                    <|start|>system<|message|>{S}<|end|> where S is the template's default system
 *                    message: "You are ChatGPT, a large language model trained by OpenAI.\n
 *                    Knowledge cutoff: 2024-06\nCurrent date: {date}\n\nReasoning: medium\n\n
 *                    # Valid channels: analysis, commentary, final. Channel must be included for every
 *                    message." with date = opts.date or MT_CHAT_HARMONY_DEFAULT_DATE (the template
 *                    writes today's date; a fixed one keeps the rendering reproducible); then, when
 *                    the first message is a system (or "developer") message with non-empty content,
 *                    <|start|>developer<|message|># Instructions\n\n{content}\n\n<|end|>; then per message
 *                      user       <|start|>user<|message|>{content}<|end|>
 *                      assistant  <|start|>assistant<|channel|>final<|message|>{c}<|end|>, or, for the
 *                                 LAST message of the conversation, ...{c}<|return|> preceded by
 *                                 <|start|>assistant<|channel|>analysis<|message|>{r}<|end|> when the
 *                                 message has reasoning; earlier turns' reasoning is dropped.
 *                    The reasoning ("thinking" in the template) is carried in the content as Qwen3's
 *                    is: a content with "</think>" splits into {r} and {c} by Qwen3's rule above;
 *                    without "</think>", {c} = content and there is no reasoning. A system/developer
 *                    message after the first (which the template silently drops) is refused, as is
 *                    content holding "<|channel|>analysis<|message|>" or "<|channel|>final<|message|>"
 *                    (which the template refuses).
 * trim/strip: Python's str.strip() (Unicode whitespace), as the templates' `| trim` / `.strip()`.
 *
 * The special tokens named above must be single tokens of the tokenizer (bos/eos: <s> </s> and
 * <|begin_of_text|> are looked up by name); [INST] / [/INST] are plain text unless the tokenizer
 * has them as added tokens (Mistral v0.3), which the encoder then recognises.
 *
 * Encoding equals encoding the whole rendered string with add_special=0 (what tokenizers gives
 * for the template's output): the text between two special tokens is encoded with those tokens
 * around it as context.
 *
 * Loss mask (1 = trained), MT_CHAT_LOSS_ASSISTANT: 1 on the tokens of each assistant turn's text
 * as written above — ChatML {content}, Qwen3 all of the turn after "<|im_start|>assistant\n" (its
 * think block when one is written — reasoning or empty — then {c} as written), Llama 3 {trim(content)}, Llama 2 " {strip(content)} ",
 * Mistral " {content}", Mistral v3 " {trim(content)}", Gemma {trim(content)}, Harmony the final
 * channel's {c} (not the analysis message) — and on the end-of-turn token that closes it
 * (<|im_end|>, <|eot_id|>, </s>, <end_of_turn>, <|end|> / <|return|>);
 * 0 on everything else (bos, headers, role names, [INST] blocks, system and user text, ChatML's
 * "\n" after <|im_end|>, Harmony's system and developer messages and analysis message). A token that straddles the start of the assistant text (BPE merging the
 * header's last bytes with the content's first, e.g. "\n" + "\n..." in ChatML) counts as assistant:
 * precisely, the assistant tokens of a text run start at the first token where the run's encoding
 * differs from the encoding of the run's text before the assistant content.
 * MT_CHAT_LOSS_ALL: every token 1.
 */
#ifndef MT_CHAT_H
#define MT_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MT_CHAT_AUTO = 0, /* mt_chat_format_for(tokenizer) */
    MT_CHAT_CHATML,
    MT_CHAT_LLAMA3,
    MT_CHAT_LLAMA2,
    MT_CHAT_MISTRAL,
    MT_CHAT_MISTRAL_V3,
    MT_CHAT_QWEN3,
    MT_CHAT_GEMMA,
    MT_CHAT_HARMONY,
} mt_chat_format;

typedef enum { MT_CHAT_LOSS_ASSISTANT = 0, MT_CHAT_LOSS_ALL } mt_chat_loss_on;

#define MT_CHAT_QWEN25_DEFAULT_SYSTEM \
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

/* The "Current date:" harmony writes when opts.date is NULL (gpt-oss's release date). */
#define MT_CHAT_HARMONY_DEFAULT_DATE "2025-08-05"

typedef struct {
    const char *role;    /* "system", "user" or "assistant" ("developer": harmony, first message only) */
    const char *content; /* NUL-terminated UTF-8 */
} mt_chat_message;

typedef struct {
    mt_chat_format format;      /* MT_CHAT_AUTO: by the tokenizer's special tokens */
    mt_chat_loss_on loss_on;
    const char *default_system; /* ChatML only; NULL: none */
    const char *date;           /* harmony only: "Current date: " as YYYY-MM-DD; NULL: the default */
} mt_chat_opts;

/* A growable mask vector, parallel to the ids (reuse across calls). */
typedef struct {
    uint8_t *v;
    size_t n, cap;
} mt_chat_mask;
void mt_chat_mask_free(mt_chat_mask *m);

/* By the tokenizer's chat template when it has one (mt_tokenizer_chat_template): one writing
 * <|im_start|> -> ChatML (Qwen3 when it also mentions reasoning_content and <think>, as Qwen3's
 * template does and Qwen 2/2.5's and QwQ's do not), <|start_header_id|> -> Llama 3, <<SYS>> -> Llama 2, [INST] -> Mistral (v3
 * when [INST] is a token), <start_of_turn> -> Gemma, <|start|> with <|channel|> -> Harmony.
 * Otherwise (or for a template with none of these) by the special tokens: <|im_start|> -> ChatML;
 * else <|eot_id|> -> Llama 3; else [INST] -> Mistral v3; else <|start|> and <|channel|> -> Harmony;
 * else <start_of_turn> -> Gemma (not when a template writes Gemma 4's "<|turn>"); else Llama 2. */
mt_chat_format mt_chat_format_for(const mt_tokenizer *t);
/* "auto", "chatml", "llama3", "llama2", "mistral", "mistral-v3", "qwen3", "gemma", "harmony" */
const char *mt_chat_format_name(mt_chat_format f);
/* One of the names above; MT_ERR naming the value otherwise. */
int mt_chat_format_parse(const char *s, mt_chat_format *out);
/* "assistant" or "all"; MT_ERR otherwise. */
int mt_chat_loss_on_parse(const char *s, mt_chat_loss_on *out);

/* Renders msgs[0..n) and appends the ids to *ids and the mask to *mask (same count). opts NULL:
 * auto format, loss on assistant, no default system. MT_ERR (with a message naming the message
 * index) on an empty conversation, a message without role or content, an unknown role, a role
 * order the format cannot express (Llama 2 / Mistral / Gemma: an optional first system message,
 * then user/assistant alternating from user; Harmony: a system message only first), or a tokenizer
 * lacking the format's special tokens; on MT_ERR ids and mask are left as they were. */
int mt_chat_render(const mt_tokenizer *t, const mt_chat_opts *opts, const mt_chat_message *msgs,
                   size_t n, mt_token_vec *ids, mt_chat_mask *mask);

#ifdef MT_CHAT_INTERNAL
/* Shared by src/tokenizer/chat.c and chat_more.c only. */
typedef struct mt_chat_builder mt_chat_builder;
/* Appends text (assist: under LOSS_ASSISTANT, trained) / a special token looked up by name (MT_ERR
 * naming it when the tokenizer lacks it). */
void mt_chat_b_text(mt_chat_builder *b, const char *s, size_t len, int assist);
void mt_chat_b_str(mt_chat_builder *b, const char *s, int assist);
int mt_chat_b_special(mt_chat_builder *b, const char *name, int assist);
/* 0 system, 1 user, 2 assistant, 3 developer, -1 other */
int mt_chat_role_kind(const char *role);
/* Python's str.strip() bounds of s[0..n) */
void mt_chat_py_strip(const char *s, size_t n, size_t *start, size_t *end);
/* Qwen3's split of an assistant content at "</think>" (chat.h, MT_CHAT_QWEN3): returns 1 and sets
 * the reasoning and the content when c has "</think>"; 0 (content = c, reasoning empty) otherwise. */
int mt_chat_split_think(const char *c, const char **reason, size_t *reason_len, const char **content,
                        size_t *content_len);
int mt_chat_render_gemma(mt_chat_builder *b, const mt_chat_message *m, size_t n);
int mt_chat_render_harmony(mt_chat_builder *b, const mt_chat_opts *o, const mt_chat_message *m, size_t n);
#endif

#ifdef __cplusplus
}
#endif

#endif
