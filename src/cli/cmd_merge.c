/* megatrain merge: fold a PEFT LoRA adapter into its base model and write the merged model, as
 * PEFT's merge_and_unload() + save_pretrained() would: W += scale * B @ A on each adapted weight,
 * every other tensor as it was, the same names, the base's config and tokenizer files. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "../io/atomic_file.h"
#include "../io/lora_io.h"
#include "../io/model_io.h"
#include "../io/safetensors.h"
#include "args.h"
#include "commands.h"
#include "model_source.h"

/* Copied from --model when there: what transformers and megatrain read beside the weights. */
static const char *const SIDE_FILES[] = {
    "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja",
    "chat_template.json"};

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: megatrain merge --model DIR|ORG/NAME --adapter DIR --out DIR [--dtype bf16|fp32]\n"
            "                       [--shard-size SIZE]\n"
            "  Folds a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) into its\n"
            "  base model, W += lora_alpha / r * B @ A (fp64 sums, into fp32 W), and writes the\n"
            "  merged Hugging Face model, as PEFT's merge_and_unload() + save_pretrained(): the base's\n"
            "  tensor names, config.json, generation and tokenizer files.\n"
            "  --out must be new or an empty directory, outside --model and --adapter; it appears\n"
            "  complete or not at all.\n"
            "  --dtype       dtype written (default: the base checkpoint's; fp32 for an fp16 base)\n"
            "  --shard-size  largest shard, e.g. 5G (default: one file)\n"
            "  --model ORG/NAME [--revision R]: a model in the Hugging Face hub cache, offline\n");
}

/* ---- paths ---- */

/* The absolute path PATH has, or will have once created: realpath() of the nearest existing
 * ancestor, then the rest ("." and ".." resolved lexically). 0 when nothing resolves. */
static int future_abs(const char *path, char *abs) {
    if (realpath(path, abs)) return 1;
    char *copy = mt_strdup(path);
    size_t n = strlen(copy);
    while (n > 1 && copy[n - 1] == '/') copy[--n] = '\0';
    char *slash = strrchr(copy, '/');
    const char *last = slash ? slash + 1 : copy;
    int ok;
    if (!slash) ok = realpath(".", abs) != NULL;
    else if (slash == copy) ok = realpath("/", abs) != NULL;
    else {
        *slash = '\0';
        ok = future_abs(copy, abs);
    }
    if (ok && strcmp(last, "..") == 0) {
        char *s = strrchr(abs, '/');
        if (s == abs) abs[1] = '\0';
        else if (s) *s = '\0';
    } else if (ok && *last && strcmp(last, ".") != 0) {
        size_t len = strlen(abs);
        if (len + strlen(last) + 2 > PATH_MAX) ok = 0;
        else snprintf(abs + len, PATH_MAX - len, "%s%s", len > 1 ? "/" : "", last);
    }
    free(copy);
    return ok;
}

/* Whether the real path a lies in (or is) directory b's. */
static int path_inside(const char *a, const char *b) {
    size_t m = strlen(b);
    return strncmp(a, b, m) == 0 && (a[m] == '\0' || a[m] == '/' || m == 1);
}

/* --out: new, or an empty directory; never inside the inputs. Runs before anything is read. */
static int check_out(const char *out, const char *model_dir, const char *adapter_dir) {
    struct stat sb;
    if (stat(out, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode)) return mt_error_set("--out %s exists and is not a directory", out);
        DIR *d = opendir(out);
        if (!d) return mt_error_set("--out %s: cannot open: %s", out, strerror(errno));
        struct dirent *e;
        int rc = MT_OK;
        while (rc == MT_OK && (e = readdir(d)) != NULL)
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
                rc = mt_error_set("--out %s is not empty (it holds %s): merge writes only a new or "
                                  "empty directory; remove it or choose another --out", out, e->d_name);
        closedir(d);
        MT_TRY(rc);
    } else if (errno != ENOENT) {
        return mt_error_set("--out %s: %s", out, strerror(errno));
    }
    char out_abs[PATH_MAX], in_abs[PATH_MAX];
    if (!future_abs(out, out_abs)) return MT_OK; /* the save reports what is wrong with it */
    const char *inputs[] = {model_dir, adapter_dir}, *flags[] = {"--model", "--adapter"};
    for (int i = 0; i < 2; i++)
        if (realpath(inputs[i], in_abs) && path_inside(out_abs, in_abs))
            return mt_error_set("--out %s is inside %s %s: merge never writes into its inputs; "
                                "choose another --out", out, flags[i], inputs[i]);
    return MT_OK;
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = mt_malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* ---- the base checkpoint's dtype ---- */

/* The dtype holding most of the base's elements: what PEFT's merged model is saved in when the
 * base was loaded with dtype="auto". */
static int base_dtype(const char *model_dir, mt_dtype *out) {
    mt_safetensors *st;
    MT_TRY(mt_safetensors_open_dir(&st, model_dir));
    int64_t count[8] = {0};
    for (int i = 0; i < mt_safetensors_count(st); i++) {
        const mt_st_tensor *x = mt_safetensors_at(st, i);
        if ((int)x->dtype >= 0 && (int)x->dtype < 8) count[x->dtype] += x->numel;
    }
    mt_safetensors_close(st);
    *out = count[MT_BF16] > count[MT_F32] && count[MT_BF16] >= count[MT_F16] ? MT_BF16
           : count[MT_F16] > count[MT_F32]                                    ? MT_F16
                                                                              : MT_F32;
    return MT_OK;
}

/* ---- the merge ---- */

/* ---- the output directory ---- */

