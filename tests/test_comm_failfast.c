/* Fail-fast of the mpi comm: jobs of test_comm_mpi --fail MODE (tests/test_comm_mpi.c) under
 * mpirun -np 3 with MT_COMM_TIMEOUT_S=3, each bounded by `timeout 60`:
 *  - hang: the last rank stays alive but never calls the second all_reduce: the others end the job
 *    with "no answer from rank 2 within 3 s in all_reduce", in well under the bound;
 *  - kill: the last rank dies by SIGKILL: the job ends, non-zero, within the bound;
 *  - count: the last rank's count differs: the job ends with an error, not a hang;
 *  - config: check_same fails on every rank: each of the 3 prints its "rank R: the ranks differ
 *    in the config" line and the job exits non-zero.
 * Exits 77 (skipped) in builds without MPI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "util/testutil.h"

static char g_out[1 << 16];

/* Runs the job of mode on 3 ranks; returns its exit status and the seconds it took. */
static int run_job(const char *mode, double *seconds) {
    const char *mpirun = getenv("MT_MPIRUN"), *bin = getenv("MT_COMM_MPI_TEST");
    assert_non_null(mpirun);
    assert_non_null(bin);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "MT_COMM_TIMEOUT_S=3 timeout 60 %s --allow-run-as-root --oversubscribe -np 3 %s "
             "--fail %s",
             mpirun, bin, mode);
    double t0 = mt_test_now_s();
    int rc = mt_test_run(cmd, g_out, sizeof g_out);
    *seconds = mt_test_now_s() - t0;
    printf("%s: exit %d after %.1f s\n%s\n", mode, rc, *seconds, g_out);
    assert_null(strstr(g_out, "Sanitizer")); /* the ranks' own ASan/UBSan reports */
    return rc;
}

static void test_hang(void **state) {
    double s;
    int rc = run_job("hang", &s);
    assert_true(rc != 0 && rc != 124); /* 124: `timeout` had to end it */
    assert_non_null(strstr(g_out, "megatrain: rank "));
    assert_non_null(strstr(g_out, ": no answer from rank 2 within 3 s in all_reduce"));
    assert_true(s < 30);
}

static void test_kill(void **state) {
    double s;
    int rc = run_job("kill", &s);
    assert_true(rc != 0 && rc != 124);
    assert_non_null(strstr(g_out, "rank 2")); /* mpirun's note, or ours */
    assert_true(s < 30);
}

static void test_count(void **state) {
    double s;
    int rc = run_job("count", &s);
    assert_true(rc != 0 && rc != 124);
    assert_non_null(strstr(g_out, "megatrain: rank "));
    assert_true(s < 30);
}

static void test_config(void **state) {
    double s;
    int rc = run_job("config", &s);
    assert_true(rc != 0 && rc != 124);
    for (int r = 0; r < 3; r++) {
        char want[128];
        snprintf(want, sizeof want,
                 "megatrain: rank %d: the ranks differ in the config: rank 2 differs from rank 0's",
                 r);
        if (!strstr(g_out, want)) fail_msg("no '%s'", want);
    }
}

int main(void) {
    if (!mt_comm_built_with_mpi()) {
        printf("test_comm_failfast: skipped, the build has no MPI\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hang),
        cmocka_unit_test(test_kill),
        cmocka_unit_test(test_count),
        cmocka_unit_test(test_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
