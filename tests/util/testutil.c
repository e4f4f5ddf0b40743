#include "testutil.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <time.h>
#include <sys/wait.h>

int mt_allclose(const char *what, const float *got, const float *ref, size_t n, double atol,
                double rtol) {
    double max_abs = 0, worst_frac = 0;
    size_t worst = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)ref[i]);
        double tol = atol + rtol * fabs((double)ref[i]);
        double frac = err / tol;
        if (!(err <= tol)) { /* NaN fails too */
            if (bad < 5)
                fprintf(stderr, "  %s[%zu]: got %.9g ref %.9g err %.3g tol %.3g\n", what, i,
                        got[i], ref[i], err, tol);
            bad++;
            if (isnan(err)) frac = INFINITY;
        }
        if (err > max_abs) max_abs = err;
        if (frac > worst_frac || isnan(frac)) {
            worst_frac = frac;
            worst = i;
        }
    }
    fprintf(stderr, "%-40s n=%-8zu max_abs_err=%.3g worst[%zu] %.1f%% of tol (atol %.1g rtol %.1g)%s\n",
            what, n, max_abs, worst, 100.0 * worst_frac, atol, rtol, bad ? "  FAIL" : "");
    if (bad) fprintf(stderr, "  %zu of %zu elements out of tolerance\n", bad, n);
    return bad == 0;
}

double mt_test_rms(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return n ? sqrt(s / n) : 0.0;
}

int mt_test_check_rms(const char *what, const float *got, const float *ref, size_t n, double atol_rel,
                      double rtol) {
    double scale = mt_test_rms(ref, n);
    if (scale == 0) scale = 1;
    return mt_allclose(what, got, ref, n, atol_rel * scale, rtol);
}

int mt_test_check_rows(const char *what, const float *got, const float *ref, size_t rows, size_t width,
                       double atol_rel, double rtol, double tensor_tol) {
    double worst = 0, floor = 0.5 * mt_test_rms(ref, rows * width);
    size_t bad = 0, worst_i = 0;
    for (size_t r = 0; r < rows; r++) {
        double scale = mt_test_rms(ref + r * width, width);
        if (scale < floor) scale = floor;
        if (scale == 0) scale = 1;
        for (size_t j = 0; j < width; j++) {
            size_t i = r * width + j;
            double err = fabs((double)got[i] - ref[i]), tol = atol_rel * scale + rtol * fabs(ref[i]);
            double frac = err / tol;
            if (!(err <= tol)) {
                if (bad < 5)
                    fprintf(stderr, "  %s[%zu]: got %.6g ref %.6g err %.3g tol %.3g\n", what, i, got[i],
                            ref[i], err, tol);
                bad++;
                if (isnan(frac)) frac = INFINITY;
            }
            if (frac > worst) worst = frac, worst_i = i;
        }
    }
    double tensor = mt_max_rel_err(got, ref, rows * width);
    int ok = bad == 0 && tensor <= tensor_tol;
    fprintf(stderr, "%-40s n=%-8zu worst[%zu] %.1f%% of row tol (atol %.0e*max(row rms, rms/2), rtol %.0e); "
                    "max|err|/max|ref| %.3g (tol %.0e)%s\n",
            what, rows * width, worst_i, 100 * worst, atol_rel, rtol, tensor, tensor_tol, ok ? "" : "  FAIL");
    return ok;
}

int mt_test_same_elems(const char *what, const void *got, const void *want, size_t n, size_t elem) {
    const uint8_t *g = got, *w = want;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(g + i * elem, w + i * elem, elem) != 0) {
            if (bad < 4) {
                uint32_t gv = 0, wv = 0;
                memcpy(&gv, g + i * elem, elem < 4 ? elem : 4);
                memcpy(&wv, w + i * elem, elem < 4 ? elem : 4);
                fprintf(stderr, "  %s[%zu]: got 0x%x, want 0x%x\n", what, i, gv, wv);
            }
            bad++;
        }
    }
    fprintf(stderr, "%-34s %zu elements: %s (%zu differ)\n", what, n,
            bad ? "DIFFER  FAIL" : "bit for bit", bad);
    return bad == 0;
}

double mt_max_rel_err(const float *got, const float *ref, size_t n) {
    double max_err = 0, max_ref = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)ref[i]);
        if (isnan(err)) return INFINITY;
        if (err > max_err) max_err = err;
        if (fabs((double)ref[i]) > max_ref) max_ref = fabs((double)ref[i]);
    }
    return max_ref > 0 ? max_err / max_ref : max_err;
}

int mt_check_rel(const char *what, const float *got, const float *ref, size_t n, double tol) {
    double e = mt_max_rel_err(got, ref, n);
    int ok = e <= tol;
    fprintf(stderr, "%-48s n=%-8zu max|got-ref|/max|ref| = %.3g (tol %.1g, %.1f%% used)%s\n", what, n,
            e, tol, 100.0 * e / tol, ok ? "" : "  FAIL");
    return ok;
}

void mt_test_rng_seed(mt_test_rng *r, uint64_t seed) { r->s = seed ^ 0x9e3779b97f4a7c15ull; }

