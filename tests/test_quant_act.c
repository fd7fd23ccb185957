/* tests/test_quant_act.c - integer activations (int8 and int16): the
 * quantizer, every block format's integer-activation product against the
 * float64 oracle (quant_oracle.c) within a bound derived from the
 * quantization, and the bit-for-bit promises: scalar == SIMD kernels, any row
 * split, decode (one X row) == prefill (many). */
#include "test.h"
#include "../engine/weights/quant.h"
#include "../engine/weights/quant_kern.h"
#include "quant_oracle.h"

#include <stdlib.h>
#include <string.h>

static const int int8_types[] = {LLM_TYPE_Q4_0, LLM_TYPE_Q4_1, LLM_TYPE_Q5_0, LLM_TYPE_Q8_0,
                                 LLM_TYPE_Q4_K, LLM_TYPE_Q5_K, LLM_TYPE_Q6_K,
                                 LLM_TYPE_Q5_1, LLM_TYPE_Q2_K, LLM_TYPE_Q3_K};
#define N_INT8 (int)(sizeof int8_types / sizeof int8_types[0])
/* The weight kernels, every table this CPU runs: "avx512" as KVCACHE_NO_VNNI=1
 * leaves it (without VNNI), then with VNNI */
static const char *const kernels[] = {"scalar", "avx2", "avx512", "avx512vnni"};
#define N_KERNELS (int)(sizeof kernels / sizeof kernels[0])
static int select_kernels(int ki) {
    const char *was = getenv("KVCACHE_NO_VNNI");
    char *keep = was ? strdup(was) : NULL;
    setenv("KVCACHE_NO_VNNI", "1", 1);
    int rc = llm_quant_select(kernels[ki]);
    if (keep) setenv("KVCACHE_NO_VNNI", keep, 1);
    else unsetenv("KVCACHE_NO_VNNI");
    free(keep);
    return rc;
}

/* X [m][n]: normal values at a scale that changes from block to block, and an
 * all-zero block, so block scales matter */
static float *random_x(test_rng *r, int64_t m, int64_t n) {
    float *x = malloc((size_t)(m * n) * sizeof *x);
    for (int64_t i = 0; i < m * n; i++) {
        double scale = ldexp(1.0, (int)((i / 32) % 5) - 2);
        x[i] = (float)(test_rng_normal(r) * scale);
    }
    if (n >= 64) memset(x + 32, 0, 32 * sizeof *x);
    return x;
}

typedef struct {
    llm_act a;
    void *buf;
} act_buf;

static int quantize(act_buf *ab, const float *x, int64_t m, int64_t n, int bits) {
    size_t bytes = llm_act_bytes(m, n);
    ab->buf = malloc(bytes);
    return llm_act_quantize(&ab->a, x, m, n, bits, ab->buf, bytes);
}

static int quant_at(const llm_act *a, int64_t i) {
    return a->bits == LLM_ACT_Q8 ? ((const int8_t *)a->q)[i] : ((const int16_t *)a->q)[i];
}

TEST(quant_act_quantizer_keeps_every_element_within_half_a_step) {
    test_rng r = {31};
    int64_t m = 3, n = 32 * 9;
    float *x = random_x(&r, m, n);
    x[5] = 0x1p-30f;                                   /* tiny next to its block's max */
    for (int bits = 8; bits <= 16; bits += 8) {
        int top = bits == 8 ? 127 : 16383;
        act_buf ab;
        CHECK(quantize(&ab, x, m, n, bits) == 0);
        CHECK(ab.a.bits == bits && ab.a.x == x && ab.a.m == m && ab.a.n == n);
        for (int64_t b = 0; b < m * n / 32; b++) {
            double amax = 0;
            for (int k = 0; k < 32; k++) amax = fmax(amax, fabs(x[32 * b + k]));
            double d = ab.a.d[b];
            CHECK_NEAR(d, amax / top, amax / top * 1e-6 + 1e-37);
            int32_t sum = 0, half = 0;
            for (int k = 0; k < 32; k++) {
                int q = quant_at(&ab.a, 32 * b + k);
                sum += q;
                half += k < 16 ? q : 0;
                if (!(q >= -top && q <= top && fabs(x[32 * b + k] - d * q) <= d * 0.5 * (1 + 1e-3) + 1e-37)) {
                    test_fail(__FILE__, __LINE__, "bits %d block %lld element %d: x %.9g, d %.9g, q %d",
                              bits, (long long)b, k, x[32 * b + k], d, q);
                    break;
                }
            }
            CHECK_EQ_INT(ab.a.s[b], sum);
            CHECK_EQ_INT(ab.a.h[b], half);
        }
        free(ab.buf);
    }
    /* n not a whole number of blocks, or bits 0 asked: no quantization */
    llm_act e;
    CHECK(llm_act_quantize(&e, x, 1, 31, 8, NULL, 0) == 0 && e.bits == 0 && e.q == NULL);
    CHECK(llm_act_quantize(&e, x, 2, 64, 0, NULL, 0) == 0 && e.bits == 0);
    /* bad arguments leave *a as it was */
    llm_act keep = e;
    char small[16];
    CHECK(llm_act_quantize(&e, x, 2, 64, 8, small, sizeof small) != 0);
    CHECK(llm_act_quantize(&e, x, 0, 64, 8, small, sizeof small) != 0);
    CHECK(llm_act_quantize(&e, NULL, 1, 64, 8, small, sizeof small) != 0);
    CHECK(llm_act_quantize(&e, x, 1, 64, 4, small, sizeof small) != 0);
    CHECK(memcmp(&e, &keep, sizeof e) == 0);
    free(x);
}

