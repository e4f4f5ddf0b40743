/* Internals of the tokenizer shared by its files (not for use outside src/tokenizer). */
#ifndef MT_TOK_INTERNAL_H
#define MT_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* Ids run below 2^24 (megatrain's vocabulary limit, model/config.h): tables are sized by the
 * largest id, so a stray id of 2^30 would take gigabytes (found by fuzz_tokenizer_load). */
#define MT_TOK_MAX_ID (1 << 24)

/* ---- byte buffers and small helpers (tok_util.c) ---- */

typedef struct {
    char *p;
    size_t n, cap;
} tok_buf;

void tok_buf_reserve(tok_buf *b, size_t extra);
void tok_buf_put(tok_buf *b, const void *s, size_t n);
static inline void tok_buf_putc(tok_buf *b, char c) {
    if (b->n + 1 > b->cap) tok_buf_reserve(b, 1);
    b->p[b->n++] = c;
}
void tok_buf_free(tok_buf *b);
void tok_vec_push(mt_token_vec *v, int32_t id);

uint64_t tok_hash(const void *s, size_t n);

/* Length of the valid UTF-8 sequence starting at s[0] (1..4), 0 when it is not valid (Rust's
 * str::from_utf8 rules: no overlongs, surrogates or code points past U+10FFFF). *cp receives it. */
int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp);
int tok_utf8_valid(const char *s, size_t n);
/* Appends s with every maximal invalid subpart replaced by U+FFFD (Rust's from_utf8_lossy). */
void tok_utf8_lossy(tok_buf *out, const char *s, size_t n);
size_t tok_utf8_put(char *out, uint32_t cp); /* encodes cp (< 0x110000), returns 1..4 */
int tok_is_whitespace(uint32_t cp);          /* Unicode White_Space (via utf8proc categories) */
int tok_is_word(uint32_t cp); /* a word character to tokenizers' single_word (tok_uclass.c) */

/* string -> id, open addressing over an id array; keys live in the caller's token table. */
typedef struct {
    uint32_t *slots; /* id + 1; 0 empty */
    uint32_t mask;
    size_t count;
    char *const *keys;     /* keys[id] */
    const uint32_t *klens; /* klens[id] */
} tok_strmap;

void tok_strmap_init(tok_strmap *m, size_t expected, char *const *keys, const uint32_t *klens);
/* Inserts id (keys[id] must be set). Returns the id already mapped to the same key, or -1. */
int32_t tok_strmap_put(tok_strmap *m, int32_t id);
int32_t tok_strmap_get(const tok_strmap *m, const char *s, size_t n);
void tok_strmap_free(tok_strmap *m);

/* ---- regex (tok_util.c) ---- */

/* Appends pattern p with its Unicode classes (\s \d \w \p{..} and negations) rewritten to those
 * of Hugging Face tokenizers' regex engine (tok_uclass.c). exact 0: without the code points new
 * since Unicode 14.0 (PCRE2 10.42's tables lack them: they stay unmatched), which agrees on any text
 * without such code points and is faster; exact 1: with them. */
void tok_regex_unicode(const char *p, size_t n, int exact, tok_buf *out);
/* Offset of the first code point new since Unicode 14.0 that a class gains, at or after `from`
 * (n when none). Invalid UTF-8 is skipped. */
size_t tok_uclass_next_new(const char *s, size_t n, size_t from);
int tok_uclass_is_new(uint32_t cp);

typedef struct {
    pcre2_code *code;  /* the fast form; exact on text without tok_uclass_next_new code points */
    pcre2_code *exact; /* the exact form, NULL when the same as code */
    int lookbehind;    /* the pattern looks back (lookbehind, \b, \A) */
} tok_regex;

/* literal: match the pattern as a plain string, else with tokenizers' Unicode classes (both
 * forms). Error names `where` and an offset into the pattern as written. */
int tok_regex_compile(tok_regex *r, const char *pattern, size_t len, int literal, const char *where);
void tok_regex_free(tok_regex *r);

/* One text being searched: the fast form runs up to the next new code point, the exact form
 * only around it. */
enum { TOK_RE_AUTO, TOK_RE_FAST, TOK_RE_EXACT }; /* FAST, EXACT: one form only (tests) */
typedef struct {
    const char *s;
    size_t n;
    size_t next_new; /* first new code point at or after the last search, or n */
    int past_new;    /* one lies before the search position */
    int mode;
} tok_subject;
void tok_subject_init(tok_subject *sub, const tok_regex *r, const char *s, size_t n, int mode);

/* Per-call matcher state (match data, JIT stack on demand). */
typedef struct {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *stack;
} tok_matcher;
void tok_matcher_free(tok_matcher *m);
/* Finds the next non-empty match in the subject at or after `from`; 1 with [*ms, *me), else 0.
 * Searches of one subject go forward (from never decreases). */
int tok_regex_next(const tok_regex *r, tok_subject *sub, tok_matcher *m, size_t from, size_t *ms,
                   size_t *me);

