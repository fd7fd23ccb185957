/* engine/text/tokenizer_encode.c - text to token ids: special tokens are cut out
 * of the text first, then each fragment is encoded by byte-level BPE (within
 * pre-tokenizer pieces, merging by rank) or SentencePiece-style (merging by
 * score, with byte fallback). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"
#include "unicode.h"

/* A candidate merge of the symbol at pos with the one after it. */
typedef struct {
    double key;     /* lower pops first: BPE rank, SPM -score */
    int32_t pos;    /* index of the left symbol; ties pop leftmost first */
    int32_t a, b;   /* BPE: left and right ids it was found for; SPM: a = merged length */
    int32_t result; /* token id of the merged symbol */
} bigram;

/* Scratch for one llm_tokenize call; every array grows on demand. Symbols are
 * a doubly linked list over an array indexed by position, so merging is O(1)
 * and a heap of candidates keeps a piece of n symbols O(n log n). */
typedef struct {
    const llm_tokenizer *t;
    const char *text;       /* the text being encoded (pieces are offsets into it) */
    int32_t *ids;           /* [n_ids] output so far */
    size_t n_ids, cap_ids;
    llm_pchar *pc;          /* [cap_pc] decoded characters for the pre-tokenizer */
    size_t cap_pc;
    int32_t *sym_id;        /* [cap_sym] token id of each symbol, -1 when it is none */
    int32_t *sym_start;     /* [cap_sym] SPM: byte offset of the symbol in buf */
    int32_t *sym_len;       /* [cap_sym] byte length; 0 once merged into its left neighbour */
    int32_t *sym_prev;      /* [cap_sym] previous live symbol, -1 at the start */
    int32_t *sym_next;      /* [cap_sym] next live symbol, -1 at the end */
    size_t cap_sym;
    bigram *heap;           /* [n_heap] binary min-heap on (key, pos) */
    size_t n_heap, cap_heap;
    char *buf;              /* SPM: escaped fragment; BPE: byte-unicode form of a piece */
    size_t cap_buf;
    char *fixed;            /* BPE: a malformed fragment re-encoded (bpe_normalize_utf8) */
    size_t cap_fixed;
} work;

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static int grow_syms(work *w, size_t n) {
    if (n <= w->cap_sym) return 0;
    size_t c = w->cap_sym;
    int32_t **arrs[5] = {&w->sym_id, &w->sym_start, &w->sym_len, &w->sym_prev, &w->sym_next};
    for (int i = 0; i < 5; i++) {
        c = w->cap_sym;
        if (grow((void **)arrs[i], &c, n, sizeof(int32_t))) return -1;
    }
    w->cap_sym = c;
    return 0;
}

static void work_free(work *w) {
    free(w->ids);
    free(w->pc);
    free(w->sym_id);
    free(w->sym_start);
    free(w->sym_len);
    free(w->sym_prev);
    free(w->sym_next);
    free(w->heap);
    free(w->buf);
    free(w->fixed);
}

static int emit_id(work *w, int32_t id) {
    if (grow((void **)&w->ids, &w->cap_ids, w->n_ids + 1, sizeof(int32_t))) return -1;
    w->ids[w->n_ids++] = id;
    return 0;
}

static int bigram_less(const bigram *x, const bigram *y) {
    return x->key < y->key || (x->key == y->key && x->pos < y->pos);
}

static int heap_push(work *w, bigram g) {
    if (grow((void **)&w->heap, &w->cap_heap, w->n_heap + 1, sizeof(bigram))) return -1;
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!bigram_less(&g, &w->heap[up])) break;
        w->heap[i] = w->heap[up];
        i = up;
    }
    w->heap[i] = g;
    return 0;
}

