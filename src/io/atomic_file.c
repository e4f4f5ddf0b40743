#include "io/atomic_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/error.h"

#define TMP_TAG ".tmp."
#define SUFFIX_LEN 6
#define CREATE_TRIES 100

static const char SUFFIX_CHARS[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

const char *mt_io_errtext(int e) {
    static _Thread_local char buf[192];
    snprintf(buf, sizeof buf, "%s%s", strerror(e),
             e == ENOSPC || e == EDQUOT ? " (disk full)" : e == EFBIG ? " (the file-size limit, ulimit -f)" : "");
    return buf;
}

/* Six random name characters; getrandom, else the clock and pid (names are retried on EEXIST). */
static void random_suffix(char out[SUFFIX_LEN + 1]) {
    unsigned char r[SUFFIX_LEN];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        static _Thread_local uint64_t counter;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                     ((uint64_t)getpid() << 40) ^ (++counter * 0x9e3779b97f4a7c15ull);
        for (int i = 0; i < SUFFIX_LEN; i++, x = x * 6364136223846793005ull + 1442695040888963407ull)
            r[i] = (unsigned char)(x >> 56);
    }
    for (int i = 0; i < SUFFIX_LEN; i++) out[i] = SUFFIX_CHARS[r[i] % (sizeof SUFFIX_CHARS - 1)];
    out[SUFFIX_LEN] = '\0';
}

/* PREFIX.XXXXXX in a fresh malloc'd buffer (suffix filled by the caller). */
static char *name_with_suffix(const char *prefix, const char *sep) {
    size_t n = strlen(prefix) + strlen(sep) + SUFFIX_LEN + 1;
    char *p = mt_malloc(n);
    snprintf(p, n, "%s%s%.*s", prefix, sep, SUFFIX_LEN, "XXXXXX");
    return p;
}

static void fill_suffix(char *name) {
    random_suffix(name + strlen(name) - SUFFIX_LEN);
}

int mt_make_temp_dir(const char *prefix, char **path) {
    char *p = name_with_suffix(prefix, ".");
    for (int i = 0; i < CREATE_TRIES; i++) {
        fill_suffix(p);
        if (mkdir(p, 0777) == 0) {
            *path = p;
            return MT_OK;
        }
        if (errno != EEXIST) break;
    }
    int e = errno;
    mt_error_set("%s: cannot create directory: %s", p, mt_io_errtext(e));
    free(p);
    return MT_ERR;
}

/* ---- leftovers of killed writers ---- */

/* "BASE.tmp.XXXXXX" for this path's base name. */
static int is_our_temp_name(const char *name, const char *base) {
    size_t b = strlen(base), t = strlen(TMP_TAG);
    if (strncmp(name, base, b) != 0 || strncmp(name + b, TMP_TAG, t) != 0) return 0;
    const char *s = name + b + t;
    return strlen(s) == SUFFIX_LEN && strspn(s, SUFFIX_CHARS) == SUFFIX_LEN;
}

/* Removes DIR/NAME when no writer holds its lock (a writer killed before its rename). */
static void remove_if_abandoned(int dirfd, const char *name) {
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return;
    struct stat a, b;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &a) == 0 && S_ISREG(a.st_mode) &&
        fstatat(dirfd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_dev == b.st_dev &&
        a.st_ino == b.st_ino)
        (void)unlinkat(dirfd, name, 0);
    close(fd);
}

static void split_path(const char *path, char **dir, const char **base) {
    const char *slash = strrchr(path, '/');
    *base = slash ? slash + 1 : path;
    if (!slash) *dir = mt_strdup(".");
    else if (slash == path) *dir = mt_strdup("/");
    else {
        size_t n = (size_t)(slash - path);
        *dir = mt_malloc(n + 1);
        memcpy(*dir, path, n);
        (*dir)[n] = '\0';
    }
}

static void remove_abandoned_temps(const char *path) {
    char *dir;
    const char *base;
    split_path(path, &dir, &base);
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (is_our_temp_name(e->d_name, base)) remove_if_abandoned(dirfd(d), e->d_name);
        closedir(d);
    }
    free(dir);
}