/* ---- BPE model (bpe.c) ---- */

#define TOK_CACHE_SHARDS 16
#define TOK_CACHE_SLOTS 4096       /* per shard, direct mapped */
#define TOK_CACHE_MAX_WORD 128     /* bytes; longer words are not cached */
#define TOK_CACHE_ARENA (1u << 20) /* bytes of keys + ids per shard before it is cleared */

typedef struct {
    uint64_t hash;
    uint32_t key_off, key_len, ids_off, ids_len; /* into the shard arena */
} tok_cache_slot;

typedef struct {
    pthread_mutex_t lock;
    tok_cache_slot *slots;
    char *arena;
    size_t used;
} tok_cache_shard;

typedef struct {
    uint64_t *keys; /* (a << 32 | b) + 1; 0 empty */
    uint32_t *rank, *new_id;
    uint64_t mask;
} tok_mergemap;

typedef struct {
    int n_vocab;      /* entries of the vocab table (max id + 1) */
    char **tok;       /* tok[id]: the token as written in the vocab (NULL: hole) */
    uint32_t *tok_len;
    tok_strmap map;   /* vocab string -> id */
    /* The strings the model sees. For byte-level tokenizers these are the vocab strings mapped
     * back to raw bytes (the model then works on the text's bytes directly); otherwise the same
     * as tok. A byte-level token that does not map back is unreachable and absent here. */
    char **raw;
    uint32_t *raw_len;
    tok_strmap raw_map;
    int32_t byte_id[256];     /* byte-level: id of the one-byte token; fallback: <0xXX>; -1 none */
    tok_mergemap merges;
    int32_t unk_id;           /* -1 when no unk_token */
    int fuse_unk, byte_fallback, ignore_merges, byte_level;
    tok_cache_shard cache[TOK_CACHE_SHARDS];
} tok_bpe;

int tok_bpe_load(tok_bpe *m, void *json_model, int byte_level, const char *path);
void tok_bpe_free(tok_bpe *m);
/* Encodes one pre-token (bytes) and appends its ids. */
void tok_bpe_encode_word(tok_bpe *m, const char *w, size_t n, mt_token_vec *out);

/* ---- pipeline components ---- */

enum { TN_UNICODE, TN_PREPEND, TN_REPLACE };
typedef struct {
    int kind;
    int uform;     /* TN_UNICODE: utf8proc options */
    char *a, *b;   /* Prepend: a; Replace: a -> b */
    size_t alen, blen;
} tok_norm;

enum { TP_BYTELEVEL, TP_SPLIT, TP_METASPACE };
enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };
typedef struct {
    int kind;
    int add_prefix_space, use_regex; /* ByteLevel */
    tok_regex re;                    /* Split pattern, or ByteLevel's GPT-2 regex */
    int behavior, invert;            /* Split */
    char repl[8];                    /* Metaspace replacement char (UTF-8) */
    size_t repl_len;
    int prepend_scheme, split;       /* Metaspace */
} tok_pretok;

enum { TD_BYTELEVEL, TD_REPLACE, TD_BYTEFALLBACK, TD_FUSE, TD_STRIP, TD_METASPACE };
typedef struct {
    int kind;
    char *a, *b; /* Replace a -> b; Strip/Metaspace: a = the char */
    size_t alen, blen;
    int start, stop;     /* Strip */
    int prepend_scheme;  /* Metaspace */
} tok_decoder;

typedef struct {
    char *content;
    size_t len;
    int32_t id;
    int single_word, lstrip, rstrip, normalized, special;
    char *pattern; /* what is matched: content, or content normalized (normalized: true) */
    size_t plen;
} tok_added;

/* Leftmost-longest matcher over a set of added tokens. */
typedef struct {
    int n;
    int *idx;            /* into the tokenizer's added[] */
    int first[257];      /* candidates whose pattern starts with byte c: idx[first[c]..first[c+1]) */
    uint8_t any[256];
} tok_addset;

struct mt_tokenizer {
    char *path;
    tok_bpe bpe;
    tok_norm *norms;
    int n_norms;
    tok_pretok *pretoks;
    int n_pretoks;
    tok_decoder *decs;
    int n_decs;
    int has_decoder;
    tok_added *added;
    int n_added;
    tok_addset set_raw, set_norm;
    int32_t *prefix_ids, *suffix_ids; /* TemplateProcessing single */
    int n_prefix, n_suffix;
    /* id -> token text for decode, covering the model vocab and added tokens */
    int n_ids;
    const char **id_tok;
    uint32_t *id_len;
    uint8_t *id_special;
    int bos, eos;
    char *chat_template; /* tokenizer_config.json "chat_template" / chat_template.jinja, or NULL */
};

/* tok_encode.c: applies the normalizers to s into out (replacing its contents). */
void tok_normalize(const mt_tokenizer *t, const char *s, size_t n, tok_buf *out);

#endif
