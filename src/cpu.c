/* src/cpu.c - the CPU-dispatch module (src/cpu.h): CPUID once, and
 * KVCACHE_SIMD once, for the library's kernels and the engine's. */
#include "cpu.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;
static unsigned isas;    /* bit i: the CPU runs kv_isa i */
static int requested;
static bool amd;

static bool vendor_amd(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    /* leaf 0: the vendor's 12 bytes in EBX, EDX, ECX */
    return __get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;
#else
    return false;
#endif
}

static unsigned detect(void) {
    unsigned has = 1u << KV_ISA_SCALAR;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    unsigned a, b, c, d;
    /* F16C: CPUID leaf 1, ECX bit 29 (not every compiler names it) */
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
    if (!(f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return has;
    has |= 1u << KV_ISA_AVX2;
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")))
        return has;
    has |= 1u << KV_ISA_AVX512;
    if (__builtin_cpu_supports("avx512vnni")) has |= 1u << KV_ISA_AVX512VNNI;
#endif
    return has;
}

static const char *const names[KV_ISA_COUNT] = {"scalar", "avx2", "avx512", "avx512vnni"};

int kv_isa_parse(const char *name) {
    for (int i = 0; name && i < KV_ISA_COUNT; i++)
        if (!strcmp(name, names[i])) return i;
    return -1;
}

static void init(void) {
    isas = detect();
    amd = vendor_amd();
    const char *env = getenv("KVCACHE_SIMD");
    requested = !env || !*env || !strcmp(env, "auto") ? -1 : kv_isa_parse(env) < 0 ? -2 : kv_isa_parse(env);
}

bool kv_cpu_has(kv_isa isa) {
    pthread_once(&once, init);
    return (unsigned)isa < KV_ISA_COUNT && (isas >> isa & 1);
}

bool kv_cpu_amd(void) {
    pthread_once(&once, init);
    return amd;
}

int kv_isa_requested(void) {
    pthread_once(&once, init);
    return requested;
}

bool kv_cpu_vnni_off(void) {
    const char *off = getenv("KVCACHE_NO_VNNI");
    return off && *off && strcmp(off, "0");
}
