/* The LoRA adapter table (model/lora.h). */
#include "model/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* The kinds whose module is a linear projection megatrain adapts (matmul_forward through
 * model/linear.h). */
static int kind_is_adaptable(mt_param_kind k) {
    switch (k) {
    case MT_W_Q: case MT_W_K: case MT_W_V: case MT_W_O:
    case MT_W_GATE: case MT_W_UP: case MT_W_DOWN:
    case MT_W_LIN_QKV: case MT_W_LIN_Z: case MT_W_LIN_B: case MT_W_LIN_A: case MT_W_LIN_OUT:
    case MT_W_SHARED_GATE:
        return 1;
    default:
        return 0;
    }
}

/* gpt-oss's fused experts, adapted through PEFT's target_parameters. */
static int kind_is_expert_param(mt_param_kind k) {
    return k == MT_W_EXP_GATE_UP || k == MT_W_EXP_DOWN_IO;
}

/* Whether parameter name (no ".weight") is NAME or ends with ".NAME", as PEFT matches
 * target_parameters. */
static int is_param(const char *tensor, const char *name, size_t len) {
    size_t n = strlen(tensor);
    if (n < len || strncmp(tensor + n - len, name, len) != 0) return 0;
    return n == len || tensor[n - len - 1] == '.';
}

/* Marks in `hit` the fused experts' parameters NAME matches (gpt-oss); *found_out says whether any. */
static void match_experts(const mt_param_table *t, const char *name, size_t len, char *hit,
                          int *found_out) {
    int found = 0;
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        if (p->ndim != 3 || !kind_is_expert_param(p->kind) || !is_param(p->name, name, len)) continue;
        hit[i] = 1;
        found = 1;
    }
    *found_out = found;
}

/* Whether tensor name "....NAME.weight" is module NAME's weight (the name ends ".NAME.weight"). */
static int is_module(const char *tensor, const char *name, size_t len) {
    size_t n = strlen(tensor), w = strlen(".weight");
    if (n < len + w + 1 || strcmp(tensor + n - w, ".weight") != 0) return 0;
    const char *at = tensor + n - w - len;
    return at[-1] == '.' && strncmp(at, name, len) == 0;
}

/* Marks in `hit` (t->n_params) the tensors one target name matches; MT_ERR for a module it
 * matches that is not adaptable (strict: a name the user gave), or none at all (strict). */
static int match_target(const mt_param_table *t, const char *name, size_t len, int strict,
                        char *hit, int *found_out) {
    int found = 0;
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        if (p->ndim != 2 || !is_module(p->name, name, len)) continue;
        if (p->expert >= 0) continue; /* gate_proj also names the experts': they stay frozen */
        if (!kind_is_adaptable(p->kind)) {
            if (!strict) continue;
            return mt_error_set("--lora-targets \"%.*s\": %s is not a module megatrain adapts "
                                "(the linear projections of attention, the Gated DeltaNet and the "
                                "MLPs are; not the experts, the router, embed_tokens or lm_head)",
                                (int)len, name, p->name);
        }
        hit[i] = 1;
        found = 1;
    }
    if (!found && strict)
        return mt_error_set("--lora-targets: no module of this %s model is named \"%.*s\" (of "
                            "those megatrain adapts: the experts are not)",
                            t->cfg.model_type, (int)len, name);
    *found_out = found;
    return MT_OK;
}

static int64_t align_up(int64_t n) { return (n + MT_LORA_ALIGN - 1) / MT_LORA_ALIGN * MT_LORA_ALIGN; }

/* An experts' adapter (model/lora.h): named as PEFT nests its wrappers (`inner`: gate_up_proj's
 * inside down_proj's), lora_A (r E, in), lora_B (out, r E) of parameter p (E, in, out). */
static void add_expert_tensor(mt_lora_table *lt, const mt_param *p, int base, int is_b, int inner,
                              int64_t *off) {
    mt_lora_param *q = &lt->params[lt->n_params++];
    memset(q, 0, sizeof(*q));
    const char *dot = strrchr(p->name, '.'); /* model.layers.N.mlp.experts | .gate_up_proj */
    snprintf(q->name, sizeof(q->name), "base_model.model.%.*s.%slora_%c.weight",
             (int)(dot - p->name), p->name, inner ? "base_layer." : "", is_b ? 'B' : 'A');
    q->base = base;
    q->layer = p->layer;
    q->kind = p->kind;
    q->is_b = is_b;
    q->experts = (int)p->shape[0];
    q->shape[0] = is_b ? p->shape[2] : lt->rank * p->shape[0];
    q->shape[1] = is_b ? lt->rank * p->shape[0] : p->shape[1];
    q->numel = q->shape[0] * q->shape[1];
    q->offset = *off;
    *off = align_up(*off + q->numel);
    lt->n_real += q->numel;
}

