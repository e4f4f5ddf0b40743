/* megatrain convert: read a checkpoint through the validating loader and write it again. */
#include <getopt.h>
#include <stdio.h>

#include "../core/error.h"
#include "../io/model_io.h"
#include "args.h"
#include "commands.h"
#include "model_source.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: megatrain convert --model DIR --out DIR [--dtype bf16|f32] [--shard-size SIZE]\n"
            "  Loads a Hugging Face checkpoint (bf16, fp16 or fp32; one file or shards), checks\n"
            "  every tensor, and writes config.json + safetensors that transformers loads.\n"
            "  --dtype       dtype written (default bf16)\n"
            "  --shard-size  largest shard, e.g. 5G (default: one file)\n");
}

int mt_cmd_convert(int argc, char **argv) {
    const char *model_dir = NULL, *out_dir = NULL;
    int dtype_index = 0;
    int64_t shard = 0;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"out", required_argument, 0, 'o'},
                                         {"dtype", required_argument, 0, 'd'},
                                         {"shard-size", required_argument, 0, 's'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'o': out_dir = optarg; break;
        case 'd':
            if (mt_arg_choice("--dtype", optarg, "bf16|f32", &dtype_index) != MT_OK) return mt_cli_fail();
            break;
        case 's':
            if (mt_arg_size("--shard-size", optarg, &shard) != MT_OK) return mt_cli_fail();
            break;
        case 'h': print_usage(stdout); return 0;
        default: print_usage(stderr); return 1;
        }
    }
    if (!model_dir || !out_dir || optind < argc) {
        print_usage(stderr);
        return 1;
    }
    mt_host_model m;
    if (mt_host_model_open(&m, model_dir, NULL, 0, 1) != MT_OK) return mt_cli_fail();
    mt_dtype dtype = dtype_index == 0 ? MT_BF16 : MT_F32;
    int rc = mt_model_save(&m.table, m.weights, out_dir, dtype, shard);
    mt_host_model_free(&m);
    if (rc != MT_OK) return mt_cli_fail();
    printf("wrote %s (%s)\n", out_dir, dtype == MT_BF16 ? "bf16" : "fp32");
    return 0;
}
