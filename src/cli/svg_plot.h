/* Line charts as SVG text: panels stacked under one title that share the x axis, axes with tick
 * labels at "nice" numbers (1, 2, 5 x 10^k), an optional log-scale y, a legend, and red ticks at
 * the bottom of a panel for points whose value could not be drawn (non-finite).
 *
 * The drawing carries what a test (or a script) needs to read it back: each panel is
 * <g class="panel" data-name=NAME data-x0 data-x1 data-y0 data-y1 data-xlo data-xhi data-lo
 * data-hi data-log>, where pixel x0..x1 shows data x xlo..xhi and pixel y0 (bottom) .. y1 (top)
 * shows y lo..hi, lo and hi being the smallest and largest value drawn; each series is
 * <g class="series" data-name=NAME> with <polyline> runs and, for a point alone between gaps, a
 * <circle class="dot">; tick labels are <text class="tick-x"|"tick-y"> at the tick's pixel. */
#ifndef MT_SVG_PLOT_H
#define MT_SVG_PLOT_H

#include <stddef.h>
#include <stdio.h>

#define MT_PLOT_MAX_SERIES 4

typedef struct {
    const char *name;  /* data-name and legend text */
    const char *color; /* an SVG color, e.g. "#1f77b4" */
    const double *x;   /* n points in increasing x */
    const double *y;   /* NaN: no value here (the line breaks) */
    size_t n;
    int markers;       /* a circle at every point (sparse series such as eval loss) */
} mt_plot_series;

typedef struct {
    const char *name;    /* data-name: "loss", "lr", ... */
    const char *heading; /* shown above the panel */
    int log_y;           /* values <= 0 are then not drawn (the caller says how many) */
    int legend;          /* a legend box at the top right */
    mt_plot_series series[MT_PLOT_MAX_SERIES];
    int n_series;
    const double *bad_x; /* x of the points that had no finite value: red ticks at the bottom */
    size_t n_bad;
    const char *bad_label; /* their legend text */
} mt_plot_panel;

typedef struct {
    const char *title;    /* escaped here: any text is fine */
    const char *subtitle; /* NULL: none */
    const char *x_label;
    int x_integer; /* x is a count (steps): no ticks between integers */
    const mt_plot_panel *panels;
    int n_panels;
} mt_plot;

/* Writes the SVG document to f. The caller checks ferror/fclose. */
void mt_svg_plot_write(FILE *f, const mt_plot *p);

#endif
