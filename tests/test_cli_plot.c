/* `megatrain plot` (env MT_BIN): a metrics.jsonl with known values in, the SVG read back:
 *  - it is well-formed XML (a small checker below), with the panels loss, lr and tok_s;
 *  - every series has one point per value (nulls skipped, the line broken there), the points lie
 *    in increasing x at the pixel that the panel's own axis mapping gives the known step and value,
 *    the smallest and largest value at the panel's bottom and top, eval loss as markers;
 *  - the tick labels are the expected 1/2/5 x 10^k numbers and sit at their values' pixels
 *    (linear and --log-loss);
 *  - non-finite losses (null, "nonfinite": true) are red ticks at their steps;
 *  - a resumed run's newer lines win; CPU lines without the GPU fields, one line, long runs
 *    (decimated, spikes kept), odd characters in the path;
 *  - errors: missing directory or file, empty file, nothing usable, bad --out: one line naming it,
 *    exit 1, no file left; invalid JSON lines: a counted warning. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/testutil.h"

#define OUT_SIZE 65536
#define MAXP 20000

static mt_cli_env g_env;

#define mt(out, ...) mt_cli_run(&g_env, out, OUT_SIZE, __VA_ARGS__)
#define expect mt_cli_expect

static void write_file(const char *rel, const char *text) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", g_env.tmp, rel);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static int exists(const char *rel) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", g_env.tmp, rel);
    return access(p, F_OK) == 0;
}

static char *read_file(const char *rel) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", g_env.tmp, rel);
    FILE *f = fopen(p, "rb");
    if (!f) fail_msg("cannot read %s", p);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

/* ---- a small XML well-formedness check: one root, tags nest and close, attribute values quoted,
 * no '<' in text or values, '&' only in entities. NULL when well-formed, else what is wrong. ---- */
static int name_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("-_:.", c); }

