/* libFuzzer: chat JSONL -> packed rows (mt_chat_pack), with the fixture tokenizers.
 * Input: byte 0 picks the tokenizer (bits 0-2, FZ_TOKENIZERS) and the chat format (bits 3-5,
 * 0 = auto); byte 1 the options (bit 0 loss on all, bit 1 --long skip, bit 2 --pack split, bits 3-5
 * T from TS); the rest is one or two JSONL files separated by FZ_SEP. What mt_chat_pack writes must
 * open as packed data of that T and vocabulary with the rows and trained targets it reported; on
 * MT_ERR nothing is left at the output path. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "fz_util.h"
#include "data/chat_pack.h"
#include "data/packed.h"

static mt_tokenizer *toks[FZ_N_TOKENIZERS];
static const int TS[8] = {1, 4, 8, 16, 32, 64, 256, 1024};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    for (int i = 0; i < FZ_N_TOKENIZERS; i++) toks[i] = fz_tokenizer(FZ_TOKENIZERS[i]);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const mt_tokenizer *tok = toks[(data[0] & 7) % FZ_N_TOKENIZERS];
    mt_chat_pack_opts o = {
        .format = (mt_chat_format)(((data[0] >> 3) & 7) % (MT_CHAT_QWEN3 + 1)),
        .loss_on = data[1] & 1 ? MT_CHAT_LOSS_ALL : MT_CHAT_LOSS_ASSISTANT,
        .long_policy = data[1] & 2 ? MT_LONG_SKIP : MT_LONG_TRUNCATE,
        .pack = data[1] & 4 ? MT_PACK_SPLIT : MT_PACK_WHOLE,
        .T = TS[(data[1] >> 3) & 7],
    };
    fz_part parts[2];
    int n = fz_split(data + 2, size - 2, parts, 2);
    const char *paths[2];
    for (int i = 0; i < n; i++) paths[i] = fz_write(i, i ? "b.jsonl" : "a.jsonl", parts[i].p, parts[i].n);
    (void)mt_chat_jsonl_detect(paths[0]);
    const char *out = fz_path(2, "chat.packed");
    mt_chat_pack_stats s;
    mt_error_clear();
    if (mt_chat_pack(tok, paths, n, out, &o, &s) != MT_OK) {
        FZ_ASSERT(mt_error_message()[0] && access(out, F_OK) != 0 &&
                  access(fz_path(3, "chat.packed.tmp"), F_OK) != 0);
        fz_refused();
        return 0;
    }
    FZ_ASSERT(s.conversations >= 1 && s.rows >= 1 && s.format != MT_CHAT_AUTO);
    mt_packed_file f;
    FZ_ASSERT(mt_packed_open(&f, out, o.T, mt_tokenizer_vocab_size(tok)) == MT_OK);
    FZ_ASSERT(f.rows == s.rows && f.trained == s.trained && f.documents == s.conversations);
    mt_packed_close(&f);
    FILE *devnull = fopen("/dev/null", "w");
    mt_chat_pack_report(&s, "fuzz: ", devnull);
    mt_chat_pack_summary(&s, &o, paths[0], out, devnull);
    fclose(devnull);
    unlink(out);
    return 0;
}
