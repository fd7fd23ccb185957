/* engine/text/tokenizer.c - building a tokenizer from GGUF vocabulary arrays
 * (copies, hash maps, the special-token index), decoding, and queries. Text to
 * ids is in tokenizer_encode.c; pre-tokenizer patterns in pretok.c; UTF-8 and
 * character classes in unicode.c. See tokenizer.h for the behaviour. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../status.h"
#include "tokenizer_impl.h"
#include "unicode.h"

llm_tokenizer_desc llm_tokenizer_desc_default(void) {
    llm_tokenizer_desc d;
    memset(&d, 0, sizeof d);
    d.bos_id = d.eos_id = d.unk_id = d.pad_id = -1;
    d.add_space_prefix = -1;
    return d;
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

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
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
        int hi = n == 6 ? hex_digit(s[3]) : -1, lo = n == 6 ? hex_digit(s[4]) : -1;
        if (hi >= 0 && lo >= 0 && memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
            dst[0] = (char)(hi * 16 + lo);
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

/* Is token i cut out of the text before encoding? Every special token with
 * text is. GGUF stores an SPM vocabulary's user-defined pieces with their
 * '▁' already turned back into spaces (Gemma 3's runs of spaces, tabs and
 * newlines), so they match the raw text, as SentencePiece matches the
 * originals after spaces became '▁'. */
static int cut_out(const llm_tokenizer *t, int32_t i) {
    return is_special_type(t->type[i]) && t->text_len[i] > 0;
}

static int build_specials(llm_tokenizer *t) {
    int32_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) n += cut_out(t, i);
    special_key *keys = malloc(sizeof *keys * (size_t)(n ? n : 1));
    t->special = malloc(sizeof *t->special * (size_t)(n ? n : 1));
    if (!keys || !t->special) {
        free(keys);
        return -1;
    }
    n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (!cut_out(t, i)) continue;
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

/* The turn-ending markers. One typed user-defined (Gemma 3's "</s>", also an
 * HTML tag there) becomes a control token, as llama.cpp retypes it: message
 * content never produces it unless special tokens are parsed. */
static void build_eog(llm_tokenizer *t) {
    static const char *const markers[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
                                          "<|endoftext|>", "<end_of_turn>", "</s>"};
    if (t->eos >= 0) t->eog[t->n_eog++] = t->eos;
    for (size_t i = 0; i < sizeof markers / sizeof markers[0] && t->n_eog < MAX_EOG; i++) {
        int32_t id = text_lookup(t, markers[i], strlen(markers[i]));
        if (id < 0 || id == t->eos) continue;
        if (t->type[id] == LLM_TOKEN_CONTROL || t->type[id] == LLM_TOKEN_USER_DEFINED) {
            t->type[id] = LLM_TOKEN_CONTROL;
            t->eog[t->n_eog++] = id;
        }
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
        llm_errf(err, errlen, -1, "out of memory (%ld merges)", (long)(d->n_merges));
        return -1;
    }
    for (uint32_t h = 0; h <= t->merge_mask; h++) t->merge_map[h].left = -1;
    for (int32_t i = 0; i < d->n_merges; i++) {
        const char *m = d->merges[i];
        size_t ml = d->merge_len ? (size_t)d->merge_len[i] : strlen(m);
        const char *sp = m ? memchr(m, ' ', ml) : NULL;
        if (!sp || sp == m || sp == m + ml - 1) {
            free(cat);
            llm_errf(err, errlen, -1, "merge %ld is not of the form \"left right\"", (long)(i));
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
        llm_errf(err, errlen, -1, "tokenizer needs a model name and 1 or more tokens");
        return -1;
    }
    int kind;
    if (strcmp(d->model, "gpt2") == 0) {
        kind = KIND_BPE;
    } else if (strcmp(d->model, "llama") == 0) {
        kind = KIND_SPM;
    } else {
        llm_errf(err, errlen, -1, "unsupported tokenizer model '%s'", d->model);
        return -1;
    }
    llm_pre_kind pre = LLM_PRE_GPT2;
    int ignore_merges = 0;
    if (kind == KIND_BPE && llm_pre_lookup(d->pre, &pre, &ignore_merges) != 0) {
        llm_errf(err, errlen, -1, "unsupported pre-tokenizer '%s'", d->pre);
        return -1;
    }
    const int32_t ids[4] = {d->bos_id, d->eos_id, d->unk_id, d->pad_id};
    for (int i = 0; i < 4; i++) {
        if (ids[i] < -1 || ids[i] >= d->n_vocab) {
            llm_errf(err, errlen, -1, "special token id %ld out of range", (long)(ids[i]));
            return -1;
        }
    }
    /* Past 2^28 entries the hash tables' sizes would overflow; no real
     * vocabulary comes near (the largest have about 2^18). */
    if (d->n_vocab > (1 << 28) || d->n_merges > (1 << 28)) {
        llm_errf(err, errlen, -1, "vocabulary too large (%ld tokens)", (long)(d->n_vocab));
        return -1;
    }
    if (d->n_merges < 0 || (d->n_merges > 0 && !d->merges)) {
        llm_errf(err, errlen, -1, "bad merge count %ld", (long)(d->n_merges));
        return -1;
    }
    for (int32_t i = 0; i < d->n_merges; i++) {
        if (!d->merges[i] || (d->merge_len && d->merge_len[i] < 0)) {
            llm_errf(err, errlen, -1, "merge %ld has no text", (long)(i));
            return -1;
        }
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
            llm_errf(err, errlen, -1, "token %ld has no text", (long)i);
            llm_tokenizer_free(t);
            return -1;
        }
        total += d->token_len ? (size_t)d->token_len[i] : strlen(d->tokens[i]);
    }
    if (total > 0x7FFFFFFFu) {
        llm_errf(err, errlen, -1, "vocabulary text too large (%ld bytes)", (long)total);
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
    llm_errf(err, errlen, -1, "out of memory building a %ld-token vocabulary", (long)(d->n_vocab));
    return -1;
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
