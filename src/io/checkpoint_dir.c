/* What checkpoint saving and loading share: paths, the step_N directories, the recorded file list
 * and the finiteness check. Internal to src/io (checkpoint_dir.h). */
#include "io/checkpoint_dir.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"

#define FINITE_BLOCK (1 << 16) /* floats per finiteness-check work item */

/* ---- small file-system helpers ---- */

char *ckpt_path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = mt_malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

int ckpt_is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* "step_<digits>" -> step; -1 for any other name. */
int64_t ckpt_parse_step_name(const char *name) {
    size_t k = strlen(STEP_PREFIX);
    if (strncmp(name, STEP_PREFIX, k) != 0) return -1;
    const char *s = name + k;
    size_t n = strlen(s);
    if (n == 0 || n > 18 || strspn(s, "0123456789") != n) return -1;
    return strtoll(s, NULL, 10);
}

/* The step_N directories of CKDIR, highest first. errno-style result in *err (0 when listed). */
ckpt_step_list ckpt_list_steps(const char *ckdir, int *err) {
    ckpt_step_list l = {NULL, 0, 0};
    *err = 0;
    DIR *d = opendir(ckdir);
    if (!d) {
        *err = errno;
        return l;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s = ckpt_parse_step_name(e->d_name);
        if (s < 0) continue;
        char *p = ckpt_path_join(ckdir, e->d_name);
        int dir = ckpt_is_dir(p);
        free(p);
        if (!dir) continue;
        if (l.n == l.cap) {
            l.cap = l.cap ? 2 * l.cap : 16;
            int64_t *grown = mt_malloc(sizeof(int64_t) * (size_t)l.cap);
            if (l.n) memcpy(grown, l.steps, sizeof(int64_t) * (size_t)l.n);
            free(l.steps);
            l.steps = grown;
        }
        l.steps[l.n++] = s;
    }
    closedir(d);
    for (int i = 1; i < l.n; i++) /* insertion sort, descending; lists are short */
        for (int j = i; j > 0 && l.steps[j] > l.steps[j - 1]; j--) {
            int64_t x = l.steps[j];
            l.steps[j] = l.steps[j - 1];
            l.steps[j - 1] = x;
        }
    return l;
}

void ckpt_step_name(char *buf, size_t size, const char *prefix, int64_t step) {
    snprintf(buf, size, "%s" STEP_PREFIX "%08lld", prefix, (long long)step);
}

void ckpt_add_file(ckpt_file_list *l, const char *name, const mt_file_digest *d) {
    MT_CHECK(l->n < MAX_FILES && strlen(name) < sizeof l->e[0].name, "checkpoint file list");
    snprintf(l->e[l->n].name, sizeof l->e[0].name, "%s", name);
    l->e[l->n++].d = *d;
}

/* ---- one tensor's state at a time ---- */

static size_t round64(size_t n) { return (n + 63) / 64 * 64; }

void ckpt_buf_init(ckpt_tensor_buf *b, const mt_param_table *t, mt_state_format f) {
    int64_t most = 1;
    for (int i = 0; i < t->n_params; i++)
        if (t->params[i].numel > most) most = t->params[i].numel;
    mt_optim_tensor x[MT_OPTIM_MAX_TENSORS];
    int n = mt_optim_parts_layout(f, (size_t)most, x);
    MT_CHECK(n > 0 && n <= MT_OPTIM_MAX_TENSORS, "parts layout of format %d", (int)f);
    size_t bytes = 0; /* a part's size grows with numel: the largest tensor's bound them all */
    for (int k = 0; k < n; k++) bytes += round64(x[k].bytes);
    b->f = f;
    b->w = mt_aligned_alloc(sizeof(float) * (size_t)most);
    b->block = mt_aligned_alloc(bytes);
    b->n_parts = 0;
}

void ckpt_buf_free(ckpt_tensor_buf *b) {
    free(b->w);
    free(b->block);
    b->w = NULL;
    b->block = NULL;
}

void ckpt_buf_layout(ckpt_tensor_buf *b, const mt_param *p) {
    b->n_parts = mt_optim_parts_layout(b->f, (size_t)p->numel, b->part);
    size_t at = 0;
    for (int k = 0; k < b->n_parts; k++) {
        b->part[k].data = b->block + at;
        at += round64(b->part[k].bytes);
    }
}

void ckpt_part_name(char *buf, size_t size, const mt_optim_tensor *x, const mt_param *p) {
    snprintf(buf, size, "%s.%s", x->name, p->name);
}

int ckpt_part_shape(const mt_optim_tensor *x, const mt_param *p, int64_t shape[3]) {
    if ((int64_t)x->numel != p->numel) {
        shape[0] = (int64_t)x->numel;
        return 1;
    }
    for (int d = 0; d < p->ndim; d++) shape[d] = p->shape[d];
    return p->ndim;
}

/* 1 when any of the n floats at p (possibly unaligned: a mapped file) is NaN or inf. */
static int block_nonfinite(const unsigned char *p, int64_t n) {
    int bad = 0;
    /* |x| as bits > FLT_MAX's bits <=> NaN or inf; a signed compare, which SSE2 has */
#pragma omp simd reduction(| : bad)
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, p + 4 * i, 4);
        bad |= (int32_t)(u & 0x7fffffffu) > 0x7f7fffff;
    }
    return bad;
}

