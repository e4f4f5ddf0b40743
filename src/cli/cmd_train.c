/* megatrain train: the training loop around the streaming engine. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../backend/backend.h"
#include "../core/error.h"
#include "../io/hf_layout.h"
#include "../model/layer.h"
#include "../engine/engine.h"
#include "../engine/flops.h"
#include "../engine/lr.h"
#include "data/byte_text.h"
#include "../io/checkpoint.h"
#include "../io/lora_checkpoint.h"
#include "../io/lora_io.h"
#include "../io/model_io.h"
#include "data/tokens.h"
#include "../model/moe.h"
#include "cached_base.h"
#include "commands.h"
#include "model_source.h"
#include "process_env.h"
#include "data/run_data.h"
#include "run_dir.h"
#include "run_ranks.h"
#include "run_setup.h"
#include "train_log.h"
#include "train_opts.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) { stop_requested = sig; }

/* A signal that kills the process while it writes a checkpoint says so (the save cannot finish;
 * its temporary directory stays until the next save or --resume removes it). saving_note is
 * written before each save; the handler only write()s it and dies of the signal as before. */
static volatile sig_atomic_t saving;
static char saving_note[4400];

static const char *signal_name(int sig) {
    switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGXCPU: return "SIGXCPU (the CPU-time limit, ulimit -t)";
    case SIGVTALRM: return "SIGVTALRM";
    case SIGPROF: return "SIGPROF";
    default: return "a signal";
    }
}

static void on_fatal(int sig) {
    if (saving) {
        const char *name = signal_name(sig);
        ssize_t ignored = write(STDERR_FILENO, "megatrain: ", 11);
        ignored = write(STDERR_FILENO, name, strlen(name));
        ignored = write(STDERR_FILENO, saving_note, strlen(saving_note));
        (void)ignored;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* the signals whose default is to end the process; one the caller ignores (nohup's SIGHUP)
     * stays ignored */
    static const int fatal[] = {SIGHUP, SIGQUIT, SIGPIPE, SIGALRM, SIGUSR1, SIGUSR2, SIGXCPU, SIGVTALRM, SIGPROF};
    sa.sa_handler = on_fatal;
    sa.sa_flags = SA_RESETHAND;
    for (size_t i = 0; i < sizeof fatal / sizeof *fatal; i++) {
        struct sigaction old;
        if (sigaction(fatal[i], NULL, &old) == 0 && old.sa_handler == SIG_DFL) sigaction(fatal[i], &sa, NULL);
    }
}

/* The process's resident set now, in GiB (-1 when /proc is not there). */
static double resident_gib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long long size = 0, resident = -1;
    if (f) {
        if (fscanf(f, "%lld %lld", &size, &resident) != 2) resident = -1;
        fclose(f);
    }
    return resident < 0 ? -1 : (double)resident * (double)sysconf(_SC_PAGESIZE) / 1073741824.0;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

typedef struct {
    mt_train_opts o;
    mt_comm *comm;         /* the data-parallel ranks (local: one) */
    mt_comm *nccl;         /* MT_COMM=nccl at one rank: the engine's comm (run_ranks.h) */
    int rank, ranks;
    int lead;              /* rank 0: prints, logs and writes the run's files */
    int stop_sig;          /* ranks: the signal every rank agreed to stop on (0: none yet) */
    int quiet;             /* ranks: another rank prints the error that ends this one */
    int64_t rows;          /* this rank's rows of each global batch: --batch / ranks */
    mt_host_model model;   /* the table (weights live in the engine) */
    mt_lora_table lora;    /* --lora / --adapter: the adapters (have_lora); the base is frozen */
    int have_lora;
    float *lora_init;      /* --adapter: its weights (lora.total fp32), NULL: the adapters' init */
    mt_backend *be;
    mt_engine *e;
    mt_run_data data, eval;
    int docs_set;          /* the engine holds document starts (packed rows) */
    mt_train_log log;
    mt_run_lock lock;      /* OUT/.lock, held for the whole run */
    char *args_json;
    int64_t step;          /* steps completed (the data position) */
    int64_t updates;       /* of those, steps whose update was applied (AdamW's t) */
    int64_t skipped;       /* steps whose update was skipped (non-finite loss or norm) */
    int64_t in_a_row;      /* non-finite steps in a row, up to now */
    double last_loss;      /* the last step's loss (NaN when it was skipped) */
    double good_loss;      /* the last finite loss and its step */
    int64_t good_step;
    double eval_loss;      /* the last evaluation (eval_step 0: none) */
    int64_t eval_step;
    char last_ckpt[4200];  /* the newest checkpoint written or resumed from ("" none) */
    int64_t first_step;    /* the step this process started at */
    double rest_ms;        /* time of this process's steps but the first (for the ETA) */
    int saved_layers;      /* layers whose backward skips the recompute (for the MFU) */
    int checkpoint_every;  /* 2: sparse checkpoints, the remade inputs' forwards (for the MFU) */
    int saved_attention;   /* layers whose backward skips the attention's recompute */
} train_run;

static int phase(train_run *r, int rc);

/* With ranks, every rank writes its shard into the one checkpoint (io/checkpoint.h: rank 0 begins
 * and finishes it, the ranks agree after each phase); no rank gathers the state. */
static int save_by_ranks(train_run *r, const mt_state_io *io, const mt_ckpt_state *st) {
    mt_ckpt_writer *w = NULL;
    char dir[4096] = "";
    int rc = r->lead ? mt_checkpoint_begin(r->o.out_dir, &r->model.table, io->format, st->step, r->args_json,
                                           r->o.model_dir, &w)
                     : MT_OK;
    if (rc == MT_OK && r->lead) snprintf(dir, sizeof dir, "%s", mt_checkpoint_writer_dir(w));
    if (phase(r, rc) != MT_OK) {
        mt_checkpoint_abort(w);
        return MT_ERR;
    }
    mt_ranks_share(r->comm, dir, sizeof dir);
    rc = phase(r, mt_checkpoint_write_shard(dir, &r->model.table, io, r->o.out_dir, st->step));
    if (!r->lead) return rc;
    if (rc != MT_OK) {
        mt_checkpoint_abort(w);
        return rc;
    }
    return mt_checkpoint_finish(w, io, st, (int)r->o.keep);
}

/* The adapters' fp32 weights and moments on the host (lora.total floats each; free all three). */
static void lora_arenas(const train_run *r, float **w, float **m, float **v) {
    size_t bytes = (size_t)(r->lora.total ? r->lora.total : 1) * sizeof(float);
    *w = mt_aligned_alloc(bytes);
    *m = mt_aligned_alloc(bytes);
    *v = mt_aligned_alloc(bytes);
}

/* LoRA: the checkpoint is a PEFT adapter directory, OUT/checkpoints/step_N, with the adapters'
 * moments and the trainer's position beside it (io/lora_checkpoint.h: --resume goes on bit for
 * bit; --adapter starts a new run from it). Every rank holds the same adapters: rank 0 writes. */
static int save_adapter(train_run *r, const mt_ckpt_state *st) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/checkpoints/step_%08lld", r->o.out_dir, (long long)r->step);
    int rc = MT_OK;
    double t0 = now_ms();
    if (r->lead) {
        float *w, *m, *v;
        lora_arenas(r, &w, &m, &v);
        mt_lora_state_get(mt_engine_lora(r->e), w, m, v);
        snprintf(saving_note, sizeof saving_note,
                 " while writing the adapter checkpoint of step %lld into %s/checkpoints: it was not "
                 "written (the older checkpoints are intact; --resume removes its temporary directory)\n",
                 (long long)r->step, r->o.out_dir);
        saving = 1;
        rc = mt_lora_checkpoint_save(r->o.out_dir, &r->lora, w, m, v, st, r->args_json, r->o.model_dir,
                                     (int)r->o.keep);
        saving = 0;
        free(w), free(m), free(v);
    }
    MT_TRY(phase(r, rc));
    snprintf(r->last_ckpt, sizeof r->last_ckpt, "%s", dir);
    return mt_train_log_note(&r->log, "saved the adapter %s (PEFT; %.1f s)", dir, (now_ms() - t0) / 1e3);
}

static int save_checkpoint(train_run *r) {
    mt_engine_finish(r->e);
    if (r->o.no_save) return MT_OK;
    mt_ckpt_state st = {.step = r->step, .seed = (uint64_t)r->o.seed, .loss = r->last_loss,
                        .updates = r->updates, .skipped = r->skipped, .in_a_row = r->in_a_row};
    if (r->have_lora) return save_adapter(r, &st);
    double t0 = now_ms();
    const mt_state_io *io = mt_engine_state_io(r->e);
    snprintf(saving_note, sizeof saving_note,
             " while writing the checkpoint of step %lld into %s/checkpoints: it was not written (the "
             "older checkpoints are intact; --resume removes its temporary directory)\n",
             (long long)r->step, r->o.out_dir);
    saving = 1;
    int rc = r->ranks > 1 ? save_by_ranks(r, io, &st)
                          : mt_checkpoint_save(r->o.out_dir, &r->model.table, io, &st, r->args_json, r->o.model_dir,
                                               (int)r->o.keep);
    saving = 0;
    MT_TRY(rc);
    snprintf(r->last_ckpt, sizeof r->last_ckpt, "%s/checkpoints/step_%08lld", r->o.out_dir,
             (long long)r->step);
    return mt_train_log_note(&r->log, "saved %s (%.1f s)", r->last_ckpt, (now_ms() - t0) / 1e3);
}

/* Packed rows come with document starts; token data is one document per row. */
static void use_documents(train_run *r, const int32_t *doc_start) {
    if (!doc_start && !r->docs_set) return;
    MT_CHECK(mt_engine_set_documents(r->e, doc_start) == MT_OK, "%s", mt_error_message());
    r->docs_set = doc_start != NULL;
}

/* This rank's rows of a global batch (B, T): rows [rank * rows, (rank + 1) * rows). */
static size_t my_rows(const train_run *r) { return (size_t)r->rank * (size_t)r->rows * (size_t)r->o.seq; }

static const int32_t *my_docs(const train_run *r, const int32_t *doc_start) {
    return doc_start ? doc_start + my_rows(r) : NULL;
}

/* An eval set: --eval-data, or the part of --data that --eval-split holds out. */
static int has_eval(const mt_train_opts *o) { return o->eval_data || o->eval_split > 0; }

static int evaluate(train_run *r) {
    int B = (int)r->o.batch, T = (int)r->o.seq;
    mt_run_data *ev = r->o.eval_split > 0 ? &r->data : &r->eval;
    int64_t rows = mt_run_data_eval_rows(ev, T);
    int64_t batches = (rows + B - 1) / B;
    if (batches > r->o.eval_batches) batches = r->o.eval_batches;
    int32_t *in = mt_malloc((size_t)B * T * sizeof(int32_t)), *tg = mt_malloc((size_t)B * T * sizeof(int32_t));
    double sum = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < batches; i++) {
        use_documents(r, my_docs(r, mt_run_data_eval_batch(ev, i * B, B, T, in, tg)));
        int64_t c;
        sum += mt_engine_eval(r->e, in + my_rows(r), tg + my_rows(r), (int)r->rows, &c);
        count += c;
    }
    free(in), free(tg);
    r->eval_loss = count ? sum / count : NAN;
    r->eval_step = r->step;
    return mt_train_log_eval(&r->log, r->step, r->eval_loss, count);
}

