/* safetensors: write -> read round trips, sharded directories, and one test per kind of bad file
 * (each built byte by byte), checking MT_ERR and a message naming the file and the tensor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "util/testutil.h"

/* u64 little-endian header length, then `header` (its strlen), then `data`. */
static void write_st_raw(const char *path, uint64_t hlen, const char *header, const void *data,
                         size_t n) {
    size_t h = strlen(header);
    unsigned char *buf = malloc(8 + h + n + 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, header, h);
    if (n) memcpy(buf + 8 + h, data, n);
    mt_test_write_bytes(path, buf, 8 + h + n);
    free(buf);
}

/* A well-formed length prefix for `header`. */
static void write_st(const char *path, const char *header, const void *data, size_t n) {
    write_st_raw(path, strlen(header), header, data, n);
}

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Opening must fail, leave *out NULL, and name the file and (when given) the tensor. */
static void expect_open_error(const char *path, int is_dir, const char *must_name,
                              const char *must_say) {
    mt_safetensors *st = (mt_safetensors *)1;
    int rc = is_dir ? mt_safetensors_open_dir(&st, path) : mt_safetensors_open_file(&st, path);
    const char *msg = mt_error_message();
    fprintf(stderr, "  error: %s\n", msg);
    assert_int_equal(rc, MT_ERR);
    assert_null(st);
    assert_non_null(strstr(msg, path));
    if (must_name) assert_non_null(strstr(msg, must_name));
    if (must_say) assert_non_null(strstr(msg, must_say));
    assert_null(strchr(msg, '\n'));
}

/* ---- round trips ---- */

static void test_roundtrip_dtypes_and_ranks(void **state) {
    char p[512];
    mt_test_dir_path(p, "rt.safetensors");
    float scalar = 3.25f;
    mt_bf16 vb[5];
    uint16_t vh[6];
    int32_t vi[24];
    int64_t vl[4] = {-1, 0, 1LL << 40, 7};
    uint8_t vu[3] = {1, 2, 255};
    const float fb[5] = {1.0f, -2.5f, 0.0f, 1e-3f, 65504.0f};
    for (int i = 0; i < 5; i++) vb[i] = mt_f32_to_bf16(fb[i]);
    for (int i = 0; i < 6; i++) vh[i] = mt_f32_to_f16((float)i - 2.5f);
    for (int i = 0; i < 24; i++) vi[i] = i * 1000 - 7;
    const mt_st_write_tensor w[] = {
        {"scalar", MT_F32, 0, {0}, &scalar},
        {"a.bf16", MT_BF16, 1, {5}, vb},
        {"b.f16", MT_F16, 2, {2, 3}, vh},
        {"c.i32", MT_I32, 3, {2, 3, 4}, vi},
        {"d.i64", MT_I64, 2, {2, 2}, vl},
        {"e.u8", MT_U8, 1, {3}, vu},
        {"f.empty", MT_F32, 2, {0, 4}, NULL},
    };
    const int n = (int)(sizeof w / sizeof w[0]);
    const mt_st_meta meta[] = {{"format", "pt"}, {"note", "h\xc3\xa9llo"}};
    assert_int_equal(mt_safetensors_write(p, w, n, meta, 2), MT_OK);

    mt_safetensors *st = NULL;
    if (mt_safetensors_open_file(&st, p) != MT_OK) fail_msg("%s", mt_error_message());
    assert_int_equal(mt_safetensors_count(st), n);
    for (int i = 0; i < n; i++) {
        const mt_st_tensor *t = mt_safetensors_find(st, w[i].name);
        assert_non_null(t);
        assert_ptr_equal(t, mt_safetensors_at(st, i)); /* written in order, read in file order */
        assert_string_equal(t->name, w[i].name);
        assert_string_equal(t->path, p);
        assert_int_equal(t->dtype, w[i].dtype);
        assert_int_equal(t->ndim, w[i].ndim);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            assert_int_equal(t->shape[d], w[i].shape[d]);
            numel *= w[i].shape[d];
        }
        assert_int_equal(t->numel, numel);
        assert_int_equal(t->nbytes, (size_t)numel * mt_dtype_size(w[i].dtype));
        if (numel) assert_memory_equal(t->data, w[i].data, t->nbytes);
        if (i == 0) assert_int_equal((uintptr_t)t->data % 8, 0); /* data section 8-aligned */
    }
    assert_null(mt_safetensors_find(st, "nope"));
    assert_string_equal(mt_safetensors_metadata(st, "format"), "pt");
    assert_string_equal(mt_safetensors_metadata(st, "note"), "h\xc3\xa9llo");
    assert_null(mt_safetensors_metadata(st, "absent"));

    float got[6];
    assert_int_equal(mt_st_tensor_to_f32(mt_safetensors_find(st, "scalar"), got), MT_OK);
    assert_true(got[0] == 3.25f);
    assert_int_equal(mt_st_tensor_to_f32(mt_safetensors_find(st, "a.bf16"), got), MT_OK);
    for (int i = 0; i < 5; i++) assert_true(got[i] == mt_bf16_to_f32(vb[i]));
    assert_int_equal(mt_st_tensor_to_f32(mt_safetensors_find(st, "b.f16"), got), MT_OK);
    for (int i = 0; i < 6; i++) assert_true(got[i] == (float)i - 2.5f);
    assert_int_equal(mt_st_tensor_to_f32(mt_safetensors_find(st, "c.i32"), got), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "c.i32"));
    mt_safetensors_close(st);

    /* the header is padded to 8 bytes with spaces */
    FILE *f = fopen(p, "rb");
    unsigned char len8[8];
    assert_int_equal(fread(len8, 1, 8, f), 8);
    fclose(f);
    assert_int_equal(len8[0] % 8, 0);
}

