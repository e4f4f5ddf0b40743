/* The BPE model of tokenizer.json: vocab, merges by rank, byte fallback, unk, ignore_merges, and
 * a word cache.
 *
 * A word is split into characters (bytes for byte-level tokenizers, which the model sees as raw
 * bytes: see tok_bpe.raw), each looked up in the vocab; then the adjacent pair of lowest merge rank
 * is merged, leftmost first on ties, until no pair has a rank — the order of tokenizers'
 * Word::merge_all, with the same binary heap of (rank, position) and the same stale-entry checks. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

/* ---- merges: (a, b) -> (rank, new id) ---- */

static void merges_init(tok_mergemap *mm, size_t n) {
    size_t cap = 64;
    while (cap < n * 2) cap *= 2;
    mm->keys = mt_calloc(cap, sizeof *mm->keys);
    mm->rank = mt_malloc(cap * sizeof *mm->rank);
    mm->new_id = mt_malloc(cap * sizeof *mm->new_id);
    mm->mask = cap - 1;
}

static inline uint64_t pair_key(int32_t a, int32_t b) {
    return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
}

static inline uint64_t pair_slot(uint64_t key) {
    uint64_t x = key * 0x9E3779B97F4A7C15ULL;
    return x ^ (x >> 29);
}

/* A later duplicate of a pair replaces the earlier one (tokenizers collects into a HashMap). */
static void merges_put(tok_mergemap *mm, int32_t a, int32_t b, uint32_t rank, uint32_t new_id) {
    uint64_t key = pair_key(a, b);
    uint64_t i = pair_slot(key) & mm->mask;
    while (mm->keys[i] && mm->keys[i] != key) i = (i + 1) & mm->mask;
    mm->keys[i] = key;
    mm->rank[i] = rank;
    mm->new_id[i] = new_id;
}

static inline int merges_get(const tok_mergemap *mm, int32_t a, int32_t b, uint32_t *rank,
                             uint32_t *new_id) {
    uint64_t key = pair_key(a, b);
    uint64_t i = pair_slot(key) & mm->mask;
    for (;;) {
        uint64_t k = mm->keys[i];
        if (k == key) {
            *rank = mm->rank[i];
            *new_id = mm->new_id[i];
            return 1;
        }
        if (!k) return 0;
        i = (i + 1) & mm->mask;
    }
}

/* ---- the byte-level alphabet (GPT-2's bytes_to_unicode) ---- */

/* Byte b is shown as code point byte_char(b): printable Latin-1 bytes as themselves, the others
 * as 256, 257, ... in byte order. */
static uint32_t byte_char(int b) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (printable) return (uint32_t)b;
    int k = 0;
    for (int c = 0; c < b; c++) {
        int p = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
        if (!p) k++;
    }
    return 256u + (uint32_t)k;
}

/* Maps a byte-level token string back to bytes; 0 when a character is outside the alphabet. */
static int bytelevel_to_raw(const char *s, size_t n, const int16_t *char_byte, char *out,
                            size_t *out_len) {
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        int k = tok_utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (!k || cp >= 512 || char_byte[cp] < 0) return 0;
        out[o++] = (char)char_byte[cp];
        i += k;
    }
    *out_len = o;
    return 1;
}

/* ---- loading ---- */

static int json_str(json_t *v, const char **s, size_t *n) {
    if (!json_is_string(v)) return 0;
    *s = json_string_value(v);
    *n = json_string_length(v);
    return 1;
}