#define H200_GEMM_PEAK 800e12 /* bf16 GEMM rate of the H200 (docs/DESIGN.md, "The test machine") */

/* A number for a message: nan and inf spelled plainly (printf may write -nan). */
static const char *num_text(double x, char *buf, size_t n) {
    if (isnan(x)) snprintf(buf, n, "nan");
    else if (isinf(x)) snprintf(buf, n, "%sinf", x < 0 ? "-" : "");
    else snprintf(buf, n, "%.4g", x);
    return buf;
}

/* A step whose update was skipped: a note, or (policy, or too many in a row) the end of the run
 * with an error that names the last good checkpoint. No checkpoint is written on that path: the
 * newest one stays the newest. */
static int on_nonfinite(train_run *r, const mt_step_result *res) {
    const mt_train_opts *o = &r->o;
    char a[32], b[32], where[4400];
    num_text(res->loss, a, sizeof a);
    num_text(res->grad_norm, b, sizeof b);
    int stop = o->nonfinite_stop || r->in_a_row >= o->max_nonfinite;
    if (!stop)
        return mt_train_log_note(&r->log, "step %lld: loss %s, gradient norm %s: update skipped (%lld in a row; "
                                 "the run stops at %lld, --max-nonfinite)",
                                 (long long)r->step, a, b, (long long)r->in_a_row, (long long)o->max_nonfinite);
    if (r->last_ckpt[0])
        snprintf(where, sizeof where, "the last good checkpoint is %s (continue from it with --resume)", r->last_ckpt);
    else
        snprintf(where, sizeof where, "there is no checkpoint of this run yet");
    char why[128];
    if (o->nonfinite_stop) snprintf(why, sizeof why, "--on-nonfinite stop");
    else snprintf(why, sizeof why, "%lld in a row, --max-nonfinite %lld", (long long)r->in_a_row,
                  (long long)o->max_nonfinite);
    return mt_error_set("step %lld: loss %s, gradient norm %s (%s): stopping; the weights were not updated "
                        "and no checkpoint was written; %s; try a lower --lr or a longer --warmup, or check "
                        "the data",
                        (long long)r->step, a, b, why, where);
}

