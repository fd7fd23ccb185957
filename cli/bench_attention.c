/* cli/bench_attention.c - `kvcache bench attention`: how close the attention
 * kernels come to this machine's limits, measured in one run.
 *
 *   limits   read bandwidth (our own vector read of 4 interleaved streams or 1 over
 *            a buffer far beyond the last-level cache, best of several trials)
 *            and FMA peak (a register-blocked FMA loop), same thread count
 *   decode   T = 1 over S cached keys: K/V bytes read per second, as a ratio to
 *            a read-bandwidth measurement taken right beside it (these virtual
 *            machines drift by ~20% within minutes), and as a ratio to the
 *            case's roofline min(read bandwidth, FMA peak / FLOP per K/V byte),
 *            both limits measured beside it,
 *            4 S d H FLOP (q.k and p v, 2 each per query head and key element)
 *   prefill  T = S: GFLOP/s (4 T S d H / 2 for the causal half) / the FMA
 *            peak measured beside it (the clock drifts as much as the bandwidth)
 *   cache vs recompute: a small synthetic model generating G tokens after a
 *            P-token prompt with the cache, and recomputing every step
 *   numpy    plain numpy attention (np.repeat, softmax, matmul) on the same decode
 *            case, if numpy is present */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BENCH_X86 1
#endif

#include "cli.h"
#include "kvcache.h"

typedef struct {
    int threads;
    bool quick, json;
    const char *plot;
    kv_pool *pool;
    float *buf;      /* the bandwidth buffer */
    size_t buf_len;  /* floats */
} bench;

static void usage(void) {
    printf("usage: kvcache bench attention [-t THREADS] [--quick] [--json] [--plot FILE.png]\n"
           "Measures read bandwidth and FMA peak, then decode (T=1, S=4k..512k; H32/Hkv8/d128 and\n"
           "H9/Hkv3/d64, f16 and q8 K/V) and prefill (T=S=512..8k) attention against them, cache\n"
           "vs recompute on a synthetic model, and numpy when python3 has it. --quick: tiny sizes.\n");
}

/* ------------------------------------------------------------------ limits */

typedef struct {
    const float *buf;
    size_t len;
    int32_t n_tasks;
    int streams;   /* 1 or 4 */
    float sink[256];
} read_job;

/* Reads one slice as 4 interleaved streams, as attention reads K and V, or
 * as one, as a core reads a matrix's rows (which some CPUs' prefetch feeds
 * faster: AMD's) */
static void read_task(void *ctx, int32_t task, int32_t thread) {
    read_job *j = ctx;
    size_t slice = j->len / (size_t)j->n_tasks / 64 * 64, q = slice / 4;
    const float *a = j->buf + (size_t)task * slice, *b = a + q, *c = b + q, *d = c + q;
    typedef float v16 __attribute__((vector_size(64)));
    v16 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    if (j->streams == 1)
        for (size_t i = 0; i < slice; i += 64) {
            s0 += *(const v16 *)(a + i);
            s1 += *(const v16 *)(a + i + 16);
            s2 += *(const v16 *)(a + i + 32);
            s3 += *(const v16 *)(a + i + 48);
        }
    else
        for (size_t i = 0; i < q; i += 16) {
            s0 += *(const v16 *)(a + i);
            s1 += *(const v16 *)(b + i);
            s2 += *(const v16 *)(c + i);
            s3 += *(const v16 *)(d + i);
        }
    v16 s = s0 + s1 + s2 + s3;
    j->sink[thread % 256] += s[0] + s[15];
}

double cli_read_bandwidth(kv_pool *pool, const float *buf, size_t len, int trials) {
    read_job j = {.buf = buf, .len = len, .n_tasks = 64};
    double best = 0;
    for (int t = 0; t < 2 * trials; t++) {   /* 4 streams and 1 in turn, the best of either */
        j.streams = t % 2 ? 1 : 4;
        double t0 = cli_now();
        kv_pool_run(pool, j.n_tasks, read_task, &j);
        double dt = cli_now() - t0;
        size_t bytes = len / 64 / 64 * 64 * 64 * sizeof(float);
        if (bytes / dt / 1e9 > best) best = bytes / dt / 1e9;
    }
    return best;
}