/* Every kernel's quantizer gives the scalar one's bytes, on blocks with a
 * NaN, an infinity, all zeros, the largest floats, subnormals, and values
 * that land halfway between two quants (rounded to even). */
TEST(quant_act_quantizer_is_bit_identical_across_kernels_on_special_blocks) {
    const char *was = llm_quant_kernels(); /* put back after: KVCACHE_SIMD's choice */
    test_rng r = {37};
    int64_t m = 2, n = 32 * 12;
    float *x = random_x(&r, m, n);
    x[32 * 1 + 3] = NAN;                                  /* block 1 */
    x[32 * 2 + 7] = -INFINITY;                            /* block 2 */
    memset(x + 32 * 3, 0, 32 * sizeof *x);                /* block 3 */
    for (int k = 0; k < 32; k++) x[32 * 4 + k] = (k % 2 ? -3.4e38f : 3.3e38f);
    for (int k = 0; k < 32; k++) x[32 * 5 + k] = ldexpf((float)(k - 16), -140);   /* subnormals */
    for (int k = 0; k < 32; k++) x[32 * 6 + k] = (float)(k - 16) + 0.5f;          /* ties at bits 8: max 16.5 */
    x[32 * 6 + 31] = 127.0f;                              /* d = 1 exactly: every x.5 a tie */
    x[32 * 7 + 0] = -0.0f;
    for (int bits = 8; bits <= 16; bits += 8) {
        act_buf a0, a1;
        llm_quant_select("scalar");
        CHECK(quantize(&a0, x, m, n, bits) == 0);
        for (int ki = 1; ki < N_KERNELS; ki++) {
            if (select_kernels(ki) != 0) continue;
            CHECK(quantize(&a1, x, m, n, bits) == 0);
            size_t nb = (size_t)(m * n / 32);
            if (memcmp(a0.a.q, a1.a.q, (size_t)(m * n) * (size_t)(bits / 8)) ||
                memcmp(a0.a.d, a1.a.d, nb * sizeof(float)) || memcmp(a0.a.s, a1.a.s, nb * sizeof(int32_t)) ||
                memcmp(a0.a.h, a1.a.h, nb * sizeof(int32_t)))
                test_fail(__FILE__, __LINE__, "bits %d: the %s quantizer differs from the scalar one", bits,
                          kernels[ki]);
            free(a1.buf);
        }
        CHECK(isnan(a0.a.d[1]) && isnan(a0.a.d[2]) && a0.a.d[3] == 0);
        free(a0.buf);
    }
    llm_quant_select(was);
    free(x);
}

/* Y[j][i] against the f64 oracle. Bound: the integer product is exactly
 * sum_k w_k * d_b q_k up to f32 rounding, and |x_k - d_b q_k| <= d_b / 2 with
 * d_b = max_b|x| / top, top = 127 (int8) or 16383 (int16) (the quantizer's
 * promise, plus its own rounding of x / d_b, under 1e-4 relative), so
 *   |Y - sum w x| <= sum_b (max_b|x| / (2 top)) (1 + 1e-4) sum_{k in b} |w_k|
 * plus f32 rounding: a few roundings of 2^-24 per block on terms no larger
 * than 3 * 32 * max_b|w| * max_b|x| (offset formats: |d q| + |m| <= 3 max|w|),
 * and the running sum over at most 70 blocks; 1e-4 of that sum covers it. */
static int check_against_oracle(int type, int bits, const uint8_t *W, int64_t rb, int64_t rows, const float *X,
                                int64_t m, int64_t n, const float *Y, int64_t ldy) {
    double top = bits == 8 ? 127 : 16383;
    for (int64_t j = 0; j < m; j++)
        for (int64_t i = 0; i < rows; i++) {
            double want = 0, qbound = 0, fbound = 0;
            for (int64_t b = 0; b < n / 32; b++) {
                double xmax = 0, wsum = 0, wmax = 0;
                for (int k = 0; k < 32; k++) {
                    double w = ref_value(type, W + i * rb, 32 * b + k);
                    want += w * X[j * n + 32 * b + k];
                    xmax = fmax(xmax, fabs(X[j * n + 32 * b + k]));
                    wsum += fabs(w);
                    wmax = fmax(wmax, fabs(w));
                }
                qbound += xmax / (2 * top) * (1 + 1e-4) * wsum;
                fbound += 3 * 32 * wmax * xmax;
            }
            double got = Y[j * ldy + i], bound = qbound + 1e-4 * fbound + 1e-30;
            if (!(fabs(got - want) <= bound)) {
                test_fail(__FILE__, __LINE__, "%s (%s, bits %d) m=%lld Y[%lld][%lld]: %.9g vs %.9g, bound %.3g",
                          llm_type_name(type), llm_quant_kernels(), bits, (long long)m, (long long)j,
                          (long long)i, got, want, bound);
                return -1;
            }
        }
    return 0;
}

