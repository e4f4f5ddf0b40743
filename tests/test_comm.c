/* comm/comm.h in one process (no mpirun):
 *  - create_from_env without a launcher (and with mpirun's one-rank environment) is the local
 *    comm: rank 0 of 1, local rank 0;
 *  - a bad MT_COMM_TIMEOUT_S is an error naming it; in a build without MPI, mpirun's environment
 *    of 2 ranks is an error saying the build has no MPI (not two lone trainings);
 *  - the local collectives: all_reduce leaves the buffer, reduce_scatter copies it, all_gather
 *    copies (also in place), barrier and check_same pass; F32 and BF16 bit for bit;
 *  - mt_comm_padded rounds up to a multiple of the rank count;
 *  - a dtype other than F32/BF16 is a fatal error naming it (in a child process);
 *  - the CUDA device of a rank (mt_comm_cuda_device): its local rank when the host shows enough
 *    devices, device 0 when the launcher gave each rank its own (CUDA_VISIBLE_DEVICES, one
 *    visible), else an error naming the counts and -npernode;
 *  - a rank's share of the host RAM: the host's available RAM divided among its ranks; the local
 *    comm's budget is the whole of it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/error.h"
#include "util/testutil.h"

static const char *k_launcher_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                        "PMI_RANK"};

static void clear_launcher_env(void) {
    for (size_t i = 0; i < sizeof k_launcher_vars / sizeof *k_launcher_vars; i++)
        unsetenv(k_launcher_vars[i]);
    unsetenv("MT_COMM_TIMEOUT_S");
}

static void expect_local(mt_comm *c) {
    assert_non_null(c);
    assert_string_equal(mt_comm_name(c), "local");
    assert_int_equal(mt_comm_rank(c), 0);
    assert_int_equal(mt_comm_size(c), 1);
    assert_int_equal(mt_comm_local_rank(c), 0);
    assert_int_equal(mt_comm_local_size(c), 1);
}

static void test_create_from_env(void **state) {
    clear_launcher_env();
    mt_comm *c = mt_comm_create_from_env();
    expect_local(c);
    mt_comm_destroy(c);

    setenv("OMPI_COMM_WORLD_SIZE", "1", 1); /* mpirun -np 1: nothing to talk to */
    c = mt_comm_create_from_env();
    expect_local(c);
    mt_comm_destroy(c);
    clear_launcher_env();

    setenv("MT_COMM_TIMEOUT_S", "soon", 1);
    mt_error_clear();
    assert_null(mt_comm_create_from_env());
    assert_non_null(strstr(mt_error_message(), "MT_COMM_TIMEOUT_S=soon"));
    setenv("MT_COMM_TIMEOUT_S", "-1", 1);
    assert_null(mt_comm_create_from_env());
    setenv("MT_COMM_TIMEOUT_S", "0", 1);
    c = mt_comm_create_from_env();
    expect_local(c);
    mt_comm_destroy(c);
    clear_launcher_env();

    if (!mt_comm_built_with_mpi()) {
        setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
        mt_error_clear();
        assert_null(mt_comm_create_from_env());
        assert_non_null(
            strstr(mt_error_message(), "mpirun with 2 ranks, but this build has no MPI"));
        clear_launcher_env();
        setenv("PMIX_RANK", "1", 1);
        assert_null(mt_comm_create_from_env());
        assert_non_null(strstr(mt_error_message(), "this build has no MPI"));
        clear_launcher_env();
    }
}

static void test_local_collectives(void **state) {
    mt_comm *c = mt_comm_create_local();
    float f[7], f0[7];
    mt_bf16 b[7], b0[7];
    for (int i = 0; i < 7; i++) {
        f0[i] = (float)i * 0.37f - 1.0f;
        b0[i] = mt_f32_to_bf16(f0[i]);
    }
    memcpy(f, f0, sizeof f);
    memcpy(b, b0, sizeof b);
    assert_int_equal(mt_comm_all_reduce(c, f, 7, MT_F32, NULL), MT_OK);
    assert_memory_equal(f, f0, sizeof f);
    assert_int_equal(mt_comm_all_reduce(c, b, 7, MT_BF16, NULL), MT_OK);
    assert_memory_equal(b, b0, sizeof b);

    float fr[7] = {0};
    mt_bf16 br[7] = {0};
    assert_int_equal(mt_comm_reduce_scatter(c, fr, f0, 7, MT_F32, NULL), MT_OK);
    assert_memory_equal(fr, f0, sizeof fr);
    assert_int_equal(mt_comm_reduce_scatter(c, br, b0, 7, MT_BF16, NULL), MT_OK);
    assert_memory_equal(br, b0, sizeof br);

    memset(fr, 0, sizeof fr);
    assert_int_equal(mt_comm_all_gather(c, fr, f0, 7, MT_F32, NULL), MT_OK);
    assert_memory_equal(fr, f0, sizeof fr);
    assert_int_equal(mt_comm_all_gather(c, fr, fr, 7, MT_F32, NULL), MT_OK); /* in place */
    assert_memory_equal(fr, f0, sizeof fr);
    memset(br, 0, sizeof br);
    assert_int_equal(mt_comm_all_gather(c, br, b0, 7, MT_BF16, NULL), MT_OK);
    assert_memory_equal(br, b0, sizeof br);

    assert_int_equal(mt_comm_barrier(c), MT_OK);
    assert_int_equal(mt_comm_check_same(c, "abc", 3, "the config"), MT_OK);
    assert_int_equal(mt_comm_check_same(c, NULL, 0, "nothing"), MT_OK);
    assert_int_equal(mt_comm_all_reduce(c, NULL, 0, MT_F32, NULL), MT_OK);
    mt_comm_destroy(c);
}

