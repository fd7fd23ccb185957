/* engine/weights/quant_avx512.c - the "avx512" weight kernels: quant_avx2.c and
 * quant_act_avx2.c compiled again with AVX-512 F/BW/VL/DQ flags, so their
 * 256-bit kernels get 32 vector registers (and quant_avx2.c's 512-bit ones in
 * -DLLM_QUANT_ZMM builds). Chosen only when CPUID reports AVX-512. */
#define QK_TABLE avx512
#define QK_CPU_OK kv_cpu_avx512
#include "quant_avx2.c"
#include "quant_act_avx2.c"
