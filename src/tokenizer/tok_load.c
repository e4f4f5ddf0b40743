/* Loading tokenizer.json (+ tokenizer_config.json): every field checked, every unsupported
 * component refused by its type name and its place in the file. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

#define TOK_MAX_STAGES 16

/* The regex of tokenizers' ByteLevel pre-tokenizer (use_regex: true), GPT-2's. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef struct {
    const char *path;
    mt_tokenizer *t;
} ld;

static const char *type_of(json_t *o) {
    json_t *ty = json_object_get(o, "type");
    return json_is_string(ty) ? json_string_value(ty) : NULL;
}

static char *dup_n(const char *s, size_t n) {
    char *p = mt_malloc(n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

static int get_str(const ld *L, json_t *o, const char *key, const char *where, char **out, size_t *len) {
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) return mt_error_set("%s: %s.%s must be a string", L->path, where, key);
    *len = json_string_length(v);
    *out = dup_n(json_string_value(v), *len);
    return MT_OK;
}

/* {"String": "..."} patterns; a {"Regex": ...} one is reported as unsupported unless allowed. */
static int get_pattern(const ld *L, json_t *o, const char *where, int allow_regex, char **out,
                       size_t *len, int *is_regex) {
    json_t *p = json_object_get(o, "pattern");
    json_t *s = json_object_get(p, "String"), *r = json_object_get(p, "Regex");
    *is_regex = 0;
    if (json_is_string(s)) {
        *len = json_string_length(s);
        *out = dup_n(json_string_value(s), *len);
        return MT_OK;
    }
    if (json_is_string(r)) {
        if (!allow_regex)
            return mt_error_set("%s: %s.pattern: a Regex pattern is not supported here (only String)",
                                L->path, where);
        *is_regex = 1;
        *len = json_string_length(r);
        *out = dup_n(json_string_value(r), *len);
        return MT_OK;
    }
    return mt_error_set("%s: %s.pattern must be {\"String\": ...} or {\"Regex\": ...}", L->path, where);
}

/* ---- normalizers ---- */

static int add_normalizer(ld *L, json_t *o, const char *where) {
    mt_tokenizer *t = L->t;
    const char *ty = type_of(o);
    if (!ty) return mt_error_set("%s: %s has no \"type\"", L->path, where);
    if (!strcmp(ty, "Sequence")) {
        json_t *list = json_object_get(o, "normalizers");
        if (!json_is_array(list)) return mt_error_set("%s: %s.normalizers must be an array", L->path, where);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char w[256];
            snprintf(w, sizeof w, "%s.normalizers[%zu]", where, i);
            MT_TRY(add_normalizer(L, json_array_get(list, i), w));
        }
        return MT_OK;
    }
    tok_norm nm;
    memset(&nm, 0, sizeof nm);
    int is_regex;
    if (!strcmp(ty, "NFC")) {
        nm.kind = TN_UNICODE;
        nm.uform = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    } else if (!strcmp(ty, "NFD")) {
        nm.kind = TN_UNICODE;
        nm.uform = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    } else if (!strcmp(ty, "NFKC")) {
        nm.kind = TN_UNICODE;
        nm.uform = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    } else if (!strcmp(ty, "NFKD")) {
        nm.kind = TN_UNICODE;
        nm.uform = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    } else if (!strcmp(ty, "Prepend")) {
        nm.kind = TN_PREPEND;
        MT_TRY(get_str(L, o, "prepend", where, &nm.a, &nm.alen));
    } else if (!strcmp(ty, "Replace")) {
        nm.kind = TN_REPLACE;
        MT_TRY(get_pattern(L, o, where, 0, &nm.a, &nm.alen, &is_regex));
        if (get_str(L, o, "content", where, &nm.b, &nm.blen) != MT_OK) {
            free(nm.a);
            return MT_ERR;
        }
    } else {
        return mt_error_set("%s: %s: normalizer type \"%s\" is not supported (supported: NFC, NFD, NFKC, "
                            "NFKD, Prepend, Replace, Sequence)", L->path, where, ty);
    }
    t->norms = realloc(t->norms, (size_t)(t->n_norms + 1) * sizeof *t->norms);
    MT_CHECK(t->norms != NULL, "out of host memory");
    t->norms[t->n_norms++] = nm;
    return MT_OK;
}

/* ---- pre-tokenizers ---- */

