/* src/attend.c - attention over the cache (paged) and over plain arrays
 * (dense): argument checks, the cutting of a call into work items spread over
 * the thread pool, the FP32 kernel built on the SIMD primitives, and the
 * log-sum-exp combination of split results. The float64 path runs the
 * reference kernel (attend_ref.c). */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "attend.h"
#include "simd.h"

/* Everything one call's work items share. */
typedef struct {
    const kv_cache *cache;      /* paged, or NULL for dense */
    const kv_batch *batch;      /* paged */
    const kv_simd *simd;
    int32_t layer, H, G, d;
    float scale;
    int32_t window;
    const float *q;             /* [rows, H, d] */
    float *out;                 /* [rows, H, d] */
    const kv_work_item *items;
    float *partials;
    /* dense only */
    int32_t T, S, Hkv;
    const float *k, *v;
} attend_job;

/* Where one item's sequence lies: row 0 of the batch rows, its T and S. */
static void item_seq(const attend_job *j, const kv_work_item *it, int32_t *row0, int32_t *T, int32_t *S) {
    if (!j->cache) {
        *row0 = 0, *T = j->T, *S = j->S;
        return;
    }
    *row0 = j->batch->row_start[it->b];
    *T = j->batch->row_start[it->b + 1] - *row0;
    *S = j->cache->seqs[j->batch->seqs[it->b]].len;
}

/* The keys of KV head `head` of an item's sequence. */
static key_source head_source(const attend_job *j, const kv_work_item *it, int32_t head) {
    if (!j->cache)
        return (key_source){.dtype = KV_F32, .d = j->d, .block = j->S > 0 ? j->S : 1,
                            .stride = (size_t)j->Hkv * (size_t)j->d * sizeof(float),
                            .k = (const unsigned char *)(j->k + (size_t)head * j->d),
                            .v = (const unsigned char *)(j->v + (size_t)head * j->d)};
    const kv_cache *c = j->cache;
    return (key_source){.dtype = c->p.dtype, .d = j->d, .block = c->p.page_size,
                        .stride = c->pages.row_bytes, .cache = c,
                        .table = kv_table(c, j->batch->seqs[it->b]), .layer = j->layer, .head = head};
}

static key_source item_source(const attend_job *j, const kv_work_item *it) { return head_source(j, it, it->head); }

/* K and V of positions [j0, j0 + n) as f32 [n][d]: straight from the page
 * when it already is f32 and contiguous, else converted into kbuf/vbuf. */
static void load_chunk(const kv_simd *simd, const key_source *src, int32_t j0, int32_t n, float *kbuf,
                       float *vbuf, const float **k, const float **v) {
    const int32_t blk = j0 / src->block, in_blk = j0 - blk * src->block;
    if (src->dtype == KV_F32 && in_blk + n <= src->block && src->stride == (size_t)src->d * sizeof(float)) {
        key_block kb = source_block(src, blk);
        *k = (const float *)(kb.k + (size_t)in_blk * src->stride);
        *v = (const float *)(kb.v + (size_t)in_blk * src->stride);
        return;
    }
    for (int32_t j = 0; j < n;) {
        const int32_t b = (j0 + j) / src->block, r = (j0 + j) - b * src->block;
        int32_t m = src->block - r < n - j ? src->block - r : n - j;
        key_block kb = source_block(src, b);
        simd->load_rows(src->dtype, kb.k + (size_t)r * src->stride, src->stride, kb.kscale ? kb.kscale + r : NULL,
                        m, src->d, kbuf + (size_t)j * src->d);
        simd->load_rows(src->dtype, kb.v + (size_t)r * src->stride, src->stride, kb.vscale ? kb.vscale + r : NULL,
                        m, src->d, vbuf + (size_t)j * src->d);
        j += m;
    }
    *k = kbuf;
    *v = vbuf;
}

/* Decode-like tiles take the fused path when the CPU has one. */
static bool decode_shaped(const attend_job *j, int32_t nv) {
    return j->simd->decode_scores && nv <= KV_DECODE_VECS && j->d % 16 == 0;
}

/* The general path: chunks of kmax keys converted to f32, scores for the
 * whole tile, then per vector the online-softmax update. */