static double read_bandwidth(bench *B, int trials) { return cli_read_bandwidth(B->pool, B->buf, B->buf_len, trials); }

enum { FMA_ITERS = 1 << 22 };

/* The FMA loop at the width the attention kernels run at (kv_simd_name), so
 * that a portable build of this file still measures the machine's peak. */
#ifdef BENCH_X86
__attribute__((target("avx512f,fma"))) static void fma_avx512(float *sink, int32_t task) {
    /* twelve named accumulators: independent chains, kept in registers */
    const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
    __m512 x0 = _mm512_set1_ps(0), x1 = _mm512_set1_ps(1), x2 = _mm512_set1_ps(2), x3 = _mm512_set1_ps(3);
    __m512 x4 = _mm512_set1_ps(4), x5 = _mm512_set1_ps(5), x6 = _mm512_set1_ps(6), x7 = _mm512_set1_ps(7);
    __m512 x8 = _mm512_set1_ps(8), x9 = _mm512_set1_ps(9), x10 = _mm512_set1_ps(10), x11 = _mm512_set1_ps(11);
    for (int n = 0; n < FMA_ITERS / 16; n++) {
        x0 = _mm512_fmadd_ps(x0, a, b), x1 = _mm512_fmadd_ps(x1, a, b), x2 = _mm512_fmadd_ps(x2, a, b);
        x3 = _mm512_fmadd_ps(x3, a, b), x4 = _mm512_fmadd_ps(x4, a, b), x5 = _mm512_fmadd_ps(x5, a, b);
        x6 = _mm512_fmadd_ps(x6, a, b), x7 = _mm512_fmadd_ps(x7, a, b), x8 = _mm512_fmadd_ps(x8, a, b);
        x9 = _mm512_fmadd_ps(x9, a, b), x10 = _mm512_fmadd_ps(x10, a, b), x11 = _mm512_fmadd_ps(x11, a, b);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(x0, x1), _mm512_add_ps(x2, x3)),
                             _mm512_add_ps(_mm512_add_ps(x4, x5), _mm512_add_ps(x6, x7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(x8, x9), _mm512_add_ps(x10, x11)));
    sink[task % 64] = _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static void fma_avx2(float *sink, int32_t task) {
    const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
    __m256 x0 = _mm256_set1_ps(0), x1 = _mm256_set1_ps(1), x2 = _mm256_set1_ps(2), x3 = _mm256_set1_ps(3);
    __m256 x4 = _mm256_set1_ps(4), x5 = _mm256_set1_ps(5), x6 = _mm256_set1_ps(6), x7 = _mm256_set1_ps(7);
    __m256 x8 = _mm256_set1_ps(8), x9 = _mm256_set1_ps(9), x10 = _mm256_set1_ps(10), x11 = _mm256_set1_ps(11);
    for (int n = 0; n < FMA_ITERS / 8; n++) {
        x0 = _mm256_fmadd_ps(x0, a, b), x1 = _mm256_fmadd_ps(x1, a, b), x2 = _mm256_fmadd_ps(x2, a, b);
        x3 = _mm256_fmadd_ps(x3, a, b), x4 = _mm256_fmadd_ps(x4, a, b), x5 = _mm256_fmadd_ps(x5, a, b);
        x6 = _mm256_fmadd_ps(x6, a, b), x7 = _mm256_fmadd_ps(x7, a, b), x8 = _mm256_fmadd_ps(x8, a, b);
        x9 = _mm256_fmadd_ps(x9, a, b), x10 = _mm256_fmadd_ps(x10, a, b), x11 = _mm256_fmadd_ps(x11, a, b);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3)),
                             _mm256_add_ps(_mm256_add_ps(x4, x5), _mm256_add_ps(x6, x7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(x8, x9), _mm256_add_ps(x10, x11)));
    float t[8];
    _mm256_storeu_ps(t, s);
    sink[task % 64] = t[0];
}
#endif

