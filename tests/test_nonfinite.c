/* tests/test_nonfinite.c - the non-finite rule of include/kvcache.h on every
 * path: dense and paged, f64 and f32 calls, every SIMD variant this CPU runs,
 * every storage type, decode (with splits, with several rows, at a window's
 * edge) and prefill shapes. One NaN or infinity is planted in a key, a value
 * or a query; the outputs that see it must show it exactly as the rule says,
 * and every other output must equal the float64 oracle (tests/ref.c) run on
 * the same data with the planted element zeroed. */
#include <math.h>
#include <string.h>

#include "helpers.h"

typedef enum { K_NAN, K_PINF, K_NINF, V_NAN, V_PINF, Q_NAN, Q_INF, N_KINDS } plant_kind;
static const char *const kind_names[] = {"K NaN", "K +inf", "K -inf", "V NaN", "V +inf", "Q NaN", "Q +inf"};

typedef struct {
    int H, Hkv, d, S, T, P, W;
    int j; /* the key planted in (K and V kinds) */
} nshape;

/* decode with splits; several rows in one decode-shaped item (the last key is
 * seen by the last row only); prefill; a window's edge in a prefill tile and
 * in a decode item (the first row's oldest key is out of the others' window);
 * a head_dim that no fused kernel takes */
static const nshape shapes[] = {
    {.H = 8, .Hkv = 2, .d = 64, .S = 1100, .T = 1, .P = 16, .W = 0, .j = 600},
    {.H = 8, .Hkv = 2, .d = 64, .S = 1100, .T = 1, .P = 16, .W = 0, .j = 1099},
    {.H = 4, .Hkv = 2, .d = 64, .S = 50, .T = 3, .P = 16, .W = 0, .j = 49},
    {.H = 8, .Hkv = 2, .d = 128, .S = 40, .T = 40, .P = 16, .W = 0, .j = 20},
    {.H = 4, .Hkv = 1, .d = 128, .S = 300, .T = 4, .P = 16, .W = 37, .j = 300 - 4 - 37 + 1},
    {.H = 4, .Hkv = 1, .d = 64, .S = 300, .T = 2, .P = 16, .W = 37, .j = 300 - 2 - 37 + 1},
    {.H = 2, .Hkv = 1, .d = 80, .S = 30, .T = 30, .P = 7, .W = 0, .j = 11},
};
enum { PLANT_E = 5, PLANT_QE = 3 };

static double plant_value(plant_kind k) {
    return k == K_NAN || k == V_NAN || k == Q_NAN ? NAN : k == K_NINF ? -INFINITY : INFINITY;
}

/* q [T, H, d], k and v [S, Hkv, d], random, with the plant in place. */
static void make_data(const nshape *s, plant_kind kind, unsigned long long seed, double **q, double **k, double **v) {
    test_rng r = {seed};
    *q = rand_normal(&r, (size_t)s->T * s->H * s->d, 1);
    *k = rand_normal(&r, (size_t)s->S * s->Hkv * s->d, 1);
    *v = rand_normal(&r, (size_t)s->S * s->Hkv * s->d, 1);
    const size_t kv_at = ((size_t)s->j * s->Hkv + (size_t)(s->Hkv - 1)) * s->d + PLANT_E;
    const size_t q_at = ((size_t)(s->T - 1) * s->H) * s->d + PLANT_QE; /* last row, head 0 */
    if (kind <= K_NINF) (*k)[kv_at] = plant_value(kind);
    else if (kind <= V_PINF) (*v)[kv_at] = plant_value(kind);
    else (*q)[q_at] = plant_value(kind);
}

static double finite_or_zero(double x) { return isfinite(x) ? x : 0; }

/* Checks out [T, H, d] against the rule; kf, vf: the K/V as stored (or as
 * given, dense), [S, Hkv, d], read back from `from`. Returns failures. */