static bigram heap_pop(work *w) {
    bigram top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bigram_less(&w->heap[c + 1], &w->heap[c])) c++;
        if (!bigram_less(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

/* Unlink symbol r (the right neighbour of l) after merging it into l. */
static void sym_unlink(work *w, int32_t l, int32_t r) {
    w->sym_next[l] = w->sym_next[r];
    if (w->sym_next[r] >= 0) w->sym_prev[w->sym_next[r]] = l;
    w->sym_len[r] = 0;
}

/* --- byte-level BPE */

static int bpe_push(work *w, int32_t l) {
    if (l < 0) return 0;
    int32_t r = w->sym_next[l];
    if (r < 0) return 0;
    int32_t a = w->sym_id[l], b = w->sym_id[r];
    if (a < 0 || b < 0) return 0;
    const llm_tokenizer *t = w->t;
    for (uint32_t h = hash_pair(a, b) & t->merge_mask;; h = (h + 1) & t->merge_mask) {
        const merge_slot *m = &t->merge_map[h];
        if (m->left < 0) return 0;
        if (m->left == a && m->right == b) return heap_push(w, (bigram){m->rank, l, a, b, m->result});
    }
}

/* Emit a symbol's token. A byte the vocabulary has no token for is dropped,
 * as llama.cpp and HF do: byte-level vocabularies name their unknown token but
 * never emit it, and SmolLM's (<|endoftext|>) would end the text. */
static int emit_sym(work *w, int32_t id) { return id >= 0 ? emit_id(w, id) : 0; }

/* Merge the bytes of one pre-tokenized piece and emit its tokens. */
static int bpe_piece(void *ctx, size_t start, size_t end) {
    work *w = ctx;
    const llm_tokenizer *t = w->t;
    const unsigned char *s = (const unsigned char *)w->text + start;
    size_t n = end - start;
    if (n == 1) return emit_sym(w, t->byte_tok[s[0]]);
    if (t->ignore_merges) {
        if (grow((void **)&w->buf, &w->cap_buf, 2 * n, 1)) return -1;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) k += (size_t)llm_utf8_encode(byte_to_cp(s[i]), w->buf + k);
        int32_t id = lookup_mergeable(t, w->buf, k);
        if (id >= 0) return emit_id(w, id);
    }
    if (grow_syms(w, n)) return -1;
    for (size_t i = 0; i < n; i++) {
        w->sym_id[i] = t->byte_tok[s[i]];
        w->sym_len[i] = 1;
        w->sym_prev[i] = (int32_t)i - 1;
        w->sym_next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    w->n_heap = 0;
    if (t->merge_map) {
        for (size_t i = 0; i + 1 < n; i++)
            if (bpe_push(w, (int32_t)i)) return -1;
    }
    while (w->n_heap) {
        bigram g = heap_pop(w);
        int32_t l = g.pos, r = w->sym_next[l];
        /* Stale candidates (a side has merged since) no longer match the ids. */
        if (w->sym_len[l] == 0 || w->sym_id[l] != g.a || r < 0 || w->sym_id[r] != g.b) continue;
        w->sym_id[l] = g.result;
        w->sym_len[l] += w->sym_len[r];
        sym_unlink(w, l, r);
        if (bpe_push(w, w->sym_prev[l]) || bpe_push(w, l)) return -1;
    }
    for (int32_t i = 0; i >= 0; i = w->sym_next[i])
        if (emit_sym(w, w->sym_id[i])) return -1;
    return 0;
}

/* One code point of s[0..n) as llama.cpp reads UTF-8 before byte-level BPE:
 * the length the lead byte announces, its continuation bytes checked, overlong
 * forms and surrogates taken as they decode. Anything else, and a value past
 * U+10FFFF, is U+FFFD for one byte. Returns the bytes consumed. */
static int bpe_read_cp(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char b = s[0];
    int len = b < 0x80 ? 1 : b < 0xC0 ? 0 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : b < 0xF8 ? 4 : 0;
    uint32_t c = len == 1 ? b : len == 2 ? b & 0x1Fu : len == 3 ? b & 0x0Fu : b & 0x07u;
    if (len == 0 || (size_t)len > n) len = 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) len = 0;
        c = (c << 6) | (s[i] & 0x3Fu);
    }
    if (len == 0 || c > 0x10FFFF) {
        *cp = 0xFFFD;
        return 1;
    }
    *cp = c;
    return len;
}

