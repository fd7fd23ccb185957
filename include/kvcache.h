/* kvcache.h - attention with a KV cache: the one public header of libkvcache.
 *
 * Under causal masking a past token's key and value never change, so each
 * layer keeps them in a cache, only new tokens are projected, and T new queries
 * attend over the S >= T keys now cached. Query row i of a step sits at absolute
 * position p_i = S - T + i and sees key j exactly when
 *
 *        j <= p_i                 (causal, diagonal offset by S - T)
 *        j >  p_i - W             (only in a sliding-window cache of window W)
 *
 * One call therefore serves prefill (T = S), chunked prefill (any T < S) and
 * decode (T = 1).
 *
 * Memory. A cache owns a pool of pages fixed at creation; a page holds
 * `page_size` consecutive positions of K and V for every layer and KV head of
 * the cache. A sequence is a length and a block table (entry i: the page of
 * positions [i*P, (i+1)*P)). Only the n_kv_heads heads are stored (GQA/MQA);
 * attention indexes the group of a query head instead of repeating KV heads.
 *
 * Page accounting. Each page is used (held by one or more sequences; shared
 * when by two or more), cached (held by none but named, so the prefix cache
 * can find it; reclaimable) or free. A page whose last reference is dropped
 * becomes cached if it is named, else free. Only these calls move pages:
 *     kv_seq_reserve, kv_batch_reserve  see there (kv_seq_reserve_cost predicts them)
 *     kv_seq_prefix_match   holds the matched pages: cached ones become used, used ones shared
 *     kv_seq_fork           every page of the parent gains a reference
 *     kv_seq_truncate       drops the references to pages wholly past the new length
 *     kv_seq_remove         names as a reserve's step 1 does, then drops every reference
 *     kv_seq_rerotate, kv_seq_shift   take a page for each shared one they rewrite
 *     kv_seq_restore        takes one page per block the file holds
 *     kv_seq_prefix_load    takes one page (or holds its named twin)
 *     kv_seq_prefix_skip    gives back every page seq holds
 *     kv_prefix_clear       cached pages become free
 * Pages are taken only by reserve, rerotate, shift, restore and prefix_load: a free page
 * first, else the least recently used cached page (its name dropped). Every
 * other call (append, attend, read, save, stats) leaves every page as it is.
 *
 * A step:
 *     kv_seq_reserve(c, seq, t, tokens)         room for t new positions (all or nothing)
 *     for each layer l:
 *         kv_step_f32(c, &layer_l, &batch, x, out)   project, RoPE, append, attend
 *       or, when the caller projects itself:
 *         kv_append_f32(c, l, &batch, k, v); kv_attend_f32(c, l, &batch, q, out, ...)
 *
 * Errors. Every call that can fail returns a kv_status; kv_status_str() names
 * it. A failed call leaves the cache exactly as it was (contents, lengths, pool).
 * The library never exits or aborts on bad input, and allocates only in
 * kv_cache_create and kv_pool_create.
 *
 * Threads. Calls on different caches may run concurrently. Calls on one cache
 * must be serialized by the caller, except the ones that only read it
 * (kv_attend_*, kv_read_*, kv_seq_length, kv_cache_get_stats, kv_seq_save),
 * which may run together while nothing changes the cache (kv_attend_f32 calls
 * take turns on the cache's work area; use a pool for parallelism within one).
 * The pure functions (kv_attention_*, kv_rope_*, kv_price_*) may run anywhere
 * at any time.
 *
 * Stack. Attention keeps each work item's tiles on the stack, so that it never
 * allocates: an FP32 attention call (kv_attend_f32, kv_attention_f32,
 * kv_step_f32) uses up to about 300 KiB of stack on the calling thread and on
 * each worker of its pool, a float64 one (kv_*_f64) about 110 KiB. Call them
 * from threads with at least 512 KiB of stack (a pool's workers get 4 MiB; a
 * POSIX thread's default is usually 8 MiB).
 */
#ifndef KVCACHE_H
#define KVCACHE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the library's exported functions. libkvcache is built with
 * -fvisibility=hidden, so these, and nothing else, are its ABI. */
#ifndef KV_API
#if defined(__GNUC__) || defined(__clang__)
#define KV_API __attribute__((visibility("default")))
#else
#define KV_API
#endif
#endif

/* ------------------------------------------------------------------ status */

