#include "svg_plot.h"

#include <math.h>
#include <string.h>

/* Layout, in pixels. The data box sits inside each panel's frame by PAD_X / PAD_Y so that the
 * extreme points and their markers do not lie on the frame line. */
enum {
    WIDTH = 960,
    LEFT = 80, /* room for the y tick labels */
    RIGHT = 24,
    TOP = 64, /* title and subtitle */
    HEADING = 22,
    PANEL_H = 190,
    GAP = 30,
    BOTTOM = 52, /* x tick labels and the x label */
    PAD_X = 6,
    PAD_Y = 10,
    MAX_TICKS = 32,
};
/* A series longer than this is drawn with the lowest and highest point of each pixel column,
 * which keeps its spikes and keeps a million-step run's SVG small. */
#define MAX_POINTS 4000

typedef struct {
    double lo, hi; /* values ... */
    double p0, p1; /* ... at these pixels */
    int log;
} axis;

typedef struct {
    double v, step; /* a tick and the spacing its label is written to */
} tick;

static double axis_map(const axis *a, double v) {
    double t = a->log ? (log10(v) - log10(a->lo)) / (log10(a->hi) - log10(a->lo))
                      : (v - a->lo) / (a->hi - a->lo);
    return a->p0 + t * (a->p1 - a->p0);
}

/* The 1, 2 or 5 x 10^k nearest to range / target: about 4 to 7 ticks for a target of 5. */
static double nice_step(double range, int target) {
    double raw = range / target, mag = pow(10, floor(log10(raw)));
    double f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

/* The multiples of a nice step inside [lo, hi]. */
static int linear_ticks(double lo, double hi, int target, double min_step, tick *t) {
    double step = nice_step(hi - lo, target);
    if (step < min_step) step = min_step;
    int n = 0;
    for (double k = ceil(lo / step - 1e-9); k <= floor(hi / step + 1e-9) && n < MAX_TICKS; k++)
        t[n++] = (tick){k * step, step};
    return n;
}

/* Log axis: 1, 2, 5 x 10^k inside [lo, hi], or only the powers of ten when those are too many
 * (every few when still too many); under one decade the linear nice ticks, placed on the log
 * scale. */
static int log_ticks(double lo, double hi, tick *t) {
    if (hi / lo < 10) return linear_ticks(lo, hi, 5, 0, t);
    static const double all[] = {1, 2, 5}, ones[] = {1};
    int n = 0;
    for (int pass = 0; pass < 2; pass++) {
        const double *m = pass ? ones : all;
        int nm = pass ? 1 : 3;
        n = 0;
        for (int k = (int)floor(log10(lo)); k <= (int)ceil(log10(hi)) && n < MAX_TICKS; k++)
            for (int j = 0; j < nm && n < MAX_TICKS; j++) {
                double p = pow(10, k), v = m[j] * p;
                if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) t[n++] = (tick){v, p};
            }
        if (n <= 8) return n;
    }
    int every = (n + 7) / 8, kept = 0;
    for (int i = 0; i < n; i += every) t[kept++] = t[i];
    return kept;
}

static void strip_zeros(char *s) {
    if (!strchr(s, '.')) return;
    size_t n = strlen(s);
    while (n > 0 && s[n - 1] == '0') s[--n] = '\0';
    if (n > 0 && s[n - 1] == '.') s[--n] = '\0';
}

static int decimals(double step) {
    int d = -(int)floor(log10(step) + 1e-9);
    return d > 0 ? d : 0;
}

/* A tick label: as many decimals as the spacing needs; k/M/G for large axes (ref is the axis'
 * largest magnitude), m·e-k with the exponent of ref for small ones (learning rates), so that
 * the labels of one axis compare at a glance. */
static void format_tick(char *buf, size_t n, double v, double step, double ref) {
    v = round(v / step) * step;
    if (fabs(v) < step * 1e-6) {
        snprintf(buf, n, "0");
        return;
    }
    if (ref >= 1e4) {
        double unit = ref >= 1e10 ? 1e9 : ref >= 1e7 ? 1e6 : 1e3;
        const char *suffix = ref >= 1e10 ? "G" : ref >= 1e7 ? "M" : "k";
        snprintf(buf, n, "%.*f", decimals(step / unit), v / unit);
        strip_zeros(buf);
        strncat(buf, suffix, n - strlen(buf) - 1);
    } else if (ref < 1e-2) {
        int e = (int)floor(log10(ref) + 1e-9), d = e - (int)floor(log10(step) + 1e-9);
        if (d < 0) d = 0;
        double m = v / pow(10, e);
        if (fabs(round(m * pow(10, d)) / pow(10, d)) >= 10) { /* 9.99.. rounded up */
            m /= 10;
            e++;
        }
        char mant[32];
        snprintf(mant, sizeof mant, "%.*f", d, m);
        strip_zeros(mant);
        snprintf(buf, n, "%se%d", mant, e);
    } else {
        snprintf(buf, n, "%.*f", decimals(step), v);
        strip_zeros(buf);
    }
}

