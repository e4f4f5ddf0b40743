#include "optimizer.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/error.h"
#include "train_state.h"

struct mt_optimizer {
    const mt_param_table *t;
    mt_train_state *st;
    mt_backend *be;
    mt_trace *trace;
    int delay_us;
    double last_ms;           /* wall time of the last completed update */

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* the job: set by start, consumed by the thread */
    int pending, running, stop;
    int groups_done;          /* of the running step, in order embed, layers, head */
    double *group_t0;         /* [group index]: when its update began (its trace span) */
    mt_adamw_hparams hp;
    int64_t step;
    int restore;              /* the job restores the groups instead (a skip) */
    float grad_scale;
    mt_event *grads_ready;
};

/* Group order index: 0 embed, 1..L layers, L+1 head. */
static int group_index(const mt_param_table *t, int layer) { return layer + 1; }

static void *optimizer_main(void *arg) {
    mt_optimizer *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->pending && !o->stop) pthread_cond_wait(&o->cv, &o->mu);
        if (o->stop) break;
        o->pending = 0;
        pthread_mutex_unlock(&o->mu);

        o->be->event_sync(o->be, o->grads_ready);
        double start = mt_trace_wall_ms();
        int L = o->t->cfg.L;
        mt_train_state_begin_update(o->st);
        for (int layer = -1; layer <= L; layer++) {
            o->group_t0[group_index(o->t, layer)] = mt_trace_now(o->trace);
            if (o->delay_us) usleep((useconds_t)o->delay_us); /* before: it is done inside */
            if (o->restore) mt_train_state_restore_group(o->st, layer);
            else mt_train_state_update_group(o->st, layer, &o->hp, o->step, o->grad_scale);
        }
        mt_train_state_end_update(o->st);
        pthread_mutex_lock(&o->mu);
        o->last_ms = mt_trace_wall_ms() - start;
        o->running = 0;
        pthread_cond_broadcast(&o->cv);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

/* The train state's word that a group is done: its span ends (a streamed group's overlaps the
 * next group's start) and the next forward may read it. */
static void group_done(void *ctx, int layer) {
    mt_optimizer *o = ctx;
    mt_trace_add(o->trace, MT_SPAN_OPTIMIZER, MT_LANE_OPT, (int)o->step - 1, layer,
                 o->group_t0[group_index(o->t, layer)], mt_trace_now(o->trace));
    pthread_mutex_lock(&o->mu);
    o->groups_done = group_index(o->t, layer) + 1;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

mt_optimizer *mt_optimizer_create(const mt_param_table *t, mt_train_state *st, mt_backend *be,
                                  mt_trace *trace) {
    mt_optimizer *o = mt_calloc(1, sizeof *o);
    *o = (mt_optimizer){.t = t, .st = st, .be = be, .trace = trace};
    o->group_t0 = mt_calloc((size_t)t->cfg.L + 2, sizeof *o->group_t0);
    mt_train_state_on_group_done(st, group_done, o);
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    MT_CHECK(pthread_create(&o->thread, NULL, optimizer_main, o) == 0, "cannot start the optimizer thread");
    return o;
}

void mt_optimizer_destroy(mt_optimizer *o) {
    if (!o) return;
    mt_optimizer_wait_all(o);
    pthread_mutex_lock(&o->mu);
    o->stop = 1;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    pthread_join(o->thread, NULL);
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    free(o->group_t0);
    free(o);
}

static void start_job(mt_optimizer *o, const mt_adamw_hparams *hp, int64_t step, float grad_scale,
                      int restore, mt_event *grads_ready) {
    mt_optimizer_wait_all(o);
    pthread_mutex_lock(&o->mu);
    o->hp = *hp;
    o->step = step;
    o->restore = restore;
    o->grad_scale = grad_scale;
    o->grads_ready = grads_ready;
    o->groups_done = 0;
    o->running = 1;
    o->pending = 1;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

void mt_optimizer_start(mt_optimizer *o, const mt_adamw_hparams *hp, int64_t step,
                        float grad_scale, mt_event *grads_ready) {
    start_job(o, hp, step, grad_scale, 0, grads_ready);
}

void mt_optimizer_skip(mt_optimizer *o, int64_t step, mt_event *grads_ready) {
    mt_adamw_hparams none = {0};
    start_job(o, &none, step, 0.0f, 1, grads_ready);
}

void mt_optimizer_wait_group(mt_optimizer *o, int layer) {
    int want = group_index(o->t, layer) + 1;
    pthread_mutex_lock(&o->mu);
    while (o->running && o->groups_done < want) pthread_cond_wait(&o->cv, &o->mu);
    pthread_mutex_unlock(&o->mu);
}

void mt_optimizer_wait_all(mt_optimizer *o) {
    pthread_mutex_lock(&o->mu);
    while (o->running) pthread_cond_wait(&o->cv, &o->mu);
    pthread_mutex_unlock(&o->mu);
}

void mt_optimizer_set_delay_us(mt_optimizer *o, int us) { o->delay_us = us; }

double mt_optimizer_last_ms(mt_optimizer *o) {
    pthread_mutex_lock(&o->mu);
    double ms = o->last_ms;
    pthread_mutex_unlock(&o->mu);
    return ms;
}
