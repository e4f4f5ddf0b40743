/* libFuzzer: token files (mt_tokens_open). Input: byte 0 picks the token size (bit 0: uint32) and
 * the vocabulary (bits 1-3, VOCABS), the rest is the file. A file that opens is read as training
 * and eval do: every token read is < vocab and equals the file's bytes at its position (mod the
 * length); batches shuffled and not, and eval batches past the end are padding. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "fz_util.h"
#include "data/tokens.h"

static const int VOCABS[8] = {1, 2, 96, 256, 1000, 65535, 65536, 1 << 20};

static uint32_t file_at(const uint8_t *p, int es, int64_t i) {
    p += (size_t)i * es;
    return es == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8
                   : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int es = data[0] & 1 ? 4 : 2, vocab = VOCABS[(data[0] >> 1) & 7];
    const uint8_t *body = data + 1;
    size_t n = size - 1;
    const char *path = fz_write(0, "train.bin", body, n);
    mt_token_file f;
    mt_error_clear();
    if (mt_tokens_open(&f, path, es, vocab) != MT_OK) {
        FZ_ASSERT(f.data == NULL && f.path == NULL && mt_error_message()[0]);
        fz_refused();
        return 0;
    }
    FZ_ASSERT(f.n_tokens == (int64_t)(n / es) && n % es == 0 && f.n_tokens >= 2);
    for (int64_t i = 0; i < f.n_tokens; i++) FZ_ASSERT(file_at(body, es, i) < (uint32_t)vocab);
    enum { B = 3, T = 5 };
    int32_t in[B * T], tg[B * T];
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        mt_batch_order o = {shuffle, 99};
        for (int64_t step = 0; step < 4; step++) {
            int64_t s = step * 1000003;
            mt_tokens_batch(&f, &o, s, B, T, in, tg);
            for (int i = 0; i < B * T; i++) FZ_ASSERT(in[i] >= 0 && in[i] < vocab && tg[i] >= 0 && tg[i] < vocab);
            if (!shuffle) /* row r starts at (s*B + r)*T */
                for (int r = 0; r < B; r++)
                    FZ_ASSERT(in[r * T] == (int32_t)file_at(body, es, ((s * B + r) * T) % f.n_tokens));
        }
    }
    int64_t rows = mt_tokens_eval_rows(&f, T);
    FZ_ASSERT(rows >= 1);
    mt_tokens_eval_batch(&f, rows - 1, B, T, in, tg);
    for (int i = T; i < B * T; i++) FZ_ASSERT(in[i] == 0 && tg[i] == -1);
    FZ_ASSERT(mt_tokens_at(&f, -1) == (int32_t)file_at(body, es, f.n_tokens - 1));
    mt_tokens_close(&f);
    return 0;
}
