/* mt_backend_cuda_memory: compiled in every build, so that `megatrain plan --device cuda` plans
 * the GPU side with the backend's own numbers on a machine (or a build) without CUDA. */
#include "backend.h"
#include "cuda/cuda_memory.h"

mt_backend_memory mt_backend_cuda_memory(void) {
    return (mt_backend_memory){.scratch = (int64_t)(MT_CUDA_LT_WORKSPACE + MT_CUDA_LM_HEAD_SCRATCH),
                               .headroom = (int64_t)MT_CUDA_POOL_HEADROOM,
                               .host_ram = 0};
}
