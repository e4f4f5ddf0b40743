/* Packed rows: the data file for fine-tuning (chat) data, where a row is not simply the next T+1
 * tokens of a stream but carries its own loss mask and document boundaries.
 *
 * A row holds T+1 ids: inputs are ids[0..T-1], targets ids[1..T]. Documents (rendered
 * conversations) are laid into rows in order by one of two policies (mt_pack_policy):
 *   whole  a document never straddles rows. It goes into the current row when its tokens fit the
 *          ids left there and its first token is an input (fill + n <= T+1 and fill < T: its last
 *          token may sit in ids[T], a target only); otherwise the rest of the current row is
 *          padding and the document starts the next row (greedy next-fit, file order, no
 *          reordering). A document of at most T+1 tokens always fits an empty row. Rows do not
 *          overlap.
 *   split  the stream: documents are concatenated and cut into rows exactly as a token file is
 *          (data/tokens.h): row r holds the T+1 stream tokens from r*T, so consecutive
 *          rows overlap by one token, and nothing is padded but the tail of the last row. A
 *          document that crosses a row boundary continues at the start of the next row as a
 *          document of its own there (its positions restart, it sees only that row's part: the
 *          tokens there are trained without their beginning).
 * Padding is the pad id, without loss, a document of its own (DOC at its first input position,
 * so attention never mixes it with real tokens). Each row records, per input position t:
 *   inputs[t]    = ids[t]
 *   targets[t]   = ids[t+1] when the LOSS flag is set, else -1 (no loss): set only when ids[t+1] is
 *                  a trained token (the loss mask) of the same document as ids[t]; so the last token
 *                  of a document never predicts the next document's first
 *   doc_start[t] = the last position <= t whose DOC flag is set (model/docs.h); DOC is set at t = 0
 *                  and wherever a document (or padding) begins
 *
 * The file (all integers little-endian; validated whole at mt_packed_open, then mmapped read-only,
 * so batch reads never fail; written to PATH.tmp and renamed):
 *   header, 64 bytes
 *     0  char[8] magic      "MTPACKED"
 *     8  u32     version    1
 *     12 u32     T          tokens per row (= --seq)
 *     16 u64     rows       >= 1
 *     24 u32     vocab      every id < vocab (the tokenizer's vocabulary)
 *     28 u32     id_size    2 (uint16 ids) or 4 (uint32)
 *     32 u64     documents  documents packed (reported, not checked)
 *     40 u64     trained    number of LOSS flags in the file (checked)
 *     48 u8[16]  reserved   zero
 *   rows records of (T+1)*id_size + T bytes, one per row:
 *     ids[T+1]   the row's tokens (padding: the pad id, no LOSS)
 *     flags[T]   bit 0 LOSS, bit 1 DOC, other bits zero
 *   nothing after the last record.
 * The packing policy is not recorded: the rows are read the same way whichever made them.
 *
 * Batch order, as for token files (tokens.h), stateless so that a run resumes from the step alone:
 * global row g = step*B + r reads row g mod rows without shuffle; with shuffle, epoch e = g / rows
 * reads row mt_tokens_perm(seed, e, rows, g mod rows). Eval reads rows 0, 1, ... once each.
 */
#ifndef MT_PACKED_H
#define MT_PACKED_H

#include <stddef.h>
#include <stdint.h>

#include "io/atomic_file.h"
#include "data/tokens.h"

#define MT_PACKED_MAGIC "MTPACKED"
#define MT_PACKED_VERSION 1
#define MT_PACKED_HEADER 64
enum { MT_PACKED_LOSS = 1, MT_PACKED_DOC = 2 };

typedef struct {
    const unsigned char *data; /* the read-only mapping */
    size_t nbytes, row_bytes;
    int T, id_size, vocab;
    int64_t rows, documents, trained;
    char *path;
} mt_packed_file;

/* 1 when PATH is a readable file starting with the magic (any version), else 0. */
int mt_packed_is_packed(const char *path);

/* Maps and validates PATH: header fields, the exact size, every id < vocab, known flags only, DOC
 * at each row's start, no LOSS target across a document boundary, the LOSS count. T > 0: the file's
 * T must equal it; model_vocab > 0: the file's vocab must not exceed it. On MT_ERR the message is
 * one line "PATH: <field> ..." and *f holds nothing to close. */
int mt_packed_open(mt_packed_file *f, const char *path, int T, int model_vocab);
void mt_packed_close(mt_packed_file *f); /* a zeroed or closed *f is fine */

/* Row `row` (0 <= row < rows): inputs, targets and doc_start, T each. */
void mt_packed_row(const mt_packed_file *f, int64_t row, int32_t *inputs, int32_t *targets,
                   int32_t *doc_start);

/* Training batch of step `step`: (B, T) each, row-major, in the order above. */
void mt_packed_batch(const mt_packed_file *f, const mt_batch_order *o, int64_t step, int B,
                     int32_t *inputs, int32_t *targets, int32_t *doc_start);

/* Rows first_row .. first_row+B-1 in file order; rows at or past `rows` are padding: inputs 0,
 * targets -1, one document. */
void mt_packed_eval_batch(const mt_packed_file *f, int64_t first_row, int B, int32_t *inputs,
                          int32_t *targets, int32_t *doc_start);

/* ---- writing: documents in, rows out ---- */

typedef enum { MT_PACK_WHOLE = 0, MT_PACK_SPLIT } mt_pack_policy;

/* "whole" or "split"; MT_ERR naming the value otherwise. */
int mt_pack_policy_parse(const char *s, mt_pack_policy *out);
const char *mt_pack_policy_name(mt_pack_policy p);

typedef struct {
    mt_atomic_file af;
    int T, id_size, vocab, pad_id;
    mt_pack_policy policy;
    unsigned char *row;       /* the row being filled: ids then flags */
    int pos;                  /* ids filled in the row (0 .. T+1) */
    int64_t rows, documents, trained, tokens;
    int64_t padded;           /* input positions holding padding (of rows * T) */
} mt_packed_writer;

/* Creates PATH.tmp. pad_id (< vocab) is the padding. */
int mt_packed_writer_open(mt_packed_writer *w, const char *path, int T, int vocab, int id_size,
                          int pad_id, mt_pack_policy policy);
/* Appends one document of n >= 1 tokens (whole: n <= T+1); trained[i] != 0: token i is a target
 * (predicted from token i-1; ignored for i = 0). */
int mt_packed_writer_add(mt_packed_writer *w, const int32_t *ids, const uint8_t *trained, size_t n);
/* Pads and writes the last row, the header, and renames into place. MT_ERR (nothing left behind)
 * when no token was added. */
int mt_packed_writer_commit(mt_packed_writer *w);
void mt_packed_writer_abort(mt_packed_writer *w);

#endif
