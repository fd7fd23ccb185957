/* server/response.c - small JSON pieces every reply uses: text as a valid
 * JSON string whatever its bytes, token bytes, finish reasons, usage. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at p[0..n) (RFC 3629: no overlong forms,
 * no surrogates, nothing above U+10FFFF), or 0 when it is not one. */
static size_t utf8_seq(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    if (c < 0x80) return 1;
    size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!len || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((p[i] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && p[1] < 0xA0) return 0;   /* overlong */
    if (c == 0xED && p[1] > 0x9F) return 0;   /* surrogates */
    if (c == 0xF0 && p[1] < 0x90) return 0;   /* overlong */
    if (c == 0xF4 && p[1] > 0x8F) return 0;   /* above U+10FFFF */
    return len;
}

json_t *srv_json_text(const char *text, size_t len) {
    json_t *s = json_stringn(text, len);
    if (s) return s;
    char *buf = malloc(len * 3 + 1);   /* each bad byte becomes 3 bytes of U+FFFD */
    if (!buf) return json_string("");
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_seq((const unsigned char *)text + i, len - i);
        if (k) {
            memcpy(buf + o, text + i, k), o += k, i += k;
        } else {
            memcpy(buf + o, "\xEF\xBF\xBD", 3), o += 3, i++;
        }
    }
    s = json_stringn(buf, o);
    free(buf);
    return s ? s : json_string("");
}

json_t *srv_json_bytes(const char *text, size_t len) {
    json_t *a = json_array();
    for (size_t i = 0; i < len; i++) json_array_append_new(a, json_integer((unsigned char)text[i]));
    return a;
}

const char *srv_finish_reason(llm_stop_reason r) {
    if (r == LLM_STOP_CANCEL) return "abort";   /* the server stopped: the answer is cut, not finished */
    return r == LLM_STOP_LENGTH || r == LLM_STOP_CONTEXT ? "length" : "stop";
}

json_t *srv_json_usage(int32_t n_prompt, int32_t n_cached, int32_t n_generated) {
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", n_prompt, "completion_tokens", n_generated,
                     "total_tokens", n_prompt + n_generated, "prompt_tokens_details", "cached_tokens", n_cached);
}
