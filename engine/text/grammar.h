/* engine/text/grammar.h - constrained decoding: a JSON recognizer that reads a
 * document byte by byte and says whether what it read so far still begins a
 * valid document, and a per-token mask built on it.
 *
 * The recognizer is a pushdown automaton in a small fixed state (a stack of
 * up to LLM_JSON_MAX_DEPTH containers as bits, the lexical state), so a copy
 * is cheap: the mask copies it per candidate token and feeds the token's
 * bytes, taken from a table built once per vocabulary (llm_grammar_vocab),
 * stopping at the first byte refused. Tokens whose first byte the state
 * refuses are passed over by a 256-entry table computed once per step.
 *
 * Documents: RFC 8259 JSON (strings without raw control bytes, escapes
 * checked, numbers in JSON's form), whitespace runs of at most
 * LLM_JSON_MAX_WS bytes (a model that loops on newlines cannot fill its
 * reply with them), nesting at most LLM_JSON_MAX_DEPTH. With
 * LLM_JSON_OBJECT the top-level value must be an object (OpenAI's
 * response_format json_object); after it only whitespace. */
#ifndef LLM_GRAMMAR_H
#define LLM_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

enum { LLM_JSON_MAX_DEPTH = 64, LLM_JSON_MAX_WS = 20 };

typedef enum { LLM_JSON_ANY = 0, LLM_JSON_OBJECT = 1 } llm_json_root;

typedef struct {
    uint64_t stack;     /* bit d: the container at depth d + 1 is an object (1) or array (0) */
    uint8_t depth;      /* containers open */
    uint8_t mode;       /* lexical state (grammar.c) */
    uint8_t sub;        /* with the mode: hex digits left, literal position, key flag */
    uint8_t ws;         /* whitespace bytes in the current run */
    uint8_t root;       /* llm_json_root */
    uint8_t dead;       /* a byte was refused: nothing continues it */
} llm_json_state;

void llm_json_init(llm_json_state *st, llm_json_root root);
/* Feeds bytes [n]; 0 while they continue a valid document, -1 once one is
 * refused (the state is then dead). */
int llm_json_feed(llm_json_state *st, const char *bytes, size_t n);
/* Whether what was fed is a complete document (more whitespace may follow). */
int llm_json_complete(const llm_json_state *st);

/* Every token's bytes (control tokens: none), once per vocabulary, and the
 * tokens grouped by first byte (the mask visits only the groups whose first
 * byte the state allows). */
typedef struct llm_grammar_vocab {
    int32_t n_vocab;
    uint32_t *off;      /* [n_vocab + 1] token t's bytes are bytes[off[t] .. off[t + 1]) */
    char *bytes;
    uint8_t *eog;       /* [n_vocab] end-of-generation tokens */
    int32_t *by_first;  /* [n_vocab] the tokens with bytes, by first byte */
    int32_t group[257]; /* by_first[group[c] .. group[c + 1]) begin with byte c */
    int32_t *eogs, n_eog; /* the end-of-generation tokens */
    uint8_t *plain;     /* [n_vocab] no byte below 0x20, no '"' or '\\': inside a string, it stays one */
    /* the tokens with bytes as a trie (llm_gbnf_mask walks it): node 0 is
     * the root; a node's tokens are trie_tok[tb .. te), those whose bytes
     * end at it first (tb .. own) */
    struct llm_trie_node {
        int32_t child, sibling; /* first child, next sibling: -1 for none */
        int32_t tb, own, te;
        uint8_t byte;           /* the byte on the edge into it */
    } *trie;
    int32_t n_trie;
    int32_t *trie_tok;  /* [n_vocab] */
} llm_grammar_vocab;

/* NULL when out of memory. */
llm_grammar_vocab *llm_grammar_vocab_new(const llm_tokenizer *tok);
/* The same from every token's bytes given (token t: bytes[off[t] ..
 * off[t + 1])) and end-of-generation flags (NULL: none); for tests and
 * benchmarks with a vocabulary of their own. */
llm_grammar_vocab *llm_grammar_vocab_from_bytes(int32_t n_vocab, const uint32_t *off, const char *bytes,
                                               const uint8_t *eog);
void llm_grammar_vocab_free(llm_grammar_vocab *v);

/* out [v->n_vocab] = in where the token can follow st, -inf elsewhere (in and
 * out distinct): a token with no bytes or whose bytes are refused is banned;
 * an end-of-generation token is allowed only once the document is complete.
 * When nothing would be left (a dead state), the end-of-generation tokens
 * are, at logit 0. Returns the count of tokens allowed. */
int32_t llm_json_mask(const llm_json_state *st, const llm_grammar_vocab *v, const float *in, float *out);
/* Feeds token's bytes (an end-of-generation token: none). */
int llm_json_accept(llm_json_state *st, const llm_grammar_vocab *v, int32_t token);

#endif