typedef enum {
    KV_OK = 0,
    KV_ERR_NULL = -1,          /* a required pointer was NULL */
    KV_ERR_SHAPE = -2,         /* a size is <= 0, too large, or inconsistent */
    KV_ERR_HEADS = -3,         /* n_heads is not a multiple of n_kv_heads */
    KV_ERR_LENGTH = -4,        /* T > S, or a truncate/position outside the sequence */
    KV_ERR_CAPACITY = -5,      /* the sequence would exceed the cache's max_seq_len */
    KV_ERR_OUT_OF_PAGES = -6,  /* the pool has too few free pages; nothing was changed */
    KV_ERR_WINDOW = -7,        /* window < 0, or the keys a call needs were evicted */
    KV_ERR_DTYPE = -8,         /* unsupported dtype, or the call's precision does not match the cache */
    KV_ERR_NOMEM = -9,         /* allocation failed (kv_cache_create, kv_pool_create) */
    KV_ERR_SEQ = -10,          /* no such sequence, or no free sequence slot */
    KV_ERR_ROPE = -11,         /* bad RoPE parameters */
    KV_ERR_IO = -12,           /* a file could not be read or written */
    KV_ERR_FORMAT = -13,       /* a saved file is corrupt or was made for another configuration */
    KV_ERR_SHARED = -14,       /* a write would change a page another sequence shares */
    KV_ERR_MISMATCH = -15,     /* a saved file was made by a cache of another configuration */
    KV_ERR_UNSUPPORTED = -16,  /* not available on this CPU or in this build */
    KV_ERR_DUPLICATE = -17,    /* a sequence appears more than once in one batch */
} kv_status;

/* A static, human-readable description of a status code. */
KV_API const char *kv_status_str(int status);

/* ------------------------------------------------------------------ types */

/* Storage type of cached K and V. Computation is always FP32 accumulation
 * (FP64 for KV_F64), whatever is stored; queries are never rounded to it.
 * One exception, for speed: the avx512 kernels' decode over KV_Q8 takes each
 * query vector (times scale) as 16-bit integers with one scale per vector,
 * off by at most 1/65534 of its largest element, and sums its products with
 * the 8-bit keys exactly in integers (see kvcache(1), KVCACHE_SIMD). */
typedef enum {
    KV_F64 = 0,   /* reference grade; used with the *_f64 calls */
    KV_F32 = 1,
    KV_F16 = 2,   /* IEEE binary16 */
    KV_BF16 = 3,  /* bfloat16 */
    KV_Q8 = 4,    /* int8 with one f32 scale per (token, head) */
} kv_dtype;

/* Bytes one element of K or V occupies (KV_Q8: 1, the scale counted apart);
 * 0 for an invalid type or one of less than a byte an element. */
KV_API size_t kv_dtype_size(kv_dtype dtype);
/* Bits one element of K or V occupies (KV_Q8: 8, the scale counted apart);
 * 0 for an invalid type. */
KV_API int32_t kv_dtype_bits(kv_dtype dtype);
KV_API const char *kv_dtype_name(kv_dtype dtype);
/* Parses "f64", "f32", "f16", "bf16", "q8"; returns KV_OK or KV_ERR_DTYPE. */
KV_API int kv_dtype_parse(const char *name, kv_dtype *out);

/* ------------------------------------------------------------------ price */

/* KV bytes one token costs: 2 (K and V) x layers x kv_heads x head_dim x
 * bytes per element, plus for KV_Q8 one f32 scale per token, layer, head and
 * K/V. Llama 3.1 8B in bf16: 2 x 32 x 8 x 128 x 2 = 131,072 B. Returns 0 for
 * invalid arguments; saturates at UINT64_MAX (never wraps). */
KV_API uint64_t kv_price_per_token(int32_t n_layers, int32_t n_kv_heads, int32_t head_dim, kv_dtype dtype);
/* The same for n_tokens tokens (saturates at UINT64_MAX). */
KV_API uint64_t kv_price_tokens(int32_t n_layers, int32_t n_kv_heads, int32_t head_dim, kv_dtype dtype,
                                uint64_t n_tokens);

/* ------------------------------------------------------------------ RoPE */

typedef enum {
    KV_ROPE_NEOX = 0,        /* split halves: pairs (x[i], x[i + r/2]) */
    KV_ROPE_INTERLEAVED = 1, /* adjacent pairs (x[2i], x[2i+1]): GPT-J, GGUF llama */
} kv_rope_layout;

