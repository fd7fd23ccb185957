/* tests/test_shift.c - moving cached keys: kv_seq_rerotate against rotating
 * the raw keys at p + delta with the oracle's RoPE (both layouts, partial
 * rotation, Llama 3.1 scaling, every storage type, bounds derived from each
 * format), and kv_seq_shift (drop [n_keep, n_keep + n_discard), renumber the
 * rest) against the oracle's keys at their new positions and its attention,
 * in full and window caches, with forks, the prefix cache and a full pool. */
#include <string.h>

#include "helpers.h"

enum { L = 2, HKV = 2, D = 64 };

static const kv_dtype DTYPES[] = {KV_F64, KV_F32, KV_F16, KV_BF16, KV_Q8};

static kv_rope rope_of(const ref_rope_cfg *c) {
    kv_rope_params p = {.head_dim = D, .rot_dim = c->rot_dim, .theta = c->theta,
                        .layout = c->interleaved ? KV_ROPE_INTERLEAVED : KV_ROPE_NEOX,
                        .scaling = c->llama3 ? KV_ROPE_SCALING_LLAMA3 : KV_ROPE_SCALING_NONE,
                        .factor = c->factor, .low_freq_factor = c->low, .high_freq_factor = c->high,
                        .original_context = c->original_context};
    kv_rope r;
    CHECK_EQ_INT(kv_rope_init(&r, &p), KV_OK);
    return r;
}

/* The three rotations under test: split halves over all of d; adjacent
 * pairs over part of d; Llama 3.1 scaling (small original context so that
 * all three bands of the scaling occur at d = 64). */
static const ref_rope_cfg CFGS[] = {
    {.rot_dim = D, .interleaved = 0, .theta = 10000},
    {.rot_dim = 48, .interleaved = 1, .theta = 10000},
    {.rot_dim = D, .interleaved = 1, .theta = 500000, .llama3 = 1, .factor = 8, .low = 1, .high = 4,
     .original_context = 64},
};

/* Raw (unrotated) keys and values of a sequence: [L][S][HKV][D]. */
typedef struct {
    int S;
    double *k, *v;
} raw_kv;

static double *at(double *a, int S, int l, int pos) { return a + ((size_t)l * S + pos) * HKV * D; }

static raw_kv raw_new(test_rng *r, int S) {
    return (raw_kv){S, rand_normal(r, (size_t)L * S * HKV * D, 1), rand_normal(r, (size_t)L * S * HKV * D, 1)};
}

static void raw_free(raw_kv *x) { free(x->k), free(x->v); }

/* raw K of (layer, position) rotated by the oracle at `at_pos`: [HKV][D] */
static void ref_key(const ref_rope_cfg *c, raw_kv *x, int l, int pos, int at_pos, double *out) {
    memcpy(out, at(x->k, x->S, l, pos), sizeof(double) * HKV * D);
    ref_rope(c, out, 1, HKV, D, &at_pos);
}

static kv_cache *new_cache(kv_dtype t, int32_t P, int32_t n_pages, int32_t window, int32_t max_seqs) {
    kv_cache_params p = kv_cache_default_params();
    p.n_layers = L, p.n_kv_heads = HKV, p.head_dim = D, p.dtype = t, p.page_size = P, p.n_pages = n_pages;
    p.window = window, p.max_seqs = max_seqs;
    kv_cache *c = NULL;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    return c;
}

/* Reserves and writes positions [from, to) of seq: raw keys rotated at their
 * position by the oracle, raw values, tokens 1000 + position. */
