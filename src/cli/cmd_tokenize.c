/* megatrain tokenize: text or JSONL in, a token file (docs/DESIGN.md "Data") out, via a tokenizer.json
 * (--tokenizer) or byte-level (--bytes); with --chat, chat JSONL in, packed rows (data/packed.h) out. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "../core/error.h"
#include "data/byte_text.h"
#include "data/chat_pack.h"
#include "data/text_data.h"
#include "../tokenizer/tokenizer.h"
#include "args.h"
#include "commands.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: megatrain tokenize --tokenizer DIR|FILE.json --out FILE.bin [--doc-sep LINE]\n"
            "                          [--dtype u16|u32] [--no-special] INPUT...\n"
            "       megatrain tokenize --bytes --out FILE.bin [--doc-sep LINE] INPUT...\n"
            "  With --tokenizer (a model directory holding tokenizer.json, or the file itself): each\n"
            "  document is encoded as Hugging Face's tokenizer(text) does (the post-processor's bos\n"
            "  prefix included; --no-special leaves it out) and followed by the tokenizer's eos.\n"
            "  Inputs: *.jsonl, one JSON object per line with a string \"text\" (one document a line);\n"
            "  any other file is plain text: one document per file, or, with --doc-sep, the text\n"
            "  between lines equal to LINE (e.g. %% for fortune files). Empty documents (no byte at\n"
            "  all; whitespace is text), lines that are not JSON and objects without \"text\" are\n"
            "  skipped and reported; invalid UTF-8 is encoded as raw bytes and reported. --dtype:\n"
            "  uint16 when the vocabulary fits (default), else u32.\n"
            "  With --bytes: the same inputs (JSONL: the bytes of \"text\"), every byte a token\n"
            "  (0-255), each document followed by the end-of-text token 256, uint16; the file\n"
            "  `train --data` makes for a model without a tokenizer.\n"
            "\n"
            "usage: megatrain tokenize --tokenizer DIR|FILE.json --chat --seq T --out FILE.packed\n"
            "                          [--chat-format F] [--loss-on assistant|all] [--long truncate|skip]\n"
            "                          [--pack whole|split] CHAT.jsonl...\n"
            "  Chat data: one {\"messages\": [{\"role\": system|user|assistant, \"content\": ...}, ...]}\n"
            "  a line, rendered in the chat format (auto: from the tokenizer's chat template, else its\n"
            "  special tokens; or chatml, llama3, llama2, mistral, mistral-v3, qwen3), the loss on the\n"
            "  assistant replies (default) or on all tokens, packed in file order into rows of T\n"
            "  tokens (+1 for the last target) with document boundaries: attention stays inside a\n"
            "  conversation. --pack whole (default): a conversation never straddles rows; when it\n"
            "  does not fit the rest of a row, that rest is padding (no loss) and it starts the next\n"
            "  row. --pack split: the conversations are one stream cut into rows, nothing is padded\n"
            "  but the last row, but a conversation cut by a row's end goes on at the next row's\n"
            "  start without its beginning. Longer than T: truncated to T tokens (--long truncate,\n"
            "  the default) or skipped (--long skip). Lines that are not JSON or not valid\n"
            "  UTF-8, objects without \"messages\", empty conversations, messages without a string\n"
            "  role or content, unknown roles, role orders the format cannot write and (loss on\n"
            "  assistant) conversations without an assistant reply are skipped and counted. Train on\n"
            "  the file with `megatrain train --data FILE.packed --seq T`.\n");
}

static int run_chat(const char *tok_path, const char *out, const mt_chat_pack_opts *o, char **inputs, int n) {
    mt_tokenizer *tok;
    if (mt_tokenizer_load(&tok, tok_path) != MT_OK) return mt_cli_fail();
    mt_chat_pack_stats s;
    int rc = mt_chat_pack(tok, (const char *const *)inputs, n, out, o, &s);
    mt_tokenizer_free(tok);
    mt_chat_pack_report(&s, "megatrain: warning: ", stderr);
    if (rc != MT_OK) return mt_cli_fail();
    mt_chat_pack_summary(&s, o, n == 1 ? inputs[0] : "input", out, stdout);
    return 0;
}

/* The reader `train --data` uses for a model without a tokenizer, so both write the same file. */
static int run_bytes(const char *out, const char *sep, char **inputs, int n) {
    mt_text_stats s;
    int rc = mt_byte_text_to_tokens((const char *const *)inputs, n, out, sep, 256, &s);
    mt_text_stats_report(&s, "megatrain: warning: ", stderr);
    if (rc != MT_OK) return mt_cli_fail();
    printf("%s: %lld tokens from %lld documents in %d file(s)\n", out, (long long)s.tokens,
           (long long)s.documents, n);
    return 0;
}

