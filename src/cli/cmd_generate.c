/* megatrain generate: text from a trained model (greedy or top-k sampling), on the CPU. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../backend/backend.h"
#include "../core/error.h"
#include "../model/layer.h"
#include "../model/runner.h"
#include "../tokenizer/tokenizer.h"
#include "args.h"
#include "commands.h"
#include "model_source.h"

#define BYTE_EOS 256

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: megatrain generate --model DIR|ORG/NAME [--prompt TEXT] [--tokens N] [--top-k K]\n"
            "                          [--temperature X] [--context T] [--seed N] [--ignore-eos]\n"
            "  Continues the prompt. With DIR/tokenizer.json the prompt is encoded as\n"
            "  tokenizer(prompt) (bos prefix included) and the output decoded as it comes; without\n"
            "  one the model speaks byte-level tokens (vocabulary > 256, eos 256). --top-k 1 is\n"
            "  greedy (default 40), --temperature 0.8, --tokens 200, --context 256 (tokens of\n"
            "  history the model sees). The tokenizer's eos stops generation, or, with\n"
            "  --ignore-eos, prints as a blank line.\n"
            "  --model ORG/NAME [--revision R]: a model in the Hugging Face hub cache, offline\n"
            "  ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub; R: ref or commit,\n"
            "  default main)\n");
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

/* The text side of generation: the tokenizer.json of the model directory, or byte-level tokens. */
typedef struct {
    mt_tokenizer *tok; /* NULL: byte-level */
    int eos;           /* -1: none (nothing stops generation early) */
    int32_t *ids;      /* the prompt, then every generated token */
    size_t n, cap;
    size_t start, shown; /* decode window: bytes of decode(ids[start..n)) already printed */
} gen_text;

static void gen_push(gen_text *g, int32_t id) {
    if (g->n == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 256;
        g->ids = realloc(g->ids, g->cap * sizeof(int32_t));
        MT_CHECK(g->ids, "out of memory");
    }
    g->ids[g->n++] = id;
}

/* Length of decode(ids[start..n)) (special tokens skipped) into *text (malloc'd). */
static size_t decode_tail(const gen_text *g, char **text) {
    size_t len = 0;
    if (mt_tokenizer_decode(g->tok, g->ids + g->start, g->n - g->start, MT_TOK_SKIP_SPECIAL, text, &len) !=
        MT_OK)
        MT_CHECK(0, "decode of sampled ids failed: %s", mt_error_message()); /* ids < vocab by construction */
    return len;
}

static int open_text(gen_text *g, const char *model_dir, int V, const char *prompt) {
    size_t plen = strlen(prompt);
    if (!has_tokenizer(model_dir)) {
        if (V <= BYTE_EOS)
            return mt_error_set("%s: no tokenizer.json, and the vocabulary (%d) is too small for "
                                "byte-level tokens (257)", model_dir, V);
        g->eos = BYTE_EOS;
        for (size_t i = 0; i < plen; i++) gen_push(g, (unsigned char)prompt[i]);
        if (g->n == 0) gen_push(g, BYTE_EOS); /* start of a document */
        return MT_OK;
    }
    MT_TRY(mt_tokenizer_load(&g->tok, model_dir));
    int tv = mt_tokenizer_vocab_size(g->tok);
    if (tv > V) {
        mt_tokenizer_free(g->tok);
        g->tok = NULL;
        return mt_error_set("%s/tokenizer.json: the tokenizer has %d ids but the model's vocabulary is %d",
                            model_dir, tv, V);
    }
    g->eos = mt_tokenizer_eos(g->tok);
    /* as the training data: tokenizer(text) with its post-processor (bos prefix) */
    mt_token_vec v = {0};
    mt_tokenizer_encode_into(g->tok, prompt, plen, 1, &v);
    for (size_t i = 0; i < v.n; i++) gen_push(g, v.ids[i]);
    mt_token_vec_free(&v);
    if (g->n == 0 && g->eos >= 0) gen_push(g, g->eos); /* start of a document, as after an eos */
    if (g->n == 0) {
        mt_tokenizer_free(g->tok);
        g->tok = NULL;
        return mt_error_set("--prompt: the tokenizer has no bos or eos to start from; give a prompt");
    }
    char *text;
    g->shown = decode_tail(g, &text);
    free(text);
    return MT_OK;
}

/* Prints what token id adds to the text, as soon as it is known. */
static void emit_token(gen_text *g, int id) {
    if (id == g->eos) fputs("\n\n", stdout); /* only with --ignore-eos */
    if (!g->tok) {
        if (id < 256) fputc(id, stdout);
        else if (id != g->eos) fputc('\n', stdout); /* another special id */
        gen_push(g, id);
        fflush(stdout);
        return;
    }
    gen_push(g, id);
    char *text;
    size_t len = decode_tail(g, &text);
    if (len > g->shown) fwrite(text + g->shown, 1, len - g->shown, stdout);
    if (len > g->shown) g->shown = len;
    free(text);
    if (g->n - g->start > 256) { /* keep each decode short: restart the window near the end */
        g->start = g->n - 16;
        g->shown = decode_tail(g, &text);
        free(text);
    }
    fflush(stdout);
}

static void gen_text_free(gen_text *g) {
    mt_tokenizer_free(g->tok);
    free(g->ids);
}

int mt_cmd_generate(int argc, char **argv) {
    const char *model_dir = NULL, *prompt = "";
    const char *revision = NULL;
    int64_t n_tokens = 200, top_k = 40, ctx = 256, seed = 1;
    double temperature = 0.8;
    int ignore_eos = 0;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"revision", required_argument, 0, 'R'},
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
        case 'R': revision = optarg; break;
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
    if (mt_model_resolve(model_dir, revision, &model_dir) != MT_OK) return mt_cli_fail();
    if (mt_host_model_open(&m, model_dir, NULL, 0, 1) != MT_OK) return mt_cli_fail();
    if (mt_layer_check_runnable(&m.table.cfg) != MT_OK) {
        mt_host_model_free(&m);
        return mt_cli_fail();
    }
    int V = m.table.cfg.V, rc = 0;
    gen_text g = {0};
    if (open_text(&g, model_dir, V, prompt) != MT_OK) {
        mt_host_model_free(&m);
        return mt_cli_fail();
    }
    int Vs = g.tok ? mt_tokenizer_vocab_size(g.tok) : V; /* sample only ids the tokenizer knows */
    if (top_k > Vs) top_k = Vs;
    int T = (int)ctx;
    int32_t *window = mt_calloc((size_t)T, sizeof(int32_t));
    int n = 0;
    for (size_t i = g.n > (size_t)T - 1 ? g.n - (T - 1) : 0; i < g.n; i++) window[n++] = g.ids[i];
    mt_backend *be = mt_backend_cpu_create();
    mt_runner r;
    mt_runner_init(&r, &m.table, be, 1, T);
    float *logits = mt_malloc((size_t)T * V * sizeof(float));
    uint64_t rng = (uint64_t)seed;
    fputs(prompt, stdout);
    fflush(stdout);
    for (int64_t i = 0; i < n_tokens; i++) {
        /* causal attention: positions past n - 1 do not change the logits at n - 1 */
        mt_runner_logits(&r, m.weights, window, 1, logits);
        int next = sample(logits + (size_t)(n - 1) * V, Vs, (int)top_k, temperature, &rng);
        if (next == g.eos && !ignore_eos) break;
        emit_token(&g, next);
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
    gen_text_free(&g);
    mt_host_model_free(&m);
    return rc;
}