static void write_positions(kv_cache *c, int32_t seq, const ref_rope_cfg *cfg, raw_kv *x, int from, int to) {
    kv_dtype t = kv_cache_get_params(c).dtype;
    int n = to - from;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) tok[i] = 1000 + from + i;
    CHECK_EQ_INT(kv_seq_reserve(c, seq, n, tok), KV_OK);
    double *k = malloc(sizeof(double) * (size_t)n * HKV * D), *v = malloc(sizeof(double) * (size_t)n * HKV * D);
    int32_t rows[2];
    kv_batch b = one_seq(&seq, rows, n);
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < n; i++) {
            ref_key(cfg, x, l, from + i, from + i, k + (size_t)i * HKV * D);
            memcpy(v + (size_t)i * HKV * D, at(x->v, x->S, l, from + i), sizeof(double) * HKV * D);
        }
        if (t == KV_F64) {
            CHECK_EQ_INT(kv_append_f64(c, l, &b, k, v), KV_OK);
        } else {
            float *kf = to_f32(k, (size_t)n * HKV * D), *vf = to_f32(v, (size_t)n * HKV * D);
            CHECK_EQ_INT(kv_append_f32(c, l, &b, kf, vf), KV_OK);
            free(kf), free(vf);
        }
    }
    free(k), free(v), free(tok);
}

/* Cached K and V of one position of one layer, as doubles: [HKV][D] each. */
static int read_pos(const kv_cache *c, int32_t seq, int l, int pos, double *k, double *v) {
    if (kv_cache_get_params(c).dtype == KV_F64) return kv_read_f64(c, l, seq, pos, 1, k, v);
    float kf[HKV * D], vf[HKV * D];
    int rc = kv_read_f32(c, l, seq, pos, 1, kf, vf);
    for (int i = 0; i < HKV * D; i++) k[i] = kf[i], v[i] = vf[i];
    return rc;
}

/* Largest per-element error the format allows for a key re-rotated once,
 * against the exact rotation of the raw key (row = the exact key, [D]).
 * Derivation: the stored key is y + e1 (append's rounding), the turn is
 * exact in double up to ~1e-15, re-encoding adds e2. A rotation keeps the
 * norm of each pair, so the turned e1 is at most |e1|'s pair norm.
 *   f64: only the angles' rounding (the oracle adds the angles, the cache
 *        composes them): ~1e-13 at these positions; 1e-10 of the pair norm.
 *   f32, f16, bf16 with unit roundoff u (2^-24, 2^-11, 2^-8): |e1_i| <= u |y_i|
 *        <= u |pair|, |e2_i| <= u (|y_i| + u |pair|): about 2u |pair| (f16
 *        adds 2^-25 absolute for its subnormals).
 *   q8: |e1_i| <= amax/254 <= M/254 (M: the row's largest pair norm, or
 *        largest unrotated element), turned: sqrt 2 M/254 per element; the
 *        new row's amax <= M (1 + sqrt 2/254), so |e2_i| <= that / 254. */
static double key_bound(kv_dtype t, const ref_rope_cfg *c, const double *row, int i) {
    int r = c->rot_dim, half = r / 2;
    int pair = i < r ? (c->interleaved ? i / 2 : i % half) : -1;
    int a = pair < 0 ? i : c->interleaved ? 2 * pair : pair, b = pair < 0 ? i : c->interleaved ? 2 * pair + 1 : pair + half;
    double pn = pair < 0 ? fabs(row[i]) : sqrt(row[a] * row[a] + row[b] * row[b]);
    double M = 0;
    for (int k = 0; k < half; k++) {
        int x = c->interleaved ? 2 * k : k, y = c->interleaved ? 2 * k + 1 : k + half;
        M = fmax(M, sqrt(row[x] * row[x] + row[y] * row[y]));
    }
    for (int k = r; k < D; k++) M = fmax(M, fabs(row[k]));
    switch (t) {
    case KV_F64: return 1e-10 * pn + 1e-14;
    case KV_F32: return (2 * 0x1p-24 + 1e-12) * pn * 1.01;
    case KV_F16: return 2 * 0x1p-11 * pn * 1.01 + 0x1p-24;
    case KV_BF16: return 2 * 0x1p-8 * pn * 1.01;
    case KV_Q8: return ((sqrt(2) + 1 + sqrt(2) / 254) / 254 * 1.01 + 1e-6) * M;
    }
    return 0;
}

/* Checks every cached key of seq at positions [from, to) against the raw
 * key of position pos + src_shift rotated at pos + rot_shift; returns the
 * largest error over its bound (<= 1 passes). */
