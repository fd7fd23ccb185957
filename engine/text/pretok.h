/* engine/text/pretok.h - the byte-level BPE pre-tokenizers: split text into the
 * pieces BPE merges within. Internal to the engine (tokenizer.c uses it).
 *
 * Each pattern is hand-written as a matcher that behaves like the regex it is
 * named for (leftmost alternative wins, greedy with backtracking), over
 * decoded characters classified by engine/text/unicode.h. The patterns, as the HF
 * tokenizer.json files and llama.cpp state them:
 *
 *   GPT2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   LLAMA3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   QWEN2   as LLAMA3 with \p{N} instead of \p{N}{1,3}
 *   SMOLLM  every \p{N} character is a piece of its own (HF Digits with
 *           individual_digits), then GPT2 within the text between digits
 *   DEFAULT llama.cpp's pattern for "default" or no tokenizer.ggml.pre: four
 *           regexes, each splitting the pieces of the one before, matches and
 *           the text between them alike: [\p{P}\$\+<=>\^~\|]+, then GPT2,
 *           then \p{N}+, then [0-9][0-9][0-9]
 */
#ifndef LLM_PRETOK_H
#define LLM_PRETOK_H

#include <stddef.h>
#include <stdint.h>

typedef enum { LLM_PRE_GPT2, LLM_PRE_LLAMA3, LLM_PRE_QWEN2, LLM_PRE_SMOLLM, LLM_PRE_DEFAULT } llm_pre_kind;

/* Map a tokenizer.ggml.pre name (NULL = "default") to its pattern. Sets
 * *ignore_merges for pre-tokenizers whose HF model skips merging a piece that
 * is already a token (Llama 3). Returns 0, or -1 for an unknown name. */
int llm_pre_lookup(const char *name, llm_pre_kind *kind, int *ignore_merges);

/* One decoded character of the text being split. */
typedef struct {
    uint32_t off; /* byte offset of the character in the text */
    uint32_t cp;  /* code point, or LLM_CP_INVALID_BASE + byte for an undecodable byte */
    uint8_t cls;  /* LLM_CC_* class of cp */
} llm_pchar;

/* Receives each piece [start, end) (byte offsets into the text, non-empty, in
 * order, together covering the text). A nonzero return stops the split and is
 * returned by llm_pre_split. */
typedef int (*llm_piece_fn)(void *ctx, size_t start, size_t end);

/* Split text[0..len) with pattern kind. scratch has room for len characters.
 * Returns 0 or the first nonzero value emit returned. */
int llm_pre_split(llm_pre_kind kind, const char *text, size_t len, llm_pchar *scratch,
                  llm_piece_fn emit, void *ctx);

#endif
