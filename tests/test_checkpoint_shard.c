/* The per-rank checkpoint save (io/checkpoint.h: mt_checkpoint_begin, _write_shard, _finish),
 * with the ranks simulated in one process: rank r of N holds, of every group, the shard the
 * engine gives it (engine/train_state.h: [r*S, (r+1)*S) with S = mt_shard_size), read through an
 * mt_state_io that has owned / get_weights_range / parts_range over one whole test state.
 *  - N = 2, 3, 5 and every format (full, compact, tight): the ranks write in a scrambled order, and
 *    model.safetensors, optimizer.safetensors and config.json are byte for byte those of
 *    mt_checkpoint_save of the same state (at least one shard starts or ends inside a tensor);
 *    the checkpoint loads (checksums verified) into a state bitwise equal to the saved one;
 *  - until finish, OUT holds no step_ directory (a crash leaves none); abort removes the
 *    temporary directory;
 *  - a NaN in rank 1's part of a tensor fails rank 1's write naming the tensor;
 *  - a rank that cannot see the temporary directory fails naming the shared file system;
 *  - a frozen state (a LoRA base) is refused at finish, leaving no directory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "engine/train_state.h"
#include "io/checkpoint.h"
#include "model/params.h"
#include "util/state_io.h"
#include "util/run_compare.h"
#include "util/testutil.h"
#include "util/tiny_config.h"

/* ---- rank r's view of a whole state ---- */

typedef struct {
    mt_test_state *ts;
    const mt_param_table *t;
    int rank, ranks;
    mt_state_io io;
} rank_view;

static void view_owned(void *ctx, const mt_param *p, int64_t *lo, int64_t *hi) {
    const rank_view *v = ctx;
    int64_t S = mt_shard_size(mt_group_size(v->t, p->layer), v->ranks);
    int64_t a = mt_group_offset(v->t, p->layer) + v->rank * S, b = a + S;
    *lo = (a > p->offset ? a : p->offset) - p->offset;
    *hi = (b < p->offset + p->numel ? b : p->offset + p->numel) - p->offset;
    if (*hi <= *lo) *lo = *hi = 0;
}

static int view_weights(void *ctx, const mt_param *p, int64_t lo, int64_t n, float *dst) {
    const rank_view *v = ctx;
    mt_optim_state_get_weights(v->ts->s, (size_t)(p->offset + lo), dst, (size_t)n);
    return MT_OK;
}

static int view_parts(void *ctx, const mt_param *p, int64_t lo, int64_t hi, mt_optim_tensor *out) {
    const rank_view *v = ctx;
    mt_optim_arenas a = mt_optim_state_arenas(v->ts->s);
    return mt_optim_arenas_parts(&a, (size_t)(p->offset + lo), (size_t)(hi - lo), out);
}

static void view_init(rank_view *v, mt_test_state *ts, const mt_param_table *t, int rank, int ranks) {
    *v = (rank_view){.ts = ts, .t = t, .rank = rank, .ranks = ranks};
    v->io = ts->io; /* format, seed, whole-tensor calls for the one-rank save */
    v->io.ctx = v;
    v->io.owned = view_owned;
    v->io.get_weights_range = view_weights;
    v->io.parts_range = view_parts;
}

/* Shard boundaries of N ranks that fall strictly inside a tensor. */
static int inner_cuts(const mt_param_table *t, int ranks) {
    int n = 0;
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        int64_t S = mt_shard_size(mt_group_size(t, p->layer), ranks), g = mt_group_offset(t, p->layer);
        for (int r = 1; r < ranks; r++) {
            int64_t cut = g + r * S;
            n += cut > p->offset && cut < p->offset + p->numel;
        }
    }
    return n;
}

static void same_file(const char *a_dir, const char *b_dir, const char *name) {
    char pa[8192], pb[8192];
    snprintf(pa, sizeof pa, "%s/%s", a_dir, name);
    snprintf(pb, sizeof pb, "%s/%s", b_dir, name);
    mt_test_same_bytes(pa, pb);
}

