/* engine/text/json_schema.c - a JSON Schema subset to a grammar's text (see
 * gbnf.h and docs/GRAMMAR.md). The schema is read by a small JSON parser of
 * its own (the engine links no JSON library); each subschema becomes a rule,
 * the JSON lexicon (strings, numbers, any value) shared rules at the end. */
#include "gbnf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- JSON */

enum { J_NULL, J_FALSE, J_TRUE, J_NUM, J_STR, J_ARR, J_OBJ };
enum { SCHEMA_MAX_DEPTH = 32, SCHEMA_MAX_NODES = 1 << 16 };

typedef struct {
    int type;
    const char *a;   /* its text [a, b) in the schema */
    const char *b;
    int32_t child;   /* first element or member (-1) */
    int32_t next;    /* next sibling (-1) */
    int32_t key;     /* as a member: its key's node (a J_STR) */
} jnode;

typedef struct {
    const char *s, *end, *text;  /* where we are, the end, the schema's start */
    jnode *n;
    int32_t nn, cap;
    char *err;
    size_t err_cap;
    int failed;
    /* the output */
    char *out;
    size_t len, out_cap;
    int32_t n_rules;
    char path[256];  /* where in the schema (a JSON pointer) */
} ctx;

__attribute__((format(printf, 2, 3))) static int fail(ctx *c, const char *fmt, ...) {
    if (c->failed) return -1;
    c->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->err_cap, fmt, ap);
    va_end(ap);
    return -1;
}

static void ws(ctx *c) {
    while (c->s < c->end && (*c->s == ' ' || *c->s == '\t' || *c->s == '\n' || *c->s == '\r')) c->s++;
}

static int32_t new_node(ctx *c, int type, const char *a) {
    if (c->nn == SCHEMA_MAX_NODES) return fail(c, "the schema is too large");
    if (c->nn == c->cap) {
        int32_t nc = c->cap ? 2 * c->cap : 64;
        jnode *x = realloc(c->n, sizeof *x * (size_t)nc);
        if (!x) return fail(c, "out of memory");
        c->n = x, c->cap = nc;
    }
    c->n[c->nn] = (jnode){type, a, a, -1, -1, -1};
    return c->nn++;
}

static int32_t parse_value(ctx *c, int depth);

static int32_t parse_string(ctx *c) {
    const char *a = c->s++;
    while (c->s < c->end && *c->s != '"') {
        unsigned char ch = (unsigned char)*c->s;
        if (ch < 0x20) return fail(c, "the schema is not valid JSON: a control character in a string");
        if (ch == '\\') {
            c->s++;
            if (c->s >= c->end) break;
            if (*c->s == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (c->s + i >= c->end || !strchr("0123456789abcdefABCDEF", c->s[i]) || !c->s[i])
                        return fail(c, "the schema is not valid JSON: a bad \\u escape");
                c->s += 4;
            } else if (!strchr("\"\\/bfnrt", *c->s) || !*c->s) {
                return fail(c, "the schema is not valid JSON: a bad escape");
            }
        }
        c->s++;
    }
    if (c->s >= c->end) return fail(c, "the schema is not valid JSON: a string is not closed");
    c->s++;
    int32_t n = new_node(c, J_STR, a);
    if (n >= 0) c->n[n].b = c->s;
    return n;
}