/* The signal to stop on: one rank's own; with ranks, the one they agreed on after a step (a
 * signal reaches the ranks at different moments, and they must stop after the same step). */
static int stopping(const train_run *r) { return r->ranks > 1 ? r->stop_sig : (int)stop_requested; }

static int train_loop(train_run *r) {
    const mt_train_opts *o = &r->o;
    int B = (int)o->batch, T = (int)o->seq;
    mt_lr_schedule sched = {.kind = (mt_lr_kind)o->schedule, .max_lr = o->lr, .min_lr = o->min_lr,
                            .warmup = o->warmup, .total = o->steps};
    mt_batch_order order = {.shuffle = !o->no_shuffle, .seed = (uint64_t)o->seed};
    int32_t *in = mt_malloc((size_t)B * T * sizeof(int32_t)), *tg = mt_malloc((size_t)B * T * sizeof(int32_t));
    /* TFLOPS count 6 * N * tokens with N the parameters a token computes with: all of them in a
     * dense model, the router and k experts of each MoE layer in a mixture of experts */
    double n_params = (double)mt_config_active_param_count(&r->model.table.cfg), t_start = now_ms();
    int64_t tokens = r->step * (int64_t)B * T;
    int rc = MT_OK;
    int64_t last = o->stop_at && o->stop_at < o->steps ? o->stop_at : o->steps;
    r->first_step = r->step;
    while (r->step < last && !stopping(r)) {
        int time_up = o->max_ms && now_ms() - t_start > (double)o->max_ms;
        if (r->ranks > 1) time_up = mt_ranks_max(r->comm, time_up); /* each rank has its own clock */
        if (time_up) {
            rc = mt_train_log_note(&r->log, "--max-time reached after %lld steps", (long long)r->step);
            break;
        }
        /* keep the timeline of the last two steps: the last one and the optimizer run it overlaps
         * (spans are labelled by the update they belong to; a skipped step shares the next one's) */
        if (o->trace_path) mt_trace_drop_before(mt_engine_trace(r->e), (int)r->updates - 1);
        double t0 = now_ms();
        const int32_t *docs = mt_run_data_batch(&r->data, &order, r->step, B, T, in, tg); /* all B rows */
        use_documents(r, my_docs(r, docs));
        /* the schedule follows the data position; AdamW's bias correction the updates applied */
        mt_adamw_hparams hp = {.lr = mt_lr_at(&sched, r->step), .beta1 = o->beta1, .beta2 = o->beta2,
                               .eps = o->eps, .weight_decay = o->weight_decay};
        mt_step_result res;
        mt_engine_step(r->e, in + my_rows(r), tg + my_rows(r), &hp, r->updates + 1, o->clip, &res);
        double ms = now_ms() - t0;
        r->step++;
        tokens += (int64_t)B * T;
        r->last_loss = res.loss;
        if (res.skipped) {
            r->skipped++;
            r->in_a_row++;
        } else {
            r->updates++;
            r->in_a_row = 0;
            r->good_loss = res.loss;
            r->good_step = r->step;
        }
        int64_t timed = r->step - r->first_step - 1; /* the first step (warm-up of caches) is left out */
        if (timed > 0) r->rest_ms += ms;
        double sec = ms / 1e3;
        int gpu = r->be->mem_used != NULL; /* a device with its own memory: the GPU measurements mean something */
        mt_step_line line = {.step = r->step, .loss = res.loss, .lr = hp.lr, .grad_norm = res.grad_norm,
                             .clip_coef = res.clip_coef, .ms = ms, .tokens = tokens, .targets = res.count,
                             .tok_per_s = B * T / sec,
                             .flops = mt_flops_6nt(n_params, (double)B * T),
                             .flops_attn = mt_flops_6nt(n_params, (double)B * T) +
                                           mt_flops_attention(&r->model.table.cfg, docs, B, T),
                             .attn_docs = docs != NULL,
                             .skipped = res.skipped,
                             .eta_s = timed > 0 ? r->rest_ms / (double)timed * (double)(last - r->step) / 1e3 : -1,
                             .gpu = gpu,
                             .mfu = ((r->have_lora ? mt_flops_executed_frozen : mt_flops_executed)(
                                         &r->model.table.cfg, (double)B * T, T, r->saved_layers, r->saved_attention) +
                                     mt_flops_remade(&r->model.table.cfg, (double)B * T, T, r->checkpoint_every)) /
                                    sec / H200_GEMM_PEAK,
                             .h2d_gbs = res.h2d_bytes / sec / 1e9,
                             .d2h_gbs = res.d2h_bytes / sec / 1e9,
                             .gpu_busy = res.compute_ms >= 0 ? res.compute_ms / ms : -1,
                             .opt_ms = res.opt_ms,
                             .gpu_gib = gpu ? r->be->mem_used(r->be) / 1073741824.0 : -1,
                             .host_gib = resident_gib()};
        rc = mt_train_log_step(&r->log, &line);
        if (rc == MT_OK && res.skipped) rc = on_nonfinite(r, &res);
        if (rc == MT_OK && has_eval(o) && o->eval_every && r->step % o->eval_every == 0) rc = evaluate(r);
        if (rc == MT_OK && o->save_every && r->step % o->save_every == 0 && r->step < o->steps)
            rc = save_checkpoint(r);
        /* the ranks go on, or stop, together: a failure on one (its log, say) or a signal that
         * reached some of them before this step ends every rank here, not in a collective */
        if (r->ranks > 1) {
            rc = mt_ranks_agree(r->comm, rc);
            r->stop_sig = mt_ranks_max(r->comm, (int)stop_requested);
        }
        if (rc != MT_OK) break;
    }
    free(in), free(tg);
    if (rc != MT_OK) return rc;
    if (stopping(r))
        MT_TRY(mt_train_log_note(&r->log, "%s: stopping after step %lld",
                                 stopping(r) == SIGINT ? "SIGINT" : "SIGTERM", (long long)r->step));
    /* reached only by a run resumed with that many skipped steps in a row (a lower --max-nonfinite
     * than its checkpoint's run, or no step left): it has diverged, whatever process skipped them */
    if (r->in_a_row > 0 && r->in_a_row >= o->max_nonfinite)
        return mt_error_set("the last %lld steps up to step %lld were all non-finite and skipped (--max-nonfinite "
                            "%lld): the run has diverged; no checkpoint was written; the last one, %s, holds "
                            "the weights from before them; try a lower --lr or a longer --warmup, or check the data",
                            (long long)r->in_a_row, (long long)r->step, (long long)o->max_nonfinite,
                            r->last_ckpt[0] ? r->last_ckpt : "(none)");
    if (has_eval(o) && (!o->eval_every || r->step % o->eval_every != 0)) MT_TRY(evaluate(r));
    return save_checkpoint(r);
}