typedef struct {
    int type;
    int64_t rows, n, m, rb;
    uint8_t *W;
    float *X;
    act_buf ab;
} problem;

static void make_problem(problem *p, test_rng *r, int type, int64_t rows, int64_t n, int64_t m, int bits) {
    p->type = type, p->rows = rows, p->n = n, p->m = m;
    p->rb = llm_row_bytes(type, n);
    p->W = malloc((size_t)(p->rb * rows));
    for (int64_t i = 0; i < rows; i++) random_row(r, type, n, p->W + i * p->rb);
    p->X = random_x(r, m, n);
    CHECK(quantize(&p->ab, p->X, m, n, bits) == 0);
}

static void free_problem(problem *p) { free(p->W); free(p->X); free(p->ab.buf); }

static float *product(const problem *p) {
    float *Y = malloc((size_t)(p->m * p->rows) * sizeof *Y);
    llm_matmul_act(p->type, p->W, NULL, p->n, 0, p->rows, &p->ab.a, Y, p->rows);
    return Y;
}

/* W in groups of 8 (llm_pack_rows), or NULL for a type that is not packed */
static void *packed_of(const problem *p) {
    int64_t bytes = llm_packed_bytes(p->type, p->rows, p->n);
    if (!bytes) return NULL;
    void *P = malloc((size_t)bytes);
    CHECK(llm_pack_rows(p->type, p->W, p->rows, p->n, P) == 0);
    return P;
}

/* the packed types: the 32-element formats but Q5_1, and Q4_K, Q5_K, Q6_K */
static int packed_type(int type) {
    return (llm_type_block_elems(type) == 32 && type != LLM_TYPE_Q5_1) || type == LLM_TYPE_Q4_K ||
           type == LLM_TYPE_Q5_K || type == LLM_TYPE_Q6_K;
}

TEST(quant_act_every_block_format_matches_the_f64_oracle_within_the_derived_bound) {
    const char *was = llm_quant_kernels(); /* put back after: KVCACHE_SIMD's choice */
    test_rng r = {32};
    static const int64_t ms[] = {1, 5};
    for (int ki = 0; ki < N_KERNELS; ki++) {
        if (select_kernels(ki) != 0) continue;
        for (int bits = 8; bits <= 16; bits += 8)
            for (int ti = 0; ti < N_INT8; ti++)
                for (int mi = 0; mi < 2; mi++) {
                    int type = int8_types[ti];
                    CHECK(llm_type_int8(type));
                    int64_t n = llm_type_block_elems(type) == 32 ? 32 * 21 : 256 * 3;
                    problem p;
                    make_problem(&p, &r, type, 19, n, ms[mi], bits);
                    float *Y = product(&p);
                    check_against_oracle(type, bits, p.W, p.rb, p.rows, p.X, p.m, n, Y, p.rows);
                    void *P = packed_of(&p);
                    CHECK_EQ_INT(P != NULL, packed_type(type));
                    if (P) {   /* the packed rows against the oracle too */
                        llm_matmul_act(type, p.W, P, n, 0, p.rows, &p.ab.a, Y, p.rows);
                        check_against_oracle(type, bits, p.W, p.rb, p.rows, p.X, p.m, n, Y, p.rows);
                    }
                    free(P);
                    free(Y);
                    free_problem(&p);
                }
    }
    llm_quant_select(was);
}

/* Activation quants at their extremes (every |q| = 16383, or 127 for
 * 8-bit ones) against the largest Q6_K, Q8_0 and Q5_K weights, in plain
 * rows and packed, one X row, two and three (the few-row kernels; Q6_K's
 * in place up to two) and 64 (the VNNI tiles): the int32 block sums must
 * not overflow (a packed Q5_K's nibbles summed at 256 times their value:
 * 8 * 31 * 256 * 16383; a packed Q6_K's unsigned quants in place: 4 * 63 *
 * 256 * 16383), nor the 8-bit tiles' scaled Q6_K sub-block sums (16 * 32 *
 * 127 * 128 each) lose a bit in their float sum. */
