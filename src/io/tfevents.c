#include "io/tfevents.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "io/atomic_file.h"

/* ---- CRC32C (Castagnoli, reflected polynomial 0x82f63b78), one table lookup a byte ---- */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t mt_crc32c(const void *data, size_t n) {
    pthread_once(&crc_once, crc_init);
    const uint8_t *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

uint32_t mt_tfevents_masked_crc(const void *data, size_t n) {
    uint32_t c = mt_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- protobuf encoding of the three messages ---- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} bytes;

static void put(bytes *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        MT_CHECK(b->p, "out of memory (%zu bytes)", b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void put_varint(bytes *b, uint64_t v) {
    uint8_t t[10];
    size_t k = 0;
    do {
        t[k++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    put(b, t, k);
}

static void put_le(bytes *b, uint64_t v, int width) {
    uint8_t t[8];
    for (int i = 0; i < width; i++) t[i] = (uint8_t)(v >> (8 * i));
    put(b, t, (size_t)width);
}

enum { WIRE_VARINT = 0, WIRE_I64 = 1, WIRE_LEN = 2, WIRE_I32 = 5 };

static void put_key(bytes *b, int field, int wire) { put_varint(b, (uint64_t)(field << 3 | wire)); }

static void put_len(bytes *b, int field, const void *d, size_t n) {
    put_key(b, field, WIRE_LEN);
    put_varint(b, n);
    put(b, d, n);
}

/* Event fields 1 and 2, which every event has */
static void put_event_head(bytes *b, int64_t step, double wall_time) {
    uint64_t bits;
    memcpy(&bits, &wall_time, sizeof bits);
    put_key(b, 1, WIRE_I64);
    put_le(b, bits, 8);
    if (step != 0) { /* proto3: a zero is left out */
        put_key(b, 2, WIRE_VARINT);
        put_varint(b, (uint64_t)step);
    }
}

size_t mt_tfevents_encode_scalars(int64_t step, double wall_time, const mt_tb_scalar *v, int n, uint8_t **out) {
    bytes summary = {0}, value = {0}, ev = {0};
    for (int i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i].value, sizeof bits);
        value.n = 0;
        put_len(&value, 1, v[i].tag, strlen(v[i].tag));
        put_key(&value, 2, WIRE_I32);
        put_le(&value, bits, 4);
        put_len(&summary, 1, value.p, value.n);
    }
    put_event_head(&ev, step, wall_time);
    put_len(&ev, 5, summary.p, summary.n);
    free(summary.p), free(value.p);
    *out = ev.p;
    return ev.n;
}

/* One record around data, appended to b. */
static void put_record(bytes *b, const uint8_t *data, size_t n) {
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)n >> (8 * i));
    put(b, len, 8);
    put_le(b, mt_tfevents_masked_crc(len, 8), 4);
    put(b, data, n);
    put_le(b, mt_tfevents_masked_crc(data, n), 4);
}

/* ---- the writer ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char prefix[] = "events.out.tfevents.";

/* The largest <unix time> in the names of DIR's events files (0 when none). */
static long long newest_time(const char *dir) {
    long long t = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, sizeof prefix - 1) != 0) continue;
        long long x = strtoll(e->d_name + sizeof prefix - 1, NULL, 10);
        if (x > t) t = x;
    }
    closedir(d);
    return t;
}