/* Text content or an attribute value: XML-escaped, control characters and bytes that are not
 * UTF-8 as '?', so that any path makes a well-formed document. */
static void put_text(FILE *f, const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned c = *p;
        int len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 && c >= 0xc2 ? 2 : (c & 0xf0) == 0xe0 ? 3
                             : (c & 0xf8) == 0xf0 && c <= 0xf4 ? 4 : 0;
        for (int i = 1; i < len; i++)
            if ((p[i] & 0xc0) != 0x80) len = 0;
        if (len == 0 || (len == 1 && c < 0x20 && c != '\t')) {
            fputc('?', f);
            p++;
        } else if (len > 1) {
            fwrite(p, 1, (size_t)len, f);
            p += len;
        } else {
            switch (c) {
            case '&': fputs("&amp;", f); break;
            case '<': fputs("&lt;", f); break;
            case '>': fputs("&gt;", f); break;
            case '"': fputs("&quot;", f); break;
            default: fputc((int)c, f);
            }
            p++;
        }
    }
}

/* 1e300: beyond it a range overflows; no metric gets there. */
static int drawable(double y, const axis *ay) { return isfinite(y) && fabs(y) < 1e300 && (!ay->log || y > 0); }

static void put_point(FILE *f, const axis *ax, const axis *ay, double x, double y) {
    fprintf(f, "%.2f,%.2f ", axis_map(ax, x), axis_map(ay, y));
}

/* One run of drawable points [i, j) as a polyline (a dot when it is one point). */
static void write_run(FILE *f, const mt_plot_series *s, size_t i, size_t j, const axis *ax, const axis *ay) {
    if (j - i == 1) {
        fprintf(f, "<circle class=\"dot\" cx=\"%.2f\" cy=\"%.2f\" r=\"2.5\" fill=\"%s\" stroke=\"none\"/>\n",
                axis_map(ax, s->x[i]), axis_map(ay, s->y[i]), s->color);
        return;
    }
    fputs("<polyline points=\"", f);
    if (s->n <= MAX_POINTS) {
        for (size_t k = i; k < j; k++) put_point(f, ax, ay, s->x[k], s->y[k]);
    } else {
        for (size_t k = i; k < j;) { /* per pixel column: its lowest and highest point, in order */
            double col = floor(axis_map(ax, s->x[k]));
            size_t lo = k, hi = k;
            for (; k < j && floor(axis_map(ax, s->x[k])) == col; k++) {
                if (s->y[k] < s->y[lo]) lo = k;
                if (s->y[k] > s->y[hi]) hi = k;
            }
            size_t a = lo < hi ? lo : hi, b = lo < hi ? hi : lo;
            put_point(f, ax, ay, s->x[a], s->y[a]);
            if (b != a) put_point(f, ax, ay, s->x[b], s->y[b]);
        }
    }
    fputs("\"/>\n", f);
}

static void write_series(FILE *f, const mt_plot_series *s, const axis *ax, const axis *ay) {
    fputs("<g class=\"series\" data-name=\"", f);
    put_text(f, s->name);
    fprintf(f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" stroke-linejoin=\"round\">\n", s->color);
    for (size_t i = 0; i < s->n;) {
        if (!drawable(s->y[i], ay)) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < s->n && drawable(s->y[j], ay)) j++;
        write_run(f, s, i, j, ax, ay);
        i = j;
    }
    if (s->markers)
        for (size_t i = 0; i < s->n; i++)
            if (drawable(s->y[i], ay))
                fprintf(f, "<circle class=\"marker\" cx=\"%.2f\" cy=\"%.2f\" r=\"3.2\" fill=\"%s\" stroke=\"white\"/>\n",
                        axis_map(ax, s->x[i]), axis_map(ay, s->y[i]), s->color);
    fputs("</g>\n", f);
}

static size_t count_drawable(const mt_plot_series *s, const axis *ay) {
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++) n += drawable(s->y[i], ay);
    return n;
}