static int32_t parse_value(ctx *c, int depth) {
    ws(c);
    if (c->s >= c->end) return fail(c, "the schema is not valid JSON: it ends early");
    if (depth > 2 * SCHEMA_MAX_DEPTH) return fail(c, "the schema nests deeper than %d", 2 * SCHEMA_MAX_DEPTH);
    const char *a = c->s;
    char ch = *c->s;
    if (ch == '"') return parse_string(c);
    if (ch == '{' || ch == '[') {
        const int obj = ch == '{';
        int32_t me = new_node(c, obj ? J_OBJ : J_ARR, a), prev = -1;
        if (me < 0) return -1;
        c->s++;
        ws(c);
        if (c->s < c->end && *c->s == (obj ? '}' : ']')) {
            c->s++;
            c->n[me].b = c->s;
            return me;
        }
        for (;;) {
            int32_t key = -1;
            ws(c);
            if (obj) {
                if (c->s >= c->end || *c->s != '"') return fail(c, "the schema is not valid JSON: expected a key");
                if ((key = parse_string(c)) < 0) return -1;
                ws(c);
                if (c->s >= c->end || *c->s != ':') return fail(c, "the schema is not valid JSON: expected ':'");
                c->s++;
            }
            int32_t v = parse_value(c, depth + 1);
            if (v < 0) return -1;
            c->n[v].key = key;
            if (prev < 0) c->n[me].child = v;
            else c->n[prev].next = v;
            prev = v;
            ws(c);
            if (c->s < c->end && *c->s == ',') {
                c->s++;
                continue;
            }
            if (c->s < c->end && *c->s == (obj ? '}' : ']')) break;
            return fail(c, "the schema is not valid JSON: expected ',' or '%c'", obj ? '}' : ']');
        }
        c->s++;
        c->n[me].b = c->s;
        return me;
    }
    static const char *const lit[3] = {"null", "false", "true"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(lit[i]);
        if ((size_t)(c->end - c->s) >= n && !memcmp(c->s, lit[i], n)) {
            c->s += n;
            int32_t me = new_node(c, J_NULL + i, a);
            if (me >= 0) c->n[me].b = c->s;
            return me;
        }
    }
    /* a number in JSON's form */
    const char *p = c->s;
    if (p < c->end && *p == '-') p++;
    if (p < c->end && *p == '0') p++;
    else if (p < c->end && *p >= '1' && *p <= '9') while (p < c->end && *p >= '0' && *p <= '9') p++;
    else return fail(c, "the schema is not valid JSON at byte %ld", (long)(a - c->text));
    if (p < c->end && *p == '.') {
        const char *d = ++p;
        while (p < c->end && *p >= '0' && *p <= '9') p++;
        if (p == d) return fail(c, "the schema is not valid JSON: a number");
    }
    if (p < c->end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < c->end && (*p == '+' || *p == '-')) p++;
        const char *d = p;
        while (p < c->end && *p >= '0' && *p <= '9') p++;
        if (p == d) return fail(c, "the schema is not valid JSON: a number");
    }
    c->s = p;
    int32_t me = new_node(c, J_NUM, a);
    if (me >= 0) c->n[me].b = p;
    return me;
}

/* The member `name` of object o, or -1 (keys compared as written). */
static int32_t member(const ctx *c, int32_t o, const char *name) {
    size_t n = strlen(name);
    for (int32_t k = c->n[o].child; k >= 0; k = c->n[k].next) {
        const jnode *key = &c->n[c->n[k].key];
        if ((size_t)(key->b - key->a) == n + 2 && !memcmp(key->a + 1, name, n)) return k;
    }
    return -1;
}

static int is_text(const ctx *c, int32_t n, const char *s) {
    size_t k = strlen(s);
    return c->n[n].type == J_STR && (size_t)(c->n[n].b - c->n[n].a) == k + 2 && !memcmp(c->n[n].a + 1, s, k);
}

/* ---------------------------------------------------------------- output */

static void put(ctx *c, const char *p, size_t n) {
    if (c->failed) return;
    if (c->len + n + 1 > c->out_cap) {
        size_t nc = (c->len + n + 1) * 2;
        char *x = realloc(c->out, nc);
        if (!x) {
            fail(c, "out of memory");
            return;
        }
        c->out = x, c->out_cap = nc;
    }
    memcpy(c->out + c->len, p, n);
    c->len += n;
    c->out[c->len] = 0;
}

__attribute__((format(printf, 2, 3))) static void putf(ctx *c, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0) put(c, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

/* Bytes as a grammar literal: "...", with '"', '\\' and bytes outside
 * printable ASCII escaped. */
static void put_literal(ctx *c, const char *p, size_t n) {
    put(c, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char u = (unsigned char)p[i];
        if (u == '"' || u == '\\') putf(c, "\\%c", u);
        else if (u < 0x20 || u >= 0x7F) putf(c, "\\x%02X", u);
        else put(c, (const char *)&u, 1);
    }
    put(c, "\"", 1);
}

/* JSON text of node n in a canonical form: compact, strings with only '"',
 * '\\' and control characters escaped (the form a model is held to). */
static int hex4(const char *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char ch = p[i];
        v = v * 16 + (ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10);
    }
    return v;
}

