/* Helpers shared by the tests: tolerance checks that print what failed, a seeded RNG, paths. */
#ifndef MT_TESTUTIL_H
#define MT_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* Elementwise check |got - ref| <= atol + rtol * |ref|. Prints one line with the max abs error, the
 * worst element and the percent of tolerance used; on failure also the first offending values.
 * Returns 1 when every element passes (NaN never passes). */
int mt_allclose(const char *what, const float *got, const float *ref, size_t n, double atol,
                double rtol);

/* Tensor-relative error: max_i |got_i - ref_i| / max_i |ref_i| (ref all zero: the max abs error).
 * This is the metric for whole-model comparisons against fixtures. */
double mt_max_rel_err(const float *got, const float *ref, size_t n);

/* ||got - ref|| / ||ref|| <= tol (NaN fails), printed with mt_max_rel_err beside it; 1 on pass. */
int mt_check_rel_l2(const char *what, const float *got, const float *ref, size_t n, double tol);
/* Checks mt_max_rel_err <= tol, printing the numbers; returns 1 on pass. */
int mt_check_rel(const char *what, const float *got, const float *ref, size_t n, double tol);

/* Deterministic RNG (splitmix64 + Box-Muller). */
typedef struct { uint64_t s; } mt_test_rng;
void mt_test_rng_seed(mt_test_rng *r, uint64_t seed);
uint64_t mt_test_rng_u64(mt_test_rng *r);
float mt_test_rng_uniform(mt_test_rng *r);           /* [0, 1) */
float mt_test_rng_normal(mt_test_rng *r);
void mt_test_fill_normal(mt_test_rng *r, float *x, size_t n, float std);
/* Gradients with mixed magnitudes: mostly normal(0, 0.02), every 7th 1e3x larger, some 1e-20x
 * (subnormal or zero in fp32), some exactly zero. */
void mt_test_fill_grad(mt_test_rng *r, float *g, size_t n);
void mt_test_fill_uniform(mt_test_rng *r, float *x, size_t n, float lo, float hi);

/* $MT_FIXTURES/<rel> (the source tree's tests/fixtures when unset), malloc'd; the caller frees. */
char *mt_fixture_path(const char *rel);

/* A fresh empty temporary directory (malloc'd path); mt_test_rmtree removes it. */
char *mt_test_tmpdir(void);
void mt_test_rmtree(const char *path);

/* What the tests that drive the megatrain binary share: its path ($MT_BIN, set by ctest), a fresh
 * temporary directory and a fixture directory. Returns -1 (a cmocka setup failure) when MT_BIN is
 * not set. */
typedef struct {
    const char *bin;
    char *tmp;
    char *fixture;
} mt_cli_env;
int mt_cli_env_init(mt_cli_env *env, const char *fixture);
void mt_cli_env_free(mt_cli_env *env);

/* Runs a shell command, returns its exit status (or -1), captures stdout+stderr into buf. */
int mt_test_run(const char *cmd, char *buf, size_t buf_size);

/* Step `step`'s rows of a learnable stream (B rows of T tokens): token i+1 = (3 * token i + 1)
 * mod V, each row from its own start; targets the next tokens, none ignored. */
void mt_test_stream_rows(int32_t *ids, int32_t *targets, int B, int T, int V, int step);

/* Entries of directory dir whose names start with prefix (0 when dir cannot be opened). */
int mt_test_count_prefix(const char *dir, const char *prefix);

/* Runs the shell command printf(fmt, ...); a non-zero exit fails the test. */
void mt_test_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Runs `cd env->tmp && env->bin ARGS`, ARGS = printf(fmt, ...), with stdout and stderr into out; a
 * crash or a sanitizer report fails the test. Returns the exit code. */
int mt_cli_run(const mt_cli_env *env, char *out, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Fails the test unless rc == want and (needle NULL or) out contains needle. */
void mt_cli_expect(int rc, int want, const char *out, const char *needle);

/* The error lines of a run's output: those starting "megatrain: " but not "megatrain: warning:".
 * Returns their count; a copy of the first goes to first. */
int mt_cli_error_lines(const char *out, char *first, size_t first_size);

/* A tiny Llama that has a tokenizer, for the tests of text and chat data: train_llama's config with
 * vocab_size 1536 (>= the llama3 fixture tokenizer's 1506 ids) and initializer_range init_std,
 * after one `train --init` step in env->tmp/init, with tests/fixtures/tokenizers/llama3 copied into
 * its checkpoint directory, whose path goes to model. 0, or -1 with a message on stderr (for a
 * cmocka group setup). */
int mt_cli_tokenizer_model(const mt_cli_env *env, double init_std, char *model, size_t size);

#endif