static int check_rule(const char *what, const nshape *s, plant_kind kind, bool q8, const double *q, const double *kf,
                      const double *vf, const double *out, double rel_tol, double abs_extra) {
    const int T = s->T, S = s->S, H = s->H, Hkv = s->Hkv, d = s->d, G = H / Hkv;
    const size_t nq = (size_t)T * H * d, nkv = (size_t)S * Hkv * d;
    double *qc = malloc(sizeof(double) * nq), *kc = malloc(sizeof(double) * nkv), *vc = malloc(sizeof(double) * nkv);
    double *ref = malloc(sizeof(double) * nq);
    for (size_t i = 0; i < nq; i++) qc[i] = finite_or_zero(q[i]);
    for (size_t i = 0; i < nkv; i++) kc[i] = finite_or_zero(kf[i]), vc[i] = finite_or_zero(vf[i]);
    ref_attention(T, S, H, Hkv, d, qc, kc, vc, ref, s->W, 0, 0);
    const double tol = rel_tol * fmax(ref_max_abs(ref, nq), 1e-3) + abs_extra;
    int fails = 0;
    for (int r = 0; r < T && fails < 3; r++)
        for (int h = 0; h < H && fails < 3; h++) {
            /* does output (r, h) see the plant? */
            bool hit;
            if (kind >= Q_NAN) hit = r == T - 1 && h == 0;
            else hit = h / G == Hkv - 1 && ref_visible(T, S, r, s->j, s->W);
            for (int e = 0; e < d; e++) {
                const double o = out[((size_t)r * H + h) * d + e], want = ref[((size_t)r * H + h) * d + e];
                bool ok;
                const char *expect;
                if (hit && (kind <= K_NINF || kind >= Q_NAN || q8 || e == PLANT_E)) {
                    /* a non-finite score: the whole vector NaN; q8 keeps a
                     * non-finite row as NaN; a V element stays in its element */
                    if (kind == V_PINF && !q8) ok = o == INFINITY, expect = "+inf";
                    else ok = isnan(o), expect = "NaN";
                } else {
                    ok = isfinite(o) && fabs(o - want) <= tol, expect = "the oracle's finite value";
                }
                if (!ok) {
                    test_fail(__FILE__, __LINE__, "%s, %s at key %d, H=%d Hkv=%d d=%d S=%d T=%d W=%d: out[%d][%d][%d] = %g, want %s (%g)",
                              what, kind_names[kind], s->j, H, Hkv, d, S, T, s->W, r, h, e, o, expect, want);
                    fails++;
                    break;
                }
            }
        }
    free(qc), free(kc), free(vc), free(ref);
    return fails;
}

/* The paged path: a cache of `dtype` (KV_F64: the f64 calls) filled with the
 * data, the last T rows attended, the stored K/V read back for the oracle. */
static int run_paged(kv_dtype dtype, const nshape *s, plant_kind kind, const char *simd) {
    double *q, *k, *v;
    make_data(s, kind, 900 + (unsigned long long)kind, &q, &k, &v);
    const int T = s->T, S = s->S, H = s->H, Hkv = s->Hkv, d = s->d;
    kv_cache_params p = kv_cache_default_params();
    p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = dtype, p.page_size = s->P, p.window = s->W;
    p.n_pages = S / s->P + 4;
    kv_cache *c;
    int32_t seq, rows[2];
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    CHECK_EQ_INT(kv_seq_new(c, &seq), KV_OK);
    for (int t0 = 0; t0 < S;) { /* in chunks, as decoding would: a window cache evicts as it goes */
        const int t = S - t0 < 500 ? S - t0 : 500;
        const size_t off = (size_t)t0 * Hkv * d, n = (size_t)t * Hkv * d;
        kv_batch b = one_seq(&seq, rows, t);
        CHECK_EQ_INT(kv_seq_reserve(c, seq, t, NULL), KV_OK);
        if (dtype == KV_F64) {
            CHECK_EQ_INT(kv_append_f64(c, 0, &b, k + off, v + off), KV_OK);
        } else {
            float *kf = to_f32(k + off, n), *vf = to_f32(v + off, n);
            CHECK_EQ_INT(kv_append_f32(c, 0, &b, kf, vf), KV_OK);
            free(kf), free(vf);
        }
        t0 += t;
    }
    const size_t nq = (size_t)T * H * d, nkv = (size_t)S * Hkv * d;
    double *out = malloc(sizeof(double) * nq), *ks = calloc(nkv, sizeof(double)), *vs = calloc(nkv, sizeof(double));
    kv_batch b = one_seq(&seq, rows, T);
    int from = s->W > 0 ? S - T - s->W + 1 : 0;
    if (from < 0) from = 0;
    const size_t at = (size_t)from * Hkv * d;
    if (dtype == KV_F64) {
        CHECK_EQ_INT(kv_attend_f64(c, 0, &b, H, q, out, 0), KV_OK);
        CHECK_EQ_INT(kv_read_f64(c, 0, seq, from, S - from, ks + at, vs + at), KV_OK);
    } else {
        float *qf = to_f32(q, nq), *of = malloc(sizeof(float) * nq);
        float *kr = calloc(nkv, sizeof(float)), *vr = calloc(nkv, sizeof(float));
        CHECK_EQ_INT(kv_attend_f32(c, 0, &b, H, qf, of, 0), KV_OK);
        CHECK_EQ_INT(kv_read_f32(c, 0, seq, from, S - from, kr + at, vr + at), KV_OK);
        for (size_t i = 0; i < nq; i++) out[i] = of[i], q[i] = qf[i];
        for (size_t i = 0; i < nkv; i++) ks[i] = kr[i], vs[i] = vr[i];
        free(qf), free(of), free(kr), free(vr);
    }
    char what[64];
    snprintf(what, sizeof what, "paged %s, %s kernels", kv_dtype_name(dtype), dtype == KV_F64 ? "f64" : simd);
    /* int16 queries (q8 on AVX-512) add at most q8i_output_bound */
    const double extra = int16_queries(dtype) ? q8i_output_bound(q, nq, ks, vs, nkv, d) : 0;
    int fails = check_rule(what, s, kind, dtype == KV_Q8, q, ks, vs, out, dtype == KV_F64 ? 1e-12 : 2e-5, extra);
    kv_cache_free(c);
    free(q), free(k), free(v), free(out), free(ks), free(vs);
    return fails;
}