TEST(quant_act_extreme_quants_do_not_overflow_the_block_sums) {
    const char *was = llm_quant_kernels(); /* put back after: KVCACHE_SIMD's choice */
    for (int ti = 0; ti < 4; ti++) {
        int type = ti == 1 ? LLM_TYPE_Q8_0 : ti == 2 ? LLM_TYPE_Q5_K : LLM_TYPE_Q6_K;
        int64_t n = 256, rb = llm_row_bytes(type, n);
        uint8_t *W = calloc(1, (size_t)rb);
        if (type == LLM_TYPE_Q6_K) {   /* every q = 0 (value -32), every scale -128, d = 1 */
            memset(W + 192, 0x80, 16);
            put_half(W + 208, 1.0f);
            if (ti == 3) {   /* every q = 63 (value 31); scales -128 and 127 in turn, so that no sub-block's
                              * error can cancel its neighbour's in the int32 sum */
                memset(W, 0xFF, 192);
                for (int i = 1; i < 16; i += 2) W[192 + i] = 127;
            }
        } else if (type == LLM_TYPE_Q8_0) {   /* every q = -128, d = 1 */
            for (int b = 0; b < 8; b++) { put_half(W + 34 * b, 1.0f); memset(W + 34 * b + 2, 0x80, 32); }
        } else {   /* every q = 31 (nibbles and fifth bits all set), every sub-block scale 1 and min 0, d = 1 */
            put_half(W, 1.0f);
            memset(W + 4, 1, 4);     /* sub-blocks 0..3: scale 1, min 0 */
            memset(W + 12, 1, 4);    /* 4..7: the low bits of scale 1, of min 0 */
            memset(W + 16, 0xFF, 160);
        }
        const double want = ti == 0 ? 256.0 * 32 * 128 : ti == 3 ? 8 * 16 * 31 * (127.0 - 128) : ti == 1 ? -256.0 * 128 : 256.0 * 31;
        uint8_t *P = malloc((size_t)llm_packed_bytes(type, 1, n));
        CHECK(llm_pack_rows(type, W, 1, n, P) == 0);
        for (int bits = 8; bits <= 16; bits += 8)
            for (int mi = 0; mi < 4; mi++) {
                const int64_t m = mi < 3 ? mi + 1 : 64;
                float *x = malloc((size_t)(m * n) * sizeof *x), y[64], y0[64];
                for (int64_t k = 0; k < m * n; k++) x[k] = 1.0f;
                act_buf ab;
                CHECK(quantize(&ab, x, m, n, bits) == 0);
                llm_quant_select("scalar");
                llm_matmul_act(type, W, NULL, n, 0, 1, &ab.a, y0, 1);
                for (int ki = 0; ki < N_KERNELS; ki++) {
                    if (select_kernels(ki) != 0) continue;
                    for (int pk = 0; pk < 2; pk++) {
                        llm_matmul_act(type, W, pk ? P : NULL, n, 0, 1, &ab.a, y, 1);
                        for (int64_t t = 0; t < m; t++) CHECK_NEAR(y[t], want, 1e-6 * fabs(want));
                        CHECK(memcmp(y, y0, (size_t)m * sizeof *y) == 0);   /* the scalar product's bits */
                    }
                }
                free(ab.buf), free(x);
            }
        free(W), free(P);
    }
    llm_quant_select(was);
}

/* 1 if the product of p's rows (P: packed, or NULL) in uneven pieces, as
 * threads split them, one X row at a time (decode), equals Y0 bit for bit */
static int decode_in_pieces_equals(const problem *p, const void *P, const float *Y0, float *Y1, int bits) {
    static const int64_t cut[] = {0, 1, 6, 9, 16, 21};
    CHECK(p->rows == cut[5]);
    memset(Y1, 0xff, (size_t)(p->m * p->rows) * sizeof *Y1);
    for (int c = 0; c < 5; c++)
        for (int64_t j = 0; j < p->m; j++) {
            act_buf one;
            CHECK(quantize(&one, p->X + j * p->n, 1, p->n, bits) == 0);
            llm_matmul_act(p->type, p->W, P, p->n, cut[c], cut[c + 1], &one.a, Y1 + j * p->rows, p->rows);
            free(one.buf);
        }
    return memcmp(Y0, Y1, (size_t)(p->m * p->rows) * sizeof *Y0) == 0;
}

/* The integer arithmetic is exact and the float part follows one stated
 * order, so every kernel gives the same bits, whatever the row split or the
 * number of X rows per call: 6 (no lanes: a packed group takes them one at
 * a time, plain rows in tiles, LLM_ACT_FEW_ROWS) or 11 (lanes of 8, then
 * the rest). */
TEST(quant_act_products_are_bit_identical_across_kernels_row_splits_and_decode_vs_prefill) {
    const char *was = llm_quant_kernels(); /* put back after: KVCACHE_SIMD's choice */
    test_rng r = {33};
    for (int tb = 0; tb < 4 * N_INT8; tb++) {   /* every type at both widths, with 6 and 11 X rows */
        int ti = tb / 4, type = int8_types[ti];
        int64_t n = llm_type_block_elems(type) == 32 ? 32 * 18 : 256 * 2;
        int bits = tb % 2 ? LLM_ACT_Q8 : LLM_ACT_Q16, m = tb % 4 < 2 ? 6 : 11;
        problem p;
        make_problem(&p, &r, type, 21, n, m, bits);
        llm_quant_select("scalar");
        float *Y0 = product(&p);
        int tried = 0;
        for (int ki = 0; ki < N_KERNELS; ki++) {
            if (select_kernels(ki) != 0) continue;
            tried++;
            float *Y1 = product(&p);
            if (memcmp(Y0, Y1, (size_t)(p.m * p.rows) * sizeof *Y0) != 0)
                test_fail(__FILE__, __LINE__, "%s: %s differs from scalar", llm_type_name(type), kernels[ki]);
            if (!decode_in_pieces_equals(&p, NULL, Y0, Y1, bits))
                test_fail(__FILE__, __LINE__, "%s (%s): decode or row split differs from prefill",
                          llm_type_name(type), kernels[ki]);
            /* packed rows (21: the last group padded), all X rows at once, then in pieces */
            void *P = packed_of(&p);
            if (P) {
                memset(Y1, 0xff, (size_t)(p.m * p.rows) * sizeof *Y1);
                llm_matmul_act(type, p.W, P, n, 0, p.rows, &p.ab.a, Y1, p.rows);
                if (memcmp(Y0, Y1, (size_t)(p.m * p.rows) * sizeof *Y0) != 0)
                    test_fail(__FILE__, __LINE__, "%s (%s): packed rows differ from plain ones", llm_type_name(type),
                              kernels[ki]);
                if (!decode_in_pieces_equals(&p, P, Y0, Y1, bits))
                    test_fail(__FILE__, __LINE__, "%s (%s): packed rows in pieces differ", llm_type_name(type),
                              kernels[ki]);
            }
            free(P);
            free(Y1);
        }
        CHECK(tried >= 1);
        free(Y0);
        free_problem(&p);
    }
    llm_quant_select(was);
}