static void fma_scalar(float *sink, int32_t task) {
    float x[12];
    for (int i = 0; i < 12; i++) x[i] = (float)i;
    for (int n = 0; n < FMA_ITERS; n++)
        for (int i = 0; i < 12; i++) x[i] = fmaf(x[i], 0.999f, 0.001f);
    sink[task % 64] = x[0] + x[11];
}

static void fma_task(void *ctx, int32_t task, int32_t thread) {
    const char *simd = kv_simd_name();
#ifdef BENCH_X86
    if (!strcmp(simd, "avx512")) fma_avx512(ctx, task);
    else if (!strcmp(simd, "avx2")) fma_avx2(ctx, task);
    else
#endif
        fma_scalar(ctx, task);
    (void)thread, (void)simd;
}

/* FLOPs of one fma_task: 12 chains x FMA_ITERS lanes-iterations x 2. */
static double fma_peak(bench *B) {
    float sink[64];
    double best = 0;
    int tasks = 2 * B->threads;
    for (int t = 0; t < 3; t++) {
        double t0 = cli_now();
        kv_pool_run(B->pool, tasks, fma_task, sink);
        double gf = 24.0 * FMA_ITERS * tasks / (cli_now() - t0) / 1e9;
        best = gf > best ? gf : best;
    }
    return best;
}

/* ------------------------------------------------------------------ a filled cache */

static void fill_random(float *x, size_t n, unsigned *seed) {
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        x[i] = (float)(*seed >> 8) / 16777216.0f - 0.5f;
    }
}

/* One sequence of S random positions in a 1-layer cache. */
static kv_cache *filled_cache(bench *B, int Hkv, int d, kv_dtype dtype, int64_t S, int32_t *seq) {
    kv_cache_params p = kv_cache_default_params();
    p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = dtype, p.page_size = 16;
    p.n_pages = (int32_t)(S / 16 + 1);
    kv_cache *c;
    if (kv_cache_create(&p, &c) != KV_OK) return NULL;
    kv_cache_set_pool(c, B->pool);
    kv_seq_new(c, seq);
    enum { CHUNK = 4096 };
    float *k = malloc(sizeof(float) * CHUNK * Hkv * d);
    unsigned seed = 7;
    fill_random(k, (size_t)CHUNK * Hkv * d, &seed);
    for (int64_t t0 = 0; t0 < S; t0 += CHUNK) {
        int32_t t = S - t0 < CHUNK ? (int32_t)(S - t0) : CHUNK, rows[2] = {0, t};
        kv_batch b = {.n_seqs = 1, .seqs = seq, .row_start = rows};
        kv_seq_reserve(c, *seq, t, NULL);
        k[t0 % 997] += 0.25f; /* not every chunk alike */
        kv_append_f32(c, 0, &b, k, k);
    }
    free(k);
    return c;
}

/* Best seconds per kv_attend_f32 call of T rows over the whole sequence.
 * Decode reads K/V from memory in real use (a model's cache is far larger
 * than the last-level cache), so when this cache would fit there, every call
 * is timed alone right after a read of the bandwidth buffer evicts it. */
