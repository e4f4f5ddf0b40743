/* The vector instruction sets the CPU kernels are built for (the AdamW kernels of src/engine and
 * src/optim), which this CPU supports, and which one runs by default: the widest supported, or
 * MT_ADAMW_ISA=avx512|avx2|scalar (one override for every such kernel; fatal when the CPU lacks it
 * or the value is unknown). */
#ifndef MT_CPU_ISA_H
#define MT_CPU_ISA_H

/* The values are those of mt_adamw_isa. */
typedef enum { MT_ISA_SCALAR = 0, MT_ISA_AVX2 = 1, MT_ISA_AVX512 = 2 } mt_isa;

const char *mt_isa_name(mt_isa isa);  /* "avx512", "avx2", "scalar" */
int mt_isa_supported(mt_isa isa);     /* 1 when this CPU runs it (scalar always) */
mt_isa mt_isa_default(void);          /* read once */
/* The ISA the kernels run now: mt_isa_default() until mt_isa_set (tests and benches compare the
 * paths); one choice for every kernel. mt_isa_set: MT_ERR when this CPU lacks it. */
mt_isa mt_isa_active(void);
int mt_isa_set(mt_isa isa);

#endif
