#include "io/digest.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/error.h"

void mt_digest_hex(uint64_t h, char out[MT_DIGEST_HEX]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) out[i] = digits[(h >> (60 - 4 * i)) & 15];
    out[16] = '\0';
}

int mt_digest_parse_hex(const char *s, uint64_t *out) {
    if (!s || strlen(s) != 16) return MT_ERR;
    uint64_t h = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int v = c >= '0' && c <= '9' ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (v < 0) return MT_ERR;
        h = h << 4 | (uint64_t)v;
    }
    *out = h;
    return MT_OK;
}

int mt_digest_file(const char *path, mt_file_digest *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block */
    if (fd < 0) return errno;
    struct stat sb;
    int e = fstat(fd, &sb) != 0 ? errno : S_ISDIR(sb.st_mode) ? EISDIR : !S_ISREG(sb.st_mode) ? EINVAL : 0;
    if (e) {
        close(fd);
        return e;
    }
    size_t n = (size_t)sb.st_size;
    uint64_t h = XXH3_64bits(NULL, 0);
    if (n > 0) {
        void *p = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            e = errno;
            close(fd);
            return e;
        }
        (void)madvise(p, n, MADV_SEQUENTIAL);
        h = XXH3_64bits(p, n);
        munmap(p, n);
    }
    close(fd);
    out->bytes = (uint64_t)n;
    out->xxh3 = h;
    return 0;
}
