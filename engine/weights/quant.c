/* engine/weights/quant.c - weight block formats: the type table, half/bfloat
 * conversions, the scalar decoders (always compiled: the reference for the
 * SIMD ones in quant_avx2.c and the whole path of a portable build), the Q8_0
 * quantizer, and the blocked matrix-product driver. */
#include "quant.h"
#include "quant_kern.h"
#include "../../src/cpu.h"
#include "../../src/half.h"

#include <pthread.h>
#include <stdlib.h>

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* ------------------------------------------------------------ type table */

typedef struct {
    int64_t elems;   /* elements per block; 0 = not decodable here */
    int64_t bytes;   /* bytes per block */
} type_size;

static type_size type_size_of(int type) {
    switch (type) {
    case LLM_TYPE_F32:  return (type_size){1, 4};
    case LLM_TYPE_F16:  return (type_size){1, 2};
    case LLM_TYPE_BF16: return (type_size){1, 2};
    case LLM_TYPE_Q4_0: return (type_size){LLM_QK, sizeof(llm_block_q4_0)};
    case LLM_TYPE_Q4_1: return (type_size){LLM_QK, sizeof(llm_block_q4_1)};
    case LLM_TYPE_Q5_0: return (type_size){LLM_QK, sizeof(llm_block_q5_0)};
    case LLM_TYPE_Q5_1: return (type_size){LLM_QK, sizeof(llm_block_q5_1)};
    case LLM_TYPE_Q8_0: return (type_size){LLM_QK, sizeof(llm_block_q8_0)};
    case LLM_TYPE_Q2_K: return (type_size){LLM_QK_K, sizeof(llm_block_q2_k)};
    case LLM_TYPE_Q3_K: return (type_size){LLM_QK_K, sizeof(llm_block_q3_k)};
    case LLM_TYPE_Q4_K: return (type_size){LLM_QK_K, sizeof(llm_block_q4_k)};
    case LLM_TYPE_Q5_K: return (type_size){LLM_QK_K, sizeof(llm_block_q5_k)};
    case LLM_TYPE_Q6_K: return (type_size){LLM_QK_K, sizeof(llm_block_q6_k)};
    default:            return (type_size){0, 0};
    }
}

_Static_assert(sizeof(llm_block_q4_0) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(llm_block_q4_1) == 20, "Q4_1 block is 20 bytes");
_Static_assert(sizeof(llm_block_q5_0) == 22, "Q5_0 block is 22 bytes");
_Static_assert(sizeof(llm_block_q5_1) == 24, "Q5_1 block is 24 bytes");
_Static_assert(sizeof(llm_block_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(llm_block_q2_k) == 84, "Q2_K block is 84 bytes");
_Static_assert(sizeof(llm_block_q3_k) == 110, "Q3_K block is 110 bytes");
_Static_assert(sizeof(llm_block_q4_k) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(llm_block_q5_k) == 176, "Q5_K block is 176 bytes");
_Static_assert(sizeof(llm_block_q6_k) == 210, "Q6_K block is 210 bytes");

const char *llm_type_name(int type) {
    /* ggml's numbering; gaps are formats ggml has retired. Names of formats
     * we cannot decode still help an error message say what the file holds. */
    static const char *const names[] = {
        "F32", "F16", "Q4_0", "Q4_1", NULL, NULL, "Q5_0", "Q5_1", "Q8_0", "Q8_1",
        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS",
        "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16",
        "I32", "I64", "F64", "IQ1_M", "BF16", NULL, NULL, NULL, "TQ1_0", "TQ2_0",
        NULL, NULL, NULL, "MXFP4",
    };
    if (type < 0 || type >= (int)(sizeof names / sizeof names[0])) return NULL;
    return names[type];
}

int llm_type_supported(int type) { return type_size_of(type).elems > 0; }
int64_t llm_type_block_elems(int type) { return type_size_of(type).elems; }
int64_t llm_type_block_bytes(int type) { return type_size_of(type).bytes; }

int64_t llm_row_bytes(int type, int64_t n) {
    type_size ts = type_size_of(type);
    if (ts.elems == 0 || n < 0 || n % ts.elems != 0) return -1;
    int64_t blocks = n / ts.elems;
    if (blocks > INT64_MAX / ts.bytes) return -1;
    return blocks * ts.bytes;
}

/* ------------------------------------------------------------ conversions */

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* The project's one conversion (src/half.h), exported under engine names. */
float llm_f16_to_f32(uint16_t h) { return kv_f16_to_f32(h); }
uint16_t llm_f32_to_f16(float f) { return kv_f32_to_f16(f); }
float llm_bf16_to_f32(uint16_t h) { return kv_bf16_to_f32(h); }
uint16_t llm_f32_to_bf16(float f) { return kv_f32_to_bf16(f); }

static float half_at(const uint8_t *p) { return kv_f16_to_f32(rd16(p)); }

/* ------------------------------------------------------------ scalar decoders */

void llm_k_scale_min(const uint8_t s[12], int j, uint8_t *sc, uint8_t *mn) {
    /* Bytes 0-3: low 6 bits = scales 0-3, top 2 bits = high bits of scales 4-7.
     * Bytes 4-7: low 6 bits = mins 0-3, top 2 bits = high bits of mins 4-7.
     * Bytes 8-11: low nibble = low 4 bits of scales 4-7, high nibble = of mins 4-7. */
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4));
        *mn = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

