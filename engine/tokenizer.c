/* engine/tokenizer.c - byte-level BPE and SentencePiece-style tokenizers built
 * from GGUF vocabulary arrays (see tokenizer.h for the behaviour).
 *
 * Layout: building (copies, hash maps, special-token index), encoding (special
 * tokens, then BPE or SPM merging per fragment), decoding. Pre-tokenizer
 * patterns live in pretok.c, UTF-8 and character classes in unicode.c. */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pretok.h"
#include "unicode.h"

enum { KIND_BPE, KIND_SPM };

#define MAX_EOG 8

/* Open-addressing slot of the merge table: (left, right) -> rank, result. */
typedef struct {
    int32_t left, right; /* token ids of the pair; left == -1 marks an empty slot */
    int32_t rank;        /* merge priority: lower merges first */
    int32_t result;      /* token id of left's text followed by right's */
} merge_slot;

struct llm_tokenizer {
    int kind;                /* KIND_BPE ("gpt2") or KIND_SPM ("llama") */
    llm_pre_kind pre;        /* BPE pre-tokenizer pattern */
    int ignore_merges;       /* BPE: a piece that is itself a token is emitted whole */
    int32_t n_vocab;
    char *arena;             /* every token's stored text, then its decoded piece */
    uint32_t *text_off;      /* [n_vocab] offset of the stored text in arena */
    int32_t *text_len;       /* [n_vocab] its byte length */
    uint32_t *piece_off;     /* [n_vocab] offset of the decoded bytes in arena */
    int32_t *piece_len;      /* [n_vocab] their byte length */
    float *score;            /* [n_vocab] SPM merge priority: higher merges first */
    uint8_t *type;           /* [n_vocab] LLM_TOKEN_* */
    int32_t *text_map;       /* [text_mask + 1] stored text -> id, -1 empty; normal tokens
                              * are inserted first, so they win over same-text specials */
    uint32_t text_mask;      /* table size - 1 (a power of two minus one) */
    merge_slot *merge_map;   /* [merge_mask + 1] BPE merges by pair; NULL for SPM */
    uint32_t merge_mask;
    int32_t byte_tok[256];   /* token for each byte: BPE the byte's unicode char, SPM <0xNN>;
                              * -1 when the vocabulary has none */
    int32_t *special;        /* [n_special] ids of control/unknown/user-defined tokens, sorted by
                              * first byte, then longest first, so the first match is the longest */
    int32_t n_special;
    int32_t special_start[257]; /* special[special_start[b] .. special_start[b+1]) start with byte b */
    int32_t eog[MAX_EOG];    /* [n_eog] ids that end a turn */
    int n_eog;
    int32_t bos, eos, unk, pad; /* -1 when absent */
    int add_bos, add_eos;
    int add_space_prefix;    /* SPM: prefix '▁' to the text and after each special token */
};

llm_tokenizer_desc llm_tokenizer_desc_default(void) {
    llm_tokenizer_desc d;
    memset(&d, 0, sizeof d);
    d.bos_id = d.eos_id = d.unk_id = d.pad_id = -1;
    d.add_space_prefix = -1;
    return d;
}

/* ---------------------------------------------------------------- helpers */

static const char *tok_text(const llm_tokenizer *t, int32_t id) { return t->arena + t->text_off[id]; }

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static uint32_t hash_pair(int32_t a, int32_t b) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    k *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(k >> 32);
}

/* Smallest power of two >= 2n (load factor <= 1/2), at least 16. */
static uint32_t table_size(size_t n) {
    uint32_t s = 16;
    while (s < 2 * n) s <<= 1;
    return s;
}

/* Any token with this stored text (normal preferred), or -1. */
static int32_t text_lookup(const llm_tokenizer *t, const char *s, size_t n) {
    for (uint32_t h = (uint32_t)hash_bytes(s, n) & t->text_mask;; h = (h + 1) & t->text_mask) {
        int32_t id = t->text_map[h];
        if (id < 0) return -1;
        if ((size_t)t->text_len[id] == n && memcmp(tok_text(t, id), s, n) == 0) return id;
    }
}

