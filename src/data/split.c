/* --eval-split: which units are held out, and the training order over the rest (see split.h). */
#include "data/split.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* splitmix64's finalizer. */
static uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

int mt_data_split_held_out(uint64_t seed, double fraction, int64_t u) {
    /* keyed apart from the shuffle's keys (tokens.c), so the split and the order are unrelated */
    uint64_t h = mix(mix(seed ^ 0x5EB1175EB1175EB1ull) ^ (uint64_t)u);
    return (double)(h >> 11) * 0x1p-53 < fraction;
}

int mt_data_split_make(mt_data_split *s, int64_t units, double fraction, uint64_t seed, const char *what) {
    memset(s, 0, sizeof *s);
    if (!(fraction > 0 && fraction < 1)) return mt_error_set("--eval-split %g: must be between 0 and 1", fraction);
    MT_CHECK(units >= 1, "units %lld", (long long)units);
    int64_t n_eval = 0;
    for (int64_t u = 0; u < units; u++) n_eval += mt_data_split_held_out(seed, fraction, u);
    if (n_eval == 0)
        return mt_error_set("--eval-split %g holds out nothing of %s: the eval set would be empty; raise it, "
                            "or give more data or --eval-data", fraction, what);
    if (n_eval == units)
        return mt_error_set("--eval-split %g holds out all of %s: nothing would be left to train on; lower it, "
                            "or give more data or --eval-data", fraction, what);
    s->units = units;
    s->n_eval = n_eval;
    s->n_train = units - n_eval;
    s->train = mt_malloc((size_t)s->n_train * sizeof(int64_t));
    s->eval = mt_malloc((size_t)s->n_eval * sizeof(int64_t));
    int64_t t = 0, e = 0;
    for (int64_t u = 0; u < units; u++) {
        if (mt_data_split_held_out(seed, fraction, u)) s->eval[e++] = u;
        else s->train[t++] = u;
    }
    return MT_OK;
}

void mt_data_split_free(mt_data_split *s) {
    free(s->train);
    free(s->eval);
    memset(s, 0, sizeof *s);
}

int64_t mt_data_split_train_unit(const mt_data_split *s, const mt_batch_order *o, int64_t g) {
    MT_CHECK(s->n_train >= 1 && g >= 0, "train units %lld, row %lld", (long long)s->n_train, (long long)g);
    int64_t slot = g % s->n_train;
    if (o->shuffle) slot = mt_tokens_perm(o->seed, g / s->n_train, s->n_train, slot);
    return s->train[slot];
}
