/* src/persist.c - save one sequence to a file and restore it into a cache.
 *
 * File layout (native little-endian; all integers 32-bit unless noted):
 *     magic "KVCSEQ01" | byte-order mark 0x01020304 | n_layers | n_kv_heads |
 *     head_dim | dtype | window | page_size (informational) | len | first_pos |
 *     tokens [len - first_pos] |
 *     for each position in [first_pos, len), for each layer:
 *         K [Hkv][d] | V [Hkv][d] as stored | (q8) Kscale [Hkv] | Vscale [Hkv] f32 |
 *     checksum: u64 FNV-1a of every byte before it
 * Positions rather than pages are stored, so a file restores into a cache of
 * any page size. first_pos > 0 when a window had evicted older positions. */
#include <stdio.h>

#include "internal.h"

static const char MAGIC[8] = {'K', 'V', 'C', 'S', 'E', 'Q', '0', '1'};
enum { HEADER_WORDS = 10 };

typedef struct {
    FILE *f;
    uint64_t hash; /* FNV-1a of what went through */
    bool failed;
} stream;

static void fnv(stream *s, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) s->hash = (s->hash ^ b[i]) * 0x100000001B3ull;
}

static void put(stream *s, const void *p, size_t n) {
    fnv(s, p, n);
    if (!s->failed && fwrite(p, 1, n, s->f) != n) s->failed = true;
}

static bool get(stream *s, void *p, size_t n) {
    if (s->failed || fread(p, 1, n, s->f) != n) return !(s->failed = true);
    fnv(s, p, n);
    return true;
}

/* Bytes of one position in one layer, and where its pieces are. */
static size_t position_bytes(const kv_cache *c) {
    return 2 * (size_t)c->p.n_kv_heads * (c->pages.row_bytes + (size_t)c->pages.row_scales * sizeof(float));
}

/* Visits every stored piece of position pos in layer l: K and V of each head,
 * then their scales (a scaled type), calling io(stream, pointer, bytes). */
static void visit_position(const kv_cache *c, int32_t page, int32_t slot, int32_t l, stream *s,
                           void (*io)(stream *, void *, size_t)) {
    const size_t row = c->pages.row_bytes;
    for (int kv = 0; kv < 2; kv++)
        for (int32_t h = 0; h < c->p.n_kv_heads; h++)
            io(s, kv_page_head(c, page, l, kv, h) + (size_t)slot * row, row);
    if (c->pages.row_scales)
        for (int kv = 0; kv < 2; kv++)
            for (int32_t h = 0; h < c->p.n_kv_heads; h++)
                io(s, kv_page_row_scales(c, page, l, kv, h, slot), (size_t)c->pages.row_scales * sizeof(float));
}

static void io_put(stream *s, void *p, size_t n) { put(s, p, n); }
static void io_get(stream *s, void *p, size_t n) { get(s, p, n); }

/* Writes the sequence at f's position; true when every write went through. */
static bool save_stream(const kv_cache *c, int32_t seq, FILE *f) {
    const kv_seq_state *q = &c->seqs[seq];
    const int32_t P = c->p.page_size, first_pos = q->first_block * P;
    const int32_t *t = kv_table(c, seq);
    stream s = {.f = f, .hash = 0xCBF29CE484222325ull};
    int32_t header[HEADER_WORDS] = {0x01020304, c->p.n_layers, c->p.n_kv_heads, c->p.head_dim,
                                    (int32_t)c->p.dtype, c->p.window, P, q->len, first_pos};
    put(&s, MAGIC, sizeof MAGIC);
    put(&s, header, sizeof header);
    for (int32_t pos = first_pos; pos < q->len; pos++)
        put(&s, &c->prefix.page_tokens[(size_t)t[pos / P] * P + pos % P], sizeof(int32_t));
    for (int32_t pos = first_pos; pos < q->len; pos++)
        for (int32_t l = 0; l < c->p.n_layers; l++)
            visit_position(c, t[pos / P], pos % P, l, &s, io_put);
    uint64_t sum = s.hash;
    put(&s, &sum, sizeof sum);
    return !s.failed;
}

int kv_seq_save(const kv_cache *c, int32_t seq, const char *path) {
    if (!c || !path) return KV_ERR_NULL;
    if (seq < 0 || seq >= c->p.max_seqs || !c->seqs[seq].live) return KV_ERR_SEQ;
    FILE *f = fopen(path, "wb");
    if (!f) return KV_ERR_IO;
    bool ok = save_stream(c, seq, f);
    if (fclose(f) != 0) ok = false;
    if (!ok) remove(path);
    return ok ? KV_OK : KV_ERR_IO;
}

int kv_seq_save_file(const kv_cache *c, int32_t seq, FILE *f) {
    if (!c || !f) return KV_ERR_NULL;
    if (seq < 0 || seq >= c->p.max_seqs || !c->seqs[seq].live) return KV_ERR_SEQ;
    return save_stream(c, seq, f) ? KV_OK : KV_ERR_IO;
}

