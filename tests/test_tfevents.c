/* io/tfevents: the CRC32C and its mask against known values, an Event's bytes against what
 * protobuf itself encodes, the records read back, the cut of a resume, and a failed write. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/testutil.h"
#include "core/error.h"
#include "io/tfevents.h"

static void test_crc32c_vectors(void **state) {
    (void)state;
    assert_int_equal(mt_crc32c("123456789", 9), 0xe3069283u);
    assert_int_equal(mt_crc32c("", 0), 0);
    uint8_t zeros[32] = {0}, ones[32], inc[32];
    memset(ones, 0xff, sizeof ones);
    for (int i = 0; i < 32; i++) inc[i] = (uint8_t)i;
    /* RFC 3720 (iSCSI), appendix B.4 */
    assert_int_equal(mt_crc32c(zeros, 32), 0x8a9136aau);
    assert_int_equal(mt_crc32c(ones, 32), 0x62a8ab43u);
    assert_int_equal(mt_crc32c(inc, 32), 0x46dd794eu);
    /* masked, as tensorboard's own masked_crc32c gives them */
    assert_int_equal(mt_tfevents_masked_crc("123456789", 9), 0xc78ab0e5u);
    assert_int_equal(mt_tfevents_masked_crc("", 0), 0xa282ead8u);
}

/* Event(wall_time=1.5, step=3, summary: train/loss 2.0, a -0.25) as protobuf's SerializeToString
 * writes it (tensorboard.compat.proto.event_pb2) */
static const uint8_t expected_event[] = {
    0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf8, 0x3f, 0x10, 0x03, 0x2a, 0x1d, 0x0a, 0x11,
    0x0a, 0x0a, 0x74, 0x72, 0x61, 0x69, 0x6e, 0x2f, 0x6c, 0x6f, 0x73, 0x73, 0x15, 0x00, 0x00,
    0x00, 0x40, 0x0a, 0x08, 0x0a, 0x01, 0x61, 0x15, 0x00, 0x00, 0x80, 0xbe};
static const mt_tb_scalar two[] = {{"train/loss", 2.0f}, {"a", -0.25f}};

static void test_event_bytes(void **state) {
    (void)state;
    uint8_t *ev;
    size_t n = mt_tfevents_encode_scalars(3, 1.5, two, 2, &ev);
    assert_int_equal(n, sizeof expected_event);
    assert_memory_equal(ev, expected_event, n);
    int64_t step = -1;
    assert_int_equal(mt_tfevents_event_step(ev, n, &step), MT_OK);
    assert_int_equal(step, 3);
    assert_int_equal(mt_tfevents_event_step(ev, n - 1, &step), MT_ERR); /* torn */
    free(ev);
}

static char *only_file(const char *dir) {
    char *path = malloc(9000);
    snprintf(path, 9000, "ls %s/events.out.tfevents.* > %s/list", dir, dir);
    assert_int_equal(system(path), 0);
    snprintf(path, 9000, "%s/list", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(fgets(path, 9000, f));
    fclose(f);
    path[strcspn(path, "\n")] = '\0';
    return path;
}

/* The steps of the file's records in order; -2 marks a bad record (then reading stops). */
static int read_steps(const char *path, int64_t *steps, int max) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t *buf = NULL;
    size_t cap = 0, n;
    int k = 0, r;
    while (k < max && (r = mt_tfevents_read_record(f, &buf, &cap, &n)) != 0) {
        if (r < 0) {
            steps[k++] = -2;
            break;
        }
        assert_int_equal(mt_tfevents_event_step(buf, n, &steps[k]), MT_OK);
        k++;
    }
    free(buf);
    fclose(f);
    return k;
}

static void test_write_read_cut(void **state) {
    (void)state;
    char *dir = mt_test_tmpdir(), sub[4200];
    snprintf(sub, sizeof sub, "%s/tb", dir); /* made by open */
    mt_tfevents w;
    assert_int_equal(mt_tfevents_open(&w, sub, 0), MT_OK);
    for (int s = 1; s <= 5; s++) assert_int_equal(mt_tfevents_scalars(&w, s, 100.0 + s, two, 2), MT_OK);
    mt_tfevents_close(&w);
    char *path = only_file(sub);
    assert_non_null(strstr(path, "/events.out.tfevents."));
    int64_t steps[16];
    assert_int_equal(read_steps(path, steps, 16), 6); /* file_version (step 0) and 5 steps */
    for (int i = 0; i < 6; i++) assert_int_equal(steps[i], i);

    /* a torn last record (a kill mid-write) and a resume from step 3 */
    FILE *f = fopen(path, "ab");
    fwrite("\x20\0\0\0\0\0", 1, 6, f);
    fclose(f);
    assert_int_equal(read_steps(path, steps, 16), 7);
    assert_int_equal(steps[6], -2);
    int64_t dropped = -1;
    assert_int_equal(mt_tfevents_cut(sub, 3, &dropped), MT_OK);
    assert_int_equal(dropped, 3); /* steps 4, 5 and the torn tail */
    assert_int_equal(read_steps(path, steps, 16), 4);
    assert_int_equal(steps[3], 3);
    assert_int_equal(mt_tfevents_cut(sub, 3, &dropped), MT_OK);
    assert_int_equal(dropped, 0);

    /* the resumed run's file: read after the first (its name sorts later), with a START at 4 */
    assert_int_equal(mt_tfevents_open(&w, sub, 4), MT_OK);
    assert_true(strcmp(w.path, path) > 0);
    assert_int_equal(mt_tfevents_scalars(&w, 4, 200.0, two, 2), MT_OK);
    mt_tfevents_close(&w);
    assert_int_equal(read_steps(w.path, steps, 16), 3);
    assert_int_equal(steps[0], 0);
    assert_int_equal(steps[1], 4);
    assert_int_equal(steps[2], 4);

    assert_int_equal(mt_tfevents_cut("/nonexistent-dir-for-tfevents", 3, &dropped), MT_OK);
    free(path);
    mt_test_rmtree(dir);
    free(dir);
}

/* A failed write: one error naming the file, then nothing more is tried. */
static void test_write_failure(void **state) {
    (void)state;
    char *dir = mt_test_tmpdir();
    mt_tfevents w;
    assert_int_equal(mt_tfevents_open(&w, dir, 0), MT_OK);
    int full = open("/dev/full", O_WRONLY);
    if (full < 0) skip();
    close(w.fd);
    w.fd = full;
    assert_int_equal(mt_tfevents_scalars(&w, 1, 1.0, two, 2), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "events.out.tfevents."));
    assert_non_null(strstr(mt_error_message(), "write failed"));
    mt_error_clear();
    assert_int_equal(mt_tfevents_scalars(&w, 2, 2.0, two, 2), MT_OK);
    assert_string_equal(mt_error_message(), "");
    mt_tfevents_close(&w);
    /* a directory that cannot be made */
    char bad[4200];
    snprintf(bad, sizeof bad, "%s/file", dir);
    fclose(fopen(bad, "w"));
    strcat(bad, "/tb");
    assert_int_equal(mt_tfevents_open(&w, bad, 0), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "cannot create"));
    mt_test_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_vectors),
        cmocka_unit_test(test_event_bytes),
        cmocka_unit_test(test_write_read_cut),
        cmocka_unit_test(test_write_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