static int fill_copy(void *ctx, int i, int64_t b, int64_t k, void *dst) {
    memcpy(dst, (const float *)ctx + b, sizeof(float) * (size_t)k);
    return MT_OK;
}

static void test_roundtrip_fill_callback(void **state) {
    char p[512];
    mt_test_dir_path(p, "fill.safetensors");
    const int64_t n = 1500000; /* more than one 4 MiB bounce chunk */
    float *x = malloc(sizeof(float) * (size_t)n);
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 1);
    mt_test_fill_normal(&rng, x, (size_t)n, 1.0f);
    const mt_st_write_tensor w[] = {{"big", MT_F32, 2, {1500, 1000}, NULL}};
    assert_int_equal(mt_safetensors_write_fill(p, w, 1, NULL, 0, fill_copy, x), MT_OK);
    mt_safetensors *st;
    assert_int_equal(mt_safetensors_open_file(&st, p), MT_OK);
    const mt_st_tensor *t = mt_safetensors_find(st, "big");
    assert_int_equal(t->numel, n);
    assert_memory_equal(t->data, x, sizeof(float) * (size_t)n);
    float *y = malloc(sizeof(float) * (size_t)n);
    assert_int_equal(mt_st_tensor_to_f32(t, y), MT_OK);
    assert_memory_equal(y, x, sizeof(float) * (size_t)n);
    mt_safetensors_close(st);
    free(x);
    free(y);
}

static int fill_fails(void *ctx, int i, int64_t b, int64_t k, void *dst) {
    return mt_error_set("fill: simulated failure");
}

static void test_write_is_atomic(void **state) {
    char p[512], tmp[600];
    mt_test_dir_path(p, "atomic.safetensors");
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    float v[2] = {1, 2};
    const mt_st_write_tensor good[] = {{"w", MT_F32, 1, {2}, v}};
    assert_int_equal(mt_safetensors_write(p, good, 1, NULL, 0), MT_OK);
    struct stat before;
    assert_int_equal(stat(p, &before), 0);

    const mt_st_write_tensor lazy[] = {{"w", MT_F32, 1, {4}, NULL}};
    assert_int_equal(mt_safetensors_write_fill(p, lazy, 1, NULL, 0, fill_fails, NULL), MT_ERR);
    const mt_st_write_tensor dup[] = {{"w", MT_F32, 1, {2}, v}, {"w", MT_F32, 1, {2}, v}};
    assert_int_equal(mt_safetensors_write(p, dup, 2, NULL, 0), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "tensor w"));
    const mt_st_write_tensor neg[] = {{"n", MT_F32, 1, {-2}, v}};
    assert_int_equal(mt_safetensors_write(p, neg, 1, NULL, 0), MT_ERR);
    assert_false(file_exists(tmp));

    mt_safetensors *st;
    assert_int_equal(mt_safetensors_open_file(&st, p), MT_OK); /* the old file, intact */
    assert_int_equal(mt_safetensors_find(st, "w")->numel, 2);
    mt_safetensors_close(st);

    char nodir[512];
    mt_test_dir_path(nodir, "no/such/dir/x.safetensors");
    assert_int_equal(mt_safetensors_write(nodir, good, 1, NULL, 0), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "no/such/dir"));
}

