/* The cuDNN attention graphs (attention_cudnn.cu) pass the cudnn-frontend's validation for Hopper
 * (sm_90), checked WITHOUT a GPU: dims, strides, GQA ratio, the causal band and the stats tensor
 * are what cuDNN's SDPA nodes accept, for every shape the GPU test and the bench run. So a machine
 * with cuDNN but no GPU (CI) catches a graph the frontend would refuse, before a GPU run does.
 * Unlike the other tests here it needs no device; it exits 77 (skipped) when libcudnn.so.9 is not
 * loadable or the build has no cuDNN. Whether cuDNN has an engine for a shape (check_support) and
 * the numbers are the GPU test's (test_cuda_attention.c). */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/attention_cudnn.h"
#include "util/testutil.h"

static void expect_valid(int backward, int B, int T, int H, int G, int D, int want) {
    char why[512];
    int ok = mt_cuda_attention_cudnn_validate(backward, B, T, H, G, D, 90, why, sizeof why);
    fprintf(stderr, "%s B=%d T=%d H=%d G=%d D=%d sm_90: %s%s%s%s\n", backward ? "bwd" : "fwd", B, T,
            H, G, D, ok == 1 ? "valid" : "invalid", *why ? " (" : "", why, *why ? ")" : "");
    assert_int_equal(ok, want);
}

static void test_graphs_validate(void **state) {
    static const int shapes[][5] = {
        {2, 1000, 8, 2, 128},   {1, 4096 + 17, 7, 1, 128}, {3, 257, 4, 4, 128},
        {2, 300, 8, 2, 64},     {1, 64, 28, 4, 128},       {2, 2048 + 5, 28, 4, 128},
        {1, 4095, 2, 1, 128},   {16, 1024, 28, 4, 128},    {4, 4096, 28, 4, 128},
        {1, 32768, 28, 4, 128}, {1, 131072, 28, 4, 128},   {1, 100, 2, 1, 96},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int bwd = 0; bwd < 2; bwd++)
            expect_valid(bwd, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4], 1);
}

/* The check can fail: query heads that are not a multiple of the kv heads. */
static void test_bad_graph_refused(void **state) {
    expect_valid(0, 1, 100, 8, 3, 128, 0);
    expect_valid(1, 1, 100, 8, 3, 128, 0);
}

int main(void) {
    const char *why = NULL;
    long version = 0;
    if (!mt_cuda_cudnn_status(&why, &version)) {
        fprintf(stderr, "test_cudnn_graph: cuDNN not usable (%s), skipped\n", why);
        return 77;
    }
    fprintf(stderr, "test_cudnn_graph: cuDNN %ld\n", version);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graphs_validate),
        cmocka_unit_test(test_bad_graph_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL) ? 1 : 0;
}
