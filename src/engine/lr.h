/* Learning-rate schedules: linear warmup, then cosine, linear or constant decay to min_lr.
 * Step s is 0-based; the value is the lr of step s's update:
 *   s < W:  max_lr * (s + 1) / W
 *   else:   p = (s - W) / max(1, S - W);  cosine: min + (max - min) * (1 + cos(pi p)) / 2
 *                                         linear: max + (min - max) * p;   constant: max  */
#ifndef MT_LR_H
#define MT_LR_H

#include <stdint.h>

typedef enum { MT_LR_COSINE = 0, MT_LR_LINEAR = 1, MT_LR_CONSTANT = 2 } mt_lr_kind;

typedef struct {
    mt_lr_kind kind;
    double max_lr, min_lr;
    int64_t warmup, total;
} mt_lr_schedule;

double mt_lr_at(const mt_lr_schedule *s, int64_t step);

#endif
