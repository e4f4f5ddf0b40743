/* megatrain train: the training loop around the streaming engine. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../backend/backend.h"
#include "../core/error.h"
#include "../engine/engine.h"
#include "../engine/lr.h"
#include "../io/byte_text.h"
#include "../io/checkpoint.h"
#include "../io/model_io.h"
#include "../io/tokens.h"
#include "commands.h"
#include "model_source.h"
#include "run_data.h"
#include "run_setup.h"
#include "train_log.h"
#include "train_opts.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) { stop_requested = sig; }

static void install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* The process's resident set now, in GB (-1 when /proc is not there). */
static double resident_gb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long long size = 0, resident = -1;
    if (f) {
        if (fscanf(f, "%lld %lld", &size, &resident) != 2) resident = -1;
        fclose(f);
    }
    return resident < 0 ? -1 : (double)resident * (double)sysconf(_SC_PAGESIZE) / 1e9;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

typedef struct {
    mt_train_opts o;
    mt_host_model model;   /* the table (weights live in the engine) */
    mt_backend *be;
    mt_engine *e;
    mt_run_data data, eval;
    int docs_set;          /* the engine holds document starts (packed rows) */
    mt_train_log log;
    char *args_json;
    int64_t step;          /* steps completed */
    double last_loss;
    int saved_layers;      /* layers whose backward skips the recompute (for the MFU) */
} train_run;

static int save_checkpoint(train_run *r) {
    mt_engine_finish(r->e);
    if (r->o.no_save) return MT_OK;
    mt_ckpt_state st = {.step = r->step, .seed = (uint64_t)r->o.seed, .loss = r->last_loss};
    double t0 = now_ms();
    MT_TRY(mt_checkpoint_save(r->o.out_dir, &r->model.table, mt_engine_master(r->e),
                              mt_engine_moment1(r->e), mt_engine_moment2(r->e), &st, r->args_json,
                              r->o.model_dir, (int)r->o.keep));
    mt_train_log_note(&r->log, "saved %s/checkpoints/step_%08lld (%.1f s)", r->o.out_dir,
                      (long long)r->step, (now_ms() - t0) / 1e3);
    return MT_OK;
}

/* Packed rows come with document starts; token data is one document per row. */
static void use_documents(train_run *r, const int32_t *doc_start) {
    if (!doc_start && !r->docs_set) return;
    MT_CHECK(mt_engine_set_documents(r->e, doc_start) == MT_OK, "%s", mt_error_message());
    r->docs_set = doc_start != NULL;
}

static void evaluate(train_run *r) {
    int B = (int)r->o.batch, T = (int)r->o.seq;
    int64_t rows = mt_run_data_eval_rows(&r->eval, T);
    int64_t batches = (rows + B - 1) / B;
    if (batches > r->o.eval_batches) batches = r->o.eval_batches;
    int32_t *in = mt_malloc((size_t)B * T * sizeof(int32_t)), *tg = mt_malloc((size_t)B * T * sizeof(int32_t));
    double sum = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < batches; i++) {
        use_documents(r, mt_run_data_eval_batch(&r->eval, i * B, B, T, in, tg));
        int64_t c;
        sum += mt_engine_eval(r->e, in, tg, B, &c);
        count += c;
    }
    free(in), free(tg);
    mt_train_log_eval(&r->log, r->step, count ? sum / count : NAN, count);
}

/* Matmul FLOPs one step executes: every layer's projections forward, again in the recompute
 * (layers without saved internals), twice in the backward; the LM head forward and its two
 * backward products; causal attention (QK^T and PV forward, recomputed likewise, and 2.5x that
 * backward) counting only the visible half. */
static double step_matmul_flops(const mt_config *c, double tokens, int T, int saved_layers) {
    double layer = 2.0 * ((double)c->C * c->H * c->D * 2 + (double)c->C * c->G * c->D * 2 + 3.0 * c->C * c->F);
    double attn = 4.0 * (T / 2.0) * c->H * c->D;
    return tokens * (c->L * (layer * 3 + attn * 3.5) + (c->L - saved_layers) * (layer + attn) +
                     2.0 * c->C * c->V * 3);
}

#define H200_GEMM_PEAK 800e12 /* bf16 dense GEMM measured on the H200 (HARDWARE.md) */