/* ---- the writer ---- */

static void free_names(mt_atomic_file *af) {
    free(af->path);
    free(af->tmp);
    af->path = af->tmp = NULL;
    XXH3_freeState(af->hash);
    af->hash = NULL;
}

/* Creates and locks a fresh temporary; 0 or an errno. A cleaner may remove a temporary in the
 * moment between its creation and the lock; then the name no longer names our file: retry. */
static int create_temp(mt_atomic_file *af, int *fd_out) {
    for (int i = 0; i < CREATE_TRIES; i++) {
        fill_suffix(af->tmp);
        int fd = open(af->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0) {
            if (errno == EEXIST) continue;
            return errno;
        }
        struct stat a, b;
        /* no flock on this file system: no cleaner can lock (and remove) it either */
        int unlockable = flock(fd, LOCK_EX) != 0;
        if (unlockable || (fstat(fd, &a) == 0 && stat(af->tmp, &b) == 0 && a.st_dev == b.st_dev &&
                           a.st_ino == b.st_ino)) {
            *fd_out = fd;
            return 0;
        }
        close(fd); /* removed by a cleaner before we locked it: the name is not ours any more */
    }
    return EEXIST;
}

int mt_atomic_open(mt_atomic_file *af, const char *path) {
    memset(af, 0, sizeof *af);
    remove_abandoned_temps(path);
    af->path = mt_strdup(path);
    af->tmp = name_with_suffix(path, TMP_TAG);
    af->hash = XXH3_createState();
    MT_CHECK(af->hash && XXH3_64bits_reset(af->hash) == XXH_OK, "XXH3 state (out of memory?)");
    af->hashed = 1;
    int fd = -1, e = create_temp(af, &fd);
    if (!e && !(af->f = fdopen(fd, "wb"))) {
        e = errno;
        close(fd);
        unlink(af->tmp);
    }
    if (e) {
        mt_error_set("%s: cannot create: %s", af->tmp, mt_io_errtext(e));
        free_names(af);
        return MT_ERR;
    }
    return MT_OK;
}

int mt_atomic_write(mt_atomic_file *af, const void *data, size_t n) {
    if (n == 0) return MT_OK;
    errno = 0;
    if (fwrite(data, 1, n, af->f) != n)
        return mt_error_set("%s: write failed: %s", af->tmp, mt_io_errtext(errno ? errno : EIO));
    XXH3_64bits_update(af->hash, data, n);
    af->bytes += n;
    return MT_OK;
}

int mt_atomic_write_at(mt_atomic_file *af, long offset, const void *data, size_t n) {
    errno = 0;
    if (fseek(af->f, offset, SEEK_SET) != 0 || fwrite(data, 1, n, af->f) != n || fseek(af->f, 0, SEEK_END) != 0)
        return mt_error_set("%s: write failed: %s", af->tmp, mt_io_errtext(errno ? errno : EIO));
    af->hashed = 0;
    return MT_OK;
}

