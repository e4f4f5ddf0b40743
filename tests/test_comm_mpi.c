/* comm/comm.h's mpi comm, run by ctest as `mpirun -np 2` and `-np 3` (tests/CMakeLists: every rank
 * runs every test, in step):
 *  - the comm is mpi with mpirun's rank, size, local rank and local size (the shared-memory
 *    split's); the host RAM budget is the smallest of the ranks' shares (a host's RAM divided
 *    by its ranks), the same on every rank, unknown when one rank's is;
 *  - all_reduce, reduce_scatter and all_gather in F32 and BF16, for counts with and without
 *    padding (and all_reduce for counts below the rank count), equal bit for bit to a reference
 *    each rank computes from every rank's inputs: the fp32 sum in rank order, bf16 rounded once;
 *    reduce_scatter's blocks and all_gather's result agree with all_reduce, the pad stays zero;
 *  - check_same passes equal bytes and fails on EVERY rank, naming what and the ranks that differ,
 *    for different bytes and for different lengths; the comm is usable after it.
 * With `--fail MODE` it is instead the child job of test_comm_failfast (see there): hang, kill,
 * count or config. Exits 77 (skipped) in builds without MPI. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/error.h"
#include "util/testutil.h"

static mt_comm *g_comm;
static int g_rank, g_size;

/* Rank r's input element i, the same wherever it is computed: normal values over a range of
 * magnitudes (2^-10 .. 2^10), so that another summation order gives other bits. */
static void fill_input(float *x, size_t n, int r, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed * 1000 + (uint64_t)r);
    for (size_t i = 0; i < n; i++) {
        float scale = ldexpf(1.0f, (int)(mt_test_rng_uniform(&rng) * 21.0f) - 10);
        x[i] = mt_test_rng_normal(&rng) * scale;
    }
}

/* The buffers of one test: every rank's input in dtype (in[r], n elements, zeros beyond the
 * count), this rank's own copy and the reference sum. */
typedef struct {
    mt_dtype dtype;
    size_t n, es;
    void **in;
    void *ref;
} inputs;

static void inputs_init(inputs *t, mt_dtype dtype, size_t count, size_t n, uint64_t seed) {
    t->dtype = dtype;
    t->n = n;
    t->es = mt_dtype_size(dtype);
    t->in = calloc((size_t)g_size, sizeof *t->in);
    float *f = calloc(n ? n : 1, sizeof *f);
    float *sum = calloc(n ? n : 1, sizeof *sum);
    for (int r = 0; r < g_size; r++) {
        memset(f, 0, n * sizeof *f);
        fill_input(f, count, r, seed);
        t->in[r] = calloc(n ? n : 1, t->es);
        if (dtype == MT_F32) {
            memcpy(t->in[r], f, n * sizeof *f);
            for (size_t i = 0; i < n; i++) sum[i] = r == 0 ? f[i] : sum[i] + f[i];
        } else {
            mt_bf16 *b = t->in[r];
            for (size_t i = 0; i < n; i++) {
                b[i] = mt_f32_to_bf16(f[i]);
                float v = mt_bf16_to_f32(b[i]);
                sum[i] = r == 0 ? v : sum[i] + v;
            }
        }
    }
    t->ref = calloc(n ? n : 1, t->es);
    if (dtype == MT_F32) {
        memcpy(t->ref, sum, n * sizeof *sum);
    } else {
        for (size_t i = 0; i < n; i++) ((mt_bf16 *)t->ref)[i] = mt_f32_to_bf16(sum[i]);
    }
    free(f);
    free(sum);
}

static void inputs_free(inputs *t) {
    for (int r = 0; r < g_size; r++) free(t->in[r]);
    free(t->in);
    free(t->ref);
}

/* Bitwise equality, printing the first difference. */
static void expect_bytes(const char *what, const void *got, const void *ref, size_t bytes) {
    const unsigned char *g = got, *e = ref;
    for (size_t i = 0; i < bytes; i++) {
        if (g[i] == e[i]) continue;
        fail_msg("rank %d: %s differs at byte %zu of %zu (got 0x%02x, want 0x%02x)", g_rank, what,
                 i, bytes, g[i], e[i]);
    }
}

static int setup(void **state) {
    g_comm = mt_comm_create_from_env();
    if (!g_comm) {
        fprintf(stderr, "test_comm_mpi: %s\n", mt_error_message());
        return -1;
    }
    g_rank = mt_comm_rank(g_comm);
    g_size = mt_comm_size(g_comm);
    return 0;
}

static int teardown(void **state) {
    mt_comm_destroy(g_comm);
    return 0;
}

static int env_int(const char *name) {
    const char *s = getenv(name);
    assert_non_null(s);
    return atoi(s);
}

