/* Byte-level text -> uint16 token file (see byte_text.h): the text / JSONL reader of text_data.c
 * with byte ids, so that `tokenize --bytes` and `train --data` read every input alike. */
#include "data/byte_text.h"

#include <string.h>

#include "core/error.h"

int mt_byte_text_to_tokens(const char *const *paths, int n_paths, const char *out_path,
                           const char *doc_sep_line, int eos_id, mt_text_stats *stats) {
    return mt_byte_text_to_tokens_indexed(paths, n_paths, out_path, doc_sep_line, eos_id, NULL, stats);
}

int mt_byte_text_to_tokens_indexed(const char *const *paths, int n_paths, const char *out_path,
                                   const char *doc_sep_line, int eos_id, const char *doc_index,
                                   mt_text_stats *stats) {
    mt_text_stats local;
    mt_text_stats *s = stats ? stats : &local;
    memset(s, 0, sizeof *s);
    if (eos_id < 256 || eos_id > 65535)
        return mt_error_set("%s: eos id %d must be in [256, 65535] (above the byte ids, within "
                            "uint16)", out_path, eos_id);
    mt_text_opts o = mt_text_opts_default();
    o.doc_sep = doc_sep_line;
    o.elem_size = 2;
    o.eos_id = eos_id;
    o.doc_index = doc_index;
    return mt_text_to_tokens(NULL, paths, n_paths, out_path, &o, s);
}

int mt_byte_text_decode(const int32_t *ids, int n, char *out, size_t out_size) {
    if (out_size == 0) return 0;
    size_t k = 0;
    for (int i = 0; i < n && k + 1 < out_size; i++) {
        if (ids[i] < 0) continue;
        out[k++] = ids[i] < 256 ? (char)(unsigned char)ids[i] : '\n';
    }
    out[k] = '\0';
    return (int)k;
}