static void attend_chunks(const attend_job *j, const kv_work_item *it, const key_source *src, const float *qbuf,
                          int32_t nv, int32_t pos0, float *m, float *l, float *acc) {
    const kv_simd *simd = j->simd;
    const int32_t d = j->d, G = j->G, kmax = att_chunk(d);
    LINE_ALIGNED float kbuf[ATT_CHUNK_ELEMS], vbuf[ATT_CHUNK_ELEMS], s[ATT_ACC_ELEMS];
    /* scores of the tile against one chunk: nv x kmax must fit s */
    const int32_t lds = kmax;
    for (int32_t j0 = it->klo; j0 <= it->khi;) {
        int32_t n = kmax - j0 % kmax;
        if (n > it->khi - j0 + 1) n = it->khi - j0 + 1;
        const float *kc, *vc;
        load_chunk(simd, src, j0, n, kbuf, vbuf, &kc, &vc);
        for (int32_t i0 = 0; i0 < nv; i0 += ATT_ACC_ELEMS / lds) {
            int32_t ni = nv - i0 < ATT_ACC_ELEMS / lds ? nv - i0 : ATT_ACC_ELEMS / lds;
            simd->dot_rows(qbuf + (size_t)i0 * d, ni, kc, n, d, s, lds);
            for (int32_t i = i0; i < i0 + ni; i++) {
                const int32_t pos = pos0 + (it->v0 + i) / G;
                int32_t jlo = j0, jhi = j0 + n - 1; /* visible: pos - window < key <= pos */
                if (j->window > 0 && jlo < pos - j->window + 1) jlo = pos - j->window + 1;
                if (jhi > pos) jhi = pos;
                if (jlo > jhi) continue;
                float *si = s + (size_t)(i - i0) * lds + (jlo - j0);
                const int32_t len = jhi - jlo + 1;
                float mx = m[i];
                for (int32_t e = 0; e < len; e++) mx = si[e] > mx ? si[e] : mx;
                const float corr = kv_corr_exp(m[i], mx);
                l[i] = l[i] * corr + simd->exp_sum(si, len, mx);
                simd->axpy_rows(si, vc + (size_t)(jlo - j0) * d, len, d, corr, acc + (size_t)i * d);
                m[i] = mx;
            }
        }
        j0 += n;
    }
}

/* The prefill path on CPUs with a tile kernel: an item of up to TILE_SUBS
 * sub-tiles of tile_sub(d) query vectors, each transposed once; per chunk of
 * kmax keys, converted to f32 once for all of them, scores, softmax and the
 * update of the accumulators of each sub-tile that sees the chunk, all along
 * vector lanes. A sub-tile's arithmetic is what it would be as an item of its
 * own: the chunks end at the same absolute positions, keys it does not see
 * are masked or skipped. Sub-tiles share each chunk's conversion to f32,
 * which is why an item holds several (docs/PERFORMANCE.md, "Tuning
 * record"). An item's vectors, transposed (qt),
 * and its accumulators, TILE_ITEM_ELEMS floats at most each, go in the
 * buffers (qbuf, acc) of run_item: 128 KB each on the stack, where the
 * pool's threads have 4 MB. */
enum { TILE_SCRATCH = 8192, TILE_SUBS = 8, TILE_ITEM_ELEMS = TILE_SUBS * ATT_ACC_ELEMS };
/* run_item's buffers: a decode item's wide rows or a tile item's vectors */
enum { ITEM_ELEMS = (int)ATT_WIDE_ELEMS > (int)TILE_ITEM_ELEMS ? (int)ATT_WIDE_ELEMS : (int)TILE_ITEM_ELEMS };

/* Keys per chunk on the tile path: twice att_chunk's budget up to 64 keys,
 * never fewer than att_chunk, so that each V block's accumulators stay in
 * registers over more keys. */
enum { TILE_CHUNK_ELEMS = 2 * ATT_CHUNK_ELEMS, TILE_CHUNK_KEYS = 64 };
static int32_t tile_chunk(int32_t d) {
    const int32_t wide = TILE_CHUNK_ELEMS / d < TILE_CHUNK_KEYS ? TILE_CHUNK_ELEMS / d : TILE_CHUNK_KEYS;
    return wide > att_chunk(d) ? wide : att_chunk(d);
}

/* Query vectors per sub-tile: a multiple of the kernel's 16 lanes within the
 * accumulator budget; where that budget is under 16 vectors (d > 256), all
 * of it, one sub-tile an item. */
static int32_t tile_sub(int32_t d) { return att_tile(d) >= 16 ? att_tile(d) & ~15 : att_tile(d); }
static int32_t tile_subs(int32_t d) { return att_tile(d) >= 16 ? TILE_SUBS : 1; }

static bool tile_path(const attend_job *j) {
    const int32_t ldq = (tile_sub(j->d) + 15) & ~15;
    return j->simd->tile_block && j->simd->tile_q && j->d % 16 == 0 && (tile_chunk(j->d) + 1) * ldq <= TILE_SCRATCH;
}

/* Query vector i of head a of the item: its row of q (and of out). */
static size_t vec_offset(const attend_job *j, const kv_work_item *it, int32_t row0, int32_t a, int32_t i) {
    const int32_t vec = it->v0 + i, r = vec / j->G, h = vec % j->G;
    return ((size_t)(row0 + r) * j->H + (size_t)(it->head + a) * j->G + h) * j->d;
}