static void test_padded(void **state) {
    assert_int_equal(mt_comm_padded(10, 3), 12);
    assert_int_equal(mt_comm_padded(9, 3), 9);
    assert_int_equal(mt_comm_padded(1, 8), 8);
    assert_int_equal(mt_comm_padded(0, 3), 0);
    assert_int_equal(mt_comm_padded(5, 1), 5);
}

/* A collective on I32 ends the process with a message naming the dtype. */
static void test_bad_dtype_is_fatal(void **state) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        mt_comm *c = mt_comm_create_local();
        int32_t x[2] = {1, 2};
        mt_comm_all_reduce(c, x, 2, MT_I32, NULL);
        _exit(0);
    }
    close(fds[1]);
    char out[1024] = "";
    size_t len = 0;
    ssize_t got; /* the message may come in several writes */
    while (len < sizeof out - 1 && (got = read(fds[0], out + len, sizeof out - 1 - len)) > 0)
        len += (size_t)got;
    close(fds[0]);
    out[len] = 0;
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    if (!strstr(out, "F32 or BF16, not I32")) fail_msg("got '%s'", out);
}

static void test_cuda_device(void **state) {
    int d = -1;
    for (int r = 0; r < 4; r++) { /* 4 ranks, 4 or 8 GPUs: one each, by local rank */
        assert_int_equal(mt_comm_cuda_device(r, 4, 4, 0, &d), MT_OK);
        assert_int_equal(d, r);
        assert_int_equal(mt_comm_cuda_device(r, 4, 8, 1, &d), MT_OK);
        assert_int_equal(d, r);
    }
    assert_int_equal(mt_comm_cuda_device(0, 1, 1, 0, &d), MT_OK);
    assert_int_equal(d, 0);
    /* a launcher that gave each rank one device of its own */
    d = -1;
    assert_int_equal(mt_comm_cuda_device(3, 4, 1, 1, &d), MT_OK);
    assert_int_equal(d, 0);
    /* more ranks than devices on a host: refused, naming the counts */
    d = -1;
    assert_int_equal(mt_comm_cuda_device(1, 4, 2, 0, &d), MT_ERR);
    assert_int_equal(d, -1);
    printf("  %s\n", mt_error_message());
    assert_non_null(strstr(mt_error_message(), "4 ranks on this host but 2 CUDA devices visible"));
    assert_non_null(strstr(mt_error_message(), "-npernode 2"));
    assert_int_equal(mt_comm_cuda_device(1, 2, 1, 0, &d), MT_ERR); /* one GPU, no per-rank launcher */
    assert_non_null(strstr(mt_error_message(), "2 ranks on this host but 1 CUDA device visible"));
    assert_int_equal(mt_comm_cuda_device(0, 2, 0, 0, &d), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "no CUDA device"));
}

static void test_host_share(void **state) {
    assert_true(mt_comm_host_share(120e9, 1) == 120e9);
    assert_true(mt_comm_host_share(120e9, 2) == 60e9);
    assert_true(mt_comm_host_share(120e9, 3) == 40e9);
    assert_true(mt_comm_host_share(-1, 4) == -1); /* unknown stays unknown */
    clear_launcher_env();
    mt_comm *c = mt_comm_create_from_env();
    double b = 0;
    assert_int_equal(mt_comm_host_budget(c, 64e9, &b), MT_OK);
    assert_true(b == 64e9);
    mt_comm_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_from_env),
        cmocka_unit_test(test_local_collectives),
        cmocka_unit_test(test_padded),
        cmocka_unit_test(test_bad_dtype_is_fatal),
        cmocka_unit_test(test_cuda_device),
        cmocka_unit_test(test_host_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
