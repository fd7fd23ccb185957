/* tests/test_storage.c - K/V storage types: what goes into the cache comes
 * back rounded exactly as the format says (f16 checked against rounding done in
 * double arithmetic, bf16 against a round-to-nearest-even written here, q8 within half
 * a quantization step). */
#include <float.h>
#include <stdint.h>
#include <string.h>

#include "helpers.h"

/* Round-trips n values through a 1-head, head_dim-n cache of `dtype`. */
static void roundtrip(kv_dtype dtype, const float *in, float *out, int n) {
    kv_cache_params p = kv_cache_default_params();
    p.head_dim = n, p.dtype = dtype;
    kv_cache *c;
    int32_t s, rows[2];
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, s, 1, NULL), KV_OK);
    kv_batch b = one_seq(&s, rows, 1);
    CHECK_EQ_INT(kv_append_f32(c, 0, &b, in, in), KV_OK);
    float v[KV_MAX_HEAD_DIM];
    CHECK_EQ_INT(kv_read_f32(c, 0, s, 0, 1, out, v), KV_OK);
    CHECK(memcmp(out, v, sizeof(float) * n) == 0);
    kv_cache_free(c);
}

static float random_float(test_rng *r) {
    /* every exponent: normals, subnormals, overflow to inf in f16 */
    double mant = test_rng_uniform(r);
    int e = test_rng_int(r, -30, 20);
    return (float)ldexp(mant, e);
}

/* IEEE binary16 rounding done in double arithmetic: the quantum at |x| is
 * 2^(e - 10) for normal numbers (|x| in [2^e, 2^(e+1))) and 2^-24 below 2^-14;
 * nearbyint rounds half to even. */
static float ref_f16(float x) {
    if (isnan(x)) return x;
    double a = fabs((double)x);
    if (a >= 65520.0) return copysignf(INFINITY, x);
    int e;
    frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
    double quantum = a < 0x1p-14 ? 0x1p-24 : ldexp(1.0, e - 1 - 10);
    return (float)copysign(nearbyint(a / quantum) * quantum, x);
}

TEST(storage_f16_rounds_to_nearest_even) {
    test_rng r = {40};
    enum { n = 256 };
    float in[n], out[n];
    for (int it = 0; it < 200; it++) {
        for (int i = 0; i < n; i++) in[i] = random_float(&r);
        if (it == 0) in[0] = 65504.0f, in[1] = 65520.0f, in[2] = -0.0f, in[3] = 0x1p-24f, in[4] = 0x1p-25f;
        roundtrip(KV_F16, in, out, n);
        for (int i = 0; i < n; i++) {
            float expect = ref_f16(in[i]);
            if (memcmp(&expect, &out[i], 4) != 0)
                test_fail(__FILE__, __LINE__, "f16(%a) = %a, expected %a", in[i], out[i], expect);
        }
    }
}

static float ref_bf16(float x) {
    /* the two bf16 neighbours of x, and the nearer one (ties: even mantissa) */
    uint32_t bits;
    memcpy(&bits, &x, 4);
    uint32_t lo = bits & 0xffff0000u, hi = lo + 0x10000u;
    float flo, fhi;
    memcpy(&flo, &lo, 4);
    memcpy(&fhi, &hi, 4);
    double dlo = fabs((double)x - flo), dhi = fabs((double)fhi - x);
    if (dlo < dhi) return flo;
    if (dhi < dlo) return fhi;
    return (lo >> 16) & 1 ? fhi : flo;
}

TEST(storage_bf16_rounds_to_nearest_even) {
    test_rng r = {41};
    enum { n = 256 };
    float in[n], out[n];
    for (int it = 0; it < 200; it++) {
        for (int i = 0; i < n; i++) in[i] = random_float(&r);
        in[0] = 1.00390625f; /* 1 + 2^-8: a tie, rounds to the even 1.0 */
        roundtrip(KV_BF16, in, out, n);
        for (int i = 0; i < n; i++) {
            float expect = ref_bf16(in[i]);
            if (memcmp(&expect, &out[i], 4) != 0)
                test_fail(__FILE__, __LINE__, "bf16(%a) = %a, expected %a", in[i], out[i], expect);
        }
    }
}

TEST(storage_q8_is_within_half_a_step_of_the_row_max) {
    test_rng r = {42};
    enum { n = 128 };
    float in[n], out[n];
    for (int it = 0; it < 200; it++) {
        double amax = 0;
        for (int i = 0; i < n; i++) in[i] = (float)(test_rng_normal(&r) * ldexp(1, test_rng_int(&r, -10, 10)));
        for (int i = 0; i < n; i++) amax = fmax(amax, fabs(in[i]));
        roundtrip(KV_Q8, in, out, n);
        double step = amax / 127, worst = 0;
        for (int i = 0; i < n; i++) worst = fmax(worst, fabs(out[i] - in[i]));
        CHECK(worst <= step * 0.5 * (1 + 1e-5));
        CHECK(worst > 0); /* it really is quantized */
    }
    float zero[n] = {0};
    roundtrip(KV_Q8, zero, out, n); /* an all-zero row: scale 0, no division by it */
    for (int i = 0; i < n; i++) CHECK(out[i] == 0);
}

/* Each type's size as include/kvcache.h documents it, in bits and bytes, and
 * a cache's bytes per token and per page of 16 from them: 2 x layers x heads
 * x (row + the f32 scale of KV_Q8). */
TEST(storage_types_report_their_bits_and_bytes) {
    static const struct {
        kv_dtype t;
        int bits, scales;
    } want[] = {{KV_F64, 64, 0}, {KV_F32, 32, 0}, {KV_F16, 16, 0}, {KV_BF16, 16, 0}, {KV_Q8, 8, 1}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK_EQ_INT(kv_dtype_bits(want[i].t), want[i].bits);
        CHECK_EQ_INT(kv_dtype_size(want[i].t), want[i].bits / 8);
        kv_cache_params p = kv_cache_default_params();
        p.n_layers = 3, p.n_kv_heads = 2, p.head_dim = 40, p.page_size = 16, p.dtype = want[i].t;
        kv_cache *c;
        CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
        const kv_cache_stats st = kv_cache_get_stats(c);
        const int per_token = 2 * 3 * 2 * (40 * want[i].bits / 8 + 4 * want[i].scales);
        CHECK_EQ_INT(st.bytes_per_token, per_token);
        CHECK_EQ_INT(st.bytes_per_page, 16 * per_token);
        kv_cache_free(c);
    }
    CHECK_EQ_INT(kv_dtype_bits((kv_dtype)5), 0);
    CHECK_EQ_INT(kv_dtype_bits((kv_dtype)-1), 0);
    CHECK_EQ_INT(kv_dtype_size((kv_dtype)5), 0);
}
