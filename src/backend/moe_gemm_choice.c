/* The experts' GEMMs, loop or grouped: see moe_gemm_choice.h. */
#include "moe_gemm_choice.h"

#include <limits.h>
#include <string.h>

int mt_moe_gemm_mode_parse(const char *s, mt_moe_gemm_mode *mode) {
    if (!s || !*s || strcmp(s, "auto") == 0) *mode = MT_MOE_GEMM_AUTO;
    else if (strcmp(s, "loop") == 0) *mode = MT_MOE_GEMM_LOOP;
    else if (strcmp(s, "grouped") == 0) *mode = MT_MOE_GEMM_GROUPED;
    else return 0;
    return 1;
}

const char *mt_moe_gemm_mode_name(mt_moe_gemm_mode mode) {
    return mode == MT_MOE_GEMM_LOOP ? "loop" : mode == MT_MOE_GEMM_GROUPED ? "grouped" : "auto";
}

int mt_moe_gemm_grouped_below(mt_moe_gemm_mode mode) {
    return mode == MT_MOE_GEMM_LOOP ? 0 : mode == MT_MOE_GEMM_GROUPED ? INT_MAX : MT_MOE_GROUPED_MAX_ROWS;
}

int mt_moe_gemm_use_grouped(mt_moe_gemm_mode mode, int64_t rows, int E) {
    return E > 0 && rows < (int64_t)mt_moe_gemm_grouped_below(mode) * E;
}
