/* Input files read line by line (the text, JSONL and chat readers): opening with an error naming
 * the file, line numbers, read errors caught, and the total size for progress lines. */
#ifndef MT_LINES_H
#define MT_LINES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    FILE *f;
    char *buf;
    size_t cap;
    const char *path;
    int64_t lineno; /* of the line last returned, 1-based */
} mt_lines;

/* MT_ERR "PATH: cannot open: ..." */
int mt_lines_open(mt_lines *l, const char *path);
/* The next line, its "\n" included (the last line may lack it), in *line / *len (valid until the next
 * call). 1: a line; 0: the end; MT_ERR: a read error, naming the file. */
int mt_lines_next(mt_lines *l, const char **line, size_t *len);
void mt_lines_close(mt_lines *l);

/* The progress line on a terminal's stderr ("\r" rewritten; a newline when done), nothing
 * otherwise: "WHAT: 3.1/10.0 MB (31%), N UNITS, M tokens, R M tok/s". */
void mt_lines_progress(const char *what, int64_t bytes, int64_t total_bytes, int64_t n, const char *units,
                       int64_t tokens, double seconds, int done);

/* The summed size of the files; MT_ERR naming one that is missing or not a regular file. */
int mt_lines_total_bytes(const char *const *paths, int n, int64_t *total);

#endif