static void attend_tile(const attend_job *j, const kv_work_item *it, const key_source *src, int32_t row0,
                        int32_t nv, int32_t pos0, float *qt, float *m, float *l, float *acc) {
    const int32_t d = j->d, G = j->G, kmax = tile_chunk(d), sub = tile_sub(d), n_sub = (nv + sub - 1) / sub;
    LINE_ALIGNED float s[TILE_SCRATCH], kbuf[TILE_CHUNK_ELEMS], vbuf[TILE_CHUNK_ELEMS];
    int32_t pos[ATT_ACC_ELEMS + 16], nts[TILE_SUBS], ldqs[TILE_SUBS]; /* sub-tile t: vectors, lanes */
    /* qt: sub-tile t's d x ldq at t * sub * d, the scale in (s = (scale q) . k),
     * straight from the rows of q */
    for (int32_t t = 0; t < n_sub; t++) {
        const int32_t i0 = t * sub, nt = nts[t] = nv - i0 < sub ? nv - i0 : sub, ldq = ldqs[t] = (nt + 15) & ~15;
        const float *rows[ATT_ACC_ELEMS / 16]; /* nt <= att_tile(d), d >= 16 */
        for (int32_t i = 0; i < nt; i++) rows[i] = j->q + vec_offset(j, it, row0, 0, i0 + i);
        j->simd->tile_q(rows, nt, d, j->scale, ldq, qt + (size_t)i0 * d);
    }
    /* the lanes the kernel reads: up to the last sub-tile's, rounded up to 16 */
    for (int32_t i = 0; i < (n_sub - 1) * sub + ldqs[n_sub - 1]; i++) {
        pos[i] = pos0 + (it->v0 + (i < nv ? i : nv - 1)) / G;
        if (i >= nv) m[i] = -INFINITY, l[i] = 0; /* padding lanes, never read back */
    }
    for (int32_t j0 = it->klo; j0 <= it->khi;) {
        int32_t n = kmax - j0 % kmax;
        if (n > it->khi - j0 + 1) n = it->khi - j0 + 1;
        const float *kc, *vc;
        load_chunk(j->simd, src, j0, n, kbuf, vbuf, &kc, &vc);
        for (int32_t t = 0; t < n_sub; t++) {
            const int32_t i0 = t * sub, nt = nts[t], ldq = ldqs[t];
            /* the chunk is past the sub-tile's last position, or before its first one's window */
            if (j0 > pos[i0 + nt - 1] || (j->window > 0 && j0 + n - 1 <= pos[i0] - j->window)) continue;
            /* only up to its last position: it would mask the keys after it to weights of exactly 0 */
            const int32_t seen = pos[i0 + nt - 1] - j0 + 1 < n ? pos[i0 + nt - 1] - j0 + 1 : n;
            j->simd->tile_block(qt + (size_t)i0 * d, nt, ldq, d, kc, vc, seen, j0, pos + i0, j->window, m + i0,
                                l + i0, acc + (size_t)i0 * d, s);
        }
        j0 += n;
    }
}

/* Decode streams K/V from memory at a few keys per step: the kernels ask for
 * the rows of one (block, K or V, head) slot of the item's traversal while
 * they work on a slot some way before it, about DECODE_PREFETCH_BYTES ahead
 * (at least 2 slots, at most a block's worth), into L2, and for those of the
 * slot right after their own into L1 (simd.h, kv_ahead). Slot f of a block:
 * f < n_heads K of head f, else V of head f - n_heads; past the last slot,
 * the next block's. A K/V row stream needs a few KB in flight to keep one
 * core's loads fed; small slots (q8, d64) need more of them than large. */
enum { DECODE_PREFETCH_BYTES = 6 << 10 };

static int32_t slots_ahead(const kv_work_item *it, int32_t row_bytes) {
    const int32_t slot = 16 * row_bytes, a = (DECODE_PREFETCH_BYTES + slot - 1) / slot;
    return a < 2 ? 2 : a > 2 * it->n_heads ? 2 * it->n_heads : a;
}

/* Where the blocks of an item's decode traversal lie, found once an item:
 * in a page, head it->head's K, V (and a scaled type's scales) at fixed
 * offsets from
 * the page's start, each further head head_step (scale_step) on; in a dense
 * array, one block of all the keys from head it->head's K and V row 0. */
typedef struct {
    const unsigned char *pool;    /* paged: the cache's pages, else NULL */
    const int32_t *table;         /* paged: the sequence's block table */
    size_t page_bytes;
    uintptr_t k, v, ks, vs;       /* paged: offsets in a page (ks, vs: a scaled type's, else 0); dense: addresses */
    size_t head_step, scale_step; /* bytes from one head to the next */
    size_t stride;                /* bytes from one position to the next */
    int32_t block, row_bytes;
    bool scaled;                  /* the rows have scales (paged: ks, vs) */
    bool share;                   /* dense, every head in the item (see block_at's `ask`) */
} block_map;

static block_map item_blocks(const attend_job *j, const kv_work_item *it, const key_source *s) {
    block_map bm = {.block = s->block, .stride = s->stride,
                    .row_bytes = (int32_t)kv_type_row_bytes(kv_type(s->dtype), s->d)};
    if (!s->cache) {
        bm.k = (uintptr_t)s->k, bm.v = (uintptr_t)s->v, bm.head_step = (size_t)bm.row_bytes;
        bm.share = it->n_heads == j->Hkv;
        return bm;
    }
    const kv_cache *c = s->cache;
    const uintptr_t pool = (uintptr_t)c->pages.pool;
    bm.pool = c->pages.pool, bm.table = s->table, bm.page_bytes = c->pages.page_bytes;
    bm.k = (uintptr_t)kv_page_head(c, 0, s->layer, 0, s->head) - pool;
    bm.v = (uintptr_t)kv_page_head(c, 0, s->layer, 1, s->head) - pool;
    bm.head_step = c->pages.head_bytes;
    if (c->pages.row_scales) {
        bm.scaled = true;
        bm.ks = (uintptr_t)kv_page_scales(c, 0, s->layer, 0, s->head) - pool;
        bm.vs = (uintptr_t)kv_page_scales(c, 0, s->layer, 1, s->head) - pool;
        bm.scale_step = (size_t)c->p.page_size * (size_t)c->pages.row_scales * sizeof(float);
    }
    return bm;
}