/* A 16-bit tensor at an odd address (header length odd) still converts (UBSan-clean). */
static void test_unaligned_bf16(void **state) {
    char p[512];
    mt_test_dir_path(p, "odd.safetensors");
    const char *h = "{\"x\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]}}";
    assert_int_equal(strlen(h) % 2, 1);
    mt_bf16 v[3] = {mt_f32_to_bf16(1.5f), mt_f32_to_bf16(-2.0f), mt_f32_to_bf16(0.25f)};
    write_st(p, h, v, sizeof v);
    mt_safetensors *st;
    if (mt_safetensors_open_file(&st, p) != MT_OK) fail_msg("%s", mt_error_message());
    float got[3];
    assert_int_equal(mt_st_tensor_to_f32(mt_safetensors_find(st, "x"), got), MT_OK);
    assert_true(got[0] == 1.5f && got[1] == -2.0f && got[2] == 0.25f);
    mt_safetensors_close(st);
}

/* ---- directories ---- */

static char *make_subdir(const char *name) {
    char *d = mt_test_dir_sub(name);
    assert_int_equal(mkdir(d, 0755), 0);
    return d;
}

static void write_in(const char *dir, const char *name, const char *text) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    mt_test_write_bytes(p, text, strlen(text));
}

static void write_shard(const char *dir, const char *name, const char *tensor, float value) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    float v[2] = {value, value};
    const mt_st_write_tensor w[] = {{tensor, MT_F32, 1, {2}, v}};
    assert_int_equal(mt_safetensors_write(p, w, 1, NULL, 0), MT_OK);
}

static void test_dir_single_and_sharded(void **state) {
    char *d1 = make_subdir("single");
    write_shard(d1, "model.safetensors", "a", 1.0f);
    mt_safetensors *st;
    assert_int_equal(mt_safetensors_open_dir(&st, d1), MT_OK);
    assert_int_equal(mt_safetensors_count(st), 1);
    assert_non_null(strstr(mt_safetensors_source(st), "/single/model.safetensors"));
    mt_safetensors_close(st);

    char *d2 = make_subdir("sharded");
    write_shard(d2, "s1.safetensors", "a", 1.0f);
    write_shard(d2, "s2.safetensors", "b", 2.0f);
    write_in(d2, "model.safetensors.index.json",
             "{\"metadata\": {\"total_size\": 16},"
             " \"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\"}}");
    if (mt_safetensors_open_dir(&st, d2) != MT_OK) fail_msg("%s", mt_error_message());
    assert_int_equal(mt_safetensors_count(st), 2);
    const mt_st_tensor *a = mt_safetensors_find(st, "a"), *b = mt_safetensors_find(st, "b");
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(strstr(a->path, "/s1.safetensors"));
    assert_non_null(strstr(b->path, "/s2.safetensors"));
    assert_true(((const float *)b->data)[1] == 2.0f);
    assert_non_null(strstr(mt_safetensors_source(st), "/sharded/model.safetensors.index.json"));
    mt_safetensors_close(st);

    char *d3 = make_subdir("empty");
    expect_open_error(d3, 1, NULL, "model.safetensors");
    free(d1);
    free(d2);
    free(d3);
}

/* ---- bad files ---- */

static const char *TENSOR_OK = "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";

static void bad_header(const char *file, const char *header, size_t data_len,
                       const char *tensor, const char *must_say) {
    char p[512];
    mt_test_dir_path(p, file);
    unsigned char data[64] = {0};
    assert_true(data_len <= sizeof data);
    write_st(p, header, data, data_len);
    expect_open_error(p, 0, tensor, must_say);
}

static void test_bad_empty_file(void **state) {
    char p[512];
    mt_test_write_bytes(mt_test_dir_path(p, "empty.safetensors"), "", 0);
    expect_open_error(p, 0, NULL, "0 bytes");
}

