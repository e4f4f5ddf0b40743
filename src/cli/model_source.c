#include "model_source.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/error.h"
#include "../io/hf_layout.h"
#include "../io/model_io.h"

/* DIR/config.json (static storage: one at a time). */
static const char *path_of(const char *dir) {
    static char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    return path;
}

int mt_host_model_open(mt_host_model *m, const char *model_dir, const char *init_config,
                       uint64_t seed, int load_weights) {
    memset(m, 0, sizeof *m);
    if ((model_dir == NULL) == (init_config == NULL))
        return mt_error_set("give exactly one of --model DIR and --init CONFIG.json");
    mt_config cfg;
    if (model_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", model_dir);
        MT_TRY(mt_config_load(&cfg, path));
    } else {
        MT_TRY(mt_config_load(&cfg, init_config));
    }
    mt_param_table_init(&m->table, &cfg);
    /* what a save writes back besides the weights: the config's text, the carried tensors, the
     * experts' layout. Without load_weights a bad checkpoint is reported by whoever loads it. */
    int rc = model_dir ? mt_hf_source_open(&m->hf, &m->table, model_dir) : mt_hf_source_config(&m->hf, init_config);
    if (rc != MT_OK && (load_weights || !model_dir || mt_hf_source_config(&m->hf, path_of(model_dir)) != MT_OK)) {
        mt_host_model_free(m);
        return MT_ERR;
    }
    m->table.hf = m->hf;
    if (!load_weights) return MT_OK;
    m->weights = mt_aligned_alloc((size_t)m->table.total * sizeof(float));
    if (model_dir) {
        if (mt_model_load(&m->table, m->weights, model_dir) != MT_OK) {
            mt_host_model_free(m);
            return MT_ERR;
        }
    } else {
        mt_param_init(&m->table, m->weights, cfg.initializer_range, seed);
    }
    return MT_OK;
}

void mt_host_model_free(mt_host_model *m) {
    free(m->weights);
    mt_hf_source_free(m->hf);
    if (m->table.params) mt_param_table_free(&m->table);
    memset(m, 0, sizeof *m);
}

/* ---- --model ORG/NAME: the Hugging Face hub cache ---- */

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* [org/]name of letters, digits, '-', '_', '.', neither part empty nor starting with '.' */
static int is_repo_id(const char *s) {
    int slashes = 0;
    for (const char *c = s; *c; c++) {
        if (*c == '/') slashes++;
        else if (!isalnum((unsigned char)*c) && !strchr("-_.", *c)) return 0;
        if ((c == s || c[-1] == '/') && (*c == '.' || *c == '/')) return 0; /* empty part, ./ ../ */
    }
    return *s && slashes <= 1 && s[strlen(s) - 1] != '/';
}

/* The cache root and how it was chosen (for the error). */
static void hub_root(char *root, size_t n, char *why, size_t why_n) {
    const char *hub = getenv("HF_HUB_CACHE"), *home = getenv("HF_HOME"), *xdg = getenv("XDG_CACHE_HOME");
    if (hub && *hub) {
        snprintf(root, n, "%s", hub);
        snprintf(why, why_n, "$HF_HUB_CACHE");
    } else if (home && *home) {
        snprintf(root, n, "%s/hub", home);
        snprintf(why, why_n, "$HF_HOME/hub");
    } else if (xdg && *xdg) {
        snprintf(root, n, "%s/huggingface/hub", xdg);
        snprintf(why, why_n, "$XDG_CACHE_HOME/huggingface/hub");
    } else {
        const char *h = getenv("HOME");
        snprintf(root, n, "%s/.cache/huggingface/hub", h && *h ? h : ".");
        snprintf(why, why_n, "~/.cache/huggingface/hub");
    }
}

static int is_commit(const char *r) {
    size_t n = strlen(r);
    return n == 40 && strspn(r, "0123456789abcdef") == n;
}

int mt_model_resolve(const char *arg, const char *revision, const char **dir) {
    static char snapshot[8192];
    *dir = arg;
    if (!arg) return revision ? mt_error_set("--revision %s needs --model ORG/NAME", revision) : MT_OK;
    if (is_dir(arg)) {
        if (revision)
            return mt_error_set("--revision %s: --model %s is a directory; --revision picks a version of a "
                                "model in the Hugging Face hub cache (--model ORG/NAME)",
                                revision, arg);
        return MT_OK;
    }
    if (!is_repo_id(arg))
        return mt_error_set("--model %s: no such directory (nor a Hugging Face repo id ORG/NAME)", arg);
    char root[4096], why[64], repo[4400], ref[4600];
    hub_root(root, sizeof root, why, sizeof why);
    int n = snprintf(repo, sizeof repo, "%s/models--", root);
    for (const char *c = arg; *c && n + 3 < (int)sizeof repo; c++) { /* org/name -> org--name */
        if (*c == '/') repo[n++] = '-';
        repo[n++] = *c == '/' ? '-' : *c;
    }
    repo[n] = '\0';
    const char *rev = revision ? revision : "main";
    if (!is_dir(repo))
        return mt_error_set("--model %s: no such directory, and not in the Hugging Face hub cache (%s): "
                            "looked for ./%s and %s; nothing is downloaded (fetch it first, e.g. "
                            "`huggingface-cli download %s`)",
                            arg, why, arg, repo, arg);
    char hash[256];
    if (is_commit(rev)) {
        snprintf(hash, sizeof hash, "%s", rev);
    } else {
        if (strstr(rev, "..") || rev[0] == '/' || !rev[0])
            return mt_error_set("--revision %s: not a ref name or a commit hash", rev);
        snprintf(ref, sizeof ref, "%s/refs/%s", repo, rev);
        FILE *f = fopen(ref, "r");
        if (!f)
            return mt_error_set("--model %s: the Hugging Face hub cache has no revision %s: %s: %s (give "
                                "--revision with a ref under %s/refs or a commit hash under %s/snapshots)",
                                arg, rev, ref, strerror(errno), repo, repo);
        int got = fgets(hash, sizeof hash, f) != NULL;
        fclose(f);
        hash[got ? strcspn(hash, " \t\r\n") : 0] = '\0';
        if (!is_commit(hash))
            return mt_error_set("--model %s: %s does not hold a commit hash (40 hex digits)", arg, ref);
    }
    snprintf(snapshot, sizeof snapshot, "%s/snapshots/%s", repo, hash);
    if (!is_dir(snapshot) && strcmp(rev, hash) != 0)
        return mt_error_set("--model %s: revision %s names commit %s, but %s is missing (an incomplete "
                            "download? fetch it again)",
                            arg, rev, hash, snapshot);
    if (!is_dir(snapshot))
        return mt_error_set("--model %s: commit %s: %s is missing (see %s/refs for the revisions there)",
                            arg, rev, snapshot, repo);
    *dir = snapshot;
    return MT_OK;
}
