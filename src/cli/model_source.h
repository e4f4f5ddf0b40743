/* Where a command's model comes from: --model DIR (config.json + safetensors) or --init
 * CONFIG.json (random init as the contract says); --model ORG/NAME from the Hugging Face hub
 * cache, offline. */
#ifndef MT_MODEL_SOURCE_H
#define MT_MODEL_SOURCE_H

#include <stdint.h>

#include "../model/params.h"

typedef struct {
    mt_param_table table;
    float *weights; /* fp32 arena in table layout; NULL when not loaded */
    struct mt_hf_source *hf; /* the source's config text, carried tensors, experts' layout
                                (io/hf_layout.h); table.hf points here */
} mt_host_model;

/* Exactly one of model_dir / init_config is set. With load_weights the fp32 arena is filled from
 * the checkpoint or by mt_param_init(std = initializer_range, seed). A multimodal checkpoint's
 * language model is loaded; its other tensors are listed in hf, to be carried into saves. */
int mt_host_model_open(mt_host_model *m, const char *model_dir, const char *init_config,
                       uint64_t seed, int load_weights);
void mt_host_model_free(mt_host_model *m);

/* --model ARG [--revision R]: an existing directory is itself (R must be NULL). Anything else is a
 * Hugging Face repo id ("org/name" or "name") looked up, with no network, in the hub cache as
 * huggingface_hub lays it out: ROOT/models--org--name/refs/R holds a commit hash, and
 * ROOT/models--org--name/snapshots/<hash>/ the files (symlinks into ../../blobs/). ROOT is
 * $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
 * ~/.cache/huggingface/hub. R defaults to main; a 40-digit hex R is the commit itself.
 * *dir = arg, or the snapshot directory (static storage: one model a process). MT_ERR names
 * each path looked at. */
int mt_model_resolve(const char *arg, const char *revision, const char **dir);

#endif
