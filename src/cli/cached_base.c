/* train --base-cache (cli/cached_base.h). */
#include "cached_base.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../core/error.h"
#include "../engine/quant_base_cache.h"
#include "../io/model_io.h"

/* The engine's state io for fp32 tensors; an mxfp4 base takes its experts' MXFP4 pairs as they are. */
typedef struct {
    mt_quant_base *q; /* NULL: none */
    const mt_state_io *io;
} base_sink;

static int set_tensor(void *ctx, const mt_param *p, const float *w) {
    const base_sink *o = ctx;
    return o->io->set_weights(o->io->ctx, p, w);
}
static int take_mxfp4(void *ctx, const mt_param *p, const uint8_t *blocks, const uint8_t *scales) {
    const base_sink *o = ctx;
    return mt_quant_base_take_mxfp4(o->q, p, blocks, scales);
}
static int outside_the_base(void *ctx, const mt_param *p) {
    const base_sink *o = ctx;
    return !mt_quant_base_holds(o->q, p);
}

int mt_base_weights_load(mt_engine *e, const mt_param_table *t, const char *model_dir, const mt_state_io *io) {
    base_sink o = {mt_engine_quant_base(e), io};
    return mt_model_load_tensors_mxfp4(t, model_dir, NULL, set_tensor, take_mxfp4, &o);
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int mt_cached_base_load(mt_engine *e, const mt_param_table *t, const char *model_dir, const char *cache_dir,
                        const mt_state_io *io) {
    mt_quant_base *q = mt_engine_quant_base(e);
    if (!q) return mt_base_weights_load(e, t, model_dir, io);
    uint64_t key;
    char *path;
    MT_TRY(mt_quant_base_cache_key(t, mt_quant_base_format(q), mt_quant_base_first(q), model_dir, cache_dir,
                                   &key, &path));
    double gib = 0, t0 = seconds();
    for (int l = 0; l < mt_quant_base_n_layers(q); l++)
        gib += (double)mt_quant_base_blob_bytes(q, mt_quant_base_first(q) + l) / 1073741824.0;
    int hit = mt_quant_base_cache_load(q, path, key);
    if (hit < 0) fprintf(stderr, "megatrain: warning: base cache: %s; quantizing the checkpoint again\n", mt_error_message());
    int rc;
    if (hit == 1) {
        base_sink o = {q, io};
        rc = mt_model_load_tensors_where(t, model_dir, outside_the_base, set_tensor, &o);
        if (rc == MT_OK)
            printf("base cache: %s read (%.2f GiB, %.1f s): the checkpoint's quantized layers not read\n", path,
                   gib, seconds() - t0);
    } else {
        rc = mt_base_weights_load(e, t, model_dir, io);
        double t1 = seconds();
        if (rc == MT_OK && mt_quant_base_cache_save(q, path, key) == MT_OK)
            printf("base cache: %s written (%.2f GiB, %.1f s) for the next run\n", path, gib, seconds() - t1);
        else if (rc == MT_OK)
            fprintf(stderr, "megatrain: warning: base cache not written: %s\n", mt_error_message());
    }
    fflush(stdout);
    free(path);
    return rc;
}
