/* megatrain bench fwdbwd: forward+backward tokens/s of the CPU backend on a small model, beside
 * the rate of one plain BLAS sgemm of a layer's shape measured in the same run. */
#include <cblas.h>
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../backend/backend.h"
#include "../core/error.h"
#include "../model/layer.h"
#include "../engine/flops.h"
#include "../model/runner.h"
#include "args.h"
#include "commands.h"
#include "model_source.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The default benchmark model: llama shape, hidden 512, 8 layers, GQA, Llama-2 vocabulary. */
static mt_config default_config(void) {
    mt_config c;
    memset(&c, 0, sizeof c);
    c.arch = MT_ARCH_LLAMA;
    strcpy(c.model_type, "llama");
    c.C = 512; c.F = 1536; c.L = 8; c.H = 8; c.G = 4; c.D = 64; c.V = 32000;
    c.rms_norm_eps = 1e-5f; c.rope_theta = 10000.0; c.rope_type = MT_ROPE_DEFAULT;
    c.max_position_embeddings = 4096; c.initializer_range = 0.02f;
    c.bos_token_id = -1; c.eos_token_id = -1;
    return c;
}

/* GEMM flops one runner step executes with gradients: the forward, the recompute of every
 * layer, and the backward (two GEMMs per forward GEMM; attention: 2 GEMMs forward, 5 backward
 * including the recomputed scores). The CPU attention computes full T x T blocks. */
static double step_gemm_flops(const mt_config *c, int B, int T) {
    double N = (double)B * T;
    double layer_mat = (double)c->C * (c->H * c->D) * 2 + (double)c->C * (c->G * c->D) * 2 +
                       3.0 * c->C * c->F;
    double layer_fwd = 2.0 * N * layer_mat;
    double att_gemm = 2.0 * B * (double)c->H * T * T * c->D; /* one T x T x D product, all heads */
    double layers = c->L * (layer_fwd * 4 + att_gemm * (2 + 2 + 5));
    double head = 2.0 * N * c->C * c->V * 3; /* logits, dinp, dweight */
    return layers + head;
}

static double sgemm_rate(int M, int K, int Ncols) {
    float *a = mt_aligned_alloc((size_t)M * K * 4), *b = mt_aligned_alloc((size_t)Ncols * K * 4),
          *c = mt_aligned_alloc((size_t)M * Ncols * 4);
    for (size_t i = 0; i < (size_t)M * K; i++) a[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)Ncols * K; i++) b[i] = (float)(i % 5) * 0.1f;
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, Ncols, K, 1.0f, a, K, b, K, 0.0f, c,
                    Ncols);
        double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    free(a), free(b), free(c);
    return 2.0 * M * K * Ncols / best;
}

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: megatrain bench fwdbwd [--init CONFIG.json] [--batch B] [--seq T] [--steps N]\n"
            "       megatrain bench adamw [--help]\n"
            "  Times forward+backward (with recompute) of a random-init model on the CPU backend\n"
            "  and prints tokens/s and the GEMM rate beside a plain sgemm of a layer's shape.\n"
            "  Default model: llama, hidden 512, 8 layers, 8 heads (4 kv), MLP 1536, vocab 32000.\n"
            "  --batch B   sequences per step (default 4)\n"
            "  --seq T     tokens per sequence (default 256)\n"
            "  --steps N   timed steps after one warm-up (default 5)\n");
}

