/* src/cpu.h - the one CPU-dispatch module of the library and the engine:
 * which instruction sets this CPU runs, found once, and which one
 * KVCACHE_SIMD asks for. The library's attention kernels (src/simd_*.c) and
 * the engine's weight kernels (engine/quant_*.c) both ask it before picking
 * a kernel compiled with -mavx2 / -mavx512*. x86 only; other targets run
 * the scalar kernels alone. */
#ifndef KV_CPU_H
#define KV_CPU_H

#include <stdbool.h>

/* The kernel families, each on top of the one before: AVX2 + FMA + F16C;
 * AVX-512 F, BW, VL and DQ; AVX-512 VNNI. */
typedef enum { KV_ISA_SCALAR, KV_ISA_AVX2, KV_ISA_AVX512, KV_ISA_AVX512VNNI, KV_ISA_COUNT } kv_isa;

/* Whether this CPU runs isa (detected on the first call). */
bool kv_cpu_has(kv_isa isa);

/* The isa named "scalar", "avx2", "avx512" or "avx512vnni", or -1. */
int kv_isa_parse(const char *name);

/* What the environment variable KVCACHE_SIMD asks for, read on the first
 * call: an isa, -1 when it is unset, empty or "auto" (the best this CPU
 * runs), or -2 for a name no kernels answer to (then the best too). */
int kv_isa_requested(void);

/* Whether the CPU is AMD's (CPUID vendor "AuthenticAMD"), detected on the
 * first call: its hardware prefetch feeds one stream a core as well as
 * several (docs/PERFORMANCE.md, "Tuning record"). */
bool kv_cpu_amd(void);

/* Whether KVCACHE_NO_VNNI (set, not "0") asks the avx512 kernels to leave
 * VNNI out where the CPU has it; read at each call (the tests run both). */
bool kv_cpu_vnni_off(void);

static inline int kv_cpu_avx2(void) { return kv_cpu_has(KV_ISA_AVX2); }
static inline int kv_cpu_avx512(void) { return kv_cpu_has(KV_ISA_AVX512); }
static inline int kv_cpu_avx512vnni(void) { return kv_cpu_has(KV_ISA_AVX512VNNI); }

#endif