static void test_identity(void **state) {
    assert_string_equal(mt_comm_name(g_comm), "mpi");
    assert_int_equal(g_size, env_int("OMPI_COMM_WORLD_SIZE"));
    assert_int_equal(g_rank, env_int("OMPI_COMM_WORLD_RANK"));
    assert_int_equal(mt_comm_local_rank(g_comm), env_int("OMPI_COMM_WORLD_LOCAL_RANK"));
    /* from the shared-memory split, which agrees with what mpirun says on one host */
    assert_int_equal(mt_comm_local_size(g_comm), env_int("OMPI_COMM_WORLD_LOCAL_SIZE"));
    assert_true(g_size >= 2);
    assert_int_equal(mt_comm_barrier(g_comm), MT_OK);
}

/* Each rank reads its own available RAM: the budget of every rank is the smallest share (ranks
 * of one host divide their host's), the same on every rank; one unknown makes it unknown. */
static void test_host_budget(void **state) {
    int L = mt_comm_local_size(g_comm);
    double b = 0;
    assert_int_equal(mt_comm_host_budget(g_comm, 1e9 * (g_rank + 1), &b), MT_OK);
    assert_true(b == 1e9 / L);
    assert_int_equal(mt_comm_host_budget(g_comm, g_rank == g_size - 1 ? -1 : 5e9, &b), MT_OK);
    assert_true(b <= 0);
}

static const mt_dtype k_dtypes[] = {MT_F32, MT_BF16};

static void test_all_reduce(void **state) {
    /* below the rank count, one short block, divisible, not, and large (messages of MiBs) */
    size_t counts[] = {1, 2, 7, (size_t)g_size * 64, (size_t)g_size * 64 + 1, 1000003};
    for (int d = 0; d < 2; d++) {
        for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
            size_t n = counts[k];
            inputs t;
            inputs_init(&t, k_dtypes[d], n, n, 10 + k);
            void *buf = malloc(n * t.es);
            memcpy(buf, t.in[g_rank], n * t.es);
            assert_int_equal(mt_comm_all_reduce(g_comm, buf, n, t.dtype, NULL), MT_OK);
            char what[64];
            snprintf(what, sizeof what, "all_reduce %s count %zu", mt_dtype_name(t.dtype), n);
            expect_bytes(what, buf, t.ref, n * t.es);
            free(buf);
            inputs_free(&t);
        }
    }
}

/* reduce_scatter then all_gather of padded counts: block rank of the reference, the pad zero,
 * and the gathered blocks equal all_reduce of the same buffer. */
static void test_reduce_scatter_all_gather(void **state) {
    size_t counts[] = {1, 5, (size_t)g_size * 100, 65537};
    for (int d = 0; d < 2; d++) {
        for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
            size_t count = counts[k], n = mt_comm_padded(count, g_size), B = n / (size_t)g_size;
            inputs t;
            inputs_init(&t, k_dtypes[d], count, n, 20 + k);
            void *recv = malloc(B * t.es);
            assert_int_equal(
                mt_comm_reduce_scatter(g_comm, recv, t.in[g_rank], n, t.dtype, NULL), MT_OK);
            char what[80];
            snprintf(what, sizeof what, "reduce_scatter %s count %zu (padded %zu)",
                     mt_dtype_name(t.dtype), count, n);
            expect_bytes(what, recv, (char *)t.ref + (size_t)g_rank * B * t.es, B * t.es);
            for (size_t i = (size_t)g_rank * B; i < (size_t)(g_rank + 1) * B; i++)
                if (i >= count)
                    assert_int_equal(((unsigned char *)recv)[(i - (size_t)g_rank * B) * t.es], 0);

            void *gathered = malloc(n * t.es);
            assert_int_equal(mt_comm_all_gather(g_comm, gathered, recv, B, t.dtype, NULL), MT_OK);
            snprintf(what, sizeof what, "all_gather %s count %zu", mt_dtype_name(t.dtype), n);
            expect_bytes(what, gathered, t.ref, n * t.es);

            /* in place: send is recv's own block */
            void *inplace = calloc(n, t.es);
            memcpy((char *)inplace + (size_t)g_rank * B * t.es, recv, B * t.es);
            assert_int_equal(mt_comm_all_gather(g_comm, inplace,
                                                (char *)inplace + (size_t)g_rank * B * t.es, B,
                                                t.dtype, NULL),
                             MT_OK);
            expect_bytes("all_gather in place", inplace, t.ref, n * t.es);

            memcpy(inplace, t.in[g_rank], n * t.es);
            assert_int_equal(mt_comm_all_reduce(g_comm, inplace, n, t.dtype, NULL), MT_OK);
            expect_bytes("all_reduce against all_gather(reduce_scatter)", inplace, gathered,
                         n * t.es);
            free(inplace);
            free(gathered);
            free(recv);
            inputs_free(&t);
        }
    }
}

