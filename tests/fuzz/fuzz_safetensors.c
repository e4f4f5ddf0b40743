/* libFuzzer: one safetensors file (mt_safetensors_open_file), the input being the whole file.
 * A file that opens is then read as the loader reads it: every tensor by index and by name, the
 * metadata, and each float tensor converted to fp32 (fz_check_safetensors). */
#include "core/error.h"
#include "fz_util.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fz_write(0, "model.safetensors", data, size);
    mt_safetensors *st = (mt_safetensors *)1;
    mt_error_clear();
    int rc = mt_safetensors_open_file(&st, path);
    if (rc != MT_OK) {
        FZ_ASSERT(st == NULL && mt_error_message()[0]);
        fz_refused();
        return 0;
    }
    FZ_ASSERT(size >= 8);
    fz_check_safetensors(st, size - 8);
    mt_safetensors_close(st);
    return 0;
}