/* One block of the decode traversal: up to 16 keys from j0, never across a
 * page, and where every head of the item keeps them (rows already offset to
 * j0; a scaled type's scales too, else NULL). n == 0: past the item's keys. Slot f
 * of a block: f < n_heads K of head f, else V of head f - n_heads; ask[f]
 * and ask_bytes, what the kernels ask the memory for of it (kv_ahead): in a
 * page, its rows, one after another; in a dense array, which interleaves the
 * heads row by row, an equal share of the block's K (or V) rows of all heads,
 * the shares covering them once (an item of fewer heads than the array has,
 * too many to take at once, asks for nothing). */
typedef struct {
    int32_t j0, n;
    const unsigned char *k[KV_WIDE_HEADS], *v[KV_WIDE_HEADS];
    const float *ks[KV_WIDE_HEADS], *vs[KV_WIDE_HEADS];
    const unsigned char *ask[2 * KV_WIDE_HEADS];
    int32_t ask_bytes;
} decode_block;

static void block_at(const block_map *bm, const kv_work_item *it, int32_t j0, decode_block *b) {
    b->j0 = j0, b->n = 0, b->ask_bytes = 0;
    if (j0 > it->khi) return;
    const int32_t blk = j0 / bm->block, in_blk = j0 - blk * bm->block, hn = it->n_heads;
    b->n = 16 - j0 % 16;
    if (b->n > bm->block - in_blk) b->n = bm->block - in_blk;
    if (b->n > it->khi - j0 + 1) b->n = it->khi - j0 + 1;
    const uintptr_t page = bm->pool ? (uintptr_t)(bm->pool + (size_t)bm->table[blk] * bm->page_bytes) : 0;
    const uintptr_t k = page + bm->k + (size_t)in_blk * bm->stride, v = page + bm->v + (size_t)in_blk * bm->stride;
    for (int32_t a = 0; a < hn; a++) {
        b->k[a] = (const unsigned char *)(k + a * bm->head_step);
        b->v[a] = (const unsigned char *)(v + a * bm->head_step);
        b->ks[a] = bm->scaled ? (const float *)(page + bm->ks + a * bm->scale_step) + in_blk : NULL;
        b->vs[a] = bm->scaled ? (const float *)(page + bm->vs + a * bm->scale_step) + in_blk : NULL;
    }
    if (bm->pool) {
        b->ask_bytes = b->n * bm->row_bytes;
        for (int32_t a = 0; a < hn; a++) b->ask[a] = b->k[a], b->ask[hn + a] = b->v[a];
    } else if (bm->share) {
        b->ask_bytes = b->n * bm->row_bytes;
        for (int32_t a = 0; a < hn; a++)
            b->ask[a] = b->k[0] + (size_t)a * b->ask_bytes, b->ask[hn + a] = b->v[0] + (size_t)a * b->ask_bytes;
    }
}

/* What the kernel on slot f of `cur` asks for (slots: 2 n_heads a block):
 * slot f + ahead_slots, past the block's last in `next`, and with each of
 * its lines the same line of slot f + 1. */
static kv_ahead slot_ahead(const decode_block *cur, const decode_block *next, int32_t slots, int32_t f,
                           int32_t ahead_slots) {
    const int32_t s = f + ahead_slots, t = f + 1;
    const decode_block *fb = s < slots ? cur : next, *nb = t < slots ? cur : next;
    kv_ahead a = {.p = fb->ask[s < slots ? s : s - slots], .bytes = fb->ask_bytes};
    if (a.bytes > 0) a.near = (uintptr_t)nb->ask[t < slots ? t : t - slots] - (uintptr_t)a.p;
    return a;
}

/* The scales of block b, every head's K and V: a line or two each,
 * asked for a block before the kernels read them, where the slots' rows do
 * not reach. */
static void prefetch_scales(const kv_work_item *it, const decode_block *b) {
    if (b->n == 0 || !b->ks[0]) return;
    for (int32_t a = 0; a < it->n_heads; a++) {
        __builtin_prefetch(b->ks[a], 0, 2), __builtin_prefetch(b->ks[a] + b->n - 1, 0, 2);
        __builtin_prefetch(b->vs[a], 0, 2), __builtin_prefetch(b->vs[a] + b->n - 1, 0, 2);
    }
}

/* The n query vectors q [n][d] as the KV_Q8 integer scores take them: q ~
 * qs qi, one scale per vector, |qi| <= 32767, each element rounded to
 * nearest (about 1e-5 of the vector's largest). False when one has a NaN or
 * an infinity: the f32 path keeps the non-finite rule for it. d % 16 == 0;
 * sixteen elements a step in loops of fixed length, which the compiler takes
 * as vector operations (each split of a long decode quantizes its queries
 * again, so this loop is on decode's path). */