static double check_keys_at(const kv_cache *c, int32_t seq, const ref_rope_cfg *cfg, raw_kv *x, int from, int to,
                            int src_shift, int rot_shift, const char *what) {
    kv_dtype t = kv_cache_get_params(c).dtype;
    double worst = 0, k[HKV * D], v[HKV * D], want[HKV * D];
    for (int l = 0; l < L; l++)
        for (int pos = from; pos < to; pos++) {
            CHECK_EQ_INT(read_pos(c, seq, l, pos, k, v), KV_OK);
            ref_key(cfg, x, l, pos + src_shift, pos + rot_shift, want);
            for (int h = 0; h < HKV; h++)
                for (int i = 0; i < D; i++) {
                    double bound = key_bound(t, cfg, want + h * D, i);
                    worst = fmax(worst, fabs(k[h * D + i] - want[h * D + i]) / bound);
                }
        }
    if (!(worst <= 1))
        test_fail(__FILE__, __LINE__, "%s, %s, rot %d%s%s: key error %.3g x its bound", what, kv_dtype_name(t),
                  cfg->rot_dim, cfg->interleaved ? " interleaved" : " neox", cfg->llama3 ? " llama3" : "", worst);
    return worst;
}

static double check_keys(const kv_cache *c, int32_t seq, const ref_rope_cfg *cfg, raw_kv *x, int from, int to,
                         int src_shift, const char *what) {
    return check_keys_at(c, seq, cfg, x, from, to, src_shift, 0, what);
}

TEST(shift_rerotating_cached_k_by_delta_equals_rotating_the_raw_keys_at_p_plus_delta) {
    test_rng r = {140};
    const int S = 37, deltas[] = {5, -3, 1000, -30};
    for (size_t ci = 0; ci < sizeof CFGS / sizeof CFGS[0]; ci++)
        for (size_t ti = 0; ti < sizeof DTYPES / sizeof DTYPES[0]; ti++)
            for (size_t di = 0; di < sizeof deltas / sizeof deltas[0]; di++) {
                const ref_rope_cfg *cfg = &CFGS[ci];
                kv_rope rope = rope_of(cfg);
                kv_cache *c = new_cache(DTYPES[ti], 5, 16, 0, 1);
                int32_t seq;
                CHECK_EQ_INT(kv_seq_new(c, &seq), KV_OK);
                raw_kv x = raw_new(&r, S);
                write_positions(c, seq, cfg, &x, 0, S);
                double v_before[L][HKV * D], k_low[L][HKV * D], scratch[HKV * D];
                for (int l = 0; l < L; l++) {
                    CHECK_EQ_INT(read_pos(c, seq, l, 30, scratch, v_before[l]), KV_OK);
                    CHECK_EQ_INT(read_pos(c, seq, l, 2, k_low[l], scratch), KV_OK);
                }
                /* positions 3..32 turned by delta: key at p is the raw key rotated at p + delta */
                int d = deltas[di], pos = 3, n = 30;
                CHECK_EQ_INT(kv_seq_rerotate(c, seq, pos, n, d, &rope), KV_OK);
                check_keys_at(c, seq, cfg, &x, pos, pos + n, 0, d, "rerotate (in place)");
                /* the test can fail: the keys moved far more than the bound */
                double k[HKV * D], v[HKV * D], unmoved[HKV * D];
                CHECK_EQ_INT(read_pos(c, seq, 0, pos + 1, k, v), KV_OK);
                ref_key(cfg, &x, 0, pos + 1, pos + 1, unmoved);
                CHECK(ref_max_diff(k, unmoved, HKV * D) > 0.05);
                /* values and the keys outside the range are untouched, bit for bit */
                for (int l = 0; l < L; l++) {
                    CHECK_EQ_INT(read_pos(c, seq, l, 30, k, v), KV_OK);
                    CHECK(memcmp(v, v_before[l], sizeof v) == 0);
                    CHECK_EQ_INT(read_pos(c, seq, l, 2, k, v), KV_OK);
                    CHECK(memcmp(k, k_low[l], sizeof k) == 0);
                }
                check_keys(c, seq, cfg, &x, pos + n, S, 0, "after the range");
                raw_free(&x);
                kv_cache_free(c);
            }
}