uint64_t mt_test_rng_u64(mt_test_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float mt_test_rng_uniform(mt_test_rng *r) {
    return (float)((mt_test_rng_u64(r) >> 40) * (1.0 / 16777216.0));
}

float mt_test_rng_normal(mt_test_rng *r) {
    double u1 = ((mt_test_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (mt_test_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void mt_test_fill_normal(mt_test_rng *r, float *x, size_t n, float std) {
    for (size_t i = 0; i < n; i++) x[i] = std * mt_test_rng_normal(r);
}

void mt_test_fill_grad(mt_test_rng *r, float *g, size_t n) {
    mt_test_fill_normal(r, g, n, 0.02f);
    for (size_t i = 0; i < n; i++) {
        if (i % 7 == 0) g[i] *= 1e3f;
        else if (i % 11 == 3) g[i] *= 1e-20f;
        else if (i % 13 == 5) g[i] = 0.0f;
    }
}

void mt_test_fill_uniform(mt_test_rng *r, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * mt_test_rng_uniform(r);
}

char *mt_fixture_path(const char *rel) {
    const char *dir = getenv("MT_FIXTURES");
    if (!dir || !*dir) dir = MT_SOURCE_DIR "/tests/fixtures";
    size_t n = strlen(dir) + strlen(rel) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", dir, rel);
    return p;
}

char *mt_fixture_vpathf(const char *fmt, va_list ap) {
    char rel[1024];
    vsnprintf(rel, sizeof rel, fmt, ap);
    return mt_fixture_path(rel);
}

char *mt_test_tmpdir(void) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    size_t n = strlen(base) + 32;
    char *p = malloc(n);
    snprintf(p, n, "%s/mt_test_XXXXXX", base);
    if (!mkdtemp(p)) {
        perror("mkdtemp");
        abort();
    }
    return p;
}

void mt_test_rmtree(const char *path) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", path);
}

char *mt_test_dir;

int mt_test_dir_setup(void **state) {
    mt_test_dir = mt_test_tmpdir();
    return 0;
}

int mt_test_dir_teardown(void **state) {
    mt_test_rmtree(mt_test_dir);
    free(mt_test_dir);
    mt_test_dir = NULL;
    return 0;
}

char *mt_test_dir_sub(const char *name) {
    size_t n = strlen(mt_test_dir) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", mt_test_dir, name);
    return p;
}

const char *mt_test_dir_path(char *buf, const char *name) {
    snprintf(buf, 512, "%s/%s", mt_test_dir, name);
    return buf;
}

void mt_test_write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

void mt_test_read_text(const char *path, char *buf, size_t size) {
    buf[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) return;
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
}

double mt_test_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void mt_test_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int mt_test_run(const char *cmd, char *buf, size_t buf_size) {
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *f = popen(full, "r");
    if (!f) return -1;
    size_t len = 0;
    if (buf_size) buf[0] = '\0';
    while (buf_size && len + 1 < buf_size) {
        size_t got = fread(buf + len, 1, buf_size - 1 - len, f);
        if (got == 0) break;
        len += got;
    }
    if (buf_size) buf[len] = '\0';
    char sink[4096];
    while (fread(sink, 1, sizeof sink, f) > 0) {}
    int status = pclose(f);
    if (status == -1) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int mt_cli_env_init(mt_cli_env *env, const char *fixture) {
    env->bin = getenv("MT_BIN");
    env->tmp = env->fixture = NULL;
    if (!env->bin) {
        fprintf(stderr, "MT_BIN is not set (run through ctest)\n");
        return -1;
    }
    /* The runs are tiny: OpenMP threads that spin while idle make them 10x slower on a loaded
     * 2-core machine. Passive waiting changes no result. */
    setenv("OMP_WAIT_POLICY", "passive", 0);
    env->tmp = mt_test_tmpdir();
    env->fixture = mt_fixture_path(fixture);
    return 0;
}

void mt_cli_env_free(mt_cli_env *env) {
    if (env->tmp) mt_test_rmtree(env->tmp);
    free(env->tmp), free(env->fixture);
    env->tmp = env->fixture = NULL;
}

int mt_cli_env_teardown(void **state) {
    if (*state) mt_cli_env_free(*state);
    return 0;
}

int mt_check_rel_l2(const char *what, const float *got, const float *ref, size_t n, double tol) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    int ok = rel <= tol; /* NaN fails */
    fprintf(stderr, "%-48s n=%-8zu rel L2 %.3g (tol %.0e, %.0f%%) | max|err|/max|ref| %.3g%s\n", what, n,
            rel, tol, 100 * rel / tol, mt_max_rel_err(got, ref, n), ok ? "" : "  FAIL");
    return ok;
}

int mt_test_count_prefix(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    closedir(d);
    return n;
}

void mt_test_stream_rows(int32_t *ids, int32_t *targets, int B, int T, int V, int step) {
    for (int r = 0; r < B; r++) {
        int32_t x = (int32_t)((step * 7 + r * 13) % V);
        for (int i = 0; i < T; i++) {
            ids[r * T + i] = x;
            x = (3 * x + 1) % V;
            targets[r * T + i] = x;
        }
    }
}
