#include "util/state_snapshot.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "util/cmocka_includes.h"

static void append(mt_test_snapshot *s, const void *p, size_t n) {
    s->data = realloc(s->data, s->bytes + n);
    memcpy(s->data + s->bytes, p, n);
    s->bytes += n;
}

void mt_test_snapshot_state(mt_test_snapshot *s, mt_engine *e, const mt_param_table *t) {
    memset(s, 0, sizeof *s);
    const mt_state_io *io = mt_engine_state_io(e);
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        float *w = malloc((size_t)p->numel * sizeof(float));
        assert_int_equal(io->get_weights(io->ctx, p, w), MT_OK);
        append(s, w, (size_t)p->numel * sizeof(float));
        free(w);
        mt_optim_tensor parts[MT_OPTIM_MAX_TENSORS];
        int n = mt_optim_parts_layout(io->format, (size_t)p->numel, parts);
        assert_true(n > 0);
        for (int k = 0; k < n; k++) parts[k].data = malloc(parts[k].bytes);
        assert_int_equal(io->get_parts(io->ctx, p, parts), MT_OK);
        for (int k = 0; k < n; k++) {
            append(s, parts[k].data, parts[k].bytes);
            free(parts[k].data);
        }
    }
}

void mt_test_snapshot_upload(mt_test_snapshot *s, mt_engine *e, const mt_param_table *t) {
    memset(s, 0, sizeof *s);
    mt_engine_finish(e);
    mt_train_state *ts = mt_engine_state(e);
    size_t el = mt_dtype_size(mt_train_state_upload_dtype(ts));
    for (int l = -1; l <= t->cfg.L; l++)
        if (!mt_train_state_in_tier(ts, l))
            append(s, mt_train_state_upload(ts, l), (size_t)mt_group_size(t, l) * el);
}

void mt_test_snapshot_free(mt_test_snapshot *s) {
    free(s->data);
    memset(s, 0, sizeof *s);
}

void mt_test_snapshot_equal(const mt_test_snapshot *a, const mt_test_snapshot *b) {
    assert_int_equal(a->bytes, b->bytes);
    assert_memory_equal(a->data, b->data, a->bytes);
}
