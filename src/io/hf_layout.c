/* Reading a Hugging Face checkpoint's layout: disk names, fused experts, carried tensors. */
#include "io/hf_layout.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/mxfp4_tensor.h"
#include "model/config.h"

static int starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static const char *fmt_shape(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < size) snprintf(buf + k, size - k, "]");
    return buf;
}

void mt_hf_name(const mt_param_table *t, const mt_param *p, char *buf, size_t size) {
    if (t->cfg.nested && starts_with(p->name, "model.")) snprintf(buf, size, MT_HF_LM_PREFIX "%s", p->name + 6);
    else snprintf(buf, size, "%s", p->name);
}

/* The experts of this model may be fused on disk (the "mlp.experts." names; not mixtral's). */
static int fusable(const mt_config *c) { return c->n_experts > 0 && c->arch != MT_ARCH_MIXTRAL; }

/* Layer l's fused tensor holding expert kind k: gate_up_proj for the gate and up rows. */
static void fused_name(const mt_param_table *t, int l, mt_param_kind k, char *buf, size_t size) {
    snprintf(buf, size, "%slayers.%d.mlp.experts.%s", t->cfg.nested ? MT_HF_LM_PREFIX : "model.", l,
             k == MT_W_EXP_DOWN ? "down_proj" : "gate_up_proj");
}

static int check_dtype(const mt_st_tensor *x) {
    if (x->dtype != MT_F32 && x->dtype != MT_BF16 && x->dtype != MT_F16)
        return mt_error_set("%s: tensor %s: dtype %s; weights must be F32, BF16 or F16", x->path, x->name,
                            mt_dtype_name(x->dtype));
    return MT_OK;
}

static int check_one(const mt_param *p, const char *name, const mt_st_tensor *x, const char *source) {
    char want[96], got[160];
    fmt_shape(want, sizeof want, p->ndim, p->shape);
    if (!x)
        return mt_error_set("%s: tensor %s is missing (the model needs shape %s); the checkpoint does not "
                            "match its config.json", source, name, want);
    int same = x->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = x->shape[d] == p->shape[d];
    if (!same)
        return mt_error_set("%s: tensor %s: shape %s on disk, the model needs %s (check config.json's sizes)",
                            x->path, name, fmt_shape(got, sizeof got, x->ndim, x->shape), want);
    return check_dtype(x);
}

/* A fused tensor: (E, 2 Fe, C) for gate_up_proj, (E, C, Fe) for down_proj. */
static int check_fused(const mt_param_table *t, const mt_st_tensor *x, int down) {
    const mt_config *c = &t->cfg;
    int64_t want[3] = {c->n_experts, down ? c->C : 2 * (int64_t)c->moe_F, down ? c->moe_F : c->C};
    int same = x->ndim == 3 && x->shape[0] == want[0] && x->shape[1] == want[1] && x->shape[2] == want[2];
    char a[96], b[160];
    if (!same)
        return mt_error_set("%s: tensor %s: shape %s on disk, the model needs %s (fused experts; check "
                            "config.json's num_experts, moe_intermediate_size, hidden_size)", x->path,
                            x->name, fmt_shape(b, sizeof b, x->ndim, x->shape), fmt_shape(a, sizeof a, 3, want));
    return check_dtype(x);
}

/* Expert tensor p from its layer's fused tensor: 1 (*r set) when the checkpoint has one, 0 when
 * not, -1 on error. */
static int find_fused(const mt_param_table *t, const mt_safetensors *st, const mt_param *p,
                      const mt_st_tensor *per_expert, mt_hf_ref *r) {
    char name[MT_HF_NAME];
    fused_name(t, p->layer, p->kind, name, sizeof name);
    const mt_st_tensor *x = mt_safetensors_find(st, name);
    if (!x) return 0;
    if (per_expert) {
        mt_error_set("%s: layer %d holds its experts twice: per expert (%s) and fused (%s)", x->path, p->layer,
                     per_expert->name, name);
        return -1;
    }
    if (check_fused(t, x, p->kind == MT_W_EXP_DOWN) != MT_OK) return -1;
    int64_t FeC = (int64_t)t->cfg.moe_F * t->cfg.C;
    r->x = x;
    r->elem = p->kind == MT_W_EXP_DOWN ? p->expert * FeC : (2 * p->expert + (p->kind == MT_W_EXP_UP)) * FeC;
    return 1;
}