static int prepend_scheme(const ld *L, json_t *o, const char *where, int *out) {
    json_t *ps = json_object_get(o, "prepend_scheme");
    if (json_is_string(ps)) {
        const char *s = json_string_value(ps);
        if (!strcmp(s, "always")) *out = PREPEND_ALWAYS;
        else if (!strcmp(s, "first")) *out = PREPEND_FIRST;
        else if (!strcmp(s, "never")) *out = PREPEND_NEVER;
        else return mt_error_set("%s: %s.prepend_scheme \"%s\" is not always|first|never", L->path, where, s);
        return MT_OK;
    }
    /* older files: add_prefix_space */
    json_t *aps = json_object_get(o, "add_prefix_space");
    *out = (!aps || json_is_true(aps)) ? PREPEND_ALWAYS : PREPEND_NEVER;
    return MT_OK;
}

static int metaspace_char(const ld *L, json_t *o, const char *where, char *out, size_t *len) {
    json_t *r = json_object_get(o, "replacement");
    uint32_t cp;
    if (!json_is_string(r) || json_string_length(r) == 0 || json_string_length(r) > 4 ||
        tok_utf8_next((const unsigned char *)json_string_value(r), json_string_length(r), &cp) !=
            (int)json_string_length(r))
        return mt_error_set("%s: %s.replacement must be one character", L->path, where);
    *len = json_string_length(r);
    memcpy(out, json_string_value(r), *len);
    return MT_OK;
}

static int add_pretok(ld *L, json_t *o, const char *where) {
    mt_tokenizer *t = L->t;
    const char *ty = type_of(o);
    if (!ty) return mt_error_set("%s: %s has no \"type\"", L->path, where);
    if (!strcmp(ty, "Sequence")) {
        json_t *list = json_object_get(o, "pretokenizers");
        if (!json_is_array(list)) return mt_error_set("%s: %s.pretokenizers must be an array", L->path, where);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char w[256];
            snprintf(w, sizeof w, "%s.pretokenizers[%zu]", where, i);
            MT_TRY(add_pretok(L, json_array_get(list, i), w));
        }
        return MT_OK;
    }
    if (t->n_pretoks && t->pretoks[t->n_pretoks - 1].kind == TP_BYTELEVEL)
        return mt_error_set("%s: %s: a pre-tokenizer after ByteLevel is not supported (ByteLevel must "
                            "come last)", L->path, where);
    if (t->n_pretoks >= TOK_MAX_STAGES)
        return mt_error_set("%s: %s: more than %d pre-tokenizers", L->path, where, TOK_MAX_STAGES);
    tok_pretok pt;
    memset(&pt, 0, sizeof pt);
    char w[300];
    if (!strcmp(ty, "ByteLevel")) {
        pt.kind = TP_BYTELEVEL;
        pt.add_prefix_space = json_is_true(json_object_get(o, "add_prefix_space"));
        json_t *ur = json_object_get(o, "use_regex");
        pt.use_regex = !ur || json_is_true(ur);
        snprintf(w, sizeof w, "%s: %s (GPT-2 regex)", L->path, where);
        if (pt.use_regex) MT_TRY(tok_regex_compile(&pt.re, GPT2_PATTERN, strlen(GPT2_PATTERN), 0, w));
    } else if (!strcmp(ty, "Split")) {
        pt.kind = TP_SPLIT;
        char *pat;
        size_t plen;
        int is_regex;
        MT_TRY(get_pattern(L, o, where, 1, &pat, &plen, &is_regex));
        snprintf(w, sizeof w, "%s: %s.pattern", L->path, where);
        int rc = tok_regex_compile(&pt.re, pat, plen, !is_regex, w);
        free(pat);
        MT_TRY(rc);
        json_t *b = json_object_get(o, "behavior");
        const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        pt.behavior = -1;
        for (int i = 0; i < 5; i++)
            if (json_is_string(b) && !strcmp(json_string_value(b), names[i])) pt.behavior = i;
        if (pt.behavior < 0) {
            tok_regex_free(&pt.re);
            return mt_error_set("%s: %s.behavior must be one of Removed, Isolated, MergedWithPrevious, "
                                "MergedWithNext, Contiguous", L->path, where);
        }
        pt.invert = json_is_true(json_object_get(o, "invert"));
    } else if (!strcmp(ty, "Metaspace")) {
        pt.kind = TP_METASPACE;
        MT_TRY(metaspace_char(L, o, where, pt.repl, &pt.repl_len));
        MT_TRY(prepend_scheme(L, o, where, &pt.prepend_scheme));
        json_t *sp = json_object_get(o, "split");
        pt.split = !sp || json_is_true(sp);
    } else {
        return mt_error_set("%s: %s: pre-tokenizer type \"%s\" is not supported (supported: ByteLevel, "
                            "Split, Metaspace, Sequence)", L->path, where, ty);
    }
    t->pretoks = realloc(t->pretoks, (size_t)(t->n_pretoks + 1) * sizeof *t->pretoks);
    MT_CHECK(t->pretoks != NULL, "out of host memory");
    t->pretoks[t->n_pretoks++] = pt;
    return MT_OK;
}

