/* megatrain bench adamw: the CPU AdamW update rate (Gparam/s) and the memory traffic it moves
 * (GB/s), for the dispatched ISA path and for the plain C path beside it, per state format.
 * Bytes counted per parameter, the gradient read (4 or 2) included:
 *   --state full (default): param, m, v read and written (24), the bf16 upload written (2):
 *     30 with fp32 gradients, 28 with bf16 ones. With --alias the gradient buffer receives the
 *     upload (bf16 only), as in the engine.
 *   --state compact: bf16 master, compensation, 8-bit m and v read and written (12), and the
 *     two fp32 scales per 256 (16/256): 16.06 / 14.06.
 *   --state tight: bf16 master, 8-bit m and v (8) and the scales: 12.06 / 10.06.
 * --pattern training --model CONFIG: the engine's own update of that model instead (its
 * optimizer thread, train state and update calls: runs of same-decay tensors, <= 64M elements,
 * one parallel region each), timed as training times it (mt_optimizer_last_ms), beside one call
 * over as many parameters. The gradients wait in host memory (--device cpu, the default) or, for
 * compact and tight, on the GPU and are fetched piece by piece as in training (--device cuda);
 * the weights' arena is the backend's host memory (pinned on cuda). What this leaves out of
 * training: the forward and backward running beside the update. */
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/error.h"
#include "../engine/optimizer.h"
#include "../engine/train_state.h"
#include "../model/params.h"
#include "../optim/adamw.h"
#include "../optim/state.h"
#include "args.h"
#include "commands.h"
#include "run_setup.h"

int mt_bench_adamw(int argc, char **argv);

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    float *p, *m, *v, *gf;
    mt_bf16 *gh, *up;
    size_t n;
    int bf16_grad, alias, threads;
} bench_bufs;

/* Best time of `reps` updates (after one warm-up), in seconds. */
static double time_updates(bench_bufs *b, int reps) {
    double best = 1e30;
    for (int r = 0; r <= reps; r++) {
        mt_adamw_step_args a = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                .weight_decay = 0.1, .step = r + 1, .grad_scale = 0.5f};
        double t0 = now_s();
        if (b->bf16_grad)
            mt_adamw_update_bf16(&a, b->p, b->m, b->v, b->gh, b->n, b->alias ? b->gh : b->up,
                                 MT_BF16, b->threads);
        else
            mt_adamw_update(&a, b->p, b->m, b->v, b->gf, b->n, b->up, MT_BF16, b->threads);
        double t = now_s() - t0;
        if (r > 0 && t < best) best = t;
    }
    return best;
}

static void usage(void) {
    fprintf(stderr, "usage: megatrain bench adamw [--state full|compact|tight] [--params N] "
                    "[--threads K] [--grad f32|bf16] [--alias] [--reps R] [--no-scalar]\n"
                    "       megatrain bench adamw --pattern training --model CONFIG.json "
                    "[--device cpu|cuda] [--state S] [--threads K] [--grad f32|bf16] [--reps R]\n"
                    "                         [--update-on host|gpu]  (gpu: train --update-on gpu's "
                    "streamed update; --device cuda, compact or tight)\n");
}

/* Best time of `reps` updates of the whole state (after one warm-up), in seconds. */
static double time_state_updates(mt_optim_state *s, const void *grad, mt_dtype gt, int threads,
                                 int reps) {
    double best = 1e30;
    size_t n = mt_optim_state_numel(s);
    for (int r = 0; r <= reps; r++) {
        mt_optim_step a = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                           .weight_decay = 0.1, .step = r + 1, .grad_scale = 0.5f};
        double t0 = now_s();
        if (mt_optim_state_update(s, &a, 0, n, grad, gt, threads)) return -1;
        double t = now_s() - t0;
        if (r > 0 && t < best) best = t;
    }
    return best;
}