static void add_carried(mt_hf_source *src, const mt_st_tensor *x) {
    src->carried = realloc(src->carried, sizeof *src->carried * (size_t)(src->n_carried + 1));
    MT_CHECK(src->carried, "out of host memory listing carried tensors");
    mt_hf_carried *c = &src->carried[src->n_carried++];
    memset(c, 0, sizeof *c);
    c->name = mt_strdup(x->name);
    c->path = mt_strdup(x->path);
    c->offset = x->file_offset;
    struct stat sb;
    c->file_bytes = stat(x->path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    c->dtype = x->dtype;
    c->ndim = x->ndim;
    for (int d = 0; d < x->ndim; d++) c->shape[d] = x->shape[d];
    c->nbytes = x->nbytes;
    src->n_visual += starts_with(x->name, "model.visual.");
    src->n_mtp += starts_with(x->name, "mtp.");
}

int mt_hf_resolve(const mt_param_table *t, const mt_safetensors *st, mt_hf_ref *refs, mt_hf_source *src) {
    const char *source = mt_safetensors_source(st);
    int n = mt_safetensors_count(st), fused = 0, n_mxfp4 = 0, rc = MT_OK;
    char name[MT_HF_NAME];
    /* transformers 4's multimodal Gemma 3 names its language model "language_model.model.*"
     * (published google/gemma-3-*-it); only the 5.x layout (model.language_model.*) is read */
    if (t->cfg.nested && mt_safetensors_find(st, "language_model.model.embed_tokens.weight"))
        return mt_error_set("%s: this multimodal checkpoint names its language model "
                            "language_model.model.* (transformers 4's layout): loading it is not yet "
                            "implemented (re-save it with transformers 5's save_pretrained, which writes "
                            "model.language_model.*)", source);
    char *used = mt_calloc((size_t)n + 1, 1);
    for (int i = 0; i < t->n_params && rc == MT_OK; i++) {
        const mt_param *p = &t->params[i];
        mt_hf_name(t, p, name, sizeof name);
        const mt_st_tensor *x = mt_safetensors_find(st, name), *blocks, *scales;
        int f = p->expert >= 0 && fusable(&t->cfg) ? find_fused(t, st, p, x, &refs[i]) : 0;
        int q = f == 0 ? mt_mxfp4_tensor_find(st, name, p, &blocks, &scales) : 0;
        if (f < 0 || q < 0) rc = MT_ERR;
        else if (q > 0) refs[i] = (mt_hf_ref){blocks, 0, scales};
        else if (f == 0 && (rc = check_one(p, name, x, source)) == MT_OK) refs[i] = (mt_hf_ref){x, 0, NULL};
        if (rc == MT_OK) used[mt_safetensors_index(st, refs[i].x)] = 1;
        if (rc == MT_OK && q > 0) used[mt_safetensors_index(st, scales)] = 1;
        fused |= f > 0;
        n_mxfp4 += q > 0;
    }
    for (int j = 0; j < n && rc == MT_OK; j++) {
        const mt_st_tensor *x = mt_safetensors_at(st, j);
        if (used[j] || ends_with(x->name, "rotary_emb.inv_freq")) continue;
        if (t->cfg.tie_word_embeddings && strcmp(x->name, "lm_head.weight") == 0) {
            fprintf(stderr, "megatrain: warning: %s: ignoring lm_head.weight: the model ties it to "
                    "model.embed_tokens.weight (tie_word_embeddings)\n", x->path);
            continue;
        }
        if (t->cfg.nested && !starts_with(x->name, MT_HF_LM_PREFIX) && strcmp(x->name, "lm_head.weight") != 0) {
            if (src) add_carried(src, x); /* vision tower, multi-token prediction, ...: not trained */
            continue;
        }
        if (strstr(x->name, "mlp.experts.") && mt_mxfp4_tensor_is_half(x->name))
            rc = mt_error_set("%s: tensor %s is MXFP4-quantized, and this %s model has no tensor to read "
                              "it into (MXFP4 is read for gpt_oss's mlp.experts.gate_up_proj and down_proj)",
                              x->path, x->name, t->cfg.model_type);
        else
            rc = mt_error_set("%s: tensor %s is not part of this %s model (check config.json: model_type, "
                              "biases, qk norm, layer count)", x->path, x->name, t->cfg.model_type);
    }
    if (rc == MT_OK && src) src->fused_experts = fused, src->n_mxfp4 = n_mxfp4;
    free(used);
    return rc;
}

mt_st_tensor mt_hf_ref_view(const mt_hf_ref *r, int64_t numel) {
    MT_CHECK(!r->scales, "%s: an MXFP4 pair has no plain view (read it with mt_hf_ref_to_f32)", r->x->name);
    mt_st_tensor v = *r->x;
    size_t es = mt_dtype_size(v.dtype);
    v.data = (const unsigned char *)v.data + (size_t)r->elem * es;
    v.file_offset += (uint64_t)r->elem * es;
    v.numel = numel;
    v.nbytes = (size_t)numel * es;
    return v;
}

int mt_hf_ref_to_f32(const mt_hf_ref *r, const mt_param *p, float *dst) {
    if (r->scales) return mt_mxfp4_tensor_to_f32(r->x, r->scales, p, dst);
    mt_st_tensor v = mt_hf_ref_view(r, p->numel);
    return mt_st_tensor_to_f32(&v, dst);
}

/* ---- the source ---- */

static int read_text(const char *path, char **text, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return mt_error_set("%s: cannot read: %s", path, strerror(errno));
    size_t cap = 4096, n = 0, k;
    char *buf = mt_malloc(cap);
    while ((k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            MT_CHECK(buf, "out of host memory reading %s", path);
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return mt_error_set("%s: read failed", path);
    }
    *text = buf;
    *len = n;
    return MT_OK;
}

int mt_hf_source_config(mt_hf_source **out, const char *config_path) {
    *out = NULL;
    mt_hf_source *s = mt_calloc(1, sizeof *s);
    if (read_text(config_path, &s->config_text, &s->config_len) != MT_OK) {
        free(s);
        return MT_ERR;
    }
    *out = s;
    return MT_OK;
}

static int has_weights(const char *dir) {
    char p[4200];
    struct stat sb;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (stat(p, &sb) == 0) return 1;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    return stat(p, &sb) == 0;
}

int mt_hf_source_open(mt_hf_source **out, const mt_param_table *t, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    MT_TRY(mt_hf_source_config(out, path));
    if (!has_weights(dir)) return MT_OK;
    mt_safetensors *st;
    int rc = mt_safetensors_open_dir(&st, dir);
    if (rc == MT_OK) {
        mt_hf_ref *refs = mt_calloc((size_t)t->n_params + 1, sizeof *refs);
        rc = mt_hf_resolve(t, st, refs, *out);
        free(refs);
        mt_safetensors_close(st);
    }
    if (rc != MT_OK) {
        mt_hf_source_free(*out);
        *out = NULL;
    }
    return rc;
}

void mt_hf_source_free(mt_hf_source *s) {
    if (!s) return;
    for (int i = 0; i < s->n_carried; i++) {
        free(s->carried[i].name);
        free(s->carried[i].path);
    }
    free(s->carried);
    free(s->config_text);
    free(s);
}

int mt_hf_config_save(const mt_param_table *t, const char *path) {
    if (!t->cfg.nested) return mt_config_save(&t->cfg, path);
    MT_TRY(mt_config_validate(&t->cfg, path));
    if (!t->hf || !t->hf->config_text)
        return mt_error_set("%s: a multimodal (text_config) config.json is written as the original one, and "
                            "this model has none (load it from its directory)", path);
    return mt_atomic_write_file(path, t->hf->config_text, t->hf->config_len);
}