static bool quantize_queries(const float *q, int32_t n, int32_t d, int16_t *qi, float *qs) {
    for (int32_t v = 0; v < n; v++) {
        const float *x = q + (size_t)v * d;
        float mx[16] = {0};
        int bad = 0;
        for (int32_t e = 0; e < d; e += 16)
            for (int32_t k = 0; k < 16; k++) {
                const float a = fabsf(x[e + k]);
                bad |= !(a <= FLT_MAX);
                mx[k] = a > mx[k] ? a : mx[k];
            }
        if (bad) return false;
        float amax = 0;
        for (int32_t k = 0; k < 16; k++) amax = mx[k] > amax ? mx[k] : amax;
        qs[v] = amax / 32767.0f;
        const float s = qs[v] > 0 ? qs[v] : 1.0f; /* an all-zero vector: every x / s is 0 */
        for (int32_t e = 0; e < d; e += 16)
            for (int32_t k = 0; k < 16; k++) {
                const float r = rintf(x[e + k] / s); /* within +-32767 but for rounding */
                qi[(size_t)v * d + e + k] = (int16_t)(r > 32767.0f ? 32767 : r < -32767.0f ? -32767 : (int32_t)r);
            }
    }
    return true;
}

/* The decode path: blocks of up to 16 keys (never across a page), and for
 * each block every KV head of the item in turn, so one item streams its pages
 * front to back. State index a * nv + i: head a of the item, vector i. */
static void attend_decode(const attend_job *j, const kv_work_item *it, int32_t pos0, const float *qbuf, float *m,
                          float *l, float *acc) {
    const int32_t d = j->d, G = j->G, nv = it->v1 - it->v0;
    int32_t lo[KV_DECODE_VECS], hi[KV_DECODE_VECS];
    const key_source first = item_source(j, it);
    /* KV_Q8 on a kernel with integer scores: the queries as int16, once */
    LINE_ALIGNED int16_t qi[ATT_WIDE_ELEMS];
    float qs[KV_WIDE_HEADS * KV_DECODE_VECS];
    const bool q8i = first.dtype == KV_Q8 && j->simd->decode_scores_q8i && d % 32 == 0 &&
                     quantize_queries(qbuf, it->n_heads * nv, d, qi, qs);
    const block_map bm = item_blocks(j, it, &first);
    const int32_t ahead_slots = slots_ahead(it, bm.row_bytes), slots = 2 * it->n_heads;
    /* each block's rows found once, the next one's a block early for the prefetches */
    decode_block blocks[2];
    decode_block *cur = &blocks[0], *next = &blocks[1];
    block_at(&bm, it, it->klo, cur);
    while (cur->n > 0) {
        const int32_t j0 = cur->j0, n = cur->n;
        block_at(&bm, it, j0 + n, next);
        for (int32_t i = 0; i < nv; i++) { /* visible: pos - window < key <= pos */
            const int32_t pos = pos0 + (it->v0 + i) / G;
            lo[i] = j->window > 0 && pos - j->window + 1 > j0 ? pos - j->window + 1 - j0 : 0;
            hi[i] = pos - j0 < n - 1 ? pos - j0 : n - 1;
        }
        prefetch_scales(it, next);
        /* every head's K in the page, then every head's V: two runs through memory */
        LINE_ALIGNED float w[KV_WIDE_HEADS][KV_DECODE_VECS][16];
        float corr[KV_WIDE_HEADS][KV_DECODE_VECS];
        for (int pass = 0; pass < 2; pass++)
            for (int32_t a = 0; a < it->n_heads; a++) {
                const size_t at = (size_t)a * nv;
                const kv_ahead ahead = slot_ahead(cur, next, slots, pass * it->n_heads + a, ahead_slots);
                if (pass == 0 && q8i)
                    j->simd->decode_scores_q8i(qi + at * d, qs + at, nv, d, cur->k[a], first.stride, cur->ks[a],
                                               cur->vs[a], n, lo, hi, m + at, l + at, w[a], corr[a], &ahead);
                else if (pass == 0)
                    j->simd->decode_scores(first.dtype, qbuf + at * d, nv, d, cur->k[a], first.stride, cur->ks[a],
                                           cur->vs[a], n, lo, hi, m + at, l + at, w[a], corr[a], &ahead);
                else
                    j->simd->decode_values(first.dtype, nv, d, cur->v[a], first.stride, n, lo, hi, w[a], corr[a],
                                           acc + at * d, &ahead);
            }
        decode_block *done = cur;
        cur = next, next = done;
    }
}

/* dst = src * s, eight elements a step: a fixed-length inner loop the
 * compiler takes as one vector operation (the same bits as one at a time),
 * so a row streams from memory a few loads per line, not one per element. */
static void scaled_row(float *restrict dst, const float *restrict src, float s, int32_t n) {
    int32_t e = 0;
    for (; e + 8 <= n; e += 8)
        for (int32_t k = 0; k < 8; k++) dst[e + k] = src[e + k] * s;
    for (; e < n; e++) dst[e] = src[e] * s;
}

