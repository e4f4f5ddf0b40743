#include "util/config_check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/layer.h"
#include "util/testutil.h"

mt_config mt_test_config_load(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *path = mt_fixture_vpathf(fmt, ap);
    va_end(ap);
    mt_config c;
    int r = mt_config_load(&c, path);
    if (r != MT_OK) print_error("%s\n", mt_error_message());
    assert_int_equal(r, MT_OK);
    free(path);
    return c;
}

mt_config mt_test_config_parse(const char *json) {
    mt_config c;
    if (mt_config_parse(&c, json, "c.json") != MT_OK) fail_msg("%s", mt_error_message());
    return c;
}

void mt_test_config_refused(const char *json, const char *says) {
    mt_config c;
    assert_int_equal(mt_config_parse(&c, json, "c.json"), MT_ERR);
    if (!strstr(mt_error_message(), says))
        fail_msg("error \"%s\" does not say \"%s\"", mt_error_message(), says);
}

void mt_test_config_roundtrip(const mt_config *a) {
    char *dir = mt_test_tmpdir(), path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mt_config b;
    assert_int_equal(mt_config_save(a, path), MT_OK);
    if (mt_config_load(&b, path) != MT_OK) fail_msg("%s", mt_error_message());
    assert_memory_equal(a, &b, sizeof b);
    mt_test_rmtree(dir);
    free(dir);
}

void mt_test_backend_refused(const mt_config *c, const mt_backend *be, const char *says) {
    assert_int_equal(mt_layer_backend_check(c, be), MT_ERR);
    assert_non_null(strstr(mt_error_message(), says));
    assert_non_null(strstr(mt_error_message(), "--device cpu"));
}
