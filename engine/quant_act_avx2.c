/* engine/quant_act_avx2.c - integer-activation dot tiles for AVX2: each
 * weight block becomes 32 bytes in element order, multiplied with the
 * activation's 32 int8 quants by vpmaddubsw (unsigned x signed byte pairs
 * into int16) and vpmaddwd (into int32), or widened to int16 and multiplied
 * with 16-bit quants by vpmaddwd alone, all exact. The integer block sums S_b of 8 (weight
 * row, X row) pairs are gathered into one vector's lanes, and the float part
 * d_b * ((float)S_b * wa_b + (float)B_b * wb_b) is done 8 pairs at a time by
 * the scalar reference's operations in its order (quant_act.c), so the
 * results equal it bit for bit. Compiled with -mavx2 -mfma -mf16c (and once
 * more with AVX-512 flags by quant_avx512.c); chosen after a CPUID check.
 * The Makefile builds these files with -ffp-contract=off: no mul+add here may
 * become an FMA, or the bits would differ from the scalar reference. */
#include "quant_kern.h"
#include "quant_simd.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

/* lane i of the result = the sum of the 8 int32 lanes of v[i] (exact) */
static inline __m256i hsum8_epi32(const __m256i v[8]) {
    __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
    __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
    __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);   /* 128-bit halves: lanes 0-3, 4-7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20), _mm256_permute2x128_si256(ab, cd, 0x31));
}

static inline __m256i join(__m128i lo, __m128i hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* Block b of one weight row: its 32 weight bytes in element order (unsigned
 * quants for the formats with an offset, signed values for Q8_0 and Q6_K),
 * where its scale half is (*hd; Q4_1's offset m follows it; K-quants: none,
 * their scales come per super-block), and (Q6_K) the int16 sub-block scales
 * for vpmaddwd. */
static inline __attribute__((always_inline)) __m256i
wbytes(const int type, const uint8_t *row, int64_t b, const uint8_t **hd, __m256i *sc16) {
    const __m128i m4 = _mm_set1_epi8(15);
    switch (type) {
    case LLM_TYPE_Q4_0: case LLM_TYPE_Q4_1: {
        const uint8_t *p = row + b * (type == LLM_TYPE_Q4_0 ? sizeof(llm_block_q4_0) : sizeof(llm_block_q4_1));
        __m128i q = _mm_loadu_si128((const __m128i *)(p + (type == LLM_TYPE_Q4_0 ? offsetof(llm_block_q4_0, qs)
                                                                                 : offsetof(llm_block_q4_1, qs))));
        *hd = p;
        return join(_mm_and_si128(q, m4), _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    }
    case LLM_TYPE_Q5_0: {
        const uint8_t *p = row + b * sizeof(llm_block_q5_0);
        __m128i lo, hi;
        q5_0_unsigned(p, &lo, &hi);
        *hd = p;
        return join(lo, hi);
    }
    case LLM_TYPE_Q8_0: {
        const uint8_t *p = row + b * sizeof(llm_block_q8_0);
        *hd = p;
        return _mm256_loadu_si256((const __m256i *)(p + offsetof(llm_block_q8_0, qs)));
    }
    case LLM_TYPE_Q4_K: case LLM_TYPE_Q5_K: {
        int five = type == LLM_TYPE_Q5_K, sub = (int)(b % 8), g = sub / 2;
        const uint8_t *p = row + (b / 8) * (five ? sizeof(llm_block_q5_k) : sizeof(llm_block_q4_k));
        __m256i q = _mm256_loadu_si256((const __m256i *)(p + (five ? offsetof(llm_block_q5_k, qs)
                                                                  : offsetof(llm_block_q4_k, qs)) + 32 * g));
        __m256i v = _mm256_and_si256(sub & 1 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(15));
        if (five) {   /* bit `sub` of qh[l] is element l's fifth bit */
            __m256i qh = _mm256_loadu_si256((const __m256i *)(p + offsetof(llm_block_q5_k, qh)));
            __m256i bit = _mm256_set1_epi8((char)(1 << sub));
            v = _mm256_or_si256(v, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit),
                                                    _mm256_set1_epi8(16)));
        }
        *hd = p;
        return v;
    }
    default: {   /* Q6_K: elements 32s..32s+31 of half h */
        const uint8_t *p = row + (b / 8) * sizeof(llm_block_q6_k);
        int e0 = (int)(b % 8) * 32, h = e0 / 128, s = (e0 % 128) / 32;
        __m256i l = _mm256_loadu_si256((const __m256i *)(p + offsetof(llm_block_q6_k, ql) + 64 * h + 32 * (s & 1)));
        __m256i hb = _mm256_loadu_si256((const __m256i *)(p + offsetof(llm_block_q6_k, qh) + 32 * h));
        __m256i lo = _mm256_and_si256(s >= 2 ? _mm256_srli_epi16(l, 4) : l, _mm256_set1_epi8(15));
        /* bits 2s, 2s+1 of qh[l] to bits 4, 5 (16-bit shifts; the mask drops strays) */
        __m256i hi2 = 2 * s >= 4 ? _mm256_srli_epi16(hb, 2 * s - 4) : _mm256_slli_epi16(hb, 4 - 2 * s);
        hi2 = _mm256_and_si256(hi2, _mm256_set1_epi8(0x30));
        const int8_t *sc = (const int8_t *)(p + offsetof(llm_block_q6_k, scales)) + e0 / 16;
        *sc16 = join(_mm_set1_epi16(sc[0]), _mm_set1_epi16(sc[1]));
        *hd = p + offsetof(llm_block_q6_k, d);
        return _mm256_sub_epi8(_mm256_or_si256(lo, hi2), _mm256_set1_epi8(32));
    }
    }
}

