/* Training a multimodal Qwen3.5 checkpoint (tests/fixtures/qwen3_5_vl_mtp) says what it does not
 * train: the vision tower and the multi-token-prediction layer are carried, and named so, not
 * dropped or trained silently. */
#include <string.h>

#include "util/testutil.h"

#define OUT_SIZE 65536

static void test_carried_named(void **state) {
    (void)state;
    mt_cli_env g;
    assert_int_equal(mt_cli_env_init(&g, "qwen3_5_vl_mtp"), 0);
    static char out[OUT_SIZE];
    /* train_llama's token file: its ids are below this model's vocabulary (96) too */
    int rc = mt_cli_run(&g, out, sizeof out,
                        "train --model '%s' --data '%s/../train_llama/data.bin' --steps 1 --batch 1 "
                        "--seq 8 --device cpu --out run --no-save --no-tensorboard",
                        g.fixture, g.fixture);
    mt_cli_expect(rc, 0, out, "carried, not trained: 36 tensors");
    mt_cli_expect(rc, 0, out, "21 vision (model.visual.*: image and video inputs are not supported)");
    mt_cli_expect(rc, 0, out, "15 multi-token prediction (mtp.*: not trained");
    mt_cli_env_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_carried_named)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
