/* src/simd_avx512.c - the "avx512" attention primitives: simd_avx2.c compiled
 * again at KV_VW 16 with AVX-512 F/BW/VL/DQ flags (16 lanes, 32 registers,
 * mask registers; see simd_vec.h). Chosen only when CPUID reports AVX-512. */
#define KV_VW 16
#include "simd_avx2.c"