/* ---- decoders ---- */

static int add_decoder(ld *L, json_t *o, const char *where) {
    mt_tokenizer *t = L->t;
    const char *ty = type_of(o);
    if (!ty) return mt_error_set("%s: %s has no \"type\"", L->path, where);
    if (!strcmp(ty, "Sequence")) {
        json_t *list = json_object_get(o, "decoders");
        if (!json_is_array(list)) return mt_error_set("%s: %s.decoders must be an array", L->path, where);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char w[256];
            snprintf(w, sizeof w, "%s.decoders[%zu]", where, i);
            MT_TRY(add_decoder(L, json_array_get(list, i), w));
        }
        return MT_OK;
    }
    tok_decoder d;
    memset(&d, 0, sizeof d);
    int is_regex;
    if (!strcmp(ty, "ByteLevel")) {
        d.kind = TD_BYTELEVEL;
    } else if (!strcmp(ty, "ByteFallback")) {
        d.kind = TD_BYTEFALLBACK;
    } else if (!strcmp(ty, "Fuse")) {
        d.kind = TD_FUSE;
    } else if (!strcmp(ty, "Replace")) {
        d.kind = TD_REPLACE;
        MT_TRY(get_pattern(L, o, where, 0, &d.a, &d.alen, &is_regex));
        if (get_str(L, o, "content", where, &d.b, &d.blen) != MT_OK) {
            free(d.a);
            return MT_ERR;
        }
    } else if (!strcmp(ty, "Strip")) {
        d.kind = TD_STRIP;
        MT_TRY(get_str(L, o, "content", where, &d.a, &d.alen));
        json_t *s = json_object_get(o, "start"), *e = json_object_get(o, "stop");
        uint32_t cp;
        if (!json_is_integer(s) || !json_is_integer(e) || json_integer_value(s) < 0 ||
            json_integer_value(e) < 0 || d.alen == 0 ||
            tok_utf8_next((const unsigned char *)d.a, d.alen, &cp) != (int)d.alen) {
            free(d.a);
            return mt_error_set("%s: %s needs a one-character content and integer start/stop >= 0",
                                L->path, where);
        }
        d.start = (int)json_integer_value(s);
        d.stop = (int)json_integer_value(e);
    } else if (!strcmp(ty, "Metaspace")) {
        d.kind = TD_METASPACE;
        char c[8];
        size_t n;
        MT_TRY(metaspace_char(L, o, where, c, &n));
        MT_TRY(prepend_scheme(L, o, where, &d.prepend_scheme)); /* before the copy: no leak on error */
        d.a = dup_n(c, n);
        d.alen = n;
    } else {
        return mt_error_set("%s: %s: decoder type \"%s\" is not supported (supported: ByteLevel, "
                            "ByteFallback, Fuse, Replace, Strip, Metaspace, Sequence)", L->path, where, ty);
    }
    t->decs = realloc(t->decs, (size_t)(t->n_decs + 1) * sizeof *t->decs);
    MT_CHECK(t->decs != NULL, "out of host memory");
    t->decs[t->n_decs++] = d;
    return MT_OK;
}

/* ---- post-processor ---- */

static int add_template_ids(ld *L, json_t *specials, const char *name, const char *where, int32_t **ids,
                            int *n) {
    json_t *sp = json_object_get(specials, name);
    json_t *list = json_object_get(sp, "ids");
    if (!json_is_array(list))
        return mt_error_set("%s: %s: special token \"%s\" is not in special_tokens (with its ids)",
                            L->path, where, name);
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *v = json_array_get(list, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return mt_error_set("%s: %s.special_tokens[\"%s\"].ids must be ids", L->path, where, name);
        *ids = realloc(*ids, (size_t)(*n + 1) * sizeof **ids);
        MT_CHECK(*ids != NULL, "out of host memory");
        (*ids)[(*n)++] = (int32_t)json_integer_value(v);
    }
    return MT_OK;
}

