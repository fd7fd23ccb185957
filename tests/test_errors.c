/* tests/test_errors.c - every bad argument gets its status code, and a failed
 * call leaves the cache exactly as it was (compared byte for byte). */
#include <string.h>

#include "helpers.h"
#include "snapshot.h"

enum { H = 4, Hkv = 2, d = 8, D = 6 };

/* A cache of 2 sequences, 6 pages of 4, holding 5 tokens in sequence 0. */
static kv_cache *filled_cache(kv_dtype dtype, int32_t *s0, double *w) {
    kv_cache_params p = kv_cache_default_params();
    p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = dtype, p.page_size = 4, p.n_pages = 6;
    p.max_seqs = 2, p.max_seq_len = 20;
    kv_cache *c;
    kv_cache_create(&p, &c);
    kv_seq_new(c, s0);
    test_rng r = {30};
    for (int i = 0; i < D * H * d; i++) w[i] = test_rng_normal(&r) * 0.3;
    double x[5 * D], out[5 * H * d];
    for (int i = 0; i < 5 * D; i++) x[i] = test_rng_normal(&r);
    kv_layer L = {.dim = D, .n_heads = H, .wq = w, .wk = w, .wv = w};
    step_seq_f64(c, *s0, &L, 5, x, out);
    return c;
}

TEST(errors_bad_create_parameters) {
    kv_cache *c = NULL;
    kv_cache_params p = kv_cache_default_params();
    CHECK_EQ_INT(kv_cache_create(NULL, &c), KV_ERR_NULL);
    CHECK_EQ_INT(kv_cache_create(&p, NULL), KV_ERR_NULL);
    p.head_dim = 0;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_ERR_SHAPE);
    p = kv_cache_default_params(), p.head_dim = KV_MAX_HEAD_DIM + 1;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_ERR_SHAPE);
    p = kv_cache_default_params(), p.n_pages = -1;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_ERR_SHAPE);
    p = kv_cache_default_params(), p.window = -1;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_ERR_WINDOW);
    p = kv_cache_default_params(), p.dtype = (kv_dtype)99;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_ERR_DTYPE);
    CHECK(c == NULL);
    kv_dtype t;
    CHECK_EQ_INT(kv_dtype_parse("f8", &t), KV_ERR_DTYPE);
    CHECK_EQ_INT(kv_dtype_parse("bf16", &t), KV_OK);
    CHECK_EQ_INT(t, KV_BF16);
}

TEST(errors_every_code_has_a_distinct_message) {
    for (int a = KV_ERR_DUPLICATE; a <= 0; a++) {
        CHECK(strlen(kv_status_str(a)) > 0);
        CHECK(strcmp(kv_status_str(a), "unknown status") != 0);
        for (int b = KV_ERR_DUPLICATE; b < a; b++) CHECK(strcmp(kv_status_str(a), kv_status_str(b)) != 0);
    }
}

TEST(errors_dense_attention_arguments) {
    double q[H * d] = {0}, kv[8 * Hkv * d] = {0}, out[H * d];
    CHECK_EQ_INT(kv_attention_f64(1, 8, 3, 2, d, q, kv, kv, out, 0, 0), KV_ERR_HEADS);
    CHECK_EQ_INT(kv_attention_f64(2, 1, H, Hkv, d, q, kv, kv, out, 0, 0), KV_ERR_LENGTH);
    CHECK_EQ_INT(kv_attention_f64(1, 8, H, Hkv, 0, q, kv, kv, out, 0, 0), KV_ERR_SHAPE);
    CHECK_EQ_INT(kv_attention_f64(1, 8, H, Hkv, d, q, kv, kv, out, -1, 0), KV_ERR_WINDOW);
    CHECK_EQ_INT(kv_attention_f64(1, 8, H, Hkv, d, NULL, kv, kv, out, 0, 0), KV_ERR_NULL);
    CHECK_EQ_INT(kv_attention_f64(-1, 8, H, Hkv, d, q, kv, kv, out, 0, 0), KV_ERR_SHAPE);
}

