/* engine/text/gbnf.h - grammars for constrained decoding: a GBNF-like text
 * (docs/GRAMMAR.md) compiled into rules, a recognizer over them that reads
 * bytes, and the token mask built on it; JSON Schema (a subset) compiles to
 * the same rules (llm_json_schema_grammar).
 *
 * Rules are sequences of elements: a byte class repeated min..max times (a
 * literal is a run of one-byte classes), or a reference to a rule; groups and
 * repetitions of anything but a class become rules of their own. The
 * recognizer's state is a set of stacks (one per way the bytes read so far
 * can be parsed), each a linked list of positions in the rules with shared
 * tails; the top of each is a class. A repeated class stays one stack while
 * it repeats (the count saturates at its minimum when it has no maximum), so
 * inside a string the state does not change from byte to byte. Left
 * recursion is refused when compiling.
 *
 * The mask walks the vocabulary's byte trie (llm_grammar_vocab) depth first
 * from the state, dropping a subtree at the first byte refused; where the
 * state is unchanged by every byte of a subtree (a string's body, a run of
 * digits), the whole subtree is allowed at once from per-node flags computed
 * when the grammar is bound to the vocabulary (llm_gbnf_bind). */
#ifndef LLM_GBNF_H
#define LLM_GBNF_H

#include <stddef.h>
#include <stdint.h>

#include "grammar.h"

/* Compile limits (untrusted text): LLM_GBNF_MAX_TEXT bytes, elements,
 * repetition counts, parenthesis nesting; recognizer limits: stacks in a
 * state (an ambiguous grammar keeps the first ones) and stack depth. */
enum {
    LLM_GBNF_MAX_TEXT = 1 << 20,
    LLM_GBNF_MAX_ELEMENTS = 1 << 20,
    LLM_GBNF_MAX_REPEAT = 1024,
    LLM_GBNF_MAX_NEST = 64,
    LLM_GBNF_MAX_STACKS = 256,
    LLM_GBNF_MAX_DEPTH = 512,
};

typedef struct llm_gbnf llm_gbnf;

/* Compiles text[len] (root rule "root"). NULL with a message in err (naming
 * the line and what is wrong) on a bad grammar or when out of memory. */
llm_gbnf *llm_gbnf_parse(const char *text, size_t len, char *err, size_t err_cap);
void llm_gbnf_free(llm_gbnf *g);
/* Prepares the mask for vocabulary v (kept; it must outlive g): 0, or -1
 * when out of memory. Needed before llm_gbnf_mask. */
int llm_gbnf_bind(llm_gbnf *g, const llm_grammar_vocab *v);
/* Whether g is bound to a vocabulary of n_vocab tokens. */
int llm_gbnf_bound(const llm_gbnf *g, int32_t n_vocab);

/* A recognizer state: where the bytes fed so far leave the grammar. */
typedef struct llm_gbnf_state llm_gbnf_state;

/* At the start of root; NULL when out of memory. */
llm_gbnf_state *llm_gbnf_state_new(const llm_gbnf *g);
void llm_gbnf_state_free(llm_gbnf_state *st);
/* Feeds bytes [n]: 0 while they continue a document, -1 once one is refused
 * (the state is then dead and stays so). */
int llm_gbnf_feed(llm_gbnf_state *st, const char *bytes, size_t n);
/* Whether what was fed is a whole document of the grammar. */
int llm_gbnf_complete(llm_gbnf_state *st);
/* Whether nothing can follow (dead, or complete with no byte allowed). */
int llm_gbnf_dead(const llm_gbnf_state *st);

/* As llm_json_mask, for a bound grammar: out [n_vocab] = in where the
 * token's bytes continue the document, -inf elsewhere; end-of-generation
 * tokens only once it is complete (or, at logit 0, when nothing else is
 * left). Returns the count allowed. */
int32_t llm_gbnf_mask(llm_gbnf_state *st, const float *in, float *out);
/* Feeds a token's bytes (an end-of-generation token: none). */
int llm_gbnf_accept(llm_gbnf_state *st, int32_t token);

/* JSON Schema (a subset, docs/GRAMMAR.md) as JSON text to a grammar's
 * text (malloc'ed; NUL-terminated). NULL with a message in err naming the
 * keyword and where it is when the schema uses what is not supported, is
 * not valid JSON, or nests too deep. */
char *llm_json_schema_grammar(const char *schema, size_t len, char *err, size_t err_cap);
/* A tool call's grammar text: head, then {"name": "NAME", "ARGS_KEY": ARGS}
 * for one of the n functions (names: [A-Za-z0-9_-], ARGS a document of
 * that function's schema), then tail; NULL with err as above. */
char *llm_json_call_grammar(int32_t n, const char *const *names, const char *const *schemas, const char *head,
                            const char *args_key, const char *tail, char *err, size_t err_cap);
/* Schema to a compiled grammar in one call (either step's error in err). */
llm_gbnf *llm_json_schema_compile(const char *schema, size_t len, char *err, size_t err_cap);

#endif