/* Tokens text may merge into: what the vocabulary learned from text, not
 * markers, byte-fallback tokens or reserved slots. */
static int mergeable(int type) { return type == LLM_TOKEN_NORMAL || type == LLM_TOKEN_UNDEFINED; }

static int32_t lookup_mergeable(const llm_tokenizer *t, const char *s, size_t n) {
    int32_t id = text_lookup(t, s, n);
    return id >= 0 && mergeable(t->type[id]) ? id : -1;
}

static int is_special_type(int type) {
    return type == LLM_TOKEN_CONTROL || type == LLM_TOKEN_UNKNOWN || type == LLM_TOKEN_USER_DEFINED;
}

/* GPT-2's byte-to-unicode map: printable Latin-1 bytes ('!'..'~', '¡'..'¬',
 * '®'..'ÿ') stand for themselves; the other 68 bytes, in byte order, take
 * code points 256, 257, ... so that every byte has a visible character. */
static uint32_t byte_to_cp(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174)) return b;
    if (b <= 32) return 256 + b;             /* 0..32    -> 256..288 */
    if (b <= 160) return 256 + 33 + b - 127; /* 127..160 -> 289..322 */
    return 323;                              /* 173 (soft hyphen) */
}

static int cp_to_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    if (cp >= 256 && cp <= 288) return (int)cp - 256;
    if (cp >= 289 && cp <= 322) return (int)cp - 289 + 127;
    if (cp == 323) return 173;
    return -1;
}

static void set_err(char *err, size_t errlen, const char *msg, long a) {
    if (err && errlen) snprintf(err, errlen, msg, a);
}

/* ---------------------------------------------------------------- building */

void llm_tokenizer_free(llm_tokenizer *t) {
    if (!t) return;
    free(t->arena);
    free(t->text_off);
    free(t->text_len);
    free(t->piece_off);
    free(t->piece_len);
    free(t->score);
    free(t->type);
    free(t->text_map);
    free(t->merge_map);
    free(t->special);
    free(t);
}

/* Decoded bytes of token id into dst (room for text_len bytes); returns length.
 * A decoded piece is never longer than the stored text. */
static int32_t decode_piece(const llm_tokenizer *t, int32_t id, char *dst) {
    const char *s = tok_text(t, id);
    int32_t n = t->text_len[id], out = 0;
    int type = t->type[id];
    if (is_special_type(type)) {
        memcpy(dst, s, (size_t)n);
        return n;
    }
    if (t->kind == KIND_SPM && type == LLM_TOKEN_BYTE) {
        unsigned v;
        char tail;
        if (n == 6 && sscanf(s, "<0x%2x%c", &v, &tail) == 2 && tail == '>') {
            dst[0] = (char)v;
            return 1;
        }
    }
    for (int32_t i = 0; i < n;) {
        uint32_t cp;
        int k = llm_utf8_decode((const unsigned char *)s + i, (size_t)(n - i), &cp);
        if (t->kind == KIND_BPE && cp_to_byte(cp) >= 0) {
            dst[out++] = (char)cp_to_byte(cp);
        } else if (t->kind == KIND_SPM && cp == 0x2581) {
            dst[out++] = ' ';
        } else {
            memcpy(dst + out, s + i, (size_t)k);
            out += k;
        }
        i += k;
    }
    return out;
}

typedef struct {
    uint8_t first; /* first byte of the token text */
    int32_t len;   /* text length */
    int32_t id;
} special_key;

