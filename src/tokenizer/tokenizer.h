/* Hugging Face tokenizer.json in C: BPE tokenizers of the Llama family, exact against the
 * `tokenizers` library (tests/fixtures/tokenizers holds the proof).
 *
 * Supported (anything else is refused at load with an error naming the file, field and type):
 *   model         BPE (vocab, merges as "a b" strings or [a, b] pairs, unk_token, fuse_unk,
 *                 byte_fallback, ignore_merges; dropout null or 0; no subword prefix/suffix)
 *   normalizer    null, NFC, NFD, NFKC, NFKD (libutf8proc), Prepend, Replace (String pattern),
 *                 Sequence of those
 *   pre_tokenizer null, ByteLevel (use_regex: the GPT-2 regex), Split (String or Regex pattern,
 *                 every behavior, invert; regexes run in PCRE2 with UTF, UCP and JIT, their \s \d
 *                 \w \p{general category} rewritten to tokenizers' sets, Unicode 16.0:
 *                 tok_uclass.c), Metaspace
 *                 (prepend_scheme always|first|never, split), Sequence of those; ByteLevel must be
 *                 the last step
 *   post_processor null, ByteLevel, TemplateProcessing (its "single" template), Sequence
 *   decoder       null, ByteLevel, Replace (String), ByteFallback, Fuse, Strip, Metaspace, Sequence
 *   added_tokens  matched before the model, longest first, on the raw text (normalized: false)
 *                 or on the normalized text (normalized: true), with lstrip/rstrip/single_word
 * That covers GPT-2, Llama 3, Qwen 2/2.5/3 (byte-level) and Llama 2 / Mistral (sentencepiece-style
 * BPE with byte fallback, Prepend+Replace normalizer or Metaspace pre-tokenizer).
 *
 * Text that is not valid UTF-8 (which Python's tokenizers cannot take at all) is accepted by every
 * model here and encoded so that decode gives the same bytes back:
 *   - byte-level models: regexes treat an invalid byte as a boundary (PCRE2_MATCH_INVALID_UTF);
 *     the unmatched bytes form a piece of their own and map to byte tokens as usual.
 *   - other models: each invalid byte is one "character"; with byte_fallback it becomes <0xXX>,
 *     otherwise unk (or nothing when the model has no unk_token, as tokenizers does for an unknown
 *     character). Unicode normalizers leave invalid bytes as they are.
 *
 * Thread safety: a loaded tokenizer is read-only except for its word cache, which is locked per
 * shard (try-lock: a busy shard is bypassed, never waited on). Encode and decode may be called
 * from many threads on one tokenizer.
 */
#ifndef MT_TOKENIZER_H
#define MT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_tokenizer mt_tokenizer;

/* Loads DIR/tokenizer.json (+ DIR/tokenizer_config.json when present, for bos/eos and the chat
 * template), or the given .json file (+ tokenizer_config.json beside it). MT_ERR with mt_error_message() naming the file
 * and field on anything malformed or unsupported. */
int mt_tokenizer_load(mt_tokenizer **out, const char *dir_or_json);
void mt_tokenizer_free(mt_tokenizer *t);

/* A growable id vector that encode appends to (reuse it across calls to avoid allocations). */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} mt_token_vec;
void mt_token_vec_free(mt_token_vec *v);

/* Encodes len bytes of text (any bytes; see above) and appends the ids to out. add_special: apply
 * the post-processor (e.g. Llama's <s> / <|begin_of_text|> prefix), as tokenizers'
 * encode(text, add_special_tokens=True). Special tokens written in the text are always recognised.
 * Returns MT_OK (encoding cannot fail on any input once loaded). */
int mt_tokenizer_encode_into(const mt_tokenizer *t, const char *text, size_t len, int add_special,
                             mt_token_vec *out);
/* Same, into a fresh malloc'd array (*ids, free() it; never NULL, even for n = 0). */
int mt_tokenizer_encode(const mt_tokenizer *t, const char *text, size_t len, int add_special,
                        int32_t **ids, size_t *n);

enum {
    MT_TOK_SKIP_SPECIAL = 1, /* drop special added tokens (tokenizers' skip_special_tokens=True) */
    MT_TOK_HF_LOSSY = 2,     /* bytes that are not UTF-8 become U+FFFD exactly where tokenizers'
                                decoders put them (Python strings); default: the raw bytes */
};
/* Decodes ids into a malloc'd, NUL-terminated byte string (*len excludes the NUL).
 * MT_ERR on an id outside the vocabulary. */
int mt_tokenizer_decode(const mt_tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                        char **text, size_t *len);

/* ids + 1 of the largest id (model vocabulary and added tokens). */
int mt_tokenizer_vocab_size(const mt_tokenizer *t);
/* bos/eos from tokenizer_config.json ("bos_token"/"eos_token", a string or {"content": ...});
 * without it, eos is the first of <|endoftext|>, </s>, <|end_of_text|>, <|im_end|>, <|eot_id|>
 * present and bos the first of <s>, <|begin_of_text|>. -1 when none. */
int mt_tokenizer_bos(const mt_tokenizer *t);
int mt_tokenizer_eos(const mt_tokenizer *t);
/* The Jinja chat template text (chat_template.jinja beside tokenizer_config.json, else its
 * "chat_template" field), NULL when there is none. Only read to pick a chat format (chat.h). */
const char *mt_tokenizer_chat_template(const mt_tokenizer *t);
/* Added tokens first, then the model vocabulary (as tokenizers' token_to_id); -1 when absent. */
int mt_tokenizer_token_id(const mt_tokenizer *t, const char *token);
/* The stored token string of an id (NULL when the id is unused); *len may be NULL. */
const char *mt_tokenizer_token(const mt_tokenizer *t, int id, size_t *len);
int mt_tokenizer_is_special(const mt_tokenizer *t, int id);

#ifdef __cplusplus
}
#endif

#endif
