#include "util/ckpt_edit.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

json_t *mt_test_st_read_header(FILE *f, const char *path, uint64_t *n) {
    unsigned char len8[8];
    assert_int_equal(fread(len8, 1, 8, f), 8);
    *n = 0;
    for (int i = 7; i >= 0; i--) *n = *n << 8 | len8[i];
    char *header = malloc(*n);
    assert_int_equal(fread(header, 1, *n, f), *n);
    json_error_t je;
    json_t *o = json_loadb(header, *n, 0, &je);
    free(header);
    if (!o) fail_msg("%s: header is not JSON: %s", path, je.text);
    return o;
}

int mt_test_ckpt_fill_f32(const char *dir, const char *file, const char *name_part, long first, long count,
                          float value) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "r+b");
    if (!f) fail_msg("cannot open %s", p);
    uint64_t n;
    json_t *o = mt_test_st_read_header(f, p, &n);
    const char *name;
    json_t *e;
    int touched = 0;
    json_object_foreach(o, name, e) {
        if (!strstr(name, name_part) || strcmp(name, "__metadata__") == 0) continue;
        if (strcmp(json_string_value(json_object_get(e, "dtype")), "F32") != 0) fail_msg("%s: %s is not F32", p, name);
        json_t *off = json_object_get(e, "data_offsets");
        long begin = (long)json_integer_value(json_array_get(off, 0)), end = (long)json_integer_value(json_array_get(off, 1));
        long numel = (end - begin) / 4, last = count < 0 || first + count > numel ? numel : first + count;
        assert_int_equal(fseek(f, 8 + (long)n + begin + 4 * first, SEEK_SET), 0);
        for (long k = first; k < last; k++) assert_int_equal(fwrite(&value, 4, 1, f), 1);
        touched++;
    }
    json_decref(o);
    fclose(f);
    if (!touched) fail_msg("%s: no tensor named like '%s'", p, name_part);
    mt_test_ckpt_restamp(dir, file);
    return touched;
}