/* fsync the directory so the rename itself survives a crash; failure here is not fatal data-wise. */
static void sync_parent_dir(const char *path) {
    char *dir;
    const char *base;
    split_path(path, &dir, &base);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

int mt_atomic_commit_digest(mt_atomic_file *af, mt_file_digest *digest) {
    MT_CHECK(!digest || af->hashed, "%s: no digest after mt_atomic_write_at", af->path);
    const char *what = NULL;
    int e = 0, renamed = 0;
    /* rename before close: the lock (held through the fd) must cover the temporary's whole life */
    if (fflush(af->f) != 0) what = "flush", e = errno;
    else if (fsync(fileno(af->f)) != 0) what = "fsync", e = errno;
    else if (rename(af->tmp, af->path) != 0) what = "rename", e = errno;
    else renamed = 1;
    int rc = fclose(af->f);
    af->f = NULL;
    if (!what && rc != 0) what = "close", e = errno;
    if (what) {
        if (renamed) mt_error_set("%s: %s failed: %s", af->path, what, mt_io_errtext(e));
        else mt_error_set("%s: %s failed: %s", af->tmp, what, mt_io_errtext(e));
        if (!renamed) unlink(af->tmp);
        free_names(af);
        return MT_ERR;
    }
    if (digest) {
        digest->bytes = af->bytes;
        digest->xxh3 = XXH3_64bits_digest(af->hash);
    }
    sync_parent_dir(af->path);
    free_names(af);
    return MT_OK;
}

int mt_atomic_commit(mt_atomic_file *af) { return mt_atomic_commit_digest(af, NULL); }

void mt_atomic_abort(mt_atomic_file *af) {
    if (af->f) fclose(af->f);
    af->f = NULL;
    if (af->tmp) unlink(af->tmp);
    free_names(af);
}

int mt_atomic_write_file_digest(const char *path, const void *data, size_t n,
                                mt_file_digest *digest) {
    mt_atomic_file af;
    MT_TRY(mt_atomic_open(&af, path));
    if (mt_atomic_write(&af, data, n) != MT_OK) {
        mt_atomic_abort(&af);
        return MT_ERR;
    }
    return mt_atomic_commit_digest(&af, digest);
}

int mt_atomic_write_file(const char *path, const void *data, size_t n) {
    return mt_atomic_write_file_digest(path, data, n, NULL);
}

int mt_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return mt_error_set("%s: cannot open directory to fsync: %s", dir, mt_io_errtext(errno));
    int rc = fsync(fd) == 0 ? MT_OK : mt_error_set("%s: fsync failed: %s", dir, mt_io_errtext(errno));
    close(fd);
    return rc;
}

/* mkdir -p of every directory above path (not path itself). */
static int make_parents(const char *path) {
    char *p = mt_strdup(path);
    int rc = MT_OK;
    for (char *s = p + 1; *s && rc == MT_OK; s++) {
        if (*s != '/') continue;
        *s = '\0';
        struct stat sb;
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            rc = mt_error_set("%s: cannot create directory: %s", p, mt_io_errtext(errno));
        else if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))
            rc = mt_error_set("%s: exists and is not a directory", p);
        *s = '/';
    }
    free(p);
    return rc;
}

/* Removes a flat directory and its files (a failed write's temporary one). */
static void remove_flat_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *p = mt_malloc(strlen(dir) + strlen(e->d_name) + 2);
            sprintf(p, "%s/%s", dir, e->d_name);
            unlink(p);
            free(p);
        }
        closedir(d);
    }
    if (rmdir(dir) != 0)
        fprintf(stderr, "megatrain: warning: %s: could not remove: %s\n", dir, strerror(errno));
}

int mt_atomic_dir_write(const char *dir, int (*fill)(const char *tmp, void *ctx), void *ctx) {
    char *clean = mt_strdup(dir);
    for (size_t n = strlen(clean); n > 1 && clean[n - 1] == '/'; n--) clean[n - 1] = '\0';
    char *tmp = NULL, *prefix = mt_malloc(strlen(clean) + 8);
    sprintf(prefix, "%s.tmp", clean);
    int rc = make_parents(clean);
    if (rc == MT_OK) rc = mt_make_temp_dir(prefix, &tmp);
    if (rc == MT_OK) rc = fill(tmp, ctx);
    if (rc == MT_OK) rc = mt_fsync_dir(tmp);
    if (rc == MT_OK && rename(tmp, clean) != 0)
        rc = mt_error_set("%s: cannot rename %s to it: %s", clean, tmp,
                          errno == ENOTEMPTY || errno == EEXIST ? "it is no longer empty"
                                                                : mt_io_errtext(errno));
    if (rc == MT_OK) {
        char *slash = strrchr(clean, '/');
        if (slash == clean) slash[1] = '\0';
        else if (slash) *slash = '\0';
        if (mt_fsync_dir(slash ? clean : ".") != MT_OK)
            fprintf(stderr, "megatrain: warning: %s\n", mt_error_message());
    } else if (tmp) {
        char msg[1024]; /* the cleanup must not overwrite the message */
        snprintf(msg, sizeof msg, "%s", mt_error_message());
        remove_flat_dir(tmp);
        mt_error_set("%s", msg);
    }
    free(tmp);
    free(prefix);
    free(clean);
    return rc;
}