static void add_tensor(mt_lora_table *lt, const mt_param *p, int base, int is_b, int64_t *off) {
    mt_lora_param *q = &lt->params[lt->n_params++];
    memset(q, 0, sizeof(*q));
    size_t n = strlen(p->name) - strlen(".weight");
    /* a multimodal checkpoint's "model.X" is transformers' module model.language_model.X */
    const char *name = p->name;
    int lm = lt->nested && strncmp(name, "model.", 6) == 0;
    if (lm) name += 6, n -= 6;
    snprintf(q->name, sizeof(q->name), "base_model.model.%s%.*s.lora_%c.weight",
             lm ? "model.language_model." : "", (int)n, name, is_b ? 'B' : 'A');
    q->base = base;
    q->layer = p->layer;
    q->kind = p->kind;
    q->is_b = is_b;
    q->shape[0] = is_b ? p->shape[0] : lt->rank;
    q->shape[1] = is_b ? lt->rank : p->shape[1];
    q->numel = q->shape[0] * q->shape[1];
    q->offset = *off;
    *off = align_up(*off + q->numel);
    lt->n_real += q->numel;
}

/* gpt-oss's MLP has no Linear module: the router (mlp.router) is a module of its own, which PEFT
 * refuses as a target, and the experts are fused 3-D parameters (mlp.experts.gate_up_proj,
 * down_proj), which PEFT reaches through target_parameters and megatrain as the targets
 * gate_up_proj and down_proj. A target naming the router, the experts' module or the dense MLP's
 * names other families have is refused with what gpt-oss supports. */
static int gpt_oss_check_target(const char *name, size_t len) {
    static const char *const mlp[] = {"experts", "gate_proj", "up_proj"};
    const char *leaf = name;
    for (size_t i = 0; i < len; i++)
        if (name[i] == '.') leaf = name + i + 1;
    size_t n = len - (size_t)(leaf - name);
    if (n == strlen("router") && strncmp(leaf, "router", n) == 0)
        return mt_error_set("--lora-targets \"%.*s\": gpt_oss's router (mlp.router) is not a Linear "
                            "module (PEFT refuses it too); LoRA on gpt_oss adapts the attention "
                            "projections (" MT_LORA_GPT_OSS_TARGETS ") and the experts ("
                            MT_LORA_GPT_OSS_EXPERTS ")", (int)len, name);
    for (size_t i = 0; i < sizeof mlp / sizeof mlp[0]; i++)
        if (n == strlen(mlp[i]) && strncmp(leaf, mlp[i], n) == 0)
            return mt_error_set("--lora-targets \"%.*s\": gpt_oss's MLP is only its experts, fused "
                                "3-D parameters: name them as gate_up_proj and down_proj (PEFT's "
                                "target_parameters mlp.experts.gate_up_proj, mlp.experts.down_proj); "
                                "LoRA on gpt_oss adapts the attention projections ("
                                MT_LORA_GPT_OSS_TARGETS ") and the experts (" MT_LORA_GPT_OSS_EXPERTS
                                ")", (int)len, name);
    return MT_OK;
}

/* Whether dotted name (len chars) has a component equal to c. */
static int has_component(const char *name, size_t len, const char *c) {
    size_t n = strlen(c);
    for (size_t i = 0; i + n <= len; i++)
        if ((i == 0 || name[i - 1] == '.') && (i + n == len || name[i + n] == '.') &&
            strncmp(name + i, c, n) == 0)
            return 1;
    return 0;
}

/* gemma4's MoE block beside the dense MLP: the router (router.proj, a Linear PEFT would adapt as
 * "proj"; "router" itself PEFT refuses) and the fused experts (experts.gate_up_proj, down_proj:
 * parameters, which PEFT reaches only through target_parameters) are not adapted; a target naming
 * them is refused saying so. gate_proj, up_proj and down_proj name the dense MLP's modules there,
 * as in PEFT. */
