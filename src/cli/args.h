/* Command-line values: parsing with validation, so that a bad flag value is a clear error that
 * names the flag instead of a silent atoi() zero. */
#ifndef MT_ARGS_H
#define MT_ARGS_H

#include <stdint.h>

/* Each returns MT_OK, or MT_ERR with a message naming `flag`. */
int mt_arg_int(const char *flag, const char *text, int64_t min, int64_t max, int64_t *out);
/* "auto" (*out = -1, MT_AUTO of engine/planner.h) or an integer in [min, max]. */
int mt_arg_int_or_auto(const char *flag, const char *text, int64_t min, int64_t max, int64_t *out);
int mt_arg_float(const char *flag, const char *text, double min, double max, double *out);
/* Sizes like 512M, 24G, 1.5T, 4096 (bytes); binary units: K = 2^10, G = 2^30 (GiB, the unit
 * sizes are printed in); a trailing B or iB is allowed (24G = 24GB = 24GiB). */
int mt_arg_size(const char *flag, const char *text, int64_t *out);
/* One of a '|'-separated list of choices, e.g. "f32|bf16"; *out = index. */
int mt_arg_choice(const char *flag, const char *text, const char *choices, int *out);

/* rc as is; on MT_ERR the message gets "flag: " in front unless it names the flag already (for
 * parsers outside the CLI, e.g. mt_chat_format_parse). */
int mt_arg_named(const char *flag, int rc);

#endif
