/* libFuzzer: decoding any ids with the fixture tokenizers (mt_tokenizer_decode).
 * Input: byte 0 picks the tokenizer (FZ_TOKENIZERS) and the flags, then little-endian uint16s,
 * each an id modulo the vocabulary, except 0xFFFF (-1) and 0xFFFE (the vocabulary size): those two
 * (and ids without a token) must give MT_ERR with a message, every other sequence MT_OK and a
 * NUL-terminated string. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "fz_util.h"
#include "tokenizer/tokenizer.h"

static mt_tokenizer *toks[FZ_N_TOKENIZERS];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    for (int i = 0; i < FZ_N_TOKENIZERS; i++) toks[i] = fz_tokenizer(FZ_TOKENIZERS[i]);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const mt_tokenizer *t = toks[data[0] % FZ_N_TOKENIZERS];
    unsigned flags = (data[0] >> 4) & (MT_TOK_SKIP_SPECIAL | MT_TOK_HF_LOSSY);
    int V = mt_tokenizer_vocab_size(t);
    size_t n = (size - 1) / 2;
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    int out_of_range = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned u = data[1 + 2 * i] | (unsigned)data[2 + 2 * i] << 8;
        ids[i] = u == 0xFFFF ? -1 : u == 0xFFFE ? V : (int32_t)(u % (unsigned)V);
        out_of_range |= u >= 0xFFFE || !mt_tokenizer_token(t, ids[i], NULL);
    }
    char *s = NULL;
    size_t sl = 0;
    mt_error_clear();
    int rc = mt_tokenizer_decode(t, ids, n, flags, &s, &sl);
    if (out_of_range) {
        FZ_ASSERT(rc == MT_ERR && mt_error_message()[0]);
    } else {
        FZ_ASSERT(rc == MT_OK && s && s[sl] == 0);
        free(s);
    }
    free(ids);
    return 0;
}