static void write_legend(FILE *f, const mt_plot_panel *pp, const axis *ay, double right, double top) {
    const char *text[MT_PLOT_MAX_SERIES + 1], *color[MT_PLOT_MAX_SERIES + 1];
    int n = 0;
    size_t chars = 0;
    for (int i = 0; i < pp->n_series; i++)
        if (count_drawable(&pp->series[i], ay)) {
            text[n] = pp->series[i].name;
            color[n++] = pp->series[i].color;
        }
    if (pp->n_bad) {
        text[n] = pp->bad_label ? pp->bad_label : "no value";
        color[n++] = "#d62728";
    }
    if (n == 0) return;
    for (int i = 0; i < n; i++)
        if (strlen(text[i]) > chars) chars = strlen(text[i]);
    double w = 44 + 6.8 * (double)chars, h = 10 + 18.0 * n, x = right - w - 8, y = top + 8;
    fprintf(f, "<g class=\"legend\" font-size=\"12\">\n<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" "
               "fill=\"white\" fill-opacity=\"0.9\" stroke=\"#ccc\"/>\n", x, y, w, h);
    for (int i = 0; i < n; i++) {
        double ly = y + 14 + 18.0 * i;
        int bad = pp->n_bad && i == n - 1;
        if (bad) /* drawn like the marks: a short upright tick */
            fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" stroke-width=\"2\"/>\n",
                    x + 20, ly + 5, x + 20, ly - 6, color[i]);
        else
            fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" stroke-width=\"2\"/>\n",
                    x + 10, ly, x + 30, ly, color[i]);
        fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" dy=\"0.35em\" fill=\"#222\">", x + 36, ly);
        put_text(f, text[i]);
        fputs("</text>\n", f);
    }
    fputs("</g>\n", f);
}

/* The y axis of a panel: from the smallest to the largest drawable value (widened around a
 * constant; 0..1 when there is nothing to draw). */
static int panel_range(const mt_plot_panel *pp, axis *ay) {
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < pp->n_series; i++)
        for (size_t k = 0; k < pp->series[i].n; k++) {
            double y = pp->series[i].y[k];
            if (!drawable(y, ay)) continue;
            if (y < lo) lo = y;
            if (y > hi) hi = y;
        }
    if (lo > hi) {
        ay->lo = ay->log ? 1 : 0;
        ay->hi = ay->log ? 10 : 1;
        return 0;
    }
    if (hi - lo <= 1e-12 * fmax(fabs(lo), fabs(hi))) {
        if (ay->log) {
            lo /= 1.25;
            hi *= 1.25;
        } else {
            double d = lo != 0 ? fabs(lo) * 0.05 : 1;
            lo -= d;
            hi += d;
        }
    }
    ay->lo = lo;
    ay->hi = hi;
    return 1;
}

