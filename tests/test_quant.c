/* tests/test_quant.c - weight block formats: decoding, dot products and the
 * row-range matrix product, on both the SIMD and the forced-scalar kernels.
 *
 * The oracle is ref_value() (quant_oracle.c): it finds each element's bits
 * from the format definition (which byte, which nibble, which scale) and
 * decodes in float64, one element at a time, sharing no code with engine/. */
#include "test.h"
#include "../engine/weights/quant.h"
#include "gguf_writer.h"
#include "quant_oracle.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* a row length that is a few blocks long (odd for the 1-element types) */
static int64_t test_len(int type) {
    int64_t be = llm_type_block_elems(type);
    return be == 1 ? 203 : be == 32 ? 7 * 32 : 3 * 256;
}

/* ------------------------------------------------------------ type table */

TEST(quant_type_table_matches_ggml_numbering_and_block_sizes) {
    struct { int type; const char *name; int elems, bytes; } want[] = {
        {0, "F32", 1, 4}, {1, "F16", 1, 2}, {30, "BF16", 1, 2}, {2, "Q4_0", 32, 18},
        {3, "Q4_1", 32, 20}, {6, "Q5_0", 32, 22}, {7, "Q5_1", 32, 24}, {8, "Q8_0", 32, 34}, {10, "Q2_K", 256, 84}, {11, "Q3_K", 256, 110},
        {12, "Q4_K", 256, 144},
        {13, "Q5_K", 256, 176}, {14, "Q6_K", 256, 210},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK(llm_type_supported(want[i].type));
        CHECK(strcmp(llm_type_name(want[i].type), want[i].name) == 0);
        CHECK_EQ_INT(llm_type_block_elems(want[i].type), want[i].elems);
        CHECK_EQ_INT(llm_type_block_bytes(want[i].type), want[i].bytes);
        CHECK_EQ_INT(llm_row_bytes(want[i].type, 4 * 256), 4 * 256 / want[i].elems * want[i].bytes);
    }
    CHECK_EQ_INT(llm_row_bytes(LLM_TYPE_Q4_1, 33), -1);
    CHECK_EQ_INT(llm_row_bytes(LLM_TYPE_Q6_K, 576), -1);
    CHECK_EQ_INT(llm_row_bytes(LLM_TYPE_F32, -1), -1);
    CHECK_EQ_INT(llm_row_bytes(99, 32), -1);
    CHECK(!llm_type_supported(16));                     /* IQ2_XXS: known name, not decoded */
    CHECK(strcmp(llm_type_name(16), "IQ2_XXS") == 0);
    CHECK(llm_type_name(4) == NULL && llm_type_name(-1) == NULL && llm_type_name(1000) == NULL);
}

