/* train --base-cache DIR: the frozen base's weights from the model directory, its quantized layers
 * from their cache file when that holds exactly them (engine/quant_base_cache.h), else quantized
 * from the checkpoint and the cache file written for the next run. */
#ifndef MT_CLI_CACHED_BASE_H
#define MT_CLI_CACHED_BASE_H

#include "../engine/engine.h"

/* Every tensor of t from model_dir into the engine through io (its state io), but an mxfp4 base's
 * expert tensors, which an MXFP4 checkpoint hands to the base as they are on disk (blocks and
 * scales byte for byte: mt_quant_base_take_mxfp4); the tensors of a bf16 or fp32 checkpoint go
 * through io (an mxfp4 base quantizes them). MT_ERR: the checkpoint's. */
int mt_base_weights_load(mt_engine *e, const mt_param_table *t, const char *model_dir, const mt_state_io *io);

/* Every tensor of t into the engine through io (its state io): the quantized base's layers from
 * cache_dir's file, or from model_dir (then the file is written; a failure to write it is a
 * warning). Prints one line saying which; a cache file that is stale or damaged is named in a
 * warning and rebuilt. MT_ERR: the checkpoint's (a bad tensor, a missing file). */
int mt_cached_base_load(mt_engine *e, const mt_param_table *t, const char *model_dir, const char *cache_dir,
                        const mt_state_io *io);

#endif
