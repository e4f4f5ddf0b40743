/* What this binary was built from and with: version, commit, date, backends, compiler. The values
 * come from CMake (CMakeLists.txt, cmake/build_stamp.cmake); `megatrain --version` prints them. */
#ifndef MT_BUILD_INFO_H
#define MT_BUILD_INFO_H

#include <stddef.h>

const char *mt_build_version(void); /* "0.3.0": project(megatrain VERSION ...) */
const char *mt_build_commit(void);  /* `git describe --always --dirty` at build time, or "unknown" */
const char *mt_build_date(void);    /* "2026-12-01" (UTC, or SOURCE_DATE_EPOCH) */
const char *mt_build_compiler(void); /* "gcc 12.2.0" (", nvcc 12.4.131" in a CUDA build) */

/* 1 when the CUDA backend was compiled in. */
int mt_build_has_cuda(void);
/* Why it was not, as a clause for a message: "built with -DMT_CUDA=OFF" or "nvcc was not found
 * when it was configured"; "" in a CUDA build. E.g.
 * "--device cuda: this build has no CUDA backend (%s)". */
const char *mt_build_no_cuda_reason(void);

/* The --version line, without a newline:
 * "megatrain 0.3.0 (a3111e9-dirty, built 2026-12-01; backends: cpu, cuda; gcc 12.2.0, nvcc 12.4)"
 * and without CUDA "...; backends: cpu (no cuda: built with -DMT_CUDA=OFF); gcc 12.2.0)". */
void mt_build_describe(char *buf, size_t size);

#endif
