/* engine/text/gbnf.c - the grammar compiler, the recognizer and the token mask
 * (see gbnf.h; the text format: docs/GRAMMAR.md). */
#include "gbnf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { E_END, E_ALT, E_CLASS, E_REF };

typedef struct {
    uint8_t type;
    int32_t a;          /* E_CLASS: class index; E_REF: rule index */
    int32_t min, max;   /* E_CLASS: repetitions; max -1: no limit */
} gel;

typedef struct {
    uint8_t b[32];
} bset;

static int has(const bset *s, int c) { return (s->b[c >> 3] >> (c & 7)) & 1; }
static void add(bset *s, int c) { s->b[c >> 3] |= (uint8_t)(1u << (c & 7)); }

enum { MAX_FAST = 16 };

struct llm_gbnf {
    gel *el;             /* [n_el] every rule's alternatives, each ended by E_ALT or E_END */
    int32_t n_el;
    int32_t n_rules;
    int32_t *alt_off;    /* [n_rules + 1] rule r's alternatives start at alts[alt_off[r] ..) */
    int32_t *alts;
    bset *cls;           /* [n_cls] */
    int32_t n_cls;
    bset *first;         /* [n_el] bytes that may come first from a position, within its alternative */
    uint8_t *nullable;   /* [n_el] the rest of the alternative may be empty */
    int32_t root;
    /* llm_gbnf_bind */
    const llm_grammar_vocab *v;
    int32_t n_fast, fast_cls[MAX_FAST]; /* classes repeated without limit */
    uint16_t *below;     /* [v->n_trie] bit i: every byte below the node is in fast_cls[i] */
};

/* ---------------------------------------------------------------- the parser */

typedef struct {
    gel *e;
    int32_t n, cap;
    char *name;
    int defined;
    int line;            /* where it was first named */
} prule;

typedef struct {
    const char *s, *end;
    int line;
    char *err;
    size_t err_cap;
    int failed;
    prule *r;
    int32_t nr, capr;
    int64_t total;       /* elements so far */
    bset *cls;
    int32_t ncls, capcls;
    int nest;
} parser;

__attribute__((format(printf, 2, 3))) static int fail(parser *p, const char *fmt, ...) {
    if (p->failed) return -1;
    p->failed = 1;
    int k = snprintf(p->err, p->err_cap, "grammar line %d: ", p->line);
    va_list ap;
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < p->err_cap) vsnprintf(p->err + k, p->err_cap - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static int push_el(parser *p, int32_t r, gel e) {
    prule *R = &p->r[r];
    if (++p->total > LLM_GBNF_MAX_ELEMENTS) return fail(p, "the grammar is too large");
    if (R->n == R->cap) {
        int32_t nc = R->cap ? 2 * R->cap : 16;
        gel *x = realloc(R->e, sizeof *x * (size_t)nc);
        if (!x) return fail(p, "out of memory");
        R->e = x, R->cap = nc;
    }
    R->e[R->n++] = e;
    return 0;
}

static int32_t new_rule(parser *p, const char *name, size_t len) {
    if (p->nr == p->capr) {
        int32_t nc = p->capr ? 2 * p->capr : 32;
        prule *x = realloc(p->r, sizeof *x * (size_t)nc);
        if (!x) return fail(p, "out of memory");
        p->r = x, p->capr = nc;
    }
    prule *R = &p->r[p->nr];
    memset(R, 0, sizeof *R);
    R->line = p->line;
    if (!(R->name = malloc(len + 1))) return fail(p, "out of memory");
    memcpy(R->name, name, len), R->name[len] = 0;
    return p->nr++;
}

static int32_t rule_named(parser *p, const char *name, size_t len) {
    for (int32_t i = 0; i < p->nr; i++)
        if (strlen(p->r[i].name) == len && !memcmp(p->r[i].name, name, len)) return i;
    return new_rule(p, name, len);
}

/* An anonymous rule for a group or a repetition: named after its parent. */
static int32_t anon_rule(parser *p, int32_t parent) {
    char name[96];
    int n = snprintf(name, sizeof name, "%.60s-%d", p->r[parent].name, (int)p->nr);
    int32_t r = new_rule(p, name, (size_t)n);
    if (r >= 0) p->r[r].defined = 1;
    return r;
}

static int32_t class_of(parser *p, const bset *b) {
    for (int32_t i = 0; i < p->ncls; i++)
        if (!memcmp(&p->cls[i], b, sizeof *b)) return i;
    if (p->ncls == p->capcls) {
        int32_t nc = p->capcls ? 2 * p->capcls : 32;
        bset *x = realloc(p->cls, sizeof *x * (size_t)nc);
        if (!x) return fail(p, "out of memory");
        p->cls = x, p->capcls = nc;
    }
    p->cls[p->ncls] = *b;
    return p->ncls++;
}

static int byte_el(parser *p, int32_t r, int c) {
    bset b = {{0}};
    add(&b, c);
    int32_t k = class_of(p, &b);
    return k < 0 ? -1 : push_el(p, r, (gel){E_CLASS, k, 1, 1});
}

static int is_name(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'; }

/* Spaces, tabs, comments; newlines too when nl (then a line may go on). */
static void skip(parser *p, int nl) {
    while (p->s < p->end) {
        char c = *p->s;
        if (c == ' ' || c == '\t' || c == '\r') p->s++;
        else if (c == '#') while (p->s < p->end && *p->s != '\n') p->s++;
        else if (c == '\n' && nl) p->s++, p->line++;
        else break;
    }
}

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
}

/* One character of a literal or class: a byte, or an escape. Returns the
 * code point (a byte value for \xHH and raw bytes; above 0xFF only from
 * \u and \U), or -1. */
static int64_t char_at(parser *p) {
    if (p->s >= p->end) return fail(p, "the text ends inside a literal or class");
    unsigned char c = (unsigned char)*p->s++;
    if (c == '\n') return fail(p, "a newline inside a literal or class (write \\n)");
    if (c != '\\') return c;
    if (p->s >= p->end) return fail(p, "the text ends after a backslash");
    c = (unsigned char)*p->s++;
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '0': return 0;
    case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': return c;
    case 'x': case 'u': case 'U': {
        int digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        int64_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = p->s < p->end ? hexval((unsigned char)*p->s) : -1;
            if (h < 0) return fail(p, "\\%c takes %d hex digits", c, digits);
            v = v * 16 + h, p->s++;
        }
        if (v > 0x10FFFF) return fail(p, "\\%c%llx is beyond Unicode", c, (unsigned long long)v);
        return c == 'x' ? v : v | ((int64_t)1 << 32); /* tag: a code point, written as UTF-8 */
    }
    default: return fail(p, "unknown escape \\%c", c);
    }
}

