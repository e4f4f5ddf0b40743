#include "run_setup.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "../io/byte_text.h"
#include "../io/text_data.h"
#include "../tokenizer/tokenizer.h"

#define BYTE_EOS 256

int mt_run_make_dir(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return mt_error_set("%s: path too long", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return mt_error_set("%s: cannot create: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return mt_error_set("%s: cannot create: %s", buf, strerror(errno));
    return MT_OK;
}

int mt_run_check_seq(const mt_config *cfg, int T, const char *flag) {
    if (T < 1) return mt_error_set("%s: %d is not a sequence length", flag, T);
    if (cfg->sliding_window > 0 && T > cfg->sliding_window)
        return mt_error_set("%s: %d is longer than the model's sliding_window %d, which this runtime "
                            "does not implement; use %s %d or less",
                            flag, T, cfg->sliding_window, flag, cfg->sliding_window);
    if (T > cfg->max_position_embeddings)
        fprintf(stderr, "megatrain: warning: %s %d is longer than max_position_embeddings %d\n", flag, T,
                cfg->max_position_embeddings);
    return MT_OK;
}

static int is_token_file(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot && (!strcmp(dot, ".bin") || !strcmp(dot, ".tokens"));
}

/* The identity of a tokenized cache: what it was made from and how. Stored beside the cache as
 * <cache>.json; the cache is re-used only when every field matches and it is newer than the source. */
typedef struct {
    char source[4096], tokenizer[4096];
    long long source_size, source_mtime_ns, tok_size, tok_mtime_ns, cache_size;
    const char *doc_sep;
    int elem_size, vocab;
} cache_key;

static long long mtime_ns(const struct stat *st) {
    return (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
}

static int cache_key_of(cache_key *k, const char *path, const char *tok_json, const char *doc_sep,
                        int elem_size, int vocab) {
    struct stat st;
    if (stat(path, &st) != 0) return mt_error_set("%s: cannot open: %s", path, strerror(errno));
    if (!realpath(path, k->source)) snprintf(k->source, sizeof k->source, "%s", path);
    k->source_size = (long long)st.st_size, k->source_mtime_ns = mtime_ns(&st);
    if (stat(tok_json, &st) != 0) return mt_error_set("%s: cannot open: %s", tok_json, strerror(errno));
    if (!realpath(tok_json, k->tokenizer)) snprintf(k->tokenizer, sizeof k->tokenizer, "%s", tok_json);
    k->tok_size = (long long)st.st_size, k->tok_mtime_ns = mtime_ns(&st);
    k->doc_sep = doc_sep, k->elem_size = elem_size, k->vocab = vocab;
    return MT_OK;
}

static json_t *cache_key_json(const cache_key *k) {
    return json_pack("{s:i, s:s, s:I, s:I, s:s, s:I, s:I, s:o, s:i, s:i, s:b, s:I}", "format", 1, "source",
                     k->source, "source_size", (json_int_t)k->source_size, "source_mtime_ns",
                     (json_int_t)k->source_mtime_ns, "tokenizer", k->tokenizer, "tokenizer_size",
                     (json_int_t)k->tok_size, "tokenizer_mtime_ns", (json_int_t)k->tok_mtime_ns, "doc_sep",
                     k->doc_sep ? json_string(k->doc_sep) : json_null(), "elem_size", k->elem_size,
                     "model_vocab", k->vocab, "add_special", 1, "cache_size", (json_int_t)k->cache_size);
}

/* 1 when cache and its sidecar exist and the sidecar says k (the exact source size and mtime, the
 * tokenizer file, --doc-sep, the element size) with the cache's current size. */
static int cache_fresh(const char *cache, const char *sidecar, cache_key *k) {
    struct stat st;
    if (stat(cache, &st) != 0) return 0;
    k->cache_size = (long long)st.st_size;
    json_t *have = json_load_file(sidecar, 0, NULL), *want = cache_key_json(k);
    int same = have && want && json_equal(have, want);
    json_decref(have), json_decref(want);
    return same;
}

static int tokenize_cached(mt_token_file *f, const char *path, const char *cache, const char *tok_json,
                           const char *doc_sep, const mt_config *cfg) {
    char sidecar[4200];
    snprintf(sidecar, sizeof sidecar, "%s.json", cache);
    int elem_size = mt_tokens_elem_size_for_vocab(cfg->V);
    cache_key k = {0};
    MT_TRY(cache_key_of(&k, path, tok_json, doc_sep, elem_size, cfg->V));
    if (cache_fresh(cache, sidecar, &k)) {
        printf("%s: using the tokenized cache %s\n", path, cache);
        return mt_tokens_open(f, cache, elem_size, cfg->V);
    }
    mt_tokenizer *tok;
    MT_TRY(mt_tokenizer_load(&tok, tok_json));
    int vocab = mt_tokenizer_vocab_size(tok);
    if (vocab > cfg->V) {
        mt_tokenizer_free(tok);
        return mt_error_set("%s: the tokenizer has %d ids but the model's vocabulary (vocab_size) is %d",
                            tok_json, vocab, cfg->V);
    }
    unlink(sidecar); /* a crash from here on leaves no sidecar, so no stale cache is trusted */
    mt_text_opts o = mt_text_opts_default();
    o.doc_sep = doc_sep;
    o.elem_size = elem_size;
    o.progress = mt_text_progress_stderr;
    mt_text_stats s;
    int rc = mt_text_to_tokens(tok, &path, 1, cache, &o, &s);
    mt_tokenizer_free(tok);
    mt_text_stats_report(&s, "megatrain: warning: ", stderr);
    MT_TRY(rc);
    printf("%s: %lld tokens from %lld documents (%s, %.0f tokens/s) -> %s\n", path, (long long)s.tokens,
           (long long)s.documents, tok_json, s.seconds > 0 ? s.tokens / s.seconds : 0.0, cache);
    /* the sidecar last: a crash before its rename leaves none, so the cache is remade */
    struct stat st;
    if (stat(cache, &st) != 0) return mt_error_set("%s: cannot stat: %s", cache, strerror(errno));
    k.cache_size = (long long)st.st_size;
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", sidecar);
    json_t *j = cache_key_json(&k);
    rc = json_dump_file(j, tmp, JSON_INDENT(2)) == 0 && rename(tmp, sidecar) == 0 ? MT_OK : MT_ERR;
    json_decref(j);
    if (rc != MT_OK) {
        unlink(tmp);
        return mt_error_set("%s: cannot write: %s", sidecar, strerror(errno));
    }
    return mt_tokens_open(f, cache, elem_size, cfg->V);
}

int mt_run_open_data(mt_token_file *f, const char *path, const char *out_dir, const char *doc_sep,
                     const mt_config *cfg, const char *model_dir) {
    if (is_token_file(path)) return mt_tokens_open(f, path, mt_tokens_elem_size_for_vocab(cfg->V), cfg->V);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char cache[4096], tok_json[4096] = "";
    if (snprintf(cache, sizeof cache, "%s/%s.tokens.bin", out_dir, base) >= (int)sizeof cache)
        return mt_error_set("%s: path too long", out_dir);
    if (model_dir) snprintf(tok_json, sizeof tok_json, "%s/tokenizer.json", model_dir);
    if (model_dir && access(tok_json, F_OK) == 0)
        return tokenize_cached(f, path, cache, tok_json, doc_sep, cfg);

    if (cfg->V <= BYTE_EOS)
        return mt_error_set("%s: text data needs a tokenizer; this model's vocabulary (%d) is too small "
                            "for byte-level tokens (257) and %s has no tokenizer.json; give a token file "
                            "(.bin)", path, cfg->V, model_dir ? model_dir : "--init");
    char sidecar[4200];
    snprintf(sidecar, sizeof sidecar, "%s.json", cache);
    unlink(sidecar); /* the byte-level file replaces any tokenizer cache of the same name */
    int64_t n;
    const char *paths[1] = {path};
    if (mt_text_is_jsonl(path)) {
        mt_text_opts o = mt_text_opts_default();
        o.eos_id = BYTE_EOS;
        mt_text_stats s;
        int rc = mt_text_to_tokens(NULL, paths, 1, cache, &o, &s);
        mt_text_stats_report(&s, "megatrain: warning: ", stderr);
        MT_TRY(rc);
        n = s.tokens;
    } else {
        MT_TRY(mt_byte_text_to_tokens(paths, 1, cache, doc_sep, BYTE_EOS, &n));
    }
    printf("%s: %lld byte-level tokens -> %s\n", path, (long long)n, cache);
    return mt_tokens_open(f, cache, 2, cfg->V);
}

int mt_run_backend(mt_backend **out, int device, int64_t gpu_mem) {
#ifdef MT_HAVE_CUDA
    int have_gpu = mt_backend_cuda_available();
    if (device == 2 && !have_gpu) return mt_error_set("--device cuda: no usable CUDA device found");
    if (have_gpu && device != 1) {
        *out = mt_backend_cuda_create(gpu_mem);
        return MT_OK;
    }
#else
    if (device == 2)
        return mt_error_set("--device cuda: this build has no CUDA backend (nvcc was not found at build time)");
#endif
    if (gpu_mem && device == 1) return mt_error_set("--gpu-mem applies to the cuda device, not --device cpu");
    *out = mt_backend_cpu_create();
    return MT_OK;
}

static double mem_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    double kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* cuBLASLt workspace and the LM head's logits chunk (lm_head_loss.cu), outside the engine's plan. */
#define CUDA_LIBRARY_SCRATCH (1.5 * 1073741824.0 + 64 * 1048576.0)

/* Left free under the budget when choosing saved layers: the attention backward's scratch and
 * small temporaries come from the stream-ordered pool, outside be->alloc's accounting. */
#define CUDA_POOL_HEADROOM (2.0 * 1073741824.0)

/* --saved-layers auto: as many layers as the memory left under the budget holds (none on the cpu
 * backend, where recompute costs less than the extra RAM traffic is worth measuring). */
static int auto_saved_layers(const mt_param_table *t, mt_backend *be, const mt_engine_opts *eo,
                             const mt_engine_plan *p, double scratch) {
    if (eo->offload || be->mem_budget <= 0) return 0;
    double left = (double)be->mem_budget - (p->dev_total + scratch) - CUDA_POOL_HEADROOM;
    if (left <= 0 || p->dev_saved_per_layer <= 0) return 0;
    double k = floor(left / p->dev_saved_per_layer);
    return k >= t->cfg.L ? t->cfg.L : (int)k;
}

int mt_run_check_memory(const mt_param_table *t, mt_backend *be, mt_engine_opts *eo,
                        int64_t gpu_budget) {
    int host_compute = strcmp(be->name, "cpu") == 0;
    double scratch = host_compute ? 0 : CUDA_LIBRARY_SCRATCH;
    int want_saved = eo->saved_layers;
    mt_engine_plan p;
    eo->saved_layers = 0;
    mt_engine_plan_of(t, be->dtype, eo, &p);
    if (!host_compute && gpu_budget > 0 && !eo->offload && p.dev_total + scratch > (double)gpu_budget) {
        /* short of GPU memory: the layer checkpoints go to pinned host memory */
        eo->offload = 1;
        mt_engine_plan_of(t, be->dtype, eo, &p);
    }
    if (want_saved > 0 && eo->offload)
        return mt_error_set("--saved-layers %d: the layer checkpoints are offloaded (--gpu-mem short or "
                            "--offload-checkpoints), so no layer can keep its internals; use 0 or auto",
                            want_saved);
    if (want_saved > t->cfg.L)
        return mt_error_set("--saved-layers %d: the model has %d layers", want_saved, t->cfg.L);
    eo->saved_layers = want_saved < 0 ? auto_saved_layers(t, be, eo, &p, scratch) : want_saved;
    mt_engine_plan_of(t, be->dtype, eo, &p);
    double n = (double)t->n_real, gb = 1e9;
    double host = p.host_total + (host_compute ? p.dev_total : 0);
    printf("memory plan: host %.2f GB (%.1f B/param: master %.2f, moments %.2f, upload copy %.2f%s)%s\n",
           host / gb, p.host_total / n, p.host_master / gb, p.host_moments / gb, p.host_upload / gb,
           eo->offload ? ", layer checkpoints" : "", host_compute ? " + compute" : "");
    printf("             %s %.2f GB (weight slots %.2f, embed/head %.2f, gradients %.2f, "
           "activations %.2f%s, working %.2f, library scratch %.2f)\n",
           host_compute ? "compute (in host RAM)" : "GPU", (p.dev_total + scratch) / gb, p.dev_slots / gb,
           p.dev_embed_head / gb, p.dev_grads / gb, p.dev_checkpoints / gb,
           eo->offload ? " with checkpoints offloaded" : "", p.dev_work / gb, scratch / gb);
    if (eo->saved_layers)
        printf("             + saved internals %.2f GB: the backward of the last %d of %d layers "
               "skips the recompute\n", p.dev_saved / gb, eo->saved_layers, t->cfg.L);
    double avail = mem_available_bytes();
    if (avail > 0 && host > avail)
        return mt_error_set("host RAM: training needs %.2f GB, %.2f GB available; use a smaller model, "
                            "--batch/--seq, or a machine with more RAM",
                            host / gb, avail / gb);
    if (!host_compute && gpu_budget > 0 && p.dev_total + scratch > (double)gpu_budget)
        return mt_error_set("GPU memory: the plan needs %.2f GB even with checkpoints in host memory, the "
                            "budget is %.2f GB; lower --batch or --seq, or raise --gpu-mem",
                            (p.dev_total + scratch) / gb, (double)gpu_budget / gb);
    return MT_OK;
}