int tok_bpe_load(tok_bpe *m, void *json_model, int byte_level, const char *path) {
    json_t *model = json_model;
    memset(m, 0, sizeof *m);
    m->unk_id = -1;
    m->byte_level = byte_level;
    for (int s = 0; s < TOK_CACHE_SHARDS; s++) pthread_mutex_init(&m->cache[s].lock, NULL);

    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0))
        return mt_error_set("%s: model.dropout must be null or 0 (BPE dropout is not deterministic)",
                            path);
    const char *fields[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int f = 0; f < 2; f++) {
        json_t *v = json_object_get(model, fields[f]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return mt_error_set("%s: model.%s is not supported (the Llama-family BPEs have none)",
                                path, fields[f]);
    }
    m->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    m->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    m->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));

    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return mt_error_set("%s: model.vocab must be an object", path);
    size_t nv = json_object_size(vocab);
    int max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= MT_TOK_MAX_ID)
            return mt_error_set("%s: model.vocab[\"%s\"] must be an id in 0..2^24 (tables are sized by "
                                "the largest id)", path, key);
        if (json_integer_value(val) > max_id) max_id = (int)json_integer_value(val);
    }
    m->n_vocab = max_id + 1;
    m->tok = mt_calloc((size_t)m->n_vocab + 1, sizeof *m->tok);
    m->tok_len = mt_calloc((size_t)m->n_vocab + 1, sizeof *m->tok_len);
    tok_strmap_init(&m->map, nv, m->tok, m->tok_len);
    void *it = json_object_iter(vocab);
    for (; it; it = json_object_iter_next(vocab, it)) {
        const char *k = json_object_iter_key(it);
        size_t klen = json_object_iter_key_len(it);
        int id = (int)json_integer_value(json_object_iter_value(it));
        if (m->tok[id])
            return mt_error_set("%s: model.vocab: id %d is given to both \"%s\" and \"%s\"", path, id,
                                m->tok[id], k);
        m->tok[id] = mt_malloc(klen + 1);
        memcpy(m->tok[id], k, klen + 1);
        m->tok_len[id] = (uint32_t)klen;
        tok_strmap_put(&m->map, id);
    }

    /* The strings the model matches against. */
    if (byte_level) {
        int16_t char_byte[512];
        for (int c = 0; c < 512; c++) char_byte[c] = -1;
        for (int b = 0; b < 256; b++) char_byte[byte_char(b)] = (int16_t)b;
        m->raw = mt_calloc((size_t)m->n_vocab + 1, sizeof *m->raw);
        m->raw_len = mt_calloc((size_t)m->n_vocab + 1, sizeof *m->raw_len);
        tok_strmap_init(&m->raw_map, nv, m->raw, m->raw_len);
        for (int id = 0; id < m->n_vocab; id++) {
            if (!m->tok[id]) continue;
            char *r = mt_malloc(m->tok_len[id] + 1);
            size_t rl;
            if (!bytelevel_to_raw(m->tok[id], m->tok_len[id], char_byte, r, &rl)) {
                free(r);
                continue;
            }
            m->raw[id] = r;
            m->raw_len[id] = (uint32_t)rl;
            tok_strmap_put(&m->raw_map, id);
        }
    } else {
        m->raw = m->tok;
        m->raw_len = m->tok_len;
    }
    const tok_strmap *rmap = byte_level ? &m->raw_map : &m->map;
    for (int b = 0; b < 256; b++) {
        if (byte_level) {
            char c = (char)b;
            m->byte_id[b] = tok_strmap_get(rmap, &c, 1);
        } else {
            char code[8];
            snprintf(code, sizeof code, "<0x%02X>", b);
            m->byte_id[b] = m->byte_fallback ? tok_strmap_get(&m->map, code, 6) : -1;
        }
    }

    json_t *unk = json_object_get(model, "unk_token");
    if (unk && !json_is_null(unk)) {
        const char *s;
        size_t n;
        if (!json_str(unk, &s, &n)) return mt_error_set("%s: model.unk_token must be a string", path);
        m->unk_id = tok_strmap_get(&m->map, s, n);
        if (m->unk_id < 0)
            return mt_error_set("%s: model.unk_token \"%s\" is not in model.vocab", path, s);
    }

    json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges)) return mt_error_set("%s: model.merges must be an array", path);
    size_t nm = json_array_size(merges);
    merges_init(&m->merges, nm);
    tok_buf cat = {0}; /* a + b; every exit below frees it */
    int rc = MT_OK;
    for (size_t r = 0; r < nm; r++) {
        json_t *e = json_array_get(merges, r);
        const char *a, *b;
        size_t an, bn;
        if (json_is_string(e)) { /* "a b" */
            const char *s = json_string_value(e);
            const char *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = mt_error_set("%s: model.merges[%zu] \"%s\" must be two tokens separated by one "
                                  "space", path, r, s);
                break;
            }
            a = s;
            an = (size_t)(sp - s);
            b = sp + 1;
            bn = json_string_length(e) - an - 1;
        } else if (!(json_is_array(e) && json_array_size(e) == 2 && json_str(json_array_get(e, 0), &a, &an) &&
                     json_str(json_array_get(e, 1), &b, &bn))) {
            rc = mt_error_set("%s: model.merges[%zu] must be \"a b\" or [\"a\", \"b\"]", path, r);
            break;
        }
        int32_t ia = tok_strmap_get(&m->map, a, an), ib = tok_strmap_get(&m->map, b, bn);
        cat.n = 0;
        tok_buf_put(&cat, a, an);
        tok_buf_put(&cat, b, bn);
        tok_buf_putc(&cat, 0); /* for the message; not part of the key */
        int32_t inew = tok_strmap_get(&m->map, cat.p, cat.n - 1);
        if (ia < 0 || ib < 0 || inew < 0) {
            const char *bad = ia < 0 ? a : ib < 0 ? b : cat.p;
            int blen = (int)(ia < 0 ? an : ib < 0 ? bn : cat.n - 1);
            rc = mt_error_set("%s: model.merges[%zu]: \"%.*s\" is not in model.vocab", path, r, blen, bad);
            break;
        }
        merges_put(&m->merges, ia, ib, (uint32_t)r, (uint32_t)inew);
    }
    tok_buf_free(&cat);
    return rc;
}