/* --state compact|tight: the src/optim kernels */
static int bench_state(mt_state_format f, size_t n, int threads, int bf16_grad, int reps,
                       int scalar) {
    double per = (f == MT_STATE_COMPACT ? 12.0 : 8.0) + 16.0 / MT_OPTIM_BLOCK;
    double gb = n * (per + (bf16_grad ? 2 : 4)) / 1e9;
    printf("adamw --state %s: %zu params, %.2f GB state (%.5g B/param) + %.2f GB grad, %d threads, "
           "%s grad\n", mt_state_format_name(f), n, mt_optim_state_bytes(f, n) / 1e9,
           mt_optim_bytes_per_param(f), n * (bf16_grad ? 2.0 : 4.0) / 1e9, threads,
           bf16_grad ? "bf16" : "f32");
    mt_optim_state *s = mt_optim_state_create(f, n, 1, NULL);
    float *w = mt_aligned_alloc(n * 4);
    void *grad = mt_aligned_alloc(n * (bf16_grad ? 2 : 4));
    float *gf = grad;
    mt_bf16 *gh = grad;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; i++) {
        w[i] = 0.01f * (float)(i % 97);
        float g = 1e-3f * (float)(i % 89) - 0.04f;
        if (bf16_grad) gh[i] = mt_f32_to_bf16(g);
        else gf[i] = g;
    }
    mt_optim_state_set_weights(s, 0, w, n);
    free(w);
    int rc = 0;
    mt_adamw_isa best = mt_adamw_isa_active();
    for (int pass = 0; pass < 1 + (scalar && best != MT_ADAMW_SCALAR); pass++) {
        mt_adamw_isa isa = pass ? MT_ADAMW_SCALAR : best;
        if ((rc = mt_adamw_set_isa(isa))) break;
        double t = time_state_updates(s, grad, bf16_grad ? MT_BF16 : MT_F32, threads, reps);
        if (t < 0) { rc = MT_ERR; break; }
        printf("  %-7s %6.3f Gparam/s  %6.1f GB/s  (%.1f ms per update)\n",
               mt_adamw_isa_name(isa), n / t / 1e9, gb / t, t * 1e3);
    }
    if (!rc) rc = mt_adamw_set_isa(best);
    mt_optim_state_free(s);
    free(grad);
    return rc ? mt_cli_fail() : 0;
}

/* --state full: adamw.h's kernels on plain buffers */
static int bench_full(size_t nn, int threads, int grad_kind, int alias, int reps, int scalar) {
    bench_bufs b = {.n = nn, .bf16_grad = grad_kind, .alias = alias, .threads = threads};
    double gb = nn * (24.0 + (grad_kind ? 2 : 4) + 2) / 1e9;
    printf("adamw: %zu params, %.2f GB state+grad+upload, %d threads, %s grad%s\n", nn,
           nn * (12.0 + (grad_kind ? 2 : 4) + (alias ? 0 : 2)) / 1e9, threads,
           grad_kind ? "bf16" : "f32", alias ? ", upload aliases grad" : "");
    b.p = mt_aligned_alloc(nn * 4);
    b.m = mt_aligned_alloc(nn * 4);
    b.v = mt_aligned_alloc(nn * 4);
    b.gf = grad_kind ? NULL : mt_aligned_alloc(nn * 4);
    b.gh = grad_kind ? mt_aligned_alloc(nn * 2) : NULL;
    b.up = alias ? NULL : mt_aligned_alloc(nn * 2);
    /* first touch in parallel, so pages spread as the update's threads will use them */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < nn; i++) {
        b.p[i] = 0.01f * (float)(i % 97);
        b.m[i] = 0.0f;
        b.v[i] = 0.0f;
        if (b.gf) b.gf[i] = 1e-3f * (float)(i % 89) - 0.04f;
        if (b.gh) b.gh[i] = mt_f32_to_bf16(1e-3f * (float)(i % 89) - 0.04f);
        if (b.up) b.up[i] = 0;
    }
    mt_adamw_isa best = mt_adamw_isa_active();
    for (int pass = 0; pass < 1 + (scalar && best != MT_ADAMW_SCALAR); pass++) {
        mt_adamw_isa isa = pass ? MT_ADAMW_SCALAR : best;
        if (mt_adamw_set_isa(isa)) return mt_cli_fail();
        double t = time_updates(&b, reps);
        printf("  %-7s %6.3f Gparam/s  %6.1f GB/s  (%.1f ms per update)\n", mt_adamw_isa_name(isa),
               nn / t / 1e9, gb / t, t * 1e3);
    }
    if (mt_adamw_set_isa(best)) return mt_cli_fail();
    free(b.p); free(b.m); free(b.v); free(b.gf); free(b.gh); free(b.up);
    return 0;
}

/* ---- --pattern training ---- */

/* The gradient every tensor's update reads: the pattern of the other benches in the tensors'
 * elements, zero in the padding between them (as the backward leaves it). */
