/* engine/text/unicode.h - UTF-8 decoding and the character classes the tokenizer's
 * pre-tokenizers need (\s, \p{L}, \p{N}, \p{P}). Internal to the engine.
 *
 * Invalid UTF-8 never stops decoding: a byte that does not start a well-formed
 * sequence decodes as one unit of length 1 with the code point
 * LLM_CP_INVALID_BASE + byte, which is in no class ("other"). Byte-level BPE
 * then still sees every input byte exactly once. */
#ifndef LLM_UNICODE_H
#define LLM_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* Code points above U+10FFFF stand for undecodable bytes: 0x110000 + byte. */
#define LLM_CP_INVALID_BASE 0x110000u

/* Character classes, as bit flags so a caller can test several at once. */
enum {
    LLM_CC_OTHER = 0,
    LLM_CC_LETTER = 1,  /* general category L* (\p{L}) */
    LLM_CC_NUMBER = 2,  /* general category N* (\p{N}) */
    LLM_CC_SPACE = 4,   /* Unicode White_Space (\s in the HF tokenizers' regexes) */
};

/* Decode one code point from s[0..n), n >= 1. Returns the bytes consumed
 * (1..4) and stores the code point, or LLM_CP_INVALID_BASE + s[0] with a
 * length of 1 for a malformed, overlong, surrogate or truncated sequence. */
int llm_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* Bytes in the UTF-8 sequence that lead byte b announces (1 for a stray
 * continuation or invalid lead byte), without validating what follows. */
int llm_utf8_len(unsigned char b);

/* Encode cp (<= 0x10FFFF) into out; returns the byte count (1..4). */
int llm_utf8_encode(uint32_t cp, char out[4]);

/* The class of a code point (one of LLM_CC_*); punctuation is "other". */
int llm_unicode_class(uint32_t cp);

/* Is cp punctuation (general category P*, \p{P})? */
int llm_unicode_is_punct(uint32_t cp);

#endif