static void test_bad_truncated_length(void **state) {
    char p[512];
    mt_test_write_bytes(mt_test_dir_path(p, "short.safetensors"), "\x10\0\0\0\0", 5);
    expect_open_error(p, 0, NULL, "5 bytes");
}

static void test_bad_length_past_eof(void **state) {
    char p[512];
    write_st_raw(mt_test_dir_path(p, "past.safetensors"), 100, "{}", NULL, 0);
    expect_open_error(p, 0, NULL, "past the end");
}

static void test_bad_huge_length(void **state) {
    char p[512];
    write_st_raw(mt_test_dir_path(p, "huge.safetensors"), 1ULL << 40, "{}", NULL, 0);
    expect_open_error(p, 0, NULL, "limit");
}

static void test_bad_json(void **state) {
    bad_header("badjson.safetensors", "{\"w\": {\"dtype\": \"F32\",\n \"shape\" [2]}}", 0, NULL,
               "line 2");
}

static void test_bad_json_not_object(void **state) {
    bad_header("array.safetensors", "[1, 2]", 0, NULL, "must be an object");
}

static void test_bad_entry_not_object(void **state) {
    bad_header("nonobj.safetensors", "{\"w\": 5}", 0, "tensor w", "object");
}

static void test_bad_unknown_dtype(void **state) {
    bad_header("f64.safetensors",
               "{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "tensor w",
               "F64");
}

static void test_bad_negative_shape(void **state) {
    bad_header("neg.safetensors",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0, "tensor w",
               "shape[0]");
}

static void test_bad_float_shape(void **state) {
    bad_header("float.safetensors",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[2, 1.5],\"data_offsets\":[0,8]}}", 8,
               "tensor w", "shape[1]");
}

static void test_bad_rank(void **state) {
    bad_header("rank.safetensors",
               "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
               1, "tensor w", "rank 9");
}

static void test_bad_shape_overflow(void **state) {
    bad_header("ovf.safetensors",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
               "\"data_offsets\":[0,8]}}",
               8, "tensor w", "overflow");
}

static void test_bad_offsets_past_end(void **state) {
    bad_header("pastend.safetensors",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 16,
               "tensor w", "past the data section");
}

static void test_bad_offsets_size_mismatch(void **state) {
    bad_header("mismatch.safetensors",
               "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,8]}}", 16,
               "tensor w", "need 12");
}

static void test_bad_begin_after_end(void **state) {
    bad_header("backward.safetensors",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, "tensor w",
               "begin 8 > end 4");
}

static void test_bad_offsets_not_ints(void **state) {
    bad_header("offs.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}",
               8, "tensor w", "data_offsets");
}

static void test_bad_overlap(void **state) {
    bad_header("overlap.safetensors",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
               16, "tensor b", "overlaps tensor a");
}

static void test_bad_truncated_data(void **state) {
    char h[128];
    snprintf(h, sizeof h, "{%s,\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
             TENSOR_OK);
    bad_header("truncdata.safetensors", h, 12, "tensor v", "truncated");
}

static void test_bad_metadata(void **state) {
    bad_header("meta.safetensors", "{\"__metadata__\":{\"format\":1}}", 0, "format", "string");
}

static void test_bad_duplicate_tensor(void **state) {
    char h[256];
    snprintf(h, sizeof h, "{%s,%s}", TENSOR_OK, TENSOR_OK);
    bad_header("dup.safetensors", h, 8, NULL, "duplicate");
}

/* ---- bad sharded directories ---- */

static char *sharded_dir(const char *name, const char *index) {
    char *d = make_subdir(name);
    write_shard(d, "s1.safetensors", "a", 1.0f);
    write_shard(d, "s2.safetensors", "b", 2.0f);
    write_in(d, "model.safetensors.index.json", index);
    return d;
}

static void test_bad_index_json(void **state) {
    char *d = sharded_dir("idx_json", "{\"weight_map\": {\"a\": \"s1.safetensors\",}}");
    expect_open_error(d, 1, "model.safetensors.index.json", "line 1");
    free(d);
}

