/* train --base-cache (cli/cached_base.h). */
#include "cached_base.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../core/error.h"
#include "../engine/quant_base_cache.h"
#include "../io/model_io.h"

static int set_tensor(void *ctx, const mt_param *p, const float *w) {
    const mt_state_io *io = ctx;
    return io->set_weights(io->ctx, p, w);
}

typedef struct {
    const mt_quant_base *q;
    const mt_state_io *io;
} outside_base;

static int outside_the_base(void *ctx, const mt_param *p) {
    const outside_base *o = ctx;
    return !mt_quant_base_holds(o->q, p);
}
static int set_outside(void *ctx, const mt_param *p, const float *w) {
    const outside_base *o = ctx;
    return o->io->set_weights(o->io->ctx, p, w);
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int mt_cached_base_load(mt_engine *e, const mt_param_table *t, const char *model_dir, const char *cache_dir,
                        const mt_state_io *io) {
    mt_quant_base *q = mt_engine_quant_base(e);
    if (!q) return mt_model_load_tensors(t, model_dir, set_tensor, (void *)io);
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
        outside_base o = {q, io};
        rc = mt_model_load_tensors_where(t, model_dir, outside_the_base, set_outside, &o);
        if (rc == MT_OK)
            printf("base cache: %s read (%.2f GiB, %.1f s): the checkpoint's quantized layers not read\n", path,
                   gib, seconds() - t0);
    } else {
        rc = mt_model_load_tensors(t, model_dir, set_tensor, (void *)io);
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