static void fill_grads(const mt_param_table *t, mt_backend *be, mt_train_state *st, void *stage) {
    size_t el = mt_dtype_size(be->dtype);
    for (int layer = MT_GROUP_EMBED; layer <= t->cfg.L; layer++) {
        void *host = mt_train_state_grad_host(st, layer), *dev = mt_train_state_grad_dev(st, layer);
        int64_t goff = mt_group_offset(t, layer), gn = mt_group_size(t, layer);
        char *dst = host ? host : stage;
        memset(dst, 0, (size_t)gn * el);
        for (int k = 0; k < t->n_params; k++) {
            const mt_param *p = &t->params[k];
            if (p->layer != layer) continue;
            char *g = dst + (size_t)(p->offset - goff) * el;
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < p->numel; i++) {
                float v = 1e-3f * (float)(i % 89) - 0.04f;
                if (be->dtype == MT_BF16) ((mt_bf16 *)g)[i] = mt_f32_to_bf16(v);
                else ((float *)g)[i] = v;
            }
        }
        if (!host) be->upload(be, dev, stage, (size_t)gn * el);
    }
}

/* Best and mean wall time of `reps` training updates (after one warm-up), in ms. */
static void time_training(const mt_param_table *t, mt_backend *be, mt_train_state *st,
                          void *stage, int host_grads, int reps, double *best, double *mean) {
    mt_optimizer *o = mt_optimizer_create(t, st, be, NULL);
    mt_event *ready = be->event_create(be);
    const mt_adamw_hparams hp = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                 .weight_decay = 0.1};
    *best = 1e30;
    *mean = 0;
    for (int r = 0; r <= reps; r++) {
        /* full: the gradient waits in the upload copy, which the update overwrites */
        if (r == 0 || host_grads) fill_grads(t, be, st, stage);
        be->event_record(be, ready, MT_STREAM_COMPUTE);
        mt_optimizer_start(o, &hp, r + 1, 0.5f, ready);
        mt_optimizer_wait_all(o);
        double ms = mt_optimizer_last_ms(o);
        if (r > 0) {
            *best = ms < *best ? ms : *best;
            *mean += ms / reps;
        }
    }
    be->event_destroy(be, ready);
    mt_optimizer_destroy(o);
}

static int bench_training(mt_state_format f, const char *model, int device, int threads,
                          int bf16_grad, int reps, int update_on_gpu) {
    mt_config cfg;
    if (mt_arg_named("--model", mt_config_load(&cfg, model))) return mt_cli_fail();
    mt_param_table t;
    mt_param_table_init(&t, &cfg);
    mt_backend *be;
    if (mt_run_backend(&be, device, 0)) {
        mt_param_table_free(&t);
        return mt_cli_fail();
    }
    int cuda = device == 2;
    if (update_on_gpu && !(cuda && f != MT_STATE_FULL)) {
        be->destroy(be);
        mt_param_table_free(&t);
        mt_error_set("--update-on gpu: needs --device cuda and --state compact or tight");
        return mt_cli_fail();
    }
    if (cuda && !bf16_grad) {
        be->destroy(be);
        mt_param_table_free(&t);
        mt_error_set("--device cuda: the gradients are bf16 there (--grad bf16)");
        return mt_cli_fail();
    }
    /* the cpu backend computes in fp32; nothing here computes, and its dtype is the gradients' */
    be->dtype = bf16_grad ? MT_BF16 : MT_F32;
    size_t n = (size_t)t.total;
    printf("adamw --pattern training: %s, %zu parameters (%lld with padding), --state %s, "
           "%d threads, %s grad, %s\n", model, (size_t)t.n_real, (long long)t.total,
           mt_state_format_name(f), threads, bf16_grad ? "bf16" : "f32",
           update_on_gpu ? "gradients on the GPU, the state streamed through it (--update-on gpu)"
           : cuda       ? "gradients on the GPU, fetched piece by piece"
                        : "gradients in host memory");
    /* one call over as many parameters first (freed before the engine's state is made) */
    int rc = 0;
    /* full: the gradient in the upload copy (--alias) when both are bf16, as in the engine */
    rc = f == MT_STATE_FULL ? bench_full(n, threads, bf16_grad, bf16_grad, reps, 0)
                            : bench_state(f, n, threads, bf16_grad, reps, 0);
    if (rc) {
        be->destroy(be);
        mt_param_table_free(&t);
        return rc;
    }
    mt_train_state_opts so = {.format = f, .gpu_layers = 0,
                              .grads_on_device = cuda && f != MT_STATE_FULL, .seed = 1,
                              .n_threads = threads, .update_on_device = update_on_gpu};
    mt_train_state *st = mt_train_state_create(&t, be, &so);
    void *stage = mt_aligned_alloc((size_t)mt_group_max_size(&t) * mt_dtype_size(be->dtype));
    double best, mean;
    time_training(&t, be, st, stage, !so.grads_on_device, reps, &best, &mean);
    printf("  training %6.3f Gparam/s  (%.1f ms per update, mean %.1f; %d groups, %d update "
           "calls, one parallel region each)\n", n / (best * 1e-3) / 1e9, best, mean,
           t.cfg.L + 2, mt_train_state_n_pieces(st));
    free(stage);
    mt_train_state_free(st);
    be->destroy(be);
    mt_param_table_free(&t);
    return 0;
}