/* One X row (decode) reads up to LLM_ROW1_GROUPS long packed groups at once
 * (or one, as on AMD's cores: both are run): row ranges over 6 groups (the
 * last of 5 rows), starting and ending inside groups, taken whole and in
 * pieces of 1 to 6 groups, on every kernel and both activation widths,
 * equal to the scalar plain product bit for bit. */
TEST(quant_act_one_row_against_several_packed_groups_matches_the_scalar_product) {
    const char *was = llm_quant_kernels(); /* put back after: KVCACHE_SIMD's choice */
    test_rng r = {41};
    static const int64_t cut[][5] = {{0, 45, 45, 45, 45}, {0, 3, 41, 45, 45}, {0, 8, 40, 44, 45}, {0, 17, 18, 45, 45}};
    for (int ti = 0; ti < N_INT8; ti++)
        for (int bits = 8; bits <= 16; bits += 8) {
            const int type = int8_types[ti];
            if (!packed_type(type)) continue;
            /* 4096 wide: groups of 8 rows long enough to be read several at once */
            const int64_t n = 4096, rows = 45;
            CHECK(8 * llm_row_bytes(type, n) >= LLM_ROW1_STREAM_BYTES);
            problem p;
            llm_quant_select("scalar");
            make_problem(&p, &r, type, rows, n, 1, bits);
            float *Y0 = product(&p), *Y1 = malloc((size_t)rows * sizeof *Y1);
            void *P = packed_of(&p);
            CHECK(P != NULL);
            for (int ki = 0; ki < N_KERNELS; ki++) {
                if (select_kernels(ki) != 0) continue;
                act_buf own;
                CHECK(quantize(&own, p.X, 1, n, bits) == 0);
                for (int groups = 1; groups <= LLM_ROW1_GROUPS; groups += LLM_ROW1_GROUPS - 1) {
                    llm_row1_groups_force(groups);
                    for (int c = 0; c < 4; c++) {
                        memset(Y1, 0xff, (size_t)rows * sizeof *Y1);
                        for (int i = 0; i < 4; i++)
                            llm_matmul_act(type, p.W, P, n, cut[c][i], cut[c][i + 1], &own.a, Y1, rows);
                        if (memcmp(Y0, Y1, (size_t)rows * sizeof *Y0) != 0)
                            test_fail(__FILE__, __LINE__,
                                      "%s (%s, bits %d, %d groups at once, cuts %d): one row against packed groups differs",
                                      llm_type_name(type), kernels[ki], bits, groups, c);
                    }
                }
                llm_row1_groups_force(0);
                free(own.buf);
            }
            free(P), free(Y0), free(Y1);
            free_problem(&p);
        }
    llm_quant_select(was);
}

/* The packed types at the row counts that choose the
 * prefill tiles: a few rows (2, 3), the tiles of 4 (and 2 on AVX2) with a
 * remainder (9, 13), AVX-512 VNNI's tiles of 32 X rows with the rest in
 * tiles (45: 32 + 13) or in lanes from the middle of a group of 16 (56: 32
 * + 16 + 8), and its tiles of 64 in a block of 64 and more (70: 64 + 6),
 * on a last group of 5 rows and a row range that starts and ends inside
 * groups; with 8-bit X rows, VNNI's tiles of 16, 32 and 64 over a last
 * group that the call's rows do not fill (9, 13, 27, 45, 56); every kernel,
 * plain and packed rows, equal to the scalar plain product bit for bit. */