/* The item's query vectors (head a's vector i at (a nv + i) d) with the
 * scale in, once: s = (scale q) . k. */
static void scaled_queries(const attend_job *j, const kv_work_item *it, int32_t row0, float *qbuf) {
    const int32_t nv = it->v1 - it->v0;
    for (int32_t a = 0; a < it->n_heads; a++)
        for (int32_t i = 0; i < nv; i++)
            scaled_row(qbuf + ((size_t)a * nv + i) * j->d, j->q + vec_offset(j, it, row0, a, i), j->scale, j->d);
}

/* One work item: the online softmax of its query vectors over its keys. */
static void run_item(void *ctx, int32_t index, int32_t thread) {
    const attend_job *j = ctx;
    const kv_work_item *it = &j->items[index];
    const int32_t d = j->d, nv = it->v1 - it->v0, hn = it->n_heads;
    int32_t row0, T, S;
    item_seq(j, it, &row0, &T, &S);
    LINE_ALIGNED float qbuf[ITEM_ELEMS], acc[ITEM_ELEMS];
    float m[ATT_ACC_ELEMS + 16], l[ATT_ACC_ELEMS + 16];
    for (int32_t i = 0; i < hn * nv; i++) m[i] = -INFINITY, l[i] = 0;
    memset(acc, 0, sizeof(float) * (size_t)hn * nv * d);
    if (decode_shaped(j, nv)) {
        scaled_queries(j, it, row0, qbuf);
        attend_decode(j, it, S - T, qbuf, m, l, acc);
    } else if (tile_path(j)) {
        key_source src = item_source(j, it);
        attend_tile(j, it, &src, row0, nv, S - T, qbuf, m, l, acc); /* qbuf holds q transposed */
    } else {
        key_source src = item_source(j, it);
        scaled_queries(j, it, row0, qbuf);
        attend_chunks(j, it, &src, qbuf, nv, S - T, m, l, acc);
    }
    if (it->partial >= 0) { /* a split: keep, per head, m [nv] | l [nv] | acc [nv][d] */
        for (int32_t a = 0; a < hn; a++) {
            float *p = j->partials + it->partial + (size_t)a * nv * (d + 2);
            memcpy(p, m + a * nv, sizeof(float) * (size_t)nv);
            memcpy(p + nv, l + a * nv, sizeof(float) * (size_t)nv);
            memcpy(p + 2 * nv, acc + (size_t)a * nv * d, sizeof(float) * (size_t)nv * d);
        }
        return;
    }
    for (int32_t a = 0; a < hn; a++)
        for (int32_t i = 0; i < nv; i++) {
            float *o = j->out + vec_offset(j, it, row0, a, i);
            const float inv = 1.0f / l[a * nv + i], *ai = acc + ((size_t)a * nv + i) * d;
            scaled_row(o, ai, inv, d);
        }
    (void)thread;
}

/* out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), M = max_s m_s, for
 * the n consecutive split items starting at `first`, in split order. */
static void combine(const attend_job *j, int32_t first, int32_t n) {
    const kv_work_item *it = &j->items[first];
    const int32_t d = j->d, nv = it->v1 - it->v0;
    int32_t row0, T, S;
    item_seq(j, it, &row0, &T, &S);
    LINE_ALIGNED float sum[KV_MAX_HEAD_DIM];
    for (int32_t a = 0; a < it->n_heads; a++)
        for (int32_t i = 0; i < nv; i++) {
            const size_t head_off = (size_t)a * nv * (d + 2);
            float M = -INFINITY, L = 0;
            for (int32_t k = 0; k < n; k++) {
                const float mk = j->partials[j->items[first + k].partial + head_off + i];
                M = mk > M ? mk : M;
            }
            memset(sum, 0, sizeof(float) * (size_t)d);
            for (int32_t k = 0; k < n; k++) {
                const float *p = j->partials + j->items[first + k].partial + head_off;
                if (p[i] == -INFINITY) continue; /* this split saw none of the vector's keys */
                const float w = kv_corr_exp(p[i], M); /* never 0: an infinite acc stays infinite */
                L += p[nv + i] * w;
                j->simd->axpy_rows(&w, p + 2 * nv + (size_t)i * d, 1, d, 1.0f, sum);
            }
            scaled_row(j->out + vec_offset(j, it, row0, a, i), sum, 1.0f / L, d);
        }
}

/* The groups of a call in a fixed order: (sequence, KV head, tile of up to
 * att_tile(d) query vectors, or of tile_subs(d) sub-tiles on the tile path).
 * Each becomes one item, or one per split. Waves are cut where the items or
 * the split workspace run out. */
typedef struct {
    int32_t b, head, v0; /* the next group to emit */
} cursor;

/* Bytes of K/V one key of a paged item of hn heads streams: its share of a
 * page's layer slice (a scaled type's scales included). */
static size_t split_key_bytes(const kv_cache *c, int32_t hn) {
    return (size_t)hn * c->pages.layer_bytes / ((size_t)c->p.page_size * (size_t)c->p.n_kv_heads);
}

