/* megatrain plot: a run's OUT/metrics.jsonl as an SVG picture (svg_plot.h): loss and eval loss,
 * learning rate, tokens/s, over steps. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/error.h"
#include "../io/lines.h"
#include "commands.h"
#include "svg_plot.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: megatrain plot [--out FILE.svg] [--log-loss] OUT\n"
            "  Draws the run in directory OUT (its metrics.jsonl, as `megatrain train --out OUT` writes\n"
            "  it; or a metrics .jsonl file itself) as an SVG picture: training loss with eval loss,\n"
            "  learning rate, and tokens/s, over steps. Steps whose loss was not finite are red\n"
            "  ticks at the bottom of the loss panel. When the file holds an older run that a resumed\n"
            "  one went over again, the newer lines win. Lines that are not JSON are counted and\n"
            "  skipped.\n"
            "  --out FILE   where to write (default OUT/metrics.svg, or FILE.svg beside a .jsonl)\n"
            "  --log-loss   log-scale loss axis\n");
}

typedef struct {
    double *v;
    size_t n, cap;
} dvec;

static void push(dvec *d, double v) {
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 256;
        d->v = realloc(d->v, d->cap * sizeof(double));
        MT_CHECK(d->v, "out of memory");
    }
    d->v[d->n++] = v;
}

/* What the file says, one point per step: train lines in increasing step order (the parallel
 * arrays), eval lines likewise. */
typedef struct {
    dvec step, loss, lr, tok, bad; /* bad: 1 where the loss was null or marked non-finite */
    dvec estep, eloss;
    long long lines, not_json, first_not_json, no_step, superseded, resumes;
    double resumed_at; /* the step of the last restart, when resumes > 0 */
} metrics;

static void metrics_free(metrics *m) {
    dvec *all[] = {&m->step, &m->loss, &m->lr, &m->tok, &m->bad, &m->estep, &m->eloss};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]->v);
}

