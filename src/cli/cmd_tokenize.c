/* megatrain tokenize: text in, the token file of DESIGN.md out. Byte-level for now; the
 * tokenizer.json path comes with the tokenizer. */
#include <getopt.h>
#include <stdio.h>

#include "../core/error.h"
#include "../io/byte_text.h"
#include "commands.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: megatrain tokenize --bytes --out FILE.bin [--doc-sep LINE] TEXT...\n"
            "  Writes a uint16 token file: every byte is a token (0-255), each document is followed\n"
            "  by the end-of-text token 256. A document is a whole file, or, with --doc-sep, the\n"
            "  text between lines equal to LINE (e.g. %% for fortune files).\n");
}

int mt_cmd_tokenize(int argc, char **argv) {
    const char *out = NULL, *sep = NULL;
    int bytes = 0;
    static const struct option opts[] = {{"bytes", no_argument, 0, 'b'},
                                         {"out", required_argument, 0, 'o'},
                                         {"doc-sep", required_argument, 0, 's'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'b': bytes = 1; break;
        case 'o': out = optarg; break;
        case 's': sep = optarg; break;
        case 'h': print_usage(stdout); return 0;
        default: print_usage(stderr); return 1;
        }
    }
    if (!bytes) {
        mt_error_set("tokenize: only --bytes is available until tokenizer.json support lands");
        return mt_cli_fail();
    }
    if (!out || optind >= argc) {
        print_usage(stderr);
        return 1;
    }
    int64_t n;
    if (mt_byte_text_to_tokens((const char *const *)argv + optind, argc - optind, out, sep, 256, &n) != MT_OK)
        return mt_cli_fail();
    printf("%s: %lld tokens from %d file(s)\n", out, (long long)n, argc - optind);
    return 0;
}