static void canon_string(ctx *c, const jnode *s, char **buf, size_t *len, size_t *cap) {
    /* decoded into UTF-8, then written with JSON's escapes */
    size_t n = 0;
    char *d = malloc((size_t)(s->b - s->a) * 2 + 8);
    if (!d) {
        fail(c, "out of memory");
        return;
    }
    for (const char *p = s->a + 1; p < s->b - 1; p++) {
        if (*p != '\\') {
            d[n++] = *p;
            continue;
        }
        p++;
        uint32_t cp;
        switch (*p) {
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            cp = (uint32_t)hex4(p + 1), p += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && p + 6 < s->b && p[1] == '\\' && p[2] == 'u') {
                uint32_t lo = (uint32_t)hex4(p + 3);
                if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00), p += 6;
            }
            break;
        default: cp = (unsigned char)*p;
        }
        if (cp < 0x80) d[n++] = (char)cp;
        else if (cp < 0x800) d[n++] = (char)(0xC0 | cp >> 6), d[n++] = (char)(0x80 | (cp & 63));
        else if (cp < 0x10000)
            d[n++] = (char)(0xE0 | cp >> 12), d[n++] = (char)(0x80 | ((cp >> 6) & 63)), d[n++] = (char)(0x80 | (cp & 63));
        else
            d[n++] = (char)(0xF0 | cp >> 18), d[n++] = (char)(0x80 | ((cp >> 12) & 63)),
            d[n++] = (char)(0x80 | ((cp >> 6) & 63)), d[n++] = (char)(0x80 | (cp & 63));
    }
    size_t need = *len + n * 6 + 3;
    if (need > *cap) {
        char *x = realloc(*buf, need * 2);
        if (!x) {
            free(d);
            fail(c, "out of memory");
            return;
        }
        *buf = x, *cap = need * 2;
    }
    (*buf)[(*len)++] = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char u = (unsigned char)d[i];
        if (u == '"' || u == '\\') (*buf)[(*len)++] = '\\', (*buf)[(*len)++] = (char)u;
        else if (u < 0x20) *len += (size_t)snprintf(*buf + *len, 7, "\\u%04x", u);
        else (*buf)[(*len)++] = (char)u;
    }
    (*buf)[(*len)++] = '"';
    free(d);
}

static void canon(ctx *c, int32_t n, char **buf, size_t *len, size_t *cap) {
    const jnode *x = &c->n[n];
    if (c->failed) return;
    if (x->type == J_STR) {
        canon_string(c, x, buf, len, cap);
        return;
    }
    if (*len + (size_t)(x->b - x->a) + 4 > *cap) {
        size_t nc = (*len + (size_t)(x->b - x->a) + 4) * 2;
        char *y = realloc(*buf, nc);
        if (!y) {
            fail(c, "out of memory");
            return;
        }
        *buf = y, *cap = nc;
    }
    if (x->type != J_ARR && x->type != J_OBJ) {
        memcpy(*buf + *len, x->a, (size_t)(x->b - x->a));
        *len += (size_t)(x->b - x->a);
        return;
    }
    int first = 1;
    (*buf)[(*len)++] = x->type == J_OBJ ? '{' : '[';
    for (int32_t k = x->child; k >= 0; k = c->n[k].next) {
        if (*len + 4 > *cap) {
            char *y = realloc(*buf, *cap * 2 + 8);
            if (!y) {
                fail(c, "out of memory");
                return;
            }
            *buf = y, *cap = *cap * 2 + 8;
        }
        if (!first) (*buf)[(*len)++] = ',';
        first = 0;
        if (x->type == J_OBJ) {
            canon(c, c->n[k].key, buf, len, cap);
            if (*len + 2 > *cap) {
                char *y = realloc(*buf, *cap * 2 + 8);
                if (!y) {
                    fail(c, "out of memory");
                    return;
                }
                *buf = y, *cap = *cap * 2 + 8;
            }
            (*buf)[(*len)++] = ':';
        }
        canon(c, k, buf, len, cap);
    }
    if (*len + 2 > *cap) {
        char *y = realloc(*buf, *cap * 2 + 8);
        if (!y) {
            fail(c, "out of memory");
            return;
        }
        *buf = y, *cap = *cap * 2 + 8;
    }
    (*buf)[(*len)++] = x->type == J_OBJ ? '}' : ']';
}