TEST(quant_act_packed_tiles_match_the_scalar_product_at_every_row_count) {
    const char *was = llm_quant_kernels(); /* put back after: KVCACHE_SIMD's choice */
    test_rng r = {37};
    static const int types[] = {LLM_TYPE_Q4_K, LLM_TYPE_Q4_0, LLM_TYPE_Q8_0, LLM_TYPE_Q4_1, LLM_TYPE_Q6_K, LLM_TYPE_Q5_0};
    static const int64_t ms[] = {2, 3, 9, 13, 27, 45, 56, 70};
    for (int ti = 0; ti < 6; ti++)
        for (int mi = 0; mi < 8; mi++)
            for (int bits = 8; bits <= 16; bits += 8) {
                const int type = types[ti];
                const int64_t n = llm_type_block_elems(type) == 256 ? 768 : 224, rows = 13, m = ms[mi];
                problem p;
                llm_quant_select("scalar");
                make_problem(&p, &r, type, rows, n, m, bits);
                float *Y0 = product(&p), *Y1 = malloc((size_t)(m * rows) * sizeof *Y1);
                void *P = packed_of(&p);
                CHECK((P != NULL) == packed_type(type));
                for (int ki = 0; ki < N_KERNELS; ki++) {
                    if (select_kernels(ki) != 0) continue;
                    /* X quantized by these kernels (with the lanes they read laid out once), and
                     * by the scalar ones (none: the product lays them out itself) */
                    act_buf own;
                    CHECK(quantize(&own, p.X, m, n, bits) == 0);
                    for (int pk = 0; pk < 4; pk++) {
                        if (pk % 2 && !P) continue;
                        const llm_act *a = pk < 2 ? &own.a : &p.ab.a;
                        memset(Y1, 0xff, (size_t)(m * rows) * sizeof *Y1);
                        llm_matmul_act(type, p.W, pk % 2 ? P : NULL, n, 0, 3, a, Y1, rows);
                        llm_matmul_act(type, p.W, pk % 2 ? P : NULL, n, 3, 10, a, Y1, rows);
                        llm_matmul_act(type, p.W, pk % 2 ? P : NULL, n, 10, rows, a, Y1, rows);
                        if (memcmp(Y0, Y1, (size_t)(m * rows) * sizeof *Y0) != 0)
                            test_fail(__FILE__, __LINE__, "%s (%s, %s rows, X by %s, bits %d, m %lld) differs from scalar",
                                      llm_type_name(type), kernels[ki], pk % 2 ? "packed" : "plain",
                                      pk < 2 ? "them" : "scalar", bits, (long long)m);
                    }
                    free(own.buf);
                }
                free(P), free(Y0), free(Y1);
                free_problem(&p);
            }
    llm_quant_select(was);
}

/* llm_act_rows: a block of X rows taken apart (a product's rows from a
 * block of 64 on, as the engine's gate and up run them) gives those rows of
 * the whole product bit for bit, on every kernel: with the lanes of the
 * whole (16-bit, from a group of 16 on), and too few rows for lanes (6).
 * The integer widths against the scalar kernels' whole product, f32 (whose
 * kernels differ in their last bits) against the same kernels'. */
TEST(quant_act_row_blocks_give_those_rows_of_the_whole_product) {
    const char *was = llm_quant_kernels(); /* put back after: KVCACHE_SIMD's choice */
    test_rng r = {38};
    static const int64_t cut[][2] = {{0, 64}, {64, 128}, {128, 150}, {64, 70}};
    for (int bits = 0; bits <= 16; bits += 8)
        for (int pk = 0; pk < 2; pk++) {
            const int type = pk ? LLM_TYPE_Q4_0 : LLM_TYPE_Q6_K;
            const int64_t n = 512, rows = 16, m = 150;
            problem p;
            llm_quant_select("scalar");
            make_problem(&p, &r, type, rows, n, m, bits);
            float *Y0 = product(&p), *Y1 = malloc((size_t)(m * rows) * sizeof *Y1);
            void *P = pk ? packed_of(&p) : NULL;
            for (int ki = 0; ki < N_KERNELS; ki++) {
                if (select_kernels(ki) != 0) continue;
                act_buf own;
                CHECK(quantize(&own, p.X, m, n, bits) == 0);
                if (bits == LLM_ACT_F32) llm_matmul_act(type, p.W, P, n, 0, rows, &own.a, Y0, rows);
                for (int c = 0; c < 4; c++) {
                    const llm_act rows_of = llm_act_rows(&own.a, cut[c][0], cut[c][1]);
                    CHECK(rows_of.m == cut[c][1] - cut[c][0]);
                    memset(Y1, 0xff, (size_t)(m * rows) * sizeof *Y1);
                    llm_matmul_act(type, p.W, P, n, 0, rows, &rows_of, Y1 + cut[c][0] * rows, rows);
                    if (memcmp(Y0 + cut[c][0] * rows, Y1 + cut[c][0] * rows,
                               (size_t)(rows_of.m * rows) * sizeof *Y0) != 0)
                        test_fail(__FILE__, __LINE__, "%s (%s, bits %d): X rows %lld..%lld differ from the whole",
                                  llm_type_name(type), kernels[ki], bits, (long long)cut[c][0],
                                  (long long)cut[c][1]);
                }
                free(own.buf);
            }
            free(P), free(Y0), free(Y1);
            free_problem(&p);
        }
    llm_quant_select(was);
}

/* The packed form: which types have it, its size, the padding of a last
 * group, and bad arguments (nothing written). */
