/* Text and JSONL -> the token file of docs/DESIGN.md ("Data"), through a tokenizer.json tokenizer.
 *
 * Inputs, by file name:
 *  - *.jsonl: one JSON object per line with a string field "text"; each such line is one document.
 *    Lines that are empty or only whitespace are not data and are passed over without a count.
 *    Lines that are not JSON (jansson also refuses raw invalid UTF-8 inside a JSON string) and
 *    objects without a string "text" are skipped and counted, with the first line number of each
 *    kind kept for the report.
 *  - anything else is plain text: doc_sep == NULL, each file is one document; otherwise a line equal to doc_sep (without its "\n" / "\r\n") ends the
 *    document and is dropped, the other lines are kept byte for byte, newlines included.
 * Documents without a byte (a JSONL "text": "", an empty text file) are skipped and counted; a
 * document of only whitespace is encoded like any other, as Hugging Face's tokenizer(text) does
 * (a blank JSONL line holds no JSON object, so is no document, and nothing between two doc_sep
 * lines is none either). Text that is not valid UTF-8 is encoded all the same (the tokenizer takes any bytes and decode gives them back) and the
 * documents holding it are counted.
 *
 * Each kept document becomes encode(text, add_special) followed by eos: add_special applies the
 * tokenizer's post-processor (Llama's <s> / <|begin_of_text|> prefix; nothing for GPT-2 or Qwen),
 * as Hugging Face's tokenizer(text) does; every document, the last one too, ends with eos (the token
 * file is read as a ring). Documents are parsed (JSONL) and encoded in parallel (OpenMP; the
 * tokenizer is thread-safe for encode, jansson for separate values) in batches of about
 * MT_TEXT_BATCH_BYTES and written and counted in input order, so neither the output nor the report
 * depends on the thread count. A document is held in memory whole while it is encoded (a plain
 * text file without doc_sep is one document: use doc_sep for multi-GB files), except with byte-level
 * tokens, whose long documents go in pieces of about MT_TEXT_BATCH_BYTES (cut at line ends).
 *
 * tok == NULL selects byte-level tokens (each byte its id 0..255, eos = opts->eos_id >= 256): the
 * JSONL reader for models without a tokenizer.
 */
#ifndef MT_TEXT_DATA_H
#define MT_TEXT_DATA_H

#include <stdint.h>
#include <stdio.h>

#include "tokenizer/tokenizer.h"

#define MT_TEXT_BATCH_BYTES (8 << 20) /* text encoded per parallel batch */

typedef struct {
    int64_t documents;      /* kept (written) documents */
    int64_t tokens;         /* tokens written, eos included */
    int64_t bytes;          /* input bytes read */
    double seconds;
    int64_t empty_docs;     /* skipped: empty (no byte at all) */
    int64_t invalid_utf8;   /* kept documents whose text is not valid UTF-8 */
    int64_t bad_json;       /* skipped JSONL lines that are not a JSON object */
    int64_t missing_text;   /* skipped JSONL objects without a string "text" */
    /* first occurrence of each (path is one of the input paths; line 0 = none) */
    const char *bad_json_path, *missing_text_path, *invalid_utf8_path, *empty_path;
    int64_t bad_json_line, missing_text_line, invalid_utf8_line, empty_line;
    char bad_json_error[160]; /* jansson's message for the first bad line */
    int elem_size;            /* of the file written */
    int eos_id;
} mt_text_stats;

/* Called from the writing thread after each batch (and once at the end with done = 1). */
typedef void (*mt_text_progress_fn)(const mt_text_stats *s, int64_t total_bytes, int done, void *user);

typedef struct {
    const char *doc_sep;   /* NULL: one document per text file */
    int elem_size;         /* 0: 2 when the vocabulary fits uint16, else 4; or 2 / 4 */
    int eos_id;            /* -1: the tokenizer's eos (MT_ERR when it has none) */
    int add_special;       /* apply the post-processor (bos prefix); 1 = as tokenizer(text) */
    mt_text_progress_fn progress;  /* NULL: none */
    void *progress_user;
    /* NULL: none. Else also written (atomically, before out_path): the document index, one
     * little-endian int64 per kept document, the token offset where it ends (just past its eos),
     * ascending, the last one the file's token count. --eval-split holds out whole documents by it. */
    const char *doc_index;
} mt_text_opts;

/* Default options: doc_sep NULL, elem_size 0, eos_id -1, add_special 1, no progress, no doc_index. */
mt_text_opts mt_text_opts_default(void);

/* Writes out_path atomically (out_path.tmp, fsync, rename): on MT_ERR nothing is left under it.
 * MT_ERR (one line naming the file at fault) on an unreadable input, no eos, elem_size 2 for a
 * vocabulary past 65536, or no document at all. stats (may be NULL) is filled on MT_OK and, as far
 * as it got, on MT_ERR. */
int mt_text_to_tokens(const mt_tokenizer *tok, const char *const *paths, int n, const char *out_path,
                      const mt_text_opts *opts, mt_text_stats *stats);

/* 1 when PATH names a JSONL file (ends in .jsonl). */
int mt_text_is_jsonl(const char *path);
/* 1 when s[0..n) is strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
int mt_text_utf8_valid(const unsigned char *s, size_t n);
/* 1 when s[0..n) is empty or only ASCII whitespace. */
int mt_text_only_space(const char *s, size_t n);

/* Multi-line report of the skipped/odd input (nothing when all was clean), each line starting with
 * prefix, e.g. "data.jsonl: 3 lines are not JSON (first: line 7: ...), skipped". */
void mt_text_stats_report(const mt_text_stats *s, const char *prefix, FILE *out);

/* The stderr progress line (a terminal-only \r line; pass as opts.progress, user = NULL). */
void mt_text_progress_stderr(const mt_text_stats *s, int64_t total_bytes, int done, void *user);

#endif
