/* Packed rows: documents in, rows of T+1 tokens out, whole or split (see packed.h). One row is
 * held in memory; the header, whose counts are known only at the end, is written last. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/packed.h"

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8), p[2] = (unsigned char)(v >> 16), p[3] = (unsigned char)(v >> 24);
}

static void put_u64(unsigned char *p, uint64_t v) {
    put_u32(p, (uint32_t)v);
    put_u32(p + 4, (uint32_t)(v >> 32));
}

static size_t row_bytes(const mt_packed_writer *w) { return (size_t)(w->T + 1) * w->id_size + w->T; }
static unsigned char *flags_of(mt_packed_writer *w) { return w->row + (size_t)(w->T + 1) * w->id_size; }

static void put_id(mt_packed_writer *w, int slot, int32_t id) {
    unsigned char *p = w->row + (size_t)slot * w->id_size;
    if (w->id_size == 2) p[0] = (unsigned char)id, p[1] = (unsigned char)(id >> 8);
    else put_u32(p, (uint32_t)id);
}

int mt_pack_policy_parse(const char *s, mt_pack_policy *out) {
    if (s && strcmp(s, "whole") == 0) *out = MT_PACK_WHOLE;
    else if (s && strcmp(s, "split") == 0) *out = MT_PACK_SPLIT;
    else return mt_error_set("unknown --pack \"%s\" (expected whole or split)", s ? s : "(null)");
    return MT_OK;
}

const char *mt_pack_policy_name(mt_pack_policy p) { return p == MT_PACK_SPLIT ? "split" : "whole"; }

int mt_packed_writer_open(mt_packed_writer *w, const char *path, int T, int vocab, int id_size, int pad_id,
                          mt_pack_policy policy) {
    memset(w, 0, sizeof *w);
    if (T < 1) return mt_error_set("%s: T %d is not a sequence length", path, T);
    if (id_size != 2 && id_size != 4) return mt_error_set("%s: id size %d must be 2 or 4", path, id_size);
    if (vocab < 1 || (id_size == 2 && vocab > 65536))
        return mt_error_set("%s: a vocabulary of %d ids does not fit %d-byte ids", path, vocab, id_size);
    if (pad_id < 0 || pad_id >= vocab) return mt_error_set("%s: pad id %d outside the vocabulary", path, pad_id);
    w->T = T, w->vocab = vocab, w->id_size = id_size, w->pad_id = pad_id, w->policy = policy;
    MT_TRY(mt_atomic_open(&w->af, path));
    unsigned char zero[MT_PACKED_HEADER] = {0}; /* the header's place, filled in at commit */
    if (mt_atomic_write(&w->af, zero, sizeof zero) != MT_OK) {
        mt_atomic_abort(&w->af);
        return MT_ERR;
    }
    w->row = mt_calloc(1, row_bytes(w));
    return MT_OK;
}

/* The rest of the row from pos: the pad id, no loss, a document of its own (DOC at its first input
 * position; none when only ids[T], a target, is left). */
static void pad_rest(mt_packed_writer *w) {
    if (w->pos < w->T) {
        flags_of(w)[w->pos] |= MT_PACKED_DOC;
        w->padded += w->T - w->pos;
    }
    for (int s = w->pos; s <= w->T; s++) put_id(w, s, w->pad_id);
    w->pos = w->T + 1;
}

/* Writes the full row and starts the next: empty (whole), or opening with the row's last token
 * (split: the one-token overlap), where whatever document it belongs to starts afresh. */
static int next_row(mt_packed_writer *w) {
    MT_TRY(mt_atomic_write(&w->af, w->row, row_bytes(w)));
    w->rows++;
    unsigned char *fl = flags_of(w);
    memset(fl, 0, (size_t)w->T);
    w->pos = 0;
    if (w->policy == MT_PACK_SPLIT) {
        memmove(w->row, w->row + (size_t)w->T * w->id_size, (size_t)w->id_size);
        fl[0] = MT_PACKED_DOC;
        w->pos = 1;
    }
    return MT_OK;
}

/* whole: the document goes into the current row (its tokens fit the ids left, its first is an input) */
static int fits(const mt_packed_writer *w, size_t n) {
    return w->pos < w->T && (size_t)w->pos + n <= (size_t)w->T + 1;
}

int mt_packed_writer_add(mt_packed_writer *w, const int32_t *ids, const uint8_t *trained, size_t n) {
    MT_CHECK(n >= 1 && w->row, "a document of %zu tokens", n);
    if (w->policy == MT_PACK_WHOLE) {
        MT_CHECK(n <= (size_t)w->T + 1, "a document of %zu tokens does not fit a row of %d + 1", n, w->T);
        if (!fits(w, n)) {
            pad_rest(w);
            MT_TRY(next_row(w));
        }
    }
    unsigned char *fl = flags_of(w);
    for (size_t i = 0; i < n; i++) {
        MT_CHECK(ids[i] >= 0 && ids[i] < w->vocab, "token id %d outside the vocabulary of %d", ids[i], w->vocab);
        if (w->pos == w->T + 1) MT_TRY(next_row(w)); /* split only: whole documents fit */
        if (i == 0 && w->pos < w->T) fl[w->pos] |= MT_PACKED_DOC;
        put_id(w, w->pos, ids[i]);
        if (i > 0 && trained[i]) {
            fl[w->pos - 1] |= MT_PACKED_LOSS;
            w->trained++;
        }
        w->pos++;
        w->tokens++;
    }
    w->documents++;
    return MT_OK;
}

int mt_packed_writer_commit(mt_packed_writer *w) {
    int rc = MT_OK;
    if (w->tokens == 0) rc = mt_error_set("%s: no document to pack", w->af.path);
    /* the last row, padded: unless it holds nothing but the previous row's overlap token (split) */
    int last = w->policy == MT_PACK_WHOLE ? w->pos > 0 : w->pos > 1 || w->rows == 0;
    if (rc == MT_OK && last) {
        pad_rest(w);
        rc = next_row(w);
    }
    if (rc == MT_OK) {
        unsigned char h[MT_PACKED_HEADER] = {0};
        memcpy(h, MT_PACKED_MAGIC, 8);
        put_u32(h + 8, MT_PACKED_VERSION);
        put_u32(h + 12, (uint32_t)w->T);
        put_u64(h + 16, (uint64_t)w->rows);
        put_u32(h + 24, (uint32_t)w->vocab);
        put_u32(h + 28, (uint32_t)w->id_size);
        put_u64(h + 32, (uint64_t)w->documents);
        put_u64(h + 40, (uint64_t)w->trained);
        rc = mt_atomic_write_at(&w->af, 0, h, sizeof h);
    }
    if (rc == MT_OK) rc = mt_atomic_commit(&w->af);
    else mt_atomic_abort(&w->af);
    free(w->row);
    w->row = NULL;
    return rc;
}

void mt_packed_writer_abort(mt_packed_writer *w) {
    mt_atomic_abort(&w->af);
    free(w->row);
    w->row = NULL;
}