int mt_bench_adamw(int argc, char **argv) {
    int64_t n = 64ll << 20, threads = omp_get_max_threads(), reps = 5;
    int grad_kind = 0, alias = 0, scalar = 1, state = MT_STATE_FULL, pattern = 0, device = 0;
    int params_given = 0, update_on = 0;
    const char *model = NULL;
    static const struct option opts[] = {
        {"state", required_argument, 0, 'S'},  {"pattern", required_argument, 0, 'P'},
        {"model", required_argument, 0, 'm'},  {"device", required_argument, 0, 'd'},
        {"params", required_argument, 0, 'n'}, {"threads", required_argument, 0, 't'},
        {"grad", required_argument, 0, 'g'},   {"alias", no_argument, 0, 'a'},
        {"reps", required_argument, 0, 'r'},   {"no-scalar", no_argument, 0, 's'},
        {"update-on", required_argument, 0, 'u'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 'S': if (mt_arg_choice("--state", optarg, "full|compact|tight", &state)) return mt_cli_fail(); break;
        case 'n': if (mt_arg_int("--params", optarg, 1, 1ll << 40, &n)) return mt_cli_fail(); params_given = 1; break;
        case 'P': if (mt_arg_choice("--pattern", optarg, "one|training", &pattern)) return mt_cli_fail(); break;
        case 'm': model = optarg; break;
        case 'd': {
            int d;
            if (mt_arg_choice("--device", optarg, "cpu|cuda", &d)) return mt_cli_fail();
            device = d + 1; /* mt_run_backend: 1 cpu, 2 cuda */
            break;
        }
        case 't': if (mt_arg_int("--threads", optarg, 1, 4096, &threads)) return mt_cli_fail(); break;
        case 'g': if (mt_arg_choice("--grad", optarg, "f32|bf16", &grad_kind)) return mt_cli_fail(); break;
        case 'r': if (mt_arg_int("--reps", optarg, 1, 1000, &reps)) return mt_cli_fail(); break;
        case 'a': alias = 1; break;
        case 's': scalar = 0; break;
        case 'u': if (mt_arg_choice("--update-on", optarg, "host|gpu", &update_on)) return mt_cli_fail(); break;
        default: usage(); return c == 'h' ? 0 : 1;
        }
    }
    if (alias && !grad_kind) {
        mt_error_set("--alias needs --grad bf16 (the upload is bf16)");
        return mt_cli_fail();
    }
    if (alias && state != MT_STATE_FULL) {
        mt_error_set("--alias is for --state full (compact and tight upload their bf16 master)");
        return mt_cli_fail();
    }
    if (pattern != (model != NULL)) {
        mt_error_set(pattern ? "--pattern training needs --model CONFIG.json (the model whose "
                               "update calls it runs)"
                             : "--model is for --pattern training");
        return mt_cli_fail();
    }
    if (!pattern && device) {
        mt_error_set("--device is for --pattern training");
        return mt_cli_fail();
    }
    if (pattern && (alias || params_given)) {
        mt_error_set("--pattern training takes its size from --model (no --params) and places "
                     "the gradients as training does (no --alias)");
        return mt_cli_fail();
    }
    if (pattern)
        return bench_training((mt_state_format)state, model, device ? device : 1, (int)threads,
                              grad_kind, (int)reps, update_on);
    if (update_on) {
        mt_error_set("--update-on gpu: with --pattern training only");
        return mt_cli_fail();
    }
    if (state != MT_STATE_FULL)
        return bench_state((mt_state_format)state, (size_t)n, (int)threads, grad_kind, (int)reps,
                           scalar);
    return bench_full((size_t)n, (int)threads, grad_kind, alias, (int)reps, scalar);
}
