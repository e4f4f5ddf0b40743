/* libFuzzer: encoding any bytes with the fixture tokenizers (mt_tokenizer_encode_into).
 * Input: byte 0 picks the tokenizer (FZ_TOKENIZERS) and add_special, the rest is the text.
 * Encoding never fails; every id is in the vocabulary, the ids decode, and for the byte-level
 * tokenizers without a normalizer (GPT-2, Llama 3) decode(encode(x)) == x whenever x holds no added
 * token that strips whitespace (tokenizer.h: text that is not UTF-8 round-trips too). */
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

static int has(const char *text, size_t n, const char *s) { return memmem(text, n, s, strlen(s)) != NULL; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int k = data[0] % FZ_N_TOKENIZERS, add = (data[0] >> 4) & 1;
    const mt_tokenizer *t = toks[k];
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    mt_token_vec v = {0};
    FZ_ASSERT(mt_tokenizer_encode_into(t, text, n, add, &v) == MT_OK);
    int V = mt_tokenizer_vocab_size(t);
    for (size_t i = 0; i < v.n; i++) FZ_ASSERT(v.ids[i] >= 0 && v.ids[i] < V);
    char *s;
    size_t sl;
    FZ_ASSERT(mt_tokenizer_decode(t, v.ids, v.n, 0, &s, &sl) == MT_OK);
    int byte_level = k == 0 || k == 1; /* gpt2, llama3 */
    if (byte_level && !add && !has(text, n, "<mask>") && !has(text, n, "[TOOL]"))
        FZ_ASSERT(sl == n && memcmp(s, text, n) == 0);
    free(s);
    FZ_ASSERT(mt_tokenizer_decode(t, v.ids, v.n, MT_TOK_HF_LOSSY | MT_TOK_SKIP_SPECIAL, &s, &sl) == MT_OK);
    free(s);
    mt_token_vec_free(&v);
    return 0;
}
