#include "lr.h"

#include <math.h>

double mt_lr_at(const mt_lr_schedule *s, int64_t step) {
    if (step < s->warmup) return s->max_lr * (double)(step + 1) / (double)s->warmup;
    int64_t span = s->total - s->warmup;
    double p = (double)(step - s->warmup) / (double)(span > 1 ? span : 1);
    if (p > 1) p = 1;
    switch (s->kind) {
    case MT_LR_COSINE: return s->min_lr + (s->max_lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * p));
    case MT_LR_LINEAR: return s->max_lr + (s->min_lr - s->max_lr) * p;
    case MT_LR_CONSTANT: return s->max_lr;
    }
    return s->max_lr;
}
