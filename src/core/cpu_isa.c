#include "core/cpu_isa.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

const char *mt_isa_name(mt_isa isa) {
    switch (isa) {
    case MT_ISA_AVX512: return "avx512";
    case MT_ISA_AVX2: return "avx2";
    default: return "scalar";
    }
}

int mt_isa_supported(mt_isa isa) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    switch (isa) {
    case MT_ISA_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
    case MT_ISA_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    default: return 1;
    }
#else
    return isa == MT_ISA_SCALAR;
#endif
}

static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static mt_isa default_isa = MT_ISA_SCALAR;

static void default_init(void) {
    mt_isa isa = MT_ISA_SCALAR;
    if (mt_isa_supported(MT_ISA_AVX512)) isa = MT_ISA_AVX512;
    else if (mt_isa_supported(MT_ISA_AVX2)) isa = MT_ISA_AVX2;
    const char *env = getenv("MT_ADAMW_ISA");
    if (env && *env) {
        if (!strcmp(env, "avx512")) isa = MT_ISA_AVX512;
        else if (!strcmp(env, "avx2")) isa = MT_ISA_AVX2;
        else if (!strcmp(env, "scalar")) isa = MT_ISA_SCALAR;
        else mt_fatal(__FILE__, __LINE__, "MT_ADAMW_ISA=%s: expected avx512, avx2 or scalar", env);
        MT_CHECK(mt_isa_supported(isa), "MT_ADAMW_ISA=%s: this CPU lacks it", env);
    }
    default_isa = isa;
}

mt_isa mt_isa_default(void) {
    pthread_once(&default_once, default_init);
    return default_isa;
}

static _Atomic int active_isa = -1; /* -1: not chosen yet */

mt_isa mt_isa_active(void) {
    int a = atomic_load(&active_isa);
    if (a < 0) {
        int unset = -1;
        atomic_compare_exchange_strong(&active_isa, &unset, (int)mt_isa_default());
        a = atomic_load(&active_isa);
    }
    return (mt_isa)a;
}

int mt_isa_set(mt_isa isa) {
    if (!mt_isa_supported(isa)) return mt_error_set("CPU path %s: this CPU lacks it", mt_isa_name(isa));
    atomic_store(&active_isa, (int)isa);
    return MT_OK;
}