static int run_tokenizer(const char *tok_path, const char *out, const char *sep, int elem_size,
                         int add_special, char **inputs, int n) {
    mt_tokenizer *tok;
    if (mt_tokenizer_load(&tok, tok_path) != MT_OK) return mt_cli_fail();
    mt_text_opts o = mt_text_opts_default();
    o.doc_sep = sep;
    o.elem_size = elem_size;
    o.add_special = add_special;
    o.progress = mt_text_progress_stderr;
    mt_text_stats s;
    int rc = mt_text_to_tokens(tok, (const char *const *)inputs, n, out, &o, &s);
    mt_tokenizer_free(tok);
    mt_text_stats_report(&s, "megatrain: warning: ", stderr);
    if (rc != MT_OK) return mt_cli_fail();
    printf("%s: %lld tokens (uint%d, eos %d) from %lld documents in %d file(s), %.1f MB of text in "
           "%.2f s: %.0f tokens/s, %.1f MB/s\n",
           out, (long long)s.tokens, 8 * s.elem_size, s.eos_id, (long long)s.documents, n, s.bytes / 1e6,
           s.seconds, s.seconds > 0 ? s.tokens / s.seconds : 0.0,
           s.seconds > 0 ? s.bytes / 1e6 / s.seconds : 0.0);
    if (s.empty_docs || s.bad_json || s.missing_text)
        printf("skipped: %lld empty documents, %lld lines not JSON, %lld objects without \"text\"\n",
               (long long)s.empty_docs, (long long)s.bad_json, (long long)s.missing_text);
    if (s.invalid_utf8) printf("invalid UTF-8: %lld documents (encoded as raw bytes)\n", (long long)s.invalid_utf8);
    return 0;
}

int mt_cmd_tokenize(int argc, char **argv) {
    const char *out = NULL, *sep = NULL, *tok = NULL;
    int bytes = 0, elem_size = 0, add_special = 1, chat = 0, chat_flags = 0;
    mt_chat_pack_opts co = {.format = MT_CHAT_AUTO, .loss_on = MT_CHAT_LOSS_ASSISTANT, .long_policy = MT_LONG_TRUNCATE,
                            .pack = MT_PACK_WHOLE};
    int64_t seq = 0;
    static const struct option opts[] = {{"bytes", no_argument, 0, 'b'},
                                         {"tokenizer", required_argument, 0, 't'},
                                         {"out", required_argument, 0, 'o'},
                                         {"doc-sep", required_argument, 0, 's'},
                                         {"dtype", required_argument, 0, 'd'},
                                         {"no-special", no_argument, 0, 'n'},
                                         {"chat", no_argument, 0, 'c'},
                                         {"chat-format", required_argument, 0, 'f'},
                                         {"loss-on", required_argument, 0, 'l'},
                                         {"long", required_argument, 0, 'g'},
                                         {"pack", required_argument, 0, 'p'},
                                         {"seq", required_argument, 0, 'q'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'b': bytes = 1; break;
        case 't': tok = optarg; break;
        case 'o': out = optarg; break;
        case 's': sep = optarg; break;
        case 'n': add_special = 0; break;
        case 'c': chat = 1; break;
        case 'f':
        case 'l':
        case 'g':
        case 'p':
        case 'q': {
            int rc = c == 'f'   ? mt_arg_named("--chat-format", mt_chat_format_parse(optarg, &co.format))
                     : c == 'l' ? mt_arg_named("--loss-on", mt_chat_loss_on_parse(optarg, &co.loss_on))
                     : c == 'g' ? mt_arg_named("--long", mt_long_policy_parse(optarg, &co.long_policy))
                     : c == 'p' ? mt_arg_named("--pack", mt_pack_policy_parse(optarg, &co.pack))
                                : mt_arg_int("--seq", optarg, 1, 1 << 24, &seq);
            if (rc != MT_OK) return mt_cli_fail();
            chat_flags = 1;
            break;
        }
        case 'd':
            if (!strcmp(optarg, "u16") || !strcmp(optarg, "uint16")) elem_size = 2;
            else if (!strcmp(optarg, "u32") || !strcmp(optarg, "uint32")) elem_size = 4;
            else {
                mt_error_set("--dtype: '%s' is not u16 or u32", optarg);
                return mt_cli_fail();
            }
            break;
        case 'h': print_usage(stdout); return 0;
        default: print_usage(stderr); return 1;
        }
    }
    if (bytes == !!tok) {
        mt_error_set("tokenize: give exactly one of --tokenizer DIR and --bytes");
        return mt_cli_fail();
    }
    if (bytes && (elem_size == 4 || !add_special)) {
        mt_error_set("tokenize --bytes: --dtype and --no-special apply to --tokenizer only");
        return mt_cli_fail();
    }
    if (chat_flags && !chat) {
        mt_error_set("tokenize: --seq, --chat-format, --loss-on, --long and --pack go with --chat");
        return mt_cli_fail();
    }
    if (chat && (bytes || sep || elem_size || !add_special)) {
        mt_error_set("tokenize --chat: --bytes, --doc-sep, --dtype and --no-special apply to text data only");
        return mt_cli_fail();
    }
    if (chat && !seq) {
        mt_error_set("tokenize --chat: --seq T is required (the row length the data is packed to)");
        return mt_cli_fail();
    }
    if (!out || optind >= argc) {
        print_usage(stderr);
        return 1;
    }
    if (chat) {
        co.T = (int)seq;
        co.progress = mt_chat_progress_stderr;
        return run_chat(tok, out, &co, argv + optind, argc - optind);
    }
    if (bytes) return run_bytes(out, sep, argv + optind, argc - optind);
    return run_tokenizer(tok, out, sep, elem_size, add_special, argv + optind, argc - optind);
}
