/* tests/test_rope.c - rotary embeddings: both layouts against the oracle,
 * keys cached at absolute positions, chunked prefill + decode = one pass. */
#include <string.h>

#include "helpers.h"

static kv_rope_params params_from(const ref_rope_cfg *c, int d) {
    return (kv_rope_params){.head_dim = d, .rot_dim = c->rot_dim, .theta = c->theta,
                            .layout = c->interleaved ? KV_ROPE_INTERLEAVED : KV_ROPE_NEOX,
                            .scaling = c->llama3 ? KV_ROPE_SCALING_LLAMA3 : KV_ROPE_SCALING_NONE,
                            .factor = c->factor, .low_freq_factor = c->low,
                            .high_freq_factor = c->high, .original_context = c->original_context};
}

TEST(rope_both_layouts_partial_and_llama3_match_oracle) {
    test_rng r = {10};
    for (int it = 0; it < 200; it++) {
        int d = 2 * test_rng_int(&r, 1, 64), heads = test_rng_int(&r, 1, 4), n = test_rng_int(&r, 1, 6);
        ref_rope_cfg c = {.rot_dim = 2 * test_rng_int(&r, 1, d / 2), .interleaved = test_rng_int(&r, 0, 1),
                          .theta = test_rng_int(&r, 0, 1) ? 10000 : 500000, .llama3 = test_rng_int(&r, 0, 1),
                          .factor = 8, .low = 1, .high = 4, .original_context = 8192};
        kv_rope rope;
        kv_rope_params p = params_from(&c, d);
        CHECK_EQ_INT(kv_rope_init(&rope, &p), KV_OK);
        int pos[6];
        int32_t pos32[6];
        for (int t = 0; t < n; t++) pos32[t] = pos[t] = test_rng_int(&r, 0, 200000);
        double *x = rand_normal(&r, n * heads * d, 1), *y = malloc(sizeof(double) * n * heads * d);
        memcpy(y, x, sizeof(double) * n * heads * d);
        CHECK_EQ_INT(kv_rope_apply_f64(&rope, x, n, heads, pos32), KV_OK);
        ref_rope(&c, y, n, heads, d, pos);
        CHECK(ref_max_diff(x, y, n * heads * d) < 1e-9); /* angles up to 2e5 rad */
        free(x), free(y);
    }
}

TEST(rope_llama31_frequencies_are_scaled_at_long_wavelengths_only) {
    kv_rope_params p = {.head_dim = 128, .rot_dim = 128, .theta = 500000, .layout = KV_ROPE_INTERLEAVED,
                        .scaling = KV_ROPE_SCALING_LLAMA3, .factor = 8, .low_freq_factor = 1,
                        .high_freq_factor = 4, .original_context = 8192};
    kv_rope rope;
    CHECK_EQ_INT(kv_rope_init(&rope, &p), KV_OK);
    CHECK_NEAR(rope.inv_freq[0], 1.0, 0);                                  /* wavelength 2 pi: kept */
    CHECK_NEAR(rope.inv_freq[63], pow(500000, -126.0 / 128) / 8, 1e-18);  /* longest: slowed 8x */
    p.scaling = KV_ROPE_SCALING_NONE;
    kv_rope plain;
    CHECK_EQ_INT(kv_rope_init(&plain, &p), KV_OK);
    int scaled = 0;
    for (int k = 0; k < 64; k++) scaled += rope.inv_freq[k] < plain.inv_freq[k];
    CHECK(scaled > 0 && scaled < 64);
}

TEST(rope_f32_at_large_positions_keeps_the_angle) {
    /* angles are taken in double: at position 10^6 an f32 angle would be off by ~0.06 rad */
    ref_rope_cfg c = {.theta = 10000, .interleaved = 1};
    kv_rope rope;
    kv_rope_params p = params_from(&c, 64);
    CHECK_EQ_INT(kv_rope_init(&rope, &p), KV_OK);
    test_rng r = {11};
    double *x = rand_normal(&r, 64, 1);
    float xf[64];
    for (int i = 0; i < 64; i++) xf[i] = (float)x[i];
    round_f32(x, 64);
    int pos = 1000003;
    int32_t pos32 = pos;
    CHECK_EQ_INT(kv_rope_apply_f32(&rope, xf, 1, 1, &pos32), KV_OK);
    ref_rope(&c, x, 1, 1, 64, &pos);
    for (int i = 0; i < 64; i++) CHECK_NEAR(xf[i], x[i], 1e-5);
    free(x);
}