TEST(errors_failed_calls_leave_the_cache_unchanged) {
    double w[D * H * d], big[64 * H * d] = {0}, out[64 * H * d];
    int32_t s, rows[2], other = 1, bad = 7;
    kv_cache *c = filled_cache(KV_F64, &s, w);
    kv_batch b = one_seq(&s, rows, 2);
    kv_layer L = {.dim = D, .n_heads = H, .wq = w, .wk = w, .wv = w};

    /* NULL */
    CHECK_REFUSED(c, kv_attend_f64(c, 0, &b, H, NULL, out, 0), KV_ERR_NULL);
    CHECK_REFUSED(c, kv_append_f64(c, 0, &b, NULL, big), KV_ERR_NULL);
    CHECK_REFUSED(c, kv_step_f64(c, &L, &b, big, out, NULL), KV_ERR_NULL);
    CHECK_REFUSED(c, kv_seq_fork(c, s, NULL), KV_ERR_NULL);
    /* shapes */
    CHECK_REFUSED(c, kv_attend_f64(c, 1, &b, H, big, out, 0), KV_ERR_SHAPE); /* no layer 1 */
    CHECK_REFUSED(c, kv_append_f64(c, -1, &b, big, big), KV_ERR_SHAPE);
    CHECK_REFUSED(c, kv_seq_reserve(c, s, -1, NULL), KV_ERR_SHAPE);
    int32_t backwards[2] = {0, -1};
    kv_batch bb = {.n_seqs = 1, .seqs = &s, .row_start = backwards};
    CHECK_REFUSED(c, kv_attend_f64(c, 0, &bb, H, big, out, 0), KV_ERR_SHAPE);
    /* H % Hkv */
    CHECK_REFUSED(c, kv_attend_f64(c, 0, &b, 3, big, out, 0), KV_ERR_HEADS);
    kv_layer L3 = L;
    L3.n_heads = 3;
    CHECK_REFUSED(c, kv_step_f64(c, &L3, &b, big, out, big), KV_ERR_HEADS);
    /* T > S */
    kv_batch b6 = one_seq(&s, rows, 6);
    CHECK_REFUSED(c, kv_attend_f64(c, 0, &b6, H, big, out, 0), KV_ERR_LENGTH);
    CHECK_REFUSED(c, kv_append_f64(c, 0, &b6, big, big), KV_ERR_LENGTH);
    CHECK_REFUSED(c, kv_seq_truncate(c, s, 6), KV_ERR_LENGTH);
    double k1[Hkv * d], v1[Hkv * d];
    CHECK_REFUSED(c, kv_read_f64(c, 0, s, 5, 1, k1, v1), KV_ERR_LENGTH);
    /* capacity: max_seq_len 20 */
    CHECK_REFUSED(c, kv_seq_reserve(c, s, 16, NULL), KV_ERR_CAPACITY);
    /* sequences */
    kv_batch bo = one_seq(&other, rows, 1);
    CHECK_REFUSED(c, kv_attend_f64(c, 0, &bo, H, big, out, 0), KV_ERR_SEQ);
    CHECK_REFUSED(c, kv_seq_reserve(c, bad, 1, NULL), KV_ERR_SEQ);
    CHECK_REFUSED(c, kv_seq_remove(c, -1), KV_ERR_SEQ);
    int32_t twice[2] = {s, s}, rows3[3] = {0, 1, 2};
    kv_batch bt = {.n_seqs = 2, .seqs = twice, .row_start = rows3};
    CHECK_REFUSED(c, kv_attend_f64(c, 0, &bt, H, big, out, 0), KV_ERR_DUPLICATE);
    CHECK_REFUSED(c, kv_batch_reserve(c, &bt, NULL), KV_ERR_DUPLICATE);
    CHECK_REFUSED(c, kv_append_f64(c, 0, &bt, big, big), KV_ERR_DUPLICATE);
    /* precision must match the cache */
    float f[64 * H * d] = {0}, fo[64 * H * d];
    CHECK_REFUSED(c, kv_attend_f32(c, 0, &b, H, f, fo, 0), KV_ERR_DTYPE);
    CHECK_REFUSED(c, kv_append_f32(c, 0, &b, f, f), KV_ERR_DTYPE);
    /* rope for another head_dim */
    kv_rope rope;
    kv_rope_params rp = kv_rope_default_params(2 * d);
    kv_rope_init(&rope, &rp);
    kv_layer Lr = L;
    Lr.rope = &rope;
    CHECK_REFUSED(c, kv_step_f64(c, &Lr, &b, big, out, big), KV_ERR_ROPE);

    /* out of pages: 6 pages of 4; seq 0 holds 2, a fork shares them */
    int32_t child;
    CHECK_EQ_INT(kv_seq_fork(c, s, &child), KV_OK);
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_shared, 2);
    /* writing into a shared page without reserving is refused */
    kv_batch bc = one_seq(&child, rows, 1);
    CHECK_REFUSED(c, kv_append_f64(c, 0, &bc, big, big), KV_ERR_SHARED);
    /* the child's first write copies its shared last page: 3 pages stay free */
    CHECK_EQ_INT(kv_seq_reserve(c, child, 3, NULL), KV_OK);
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_free, 3);
    CHECK_EQ_INT(kv_seq_reserve(c, child, 1, NULL), KV_OK); /* position 8 opens a third page */
    /* seq 0 needs 3 new pages for positions 5..19; 2 are free */
    CHECK_REFUSED(c, kv_seq_reserve(c, s, 15, NULL), KV_ERR_OUT_OF_PAGES);
    /* one more sequence than slots */
    int32_t third;
    CHECK_REFUSED(c, kv_seq_new(c, &third), KV_ERR_SEQ);
    kv_cache_free(c);
}

