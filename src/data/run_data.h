/* What --data (and --eval-data) names, opened as something batches are read from.
 *
 * By content, not by name alone:
 *   - a file starting with the packed-rows magic (data/packed.h), or named *.packed: used as is
 *     (validated; its T must be --seq);
 *   - *.bin / *.tokens: a token file (data/tokens.h);
 *   - *.jsonl whose first JSON object has "messages": chat data, packed with the model's
 *     tokenizer.json into OUT/<name>.packed (flags: chat_format, loss_on, long_policy, pack);
 *   - anything else: text / JSONL ("text" field) tokenized into OUT/<name>.tokens.bin with the
 *     model's tokenizer.json, or as bytes for a model without one, and its document index
 *     (text_data.h) into OUT/<name>.tokens.bin.docs: --eval-split holds out whole documents.
 * Opening installs the SIGBUS guard of data/map_guard.h, and each batch read first checks that the
 * file has not shrunk: a data file truncated under a running command ends it with one line naming
 * the file and exit 1 (never a SIGBUS), before that batch is used.
 * A derived file is re-used while its sidecar OUT/<file>.json says it was made from the same source
 * (path, size, mtime), tokenizer files and options; otherwise it is made again (and the sidecar is
 * written last, so a crash never leaves a stale file trusted).
 */
#ifndef MT_RUN_DATA_H
#define MT_RUN_DATA_H

#include <stdint.h>

#include "data/chat_pack.h"
#include "data/doc_split.h"
#include "data/packed.h"
#include "data/split.h"
#include "data/tokens.h"
#include "model/config.h"

typedef struct {
    const char *out_dir;   /* where derived files go */
    const char *model_dir; /* its tokenizer.json, if any; NULL for --init */
    const char *doc_sep;   /* text data */
    int T;                 /* --seq */
    mt_chat_format chat_format;
    mt_chat_loss_on loss_on;
    mt_long_policy long_policy;
    mt_pack_policy pack;   /* chat data: whole (0, the default) or split */
    int chat_flags;        /* a chat flag was given: refused for data that is not chat JSONL */
} mt_run_data_opts;

typedef struct {
    mt_token_file tokens;
    mt_packed_file packed; /* packed.data != NULL: packed rows */
    int32_t *doc_start;    /* packed rows: the document starts of the last batch read */
    int doc_cap;
    mt_data_split split;   /* split.units > 0: --eval-split (training and eval rows both from here) */
    char *doc_index;       /* text data: its document index (the split's units are then documents) */
    int one_doc_per_file;  /* text data without --doc-sep (for the message of a split refused) */
    mt_doc_stream train_docs, eval_docs; /* split.units > 0 and doc_index: each side's documents */
} mt_run_data;

/* MT_OK when PATH is a readable regular file. Anything else is refused before it is opened (a FIFO
 * with no writer would block the open forever): MT_ERR "FLAG PATH: is a FIFO (named pipe), not a
 * regular file" (a directory, a device, a socket likewise), or "FLAG PATH: cannot open: ...".
 * flag may be NULL (the message then starts with PATH). */
int mt_run_data_check_file(const char *flag, const char *path);

/* MT_ERR with one line naming the file or flag at fault. */
int mt_run_data_open(mt_run_data *d, const char *path, const mt_run_data_opts *o, const mt_config *cfg);
void mt_run_data_close(mt_run_data *d);

/* --eval-split fraction (data/split.h): from here on the training batches read the train units only
 * and the eval rows are the held-out units: a packed file's rows, text data's documents
 * (data/doc_split.h), a token file's windows of T (--seq) tokens. MT_ERR naming the data (name: the
 * path the user gave) when a side would be empty. */
int mt_run_data_split(mt_run_data *d, const char *name, double fraction, uint64_t seed, int T);
/* What the split's units are: "rows", "documents" or "sequences". */
const char *mt_run_data_split_units(const mt_run_data *d);

/* Human summary: "123456 tokens" or "40 packed rows of 1024 tokens". */
void mt_run_data_describe(const mt_run_data *d, char *buf, int size);

/* Training batch of `step` (B, T) into inputs/targets; returns the document starts (B, T) of packed
 * rows (for mt_engine_set_documents / mt_runner_set_documents), NULL for a token file. */
const int32_t *mt_run_data_batch(mt_run_data *d, const mt_batch_order *o, int64_t step, int B, int T,
                                 int32_t *inputs, int32_t *targets);

/* Eval rows (each counted once) and the batch of B of them from first_row (padding past the end). */
int64_t mt_run_data_eval_rows(const mt_run_data *d, int T);
const int32_t *mt_run_data_eval_batch(mt_run_data *d, int64_t first_row, int B, int T, int32_t *inputs,
                                      int32_t *targets);

#endif