static void run_f32(attend_job *j, kv_pool *pool, int32_t n_seqs, kv_work_item *items, int32_t item_cap,
                    float *partials, size_t partial_cap) {
    const int32_t G = j->G, tile = tile_path(j) ? tile_subs(j->d) * tile_sub(j->d) : att_tile(j->d);
    cursor at = {0, 0, 0};
    for (;;) {
        int32_t n_items = 0;
        size_t used = 0;
        while (at.b < n_seqs && n_items < item_cap) {
            kv_work_item probe = {.b = at.b};
            int32_t row0, T, S;
            item_seq(j, &probe, &row0, &T, &S);
            if (T == 0 || at.head == j->Hkv) {
                at = (cursor){at.b + 1, 0, 0};
                continue;
            }
            /* decode: all heads in one item, so its pages stream front to back */
            const bool wide = at.v0 == 0 && at.head == 0 && decode_shaped(j, T * G) && j->Hkv <= KV_WIDE_HEADS &&
                              (size_t)j->Hkv * T * G * j->d <= ATT_WIDE_ELEMS;
            const int32_t hn = wide ? j->Hkv : 1;
            const int32_t v1 = wide ? T * G : at.v0 + tile < T * G ? at.v0 + tile : T * G;
            const int32_t first = S - T + at.v0 / G, last = S - T + (v1 - 1) / G;
            const int32_t lo = j->window > 0 && first - j->window + 1 > 0 ? first - j->window + 1 : 0;
            kv_work_item it = {.b = at.b, .head = at.head, .n_heads = hn, .v0 = at.v0, .v1 = v1, .klo = lo,
                               .khi = last, .partial = -1};
            const size_t split_size = (size_t)hn * (size_t)(v1 - at.v0) * (size_t)(j->d + 2);
            const bool may_split = T <= KV_SPLIT_ROWS && partials; /* decode-like: prefill groups never split */
            const int32_t len = may_split ? kv_split_len(last - lo + 1, split_key_bytes(j->cache, hn)) : 0;
            int32_t splits = may_split ? last / len - lo / len + 1 : 1;
            size_t need = (size_t)splits * split_size;
            if (splits > 1 && (need > partial_cap || splits > item_cap)) splits = 1; /* too long to split here */
            if (splits > 1 && (used + need > partial_cap || n_items + splits > item_cap)) break; /* next wave */
            if (splits == 1) {
                items[n_items++] = it;
            } else {
                for (int32_t k = 0; k < splits; k++) {
                    kv_work_item sp = it;
                    sp.klo = k == 0 ? lo : (lo / len + k) * len;
                    sp.khi = k == splits - 1 ? last : (lo / len + k + 1) * len - 1;
                    sp.partial = (int32_t)(used + (size_t)k * split_size);
                    items[n_items++] = sp;
                }
                used += need;
            }
            if (wide) { /* the whole sequence is done */
                at = (cursor){at.b + 1, 0, 0};
                continue;
            }
            /* advance: next tile, next head, next sequence */
            at.v0 = v1;
            if (at.v0 >= T * G) at.v0 = 0, at.head++;
        }
        if (n_items == 0) return;
        j->items = items;
        j->partials = partials;
        kv_pool_run(pool, n_items, run_item, j);
        for (int32_t i = 0; i < n_items;) { /* combine each split group, in order */
            int32_t n = 1;
            if (items[i].partial >= 0)
                while (i + n < n_items && items[i + n].partial >= 0 && items[i + n].b == items[i].b &&
                       items[i + n].head == items[i].head && items[i + n].v0 == items[i].v0)
                    n++;
            if (items[i].partial >= 0) combine(j, i, n);
            i += n;
        }
    }
}

static double default_scale(double scale, int32_t d) { return scale != 0 ? scale : 1.0 / sqrt(d); }

/* ------------------------------------------------------------------ dense */

static int dense_check(int32_t T, int32_t S, int32_t H, int32_t Hkv, int32_t d, const void *q,
                       const void *k, const void *v, const void *out, int32_t window) {
    if (T < 0 || S < 0 || H <= 0 || Hkv <= 0 || d <= 0 || d > KV_MAX_HEAD_DIM) return KV_ERR_SHAPE;
    if (H % Hkv) return KV_ERR_HEADS;
    if (T > S) return KV_ERR_LENGTH;
    if (window < 0) return KV_ERR_WINDOW;
    if (T > 0 && (!q || !k || !v || !out)) return KV_ERR_NULL;
    return KV_OK;
}

int kv_attention_f64(int32_t T, int32_t S, int32_t H, int32_t Hkv, int32_t d, const double *q,
                     const double *k, const double *v, double *out, int32_t window, double scale) {
    int rc = dense_check(T, S, H, Hkv, d, q, k, v, out, window);
    if (rc || T == 0) return rc;
    const int32_t G = H / Hkv;
    for (int32_t g = 0; g < Hkv; g++) {
        key_source src = {.dtype = KV_F64, .d = d, .block = S, .stride = (size_t)Hkv * d * sizeof(double),
                          .k = (const unsigned char *)(k + (size_t)g * d),
                          .v = (const unsigned char *)(v + (size_t)g * d)};
        kv_attend_group_f64(&src, q + (size_t)g * G * d, out + (size_t)g * G * d, (size_t)H * d, T, G,
                            S - T, window, default_scale(scale, d));
    }
    return KV_OK;
}

