/* engine/text/grammar.c - the JSON recognizer and the token mask (see grammar.h). */
#include "grammar.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
    M_VALUE,    /* a value is expected; sub 1: just after '[', so ']' may close it */
    M_KEY,      /* a key is expected; sub 1: just after '{', so '}' may close it */
    M_COLON,
    M_AFTER,    /* a value ended inside a container: ',' or the closer */
    M_DONE,     /* the top-level value ended: whitespace only */
    M_STR,      /* in a string; sub KEY: it is a key */
    M_ESC,      /* after a backslash */
    M_HEX,      /* in \uXXXX: sub & 7 digits left */
    M_LIT,      /* in true/false/null: sub = literal * 8 + bytes matched */
    M_N_MINUS, M_N_ZERO, M_N_INT, M_N_DOT, M_N_FRAC, M_N_E, M_N_ESIGN, M_N_EXP,
};
enum { KEY = 0x80 };

static const char *const literals[3] = {"true", "false", "null"};

void llm_json_init(llm_json_state *st, llm_json_root root) {
    memset(st, 0, sizeof *st);
    st->mode = M_VALUE, st->root = (uint8_t)root;
}

static int is_ws(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int top_is_object(const llm_json_state *st) { return (st->stack >> (st->depth - 1)) & 1; }

static void end_value(llm_json_state *st) {
    st->mode = st->depth == 0 ? M_DONE : M_AFTER, st->sub = 0;
}

static int push(llm_json_state *st, int object) {
    if (st->depth == LLM_JSON_MAX_DEPTH) return -1;
    st->stack = (st->stack & ~(1ull << st->depth)) | ((uint64_t)object << st->depth);
    st->depth++;
    st->mode = object ? M_KEY : M_VALUE, st->sub = 1;
    return 0;
}

static void pop(llm_json_state *st) {
    st->depth--;
    end_value(st);
}

/* A number's byte, or -2: the number ended before c (c is read again). */
static int number(llm_json_state *st, int c) {
    const int e = c == 'e' || c == 'E';
    switch (st->mode) {
    case M_N_MINUS: return c == '0' ? (st->mode = M_N_ZERO, 0) : is_digit(c) ? (st->mode = M_N_INT, 0) : -1;
    case M_N_ZERO: return c == '.' ? (st->mode = M_N_DOT, 0) : e ? (st->mode = M_N_E, 0) : -2;
    case M_N_INT: return is_digit(c) ? 0 : c == '.' ? (st->mode = M_N_DOT, 0) : e ? (st->mode = M_N_E, 0) : -2;
    case M_N_DOT: return is_digit(c) ? (st->mode = M_N_FRAC, 0) : -1;
    case M_N_FRAC: return is_digit(c) ? 0 : e ? (st->mode = M_N_E, 0) : -2;
    case M_N_E: return c == '+' || c == '-' ? (st->mode = M_N_ESIGN, 0) : is_digit(c) ? (st->mode = M_N_EXP, 0) : -1;
    case M_N_ESIGN: return is_digit(c) ? (st->mode = M_N_EXP, 0) : -1;
    default: return is_digit(c) ? 0 : -2; /* M_N_EXP */
    }
}

/* The start of a value at byte c. */
static int value(llm_json_state *st, int c) {
    if (st->root == LLM_JSON_OBJECT && st->depth == 0 && c != '{') return -1;
    switch (c) {
    case '{': return push(st, 1);
    case '[': return push(st, 0);
    case '"': st->mode = M_STR, st->sub = 0; return 0;
    case '-': st->mode = M_N_MINUS; return 0;
    case 't': st->mode = M_LIT, st->sub = 0 * 8 + 1; return 0;
    case 'f': st->mode = M_LIT, st->sub = 1 * 8 + 1; return 0;
    case 'n': st->mode = M_LIT, st->sub = 2 * 8 + 1; return 0;
    default:
        if (!is_digit(c)) return -1;
        st->mode = c == '0' ? M_N_ZERO : M_N_INT;
        return 0;
    }
}

static int step(llm_json_state *st, int c) {
    if (st->mode >= M_N_MINUS) {
        int r = number(st, c);
        if (r != -2) return r;
        end_value(st); /* the number ended: c belongs to what follows it */
    }
    if (st->mode <= M_DONE) {
        if (is_ws(c)) return ++st->ws > LLM_JSON_MAX_WS ? -1 : 0;
        st->ws = 0;
    }
    switch (st->mode) {
    case M_VALUE:
        if (c == ']' && st->sub == 1) return pop(st), 0;
        return value(st, c);
    case M_KEY:
        if (c == '}' && st->sub == 1) return pop(st), 0;
        if (c != '"') return -1;
        st->mode = M_STR, st->sub = KEY;
        return 0;
    case M_COLON:
        if (c != ':') return -1;
        st->mode = M_VALUE, st->sub = 0;
        return 0;
    case M_AFTER:
        if (c == ',') {
            st->mode = top_is_object(st) ? M_KEY : M_VALUE, st->sub = 0;
            return 0;
        }
        if (c == (top_is_object(st) ? '}' : ']')) return pop(st), 0;
        return -1;
    case M_DONE: return -1;
    case M_STR:
        if (c == '"') {
            if (st->sub & KEY) st->mode = M_COLON, st->sub = 0;
            else end_value(st);
            return 0;
        }
        if (c == '\\') st->mode = M_ESC;
        return c < 0x20 ? -1 : 0;
    case M_ESC:
        if (c == 'u') st->mode = M_HEX, st->sub = (uint8_t)((st->sub & KEY) | 4);
        else if (strchr("\"\\/bfnrt", c) && c) st->mode = M_STR;
        else return -1;
        return 0;
    case M_HEX:
        if (!is_digit(c) && !((c | 0x20) >= 'a' && (c | 0x20) <= 'f')) return -1;
        if ((--st->sub & 7) == 0) st->mode = M_STR;
        return 0;
    default: { /* M_LIT */
        const char *lit = literals[st->sub / 8];
        const int at = st->sub % 8;
        if (c != lit[at]) return -1;
        st->sub++;
        if (!lit[at + 1]) end_value(st);
        return 0;
    }
    }
}

int llm_json_feed(llm_json_state *st, const char *bytes, size_t n) {
    for (size_t i = 0; i < n && !st->dead; i++)
        if (step(st, (unsigned char)bytes[i])) st->dead = 1;
    return st->dead ? -1 : 0;
}

int llm_json_complete(const llm_json_state *st) {
    if (st->dead) return 0;
    return st->mode == M_DONE ||
           (st->depth == 0 && (st->mode == M_N_ZERO || st->mode == M_N_INT || st->mode == M_N_FRAC || st->mode == M_N_EXP));
}

/* ---------------------------------------------------------------- the trie */

typedef struct {
    const char *p;
    uint32_t n;
    int32_t id;
} tok_bytes;

static int by_bytes(const void *pa, const void *pb) {
    const tok_bytes *a = pa, *b = pb;
    int c = memcmp(a->p, b->p, a->n < b->n ? a->n : b->n);
    if (c) return c;
    return a->n != b->n ? (a->n < b->n ? -1 : 1) : (a->id < b->id ? -1 : a->id > b->id);
}

/* The node for trie_tok[lo .. hi), whose bytes share their first depth
 * bytes, and its subtree (preorder); returns its index. */
static int32_t trie_build(llm_grammar_vocab *v, int32_t lo, int32_t hi, uint32_t depth, uint8_t byte) {
    const int32_t me = v->n_trie++;
    struct llm_trie_node *n = &v->trie[me];
    n->child = n->sibling = -1, n->tb = lo, n->te = hi, n->byte = byte;
    int32_t i = lo;
    while (i < hi && v->off[v->trie_tok[i] + 1] - v->off[v->trie_tok[i]] == depth) i++;
    v->trie[me].own = i;
    int32_t prev = -1;
    while (i < hi) {
        const int32_t t0 = v->trie_tok[i];
        const uint8_t c = (uint8_t)v->bytes[v->off[t0] + depth];
        int32_t j = i + 1;
        while (j < hi && (uint8_t)v->bytes[v->off[v->trie_tok[j]] + depth] == c) j++;
        const int32_t ch = trie_build(v, i, j, depth + 1, c);
        if (prev < 0) v->trie[me].child = ch;
        else v->trie[prev].sibling = ch;
        prev = ch, i = j;
    }
    return me;
}

/* Sorted by bytes, the tokens sharing a prefix are contiguous: each node
 * is a range. At most one node per byte of the vocabulary, plus the root. */
static int trie_new(llm_grammar_vocab *v) {
    int32_t n = 0;
    if (!(v->trie_tok = malloc(sizeof *v->trie_tok * ((size_t)v->n_vocab + 1)))) return -1;
    for (int32_t t = 0; t < v->n_vocab; t++)
        if (!v->eog[t] && v->off[t + 1] > v->off[t]) v->trie_tok[n++] = t;
    tok_bytes *tb = malloc(sizeof *tb * ((size_t)n + 1));
    if (!tb) return -1;
    for (int32_t i = 0; i < n; i++) {
        const int32_t t = v->trie_tok[i];
        tb[i] = (tok_bytes){v->bytes + v->off[t], v->off[t + 1] - v->off[t], t};
    }
    qsort(tb, (size_t)n, sizeof *tb, by_bytes);
    for (int32_t i = 0; i < n; i++) v->trie_tok[i] = tb[i].id;
    free(tb);
    if (!(v->trie = malloc(sizeof *v->trie * ((size_t)v->off[v->n_vocab] + 1)))) return -1;
    trie_build(v, 0, n, 0, 0);
    return 0;
}

static llm_grammar_vocab *vocab_finish(llm_grammar_vocab *v);

llm_grammar_vocab *llm_grammar_vocab_new(const llm_tokenizer *tok) {
    const int32_t V = llm_tokenizer_n_vocab(tok);
    llm_grammar_vocab *v = calloc(1, sizeof *v);
    size_t cap = (size_t)V * 8 + 64, used = 0;
    if (v) v->n_vocab = V, v->off = malloc(sizeof *v->off * ((size_t)V + 1)), v->eog = malloc((size_t)V),
           v->bytes = malloc(cap);
    if (!v || !v->off || !v->eog || !v->bytes) {
        llm_grammar_vocab_free(v);
        return NULL;
    }
    for (int32_t t = 0; t < V; t++) {
        v->off[t] = (uint32_t)used;
        v->eog[t] = (uint8_t)(llm_token_is_eog(tok, t) != 0);
        int32_t n = llm_token_to_piece(tok, t, 0, v->bytes + used, (int32_t)(cap - used > INT32_MAX ? INT32_MAX : cap - used));
        if (n < 0 && n != LLM_TOK_ERR) { /* -(bytes needed): grow and write it again */
            size_t nc = cap * 2 + (size_t)-n;
            char *b = realloc(v->bytes, nc);
            if (!b) {
                llm_grammar_vocab_free(v);
                return NULL;
            }
            v->bytes = b, cap = nc;
            n = llm_token_to_piece(tok, t, 0, v->bytes + used, (int32_t)-n);
        }
        if (n > 0) used += (size_t)n;
    }
    v->off[V] = (uint32_t)used;
    return vocab_finish(v);
}

/* Groups, plain flags and the trie of a vocabulary whose bytes are in. */
static llm_grammar_vocab *vocab_finish(llm_grammar_vocab *v) {
    const int32_t V = v->n_vocab;
    /* group by first byte: counts, offsets, then place (counting sort) */
    v->by_first = malloc(sizeof *v->by_first * ((size_t)V + 1));
    v->eogs = malloc(sizeof *v->eogs * ((size_t)V + 1));
    if (!v->by_first || !v->eogs) {
        llm_grammar_vocab_free(v);
        return NULL;
    }
    /* plain: every byte may stand inside a string as itself */
    if (!(v->plain = malloc((size_t)V + 1))) {
        llm_grammar_vocab_free(v);
        return NULL;
    }
    for (int32_t t = 0; t < V; t++) {
        v->plain[t] = 1;
        for (uint32_t k = v->off[t]; k < v->off[t + 1]; k++) {
            const unsigned char b = (unsigned char)v->bytes[k];
            if (b < 0x20 || b == '"' || b == '\\') v->plain[t] = 0;
        }
    }
    int32_t at[257] = {0};
    for (int32_t t = 0; t < V; t++)
        if (v->eog[t]) v->eogs[v->n_eog++] = t;
        else if (v->off[t + 1] > v->off[t]) at[(unsigned char)v->bytes[v->off[t]] + 1]++;
    for (int c = 0; c < 256; c++) at[c + 1] += at[c];
    memcpy(v->group, at, sizeof at);
    for (int32_t t = 0; t < V; t++)
        if (!v->eog[t] && v->off[t + 1] > v->off[t]) v->by_first[at[(unsigned char)v->bytes[v->off[t]]]++] = t;
    if (trie_new(v)) {
        llm_grammar_vocab_free(v);
        return NULL;
    }
    return v;
}

llm_grammar_vocab *llm_grammar_vocab_from_bytes(int32_t n_vocab, const uint32_t *off, const char *bytes,
                                               const uint8_t *eog) {
    llm_grammar_vocab *v = calloc(1, sizeof *v);
    if (v) v->n_vocab = n_vocab, v->off = malloc(sizeof *v->off * ((size_t)n_vocab + 1)), v->eog = malloc((size_t)n_vocab + 1),
           v->bytes = malloc((size_t)off[n_vocab] + 1);
    if (!v || !v->off || !v->eog || !v->bytes) {
        llm_grammar_vocab_free(v);
        return NULL;
    }
    memcpy(v->off, off, sizeof *off * ((size_t)n_vocab + 1));
    memcpy(v->bytes, bytes, off[n_vocab]);
    for (int32_t t = 0; t < n_vocab; t++) v->eog[t] = eog ? eog[t] != 0 : 0;
    return vocab_finish(v);
}

void llm_grammar_vocab_free(llm_grammar_vocab *v) {
    if (!v) return;
    free(v->off), free(v->bytes), free(v->eog), free(v->by_first), free(v->eogs), free(v->plain), free(v->trie), free(v->trie_tok), free(v);
}

int32_t llm_json_mask(const llm_json_state *st, const llm_grammar_vocab *v, const float *in, float *out) {
    for (int32_t t = 0; t < v->n_vocab; t++) out[t] = -INFINITY;
    /* the state after each first byte, once per step; then only the groups
     * that byte allows, each token from the state after its first byte */
    int32_t allowed = 0;
    for (int c = 0; c < 256 && !st->dead; c++) {
        if (v->group[c] == v->group[c + 1]) continue;
        llm_json_state after = *st;
        if (step(&after, c)) continue;
        /* in a string, a token of plain string bytes stays in it: allowed unread */
        const int in_str = after.mode == M_STR && st->mode == M_STR;
        /* a large group: the second bytes the state allows, once (most tokens
         * after a space are refused at their second byte) */
        uint8_t ok2[256];
        const int use2 = !in_str && v->group[c + 1] - v->group[c] > 256;
        for (int c2 = 0; use2 && c2 < 256; c2++) {
            llm_json_state s2 = after;
            ok2[c2] = step(&s2, c2) == 0;
        }
        for (int32_t i = v->group[c]; i < v->group[c + 1]; i++) {
            const int32_t t = v->by_first[i];
            const uint32_t a = v->off[t] + 1, b = v->off[t + 1];
            if (in_str && v->plain[t]) {
                out[t] = in[t], allowed++;
                continue;
            }
            if (use2 && a < b && !ok2[(unsigned char)v->bytes[a]]) continue;
            llm_json_state s = after;
            if (a == b || llm_json_feed(&s, v->bytes + a, b - a) == 0) out[t] = in[t], allowed++;
        }
    }
    const int complete = llm_json_complete(st);
    for (int32_t i = 0; i < v->n_eog; i++)
        if (complete || allowed == 0) /* with nothing else left: let the reply end */
            out[v->eogs[i]] = complete ? in[v->eogs[i]] : 0.0f;
    return allowed + (complete || allowed == 0 ? v->n_eog : 0);
}

int llm_json_accept(llm_json_state *st, const llm_grammar_vocab *v, int32_t token) {
    if (token < 0 || token >= v->n_vocab) return -1;
    if (v->eog[token]) return 0;
    return llm_json_feed(st, v->bytes + v->off[token], v->off[token + 1] - v->off[token]);
}