/* int32 lanes summing to sum_k w[k] * x[k] (Q6_K: times the sub-block scales) */
static inline __attribute__((always_inline)) __m256i dot32(const int type, __m256i wv, __m256i xv, __m256i sc16) {
    if (type == LLM_TYPE_Q8_0 || type == LLM_TYPE_Q6_K) {   /* signed weights: |w| times x with w's sign */
        __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
        return _mm256_madd_epi16(p, type == LLM_TYPE_Q6_K ? sc16 : _mm256_set1_epi16(1));
    }
    return _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), _mm256_set1_epi16(1));
}

/* The same sum against 16-bit quants xl (elements 0..15) and xh (16..31):
 * the weight bytes widened to int16 (Q6_K: times its sub-block scales, at
 * most 32 * 128 in size) and multiplied by vpmaddwd. */
static inline __attribute__((always_inline)) __m256i
dot32w(const int type, __m256i wv, __m256i xl, __m256i xh, __m256i sc16) {
    __m128i w0 = _mm256_castsi256_si128(wv), w1 = _mm256_extracti128_si256(wv, 1);
    int sgn = type == LLM_TYPE_Q8_0 || type == LLM_TYPE_Q6_K;
    __m256i lo = sgn ? _mm256_cvtepi8_epi16(w0) : _mm256_cvtepu8_epi16(w0);
    __m256i hi = sgn ? _mm256_cvtepi8_epi16(w1) : _mm256_cvtepu8_epi16(w1);
    if (type == LLM_TYPE_Q6_K) {
        lo = _mm256_mullo_epi16(lo, _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sc16)));
        hi = _mm256_mullo_epi16(hi, _mm256_broadcastsi128_si256(_mm256_extracti128_si256(sc16, 1)));
    }
    return _mm256_add_epi32(_mm256_madd_epi16(lo, xl), _mm256_madd_epi16(hi, xh));
}

/* For the 16-bit path, Q4_0/Q4_1/Q8_0 widen straight from memory (each byte
 * of nibbles to one int16 lane: low nibble and >> 4), cheaper than the bytes
 * of wbytes widened after; 0 for the other types. */
static inline __attribute__((always_inline)) int
wwords(const int type, const uint8_t *row, int64_t b, const uint8_t **hd, __m256i *lo, __m256i *hi) {
    if (type == LLM_TYPE_Q4_0 || type == LLM_TYPE_Q4_1) {
        const uint8_t *p = row + b * (type == LLM_TYPE_Q4_0 ? sizeof(llm_block_q4_0) : sizeof(llm_block_q4_1));
        __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(
            p + (type == LLM_TYPE_Q4_0 ? offsetof(llm_block_q4_0, qs) : offsetof(llm_block_q4_1, qs)))));
        *lo = _mm256_and_si256(q, _mm256_set1_epi16(15));
        *hi = _mm256_srli_epi16(q, 4);
        *hd = p;
        return 1;
    }
    if (type == LLM_TYPE_Q8_0) {
        const uint8_t *p = row + b * sizeof(llm_block_q8_0), *qs = p + offsetof(llm_block_q8_0, qs);
        *lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)qs));
        *hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(qs + 16)));
        *hd = p;
        return 1;
    }
    return 0;
}