/* The whole of b at the end of the file, or the file cut back to where it was. */
static int append(mt_tfevents *w, const bytes *b) {
    if (w->failed || !w->open) return MT_OK;
    off_t start = lseek(w->fd, 0, SEEK_END);
    size_t done = 0;
    errno = 0;
    while (start >= 0 && done < b->n) {
        ssize_t k = write(w->fd, b->p + done, b->n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        done += (size_t)k;
    }
    if (done == b->n && start >= 0) return MT_OK;
    int err = errno ? errno : EIO;
    if (start >= 0) { /* back to the last whole record; should that fail too, readers stop at the torn tail */
        int cut = ftruncate(w->fd, start);
        (void)cut;
    }
    w->failed = 1;
    return mt_error_set("%s: write failed: %s", w->path, strerror(err));
}

int mt_tfevents_open(mt_tfevents *w, const char *dir, int64_t start_step) {
    static int counter;
    memset(w, 0, sizeof *w);
    w->fd = -1;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return mt_error_set("%s: cannot create: %s", dir, strerror(errno));
    double wall = now_s();
    long long t = (long long)wall, newest = newest_time(dir);
    if (t <= newest) t = newest + 1; /* read after the files already there */
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    snprintf(w->path, sizeof w->path, "%s/%s%lld.%s.%ld.%d", dir, prefix, t, host, (long)getpid(), counter++);
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (w->fd < 0) return mt_error_set("%s: cannot create: %s", w->path, strerror(errno));
    w->open = 1;
    bytes ev = {0}, rec = {0};
    put_event_head(&ev, 0, wall);
    put_len(&ev, 3, "brain.Event:2", 13);
    put_record(&rec, ev.p, ev.n);
    if (start_step > 0) {
        bytes log = {0};
        put_key(&log, 1, WIRE_VARINT);
        put_varint(&log, 1); /* SessionLog.START */
        ev.n = 0;
        put_event_head(&ev, start_step, wall);
        put_len(&ev, 7, log.p, log.n);
        put_record(&rec, ev.p, ev.n);
        free(log.p);
    }
    int rc = append(w, &rec);
    free(ev.p), free(rec.p);
    if (rc != MT_OK) mt_tfevents_close(w);
    return rc;
}

int mt_tfevents_scalars(mt_tfevents *w, int64_t step, double wall_time, const mt_tb_scalar *v, int n) {
    if (w->failed || !w->open) return MT_OK;
    uint8_t *ev;
    size_t len = mt_tfevents_encode_scalars(step, wall_time, v, n, &ev);
    bytes rec = {0};
    put_record(&rec, ev, len);
    int rc = append(w, &rec);
    free(ev), free(rec.p);
    return rc;
}

void mt_tfevents_close(mt_tfevents *w) {
    if (w->open) close(w->fd);
    w->open = 0;
    w->fd = -1;
}

/* ---- reading and the cut on resume ---- */

static uint32_t get_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int mt_tfevents_read_record(FILE *f, uint8_t **buf, size_t *cap, size_t *n) {
    uint8_t head[12], tail[4];
    size_t got = fread(head, 1, sizeof head, f);
    if (got == 0) return 0;
    if (got < sizeof head || get_le32(head + 8) != mt_tfevents_masked_crc(head, 8)) return -1;
    uint64_t len = 0;
    for (int i = 0; i < 8; i++) len |= (uint64_t)head[i] << (8 * i);
    if (len > ((uint64_t)1 << 30)) return -1;
    if (len > *cap) {
        *cap = (size_t)len;
        *buf = realloc(*buf, *cap);
        MT_CHECK(*buf, "out of memory (%zu bytes)", *cap);
    }
    if (fread(*buf, 1, (size_t)len, f) != len || fread(tail, 1, 4, f) != 4 ||
        get_le32(tail) != mt_tfevents_masked_crc(*buf, (size_t)len))
        return -1;
    *n = (size_t)len;
    return 1;
}

static int get_varint(const uint8_t *p, size_t n, size_t *at, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*at >= n) return MT_ERR;
        uint8_t c = p[(*at)++];
        *v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) return MT_OK;
    }
    return MT_ERR;
}

int mt_tfevents_event_step(const uint8_t *data, size_t n, int64_t *step) {
    *step = 0;
    size_t at = 0;
    while (at < n) {
        uint64_t key, v;
        MT_TRY(get_varint(data, n, &at, &key));
        switch (key & 7) {
        case WIRE_VARINT:
            MT_TRY(get_varint(data, n, &at, &v));
            if (key >> 3 == 2) *step = (int64_t)v;
            break;
        case WIRE_I64: at += 8; break;
        case WIRE_I32: at += 4; break;
        case WIRE_LEN:
            MT_TRY(get_varint(data, n, &at, &v));
            if (v > n - at) return MT_ERR;
            at += v;
            break;
        default: return MT_ERR;
        }
    }
    return at == n ? MT_OK : MT_ERR;
}

/* A record stays when it reads whole and is of step or before; reading stops at a bad one. */
static int64_t cut_file(const char *path, int64_t step, int *rc) {
    *rc = MT_OK;
    FILE *f = fopen(path, "rb");
    if (!f) {
        *rc = mt_error_set("%s: cannot read: %s", path, strerror(errno));
        return 0;
    }
    uint8_t *buf = NULL;
    size_t cap = 0, n;
    int64_t dropped = 0, s;
    int r;
    for (int pass = 0; pass < 2; pass++) {
        mt_atomic_file af;
        if (pass == 1) {
            if (dropped == 0) break; /* most resumes: nothing rewritten */
            rewind(f);
            if ((*rc = mt_atomic_open(&af, path)) != MT_OK) break;
        }
        while ((r = mt_tfevents_read_record(f, &buf, &cap, &n)) == 1) {
            int go = mt_tfevents_event_step(buf, n, &s) != MT_OK || s > step;
            if (pass == 0) dropped += go;
            if (pass == 1 && !go && *rc == MT_OK) {
                bytes rec = {0};
                put_record(&rec, buf, n);
                *rc = mt_atomic_write(&af, rec.p, rec.n);
                free(rec.p);
            }
        }
        if (pass == 0) dropped += r < 0;
        if (pass == 1) *rc = *rc == MT_OK ? mt_atomic_commit(&af) : (mt_atomic_abort(&af), MT_ERR);
    }
    free(buf);
    fclose(f);
    return dropped;
}

int mt_tfevents_cut(const char *dir, int64_t step, int64_t *dropped) {
    *dropped = 0;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? MT_OK : mt_error_set("%s: cannot read: %s", dir, strerror(errno));
    int rc = MT_OK;
    struct dirent *e;
    while (rc == MT_OK && (e = readdir(d))) {
        if (strncmp(e->d_name, prefix, sizeof prefix - 1) != 0 || strstr(e->d_name, ".tmp.")) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        *dropped += cut_file(path, step, &rc);
    }
    closedir(d);
    return rc;
}