/* Byte-level BPE sees malformed UTF-8 as llama.cpp does (bpe_read_cp): when
 * text[0..n) is not well-formed, w->fixed receives it re-encoded from those
 * code points and *n its length. Returns the text to encode, NULL when out of
 * memory. */
static const char *bpe_normalize_utf8(work *w, const char *text, size_t *n) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    for (uint32_t cp; i < *n;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int k = llm_utf8_decode(s + i, *n - i, &cp);
        if (cp >= LLM_CP_INVALID_BASE) break;
        i += (size_t)k;
    }
    if (i == *n) return text;
    if (grow((void **)&w->fixed, &w->cap_fixed, 3 * *n, 1)) return NULL; /* U+FFFD: 3 bytes per byte */
    memcpy(w->fixed, text, i);
    size_t k = i;
    for (uint32_t cp; i < *n;) {
        i += (size_t)bpe_read_cp(s + i, *n - i, &cp);
        k += (size_t)llm_utf8_encode(cp, w->fixed + k);
    }
    *n = k;
    return w->fixed;
}

static int bpe_fragment(work *w, size_t start, size_t end) {
    size_t n = end - start;
    const char *saved = w->text, *text = bpe_normalize_utf8(w, w->text + start, &n);
    if (!text || grow((void **)&w->pc, &w->cap_pc, n, sizeof(llm_pchar))) return -1;
    w->text = text;
    int rc = llm_pre_split(w->t->pre, w->text, n, w->pc, bpe_piece, w);
    w->text = saved;
    return rc;
}

/* --- SentencePiece-style */

static int spm_push(work *w, int32_t l) {
    if (l < 0) return 0;
    int32_t r = w->sym_next[l];
    if (r < 0) return 0;
    int32_t n = w->sym_len[l] + w->sym_len[r];
    int32_t id = lookup_mergeable(w->t, w->buf + w->sym_start[l], (size_t)n);
    if (id < 0) return 0;
    return heap_push(w, (bigram){-(double)w->t->score[id], l, n, 0, id});
}

/* Bytes in the character lead byte b starts: by its top four bits, so a
 * continuation byte alone is 1 and 0xF8..0xFF count as 4-byte leads. */
static int spm_char_len(unsigned char b) {
    static const unsigned char len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[b >> 4];
}

/* Encode text[start..end) SentencePiece-style; prefix: add the leading '▁'. */
static int spm_fragment(work *w, size_t start, size_t end, int prefix) {
    const llm_tokenizer *t = w->t;
    const unsigned char *s = (const unsigned char *)w->text + start;
    size_t n = end - start, spaces = 0;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    size_t m = n + 2 * spaces + (prefix ? 3 : 0);
    if (grow((void **)&w->buf, &w->cap_buf, m, 1) || grow_syms(w, m)) return -1;
    size_t k = 0;
    if (prefix) memcpy(w->buf, "\xE2\x96\x81", 3), k = 3;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(w->buf + k, "\xE2\x96\x81", 3);
            k += 3;
        } else {
            w->buf[k++] = (char)s[i];
        }
    }
    /* One symbol per character, as long as its lead byte says (up to the end
     * of the text) without validating what follows, as llama.cpp splits: a
     * malformed sequence becomes one symbol whose bytes fall back together. */
    int32_t ns = 0;
    for (size_t i = 0; i < m; ns++) {
        int len = spm_char_len((unsigned char)w->buf[i]);
        if ((size_t)len > m - i) len = (int)(m - i);
        w->sym_start[ns] = (int32_t)i;
        w->sym_len[ns] = len;
        w->sym_id[ns] = -1; /* looked up at the end unless merged */
        w->sym_prev[ns] = ns - 1;
        w->sym_next[ns] = i + (size_t)len < m ? ns + 1 : -1;
        i += (size_t)len;
    }
    w->n_heap = 0;
    for (int32_t i = 0; i + 1 < ns; i++)
        if (spm_push(w, i)) return -1;
    while (w->n_heap) {
        bigram g = heap_pop(w);
        int32_t l = g.pos, r = w->sym_next[l];
        /* Lengths only grow, so an unchanged sum means an unchanged pair. */
        if (w->sym_len[l] == 0 || r < 0 || w->sym_len[l] + w->sym_len[r] != g.a) continue;
        w->sym_id[l] = g.result;
        w->sym_len[l] = g.a;
        sym_unlink(w, l, r);
        if (spm_push(w, w->sym_prev[l]) || spm_push(w, l)) return -1;
    }
    for (int32_t i = ns ? 0 : -1; i >= 0; i = w->sym_next[i]) {
        const char *p = w->buf + w->sym_start[i];
        int32_t id = w->sym_id[i] >= 0 ? w->sym_id[i] : lookup_mergeable(t, p, (size_t)w->sym_len[i]);
        if (id >= 0) {
            if (emit_id(w, id)) return -1;
            continue;
        }
        /* Byte fallback: a character the vocabulary lacks becomes its bytes. */
        for (int32_t j = 0; j < w->sym_len[i]; j++) {
            int32_t b = t->byte_tok[(unsigned char)p[j]];
            if (b < 0) {
                if (t->unk >= 0 && emit_id(w, t->unk)) return -1;
                break; /* one unknown per character, as SentencePiece does */
            }
            if (emit_id(w, b)) return -1;
        }
    }
    return 0;
}