static int utf8(uint32_t cp, unsigned char *o) {
    if (cp < 0x80) return o[0] = (unsigned char)cp, 1;
    if (cp < 0x800) return o[0] = (unsigned char)(0xC0 | cp >> 6), o[1] = (unsigned char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return o[0] = (unsigned char)(0xE0 | cp >> 12), o[1] = (unsigned char)(0x80 | ((cp >> 6) & 63)),
               o[2] = (unsigned char)(0x80 | (cp & 63)), 3;
    return o[0] = (unsigned char)(0xF0 | cp >> 18), o[1] = (unsigned char)(0x80 | ((cp >> 12) & 63)),
           o[2] = (unsigned char)(0x80 | ((cp >> 6) & 63)), o[3] = (unsigned char)(0x80 | (cp & 63)), 4;
}

/* A class item's byte: code points above 0xFF cannot stand in a byte class. */
static int class_byte(parser *p) {
    int64_t v = char_at(p);
    if (v < 0) return -1;
    if (v >> 32) {
        v &= 0xFFFFFFFF;
        if (v > 0x7F) return fail(p, "a character class holds bytes: U+%04llX is more than one (use alternatives)", (unsigned long long)v);
    }
    return (int)v;
}

static int parse_alts(parser *p, int32_t r);

/* One item (a primary and its repetition) appended to rule r. */
static int parse_item(parser *p, int32_t r) {
    const int32_t start = p->r[r].n;
    char c = *p->s;
    if (c == '"') {
        p->s++;
        while (p->s < p->end && *p->s != '"') {
            int64_t v = char_at(p);
            if (v < 0) return -1;
            unsigned char u[4];
            int n = v >> 32 ? utf8((uint32_t)(v & 0xFFFFFFFF), u) : (u[0] = (unsigned char)v, 1);
            for (int i = 0; i < n; i++)
                if (byte_el(p, r, u[i])) return -1;
        }
        if (p->s >= p->end) return fail(p, "a literal is not closed");
        p->s++;
    } else if (c == '[') {
        p->s++;
        bset b = {{0}};
        int neg = p->s < p->end && *p->s == '^';
        if (neg) p->s++;
        while (p->s < p->end && *p->s != ']') {
            int lo = class_byte(p), hi = lo;
            if (lo < 0) return -1;
            if (p->s + 1 < p->end && *p->s == '-' && p->s[1] != ']') {
                p->s++;
                if ((hi = class_byte(p)) < 0) return -1;
                if (hi < lo) return fail(p, "a range goes down (%d-%d)", lo, hi);
            }
            for (int k = lo; k <= hi; k++) add(&b, k);
        }
        if (p->s >= p->end) return fail(p, "a character class is not closed");
        p->s++;
        if (neg)
            for (int k = 0; k < 32; k++) b.b[k] = (uint8_t)~b.b[k];
        int32_t k = class_of(p, &b);
        if (k < 0 || push_el(p, r, (gel){E_CLASS, k, 1, 1})) return -1;
    } else if (c == '.') {
        p->s++;
        bset b;
        memset(&b, 0xFF, sizeof b);
        int32_t k = class_of(p, &b);
        if (k < 0 || push_el(p, r, (gel){E_CLASS, k, 1, 1})) return -1;
    } else if (c == '(') {
        if (++p->nest > LLM_GBNF_MAX_NEST) return fail(p, "parentheses nest deeper than %d", LLM_GBNF_MAX_NEST);
        p->s++;
        int32_t g = anon_rule(p, r);
        if (g < 0) return -1;
        skip(p, 1);
        if (parse_alts(p, g)) return -1;
        skip(p, 1);
        if (p->s >= p->end || *p->s != ')') return fail(p, "expected ')'");
        p->s++, p->nest--;
        if (push_el(p, r, (gel){E_REF, g, 0, 0})) return -1;
    } else if (is_name((unsigned char)c)) {
        const char *a = p->s;
        while (p->s < p->end && is_name((unsigned char)*p->s)) p->s++;
        int32_t ref = rule_named(p, a, (size_t)(p->s - a));
        if (ref < 0 || push_el(p, r, (gel){E_REF, ref, 0, 0})) return -1;
    } else {
        return fail(p, "unexpected '%c'", c);
    }
    /* the repetition */
    if (p->s >= p->end) return 0;
    int64_t lo, hi;
    c = *p->s;
    if (c == '*') lo = 0, hi = -1;
    else if (c == '+') lo = 1, hi = -1;
    else if (c == '?') lo = 0, hi = 1;
    else if (c == '{') {
        p->s++;
        lo = 0;
        int digits = 0;
        while (p->s < p->end && *p->s >= '0' && *p->s <= '9' && lo <= LLM_GBNF_MAX_REPEAT) lo = lo * 10 + (*p->s++ - '0'), digits++;
        if (!digits) return fail(p, "'{' takes a count");
        hi = lo;
        if (p->s < p->end && *p->s == ',') {
            p->s++, hi = -1;
            if (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
                hi = 0;
                while (p->s < p->end && *p->s >= '0' && *p->s <= '9' && hi <= LLM_GBNF_MAX_REPEAT) hi = hi * 10 + (*p->s++ - '0');
            }
        }
        if (p->s >= p->end || *p->s != '}') return fail(p, "expected '}' after a count");
        if (lo > LLM_GBNF_MAX_REPEAT || hi > LLM_GBNF_MAX_REPEAT)
            return fail(p, "a repetition count is above %d", LLM_GBNF_MAX_REPEAT);
        if (hi >= 0 && hi < lo) return fail(p, "{%lld,%lld} goes down", (long long)lo, (long long)hi);
    } else {
        return 0;
    }
    p->s++;
    prule *R = &p->r[r];
    if (R->n == start) return 0; /* an empty literal repeated: still empty */
    if (R->n == start + 1 && R->e[start].type == E_CLASS) { /* one class: counted in place */
        R->e[start].min = (int32_t)lo, R->e[start].max = (int32_t)hi;
        return 0;
    }
    /* anything else: its elements become rule g, repeated through rules */
    int32_t g;
    if (R->n == start + 1) {
        g = R->e[start].a; /* a reference or a group: that rule itself */
    } else {
        if ((g = anon_rule(p, r)) < 0) return -1;
        for (int32_t i = start; i < p->r[r].n; i++)
            if (push_el(p, g, p->r[r].e[i])) return -1;
        if (push_el(p, g, (gel){E_END, 0, 0, 0})) return -1;
    }
    p->r[r].n = start;
    for (int64_t i = 0; i < lo; i++)
        if (push_el(p, r, (gel){E_REF, g, 0, 0})) return -1;
    if (hi == lo) return 0;
    /* the optional rest: star ::= g star | ""; or k nested optionals
     * opt_k ::= g opt_(k-1) | "" */
    int32_t tail = -1;
    for (int64_t k = 0; k < (hi < 0 ? 1 : hi - lo); k++) {
        int32_t o = anon_rule(p, r);
        if (o < 0 || push_el(p, o, (gel){E_REF, g, 0, 0})) return -1;
        if (hi < 0 ? push_el(p, o, (gel){E_REF, o, 0, 0}) : tail >= 0 ? push_el(p, o, (gel){E_REF, tail, 0, 0}) : 0)
            return -1;
        if (push_el(p, o, (gel){E_ALT, 0, 0, 0}) || push_el(p, o, (gel){E_END, 0, 0, 0})) return -1;
        tail = o;
    }
    return push_el(p, r, (gel){E_REF, tail, 0, 0});
}

/* Alternatives into rule r, each ended by E_ALT, the last by E_END. Inside
 * parentheses (nest > 0) lines may break anywhere; at the top, after '|',
 * or before a '|' that starts the next line. */
static int parse_alts(parser *p, int32_t r) {
    for (;;) {
        skip(p, p->nest > 0);
        while (p->s < p->end && *p->s != '|' && *p->s != ')' && *p->s != '\n') {
            if (parse_item(p, r)) return -1;
            skip(p, p->nest > 0);
        }
        /* a line that begins with '|' goes on with the rule */
        const char *save = p->s;
        int line = p->line;
        if (p->nest == 0 && p->s < p->end && *p->s == '\n') {
            skip(p, 1);
            if (p->s >= p->end || *p->s != '|') p->s = save, p->line = line;
        }
        if (p->s < p->end && *p->s == '|') {
            p->s++;
            if (push_el(p, r, (gel){E_ALT, 0, 0, 0})) return -1;
            skip(p, 1);
            continue;
        }
        return push_el(p, r, (gel){E_END, 0, 0, 0});
    }
}

static int parse_rules(parser *p) {
    for (;;) {
        skip(p, 1);
        if (p->s >= p->end) return 0;
        const char *a = p->s;
        while (p->s < p->end && is_name((unsigned char)*p->s)) p->s++;
        if (p->s == a) return fail(p, "expected a rule name, got '%c'", *p->s);
        int32_t r = rule_named(p, a, (size_t)(p->s - a));
        if (r < 0) return -1;
        if (p->r[r].defined) return fail(p, "rule '%s' is defined twice", p->r[r].name);
        p->r[r].defined = 1, p->r[r].line = p->line;
        skip(p, 0);
        if (p->end - p->s < 3 || memcmp(p->s, "::=", 3)) return fail(p, "expected '::=' after '%s'", p->r[r].name);
        p->s += 3;
        skip(p, 1);
        if (parse_alts(p, r)) return -1;
        if (p->s < p->end && *p->s == ')') return fail(p, "unexpected ')'");
    }
}

/* ---------------------------------------------------------------- analysis */

/* first and nullable of every position, to a fixed point over the rules. */
static void analyse(llm_gbnf *g) {
    bset *rfirst = calloc((size_t)g->n_rules, sizeof *rfirst);
    uint8_t *rnull = calloc((size_t)g->n_rules, 1);
    if (!rfirst || !rnull) {
        /* no memory for the analysis: every position may start with anything (correct, slower) */
        memset(g->first, 0xFF, sizeof *g->first * (size_t)g->n_el), memset(g->nullable, 1, (size_t)g->n_el);
        free(rfirst), free(rnull);
        return;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int32_t p = g->n_el - 1; p >= 0; p--) {
            const gel *e = &g->el[p];
            bset f = {{0}};
            uint8_t nu;
            if (e->type == E_END || e->type == E_ALT) {
                nu = 1;
            } else if (e->type == E_CLASS) {
                if (e->max != 0) f = g->cls[e->a];
                nu = e->min == 0 && g->nullable[p + 1];
                if (e->min == 0)
                    for (int k = 0; k < 32; k++) f.b[k] |= g->first[p + 1].b[k];
            } else {
                f = rfirst[e->a];
                nu = rnull[e->a] && g->nullable[p + 1];
                if (rnull[e->a])
                    for (int k = 0; k < 32; k++) f.b[k] |= g->first[p + 1].b[k];
            }
            g->first[p] = f, g->nullable[p] = nu;
        }
        for (int32_t r = 0; r < g->n_rules; r++) {
            bset f = {{0}};
            uint8_t nu = 0;
            for (int32_t i = g->alt_off[r]; i < g->alt_off[r + 1]; i++) {
                for (int k = 0; k < 32; k++) f.b[k] |= g->first[g->alts[i]].b[k];
                nu |= g->nullable[g->alts[i]];
            }
            if (memcmp(&f, &rfirst[r], sizeof f) || nu != rnull[r]) rfirst[r] = f, rnull[r] = nu, changed = 1;
        }
    }
    free(rfirst), free(rnull);
}