typedef enum {
    KV_ROPE_SCALING_NONE = 0,
    KV_ROPE_SCALING_LLAMA3 = 1, /* Llama 3.1 wavelength-dependent frequency scaling */
} kv_rope_scaling;

enum { KV_MAX_HEAD_DIM = 512 };

typedef struct {
    int32_t head_dim;           /* d */
    int32_t rot_dim;            /* r <= d, even: dimensions rotated (0 means d) */
    kv_rope_layout layout;
    double theta;               /* base, e.g. 10000 or 500000 */
    kv_rope_scaling scaling;
    double factor;              /* LLAMA3: e.g. 8 */
    double low_freq_factor;     /* LLAMA3: e.g. 1 */
    double high_freq_factor;    /* LLAMA3: e.g. 4 */
    int32_t original_context;   /* LLAMA3: e.g. 8192 */
} kv_rope_params;

/* theta 10000, NEOX, rot_dim = head_dim, no scaling. */
KV_API kv_rope_params kv_rope_default_params(int32_t head_dim);

/* Precomputed rotation frequencies; a plain value, no allocation. */
typedef struct {
    kv_rope_params params;
    double inv_freq[KV_MAX_HEAD_DIM / 2]; /* [rot_dim/2] angle per position of pair k */
} kv_rope;

KV_API int kv_rope_init(kv_rope *rope, const kv_rope_params *params);

/* Rotates x [n, n_heads, head_dim] in place; row t by angle pos[t] * inv_freq. */
KV_API int kv_rope_apply_f64(const kv_rope *rope, double *x, int32_t n, int32_t n_heads, const int32_t *pos);
KV_API int kv_rope_apply_f32(const kv_rope *rope, float *x, int32_t n, int32_t n_heads, const int32_t *pos);

/* ------------------------------------------------------------------ dense attention */

/* Attention without a cache (the textbook computation), over contiguous arrays:
 *   q [T, H, d], k and v [S, Hkv, d], out [T, H, d], S >= T, H % Hkv == 0.
 * Query i sits at S - T + i. window 0 means full causal attention; scale 0
 * means 1/sqrt(d). T = 0 writes nothing and succeeds. */
KV_API int kv_attention_f64(int32_t T, int32_t S, int32_t H, int32_t Hkv, int32_t d, const double *q,
                            const double *k, const double *v, double *out, int32_t window, double scale);
KV_API int kv_attention_f32(int32_t T, int32_t S, int32_t H, int32_t Hkv, int32_t d, const float *q,
                            const float *k, const float *v, float *out, int32_t window, float scale);

/* ------------------------------------------------------------------ threads */

/* A small pool of worker threads. A job is n_tasks calls fn(ctx, task,
 * thread), task in [0, n_tasks), thread in [0, n_threads), spread over the
 * workers and the calling thread, which returns when all are done. Work is
 * cut into tasks independently of the thread count, so results never depend
 * on it. kv_pool_run may be called from several threads; jobs run one at a
 * time. A NULL pool runs every task on the calling thread. */
typedef struct kv_pool kv_pool;
typedef void (*kv_task_fn)(void *ctx, int32_t task, int32_t thread);

/* n_threads counts the caller: 1 starts no worker. 0 means one per core. */
KV_API int kv_pool_create(int32_t n_threads, kv_pool **out);
KV_API void kv_pool_free(kv_pool *pool);
KV_API int32_t kv_pool_threads(const kv_pool *pool); /* 1 for NULL */
KV_API int kv_pool_run(kv_pool *pool, int32_t n_tasks, kv_task_fn fn, void *ctx);

/* ------------------------------------------------------------------ SIMD */

/* The FP32 kernels' instruction set: "scalar", "avx2" or "avx512", chosen at
 * first use as the best this CPU supports, or by the environment variable
 * KVCACHE_SIMD. kv_simd_select changes it process-wide ("auto" for the best);
 * KV_ERR_UNSUPPORTED when this CPU or build lacks it. Not thread-safe: call it
 * before starting work. */
KV_API const char *kv_simd_name(void);
KV_API int kv_simd_select(const char *name);

/* ------------------------------------------------------------------ the cache */

typedef struct kv_cache kv_cache;