/* Node n's canonical JSON as a grammar literal. */
static void put_value_literal(ctx *c, int32_t n) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    canon(c, n, &buf, &len, &cap);
    if (!c->failed) put_literal(c, buf, len);
    free(buf);
}

/* ---------------------------------------------------------------- schemas */

static const char *const annotations[] = {"title", "description", "$schema", "$id", "$comment", "default", "examples"};
static const char *const types[] = {"object", "array", "string", "number", "integer", "boolean", "null"};

static int32_t schema(ctx *c, int32_t n, int depth);

/* The path with /seg appended while f runs (restored after). */
static size_t path_push(ctx *c, const char *seg, size_t n) {
    size_t at = strlen(c->path);
    snprintf(c->path + at, sizeof c->path - at, "/%.*s", (int)(n > 60 ? 60 : n), seg);
    return at;
}

static const char *where(const ctx *c) { return c->path[0] ? c->path : "the top"; }

/* One type's rule body for schema object n (its keywords checked). */
static void type_body(ctx *c, int32_t n, const char *type, int32_t me, int depth) {
    if (strcmp(type, "array") && strcmp(type, "object")) putf(c, "s%d ::= %s", (int)me, type);
    else if (!strcmp(type, "array")) {
        int32_t items = member(c, n, "items"), mi = member(c, n, "minItems"), ma = member(c, n, "maxItems");
        long lo = 0, hi = -1;
        for (int k = 0; k < 2; k++) {
            int32_t m = k ? ma : mi;
            if (m < 0) continue;
            const jnode *x = &c->n[m];
            char num[32];
            size_t len = (size_t)(x->b - x->a);
            if (x->type != J_NUM || len >= sizeof num) {
                fail(c, "'%s' must be an integer (at %s)", k ? "maxItems" : "minItems", where(c));
                return;
            }
            memcpy(num, x->a, len), num[len] = 0;
            char *end;
            long v = strtol(num, &end, 10);
            if (*end || v < 0 || v > LLM_GBNF_MAX_REPEAT) {
                fail(c, "'%s' must be an integer in [0, %d] (at %s)", k ? "maxItems" : "minItems", LLM_GBNF_MAX_REPEAT,
                     where(c));
                return;
            }
            if (k) hi = v;
            else lo = v;
        }
        if (hi >= 0 && hi < lo) {
            fail(c, "'maxItems' is below 'minItems' (at %s)", where(c));
            return;
        }
        int32_t item = -1;
        if (items >= 0) {
            size_t at = path_push(c, "items", 5);
            item = schema(c, items, depth + 1);
            c->path[at] = 0;
            if (item < 0) return;
        }
        char it[32];
        if (item >= 0) snprintf(it, sizeof it, "s%d", (int)item);
        else snprintf(it, sizeof it, "value");
        putf(c, "s%d ::= ", (int)me);
        if (hi == 0) {
            put(c, "\"[\" ws \"]\"", 10);
            return;
        }
        putf(c, "\"[\" ws ");
        if (lo == 0) put(c, "(", 1);
        putf(c, "%s ws", it);
        long rlo = lo > 0 ? lo - 1 : 0, rhi = hi > 0 ? hi - 1 : -1;
        if (rhi < 0) putf(c, " (\",\" ws %s ws){%ld,}", it, rlo);
        else if (rhi > 0) putf(c, " (\",\" ws %s ws){%ld,%ld}", it, rlo, rhi);
        if (lo == 0) put(c, ")?", 2);
        put(c, " \"]\"", 4);
    } else { /* object */
        int32_t props = member(c, n, "properties"), req = member(c, n, "required"), ap = member(c, n, "additionalProperties");
        if (ap >= 0 && c->n[ap].type != J_FALSE) {
            fail(c, "'additionalProperties' is only supported as false (at %s)", where(c));
            return;
        }
        if (props >= 0 && c->n[props].type != J_OBJ) {
            fail(c, "'properties' must be an object (at %s)", where(c));
            return;
        }
        if (req >= 0 && c->n[req].type != J_ARR) {
            fail(c, "'required' must be an array of names (at %s)", where(c));
            return;
        }
        if (props < 0) {
            if (req >= 0 && c->n[req].child >= 0) {
                fail(c, "'required' names properties that 'properties' does not give (at %s)", where(c));
                return;
            }
            putf(c, "s%d ::= object", (int)me);
            return;
        }
        /* required names must be properties */
        for (int32_t r = req >= 0 ? c->n[req].child : -1; r >= 0; r = c->n[r].next) {
            int found = c->n[r].type == J_STR;
            if (found) {
                found = 0;
                for (int32_t k = c->n[props].child; k >= 0 && !found; k = c->n[k].next) {
                    const jnode *a = &c->n[c->n[k].key], *b = &c->n[r];
                    found = a->b - a->a == b->b - b->a && !memcmp(a->a, b->a, (size_t)(a->b - a->a));
                }
            }
            if (!found) {
                fail(c, "'required' names %.*s, which is not in 'properties' (at %s)", (int)(c->n[r].b - c->n[r].a > 40 ? 40 : c->n[r].b - c->n[r].a), c->n[r].a, where(c));
                return;
            }
        }
        /* each property's value rule first */
        int32_t np = 0, vals[256];
        uint8_t required[256];
        for (int32_t k = c->n[props].child; k >= 0; k = c->n[k].next) {
            if (np == 256) {
                fail(c, "more than 256 properties (at %s)", where(c));
                return;
            }
            const jnode *key = &c->n[c->n[k].key];
            size_t at = path_push(c, "properties", 10);
            path_push(c, key->a + 1, (size_t)(key->b - key->a - 2));
            vals[np] = schema(c, k, depth + 1);
            c->path[at] = 0;
            if (vals[np] < 0) return;
            required[np] = 0;
            for (int32_t r = req >= 0 ? c->n[req].child : -1; r >= 0; r = c->n[r].next) {
                const jnode *b = &c->n[r];
                required[np] |= key->b - key->a == b->b - b->a && !memcmp(key->a, b->a, (size_t)(key->b - key->a));
            }
            np++;
        }
        /* {"k0": v0, "k1": v1, ...} in the order given, optional ones
         * skipped: a_i (nothing written yet) and b_i (a comma first) */
        putf(c, "s%d ::= \"{\" ws s%d-a0 \"}\"\n", (int)me, (int)me);
        int32_t i = 0;
        for (int32_t k = c->n[props].child; k >= 0; k = c->n[k].next, i++) {
            const jnode *key = &c->n[c->n[k].key];
            char *kbuf = NULL;
            size_t klen = 0, kcap = 0;
            canon(c, c->n[k].key, &kbuf, &klen, &kcap);
            putf(c, "s%d-kv%d ::= ", (int)me, (int)i);
            if (!c->failed) put_literal(c, kbuf, klen);
            free(kbuf);
            (void)key;
            putf(c, " ws \":\" ws s%d ws\n", (int)vals[i]);
            putf(c, "s%d-a%d ::= s%d-kv%d s%d-b%d%s", (int)me, (int)i, (int)me, (int)i, (int)me, (int)i + 1,
                 required[i] ? "" : " | ");
            if (!required[i]) putf(c, "s%d-a%d", (int)me, (int)i + 1);
            put(c, "\n", 1);
            putf(c, "s%d-b%d ::= \",\" ws s%d-kv%d s%d-b%d%s", (int)me, (int)i, (int)me, (int)i, (int)me, (int)i + 1,
                 required[i] ? "" : " | ");
            if (!required[i]) putf(c, "s%d-b%d", (int)me, (int)i + 1);
            put(c, "\n", 1);
        }
        putf(c, "s%d-a%d ::= \"\"\ns%d-b%d ::= \"\"", (int)me, (int)np, (int)me, (int)np);
    }
}

