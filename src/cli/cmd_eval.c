/* megatrain eval: the mean loss of a model on token data (held-out evaluation). */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../backend/backend.h"
#include "../core/error.h"
#include "../io/lora_io.h"
#include "../model/layer.h"
#include "data/tokens.h"
#include "../model/runner.h"
#include "args.h"
#include "commands.h"
#include "model_source.h"
#include "data/run_data.h"
#include "run_setup.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: megatrain eval --model DIR|ORG/NAME --data PATH [--batch B] [--seq T] [--batches N]\n"
            "                      [--adapter DIR]\n"
            "                      [--doc-sep LINE] [--loss-on assistant|all] [--chat-format F]\n"
            "                      [--long truncate|skip] [--pack whole|split]\n"
            "  Mean cross-entropy (and perplexity) over non-overlapping rows of T+1 tokens of PATH:\n"
            "  a token file, text / JSONL (tokenized with the model's tokenizer.json, or as bytes),\n"
            "  chat JSONL (\"messages\"; packed as train packs it, the loss on the targets it trains:\n"
            "  the assistant replies by default; --pack whole, the default, keeps each conversation in\n"
            "  one row, --pack split cuts their stream into rows), or packed rows from `megatrain\n"
            "  tokenize --chat` (--seq must be theirs). Text and chat data are tokenized into a\n"
            "  temporary directory, removed at the end. Defaults: B 8, T 1024 (capped by the model),\n"
            "  N all rows.\n"
            "  --adapter DIR: the model with a PEFT LoRA adapter (a LoRA run's checkpoint), folded\n"
            "  into its fp32 weights as merge does (the adapted model's function).\n"
            "  --model ORG/NAME [--revision R]: a model in the Hugging Face hub cache, offline\n"
            "  ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub; R: ref or commit,\n"
            "  default main)\n");
}

/* The files of a flat directory, then the directory. */
static void remove_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(path);
}

int mt_cmd_eval(int argc, char **argv) {
    const char *model_dir = NULL, *data = NULL, *adapter = NULL;
    const char *revision = NULL;
    int64_t B = 8, T = 0, batches = 0;
    mt_run_data_opts dopts = {0};
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"revision", required_argument, 0, 'R'},
                                         {"data", required_argument, 0, 'd'},
                                         {"batch", required_argument, 0, 'b'},
                                         {"seq", required_argument, 0, 't'},
                                         {"batches", required_argument, 0, 'n'},
                                         {"doc-sep", required_argument, 0, 's'},
                                         {"loss-on", required_argument, 0, 'l'},
                                         {"chat-format", required_argument, 0, 'f'},
                                         {"long", required_argument, 0, 'g'},
                                         {"pack", required_argument, 0, 'p'},
                                         {"adapter", required_argument, 0, 'a'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int rc = MT_OK;
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'R': revision = optarg; break;
        case 'd': data = optarg; break;
        case 'a': adapter = optarg; break;
        case 's': dopts.doc_sep = optarg; break;
        case 'l': rc = mt_arg_named("--loss-on", mt_chat_loss_on_parse(optarg, &dopts.loss_on)); break;
        case 'f': rc = mt_arg_named("--chat-format", mt_chat_format_parse(optarg, &dopts.chat_format)); break;
        case 'g': rc = mt_arg_named("--long", mt_long_policy_parse(optarg, &dopts.long_policy)); break;
        case 'p': rc = mt_arg_named("--pack", mt_pack_policy_parse(optarg, &dopts.pack)); break;
        case 'b': rc = mt_arg_int("--batch", optarg, 1, 1 << 20, &B); break;
        case 't': rc = mt_arg_int("--seq", optarg, 1, 1 << 24, &T); break;
        case 'n': rc = mt_arg_int("--batches", optarg, 1, (int64_t)1 << 40, &batches); break;
        case 'h': print_usage(stdout); return 0;
        default: print_usage(stderr); return 1;
        }
        if (rc != MT_OK) return mt_cli_fail();
        dopts.chat_flags |= c == 'l' || c == 'f' || c == 'g' || c == 'p';
    }
    if (!model_dir || !data || optind < argc) {
        print_usage(stderr);
        return 1;
    }
    mt_host_model m;
    if (mt_model_resolve(model_dir, revision, &model_dir) != MT_OK) return mt_cli_fail();
    if (mt_host_model_open(&m, model_dir, NULL, 0, 1) != MT_OK) return mt_cli_fail();
    const mt_config *cfg = &m.table.cfg;
    if (mt_layer_check_runnable(cfg) != MT_OK) {
        mt_host_model_free(&m);
        return mt_cli_fail();
    }
    if (adapter) { /* the adapted model: W + scale B A, as PEFT computes it */
        mt_lora_table lt;
        float *arena;
        if (mt_lora_load_dir(adapter, &m.table, &lt, &arena) != MT_OK) {
            mt_host_model_free(&m);
            return mt_cli_fail();
        }
        mt_lora_merge(&lt, arena, &m.table, m.weights);
        printf("adapter %s: rank %d, alpha %g on %d modules\n", adapter, lt.rank, lt.alpha, lt.n_modules);
        mt_lora_table_free(&lt);
        free(arena);
    }
    if (!T) T = mt_plan_default_seq(cfg); /* as train and plan */
    mt_run_data f = {0};
    char scratch[] = "/tmp/megatrain_eval_XXXXXX"; /* derived files: private, removed at the end */
    if (!mkdtemp(scratch)) {
        mt_host_model_free(&m);
        mt_error_set("%s: cannot create a temporary directory: %s", scratch, strerror(errno));
        return mt_cli_fail();
    }
    dopts.out_dir = scratch;
    dopts.model_dir = model_dir;
    dopts.T = (int)T;
    int rc = mt_run_check_seq(cfg, (int)T, "--seq");
    if (rc == MT_OK) rc = mt_run_data_check_file("--data", data);
    if (rc == MT_OK) rc = mt_run_data_open(&f, data, &dopts, cfg);
    remove_dir(scratch); /* what was opened stays mapped */
    if (rc != MT_OK) {
        mt_host_model_free(&m);
        return mt_cli_fail();
    }
    int64_t rows = mt_run_data_eval_rows(&f, (int)T), all = (rows + B - 1) / B;
    if (!batches || batches > all) batches = all;
    mt_backend *be = mt_backend_cpu_create();
    mt_runner r;
    mt_runner_init(&r, &m.table, be, (int)B, (int)T);
    int32_t *in = mt_malloc((size_t)(B * T) * sizeof(int32_t)), *tg = mt_malloc((size_t)(B * T) * sizeof(int32_t));
    double sum = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < batches; i++) {
        const int32_t *docs = mt_run_data_eval_batch(&f, i * B, (int)B, (int)T, in, tg);
        if (docs) MT_CHECK(mt_runner_set_documents(&r, docs) == MT_OK, "%s", mt_error_message());
        int64_t n;
        sum += mt_runner_step(&r, m.weights, NULL, in, tg, (int)B, 0, &n);
        count += n;
    }
    double loss = count ? sum / count : NAN;
    printf("eval %s on %s: loss %.6f, perplexity %.2f, %lld tokens\n", model_dir, data, loss, exp(loss),
           (long long)count);
    free(in), free(tg);
    mt_runner_free(&r);
    be->destroy(be);
    mt_run_data_close(&f);
    mt_host_model_free(&m);
    return 0;
}