static int add_post(ld *L, json_t *o, const char *where) {
    mt_tokenizer *t = L->t;
    const char *ty = type_of(o);
    if (!ty) return mt_error_set("%s: %s has no \"type\"", L->path, where);
    if (!strcmp(ty, "Sequence")) {
        json_t *list = json_object_get(o, "processors");
        if (!json_is_array(list)) return mt_error_set("%s: %s.processors must be an array", L->path, where);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char w[256];
            snprintf(w, sizeof w, "%s.processors[%zu]", where, i);
            MT_TRY(add_post(L, json_array_get(list, i), w));
        }
        return MT_OK;
    }
    if (!strcmp(ty, "ByteLevel")) return MT_OK; /* offsets only */
    if (strcmp(ty, "TemplateProcessing") != 0)
        return mt_error_set("%s: %s: post-processor type \"%s\" is not supported (supported: "
                            "TemplateProcessing, ByteLevel, Sequence)", L->path, where, ty);
    if (t->n_prefix || t->n_suffix)
        return mt_error_set("%s: %s: more than one TemplateProcessing", L->path, where);
    json_t *single = json_object_get(o, "single"), *specials = json_object_get(o, "special_tokens");
    if (!json_is_array(single)) return mt_error_set("%s: %s.single must be an array", L->path, where);
    int seen_a = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        json_t *e = json_array_get(single, i);
        json_t *st = json_object_get(e, "SpecialToken"), *sq = json_object_get(e, "Sequence");
        if (st && json_is_string(json_object_get(st, "id"))) {
            const char *name = json_string_value(json_object_get(st, "id"));
            MT_TRY(add_template_ids(L, specials, name, where, seen_a ? &t->suffix_ids : &t->prefix_ids,
                                    seen_a ? &t->n_suffix : &t->n_prefix));
        } else if (sq) {
            json_t *id = json_object_get(sq, "id");
            if (seen_a || !json_is_string(id) || strcmp(json_string_value(id), "A") != 0)
                return mt_error_set("%s: %s.single must hold the sequence A exactly once", L->path, where);
            seen_a = 1;
        } else {
            return mt_error_set("%s: %s.single[%zu] must be a SpecialToken or a Sequence", L->path, where, i);
        }
    }
    if (!seen_a) return mt_error_set("%s: %s.single has no Sequence A", L->path, where);
    return MT_OK;
}

/* ---- added tokens ---- */

static int cmp_added(const void *x, const void *y, void *arg) {
    const tok_added *a = (const tok_added *)arg + *(const int *)x, *b = (const tok_added *)arg + *(const int *)y;
    unsigned ca = (unsigned char)a->pattern[0], cb = (unsigned char)b->pattern[0];
    if (ca != cb) return ca < cb ? -1 : 1;
    if (a->plen != b->plen) return a->plen > b->plen ? -1 : 1; /* longest first */
    return *(const int *)x - *(const int *)y;
}

static void build_set(mt_tokenizer *t, tok_addset *s, int normalized) {
    s->idx = mt_malloc((size_t)(t->n_added + 1) * sizeof *s->idx);
    s->n = 0;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && t->added[i].plen) s->idx[s->n++] = i;
    qsort_r(s->idx, (size_t)s->n, sizeof *s->idx, cmp_added, t->added);
    memset(s->any, 0, sizeof s->any);
    int k = 0;
    for (int c = 0; c < 256; c++) {
        s->first[c] = k;
        while (k < s->n && (unsigned char)t->added[s->idx[k]].pattern[0] == c) {
            s->any[c] = 1;
            k++;
        }
    }
    s->first[256] = k;
}