TEST(shift_rerotate_refuses_bad_arguments_and_changes_nothing) {
    kv_cache *c = new_cache(KV_F32, 4, 8, 0, 2);
    kv_rope rope = rope_of(&CFGS[0]), wrong;
    kv_rope_params wp = kv_rope_default_params(32);
    CHECK_EQ_INT(kv_rope_init(&wrong, &wp), KV_OK);
    int32_t seq;
    CHECK_EQ_INT(kv_seq_new(c, &seq), KV_OK);
    test_rng r = {141};
    raw_kv x = raw_new(&r, 10);
    write_positions(c, seq, &CFGS[0], &x, 0, 10);
    CHECK_EQ_INT(kv_seq_rerotate(NULL, seq, 0, 1, 1, &rope), KV_ERR_NULL);
    CHECK_EQ_INT(kv_seq_rerotate(c, seq, 0, 1, 1, NULL), KV_ERR_NULL);
    CHECK_EQ_INT(kv_seq_rerotate(c, 1, 0, 1, 1, &rope), KV_ERR_SEQ);
    CHECK_EQ_INT(kv_seq_rerotate(c, seq, 0, 1, 1, &wrong), KV_ERR_ROPE);
    CHECK_EQ_INT(kv_seq_rerotate(c, seq, 5, 6, 1, &rope), KV_ERR_LENGTH);
    CHECK_EQ_INT(kv_seq_rerotate(c, seq, -1, 2, 1, &rope), KV_ERR_LENGTH);
    CHECK_EQ_INT(kv_seq_shift(c, seq, 4, 7, &rope), KV_ERR_LENGTH);
    CHECK_EQ_INT(kv_seq_shift(c, seq, -1, 2, &rope), KV_ERR_LENGTH);
    CHECK_EQ_INT(kv_seq_shift(c, seq, 1, 2, &wrong), KV_ERR_ROPE);
    CHECK_EQ_INT(kv_seq_shift(c, 1, 1, 2, &rope), KV_ERR_SEQ);
    CHECK_EQ_INT(kv_seq_length(c, seq), 10);
    check_keys(c, seq, &CFGS[0], &x, 0, 10, 0, "after refused calls"); /* never re-rotated: within bound */
    raw_free(&x);
    kv_cache_free(c);
}

static bool same_stats(const kv_cache_stats *a, const kv_cache_stats *b) {
    return a->pages_used == b->pages_used && a->pages_free == b->pages_free && a->pages_cached == b->pages_cached &&
           a->pages_shared == b->pages_shared && a->pages_named == b->pages_named && a->seqs == b->seqs;
}

/* After kv_seq_shift(n_keep, n_discard): the sinks as they were, position q
 * >= n_keep holds the raw key of q + n_discard rotated at q and its value. */
static void check_shifted(const kv_cache *c, int32_t seq, const ref_rope_cfg *cfg, raw_kv *x, int n_keep,
                          int n_discard, int first_visible) {
    int new_len = x->S - n_discard;
    CHECK_EQ_INT(kv_seq_length(c, seq), new_len);
    int lo = first_visible > n_keep ? first_visible : n_keep;
    if (first_visible < n_keep) check_keys(c, seq, cfg, x, first_visible, n_keep, 0, "sinks");
    check_keys(c, seq, cfg, x, lo, new_len, n_discard, "moved keys");
    double k[HKV * D], v[HKV * D];
    float kf[HKV * D], vf[HKV * D];
    for (int l = 0; l < L; l++)
        for (int q = lo; q < new_len; q++) {
            CHECK_EQ_INT(read_pos(c, seq, l, q, k, v), KV_OK);
            const double *want = at(x->v, x->S, l, q + n_discard);
            for (int i = 0; i < HKV * D; i++) vf[i] = (float)want[i];
            if (kv_cache_get_params(c).dtype == KV_F64) {
                CHECK(memcmp(v, want, sizeof v) == 0);
            } else if (kv_cache_get_params(c).dtype == KV_F32) {
                for (int i = 0; i < HKV * D; i++) kf[i] = (float)v[i];
                CHECK(memcmp(kf, vf, sizeof kf) == 0);
            } else {
                CHECK(ref_max_diff(v, want, HKV * D) < 0.05); /* stored once, never re-encoded */
            }
        }
}

