#include "util/fixture_io.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/model_io.h"
#include "util/config_check.h"
#include "util/host_buffers.h"
#include "util/testutil.h"

int mt_test_fixture_st_open(void **state, mt_safetensors **st, const char *rel, const char *who) {
    char *path = mt_fixture_path(rel);
    int rc = mt_safetensors_open_file(st, path);
    if (rc != MT_OK) fprintf(stderr, "%s: %s\n", who, mt_error_message());
    free(path);
    *state = rc == MT_OK ? *st : NULL;
    return rc == MT_OK ? 0 : -1;
}

int mt_test_fixture_st_teardown(void **state) {
    mt_safetensors_close(*state);
    return 0;
}

float *mt_test_st_f32(const mt_safetensors *st, const char *name, int64_t numel) {
    const mt_st_tensor *t = mt_safetensors_find(st, name);
    if (!t) fail_msg("reference tensor %s missing", name);
    assert_int_equal(t->numel, numel);
    float *out = malloc((size_t)numel * sizeof(float));
    assert_int_equal(mt_st_tensor_to_f32(t, out), MT_OK);
    return out;
}

int32_t *mt_test_st_i32(const mt_safetensors *st, const char *name, int *B, int *T) {
    const mt_st_tensor *t = mt_safetensors_find(st, name);
    if (!t) fail_msg("reference tensor %s missing", name);
    assert_int_equal(t->dtype, MT_I32);
    assert_int_equal(t->ndim, 2);
    *B = (int)t->shape[0];
    *T = (int)t->shape[1];
    int32_t *out = malloc(t->nbytes);
    memcpy(out, t->data, t->nbytes);
    return out;
}

float *mt_test_fixture_weights(const char *name, mt_param_table *t) {
    mt_config cfg = mt_test_config_load("%s/config.json", name);
    mt_param_table_init(t, &cfg);
    float *w = mt_aligned_alloc((size_t)t->total * sizeof(float));
    char *dir = mt_fixture_path(name);
    if (mt_model_load(t, w, dir) != MT_OK) fail_msg("%s", mt_error_message());
    free(dir);
    return w;
}

float *mt_test_fixture_weights_bf16(const char *name, mt_param_table *t) {
    float *w = mt_test_fixture_weights(name, t);
    mt_test_round_bf16(w, (size_t)t->total);
    return w;
}

mt_tokenizer *mt_test_tokenizer_load(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *path = mt_fixture_vpathf(fmt, ap);
    va_end(ap);
    mt_tokenizer *t = NULL;
    if (mt_tokenizer_load(&t, path) != MT_OK) fail_msg("%s: %s", path, mt_error_message());
    free(path);
    return t;
}

void mt_test_fixture_args(const char *dir, char *args, size_t size) {
    char path[4096];
    snprintf(path, sizeof path, "%s/args.txt", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(args, (int)size, f));
    fclose(f);
    args[strcspn(args, "\n")] = '\0';
}

void mt_test_table_matches_fixture(const mt_param_table *t, const char *name) {
    char rel[1024];
    snprintf(rel, sizeof rel, "%s/model.safetensors", name);
    char *path = mt_fixture_path(rel);
    mt_safetensors *st;
    assert_int_equal(mt_safetensors_open_file(&st, path), MT_OK);
    assert_int_equal(mt_safetensors_count(st), t->n_params);
    for (int j = 0; j < t->n_params; j++) {
        const mt_param *p = &t->params[j];
        const mt_st_tensor *x = mt_safetensors_find(st, p->name);
        if (!x) fail_msg("%s: not in the checkpoint", p->name);
        assert_int_equal(x->ndim, p->ndim);
        for (int d = 0; d < p->ndim; d++) assert_int_equal(x->shape[d], p->shape[d]);
    }
    mt_safetensors_close(st);
    free(path);
}