/* A sum whose bits depend on the order: 2^24 + 1 + 1 ... is 2^24 in fp32 when each 1 is added to
 * 2^24 alone, more when the ones are summed first. Rank 0 holds 2^24, the others 1: the rank-order
 * sum is exactly 2^24 with any rank count. */
static void test_rank_order(void **state) {
    float x = g_rank == 0 ? 16777216.0f : 1.0f;
    float buf[3] = {x, x, x};
    assert_int_equal(mt_comm_all_reduce(g_comm, buf, 3, MT_F32, NULL), MT_OK);
    for (int i = 0; i < 3; i++) assert_true(buf[i] == 16777216.0f);
}

static void test_check_same(void **state) {
    char cfg[64] = "hidden_size=64 layers=2 lr=3e-4";
    assert_int_equal(mt_comm_check_same(g_comm, cfg, strlen(cfg), "the config"), MT_OK);

    /* the last rank's bytes differ: every rank fails, naming it */
    char other[64];
    memcpy(other, cfg, sizeof cfg);
    if (g_rank == g_size - 1) other[5] = 'X';
    mt_error_clear();
    assert_int_equal(mt_comm_check_same(g_comm, other, strlen(other), "the config"), MT_ERR);
    char want[128];
    snprintf(want, sizeof want, "rank %d: the ranks differ in the config: rank %d differs from "
                                "rank 0's", g_rank, g_size - 1);
    if (!strstr(mt_error_message(), want)) fail_msg("got '%s'", mt_error_message());

    /* rank 1 passes one byte more: a length difference fails as well */
    mt_error_clear();
    size_t n = strlen(cfg) + (g_rank == 1 ? 1 : 0);
    assert_int_equal(mt_comm_check_same(g_comm, cfg, n, "the plan"), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "differ in the plan: rank 1 "));

    /* all but rank 0 differ: the message names them all */
    if (g_size >= 3) {
        int v = g_rank == 0 ? 0 : 1;
        assert_int_equal(mt_comm_check_same(g_comm, &v, sizeof v, "v"), MT_ERR);
        assert_non_null(strstr(mt_error_message(), "ranks 1, 2"));
    }
    /* the comm goes on working */
    assert_int_equal(mt_comm_check_same(g_comm, cfg, strlen(cfg), "the config"), MT_OK);
    assert_int_equal(mt_comm_barrier(g_comm), MT_OK);
}

/* The child job of test_comm_failfast: ranks other than the last call all_reduce, and on MT_ERR
 * print the message and end the job as the engine will. */
static int fail_mode(const char *mode) {
    mt_comm *c = mt_comm_create_from_env();
    if (!c) {
        fprintf(stderr, "megatrain: %s\n", mt_error_message());
        return 1;
    }
    int rank = mt_comm_rank(c), last = mt_comm_size(c) - 1;
    float buf[1000] = {0};
    size_t count = 1000;
    if (mt_comm_all_reduce(c, buf, count, MT_F32, NULL) != MT_OK) goto failed; /* in step */
    if (strcmp(mode, "hang") == 0 && rank == last) {
        for (int i = 0; i < 120; i++) sleep(1); /* alive, never answering */
        return 3;
    }
    if (strcmp(mode, "kill") == 0 && rank == last) raise(SIGKILL);
    if (strcmp(mode, "count") == 0 && rank == last) count = 999;
    if (strcmp(mode, "config") == 0) {
        int lr = rank == last ? 2 : 1;
        if (mt_comm_check_same(c, &lr, sizeof lr, "the config") != MT_OK) {
            fprintf(stderr, "megatrain: %s\n", mt_error_message());
            mt_comm_destroy(c);
            return 1;
        }
    }
    if (mt_comm_all_reduce(c, buf, count, MT_F32, NULL) != MT_OK) goto failed;
    mt_comm_destroy(c);
    return 0;
failed:
    fprintf(stderr, "megatrain: %s\n", mt_error_message());
    mt_comm_abort(c, 1);
}

int main(int argc, char **argv) {
    if (!mt_comm_built_with_mpi()) {
        printf("test_comm_mpi: skipped, the build has no MPI\n");
        return 77;
    }
    if (argc == 3 && strcmp(argv[1], "--fail") == 0) return fail_mode(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_host_budget),
        cmocka_unit_test(test_all_reduce),
        cmocka_unit_test(test_reduce_scatter_all_gather),
        cmocka_unit_test(test_rank_order),
        cmocka_unit_test(test_check_same),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