static int load_added(ld *L, json_t *root) {
    mt_tokenizer *t = L->t;
    json_t *list = json_object_get(root, "added_tokens");
    if (!list || json_is_null(list)) return MT_OK;
    if (!json_is_array(list)) return mt_error_set("%s: added_tokens must be an array", L->path);
    size_t n = json_array_size(list);
    t->added = mt_calloc(n + 1, sizeof *t->added);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(list, i);
        json_t *id = json_object_get(e, "id"), *content = json_object_get(e, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MT_TOK_MAX_ID ||
            !json_is_string(content))
            return mt_error_set("%s: added_tokens[%zu] needs an integer id and a string content", L->path, i);
        tok_added *a = &t->added[t->n_added++];
        a->len = json_string_length(content);
        a->content = dup_n(json_string_value(content), a->len);
        a->id = (int32_t)json_integer_value(id);
        a->single_word = json_is_true(json_object_get(e, "single_word"));
        a->lstrip = json_is_true(json_object_get(e, "lstrip"));
        a->rstrip = json_is_true(json_object_get(e, "rstrip"));
        json_t *nz = json_object_get(e, "normalized");
        a->special = json_is_true(json_object_get(e, "special"));
        a->normalized = nz ? json_is_true(nz) : !a->special;
        if (a->normalized && t->n_norms) { /* matched as the normalizer writes it */
            tok_buf b = {0};
            tok_normalize(t, a->content, a->len, &b);
            a->pattern = dup_n(b.p ? b.p : "", b.n);
            a->plen = b.n;
            tok_buf_free(&b);
        } else {
            a->pattern = dup_n(a->content, a->len);
            a->plen = a->len;
        }
    }
    build_set(t, &t->set_raw, 0);
    build_set(t, &t->set_norm, 1);
    return MT_OK;
}

/* ---- ids, bos/eos ---- */

static void build_id_table(mt_tokenizer *t) {
    int n = t->bpe.n_vocab;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id + 1 > n) n = t->added[i].id + 1;
    t->n_ids = n;
    t->id_tok = mt_calloc((size_t)n + 1, sizeof *t->id_tok);
    t->id_len = mt_calloc((size_t)n + 1, sizeof *t->id_len);
    t->id_special = mt_calloc((size_t)n + 1, 1);
    for (int id = 0; id < t->bpe.n_vocab; id++) {
        t->id_tok[id] = t->bpe.tok[id];
        t->id_len[id] = t->bpe.tok_len[id];
    }
    for (int i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        t->id_tok[a->id] = a->content;
        t->id_len[a->id] = (uint32_t)a->len;
    }
    /* special is a property of the content (tokenizers' special_tokens_set) */
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].special)
            for (int j = 0; j < t->n_added; j++)
                if (t->added[j].len == t->added[i].len && !memcmp(t->added[j].content, t->added[i].content, t->added[i].len))
                    t->id_special[t->added[j].id] = 1;
}

static int config_token(ld *L, json_t *cfg, const char *key, const char *cfg_path) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!v || json_is_null(v)) return -2; /* not given */
    if (!json_is_string(v))
        return mt_error_set("%s: %s must be a string or {\"content\": string}", cfg_path, key), -3;
    int id = mt_tokenizer_token_id(L->t, json_string_value(v));
    if (id < 0)
        return mt_error_set("%s: %s \"%s\" is not a token of %s", cfg_path, key, json_string_value(v),
                            L->path), -3;
    return id;
}

static int first_present(const mt_tokenizer *t, const char *const *names) {
    for (int i = 0; names[i]; i++) {
        int id = mt_tokenizer_token_id(t, names[i]);
        if (id >= 0) return id;
    }
    return -1;
}

/* "chat_template": a string, or transformers' list of {"name", "template"} (the "default" one).
 * Kept as text: only the chat format is read from it (tokenizer/chat.h), never executed. */
static int config_chat_template(mt_tokenizer *t, json_t *cfg, const char *cfg_path) {
    json_t *v = json_object_get(cfg, "chat_template");
    if (json_is_array(v)) {
        json_t *item, *found = NULL;
        size_t i;
        json_array_foreach(v, i, item) {
            json_t *name = json_object_get(item, "name");
            if (json_is_string(name) && strcmp(json_string_value(name), "default") == 0)
                found = json_object_get(item, "template");
        }
        v = found;
    }
    if (!v || json_is_null(v)) return MT_OK;
    if (!json_is_string(v))
        return mt_error_set("%s: chat_template must be a string or a list of {\"name\", \"template\"}",
                            cfg_path);
    t->chat_template = dup_n(json_string_value(v), json_string_length(v));
    return MT_OK;
}

