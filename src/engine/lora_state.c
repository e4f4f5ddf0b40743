/* The adapters' state on the compute side (engine/lora_state.h). */
#include "engine/lora_state.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

struct mt_lora_state {
    const mt_lora_table *lt;
    mt_backend *be;
    size_t n;
    mt_optim_arenas a; /* full format: master, m, v fp32; w the compute-dtype copy */
    float *grads;
};

mt_lora_state *mt_lora_state_create(const mt_lora_table *lt, mt_backend *be, const float *init) {
    mt_lora_state *s = mt_calloc(1, sizeof *s);
    s->lt = lt;
    s->be = be;
    s->n = (size_t)lt->total;
    size_t n = s->n ? s->n : 1;
    s->a.f = MT_STATE_FULL;
    s->a.n = s->n;
    s->a.w_dtype = be->dtype;
    s->a.master = be->alloc(be, n * sizeof(float));
    s->a.m = be->alloc(be, n * sizeof(float));
    s->a.v = be->alloc(be, n * sizeof(float));
    s->a.w = be->alloc(be, n * mt_dtype_size(be->dtype));
    s->grads = be->alloc(be, n * sizeof(float));
    mt_lora_state_set(s, init, NULL, NULL);
    be->zero(be, s->a.m, n * sizeof(float));
    be->zero(be, s->a.v, n * sizeof(float));
    be->zero(be, s->grads, n * sizeof(float));
    return s;
}

void mt_lora_state_free(mt_lora_state *s) {
    if (!s) return;
    void *bufs[] = {s->a.master, s->a.m, s->a.v, s->a.w, s->grads};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) s->be->free(s->be, bufs[i]);
    free(s);
}

void *mt_lora_state_weights(const mt_lora_state *s) { return s->a.w; }
float *mt_lora_state_grads(const mt_lora_state *s) { return s->grads; }

double mt_lora_state_bytes(const mt_lora_table *lt, mt_dtype compute) {
    return (double)lt->total * (16.0 + (double)mt_dtype_size(compute));
}

void mt_lora_state_zero_grads(mt_lora_state *s) {
    s->be->zero(s->be, s->grads, s->n * sizeof(float));
}

void mt_lora_state_sumsq(mt_lora_state *s, float *out) { s->be->sumsq(s->be, out, s->grads, s->n); }

void mt_lora_state_update(mt_lora_state *s, const mt_adamw_hparams *hp, int64_t step,
                          float grad_scale) {
    mt_optim_step a = {.lr = hp->lr, .beta1 = hp->beta1, .beta2 = hp->beta2, .eps = hp->eps,
                       .weight_decay = hp->weight_decay, .step = step, .grad_scale = grad_scale};
    if (s->n) s->be->optim_update(s->be, &s->a, &a, 0, s->n, s->grads, MT_F32);
}

void mt_lora_state_get(mt_lora_state *s, float *weights, float *exp_avg, float *exp_avg_sq) {
    mt_backend *be = s->be;
    be->sync(be);
    size_t bytes = s->n * sizeof(float);
    if (weights) be->download(be, weights, s->a.master, bytes);
    if (exp_avg) be->download(be, exp_avg, s->a.m, bytes);
    if (exp_avg_sq) be->download(be, exp_avg_sq, s->a.v, bytes);
}

void mt_lora_state_set(mt_lora_state *s, const float *weights, const float *exp_avg,
                       const float *exp_avg_sq) {
    mt_backend *be = s->be;
    be->sync(be);
    size_t bytes = s->n * sizeof(float);
    if (weights) {
        be->upload(be, s->a.master, weights, bytes);
        be->from_f32(be, s->a.w, s->a.master, s->n);
    }
    if (exp_avg) be->upload(be, s->a.m, exp_avg, bytes);
    if (exp_avg_sq) be->upload(be, s->a.v, exp_avg_sq, bytes);
    be->sync(be);
}
