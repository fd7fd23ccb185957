/* engine/text/tokenizer_impl.h - the tokenizer's internals, shared by
 * tokenizer.c (building, decoding, queries) and tokenizer_encode.c (text to
 * ids). Not part of the engine's interface: include tokenizer.h instead. */
#ifndef LLM_TOKENIZER_IMPL_H
#define LLM_TOKENIZER_IMPL_H

#include <string.h>

#include "pretok.h"
#include "tokenizer.h"

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

/* ---------------------------------------------------------------- helpers */

static inline const char *tok_text(const llm_tokenizer *t, int32_t id) { return t->arena + t->text_off[id]; }

static inline uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static inline uint32_t hash_pair(int32_t a, int32_t b) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    k *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(k >> 32);
}

/* Smallest power of two >= 2n (load factor <= 1/2), at least 16. */
static inline uint32_t table_size(size_t n) {
    uint32_t s = 16;
    while (s < 2 * n) s <<= 1;
    return s;
}

/* Any token with this stored text (normal preferred), or -1. */
static inline int32_t text_lookup(const llm_tokenizer *t, const char *s, size_t n) {
    for (uint32_t h = (uint32_t)hash_bytes(s, n) & t->text_mask;; h = (h + 1) & t->text_mask) {
        int32_t id = t->text_map[h];
        if (id < 0) return -1;
        if ((size_t)t->text_len[id] == n && memcmp(tok_text(t, id), s, n) == 0) return id;
    }
}

/* Tokens text may merge into: what the vocabulary learned from text, not
 * markers, byte-fallback tokens or reserved slots. */
static inline int mergeable(int type) { return type == LLM_TOKEN_NORMAL || type == LLM_TOKEN_UNDEFINED; }

static inline int32_t lookup_mergeable(const llm_tokenizer *t, const char *s, size_t n) {
    int32_t id = text_lookup(t, s, n);
    return id >= 0 && mergeable(t->type[id]) ? id : -1;
}

static inline int is_special_type(int type) {
    return type == LLM_TOKEN_CONTROL || type == LLM_TOKEN_UNKNOWN || type == LLM_TOKEN_USER_DEFINED;
}

/* GPT-2's byte-to-unicode map: printable Latin-1 bytes ('!'..'~', '¡'..'¬',
 * '®'..'ÿ') stand for themselves; the other 68 bytes, in byte order, take
 * code points 256, 257, ... so that every byte has a visible character. */
static inline uint32_t byte_to_cp(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174)) return b;
    if (b <= 32) return 256 + b;             /* 0..32    -> 256..288 */
    if (b <= 160) return 256 + 33 + b - 127; /* 127..160 -> 289..322 */
    return 323;                              /* 173 (soft hyphen) */
}

static inline int cp_to_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    if (cp >= 256 && cp <= 288) return (int)cp - 256;
    if (cp >= 289 && cp <= 322) return (int)cp - 289 + 127;
    if (cp == 323) return 173;
    return -1;
}

#endif