static double time_attend(bench *B, kv_cache *c, int32_t seq, int H, int d, int32_t T, double min_seconds,
                          double *evict_gbs, double *peak_gflops) {
    int32_t rows[2] = {0, T};
    kv_batch b = {.n_seqs = 1, .seqs = &seq, .row_start = rows};
    float *q = malloc(sizeof(float) * (size_t)T * H * d), *out = malloc(sizeof(float) * (size_t)T * H * d);
    unsigned seed = 3;
    fill_random(q, (size_t)T * H * d, &seed);
    kv_attend_f32(c, 0, &b, H, q, out, 0); /* warm-up */
    const bool cold = T == 1 && kv_cache_get_stats(c).bytes_in_use < B->buf_len * sizeof(float) / 2;
    read_job evict = {.buf = B->buf, .len = B->buf_len, .n_tasks = 64};
    double best = 1e30;
    if (cold) {
        double spent = 0;
        const double evict_bytes = (double)(B->buf_len / 64 / 64 * 64 * 64 * sizeof(float));
        for (int rep = 0; rep < 200 && (rep < 5 || spent < min_seconds); rep++) {
            /* the eviction is a read-bandwidth trial too, taken between the calls
             * it is compared with: as many samples of each, at the same moments */
            double te = cli_now();
            kv_pool_run(B->pool, evict.n_tasks, read_task, &evict);
            te = cli_now() - te;
            if (evict_gbs && evict_bytes / te / 1e9 > *evict_gbs) *evict_gbs = evict_bytes / te / 1e9;
            double t0 = cli_now();
            kv_attend_f32(c, 0, &b, H, q, out, 0);
            double dt = cli_now() - t0;
            spent += dt;
            best = dt < best ? dt : best;
        }
    } else {
        for (int trial = 0; trial < 3; trial++) {
            /* the FMA peak beside each trial: the clock of a shared machine drifts */
            const double peak = peak_gflops ? fma_peak(B) : 0;
            if (peak_gflops && peak > *peak_gflops) *peak_gflops = peak;
            int reps = 0;
            double t0 = cli_now(), dt;
            do {
                kv_attend_f32(c, 0, &b, H, q, out, 0);
                reps++;
            } while ((dt = cli_now() - t0) < min_seconds / 3);
            best = dt / reps < best ? dt / reps : best;
        }
    }
    free(q), free(out);
    return best;
}

/* ------------------------------------------------------------------ cases */

typedef struct {
    int64_t S;
    int H, Hkv, d;
    kv_dtype kv;
    double gbs, ratio, read_gbs, ms, peak_gflops; /* read bandwidth and FMA peak measured beside it */
    double flop_per_byte, roofline_gbs, roofline_ratio; /* arithmetic intensity; min(read, peak / it) */
} decode_row;

typedef struct {
    int64_t T;
    double gflops, ratio, ms, peak_gflops; /* the FMA peak measured beside it */
} prefill_row;

typedef struct {
    int prompt, gen;
    double cached_s, recompute_s, speedup, flop_ratio;
    int sampled_every;
} cvr_row;

static decode_row run_decode(bench *B, int64_t S, int H, int Hkv, int d, kv_dtype kv) {
    decode_row r = {.S = S, .H = H, .Hkv = Hkv, .d = d, .kv = kv};
    int32_t seq;
    kv_cache *c = filled_cache(B, Hkv, d, kv, S, &seq);
    if (!c) return r;
    double bytes = (double)kv_price_tokens(1, Hkv, d, kv, (uint64_t)S);
    r.read_gbs = read_bandwidth(B, B->quick ? 2 : 4); /* right beside the case */
    r.peak_gflops = fma_peak(B);
    double sec = time_attend(B, c, seq, H, d, 1, B->quick ? 0.05 : 0.6, &r.read_gbs, &r.peak_gflops);
    r.peak_gflops = fmax(r.peak_gflops, fma_peak(B));
    r.ms = sec * 1e3;
    r.gbs = bytes / sec / 1e9;
    r.ratio = r.gbs / r.read_gbs;
    r.flop_per_byte = 4.0 * (double)S * d * H / bytes;
    r.roofline_gbs = fmin(r.read_gbs, r.peak_gflops / r.flop_per_byte);
    r.roofline_ratio = r.gbs / r.roofline_gbs;
    kv_cache_free(c);
    return r;
}