/* Schema n to rule s<k>; returns k, or -1. */
static int32_t schema(ctx *c, int32_t n, int depth) {
    if (c->failed) return -1;
    if (depth > SCHEMA_MAX_DEPTH) return fail(c, "the schema nests deeper than %d (at %s)", SCHEMA_MAX_DEPTH, where(c));
    const int32_t me = c->n_rules++;
    const jnode *x = &c->n[n];
    if (x->type == J_TRUE) {
        putf(c, "s%d ::= value\n", (int)me);
        return me;
    }
    if (x->type != J_OBJ) return fail(c, "a schema must be an object (at %s)", where(c));
    /* every keyword must be one this subset knows */
    static const char *const known[] = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                        "maxItems", "enum", "const", "anyOf"};
    for (int32_t k = x->child; k >= 0; k = c->n[k].next) {
        const jnode *key = &c->n[c->n[k].key];
        int ok = 0;
        for (size_t i = 0; i < sizeof known / sizeof *known && !ok; i++) ok = is_text(c, c->n[k].key, known[i]);
        for (size_t i = 0; i < sizeof annotations / sizeof *annotations && !ok; i++)
            ok = is_text(c, c->n[k].key, annotations[i]);
        if (!ok)
            return fail(c, "JSON Schema keyword '%.*s' is not supported (at %s)",
                        (int)(key->b - key->a - 2 > 60 ? 60 : key->b - key->a - 2), key->a + 1, where(c));
    }
    int32_t en = member(c, n, "enum"), co = member(c, n, "const"), any = member(c, n, "anyOf"),
            ty = member(c, n, "type");
    if (en >= 0 || co >= 0) {
        if (en >= 0 && (c->n[en].type != J_ARR || c->n[en].child < 0))
            return fail(c, "'enum' must be a non-empty array (at %s)", where(c));
        putf(c, "s%d ::= ", (int)me);
        if (co >= 0) put_value_literal(c, co);
        for (int32_t k = en >= 0 ? c->n[en].child : -1; k >= 0; k = c->n[k].next) {
            if (k != c->n[en].child || co >= 0) put(c, " | ", 3);
            put_value_literal(c, k);
        }
        put(c, "\n", 1);
        return c->failed ? -1 : me;
    }
    if (any >= 0) {
        if (c->n[any].type != J_ARR || c->n[any].child < 0)
            return fail(c, "'anyOf' must be a non-empty array (at %s)", where(c));
        if (ty >= 0 || member(c, n, "properties") >= 0 || member(c, n, "items") >= 0)
            return fail(c, "'anyOf' beside 'type', 'properties' or 'items' is not supported (at %s)", where(c));
        int32_t subs[64], ns = 0, i = 0;
        for (int32_t k = c->n[any].child; k >= 0; k = c->n[k].next, i++) {
            if (ns == 64) return fail(c, "'anyOf' with more than 64 schemas (at %s)", where(c));
            char idx[16];
            int len = snprintf(idx, sizeof idx, "%d", (int)i);
            size_t at = path_push(c, "anyOf", 5);
            path_push(c, idx, (size_t)len);
            subs[ns++] = schema(c, k, depth + 1);
            c->path[at] = 0;
            if (subs[ns - 1] < 0) return -1;
        }
        putf(c, "s%d ::= ", (int)me);
        for (int32_t k = 0; k < ns; k++) putf(c, "%ss%d", k ? " | " : "", (int)subs[k]);
        put(c, "\n", 1);
        return me;
    }
    /* the types: one, a list, or none given (then what properties / items
     * imply, else any value) */
    const char *list[8];
    int nt = 0;
    if (ty >= 0) {
        if (c->n[ty].type == J_STR) {
            for (size_t i = 0; i < sizeof types / sizeof *types; i++)
                if (is_text(c, ty, types[i])) list[nt++] = types[i];
            if (!nt) return fail(c, "'type' %.*s is not a JSON Schema type (at %s)", (int)(c->n[ty].b - c->n[ty].a > 40 ? 40 : c->n[ty].b - c->n[ty].a), c->n[ty].a, where(c));
        } else if (c->n[ty].type == J_ARR && c->n[ty].child >= 0) {
            for (int32_t k = c->n[ty].child; k >= 0; k = c->n[k].next) {
                int found = 0;
                for (size_t i = 0; i < sizeof types / sizeof *types && !found; i++)
                    if (is_text(c, k, types[i])) found = 1, list[nt < 7 ? nt++ : nt] = types[i];
                if (!found) return fail(c, "'type' holds something that is not a JSON Schema type (at %s)", where(c));
            }
        } else {
            return fail(c, "'type' must be a type name or a non-empty array of them (at %s)", where(c));
        }
    } else if (member(c, n, "properties") >= 0) {
        list[nt++] = "object";
    } else if (member(c, n, "items") >= 0) {
        list[nt++] = "array";
    } else {
        putf(c, "s%d ::= value\n", (int)me);
        return me;
    }
    /* object and array rules write nested rules first: each type's body
     * goes into a rule of its own, the schema's rule picks among them */
    int32_t body[8];
    for (int i = 0; i < nt; i++) {
        body[i] = c->n_rules++;
        type_body(c, n, list[i], body[i], depth);   /* nested rules first, then its own line */
        if (c->failed) return -1;
        put(c, "\n", 1);
    }
    putf(c, "s%d ::= ", (int)me);
    for (int i = 0; i < nt; i++) putf(c, "%ss%d", i ? " | " : "", (int)body[i]);
    put(c, "\n", 1);
    return c->failed ? -1 : me;
}