/* A rule that can reach itself before reading a byte would never stop
 * expanding: found as a cycle among the references each alternative makes
 * while all before them may be empty. The name of one such rule, or NULL. */
static const char *left_recursive(const llm_gbnf *g, char *const *names) {
    const int32_t R = g->n_rules;
    uint8_t *rnull = calloc((size_t)R + 1, 1), *color = calloc((size_t)R + 1, 1); /* 0 new, 1 on the path, 2 done */
    int32_t *eoff = calloc((size_t)R + 2, sizeof *eoff), *edge = malloc(sizeof *edge * ((size_t)g->n_el + 1));
    int32_t *stack = malloc(sizeof *stack * ((size_t)R * 2 + 2));
    const char *bad = NULL;
    if (!rnull || !color || !eoff || !edge || !stack) goto out;
    for (int32_t r = 0; r < R; r++)
        for (int32_t i = g->alt_off[r]; i < g->alt_off[r + 1]; i++) rnull[r] |= g->nullable[g->alts[i]];
    int32_t ne = 0;
    for (int32_t r = 0; r < R; r++) {
        eoff[r] = ne;
        for (int32_t i = g->alt_off[r]; i < g->alt_off[r + 1]; i++)
            for (int32_t p = g->alts[i]; g->el[p].type == E_CLASS || g->el[p].type == E_REF; p++) {
                if (g->el[p].type == E_CLASS) {
                    if (g->el[p].min > 0) break;
                    continue;
                }
                edge[ne++] = g->el[p].a;
                if (!rnull[g->el[p].a]) break;
            }
    }
    eoff[R] = ne;
    for (int32_t s0 = 0; s0 < R && !bad; s0++) {
        if (color[s0]) continue;
        int32_t n = 0;
        stack[n++] = s0, stack[n++] = eoff[s0], color[s0] = 1;
        while (n && !bad) {
            const int32_t r = stack[n - 2], k = stack[n - 1];
            if (k == eoff[r + 1]) {
                color[r] = 2, n -= 2;
                continue;
            }
            stack[n - 1] = k + 1;
            const int32_t to = edge[k];
            if (color[to] == 1) bad = names[to];
            else if (color[to] == 0) color[to] = 1, stack[n++] = to, stack[n++] = eoff[to];
        }
    }
out:
    free(rnull), free(color), free(eoff), free(edge), free(stack);
    return bad;
}