static void deq_q4_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += sizeof(llm_block_q4_0), y += LLM_QK) {
        float d = half_at(b + offsetof(llm_block_q4_0, d));
        const uint8_t *qs = b + offsetof(llm_block_q4_0, qs);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((qs[j] & 15) - 8);
            y[j + 16] = d * (float)((qs[j] >> 4) - 8);
        }
    }
}

static void deq_q4_1(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += sizeof(llm_block_q4_1), y += LLM_QK) {
        float d = half_at(b + offsetof(llm_block_q4_1, d));
        float m = half_at(b + offsetof(llm_block_q4_1, m));
        const uint8_t *qs = b + offsetof(llm_block_q4_1, qs);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(qs[j] & 15) + m;
            y[j + 16] = d * (float)(qs[j] >> 4) + m;
        }
    }
}

/* Q5_0 (x = d (q - 16)) and Q5_1 (x = d q + m): the same quants after
 * their header. */
static void deq_q5(const uint8_t *b, float *y, int64_t nb, int with_min) {
    const size_t bsize = with_min ? sizeof(llm_block_q5_1) : sizeof(llm_block_q5_0);
    const size_t qh_at = with_min ? offsetof(llm_block_q5_1, qh) : offsetof(llm_block_q5_0, qh);
    const size_t qs_at = with_min ? offsetof(llm_block_q5_1, qs) : offsetof(llm_block_q5_0, qs);
    for (int64_t i = 0; i < nb; i++, b += bsize, y += LLM_QK) {
        float d = half_at(b), m = with_min ? half_at(b + offsetof(llm_block_q5_1, m)) : 0.0f;
        const uint8_t *qh = b + qh_at;
        uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
        const uint8_t *qs = b + qs_at;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 15) | (int)((h >> j) & 1) << 4;
            int hi = (qs[j] >> 4) | (int)((h >> (j + 16)) & 1) << 4;
            y[j] = with_min ? d * (float)lo + m : d * (float)(lo - 16);
            y[j + 16] = with_min ? d * (float)hi + m : d * (float)(hi - 16);
        }
    }
}

static void deq_q8_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += sizeof(llm_block_q8_0), y += LLM_QK) {
        float d = half_at(b + offsetof(llm_block_q8_0, d));
        const int8_t *qs = (const int8_t *)(b + offsetof(llm_block_q8_0, qs));
        for (int j = 0; j < LLM_QK; j++) y[j] = d * (float)qs[j];
    }
}

