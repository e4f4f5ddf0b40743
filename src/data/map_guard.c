/* SIGBUS on a truncated data mapping -> one line and exit 1 (see map_guard.h). */
#include "data/map_guard.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

/* What both the check and the handler say after the path: the batch is refused before use. */
#define MT_MAP_GUARD_TAIL "while being read (was it rewritten in place? write a new file and rename it " \
                          "over the old one); stopped before using this batch: nothing of it was applied"

typedef struct {
    volatile sig_atomic_t active; /* set last on register, cleared first on unregister */
    const char *addr;
    size_t len;
    int fd;
    size_t path_len;
    char path[PATH_MAX];
} guard_slot;

static guard_slot slots[MT_MAP_GUARD_SLOTS];
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;

void mt_map_guard_register(const void *addr, size_t len, int fd, const char *path) {
    pthread_mutex_lock(&slots_lock);
    guard_slot *s = NULL;
    for (int i = 0; i < MT_MAP_GUARD_SLOTS && !s; i++)
        if (!slots[i].active) s = &slots[i];
    if (s) {
        s->addr = addr;
        s->len = len;
        s->fd = fd;
        snprintf(s->path, sizeof s->path, "%s", path);
        s->path_len = strlen(s->path);
        __atomic_thread_fence(__ATOMIC_SEQ_CST); /* the fields before the flag, for the handler */
        s->active = 1;
    } else {
        close(fd); /* no slot left: mapped unguarded */
    }
    pthread_mutex_unlock(&slots_lock);
}

static guard_slot *find(const void *addr) {
    for (int i = 0; i < MT_MAP_GUARD_SLOTS; i++)
        if (slots[i].active && slots[i].addr == addr) return &slots[i];
    return NULL;
}

void mt_map_guard_unregister(const void *addr) {
    pthread_mutex_lock(&slots_lock);
    guard_slot *s = find(addr);
    if (s) {
        s->active = 0;
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        close(s->fd);
    }
    pthread_mutex_unlock(&slots_lock);
}

int mt_map_guard_check(const void *addr) {
    pthread_mutex_lock(&slots_lock);
    guard_slot *s = find(addr);
    struct stat sb;
    int rc = MT_OK;
    if (s && fstat(s->fd, &sb) == 0 && (size_t)sb.st_size < s->len)
        rc = mt_error_set("%s: the data file shrank from %zu to %lld bytes " MT_MAP_GUARD_TAIL, s->path,
                          s->len, (long long)sb.st_size);
    pthread_mutex_unlock(&slots_lock);
    return rc;
}

static void write_all(const char *p, size_t n) {
    while (n > 0) {
        ssize_t k = write(STDERR_FILENO, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return;
        p += k, n -= (size_t)k;
    }
}

/* Async-signal-safe only: no stdio, no locks, no malloc. */
static void on_sigbus(int sig, siginfo_t *si, void *ctx) {
    (void)ctx;
    const char *a = si ? (const char *)si->si_addr : NULL;
    for (int i = 0; a && i < MT_MAP_GUARD_SLOTS; i++) {
        const guard_slot *s = &slots[i];
        if (!s->active || a < s->addr || a >= s->addr + s->len) continue;
        static const char head[] = "megatrain: ", tail[] = ": the data file was truncated " MT_MAP_GUARD_TAIL "\n";
        write_all(head, sizeof head - 1);
        write_all(s->path, s->path_len);
        write_all(tail, sizeof tail - 1);
        _exit(1);
    }
    /* Not a data mapping: the default action, so the crash is reported as one. */
    signal(sig, SIG_DFL);
    raise(sig);
}

void mt_map_guard_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}