void llm_gbnf_free(llm_gbnf *g) {
    if (!g) return;
    free(g->el), free(g->alt_off), free(g->alts), free(g->cls), free(g->first), free(g->nullable), free(g->below);
    free(g);
}

llm_gbnf *llm_gbnf_parse(const char *text, size_t len, char *err, size_t err_cap) {
    parser p = {.s = text, .end = text + len, .line = 1, .err = err, .err_cap = err_cap};
    if (err_cap) err[0] = 0;
    llm_gbnf *g = NULL;
    if (len > LLM_GBNF_MAX_TEXT) fail(&p, "the grammar is longer than %d bytes", LLM_GBNF_MAX_TEXT);
    else if (!parse_rules(&p)) {
        int32_t root = -1;
        for (int32_t i = 0; i < p.nr && !p.failed; i++) {
            if (!p.r[i].defined) p.line = p.r[i].line, fail(&p, "rule '%s' is used but not defined", p.r[i].name);
            if (!strcmp(p.r[i].name, "root")) root = i;
        }
        if (!p.failed && root < 0) p.line = 1, fail(&p, "there is no rule 'root'");
    }
    if (!p.failed && !(g = calloc(1, sizeof *g))) fail(&p, "out of memory");
    if (!p.failed) {
        int64_t n = 1, na = 0; /* a trailing E_END: first[p + 1] of the last element is always defined */
        for (int32_t i = 0; i < p.nr; i++) {
            n += p.r[i].n;
            for (int32_t k = 0; k < p.r[i].n; k++) na += p.r[i].e[k].type == E_END || p.r[i].e[k].type == E_ALT;
        }
        g->el = malloc(sizeof *g->el * (size_t)n), g->alts = malloc(sizeof *g->alts * (size_t)(na + 1));
        g->alt_off = malloc(sizeof *g->alt_off * ((size_t)p.nr + 1));
        g->first = malloc(sizeof *g->first * (size_t)n), g->nullable = malloc((size_t)n);
        if (!g->el || !g->alts || !g->alt_off || !g->first || !g->nullable) fail(&p, "out of memory");
        else {
            int32_t at = 0, ai = 0;
            for (int32_t i = 0; i < p.nr; i++) {
                g->alt_off[i] = ai;
                g->alts[ai++] = at;
                for (int32_t k = 0; k < p.r[i].n; k++) {
                    g->el[at++] = p.r[i].e[k];
                    if (p.r[i].e[k].type == E_ALT) g->alts[ai++] = at;
                }
            }
            g->alt_off[p.nr] = ai;
            g->el[at++] = (gel){E_END, 0, 0, 0};
            g->n_el = at, g->n_rules = p.nr, g->root = 0;
            for (int32_t i = 0; i < p.nr; i++)
                if (!strcmp(p.r[i].name, "root")) g->root = i;
            g->cls = p.cls, g->n_cls = p.ncls, p.cls = NULL;
            analyse(g);
            char **names = malloc(sizeof *names * (size_t)p.nr);
            if (!names) fail(&p, "out of memory");
            else {
                for (int32_t i = 0; i < p.nr; i++) names[i] = p.r[i].name;
                const char *lr = left_recursive(g, names);
                if (lr) p.line = 1, fail(&p, "rule '%s' is left-recursive (it can reach itself before reading a byte)", lr);
                free(names);
            }
        }
    }
    for (int32_t i = 0; i < p.nr; i++) free(p.r[i].e), free(p.r[i].name);
    free(p.r), free(p.cls);
    if (p.failed) {
        llm_gbnf_free(g);
        return NULL;
    }
    return g;
}