TEST(quant_act_packing_covers_the_32_element_formats_q4_k_q5_k_and_q6_k_and_refuses_bad_shapes) {
    test_rng r = {36};
    static const int packed[] = {LLM_TYPE_Q4_0, LLM_TYPE_Q4_1, LLM_TYPE_Q5_0, LLM_TYPE_Q8_0,
                                 LLM_TYPE_Q4_K, LLM_TYPE_Q5_K, LLM_TYPE_Q6_K};
    static const int plain[] = {LLM_TYPE_F32, LLM_TYPE_F16, LLM_TYPE_BF16, LLM_TYPE_Q5_1, LLM_TYPE_Q3_K};
    for (int i = 0; i < 5; i++) CHECK(llm_packed_bytes(plain[i], 8, 256) == 0);
    for (int i = 0; i < 7; i++) {
        int type = packed[i];
        int64_t n = llm_type_block_elems(type) == 256 ? 768 : 96, rows = 11, rb = llm_row_bytes(type, n);
        CHECK(llm_packed_bytes(type, rows, n) == 16 * rb);   /* 2 groups of 8 */
        CHECK(llm_packed_bytes(type, 8, n) == 8 * rb);
        CHECK(llm_packed_bytes(type, 0, n) == 0 && llm_packed_bytes(type, 8, 33) == 0);
        CHECK(llm_packed_bytes(type, INT64_MAX / 4, n) == 0);
        uint8_t *W = malloc((size_t)(rows * rb)), *P = malloc((size_t)(16 * rb));
        for (int64_t j = 0; j < rows; j++) random_row(&r, type, n, W + j * rb);
        memset(P, 0x5a, (size_t)(16 * rb));
        CHECK(llm_pack_rows(type, W, rows, 33, P) == -1 && llm_pack_rows(type, NULL, rows, n, P) == -1);
        CHECK(llm_pack_rows(LLM_TYPE_Q3_K, W, rows, 256, P) == -1);
        CHECK(P[0] == 0x5a && P[16 * rb - 1] == 0x5a);
        CHECK(llm_pack_rows(type, W, rows, n, P) == 0);
        /* the same bits, moved (whole halves and quants: nibbles or bytes; Q4_K's 6-bit scales and
         * mins; Q5_K's and Q6_K's quants split in 4 and 1 or 2 bits), and the 5 padding rows zero */
        uint64_t sw = 0, sp = 0;
        for (int64_t k = 0; k < rows * rb; k++) sw += (uint64_t)__builtin_popcount(W[k]);
        for (int64_t k = 0; k < 16 * rb; k++) sp += (uint64_t)__builtin_popcount(P[k]);
        CHECK(sw == sp);
        /* 70 X rows: two blocks of the packed path's 64, each against every group */
        {
            problem q;
            make_problem(&q, &r, type, 11, n, 70, LLM_ACT_Q16);
            float *Y0 = product(&q), *Y1 = malloc((size_t)(q.m * q.rows) * sizeof *Y1);
            void *Q = packed_of(&q);
            llm_matmul_act(type, q.W, Q, n, 0, q.rows, &q.ab.a, Y1, q.rows);
            CHECK(memcmp(Y0, Y1, (size_t)(q.m * q.rows) * sizeof *Y0) == 0);
            free(Y0), free(Y1), free(Q);
            free_problem(&q);
        }
        /* the padding rows' products are not written; the real rows' equal the plain ones */
        float x[768], y0[11], y1[11];
        for (int k = 0; k < n; k++) x[k] = (float)test_rng_normal(&r);
        act_buf ab;
        CHECK(quantize(&ab, x, 1, n, LLM_ACT_Q16) == 0);
        llm_matmul_act(type, W, NULL, n, 0, rows, &ab.a, y0, rows);
        llm_matmul_act(type, W, P, n, 0, rows, &ab.a, y1, rows);
        CHECK(memcmp(y0, y1, sizeof y0) == 0);
        free(ab.buf), free(W), free(P);
    }
}

/* 8-bit quants stored as int16 (llm_act_quantize_as, as the engine stores
 * them for many rows where the kernels have no 8-bit tiles) are the same
 * values, and every kernel's products of them, plain and packed, are the
 * 8-bit products' bits and within the f64 oracle's 8-bit bound. */