static int cmp_special(const void *pa, const void *pb) {
    const special_key *a = pa, *b = pb;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int build_specials(llm_tokenizer *t) {
    int32_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (is_special_type(t->type[i]) && t->text_len[i] > 0) n++;
    special_key *keys = malloc(sizeof *keys * (size_t)(n ? n : 1));
    t->special = malloc(sizeof *t->special * (size_t)(n ? n : 1));
    if (!keys || !t->special) {
        free(keys);
        return -1;
    }
    n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (!is_special_type(t->type[i]) || t->text_len[i] == 0) continue;
        keys[n].first = (uint8_t)tok_text(t, i)[0];
        keys[n].len = t->text_len[i];
        keys[n].id = i;
        n++;
    }
    qsort(keys, (size_t)n, sizeof *keys, cmp_special);
    for (int b = 0, k = 0; b <= 256; b++) {
        while (k < n && keys[k].first < b) k++;
        t->special_start[b] = k;
    }
    for (int32_t k = 0; k < n; k++) t->special[k] = keys[k].id;
    t->n_special = n;
    free(keys);
    return 0;
}

static void build_eog(llm_tokenizer *t) {
    static const char *const markers[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
                                          "<|endoftext|>", "<end_of_turn>", "</s>"};
    if (t->eos >= 0) t->eog[t->n_eog++] = t->eos;
    for (size_t i = 0; i < sizeof markers / sizeof markers[0] && t->n_eog < MAX_EOG; i++) {
        int32_t id = text_lookup(t, markers[i], strlen(markers[i]));
        if (id < 0 || id == t->eos) continue;
        if (t->type[id] == LLM_TOKEN_CONTROL || t->type[id] == LLM_TOKEN_USER_DEFINED)
            t->eog[t->n_eog++] = id;
    }
}

static int build_merges(llm_tokenizer *t, const llm_tokenizer_desc *d, char *err, size_t errlen) {
    t->merge_mask = table_size((size_t)d->n_merges) - 1;
    t->merge_map = malloc(sizeof *t->merge_map * ((size_t)t->merge_mask + 1));
    size_t maxlen = 0;
    for (int32_t i = 0; i < d->n_merges; i++) {
        size_t ml = d->merge_len ? (size_t)d->merge_len[i] : strlen(d->merges[i]);
        if (ml > maxlen) maxlen = ml;
    }
    char *cat = malloc(maxlen + 1);
    if (!t->merge_map || !cat) {
        free(cat);
        set_err(err, errlen, "out of memory (%ld merges)", d->n_merges);
        return -1;
    }
    for (uint32_t h = 0; h <= t->merge_mask; h++) t->merge_map[h].left = -1;
    for (int32_t i = 0; i < d->n_merges; i++) {
        const char *m = d->merges[i];
        size_t ml = d->merge_len ? (size_t)d->merge_len[i] : strlen(m);
        const char *sp = m ? memchr(m, ' ', ml) : NULL;
        if (!sp || sp == m || sp == m + ml - 1) {
            free(cat);
            set_err(err, errlen, "merge %ld is not of the form \"left right\"", i);
            return -1;
        }
        size_t ln = (size_t)(sp - m), rn = ml - ln - 1;
        int32_t a = lookup_mergeable(t, m, ln), b = lookup_mergeable(t, sp + 1, rn);
        memcpy(cat, m, ln);
        memcpy(cat + ln, sp + 1, rn);
        int32_t r = lookup_mergeable(t, cat, ln + rn);
        /* A merge whose parts or result are not tokens can never fire on
         * token symbols; vocabularies trimmed after training have a few. */
        if (a < 0 || b < 0 || r < 0) continue;
        uint32_t h = hash_pair(a, b) & t->merge_mask;
        while (t->merge_map[h].left >= 0 && !(t->merge_map[h].left == a && t->merge_map[h].right == b))
            h = (h + 1) & t->merge_mask;
        if (t->merge_map[h].left >= 0) continue; /* a repeated pair keeps its first rank */
        t->merge_map[h] = (merge_slot){a, b, i, r};
    }
    free(cat);
    return 0;
}