static const char *entity(const char *p) { /* p at '&': past the entity, or NULL */
    static const char *named[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
    for (size_t i = 0; i < 5; i++)
        if (!strncmp(p, named[i], strlen(named[i]))) return p + strlen(named[i]);
    if (p[1] == '#') {
        const char *q = p + 2 + (p[2] == 'x');
        const char *d = q;
        while (*q && strchr(p[2] == 'x' ? "0123456789abcdefABCDEF" : "0123456789", *q)) q++;
        if (q > d && *q == ';') return q + 1;
    }
    return NULL;
}

static const char *xml_check(const char *s) {
    static char msg[256];
    char stack[64][64];
    int depth = 0, roots = 0;
    const char *p = s;
    if (!strncmp(p, "<?xml", 5)) {
        p = strstr(p, "?>");
        if (!p) return "unterminated <?xml";
        p += 2;
    }
    while (*p) {
        if (*p == '&') {
            if (!(p = entity(p))) return "a bare '&' in text";
            continue;
        }
        if (*p != '<') {
            if (depth == 0 && !strchr(" \t\r\n", *p)) return "text outside the root element";
            p++;
            continue;
        }
        if (!strncmp(p, "<!--", 4)) {
            if (!(p = strstr(p, "-->"))) return "unterminated comment";
            p += 3;
            continue;
        }
        int closing = p[1] == '/';
        p += 1 + closing;
        const char *name = p;
        while (*p && name_char(*p)) p++;
        size_t len = (size_t)(p - name);
        if (len == 0 || len >= 64) return "a tag without a name";
        if (closing) {
            if (depth == 0 || strlen(stack[depth - 1]) != len || strncmp(stack[depth - 1], name, len)) {
                snprintf(msg, sizeof msg, "</%.*s> does not close <%s>", (int)len, name, depth ? stack[depth - 1] : "");
                return msg;
            }
            depth--;
            while (*p == ' ') p++;
            if (*p++ != '>') return "junk in a closing tag";
            continue;
        }
        for (;;) { /* attributes */
            while (strchr(" \t\r\n", *p) && *p) p++;
            if (*p == '>' || !strncmp(p, "/>", 2)) break;
            const char *an = p;
            while (*p && name_char(*p)) p++;
            if (p == an || *p++ != '=') return "an attribute without a name or '='";
            char q = *p++;
            if (q != '"' && q != '\'') return "an unquoted attribute value";
            while (*p && *p != q) {
                if (*p == '<') return "'<' in an attribute value";
                if (*p == '&') {
                    if (!(p = entity(p))) return "a bare '&' in an attribute value";
                } else {
                    p++;
                }
            }
            if (!*p++) return "an unterminated attribute value";
        }
        if (*p == '/') {
            p += 2;
            if (depth == 0) roots++;
            continue;
        }
        p++;
        if (depth == 0) roots++;
        if (depth == 64) return "nested too deep";
        snprintf(stack[depth++], 64, "%.*s", (int)len, name);
    }
    if (depth) return "unclosed elements at the end";
    if (roots != 1) return "not exactly one root element";
    return NULL;
}

/* ---- reading the SVG back ---- */
static double attr(const char *tag, const char *name) {
    char key[64];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *end = strchr(tag, '>'), *a = strstr(tag, key);
    if (!a || (end && a > end)) fail_msg("no attribute %s in %.80s", name, tag);
    return strtod(a + strlen(key), NULL);
}

typedef struct {
    const char *name;
    const char *start, *end; /* the panel's text */
    double x0, x1, y0, y1, xlo, xhi, lo, hi;
    int log;
} panel;

static panel find_panel(const char *svg, const char *name) {
    char key[128];
    snprintf(key, sizeof key, "<g class=\"panel\" data-name=\"%s\"", name);
    panel p;
    p.name = name;
    p.start = strstr(svg, key);
    if (!p.start) fail_msg("no panel %s", name);
    p.end = p.start ? strstr(p.start + 1, "<g class=\"panel\"") : NULL;
    if (!p.end) p.end = p.start + strlen(p.start);
    p.x0 = attr(p.start, "data-x0"), p.x1 = attr(p.start, "data-x1");
    p.y0 = attr(p.start, "data-y0"), p.y1 = attr(p.start, "data-y1");
    p.xlo = attr(p.start, "data-xlo"), p.xhi = attr(p.start, "data-xhi");
    p.lo = attr(p.start, "data-lo"), p.hi = attr(p.start, "data-hi");
    p.log = (int)attr(p.start, "data-log");
    return p;
}

static double px(const panel *p, double step) { return p->x0 + (step - p->xlo) / (p->xhi - p->xlo) * (p->x1 - p->x0); }
static double py(const panel *p, double v) {
    double t = p->log ? (log10(v) - log10(p->lo)) / (log10(p->hi) - log10(p->lo)) : (v - p->lo) / (p->hi - p->lo);
    return p->y0 + t * (p->y1 - p->y0);
}

typedef struct {
    double x[MAXP], y[MAXP];
    int n, lines, dots, markers;
    double mx[MAXP], my[MAXP];
} points;

/* The points of series `name` in the panel: polyline vertices and lone dots in document order;
 * markers apart. */
static void series_points(const panel *p, const char *name, points *o) {
    char key[128];
    snprintf(key, sizeof key, "<g class=\"series\" data-name=\"%s\"", name);
    const char *s = strstr(p->start, key);
    if (!s || s > p->end) fail_msg("no series %s", name);
    const char *end = strstr(s, "</g>");
    memset(o, 0, sizeof *o);
    for (const char *t = strchr(s + 1, '<'); t && t < end; t = strchr(t + 1, '<')) {
        if (!strncmp(t, "<polyline", 9)) {
            o->lines++;
            const char *q = strstr(t, "points=\"") + 8;
            char *e;
            while (*q != '"') {
                double x = strtod(q, &e);
                assert_int_equal(*e, ',');
                double y = strtod(e + 1, &e);
                assert_true(o->n < MAXP);
                o->x[o->n] = x, o->y[o->n++] = y;
                q = e;
                while (*q == ' ') q++;
            }
        } else if (!strncmp(t, "<circle class=\"dot\"", 19)) {
            o->dots++;
            o->x[o->n] = attr(t, "cx"), o->y[o->n++] = attr(t, "cy");
        } else if (!strncmp(t, "<circle class=\"marker\"", 22)) {
            o->mx[o->markers] = attr(t, "cx"), o->my[o->markers++] = attr(t, "cy");
        }
    }
}

/* Each tick label of the class in the panel: its text, and its position along the axis. */
static int tick_labels(const panel *p, const char *cls, char labels[][32], double *pos, int max) {
    char key[64];
    snprintf(key, sizeof key, "<text class=\"%s\"", cls);
    int n = 0;
    for (const char *t = strstr(p->start, key); t && t < p->end && n < max; t = strstr(t + 1, key)) {
        pos[n] = attr(t, strcmp(cls, "tick-x") ? "y" : "x");
        const char *a = strchr(t, '>') + 1, *b = strchr(a, '<');
        snprintf(labels[n++], 32, "%.*s", (int)(b - a), a);
    }
    return n;
}

static int count(const char *from, const char *to, const char *needle) {
    int n = 0;
    for (const char *t = strstr(from, needle); t && t < to; t = strstr(t + 1, needle)) n++;
    return n;
}

#define NEAR(a, b) assert_true(fabs((a) - (b)) < 0.011)

/* The labels are exactly want (in order), each at the pixel of its value. */
static void check_ticks(const panel *p, const char *cls, const char *const *want, const double *values, int n) {
    char labels[32][32];
    double pos[32];
    int got = tick_labels(p, cls, labels, pos, 32);
    printf("%s %s:", p->name, cls);
    for (int i = 0; i < got; i++) printf(" %s", labels[i]);
    printf("\n");
    assert_int_equal(got, n);
    for (int i = 0; i < n; i++) {
        assert_string_equal(labels[i], want[i]);
        NEAR(pos[i], strcmp(cls, "tick-x") ? py(p, values[i]) : px(p, values[i]));
    }
}

static const char *plot_ok(char *out, const char *args, const char *svg_rel) {
    int rc = mt(out, "plot %s", args);
    expect(rc, 0, out, svg_rel);
    char *svg = read_file(svg_rel);
    const char *bad = xml_check(svg);
    if (bad) fail_msg("%s is not well-formed XML: %s", svg_rel, bad);
    return svg;
}

/* A CPU run (no GPU fields), step 5's loss non-finite, two eval lines. */
static const char *KNOWN =
    "{\"step\": 1, \"loss\": 4.0, \"lr\": 1e-4, \"grad_norm\": 1.5, \"tokens\": 32, \"tok_s\": 1000}\n"
    "{\"step\": 2, \"loss\": 3.6, \"lr\": 2e-4, \"grad_norm\": 1.2, \"tokens\": 32, \"tok_s\": 3000}\n"
    "{\"step\": 3, \"loss\": 3.1, \"lr\": 3e-4, \"grad_norm\": 1.1, \"tokens\": 32, \"tok_s\": 2000}\n"
    "{\"step\": 4, \"loss\": 2.9, \"lr\": 4e-4, \"grad_norm\": 1.0, \"tokens\": 32, \"tok_s\": 2000}\n"
    "{\"step\": 4, \"eval_loss\": 3.0, \"eval_tokens\": 64}\n"
    "{\"step\": 5, \"loss\": null, \"nonfinite\": true, \"lr\": 5e-4, \"grad_norm\": null, \"tok_s\": 2000}\n"
    "{\"step\": 6, \"loss\": 2.6, \"lr\": 5e-4, \"grad_norm\": 0.9, \"tokens\": 32, \"tok_s\": 2500}\n"
    "{\"step\": 7, \"loss\": 2.4, \"lr\": 4e-4, \"grad_norm\": 0.9, \"tokens\": 32, \"tok_s\": 2500}\n"
    "{\"step\": 8, \"loss\": 2.2, \"lr\": 3e-4, \"grad_norm\": 0.8, \"tokens\": 32, \"tok_s\": 2500}\n"
    "{\"step\": 8, \"eval_loss\": 2.5, \"eval_tokens\": 64}\n"
    "{\"step\": 9, \"loss\": 2.1, \"lr\": 2e-4, \"grad_norm\": 0.8, \"tokens\": 32, \"tok_s\": 2500}\n"
    "{\"step\": 10, \"loss\": 2.0, \"lr\": 1e-4, \"grad_norm\": 0.7, \"tokens\": 32, \"tok_s\": 1500}\n";

/* Every point of the series at its step and known value; n points in `lines` polylines. */
static void check_series(const panel *p, const char *name, const double *steps, const double *values, int n,
                         int lines) {
    static points pt;
    series_points(p, name, &pt);
    printf("%s: %d points in %d lines, %d dots\n", name, pt.n, pt.lines, pt.dots);
    assert_int_equal(pt.n, n);
    assert_int_equal(pt.lines, lines);
    for (int i = 0; i < n; i++) {
        if (i) assert_true(pt.x[i] > pt.x[i - 1]);
        NEAR(pt.x[i], px(p, steps[i]));
        NEAR(pt.y[i], py(p, values[i]));
    }
}

static void test_xml_check(void **st) {
    (void)st; /* the checker itself finds what it should */
    assert_null(xml_check("<?xml version=\"1.0\"?>\n<a x=\"1 &amp; 2\"><b/>t &lt; u</a>\n"));
    const char *bad[] = {"<a><b></a>", "<a>", "<a></a><b></b>", "<a x=1></a>", "<a>x & y</a>",
                         "<a x=\"<\"></a>", "text<a/>", "<a></b>"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (!xml_check(bad[i])) fail_msg("xml_check passed %s", bad[i]);
}

static void test_plot_known_values(void **st) {
    (void)st;
    char *out = malloc(OUT_SIZE);
    mt_test_sh("mkdir -p '%s/run'", g_env.tmp);
    write_file("run/metrics.jsonl", KNOWN);
    char *svg = (char *)plot_ok(out, "run", "run/metrics.svg");
    expect(0, 0, out, "10 steps, 2 evals, 1 non-finite");
    assert_non_null(strstr(svg, "megatrain run: "));
    assert_non_null(strstr(svg, "/run</text>")); /* the title names the run directory */

    /* loss: 9 of the 10 train points (step 5 is null) in two runs; min 2.0 at the bottom, max
     * 4.0 at the top, step 1 and step 10 at the box's ends */
    panel loss = find_panel(svg, "loss");
    assert_true(loss.lo == 2.0 && loss.hi == 4.0 && loss.xlo == 1 && loss.xhi == 10 && !loss.log);
    assert_true(loss.y0 > loss.y1 && loss.x1 > loss.x0);
    static const double ls[] = {1, 2, 3, 4, 6, 7, 8, 9, 10}, lv[] = {4.0, 3.6, 3.1, 2.9, 2.6, 2.4, 2.2, 2.1, 2.0};
    check_series(&loss, "train loss", ls, lv, 9, 2);
    NEAR(py(&loss, 4.0), loss.y1);
    NEAR(py(&loss, 2.0), loss.y0);
    NEAR(px(&loss, 1), loss.x0);
    NEAR(px(&loss, 10), loss.x1);
    static points ev;
    series_points(&loss, "eval loss", &ev);
    assert_int_equal(ev.markers, 2);
    NEAR(ev.mx[0], px(&loss, 4)), NEAR(ev.my[0], py(&loss, 3.0));
    NEAR(ev.mx[1], px(&loss, 8)), NEAR(ev.my[1], py(&loss, 2.5));
    /* step 5: one red tick at its x */
    assert_int_equal(count(loss.start, loss.end, "<line class=\"bad\""), 1);
    NEAR(attr(strstr(loss.start, "<line class=\"bad\""), "x1"), px(&loss, 5));
    assert_non_null(strstr(loss.start, "non-finite loss (1)"));
    static const char *const lt[] = {"2", "2.5", "3", "3.5", "4"};
    static const double ltv[] = {2, 2.5, 3, 3.5, 4};
    check_ticks(&loss, "tick-y", lt, ltv, 5);

    /* learning rate: all 10 (step 5's lr is a number), one line */
    panel lr = find_panel(svg, "lr");
    static const double s10[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    static const double lrv[] = {1e-4, 2e-4, 3e-4, 4e-4, 5e-4, 5e-4, 4e-4, 3e-4, 2e-4, 1e-4};
    assert_true(fabs(lr.lo - 1e-4) < 1e-12 && fabs(lr.hi - 5e-4) < 1e-12);
    check_series(&lr, "learning rate", s10, lrv, 10, 1);
    static const char *const lrt[] = {"1e-4", "2e-4", "3e-4", "4e-4", "5e-4"};
    check_ticks(&lr, "tick-y", lrt, lrv, 5);

    /* tokens/s, and the step labels under the last panel */
    panel tok = find_panel(svg, "tok_s");
    static const double tv[] = {1000, 3000, 2000, 2000, 2000, 2500, 2500, 2500, 2500, 1500};
    check_series(&tok, "tokens/s", s10, tv, 10, 1);
    static const char *const tt[] = {"1000", "1500", "2000", "2500", "3000"};
    static const double ttv[] = {1000, 1500, 2000, 2500, 3000};
    check_ticks(&tok, "tick-y", tt, ttv, 5);
    static const char *const xt[] = {"1", "2", "3", "4", "5", "6", "7", "8", "9", "10"};
    check_ticks(&tok, "tick-x", xt, s10, 10);
    assert_int_equal(count(svg, svg + strlen(svg), "class=\"tick-x\""), 10); /* on the last panel only */
    free(svg);
    free(out);
}

static void test_plot_log_loss(void **st) {
    (void)st;
    char *out = malloc(OUT_SIZE);
    mt_test_sh("mkdir -p '%s/logrun'", g_env.tmp);
    write_file("logrun/metrics.jsonl", "{\"step\": 1, \"loss\": 20, \"lr\": 0.001, \"tok_s\": 5}\n"
                                       "{\"step\": 2, \"loss\": 4, \"lr\": 0.001, \"tok_s\": 5}\n"
                                       "{\"step\": 3, \"loss\": 1.5, \"lr\": 0.001, \"tok_s\": 5}\n"
                                       "{\"step\": 4, \"loss\": 0.5, \"lr\": 0.001, \"tok_s\": 5}\n");
    char *svg = (char *)plot_ok(out, "--log-loss logrun", "logrun/metrics.svg");
    panel loss = find_panel(svg, "loss");
    assert_int_equal(loss.log, 1);
    assert_true(loss.lo == 0.5 && loss.hi == 20);
    static const double s[] = {1, 2, 3, 4}, v[] = {20, 4, 1.5, 0.5};
    check_series(&loss, "train loss", s, v, 4, 1);
    /* 4 lies at log10(4/0.5)/log10(20/0.5) of the way up, not (4-0.5)/(20-0.5) */
    static points pt;
    series_points(&loss, "train loss", &pt);
    NEAR(pt.y[1], loss.y0 + log10(8) / log10(40) * (loss.y1 - loss.y0));
    static const char *const lt[] = {"0.5", "1", "2", "5", "10", "20"};
    static const double ltv[] = {0.5, 1, 2, 5, 10, 20};
    check_ticks(&loss, "tick-y", lt, ltv, 6);
    /* a constant series is widened around its value */
    panel lr = find_panel(svg, "lr");
    assert_true(lr.lo < 0.001 && lr.hi > 0.001);
    free(svg);

    /* values <= 0 cannot be drawn on a log axis: said, and left out */
    write_file("logrun/metrics.jsonl", "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": 0}\n{\"step\": 3, \"loss\": 1}\n");
    svg = (char *)plot_ok(out, "--log-loss logrun", "logrun/metrics.svg");
    expect(0, 0, out, "--log-loss: 1 loss values <= 0 are not drawn");
    loss = find_panel(svg, "loss");
    series_points(&loss, "train loss", &pt);
    assert_int_equal(pt.n, 2);
    assert_int_equal(pt.dots, 2);
    free(svg);
    free(out);
}

static void test_plot_resumed(void **st) {
    (void)st;
    char *out = malloc(OUT_SIZE);
    mt_test_sh("mkdir -p '%s/res'", g_env.tmp);
    /* the first run logged steps 1-6 and an eval at 5; resumed from step 3's checkpoint over the
     * same file, the second logged 4-8 (other losses) and an eval at 6 */
    write_file("res/metrics.jsonl", "{\"step\": 1, \"loss\": 9}\n{\"step\": 2, \"loss\": 8}\n{\"step\": 3, \"loss\": 7}\n"
                                    "{\"step\": 4, \"loss\": 6}\n{\"step\": 5, \"loss\": 5}\n"
                                    "{\"step\": 5, \"eval_loss\": 5.5}\n{\"step\": 6, \"loss\": 4}\n"
                                    "{\"step\": 4, \"loss\": 6.5}\n{\"step\": 5, \"loss\": 5.5}\n{\"step\": 6, \"loss\": 4.5}\n"
                                    "{\"step\": 6, \"eval_loss\": 4.8}\n{\"step\": 7, \"loss\": 3.5}\n{\"step\": 8, \"loss\": 3}\n");
    char *svg = (char *)plot_ok(out, "res", "res/metrics.svg");
    expect(0, 0, out, "8 steps, 1 evals, 0 non-finite (older lines of a resumed run left out)");
    assert_non_null(strstr(svg, "resumed at step 4"));
    panel loss = find_panel(svg, "loss");
    static const double s[] = {1, 2, 3, 4, 5, 6, 7, 8}, v[] = {9, 8, 7, 6.5, 5.5, 4.5, 3.5, 3};
    check_series(&loss, "train loss", s, v, 8, 1);
    static points ev;
    series_points(&loss, "eval loss", &ev);
    assert_int_equal(ev.markers, 1);
    NEAR(ev.mx[0], px(&loss, 6)), NEAR(ev.my[0], py(&loss, 4.8));
    free(svg);

    /* resumed from step 2 and stopped at 3: the old 3-6 are not this run's history */
    write_file("res/metrics.jsonl", "{\"step\": 1, \"loss\": 9}\n{\"step\": 2, \"loss\": 8}\n{\"step\": 3, \"loss\": 7}\n"
                                    "{\"step\": 4, \"loss\": 6}\n{\"step\": 5, \"loss\": 5}\n{\"step\": 6, \"loss\": 4}\n"
                                    "{\"step\": 3, \"loss\": 7.5}\n");
    svg = (char *)plot_ok(out, "res", "res/metrics.svg");
    loss = find_panel(svg, "loss");
    assert_true(loss.xhi == 3 && loss.hi == 9 && loss.lo == 7.5);
    static const double s3[] = {1, 2, 3}, v3[] = {9, 8, 7.5};
    check_series(&loss, "train loss", s3, v3, 3, 1);
    free(svg);
    free(out);
}

static void test_plot_one_line_and_paths(void **st) {
    (void)st;
    char *out = malloc(OUT_SIZE);
    /* one line: a dot per series, axes widened around it; a directory name with XML characters */
    mt_test_sh("mkdir -p '%s/a&b<c>'", g_env.tmp);
    write_file("a&b<c>/metrics.jsonl", "{\"step\": 1, \"loss\": 5.25, \"lr\": 0.0, \"tok_s\": 100}");
    char *svg = (char *)plot_ok(out, "'a&b<c>'", "a&b<c>/metrics.svg");
    assert_non_null(strstr(svg, "a&amp;b&lt;c&gt;</text>"));
    const char *names[] = {"loss", "lr", "tok_s"}, *series[] = {"train loss", "learning rate", "tokens/s"};
    static points pt;
    for (int i = 0; i < 3; i++) {
        panel p = find_panel(svg, names[i]);
        assert_true(p.lo < p.hi && p.xlo < 1 && p.xhi > 1);
        series_points(&p, series[i], &pt);
        assert_int_equal(pt.n, 1);
        assert_int_equal(pt.dots, 1);
        NEAR(pt.x[0], px(&p, 1));
    }
    free(svg);

    /* --out, and a .jsonl file given instead of the directory */
    write_file("copy.jsonl", KNOWN);
    free((char *)plot_ok(out, "copy.jsonl", "copy.svg"));
    free((char *)plot_ok(out, "--out elsewhere.svg copy.jsonl", "elsewhere.svg"));
    free(out);
}

static void test_plot_long_run(void **st) {
    (void)st;
    char *out = malloc(OUT_SIZE);
    mt_test_sh("mkdir -p '%s/long'", g_env.tmp);
    /* 20000 steps with one spike: drawn with at most 2 points a pixel column, the spike kept */
    char p[4096];
    snprintf(p, sizeof p, "%s/long/metrics.jsonl", g_env.tmp);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    for (int s = 1; s <= 20000; s++)
        fprintf(f, "{\"step\": %d, \"loss\": %.4f, \"lr\": 0.001, \"tok_s\": 1000}\n", s, s == 7777 ? 50.0 : 3.0 + (s % 7) * 0.01);
    assert_int_equal(fclose(f), 0);
    char *svg = (char *)plot_ok(out, "long", "long/metrics.svg");
    panel loss = find_panel(svg, "loss");
    assert_true(loss.hi == 50 && loss.lo == 3);
    static points pt;
    series_points(&loss, "train loss", &pt);
    printf("20000 steps drawn with %d points\n", pt.n);
    assert_true(pt.n > 500 && pt.n <= 2 * 960);
    int top = 0;
    for (int i = 0; i < pt.n; i++) {
        if (i) assert_true(pt.x[i] >= pt.x[i - 1]);
        if (fabs(pt.y[i] - loss.y1) < 0.011) top++, NEAR(pt.x[i], px(&loss, 7777));
    }
    assert_int_equal(top, 1);
    free(svg);
    free(out);
}

static void test_plot_errors(void **st) {
    (void)st;
    char *out = malloc(OUT_SIZE), first[512];
    /* no such directory */
    int rc = mt(out, "plot nowhere");
    expect(rc, 1, out, "megatrain: nowhere: No such file or directory");
    assert_int_equal(mt_cli_error_lines(out, first, sizeof first), 1);
    /* a directory without metrics.jsonl */
    mt_test_sh("mkdir -p '%s/nometrics' '%s/emptyrun' '%s/junkrun' '%s/partrun'", g_env.tmp, g_env.tmp, g_env.tmp, g_env.tmp);
    rc = mt(out, "plot nometrics");
    expect(rc, 1, out, "nometrics/metrics.jsonl: cannot open");
    assert_int_equal(mt_cli_error_lines(out, first, sizeof first), 1);
    /* empty (blank lines only) */
    write_file("emptyrun/metrics.jsonl", "\n  \n");
    rc = mt(out, "plot emptyrun");
    expect(rc, 1, out, "emptyrun/metrics.jsonl: empty, no metrics to plot");
    assert_false(exists("emptyrun/metrics.svg") || exists("emptyrun/metrics.svg.tmp"));
    /* nothing usable */
    write_file("junkrun/metrics.jsonl", "not json\n[1, 2]\n{\"loss\": 3}\n{\"step\": 1, \"note\": \"x\"}\n"
                                        "{\"step\": 1e300, \"loss\": 3}\n");
    rc = mt(out, "plot junkrun");
    expect(rc, 1, out, "junkrun/metrics.jsonl: no metrics lines (a \"step\" with \"loss\" or \"eval_loss\") in 5 lines");
    assert_int_equal(mt_cli_error_lines(out, first, sizeof first), 1);
    expect(rc, 1, out, "warning: junkrun/metrics.jsonl: 2 lines are not JSON objects, skipped (the first: line 1)");
    expect(rc, 1, out, "2 lines have no numeric \"step\"");
    assert_false(exists("junkrun/metrics.svg"));
    /* invalid lines among good ones (a line cut by a crash): counted, the rest drawn */
    char text[4096];
    snprintf(text, sizeof text, "%s{\"step\": 11, \"loss\": 1.9, \"lr\"\n{oops}\n", KNOWN);
    write_file("partrun/metrics.jsonl", text);
    rc = mt(out, "plot partrun");
    expect(rc, 0, out, "warning: partrun/metrics.jsonl: 2 lines are not JSON objects, skipped (the first: line 13)");
    char *svg = read_file("partrun/metrics.svg");
    assert_null(xml_check(svg));
    panel loss = find_panel(svg, "loss");
    assert_true(loss.xhi == 10);
    free(svg);
    /* --out where nothing can be written: named, nothing left */
    rc = mt(out, "plot --out no/such/dir/p.svg partrun");
    expect(rc, 1, out, "megatrain: --out no/such/dir/p.svg: cannot write: No such file or directory");
    /* --out onto the metrics file itself: refused, the data kept */
    rc = mt(out, "plot --out partrun/./metrics.jsonl partrun");
    expect(rc, 1, out, "that is the metrics file being plotted");
    char *kept = read_file("partrun/metrics.jsonl");
    assert_string_equal(kept, text);
    free(kept);
    /* usage errors */
    rc = mt(out, "plot");
    expect(rc, 1, out, "plot takes one run directory");
    rc = mt(out, "plot a b");
    expect(rc, 1, out, "plot takes one run directory");
    rc = mt(out, "plot --bogus partrun");
    expect(rc, 1, out, "usage: megatrain plot");
    rc = mt(out, "plot --help");
    expect(rc, 0, out, "--log-loss");
    free(out);
}

static int setup(void **st) {
    *st = &g_env; /* for mt_cli_env_teardown */
    return mt_cli_env_init(&g_env, "");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xml_check),         cmocka_unit_test(test_plot_known_values),
        cmocka_unit_test(test_plot_log_loss),
        cmocka_unit_test(test_plot_resumed),      cmocka_unit_test(test_plot_one_line_and_paths),
        cmocka_unit_test(test_plot_long_run),     cmocka_unit_test(test_plot_errors),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
