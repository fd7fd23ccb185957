/* engine/text/unicode.c - UTF-8 decoding and character classes for the
 * pre-tokenizers. The letter/number table is generated data
 * (engine/text/unicode_data.h, from tests/data/gen_unicode_data.py). */
#include "unicode.h"

#include "unicode_data.h"

int llm_utf8_len(unsigned char b) {
    if (b < 0x80) return 1;
    if ((b & 0xE0) == 0xC0) return 2;
    if ((b & 0xF0) == 0xE0) return 3;
    if ((b & 0xF8) == 0xF0) return 4;
    return 1;
}

int llm_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    int len;
    uint32_t c, min;
    if (b >= 0xC2 && b <= 0xDF) {
        len = 2, c = b & 0x1F, min = 0x80;
    } else if ((b & 0xF0) == 0xE0) {
        len = 3, c = b & 0x0F, min = 0x800;
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4, c = b & 0x07, min = 0x10000;
    } else {
        goto invalid; /* continuation byte, C0/C1 (always overlong), F5..FF */
    }
    if ((size_t)len > n) goto invalid;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) goto invalid;
        c = (c << 6) | (s[i] & 0x3F);
    }
    /* Overlong forms, UTF-16 surrogates and values past U+10FFFF are not
     * characters; treating them byte by byte keeps decoding one-to-one. */
    if (c < min || (c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF) goto invalid;
    *cp = c;
    return len;
invalid:
    *cp = LLM_CP_INVALID_BASE + b;
    return 1;
}

int llm_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Unicode's White_Space property: the \s of Oniguruma, which the HF
 * tokenizers' regexes run on. (Python's str.isspace adds U+001C..U+001F,
 * which are not White_Space.) */
static int is_white_space(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return 0;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* The table's class of cp (0 when in no range): 1 letter, 2 number, 3
 * punctuation. */
static int table_class(uint32_t cp) {
    int lo = 0, hi = LLM_UNICODE_N_RANGES - 1, found = -1;
    while (lo <= hi) { /* the last range starting at or before cp */
        int mid = (lo + hi) / 2;
        if (llm_unicode_ranges[mid][0] <= cp) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    if (found < 0) return 0;
    uint32_t last = llm_unicode_ranges[found][1] & 0xFFFFFFu;
    return cp <= last ? (int)(llm_unicode_ranges[found][1] >> 24) : 0;
}

int llm_unicode_class(uint32_t cp) {
    /* ASCII is most of the text we see: answer it without a search. */
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return LLM_CC_LETTER;
        if (cp >= '0' && cp <= '9') return LLM_CC_NUMBER;
        return is_white_space(cp) ? LLM_CC_SPACE : LLM_CC_OTHER;
    }
    if (cp >= LLM_CP_INVALID_BASE) return LLM_CC_OTHER;
    if (is_white_space(cp)) return LLM_CC_SPACE;
    int c = table_class(cp);
    return c == 1 ? LLM_CC_LETTER : c == 2 ? LLM_CC_NUMBER : LLM_CC_OTHER;
}

int llm_unicode_is_punct(uint32_t cp) { return cp < LLM_CP_INVALID_BASE && table_class(cp) == 3; }
