/* engine/text/tokenizer.h - text <-> token ids for Llama-family GGUF models.
 *
 * Two vocabulary kinds, named as GGUF's `tokenizer.ggml.model` names them:
 *
 *   "gpt2"   byte-level BPE (Llama 3, Qwen2, SmolLM, GPT-2). Text is split by a
 *            pre-tokenizer pattern (`tokenizer.ggml.pre`), each piece's bytes are
 *            mapped to printable characters by the GPT-2 byte-to-unicode table,
 *            and adjacent symbols are merged by rank (`tokenizer.ggml.merges`,
 *            rank = index) until no ranked pair is left. Well-formed UTF-8
 *            encodes and decodes back exactly, as long as the vocabulary has a
 *            token for every byte (a byte without one is dropped).
 *   "llama"  SentencePiece-style BPE (Llama 2, TinyLlama, Gemma). Spaces become
 *            U+2581 '▁', a leading '▁' is added when the vocabulary says so
 *            (add_space_prefix), and the adjacent pair whose
 *            concatenation is the highest-scoring vocabulary token is merged
 *            until none is left; characters outside the vocabulary fall back to
 *            <0xNN> byte tokens.
 *
 * A tokenizer is built from plain arrays (what the GGUF loader reads) and
 * copies everything it keeps into one allocation, so the arrays (and a GGUF
 * mapping behind them) may be released as soon as llm_tokenizer_create returns.
 * A built tokenizer is immutable: any number of threads may use it at once.
 *
 * Special tokens: tokens of type CONTROL or UNKNOWN (e.g. "<|im_start|>",
 * "<s>") are recognised in the input text only when parse_special is set;
 * USER_DEFINED tokens (Gemma 3's runs of spaces, tabs and newlines, its HTML
 * tags) are always recognised, as in llama.cpp, HF and SentencePiece. They
 * are cut out of the text first, leftmost first and at each position the
 * longest, and the fragments between them are encoded apart. */
#ifndef LLM_TOKENIZER_H
#define LLM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

/* Token types, as GGUF's tokenizer.ggml.token_type stores them. */
enum {
    LLM_TOKEN_UNDEFINED = 0,
    LLM_TOKEN_NORMAL = 1,
    LLM_TOKEN_UNKNOWN = 2,
    LLM_TOKEN_CONTROL = 3,
    LLM_TOKEN_USER_DEFINED = 4,
    LLM_TOKEN_UNUSED = 5,
    LLM_TOKEN_BYTE = 6,
};

/* Returned (instead of a count) on an invalid argument or out of memory. Every
 * other negative return r means "buffer too small: -r is the size needed". */
#define LLM_TOK_ERR INT32_MIN

/* What the caller fills to build a tokenizer; nothing here is kept. */
typedef struct {
    const char *model;              /* "gpt2" (byte-level BPE) or "llama" (SentencePiece-style) */
    const char *pre;                /* pre-tokenizer (tokenizer.ggml.pre), gpt2 only: "gpt2"
                                     * (GPT-2 pattern), "llama-bpe" (Llama 3), "qwen2",
                                     * "smollm" (digits apart, then GPT-2), aliases, or NULL
                                     * or "default": llama.cpp's fallback (engine/text/pretok.h) */
    int32_t n_vocab;                /* number of tokens, > 0 */
    const char *const *tokens;      /* [n_vocab] token texts as GGUF stores them (gpt2: byte-to-
                                     * unicode form such as "Ġthe"; llama: "▁the", "<0x0A>") */
    const int32_t *token_len;       /* [n_vocab] byte lengths of tokens[i]; NULL: NUL-terminated */
    const float *scores;            /* [n_vocab] merge priority (llama), or NULL: all equal */
    const int32_t *token_type;      /* [n_vocab] LLM_TOKEN_*, or NULL: all normal except the
                                     * bos/eos/unk/pad ids, which count as control */
    int32_t n_merges;               /* number of merges (gpt2); 0 for llama */
    const char *const *merges;      /* [n_merges] "left right" in token-text form; rank = index */
    const int32_t *merge_len;       /* [n_merges] byte lengths, or NULL: NUL-terminated */
    int32_t bos_id, eos_id;         /* beginning/end of sequence ids, -1 when absent */
    int32_t unk_id, pad_id;         /* unknown/padding ids, -1 when absent */
    int add_bos, add_eos;           /* add bos/eos when llm_tokenize's add_special is set */
    int add_space_prefix;           /* llama: prefix a space ('▁') to the text; -1: the model's
                                     * default (llama 1, gpt2 0). gpt2 ignores it */
} llm_tokenizer_desc;

