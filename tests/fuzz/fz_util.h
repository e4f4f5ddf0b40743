/* Shared pieces of the libFuzzer harnesses (tests/fuzz/fuzz_*.c) and their seed writer.
 *
 * Most parsers take paths, so a harness writes its input into a private directory (on tmpfs when
 * there is one) and calls the real entry point on it. Targets that read several files from one
 * directory (a sharded model, a checkpoint, tokenizer.json + tokenizer_config.json) take one input
 * holding the files in a fixed order, separated by FZ_SEP; a part that is absent means the file is
 * absent. An invariant a harness checks itself fails through FZ_ASSERT (abort: libFuzzer keeps the
 * input as a crash), as does a library that exits (mt_fatal) on bad input.
 */
#ifndef MT_FZ_UTIL_H
#define MT_FZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "model/params.h"
#include "optim/state_io.h"
#include "tokenizer/tokenizer.h"

#define FZ_SEP "\n#MTFZ#\n"
#define FZ_SEP_LEN 8
#define FZ_MAX_PARTS 8

typedef struct {
    const uint8_t *p;
    size_t n;
} fz_part;

/* Splits data at each FZ_SEP into at most max parts (the last takes the rest); returns the count. */
int fz_split(const uint8_t *data, size_t size, fz_part *parts, int max);

/* The fixture tree: $MT_FIXTURES, else the source tree's tests/fixtures. */
const char *fz_fixtures(void);

/* This process's private directory: created on first use under $MT_FUZZ_TMP, /dev/shm or /tmp,
 * removed (with the flat files in it) at exit. */
const char *fz_dir(void);

/* fz_dir()/name, in a static buffer per slot (0..7). */
const char *fz_path(int slot, const char *name);

/* Writes n bytes to fz_dir()/name (replacing it) and returns its path (slot 0..7, as fz_path);
 * data NULL removes the file instead (a part that is absent). */
const char *fz_write(int slot, const char *name, const void *data, size_t n);

/* A fixture tokenizer by its path under the fixtures ("tokenizers/gpt2"); aborts when it fails. */
mt_tokenizer *fz_tokenizer(const char *rel);

/* The fixture tokenizers the encode, decode and chat targets choose from by an input byte. */
extern const char *const FZ_TOKENIZERS[];
enum { FZ_N_TOKENIZERS = 7 };

/* The model of the checkpoint target (tiny, so that a whole checkpoint is a few KiB). */
#define FZ_CKPT_CONFIG                                                                          \
    "{\"model_type\": \"llama\", \"hidden_size\": 8, \"intermediate_size\": 16, "               \
    "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "        \
    "\"vocab_size\": 12, \"tie_word_embeddings\": false, \"rms_norm_eps\": 1e-05}"

/* The checkpoint target's state: one host optimizer state of format f over the whole table
 * (tensor p at p->offset) behind an mt_state_io, as the engine's looks to a checkpoint. */
typedef struct {
    mt_optim_state *s;
    mt_state_io io; /* ctx: this struct */
    int n_sets;     /* calls of set_weights, set_parts, set_sr_seed */
} fz_state;
fz_state *fz_state_create(mt_state_format f, const mt_param_table *t);
void fz_state_free(fz_state *fs);

/* What every open safetensors handle must satisfy: each tensor found by its name, numel and nbytes
 * agreeing with shape and dtype, float tensors converting to fp32, and all tensors together no more
 * than total_bytes (their data sections: they do not overlap). */
struct mt_safetensors;
void fz_check_safetensors(const struct mt_safetensors *st, size_t total_bytes);

/* Called where a harness's input was refused (MT_ERR): prints the message when $MT_FUZZ_VERBOSE is
 * set, to see why a seed or a crash input is refused. */
void fz_refused(void);

void fz_fail(const char *file, int line, const char *what);
#define FZ_ASSERT(cond)                                        \
    do {                                                       \
        if (!(cond)) fz_fail(__FILE__, __LINE__, #cond);       \
    } while (0)

#endif