static int gemma4_moe_check_target(const char *name, size_t len) {
    if (has_component(name, len, "router") || has_component(name, len, "proj"))
        return mt_error_set("--lora-targets \"%.*s\": the router of gemma4's MoE block (router.proj) "
                            "stays frozen (megatrain adapts no router); LoRA on gemma4 adapts the "
                            "attention and the dense MLP: " MT_LORA_GEMMA4_TARGETS, (int)len, name);
    if (has_component(name, len, "experts") || has_component(name, len, "gate_up_proj"))
        return mt_error_set("--lora-targets \"%.*s\": gemma4's experts are fused 3-D parameters "
                            "(experts.gate_up_proj, down_proj), not Linear modules (PEFT reaches "
                            "them only through target_parameters, which megatrain trains on gpt_oss "
                            "only); LoRA on gemma4 adapts the attention and the dense MLP: "
                            MT_LORA_GEMMA4_TARGETS, (int)len, name);
    return MT_OK;
}

int mt_lora_table_init(mt_lora_table *lt, const mt_param_table *t, const mt_lora_opts *o) {
    memset(lt, 0, sizeof(*lt));
    /* gpt-oss: adapters on q/k/v/o (the biases, sinks, router and experts stay frozen), checked
     * against PEFT 0.21 on the CPU (tests/fixtures/lora_gpt_oss); the default list matches those
     * alone there. Gemma 3 (gemma3_text): adapters on its projections checked against PEFT 0.21
     * on the CPU (tests/fixtures/lora_gemma3). Gemma 4: the same, with v_proj only where a layer
     * has one (not the full layers with attention_k_eq_v, whose values are k_proj's output: its
     * adapter reaches them), and on the MoE model the dense MLP's, the router and the experts
     * frozen (tests/fixtures/lora_gemma4, lora_gemma4_moe). A backend without a family's ops
     * refuses the family as a whole (mt_layer_backend_check), LoRA with it. */
    if (o->rank < 1 || o->rank > MT_LORA_MAX_RANK)
        return mt_error_set("--lora %d: the rank must be 1 to %d", o->rank, MT_LORA_MAX_RANK);
    int strict = o->targets != NULL; /* the default list names what any family may have */
    const char *targets = strict ? o->targets : MT_LORA_DEFAULT_TARGETS;
    if (strlen(targets) >= sizeof(lt->targets))
        return mt_error_set("--lora-targets: longer than %zu characters", sizeof(lt->targets) - 1);
    char *hit = mt_calloc((size_t)t->n_params, 1);
    size_t used = 0; /* lt->targets: the names that matched, in the order given */
    for (const char *p = targets;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        int found = 0;
        int rc = len ? MT_OK : mt_error_set("--lora-targets \"%s\": an empty module name", targets);
        if (rc == MT_OK && strict && t->cfg.arch == MT_ARCH_GPT_OSS) {
            rc = gpt_oss_check_target(p, len);
            if (rc == MT_OK) match_experts(t, p, len, hit, &found);
            if (found) goto next; /* an experts' parameter: listed in lt->parameters */
        }
        if (rc == MT_OK && strict && t->cfg.moe_beside_dense)
            rc = gemma4_moe_check_target(p, len);
        if (rc == MT_OK && strict && !t->cfg.moe_beside_dense && t->cfg.arch != MT_ARCH_GPT_OSS &&
            (has_component(p, len, "gate_up_proj") || has_component(p, len, "experts")))
            rc = mt_error_set("--lora-targets \"%.*s\": LoRA on fused experts (PEFT's "
                              "target_parameters mlp.experts.gate_up_proj, down_proj) is supported "
                              "on gpt_oss only, not %s", (int)len, p, t->cfg.model_type);
        if (rc == MT_OK) rc = match_target(t, p, len, strict, hit, &found);
        if (rc != MT_OK) {
            free(hit);
            return rc;
        }
        if (found) {
            used += (size_t)snprintf(lt->targets + used, sizeof lt->targets - used, "%s%.*s",
                                     used ? "," : "", (int)len, p);
        }
    next:
        if (!end) break;
        p = end + 1;
    }
    /* PEFT's target_parameters (an adapter directory's): the experts' parameters alone */
    for (const char *p = o->parameters; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        int found = 0;
        if (t->cfg.arch == MT_ARCH_GPT_OSS) match_experts(t, p, len, hit, &found);
        if (!found) {
            free(hit);
            return mt_error_set("target_parameters \"%.*s\": %s", (int)len, p,
                                t->cfg.arch == MT_ARCH_GPT_OSS
                                    ? "no experts' parameter of this gpt_oss model has that name "
                                      "(megatrain adapts mlp.experts.gate_up_proj and down_proj)"
                                    : "LoRA on parameters (fused experts) is supported on gpt_oss only");
        }
        if (!end) break;
        p = end + 1;
    }
    lt->rank = o->rank;
    lt->alpha = o->alpha > 0 ? o->alpha : 2.0 * o->rank;
    lt->scale = (float)(lt->alpha / o->rank);
    lt->L = t->cfg.L;
    lt->nested = t->cfg.nested;
    int modules = 0, adapted[2] = {0, 0}; /* experts: gate_up_proj, down_proj */
    for (int i = 0; i < t->n_params; i++) {
        modules += hit[i];
        if (hit[i] && kind_is_expert_param(t->params[i].kind))
            adapted[t->params[i].kind == MT_W_EXP_DOWN_IO] = 1;
    }
    snprintf(lt->parameters, sizeof lt->parameters, "%s%s%s",
             adapted[0] ? "mlp.experts.gate_up_proj" : "", adapted[0] && adapted[1] ? "," : "",
             adapted[1] ? "mlp.experts.down_proj" : "");
    lt->params = mt_calloc((size_t)(2 * modules + 1), sizeof(mt_lora_param));
    lt->a_index = mt_malloc((size_t)lt->L * MT_LAYER_KINDS * sizeof(int64_t));
    for (int i = 0; i < lt->L * MT_LAYER_KINDS; i++) lt->a_index[i] = -1;
    int64_t off = 0;
    for (int i = 0; i < t->n_params; i++) {
        if (!hit[i]) continue;
        const mt_param *p = &t->params[i];
        lt->a_index[(size_t)p->layer * MT_LAYER_KINDS + p->kind] = lt->n_params;
        if (kind_is_expert_param(p->kind)) { /* gate_up_proj's wrapper inside down_proj's */
            int inner = p->kind == MT_W_EXP_GATE_UP && adapted[1];
            add_expert_tensor(lt, p, i, 0, inner, &off);
            add_expert_tensor(lt, p, i, 1, inner, &off);
            continue;
        }
        add_tensor(lt, p, i, 0, &off);
        add_tensor(lt, p, i, 1, &off);
    }
    lt->n_modules = modules;
    lt->total = off;
    free(hit);
    return MT_OK;
}