static inline uint16_t rd16(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return h; }

/* the 8 halves at p[i] + off as floats (exact, as the scalar conversion) */
static inline __m256 halves8(const uint8_t *const p[8], size_t off) {
    return _mm256_cvtph_ps(_mm_setr_epi16((short)rd16(p[0] + off), (short)rd16(p[1] + off), (short)rd16(p[2] + off),
                                          (short)rd16(p[3] + off), (short)rd16(p[4] + off), (short)rd16(p[5] + off),
                                          (short)rd16(p[6] + off), (short)rd16(p[7] + off)));
}

/* R weight rows x T X rows (R*T <= 16), pairs p = r*T + t in groups of 8:
 * lane i of group g is pair 8g + i; W16: 16-bit quants. */
static inline __attribute__((always_inline)) void
act_tile(const int type, const uint8_t *const *w, const llm_act_row *x, int64_t nb, float *out,
         const int R, const int T, const int W16) {
    const int P = R * T, G = (P + 7) / 8;
    const int off = type == LLM_TYPE_Q4_0 ? 3 : type == LLM_TYPE_Q5_0 ? 4 : 0;   /* log2 of the quant offset */
    const int kq = type == LLM_TYPE_Q4_K || type == LLM_TYPE_Q5_K;
    const size_t kbytes = type == LLM_TYPE_Q5_K ? sizeof(llm_block_q5_k) : sizeof(llm_block_q4_k);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    _Alignas(32) float kwa[2][8][8] = {{{0}}}, kwb[2][8][8] = {{{0}}};   /* K-quants: [group][sub-block][lane] */
    for (int64_t b = 0; b < nb; b++) {
        if (kq && b % 8 == 0)   /* this super-block's sub-block scales and offsets, per lane */
            for (int r = 0; r < R; r++) {
                const uint8_t *sb = w[r] + (b / 8) * kbytes;
                float d = half_at(sb + offsetof(llm_block_q4_k, d)), dmin = half_at(sb + offsetof(llm_block_q4_k, dmin));
                for (int s = 0; s < 8; s++) {
                    uint8_t sc, mn;
                    llm_k_scale_min(sb + offsetof(llm_block_q4_k, scales), s, &sc, &mn);
                    float a = d * (float)sc, c = -(dmin * (float)mn);   /* both exact */
                    for (int t = 0; t < T; t++) {
                        int p = r * T + t;
                        kwa[p / 8][s][p % 8] = a;
                        kwb[p / 8][s][p % 8] = c;
                    }
                }
            }
        __m256i xv[4], xw[4];
        UNROLL for (int t = 0; t < T; t++) {
            if (W16) {
                const int16_t *q = (const int16_t *)x[t].q + 32 * b;
                xv[t] = _mm256_loadu_si256((const __m256i *)q);
                xw[t] = _mm256_loadu_si256((const __m256i *)(q + 16));
            } else {
                xv[t] = _mm256_loadu_si256((const __m256i *)((const int8_t *)x[t].q + 32 * b));
                xw[t] = xv[t];
            }
        }
        __m256 dxv;
        __m256i Bv;
        if (T == 1) {
            dxv = _mm256_set1_ps(x[0].d[b]);
            Bv = _mm256_set1_epi32(x[0].s[b]);
        } else {   /* lane i holds X row i % 4 */
            __m128 d4 = _mm_setr_ps(x[0].d[b], x[1 % T].d[b], x[2 % T].d[b], x[3 % T].d[b]);
            __m128i b4 = _mm_setr_epi32(x[0].s[b], x[1 % T].s[b], x[2 % T].s[b], x[3 % T].s[b]);
            dxv = _mm256_set_m128(d4, d4);
            Bv = _mm256_set_m128i(b4, b4);
        }
        UNROLL for (int g = 0; g < G; g++) {
            __m256i v[8], wv = _mm256_setzero_si256(), sc16 = _mm256_setzero_si256();
            __m256i wl = _mm256_setzero_si256(), wh = _mm256_setzero_si256();
            const int direct = W16 && (type == LLM_TYPE_Q4_0 || type == LLM_TYPE_Q4_1 || type == LLM_TYPE_Q8_0);
            const uint8_t *hd[8], *h = w[0];
            UNROLL for (int i = 0; i < 8; i++) {
                int p = 8 * g + i, r = p / T, t = p % T;
                if (p >= P) {              /* a lane no pair uses: computed and dropped */
                    v[i] = _mm256_setzero_si256();
                    hd[i] = w[0];
                    continue;
                }
                if (direct) {
                    if (i == 0 || t == 0) wwords(type, w[r], b, &h, &wl, &wh);
                    v[i] = _mm256_add_epi32(_mm256_madd_epi16(wl, xv[t]), _mm256_madd_epi16(wh, xw[t]));
                } else {
                    if (i == 0 || t == 0) wv = wbytes(type, w[r], b, &h, &sc16);
                    v[i] = W16 ? dot32w(type, wv, xv[t], xw[t], sc16) : dot32(type, wv, xv[t], sc16);
                }
                hd[i] = h;
            }
            __m256i S = hsum8_epi32(v);
            if (off) S = _mm256_sub_epi32(S, _mm256_slli_epi32(Bv, off));
            __m256 wa, wb;
            if (kq) {
                wa = _mm256_load_ps(kwa[g][b % 8]);
                wb = _mm256_load_ps(kwb[g][b % 8]);
            } else {
                wa = halves8(hd, 0);
                wb = type == LLM_TYPE_Q4_1 ? halves8(hd, offsetof(llm_block_q4_1, m)) : _mm256_setzero_ps();
            }
            /* the reference's operations, in its order: t1 = S wa, t2 = B wb, c = d (t1 + t2), acc += c */
            __m256 t1 = _mm256_mul_ps(_mm256_cvtepi32_ps(S), wa);
            __m256 t2 = _mm256_mul_ps(_mm256_cvtepi32_ps(Bv), wb);
            __m256 c = _mm256_mul_ps(dxv, _mm256_add_ps(t1, t2));
            acc[g] = _mm256_add_ps(acc[g], c);
        }
    }
    float all[16];
    _mm256_storeu_ps(all, acc[0]);
    _mm256_storeu_ps(all + 8, acc[1]);
    for (int p = 0; p < P; p++) out[p] = all[p];
}