TEST(quant_act_8_bit_quants_stored_as_int16_give_the_8_bit_products) {
    const char *was = llm_quant_kernels(); /* put back after: KVCACHE_SIMD's choice */
    test_rng r = {38};
    for (int ti = 0; ti < N_INT8; ti++) {
        const int type = int8_types[ti];
        const int64_t n = llm_type_block_elems(type) == 32 ? 32 * 13 : 256 * 2, m = 40, rows = 16;
        problem p;
        llm_quant_select("scalar");
        make_problem(&p, &r, type, rows, n, m, 8);
        float *Y0 = product(&p), *Y = malloc((size_t)(m * rows) * sizeof *Y);
        void *P = packed_of(&p);
        for (int ki = 0; ki < N_KERNELS; ki++) {
            if (select_kernels(ki) != 0) continue;
            act_buf w;
            size_t bytes = llm_act_bytes(m, n);
            w.buf = malloc(bytes);
            CHECK(llm_act_quantize_as(&w.a, p.X, m, n, 8, 16, w.buf, bytes) == 0);
            CHECK_EQ_INT(w.a.bits, 16);
            for (int64_t i = 0; i < m * n; i++)
                if (quant_at(&w.a, i) != quant_at(&p.ab.a, i)) {
                    test_fail(__FILE__, __LINE__, "%s: quant %lld differs", kernels[ki], (long long)i);
                    break;
                }
            for (int pk = 0; pk < 1 + (P != NULL); pk++) {
                llm_matmul_act(type, p.W, pk ? P : NULL, n, 0, rows, &w.a, Y, rows);
                if (memcmp(Y, Y0, (size_t)(m * rows) * sizeof *Y))
                    test_fail(__FILE__, __LINE__, "%s %s%s: int16-stored 8-bit quants, another product",
                              llm_type_name(type), kernels[ki], pk ? " packed" : "");
                check_against_oracle(type, 8, p.W, p.rb, rows, p.X, m, n, Y, rows);
            }
            free(w.buf);
        }
        free(P), free(Y), free(Y0);
        free_problem(&p);
    }
    /* the engine's choice: 8-bit rows as int16 past a few rows on the SIMD kernels without 8-bit tiles */
    for (int ki = 0; ki < N_KERNELS; ki++) {
        if (select_kernels(ki) != 0) continue;
        const int widen = !strcmp(kernels[ki], "avx2") || !strcmp(kernels[ki], "avx512");
        CHECK_EQ_INT(llm_act_store_bits(8, 64), widen ? 16 : 8);
        CHECK_EQ_INT(llm_act_store_bits(8, LLM_ACT_FEW_ROWS), 8);
        CHECK_EQ_INT(llm_act_store_bits(16, 64), 16);
        CHECK_EQ_INT(llm_act_store_bits(0, 64), 0);
    }
    llm_quant_select(was);
    /* int8 storage of 16-bit quants, or storage of other widths: refused */
    float x[64] = {0};
    char buf[4096];
    llm_act e;
    CHECK(llm_act_quantize_as(&e, x, 1, 64, 16, 8, buf, sizeof buf) != 0);
    CHECK(llm_act_quantize_as(&e, x, 1, 64, 8, 12, buf, sizeof buf) != 0);
    CHECK(llm_act_quantize_as(&e, x, 1, 64, 8, 8, buf, sizeof buf) == 0 && e.bits == 8);
}

TEST(quant_act_exact_mode_and_float_weights_take_the_f32_product) {
    test_rng r = {34};
    static const int types[] = {LLM_TYPE_F32, LLM_TYPE_F16, LLM_TYPE_BF16, LLM_TYPE_Q4_1, LLM_TYPE_Q6_K};
    for (int ti = 0; ti < 5; ti++) {
        int type = types[ti];
        int64_t n = 512, rows = 10, m = 3, rb = llm_row_bytes(type, n);
        uint8_t *W = malloc((size_t)(rb * rows));
        for (int64_t i = 0; i < rows; i++) random_row(&r, type, n, W + i * rb);
        float *X = random_x(&r, m, n);
        float *Y0 = malloc((size_t)(m * rows) * sizeof *Y0), *Y1 = malloc((size_t)(m * rows) * sizeof *Y1);
        llm_matmul_rows(type, W, n, 0, rows, X, m, Y0, rows);
        act_buf ab;
        CHECK(quantize(&ab, X, m, n, llm_type_int8(type) ? LLM_ACT_F32 : LLM_ACT_Q8) == 0);
        llm_matmul_act(type, W, NULL, n, 0, rows, &ab.a, Y1, rows);
        CHECK(memcmp(Y0, Y1, (size_t)(m * rows) * sizeof *Y0) == 0);
        CHECK_EQ_INT(llm_type_int8(type), type == LLM_TYPE_Q4_1 || type == LLM_TYPE_Q6_K);
        free(ab.buf); free(W); free(X); free(Y0); free(Y1);
    }
}

/* A NaN or infinite activation makes the products that read its block NaN
 * or infinite, as the f32 path does, never an undefined float-to-int cast. */
TEST(quant_act_nan_and_inf_inputs_give_non_finite_products) {
    const char *was = llm_quant_kernels(); /* put back after: KVCACHE_SIMD's choice */
    test_rng r = {35};
    int64_t n = 64, rows = 3, rb = llm_row_bytes(LLM_TYPE_Q8_0, n);
    uint8_t *W = malloc((size_t)(rb * rows));
    for (int64_t i = 0; i < rows; i++) random_row(&r, LLM_TYPE_Q8_0, n, W + i * rb);
    for (int bits = 8; bits <= 16; bits += 8)
        for (int k = 0; k < 2; k++) {
            float x[64], y[3];
            for (int i = 0; i < 64; i++) x[i] = (float)test_rng_normal(&r);
            x[40] = k ? INFINITY : NAN;
            act_buf ab;
            CHECK(quantize(&ab, x, 1, n, bits) == 0);
            llm_matmul_act(LLM_TYPE_Q8_0, W, NULL, n, 0, rows, &ab.a, y, rows);
            for (int i = 0; i < 3; i++) CHECK(!isfinite(y[i]));
            uint8_t P[8 * 68];   /* one packed group */
            CHECK(llm_pack_rows(LLM_TYPE_Q8_0, W, rows, n, P) == 0);
            for (int ki = 0; ki < N_KERNELS; ki++) {
                if (select_kernels(ki) != 0) continue;
                llm_matmul_act(LLM_TYPE_Q8_0, W, P, n, 0, rows, &ab.a, y, rows);
                for (int i = 0; i < 3; i++) CHECK(!isfinite(y[i]));
            }
            llm_quant_select(was);
            free(ab.buf);
        }
    free(W);
}