/* The dense calls: kv_attention_f64, or kv_attention_f32 on the same data. */
static int run_dense(bool f64, const nshape *s, plant_kind kind, const char *simd) {
    double *q, *k, *v;
    make_data(s, kind, 950 + (unsigned long long)kind, &q, &k, &v);
    const size_t nq = (size_t)s->T * s->H * s->d, nkv = (size_t)s->S * s->Hkv * s->d;
    double *out = malloc(sizeof(double) * nq);
    if (f64) {
        CHECK_EQ_INT(kv_attention_f64(s->T, s->S, s->H, s->Hkv, s->d, q, k, v, out, s->W, 0), KV_OK);
    } else {
        float *qf = to_f32(q, nq), *kf = to_f32(k, nkv), *vf = to_f32(v, nkv), *of = malloc(sizeof(float) * nq);
        CHECK_EQ_INT(kv_attention_f32(s->T, s->S, s->H, s->Hkv, s->d, qf, kf, vf, of, s->W, 0), KV_OK);
        for (size_t i = 0; i < nq; i++) out[i] = of[i];
        round_f32(q, nq), round_f32(k, nkv), round_f32(v, nkv);
        free(qf), free(kf), free(vf), free(of);
    }
    char what[64];
    snprintf(what, sizeof what, "dense %s, %s kernels", f64 ? "f64" : "f32", f64 ? "f64" : simd);
    int fails = check_rule(what, s, kind, false, q, k, v, out, f64 ? 1e-12 : 2e-5, 0);
    free(q), free(k), free(v), free(out);
    return fails;
}

static const char *const simd_names[] = {"scalar", "avx2", "avx512"};
enum { N_SHAPES = sizeof shapes / sizeof shapes[0] };

TEST(nonfinite_f64_paths_follow_the_rule) {
    int runs = 0, fails = 0;
    for (int si = 0; si < N_SHAPES; si++)
        for (int kind = 0; kind < N_KINDS; kind++) {
            fails += run_paged(KV_F64, &shapes[si], (plant_kind)kind, "f64");
            fails += run_dense(true, &shapes[si], (plant_kind)kind, "f64");
            runs += 2;
        }
    printf("     %d runs, %d failing\n", runs, fails);
}

TEST(nonfinite_every_kernel_and_storage_type_follows_the_rule) {
    static const kv_dtype dtypes[] = {KV_F32, KV_F16, KV_BF16, KV_Q8};
    const char *was = kv_simd_name();
    for (int v = 0; v < 3; v++) {
        if (kv_simd_select(simd_names[v]) != KV_OK) {
            printf("     %s: not available on this CPU, not tested here\n", simd_names[v]);
            continue;
        }
        int runs = 0, fails = 0;
        for (int si = 0; si < N_SHAPES; si++)
            for (int kind = 0; kind < N_KINDS; kind++) {
                for (int t = 0; t < 4; t++) /* quick: one storage type per shape and kind, in turn */
                    if (!test_quick() || t == (si + kind) % 4)
                        fails += run_paged(dtypes[t], &shapes[si], (plant_kind)kind, simd_names[v]), runs++;
                fails += run_dense(false, &shapes[si], (plant_kind)kind, simd_names[v]);
                runs++;
            }
        printf("     %s: %d runs, %d failing\n", simd_names[v], runs, fails);
    }
    kv_simd_select(was);
}

/* ------------------------------------------------------------------ storage */