int kv_attention_f32(int32_t T, int32_t S, int32_t H, int32_t Hkv, int32_t d, const float *q,
                     const float *k, const float *v, float *out, int32_t window, float scale) {
    int rc = dense_check(T, S, H, Hkv, d, q, k, v, out, window);
    if (rc || T == 0) return rc;
    attend_job j = {.simd = kv_simd_active(), .H = H, .G = H / Hkv, .d = d, .window = window,
                    .scale = (float)default_scale(scale, d), .q = q, .out = out, .T = T, .S = S, .Hkv = Hkv,
                    .k = k, .v = v};
    kv_work_item items[64];
    run_f32(&j, NULL, 1, items, 64, NULL, 0); /* no workspace: never split */
    return KV_OK;
}

/* ------------------------------------------------------------------ paged */

static int attend_check(const kv_cache *c, int32_t layer, const kv_batch *b, int32_t H, bool f64,
                        const void *q, const void *out, int32_t *rows) {
    if (!c || !b) return KV_ERR_NULL;
    if (kv_type_f64(c->p.dtype) != f64) return KV_ERR_DTYPE;
    if (layer < 0 || layer >= c->p.n_layers || H <= 0) return KV_ERR_SHAPE;
    if (H % c->p.n_kv_heads) return KV_ERR_HEADS;
    int rc = kv_batch_check(c, b, rows);
    if (rc) return rc;
    if (*rows > 0 && (!q || !out)) return KV_ERR_NULL;
    return KV_OK;
}

int kv_attend_f64(const kv_cache *c, int32_t layer, const kv_batch *b, int32_t H, const double *q,
                  double *out, double scale) {
    int32_t rows;
    int rc = attend_check(c, layer, b, H, true, q, out, &rows);
    if (rc || rows == 0) return rc;
    const int32_t Hkv = c->p.n_kv_heads, d = c->p.head_dim, G = H / Hkv;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const int32_t seq = b->seqs[i], T = b->row_start[i + 1] - b->row_start[i];
        if (T == 0) continue;
        for (int32_t g = 0; g < Hkv; g++) {
            key_source src = {.dtype = KV_F64, .d = d, .block = c->p.page_size, .stride = c->pages.row_bytes,
                              .cache = c, .table = kv_table(c, seq), .layer = layer, .head = g};
            size_t off = ((size_t)b->row_start[i] * H + (size_t)g * G) * d;
            kv_attend_group_f64(&src, q + off, out + off, (size_t)H * d, T, G, c->seqs[seq].len - T,
                                c->p.window, default_scale(scale, d));
        }
    }
    return KV_OK;
}

int kv_attend_f32(const kv_cache *c, int32_t layer, const kv_batch *b, int32_t H, const float *q,
                  float *out, float scale) {
    int32_t rows;
    int rc = attend_check(c, layer, b, H, false, q, out, &rows);
    if (rc || rows == 0) return rc;
    attend_job j = {.cache = c, .batch = b, .simd = kv_simd_active(), .layer = layer, .H = H,
                    .G = H / c->p.n_kv_heads, .d = c->p.head_dim, .Hkv = c->p.n_kv_heads,
                    .scale = (float)default_scale(scale, c->p.head_dim), .window = c->p.window, .q = q, .out = out};
    /* concurrent readers of one cache take turns on its work area */
    kv_attend_work *w = c->work;
    pthread_mutex_lock(&w->lock);
    run_f32(&j, w->threads, b->n_seqs, w->items, w->item_cap, w->partials, w->partial_cap);
    pthread_mutex_unlock(&w->lock);
    return KV_OK;
}

/* ------------------------------------------------------------------ work area */

kv_attend_work *kv_attend_work_create(int32_t max_seq_len, int32_t n_kv_heads) {
    kv_attend_work *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    pthread_mutex_init(&w->lock, NULL);
    /* room for every split of one longest sequence (all heads), within 64 MB;
     * untouched, the memory costs nothing */
    size_t splits = (size_t)max_seq_len / KV_SPLIT + 2;
    if (splits < KV_SPLIT_SHORT + 2) splits = KV_SPLIT_SHORT + 2; /* a short group's (kv_split_len) */
    w->partial_cap = splits * (ATT_WIDE_ELEMS + 2 * (size_t)KV_DECODE_VECS * (size_t)n_kv_heads);
    if (w->partial_cap > (16u << 20)) w->partial_cap = 16u << 20;
    w->item_cap = 8192;
    w->partials = malloc(w->partial_cap * sizeof *w->partials);
    w->items = malloc((size_t)w->item_cap * sizeof *w->items);
    if (!w->partials || !w->items) {
        kv_attend_work_free(w);
        return NULL;
    }
    return w;
}

void kv_attend_work_free(kv_attend_work *w) {
    if (!w) return;
    pthread_mutex_destroy(&w->lock);
    free(w->partials);
    free(w->items);
    free(w);
}

void kv_attend_work_set_pool(kv_attend_work *w, kv_pool *pool) { w->threads = pool; }