TEST(rope_key_cached_at_position_p_was_rotated_by_p) {
    enum { H = 4, Hkv = 2, d = 32, D = 24, N = 11 };
    test_rng r = {12};
    double *wq = rand_normal(&r, D * H * d, 0.2), *wk = rand_normal(&r, D * Hkv * d, 0.2);
    double *wv = rand_normal(&r, D * Hkv * d, 0.2), *x = rand_normal(&r, N * D, 1);
    ref_rope_cfg c = {.theta = 10000, .interleaved = 1};
    kv_rope rope;
    kv_rope_params rp = params_from(&c, d);
    CHECK_EQ_INT(kv_rope_init(&rope, &rp), KV_OK);
    kv_cache_params p = kv_cache_default_params();
    p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = KV_F64, p.page_size = 4;
    kv_cache *cache;
    int32_t s;
    CHECK_EQ_INT(kv_cache_create(&p, &cache), KV_OK);
    CHECK_EQ_INT(kv_seq_new(cache, &s), KV_OK);
    kv_layer L = {.dim = D, .n_heads = H, .wq = wq, .wk = wk, .wv = wv, .rope = &rope};
    double out[N * H * d], full[N * H * d];
    /* chunks 3, 4, then decode */
    CHECK_EQ_INT(step_seq_f64(cache, s, &L, 3, x, out), KV_OK);
    CHECK_EQ_INT(step_seq_f64(cache, s, &L, 4, x + 3 * D, out + 3 * H * d), KV_OK);
    for (int i = 7; i < N; i++) CHECK_EQ_INT(step_seq_f64(cache, s, &L, 1, x + i * D, out + i * H * d), KV_OK);
    ref_forward(N, D, H, Hkv, d, x, wq, wk, wv, &c, 0, full, NULL, NULL, NULL);
    CHECK(ref_max_diff(out, full, N * H * d) < 1e-12);

    double k[Hkv * d], v[Hkv * d], expect[Hkv * d], local[Hkv * d];
    for (int p9 = 0; p9 < N; p9++) {
        CHECK_EQ_INT(kv_read_f64(cache, 0, s, p9, 1, k, v), KV_OK);
        ref_matmul(x + p9 * D, wk, expect, 1, D, Hkv * d);
        memcpy(local, expect, sizeof local);
        ref_rope(&c, expect, 1, Hkv, d, &p9);
        CHECK(ref_max_diff(k, expect, Hkv * d) < 1e-12);
        int zero = 0; /* the decode-only bug: rotating by the local index */
        ref_rope(&c, local, 1, Hkv, d, &zero);
        if (p9 >= 7) CHECK(ref_max_diff(k, local, Hkv * d) > 1e-3);
    }
    kv_cache_free(cache);
    free(wq), free(wk), free(wv), free(x);
}

TEST(rope_rejects_bad_parameters) {
    kv_rope rope;
    kv_rope_params p = kv_rope_default_params(64);
    CHECK_EQ_INT(kv_rope_init(NULL, &p), KV_ERR_NULL);
    p.rot_dim = 63;
    CHECK_EQ_INT(kv_rope_init(&rope, &p), KV_ERR_ROPE);
    p = kv_rope_default_params(64);
    p.rot_dim = 66;
    CHECK_EQ_INT(kv_rope_init(&rope, &p), KV_ERR_ROPE);
    p = kv_rope_default_params(64);
    p.theta = 0;
    CHECK_EQ_INT(kv_rope_init(&rope, &p), KV_ERR_ROPE);
    p = kv_rope_default_params(KV_MAX_HEAD_DIM + 2);
    CHECK_EQ_INT(kv_rope_init(&rope, &p), KV_ERR_ROPE);
    p = kv_rope_default_params(64);
    p.scaling = KV_ROPE_SCALING_LLAMA3; /* factors missing */
    CHECK_EQ_INT(kv_rope_init(&rope, &p), KV_ERR_ROPE);
    p = kv_rope_default_params(64);
    CHECK_EQ_INT(kv_rope_init(&rope, &p), KV_OK);
    float x[64] = {0};
    int32_t neg = -1;
    CHECK_EQ_INT(kv_rope_apply_f32(&rope, x, 1, 1, &neg), KV_ERR_LENGTH);
}