static void write_panel(FILE *f, const mt_plot_panel *pp, double top, const axis *ax,
                        const tick *xt, int nxt, int last) {
    double ftop = top + HEADING, fbottom = ftop + PANEL_H, fleft = LEFT, fright = WIDTH - RIGHT;
    axis ay = {.p0 = fbottom - PAD_Y, .p1 = ftop + PAD_Y, .log = pp->log_y};
    int any = panel_range(pp, &ay);
    fputs("<g class=\"panel\" data-name=\"", f);
    put_text(f, pp->name);
    fprintf(f, "\" data-x0=\"%.2f\" data-x1=\"%.2f\" data-y0=\"%.2f\" data-y1=\"%.2f\" data-xlo=\"%.10g\" "
               "data-xhi=\"%.10g\" data-lo=\"%.10g\" data-hi=\"%.10g\" data-log=\"%d\">\n",
            ax->p0, ax->p1, ay.p0, ay.p1, ax->lo, ax->hi, ay.lo, ay.hi, ay.log);
    fprintf(f, "<text class=\"heading\" x=\"%.2f\" y=\"%.2f\" font-size=\"13\" font-weight=\"bold\" fill=\"#333\">",
            fleft, top + 14);
    put_text(f, pp->heading);
    fputs(pp->log_y ? " (log scale)</text>\n" : "</text>\n", f);
    fprintf(f, "<rect class=\"frame\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"white\" "
               "stroke=\"#bbb\"/>\n", fleft, ftop, fright - fleft, (double)PANEL_H);

    /* grid and tick labels */
    fputs("<g class=\"grid\" stroke=\"#e8e8e8\">\n", f);
    for (int i = 0; i < nxt; i++) {
        double x = axis_map(ax, xt[i].v);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", x, ftop, x, fbottom);
    }
    tick yt[MAX_TICKS];
    int nyt = !any ? 0 : ay.log ? log_ticks(ay.lo, ay.hi, yt) : linear_ticks(ay.lo, ay.hi, 5, 0, yt);
    for (int i = 0; i < nyt; i++) {
        double y = axis_map(&ay, yt[i].v);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", fleft, y, fright, y);
    }
    fputs("</g>\n<g font-size=\"11\" fill=\"#444\">\n", f);
    double ref = fmax(fabs(ay.lo), fabs(ay.hi));
    for (int i = 0; i < nyt; i++) {
        char label[64];
        format_tick(label, sizeof label, yt[i].v, yt[i].step, ay.log ? yt[i].v : ref);
        fprintf(f, "<text class=\"tick-y\" x=\"%.2f\" y=\"%.2f\" dy=\"0.35em\" text-anchor=\"end\">%s</text>\n",
                fleft - 6, axis_map(&ay, yt[i].v), label);
    }
    if (last) {
        double xref = fmax(fabs(ax->lo), fabs(ax->hi));
        for (int i = 0; i < nxt; i++) {
            char label[64];
            format_tick(label, sizeof label, xt[i].v, xt[i].step, xref);
            fprintf(f, "<text class=\"tick-x\" x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">%s</text>\n",
                    axis_map(ax, xt[i].v), fbottom + 16, label);
        }
    }
    fputs("</g>\n", f);

    for (int i = 0; i < pp->n_series; i++) write_series(f, &pp->series[i], ax, &ay);
    for (size_t i = 0; i < pp->n_bad; i++) {
        double x = axis_map(ax, pp->bad_x[i]);
        fprintf(f, "<line class=\"bad\" x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#d62728\" "
                   "stroke-width=\"2\"/>\n", x, fbottom, x, fbottom - 12);
    }
    if (!any)
        fprintf(f, "<text class=\"empty\" x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\" font-size=\"13\" "
                   "fill=\"#999\">no values</text>\n", (fleft + fright) / 2, (ftop + fbottom) / 2);
    if (pp->legend) write_legend(f, pp, &ay, fright, ftop);
    fputs("</g>\n", f);
}

/* The x axis: every drawable point and every bad mark of every panel. */
static void x_range(const mt_plot *p, axis *ax) {
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < p->n_panels; i++) {
        const mt_plot_panel *pp = &p->panels[i];
        axis ay = {.log = pp->log_y};
        for (int s = 0; s < pp->n_series; s++)
            for (size_t k = 0; k < pp->series[s].n; k++)
                if (drawable(pp->series[s].y[k], &ay)) {
                    lo = fmin(lo, pp->series[s].x[k]);
                    hi = fmax(hi, pp->series[s].x[k]);
                }
        for (size_t k = 0; k < pp->n_bad; k++) {
            lo = fmin(lo, pp->bad_x[k]);
            hi = fmax(hi, pp->bad_x[k]);
        }
    }
    if (lo > hi) {
        lo = 0;
        hi = 1;
    } else if (lo == hi) {
        lo -= 1;
        hi += 1;
    }
    ax->lo = lo;
    ax->hi = hi;
}

void mt_svg_plot_write(FILE *f, const mt_plot *p) {
    int height = TOP + p->n_panels * (HEADING + PANEL_H) + (p->n_panels - 1) * GAP + BOTTOM;
    axis ax = {.p0 = LEFT + PAD_X, .p1 = WIDTH - RIGHT - PAD_X};
    x_range(p, &ax);
    tick xt[MAX_TICKS];
    int nxt = linear_ticks(ax.lo, ax.hi, 8, p->x_integer ? 1 : 0, xt);

    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            WIDTH, height, WIDTH, height);
    fprintf(f, "<text class=\"title\" x=\"%d\" y=\"26\" font-size=\"17\" font-weight=\"bold\" fill=\"#111\">", LEFT);
    put_text(f, p->title);
    fputs("</text>\n", f);
    if (p->subtitle) {
        fprintf(f, "<text class=\"subtitle\" x=\"%d\" y=\"46\" font-size=\"12\" fill=\"#555\">", LEFT);
        put_text(f, p->subtitle);
        fputs("</text>\n", f);
    }
    for (int i = 0; i < p->n_panels; i++)
        write_panel(f, &p->panels[i], TOP + i * (HEADING + PANEL_H + GAP), &ax, xt, nxt, i == p->n_panels - 1);
    fprintf(f, "<text class=\"x-label\" x=\"%.2f\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\" fill=\"#333\">",
            (LEFT + WIDTH - RIGHT) / 2.0, height - 12);
    put_text(f, p->x_label);
    fputs("</text>\n</svg>\n", f);
}