/* chat_template.jinja beside tokenizer_config.json (where newer transformers save the template). */
static int load_chat_template_file(mt_tokenizer *t, const char *cfg_path) {
    const char *slash = strrchr(cfg_path, '/');
    size_t dlen = slash ? (size_t)(slash - cfg_path) : 0;
    char *path = mt_malloc(dlen + 32);
    snprintf(path, dlen + 32, "%.*s%schat_template.jinja", (int)dlen, cfg_path, slash ? "/" : "");
    FILE *f = fopen(path, "rb");
    int rc = MT_OK;
    if (f) {
        size_t cap = 4096, n = 0, got;
        char *buf = mt_malloc(cap);
        while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
            n += got;
            if (n + 1 == cap) {
                cap *= 2;
                buf = realloc(buf, cap);
                MT_CHECK(buf != NULL, "out of memory");
            }
        }
        if (ferror(f)) {
            rc = mt_error_set("%s: read failed", path);
            free(buf);
        } else {
            buf[n] = 0;
            t->chat_template = buf;
        }
        fclose(f);
    }
    free(path);
    return rc;
}

static int load_config(ld *L, const char *cfg_path) {
    mt_tokenizer *t = L->t;
    MT_TRY(load_chat_template_file(t, cfg_path));
    static const char *const eos_names[] = {"<|endoftext|>", "</s>", "<|end_of_text|>", "<|im_end|>",
                                            "<|eot_id|>", NULL};
    static const char *const bos_names[] = {"<s>", "<|begin_of_text|>", NULL};
    t->eos = first_present(t, eos_names);
    t->bos = first_present(t, bos_names);
    struct stat st;
    if (stat(cfg_path, &st) != 0) return MT_OK;
    json_error_t jerr;
    /* Integers as doubles: the real Llama 2 / Mistral files hold model_max_length = 1e30 written
     * as an integer, past jansson's 64 bits. Nothing numeric is read from this file (only the
     * bos/eos strings and the chat template), so the rounding never matters. */
    json_t *cfg = json_load_file(cfg_path, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &jerr);
    if (!cfg) return mt_error_set("%s:%d: %s", cfg_path, jerr.line, jerr.text);
    int rc = MT_OK;
    if (!json_is_object(cfg)) {
        rc = mt_error_set("%s: must be a JSON object", cfg_path);
    } else {
        int bos = config_token(L, cfg, "bos_token", cfg_path);
        int eos = bos == -3 ? -3 : config_token(L, cfg, "eos_token", cfg_path);
        if (bos == -3 || eos == -3) rc = MT_ERR;
        if (json_is_null(json_object_get(cfg, "bos_token"))) t->bos = -1;
        if (bos >= 0) t->bos = bos;
        if (eos >= 0) t->eos = eos;
        if (rc == MT_OK && !t->chat_template) rc = config_chat_template(t, cfg, cfg_path);
    }
    json_decref(cfg);
    return rc;
}

/* ---- the whole file ---- */

static int load_root(ld *L, json_t *root) {
    mt_tokenizer *t = L->t;
    if (!json_is_object(root)) return mt_error_set("%s: must be a JSON object", L->path);
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return mt_error_set("%s: model must be an object", L->path);
    const char *mty = type_of(model);
    if (mty && strcmp(mty, "BPE") != 0)
        return mt_error_set("%s: model.type \"%s\" is not supported (only BPE)", L->path, mty);
    if (!mty && !json_object_get(model, "merges"))
        return mt_error_set("%s: model has no type and no merges: not a BPE model", L->path);

    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) MT_TRY(add_normalizer(L, norm, "normalizer"));
    json_t *pre = json_object_get(root, "pre_tokenizer");
    if (pre && !json_is_null(pre)) MT_TRY(add_pretok(L, pre, "pre_tokenizer"));
    json_t *post = json_object_get(root, "post_processor");
    if (post && !json_is_null(post)) MT_TRY(add_post(L, post, "post_processor"));
    json_t *dec = json_object_get(root, "decoder");
    if (dec && !json_is_null(dec)) {
        t->has_decoder = 1;
        MT_TRY(add_decoder(L, dec, "decoder"));
    }
    int byte_level = t->n_pretoks && t->pretoks[t->n_pretoks - 1].kind == TP_BYTELEVEL;
    MT_TRY(tok_bpe_load(&t->bpe, model, byte_level, L->path));
    MT_TRY(load_added(L, root));
    for (int i = 0; i < t->n_added; i++) {
        int32_t in_vocab = tok_strmap_get(&t->bpe.map, t->added[i].content, t->added[i].len);
        if (in_vocab >= 0 && in_vocab != t->added[i].id)
            return mt_error_set("%s: added_tokens: \"%s\" has id %d but model.vocab gives it %d", L->path,
                                t->added[i].content, t->added[i].id, in_vocab);
    }
    build_id_table(t);
    for (int i = 0; i < t->n_prefix; i++)
        if (t->prefix_ids[i] >= t->n_ids) return mt_error_set("%s: post_processor: id %d out of range", L->path, t->prefix_ids[i]);
    for (int i = 0; i < t->n_suffix; i++)
        if (t->suffix_ids[i] >= t->n_ids) return mt_error_set("%s: post_processor: id %d out of range", L->path, t->suffix_ids[i]);
    return MT_OK;
}

