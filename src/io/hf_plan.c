/* Writing a model directory's safetensors: the table's tensors (fused experts when the source had
 * them) and the carried ones, read back from their source files chunk by chunk. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/hf_layout.h"
#include "model/config.h"

/* Param index of layer l's tensor of kind k for expert e. */
static int find_expert(const mt_param_table *t, int l, mt_param_kind k, int e) {
    for (int i = t->layer_first[l]; i < t->layer_first[l + 1]; i++)
        if (t->params[i].kind == k && t->params[i].expert == e) return i;
    MT_CHECK(0, "layer %d has no expert %d of kind %d", l, e, (int)k);
}

static mt_hf_item *add_item(mt_hf_plan *pl, const char *name, mt_dtype dtype, int ndim, const int64_t *shape) {
    mt_hf_item *it = &pl->items[pl->n++];
    memset(it, 0, sizeof *it);
    snprintf(it->name, sizeof it->name, "%s", name);
    it->w.name = it->name;
    it->w.dtype = dtype;
    it->w.ndim = ndim;
    for (int d = 0; d < ndim; d++) it->w.shape[d] = shape[d];
    return it;
}

/* Appends param i to item it, at its element `at`. */
static void add_piece(mt_hf_plan *pl, mt_hf_item *it, int *np, int i, int64_t at) {
    if (it->n == 0) it->first = *np;
    pl->pieces[(*np)++] = i;
    it->n++;
    pl->item_of[i] = (int)(it - pl->items);
    pl->elem_of[i] = at;
}

void mt_hf_plan_init(mt_hf_plan *pl, const mt_param_table *t, mt_dtype dtype) {
    memset(pl, 0, sizeof *pl);
    const mt_config *c = &t->cfg;
    int n_carried = t->hf ? t->hf->n_carried : 0;
    int fused = t->hf && t->hf->fused_experts && c->n_experts > 0 && c->arch != MT_ARCH_MIXTRAL;
    pl->items = mt_calloc((size_t)(t->n_params + n_carried) + 1, sizeof *pl->items);
    pl->pieces = mt_calloc((size_t)t->n_params + 1, sizeof *pl->pieces);
    pl->item_of = mt_calloc((size_t)t->n_params + 1, sizeof *pl->item_of);
    pl->elem_of = mt_calloc((size_t)t->n_params + 1, sizeof *pl->elem_of);
    int np = 0;
    char name[MT_HF_NAME];
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        if (fused && p->expert >= 0) {
            if (p->expert != 0 || p->kind == MT_W_EXP_UP) continue; /* placed with its layer's expert 0 */
            int down = p->kind == MT_W_EXP_DOWN, E = c->n_experts;
            int64_t Fe = c->moe_F, C = c->C, at = 0;
            int64_t shape[3] = {E, down ? C : 2 * Fe, down ? Fe : C};
            snprintf(name, sizeof name, "%slayers.%d.mlp.experts.%s", c->nested ? MT_HF_LM_PREFIX : "model.",
                     p->layer, down ? "down_proj" : "gate_up_proj");
            mt_hf_item *it = add_item(pl, name, dtype, 3, shape);
            for (int e = 0; e < E; e++) { /* per expert its gate rows, then its up rows */
                int a = find_expert(t, p->layer, down ? MT_W_EXP_DOWN : MT_W_EXP_GATE, e);
                add_piece(pl, it, &np, a, at);
                at += t->params[a].numel;
                if (down) continue;
                int b = find_expert(t, p->layer, MT_W_EXP_UP, e);
                add_piece(pl, it, &np, b, at);
                at += t->params[b].numel;
            }
            continue;
        }
        mt_hf_name(t, p, name, sizeof name);
        add_piece(pl, add_item(pl, name, dtype, p->ndim, p->shape), &np, i, 0);
    }
    for (int k = 0; k < n_carried; k++) {
        const mt_hf_carried *cr = &t->hf->carried[k];
        add_item(pl, cr->name, cr->dtype, cr->ndim, cr->shape)->carried = cr;
    }
}

void mt_hf_plan_free(mt_hf_plan *pl) {
    free(pl->items);
    free(pl->pieces);
    free(pl->item_of);
    free(pl->elem_of);
    memset(pl, 0, sizeof *pl);
}

void mt_hf_reader_init(mt_hf_reader *r) {
    r->fd = -1;
    r->path = NULL;
}

void mt_hf_reader_close(mt_hf_reader *r) {
    if (r->fd >= 0) close(r->fd);
    mt_hf_reader_init(r);
}

/* c's bytes [begin, begin + n) from its source file. */
static int read_carried(mt_hf_reader *r, const mt_hf_carried *c, uint64_t begin, size_t n, void *dst) {
    if (!r->path || strcmp(r->path, c->path) != 0) {
        mt_hf_reader_close(r);
        r->fd = open(c->path, O_RDONLY | O_CLOEXEC);
        if (r->fd < 0)
            return mt_error_set("%s: cannot open to copy tensor %s through: %s", c->path, c->name, strerror(errno));
        r->path = c->path;
        struct stat sb;
        if (fstat(r->fd, &sb) != 0 || (uint64_t)sb.st_size != c->file_bytes)
            return mt_error_set("%s: changed since the model was loaded (%lld bytes, then %llu): tensor %s "
                                "cannot be copied through", c->path, (long long)sb.st_size,
                                (unsigned long long)c->file_bytes, c->name);
    }
    unsigned char *p = dst;
    uint64_t at = c->offset + begin;
    while (n > 0) {
        ssize_t k = pread(r->fd, p, n, (off_t)at);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return mt_error_set("%s: tensor %s: read failed: %s", c->path, c->name,
                                k < 0 ? strerror(errno) : "unexpected end of file");
        p += k, n -= (size_t)k, at += (uint64_t)k;
    }
    return MT_OK;
}

int mt_hf_fill(const mt_hf_plan *pl, int i, int64_t begin, int64_t n, void *dst, mt_hf_piece_fn piece, void *ctx,
               mt_hf_reader *rd) {
    const mt_hf_item *it = &pl->items[i];
    size_t es = mt_dtype_size(it->w.dtype);
    if (it->carried) return read_carried(rd, it->carried, (uint64_t)begin * es, (size_t)n * es, dst);
    unsigned char *out = dst;
    for (int k = 0; k < it->n && n > 0; k++) {
        int p = pl->pieces[it->first + k];
        int64_t lo = pl->elem_of[p], hi = k + 1 < it->n ? pl->elem_of[pl->pieces[it->first + k + 1]] : INT64_MAX;
        if (begin >= hi) continue;
        int64_t m = hi - begin < n ? hi - begin : n;
        MT_TRY(piece(ctx, p, begin - lo, m, out));
        out += (size_t)m * es, begin += m, n -= m;
    }
    return MT_OK;
}
