#include "build_info.h"

#include <stdio.h>

#include "mt_build_stamp.h" /* MT_BUILD_COMMIT, MT_BUILD_DATE: generated in the build tree */

/* MT_VERSION, MT_BUILD_COMPILER and MT_NO_CUDA_WHY are definitions on this file (CMakeLists.txt). */
#if !defined(MT_VERSION) || !defined(MT_BUILD_COMPILER) || !defined(MT_NO_CUDA_WHY)
#error "build_info.c needs the definitions that CMakeLists.txt gives it"
#endif

const char *mt_build_version(void) { return MT_VERSION; }
const char *mt_build_commit(void) { return MT_BUILD_COMMIT; }
const char *mt_build_date(void) { return MT_BUILD_DATE; }
const char *mt_build_compiler(void) { return MT_BUILD_COMPILER; }

int mt_build_has_cuda(void) {
#ifdef MT_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

const char *mt_build_no_cuda_reason(void) { return mt_build_has_cuda() ? "" : MT_NO_CUDA_WHY; }

void mt_build_describe(char *buf, size_t size) {
    char backends[160];
    if (mt_build_has_cuda())
        snprintf(backends, sizeof backends, "cpu, cuda");
    else
        snprintf(backends, sizeof backends, "cpu (no cuda: %s)", mt_build_no_cuda_reason());
    snprintf(buf, size, "megatrain %s (%s, built %s; backends: %s; %s)", mt_build_version(),
             mt_build_commit(), mt_build_date(), backends, mt_build_compiler());
}
