/* Gemma 3's own CPU ops against plain double-precision references:
 *  - GeGLU (geglu_*): out = gelu_tanh(gate) * up with torch's gelu(approximate="tanh") in double
 *    (values from -8 to 8: both tails and the bend), the backward against central finite
 *    differences of that formula (h = 1e-4), dgate and dup written (=) over poisoned buffers;
 *    and six of torch 2's own float64 values of gelu(x, approximate="tanh") (erf's gelu differs
 *    from them by up to 4e-4: a wrong variant fails);
 *  - zero_rows_of_id: the pad token's rows of the embedding's gradient zeroed, the others kept
 *    bit for bit.
 * Tolerances as tests/test_ops_cpu.c: forward atol 1e-6 rtol 1e-5, backward atol 1e-5 rtol 1e-4. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "util/cpu_op_tol.h"
#include "util/host_buffers.h"
#include "util/testutil.h"

static mt_backend *be;

/* torch.nn.functional.gelu(x, approximate="tanh") in double. */
static double gelu_tanh(double x) {
    const double k = sqrt(2.0 / 3.14159265358979323846);
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

static void check_geglu(size_t n, uint64_t seed) {
    mt_test_rng rng;
    mt_test_rng_seed(&rng, seed);
    float *gate = mt_test_fnew(n), *up = mt_test_fnew(n), *dout = mt_test_fnew(n);
    mt_test_fill_uniform(&rng, gate, n, -8, 8);
    mt_test_fill_normal(&rng, up, n, 1);
    mt_test_fill_normal(&rng, dout, n, 1);
    if (n > 2) gate[0] = 0, gate[1] = -0.0f, gate[2] = 1e-3f; /* around the origin */
    float *ref = mt_test_fnew(n), *rdg = mt_test_fnew(n), *rdu = mt_test_fnew(n);
    for (size_t i = 0; i < n; i++) {
        double g = gate[i], u = up[i], d = dout[i];
        ref[i] = (float)(gelu_tanh(g) * u);
        rdg[i] = (float)(d * u * (gelu_tanh(g + FD_H) - gelu_tanh(g - FD_H)) / (2 * FD_H));
        rdu[i] = (float)(d * gelu_tanh(g));
    }
    float *out = mt_test_fnew(n), *dg = mt_test_fnew(n), *du = mt_test_fnew(n);
    mt_test_nan_fill(out, n), mt_test_nan_fill(dg, n), mt_test_nan_fill(du, n);
    be->geglu_forward(be, out, gate, up, n);
    assert_true(mt_allclose("geglu_forward", out, ref, n, FWD_ATOL, FWD_RTOL));
    be->geglu_backward(be, dg, du, dout, gate, up, n);
    assert_true(mt_allclose("geglu_backward dgate", dg, rdg, n, BWD_ATOL, BWD_RTOL));
    assert_true(mt_allclose("geglu_backward dup", du, rdu, n, BWD_ATOL, BWD_RTOL));
    free(gate), free(up), free(dout), free(ref), free(rdg), free(rdu), free(out), free(dg), free(du);
}

static void test_geglu(void **state) {
    (void)state;
    check_geglu(1, 1);
    check_geglu(37, 2);
    check_geglu(100000, 3); /* past the parallel threshold */
}

/* torch.nn.functional.gelu(torch.tensor(x, dtype=float64), approximate="tanh"): the formula's
 * constants (sqrt(2/pi), 0.044715) and the 0.5 x (1 + tanh) form, not erf's gelu. */
static void test_geglu_torch_values(void **state) {
    (void)state;
    static const float x[] = {-3.0f, -1.0f, -0.5f, 0.5f, 1.0f, 3.0f};
    static const float want[] = {-0.0036373920817729943, -0.15880800939172324, -0.15428599017485606,
                                 0.34571400982514394, 0.8411919906082768, 2.996362607918227};
    float one[6] = {1, 1, 1, 1, 1, 1}, out[6];
    be->geglu_forward(be, out, x, one, 6);
    assert_true(mt_allclose("gelu_tanh vs torch", out, want, 6, FWD_ATOL, FWD_RTOL));
}

static void test_zero_rows_of_id(void **state) {
    (void)state;
    enum { N = 7, C = 5 };
    const int32_t ids[N] = {3, 0, 2, 0, 0, 1, 4};
    float x[N * C], want[N * C];
    mt_test_rng rng;
    mt_test_rng_seed(&rng, 9);
    mt_test_fill_normal(&rng, x, N * C, 1);
    memcpy(want, x, sizeof x);
    for (int n = 0; n < N; n++)
        if (ids[n] == 0) memset(want + n * C, 0, C * sizeof(float));
    be->zero_rows_of_id(be, x, ids, 0, N, C);
    assert_memory_equal(x, want, sizeof x);
    be->zero_rows_of_id(be, x, ids, 7, N, C); /* an id no token has: nothing changes */
    assert_memory_equal(x, want, sizeof x);
}

int main(void) {
    be = mt_backend_cpu_create();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geglu),
        cmocka_unit_test(test_geglu_torch_values),
        cmocka_unit_test(test_zero_rows_of_id),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    be->destroy(be);
    return rc;
}