static void test_bad_index_no_weight_map(void **state) {
    char *d = sharded_dir("idx_nowm", "{\"metadata\": {}}");
    expect_open_error(d, 1, "model.safetensors.index.json", "weight_map");
    free(d);
}

static void test_bad_index_missing_shard(void **state) {
    char *d = sharded_dir("idx_missing",
                          "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s9.safetensors\"}}");
    expect_open_error(d, 1, "tensor b", "s9.safetensors does not exist");
    free(d);
}

static void test_bad_index_escape(void **state) {
    char *d = sharded_dir("idx_escape", "{\"weight_map\": {\"a\": \"../s1.safetensors\"}}");
    expect_open_error(d, 1, "tensor a", "../s1.safetensors");
    free(d);
}

static void test_bad_index_absolute(void **state) {
    char *d = sharded_dir("idx_abs", "{\"weight_map\": {\"a\": \"/etc/passwd\"}}");
    expect_open_error(d, 1, "tensor a", "plain file name");
    free(d);
}

static void test_bad_index_tensor_not_in_shard(void **state) {
    char *d = sharded_dir("idx_wrong",
                          "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\"}}");
    expect_open_error(d, 1, "tensor b", "not found in shard s1.safetensors");
    free(d);
}

static void test_bad_index_tensor_absent(void **state) {
    char *d = sharded_dir("idx_absent",
                          "{\"weight_map\": {\"a\": \"s1.safetensors\", \"zz\": \"s2.safetensors\"}}");
    expect_open_error(d, 1, "tensor zz", "not found");
    free(d);
}

static void test_bad_tensor_in_two_shards(void **state) {
    char *d = make_subdir("idx_twice");
    write_shard(d, "s1.safetensors", "a", 1.0f);
    write_shard(d, "s2.safetensors", "a", 2.0f);
    write_in(d, "model.safetensors.index.json",
             "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\"}}");
    expect_open_error(d, 1, "tensor a", "only once");
    free(d);
}

static void test_bad_shard_content(void **state) {
    char *d = sharded_dir("idx_badshard", "{\"weight_map\": {\"a\": \"s1.safetensors\","
                                          " \"b\": \"s2.safetensors\"}}");
    char p[1024];
    snprintf(p, sizeof p, "%s/s2.safetensors", d);
    write_st(p, "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", "abcd", 4);
    expect_open_error(d, 1, "tensor b", "s2.safetensors");
    free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_dtypes_and_ranks),
        cmocka_unit_test(test_roundtrip_fill_callback),
        cmocka_unit_test(test_write_is_atomic),
        cmocka_unit_test(test_unaligned_bf16),
        cmocka_unit_test(test_dir_single_and_sharded),
        cmocka_unit_test(test_bad_empty_file),
        cmocka_unit_test(test_bad_truncated_length),
        cmocka_unit_test(test_bad_length_past_eof),
        cmocka_unit_test(test_bad_huge_length),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_bad_json_not_object),
        cmocka_unit_test(test_bad_entry_not_object),
        cmocka_unit_test(test_bad_unknown_dtype),
        cmocka_unit_test(test_bad_negative_shape),
        cmocka_unit_test(test_bad_float_shape),
        cmocka_unit_test(test_bad_rank),
        cmocka_unit_test(test_bad_shape_overflow),
        cmocka_unit_test(test_bad_offsets_past_end),
        cmocka_unit_test(test_bad_offsets_size_mismatch),
        cmocka_unit_test(test_bad_begin_after_end),
        cmocka_unit_test(test_bad_offsets_not_ints),
        cmocka_unit_test(test_bad_overlap),
        cmocka_unit_test(test_bad_truncated_data),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_bad_duplicate_tensor),
        cmocka_unit_test(test_bad_index_json),
        cmocka_unit_test(test_bad_index_no_weight_map),
        cmocka_unit_test(test_bad_index_missing_shard),
        cmocka_unit_test(test_bad_index_escape),
        cmocka_unit_test(test_bad_index_absolute),
        cmocka_unit_test(test_bad_index_tensor_not_in_shard),
        cmocka_unit_test(test_bad_index_tensor_absent),
        cmocka_unit_test(test_bad_tensor_in_two_shards),
        cmocka_unit_test(test_bad_shard_content),
    };
    return cmocka_run_group_tests(tests, mt_test_dir_setup, mt_test_dir_teardown);
}
