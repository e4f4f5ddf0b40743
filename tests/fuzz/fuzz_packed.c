/* libFuzzer: packed rows files (mt_packed_open), the input being the whole file.
 * A file that opens is read back whole: every row's inputs are ids of the header's vocabulary,
 * targets are -1 or such ids, doc_start[t] <= t with doc_start[0] = 0, the LOSS targets count the
 * header's trained; then training batches (shuffled and not) and eval batches past the end. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "fz_util.h"
#include "data/packed.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fz_write(0, "data.packed", data, size);
    mt_packed_file f;
    mt_error_clear();
    if (mt_packed_open(&f, path, 0, 0) != MT_OK) {
        FZ_ASSERT(f.data == NULL && f.path == NULL && mt_error_message()[0]);
        fz_refused();
        return 0;
    }
    FZ_ASSERT(f.T >= 1 && f.rows >= 1 && (size_t)f.rows * f.row_bytes + MT_PACKED_HEADER == size);
    int T = f.T;
    int32_t *in = malloc(sizeof(int32_t) * 3 * (size_t)T * 2), *tg = in + 2 * T, *ds = tg + 2 * T;
    int64_t trained = 0;
    for (int64_t r = 0; r < f.rows; r++) {
        mt_packed_row(&f, r, in, tg, ds);
        FZ_ASSERT(ds[0] == 0);
        for (int t = 0; t < T; t++) {
            FZ_ASSERT(in[t] >= 0 && in[t] < f.vocab);
            FZ_ASSERT(tg[t] >= -1 && tg[t] < f.vocab);
            FZ_ASSERT(ds[t] >= 0 && ds[t] <= t);
            trained += tg[t] >= 0;
        }
    }
    FZ_ASSERT(trained == f.trained);
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        mt_batch_order o = {shuffle, 1234};
        for (int64_t step = 0; step < 3; step++) mt_packed_batch(&f, &o, step * f.rows, 2, in, tg, ds);
    }
    mt_packed_eval_batch(&f, f.rows - 1, 2, in, tg, ds);
    FZ_ASSERT(in[T] == 0 && tg[T] == -1 && ds[T] == 0);
    /* the caller's T and vocabulary are checked against the header */
    mt_packed_file g;
    FZ_ASSERT(mt_packed_open(&g, path, T + 1, 0) == MT_ERR);
    if (f.vocab > 1) FZ_ASSERT(mt_packed_open(&g, path, T, f.vocab - 1) == MT_ERR);
    free(in);
    mt_packed_close(&f);
    return 0;
}
