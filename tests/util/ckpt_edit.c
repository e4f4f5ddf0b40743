#include "util/ckpt_edit.h"

#include <stdio.h>

#include "io/digest.h"
#include "util/cmocka_includes.h"

json_t *mt_test_ckpt_load_state(const char *dir) {
    char p[4400];
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    json_error_t je;
    json_t *o = json_load_file(p, 0, &je);
    if (!o) fail_msg("%s: %s", p, je.text);
    return o;
}

void mt_test_ckpt_store_state(const char *dir, json_t *o) {
    char p[4400];
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    assert_int_equal(json_dump_file(o, p, JSON_INDENT(2)), 0);
    json_decref(o);
}

void mt_test_ckpt_restamp(const char *dir, const char *file) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    mt_file_digest d;
    assert_int_equal(mt_digest_file(p, &d), 0);
    char hex[MT_DIGEST_HEX];
    mt_digest_hex(d.xxh3, hex);
    json_t *o = mt_test_ckpt_load_state(dir);
    json_t *e = json_object_get(json_object_get(o, "files"), file);
    assert_non_null(e);
    json_object_set_new(e, "bytes", json_integer((json_int_t)d.bytes));
    json_object_set_new(e, "xxh3_64", json_string(hex));
    mt_test_ckpt_store_state(dir, o);
}
