#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

int mt_arg_int(const char *flag, const char *text, int64_t min, int64_t max, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end != '\0')
        return mt_error_set("%s: '%s' is not an integer", flag, text);
    if (v < min || v > max)
        return mt_error_set("%s: %lld is out of range [%lld, %lld]", flag, v, (long long)min,
                            (long long)max);
    *out = v;
    return MT_OK;
}

int mt_arg_int_or_auto(const char *flag, const char *text, int64_t min, int64_t max, int64_t *out) {
    if (strcmp(text, "auto") == 0) {
        *out = -1;
        return MT_OK;
    }
    if (mt_arg_int(flag, text, min, max, out) == MT_OK) return MT_OK;
    return mt_error_set("%s: '%s' is not auto or an integer in [%lld, %lld]", flag, text,
                        (long long)min, (long long)max);
}

int mt_arg_float(const char *flag, const char *text, double min, double max, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end != '\0' || !isfinite(v))
        return mt_error_set("%s: '%s' is not a number", flag, text);
    if (v < min || v > max) return mt_error_set("%s: %g is out of range [%g, %g]", flag, v, min, max);
    *out = v;
    return MT_OK;
}

int mt_arg_size(const char *flag, const char *text, int64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || !isfinite(v) || v < 0)
        return mt_error_set("%s: '%s' is not a size (e.g. 24G = 24 GiB, 512M)", flag, text);
    double mult = 1;
    switch (*end) {
    case 'K': case 'k': mult = 1024.0; end++; break;
    case 'M': case 'm': mult = 1024.0 * 1024; end++; break;
    case 'G': case 'g': mult = 1024.0 * 1024 * 1024; end++; break;
    case 'T': case 't': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    /* 24G, 24GiB and 24GB all mean 24 GiB: one unit, the one every size is printed in */
    if (mult > 1 && (*end == 'i' || *end == 'I') && (end[1] == 'B' || end[1] == 'b')) end += 2;
    else if (*end == 'B' || *end == 'b') end++;
    if (*end != '\0' || v * mult > 9e18)
        return mt_error_set("%s: '%s' is not a size (e.g. 24G = 24 GiB, 512M)", flag, text);
    *out = (int64_t)(v * mult);
    return MT_OK;
}

int mt_arg_choice(const char *flag, const char *text, const char *choices, int *out) {
    size_t len = strlen(text);
    const char *p = choices;
    for (int i = 0; *p; i++) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && strncmp(p, text, n) == 0) {
            *out = i;
            return MT_OK;
        }
        if (!bar) break;
        p = bar + 1;
    }
    return mt_error_set("%s: '%s' is not one of %s", flag, text, choices);
}

int mt_arg_named(const char *flag, int rc) {
    if (rc == MT_OK || strstr(mt_error_message(), flag)) return rc;
    char msg[512]; /* a copy: the message buffer is rewritten */
    snprintf(msg, sizeof msg, "%s", mt_error_message());
    return mt_error_set("%s: %s", flag, msg);
}
