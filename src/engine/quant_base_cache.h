/* A quantized frozen base on disk (train --base-cache DIR): quantizing a 70B base from its bf16
 * checkpoint reads ~140 GB and quantizes every weight; the cache file holds the quantized layer
 * blobs (engine/quant_base.h) as they sit in memory, so a second run reads ~40 GB (nf4) and skips
 * the checkpoint's layer tensors altogether.
 *
 * The file is DIR/<model dir's name>.<format>.<8 hex digits>.mtq, the digits a hash of the model
 * directory's real path and the first quantized layer (so one model and format keep one file,
 * replaced when the model changes). Its header holds the key (below), the format, the layers and
 * each blob's bytes and XXH3-64; the blobs follow, each at a multiple of 4096 bytes.
 *
 * The key is an XXH3-64 of what the quantized bytes depend on: this cache's version (bumped when
 * quantization changes), the format, the layer range, every tensor's name and size, and each
 * weight file of the model directory (config.json, *.safetensors and the shard index) by name,
 * size and modification time. A file replaced, shard added or config edited gives another key:
 * the cache is then rebuilt, never used. */
#ifndef MT_QUANT_BASE_CACHE_H
#define MT_QUANT_BASE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "model/params.h"
#include "engine/quant_base.h"

/* The key of t's layers [first, L) in format f from the checkpoint in model_dir, and the cache
 * file's path in cache_dir (malloc'd). MT_ERR when model_dir cannot be listed or its real path
 * not resolved. */
int mt_quant_base_cache_key(const mt_param_table *t, mt_base_format f, int first, const char *model_dir,
                            const char *cache_dir, uint64_t *key, char **path);

/* Fills q's blobs from PATH. 1: it held exactly this base (key, format, layers, each blob's size
 * and checksum); 0: no file at PATH; -1: another base's file, or damaged (mt_error_message says
 * which; q's blobs may then hold part of it: set every tensor again). */
int mt_quant_base_cache_load(mt_quant_base *q, const char *path, uint64_t key);

/* Writes q's blobs to PATH atomically (a temporary file renamed over PATH when complete). MT_ERR
 * names the file and the system's reason (a full disk...); PATH is then as it was. */
int mt_quant_base_cache_save(const mt_quant_base *q, const char *path, uint64_t key);

#endif