int mt_cmd_bench(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "adamw") == 0) return mt_bench_adamw(argc - 1, argv + 1);
    if (argc < 2 || strcmp(argv[1], "fwdbwd") != 0) {
        print_usage(argc >= 2 && !strcmp(argv[1], "--help") ? stdout : stderr);
        return argc >= 2 && !strcmp(argv[1], "--help") ? 0 : 1;
    }
    argc--, argv++;
    const char *init = NULL;
    int64_t B = 4, T = 256, steps = 5;
    static const struct option opts[] = {{"init", required_argument, 0, 'i'},
                                         {"batch", required_argument, 0, 'b'},
                                         {"seq", required_argument, 0, 't'},
                                         {"steps", required_argument, 0, 's'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int rc = MT_OK;
        switch (c) {
        case 'i': init = optarg; break;
        case 'b': rc = mt_arg_int("--batch", optarg, 1, 4096, &B); break;
        case 't': rc = mt_arg_int("--seq", optarg, 1, 1 << 20, &T); break;
        case 's': rc = mt_arg_int("--steps", optarg, 1, 100000, &steps); break;
        case 'h': print_usage(stdout); return 0;
        default: print_usage(stderr); return 1;
        }
        if (rc != MT_OK) return mt_cli_fail();
    }
    mt_host_model m;
    if (init) {
        if (mt_host_model_open(&m, NULL, init, 1234, 1) != MT_OK) return mt_cli_fail();
        if (mt_layer_check_runnable(&m.table.cfg) != MT_OK) {
            mt_host_model_free(&m);
            return mt_cli_fail();
        }
    } else {
        memset(&m, 0, sizeof m);
        mt_config cfg = default_config();
        mt_param_table_init(&m.table, &cfg);
        m.weights = mt_aligned_alloc((size_t)m.table.total * sizeof(float));
        mt_param_init(&m.table, m.weights, cfg.initializer_range, 1234);
    }
    const mt_config *cfg = &m.table.cfg;
    int N = (int)(B * T);
    int32_t *ids = mt_malloc((size_t)N * sizeof(int32_t)), *targets = mt_malloc((size_t)N * sizeof(int32_t));
    uint64_t s = 42;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((s >> 33) % (uint64_t)cfg->V);
    }
    for (int i = 0; i < N; i++) targets[i] = ids[(i + 1) % N];
    mt_backend *be = mt_backend_cpu_create();
    mt_runner r;
    mt_runner_init(&r, &m.table, be, (int)B, (int)T);
    float *grads = mt_aligned_alloc((size_t)m.table.total * sizeof(float));
    memset(grads, 0, (size_t)m.table.total * sizeof(float));

    printf("bench fwdbwd: cpu backend, %d threads, %.1fM parameters, B=%lld T=%lld (%d tokens/step)\n",
           omp_get_max_threads(), m.table.n_real / 1e6, (long long)B, (long long)T, N);
    double loss = mt_runner_step(&r, m.weights, grads, ids, targets, (int)B, 0, NULL) / N;
    double best = 1e30, total = 0;
    for (int i = 0; i < steps; i++) {
        double t0 = now_s();
        mt_runner_step(&r, m.weights, grads, ids, targets, (int)B, 0, NULL);
        double dt = now_s() - t0;
        total += dt;
        if (dt < best) best = dt;
    }
    double mean = total / steps;
    double flops = step_gemm_flops(cfg, (int)B, (int)T);
    double model_flops = mt_flops_6nt((double)m.table.n_real, N);
    double attn_flops = model_flops + mt_flops_attention(cfg, NULL, (int)B, (int)T);
    double ref = sgemm_rate(N, cfg->C, cfg->F);
    printf("loss %.4f (ln V = %.4f)\n", loss, __builtin_log((double)cfg->V));
    printf("step: mean %.1f ms, best %.1f ms | %.0f tokens/s | 6NT %.1f GFLOP/s, with causal attention "
           "%.1f GFLOP/s\n",
           mean * 1e3, best * 1e3, N / mean, model_flops / mean / 1e9, attn_flops / mean / 1e9);
    printf("GEMM work %.1f GFLOP/step -> %.1f GFLOP/s; plain sgemm %dx%dx%d: %.1f GFLOP/s (%.0f%%)\n",
           flops / 1e9, flops / mean / 1e9, N, cfg->F, cfg->C, ref / 1e9, 100.0 * flops / mean / ref);
    mt_runner_free(&r);
    be->destroy(be);
    free(grads), free(ids), free(targets);
    mt_host_model_free(&m);
    return 0;
}