/* What the run did, where its state is and how to go on; also after a failure (then the last
 * checkpoint named is the one to go back to). */
static void print_summary(train_run *r, double wall_ms) {
    const mt_train_opts *o = &r->o;
    int64_t done = r->step - r->first_step, tokens = done * o->batch * o->seq;
    double sec = wall_ms / 1e3;
    char line[4600], loss[32];
    mt_train_log *lg = &r->log;
    if (done == 0)
        mt_train_log_note(lg, "summary: no step to run (step %lld of %lld)", (long long)r->step, (long long)o->steps);
    else
        mt_train_log_note(lg, "summary: steps %lld-%lld of %lld done in %.1f s (%lld skipped in all); %lld tokens, "
                          "%.0f tok/s",
                          (long long)r->first_step + 1, (long long)r->step, (long long)o->steps, sec,
                          (long long)r->skipped, (long long)tokens, sec > 0 ? tokens / sec : 0.0);
    mt_train_log_throughput(lg, line, sizeof line);
    if (done > 0 && line[0]) mt_train_log_note(lg, "throughput: %s", line);
    if (r->good_step) {
        int n = snprintf(line, sizeof line, "final loss %s (step %lld)", num_text(r->good_loss, loss, sizeof loss),
                         (long long)r->good_step);
        if (r->eval_step)
            snprintf(line + n, sizeof line - (size_t)n, ", eval loss %s (step %lld)",
                     num_text(r->eval_loss, loss, sizeof loss), (long long)r->eval_step);
        mt_train_log_note(lg, "%s", line);
    }
    if (o->no_save) mt_train_log_note(lg, "no checkpoint (--no-save)");
    else if (!r->last_ckpt[0]) mt_train_log_note(lg, "no checkpoint was written");
    else if (r->have_lora)
        mt_train_log_note(lg, "last checkpoint: %s (a PEFT adapter: PeftModel.from_pretrained loads it; "
                          "go on from it with --adapter; `megatrain merge --model %s --adapter %s --out DIR` "
                          "folds it into the model)", r->last_ckpt, o->model_dir ? o->model_dir : "BASE",
                          r->last_ckpt);
    else if (r->step < o->steps)
        mt_train_log_note(lg, "last checkpoint: %s; continue with the same command and --resume", r->last_ckpt);
    else if (r->in_a_row == 0)
        mt_train_log_note(lg, "last checkpoint: %s (a Hugging Face model directory: use it with --model)",
                          r->last_ckpt);
    else /* fewer than --max-nonfinite, but the run did not end on a healthy step */
        mt_train_log_note(lg, "last checkpoint: %s (a Hugging Face model directory: use it with --model); "
                          "the last %lld steps were non-finite and skipped: its weights are from before them",
                          r->last_ckpt, (long long)r->in_a_row);
}

static void train_run_free(train_run *r) {
    mt_engine_destroy(r->e);
    mt_comm_destroy(r->nccl);
    if (r->be) r->be->destroy(r->be);
    mt_run_data_close(&r->data);
    mt_run_data_close(&r->eval);
    mt_train_log_close(&r->log);
    mt_host_model_free(&r->model);
    if (r->have_lora) mt_lora_table_free(&r->lora);
    free(r->lora_init);
    free(r->args_json);
    mt_run_unlock(&r->lock);
}

/* The newest intact checkpoint of OUT into the engine's arenas and *st; *found = 0 when OUT has none.
 * (The one place that picks and loads the checkpoint to resume from.) */
static int load_resume_checkpoint(train_run *r, mt_ckpt_state *st, int *found) {
    char path[4096];
    /* the newest checkpoint that verifies (checksums, dtypes, finite values); a damaged newer one
     * is named in a warning. LoRA: the adapters' weights and moments (the frozen base is the
     * model's, loaded as for a fresh run) */
    int rc;
    if (r->have_lora) {
        float *w, *m, *v;
        lora_arenas(r, &w, &m, &v);
        rc = mt_lora_checkpoint_resume(r->o.out_dir, &r->model.table, &r->lora, w, m, v, st, path,
                                       sizeof path);
        if (rc == MT_OK) mt_lora_state_set(mt_engine_lora(r->e), w, m, v);
        free(w), free(m), free(v);
    } else {
        rc = mt_checkpoint_resume(r->o.out_dir, &r->model.table, mt_engine_state_io(r->e), st, path,
                                  sizeof path);
    }
    *found = rc == MT_OK;
    if (rc == MT_CKPT_NONE) return MT_OK;
    MT_TRY(rc);
    snprintf(r->last_ckpt, sizeof r->last_ckpt, "%s", path);
    return MT_OK;
}

/* The checkpoint's settings against this command's: a change in what shapes the math of the
 * remaining steps is refused, by name, unless --resume-changed (then it is a warning). */
static int check_resume_settings(const train_run *r, const mt_ckpt_state *st) {
    if (!st->args_json) {
        fprintf(stderr, "megatrain: warning: %s records no settings; they are not compared\n", r->last_ckpt);
        return MT_OK;
    }
    char *list;
    int n = mt_train_opts_changes(&r->o, st->args_json, &list);
    int rc = MT_OK;
    if (n < 0) fprintf(stderr, "megatrain: warning: %s: its settings are unreadable; not compared\n", r->last_ckpt);
    else if (n > 0 && !r->o.resume_changed)
        rc = mt_error_set("--resume: %s was trained with other settings: %s; resume with the old values, "
                          "or add --resume-changed to go on with the new ones",
                          r->last_ckpt, list);
    else if (n > 0)
        fprintf(stderr, "megatrain: warning: --resume-changed: going on with changed settings: %s\n", list);
    free(list);
    return rc;
}