TEST(nonfinite_storage_keeps_nan_and_infinity) {
    enum { d = 32 };
    static const kv_dtype dtypes[] = {KV_F32, KV_F16, KV_BF16, KV_Q8}; /* f64 stores doubles as given */
    for (int t = 0; t < 4; t++) {
        kv_cache_params p = kv_cache_default_params();
        p.n_kv_heads = 1, p.head_dim = d, p.dtype = dtypes[t];
        kv_cache *c;
        int32_t seq, rows[2];
        CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
        CHECK_EQ_INT(kv_seq_new(c, &seq), KV_OK);
        /* rows: a NaN, a +inf, a -inf, then a finite row */
        float k[4 * d], v[4 * d], kr[4 * d], vr[4 * d];
        for (int i = 0; i < 4 * d; i++) k[i] = v[i] = (float)(i % 7) - 3.0f;
        k[0 * d + 4] = NAN, k[1 * d + 4] = INFINITY, k[2 * d + 4] = -INFINITY;
        v[0 * d + 9] = NAN, v[1 * d + 9] = INFINITY, v[2 * d + 9] = -INFINITY;
        kv_batch b = one_seq(&seq, rows, 4);
        CHECK_EQ_INT(kv_seq_reserve(c, seq, 4, NULL), KV_OK);
        CHECK_EQ_INT(kv_append_f32(c, 0, &b, k, v), KV_OK);
        CHECK_EQ_INT(kv_read_f32(c, 0, seq, 0, 4, kr, vr), KV_OK);
        for (int r = 0; r < 3; r++) {
            if (dtypes[t] == KV_Q8) { /* a non-finite row reads back all NaN: a NaN scale */
                for (int e = 0; e < d; e++) CHECK(isnan(kr[r * d + e]) && isnan(vr[r * d + e]));
                continue;
            }
            const float kw = k[r * d + 4], vw = v[r * d + 9];
            CHECK(isnan(kw) ? isnan(kr[r * d + 4]) : kr[r * d + 4] == kw);
            CHECK(isnan(vw) ? isnan(vr[r * d + 9]) : vr[r * d + 9] == vw);
        }
        for (int e = 0; e < d; e++) /* the finite row is untouched by its neighbours */
            CHECK(isfinite(kr[3 * d + e]) && fabsf(kr[3 * d + e] - k[3 * d + e]) <= 0.02f);
        kv_cache_free(c);
    }
}

/* ------------------------------------------------------------------ a step */

TEST(nonfinite_nan_in_wq_through_a_step_poisons_its_head_on_every_storage_type) {
    enum { D = 16, H = 4, Hkv = 2, d = 16, N = 5 };
    static const kv_dtype dtypes[] = {KV_F32, KV_F16, KV_BF16, KV_Q8};
    test_rng r = {960};
    double *wq = rand_normal(&r, D * H * d, 0.25), *wk = rand_normal(&r, D * Hkv * d, 0.25);
    double *wv = rand_normal(&r, D * Hkv * d, 0.25), *x = rand_normal(&r, N * D, 1);
    float *wqf = to_f32(wq, D * H * d), *wkf = to_f32(wk, D * Hkv * d), *wvf = to_f32(wv, D * Hkv * d);
    float *xf = to_f32(x, N * D);
    wqf[2 * H * d + 1 * d + 7] = NAN; /* input 2 -> head 1, element 7 */
    for (int t = 0; t < 4; t++) {
        kv_cache_params p = kv_cache_default_params();
        p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = dtypes[t];
        kv_cache *c;
        int32_t seq;
        CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
        CHECK_EQ_INT(kv_seq_new(c, &seq), KV_OK);
        kv_layer L = {.dim = D, .n_heads = H, .wq = wqf, .wk = wkf, .wv = wvf};
        float out[N * H * d];
        CHECK_EQ_INT(step_seq_f32(c, seq, &L, 3, xf, out), KV_OK);              /* prefill */
        CHECK_EQ_INT(step_seq_f32(c, seq, &L, 1, xf + 3 * D, out + 3 * H * d), KV_OK); /* decode */
        CHECK_EQ_INT(step_seq_f32(c, seq, &L, 1, xf + 4 * D, out + 4 * H * d), KV_OK);
        int wrong = 0;
        for (int i = 0; i < N; i++)
            for (int h = 0; h < H; h++)
                for (int e = 0; e < d; e++) {
                    const float o = out[(i * H + h) * d + e];
                    wrong += h == 1 ? !isnan(o) : !isfinite(o);
                }
        if (wrong) test_fail(__FILE__, __LINE__, "%s cache: %d outputs break the rule (head 1 all NaN, the rest finite)",
                             kv_dtype_name(dtypes[t]), wrong);
        kv_cache_free(c);
    }
    free(wq), free(wk), free(wv), free(x), free(wqf), free(wkf), free(wvf), free(xf);
}