/* ---------------------------------------------------------------- the recognizer */

typedef struct gnode {
    int32_t pos, depth;
    const struct gnode *next;
} gnode;

typedef struct {
    const gnode *top; /* NULL: the document is complete on this stack */
    int32_t cnt;      /* repetitions of the top class so far (saturated at its min when unbounded) */
} gstack;

/* A bump allocator in chunks that are kept for reuse; mark and reset. */
enum { CHUNK = 1 << 16 };
typedef struct {
    char **chunk;
    int32_t n, cur;
    size_t used;
} arena;
typedef struct {
    int32_t cur;
    size_t used;
} amark;

static void *aalloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (a->n == 0 || a->used + n > CHUNK) {
        if (a->n > 0 && a->cur + 1 < a->n) {
            a->cur++;
        } else {
            char **c = realloc(a->chunk, sizeof *c * (size_t)(a->n + 1));
            if (!c) return NULL;
            a->chunk = c;
            if (!(c[a->n] = malloc(CHUNK))) return NULL;
            a->cur = a->n++;
        }
        a->used = 0;
    }
    void *p = a->chunk[a->cur] + a->used;
    a->used += n;
    return p;
}

static amark amark_get(const arena *a) { return (amark){a->cur, a->used}; }
static void areset(arena *a, amark m) { a->cur = m.cur, a->used = m.used; }
static void afree(arena *a) {
    for (int32_t i = 0; i < a->n; i++) free(a->chunk[i]);
    free(a->chunk);
    memset(a, 0, sizeof *a);
}