TEST(errors_out_of_pages_in_a_quantized_cache_changes_nothing) {
    double w[D * H * d];
    int32_t s;
    kv_cache *c = filled_cache(KV_F64, &s, w);
    kv_cache_free(c);
    /* the f32 path: a q8 cache refuses f64 calls and keeps its scales intact */
    kv_cache_params p = kv_cache_default_params();
    p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = KV_Q8, p.page_size = 4, p.n_pages = 2;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    float k[8 * Hkv * d], q[8 * H * d], out[8 * H * d];
    for (int i = 0; i < 8 * Hkv * d; i++) k[i] = (float)(i % 7) - 3;
    for (int i = 0; i < 8 * H * d; i++) q[i] = 0.1f * (float)(i % 5);
    int32_t rows[2];
    kv_batch b = one_seq(&s, rows, 8);
    CHECK_EQ_INT(kv_seq_reserve(c, s, 8, NULL), KV_OK);
    CHECK_EQ_INT(kv_append_f32(c, 0, &b, k, k), KV_OK);
    CHECK_REFUSED(c, kv_seq_reserve(c, s, 1, NULL), KV_ERR_CAPACITY); /* max_seq_len = 2 pages x 4 */
    CHECK_REFUSED(c, kv_attend_f64(c, 0, &b, H, (double *)q, (double *)out, 0), KV_ERR_DTYPE);
    CHECK_EQ_INT(kv_attend_f32(c, 0, &b, H, q, out, 0), KV_OK);
    kv_cache_free(c);
}

/* ------------------------------------------------------------------ price */

/* The exact price of n tokens in 128-bit arithmetic (per token it is below
 * 2^98), clamped to UINT64_MAX: the reference for saturation. */
static uint64_t price_ref(int32_t L, int32_t heads_kv, int32_t hd, kv_dtype t, uint64_t n) {
    static const unsigned size[] = {8, 4, 2, 2, 1};
    const unsigned __int128 heads = (unsigned __int128)2 * (uint64_t)L * (uint64_t)heads_kv;
    const unsigned __int128 per = heads * (uint64_t)hd * size[t] + (t == KV_Q8 ? heads * 4 : 0);
    if (n == 0) return 0;
    if (per > UINT64_MAX) return UINT64_MAX;
    const unsigned __int128 all = per * n; /* both below 2^64: fits */
    return all > UINT64_MAX ? UINT64_MAX : (uint64_t)all;
}

TEST(price_saturates_for_huge_arguments_instead_of_wrapping) {
    const int32_t big[] = {1, 1000, 65536, 1 << 20, INT32_MAX};
    const uint64_t tokens[] = {0, 1, 8192, 1ull << 40, UINT64_MAX};
    for (int t = KV_F64; t <= KV_Q8; t++)
        for (int a = 0; a < 5; a++)
            for (int b = 0; b < 5; b++)
                for (int e = 0; e < 5; e++) {
                    CHECK_EQ_INT(kv_price_per_token(big[a], big[b], big[e], (kv_dtype)t),
                                 price_ref(big[a], big[b], big[e], (kv_dtype)t, 1));
                    for (int n = 0; n < 5; n++)
                        CHECK(kv_price_tokens(big[a], big[b], big[e], (kv_dtype)t, tokens[n]) ==
                              price_ref(big[a], big[b], big[e], (kv_dtype)t, tokens[n]));
                }
    CHECK(kv_price_per_token(INT32_MAX, INT32_MAX, INT32_MAX, KV_F64) == UINT64_MAX);
}

TEST(price_llama31_8b_bf16_is_128_KiB_per_token_and_1_GiB_at_8k) {
    CHECK_EQ_INT(kv_price_per_token(32, 8, 128, KV_BF16), 131072);
    CHECK_EQ_INT(kv_price_tokens(32, 8, 128, KV_BF16, 8192), 1ull << 30);
    CHECK_EQ_INT(kv_price_per_token(30, 3, 64, KV_F16), 2 * 30 * 3 * 64 * 2); /* SmolLM2-135M */
    CHECK_EQ_INT(kv_price_per_token(32, 8, 128, KV_Q8), 2 * 32 * 8 * (128 + 4));
    CHECK_EQ_INT(kv_price_per_token(0, 8, 128, KV_F16), 0);
    CHECK_EQ_INT(kv_price_per_token(32, 8, 128, (kv_dtype)42), 0);
    CHECK(kv_price_tokens(32, 8, 128, KV_F64, UINT64_MAX / 2) == UINT64_MAX);
    /* a cache reports the same price and its pages */
    kv_cache_params p = kv_cache_default_params();
    p.n_layers = 4, p.n_kv_heads = 2, p.head_dim = 32, p.dtype = KV_F16, p.page_size = 16, p.n_pages = 10;
    kv_cache *c;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    kv_cache_stats st = kv_cache_get_stats(c);
    CHECK_EQ_INT(st.bytes_per_token, kv_price_per_token(4, 2, 32, KV_F16));
    CHECK_EQ_INT(st.bytes_per_page, st.bytes_per_token * 16);
    CHECK_EQ_INT(st.bytes_in_use, 0);
    int32_t s;
    kv_seq_new(c, &s);
    kv_seq_reserve(c, s, 17, NULL);
    st = kv_cache_get_stats(c);
    CHECK_EQ_INT(st.pages_used, 2);
    CHECK_EQ_INT(st.bytes_in_use, 2 * st.bytes_per_page);
    kv_cache_free(c);
}