void tok_bpe_free(tok_bpe *m) {
    for (int id = 0; id < m->n_vocab; id++) {
        free(m->tok ? m->tok[id] : NULL);
        if (m->byte_level && m->raw) free(m->raw[id]);
    }
    if (m->byte_level) {
        free(m->raw);
        free(m->raw_len);
        tok_strmap_free(&m->raw_map);
    }
    free(m->tok);
    free(m->tok_len);
    tok_strmap_free(&m->map);
    free(m->merges.keys);
    free(m->merges.rank);
    free(m->merges.new_id);
    for (int s = 0; s < TOK_CACHE_SHARDS; s++) {
        pthread_mutex_destroy(&m->cache[s].lock);
        free(m->cache[s].slots);
        free(m->cache[s].arena);
    }
    memset(m, 0, sizeof *m);
}

/* ---- merging one word ---- */

typedef struct {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    uint32_t len;       /* bytes; 0 once merged into the left neighbour */
} tok_sym;

typedef struct {
    uint32_t rank, pos, new_id;
} tok_merge;

static inline int merge_less(const tok_merge *x, const tok_merge *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(tok_merge *h, size_t *n, tok_merge m) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_less(&m, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static tok_merge heap_pop(tok_merge *h, size_t *n) {
    tok_merge top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && merge_less(&h[c + 1], &h[c])) c++;
        if (!merge_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* Scratch for one word; small words stay on the stack. */
#define TOK_STACK_SYMS 64

static void sym_add(tok_sym *syms, size_t *ns, int32_t id, uint32_t len) {
    size_t i = (*ns)++;
    syms[i].id = id;
    syms[i].len = len;
    syms[i].prev = (int32_t)i - 1;
    syms[i].next = (int32_t)i + 1;
}

static void merge_word(const tok_bpe *m, const char *w, size_t n, mt_token_vec *out) {
    tok_sym stack_syms[TOK_STACK_SYMS];
    tok_merge stack_heap[2 * TOK_STACK_SYMS];
    tok_sym *syms = n <= TOK_STACK_SYMS ? stack_syms : mt_malloc(n * sizeof *syms);
    tok_merge *heap = n <= TOK_STACK_SYMS ? stack_heap : mt_malloc(n * 2 * sizeof *heap);
    size_t ns = 0;
    const unsigned char *u = (const unsigned char *)w;

    /* characters -> initial symbols (tokenizers' merge_word) */
    int32_t unk_pending = -1;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        size_t k = 1;
        int32_t id;
        if (m->byte_level) {
            id = m->byte_id[u[i]];
        } else {
            uint32_t cp;
            int kk = u[i] < 0x80 ? 1 : tok_utf8_next(u + i, n - i, &cp);
            k = kk ? (size_t)kk : 1; /* an invalid byte is a character of its own */
            id = tok_strmap_get(&m->map, w + i, k);
        }
        if (id >= 0) {
            if (unk_pending >= 0) {
                sym_add(syms, &ns, unk_pending, unk_len);
                unk_pending = -1;
            }
            sym_add(syms, &ns, id, (uint32_t)k);
        } else {
            int fell_back = 0;
            if (m->byte_fallback) {
                fell_back = 1;
                for (size_t j = 0; j < k; j++)
                    if (m->byte_id[u[i + j]] < 0) fell_back = 0;
                if (fell_back)
                    for (size_t j = 0; j < k; j++) sym_add(syms, &ns, m->byte_id[u[i + j]], 1);
            }
            if (!fell_back && m->unk_id >= 0) {
                if (unk_pending >= 0 && m->fuse_unk) {
                    unk_len += (uint32_t)k;
                } else {
                    if (unk_pending >= 0) sym_add(syms, &ns, unk_pending, unk_len);
                    unk_pending = m->unk_id;
                    unk_len = (uint32_t)k;
                }
            }
        }
        i += k;
    }
    if (unk_pending >= 0) sym_add(syms, &ns, unk_pending, unk_len);
    if (ns) syms[ns - 1].next = -1;

    /* merges, lowest rank first, leftmost on ties */
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        uint32_t rank, nid;
        if (merges_get(&m->merges, syms[i].id, syms[i + 1].id, &rank, &nid))
            heap_push(heap, &nh, (tok_merge){rank, (uint32_t)i, nid});
    }
    while (nh) {
        tok_merge top = heap_pop(heap, &nh);
        tok_sym *s = &syms[top.pos];
        if (s->len == 0 || s->next < 0) continue;
        tok_sym *r = &syms[s->next];
        uint32_t rank, nid;
        if (!merges_get(&m->merges, s->id, r->id, &rank, &nid) || nid != top.new_id) continue;
        s->id = (int32_t)top.new_id;
        s->len += r->len;
        s->next = r->next;
        r->len = 0;
        if (s->next >= 0) syms[s->next].prev = (int32_t)top.pos;
        if (s->prev >= 0 && merges_get(&m->merges, syms[s->prev].id, s->id, &rank, &nid))
            heap_push(heap, &nh, (tok_merge){rank, (uint32_t)s->prev, nid});
        if (s->next >= 0 && merges_get(&m->merges, s->id, syms[s->next].id, &rank, &nid))
            heap_push(heap, &nh, (tok_merge){rank, top.pos, nid});
    }
    for (size_t i = 0; i < ns; i++)
        if (syms[i].len) tok_vec_push(out, syms[i].id);
    if (syms != stack_syms) {
        free(syms);
        free(heap);
    }
}

/* Heap bound: n - 1 initial pairs, and each merge pops one entry and pushes at most two, with at
 * most n - 1 merges: never more than 2n entries (symbols <= bytes, as each symbol covers >= 1). */

/* ---- cache ---- */

static int cache_get(tok_bpe *m, uint64_t h, const char *w, size_t n, mt_token_vec *out) {
    tok_cache_shard *sh = &m->cache[h % TOK_CACHE_SHARDS];
    if (pthread_mutex_trylock(&sh->lock) != 0) return 0;
    int hit = 0;
    if (sh->slots) {
        tok_cache_slot *s = &sh->slots[(h >> 8) % TOK_CACHE_SLOTS];
        if (s->hash == h && s->key_len == n && memcmp(sh->arena + s->key_off, w, n) == 0) {
            const int32_t *ids = (const int32_t *)(sh->arena + s->ids_off);
            for (uint32_t i = 0; i < s->ids_len; i++) tok_vec_push(out, ids[i]);
            hit = 1;
        }
    }
    pthread_mutex_unlock(&sh->lock);
    return hit;
}

static void cache_put(tok_bpe *m, uint64_t h, const char *w, size_t n, const int32_t *ids,
                      size_t nids) {
    tok_cache_shard *sh = &m->cache[h % TOK_CACHE_SHARDS];
    if (pthread_mutex_trylock(&sh->lock) != 0) return;
    if (!sh->slots) {
        sh->slots = mt_calloc(TOK_CACHE_SLOTS, sizeof *sh->slots);
        sh->arena = mt_malloc(TOK_CACHE_ARENA);
    }
    size_t key_off = (sh->used + 3) & ~(size_t)3;
    size_t ids_off = (key_off + n + 3) & ~(size_t)3;
    size_t end = ids_off + nids * sizeof(int32_t);
    if (end > TOK_CACHE_ARENA) { /* full: start over */
        memset(sh->slots, 0, TOK_CACHE_SLOTS * sizeof *sh->slots);
        key_off = 0;
        ids_off = (n + 3) & ~(size_t)3;
        end = ids_off + nids * sizeof(int32_t);
    }
    memcpy(sh->arena + key_off, w, n);
    memcpy(sh->arena + ids_off, ids, nids * sizeof(int32_t));
    sh->used = end;
    tok_cache_slot *s = &sh->slots[(h >> 8) % TOK_CACHE_SLOTS];
    *s = (tok_cache_slot){h, (uint32_t)key_off, (uint32_t)n, (uint32_t)ids_off, (uint32_t)nids};
    pthread_mutex_unlock(&sh->lock);
}

void tok_bpe_encode_word(tok_bpe *m, const char *w, size_t n, mt_token_vec *out) {
    if (n == 0) return;
    if (m->ignore_merges) {
        int32_t id = tok_strmap_get(m->byte_level ? &m->raw_map : &m->map, w, n);
        if (id >= 0) {
            tok_vec_push(out, id);
            return;
        }
    }
    if (n > TOK_CACHE_MAX_WORD) {
        merge_word(m, w, n, out);
        return;
    }
    uint64_t h = tok_hash(w, n);
    if (cache_get(m, h, w, n, out)) return;
    size_t start = out->n;
    merge_word(m, w, n, out);
    cache_put(m, h, w, n, out->ids + start, out->n - start);
}