/* --resume: the run's state and counters from its checkpoint, metrics.jsonl cut back to it.
 * *resumed = 0 when OUT has no checkpoint and no run either (then the run starts at step 0). */
static int resume(train_run *r, int *resumed) {
    const mt_train_opts *o = &r->o;
    mt_ckpt_state st = {0};
    /* rank 0 holds OUT's lock: no other run saves there, and a save of this run would hold its
     * temporary directory locked; what is left is a killed save's */
    int stale = r->lead ? mt_checkpoint_clean_temps(o->out_dir) : 0;
    if (stale)
        printf("--resume: removed %d temporary checkpoint director%s in %s/checkpoints (a save that "
               "was killed)\n", stale, stale == 1 ? "y" : "ies", o->out_dir);
    MT_TRY(load_resume_checkpoint(r, &st, resumed));
    if (!*resumed) {
        char what[512];
        if (mt_run_dir_used(o->out_dir, what, sizeof what))
            return mt_error_set("--resume: %s holds a run's %s but no checkpoint to resume it from; start "
                                "it again with --overwrite instead of --resume",
                                o->out_dir, what);
        printf("--resume: no checkpoint in %s yet; starting at step 0\n", o->out_dir);
        return MT_OK;
    }
    int rc = check_resume_settings(r, &st);
    int64_t dropped = 0;
    if (rc == MT_OK && r->lead) rc = mt_run_dir_cut_metrics(o->out_dir, st.step, &dropped);
    if (rc == MT_OK) {
        r->step = st.step;
        r->updates = st.updates;
        r->skipped = st.skipped;
        r->in_a_row = st.in_a_row; /* a run of skipped steps goes on across processes */
        r->last_loss = st.loss;
        if (isfinite(st.loss) && !st.in_a_row) r->good_loss = st.loss, r->good_step = st.step;
        printf("resuming from %s (step %lld", r->last_ckpt, (long long)st.step);
        if (st.skipped) printf(", %lld of them skipped", (long long)st.skipped);
        if (st.in_a_row) printf(", the last %lld in a row", (long long)st.in_a_row);
        if (dropped) printf("; %lld later lines of metrics.jsonl dropped", (long long)dropped);
        printf(")\n");
    }
    mt_ckpt_state_free(&st);
    return rc;
}

/* --resume without --micro-batch: the micro-batch the checkpoint's run used, so that the resumed
 * steps sum their micro-batches in the same order (bit-identical to an uninterrupted run) even
 * when the planner would choose another today (a GPU with less free memory). -1: none recorded
 * (or it no longer divides the rows of a rank, --batch / ranks): the planner chooses. */
static int64_t resumed_micro_batch(const mt_train_opts *o, int64_t rows) {
    char latest[4096];
    mt_ckpt_state st = {0};
    if (!o->resume || o->have_micro_batch || mt_checkpoint_latest(o->out_dir, latest, sizeof latest) != MT_OK ||
        mt_checkpoint_read_state(latest, &st) != MT_OK)
        return -1;
    json_t *args = st.args_json ? json_loads(st.args_json, 0, NULL) : NULL;
    json_t *mb = json_object_get(args, "micro_batch");
    int64_t b = json_is_integer(mb) ? (int64_t)json_integer_value(mb) : -1;
    json_decref(args);
    mt_ckpt_state_free(&st);
    return b > 0 && rows % b == 0 ? b : -1;
}

/* --resume without --state: the checkpoint's format (a checkpoint is resumed in the format it was
 * saved in; another is refused by name). -1: no checkpoint to read. */
static int resumed_state(const mt_train_opts *o) {
    char latest[4096];
    mt_ckpt_state st = {0};
    if (!o->resume || o->have_state || mt_checkpoint_latest(o->out_dir, latest, sizeof latest) != MT_OK ||
        mt_checkpoint_read_state(latest, &st) != MT_OK)
        return -1;
    int f = (int)st.state;
    mt_ckpt_state_free(&st);
    return f;
}

/* The weights a fresh run starts from (the model's, or the random init), tensor by tensor into the
 * engine's state: no fp32 copy of the whole model (a 14B's would be 59 GB). */
static int set_tensor(void *ctx, const mt_param *p, const float *w) {
    const mt_state_io *io = ctx;
    return io->set_weights(io->ctx, p, w);
}

static int initial_weights(train_run *r) {
    const mt_param_table *t = &r->model.table;
    const mt_state_io *io = mt_engine_state_io(r->e);
    if (r->o.model_dir && r->o.base_cache) return mt_cached_base_load(r->e, t, r->o.model_dir, r->o.base_cache, io);
    if (r->o.model_dir) return mt_base_weights_load(r->e, t, r->o.model_dir, io);
    int64_t biggest = 1;
    for (int i = 0; i < t->n_params; i++)
        if (t->params[i].numel > biggest) biggest = t->params[i].numel;
    float *buf = mt_aligned_alloc((size_t)biggest * sizeof(float));
    int rc = MT_OK;
    for (int i = 0; i < t->n_params && rc == MT_OK; i++) {
        mt_param_init_tensor(t, i, buf, t->cfg.initializer_range, (uint64_t)r->o.seed);
        rc = set_tensor((void *)io, &t->params[i], buf);
    }
    free(buf);
    return rc;
}

/* The end of a phase: with ranks, every rank's result agreed, so that a failure on one ends them
 * all here (each distinct message printed once: r->quiet on the ranks that stay silent). */
static int phase(train_run *r, int rc) {
    if (r->ranks == 1) return rc;
    rc = mt_ranks_agree(r->comm, rc);
    if (rc == MT_RANKS_QUIET) r->quiet = 1;
    return rc == MT_OK ? MT_OK : MT_ERR;
}

/* --lora / --adapter: the adapter table over the model (and, from --adapter, the weights the
 * adapters start from); the layer's workspace is sized for the rank. */