#define ACT_SHAPES_W(T_, W_)                                                      \
    do {                                                                          \
        if (nr == 8 && nt == 1) act_tile(T_, w, x, nb, out, 8, 1, W_);           \
        else if (nr == 4 && nt == 4) act_tile(T_, w, x, nb, out, 4, 4, W_);      \
        else                                                                      \
            for (int r = 0; r < nr; r++)                                          \
                for (int t = 0; t < nt; t++)                                      \
                    act_tile(T_, &w[r], &x[t], nb, &out[r * nt + t], 1, 1, W_);   \
    } while (0)
#define ACT_SHAPES(T_)                                \
    do {                                              \
        if (x[0].bits == LLM_ACT_Q16) ACT_SHAPES_W(T_, 1); \
        else ACT_SHAPES_W(T_, 0);                     \
    } while (0)

int QK_CAT(llm_act_dot_, QK_TABLE)(int type, const uint8_t *const *w, int nr, const llm_act_row *x, int nt,
                                   int64_t nb, float *out) {
    switch (type) {
    case LLM_TYPE_Q4_0: ACT_SHAPES(LLM_TYPE_Q4_0); return 0;
    case LLM_TYPE_Q4_1: ACT_SHAPES(LLM_TYPE_Q4_1); return 0;
    case LLM_TYPE_Q5_0: ACT_SHAPES(LLM_TYPE_Q5_0); return 0;
    case LLM_TYPE_Q8_0: ACT_SHAPES(LLM_TYPE_Q8_0); return 0;
    case LLM_TYPE_Q4_K: ACT_SHAPES(LLM_TYPE_Q4_K); return 0;
    case LLM_TYPE_Q5_K: ACT_SHAPES(LLM_TYPE_Q5_K); return 0;
    case LLM_TYPE_Q6_K: ACT_SHAPES(LLM_TYPE_Q6_K); return 0;
    default: return llm_act_dot_scalar(type, w, nr, x, nt, nb, out);
    }
}

#else

int QK_CAT(llm_act_dot_, QK_TABLE)(int type, const uint8_t *const *w, int nr, const llm_act_row *x, int nt,
                                   int64_t nb, float *out) {
    return llm_act_dot_scalar(type, w, nr, x, nt, nb, out);
}

#endif