int llm_tokenizer_create(const llm_tokenizer_desc *d, llm_tokenizer **out, char *err, size_t errlen) {
    if (!d || !out) return -1;
    *out = NULL;
    if (!d->model || !d->tokens || d->n_vocab <= 0) {
        set_err(err, errlen, "tokenizer needs a model name and %ld or more tokens", 1);
        return -1;
    }
    int kind;
    if (strcmp(d->model, "gpt2") == 0) {
        kind = KIND_BPE;
    } else if (strcmp(d->model, "llama") == 0) {
        kind = KIND_SPM;
    } else {
        if (err && errlen) snprintf(err, errlen, "unsupported tokenizer model '%s'", d->model);
        return -1;
    }
    llm_pre_kind pre = LLM_PRE_GPT2;
    int ignore_merges = 0;
    if (kind == KIND_BPE && llm_pre_lookup(d->pre, &pre, &ignore_merges) != 0) {
        if (err && errlen) snprintf(err, errlen, "unsupported pre-tokenizer '%s'", d->pre);
        return -1;
    }
    const int32_t ids[4] = {d->bos_id, d->eos_id, d->unk_id, d->pad_id};
    for (int i = 0; i < 4; i++) {
        if (ids[i] < -1 || ids[i] >= d->n_vocab) {
            set_err(err, errlen, "special token id %ld out of range", ids[i]);
            return -1;
        }
    }
    if (d->n_merges < 0 || (d->n_merges > 0 && !d->merges)) {
        set_err(err, errlen, "bad merge count %ld", d->n_merges);
        return -1;
    }

    llm_tokenizer *t = calloc(1, sizeof *t);
    if (!t) goto oom;
    t->kind = kind;
    t->pre = pre;
    t->ignore_merges = ignore_merges;
    t->n_vocab = d->n_vocab;
    t->bos = d->bos_id, t->eos = d->eos_id, t->unk = d->unk_id, t->pad = d->pad_id;
    t->add_bos = d->add_bos != 0, t->add_eos = d->add_eos != 0;
    t->add_space_prefix = kind == KIND_SPM && d->add_space_prefix != 0;

    size_t nv = (size_t)d->n_vocab, total = 0;
    for (size_t i = 0; i < nv; i++) {
        if (!d->tokens[i] || (d->token_len && d->token_len[i] < 0)) {
            set_err(err, errlen, "token %ld has no text", (long)i);
            llm_tokenizer_free(t);
            return -1;
        }
        total += d->token_len ? (size_t)d->token_len[i] : strlen(d->tokens[i]);
    }
    if (total > 0x7FFFFFFFu) {
        set_err(err, errlen, "vocabulary text too large (%ld bytes)", (long)total);
        llm_tokenizer_free(t);
        return -1;
    }
    t->arena = malloc(2 * total + 1);
    t->text_off = malloc(sizeof *t->text_off * nv);
    t->text_len = malloc(sizeof *t->text_len * nv);
    t->piece_off = malloc(sizeof *t->piece_off * nv);
    t->piece_len = malloc(sizeof *t->piece_len * nv);
    t->score = malloc(sizeof *t->score * nv);
    t->type = malloc(nv);
    t->text_mask = table_size(nv) - 1;
    t->text_map = malloc(sizeof *t->text_map * ((size_t)t->text_mask + 1));
    if (!t->arena || !t->text_off || !t->text_len || !t->piece_off || !t->piece_len || !t->score ||
        !t->type || !t->text_map)
        goto oom;

    size_t at = 0;
    for (size_t i = 0; i < nv; i++) {
        size_t n = d->token_len ? (size_t)d->token_len[i] : strlen(d->tokens[i]);
        memcpy(t->arena + at, d->tokens[i], n);
        t->text_off[i] = (uint32_t)at;
        t->text_len[i] = (int32_t)n;
        at += n;
        t->score[i] = d->scores ? d->scores[i] : 0.0f;
        int ty = d->token_type ? d->token_type[i] : LLM_TOKEN_NORMAL;
        if (ty < 0 || ty > LLM_TOKEN_BYTE) ty = LLM_TOKEN_NORMAL;
        t->type[i] = (uint8_t)ty;
    }
    if (!d->token_type) {
        for (int i = 0; i < 4; i++)
            if (ids[i] >= 0) t->type[ids[i]] = ids[i] == d->unk_id ? LLM_TOKEN_UNKNOWN : LLM_TOKEN_CONTROL;
    }
    for (size_t i = 0; i < nv; i++) {
        t->piece_off[i] = (uint32_t)at;
        t->piece_len[i] = decode_piece(t, (int32_t)i, t->arena + at);
        at += (size_t)t->piece_len[i];
    }

    /* text -> id: mergeable tokens first so they own their text. */
    for (uint32_t h = 0; h <= t->text_mask; h++) t->text_map[h] = -1;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < nv; i++) {
            if ((mergeable(t->type[i]) != 0) != (pass == 0)) continue;
            const char *s = tok_text(t, (int32_t)i);
            size_t n = (size_t)t->text_len[i];
            uint32_t h = (uint32_t)hash_bytes(s, n) & t->text_mask;
            int dup = 0;
            for (; t->text_map[h] >= 0; h = (h + 1) & t->text_mask) {
                int32_t o = t->text_map[h];
                if ((size_t)t->text_len[o] == n && memcmp(tok_text(t, o), s, n) == 0) {
                    dup = 1; /* the earlier id keeps the text */
                    break;
                }
            }
            if (!dup) t->text_map[h] = (int32_t)i;
        }
    }

    for (int b = 0; b < 256; b++) {
        char s[8];
        int32_t id = -1;
        if (kind == KIND_BPE) {
            id = text_lookup(t, s, (size_t)llm_utf8_encode(byte_to_cp((unsigned)b), s));
            if (id >= 0 && !mergeable(t->type[id]) && t->type[id] != LLM_TOKEN_BYTE) id = -1;
        } else {
            snprintf(s, sizeof s, "<0x%02X>", b);
            id = text_lookup(t, s, 6);
            if (id >= 0 && t->type[id] != LLM_TOKEN_BYTE && d->token_type) id = -1;
        }
        t->byte_tok[b] = id;
    }
    if (kind == KIND_BPE && d->n_merges > 0 && build_merges(t, d, err, errlen) != 0) {
        llm_tokenizer_free(t);
        return -1;
    }
    if (build_specials(t) != 0) goto oom;
    build_eog(t);
    *out = t;
    return 0;
