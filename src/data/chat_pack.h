/* Chat JSONL -> packed rows (data/packed.h), through a tokenizer.json tokenizer and a chat format
 * (tokenizer/chat.h).
 *
 * Input: one JSON object per line, {"messages": [{"role": "system"|"user"|"assistant",
 * "content": "..."}, ...]} (other fields ignored); lines that are empty or only whitespace are not
 * data and are passed over. Each kept line is one conversation: rendered in the chat format with
 * its loss mask (assistant replies, or every token with loss_on all) and packed, in file order, as
 * one document into rows of T input positions (T+1 ids, data/packed.h) by opts.pack:
 *   whole (default)  a conversation never straddles rows: when it does not fit what is left of the
 *                    current row, the rest of that row is padding and it starts the next row
 *                    (greedy next-fit, no reordering). Every conversation is trained with all of
 *                    its context; the price is the padding, reported (stats.padded).
 *   split            the conversations are concatenated and the stream is cut into rows as a token
 *                    file is: nothing is padded but the last row's tail, but a conversation that
 *                    crosses a row boundary goes on at the next row's start as a document of its
 *                    own, and its tokens there are trained without the beginning they follow.
 * Padding is the tokenizer's eos (or id 0), without loss, a document of its own.
 * A conversation is at most T tokens (the row's T inputs; its targets are its tokens 1 .. T-1), so
 * one of the maximum length fills a row alone.
 *
 * Skipped and counted, never fatal, with the first file and line of each kind kept for the report:
 *   invalid_utf8   the line is not valid UTF-8 (not parsed)
 *   bad_json       not a JSON object (jansson's message for the first); \u0000 in a string is refused
 *   no_messages    an object without a "messages" array
 *   empty          "messages" is empty, or every content is empty or only whitespace
 *   bad_message    a message that is not an object with a string "role" and a string "content"
 *   unknown_role   a role other than system, user and assistant
 *   bad_order      a role order the format cannot write (Llama 2 / Mistral: an optional first
 *                  system message, then user/assistant alternating from user)
 *   no_assistant   loss_on assistant and no assistant message (nothing to train on)
 *   long_skipped   long = skip and more than T tokens
 * Kept but changed: long_truncated (long = truncate, the default: cut to the first T tokens).
 * A conversation truncated so that no trained token is left is skipped and counted in
 * long_untrained.
 *
 * Lines are parsed, checked and rendered in parallel (OpenMP; the tokenizer is thread-safe for
 * encode, jansson for separate values) in batches of about MT_TEXT_BATCH_BYTES, then counted and
 * packed in input order, so neither the output nor the report depends on the thread count.
 */
#ifndef MT_CHAT_PACK_H
#define MT_CHAT_PACK_H

#include <stdint.h>
#include <stdio.h>

#include "data/packed.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

typedef enum { MT_LONG_TRUNCATE = 0, MT_LONG_SKIP } mt_long_policy;

/* "truncate" or "skip"; MT_ERR naming the value otherwise. */
int mt_long_policy_parse(const char *s, mt_long_policy *out);
const char *mt_long_policy_name(mt_long_policy p);

typedef struct {
    int64_t n;        /* how many */
    const char *path; /* first occurrence: one of the input paths, and its 1-based line */
    int64_t line;
} mt_chat_issue;

typedef struct {
    mt_chat_format format; /* the format used (never AUTO) */
    int64_t conversations; /* packed */
    int64_t tokens;        /* of the packed conversations (padding not counted) */
    int64_t trained;       /* targets with loss */
    int64_t rows;          /* rows written */
    int64_t padded;        /* input positions holding padding, of rows * T */
    int64_t bytes;         /* input bytes read */
    double seconds;
    mt_chat_issue invalid_utf8, bad_json, no_messages, empty, bad_message, unknown_role, bad_order,
        no_assistant, long_skipped, long_truncated, long_untrained;
    char bad_json_error[160], bad_order_error[256]; /* the first of each */
} mt_chat_pack_stats;

typedef void (*mt_chat_progress_fn)(const mt_chat_pack_stats *s, int64_t total_bytes, int done, void *user);

typedef struct {
    mt_chat_format format; /* MT_CHAT_AUTO: mt_chat_format_for(tokenizer) */
    mt_chat_loss_on loss_on;
    int T;                 /* tokens per row (--seq) */
    mt_long_policy long_policy;
    mt_pack_policy pack;   /* MT_PACK_WHOLE (0, the default) or MT_PACK_SPLIT */
    mt_chat_progress_fn progress; /* NULL: none */
    void *progress_user;
} mt_chat_pack_opts;

/* Writes out_path atomically (nothing left under it on MT_ERR). MT_ERR (one line naming the file at
 * fault) on an unreadable input, a tokenizer without the format's special tokens, or no conversation
 * kept at all. stats (may be NULL) is filled on MT_OK and, as far as it got, on MT_ERR. */
int mt_chat_pack(const mt_tokenizer *tok, const char *const *paths, int n, const char *out_path,
                 const mt_chat_pack_opts *opts, mt_chat_pack_stats *stats);

/* 1 when the first line of PATH that is a JSON object has a "messages" field (a chat JSONL), 0
 * otherwise (also when unreadable: opening it later gives the error). */
int mt_chat_jsonl_detect(const char *path);

/* One line per kind of skipped or changed input (nothing when all was clean), each starting with
 * prefix, e.g. "megatrain: warning: 3 lines that are not JSON skipped (first: a.jsonl line 7: ...)". */
void mt_chat_pack_report(const mt_chat_pack_stats *s, const char *prefix, FILE *out);

/* One line: "IN: N conversations (format, loss on X) -> R rows of T tokens (--pack P: D padding
 * tokens, Q% of the positions), K trained targets (S% of the positions) -> OUT (tokens/s)". */
void mt_chat_pack_summary(const mt_chat_pack_stats *s, const mt_chat_pack_opts *o, const char *in,
                          const char *out, FILE *f);

/* The stderr progress line (terminal only; pass as opts.progress, user = NULL). */
void mt_chat_progress_stderr(const mt_chat_pack_stats *s, int64_t total_bytes, int done, void *user);

#endif
