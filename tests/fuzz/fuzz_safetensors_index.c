/* libFuzzer: a sharded model directory (mt_safetensors_open_dir without model.safetensors).
 * Input: model.safetensors.index.json FZ_SEP shard 1 FZ_SEP shard 2 (the fixture's shard names;
 * a missing part is a missing file). A directory that opens is read as fuzz_safetensors reads a
 * file, and every tensor must live in one of the shards. */
#include <string.h>

#include "core/error.h"
#include "fz_util.h"
#include "io/safetensors.h"

static const char *const FILES[] = {
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
};
enum { N_FILES = sizeof FILES / sizeof *FILES };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_part parts[N_FILES];
    int n = fz_split(data, size, parts, N_FILES);
    size_t shard_bytes = 0;
    for (int i = 0; i < N_FILES; i++) {
        fz_write(i, FILES[i], i < n ? parts[i].p : NULL, i < n ? parts[i].n : 0);
        if (i > 0 && i < n) shard_bytes += parts[i].n;
    }
    mt_safetensors *st = (mt_safetensors *)1;
    mt_error_clear();
    int rc = mt_safetensors_open_dir(&st, fz_dir());
    if (rc != MT_OK) {
        FZ_ASSERT(st == NULL && mt_error_message()[0]);
        fz_refused();
        return 0;
    }
    fz_check_safetensors(st, shard_bytes);
    for (int i = 0; i < mt_safetensors_count(st); i++) {
        const char *p = mt_safetensors_at(st, i)->path;
        FZ_ASSERT(strcmp(p, fz_path(1, FILES[1])) == 0 || strcmp(p, fz_path(2, FILES[2])) == 0);
    }
    mt_safetensors_close(st);
    return 0;
}