typedef struct {
    int32_t n_layers;      /* layers that share this cache (same window) */
    int32_t n_kv_heads;    /* Hkv: only these heads are stored */
    int32_t head_dim;      /* d <= KV_MAX_HEAD_DIM */
    kv_dtype dtype;        /* storage type of K and V */
    int32_t page_size;     /* P: positions per page (default 16) */
    int32_t n_pages;       /* pages in the pool, all allocated at creation */
    int32_t max_seqs;      /* sequence slots (default 1) */
    int32_t max_seq_len;   /* longest sequence allowed (0: n_pages * page_size, or for a
                            * window cache, which recycles pages, at least 2^20) */
    int32_t window;        /* W > 0: sliding-window cache that evicts old pages; 0: full */
    int32_t no_evict;      /* 1 (window caches): attention still sees only the window, but
                            * no page is evicted, so memory grows as a full cache's does
                            * (for comparing the two; `kvcache --no-window`); default 0 */
} kv_cache_params;

/* n_layers 1, n_kv_heads 1, head_dim 64, KV_F32, page_size 16, n_pages 256,
 * max_seqs 1, max_seq_len 0, window 0, no_evict 0. */
KV_API kv_cache_params kv_cache_default_params(void);

/* Allocates the pool and every table; the only call that allocates. */
KV_API int kv_cache_create(const kv_cache_params *params, kv_cache **out);
KV_API void kv_cache_free(kv_cache *cache);
KV_API kv_cache_params kv_cache_get_params(const kv_cache *cache);
/* Attention on this cache runs its work on `pool` (NULL: the calling thread
 * only). The pool is borrowed, not owned: free it after the cache. */
KV_API void kv_cache_set_pool(kv_cache *cache, kv_pool *pool);

typedef struct {
    int32_t pages_total;       /* = used + free + cached */
    int32_t pages_used;        /* referenced by at least one sequence */
    int32_t pages_free;        /* hold nothing */
    int32_t pages_cached;      /* unreferenced but kept for the prefix cache (reclaimable) */
    int32_t pages_shared;      /* referenced by two or more sequences */
    int32_t pages_named;       /* full pages the prefix cache can find (used or cached) */
    int32_t seqs;              /* live sequences */
    uint64_t bytes_per_token;  /* kv_price_per_token of this configuration */
    uint64_t bytes_per_page;
    uint64_t bytes_in_use;     /* pages_used x bytes_per_page */
    uint64_t bytes_total;      /* the pool */
} kv_cache_stats;

KV_API kv_cache_stats kv_cache_get_stats(const kv_cache *cache);

/* ------------------------------------------------------------------ sequences */

/* Takes a free sequence slot; *seq receives its id (0 <= id < max_seqs). */
KV_API int kv_seq_new(kv_cache *cache, int32_t *seq);
/* Releases the sequence and its pages: first names its full pages as step 1
 * of kv_seq_reserve does (twins swapped in), then drops every reference it
 * holds. Takes no page. */
KV_API int kv_seq_remove(kv_cache *cache, int32_t seq);
/* Length S of the sequence (positions reserved so far), or a negative status. */
KV_API int32_t kv_seq_length(const kv_cache *cache, int32_t seq);
/* Makes room for n_new positions after the current length and advances the
 * length. tokens [n_new] are the ids of the new positions, which name full
 * pages for the prefix cache; NULL when unknown. All or nothing:
 * KV_ERR_OUT_OF_PAGES or KV_ERR_CAPACITY change nothing.
 *
 * Pages, in three steps (kv_batch_reserve: each step for every sequence of
 * the batch, in batch order, before the next step):
 *  1. Naming. Each full page below the current length S that is not yet
 *     named is named when all its token ids are known and the page before it
 *     is named. Such a page whose twin (the same tokens after the same page)
 *     is named already is swapped for the twin: the sequence drops its page
 *     (which becomes free if no other sequence holds it) and holds the twin
 *     (a cached twin becomes used, a used one shared); except that a cached
 *     twin is not taken for a page another sequence still holds (the page
 *     then stays unnamed, and so do the pages after it). Takes no page and
 *     never adds a used one: pages_used falls by the pages swapped away that
 *     no other sequence held.
 *  2. Eviction (window caches): pages wholly before the window of a query at
 *     S are dropped.
 *  3. Growth. A partly filled last page that another sequence shares is
 *     copied (one page taken; the shared page loses this reference); then one
 *     page is taken for each new block, ceil((S + n_new) / P) - ceil(S / P).
 * Only step 3 takes pages: free ones first, then the least recently used
 * cached pages, reclaimed (their names dropped). So pages_used grows by at
 * most ceil((S + n_new) / P) - ceil(S / P), plus 1 when S % P != 0, and it
 * may fall (steps 1 and 2). kv_seq_reserve_cost tells beforehand exactly what
 * these steps will do.
 *
 * Contract: the K/V of the new positions must then be written (kv_append_*
 * or kv_step_*) in every layer before they are attended, and before the next
 * reserve or remove of this sequence, which is when its full pages become
 * visible to kv_seq_prefix_match (a reserve of n_new = 0 does only that). */
