#include "run_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "io/atomic_file.h"

/* ---- the lock ---- */

int mt_run_lock_take(mt_run_lock *l, const char *out_dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/.lock", out_dir);
    l->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (l->fd < 0) return mt_error_set("%s: cannot open: %s", path, strerror(errno));
    if (flock(l->fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char holder[512] = "";
        ssize_t n = pread(l->fd, holder, sizeof holder - 1, 0);
        holder[n > 0 ? n : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        close(l->fd);
        l->fd = -1;
        if (err != EWOULDBLOCK) return mt_error_set("%s: cannot lock: %s", path, strerror(err));
        return mt_error_set("--out %s is in use by another megatrain train (%s); wait for it to end, "
                            "or use another --out",
                            out_dir, holder[0] ? holder : "it has not written its pid yet");
    }
    char host[256] = "?", when[64] = "?", text[512];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
    int len = snprintf(text, sizeof text, "pid %ld, host %s, started %s\n", (long)getpid(), host, when);
    /* what the lock file says is only for the message above: a failure here is no reason to stop */
    if (ftruncate(l->fd, 0) != 0 || pwrite(l->fd, text, (size_t)len, 0) != len)
        fprintf(stderr, "megatrain: warning: %s: cannot record the pid: %s\n", path, strerror(errno));
    return MT_OK;
}

void mt_run_unlock(mt_run_lock *l) {
    if (l->fd >= 0) close(l->fd); /* closing releases the flock */
    l->fd = -1;
}

/* ---- what OUT holds ---- */

static int is_ckpt_entry(const char *name) {
    return strncmp(name, "step_", 5) == 0 || strncmp(name, ".tmp-", 5) == 0;
}

/* The highest checkpoints/step_* name into newest ("" when none); the count of step_* entries. */
static int list_steps(const char *out_dir, char *newest, size_t size) {
    char path[4200];
    snprintf(path, sizeof path, "%s/checkpoints", out_dir);
    newest[0] = '\0';
    DIR *d = opendir(path);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "step_", 5) != 0) continue;
        n++;
        if (strcmp(e->d_name, newest) > 0) snprintf(newest, size, "%s", e->d_name);
    }
    closedir(d);
    return n;
}

int mt_run_dir_used(const char *out_dir, char *what, size_t what_size) {
    char path[4200], newest[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    struct stat st;
    int metrics = stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0;
    int steps = list_steps(out_dir, newest, sizeof newest);
    if (metrics && steps) snprintf(what, what_size, "metrics.jsonl and checkpoints/%s", newest);
    else if (metrics) snprintf(what, what_size, "metrics.jsonl");
    else if (steps) snprintf(what, what_size, "checkpoints/%s", newest);
    else snprintf(what, what_size, "nothing");
    return metrics || steps;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path); /* FTW_PHYS: a symbolic link is removed, never followed */
}

static int remove_tree(const char *path) {
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return mt_error_set("--overwrite: cannot remove %s: %s", path, strerror(errno));
    return MT_OK;
}

/* OUT/tensorboard's event files (the directory too once empty): the old run's curves. */
static int remove_events(const char *out_dir) {
    char dir[4200], path[4600];
    snprintf(dir, sizeof dir, "%s/tensorboard", out_dir);
    DIR *d = opendir(dir);
    if (!d) return MT_OK;
    struct dirent *e;
    int rc = MT_OK;
    while (rc == MT_OK && (e = readdir(d))) {
        if (strncmp(e->d_name, "events.out.tfevents.", 20) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0) rc = mt_error_set("--overwrite: cannot remove %s: %s", path, strerror(errno));
    }
    closedir(d);
    rmdir(dir); /* stays when something else is in it */
    return rc;
}

int mt_run_dir_prepare_fresh(const char *out_dir, int overwrite) {
    char what[512];
    if (!mt_run_dir_used(out_dir, what, sizeof what)) return MT_OK;
    if (!overwrite)
        return mt_error_set("--out %s already holds a run (%s); continue it with --resume, replace it "
                            "with --overwrite, or choose another --out",
                            out_dir, what);
    /* the checkpoints first: until metrics.jsonl goes too, OUT still reads as used */
    char dir[4200], path[4600];
    snprintf(dir, sizeof dir, "%s/checkpoints", out_dir);
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        int rc = MT_OK;
        while (rc == MT_OK && (e = readdir(d))) {
            if (!is_ckpt_entry(e->d_name)) continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            rc = remove_tree(path);
        }
        closedir(d);
        MT_TRY(rc);
        rmdir(dir); /* fails, and stays, when something else is in it */
    }
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    if (unlink(path) != 0 && errno != ENOENT)
        return mt_error_set("--overwrite: cannot remove %s: %s", path, strerror(errno));
    MT_TRY(remove_events(out_dir));
    printf("--overwrite: removed the previous run's %s from %s\n", what, out_dir);
    return MT_OK;
}

/* ---- metrics.jsonl on resume ---- */

/* The "step" of a metrics line; 0 when the line has none (kept as it is), -1 when it is no JSON
 * object at all (kept too, with a warning: the run's lines are never dropped on a guess). */
static int64_t line_step(const char *line) {
    json_error_t err;
    json_t *j = json_loads(line, 0, &err);
    json_t *s = json_object_get(j, "step");
    int64_t step = !json_is_object(j) ? -1 : json_is_integer(s) ? (int64_t)json_integer_value(s) : 0;
    json_decref(j);
    return step;
}

/* A line that goes: torn (no newline) or of a later step. */
static int goes(const char *line, ssize_t n, int64_t step) {
    return line[n - 1] != '\n' || line_step(line) > step;
}

/* One warning for a whole line that is not a JSON object (what a hand edit or another program
 * left): it stays, but a plot or a reader of the file would stumble on it. */
static void warn_garbage(const char *path, int64_t number, const char *line, ssize_t n) {
    if (line[n - 1] != '\n' || line_step(line) >= 0) return;
    int shown = n - 1 > 60 ? 60 : (int)(n - 1);
    fprintf(stderr, "megatrain: warning: %s line %lld is not a JSON object (kept as it is): %.*s%s\n", path,
            (long long)number, shown, line, n - 1 > 60 ? "..." : "");
}

/* Copies the lines that stay from f (at its start) into af. */
static int write_kept(FILE *f, mt_atomic_file *af, int64_t step) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = MT_OK;
    while (rc == MT_OK && (n = getline(&line, &cap, f)) > 0)
        if (!goes(line, n, step)) rc = mt_atomic_write(af, line, (size_t)n);
    free(line);
    return rc;
}

int mt_run_dir_cut_metrics(const char *out_dir, int64_t step, int64_t *dropped) {
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    *dropped = 0;
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? MT_OK : mt_error_set("%s: cannot read: %s", path, strerror(errno));
    /* count first: most resumes drop nothing, and then nothing is rewritten */
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int64_t number = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        *dropped += goes(line, n, step);
        warn_garbage(path, ++number, line, n);
    }
    free(line);
    int rc = ferror(f) ? mt_error_set("%s: read failed: %s", path, strerror(errno)) : MT_OK;
    if (rc == MT_OK && *dropped) {
        mt_atomic_file af;
        rewind(f);
        if ((rc = mt_atomic_open(&af, path)) == MT_OK) {
            rc = write_kept(f, &af, step);
            if (rc == MT_OK) rc = mt_atomic_commit(&af);
            else mt_atomic_abort(&af);
        }
    }
    fclose(f);
    return rc;
}
