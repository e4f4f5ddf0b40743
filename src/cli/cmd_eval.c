/* megatrain eval: the mean loss of a model on token data (held-out evaluation). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../backend/backend.h"
#include "../core/error.h"
#include "../io/tokens.h"
#include "../model/runner.h"
#include "args.h"
#include "commands.h"
#include "model_source.h"
#include "run_setup.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: megatrain eval --model DIR --data PATH [--batch B] [--seq T] [--batches N]\n"
            "                      [--doc-sep LINE]\n"
            "  Mean cross-entropy (and perplexity) over non-overlapping rows of T+1 tokens of PATH\n"
            "  (token file, or text as byte-level tokens). Defaults: B 8, T 1024 (capped by the\n"
            "  model), N all rows.\n");
}

int mt_cmd_eval(int argc, char **argv) {
    const char *model_dir = NULL, *data = NULL, *doc_sep = NULL;
    int64_t B = 8, T = 0, batches = 0;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"data", required_argument, 0, 'd'},
                                         {"batch", required_argument, 0, 'b'},
                                         {"seq", required_argument, 0, 't'},
                                         {"batches", required_argument, 0, 'n'},
                                         {"doc-sep", required_argument, 0, 's'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int rc = MT_OK;
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'd': data = optarg; break;
        case 's': doc_sep = optarg; break;
        case 'b': rc = mt_arg_int("--batch", optarg, 1, 1 << 20, &B); break;
        case 't': rc = mt_arg_int("--seq", optarg, 1, 1 << 24, &T); break;
        case 'n': rc = mt_arg_int("--batches", optarg, 1, (int64_t)1 << 40, &batches); break;
        case 'h': print_usage(stdout); return 0;
        default: print_usage(stderr); return 1;
        }
        if (rc != MT_OK) return mt_cli_fail();
    }
    if (!model_dir || !data || optind < argc) {
        print_usage(stderr);
        return 1;
    }
    mt_host_model m;
    if (mt_host_model_open(&m, model_dir, NULL, 0, 1) != MT_OK) return mt_cli_fail();
    const mt_config *cfg = &m.table.cfg;
    if (!T) T = cfg->max_position_embeddings < 1024 ? cfg->max_position_embeddings : 1024;
    mt_token_file f = {0};
    if (mt_run_check_seq(cfg, (int)T, "--seq") != MT_OK ||
        mt_run_open_data(&f, data, "/tmp", doc_sep, cfg, model_dir) != MT_OK) {
        mt_host_model_free(&m);
        return mt_cli_fail();
    }
    int64_t rows = mt_tokens_eval_rows(&f, (int)T), all = (rows + B - 1) / B;
    if (!batches || batches > all) batches = all;
    mt_backend *be = mt_backend_cpu_create();
    mt_runner r;
    mt_runner_init(&r, &m.table, be, (int)B, (int)T);
    int32_t *in = mt_malloc((size_t)(B * T) * sizeof(int32_t)), *tg = mt_malloc((size_t)(B * T) * sizeof(int32_t));
    double sum = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < batches; i++) {
        mt_tokens_eval_batch(&f, i * B, (int)B, (int)T, in, tg);
        int64_t n;
        sum += mt_runner_step(&r, m.weights, NULL, in, tg, (int)B, 0, &n);
        count += n;
    }
    double loss = count ? sum / count : NAN;
    printf("eval %s on %s: loss %.4f, perplexity %.2f, %lld tokens\n", model_dir, data, loss, exp(loss),
           (long long)count);
    free(in), free(tg);
    mt_runner_free(&r);
    be->destroy(be);
    mt_tokens_close(&f);
    mt_host_model_free(&m);
    return 0;
}