static prefill_row run_prefill(bench *B, int64_t T) {
    enum { H = 32, HKV = 8, D = 128 };
    prefill_row r = {.T = T};
    int32_t seq;
    kv_cache *c = filled_cache(B, HKV, D, KV_F16, T, &seq);
    if (!c) return r;
    double sec = time_attend(B, c, seq, H, D, (int32_t)T, B->quick ? 0.05 : 1.0, NULL, &r.peak_gflops);
    r.ms = sec * 1e3;
    r.gflops = 4.0 * T * T * D * H / 2 / sec / 1e9;
    r.ratio = r.gflops / r.peak_gflops;
    kv_cache_free(c);
    return r;
}

/* A synthetic model (2 layers, width 256, 4 query heads over 2 KV heads of 64):
 * cached, G decode steps after the prompt; recomputed, every step a full
 * forward over all tokens so far. Recompute steps of long runs are timed every
 * `every` steps and summed times `every`. Per-step times go to `plot`. */
static cvr_row run_cache_vs_recompute(bench *B, int P, int G, FILE *plot) {
    enum { L = 2, H = 4, HKV = 2, HD = 64, D = H * HD };
    cvr_row r = {.prompt = P, .gen = G, .sampled_every = P + G > 600 ? 25 : 1};
    kv_cache_params p = kv_cache_default_params();
    p.n_layers = L, p.n_kv_heads = HKV, p.head_dim = HD, p.dtype = KV_F16;
    p.n_pages = (P + G) / 16 + 2;
    kv_cache *c;
    if (kv_cache_create(&p, &c) != KV_OK) return r;
    kv_cache_set_pool(c, B->pool);
    kv_rope rope;
    kv_rope_params rp = kv_rope_default_params(HD);
    kv_rope_init(&rope, &rp);
    size_t wsize = (size_t)D * (H + 2 * HKV) * HD;
    float *w = malloc(sizeof(float) * wsize * L), *x = malloc(sizeof(float) * (size_t)(P + G) * D);
    float *out = malloc(sizeof(float) * (size_t)(P + G) * D), *h = malloc(sizeof(float) * (size_t)(P + G) * D);
    unsigned seed = 11;
    fill_random(w, wsize * L, &seed);
    fill_random(x, (size_t)(P + G) * D, &seed);
    kv_layer layers[L];
    for (int l = 0; l < L; l++)
        layers[l] = (kv_layer){.layer = l, .dim = D, .n_heads = H, .wq = w + wsize * l,
                               .wk = w + wsize * l + (size_t)D * H * HD, .wv = w + wsize * l + (size_t)D * (H + HKV) * HD,
                               .rope = &rope};
    float *scratch = malloc(sizeof(float) * kv_step_scratch(c, &layers[0], P + G));
    int32_t seq, rows[2] = {0, 0};
    kv_seq_new(c, &seq);
    kv_batch b = {.n_seqs = 1, .seqs = &seq, .row_start = rows};
    /* a forward of t new tokens starting at token `from` */
#define FORWARD(from, t)                                                                     \
    do {                                                                                     \
        rows[1] = (t);                                                                       \
        kv_seq_reserve(c, seq, (t), NULL);                                                   \
        memcpy(h, x + (size_t)(from) * D, sizeof(float) * (size_t)(t) * D);                  \
        for (int l = 0; l < L; l++) {                                                        \
            kv_step_f32(c, &layers[l], &b, h, out, scratch);                                 \
            for (size_t e_ = 0; e_ < (size_t)(t) * D; e_++) h[e_] = tanhf(h[e_] + out[e_]);  \
        }                                                                                    \
    } while (0)
    FORWARD(0, P);
    for (int i = 0; i < G; i++) {
        double t0 = cli_now();
        FORWARD(P + i, 1);
        double dt = cli_now() - t0;
        r.cached_s += dt;
        if (plot) fprintf(plot, "%d %.6f NaN\n", P + i + 1, dt * 1e3);
    }
    for (int i = 0; i < G; i += r.sampled_every) {
        kv_seq_truncate(c, seq, 0);
        double t0 = cli_now();
        FORWARD(0, P + i + 1);
        double dt = cli_now() - t0;
        r.recompute_s += dt * r.sampled_every;
        if (plot) fprintf(plot, "%d NaN %.6f\n", P + i + 1, dt * 1e3);
    }
#undef FORWARD
    /* recompute costs 2N (P+1 + ... + P+G), the cache 2N G */
    r.flop_ratio = ((double)G * P + (double)G * (G + 1) / 2) / G;
    r.speedup = r.recompute_s / r.cached_s;
    kv_cache_free(c);
    free(w), free(x), free(out), free(h), free(scratch);
    return r;
}