/* A numeric field's value; NaN when it is missing, null or not a number. */
static double field(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* A train line for a step at or before the last one: the run was resumed from an earlier
 * checkpoint over an old metrics.jsonl. What the old run logged from that step on is no longer
 * this run's history. */
static void supersede_train(metrics *m, double step) {
    size_t n = m->step.n;
    while (n > 0 && m->step.v[n - 1] >= step) n--;
    m->superseded += (long long)(m->step.n - n);
    m->step.n = m->loss.n = m->lr.n = m->tok.n = m->bad.n = n;
}

static void supersede_eval(metrics *m, double step) {
    size_t n = m->estep.n;
    while (n > 0 && m->estep.v[n - 1] >= step) n--;
    m->superseded += (long long)(m->estep.n - n);
    m->estep.n = m->eloss.n = n;
}

static void add_line(metrics *m, json_t *o) {
    json_t *js = json_object_get(o, "step");
    double step = json_is_number(js) ? json_number_value(js) : NAN;
    if (!(fabs(step) < 1e15)) { /* missing, not a number, or no step count */
        m->no_step++;
        return;
    }
    if (json_object_get(o, "loss")) {
        if (m->step.n && m->step.v[m->step.n - 1] >= step) {
            m->resumes++;
            m->resumed_at = step;
            supersede_train(m, step);
            supersede_eval(m, step);
        }
        double loss = field(o, "loss");
        int bad = !isfinite(loss) || json_is_true(json_object_get(o, "nonfinite"));
        push(&m->step, step);
        push(&m->loss, bad ? NAN : loss);
        push(&m->lr, field(o, "lr"));
        push(&m->tok, field(o, "tok_s"));
        push(&m->bad, bad);
    }
    if (json_object_get(o, "eval_loss")) {
        supersede_eval(m, step);
        push(&m->estep, step);
        push(&m->eloss, field(o, "eval_loss"));
    }
}

static int metrics_read(metrics *m, const char *path) {
    mt_lines in;
    MT_TRY(mt_lines_open(&in, path));
    const char *line;
    size_t len;
    int rc;
    while ((rc = mt_lines_next(&in, &line, &len)) == 1) {
        if (strspn(line, " \t\r\n") == len) continue;
        m->lines++;
        json_t *o = json_loadb(line, len, 0, NULL);
        if (!json_is_object(o)) {
            if (!m->not_json++) m->first_not_json = in.lineno;
        } else {
            add_line(m, o);
        }
        json_decref(o);
    }
    mt_lines_close(&in);
    if (rc != 0) return MT_ERR;
    if (m->not_json)
        fprintf(stderr, "megatrain: warning: %s: %lld lines are not JSON objects, skipped (the first: line %lld)\n",
                path, m->not_json, m->first_not_json);
    if (m->no_step)
        fprintf(stderr, "megatrain: warning: %s: %lld lines have no numeric \"step\", skipped\n", path, m->no_step);
    if (m->lines == 0) return mt_error_set("%s: empty, no metrics to plot", path);
    if (m->step.n == 0 && m->estep.n == 0)
        return mt_error_set("%s: no metrics lines (a \"step\" with \"loss\" or \"eval_loss\") in %lld lines",
                            path, m->lines);
    return MT_OK;
}

/* OUT (a directory or a .jsonl file) to the metrics file, the default output and the title. */
static int resolve(const char *arg, char *jsonl, char *svg, size_t size) {
    struct stat st;
    if (stat(arg, &st) != 0) return mt_error_set("%s: %s (give a `train --out` directory)", arg, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        snprintf(jsonl, size, "%s/metrics.jsonl", arg);
        snprintf(svg, size, "%s/metrics.svg", arg);
        return MT_OK;
    }
    snprintf(jsonl, size, "%s", arg);
    size_t n = strlen(arg);
    if (n > 6 && !strcmp(arg + n - 6, ".jsonl")) n -= 6;
    snprintf(svg, size, "%.*s.svg", (int)n, arg);
    return MT_OK;
}

static size_t count_nonpositive(const dvec *d) {
    size_t n = 0;
    for (size_t i = 0; i < d->n; i++) n += isfinite(d->v[i]) && d->v[i] <= 0;
    return n;
}

static void append(char *buf, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t size, const char *fmt, ...) {
    size_t at = strlen(buf);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + at, size - at, fmt, ap);
    va_end(ap);
}

/* "steps 1–60 · loss 5.5410 → 2.3120 · eval loss 2.4010 at step 60 · 2 non-finite · resumed at
 * step 31" */
static void describe(const metrics *m, size_t n_bad, char *buf, size_t size) {
    static const char *dot = "  \u00b7  ";
    buf[0] = '\0';
    if (m->step.n) {
        if (m->step.n == 1)
            append(buf, size, "step %.10g", m->step.v[0]);
        else
            append(buf, size, "steps %.10g\u2013%.10g", m->step.v[0], m->step.v[m->step.n - 1]);
        double first = NAN, last = NAN;
        for (size_t i = 0; i < m->loss.n; i++)
            if (isfinite(m->loss.v[i])) {
                if (!isfinite(first)) first = m->loss.v[i];
                last = m->loss.v[i];
            }
        if (isfinite(first)) append(buf, size, "%sloss %.4f \u2192 %.4f", dot, first, last);
    }
    for (size_t i = m->eloss.n; i-- > 0;)
        if (isfinite(m->eloss.v[i])) {
            append(buf, size, "%seval loss %.4f at step %.10g", buf[0] ? dot : "", m->eloss.v[i], m->estep.v[i]);
            break;
        }
    if (n_bad) append(buf, size, "%s%zu non-finite", dot, n_bad);
    if (m->resumes) append(buf, size, "%sresumed at step %.10g", dot, m->resumed_at);
}

