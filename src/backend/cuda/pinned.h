/* Pinned host memory of the CUDA backend (pinned.cu: MT_PIN=alloc|register). Both fatal on
 * failure with the size and the reason. */
#ifndef MT_CUDA_PINNED_H
#define MT_CUDA_PINNED_H

#include <stddef.h>

void *mt_cuda_pinned_alloc(size_t bytes);
void mt_cuda_pinned_free(void *p);

#endif
