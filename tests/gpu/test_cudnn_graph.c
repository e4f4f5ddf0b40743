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

/* The variable-length graphs of packed rows (MT_ATTENTION_DOCS=cudnn): for the document shapes
 * test_cuda_attention's docs cases and the bench run, as attention_docs.h buckets them (and a few
 * more buckets: 1 sequence, 64 tokens, 512k tokens with int64 offsets). */
static void expect_docs_valid(int backward, int S, int s_max, int B, int T, int H, int G, int D,
                              int want) {
    char why[512];
    int ok = mt_cuda_attention_cudnn_validate_docs(backward, S, s_max, B, T, H, G, D, 90, why,
                                                   sizeof why);
    fprintf(stderr, "%s docs S=%d s_max=%d B=%d T=%d H=%d G=%d D=%d sm_90: %s%s%s%s\n",
            backward ? "bwd" : "fwd", S, s_max, B, T, H, G, D, ok == 1 ? "valid" : "invalid",
            *why ? " (" : "", why, *why ? ")" : "");
    assert_int_equal(ok, want);
}

static void test_docs_graphs_validate(void **state) {
    static const int shapes[][7] = {
        /* S, s_max, B, T, H, G, D */
        {8, 1000, 2, 1000, 8, 2, 128},    {8, 257, 3, 257, 8, 1, 64},
        {4, 4096 + 17, 1, 4096 + 17, 7, 1, 128}, {4, 2048 + 5, 2, 2048 + 5, 28, 4, 128},
        {8, 2048 + 5, 2, 2048 + 5, 28, 4, 128},  {8, 600, 2, 600, 8, 2, 128},
        {8, 4096, 1, 32768, 28, 4, 128},  {4, 1024, 1, 4096, 28, 4, 128},
        {64, 4096, 16, 4096, 28, 4, 128}, {1, 64, 1, 64, 2, 1, 128},
        {1024, 64, 1, 65536, 28, 4, 128}, {16, 65536, 1, 524288, 28, 4, 128},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int bwd = 0; bwd < 2; bwd++)
            expect_docs_valid(bwd, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3],
                              shapes[i][4], shapes[i][5], shapes[i][6], 1);
    /* and it can fail: query heads not a multiple of the kv heads */
    expect_docs_valid(0, 4, 128, 1, 256, 8, 3, 128, 0);
    expect_docs_valid(1, 4, 128, 1, 256, 8, 3, 128, 0);
}

/* The graphs with a call's options: Gemma 3's query_pre_attn_scalar and 1024-token window (heads
 * of 128), Gemma 4's sliding layers (heads of 256, window 1024), gpt-oss's 128-token band (64) and
 * its sinks (the forward's sink tensor), on its sliding and its full layers. */
static void test_options_graphs_validate(void **state) {
    static const struct { int B, T, H, G, D; float scale; int window, sinks; } shapes[] = {
        {16, 4096, 32, 16, 128, 0.0771517f, 1024, 0}, {1, 131072, 32, 16, 128, 0.0771517f, 1024, 0},
        {16, 4096, 16, 8, 256, 1.0f, 1024, 0},         {1, 4096, 64, 8, 64, 0, 128, 0},
        {2, 300, 8, 2, 128, 0.2f, 0, 0},               {1, 700, 4, 2, 256, 0.0625f, 200, 0},
        {16, 4096, 64, 8, 64, 0, 128, 1},              {16, 4096, 64, 8, 64, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int bwd = 0; bwd < 2; bwd++) {
            char why[512];
            int ok = mt_cuda_attention_cudnn_validate_opts(
                bwd, shapes[i].B, shapes[i].T, shapes[i].H, shapes[i].G, shapes[i].D,
                shapes[i].scale, shapes[i].window, shapes[i].sinks, 90, why, sizeof why);
            fprintf(stderr, "%s B=%d T=%d H=%d G=%d D=%d scale=%g W=%d%s sm_90: %s%s%s%s\n",
                    bwd ? "bwd" : "fwd", shapes[i].B, shapes[i].T, shapes[i].H, shapes[i].G,
                    shapes[i].D, shapes[i].scale, shapes[i].window, shapes[i].sinks ? " sinks" : "",
                    ok == 1 ? "valid" : "invalid",
                    *why ? " (" : "", why, *why ? ")" : "");
            assert_int_equal(ok, 1);
        }
}

/* The variable-length graphs (packed documents) with options validate for sm_90: the shapes of
 * test_cuda_attention's packed option cases (S and s_max as their buckets), and one plain. */
static void test_docs_options_graphs(void **state) {
    static const struct { int S, s_max, B, T, H, G, D; float scale; int window, sinks; } shapes[] = {
        {4, 128, 1, 200, 4, 1, 128, 0.05f, 0, 0}, {8, 128, 2, 300, 8, 2, 64, 0, 3, 0},
        {8, 128, 2, 300, 8, 2, 64, 0, 0, 1},      {8, 128, 2, 300, 4, 2, 256, 0.0625f, 64, 0},
        {8, 128, 2, 300, 8, 2, 128, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int bwd = 0; bwd < 2; bwd++) {
            char why[512] = "";
            int ok = mt_cuda_attention_cudnn_validate_docs_opts(
                bwd, shapes[i].S, shapes[i].s_max, shapes[i].B, shapes[i].T, shapes[i].H, shapes[i].G,
                shapes[i].D, shapes[i].scale, shapes[i].window, shapes[i].sinks, 90, why, sizeof why);
            fprintf(stderr, "docs %s S=%d s_max=%d D=%d scale=%g W=%d%s sm_90: %s%s%s%s\n", bwd ? "bwd" : "fwd",
                    shapes[i].S, shapes[i].s_max, shapes[i].D, shapes[i].scale, shapes[i].window,
                    shapes[i].sinks ? " sinks" : "", ok == 1 ? "valid" : "invalid", *why ? " (" : "", why,
                    *why ? ")" : "");
            assert_int_equal(ok, 1);
        }
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
        cmocka_unit_test(test_docs_graphs_validate),
        cmocka_unit_test(test_options_graphs_validate),
        cmocka_unit_test(test_docs_options_graphs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL) ? 1 : 0;
}