static int open_lora(train_run *r) {
    mt_train_opts *o = &r->o;
    mt_param_table *t = &r->model.table;
    if (!o->lora && !o->adapter) return MT_OK;
    if (o->adapter) {
        MT_TRY(mt_lora_load_dir(o->adapter, t, &r->lora, &r->lora_init));
        r->have_lora = 1;
        if (o->lora && o->lora != r->lora.rank)
            return mt_error_set("--lora %lld: the adapter %s has rank %d (leave --lora out to take it)",
                                (long long)o->lora, o->adapter, r->lora.rank);
        if (o->lora_alpha && o->lora_alpha != r->lora.alpha)
            return mt_error_set("--lora-alpha %g: the adapter %s has lora_alpha %g", o->lora_alpha,
                                o->adapter, r->lora.alpha);
        char names[sizeof r->lora.targets + sizeof r->lora.parameters];
        mt_lora_targets_text(&r->lora, names, sizeof names);
        if (o->lora_targets && strcmp(o->lora_targets, names) != 0)
            return mt_error_set("--lora-targets %s: the adapter %s targets %s", o->lora_targets,
                                o->adapter, names);
    } else {
        mt_lora_opts lo = {.rank = (int)o->lora, .alpha = o->lora_alpha, .targets = o->lora_targets};
        MT_TRY(mt_lora_table_init(&r->lora, t, &lo));
        r->have_lora = 1;
    }
    t->cfg.lora_rank = r->lora.rank;
    t->cfg.lora_experts = r->lora.parameters[0] != '\0';
    char names[sizeof r->lora.targets + sizeof r->lora.parameters];
    printf("LoRA: rank %d, alpha %g on %d modules (%s), %.3fM trainable parameters of %.1fM; the "
           "base is frozen%s%s\n",
           r->lora.rank, r->lora.alpha, r->lora.n_modules,
           mt_lora_targets_text(&r->lora, names, sizeof names), r->lora.n_real / 1e6,
           (t->n_real + r->lora.n_real) / 1e6, o->adapter ? "; starting from the adapter " : "",
           o->adapter ? o->adapter : "");
    return MT_OK;
}

static int open_model(train_run *r) {
    mt_train_opts *o = &r->o;
    MT_TRY(mt_host_model_open(&r->model, o->model_dir, o->init_config, (uint64_t)o->seed, 0));
    const mt_config *cfg = &r->model.table.cfg;
    MT_TRY(mt_layer_check_runnable(cfg));
    MT_TRY(open_lora(r));
    MT_TRY(mt_base_format_check(cfg, (mt_base_format)o->base_dtype));
    const mt_hf_source *hf = r->model.hf;
    if (hf && hf->n_carried > 0) /* a multimodal checkpoint: say what is not trained, and why */
        printf("carried, not trained: %d tensors of %s, copied unchanged into every checkpoint: %d "
               "vision (model.visual.*: image and video inputs are not supported), %d multi-token "
               "prediction (mtp.*: not trained, so it will not follow the fine-tuned model), %d other\n",
               hf->n_carried, o->model_dir, hf->n_visual, hf->n_mtp,
               hf->n_carried - hf->n_visual - hf->n_mtp);
    if (hf && hf->n_mxfp4 > 0 && r->have_lora && o->base_dtype == MT_BASE_MXFP4) /* kept MXFP4 */
        printf("experts kept in MXFP4 in the frozen base: the checkpoint's blocks and scales as they are "
               "(the GPU tier's layers, if any, hold them dequantized)\n");
    else if (hf && hf->n_mxfp4 > 0 && r->have_lora) /* a published gpt-oss as a frozen base */
        printf("experts loaded from MXFP4 (dequantized) into the frozen base%s\n",
               o->base_dtype ? "" : " (--base-dtype mxfp4 keeps them in MXFP4)");
    else if (hf && hf->n_mxfp4 > 0) /* a published gpt-oss: its experts train and save unquantized */
        printf("experts loaded from MXFP4 (dequantized): saved checkpoints hold them unquantized (fp32 "
               "here, bf16 from megatrain convert), with no quantization_config\n");
    if (!o->have_seq) o->seq = mt_plan_default_seq(cfg);
    MT_TRY(mt_run_check_seq(cfg, (int)o->seq, "--seq"));
    /* a missing data file is refused before --out is created, so a typo leaves nothing behind */
    MT_TRY(mt_run_data_check_file("--data", o->data));
    if (o->eval_data) MT_TRY(mt_run_data_check_file("--eval-data", o->eval_data));
    return MT_OK;
}

/* Rank 0's files: OUT, its lock, a fresh run's clean directory. */
static int open_run_dir(train_run *r) {
    mt_train_opts *o = &r->o;
    if (!r->lead) return MT_OK;
    MT_TRY(mt_run_make_dir(o->out_dir));
    /* before anything is written into OUT (data caches included): one process per directory, and
     * a fresh run never mixes with an old one */
    MT_TRY(mt_run_lock_take(&r->lock, o->out_dir));
    if (!o->resume) MT_TRY(mt_run_dir_prepare_fresh(o->out_dir, o->overwrite));
    return MT_OK;
}

static int open_data(train_run *r) {
    mt_train_opts *o = &r->o;
    const mt_config *cfg = &r->model.table.cfg;
    mt_run_data_opts dopts = {.out_dir = o->out_dir, .model_dir = o->model_dir, .doc_sep = o->doc_sep,
                              .T = (int)o->seq, .chat_format = (mt_chat_format)o->chat_format,
                              .loss_on = (mt_chat_loss_on)o->loss_on, .long_policy = (mt_long_policy)o->long_policy,
                              .pack = (mt_pack_policy)o->pack_policy,
                              .chat_flags = o->have_chat_flags};
    MT_TRY(mt_run_data_open(&r->data, o->data, &dopts, cfg));
    if (o->eval_data) MT_TRY(mt_run_data_open(&r->eval, o->eval_data, &dopts, cfg));
    if (o->eval_split > 0) MT_TRY(mt_run_data_split(&r->data, o->data, o->eval_split, (uint64_t)o->seed, (int)o->seq));
    return MT_OK;
}

