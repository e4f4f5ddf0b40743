#include "io/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

static void free_names(mt_atomic_file *af) {
    free(af->path);
    free(af->tmp);
    af->path = af->tmp = NULL;
}

int mt_atomic_open(mt_atomic_file *af, const char *path) {
    size_t n = strlen(path) + 5;
    af->path = mt_strdup(path);
    af->tmp = mt_malloc(n);
    snprintf(af->tmp, n, "%s.tmp", path);
    af->f = fopen(af->tmp, "wb");
    if (!af->f) {
        int e = errno;
        mt_error_set("%s: cannot create: %s (is the directory writable?)", af->tmp, strerror(e));
        free_names(af);
        return MT_ERR;
    }
    return MT_OK;
}

int mt_atomic_write(mt_atomic_file *af, const void *data, size_t n) {
    if (n && fwrite(data, 1, n, af->f) != n)
        return mt_error_set("%s: write failed: %s (disk full?)", af->tmp, strerror(errno));
    return MT_OK;
}

int mt_atomic_write_at(mt_atomic_file *af, long offset, const void *data, size_t n) {
    if (fseek(af->f, offset, SEEK_SET) != 0 || fwrite(data, 1, n, af->f) != n || fseek(af->f, 0, SEEK_END) != 0)
        return mt_error_set("%s: write failed: %s (disk full?)", af->tmp, strerror(errno));
    return MT_OK;
}

/* fsync the directory so the rename itself survives a crash; failure here is not fatal data-wise. */
static void sync_parent_dir(const char *path) {
    char *dir = mt_strdup(path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) slash[1] = '\0';
    else if (slash) *slash = '\0';
    else strcpy(dir, ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

int mt_atomic_commit(mt_atomic_file *af) {
    const char *what = NULL;
    int e = 0;
    if (fflush(af->f) != 0) what = "flush", e = errno;
    else if (fsync(fileno(af->f)) != 0) what = "fsync", e = errno;
    int rc = fclose(af->f);
    af->f = NULL;
    if (!what && rc != 0) what = "close", e = errno;
    if (!what && rename(af->tmp, af->path) != 0) what = "rename", e = errno;
    if (what) {
        mt_error_set("%s: %s failed: %s (disk full?)", af->tmp, what, strerror(e));
        unlink(af->tmp);
        free_names(af);
        return MT_ERR;
    }
    sync_parent_dir(af->path);
    free_names(af);
    return MT_OK;
}

void mt_atomic_abort(mt_atomic_file *af) {
    if (af->f) fclose(af->f);
    af->f = NULL;
    if (af->tmp) unlink(af->tmp);
    free_names(af);
}

int mt_atomic_write_file(const char *path, const void *data, size_t n) {
    mt_atomic_file af;
    MT_TRY(mt_atomic_open(&af, path));
    if (mt_atomic_write(&af, data, n) != MT_OK) {
        mt_atomic_abort(&af);
        return MT_ERR;
    }
    return mt_atomic_commit(&af);
}