typedef struct {
    gstack *s;
    int32_t n;
} gset;

struct llm_gbnf_state {
    const llm_gbnf *g;
    arena keep[2];       /* the current state's nodes live in keep[cur] */
    int cur;
    arena scratch;       /* states on the way (the mask's walk, a token's bytes) */
    gset set;
    /* the expansion under way */
    gstack emit[LLM_GBNF_MAX_STACKS];
    int32_t n_emit;
    arena *to;           /* where its nodes go */
    int64_t budget;      /* expansion steps left for this byte (an ambiguous grammar is cut off) */
    int want_end;        /* the expansion looks for the end of the document */
};

static int same_stack(const gnode *a, const gnode *b) {
    while (a != b) {
        if (!a || !b || a->pos != b->pos) return 0;
        a = a->next, b = b->next;
    }
    return 1;
}

static void emit(llm_gbnf_state *st, const gnode *top, int32_t cnt) {
    for (int32_t i = 0; i < st->n_emit; i++)
        if (st->emit[i].cnt == cnt && same_stack(st->emit[i].top, top)) return;
    if (st->n_emit < LLM_GBNF_MAX_STACKS) st->emit[st->n_emit++] = (gstack){top, cnt};
}

static const gnode *node(llm_gbnf_state *st, int32_t pos, const gnode *next) {
    const int32_t depth = next ? next->depth + 1 : 1;
    if (depth > LLM_GBNF_MAX_DEPTH) return NULL;
    gnode *n = aalloc(st->to, sizeof *n);
    if (n) n->pos = pos, n->depth = depth, n->next = next;
    return n;
}

static void expand(llm_gbnf_state *st, int32_t q, const gnode *r, int c, int depth);

/* The stack whose top class is `top`, repeated cnt times, given byte c
 * (c < 0: none; the stack is emitted as it is). */
static void take(llm_gbnf_state *st, const gnode *top, int32_t cnt, int c, int depth) {
    const llm_gbnf *g = st->g;
    const int32_t p = top->pos;
    if (c < 0) {
        emit(st, top, cnt);
        /* looking for the end: past a class that has repeated enough */
        if (st->want_end && cnt >= g->el[p].min && g->nullable[p + 1]) expand(st, p + 1, top->next, -1, depth + 1);
        return;
    }
    const gel *e = &g->el[p];
    if (has(&g->cls[e->a], c) && (e->max < 0 || cnt < e->max)) {
        const int32_t n = cnt + 1;
        if (e->max >= 0 && n >= e->max) expand(st, p + 1, top->next, -1, depth + 1);
        else emit(st, top, e->max < 0 && n > e->min ? e->min : n);
    }
    if (cnt >= e->min && (has(&g->first[p + 1], c) || g->nullable[p + 1])) expand(st, p + 1, top->next, c, depth + 1);
}

/* The stack [r..., q] expanded until each top is a class (or the stack is
 * empty), each then given byte c. */
static void expand(llm_gbnf_state *st, int32_t q, const gnode *r, int c, int depth) {
    if (--st->budget < 0 || depth > 2 * LLM_GBNF_MAX_DEPTH) return;
    const llm_gbnf *g = st->g;
    const gel *e = &g->el[q];
    if (e->type == E_CLASS) {
        const gnode *n = node(st, q, r);
        if (n) take(st, n, 0, c, depth);
    } else if (e->type == E_REF) {
        const gnode *ret = r;
        /* a reference that ends its alternative needs no return (tail call) */
        if (g->el[q + 1].type != E_END && g->el[q + 1].type != E_ALT && !(ret = node(st, q + 1, r))) return;
        for (int32_t i = g->alt_off[e->a]; i < g->alt_off[e->a + 1]; i++) expand(st, g->alts[i], ret, c, depth + 1);
    } else if (!r) { /* the end of root */
        if (c < 0) emit(st, NULL, 0);
    } else if (g->el[r->pos].type == E_CLASS) { /* back to a class: the return node is its stack */
        take(st, r, 0, c, depth + 1);
    } else {
        expand(st, r->pos, r->next, c, depth + 1);
    }
}