/* Q4_K and Q5_K share everything but the fifth bit; qh == NULL means Q4_K. */
static void deq_k45(const uint8_t *b, float *y, int64_t nb, int five) {
    size_t bsz = five ? sizeof(llm_block_q5_k) : sizeof(llm_block_q4_k);
    for (int64_t i = 0; i < nb; i++, b += bsz, y += LLM_QK_K) {
        float d = half_at(b + offsetof(llm_block_q4_k, d));
        float dmin = half_at(b + offsetof(llm_block_q4_k, dmin));
        const uint8_t *sc = b + offsetof(llm_block_q4_k, scales);
        const uint8_t *qh = five ? b + offsetof(llm_block_q5_k, qh) : NULL;
        const uint8_t *qs = b + (five ? offsetof(llm_block_q5_k, qs) : offsetof(llm_block_q4_k, qs));
        for (int g = 0; g < 4; g++) {
            uint8_t s1, m1, s2, m2;
            llm_k_scale_min(sc, 2 * g, &s1, &m1);
            llm_k_scale_min(sc, 2 * g + 1, &s2, &m2);
            float d1 = d * s1, o1 = dmin * m1, d2 = d * s2, o2 = dmin * m2;
            const uint8_t *q = qs + 32 * g;
            for (int l = 0; l < 32; l++) {
                int lo = q[l] & 15, hi = q[l] >> 4;
                if (qh) {
                    lo |= ((qh[l] >> (2 * g)) & 1) << 4;
                    hi |= ((qh[l] >> (2 * g + 1)) & 1) << 4;
                }
                y[64 * g + l] = d1 * (float)lo - o1;
                y[64 * g + 32 + l] = d2 * (float)hi - o2;
            }
        }
    }
}

/* Q6_K element order, half h (elements 128h..128h+127), l in 0..31:
 *   128h+l    : low nibble of ql[64h+l],     bits 0-1 of qh[32h+l]
 *   128h+32+l : low nibble of ql[64h+32+l],  bits 2-3 of qh[32h+l]
 *   128h+64+l : high nibble of ql[64h+l],    bits 4-5 of qh[32h+l]
 *   128h+96+l : high nibble of ql[64h+32+l], bits 6-7 of qh[32h+l]
 * and element e uses scale scales[e / 16]. */
static void deq_q2_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += sizeof(llm_block_q2_k), y += LLM_QK_K) {
        const float d = half_at(b + offsetof(llm_block_q2_k, d)), dmin = half_at(b + offsetof(llm_block_q2_k, dmin));
        const uint8_t *sc = b + offsetof(llm_block_q2_k, scales), *qs = b + offsetof(llm_block_q2_k, qs);
        for (int e = 0; e < LLM_QK_K; e++) {
            const int q = (qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3, s = sc[e / 16];
            y[e] = d * (float)(s & 15) * (float)q - dmin * (float)(s >> 4);
        }
    }
}

static void deq_q3_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += sizeof(llm_block_q3_k), y += LLM_QK_K) {
        const float d = half_at(b + offsetof(llm_block_q3_k, d));
        const uint8_t *hm = b + offsetof(llm_block_q3_k, hmask), *qs = b + offsetof(llm_block_q3_k, qs);
        const uint8_t *sc = b + offsetof(llm_block_q3_k, scales);
        float dl[16];
        for (int s = 0; s < 16; s++) {
            int lo = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4, hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
            dl[s] = d * (float)((lo | hi << 4) - 32);
        }
        for (int e = 0; e < LLM_QK_K; e++) {
            const int h = e / 128, j = e % 128 / 32, l = e % 32;
            const int q = ((qs[32 * h + l] >> (2 * j)) & 3) - ((hm[l] >> (4 * h + j)) & 1 ? 0 : 4);
            y[e] = dl[e / 16] * (float)q;
        }
    }
}

static void deq_q6_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += sizeof(llm_block_q6_k), y += LLM_QK_K) {
        float d = half_at(b + offsetof(llm_block_q6_k, d));
        const int8_t *sc = (const int8_t *)(b + offsetof(llm_block_q6_k, scales));
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b + offsetof(llm_block_q6_k, ql) + 64 * h;
            const uint8_t *qh = b + offsetof(llm_block_q6_k, qh) + 32 * h;
            float *yh = y + 128 * h;
            for (int l = 0; l < 32; l++) {
                int q0 = (ql[l] & 15) | ((qh[l] & 3) << 4);
                int q1 = (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4);
                int q2 = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                int q3 = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                int q[4] = {q0, q1, q2, q3};
                for (int s = 0; s < 4; s++) {
                    int e = 32 * s + l;
                    yh[e] = d * (float)sc[8 * h + e / 16] * (float)(q[s] - 32);
                }
            }
        }
    }
}

