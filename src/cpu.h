/* src/cpu.h - which SIMD instruction sets this CPU runs: the one check the
 * library's attention kernels and the engine's weight kernels both use
 * before picking a kernel compiled with -mavx2 / -mavx512*. x86 only; other
 * targets report none. */
#ifndef KV_CPU_H
#define KV_CPU_H

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* AVX2 + FMA + F16C (F16C: CPUID leaf 1, ECX bit 29; not every compiler names it) */
static inline int kv_cpu_avx2(void) {
    __builtin_cpu_init();
    unsigned a, b, c, d;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* AVX-512 F, BW, VL and DQ, on top of kv_cpu_avx2() */
static inline int kv_cpu_avx512(void) {
    return kv_cpu_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

/* AVX-512 VNNI, on top of kv_cpu_avx512() */
static inline int kv_cpu_avx512vnni(void) { return kv_cpu_avx512() && __builtin_cpu_supports("avx512vnni"); }
#else
static inline int kv_cpu_avx2(void) { return 0; }
static inline int kv_cpu_avx512(void) { return 0; }
static inline int kv_cpu_avx512vnni(void) { return 0; }
#endif

#endif