/* The sequence goes on after a shift: one new key at its length, and one
 * query there attends (f64) exactly as the oracle over the keys it sees
 * (the last W, or all), each the raw key of its source position rotated at
 * its new one, then the new key. */
static void check_next_query(kv_cache *c, int32_t seq, const ref_rope_cfg *cfg, raw_kv *x, int n_keep,
                             int n_discard, test_rng *r) {
    const int W = kv_cache_get_params(c).window, pos = kv_seq_length(c, seq);
    const int first = W > 0 && pos - W + 1 > 0 ? pos - W + 1 : 0, n = pos - first + 1;
    int32_t rows[2];
    kv_batch b = one_seq(&seq, rows, 1);
    CHECK_EQ_INT(kv_seq_reserve(c, seq, 1, NULL), KV_OK);
    raw_kv y = raw_new(r, 1);
    double *q = rand_normal(r, HKV * D, 1), out[HKV * D], want[HKV * D];
    double *kk = malloc(sizeof(double) * (size_t)n * HKV * D), *vv = malloc(sizeof(double) * (size_t)n * HKV * D);
    for (int l = 0; l < L; l++) {
        double *kn = kk + (size_t)(n - 1) * HKV * D, *vn = vv + (size_t)(n - 1) * HKV * D;
        memcpy(kn, at(y.k, 1, l, 0), sizeof(double) * HKV * D);
        memcpy(vn, at(y.v, 1, l, 0), sizeof(double) * HKV * D);
        ref_rope(cfg, kn, 1, HKV, D, &pos);
        CHECK_EQ_INT(kv_append_f64(c, l, &b, kn, vn), KV_OK);
        CHECK_EQ_INT(kv_attend_f64(c, l, &b, HKV, q, out, 0), KV_OK);
        for (int j = 0; j < n - 1; j++) {
            int p = first + j, src = p < n_keep ? p : p + n_discard;
            ref_key(cfg, x, l, src, p, kk + (size_t)j * HKV * D);
            memcpy(vv + (size_t)j * HKV * D, at(x->v, x->S, l, src), sizeof(double) * HKV * D);
        }
        ref_attention(1, n, HKV, HKV, D, q, kk, vv, want, 0, 0, 0);
        CHECK(ref_max_diff(out, want, HKV * D) < 1e-10);
    }
    free(kk), free(vv), free(q);
    raw_free(&y);
}

TEST(shift_drops_a_run_and_renumbers_later_positions_in_a_full_cache) {
    test_rng r = {142};
    /* mid-page and page-aligned sinks and holes; the first and the last page touched */
    const int cases[][3] = {{4, 10, 5}, {7, 13, 5}, {0, 9, 4}, {8, 8, 4}, {3, 30, 16}, {5, 1, 5}};
    for (size_t ci = 0; ci < sizeof CFGS / sizeof CFGS[0]; ci++)
        for (size_t ti = 0; ti < sizeof DTYPES / sizeof DTYPES[0]; ti++)
            for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
                const int n_keep = cases[k][0], n_discard = cases[k][1], P = cases[k][2], S = 41;
                const ref_rope_cfg *cfg = &CFGS[ci];
                kv_rope rope = rope_of(cfg);
                kv_cache *c = new_cache(DTYPES[ti], P, 64, 0, 1);
                int32_t seq;
                CHECK_EQ_INT(kv_seq_new(c, &seq), KV_OK);
                raw_kv x = raw_new(&r, S);
                write_positions(c, seq, cfg, &x, 0, S);
                CHECK_EQ_INT(kv_seq_shift(c, seq, n_keep, n_discard, &rope), KV_OK);
                check_shifted(c, seq, cfg, &x, n_keep, n_discard, 0);
                /* the pages of the dropped positions went back to the pool */
                kv_cache_stats st = kv_cache_get_stats(c);
                CHECK_EQ_INT(st.pages_used, (S - n_discard + P - 1) / P);
                if (DTYPES[ti] == KV_F64) check_next_query(c, seq, cfg, &x, n_keep, n_discard, &r);
                raw_free(&x);
                kv_cache_free(c);
            }
}