/* Scalar decode of n elements (a whole number of blocks; checked by callers). */
static void dequant_scalar(int type, const uint8_t *src, float *dst, int64_t n) {
    int64_t nb = n / type_size_of(type).elems;
    switch (type) {
    case LLM_TYPE_F32:  memcpy(dst, src, (size_t)n * 4); break;
    case LLM_TYPE_F16:  for (int64_t i = 0; i < n; i++) dst[i] = half_at(src + 2 * i); break;
    case LLM_TYPE_BF16: for (int64_t i = 0; i < n; i++) dst[i] = kv_bf16_to_f32(rd16(src + 2 * i)); break;
    case LLM_TYPE_Q4_0: deq_q4_0(src, dst, nb); break;
    case LLM_TYPE_Q4_1: deq_q4_1(src, dst, nb); break;
    case LLM_TYPE_Q5_0: deq_q5(src, dst, nb, 0); break;
    case LLM_TYPE_Q5_1: deq_q5(src, dst, nb, 1); break;
    case LLM_TYPE_Q8_0: deq_q8_0(src, dst, nb); break;
    case LLM_TYPE_Q2_K: deq_q2_k(src, dst, nb); break;
    case LLM_TYPE_Q3_K: deq_q3_k(src, dst, nb); break;
    case LLM_TYPE_Q4_K: deq_k45(src, dst, nb, 0); break;
    case LLM_TYPE_Q5_K: deq_k45(src, dst, nb, 1); break;
    case LLM_TYPE_Q6_K: deq_q6_k(src, dst, nb); break;
    default: break;
    }
}

/* ------------------------------------------------------------ kernel choice */

/* One accumulator per (r, t), summed in k order: the same arithmetic for
 * every tile shape, which keeps results independent of how rows are split. */
static void scalar_dot_tile(const float *const *w, int nr, const float *const *x, int nt,
                            int64_t n, float *out) {
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < n; k++) acc += w[r][k] * x[t][k];
            out[r * nt + t] = acc;
        }
}

static int scalar_dequant(int type, const void *src, float *dst, int64_t n) {
    dequant_scalar(type, src, dst, n);
    return 0;
}

static int scalar_fused(int type, const uint8_t *const *w, int nr, const float *x, int64_t n, float *out) {
    (void)type; (void)w; (void)nr; (void)x; (void)n; (void)out;
    return -1;
}

const llm_qkern llm_qkern_scalar = {"scalar", scalar_dequant, scalar_dot_tile, scalar_fused, llm_act_dot_scalar,
                                     llm_act_dot_packed_scalar, llm_act_quantize_scalar, NULL, 0, NULL};

/* The AVX-512 kernels, with VNNI where the CPU has it, unless
 * KVCACHE_NO_VNNI (src/cpu.h) */
static const llm_qkern *avx512_best(void) {
    const llm_qkern *k = kv_cpu_vnni_off() ? NULL : llm_qkern_avx512vnni();
    return k ? k : llm_qkern_avx512();
}

/* The kernels of isa (src/cpu.h), or NULL when not compiled in or the CPU
 * lacks it. */
static const llm_qkern *for_isa(int isa) {
    switch (isa) {
    case KV_ISA_SCALAR: return &llm_qkern_scalar;
    case KV_ISA_AVX2: return llm_qkern_avx2();
    case KV_ISA_AVX512: return avx512_best();
    case KV_ISA_AVX512VNNI: return llm_qkern_avx512vnni();
    default: return NULL;
    }
}

static const llm_qkern *best(void) {
    const llm_qkern *k = NULL;
    for (int isa = KV_ISA_AVX512; !k; isa--) k = for_isa(isa);   /* avx512 takes VNNI where it may */
    return k;
}

/* The first-use choice and the one in force; tests switch between runs, so
 * the pointer is atomic to keep concurrent readers defined. */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static const llm_qkern *chosen;
static _Atomic(const llm_qkern *) active;

static void choose(void) {
    const llm_qkern *k = for_isa(kv_isa_requested());
    chosen = k ? k : best();
    atomic_store_explicit(&active, chosen, memory_order_relaxed);
}

