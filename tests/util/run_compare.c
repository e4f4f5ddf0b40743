#include "run_compare.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "testutil.h"

int mt_test_read_step_metrics(const char *path, int max, double *loss, double *norm,
                              char (*text)[256]) {
    char line[4096];
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        if (!j) fail_msg("%s: not JSON: %s", path, line);
        if (json_object_get(j, "loss")) {
            assert_int_equal(json_integer_value(json_object_get(j, "step")), n + 1);
            if (n >= max) fail_msg("%s: more than %d step lines", path, max);
            loss[n] = json_number_value(json_object_get(j, "loss"));
            norm[n] = json_number_value(json_object_get(j, "grad_norm"));
            if (text) {
                const char *a = strstr(line, "\"loss\""), *b = strstr(line, "\"grad_norm\"");
                assert_non_null(a);
                assert_non_null(b);
                snprintf(text[n], sizeof text[n], "%.*s %.*s", (int)strcspn(a, ","), a,
                         (int)strcspn(b, ","), b);
            }
            n++;
        }
        json_decref(j);
    }
    fclose(f);
    return n;
}

void mt_test_weights_close(const char *pa, const char *pb, const char *label, double tol) {
    mt_safetensors *a = NULL, *b = NULL;
    if (mt_safetensors_open_file(&a, pa) != MT_OK) fail_msg("%s", mt_error_message());
    if (mt_safetensors_open_file(&b, pb) != MT_OK) fail_msg("%s", mt_error_message());
    assert_int_equal(mt_safetensors_count(a), mt_safetensors_count(b));
    for (int i = 0; i < mt_safetensors_count(a); i++) {
        const mt_st_tensor *x = mt_safetensors_at(a, i), *y = mt_safetensors_find(b, x->name);
        if (!y) fail_msg("%s has %s, %s does not", pa, x->name, pb);
        assert_int_equal(x->dtype, MT_F32);
        assert_int_equal(y->dtype, MT_F32);
        assert_int_equal(x->nbytes, y->nbytes);
        char what[256];
        snprintf(what, sizeof what, "%s %s", label, x->name);
        if (!mt_check_rel(what, y->data, x->data, x->nbytes / sizeof(float), tol))
            fail_msg("%s: %s differs from %s", pb, x->name, pa);
    }
    mt_safetensors_close(a);
    mt_safetensors_close(b);
}

void mt_test_same_bytes(const char *pa, const char *pb) {
    char cmd[20000], out[4096];
    snprintf(cmd, sizeof cmd, "cmp '%s' '%s' || { cmp -l '%s' '%s' | head -4; exit 1; }", pa, pb, pa, pb);
    if (mt_test_run(cmd, out, sizeof out) != 0) fail_msg("%s differs from %s: %s", pb, pa, out);
}
