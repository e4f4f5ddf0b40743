/* libFuzzer: loading a training checkpoint (mt_checkpoint_load) into the tiny model FZ_CKPT_CONFIG,
 * once into a state of each format (full, compact, tight).
 * Input: trainer_state.json FZ_SEP config.json FZ_SEP model.safetensors FZ_SEP
 * optimizer.safetensors (absent parts are absent files). On MT_ERR the state and *st are untouched
 * (checkpoint.h: io is not called); on MT_OK *st is well formed, every tensor was set once, and its
 * weights and fp32 parts are finite. */
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
enum { N_FILES = sizeof FILES / sizeof *FILES, N_ARENAS = 9 };

static mt_param_table table;
static fz_state *state[3];
static float *weights;

/* The state's arenas with their byte sizes. */
static int arenas(const fz_state *fs, unsigned char **p, size_t *bytes) {
    mt_optim_arenas a = mt_optim_state_arenas(fs->s);
    void *ptr[N_ARENAS] = {a.master, a.m, a.v, a.w, a.comp, a.mq, a.vq, a.ms, a.vs};
    size_t b[N_ARENAS] = {4 * a.n, 4 * a.n, 4 * a.n, mt_dtype_size(a.w_dtype) * a.n, 2 * a.n,
                          a.n, a.n, 4 * a.nblocks, 4 * a.nblocks};
    int n = 0;
    for (int i = 0; i < N_ARENAS; i++)
        if (ptr[i]) p[n] = ptr[i], bytes[n++] = b[i];
    return n;
}

static void poison(fz_state *fs) {
    unsigned char *p[N_ARENAS];
    size_t b[N_ARENAS];
    int n = arenas(fs, p, b);
    for (int i = 0; i < n; i++) memset(p[i], 0x5A, b[i]);
    fs->n_sets = 0;
}

static int poisoned(const fz_state *fs) {
    unsigned char *p[N_ARENAS];
    size_t b[N_ARENAS];
    int n = arenas(fs, p, b);
    for (int i = 0; i < n; i++)
        for (size_t j = 0; j < b[i]; j++)
            if (p[i][j] != 0x5A) return 0;
    return fs->n_sets == 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    mt_config cfg;
    if (mt_config_parse(&cfg, FZ_CKPT_CONFIG, "FZ_CKPT_CONFIG") != MT_OK) fz_fail(__FILE__, __LINE__, "config");
    mt_param_table_init(&table, &cfg);
    for (int f = 0; f < 3; f++) state[f] = fz_state_create((mt_state_format)f, &table);
    weights = malloc(sizeof(float) * (size_t)table.total);
    return 0;
}

/* After a load: every tensor's weights and fp32 parts finite. */
static void check_loaded(fz_state *fs) {
    for (int i = 0; i < table.n_params; i++) {
        const mt_param *p = &table.params[i];
        FZ_ASSERT(fs->io.get_weights(fs, p, weights) == MT_OK);
        for (int64_t j = 0; j < p->numel; j++) FZ_ASSERT(isfinite(weights[j]));
        mt_optim_tensor x[MT_OPTIM_MAX_TENSORS];
        mt_optim_arenas a = mt_optim_state_arenas(fs->s);
        int n = mt_optim_arenas_parts(&a, (size_t)p->offset, (size_t)p->numel, x);
        FZ_ASSERT(n > 0);
        for (int k = 0; k < n; k++)
            for (size_t j = 0; x[k].dtype == MT_F32 && j < x[k].numel; j++)
                FZ_ASSERT(isfinite(((const float *)x[k].data)[j]));
    }
    int sets = 2 * table.n_params + (fs->io.format == MT_STATE_TIGHT);
    FZ_ASSERT(fs->n_sets == sets);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_part parts[N_FILES];
    int n = fz_split(data, size, parts, N_FILES);
    for (int i = 0; i < N_FILES; i++)
        fz_write(i, FILES[i], i < n ? parts[i].p : NULL, i < n ? parts[i].n : 0);
    for (int f = 0; f < 3; f++) {
        fz_state *fs = state[f];
        poison(fs);
        mt_ckpt_state st, st0;
        memset(&st, 0x5A, sizeof st);
        memset(&st0, 0x5A, sizeof st0);
        mt_error_clear();
        if (mt_checkpoint_load(fz_dir(), &table, &fs->io, &st) != MT_OK) {
            FZ_ASSERT(mt_error_message()[0] && memcmp(&st, &st0, sizeof st) == 0);
            FZ_ASSERT(poisoned(fs));
            fz_refused();
            continue;
        }
        FZ_ASSERT(st.step >= 0 && st.updates >= 0 && st.updates <= st.step);
        FZ_ASSERT((int)st.state == f);
        mt_ckpt_state_free(&st); /* the recorded args */
        check_loaded(fs);
    }
    return 0;
}