TEST(quant_half_conversion_is_exact_for_every_half_and_rounds_to_nearest) {
    for (int h = 0; h < 65536; h++) {
        if (((h >> 10) & 31) == 31) continue;           /* inf and NaN checked below */
        uint8_t b[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
        float f = llm_f16_to_f32((uint16_t)h);
        if (f != (float)ref_half(b)) { CHECK(f == (float)ref_half(b)); break; }
        if (llm_f32_to_f16(f) != h && f != 0) { CHECK_EQ_INT(llm_f32_to_f16(f), h); break; }
    }
    CHECK(isinf(llm_f16_to_f32(0x7c00)) && isnan(llm_f16_to_f32(0x7e00)));
    CHECK_EQ_INT(llm_f32_to_f16(1e6f), 0x7c00);
    CHECK_EQ_INT(llm_f32_to_f16(-1e6f), 0xfc00);
    CHECK(isnan(llm_f16_to_f32(llm_f32_to_f16(NAN))));
    CHECK_EQ_INT(llm_f32_to_f16(65504.0f), 0x7bff);
    CHECK_EQ_INT(llm_f32_to_f16(65519.0f), 0x7bff);     /* below the halfway point to 2^16 */
    CHECK_EQ_INT(llm_f32_to_f16(65520.0f), 0x7c00);
    CHECK_EQ_INT(llm_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);           /* tie to even, down */
    CHECK_EQ_INT(llm_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);       /* tie to even, up */
    CHECK_EQ_INT(llm_f32_to_f16(0x1p-25f), 0);                        /* tie to even: zero */
    CHECK_EQ_INT(llm_f32_to_f16(0x1.8p-25f), 1);                      /* above half: 2^-24 */
    test_rng r = {1};
    for (int i = 0; i < 20000; i++) {   /* nearest: no neighbour of the result is closer */
        float x = (float)(test_rng_normal(&r) * ldexp(1.0, test_rng_int(&r, -26, 15)));
        uint16_t h = llm_f32_to_f16(x);
        if ((h & 0x7c00) == 0x7c00) continue;           /* overflowed to inf */
        double err = fabs(llm_f16_to_f32(h) - (double)x);
        uint16_t up = (uint16_t)(h + 1), dn = (uint16_t)(h - 1);
        if ((up & 0x7c00) != 0x7c00 && fabs(llm_f16_to_f32(up) - (double)x) < err) { CHECK(0); break; }
        if ((h & 0x7fff) && fabs(llm_f16_to_f32(dn) - (double)x) < err) { CHECK(0); break; }
    }
    CHECK(llm_bf16_to_f32(0x3f80) == 1.0f);
    CHECK_EQ_INT(llm_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);            /* tie to even, down */
    CHECK_EQ_INT(llm_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);        /* tie to even, up */
}

/* ------------------------------------------------------------ decoding */

TEST(quant_q4_0_hand_built_block_decodes_low_nibbles_first) {
    uint8_t b[18];
    put_half(b, 0.5f);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    CHECK(llm_dequant_row(LLM_TYPE_Q4_0, b, y, 32) == 0);
    for (int j = 0; j < 16; j++) {
        CHECK(y[j] == 0.5f * (j - 8));          /* element j: low nibble of byte j */
        CHECK(y[j + 16] == 0.5f * (7 - j));     /* element j+16: high nibble of byte j */
    }
}

TEST(quant_q4_1_and_q8_0_hand_built_blocks_decode_as_defined) {
    uint8_t b[20];
    put_half(b, 0.25f);
    put_half(b + 2, -1.0f);
    for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)(15 | j << 4);
    float y[32];
    CHECK(llm_dequant_row(LLM_TYPE_Q4_1, b, y, 32) == 0);
    for (int j = 0; j < 16; j++) {
        CHECK(y[j] == 0.25f * 15 - 1.0f);
        CHECK(y[j + 16] == 0.25f * j - 1.0f);
    }
    uint8_t c[34];
    put_half(c, 2.0f);
    for (int j = 0; j < 32; j++) c[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
    CHECK(llm_dequant_row(LLM_TYPE_Q8_0, c, y, 32) == 0);
    for (int j = 0; j < 32; j++) CHECK(y[j] == 2.0f * (j * 8 - 128));
}

TEST(quant_q5_0_hand_built_block_takes_fifth_bit_j_for_element_j) {
    uint8_t b[22];
    put_half(b, 0.5f);
    uint32_t qh = 0x80000001u | 0x00f0f000u;   /* elements 0, 12..15, 20..23 and 31 */
    for (int k = 0; k < 4; k++) b[2 + k] = (uint8_t)(qh >> (8 * k));
    for (int j = 0; j < 16; j++) b[6 + j] = (uint8_t)(j | (15 - j) << 4);
    for (int pass = 0; pass < 2; pass++) {
        llm_quant_force_scalar(pass);
        float y[32];
        CHECK(llm_dequant_row(LLM_TYPE_Q5_0, b, y, 32) == 0);
        for (int j = 0; j < 16; j++) {
            int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
            CHECK(y[j] == 0.5f * (float)(j + 16 * h0 - 16));            /* low nibble of byte j */
            CHECK(y[j + 16] == 0.5f * (float)(15 - j + 16 * h1 - 16));  /* high nibble of byte j */
        }
    }
    llm_quant_force_scalar(0);
}

TEST(quant_k_quant_hand_built_blocks_decode_as_defined) {
    /* Q4_K: sub-block s has scale s+1 and min 2s (6-bit, packed by hand). */
    uint8_t b[176] = {0};
    put_half(b, 1.0f);
    put_half(b + 2, 0.5f);
    int sc[8], mn[8];
    for (int s = 0; s < 8; s++) { sc[s] = s + 1 + (s >= 4 ? 40 : 0); mn[s] = 2 * s + (s >= 4 ? 33 : 0); }
    for (int j = 0; j < 4; j++) {
        b[4 + j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        b[8 + j] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        b[12 + j] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
    for (int i = 0; i < 128; i++) b[16 + i] = (uint8_t)((i % 16) | ((i + 3) % 16) << 4);
    float y[256];
    CHECK(llm_dequant_row(LLM_TYPE_Q4_K, b, y, 256) == 0);
    for (int e = 0; e < 256; e++) {
        int g = e / 64, hi = (e % 64) / 32, l = e % 32, s = 2 * g + hi;
        int q = hi ? (32 * g + l + 3) % 16 : (32 * g + l) % 16;
        CHECK_NEAR(y[e], 1.0 * sc[s] * q - 0.5 * mn[s], 1e-6);
    }
    /* Q6_K: element e = 128h + 32s + l holds q = (e * 7) % 64, scale (e/16) - 8 */
    uint8_t c[210] = {0};
    for (int e = 0; e < 256; e++) {
        int h = e / 128, s = (e % 128) / 32, l = e % 32, q = (e * 7) % 64;
        c[64 * h + l + 32 * (s & 1)] |= (uint8_t)((q & 15) << (s >= 2 ? 4 : 0));
        c[128 + 32 * h + l] |= (uint8_t)((q >> 4) << (2 * s));
    }
    for (int s = 0; s < 16; s++) c[192 + s] = (uint8_t)(int8_t)(s - 8);
    put_half(c + 208, 0.125f);
    CHECK(llm_dequant_row(LLM_TYPE_Q6_K, c, y, 256) == 0);
    for (int e = 0; e < 256; e++) CHECK_NEAR(y[e], 0.125 * (e / 16 - 8) * ((e * 7) % 64 - 32), 1e-6);
}

TEST(quant_every_type_decodes_random_blocks_like_the_f64_reference) {
    test_rng r = {2};
    for (int pass = 0; pass < 2; pass++) {
        llm_quant_force_scalar(pass);
        for (int ti = 0; ti < n_all_types; ti++) {
            int type = all_types[ti];
            int64_t n = test_len(type);
            uint8_t *row = malloc((size_t)llm_row_bytes(type, n));
            float *y = malloc((size_t)n * sizeof *y);
            for (int rep = 0; rep < 20; rep++) {
                random_row(&r, type, n, row);
                CHECK(llm_dequant_row(type, row, y, n) == 0);
                /* d*q - m may cancel: measure error against the row's scale */
                double big = 0;
                for (int64_t e = 0; e < n; e++) big = fmax(big, fabs(ref_value(type, row, e)));
                int bad = 0;
                for (int64_t e = 0; e < n && !bad; e++) {
                    double want = ref_value(type, row, e);
                    if (!(fabs(y[e] - want) <= 1e-6 * big + 1e-30)) {
                        test_fail(__FILE__, __LINE__, "%s (%s) element %lld: %.9g vs %.9g",
                                  llm_type_name(type), llm_quant_kernels(), (long long)e, y[e], want);
                        bad = 1;
                    }
                }
            }
            free(row);
            free(y);
        }
    }
    llm_quant_force_scalar(0);
}

TEST(quant_dequant_rejects_partial_blocks_and_unknown_types) {
    float y[64] = {0};
    uint8_t b[64] = {0};
    CHECK(llm_dequant_row(LLM_TYPE_Q4_0, b, y, 31) != 0);
    CHECK(llm_dequant_row(LLM_TYPE_Q6_K, b, y, 32) != 0);
    CHECK(llm_dequant_row(16, b, y, 256) != 0);         /* IQ2_XXS */
    CHECK(isnan(llm_vec_dot(LLM_TYPE_Q8_0, b, y, 33)));
}

/* ------------------------------------------------------------ dot products */

static double ref_dot(int type, const uint8_t *row, const float *x, int64_t n, double *mag) {
    double s = 0, a = 0;
    for (int64_t e = 0; e < n; e++) {
        double p = ref_value(type, row, e) * x[e];
        s += p;
        a += fabs(p);
    }
    *mag = a;
    return s;
}

TEST(quant_vec_dot_matches_f64_dot_of_the_reference_decode) {
    test_rng r = {3};
    for (int pass = 0; pass < 2; pass++) {
        llm_quant_force_scalar(pass);
        for (int ti = 0; ti < n_all_types; ti++) {
            int type = all_types[ti];
            for (int rep = 0; rep < 10; rep++) {
                /* several lengths, including ones past one decode chunk */
                int64_t be = llm_type_block_elems(type);
                int64_t n = be == 1 ? test_rng_int(&r, 1, 2100) : be * test_rng_int(&r, 1, be == 32 ? 70 : 9);
                uint8_t *row = malloc((size_t)llm_row_bytes(type, n));
                float *x = malloc((size_t)n * sizeof *x);
                random_row(&r, type, n, row);
                for (int64_t k = 0; k < n; k++) x[k] = (float)test_rng_normal(&r);
                double mag, want = ref_dot(type, row, x, n, &mag);
                float got = llm_vec_dot(type, row, x, n);
                if (!(fabs(got - want) <= 1e-5 * mag + 1e-30))
                    test_fail(__FILE__, __LINE__, "%s (%s) n=%lld: %.9g vs %.9g (sum|wx| %.3g)",
                              llm_type_name(type), llm_quant_kernels(), (long long)n, got, want, mag);
                free(row);
                free(x);
            }
        }
    }
    llm_quant_force_scalar(0);
}

/* One type, `rows` weight rows, m X rows, the range [r0, r1): Y inside the
 * range matches the reference, Y outside it keeps its sentinel. */
static void check_matmul(test_rng *r, int type, int64_t rows, int64_t n, int64_t m, int64_t r0, int64_t r1) {
    int64_t rb = llm_row_bytes(type, n), ldy = rows + 3;
    uint8_t *W = malloc((size_t)(rb * rows));
    float *X = malloc((size_t)(m * n) * sizeof *X), *Y = malloc((size_t)(m * ldy) * sizeof *Y);
    for (int64_t i = 0; i < rows; i++) random_row(r, type, n, W + i * rb);
    for (int64_t k = 0; k < m * n; k++) X[k] = (float)test_rng_uniform(r);
    for (int64_t k = 0; k < m * ldy; k++) Y[k] = -12345.0f;
    llm_matmul_rows(type, W, n, r0, r1, X, m, Y, ldy);
    int bad = 0;
    for (int64_t j = 0; j < m && !bad; j++)
        for (int64_t i = 0; i < ldy && !bad; i++) {
            float got = Y[j * ldy + i];
            if (i < r0 || i >= r1) {
                if (got != -12345.0f) {
                    test_fail(__FILE__, __LINE__, "%s: Y[%lld][%lld] outside rows [%lld,%lld) was written",
                              llm_type_name(type), (long long)j, (long long)i, (long long)r0, (long long)r1);
                    bad = 1;
                }
                continue;
            }
            double mag, want = ref_dot(type, W + i * rb, X + j * n, n, &mag);
            if (!(fabs(got - want) <= 1e-5 * mag + 1e-30)) {
                test_fail(__FILE__, __LINE__, "%s (%s) m=%lld rows [%lld,%lld): Y[%lld][%lld] %.9g vs %.9g",
                          llm_type_name(type), llm_quant_kernels(), (long long)m, (long long)r0,
                          (long long)r1, (long long)j, (long long)i, got, want);
                bad = 1;
            }
        }
    free(W);
    free(X);
    free(Y);
}

TEST(quant_matmul_rows_matches_reference_for_odd_row_ranges_and_batch_sizes) {
    test_rng r = {4};
    static const int64_t ms[] = {1, 3, 8, 13};
    static const int64_t ranges[][2] = {{0, 21}, {3, 10}, {5, 6}, {20, 21}, {1, 20}};
    for (int pass = 0; pass < 2; pass++) {
        llm_quant_force_scalar(pass);
        for (int ti = 0; ti < n_all_types; ti++)
            for (int mi = 0; mi < 4; mi++)
                for (int ri = 0; ri < 5; ri++)
                    check_matmul(&r, all_types[ti], 21, test_len(all_types[ti]), ms[mi],
                                 ranges[ri][0], ranges[ri][1]);
    }
    llm_quant_force_scalar(0);
}

TEST(quant_matmul_rows_handles_rows_longer_than_a_decode_chunk) {
    test_rng r = {5};
    for (int pass = 0; pass < 2; pass++) {
        llm_quant_force_scalar(pass);
        check_matmul(&r, LLM_TYPE_Q4_1, 9, 1536, 5, 0, 9);
        check_matmul(&r, LLM_TYPE_Q6_K, 9, 1536, 1, 0, 9);
        check_matmul(&r, LLM_TYPE_F32, 9, 2500, 70, 2, 9);  /* > one block of 64 X rows */
        check_matmul(&r, LLM_TYPE_Q8_0, 10, 2080, 2, 1, 10);
    }
    llm_quant_force_scalar(0);
}

/* Splitting rows over threads or X rows over calls must not change a bit:
 * each (row, X row) result is computed the same way in every tile. */
TEST(quant_matmul_result_is_independent_of_row_split_and_batch_size) {
    test_rng r = {6};
    for (int pass = 0; pass < 2; pass++) {
        llm_quant_force_scalar(pass);
        for (int ti = 0; ti < n_all_types; ti++) {
            int type = all_types[ti];
            int64_t rows = 19, n = test_len(type), m = 6, rb = llm_row_bytes(type, n);
            uint8_t *W = malloc((size_t)(rb * rows));
            float *X = malloc((size_t)(m * n) * sizeof *X);
            float *Y1 = malloc((size_t)(m * rows) * sizeof *Y1), *Y2 = malloc((size_t)(m * rows) * sizeof *Y2);
            for (int64_t i = 0; i < rows; i++) random_row(&r, type, n, W + i * rb);
            for (int64_t k = 0; k < m * n; k++) X[k] = (float)test_rng_normal(&r);
            llm_matmul_rows(type, W, n, 0, rows, X, m, Y1, rows);
            /* rows in uneven pieces, X rows one at a time */
            static const int64_t cut[] = {0, 1, 6, 7, 15, 19};
            for (int c = 0; c < 5; c++)
                for (int64_t j = 0; j < m; j++)
                    llm_matmul_rows(type, W, n, cut[c], cut[c + 1], X + j * n, 1, Y2 + j * rows, rows);
            CHECK(memcmp(Y1, Y2, (size_t)(m * rows) * sizeof *Y1) == 0);
            for (int64_t i = 0; i < rows; i++)
                CHECK(llm_vec_dot(type, W + i * rb, X + 2 * n, n) == Y1[2 * rows + i]);
            free(W); free(X); free(Y1); free(Y2);
        }
    }
    llm_quant_force_scalar(0);
}

TEST(quant_matmul_reads_f32_weights_at_any_byte_alignment) {
    test_rng r = {7};
    int64_t n = 37, rows = 5;
    uint8_t *raw = malloc((size_t)(4 * n * rows + 1));
    float X[37], Y[5];
    for (int k = 0; k < n; k++) X[k] = (float)test_rng_normal(&r);
    random_row(&r, LLM_TYPE_F32, n * rows, raw + 1);
    for (int pass = 0; pass < 2; pass++) {
        llm_quant_force_scalar(pass);
        llm_matmul_rows(LLM_TYPE_F32, raw + 1, n, 0, rows, X, 1, Y, rows);
        for (int i = 0; i < rows; i++) {
            double mag, want = ref_dot(LLM_TYPE_F32, raw + 1 + 4 * n * i, X, n, &mag);
            CHECK_NEAR(Y[i], want, 1e-5 * mag);
        }
    }
    llm_quant_force_scalar(0);
    free(raw);
}

TEST(quant_kernel_choice_follows_select_and_force_scalar) {
    const char *first = llm_quant_kernels();
    llm_quant_force_scalar(1);
    CHECK(strcmp(llm_quant_kernels(), "scalar") == 0);
    llm_quant_force_scalar(0);
    CHECK(strcmp(llm_quant_kernels(), first) == 0);
    CHECK(llm_quant_select("sse9") != 0 && llm_quant_select(NULL) != 0);
    CHECK(strcmp(llm_quant_kernels(), first) == 0);   /* a refused name changes nothing */
    CHECK(llm_quant_select("scalar") == 0 && strcmp(llm_quant_kernels(), "scalar") == 0);
    /* a CPU with AVX2 gets SIMD kernels in every build, portable ones too */
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        CHECK(llm_quant_select("avx2") == 0 && strcmp(llm_quant_kernels(), "avx2") == 0);
        CHECK(llm_quant_select("auto") == 0 && strcmp(llm_quant_kernels(), "scalar") != 0);
    }
    /* with VNNI, "avx512" and "auto" take it unless KVCACHE_NO_VNNI says no */
    const char *was = getenv("KVCACHE_NO_VNNI");
    char *keep = was ? strdup(was) : NULL;
    unsetenv("KVCACHE_NO_VNNI");
    if (llm_quant_select("avx512vnni") == 0) {
        CHECK(strcmp(llm_quant_kernels(), "avx512vnni") == 0);
        CHECK(llm_quant_select("avx512") == 0 && strcmp(llm_quant_kernels(), "avx512vnni") == 0);
        setenv("KVCACHE_NO_VNNI", "1", 1);
        CHECK(llm_quant_select("avx512") == 0 && strcmp(llm_quant_kernels(), "avx512") == 0);
        CHECK(llm_quant_select("auto") == 0 && strcmp(llm_quant_kernels(), "avx512") == 0);
        unsetenv("KVCACHE_NO_VNNI");
        CHECK(llm_quant_select("auto") == 0 && strcmp(llm_quant_kernels(), "avx512vnni") == 0);
    }
    if (keep) setenv("KVCACHE_NO_VNNI", keep, 1);
    free(keep);
    llm_quant_select(first);
    llm_quant_force_scalar(0);
}

/* ------------------------------------------------------------ quantizer */

TEST(quant_q8_0_quantizer_error_is_at_most_half_a_step) {
    test_rng r = {8};
    enum { N = 32 * 40 };
    float x[N];
    uint8_t q[34 * 40];
    for (int i = 0; i < N; i++) x[i] = (float)(test_rng_normal(&r) * ldexp(1.0, test_rng_int(&r, -8, 8)));
    for (int i = 0; i < 32; i++) x[i] = 0.0f;           /* an all-zero block */
    CHECK(llm_quantize_row_q8_0(x, q, N) == 0);
    for (int b = 0; b < 40; b++) {
        double amax = 0;
        for (int j = 0; j < 32; j++) amax = fmax(amax, fabs(x[32 * b + j]));
        double d = ref_half(q + 34 * b);
        CHECK_NEAR(d, amax / 127, amax / 127 * 1e-3 + 1e-30);
        for (int j = 0; j < 32; j++)
            CHECK_NEAR(ref_value(GW_Q8_0, q, 32 * b + j), x[32 * b + j], d * 0.5 * (1 + 1e-6) + 1e-30);
    }
    CHECK(llm_quantize_row_q8_0(x, q, 33) != 0);
}