KV_API int kv_seq_reserve(kv_cache *cache, int32_t seq, int32_t n_new, const int32_t *tokens);
/* Creates *child sharing every page of parent (copy-on-write: the first write
 * into a shared page copies that page only). Takes no page; every page of the
 * parent gains a reference (and is then shared). */
KV_API int kv_seq_fork(kv_cache *cache, int32_t parent, int32_t *child);
/* Drops every position >= new_len (rollback for speculative decoding or
 * editing). Takes no page; drops the sequence's reference to each page
 * wholly at or past new_len (see "Page accounting"). In a window cache,
 * KV_ERR_WINDOW when the keys the next query would see were evicted. */
KV_API int kv_seq_truncate(kv_cache *cache, int32_t seq, int32_t new_len);

/* Re-rotates the cached K of positions [pos, pos + n) of seq, in every
 * layer, by delta positions (any sign): a key rotated at p becomes the key
 * rotated at p + delta, since RoPE rotations compose, R(p + delta) =
 * R(delta) R(p). V and the positions themselves stay. f64 and f32 keys are
 * turned as stored (f32: one f32 rounding); f16, bf16 and q8 are decoded,
 * turned in double and encoded again, which adds one rounding of the format
 * per call: per element at most about 2^-11 (f16) or 2^-8 (bf16) of the norm
 * of its rotation pair, and for q8 up to (1 + sqrt 2) / 254 (about 1%) of the
 * row's largest pair norm, so repeated shifts of a q8 cache accumulate error
 * (f32 and f64 do not measurably). rope->params.head_dim must be the cache's
 * (KV_ERR_ROPE). Shared pages are copied first (KV_ERR_OUT_OF_PAGES when the
 * pool cannot; nothing changed), and the pages touched leave the prefix cache. */
KV_API int kv_seq_rerotate(kv_cache *cache, int32_t seq, int32_t pos, int32_t n, int32_t delta, const kv_rope *rope);
/* Context shift (StreamingLLM's attention sinks, llama.cpp's n_keep): drops
 * positions [n_keep, n_keep + n_discard) and moves every later position down
 * by n_discard, its K re-rotated by -n_discard as kv_seq_rerotate does (rope
 * NULL: moved unrotated, for a model without RoPE). The sequence then has
 * length S - n_discard and continues as if the kept keys had been written at
 * their new positions. A window cache keeps what its next query sees: the sinks
 * it had already evicted stay gone, and KV_ERR_WINDOW (nothing changed) when
 * the next query would need a key it no longer has. All or nothing:
 * KV_ERR_LENGTH when n_keep + n_discard > S, KV_ERR_OUT_OF_PAGES when shared
 * pages cannot be copied. Moved positions lose their token ids: they and what
 * follows them are never offered to the prefix cache. */
KV_API int kv_seq_shift(kv_cache *cache, int32_t seq, int32_t n_keep, int32_t n_discard, const kv_rope *rope);

/* Prefix cache. On an empty sequence, reuses the cached pages whose tokens
 * equal the longest page-aligned prefix of tokens [n]: full pages are named by
 * a hash of their tokens chained with the hash of the page before, and a hit is
 * confirmed by comparing the tokens and the page before, so a hash collision
 * never returns wrong K/V. *n_matched (a multiple of page_size) positions are
 * then cached and need no prefill; pass n - 1 to keep at least one token to
 * prefill for its logits.
 *
 * A window cache (window W, evicting) resumes at a point m from the pages
 * covering (m - W, m] alone, so *n_matched is the longest page-aligned m <= n
 * whose pages it still has, chained (a window whose older pages were
 * reclaimed serves only from points it still covers; the sequence's blocks
 * below the window stay empty). The first of those pages is confirmed by its
 * tokens and the 64-bit chained hash of every token before it, the others by
 * their tokens and the page before. A page is named once written (at the
 * next reserve), also when the window evicts it later: evicted named pages
 * are cached (reclaimable), not held, so a live sequence still holds about W
 * positions. */
KV_API int kv_seq_prefix_match(kv_cache *cache, int32_t seq, const int32_t *tokens, int32_t n,
                               int32_t *n_matched);
