/* Byte-level text: the tokens of a model without a tokenizer.json.
 *
 * Each byte of the text is one token id 0..255; eos_id (>= 256, e.g. 256, so vocab 257) ends every
 * document. The inputs are read as mt_text_to_tokens reads them (text_data.h), the same for
 * `megatrain tokenize --bytes` and `train --data`:
 *  - *.jsonl: the bytes of each line's string "text" field (a line is a document);
 *  - any other file, doc_sep_line == NULL: each input file is one document;
 *  - otherwise a line equal to doc_sep_line (compared without its "\n" or "\r\n"; e.g. "%" in
 *    fortune files) ends the current document and is itself dropped; the end of a file also ends
 *    the document. The other lines are kept byte for byte, newlines included.
 * Documents without a byte are skipped (and counted); whitespace-only ones are kept. Every kept
 * document is followed by eos_id (also the last one: the token file is read as a ring, so the wrap
 * from the last document back to the first is separated too). Memory stays bounded for inputs of
 * any size: long documents are read in pieces.
 */
#ifndef MT_BYTE_TEXT_H
#define MT_BYTE_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "data/text_data.h"

/* Writes the uint16 token file out_path atomically (out_path.tmp, flush, fsync, rename): on MT_ERR
 * nothing is left under out_path. eos_id must be in [256, 65535]. Errors name the file at fault
 * (an unreadable input, or out_path when there is no text at all). stats (may be NULL) as
 * mt_text_to_tokens fills it (report skipped lines with mt_text_stats_report). */
int mt_byte_text_to_tokens(const char *const *paths, int n_paths, const char *out_path,
                           const char *doc_sep_line, int eos_id, mt_text_stats *stats);
/* As mt_byte_text_to_tokens, and the document index (text_data.h, mt_text_opts.doc_index) into
 * doc_index (NULL: none). */
int mt_byte_text_to_tokens_indexed(const char *const *paths, int n_paths, const char *out_path,
                                   const char *doc_sep_line, int eos_id, const char *doc_index,
                                   mt_text_stats *stats);

/* Text of n token ids into out (always NUL-terminated when out_size > 0, truncated to fit): ids
 * 0..255 are their byte, ids >= 256 (eos and any other special) are shown as "\n", negative ids
 * (ignored targets, padding) are skipped. Returns the number of bytes written, NUL excluded (the
 * text may itself contain NUL bytes). */
int mt_byte_text_decode(const int32_t *ids, int n, char *out, size_t out_size);

#endif