static const char lexicon[] =
    "value ::= object | array | string | number | boolean | null\n"
    "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\"\n"
    "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
    "string ::= \"\\\"\" [^\"\\\\\\x00-\\x1F]* ( \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) [^\"\\\\\\x00-\\x1F]* )* \"\\\"\"\n"
    "number ::= integer ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n"
    "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n"
    "ws ::= [ \\t\\n]{0,20}\n";

/* Reads one schema document [text, end) and compiles its rules; the top
 * rule's number, or -1 with c->failed set. */
static int32_t schema_text(ctx *c, const char *text, const char *end) {
    c->s = c->text = text, c->end = end;
    int32_t root = parse_value(c, 0);
    if (root < 0) return -1;
    ws(c);
    if (c->s != c->end) {
        fail(c, "the schema is not valid JSON: something follows it");
        return -1;
    }
    return schema(c, root, 0);
}

/* The grammar text written, or NULL when compiling failed (err says why). */
static char *grammar_done(ctx *c) {
    free(c->n);
    if (c->failed) {
        free(c->out);
        return NULL;
    }
    return c->out;
}

char *llm_json_schema_grammar(const char *text, size_t len, char *err, size_t err_cap) {
    ctx c = {.err = err, .err_cap = err_cap};
    if (err_cap) err[0] = 0;
    int32_t top = schema_text(&c, text, text + len);
    if (!c.failed && top >= 0) {
        putf(&c, "root ::= ws s%d ws\n", (int)top);
        put(&c, lexicon, sizeof lexicon - 1);
    }
    return grammar_done(&c);
}