/* Reads and checks the header; on success *len and *first_pos are set. */
static int read_header(const kv_cache *c, stream *s, int32_t *len, int32_t *first_pos) {
    char magic[sizeof MAGIC];
    int32_t h[HEADER_WORDS];
    if (!get(s, magic, sizeof magic) || memcmp(magic, MAGIC, sizeof MAGIC) != 0) return KV_ERR_FORMAT;
    if (!get(s, h, sizeof h) || h[0] != 0x01020304) return KV_ERR_FORMAT;
    if (h[1] != c->p.n_layers || h[2] != c->p.n_kv_heads || h[3] != c->p.head_dim ||
        h[4] != (int32_t)c->p.dtype || h[5] != c->p.window)
        return KV_ERR_MISMATCH;
    *len = h[7];
    *first_pos = h[8];
    if (*len < 0 || *first_pos < 0 || *first_pos > *len) return KV_ERR_FORMAT;
    /* Only a window evicts, and never a key the next query sees (at len: keys
     * j > len - window); the positions of the first page below first_pos are
     * restored as zeros, which that query must not see either. */
    if (*first_pos > 0 && (c->p.window == 0 || (int64_t)*first_pos > (int64_t)*len - c->p.window + 1))
        return KV_ERR_FORMAT;
    if (*first_pos > 0 && c->p.no_evict) return KV_ERR_MISMATCH; /* saved by a cache that evicts */
    if (*len > c->p.max_seq_len) return KV_ERR_CAPACITY;
    return KV_OK;
}

/* Restores the sequence that starts at f's position. whole_file: nothing
 * may follow it. f is left after the checksum on success. */
static int restore_stream(kv_cache *c, FILE *f, bool whole_file, int32_t *seq_out) {
    long start = ftell(f);
    if (start < 0) return KV_ERR_IO;
    stream s = {.f = f, .hash = 0xCBF29CE484222325ull};
    int32_t len, first_pos;
    int rc = read_header(c, &s, &len, &first_pos);
    if (rc) return rc;

    /* Pass 1: the size must be exact and the checksum right before anything changes. */
    const uint64_t body = (uint64_t)(len - first_pos) * (sizeof(int32_t) + position_bytes(c) * (uint64_t)c->p.n_layers);
    unsigned char buf[4096];
    for (uint64_t left = body; left > 0;) {
        size_t n = left < sizeof buf ? (size_t)left : sizeof buf;
        if (!get(&s, buf, n)) break;
        left -= n;
    }
    uint64_t expect = s.hash, sum;
    if (s.failed || fread(&sum, 1, sizeof sum, s.f) != sizeof sum || sum != expect ||
        (whole_file && fgetc(s.f) != EOF))
        return KV_ERR_FORMAT;
    long end = ftell(f);
    const int32_t P = c->p.page_size, first_block = first_pos / P;
    const int32_t blocks = (int32_t)(((int64_t)len + P - 1) / P);
    if (blocks - first_block > c->pages.n_free + c->prefix.n_cached) return KV_ERR_OUT_OF_PAGES;
    int32_t seq;
    if ((rc = kv_seq_new(c, &seq))) return rc;

    /* Pass 2: into pages. */
    kv_seq_state *q = &c->seqs[seq];
    int32_t *t = kv_table(c, seq);
    for (int32_t i = first_block; i < blocks; i++) {
        t[i] = kv_page_take(c);
        memset(c->pages.pool + (size_t)t[i] * c->pages.page_bytes, 0, c->pages.page_bytes);
        for (int32_t j = 0; j < P; j++) c->prefix.page_tokens[(size_t)t[i] * P + j] = -1;
    }
    q->len = len;
    q->first_block = q->named_blocks = first_block;
    s.failed = fseek(s.f, start + (long)(sizeof MAGIC + HEADER_WORDS * sizeof(int32_t)), SEEK_SET) != 0;
    for (int32_t pos = first_pos; pos < len; pos++)
        get(&s, &c->prefix.page_tokens[(size_t)t[pos / P] * P + pos % P], sizeof(int32_t));
    for (int32_t pos = first_pos; pos < len; pos++)
        for (int32_t l = 0; l < c->p.n_layers; l++) visit_position(c, t[pos / P], pos % P, l, &s, io_get);
    if (s.failed || end < 0 || fseek(f, end, SEEK_SET) != 0) { /* the file changed under us: give everything back */
        kv_seq_remove(c, seq);
        return KV_ERR_IO;
    }
    *seq_out = seq;
    return KV_OK;
}

int kv_seq_restore(kv_cache *c, const char *path, int32_t *seq_out) {
    if (!c || !path || !seq_out) return KV_ERR_NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return KV_ERR_IO;
    int rc = restore_stream(c, f, true, seq_out);
    fclose(f);
    return rc;
}

int kv_seq_restore_file(kv_cache *c, FILE *f, int32_t *seq_out) {
    if (!c || !f || !seq_out) return KV_ERR_NULL;
    return restore_stream(c, f, false, seq_out);
}
