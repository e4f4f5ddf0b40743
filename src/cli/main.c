/* megatrain: train Llama-family models far larger than GPU memory on one GPU. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "../core/error.h"
#include "build_info.h"
#include "commands.h"
#include "process_env.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"train", mt_cmd_train, "train or fine-tune (state in host RAM, layers streamed)"},
    {"eval", mt_cmd_eval, "loss of a model on token or text data"},
    {"plan", mt_cmd_plan, "the memory plan of a run and whether it fits, without training"},
    {"generate", mt_cmd_generate, "continue a prompt with a trained model"},
    {"tokenize", mt_cmd_tokenize, "text or JSONL to a token file (tokenizer.json or bytes)"},
    {"info", mt_cmd_info, "describe a model: config, parameters, tensors, memory"},
    {"convert", mt_cmd_convert, "load a Hugging Face checkpoint and write it again (bf16/fp32, shards)"},
    {"merge", mt_cmd_merge, "fold a PEFT LoRA adapter into its base model and write the merged model"},
    {"bench", mt_cmd_bench, "benchmarks: fwdbwd (CPU forward+backward), adamw (optimizer Gparam/s)"},
    {"plot", mt_cmd_plot, "draw a run's metrics.jsonl (loss, eval loss, lr, tokens/s) as SVG"},
    {"version", mt_cmd_version, "the version, commit, build date, backends and compiler"},
};

int mt_cmd_version(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: megatrain version | megatrain --version\n"
               "  One line: version, commit (git describe at build time), build date, the compiled\n"
               "  backends (and why CUDA is missing, where it is) and the compilers.\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "megatrain: version takes no arguments (got '%s')\n", argv[1]);
        return 1;
    }
    char line[512];
    mt_build_describe(line, sizeof line);
    printf("%s\n", line);
    return 0;
}

static void usage(FILE *out) {
    fprintf(out, "usage: megatrain <command> [options]   (megatrain <command> --help for its options)\n"
                 "       megatrain --version\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

int mt_cli_fail(void) {
    fprintf(stderr, "megatrain: %s\n", mt_error_message());
    return 1;
}

int main(int argc, char **argv) {
    mt_process_env_init(argv);
    /* a write past the file-size limit (ulimit -f) fails with EFBIG, which every writer reports with
     * the file's name, instead of killing the process silently in the middle of a save */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) return mt_cmd_version(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "megatrain: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 1;
}
