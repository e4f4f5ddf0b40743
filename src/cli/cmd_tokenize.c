/* megatrain tokenize: text or JSONL in, the token file of DESIGN.md out, through a tokenizer.json
 * (--tokenizer) or byte-level (--bytes). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "../core/error.h"
#include "../io/byte_text.h"
#include "../io/text_data.h"
#include "../tokenizer/tokenizer.h"
#include "commands.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: megatrain tokenize --tokenizer DIR|FILE.json --out FILE.bin [--doc-sep LINE]\n"
            "                          [--dtype u16|u32] [--no-special] INPUT...\n"
            "       megatrain tokenize --bytes --out FILE.bin [--doc-sep LINE] TEXT...\n"
            "  With --tokenizer (a model directory holding tokenizer.json, or the file itself): each\n"
            "  document is encoded as Hugging Face's tokenizer(text) does (the post-processor's bos\n"
            "  prefix included; --no-special leaves it out) and followed by the tokenizer's eos.\n"
            "  Inputs: *.jsonl, one JSON object per line with a string \"text\" (one document a line);\n"
            "  any other file is plain text: one document per file, or, with --doc-sep, the text\n"
            "  between lines equal to LINE (e.g. %% for fortune files). Empty documents, lines that are\n"
            "  not JSON and objects without \"text\" are skipped and reported; invalid UTF-8 is encoded\n"
            "  as raw bytes and reported. --dtype: uint16 when the vocabulary fits (default), else u32.\n"
            "  With --bytes: every byte is a token (0-255), each document is followed by the\n"
            "  end-of-text token 256, uint16.\n");
}

static int run_bytes(const char *out, const char *sep, char **inputs, int n) {
    int64_t nt;
    if (mt_byte_text_to_tokens((const char *const *)inputs, n, out, sep, 256, &nt) != MT_OK)
        return mt_cli_fail();
    printf("%s: %lld tokens from %d file(s)\n", out, (long long)nt, n);
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
    int bytes = 0, elem_size = 0, add_special = 1;
    static const struct option opts[] = {{"bytes", no_argument, 0, 'b'},
                                         {"tokenizer", required_argument, 0, 't'},
                                         {"out", required_argument, 0, 'o'},
                                         {"doc-sep", required_argument, 0, 's'},
                                         {"dtype", required_argument, 0, 'd'},
                                         {"no-special", no_argument, 0, 'n'},
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
    if (!out || optind >= argc) {
        print_usage(stderr);
        return 1;
    }
    if (bytes) return run_bytes(out, sep, argv + optind, argc - optind);
    return run_tokenizer(tok, out, sep, elem_size, add_special, argv + optind, argc - optind);
}