static int train_loop(train_run *r) {
    const mt_train_opts *o = &r->o;
    int B = (int)o->batch, T = (int)o->seq;
    mt_lr_schedule sched = {.kind = (mt_lr_kind)o->schedule, .max_lr = o->lr, .min_lr = o->min_lr,
                            .warmup = o->warmup, .total = o->steps};
    mt_batch_order order = {.shuffle = !o->no_shuffle, .seed = (uint64_t)o->seed};
    int32_t *in = mt_malloc((size_t)B * T * sizeof(int32_t)), *tg = mt_malloc((size_t)B * T * sizeof(int32_t));
    double n_params = (double)r->model.table.n_real, t_start = now_ms();
    int64_t tokens = r->step * (int64_t)B * T;
    int rc = MT_OK;
    int64_t last = o->stop_at && o->stop_at < o->steps ? o->stop_at : o->steps;
    while (r->step < last && !stop_requested) {
        if (o->max_ms && now_ms() - t_start > (double)o->max_ms) {
            mt_train_log_note(&r->log, "--max-time reached after %lld steps", (long long)r->step);
            break;
        }
        /* keep the timeline of the last two steps: the last one and the optimizer run it overlaps */
        if (o->trace_path) mt_trace_drop_before(mt_engine_trace(r->e), (int)r->step - 1);
        double t0 = now_ms();
        use_documents(r, mt_run_data_batch(&r->data, &order, r->step, B, T, in, tg));
        mt_adamw_hparams hp = {.lr = mt_lr_at(&sched, r->step), .beta1 = o->beta1, .beta2 = o->beta2,
                               .eps = o->eps, .weight_decay = o->weight_decay};
        mt_step_result res;
        mt_engine_step(r->e, in, tg, &hp, r->step + 1, o->clip, &res);
        double ms = now_ms() - t0;
        r->step++;
        tokens += (int64_t)B * T;
        r->last_loss = res.loss;
        double sec = ms / 1e3;
        mt_step_line line = {.step = r->step, .loss = res.loss, .lr = hp.lr, .grad_norm = res.grad_norm,
                             .clip_coef = res.clip_coef, .ms = ms, .tokens = tokens, .targets = res.count,
                             .tok_per_s = B * T / sec,
                             .tflops = 6.0 * n_params * B * T / sec / 1e12,
                             .mfu = step_matmul_flops(&r->model.table.cfg, (double)B * T, T, r->saved_layers) / sec /
                                    H200_GEMM_PEAK,
                             .h2d_gbs = res.h2d_bytes / sec / 1e9,
                             .d2h_gbs = res.d2h_bytes / sec / 1e9,
                             .gpu_busy = res.compute_ms >= 0 ? res.compute_ms / ms : -1,
                             .opt_ms = res.opt_ms,
                             .gpu_gb = r->be->mem_used ? r->be->mem_used(r->be) / 1e9 : -1,
                             .host_gb = resident_gb()};
        mt_train_log_step(&r->log, &line);
        if (!isfinite(res.loss)) {
            rc = mt_error_set("step %lld: the loss is %g; stopping (lower --lr, or check the data)",
                              (long long)r->step, res.loss);
            break;
        }
        if (o->eval_data && o->eval_every && r->step % o->eval_every == 0) evaluate(r);
        if (o->save_every && r->step % o->save_every == 0 && r->step < o->steps)
            if ((rc = save_checkpoint(r)) != MT_OK) break;
    }
    free(in), free(tg);
    if (rc != MT_OK) return rc;
    if (stop_requested)
        mt_train_log_note(&r->log, "%s: stopping after step %lld", stop_requested == SIGINT ? "SIGINT" : "SIGTERM",
                          (long long)r->step);
    if (o->eval_data && (!o->eval_every || r->step % o->eval_every != 0)) evaluate(r);
    return save_checkpoint(r);
}

static void train_run_free(train_run *r) {
    mt_engine_destroy(r->e);
    if (r->be) r->be->destroy(r->be);
    mt_run_data_close(&r->data);
    mt_run_data_close(&r->eval);
    mt_train_log_close(&r->log);
    mt_host_model_free(&r->model);
    free(r->args_json);
}

static int readable_file(const char *flag, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return mt_error_set("%s %s: cannot open: %s", flag, path, strerror(errno));
    fclose(f);
    return MT_OK;
}