TEST(shift_copies_shared_pages_leaves_a_fork_as_it_was_and_never_names_moved_pages) {
    test_rng r = {143};
    const ref_rope_cfg *cfg = &CFGS[1];
    kv_rope rope = rope_of(cfg);
    const int S = 40, P = 4;
    kv_cache *c = new_cache(KV_F32, P, 40, 0, 3);
    int32_t parent, child;
    CHECK_EQ_INT(kv_seq_new(c, &parent), KV_OK);
    raw_kv x = raw_new(&r, S);
    write_positions(c, parent, cfg, &x, 0, S);
    CHECK_EQ_INT(kv_seq_fork(c, parent, &child), KV_OK);
    /* 10 pages shared; the child's shift writes blocks 1..7 (positions 6..29):
     * 7 copies, from a pool of 30 free pages */
    CHECK_EQ_INT(kv_seq_shift(c, child, 6, 10, &rope), KV_OK);
    check_shifted(c, child, cfg, &x, 6, 10, 0);
    check_keys(c, parent, cfg, &x, 0, S, 0, "the parent after its fork shifted");
    CHECK_EQ_INT(kv_seq_length(c, parent), S);
    kv_cache_stats st = kv_cache_get_stats(c);
    CHECK_EQ_INT(st.pages_shared, 1); /* block 0 only */
    CHECK_EQ_INT(st.pages_used, 10 + 7);

    /* the prefix cache finds the parent's pages but none the shift wrote */
    CHECK_EQ_INT(kv_seq_remove(c, child), KV_OK);
    int32_t probe, matched = -1, tok[S];
    for (int i = 0; i < S; i++) tok[i] = 1000 + i;
    CHECK_EQ_INT(kv_seq_remove(c, parent), KV_OK); /* its pages named, now cached */
    CHECK_EQ_INT(kv_seq_new(c, &probe), KV_OK);
    CHECK_EQ_INT(kv_seq_prefix_match(c, probe, tok, S, &matched), KV_OK);
    CHECK_EQ_INT(matched, S); /* the parent's own keys, never shifted */
    check_keys(c, probe, cfg, &x, 0, S, 0, "a prefix hit on the parent's pages");
    /* shift the hit itself: its pages are shared with the prefix cache's names */
    CHECK_EQ_INT(kv_seq_shift(c, probe, 4, 8, &rope), KV_OK);
    check_shifted(c, probe, cfg, &x, 4, 8, 0);
    CHECK_EQ_INT(kv_seq_remove(c, probe), KV_OK);
    int32_t probe2;
    CHECK_EQ_INT(kv_seq_new(c, &probe2), KV_OK);
    int32_t moved[S];
    for (int i = 0; i < S - 8; i++) moved[i] = i < 4 ? 1000 + i : 1000 + i + 8;
    CHECK_EQ_INT(kv_seq_prefix_match(c, probe2, moved, S - 8, &matched), KV_OK);
    CHECK_EQ_INT(matched, 4); /* block 0 (the sinks) only: the shifted keys are not a fresh pass */
    raw_free(&x);
    kv_cache_free(c);
}