char *llm_json_call_grammar(int32_t n, const char *const *names, const char *const *schemas, const char *head,
                            const char *args_key, const char *tail, char *err, size_t err_cap) {
    ctx c = {.err = err, .err_cap = err_cap};
    int32_t tops[64];
    if (err_cap) err[0] = 0;
    if (n < 1 || n > 64) fail(&c, "a call grammar takes 1 to 64 functions");
    for (int32_t i = 0; i < n && !c.failed; i++) tops[i] = schema_text(&c, schemas[i], schemas[i] + strlen(schemas[i]));
    if (!c.failed) {
        put(&c, "root ::= ", 9);
        put_literal(&c, head, strlen(head));
        putf(&c, "%s", " \"{\\\"name\\\": \" (");
        for (int32_t i = 0; i < n; i++) {
            char lit[200];
            snprintf(lit, sizeof lit, "\"%s\", \"%s\": ", names[i], args_key);
            putf(&c, "%s", i ? " | " : " ");
            put_literal(&c, lit, strlen(lit));
            putf(&c, " s%d", (int)tops[i]);
        }
        putf(&c, "%s", " ) \"}\" ");
        put_literal(&c, tail, strlen(tail));
        put(&c, "\n", 1);
        put(&c, lexicon, sizeof lexicon - 1);
    }
    return grammar_done(&c);
}

llm_gbnf *llm_json_schema_compile(const char *schema_text, size_t len, char *err, size_t err_cap) {
    char *g = llm_json_schema_grammar(schema_text, len, err, err_cap);
    if (!g) return NULL;
    llm_gbnf *out = llm_gbnf_parse(g, strlen(g), err, err_cap);
    free(g);
    return out;
}