void mt_lora_table_free(mt_lora_table *lt) {
    free(lt->params);
    free(lt->a_index);
    memset(lt, 0, sizeof(*lt));
}

const char *mt_lora_targets_text(const mt_lora_table *lt, char *buf, size_t size) {
    size_t used = (size_t)snprintf(buf, size, "%s", lt->targets);
    char *copy = mt_strdup(lt->parameters);
    for (char *save = NULL, *p = strtok_r(copy, ",", &save); p && used < size;
         p = strtok_r(NULL, ",", &save)) {
        const char *leaf = strrchr(p, '.');
        used += (size_t)snprintf(buf + used, size - used, "%s%s", used ? "," : "", leaf ? leaf + 1 : p);
    }
    free(copy);
    return buf;
}

const mt_lora_param *mt_lora_find(const mt_lora_table *lt, int l, mt_param_kind kind) {
    if (l < 0 || l >= lt->L || (int)kind < 0 || kind >= MT_LAYER_KINDS) return NULL;
    int64_t i = lt->a_index[(size_t)l * MT_LAYER_KINDS + kind];
    return i < 0 ? NULL : &lt->params[i];
}

const mt_lora_param *mt_lora_find_name(const mt_lora_table *lt, const char *name) {
    for (int i = 0; i < lt->n_params; i++)
        if (strcmp(lt->params[i].name, name) == 0) return &lt->params[i];
    return NULL;
}

mt_lora_view mt_lora_view_at(const mt_lora_table *lt, int l, void *arena, size_t elem_size) {
    mt_lora_view v;
    memset(&v, 0, sizeof(v));
    v.rank = lt->rank;
    v.scale = lt->scale;
    for (int k = 0; k < MT_LAYER_KINDS; k++) {
        const mt_lora_param *a = mt_lora_find(lt, l, (mt_param_kind)k);
        if (!a) continue;
        v.a[k] = (char *)arena + (size_t)a->offset * elem_size;
        v.b[k] = (char *)arena + (size_t)a[1].offset * elem_size;
    }
    return v;
}

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void mt_lora_init(const mt_lora_table *lt, float *arena, uint64_t seed) {
    memset(arena, 0, (size_t)lt->total * sizeof(float));
    for (int i = 0; i < lt->n_params; i++) {
        const mt_lora_param *p = &lt->params[i];
        if (p->is_b) continue; /* zero */
        float bound = 1.0f / sqrtf((float)p->shape[1]);
        uint64_t key = mix64(seed ^ mix64(0x6c6f7261ull + (uint64_t)i));
        float *x = arena + p->offset;
        for (int64_t j = 0; j < p->numel; j++) { /* 24 random bits to [-1, 1) */
            double u = (double)(mix64(key ^ mix64((uint64_t)j)) >> 40) / (double)(1 << 23) - 1.0;
            x[j] = (float)u * bound;
        }
    }
}