/* Plain numpy attention (np.repeat of the KV heads) on H32/Hkv8/d128 f32 decode at S; seconds per call, or 0. */
static double numpy_decode(int64_t S) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             /* as the environment notes say: these two slow a current numpy down */
             "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python3 -c '\n"
             "import time, numpy as np\n"
             "H, Hkv, d, S = 32, 8, 128, %lld\n"
             "r = np.random.default_rng(0)\n"
             "q = r.standard_normal((H, 1, d), dtype=np.float32)\n"
             "k = r.standard_normal((Hkv, S, d), dtype=np.float32)\n"
             "v = r.standard_normal((Hkv, S, d), dtype=np.float32)\n"
             "def attention(q, k, v):\n"
             "    H, T, d = q.shape; Hkv, S, _ = k.shape\n"
             "    k = np.repeat(k, H // Hkv, axis=0); v = np.repeat(v, H // Hkv, axis=0)\n"
             "    s = q @ k.transpose(0, 2, 1) / np.sqrt(d)\n"
             "    pos = np.arange(T)[:, None] + (S - T)\n"
             "    s = np.where(np.arange(S)[None, :] <= pos, s, -np.inf)\n"
             "    s = s - s.max(axis=-1, keepdims=True); p = np.exp(s)\n"
             "    return (p / p.sum(axis=-1, keepdims=True)) @ v\n"
             "best = 1e9\n"
             "for _ in range(5):\n"
             "    t0 = time.perf_counter(); attention(q, k, v); best = min(best, time.perf_counter() - t0)\n"
             "print(best)' 2>/dev/null",
             (long long)S);
    FILE *f = popen(cmd, "r");
    if (!f) return 0;
    double sec = 0;
    if (fscanf(f, "%lf", &sec) != 1) sec = 0;
    pclose(f);
    return sec;
}

/* ------------------------------------------------------------------ report */

int cmd_bench_attention(int argc, char **argv) {
    bench B = {0};
    int64_t threads = 0;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) { usage(); return 0; }
        if (cli_opt_int(argc, argv, &i, "-t", "--threads", &threads)) continue;
        if (cli_opt_str(argc, argv, &i, NULL, "--plot", &B.plot)) continue;
        if (!strcmp(argv[i], "--quick")) { B.quick = true; continue; }
        if (!strcmp(argv[i], "--json")) { B.json = true; continue; }
        fprintf(stderr, "kvcache bench attention: unknown option '%s'\n", argv[i]);
        return 2;
    }
    if (threads < 0 || threads > 256) {
        fprintf(stderr, "kvcache bench attention: -t must be 0..256\n");
        return 2;
    }
    if (kv_pool_create((int32_t)threads, &B.pool) != KV_OK) {
        fprintf(stderr, "kvcache bench attention: cannot start threads\n");
        return 1;
    }
    B.threads = kv_pool_threads(B.pool);
    B.buf_len = (B.quick ? 64u : 1024u) << 18; /* 64 MiB (quick) or 1 GiB of floats */
    B.buf = aligned_alloc((size_t)2 << 20, B.buf_len * sizeof(float));
#ifdef MADV_HUGEPAGE
    if (B.buf) madvise(B.buf, B.buf_len * sizeof(float), MADV_HUGEPAGE); /* as the cache's pool */
