/* Token files and the order batches are read in (docs/DESIGN.md, "Contracts" -> "Data").
 *
 * A token file is a flat array of little-endian token ids, uint16 (elem_size 2, the default) or
 * uint32 (elem_size 4, for vocabularies over 65536), as nanoGPT's train.bin. It is mmapped read-only
 * and validated once at open, so batch reads never fail -- unless the file is truncated under the
 * mapping: data/map_guard.h notices that (mt_map_guard_check(f->data) before a batch, and a SIGBUS
 * handler).
 *
 * Rows. A row is T+1 consecutive tokens from a start position; inputs are its first T tokens and
 * targets its last T (targets[t] = inputs[t+1]). Positions are taken modulo n_tokens: the file is a
 * ring, so a row may straddle the end, and a file shorter than T+1 simply wraps several times.
 *
 * No shuffle (o->shuffle == 0): step s (0-based) reads B rows; row r starts at token
 * (s*B + r)*T = s*B*T + r*T (mod n_tokens). Consecutive steps tile the file; rows overlap by the one
 * token that is the last target of a row and the first input of the next.
 *
 * Shuffle (o->shuffle == 1): stateless, so a run resumes from the step number alone (no state but
 * o->seed and the step). The file is cut into W = max(1, n_tokens / T) windows, window k starting at
 * token k*T. Global row g = s*B + r belongs to epoch e = g / W and reads the window
 * k = perm(seed, e, W, g mod W) -- the row of T+1 tokens from k*T, wrapping as above. perm is a
 * bijection of [0, W) for every (seed, e), so each epoch visits every window exactly once, in an
 * order that changes from epoch to epoch. It is a 6-round Feistel network over the smallest power
 * of two >= W (halves of unequal width when the bit count is odd), keyed by (seed, e), with cycle
 * walking (re-apply while the result is >= W): O(1) memory, < 2 rounds of walking on average.
 * Tokens past W*T (fewer than T) are read only as wrapped tails of the last window.
 *
 * Eval order: rows that never overlap in targets, k = 0, 1, ... starting at k*T, so every target
 * position is counted at most once (see mt_tokens_eval_*).
 */
#ifndef MT_TOKENS_H
#define MT_TOKENS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const unsigned char *data; /* the read-only mapping */
    size_t nbytes;
    int64_t n_tokens;          /* >= 2 once open */
    int elem_size;             /* 2 (uint16) or 4 (uint32) */
    int vocab;                 /* every id is < vocab */
    char *path;
} mt_token_file;

typedef struct {
    int shuffle;   /* 0: the contract's sequential order; 1: seeded permutation of windows */
    uint64_t seed;
} mt_batch_order;

/* 2 when every id of the vocabulary fits in uint16 (vocab <= 65536), else 4. */
int mt_tokens_elem_size_for_vocab(int vocab);

/* Maps PATH and validates it: readable regular file, non-empty, size a multiple of elem_size,
 * at least 2 tokens, every id < vocab (threaded scan). On MT_ERR the message is one line starting
 * with PATH (for a bad id: its position and value and the vocab) and *f holds nothing to close. */
int mt_tokens_open(mt_token_file *f, const char *path, int elem_size /* 2 or 4 */, int vocab);
void mt_tokens_close(mt_token_file *f); /* a zeroed or closed *f is fine */

/* Token at position i (taken modulo n_tokens). */
int32_t mt_tokens_at(const mt_token_file *f, int64_t i);

/* The shuffle permutation: window index for slot i (0 <= i < W) of epoch `epoch`. A bijection of
 * [0, W) for each (seed, epoch); W == 1 gives 0. */
int64_t mt_tokens_perm(uint64_t seed, int64_t epoch, int64_t W, int64_t i);

/* Training batch of step `step` (>= 0): inputs and targets are (B, T), row-major. */
void mt_tokens_batch(const mt_token_file *f, const mt_batch_order *o, int64_t step, int B, int T,
                     int32_t *inputs, int32_t *targets);

/* Window k's row (the T+1 tokens from k*T, wrapping as above) into inputs and targets (T each). */
void mt_tokens_window(const mt_token_file *f, int64_t k, int T, int32_t *inputs, int32_t *targets);

/* Number of non-overlapping eval rows of length T+1: (n_tokens - 1) / T, at least 1 (a file shorter
 * than T+1 gives one row that wraps). */
int64_t mt_tokens_eval_rows(const mt_token_file *f, int T);

/* Rows first_row .. first_row+B-1 of the eval order (row k starts at k*T). Rows at or past
 * mt_tokens_eval_rows are padding: inputs 0 and targets -1 (= ignored by the loss), so the last
 * partial batch counts no token twice. */
void mt_tokens_eval_batch(const mt_token_file *f, int64_t first_row, int B, int T, int32_t *inputs,
                          int32_t *targets);

#endif