/* --- special tokens and the whole text */

/* The longest special token at text[p..len) that may match, or -1. */
static int32_t match_special(const llm_tokenizer *t, const unsigned char *s, size_t len, size_t p,
                             int parse_special) {
    for (int32_t k = t->special_start[s[p]]; k < t->special_start[s[p] + 1]; k++) {
        int32_t id = t->special[k];
        if (!parse_special && t->type[id] != LLM_TOKEN_USER_DEFINED) continue;
        size_t n = (size_t)t->text_len[id];
        if (n <= len - p && memcmp(s + p, tok_text(t, id), n) == 0) return id;
    }
    return -1;
}

static int encode_raw(work *w, size_t start, size_t end, int after_special) {
    if (w->t->kind == KIND_SPM) return spm_fragment(w, start, end, w->t->add_space_prefix && after_special);
    return bpe_fragment(w, start, end);
}

int32_t llm_tokenize(const llm_tokenizer *t, const char *text, size_t len, int add_special,
                     int parse_special, int32_t *out, int32_t max_out) {
    if (!t || (!text && len) || len > INT32_MAX / 4 || max_out < 0 || (!out && max_out)) return LLM_TOK_ERR;
    work w;
    memset(&w, 0, sizeof w);
    w.t = t;
    w.text = text;
    int rc = 0;
    if (add_special && t->add_bos && t->bos >= 0) rc = emit_id(&w, t->bos);
    const unsigned char *s = (const unsigned char *)text;
    size_t frag = 0;
    /* SPM prefixes '▁' to the first fragment and to each after a special token. */
    int after_special = 1;
    for (size_t p = 0; p < len && !rc; p++) {
        if (t->special_start[s[p]] == t->special_start[s[p] + 1]) continue;
        int32_t id = match_special(t, s, len, p, parse_special);
        if (id < 0) continue;
        if (p > frag) rc = encode_raw(&w, frag, p, after_special);
        if (!rc) rc = emit_id(&w, id);
        after_special = 1;
        frag = p + (size_t)t->text_len[id];
        p = frag - 1;
    }
    if (!rc && frag < len) rc = encode_raw(&w, frag, len, after_special);
    if (!rc && add_special && t->add_eos && t->eos >= 0) rc = emit_id(&w, t->eos);
    int32_t result;
    if (rc) {
        result = LLM_TOK_ERR;
    } else if (w.n_ids > (size_t)max_out) {
        result = -(int32_t)w.n_ids;
    } else {
        if (w.n_ids) memcpy(out, w.ids, w.n_ids * sizeof(int32_t));
        result = (int32_t)w.n_ids;
    }
    work_free(&w);
    return result;
}
