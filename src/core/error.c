#include "error.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char error_message[1024];

int mt_error_set(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    return MT_ERR;
}

const char *mt_error_message(void) { return error_message; }

void mt_error_clear(void) { error_message[0] = '\0'; }

MT_NORETURN void mt_fatal(const char *file, int line, const char *fmt, ...) {
    fflush(stdout);
    fprintf(stderr, "megatrain: fatal: %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

void *mt_malloc_impl(size_t bytes, const char *file, int line) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) mt_fatal(file, line, "out of host memory allocating %zu bytes", bytes);
    return p;
}

void *mt_calloc_impl(size_t count, size_t size, const char *file, int line) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) mt_fatal(file, line, "out of host memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *mt_aligned_alloc_impl(size_t bytes, const char *file, int line) {
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) mt_fatal(file, line, "out of host memory allocating %zu bytes", bytes);
    return p;
}

char *mt_strdup_impl(const char *s, const char *file, int line) {
    size_t n = strlen(s) + 1;
    char *p = mt_malloc_impl(n, file, line);
    memcpy(p, s, n);
    return p;
}
