/* Byte-level text: the stand-in tokenizer of the default job until the real one exists.
 *
 * Each byte of the text is one token id 0..255; eos_id (>= 256, e.g. 256, so vocab 257) ends every
 * document. Documents:
 *  - doc_sep_line == NULL: each input file is one document;
 *  - otherwise a line equal to doc_sep_line (compared without its "\n" or "\r\n"; e.g. "%" in
 *    fortune files) ends the current document and is itself dropped; the end of a file also ends
 *    the document. The other lines are kept byte for byte, newlines included.
 * Documents that are empty or only whitespace are skipped. Every kept document is followed by eos_id
 * (also the last one: the token file is read as a ring, so the wrap from the last document back to
 * the first is separated too).
 */
#ifndef MT_BYTE_TEXT_H
#define MT_BYTE_TEXT_H

#include <stddef.h>
#include <stdint.h>

/* Writes the uint16 token file out_path atomically (out_path.tmp, flush, fsync, rename): on MT_ERR
 * nothing is left under out_path. eos_id must be in [256, 65535]. Errors name the file at fault
 * (an unreadable input, or out_path when there is no text at all). *n_tokens_out (may be NULL)
 * receives the number of tokens written. */
int mt_byte_text_to_tokens(const char *const *text_paths, int n_paths, const char *out_path,
                           const char *doc_sep_line, int eos_id, int64_t *n_tokens_out);

/* Text of n token ids into out (always NUL-terminated when out_size > 0, truncated to fit): ids
 * 0..255 are their byte, ids >= 256 (eos and any other special) are shown as "\n", negative ids
 * (ignored targets, padding) are skipped. Returns the number of bytes written, NUL excluded (the
 * text may itself contain NUL bytes). */
int mt_byte_text_decode(const int32_t *ids, int n, char *out, size_t out_size);

#endif
