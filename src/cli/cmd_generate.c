/* megatrain generate: text from a trained model (greedy or top-k sampling), on the CPU. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../backend/backend.h"
#include "../core/error.h"
#include "../io/byte_text.h"
#include "../model/runner.h"
#include "args.h"
#include "commands.h"
#include "model_source.h"

#define BYTE_EOS 256

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: megatrain generate --model DIR [--prompt TEXT] [--tokens N] [--top-k K]\n"
            "                          [--temperature X] [--context T] [--seed N] [--ignore-eos]\n"
            "  Continues the prompt with a model trained on byte-level tokens (vocabulary > 256,\n"
            "  no tokenizer.json). --top-k 1 is greedy (default 40), --temperature 0.8,\n"
            "  --tokens 200, --context 256 (tokens of history the model sees). The end-of-text\n"
            "  token stops generation, or, with --ignore-eos, prints as a blank line.\n");
}

static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Samples from the k most likely tokens of `logits` at `temperature` (k = 1: greedy). */
static int sample(const float *logits, int V, int k, double temperature, uint64_t *rng) {
    int *top = mt_malloc((size_t)k * sizeof(int));
    int n = 0;
    for (int v = 0; v < V; v++) { /* insertion into a small sorted list: k is small */
        int pos = n < k ? n++ : k;
        while (pos > 0 && logits[top[pos - 1]] < logits[v]) {
            if (pos < k) top[pos] = top[pos - 1];
            pos--;
        }
        if (pos < k) top[pos] = v;
    }
    double *p = mt_malloc((size_t)n * sizeof(double)), sum = 0;
    for (int i = 0; i < n; i++) sum += p[i] = exp((logits[top[i]] - logits[top[0]]) / temperature);
    double u = (next_u64(rng) >> 11) * (1.0 / 9007199254740992.0) * sum;
    int pick = top[n - 1];
    for (int i = 0; i < n; i++) {
        if ((u -= p[i]) <= 0) {
            pick = top[i];
            break;
        }
    }
    free(top), free(p);
    return pick;
}

static int has_tokenizer(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    return access(path, R_OK) == 0;
}

int mt_cmd_generate(int argc, char **argv) {
    const char *model_dir = NULL, *prompt = "";
    int64_t n_tokens = 200, top_k = 40, ctx = 256, seed = 1;
    double temperature = 0.8;
    int ignore_eos = 0;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"prompt", required_argument, 0, 'p'},
                                         {"tokens", required_argument, 0, 'n'},
                                         {"top-k", required_argument, 0, 'k'},
                                         {"temperature", required_argument, 0, 't'},
                                         {"context", required_argument, 0, 'c'},
                                         {"seed", required_argument, 0, 's'},
                                         {"ignore-eos", no_argument, 0, 'e'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int rc = MT_OK;
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n': rc = mt_arg_int("--tokens", optarg, 0, 1 << 20, &n_tokens); break;
        case 'k': rc = mt_arg_int("--top-k", optarg, 1, 1 << 20, &top_k); break;
        case 't': rc = mt_arg_float("--temperature", optarg, 1e-3, 100, &temperature); break;
        case 'c': rc = mt_arg_int("--context", optarg, 1, 1 << 16, &ctx); break;
        case 's': rc = mt_arg_int("--seed", optarg, 0, INT64_MAX, &seed); break;
        case 'e': ignore_eos = 1; break;
        case 'h': print_usage(stdout); return 0;
        default: print_usage(stderr); return 1;
        }
        if (rc != MT_OK) return mt_cli_fail();
    }
    if (!model_dir || optind < argc) {
        print_usage(stderr);
        return 1;
    }
    mt_host_model m;
    if (mt_host_model_open(&m, model_dir, NULL, 0, 1) != MT_OK) return mt_cli_fail();
    int V = m.table.cfg.V, rc = 0;
    if (V <= BYTE_EOS || has_tokenizer(model_dir)) {
        mt_error_set("%s: generate speaks byte-level models only until tokenizer.json support lands",
                     model_dir);
        mt_host_model_free(&m);
        return mt_cli_fail();
    }
    if (top_k > V) top_k = V;
    int T = (int)ctx;
    int32_t *window = mt_calloc((size_t)T, sizeof(int32_t));
    int n = 0;
    size_t plen = strlen(prompt);
    for (size_t i = plen > (size_t)T - 1 ? plen - (T - 1) : 0; i < plen; i++) window[n++] = (unsigned char)prompt[i];
    if (n == 0) window[n++] = BYTE_EOS; /* start of a document */
    mt_backend *be = mt_backend_cpu_create();
    mt_runner r;
    mt_runner_init(&r, &m.table, be, 1, T);
    float *logits = mt_malloc((size_t)T * V * sizeof(float));
    uint64_t rng = (uint64_t)seed;
    fputs(prompt, stdout);
    for (int64_t i = 0; i < n_tokens; i++) {
        /* causal attention: positions past n - 1 do not change the logits at n - 1 */
        mt_runner_logits(&r, m.weights, window, 1, logits);
        int next = sample(logits + (size_t)(n - 1) * V, V, (int)top_k, temperature, &rng);
        if (next == BYTE_EOS && !ignore_eos) break;
        char ch[4];
        int32_t id = next;
        mt_byte_text_decode(&id, 1, ch, sizeof ch);
        fputs(next == BYTE_EOS ? "\n\n" : ch, stdout);
        fflush(stdout);
        if (n == T) {
            memmove(window, window + 1, (size_t)(T - 1) * sizeof(int32_t));
            n--;
        }
        window[n++] = next;
    }
    fputc('\n', stdout);
    mt_runner_free(&r);
    be->destroy(be);
    free(window), free(logits);
    mt_host_model_free(&m);
    return rc;
}
