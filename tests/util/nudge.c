#include "nudge.h"

#include <string.h>

#include "core/error.h"
#include "testutil.h"

float *mt_test_nudged(const mt_param_table *t, const float *w, uint64_t seed, double rel) {
    float *p = mt_aligned_alloc((size_t)t->total * sizeof(float));
    memcpy(p, w, (size_t)t->total * sizeof(float));
    for (int i = 0; i < t->n_params; i++) {
        mt_test_rng rng;
        mt_test_rng_seed(&rng, seed * 1000003u + (uint64_t)i);
        for (int64_t j = 0; j < t->params[i].numel; j++) {
            double u = (double)(mt_test_rng_u64(&rng) >> 11) / 9007199254740992.0 * 2 - 1;
            p[t->params[i].offset + j] *= (float)(1 + u * rel);
        }
    }
    return p;
}
