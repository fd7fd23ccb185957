/* engine/weights/quant_avx512vnni.c - the "avx512vnni" weight kernels: the "avx512"
 * ones (quant_avx512.c) with AVX-512 VNNI as well, whose vpdpwssd and
 * vpdpbusd take the integer-activation products' multiply and add in one
 * instruction (QK_VNNI in quant_act_avx2.c). Chosen only when CPUID reports
 * VNNI, and not when KVCACHE_NO_VNNI is set (as the library's kernels). */
#define QK_TABLE avx512vnni
#define QK_CPU_OK kv_cpu_avx512vnni
#define QK_VNNI 1
#include "quant_avx2.c"
#include "quant_act_avx2.c"