/* A desc with every id -1, add_space_prefix -1 and the rest zero. */
llm_tokenizer_desc llm_tokenizer_desc_default(void);

typedef struct llm_tokenizer llm_tokenizer;

/* Build a tokenizer. Returns 0 and sets *out, or -1 with a message in err
 * (err may be NULL) for an unknown model or pre-tokenizer, an id out of range,
 * a malformed merge, or out of memory. */
int llm_tokenizer_create(const llm_tokenizer_desc *desc, llm_tokenizer **out, char *err,
                         size_t errlen);
void llm_tokenizer_free(llm_tokenizer *tok);

/* Encode text[0..len) (any bytes; NUL is an ordinary byte) into out[0..max_out).
 * Ids equal llama.cpp's for the same bytes. Malformed UTF-8 is read as llama.cpp
 * reads it, so it does not decode back byte for byte: byte-level BPE takes a
 * byte that starts no well-formed sequence as U+FFFD; SentencePiece takes as
 * many bytes as a lead byte announces into one symbol, which falls back to
 * byte tokens. Well-formed text always decodes back exactly.
 * add_special: add bos/eos as the desc says. parse_special: recognise control
 * tokens written in the text (see above). Returns the number of ids written;
 * when max_out is too small it writes nothing and returns -(ids needed);
 * LLM_TOK_ERR when out of memory or len > INT32_MAX / 4. */
int32_t llm_tokenize(const llm_tokenizer *tok, const char *text, size_t len, int add_special,
                     int parse_special, int32_t *out, int32_t max_out);

/* The bytes token id stands for: byte-level decoded (gpt2), '▁' -> ' ' and
 * <0xNN> -> that byte (llama). Control and unknown tokens give their text when
 * render_special is set and nothing otherwise. A token may end inside a UTF-8
 * character; concatenate pieces before printing. Returns the byte count (no
 * NUL is written), -(bytes needed) when buflen is too small, LLM_TOK_ERR for an
 * id out of range. */
int32_t llm_token_to_piece(const llm_tokenizer *tok, int32_t id, int render_special, char *buf,
                           int32_t buflen);

/* Zero-copy form of llm_token_to_piece with render_special set: the piece's
 * bytes (not NUL-terminated) live as long as the tokenizer. NULL for a bad id. */
const char *llm_token_piece(const llm_tokenizer *tok, int32_t id, int32_t *len);

/* Flags for llm_detokenize. */
enum {
    LLM_DETOK_SPECIAL = 1,  /* render control/unknown tokens as their text */
    LLM_DETOK_KEEP_SPACE = 2, /* llama: keep the space the encoder prefixed to the text and
                               * after each special token (default: drop it, so that
                               * detokenize(tokenize(s)) == s) */
};

/* Decode ids[0..n) into text, NUL-terminated. Returns the text length (without
 * the NUL); -(length + 1) when cap < length + 1, writing nothing;
 * LLM_TOK_ERR for an id out of range. */
int32_t llm_detokenize(const llm_tokenizer *tok, const int32_t *ids, int32_t n, int flags,
                       char *out, int32_t cap);

/* The id of the token whose stored text is exactly text[0..len) (any type), or
 * -1. For finding markers such as "<|im_end|>" or "<|eot_id|>". */
int32_t llm_tokenizer_find(const llm_tokenizer *tok, const char *text, size_t len);

int32_t llm_tokenizer_n_vocab(const llm_tokenizer *tok);
int32_t llm_tokenizer_bos(const llm_tokenizer *tok);  /* -1 when absent */
int32_t llm_tokenizer_eos(const llm_tokenizer *tok);  /* -1 when absent */
int llm_token_type(const llm_tokenizer *tok, int32_t id); /* LLM_TOKEN_*, -1 for a bad id */

/* Does generating this token end the model's turn? True for eos and for the
 * control tokens chat models stop on ("<|im_end|>", "<|eot_id|>", "<|eom_id|>",
 * "<|end|>", "<|endoftext|>", "<end_of_turn>", "</s>"). */
int llm_token_is_eog(const llm_tokenizer *tok, int32_t id);

/* The pre-tokenizer alone, for tests and debugging: split text[0..len) as the
 * named pre-tokenizer does (names as in llm_tokenizer_desc.pre), storing the end
 * offset of each piece in ends[0..max_ends). Returns the piece count, -(count)
 * when max_ends is too small, LLM_TOK_ERR for an unknown name or out of memory. */
int32_t llm_pretokenize(const char *pre, const char *text, size_t len, int32_t *ends,
                        int32_t max_ends);

#endif