/* W (out, in) += scale * B (out, r) @ A (r, in): each row's sums in fp64, rounded once into W. */
static void merge_module(float *w, const float *a, const float *b, int64_t out, int64_t in, int r,
                         double scale) {
#pragma omp parallel
    {
        double *acc = mt_malloc((size_t)in * sizeof(double));
#pragma omp for schedule(static)
        for (int64_t i = 0; i < out; i++) {
            memset(acc, 0, (size_t)in * sizeof(double));
            for (int k = 0; k < r; k++) {
                const double bk = b[i * r + k];
                const float *ak = a + (int64_t)k * in;
                for (int64_t j = 0; j < in; j++) acc[j] += bk * ak[j];
            }
            float *wi = w + i * in;
            for (int64_t j = 0; j < in; j++) wi[j] = (float)((double)wi[j] + scale * acc[j]);
        }
        free(acc);
    }
}

/* The experts' W (E, in, out): W[e] += scale * A_e^T (in, r) B_e^T (r, out), A (E, r, in) and B
 * (E, out, r) as the arena holds them; each row's sums in fp64, rounded once into W. */
static void merge_experts(float *w, const float *a, const float *b, int64_t E, int64_t in,
                          int64_t out, int r, double scale) {
#pragma omp parallel
    {
        double *acc = mt_malloc((size_t)out * sizeof(double));
#pragma omp for schedule(static)
        for (int64_t ei = 0; ei < E * in; ei++) {
            int64_t e = ei / in, i = ei % in;
            const float *ae = a + e * r * in, *be = b + e * out * r;
            memset(acc, 0, (size_t)out * sizeof(double));
            for (int k = 0; k < r; k++) {
                const double ak = ae[(int64_t)k * in + i];
                for (int64_t o = 0; o < out; o++) acc[o] += ak * be[o * r + k];
            }
            float *wi = w + ei * out;
            for (int64_t o = 0; o < out; o++) wi[o] = (float)((double)wi[o] + scale * acc[o]);
        }
        free(acc);
    }
}

void mt_lora_peft_layout(const mt_lora_param *p, const float *src, float *dst, int to_peft) {
    if (!p->experts || !p->is_b) {
        memcpy(dst, src, (size_t)p->numel * sizeof(float));
        return;
    }
    int64_t E = p->experts, out = p->shape[0], r = p->shape[1] / E;
    for (int64_t e = 0; e < E; e++)
        for (int64_t o = 0; o < out; o++)
            for (int64_t k = 0; k < r; k++) {
                int64_t arena = (e * out + o) * r + k, peft = o * r * E + k * E + e;
                if (to_peft) dst[peft] = src[arena];
                else dst[arena] = src[peft];
            }
}

void mt_lora_merge(const mt_lora_table *lt, const float *adapters, const mt_param_table *t,
                   float *weights) {
    for (int i = 0; i < lt->n_params; i++) {
        const mt_lora_param *a = &lt->params[i];
        if (a->is_b) continue;
        const mt_lora_param *b = a + 1;
        const mt_param *p = &t->params[a->base];
        if (a->experts) {
            MT_CHECK(b->is_b && b->base == a->base && p->ndim == 3 && p->shape[0] == a->experts &&
                         p->shape[1] == a->shape[1] && p->shape[2] == b->shape[0],
                     "adapter table out of step at %s", a->name);
            merge_experts(weights + p->offset, adapters + a->offset, adapters + b->offset,
                          p->shape[0], p->shape[1], p->shape[2], lt->rank, (double)lt->scale);
            continue;
        }
        MT_CHECK(b->is_b && b->base == a->base && p->shape[0] == b->shape[0] &&
                     p->shape[1] == a->shape[1], "adapter table out of step at %s", a->name);
        merge_module(weights + p->offset, adapters + a->offset, adapters + b->offset, p->shape[0],
                     p->shape[1], lt->rank, (double)lt->scale);
    }
}
