/* Helpers shared by the tests: tolerance checks that print what failed, a seeded RNG, paths, a
 * group's temporary directory, small file and clock helpers, and the CLI tests' environment. */
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

/* sqrt(mean of x^2) in double; 0 for n = 0. */
double mt_test_rms(const float *x, size_t n);
/* mt_allclose with atol = atol_rel * RMS(ref) (RMS 0: atol_rel): an absolute tolerance at the
 * reference tensor's own scale. */
int mt_test_check_rms(const char *what, const float *got, const float *ref, size_t n, double atol_rel,
                      double rtol);
/* got vs ref over rows of `width`: |got - ref| <= atol_rel * scale + rtol * |ref| with scale the
 * row's RMS, floored at half the tensor's (a row that is zero in exact arithmetic carries noise at
 * the tensor's scale), plus the tensor metric mt_max_rel_err <= tensor_tol. For outputs whose rows
 * differ in magnitude by orders (attention gradients). 1 on pass. */
int mt_test_check_rows(const char *what, const float *got, const float *ref, size_t rows, size_t width,
                       double atol_rel, double rtol, double tensor_tol);

/* The n elements of elem bytes at got and want are the same bytes: prints the first few that
 * differ (their first 4 bytes in hex) and the count; 1 when none differ. */
int mt_test_same_elems(const char *what, const void *got, const void *want, size_t n, size_t elem);

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

/* $MT_FIXTURES/<rel> (the source tree's tests/fixtures when unset), malloc'd; the caller frees.
 * mt_fixture_vpathf: rel = vprintf(fmt, ap). */
char *mt_fixture_path(const char *rel);
char *mt_fixture_vpathf(const char *fmt, va_list ap);

/* A fresh empty temporary directory (malloc'd path); mt_test_rmtree removes it. */
char *mt_test_tmpdir(void);
void mt_test_rmtree(const char *path);

/* The temporary directory of a cmocka group: mt_test_dir_setup (the group's setup) makes a fresh
 * one at mt_test_dir, mt_test_dir_teardown removes it. mt_test_dir_sub is mt_test_dir/name
 * (malloc'd), mt_test_dir_path the same into buf (512 bytes), which it returns. */
extern char *mt_test_dir;
int mt_test_dir_setup(void **state);
int mt_test_dir_teardown(void **state);
char *mt_test_dir_sub(const char *name);
const char *mt_test_dir_path(char *buf, const char *name);

/* A new file at path holding the n bytes of data. */
void mt_test_write_bytes(const char *path, const void *data, size_t n);
/* The first size - 1 bytes of the file at path into buf, NUL-terminated ("" when it cannot be
 * opened). */
void mt_test_read_text(const char *path, char *buf, size_t size);

/* Seconds on the monotonic clock; a sleep of ms milliseconds. */
double mt_test_now_s(void);
void mt_test_sleep_ms(int ms);

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
/* A cmocka group teardown that frees the mt_cli_env its group setup put in *state. */
int mt_cli_env_teardown(void **state);
/* 1 when env->tmp/rel exists (lstat: a dangling link counts). */
int mt_cli_exists(const mt_cli_env *env, const char *rel);

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

/* `train` of env's fixture model on its data.bin (batch 2 of 16 tokens, lr 1e-2, warmup 1, on the
 * CPU) with --out out_dir (under env->tmp), then extra; the output into out. Returns the exit code;
 * mt_cli_train_ok fails the test, printing the output, unless it is 0. */
int mt_cli_train(const mt_cli_env *env, char *out, size_t size, const char *out_dir,
                 const char *extra);
void mt_cli_train_ok(const mt_cli_env *env, char *out, size_t size, const char *out_dir,
                     const char *extra);

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