/* What kv_seq_prefix_match would match for tokens [n] on an empty sequence,
 * changing nothing: *n_found, a multiple of page_size. A caller holding
 * several caches (one per layer group) asks each in turn for the longest
 * point <= the previous answer, until all agree, then matches that point in
 * each. */
KV_API int kv_prefix_lookup(const kv_cache *cache, const int32_t *tokens, int32_t n, int32_t *n_found);
/* Empties the prefix cache: every cached page becomes free, and no page can be
 * found any more. Pages in use stay with their sequences, whose next reserve
 * or remove names their full pages again. KV_ERR_NULL for a NULL cache. */
KV_API int kv_prefix_clear(kv_cache *cache);

/* Prefix-cache events, for publishing what a cache holds to routers outside
 * the process. KV_PREFIX_STORED: a full page became findable under hash
 * (chained from parent_hash, has_parent 0 for a sequence's first page), holding
 * tokens[n_tokens]; KV_PREFIX_REMOVED: the page named hash can no longer be
 * found (reclaimed, overwritten, truncated away); KV_PREFIX_CLEARED:
 * kv_prefix_clear emptied the cache (no REMOVED for its pages). The listener
 * runs on the thread that changed the cache, inside the call that did; it
 * must not call back into this cache. tokens is valid during the call. */
typedef enum { KV_PREFIX_STORED, KV_PREFIX_REMOVED, KV_PREFIX_CLEARED } kv_prefix_event_kind;
typedef struct {
    kv_prefix_event_kind kind;
    uint64_t hash, parent_hash;
    int has_parent;
    const int32_t *tokens;
    int32_t n_tokens;
} kv_prefix_event;
typedef void (*kv_prefix_listener)(void *user, const kv_prefix_event *ev);
/* Sets (fn NULL: removes) the cache's one listener. Not thread-safe against
 * calls that change the cache: set it before they start. */
KV_API void kv_cache_set_prefix_listener(kv_cache *cache, kv_prefix_listener fn, void *user);

/* A tier below the pool (a disk, another host): named pages leave the pool
 * through a spill listener and come back through kv_seq_prefix_load. A page
 * image is a named page's name (hash, chained from parent_hash; has_parent 0
 * for a sequence's first page), its tokens [n_tokens = page_size] and its
 * K/V exactly as stored, data [bytes = bytes_per_page], valid during the
 * call. The listener runs on the thread that changed the cache, inside the
 * call, and must not call back into this cache. */
typedef struct {
    uint64_t hash, parent_hash;
    int has_parent;
    const int32_t *tokens;
    int32_t n_tokens;
    const void *data;
    size_t bytes;
} kv_page_image;
typedef void (*kv_spill_fn)(void *user, const kv_page_image *img);
/* Sets (fn NULL: removes) the listener called with each named cached page
 * the pool reclaims, just before its content is dropped (inside a call that
 * takes pages). Not thread-safe against calls that change the cache. */
KV_API void kv_cache_set_spill(kv_cache *cache, kv_spill_fn fn, void *user);
/* Calls the spill listener with every named page, used or cached, and
 * changes nothing (before a shutdown). KV_ERR_NULL without a cache. */
KV_API int kv_prefix_spill_all(kv_cache *cache);
/* The names of the full pages of tokens [n] as a sequence holding them from
 * position 0 would give them: hashes [n / page_size], each chained from the
 * one before (what kv_seq_prefix_next tells page by page). */
KV_API int kv_prefix_hashes(const kv_cache *cache, const int32_t *tokens, int32_t n, uint64_t *hashes);
/* The name the next page of seq would get if it held tokens [page_size]:
 * *hash, and the name it chains from (*has_parent 0: none). KV_ERR_LENGTH
 * unless seq's length is a multiple of page_size and every page of it is
 * named (in a window cache: its last block's, or it was skipped to). */
KV_API int kv_seq_prefix_next(const kv_cache *cache, int32_t seq, const int32_t *tokens, uint64_t *hash,
                              uint64_t *parent_hash, int *has_parent);
/* A window cache resumes at m from the pages of (m - W, m] alone: moves seq
 * (ending on a named page boundary, as kv_seq_prefix_next asks) to length n
 * (a multiple of page_size, >= its length), holding no pages (those it held
 * are given back), its blocks below n empty and the last of them named from
 * tokens [n], so that kv_seq_prefix_load appends the pages from n on. The
 * caller then loads up to a point m whose window needs no block below n
 * before the sequence is used, or truncates it. KV_ERR_WINDOW in a cache
 * without an evicting window, KV_ERR_LENGTH for another n; nothing changes
 * on failure. */
