#include "io/lines.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "core/error.h"

int mt_lines_open(mt_lines *l, const char *path) {
    memset(l, 0, sizeof *l);
    l->f = fopen(path, "rb");
    if (!l->f) return mt_error_set("%s: cannot open: %s", path, strerror(errno));
    l->path = path;
    return MT_OK;
}

int mt_lines_next(mt_lines *l, const char **line, size_t *len) {
    ssize_t n = getline(&l->buf, &l->cap, l->f);
    if (n < 0) return ferror(l->f) ? mt_error_set("%s: read failed: %s", l->path, strerror(errno)) : 0;
    l->lineno++;
    *line = l->buf;
    *len = (size_t)n;
    return 1;
}

void mt_lines_close(mt_lines *l) {
    if (l->f) fclose(l->f);
    free(l->buf);
    memset(l, 0, sizeof *l);
}

int mt_lines_total_bytes(const char *const *paths, int n, int64_t *total) {
    *total = 0;
    for (int i = 0; i < n; i++) {
        struct stat st;
        if (stat(paths[i], &st) != 0) return mt_error_set("%s: cannot open: %s", paths[i], strerror(errno));
        if (!S_ISREG(st.st_mode)) return mt_error_set("%s: not a regular file", paths[i]);
        *total += st.st_size;
    }
    return MT_OK;
}

void mt_lines_progress(const char *what, int64_t bytes, int64_t total_bytes, int64_t n, const char *units,
                       int64_t tokens, double seconds, int done) {
    if (!isatty(STDERR_FILENO)) return;
    fprintf(stderr, "\r%s: %.1f/%.1f MB (%.0f%%), %lld %s, %lld tokens, %.2fM tok/s   ", what, bytes / 1e6,
            total_bytes / 1e6, total_bytes ? 100.0 * bytes / total_bytes : 100.0, (long long)n, units,
            (long long)tokens, seconds > 0 ? tokens / seconds / 1e6 : 0.0);
    if (done) fputc('\n', stderr);
    fflush(stderr);
}