int mt_tokenizer_load(mt_tokenizer **out, const char *dir_or_json) {
    *out = NULL;
    struct stat st;
    if (stat(dir_or_json, &st) != 0) return mt_error_set("%s: no such file or directory", dir_or_json);
    size_t n = strlen(dir_or_json);
    char *json_path = mt_malloc(n + 32), *cfg_path = mt_malloc(n + 32);
    if (S_ISDIR(st.st_mode)) {
        snprintf(json_path, n + 32, "%s/tokenizer.json", dir_or_json);
        snprintf(cfg_path, n + 32, "%s/tokenizer_config.json", dir_or_json);
    } else {
        snprintf(json_path, n + 32, "%s", dir_or_json);
        const char *slash = strrchr(dir_or_json, '/');
        int dlen = slash ? (int)(slash - dir_or_json) : 1;
        snprintf(cfg_path, n + 32, "%.*s/tokenizer_config.json", dlen, slash ? dir_or_json : ".");
    }
    mt_tokenizer *t = mt_calloc(1, sizeof *t);
    t->path = json_path;
    t->bos = t->eos = -1;
    ld L = {json_path, t};
    int rc = MT_OK;
    json_error_t jerr;
    json_t *root = json_load_file(json_path, JSON_ALLOW_NUL, &jerr);
    if (!root) {
        rc = stat(json_path, &st) != 0 ? mt_error_set("%s: no such file", json_path)
                                       : mt_error_set("%s:%d:%d: malformed JSON: %s", json_path, jerr.line,
                                                      jerr.column, jerr.text);
    } else {
        rc = load_root(&L, root);
        json_decref(root);
    }
    if (rc == MT_OK) rc = load_config(&L, cfg_path);
    free(cfg_path);
    if (rc != MT_OK) {
        mt_tokenizer_free(t);
        return MT_ERR;
    }
    *out = t;
    return MT_OK;
}

void mt_tokenizer_free(mt_tokenizer *t) {
    if (!t) return;
    tok_bpe_free(&t->bpe);
    for (int i = 0; i < t->n_norms; i++) {
        free(t->norms[i].a);
        free(t->norms[i].b);
    }
    free(t->norms);
    for (int i = 0; i < t->n_pretoks; i++)
        if (t->pretoks[i].re.code) tok_regex_free(&t->pretoks[i].re);
    free(t->pretoks);
    for (int i = 0; i < t->n_decs; i++) {
        free(t->decs[i].a);
        free(t->decs[i].b);
    }
    free(t->decs);
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].pattern);
    }
    free(t->added);
    free(t->set_raw.idx);
    free(t->set_norm.idx);
    free(t->prefix_ids);
    free(t->suffix_ids);
    free(t->id_tok);
    free(t->id_len);
    free(t->id_special);
    free(t->path);
    free(t->chat_template);
    free(t);
}

/* ---- queries ---- */

int mt_tokenizer_vocab_size(const mt_tokenizer *t) { return t->n_ids; }
int mt_tokenizer_bos(const mt_tokenizer *t) { return t->bos; }
int mt_tokenizer_eos(const mt_tokenizer *t) { return t->eos; }
const char *mt_tokenizer_chat_template(const mt_tokenizer *t) { return t->chat_template; }

int mt_tokenizer_token_id(const mt_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, token, n)) return t->added[i].id;
    return tok_strmap_get(&t->bpe.map, token, n);
}

const char *mt_tokenizer_token(const mt_tokenizer *t, int id, size_t *len) {
    if (id < 0 || id >= t->n_ids || !t->id_tok[id]) return NULL;
    if (len) *len = t->id_len[id];
    return t->id_tok[id];
}

int mt_tokenizer_is_special(const mt_tokenizer *t, int id) {
    return id >= 0 && id < t->n_ids && t->id_special[id];
}
