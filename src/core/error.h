/* Errors.
 *
 * Two kinds, kept apart on purpose:
 *  - Bad input (a file, a config field, a flag): the function returns MT_ERR after mt_error_set()
 *    recorded one line naming what was wrong; the caller decides (the CLI prints it and exits 1).
 *    Nothing is half-done when MT_ERR comes back.
 *  - Broken invariants and exhausted resources (a bug, malloc failing, a BLAS/CUDA call failing):
 *    mt_fatal() prints file:line and the message and exits. The MT_CHECK family wraps these.
 */
#ifndef MT_ERROR_H
#define MT_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stddef.h>
#include <stdio.h>

#define MT_OK 0
#define MT_ERR (-1)

/* Records the message of the current bad-input error (thread-local) and returns MT_ERR. */
int mt_error_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The last message recorded on this thread ("" when none). */
const char *mt_error_message(void);
void mt_error_clear(void);

#ifdef __cplusplus
#define MT_NORETURN [[noreturn]]
#else
#define MT_NORETURN _Noreturn
#endif

MT_NORETURN void mt_fatal(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* MT_CHECK(cond, "fmt", ...) — for invariants; the stringified condition is printed too. */
#define MT_CHECK(cond, fmt, ...)                                                    \
    do {                                                                            \
        if (!(cond)) mt_fatal(__FILE__, __LINE__, "(%s) " fmt, #cond, ##__VA_ARGS__); \
    } while (0)

/* MT_TRY(call) — propagate an MT_ERR returned by a bad-input function. */
#define MT_TRY(call)                         \
    do {                                     \
        if ((call) != MT_OK) return MT_ERR;  \
    } while (0)

void *mt_malloc_impl(size_t bytes, const char *file, int line);
void *mt_calloc_impl(size_t count, size_t size, const char *file, int line);
/* 64-byte aligned, for vectorized loops; free with free(). */
void *mt_aligned_alloc_impl(size_t bytes, const char *file, int line);
char *mt_strdup_impl(const char *s, const char *file, int line);

#define mt_malloc(bytes) mt_malloc_impl((bytes), __FILE__, __LINE__)
#define mt_calloc(count, size) mt_calloc_impl((count), (size), __FILE__, __LINE__)
#define mt_aligned_alloc(bytes) mt_aligned_alloc_impl((bytes), __FILE__, __LINE__)
#define mt_strdup(s) mt_strdup_impl((s), __FILE__, __LINE__)

#ifdef __cplusplus
}
#endif

#endif