/* Every rank's write, in the order given. */
static void write_all(const char *dir, const mt_param_table *t, mt_test_state *ts, int ranks, const int *order,
                      const char *out) {
    for (int k = 0; k < ranks; k++) {
        rank_view v;
        view_init(&v, ts, t, order[k], ranks);
        if (mt_checkpoint_write_shard(dir, t, &v.io, out, 9) != MT_OK) fail_msg("%s", mt_error_message());
    }
}

static void same_as_one_writer(mt_state_format f, int ranks) {
    mt_config cfg = mt_test_tiny_config("llama_gqa");
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    mt_test_state *ts = mt_test_state_create(f, &t, 77), *back = mt_test_state_create(f, &t, 0);
    mt_test_state_fill_random(ts, &t, 5 + (uint64_t)ranks);
    int cuts = inner_cuts(&t, ranks);
    assert_true(cuts > 0);

    char name[64];
    snprintf(name, sizeof name, "one_%s_%d", mt_state_format_name(f), ranks);
    char *one = mt_test_dir_sub(name);
    snprintf(name, sizeof name, "ranks_%s_%d", mt_state_format_name(f), ranks);
    char *out = mt_test_dir_sub(name);
    mt_ckpt_state st = {.step = 9, .seed = 3, .loss = 1.5, .updates = 8, .skipped = 1};
    const char *args = "{\"lr\": 0.001}";
    if (mt_checkpoint_save(one, &t, &ts->io, &st, args, NULL, 0) != MT_OK) fail_msg("%s", mt_error_message());

    mt_ckpt_writer *w;
    if (mt_checkpoint_begin(out, &t, f, 9, args, NULL, &w) != MT_OK) fail_msg("%s", mt_error_message());
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/checkpoints", out);
    int order[8];
    for (int k = 0; k < ranks; k++) order[k] = (k + 1) % ranks; /* rank 0 last */
    write_all(mt_checkpoint_writer_dir(w), &t, ts, ranks, order, out);
    assert_int_equal(mt_test_count_prefix(ck, "step_"), 0); /* nothing under a final name yet */
    rank_view v0;
    view_init(&v0, ts, &t, 0, ranks);
    if (mt_checkpoint_finish(w, &v0.io, &st, 0) != MT_OK) fail_msg("%s", mt_error_message());
    assert_int_equal(mt_test_count_prefix(ck, ".tmp-"), 0);

    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/checkpoints/step_00000009", one);
    snprintf(b, sizeof b, "%s/checkpoints/step_00000009", out);
    same_file(a, b, "model.safetensors");
    same_file(a, b, "optimizer.safetensors");
    same_file(a, b, "config.json");
    same_file(a, b, "trainer_state.json"); /* the same checksums too */
    mt_ckpt_state got = {0};
    if (mt_checkpoint_load(b, &t, &back->io, &got) != MT_OK) fail_msg("%s", mt_error_message());
    assert_true(mt_test_state_equal(ts, back, &t));
    assert_int_equal(got.step, 9);
    mt_ckpt_state_free(&got);
    printf("  %s, %d ranks (%d shard ends inside tensors): the one-writer bytes\n", mt_state_format_name(f),
           ranks, cuts);

    mt_test_rmtree(one);
    mt_test_rmtree(out);
    free(one);
    free(out);
    mt_test_state_free(ts);
    mt_test_state_free(back);
    mt_param_table_free(&t);
}

static void test_full(void **state) {
    for (int n = 2; n <= 5; n += n == 3 ? 2 : 1) same_as_one_writer(MT_STATE_FULL, n);
}
static void test_compact(void **state) {
    for (int n = 2; n <= 5; n += n == 3 ? 2 : 1) same_as_one_writer(MT_STATE_COMPACT, n);
}
static void test_tight(void **state) {
    for (int n = 2; n <= 5; n += n == 3 ? 2 : 1) same_as_one_writer(MT_STATE_TIGHT, n);
}