int ckpt_any_nonfinite(const void *x, int64_t n) {
    const unsigned char *p = x;
    int64_t blocks = (n + FINITE_BLOCK - 1) / FINITE_BLOCK;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (blocks > 4)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t begin = b * FINITE_BLOCK, k = n - begin < FINITE_BLOCK ? n - begin : FINITE_BLOCK;
        bad |= block_nonfinite(p + 4 * begin, k);
    }
    return bad;
}

/* 1 when any of the n floats at p is out of range. As float bits, |x| <= max_abs <=> (bits &
 * 0x7fffffff) <= bits(max_abs) (NaN and inf are above every finite value's bits); a negative
 * value has the sign bit and a non-zero rest, i.e. bits > 0x80000000. Both as signed compares,
 * which SSE2 has: bits > 0x80000000 unsigned <=> (int32)bits in (INT32_MIN, 0). */
static int block_out_of_range(const unsigned char *p, int64_t n, int32_t max_bits, int nonneg) {
    int bad = 0;
    if (!nonneg) { /* the weights: one compare, as the finiteness check */
#pragma omp simd reduction(| : bad)
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, p + 4 * i, 4);
            bad |= (int32_t)(u & 0x7fffffffu) > max_bits;
        }
        return bad;
    }
#pragma omp simd reduction(| : bad)
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, p + 4 * i, 4);
        int32_t s = (int32_t)u;
        bad |= ((int32_t)(u & 0x7fffffffu) > max_bits) | ((s < 0) & (s != INT32_MIN));
    }
    return bad;
}

int64_t ckpt_first_out_of_range(const void *x, int64_t n, float max_abs, int nonneg) {
    const unsigned char *p = x;
    int32_t max_bits;
    memcpy(&max_bits, &max_abs, 4);
    nonneg = nonneg != 0;
    int64_t blocks = (n + FINITE_BLOCK - 1) / FINITE_BLOCK;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (blocks > 4)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t begin = b * FINITE_BLOCK, k = n - begin < FINITE_BLOCK ? n - begin : FINITE_BLOCK;
        bad |= block_out_of_range(p + 4 * begin, k, max_bits, nonneg);
    }
    if (!bad) return -1;
    for (int64_t i = 0; i < n; i++) /* the failure path only: which one */
        if (block_out_of_range(p + 4 * i, 1, max_bits, nonneg)) return i;
    return -1;
}

/* ---- the files' tensor lists ---- */

static void list_alloc(ckpt_tensor_list *l, int n) {
    l->n = n;
    l->w = mt_calloc((size_t)n + 1, sizeof *l->w);
    l->names = mt_calloc((size_t)n + 1, sizeof *l->names);
    l->param_of = mt_calloc((size_t)n + 1, sizeof(int));
    l->part_of = mt_calloc((size_t)n + 1, sizeof(int));
    l->hf = NULL;
}

void ckpt_weight_list(const mt_param_table *t, ckpt_tensor_list *l) {
    mt_hf_plan *pl = mt_calloc(1, sizeof *pl);
    mt_hf_plan_init(pl, t, MT_F32);
    list_alloc(l, pl->n);
    for (int j = 0; j < pl->n; j++) l->w[j] = pl->items[j].w;
    l->hf = pl;
}

void ckpt_part_list(const mt_param_table *t, mt_state_format f, ckpt_tensor_list *l) {
    mt_optim_tensor x[MT_OPTIM_MAX_TENSORS];
    int n = 0;
    for (int i = 0; i < t->n_params; i++) n += mt_optim_parts_layout(f, (size_t)t->params[i].numel, x);
    list_alloc(l, n);
    for (int i = 0, j = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        int k_n = mt_optim_parts_layout(f, (size_t)p->numel, x);
        for (int k = 0; k < k_n; k++, j++) {
            ckpt_part_name(l->names[j], sizeof l->names[j], &x[k], p);
            l->w[j] = (mt_st_write_tensor){.name = l->names[j], .dtype = x[k].dtype};
            l->w[j].ndim = ckpt_part_shape(&x[k], p, l->w[j].shape);
            l->param_of[j] = i;
            l->part_of[j] = k;
        }
    }
}

void ckpt_tensor_list_free(ckpt_tensor_list *l) {
    free(l->w);
    free(l->names);
    free(l->param_of);
    free(l->part_of);
    if (l->hf) mt_hf_plan_free(l->hf);
    free(l->hf);
    memset(l, 0, sizeof *l);
}

/* What holds a NaN/inf, for the refusal: the weights, or a part by its name. A NaN or inf in
 * saved state would poison every step after a resume. */
const char *ckpt_part_what(const char *part) {
    static const struct {
        const char *name, *what;
    } w[] = {
        {"exp_avg", "exp_avg (Adam's first moment) holds"},
        {"exp_avg_sq", "exp_avg_sq (Adam's second moment) holds"},
        {"exp_avg_scale", "exp_avg_scale (the first moment's block scales) holds"},
        {"exp_avg_sq_scale", "exp_avg_sq_scale (the second moment's block scales) holds"},
    };
    for (size_t i = 0; i < sizeof w / sizeof *w; i++)
        if (strcmp(part, w[i].name) == 0) return w[i].what;
    return part;
}