#endif
    if (!B.buf) {
        fprintf(stderr, "kvcache bench attention: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < B.buf_len; i++) B.buf[i] = (float)(i & 1023);

    FILE *out = B.json ? stderr : stdout; /* the table goes to stderr with --json */
    double read_gbs = read_bandwidth(&B, 5), peak = fma_peak(&B);
    fprintf(out, "kvcache bench attention: %d thread%s, %s kernels\n", B.threads, B.threads > 1 ? "s" : "", kv_simd_name());
    fprintf(out, "  read bandwidth %.1f GB/s (the best of 4 streams and 1 over %zu MiB), FMA peak %.1f GFLOP/s\n\n", read_gbs,
            B.buf_len * sizeof(float) >> 20, peak);

    static const int64_t S_full[] = {4096, 32768, 131072, 524288}, S_quick[] = {512, 2048};
    const int64_t *Ss = B.quick ? S_quick : S_full;
    int nS = B.quick ? 2 : 4;
    static const int shapes[2][3] = {{32, 8, 128}, {9, 3, 64}};
    static const kv_dtype kvs[2] = {KV_F16, KV_Q8};
    decode_row dec[32];
    int nd = 0;
    fprintf(out, "  decode (T=1)           S      ms    K/V GB/s   read GB/s   ratio  FLOP/B  roof GB/s  / roof\n");
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < nS; i++) {
                decode_row r = run_decode(&B, Ss[i], shapes[s][0], shapes[s][1], shapes[s][2], kvs[k]);
                dec[nd++] = r;
                fprintf(out, "  H%-2d/Hkv%d/d%-3d %-4s %8lld %7.3f %11.1f %11.1f %7.2f %7.2f %10.1f %7.2f\n", r.H, r.Hkv,
                        r.d, kv_dtype_name(r.kv), (long long)r.S, r.ms, r.gbs, r.read_gbs, r.ratio, r.flop_per_byte,
                        r.roofline_gbs, r.roofline_ratio);
            }

    static const int64_t T_full[] = {512, 2048, 8192}, T_quick[] = {128, 256};
    prefill_row pre[3];
    int np = B.quick ? 2 : 3;
    fprintf(out, "\n  prefill (T=S, H32/Hkv8/d128, f16)     ms   GFLOP/s   peak GFLOP/s   / peak\n");
    for (int i = 0; i < np; i++) {
        pre[i] = run_prefill(&B, (B.quick ? T_quick : T_full)[i]);
        fprintf(out, "  T = S = %-6lld %24.2f %9.1f %14.1f %8.2f\n", (long long)pre[i].T, pre[i].ms, pre[i].gflops,
                pre[i].peak_gflops, pre[i].ratio);
    }

    FILE *plot = NULL;
    char data_path[] = "/tmp/kvcache_plot_XXXXXX";
    if (B.plot) {
        int fd = mkstemp(data_path);
        plot = fd >= 0 ? fdopen(fd, "w") : NULL;
    }
    static const int PG_full[] = {256, 1000}, PG_quick[] = {32, 64};
    cvr_row cvr[2];
    fprintf(out, "\n  cache vs recompute (2 layers, width 256)  cached s  recompute s  speedup  FLOP ratio\n");
    for (int i = 0; i < 2; i++) {
        int n = (B.quick ? PG_quick : PG_full)[i];
        cvr[i] = run_cache_vs_recompute(&B, n, n, i == 1 ? plot : NULL);
        fprintf(out, "  prompt %4d, generate %4d %16.3f %12.3f %8.1f %11.1f%s\n", n, n, cvr[i].cached_s,
                cvr[i].recompute_s, cvr[i].speedup, cvr[i].flop_ratio,
                cvr[i].sampled_every > 1 ? "  (recompute timed every 25th step)" : "");
    }
    if (plot) {
        fclose(plot);
        char cmd[1024];
        snprintf(cmd, sizeof cmd,
                 "gnuplot -e \"set terminal png size 900,560; set output '%s'; set logscale y; "
                 "set xlabel 'context length (tokens)'; set ylabel 'ms per generated token'; "
                 "set title 'Decode step: KV cache vs full recompute'; set key left top; "
                 "plot '%s' using 1:2 with lines title 'with KV cache', '' using 1:3 with linespoints title 'recompute'\" 2>&1",
                 B.plot, data_path);
        if (system(cmd) != 0) fprintf(stderr, "kvcache bench attention: --plot needs gnuplot (apt-get install gnuplot-nox)\n");
        remove(data_path);
    }

    int64_t numpy_S = B.quick ? 512 : 4096;
    double np_sec = numpy_decode(numpy_S), ours_sec = 0;
    if (np_sec > 0) {
        int32_t seq;
        kv_cache *c = filled_cache(&B, 8, 128, KV_F32, numpy_S, &seq);
        ours_sec = c ? time_attend(&B, c, seq, 32, 128, 1, 0.3, NULL, NULL) : 0;
        kv_cache_free(c);
        fprintf(out, "\n  numpy (np.repeat, softmax, matmul), H32/Hkv8/d128 f32, S=%lld: %.3f ms, ours %.3f ms: ours/numpy speed %.1fx\n",
                (long long)numpy_S, np_sec * 1e3, ours_sec * 1e3, np_sec / ours_sec);
    } else {
        fprintf(out, "\n  numpy: python3 with numpy not found, comparison skipped\n");
    }

    if (B.json) {
        printf("{\"threads\": %d, \"simd\": \"%s\", \"read_gbs\": %.6g, \"peak_gflops\": %.6g,\n \"decode\": [", B.threads,
               kv_simd_name(), read_gbs, peak);
        for (int i = 0; i < nd; i++)
            printf("%s\n  {\"S\": %lld, \"H\": %d, \"Hkv\": %d, \"d\": %d, \"kv_type\": \"%s\", \"threads\": %d, "
                   "\"ms\": %.6g, \"gbs\": %.6g, \"read_gbs\": %.6g, \"ratio\": %.6g, \"peak_gflops\": %.6g, "
                   "\"flop_per_byte\": %.6g, \"roofline_gbs\": %.6g, \"roofline_ratio\": %.6g}",
                   i ? "," : "", (long long)dec[i].S, dec[i].H, dec[i].Hkv, dec[i].d, kv_dtype_name(dec[i].kv), B.threads,
                   dec[i].ms, dec[i].gbs, dec[i].read_gbs, dec[i].ratio, dec[i].peak_gflops, dec[i].flop_per_byte,
                   dec[i].roofline_gbs, dec[i].roofline_ratio);
        printf("],\n \"prefill\": [");
        for (int i = 0; i < np; i++)
            printf("%s\n  {\"T\": %lld, \"S\": %lld, \"ms\": %.4f, \"gflops\": %.3f, \"peak_gflops\": %.3f, "
                   "\"ratio\": %.4f}",
                   i ? "," : "", (long long)pre[i].T, (long long)pre[i].T, pre[i].ms, pre[i].gflops, pre[i].peak_gflops,
                   pre[i].ratio);
        printf("],\n \"cache_vs_recompute\": [");
        for (int i = 0; i < 2; i++)
            printf("%s\n  {\"prompt\": %d, \"gen\": %d, \"cached_s\": %.4f, \"recompute_s\": %.4f, \"speedup\": %.3f, "
                   "\"flop_ratio\": %.3f}", i ? "," : "", cvr[i].prompt, cvr[i].gen, cvr[i].cached_s, cvr[i].recompute_s,
                   cvr[i].speedup, cvr[i].flop_ratio);
        printf("]");
        if (np_sec > 0)
            printf(",\n \"numpy\": {\"S\": %lld, \"numpy_ms\": %.4f, \"ours_ms\": %.4f, \"speedup\": %.3f}",
                   (long long)numpy_S, np_sec * 1e3, ours_sec * 1e3, np_sec / ours_sec);
        printf("}\n");
    }
    free(B.buf);
    kv_pool_free(B.pool);
    return 0;
}