KV_API int kv_seq_prefix_skip(kv_cache *cache, int32_t seq, const int32_t *tokens, int32_t n);
/* Appends one full page to seq from a page image's tokens [page_size] and
 * data [bytes_per_page], named as kv_seq_prefix_next tells, and held by seq
 * (as if kv_seq_prefix_match had found it). Takes one page, as a reserve's
 * growth does (none when the same page is named in the pool already: that
 * one is held). The caller vouches that data is what this cache would have
 * computed for these tokens after this prefix. KV_ERR_LENGTH as
 * kv_seq_prefix_next, KV_ERR_SHAPE when bytes is not bytes_per_page,
 * KV_ERR_CAPACITY past max_seq_len, KV_ERR_OUT_OF_PAGES; nothing changes on
 * failure. A window cache's pages below its window stay held until the
 * next reserve. */
KV_API int kv_seq_prefix_load(kv_cache *cache, int32_t seq, const int32_t *tokens, const void *data, size_t bytes);

/* Save and restore. kv_seq_save writes the sequence's tokens and K/V (as
 * stored, for every layer), under a header naming the cache configuration and
 * a checksum. kv_seq_restore reads such a file into a new sequence (*seq):
 * KV_ERR_IO when the file cannot be read, KV_ERR_FORMAT when it is corrupt or
 * truncated, KV_ERR_MISMATCH when it was made for another configuration,
 * KV_ERR_CAPACITY when it is longer than max_seq_len, KV_ERR_OUT_OF_PAGES,
 * KV_ERR_SEQ when no sequence slot is free; on any failure the cache is
 * unchanged. A restored
 * sequence continues exactly as if it had never left. */
KV_API int kv_seq_save(const kv_cache *cache, int32_t seq, const char *path);
KV_API int kv_seq_restore(kv_cache *cache, const char *path, int32_t *seq);
/* The same at the current position of an open, seekable stream, so that a
 * caller can put its own header first (the engine's session files name the
 * model): kv_seq_save_file writes the sequence there (KV_ERR_IO when a write
 * fails; the stream is the caller's to close); kv_seq_restore_file reads one
 * from there, leaves the stream just after it on success, and does not care
 * what follows (kv_seq_restore requires that nothing does). */
KV_API int kv_seq_save_file(const kv_cache *cache, int32_t seq, FILE *f);
KV_API int kv_seq_restore_file(kv_cache *cache, FILE *f, int32_t *seq);

/* ------------------------------------------------------------------ batches */

/* A ragged batch in CSR form: sequence b (seqs[b]) owns the rows
 * row_start[b] .. row_start[b+1]-1 of q, k, v, x and out, so its T_b =
 * row_start[b+1] - row_start[b]. Its cache length S_b is kv_seq_length at the
 * time of the call (the T_b new positions already reserved), and its row i sits
 * at absolute position S_b - T_b + i. A sequence appears at most once
 * (KV_ERR_DUPLICATE otherwise). */
typedef struct {
    int32_t n_seqs;
    const int32_t *seqs;       /* [n_seqs] sequence ids */
    const int32_t *row_start;  /* [n_seqs + 1], row_start[0] = 0, non-decreasing */
} kv_batch;

/* kv_seq_reserve for every sequence of the batch at once: T_b new positions
 * each (tokens [rows] or NULL). All or nothing across the batch: on
 * KV_ERR_OUT_OF_PAGES no sequence changed, so a caller can preempt one and
 * retry. */
KV_API int kv_batch_reserve(kv_cache *cache, const kv_batch *batch, const int32_t *tokens);

/* What a reserve will do to the pages, asked before calling it: the same
 * steps worked out without changing the cache (token ids do not change the
 * pages, so none are asked for). KV_OK with *cost filled, fits 0 when the
 * reserve would return KV_ERR_OUT_OF_PAGES; otherwise the status the reserve
 * would return (KV_ERR_CAPACITY, KV_ERR_SEQ, ...). Changes nothing, but must
 * be serialized with the calls that change the cache (it uses a scratch area
 * of the cache). Exact: a kv_batch_reserve of the same batch right after
 * changes the stats by exactly these deltas. */