static void begin(llm_gbnf_state *st, arena *to) {
    st->n_emit = 0, st->to = to, st->budget = 1 << 16;
}

/* The set s given byte c, into arena `to`. */
static gset advance(llm_gbnf_state *st, gset s, int c, arena *to) {
    begin(st, to);
    for (int32_t i = 0; i < s.n; i++)
        if (s.s[i].top) take(st, s.s[i].top, s.s[i].cnt, c, 0);
    gset out = {aalloc(to, sizeof(gstack) * (size_t)(st->n_emit ? st->n_emit : 1)), st->n_emit};
    if (!out.s) out.n = 0;
    else memcpy(out.s, st->emit, sizeof(gstack) * (size_t)st->n_emit);
    return out;
}

static int complete_set(llm_gbnf_state *st, gset s) {
    const llm_gbnf *g = st->g;
    for (int32_t i = 0; i < s.n; i++) {
        const gnode *t = s.s[i].top;
        if (!t) return 1;
        if (s.s[i].cnt < g->el[t->pos].min || !g->nullable[t->pos + 1]) continue;
        amark m = amark_get(&st->scratch);
        begin(st, &st->scratch);
        st->want_end = 1;
        expand(st, t->pos + 1, t->next, -1, 0);
        st->want_end = 0;
        int done = 0;
        for (int32_t k = 0; k < st->n_emit; k++) done |= st->emit[k].top == NULL;
        areset(&st->scratch, m);
        if (done) return 1;
    }
    return 0;
}

static int same_set(gset a, gset b) {
    if (a.n != b.n) return 0;
    for (int32_t i = 0; i < a.n; i++)
        if (a.s[i].cnt != b.s[i].cnt || !same_stack(a.s[i].top, b.s[i].top)) return 0;
    return 1;
}

/* s's stacks copied into `to` (nodes and all): s no longer needs the arena it was built in. */
static gset copy_set(llm_gbnf_state *st, gset s, arena *to) {
    gset out = {aalloc(to, sizeof(gstack) * (size_t)(s.n ? s.n : 1)), s.n};
    if (!out.s) return (gset){NULL, 0};
    for (int32_t i = 0; i < s.n; i++) {
        const gnode *src = s.s[i].top;
        gnode *head = NULL, **link = &head;
        for (; src; src = src->next) {
            gnode *n = aalloc(to, sizeof *n);
            if (!n) return (gset){NULL, 0};
            *n = *src, n->next = NULL;
            *link = n, link = (gnode **)&n->next;
        }
        out.s[i] = (gstack){head, s.s[i].cnt};
    }
    (void)st;
    return out;
}

llm_gbnf_state *llm_gbnf_state_new(const llm_gbnf *g) {
    llm_gbnf_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->g = g;
    begin(st, &st->keep[0]);
    for (int32_t i = g->alt_off[g->root]; i < g->alt_off[g->root + 1]; i++) expand(st, g->alts[i], NULL, -1, 0);
    st->set.s = aalloc(&st->keep[0], sizeof(gstack) * (size_t)(st->n_emit ? st->n_emit : 1));
    if (!st->set.s) {
        llm_gbnf_state_free(st);
        return NULL;
    }
    st->set.n = st->n_emit;
    memcpy(st->set.s, st->emit, sizeof(gstack) * (size_t)st->n_emit);
    return st;
}

void llm_gbnf_state_free(llm_gbnf_state *st) {
    if (!st) return;
    afree(&st->keep[0]), afree(&st->keep[1]), afree(&st->scratch);
    free(st);
}

int llm_gbnf_feed(llm_gbnf_state *st, const char *bytes, size_t n) {
    if (st->set.n == 0) return -1;
    if (n == 0) return 0;
    areset(&st->scratch, (amark){0, 0});
    gset s = st->set;
    for (size_t i = 0; i < n && s.n; i++) s = advance(st, s, (unsigned char)bytes[i], &st->scratch);
    arena *to = &st->keep[1 - st->cur];
    areset(to, (amark){0, 0});
    gset kept = copy_set(st, s, to);
    st->set = kept, st->cur = 1 - st->cur;
    areset(&st->scratch, (amark){0, 0});
    return st->set.n ? 0 : -1;
}

int llm_gbnf_complete(llm_gbnf_state *st) { return complete_set(st, st->set); }

int llm_gbnf_dead(const llm_gbnf_state *st) { return st->set.n == 0; }

/* ---------------------------------------------------------------- the mask */

