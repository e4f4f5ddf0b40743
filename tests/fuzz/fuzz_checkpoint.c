/* libFuzzer: loading a training checkpoint (mt_checkpoint_load) into the tiny model FZ_CKPT_CONFIG.
 * Input: trainer_state.json FZ_SEP config.json FZ_SEP model.safetensors FZ_SEP
 * optimizer.safetensors (absent parts are absent files). On MT_ERR the three arenas and the state
 * are untouched (checkpoint.h); on MT_OK the state is well formed and the arenas' padding zero. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "fz_util.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/params.h"

static const char *const FILES[] = {"trainer_state.json", "config.json", "model.safetensors",
                                    "optimizer.safetensors"};
enum { N_FILES = sizeof FILES / sizeof *FILES };

static mt_param_table table;
static float *arena[3], *pristine;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    mt_config cfg;
    if (mt_config_parse(&cfg, FZ_CKPT_CONFIG, "FZ_CKPT_CONFIG") != MT_OK) fz_fail(__FILE__, __LINE__, "config");
    mt_param_table_init(&table, &cfg);
    pristine = malloc(sizeof(float) * (size_t)table.total);
    for (int64_t i = 0; i < table.total; i++) pristine[i] = NAN;
    for (int k = 0; k < 3; k++) arena[k] = malloc(sizeof(float) * (size_t)table.total);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_part parts[N_FILES];
    int n = fz_split(data, size, parts, N_FILES);
    for (int i = 0; i < N_FILES; i++)
        fz_write(i, FILES[i], i < n ? parts[i].p : NULL, i < n ? parts[i].n : 0);
    size_t bytes = sizeof(float) * (size_t)table.total;
    for (int k = 0; k < 3; k++) memcpy(arena[k], pristine, bytes);
    mt_ckpt_state st, st0;
    memset(&st, 0x5A, sizeof st);
    memset(&st0, 0x5A, sizeof st0);
    mt_error_clear();
    if (mt_checkpoint_load(fz_dir(), &table, arena[0], arena[1], arena[2], &st) != MT_OK) {
        FZ_ASSERT(mt_error_message()[0] && memcmp(&st, &st0, sizeof st) == 0);
        for (int k = 0; k < 3; k++) FZ_ASSERT(memcmp(arena[k], pristine, bytes) == 0);
        fz_refused();
        return 0;
    }
    FZ_ASSERT(st.step >= 0 && st.updates >= 0 && st.updates <= st.step);
    mt_ckpt_state_free(&st); /* the recorded args */
    for (int k = 0; k < 3; k++) {
        int64_t cursor = 0;
        for (int i = 0; i < table.n_params; i++) {
            for (int64_t j = cursor; j < table.params[i].offset; j++) FZ_ASSERT(arena[k][j] == 0);
            cursor = table.params[i].offset + table.params[i].numel;
        }
        for (int64_t j = cursor; j < table.total; j++) FZ_ASSERT(arena[k][j] == 0);
    }
    return 0;
}
