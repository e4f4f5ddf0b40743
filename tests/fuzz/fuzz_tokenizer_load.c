/* libFuzzer: tokenizer.json loading (mt_tokenizer_load on a directory).
 * Input: tokenizer.json FZ_SEP tokenizer_config.json FZ_SEP chat_template.jinja (absent parts are
 * absent files). A tokenizer that loads is used: a fixed text with special tokens and bytes that
 * are not UTF-8 is encoded (ids in the vocabulary) and decoded, every id is looked up, and every
 * id is decoded once. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "fz_util.h"
#include "tokenizer/tokenizer.h"

static const char *const FILES[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"};
enum { N_FILES = sizeof FILES / sizeof *FILES };

static const char TEXT[] = "Hello, world! <s>[INST] caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xff\xfe 123 "
                           "<|endoftext|>  \n\tfoo bar</s><|im_start|>";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_part parts[N_FILES];
    int n = fz_split(data, size, parts, N_FILES);
    for (int i = 0; i < N_FILES; i++)
        fz_write(i, FILES[i], i < n ? parts[i].p : NULL, i < n ? parts[i].n : 0);
    mt_tokenizer *t = (mt_tokenizer *)1;
    mt_error_clear();
    if (mt_tokenizer_load(&t, fz_dir()) != MT_OK) {
        FZ_ASSERT(t == NULL && mt_error_message()[0]);
        fz_refused();
        return 0;
    }
    int V = mt_tokenizer_vocab_size(t);
    FZ_ASSERT(V >= 0);
    FZ_ASSERT(mt_tokenizer_bos(t) < V && mt_tokenizer_eos(t) < V);
    for (int add = 0; add < 2; add++) {
        int32_t *ids;
        size_t ni;
        FZ_ASSERT(mt_tokenizer_encode(t, TEXT, sizeof TEXT - 1, add, &ids, &ni) == MT_OK);
        for (size_t i = 0; i < ni; i++) FZ_ASSERT(ids[i] >= 0 && ids[i] < V);
        char *s;
        size_t sl;
        FZ_ASSERT(mt_tokenizer_decode(t, ids, ni, add ? MT_TOK_SKIP_SPECIAL : MT_TOK_HF_LOSSY, &s, &sl) == MT_OK);
        FZ_ASSERT(strlen(s) <= sl);
        free(s);
        free(ids);
    }
    for (int id = 0; id < V; id++) {
        size_t len = 0;
        const char *tok = mt_tokenizer_token(t, id, &len);
        (void)mt_tokenizer_is_special(t, id);
        char *s = NULL;
        size_t sl;
        /* an id without a token (a hole in the ids) does not decode */
        FZ_ASSERT((mt_tokenizer_decode(t, &id, 1, 0, &s, &sl) == MT_OK) == (tok != NULL));
        free(s);
        if (tok) FZ_ASSERT(memchr(tok, 0, len) != NULL || mt_tokenizer_token_id(t, tok) >= 0);
    }
    int32_t bad = V;
    char *s = NULL;
    size_t sl;
    FZ_ASSERT(mt_tokenizer_decode(t, &bad, 1, 0, &s, &sl) == MT_ERR);
    (void)mt_tokenizer_chat_template(t);
    mt_tokenizer_free(t);
    return 0;
}