const llm_qkern *llm_qkern_active(void) {
    pthread_once(&once, choose);
    return atomic_load_explicit(&active, memory_order_relaxed);
}

int llm_quant_select(const char *name) {
    if (!name) return -1;
    pthread_once(&once, choose);
    const llm_qkern *k = strcmp(name, "auto") ? for_isa(kv_isa_parse(name)) : best();
    if (!k) return -1;
    atomic_store_explicit(&active, k, memory_order_relaxed);
    return 0;
}

void llm_quant_force_scalar(int on) {
    pthread_once(&once, choose);
    atomic_store_explicit(&active, on ? &llm_qkern_scalar : chosen, memory_order_relaxed);
}

const char *llm_quant_kernels(void) { return llm_qkern_active()->name; }

static void dequant_any(int type, const uint8_t *src, float *dst, int64_t n, const llm_qkern *k) {
    if (k->dequant(type, src, dst, n) != 0) dequant_scalar(type, src, dst, n);
}

int llm_dequant_row(int type, const void *src, float *dst, int64_t n) {
    if (llm_row_bytes(type, n) < 0) return -1;
    dequant_any(type, src, dst, n, llm_qkern_active());
    return 0;
}

/* ------------------------------------------------------------ matrix product */

enum {
    CHUNK = 1024,  /* most row elements decoded at once: 4 rows x 4 KiB stay in L1 */
    JBLOCK = 64,   /* X rows kept hot in L2 while all weight rows pass over them */
    XT = 4,        /* X rows per tile: each decoded weight vector feeds 4 FMAs */
};

static void dot_tile(const float *const *w, int nr, const float *const *x, int nt, int64_t n,
                     float *out, const llm_qkern *k) {
    k->dot_tile(w, nr, x, nt, n, out);
}

/* Y[j*ldy + r0 + r] = out[r*nt + t] on the first chunk of k, += after it. */
static void store_tile(float *Y, int64_t ldy, int64_t j, int64_t r0, const float *out,
                       int nr_real, int nt_real, int nt, int first) {
    for (int r = 0; r < nr_real; r++)
        for (int t = 0; t < nt_real; t++) {
            float *y = &Y[(j + t) * ldy + r0 + r];
            *y = first ? out[r * nt + t] : *y + out[r * nt + t];
        }
}

