/* Comparing two training runs by their files: the step lines of metrics.jsonl, the weights of a
 * checkpoint's model.safetensors, and files byte for byte. Used by the data-parallel tests
 * (tests/test_cli_dp.c on the cpu backend, tests/gpu/test_cuda_dp_ranks.c on GPUs). Each fails
 * the calling cmocka test with a message naming the file. */
#ifndef MT_TEST_RUN_COMPARE_H
#define MT_TEST_RUN_COMPARE_H

#include <stddef.h>

/* The loss and grad_norm of each step line of the metrics.jsonl at path, in order (the lines'
 * "step" must count 1, 2, ...; at most max); text (may be NULL): each line's "loss" and
 * "grad_norm" as printed, for bitwise comparisons. Returns the number of step lines. */
int mt_test_read_step_metrics(const char *path, int max, double *loss, double *norm,
                              char (*text)[256]);

/* Every tensor of the fp32 model.safetensors at b within tol (mt_check_rel) of a's; label names
 * the comparison in the printed lines. */
void mt_test_weights_close(const char *a, const char *b, const char *label, double tol);

/* The two files are the same bytes (else the failure shows the first differing ones). */
void mt_test_same_bytes(const char *a, const char *b);

#endif