/* Copies SRC to DST (atomic, fsync'd); *copied 0 when SRC does not exist. */
static int copy_file(const char *src, const char *dst, int *copied) {
    *copied = 0;
    FILE *in = fopen(src, "rb");
    if (!in) return errno == ENOENT ? MT_OK : mt_error_set("%s: cannot read: %s", src, strerror(errno));
    mt_atomic_file af;
    if (mt_atomic_open(&af, dst) != MT_OK) {
        fclose(in);
        return MT_ERR;
    }
    char buf[1 << 16];
    size_t k;
    int rc = MT_OK;
    while (rc == MT_OK && (k = fread(buf, 1, sizeof buf, in)) > 0) rc = mt_atomic_write(&af, buf, k);
    if (rc == MT_OK && ferror(in)) rc = mt_error_set("%s: read failed: %s", src, strerror(errno));
    fclose(in);
    if (rc != MT_OK) {
        mt_atomic_abort(&af);
        return MT_ERR;
    }
    MT_TRY(mt_atomic_commit(&af));
    *copied = 1;
    return MT_OK;
}

typedef struct {
    const mt_host_model *m;
    const char *model_dir;
    mt_dtype dtype;
    int64_t shard;
    int n_side;
} merged_ctx;

/* The merged model's files into the directory tmp: the model, then the base's side files. */
static int fill_merged(const char *tmp, void *ctx) {
    merged_ctx *c = ctx;
    MT_TRY(mt_model_save(&c->m->table, c->m->weights, tmp, c->dtype, c->shard));
    for (size_t i = 0; i < sizeof SIDE_FILES / sizeof *SIDE_FILES; i++) {
        char *src = path_join(c->model_dir, SIDE_FILES[i]), *dst = path_join(tmp, SIDE_FILES[i]);
        int copied = 0, rc = copy_file(src, dst, &copied);
        c->n_side += copied;
        free(src);
        free(dst);
        MT_TRY(rc);
    }
    return MT_OK;
}

/* The merged model into OUT.tmp.XXXXXX beside OUT, renamed to OUT (new or empty) when complete. */
static int save_merged(const mt_host_model *m, const char *model_dir, const char *out,
                       mt_dtype dtype, int64_t shard, int *n_side) {
    merged_ctx c = {m, model_dir, dtype, shard, 0};
    int rc = mt_atomic_dir_write(out, fill_merged, &c);
    *n_side = c.n_side;
    if (rc != MT_OK) mt_error_set("--out %s", mt_error_message());
    return rc;
}

int mt_cmd_merge(int argc, char **argv) {
    const char *model_dir = NULL, *adapter_dir = NULL, *out_dir = NULL, *revision = NULL;
    int dtype_index = -1;
    int64_t shard = 0;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"revision", required_argument, 0, 'R'},
                                         {"adapter", required_argument, 0, 'a'},
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
        case 'a': adapter_dir = optarg; break;
        case 'o': out_dir = optarg; break;
        case 'd':
            if (mt_arg_choice("--dtype", optarg, "bf16|fp32|f32", &dtype_index) != MT_OK) return mt_cli_fail();
            break;
        case 's':
            if (mt_arg_size("--shard-size", optarg, &shard) != MT_OK) return mt_cli_fail();
            break;
        case 'h': print_usage(stdout); return 0;
        default: print_usage(stderr); return 1;
        }
    }
    if (!model_dir || !adapter_dir || !out_dir || optind < argc) {
        fprintf(stderr, "megatrain: merge needs --model, --adapter and --out%s%s\n",
                optind < argc ? "; unexpected argument " : "", optind < argc ? argv[optind] : "");
        print_usage(stderr);
        return 1;
    }
    if (mt_model_resolve(model_dir, revision, &model_dir) != MT_OK) return mt_cli_fail();
    if (check_out(out_dir, model_dir, adapter_dir) != MT_OK) return mt_cli_fail();
    /* the config and the adapter first: a bad adapter is refused before the weights are read */
    mt_host_model m;
    if (mt_host_model_open(&m, model_dir, NULL, 0, 0) != MT_OK) return mt_cli_fail();
    mt_lora_table lt;
    float *arena = NULL;
    mt_dtype dtype = MT_F32;
    int rc = mt_lora_load_dir(adapter_dir, &m.table, &lt, &arena);
    if (rc == MT_OK && dtype_index < 0) {
        rc = base_dtype(model_dir, &dtype);
        if (rc == MT_OK && dtype == MT_F16) {
            printf("%s is fp16: writing fp32, which holds the merged weights exactly (--dtype bf16 "
                   "for half the size)\n", model_dir);
            dtype = MT_F32;
        }
    } else if (rc == MT_OK) {
        dtype = dtype_index == 0 ? MT_BF16 : MT_F32;
    }
    if (rc == MT_OK) {
        m.weights = mt_aligned_alloc((size_t)m.table.total * sizeof(float));
        rc = mt_model_load(&m.table, m.weights, model_dir);
    }
    int n_side = 0;
    if (rc == MT_OK) {
        mt_lora_merge(&lt, arena, &m.table, m.weights);
        rc = save_merged(&m, model_dir, out_dir, dtype, shard, &n_side);
    }
    if (rc == MT_OK)
        printf("merged %d adapted modules (r %d, lora_alpha %g, scale %g) of %s into %s: wrote %s "
               "(%s, %d tokenizer/generation files copied)\n", lt.n_modules, lt.rank, lt.alpha,
               (double)lt.scale, adapter_dir, model_dir, out_dir, dtype == MT_BF16 ? "bf16" : "fp32",
               n_side);
    free(arena);
    mt_lora_table_free(&lt);
    mt_host_model_free(&m);
    return rc == MT_OK ? 0 : mt_cli_fail();
}
