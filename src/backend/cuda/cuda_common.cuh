/* What every CUDA file of the backend shares: the check macros, the bf16 type, the context. */
#ifndef MT_CUDA_COMMON_CUH
#define MT_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "../../core/error.h"
#include "../backend.h"
#include "../moe_gemm_choice.h"

typedef __nv_bfloat16 bf16;

#define CUDA_CHECK(call)                                                                   \
    do {                                                                                   \
        cudaError_t err_ = (call);                                                         \
        if (err_ != cudaSuccess)                                                           \
            mt_fatal(__FILE__, __LINE__, "%s: %s", #call, cudaGetErrorString(err_));       \
    } while (0)

#define CUBLAS_CHECK(call)                                                                 \
    do {                                                                                   \
        cublasStatus_t st_ = (call);                                                       \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                  \
            mt_fatal(__FILE__, __LINE__, "%s: cuBLAS status %d", #call, (int)st_);         \
    } while (0)

/* After a kernel launch: configuration errors now, execution errors at the next sync. */
#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

typedef struct mt_cuda_moe_gemm mt_cuda_moe_gemm; /* moe_gemm.cu's state */
typedef struct mt_cuda_gd_blas mt_cuda_gd_blas;   /* gated_delta_gemm.cu's cuBLAS handle */

/* The backend's context (be->ctx). */
typedef struct {
    int device;
    cudaDeviceProp prop;
    cudaStream_t streams[MT_STREAMS];
    cublasLtHandle_t lt;
    void *lt_workspace;       /* cuBLASLt workspace on the device */
    size_t lt_workspace_bytes;
    int64_t budget;           /* --gpu-mem cap in bytes (0 = the device's free memory) */
    int64_t used;             /* bytes allocated through be->alloc */
    void *scratch;            /* grow-only scratch for ops that need it (lm_head logits chunk) */
    size_t scratch_bytes;
    int moe_gemm_mode;        /* MT_MOE_GEMM (mt_moe_gemm_mode): loop, grouped (moe_gemm.cu), auto */
    mt_cuda_moe_gemm *moe_gemm; /* its cuBLAS handle and arrays, made on first use */
    mt_cuda_gd_blas *gd_blas;   /* the gated delta rule's batched GEMMs' handle, the same */
} mt_cuda_ctx;

static inline mt_cuda_ctx *mt_cuda_ctx_of(mt_backend *be) { return (mt_cuda_ctx *)be->ctx; }
static inline cudaStream_t mt_cuda_compute_stream(mt_backend *be) {
    return mt_cuda_ctx_of(be)->streams[MT_STREAM_COMPUTE];
}

/* Scratch of at least `bytes` on the device, valid until the next call (compute stream order). */
void *mt_cuda_scratch(mt_backend *be, size_t bytes);

#endif