static int64_t file_bytes(const char *path) {
    struct stat st;
    return path && stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

/* Every rank must run the same math: the settings that shape it, compared one by one so that the
 * error names the one that differs, then the whole command line for the rest. */
static int check_same_settings(train_run *r) {
    const mt_train_opts *o = &r->o;
    const mt_config *c = &r->model.table.cfg;
    mt_comm *m = r->comm;
    MT_TRY(mt_ranks_check_text(m, "the model config",
                               "%d %s C%d F%d L%d H%d G%d D%d V%d %a %a %d %a %a %a %d %d %d %d %d %d %d %d %a %lld",
                               (int)c->arch, c->model_type, c->C, c->F, c->L, c->H, c->G, c->D, c->V,
                               (double)c->rms_norm_eps, c->rope_theta, (int)c->rope_type, c->rope_factor,
                               c->rope_low_freq_factor, c->rope_high_freq_factor, c->rope_original_max_pos,
                               c->max_position_embeddings, c->tie_word_embeddings, c->qkv_bias, c->o_bias,
                               c->mlp_bias, c->qk_norm, c->sliding_window, (double)c->initializer_range,
                               (long long)r->model.table.total));
    MT_TRY(mt_ranks_check_same(m, &o->batch, sizeof o->batch, "--batch"));
    MT_TRY(mt_ranks_check_same(m, &o->seq, sizeof o->seq, "--seq"));
    MT_TRY(mt_ranks_check_same(m, &o->micro_batch, sizeof o->micro_batch, "--micro-batch"));
    MT_TRY(mt_ranks_check_same(m, &o->state, sizeof o->state, "--state"));
    MT_TRY(mt_ranks_check_same(m, &o->lr, sizeof o->lr, "--lr"));
    MT_TRY(mt_ranks_check_same(m, &o->seed, sizeof o->seed, "--seed"));
    int64_t bytes[2] = {file_bytes(o->data), file_bytes(o->eval_data)};
    MT_TRY(mt_ranks_check_same(m, &bytes[0], sizeof bytes[0], "the size of the --data file"));
    MT_TRY(mt_ranks_check_same(m, &bytes[1], sizeof bytes[1], "the size of the --eval-data file"));
    char *args = mt_train_opts_json(o);
    int rc = mt_ranks_check_same(m, args, strlen(args), "the other flags of train");
    free(args);
    return rc;
}

/* What a run on several ranks does not do (yet), refused by name; this rank's rows. */
static int check_ranks(train_run *r) {
    mt_train_opts *o = &r->o;
    int N = r->ranks;
    r->rows = o->batch / N;
    if (N == 1 && r->nccl && o->gpu_layers > 0)
        return mt_error_set("--gpu-layers %lld: the GPU tier does not run with MT_COMM=nccl yet; use "
                            "--gpu-layers 0 (or unset MT_COMM)",
                            (long long)o->gpu_layers);
    if (N == 1) return MT_OK;
    if (o->base_dtype)
        return mt_error_set("--base-dtype %s: a quantized base runs on one rank yet (each rank would hold "
                            "the whole base); use --base-dtype bf16 on %d ranks",
                            mt_base_format_name((mt_base_format)o->base_dtype), N);
    if (o->gpu_layers > 0)
        return mt_error_set("--gpu-layers %lld: the GPU tier is not supported on %d ranks yet; use "
                            "--gpu-layers 0",
                            (long long)o->gpu_layers, N);
    int64_t b = o->have_micro_batch ? o->micro_batch : 1;
    if (o->batch % (N * b))
        return mt_error_set("--batch %lld: the global batch must divide by %d ranks x micro-batch "
                            "%lld = %lld (each rank takes --batch / %d rows)",
                            (long long)o->batch, N, (long long)b, (long long)(N * b), N);
    return MT_OK;
}

static int train(train_run *r) {
    mt_train_opts *o = &r->o;
    MT_TRY(phase(r, open_model(r)));
    if (r->ranks > 1) MT_TRY(phase(r, check_same_settings(r)));
    MT_TRY(phase(r, open_run_dir(r)));
    /* rank 0 first: it makes the derived data files (tokenized text) that the others then reuse */
    MT_TRY(phase(r, r->lead ? open_data(r) : MT_OK));
    MT_TRY(phase(r, r->lead ? MT_OK : open_data(r)));
    MT_TRY(phase(r, mt_ranks_nccl_from_env(r->comm, (int)o->device, mt_run_cuda_devices(), &r->nccl)));
    MT_TRY(phase(r, mt_run_backend(&r->be, o->device, o->gpu_mem)));
    if (r->nccl && r->be->memory.host_ram) /* --device auto chose the cpu */
        MT_TRY(phase(r, mt_error_set("MT_COMM=nccl: the NCCL comm runs on the cuda backend, not %s",
                                     r->be->name)));
    MT_TRY(phase(r, mt_moe_backend_check(&r->model.table.cfg, r->be)));
    MT_TRY(phase(r, mt_layer_backend_check(&r->model.table.cfg, r->be)));
    MT_TRY(phase(r, check_ranks(r)));

    int resumed_f = resumed_state(o);
    if (resumed_f > 0) {
        o->state = resumed_f;
        printf("--resume: --state %s, as the checkpoint's run\n", mt_state_format_name((mt_state_format)resumed_f));
    }
    int64_t resumed_mb = resumed_micro_batch(o, r->rows);
    if (resumed_mb > 0) {
        o->micro_batch = resumed_mb;
        printf("--resume: micro-batch %lld, as the checkpoint's run (give --micro-batch to choose another)\n",
               (long long)resumed_mb);
    }
    /* with ranks, the plan is one rank's: its rows, its shard of the host state, its share of the
     * host's RAM (the ranks of a host divide it; the smallest share over the hosts, so that every
     * rank plans alike); the GPU budget is its own device's */
    double host_available = mt_run_host_available();
    if (r->ranks > 1 && mt_comm_host_budget(r->comm, host_available, &host_available) != MT_OK) {
        fprintf(stderr, "megatrain: %s\n", mt_error_message());
        mt_comm_abort(r->comm, 1);
    }
    if (r->ranks > 1 && host_available > 0)
        printf("host RAM: %.2f GiB for each rank (the available RAM of its host shared by its %d "
               "ranks; the smallest share of any host)\n",
               host_available / 1073741824.0, mt_comm_local_size(r->comm));
    mt_plan_request rq = {.batch = (int)r->rows, .T = (int)o->seq, .micro_batch = (int)o->micro_batch,
                          .offload = o->offload ? 1 : MT_AUTO, .saved_layers = (int)o->saved_layers,
                          .checkpoint_every = o->checkpoint_every ? o->checkpoint_every : MT_AUTO,
                          .resident = o->resident == 1 ? 1 : o->resident == 2 ? 0 : MT_AUTO,
                          .n_slots = 2, .gpu_mem = o->gpu_mem, .host_available = host_available,
                          .state = (mt_state_format)o->state,
                          .gpu_layers = o->gpu_layers < 0 ? (r->ranks > 1 || r->nccl ? 0 : MT_AUTO) : (int)o->gpu_layers,
                          .ranks = r->ranks,
                          /* packed training rows: their attention backward's pool need (the eval
                             rows only run forwards, whose workspace is none) */
                          .documents = r->data.packed.data != NULL,
                          .lora = r->have_lora ? &r->lora : NULL,
                          .base_format = (mt_base_format)o->base_dtype,
                          .update_on_device = o->update_on == 2 ? MT_AUTO : o->update_on};
    mt_engine_opts eo;
    MT_TRY(phase(r, mt_run_check_memory(&r->model.table, r->be, &rq, &eo)));
    eo.ranks = r->ranks;
    if (o->update_on == 1 && !mt_engine_streams_update(&eo))
        MT_TRY(phase(r, mt_error_set("--update-on gpu: needs --state compact or tight on a GPU, one "
                                     "rank, no LoRA, and the plan's gradients waiting on the GPU "
                                     "(this plan: --state %s, gradients %s)",
                                     mt_state_format_name(eo.state),
                                     eo.grads_on_device ? "on the GPU" : "in host memory")));
    eo.opt_threads = (int)o->threads;
    eo.seed = (uint64_t)o->seed; /* tight's rounding; a resume takes the checkpoint's */
    eo.trace = o->trace_path != NULL;
    eo.comm = r->nccl ? r->nccl : r->ranks > 1 ? r->comm : NULL; /* nccl on the GPUs, else mpi */
    o->micro_batch = eo.micro_batch; /* resolved: for the header and the stored arguments */
    if (r->ranks > 1) /* the planner chose it from this host's memory */
        MT_TRY(phase(r, mt_ranks_check_same(r->comm, &o->micro_batch, sizeof o->micro_batch,
                                             "the micro-batch the planner chose (give --micro-batch)")));
    r->saved_layers = eo.saved_layers;
    r->saved_attention = eo.saved_attention;
    r->checkpoint_every = eo.checkpoint_every;
    /* setup can take minutes at tens of billions of parameters (pinning host memory, drawing the
     * initial weights): say what it is doing, and afterwards how long each part took */
    printf("setting up: the plan's memory%s, then the %s ...\n",
           r->be->memory.host_ram ? "" : " (the host's pinned)",
           o->resume ? "checkpoint" : o->model_dir ? "model's weights" : "random weights");
    fflush(stdout);
    double t_setup = now_ms();
    r->e = mt_engine_create(&r->model.table, r->be, &eo, NULL);
    double t_engine = now_ms();

    r->args_json = mt_train_opts_json(o);
    int resumed = 0;
    /* every rank loads the checkpoint and keeps its shard (so any number of ranks resumes it) */
    if (o->resume) MT_TRY(phase(r, resume(r, &resumed)));
    if (r->ranks > 1)
        MT_TRY(phase(r, mt_ranks_check_same(r->comm, &r->step, sizeof r->step, "the checkpoint step resumed from")));
    /* LoRA: the frozen base is never in a checkpoint, so it is loaded on a resume too */
    if (!resumed || r->have_lora) MT_TRY(phase(r, initial_weights(r)));
    if (r->lora_init && !resumed) mt_lora_state_set(mt_engine_lora(r->e), r->lora_init, NULL, NULL);
    printf("set up in %.1f s: the engine's memory %.1f s, %s %.1f s\n", (now_ms() - t_setup) / 1e3,
           (t_engine - t_setup) / 1e3, resumed ? "the checkpoint" : o->model_dir ? "the model's weights" : "random weights",
           (now_ms() - t_engine) / 1e3);
    MT_TRY(phase(r, r->lead ? mt_train_log_open(&r->log, o->out_dir, o->log_path, o->steps, r->step,
                                                           !o->no_tensorboard) : MT_OK));
    char data_desc[256];
    mt_run_data_describe(&r->data, data_desc, sizeof data_desc);
    printf("training %.1fM parameters on %s: %lld steps of %lld x %lld tokens (micro-batch %lld), "
           "data %s (%s)\n",
           r->model.table.n_real / 1e6, r->be->name, (long long)o->steps, (long long)o->batch,
           (long long)o->seq, (long long)o->micro_batch, o->data, data_desc);
    if (o->eval_split > 0)
        printf("--eval-split %g: %lld of %lld %s held out as the eval set (never trained on), %lld trained\n",
               o->eval_split, (long long)r->data.split.n_eval, (long long)r->data.split.units,
               mt_run_data_split_units(&r->data), (long long)r->data.split.n_train);
    if (r->ranks > 1)
        printf("data parallel: %d ranks (%s), %lld rows of each batch per rank; host state %.0f bytes "
               "on each rank (its shard of every group)\n",
               r->ranks, r->nccl ? "nccl over mpi, one GPU a rank" : mt_comm_name(r->comm),
               (long long)r->rows, mt_engine_host_state_bytes(r->e));
    if (r->nccl && r->ranks == 1)
        printf("comm: nccl on one GPU (MT_COMM=nccl): the schedule's all-gathers, reduce-scatters "
               "and norm all-reduce run through NCCL\n");
    if (r->model.table.cfg.n_experts > 0)
        printf("mixture of experts: %.1fM parameters active per token (TFLOPS count 6 x active x "
               "tokens)\n", (double)mt_config_active_param_count(&r->model.table.cfg) / 1e6);
    printf("host threads: %d (OpenMP wait policy %s)\n", omp_get_max_threads(), mt_process_wait_policy());
    install_signals();
    double t0 = now_ms();
    int rc = train_loop(r);
    char *error = rc == MT_OK ? NULL : mt_strdup(mt_error_message()); /* the summary's notes may fail too */
    print_summary(r, now_ms() - t0);
    if (rc == MT_OK && o->trace_path && r->lead) rc = mt_trace_write_json(mt_engine_trace(r->e), o->trace_path);
    int closed = mt_train_log_close(&r->log); /* the last bytes reach the files only now */
    if (rc == MT_OK) rc = closed;
    if (error) mt_error_set("%s", error);
    free(error);
    return rc;
}

int mt_cmd_train(int argc, char **argv) {
    train_run r;
    memset(&r, 0, sizeof r);
    r.lock.fd = -1;
    /* the ranks first: only rank 0 speaks, and a rank whose flags do not parse ends them all */
    r.comm = mt_ranks_start();
    if (!r.comm) return mt_cli_fail();
    r.rank = mt_comm_rank(r.comm);
    r.ranks = mt_comm_size(r.comm);
    r.lead = r.rank == 0;
    int exit_now = 0;
    int rc = phase(&r, mt_train_opts_parse(&r.o, argc, argv, &exit_now));
    if (rc == MT_OK && !exit_now) rc = train(&r);
    rc = phase(&r, rc); /* the ranks end together, whatever ended each */
    int quiet = r.quiet;
    if (rc != MT_OK && !quiet) mt_cli_fail();
    train_run_free(&r);
    mt_comm_destroy(r.comm);
    return rc == MT_OK ? 0 : 1;
}