int llm_gbnf_bind(llm_gbnf *g, const llm_grammar_vocab *v) {
    free(g->below);
    g->v = v, g->n_fast = 0;
    if (!(g->below = malloc(sizeof *g->below * (size_t)(v->n_trie ? v->n_trie : 1)))) return -1;
    for (int32_t p = 0; p < g->n_el && g->n_fast < MAX_FAST; p++) {
        const gel *e = &g->el[p];
        if (e->type != E_CLASS || e->max >= 0) continue;
        int known = 0;
        for (int32_t i = 0; i < g->n_fast; i++) known |= g->fast_cls[i] == e->a;
        if (!known) g->fast_cls[g->n_fast++] = e->a;
    }
    uint16_t in[256];
    for (int c = 0; c < 256; c++) {
        in[c] = 0;
        for (int32_t i = 0; i < g->n_fast; i++) in[c] |= (uint16_t)(has(&g->cls[g->fast_cls[i]], c) << i);
    }
    /* preorder: a node's children come after it */
    for (int32_t n = v->n_trie - 1; n >= 0; n--) {
        uint16_t b = 0xFFFF;
        for (int32_t ch = v->trie[n].child; ch >= 0; ch = v->trie[ch].sibling) b &= in[v->trie[ch].byte] & g->below[ch];
        g->below[n] = b;
    }
    return 0;
}

int llm_gbnf_bound(const llm_gbnf *g, int32_t n_vocab) { return g->v && g->below && g->v->n_vocab == n_vocab; }

typedef struct {
    llm_gbnf_state *st;
    const llm_grammar_vocab *v;
    const float *in;
    float *out;
    int32_t allowed;
} walk;

static void allow(walk *w, int32_t a, int32_t b) {
    for (int32_t i = a; i < b; i++) {
        const int32_t t = w->v->trie_tok[i];
        w->out[t] = w->in[t];
    }
    w->allowed += b - a;
}

/* The bytes that leave s as it is, and the fast classes within them. */
static uint16_t stable_of(llm_gbnf_state *st, gset s, bset *stable) {
    memset(stable, 0, sizeof *stable);
    for (int c = 0; c < 256; c++) {
        amark m = amark_get(&st->scratch);
        gset t = advance(st, s, c, &st->scratch);
        if (t.n && same_set(t, s)) add(stable, c);
        areset(&st->scratch, m);
    }
    uint16_t fast = 0;
    for (int32_t i = 0; i < st->g->n_fast; i++) {
        const bset *k = &st->g->cls[st->g->fast_cls[i]];
        int sub = 1;
        for (int b = 0; b < 32; b++) sub &= (k->b[b] & ~stable->b[b]) == 0;
        fast |= (uint16_t)(sub << i);
    }
    return fast;
}

enum { STABLE_MIN_TOKENS = 64 }; /* below this many tokens under a node, walking beats finding the stable bytes */

static void visit(walk *w, int32_t parent, gset s, const bset *stable, uint16_t fast) {
    const llm_grammar_vocab *v = w->v;
    llm_gbnf_state *st = w->st;
    for (int32_t ch = v->trie[parent].child; ch >= 0; ch = v->trie[ch].sibling) {
        const struct llm_trie_node *n = &v->trie[ch];
        if (stable && has(stable, n->byte)) {
            if (fast & st->g->below[ch]) {
                allow(w, n->tb, n->te);
                continue;
            }
            allow(w, n->tb, n->own);
            if (n->child >= 0) visit(w, ch, s, stable, fast);
            continue;
        }
        amark m = amark_get(&st->scratch);
        gset t = advance(st, s, n->byte, &st->scratch);
        if (t.n) {
            allow(w, n->tb, n->own);
            if (n->child >= 0) {
                bset st2;
                if (n->te - n->own >= STABLE_MIN_TOKENS) {
                    uint16_t f2 = stable_of(st, t, &st2);
                    visit(w, ch, t, &st2, f2);
                } else {
                    visit(w, ch, t, NULL, 0);
                }
            }
        }
        areset(&st->scratch, m);
    }
}

int32_t llm_gbnf_mask(llm_gbnf_state *st, const float *in, float *out) {
    const llm_grammar_vocab *v = st->g->v;
    for (int32_t t = 0; t < v->n_vocab; t++) out[t] = -INFINITY;
    walk w = {st, v, in, out, 0};
    areset(&st->scratch, (amark){0, 0});
    if (st->set.n) {
        bset stable;
        uint16_t fast = stable_of(st, st->set, &stable);
        visit(&w, 0, st->set, &stable, fast);
    }
    const int complete = st->set.n && llm_gbnf_complete(st);
    for (int32_t i = 0; i < v->n_eog; i++)
        if (complete || w.allowed == 0) out[v->eogs[i]] = complete ? in[v->eogs[i]] : 0.0f;
    areset(&st->scratch, (amark){0, 0});
    return w.allowed + (complete || w.allowed == 0 ? v->n_eog : 0);
}

int llm_gbnf_accept(llm_gbnf_state *st, int32_t token) {
    const llm_grammar_vocab *v = st->g->v;
    if (!v || token < 0 || token >= v->n_vocab) return -1;
    if (v->eog[token]) return 0;
    return llm_gbnf_feed(st, v->bytes + v->off[token], v->off[token + 1] - v->off[token]);
}