typedef struct {
    int32_t fits;             /* 1: the reserve succeeds */
    int32_t pages_taken;      /* step 3: copies and new blocks */
    int32_t pages_reclaimed;  /* of those, cached pages reclaimed when the free ones run out */
    int32_t pages_adopted;    /* step 1: cached twins that become used */
    int32_t pages_given_back; /* steps 1-3: used pages no sequence holds afterwards */
    int32_t used_delta;       /* change of pages_used: taken + adopted - given_back */
    int32_t shared_delta;     /* change of pages_shared */
    int32_t free_delta;       /* change of pages_free */
    int32_t cached_delta;     /* change of pages_cached */
} kv_reserve_cost;

KV_API int kv_batch_reserve_cost(kv_cache *cache, const kv_batch *batch, kv_reserve_cost *cost);
KV_API int kv_seq_reserve_cost(kv_cache *cache, int32_t seq, int32_t n_new, kv_reserve_cost *cost);

/* Writes the K and V of the T_b newest positions of every sequence of the
 * batch into `layer`: k and v are [rows, Hkv, d] (rows = row_start[n_seqs]),
 * already rotated. Overwrites only those positions. */
KV_API int kv_append_f64(kv_cache *cache, int32_t layer, const kv_batch *batch, const double *k,
                         const double *v);
KV_API int kv_append_f32(kv_cache *cache, int32_t layer, const kv_batch *batch, const float *k,
                         const float *v);

/* Reads back the cached K and V of positions [pos, pos + n) of `seq` in
 * `layer`, as [n, Hkv, d] (dequantized for f16/bf16/q8 storage). */
KV_API int kv_read_f64(const kv_cache *cache, int32_t layer, int32_t seq, int32_t pos, int32_t n, double *k,
                       double *v);
KV_API int kv_read_f32(const kv_cache *cache, int32_t layer, int32_t seq, int32_t pos, int32_t n, float *k,
                       float *v);

/* NaN and infinity, the same on every path (dense and paged, f64 and f32,
 * every SIMD variant and storage type): IEEE arithmetic on the softmax over a
 * row's visible keys, where a score q.k*scale that is not finite (a NaN or an
 * infinity in q or in a visible key, or an overflow) makes that output vector
 * all NaN; a NaN in element e of a visible value makes element e NaN, and an
 * infinity there makes it infinite of its sign (NaN if both signs meet), since
 * no weight of a finite score rounds to 0. Keys a row does not see never touch
 * it, whatever they hold. Storage keeps NaN and infinity (f16 also turns
 * values beyond 65504 into infinity); KV_Q8 stores a row holding either as a
 * NaN scale, so the whole row reads back NaN. */

/* Attends q [rows, H, d] over the cache of `layer`; out [rows, H, d].
 * H % Hkv == 0; scale 0 means 1/sqrt(d). Online softmax: no score row of
 * length S is ever materialized. */
KV_API int kv_attend_f64(const kv_cache *cache, int32_t layer, const kv_batch *batch, int32_t n_heads,
                         const double *q, double *out, double scale);
KV_API int kv_attend_f32(const kv_cache *cache, int32_t layer, const kv_batch *batch, int32_t n_heads,
                         const float *q, float *out, float scale);

/* ------------------------------------------------------------------ one step */

/* The weights of one attention layer for kv_step_*. Row-major:
 * wq [dim, n_heads * d], wk and wv [dim, n_kv_heads * d]. */
typedef struct {
    int32_t layer;          /* which layer of the cache */
    int32_t dim;            /* D, the model width */
    int32_t n_heads;        /* H */
    const void *wq;         /* double* for kv_step_f64, float* for kv_step_f32 */
    const void *wk;
    const void *wv;
    const kv_rope *rope;    /* NULL: no positional rotation */
    double scale;           /* 0: 1/sqrt(d) */
} kv_layer;

/* x [rows, D] holds only the new tokens; out [rows, H * d]. Projects each new
 * token once, rotates q and k at their absolute positions, appends k and v in
 * place, attends. `scratch` holds rows x (H + 2 Hkv) x d elements of the call's
 * precision (kv_step_scratch tells how many). */
KV_API size_t kv_step_scratch(const kv_cache *cache, const kv_layer *layer, int32_t rows);
KV_API int kv_step_f64(kv_cache *cache, const kv_layer *layer, const kv_batch *batch, const double *x,
                       double *out, double *scratch);
KV_API int kv_step_f32(kv_cache *cache, const kv_layer *layer, const kv_batch *batch, const float *x,
                       float *out, float *scratch);

#ifdef __cplusplus
}
#endif
#endif