TEST(shift_out_of_pages_for_its_copies_changes_nothing) {
    test_rng r = {144};
    const ref_rope_cfg *cfg = &CFGS[0];
    kv_rope rope = rope_of(cfg);
    kv_cache *c = new_cache(KV_F16, 4, 12, 0, 2);
    int32_t parent, child;
    CHECK_EQ_INT(kv_seq_new(c, &parent), KV_OK);
    raw_kv x = raw_new(&r, 40);
    write_positions(c, parent, cfg, &x, 0, 40); /* all 10 pages, 2 free */
    CHECK_EQ_INT(kv_seq_fork(c, parent, &child), KV_OK);
    kv_cache_stats before = kv_cache_get_stats(c);
    CHECK_EQ_INT(kv_seq_shift(c, child, 2, 4, &rope), KV_ERR_OUT_OF_PAGES); /* 9 copies needed */
    CHECK_EQ_INT(kv_seq_rerotate(c, child, 0, 40, 3, &rope), KV_ERR_OUT_OF_PAGES);
    kv_cache_stats after = kv_cache_get_stats(c);
    CHECK(same_stats(&before, &after));
    CHECK_EQ_INT(kv_seq_length(c, child), 40);
    check_keys(c, child, cfg, &x, 0, 40, 0, "the child after a refused shift");
    /* the parent gone, the child owns every page: the same shift needs none */
    CHECK_EQ_INT(kv_seq_remove(c, parent), KV_OK);
    CHECK_EQ_INT(kv_seq_shift(c, child, 2, 4, &rope), KV_OK);
    check_shifted(c, child, cfg, &x, 2, 4, 0);
    raw_free(&x);
    kv_cache_free(c);
}

TEST(shift_in_a_window_cache_keeps_what_the_next_query_sees) {
    test_rng r = {145};
    const int W = 12, P = 4;
    for (size_t ci = 0; ci < sizeof CFGS / sizeof CFGS[0]; ci++)
        for (size_t ti = 0; ti < sizeof DTYPES / sizeof DTYPES[0]; ti++) {
            const ref_rope_cfg *cfg = &CFGS[ci];
            kv_rope rope = rope_of(cfg);
            kv_cache *c = new_cache(DTYPES[ti], P, 8, W, 1);
            int32_t seq;
            CHECK_EQ_INT(kv_seq_new(c, &seq), KV_OK);
            const int S = 50;
            raw_kv x = raw_new(&r, S);
            for (int p = 0; p < S; p += 5) write_positions(c, seq, cfg, &x, p, p + 5); /* evicts as it goes */
            /* the sinks (0..3) were evicted long ago; 10 dropped, the rest renumbered */
            CHECK_EQ_INT(kv_seq_shift(c, seq, 4, 10, &rope), KV_OK);
            int new_len = S - 10, first_visible = new_len - W + 1;
            check_shifted(c, seq, cfg, &x, 4, 10, first_visible);
            if (DTYPES[ti] == KV_F64) check_next_query(c, seq, cfg, &x, 4, 10, &r);
            raw_free(&x);
            kv_cache_free(c);
        }
    /* sinks still present but the next query would see below them: refused */
    kv_rope rope = rope_of(&CFGS[0]);
    kv_cache *c = new_cache(KV_F32, P, 16, W, 1);
    int32_t seq;
    CHECK_EQ_INT(kv_seq_new(c, &seq), KV_OK);
    raw_kv x = raw_new(&r, 20);
    for (int p = 0; p < 20; p++) write_positions(c, seq, &CFGS[0], &x, p, p + 1); /* evicts 0..7 */
    kv_cache_stats before = kv_cache_get_stats(c);
    CHECK_EQ_INT(kv_seq_shift(c, seq, 10, 6, &rope), KV_ERR_WINDOW); /* next query at 14 sees from 3 */
    kv_cache_stats after = kv_cache_get_stats(c);
    CHECK(same_stats(&before, &after));
    CHECK_EQ_INT(kv_seq_length(c, seq), 20);
    check_keys(c, seq, &CFGS[0], &x, 8, 20, 0, "after a refused window shift");
    /* dropping one keeps the window whole (the next query, at 19, sees from
     * 8): sinks 8..9 stay in place */
    CHECK_EQ_INT(kv_seq_shift(c, seq, 10, 1, &rope), KV_OK);
    check_shifted(c, seq, &CFGS[0], &x, 10, 1, 8);
    raw_free(&x);
    kv_cache_free(c);
}