/* A failure on one rank: abort leaves nothing; NaN and an unseen directory are named. */
static void test_failures(void **state) {
    mt_config cfg = mt_test_tiny_config("llama_gqa");
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    mt_test_state *ts = mt_test_state_create(MT_STATE_FULL, &t, 0);
    mt_test_state_fill_random(ts, &t, 1);
    char *out = mt_test_dir_sub("fail");
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/checkpoints", out);

    /* NaN in an element that rank 1 of 2 holds: rank 0 writes, rank 1 refuses, the save aborts */
    const mt_param *p = &t.params[1];
    rank_view v1;
    view_init(&v1, ts, &t, 1, 2);
    int64_t lo, hi;
    view_owned(&v1, p, &lo, &hi);
    if (hi <= lo) p = &t.params[t.n_params - 1], view_owned(&v1, p, &lo, &hi);
    assert_true(hi > lo);
    mt_optim_arenas a = mt_optim_state_arenas(ts->s);
    a.master[p->offset + lo] = NAN;
    mt_ckpt_writer *w;
    mt_ckpt_state st = {.step = 9};
    assert_int_equal(mt_checkpoint_begin(out, &t, MT_STATE_FULL, 9, NULL, NULL, &w), MT_OK);
    rank_view v0;
    view_init(&v0, ts, &t, 0, 2);
    assert_int_equal(mt_checkpoint_write_shard(mt_checkpoint_writer_dir(w), &t, &v0.io, out, 9), MT_OK);
    assert_int_equal(mt_checkpoint_write_shard(mt_checkpoint_writer_dir(w), &t, &v1.io, out, 9), MT_ERR);
    printf("  rank 1: %s\n", mt_error_message());
    assert_non_null(strstr(mt_error_message(), "NaN or inf in tensor"));
    assert_non_null(strstr(mt_error_message(), p->name));
    mt_checkpoint_abort(w);
    assert_int_equal(mt_test_count_prefix(ck, "step_"), 0);
    assert_int_equal(mt_test_count_prefix(ck, ".tmp-"), 0);
    a.master[p->offset + lo] = 0.5f;

    /* a rank that does not see rank 0's directory */
    char *nowhere = mt_test_dir_sub("not_shared/.tmp-step_00000009.abc");
    assert_int_equal(mt_checkpoint_write_shard(nowhere, &t, &v1.io, out, 9), MT_ERR);
    printf("  unseen: %s\n", mt_error_message());
    assert_non_null(strstr(mt_error_message(), "all ranks see"));
    free(nowhere);

    /* the state finish records must be the step begun */
    assert_int_equal(mt_checkpoint_begin(out, &t, MT_STATE_FULL, 9, "{\"x\": ", NULL, &w), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "not valid JSON"));
    assert_int_equal(mt_test_count_prefix(ck, ".tmp-"), 0);
    (void)st;

    /* a frozen state (a LoRA base): finish refuses it by name and leaves nothing */
    mt_test_state *fz = mt_test_state_create(MT_STATE_FROZEN, &t, 0);
    assert_int_equal(mt_checkpoint_begin(out, &t, MT_STATE_FROZEN, 9, NULL, NULL, &w), MT_OK);
    assert_int_equal(mt_checkpoint_finish(w, &fz->io, &st, 0), MT_ERR);
    printf("  frozen: %s\n", mt_error_message());
    assert_non_null(strstr(mt_error_message(), "frozen"));
    assert_int_equal(mt_test_count_prefix(ck, "step_"), 0);
    assert_int_equal(mt_test_count_prefix(ck, ".tmp-"), 0);
    mt_test_state_free(fz);

    mt_test_rmtree(out);
    free(out);
    mt_test_state_free(ts);
    mt_param_table_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_compact),
        cmocka_unit_test(test_tight),
        cmocka_unit_test(test_failures),
    };
    return cmocka_run_group_tests(tests, mt_test_dir_setup, mt_test_dir_teardown);
}
