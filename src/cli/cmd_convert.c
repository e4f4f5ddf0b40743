/* megatrain convert: read a checkpoint through the validating loader and write it again. */
#include <dirent.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../io/model_io.h"
#include "args.h"
#include "commands.h"
#include "model_source.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: megatrain convert --model DIR|ORG/NAME --out DIR [--dtype bf16|f32] [--shard-size SIZE]\n"
            "  Loads a Hugging Face checkpoint (bf16, fp16 or fp32; one file or shards), checks\n"
            "  every tensor, and writes config.json + safetensors that transformers loads.\n"
            "  --out must be a new directory or one without a model, outside --model.\n"
            "  --dtype       dtype written (default bf16)\n"
            "  --shard-size  largest shard, e.g. 5G (default: one file)\n"
            "  --model ORG/NAME [--revision R]: a model in the Hugging Face hub cache, offline\n"
            "  ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub; R: ref or commit,\n"
            "  default main)\n");
}

/* ---- the output directory: never the input, never an earlier model ---- */

/* Appends path component [c, c + n) to the absolute path abs (capacity PATH_MAX), resolving "."
 * and ".." lexically: the components after the nearest existing ancestor do not exist yet, so
 * no symlink can hide among them. */
static void push_component(char *abs, const char *c, size_t n) {
    if (n == 0 || (n == 1 && c[0] == '.')) return;
    size_t len = strlen(abs);
    if (n == 2 && c[0] == '.' && c[1] == '.') {
        char *slash = strrchr(abs, '/');
        if (slash == abs) abs[1] = '\0';
        else if (slash) *slash = '\0';
        return;
    }
    if (len + n + 2 > PATH_MAX) return; /* realpath of the ancestor already fits; a longer --out
                                           fails in mkdir with its own message */
    if (len > 1) abs[len++] = '/';
    memcpy(abs + len, c, n);
    abs[len + n] = '\0';
}

/* The absolute path PATH will have once created: realpath() of its nearest existing ancestor
 * (symlinks resolved) plus the rest. Returns 0 when no ancestor resolves (not even "."). */
static int future_realpath(const char *path, char *abs) {
    size_t n = strlen(path);
    char *head = mt_strdup(path);
    size_t cut = n; /* head = path[0, cut) */
    int ok = 0;
    for (;;) {
        char tmp[PATH_MAX];
        const char *try = cut ? head : (path[0] == '/' ? "/" : ".");
        if (realpath(try, tmp)) {
            snprintf(abs, PATH_MAX, "%s", tmp);
            ok = 1;
            break;
        }
        if (cut == 0) break;
        while (cut > 0 && path[cut - 1] == '/') cut--; /* drop the last component */
        while (cut > 0 && path[cut - 1] != '/') cut--;
        head[cut] = '\0';
    }
    for (size_t i = cut; ok && i < n;) {
        size_t j = i;
        while (j < n && path[j] != '/') j++;
        push_component(abs, path + i, j - i);
        i = j + 1;
    }
    free(head);
    return ok;
}

/* A file that a saved model consists of. */
static int is_model_file(const char *name) {
    size_t n = strlen(name);
    return strcmp(name, "config.json") == 0 || strcmp(name, "model.safetensors.index.json") == 0 ||
           (n > 12 && strcmp(name + n - 12, ".safetensors") == 0);
}

/* Refuses an --out that is --model or inside it (compared as real paths, so ./CK, CK/, a symlink
 * and CK/sub are all caught), and an --out that already holds a model: convert writes only new
 * files, so a mistyped flag never replaces a checkpoint. Runs before anything is written. */
static int check_out_dir(const char *model_dir, const char *out_dir) {
    char model_abs[PATH_MAX], out_abs[PATH_MAX];
    if (realpath(model_dir, model_abs) && future_realpath(out_dir, out_abs)) {
        size_t m = strlen(model_abs);
        int inside = strncmp(out_abs, model_abs, m) == 0 &&
                     (out_abs[m] == '\0' || out_abs[m] == '/' || m == 1);
        if (inside)
            return mt_error_set("--out %s is %s --model %s: convert never writes over its input; "
                                "choose another --out", out_dir,
                                out_abs[m] == '\0' ? "the same directory as" : "inside", model_dir);
    }
    DIR *d = opendir(out_dir);
    if (!d) return MT_OK; /* absent (created by the save) or not a directory (refused there) */
    struct dirent *e;
    int rc = MT_OK;
    while (rc == MT_OK && (e = readdir(d)) != NULL)
        if (is_model_file(e->d_name))
            rc = mt_error_set("--out %s already holds a model (%s); convert writes only into a new "
                              "or model-free directory: remove it or choose another --out",
                              out_dir, e->d_name);
    closedir(d);
    return rc;
}

int mt_cmd_convert(int argc, char **argv) {
    const char *model_dir = NULL, *out_dir = NULL;
    const char *revision = NULL;
    int dtype_index = 0;
    int64_t shard = 0;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"revision", required_argument, 0, 'R'},
                                         {"out", required_argument, 0, 'o'},
                                         {"dtype", required_argument, 0, 'd'},
                                         {"shard-size", required_argument, 0, 's'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'R': revision = optarg; break;
        case 'o': out_dir = optarg; break;
        case 'd':
            if (mt_arg_choice("--dtype", optarg, "bf16|f32", &dtype_index) != MT_OK) return mt_cli_fail();
            break;
        case 's':
            if (mt_arg_size("--shard-size", optarg, &shard) != MT_OK) return mt_cli_fail();
            break;
        case 'h': print_usage(stdout); return 0;
        default: print_usage(stderr); return 1;
        }
    }
    if (!model_dir || !out_dir || optind < argc) {
        print_usage(stderr);
        return 1;
    }
    if (mt_model_resolve(model_dir, revision, &model_dir) != MT_OK) return mt_cli_fail();
    if (check_out_dir(model_dir, out_dir) != MT_OK) return mt_cli_fail();
    mt_host_model m;
    if (mt_host_model_open(&m, model_dir, NULL, 0, 1) != MT_OK) return mt_cli_fail();
    mt_dtype dtype = dtype_index == 0 ? MT_BF16 : MT_F32;
    int rc = mt_model_save(&m.table, m.weights, out_dir, dtype, shard);
    mt_host_model_free(&m);
    if (rc != MT_OK) return mt_cli_fail();
    printf("wrote %s (%s)\n", out_dir, dtype == MT_BF16 ? "bf16" : "fp32");
    return 0;
}