oom:
    llm_tokenizer_free(t);
    set_err(err, errlen, "out of memory building a %ld-token vocabulary", d->n_vocab);
    return -1;
}

/* ---------------------------------------------------------------- encoding */

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

static int bpe_fragment(work *w, size_t start, size_t end) {
    size_t n = end - start;
    if (grow((void **)&w->pc, &w->cap_pc, n, sizeof(llm_pchar))) return -1;
    const char *saved = w->text;
    w->text += start;
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
    /* One symbol per character; an undecodable byte is a symbol of its own. */
    int32_t ns = 0;
    for (size_t i = 0; i < m; ns++) {
        uint32_t cp;
        int len = llm_utf8_decode((const unsigned char *)w->buf + i, m - i, &cp);
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

/* ---------------------------------------------------------------- decoding */

static int rendered(const llm_tokenizer *t, int32_t id, int render_special) {
    int ty = t->type[id];
    if (ty == LLM_TOKEN_CONTROL || ty == LLM_TOKEN_UNKNOWN || ty == LLM_TOKEN_UNUSED) return render_special;
    return 1;
}

const char *llm_token_piece(const llm_tokenizer *t, int32_t id, int32_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = t->piece_len[id];
    return t->arena + t->piece_off[id];
}

int32_t llm_token_to_piece(const llm_tokenizer *t, int32_t id, int render_special, char *buf,
                           int32_t buflen) {
    if (!t || id < 0 || id >= t->n_vocab || buflen < 0 || (!buf && buflen)) return LLM_TOK_ERR;
    int32_t n = rendered(t, id, render_special) ? t->piece_len[id] : 0;
    if (n > buflen) return -n;
    if (n) memcpy(buf, t->arena + t->piece_off[id], (size_t)n);
    return n;
}

int32_t llm_detokenize(const llm_tokenizer *t, const int32_t *ids, int32_t n, int flags, char *out,
                       int32_t cap) {
    if (!t || n < 0 || (!ids && n) || cap < 0 || (!out && cap)) return LLM_TOK_ERR;
    int strip_spaces = t->kind == KIND_SPM && t->add_space_prefix && !(flags & LLM_DETOK_KEEP_SPACE);
    int render_special = (flags & LLM_DETOK_SPECIAL) != 0;
    /* Two passes: measure, then write only if everything fits. */
    int64_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        int after_special = 1;
        int64_t at = 0;
        for (int32_t i = 0; i < n; i++) {
            int32_t id = ids[i];
            if (id < 0 || id >= t->n_vocab) return LLM_TOK_ERR;
            const char *p = t->arena + t->piece_off[id];
            int32_t len = rendered(t, id, render_special) ? t->piece_len[id] : 0;
            if (is_special_type(t->type[id])) {
                after_special = 1;
            } else {
                /* Undo the '▁' the encoder put before this fragment. */
                if (strip_spaces && after_special && len > 0 && p[0] == ' ') p++, len--;
                after_special = 0;
            }
            if (pass == 1) memcpy(out + at, p, (size_t)len);
            at += len;
        }
        if (pass == 0) {
            total = at;
            if (total >= INT32_MAX) return LLM_TOK_ERR;
            if (total + 1 > cap) return -(int32_t)(total + 1);
        }
    }
    out[total] = '\0';
    return (int32_t)total;
}

/* ---------------------------------------------------------------- queries */

int32_t llm_tokenizer_find(const llm_tokenizer *t, const char *text, size_t len) {
    if (!t || (!text && len)) return -1;
    return text_lookup(t, text, len);
}

int32_t llm_tokenizer_n_vocab(const llm_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t llm_tokenizer_bos(const llm_tokenizer *t) { return t ? t->bos : -1; }
int32_t llm_tokenizer_eos(const llm_tokenizer *t) { return t ? t->eos : -1; }

int llm_token_type(const llm_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_vocab) return -1;
    return t->type[id];
}

int llm_token_is_eog(const llm_tokenizer *t, int32_t id) {
    if (!t) return 0;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return 1;
    return 0;
}

typedef struct {
    int32_t *ends;  /* [max] caller's output */
    int32_t max;
    int32_t n;      /* pieces seen, including those that did not fit */
} ends_sink;

static int collect_end(void *ctx, size_t start, size_t end) {
    ends_sink *k = ctx;
    (void)start;
    if (k->n < k->max) k->ends[k->n] = (int32_t)end;
    k->n++;
    return 0;
}

int32_t llm_pretokenize(const char *pre, const char *text, size_t len, int32_t *ends, int32_t max_ends) {
    llm_pre_kind kind;
    int ignore;
    if ((!text && len) || len > INT32_MAX / 4 || max_ends < 0 || (!ends && max_ends) ||
        llm_pre_lookup(pre, &kind, &ignore) != 0)
        return LLM_TOK_ERR;
    llm_pchar *pc = malloc(sizeof *pc * (len ? len : 1));
    if (!pc) return LLM_TOK_ERR;
    ends_sink k = {ends, max_ends, 0};
    llm_pre_split(kind, text, len, pc, collect_end, &k);
    free(pc);
    return k.n > max_ends ? -k.n : k.n;
}