void llm_matmul_rows(int type, const void *W, int64_t n_in, int64_t row0, int64_t row1,
                     const float *X, int64_t m, float *Y, int64_t ldy) {
    if (row0 < 0 || row1 <= row0 || m <= 0) return;
    int64_t rb = llm_row_bytes(type, n_in);
    if (rb < 0 || n_in == 0) {
        float v = rb < 0 ? NAN : 0.0f;
        for (int64_t j = 0; j < m; j++)
            for (int64_t r = row0; r < row1; r++) Y[j * ldy + r] = v;
        return;
    }
    const llm_qkern *kern = llm_qkern_active();
    int simd = kern != &llm_qkern_scalar;
    _Alignas(64) float buf[8][CHUNK];        /* decoded chunks of up to 8 weight rows */
    const uint8_t *Wb = W;
    int64_t elems = type_size_of(type).elems, bbytes = type_size_of(type).bytes;
    /* Equal chunks, whole super-blocks each: a short last chunk (576 = 512 + 64)
     * would pay a tile's setup and reduction for little work. */
    int64_t nch = (n_in + CHUNK - 1) / CHUNK;
    int64_t chunk = ((n_in + nch - 1) / nch + LLM_QK_K - 1) / LLM_QK_K * LLM_QK_K;
    if (chunk > CHUNK) chunk = CHUNK;

    for (int64_t jb = 0; jb < m; jb += JBLOCK) {
        int64_t je = m - jb < JBLOCK ? m : jb + JBLOCK;
        /* One X row (decode) is bound by weight decoding, so 8 weight rows
         * share each x vector; with more X rows each decoded 4-row chunk is
         * reused by tiles of XT X rows. */
        int decode = (je - jb == 1);
        int R = decode ? 8 : 4;
        for (int64_t r0 = row0; r0 < row1; r0 += R) {
            int nr = (int)(row1 - r0 < R ? row1 - r0 : R);
            for (int64_t k0 = 0; k0 < n_in; k0 += chunk) {
                int64_t kc = n_in - k0 < chunk ? n_in - k0 : chunk;
                int first = (k0 == 0);
                float out[8 * XT];
                if (decode && simd) {          /* decode in registers where a kernel exists */
                    const uint8_t *src[8];
                    for (int i = 0; i < nr; i++) src[i] = Wb + (r0 + i) * rb + k0 / elems * bbytes;
                    const float *xp = X + jb * n_in + k0;
                    if (nr == 8 && kern->fused_dot(type, src, 8, xp, kc, out) == 0) {
                        store_tile(Y, ldy, jb, r0, out, 8, 1, 1, first);
                        continue;
                    }
                    if (nr < 8) {              /* the last few rows, one at a time */
                        int i = 0;
                        for (; i < nr && kern->fused_dot(type, &src[i], 1, xp, kc, out) == 0; i++)
                            store_tile(Y, ldy, jb, r0 + i, out, 1, 1, 1, first);
                        if (i == nr) continue;
                        /* i == 0: no fused kernel for this type */
                    }
                }
                const float *wp[8];
                for (int i = 0; i < nr; i++) {
                    const uint8_t *src = Wb + (r0 + i) * rb + k0 / elems * bbytes;
                    if (type == LLM_TYPE_F32 && ((uintptr_t)src & 3) == 0) {
                        wp[i] = (const float *)(const void *)src;   /* no copy needed */
                    } else {
                        dequant_any(type, src, buf[i], kc, kern);
                        wp[i] = buf[i];
                    }
                }
                if (decode) {
                    const float *xp = X + jb * n_in + k0;
                    if (nr == 8) {
                        dot_tile(wp, 8, &xp, 1, kc, out, kern);
                        store_tile(Y, ldy, jb, r0, out, 8, 1, 1, first);
                    } else {                 /* the last few rows, one at a time */
                        for (int i = 0; i < nr; i++) {
                            dot_tile(&wp[i], 1, &xp, 1, kc, out, kern);
                            store_tile(Y, ldy, jb, r0 + i, out, 1, 1, 1, first);
                        }
                    }
                    continue;
                }
                /* A short group or tile repeats its last row; the extra
                 * results are computed and dropped, so one kernel shape serves. */
                for (int i = nr; i < 4; i++) wp[i] = wp[nr - 1];
                for (int64_t j = jb; j < je; j += XT) {
                    int nt = (int)(je - j < XT ? je - j : XT);
                    const float *xp[XT];
                    for (int t = 0; t < XT; t++) xp[t] = X + (j + (t < nt ? t : nt - 1)) * n_in + k0;
                    dot_tile(wp, 4, xp, XT, kc, out, kern);
                    store_tile(Y, ldy, j, r0, out, nr, nt, XT, first);
                }
            }
        }
    }
}

float llm_vec_dot(int type, const void *row, const float *x, int64_t n) {
    float y;
    llm_matmul_rows(type, row, n, 0, 1, x, 1, &y, 1);
    return y;
}

/* ------------------------------------------------------------ quantizer */

int llm_quantize_row_q8_0(const float *src, void *dst, int64_t n) {
    if (n < 0 || n % LLM_QK != 0) return -1;
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / LLM_QK; i++, src += LLM_QK, b += sizeof(llm_block_q8_0)) {
        float amax = 0.0f;
        for (int j = 0; j < LLM_QK; j++) amax = fmaxf(amax, fabsf(src[j]));
        uint16_t dh = llm_f32_to_f16(amax / 127.0f);
        float d = llm_f16_to_f32(dh);      /* quantize against the scale the reader sees */
        memcpy(b + offsetof(llm_block_q8_0, d), &dh, 2);
        int8_t *qs = (int8_t *)(b + offsetof(llm_block_q8_0, qs));
        for (int j = 0; j < LLM_QK; j++) {
            float v = d > 0.0f ? rintf(src[j] / d) : 0.0f;
            qs[j] = (int8_t)(v > 127.0f ? 127 : v < -128.0f ? -128 : v);
        }
    }
    return 0;
}