static int train(train_run *r) {
    mt_train_opts *o = &r->o;
    MT_TRY(mt_host_model_open(&r->model, o->model_dir, o->init_config, (uint64_t)o->seed, 0));
    const mt_config *cfg = &r->model.table.cfg;
    if (!o->have_seq) o->seq = mt_plan_default_seq(cfg);
    MT_TRY(mt_run_check_seq(cfg, (int)o->seq, "--seq"));
    /* a missing data file is refused before --out is created, so a typo leaves nothing behind */
    MT_TRY(readable_file("--data", o->data));
    if (o->eval_data) MT_TRY(readable_file("--eval-data", o->eval_data));
    MT_TRY(mt_run_make_dir(o->out_dir));
    mt_run_data_opts dopts = {.out_dir = o->out_dir, .model_dir = o->model_dir, .doc_sep = o->doc_sep,
                              .T = (int)o->seq, .chat_format = (mt_chat_format)o->chat_format,
                              .loss_on = (mt_chat_loss_on)o->loss_on, .long_policy = (mt_long_policy)o->long_policy,
                              .pack = (mt_pack_policy)o->pack_policy,
                              .chat_flags = o->have_chat_flags};
    MT_TRY(mt_run_data_open(&r->data, o->data, &dopts, cfg));
    if (o->eval_data) MT_TRY(mt_run_data_open(&r->eval, o->eval_data, &dopts, cfg));
    MT_TRY(mt_run_backend(&r->be, o->device, o->gpu_mem));

    mt_plan_request rq = {.batch = (int)o->batch, .T = (int)o->seq, .micro_batch = (int)o->micro_batch,
                          .offload = o->offload ? 1 : MT_AUTO, .saved_layers = (int)o->saved_layers,
                          .resident = o->resident == 1 ? 1 : o->resident == 2 ? 0 : MT_AUTO,
                          .n_slots = 2, .gpu_mem = o->gpu_mem, .host_available = mt_run_host_available()};
    mt_engine_opts eo;
    MT_TRY(mt_run_check_memory(&r->model.table, r->be, &rq, &eo));
    eo.opt_threads = (int)o->threads;
    eo.trace = o->trace_path != NULL;
    o->micro_batch = eo.micro_batch; /* resolved: for the header and the stored arguments */
    r->saved_layers = eo.saved_layers;
    r->e = mt_engine_create(&r->model.table, r->be, &eo, NULL);
    float *master = mt_engine_master(r->e);

    char latest[4096];
    if (o->resume && mt_checkpoint_latest(o->out_dir, latest, sizeof latest) == MT_OK) {
        mt_ckpt_state st;
        MT_TRY(mt_checkpoint_load(latest, &r->model.table, master, mt_engine_moment1(r->e),
                                  mt_engine_moment2(r->e), &st));
        r->step = st.step;
        printf("resuming from %s (step %lld)\n", latest, (long long)st.step);
    } else {
        if (o->resume) printf("--resume: no checkpoint in %s yet; starting at step 0\n", o->out_dir);
        if (o->model_dir) MT_TRY(mt_model_load(&r->model.table, master, o->model_dir));
        else mt_param_init(&r->model.table, master, cfg->initializer_range, (uint64_t)o->seed);
    }
    mt_engine_refresh_upload(r->e);
    r->args_json = mt_train_opts_json(o);
    MT_TRY(mt_train_log_open(&r->log, o->out_dir, o->log_path, o->steps, r->step > 0));
    char data_desc[256];
    mt_run_data_describe(&r->data, data_desc, sizeof data_desc);
    printf("training %.1fM parameters on %s: %lld steps of %lld x %lld tokens (micro-batch %lld), "
           "data %s (%s)\n",
           r->model.table.n_real / 1e6, r->be->name, (long long)o->steps, (long long)o->batch,
           (long long)o->seq, (long long)o->micro_batch, o->data, data_desc);
    install_signals();
    int rc = train_loop(r);
    if (o->trace_path && rc == MT_OK) rc = mt_trace_write_json(mt_engine_trace(r->e), o->trace_path);
    return rc;
}

int mt_cmd_train(int argc, char **argv) {
    train_run r;
    memset(&r, 0, sizeof r);
    int exit_now;
    if (mt_train_opts_parse(&r.o, argc, argv, &exit_now) != MT_OK) {
        fprintf(stderr, "megatrain: %s\n", mt_error_message());
        return 1;
    }
    if (exit_now) return 0;
    int rc = train(&r);
    train_run_free(&r);
    return rc == MT_OK ? 0 : mt_cli_fail();
}