static int write_svg(const char *path, const mt_plot *p) {
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return mt_error_set("--out %s: cannot write: %s", path, strerror(errno));
    mt_svg_plot_write(f, p);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        int e = errno;
        remove(tmp);
        return mt_error_set("--out %s: cannot write: %s", path, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        return mt_error_set("--out %s: cannot write: %s", path, strerror(e));
    }
    return MT_OK;
}

static int plot(const char *arg, const char *out, int log_loss) {
    char metrics_path[PATH_MAX], svg_path[PATH_MAX];
    MT_TRY(resolve(arg, metrics_path, svg_path, sizeof metrics_path));
    if (out) snprintf(svg_path, sizeof svg_path, "%s", out);
    struct stat a, b; /* never write the picture over the data */
    if (stat(svg_path, &a) == 0 && stat(metrics_path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        return mt_error_set("--out %s: that is the metrics file being plotted; choose another name", svg_path);
    metrics m = {0};
    if (metrics_read(&m, metrics_path) != MT_OK) {
        metrics_free(&m);
        return MT_ERR;
    }
    if (log_loss && count_nonpositive(&m.loss) + count_nonpositive(&m.eloss))
        fprintf(stderr, "megatrain: warning: --log-loss: %zu loss values <= 0 are not drawn\n",
                count_nonpositive(&m.loss) + count_nonpositive(&m.eloss));

    dvec bad_x = {0};
    for (size_t i = 0; i < m.bad.n; i++)
        if (m.bad.v[i]) push(&bad_x, m.step.v[i]);
    char bad_label[64], title[PATH_MAX + 32], subtitle[512];
    snprintf(bad_label, sizeof bad_label, "non-finite loss (%zu)", bad_x.n);
    char *real = realpath(arg, NULL);
    snprintf(title, sizeof title, "megatrain run: %s", real ? real : arg);
    free(real);
    describe(&m, bad_x.n, subtitle, sizeof subtitle);

    mt_plot_panel panels[3] = {
        {.name = "loss", .heading = "loss", .log_y = log_loss, .legend = 1, .n_series = 2,
         .series = {{"train loss", "#1f77b4", m.step.v, m.loss.v, m.step.n, 0},
                    {"eval loss", "#ff7f0e", m.estep.v, m.eloss.v, m.estep.n, 1}},
         .bad_x = bad_x.v, .n_bad = bad_x.n, .bad_label = bad_label},
        {.name = "lr", .heading = "learning rate", .n_series = 1,
         .series = {{"learning rate", "#2ca02c", m.step.v, m.lr.v, m.step.n, 0}}},
        {.name = "tok_s", .heading = "tokens/s", .n_series = 1,
         .series = {{"tokens/s", "#9467bd", m.step.v, m.tok.v, m.step.n, 0}}},
    };
    mt_plot p = {.title = title, .subtitle = subtitle[0] ? subtitle : NULL, .x_label = "step", .x_integer = 1,
                 .panels = panels, .n_panels = 3};
    int rc = write_svg(svg_path, &p);
    if (rc == MT_OK)
        printf("%s: %zu steps, %zu evals, %zu non-finite%s\n", svg_path, m.step.n, m.estep.n, bad_x.n,
               m.superseded ? " (older lines of a resumed run left out)" : "");
    free(bad_x.v);
    metrics_free(&m);
    return rc;
}

int mt_cmd_plot(int argc, char **argv) {
    const char *out = NULL;
    int log_loss = 0;
    static const struct option opts[] = {{"out", required_argument, 0, 'o'},
                                         {"log-loss", no_argument, 0, 'l'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'l': log_loss = 1; break;
        case 'h': print_usage(stdout); return 0;
        default: print_usage(stderr); return 1;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "megatrain: plot takes one run directory (got %d arguments)\n", argc - optind);
        print_usage(stderr);
        return 1;
    }
    return plot(argv[optind], out, log_loss) == MT_OK ? 0 : mt_cli_fail();
}
