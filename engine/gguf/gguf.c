/* engine/gguf/gguf.c - the GGUF reader: a parser that checks every field against
 * the bytes that are really there before trusting it, lookups by key and by
 * tensor name (binary search over sorted indexes), and a printable summary.
 * See gguf.h for the file layout. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* mmap, fstat under -std=c11 */
#endif
#include "gguf.h"
#include "../weights/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* One metadata entry; every offset was checked at open. */
typedef struct {
    const uint8_t *key;    /* [key_len] key bytes in the file */
    uint64_t key_len;      /* key length in bytes */
    uint32_t type;         /* value type LLM_GGUF_* */
    uint32_t arr_type;     /* element type when type == ARR */
    uint64_t arr_n;        /* element count when type == ARR */
    uint64_t at;           /* file offset of the value (ARR: of the first element) */
    uint64_t *str_at;      /* STR arrays: [arr_n] file offsets of the elements; owned */
} kv_entry;

struct llm_gguf {
    const uint8_t *base;          /* [size] the file */
    uint64_t size;                /* file size in bytes */
    void *map;                    /* mmap'ed region to unmap at close, or NULL */
    uint32_t version;             /* 2 or 3 */
    uint32_t alignment;           /* power of two */
    uint64_t data_start;          /* file offset of the data section */
    int64_t n_kv;                 /* metadata entry count */
    kv_entry *kv;                 /* [n_kv] in file order */
    kv_entry **kv_sorted;         /* [n_kv] sorted by key bytes, for lookup */
    int64_t n_tensors;            /* tensor count */
    llm_gguf_tensor *tensors;     /* [n_tensors] in file order */
    llm_gguf_tensor **by_name;    /* [n_tensors] sorted by name, for lookup */
    char *names;                  /* NUL-terminated tensor names, back to back; owned */
};

/* ------------------------------------------------------------ byte access */

static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t ld32(const uint8_t *p) { return (uint32_t)ld16(p) | (uint32_t)ld16(p + 2) << 16; }
static uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32; }

/* Bytes of one element of a fixed-size value type; 0 for STR, ARR, unknown. */
static uint64_t value_size(uint32_t t) {
    switch (t) {
    case LLM_GGUF_U8: case LLM_GGUF_I8: case LLM_GGUF_BOOL: return 1;
    case LLM_GGUF_U16: case LLM_GGUF_I16: return 2;
    case LLM_GGUF_U32: case LLM_GGUF_I32: case LLM_GGUF_F32: return 4;
    case LLM_GGUF_U64: case LLM_GGUF_I64: case LLM_GGUF_F64: return 8;
    default: return 0;
    }
}

const char *llm_gguf_type_name(int t) {
    static const char *const n[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                    "bool", "string", "array", "u64", "i64", "f64"};
    return t >= 0 && t <= LLM_GGUF_F64 ? n[t] : "?";
}

/* ------------------------------------------------------------ parser */

/* Cursor over the file plus the caller's error buffer. */
typedef struct {
    const uint8_t *p;    /* [size] the file */
    uint64_t size;       /* file size */
    uint64_t pos;        /* next byte to read */
    char *err;           /* [errlen] message buffer */
    size_t errlen;       /* its size; 0 = no message wanted */
    char what[128];      /* what is being read, for messages: "metadata entry 3 ('a.b')" */
    int flags;           /* LLM_GGUF_ANY_TYPE */
} rd;

/* Block sizes (elements, bytes) the format gives the tensor types the engine
 * does not read, in ggml's numbering: with LLM_GGUF_ANY_TYPE their tensors are
 * bounds-checked with these and listed, never decoded. */
static const struct { int16_t type, elems, bytes; } format_only[] = {
    {9, 32, 40},    {15, 256, 292}, {16, 256, 66},  {17, 256, 74},  {18, 256, 98}, {19, 256, 50}, {20, 32, 18},
    {21, 256, 110}, {22, 256, 82},  {23, 256, 136}, {24, 1, 1},     {25, 1, 2},    {26, 1, 4},    {27, 1, 8},
    {28, 1, 8},     {29, 256, 56},  {34, 256, 54},  {35, 256, 66},  {39, 32, 17},
};

/* A type's block size: the engine's for the types it reads, else (with
 * LLM_GGUF_ANY_TYPE) the format's; 0 when neither knows it. */
static int block_size(const rd *r, int type, int64_t *elems, int64_t *bytes) {
    if (llm_type_supported(type)) {
        *elems = llm_type_block_elems(type), *bytes = llm_type_block_bytes(type);
        return 1;
    }
    for (size_t i = 0; (r->flags & LLM_GGUF_ANY_TYPE) && i < sizeof format_only / sizeof *format_only; i++)
        if (format_only[i].type == type) {
            *elems = format_only[i].elems, *bytes = format_only[i].bytes;
            return 1;
        }
    return 0;
}

__attribute__((format(printf, 2, 3)))
static int fail(rd *r, const char *fmt, ...) {
    if (r->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err, r->errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Printable, bounded copy of file bytes for messages (names may hold anything). */
static void printable(char *dst, size_t cap, const uint8_t *s, uint64_t len) {
    size_t o = 0;
    uint64_t i = 0;
    for (; i < len && o + 4 < cap; i++) dst[o++] = (s[i] >= 32 && s[i] < 127) ? (char)s[i] : '?';
    if (i < len) { dst[o++] = '.'; dst[o++] = '.'; dst[o++] = '.'; }
    dst[o] = 0;
}

static int need(rd *r, uint64_t n, const char *field) {
    if (n > r->size - r->pos)
        return fail(r, "%s: %s at offset %llu needs %llu bytes, file has %llu left (size %llu)",
                    r->what, field, (unsigned long long)r->pos, (unsigned long long)n,
                    (unsigned long long)(r->size - r->pos), (unsigned long long)r->size);
    return 0;
}

static int get_u32(rd *r, uint32_t *v, const char *field) {
    if (need(r, 4, field)) return -1;
    *v = ld32(r->p + r->pos);
    r->pos += 4;
    return 0;
}

static int get_u64(rd *r, uint64_t *v, const char *field) {
    if (need(r, 8, field)) return -1;
    *v = ld64(r->p + r->pos);
    r->pos += 8;
    return 0;
}

/* A length-prefixed string: *at = offset of its bytes, *len = their count. */
static int get_str(rd *r, uint64_t *at, uint64_t *len, const char *field) {
    uint64_t start = r->pos;
    if (get_u64(r, len, field)) return -1;
    if (*len > r->size - r->pos)
        return fail(r, "%s: %s at offset %llu has length %llu, past end of file (size %llu)",
                    r->what, field, (unsigned long long)start, (unsigned long long)*len,
                    (unsigned long long)r->size);
    *at = r->pos;
    r->pos += *len;
    return 0;
}

static int check_bools(rd *r, uint64_t at, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (r->p[at + i] > 1)
            return fail(r, "%s: bool at offset %llu has value %u (must be 0 or 1)", r->what,
                        (unsigned long long)(at + i), r->p[at + i]);
    return 0;
}

static int parse_value(rd *r, kv_entry *e) {
    uint64_t tpos = r->pos;
    if (get_u32(r, &e->type, "value type")) return -1;
    if (e->type > LLM_GGUF_F64)
        return fail(r, "%s: unknown value type %u at offset %llu", r->what, e->type,
                    (unsigned long long)tpos);
    if (e->type == LLM_GGUF_STR) {
        uint64_t len;
        e->at = r->pos;
        return get_str(r, &tpos, &len, "string value");
    }
    if (e->type != LLM_GGUF_ARR) {
        e->at = r->pos;
        if (need(r, value_size(e->type), "value")) return -1;
        r->pos += value_size(e->type);
        return e->type == LLM_GGUF_BOOL ? check_bools(r, e->at, 1) : 0;
    }
    tpos = r->pos;
    if (get_u32(r, &e->arr_type, "array element type")) return -1;
    if (e->arr_type == LLM_GGUF_ARR)
        return fail(r, "%s: nested arrays are not supported (offset %llu)", r->what,
                    (unsigned long long)tpos);
    if (e->arr_type > LLM_GGUF_F64)
        return fail(r, "%s: unknown array element type %u at offset %llu", r->what, e->arr_type,
                    (unsigned long long)tpos);
    if (get_u64(r, &e->arr_n, "array length")) return -1;
    e->at = r->pos;
    uint64_t left = r->size - r->pos, es = value_size(e->arr_type);
    /* every element takes at least es bytes (8 for a string's length), so a
     * count the rest of the file cannot hold fails before anything is allocated */
    uint64_t min_es = es ? es : 8;
    if (e->arr_n > left / min_es)
        return fail(r, "%s: array of %llu %s at offset %llu needs at least %llu bytes per "
                    "element, file has %llu left", r->what, (unsigned long long)e->arr_n,
                    llm_gguf_type_name((int)e->arr_type), (unsigned long long)tpos,
                    (unsigned long long)min_es, (unsigned long long)left);
    if (es) {
        r->pos += e->arr_n * es;
        return e->arr_type == LLM_GGUF_BOOL ? check_bools(r, e->at, e->arr_n) : 0;
    }
    e->str_at = malloc((e->arr_n ? e->arr_n : 1) * sizeof *e->str_at);
    if (!e->str_at) return fail(r, "%s: out of memory for %llu strings", r->what,
                                (unsigned long long)e->arr_n);
    for (uint64_t i = 0; i < e->arr_n; i++) {
        uint64_t at, len;
        e->str_at[i] = r->pos;
        if (get_str(r, &at, &len, "array string")) return -1;
    }
    return 0;
}

static int cmp_bytes(const uint8_t *a, uint64_t la, const uint8_t *b, uint64_t lb) {
    int c = memcmp(a, b, la < lb ? la : lb);
    return c ? c : (la > lb) - (la < lb);
}

static int cmp_kv(const void *x, const void *y) {
    const kv_entry *a = *(kv_entry *const *)x, *b = *(kv_entry *const *)y;
    return cmp_bytes(a->key, a->key_len, b->key, b->key_len);
}

static int cmp_name(const void *x, const void *y) {
    return strcmp((*(llm_gguf_tensor *const *)x)->name, (*(llm_gguf_tensor *const *)y)->name);
}

static int cmp_offset(const void *x, const void *y) {
    const llm_gguf_tensor *a = *(llm_gguf_tensor *const *)x, *b = *(llm_gguf_tensor *const *)y;
    return (a->offset > b->offset) - (a->offset < b->offset);
}

static int parse_kvs(rd *r, llm_gguf *g) {
    for (int64_t i = 0; i < g->n_kv; i++) {
        kv_entry *e = &g->kv[i];
        uint64_t at;
        snprintf(r->what, sizeof r->what, "metadata entry %lld", (long long)i);
        if (get_str(r, &at, &e->key_len, "key")) return -1;
        e->key = r->p + at;
        char key[64];
        printable(key, sizeof key, e->key, e->key_len);
        snprintf(r->what, sizeof r->what, "metadata entry %lld ('%s')", (long long)i, key);
        if (parse_value(r, e)) return -1;
    }
    for (int64_t i = 0; i < g->n_kv; i++) g->kv_sorted[i] = &g->kv[i];
    qsort(g->kv_sorted, (size_t)g->n_kv, sizeof *g->kv_sorted, cmp_kv);
    for (int64_t i = 1; i < g->n_kv; i++)
        if (cmp_kv(&g->kv_sorted[i - 1], &g->kv_sorted[i]) == 0) {
            char key[64];
            printable(key, sizeof key, g->kv_sorted[i]->key, g->kv_sorted[i]->key_len);
            return fail(r, "metadata key '%s' appears more than once", key);
        }
    return 0;
}

static int parse_alignment(rd *r, llm_gguf *g) {
    g->alignment = 32;
    int64_t i = llm_gguf_find_key(g, "general.alignment");
    if (i < 0) return 0;
    const kv_entry *e = &g->kv[i];
    if (e->type != LLM_GGUF_U32)
        return fail(r, "general.alignment has type %s, expected u32",
                    llm_gguf_type_name((int)e->type));
    uint32_t a = ld32(r->p + e->at);
    if (a == 0 || (a & (a - 1)))
        return fail(r, "general.alignment is %u, not a power of two", a);
    g->alignment = a;
    return 0;
}

/* One tensor info record; the name stays in the file until names are copied. */
static int parse_tensor_info(rd *r, llm_gguf_tensor *t, uint64_t *name_at, uint64_t *name_len) {
    if (get_str(r, name_at, name_len, "name")) return -1;
    char name[80];
    printable(name, sizeof name, r->p + *name_at, *name_len);
    if (memchr(r->p + *name_at, 0, *name_len))
        return fail(r, "%s: name '%s' contains a NUL byte", r->what, name);
    snprintf(r->what, sizeof r->what, "tensor '%s'", name);
    uint32_t nd, type;
    if (get_u32(r, &nd, "n_dims")) return -1;
    if (nd < 1 || nd > LLM_GGUF_MAX_DIMS)
        return fail(r, "tensor '%s': n_dims is %u, must be 1..%d", name, nd, LLM_GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    int64_t n = 1;
    for (int d = 0; d < LLM_GGUF_MAX_DIMS; d++) {
        uint64_t v = 1;
        if (d < (int)nd && get_u64(r, &v, "dimension")) return -1;
        if (v > (uint64_t)INT64_MAX)
            return fail(r, "tensor '%s': dimension %d is %llu, too large", name, d,
                        (unsigned long long)v);
        t->dims[d] = (int64_t)v;
        if (v != 0 && n > INT64_MAX / (int64_t)v)
            return fail(r, "tensor '%s': element count overflows 64 bits", name);
        n *= (int64_t)v;
    }
    t->n_elements = n;
    if (get_u32(r, &type, "type")) return -1;
    int64_t elems, bytes;
    if (type > INT16_MAX || !block_size(r, (int)type, &elems, &bytes)) {
        const char *tn = llm_type_name((int)type);
        return fail(r, "tensor '%s': %s type %u%s%s%s", name, tn ? "unsupported" : "unknown",
                    type, tn ? " (" : "", tn ? tn : "", tn ? ")" : "");
    }
    t->type = (int)type;
    if (t->dims[0] % elems)
        return fail(r, "tensor '%s': row length %lld is not a multiple of the %s block size %lld",
                    name, (long long)t->dims[0], llm_type_name(t->type), (long long)elems);
    if (t->dims[0] / elems > INT64_MAX / bytes)
        return fail(r, "tensor '%s': byte size overflows 64 bits", name);
    int64_t rb = t->dims[0] / elems * bytes;
    int64_t rows = t->dims[0] ? n / t->dims[0] : 0;
    if (rb && rows > INT64_MAX / rb)
        return fail(r, "tensor '%s': byte size overflows 64 bits", name);
    t->n_bytes = (uint64_t)(rb * rows);
    return get_u64(r, &t->offset, "data offset");
}

static int parse_tensors(rd *r, llm_gguf *g) {
    uint64_t *name_pos = malloc(2 * (size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof *name_pos);
    if (!name_pos) return fail(r, "out of memory for %lld tensors", (long long)g->n_tensors);
    uint64_t name_bytes = 0;
    int rc = 0;
    for (int64_t i = 0; i < g->n_tensors && !rc; i++) {
        snprintf(r->what, sizeof r->what, "tensor info %lld", (long long)i);
        rc = parse_tensor_info(r, &g->tensors[i], &name_pos[2 * i], &name_pos[2 * i + 1]);
        if (!rc) name_bytes += name_pos[2 * i + 1] + 1;   /* bounded by the file size */
    }
    if (!rc && !(g->names = malloc(name_bytes ? name_bytes : 1)))
        rc = fail(r, "out of memory for tensor names");
    for (int64_t i = 0, o = 0; i < g->n_tensors && !rc; i++) {
        memcpy(g->names + o, r->p + name_pos[2 * i], name_pos[2 * i + 1]);
        g->names[o + (int64_t)name_pos[2 * i + 1]] = 0;
        g->tensors[i].name = g->names + o;
        o += (int64_t)name_pos[2 * i + 1] + 1;
    }
    free(name_pos);
    return rc;
}

/* Data section: start, per-tensor bounds and alignment, overlaps, duplicate names. */
static int check_tensor_data(rd *r, llm_gguf *g) {
    uint64_t a = g->alignment, pos = r->pos;
    if (pos > UINT64_MAX - (a - 1)) return fail(r, "data section offset overflows");
    g->data_start = (pos + a - 1) / a * a;
    if (g->n_tensors == 0) return 0;
    if (g->data_start > r->size)
        return fail(r, "data section would start at offset %llu (tensor infos end at %llu, "
                    "alignment %u), past end of file (size %llu)",
                    (unsigned long long)g->data_start, (unsigned long long)pos, g->alignment,
                    (unsigned long long)r->size);
    uint64_t room = r->size - g->data_start;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        llm_gguf_tensor *t = &g->tensors[i];
        if (t->offset % a)
            return fail(r, "tensor '%s': data offset %llu is not a multiple of the alignment %u",
                        t->name, (unsigned long long)t->offset, g->alignment);
        if (t->offset > room || t->n_bytes > room - t->offset)
            return fail(r, "tensor '%s': data [offset %llu, size %llu] runs past end of file "
                        "(data section starts at %llu, file size %llu)", t->name,
                        (unsigned long long)t->offset, (unsigned long long)t->n_bytes,
                        (unsigned long long)g->data_start, (unsigned long long)r->size);
        t->data = r->p + g->data_start + t->offset;
        g->by_name[i] = t;
    }
    /* overlaps: in offset order each non-empty tensor must start at or after
     * the furthest end seen so far (empty tensors occupy nothing) */
    qsort(g->by_name, (size_t)g->n_tensors, sizeof *g->by_name, cmp_offset);
    const llm_gguf_tensor *far = NULL;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const llm_gguf_tensor *t = g->by_name[i];
        if (t->n_bytes == 0) continue;
        if (far && t->offset < far->offset + far->n_bytes)
            return fail(r, "tensors '%s' [offset %llu, size %llu] and '%s' [offset %llu, size "
                        "%llu] overlap", far->name, (unsigned long long)far->offset,
                        (unsigned long long)far->n_bytes, t->name, (unsigned long long)t->offset,
                        (unsigned long long)t->n_bytes);
        if (!far || t->offset + t->n_bytes > far->offset + far->n_bytes) far = t;
    }
    qsort(g->by_name, (size_t)g->n_tensors, sizeof *g->by_name, cmp_name);
    for (int64_t i = 1; i < g->n_tensors; i++)
        if (strcmp(g->by_name[i - 1]->name, g->by_name[i]->name) == 0)
            return fail(r, "tensor name '%s' appears more than once", g->by_name[i]->name);
    return 0;
}

static int parse(llm_gguf *g, rd *r) {
    uint64_t n_tensors, n_kv;
    uint32_t magic;
    snprintf(r->what, sizeof r->what, "header");
    if (need(r, 4, "magic")) return -1;
    magic = ld32(r->p);
    if (memcmp(r->p, "GGUF", 4) != 0)
        return fail(r, "not a GGUF file: magic is 0x%08x, expected \"GGUF\"", magic);
    r->pos = 4;
    if (get_u32(r, &g->version, "version")) return -1;
    if (g->version != 2 && g->version != 3)
        return fail(r, "unsupported GGUF version %u (this reader reads 2 and 3)", g->version);
    if (get_u64(r, &n_tensors, "tensor count") || get_u64(r, &n_kv, "metadata count")) return -1;
    /* Each KV takes >= 13 bytes (key length, type, a 1-byte value) and each tensor
     * info >= 32 (name length, n_dims, one dim, type, offset): counts the file
     * cannot hold fail here, before any allocation is sized by them. */
    uint64_t left = r->size - r->pos;
    if (n_kv > left / 13)
        return fail(r, "metadata count %llu cannot fit in the %llu bytes after the header",
                    (unsigned long long)n_kv, (unsigned long long)left);
    if (n_tensors > left / 32)
        return fail(r, "tensor count %llu cannot fit in the %llu bytes after the header",
                    (unsigned long long)n_tensors, (unsigned long long)left);
    g->n_kv = (int64_t)n_kv;
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->kv_sorted = calloc(n_kv ? n_kv : 1, sizeof *g->kv_sorted);
    if (!g->kv || !g->kv_sorted) return fail(r, "out of memory for %llu metadata entries",
                                             (unsigned long long)n_kv);
    if (parse_kvs(r, g) || parse_alignment(r, g)) return -1;
    left = r->size - r->pos;
    if (n_tensors > left / 32)
        return fail(r, "tensor count %llu cannot fit in the %llu bytes after the metadata",
                    (unsigned long long)n_tensors, (unsigned long long)left);
    g->n_tensors = (int64_t)n_tensors;
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    g->by_name = calloc(n_tensors ? n_tensors : 1, sizeof *g->by_name);
    if (!g->tensors || !g->by_name) return fail(r, "out of memory for %llu tensors",
                                                (unsigned long long)n_tensors);
    if (parse_tensors(r, g)) return -1;
    return check_tensor_data(r, g);
}

int llm_gguf_open_memory(const void *data, size_t size, llm_gguf **out, char *err, size_t errlen) {
    return llm_gguf_open_memory_ex(data, size, 0, out, err, errlen);
}

int llm_gguf_open_memory_ex(const void *data, size_t size, int flags, llm_gguf **out, char *err, size_t errlen) {
    rd r = {.p = data, .size = size, .err = err, .errlen = errlen, .flags = flags};
    *out = NULL;
    if (errlen) err[0] = 0;
    if (!data && size) return fail(&r, "no data");
    llm_gguf *g = calloc(1, sizeof *g);
    if (!g) return fail(&r, "out of memory");
    g->base = data;
    g->size = size;
    if (parse(g, &r)) {
        llm_gguf_close(g);
        if (errlen && !err[0]) snprintf(err, errlen, "invalid GGUF file");
        return -1;
    }
    *out = g;
    return 0;
}

int llm_gguf_open(const char *path, llm_gguf **out, char *err, size_t errlen) {
    return llm_gguf_open_ex(path, 0, out, err, errlen);
}

int llm_gguf_open_ex(const char *path, int flags, llm_gguf **out, char *err, size_t errlen) {
    *out = NULL;
    /* O_NONBLOCK: open() of a FIFO would otherwise wait for a writer before
     * fstat could tell it is no regular file (no effect on a regular one) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (errlen) snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -2;
    }
    if (!S_ISREG(st.st_mode) || st.st_size == 0) {
        if (errlen) snprintf(err, errlen, "%s: %s", path,
                             S_ISREG(st.st_mode) ? "file is empty" : "not a regular file");
        close(fd);
        return S_ISREG(st.st_mode) ? -1 : -2;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int mmap_errno = errno;
    close(fd);   /* the mapping keeps the file open */
    if (m == MAP_FAILED) {
        if (errlen) snprintf(err, errlen, "%s: mmap failed: %s", path, strerror(mmap_errno));
        return -2;
    }
    char msg[400];
    if (llm_gguf_open_memory_ex(m, (size_t)st.st_size, flags, out, msg, sizeof msg)) {
        if (errlen) snprintf(err, errlen, "%s: %s", path, msg);
        munmap(m, (size_t)st.st_size);
        return -1;
    }
    (*out)->map = m;
    return 0;
}

void llm_gguf_close(llm_gguf *g) {
    if (!g) return;
    if (g->kv)
        for (int64_t i = 0; i < g->n_kv; i++) free(g->kv[i].str_at);
    free(g->kv);
    free(g->kv_sorted);
    free(g->tensors);
    free(g->by_name);
    free(g->names);
    if (g->map) munmap(g->map, (size_t)g->size);
    free(g);
}

void llm_gguf_release(const llm_gguf *g, const void *p, size_t n) {
    if (!g || !g->map || !p) return;
    uintptr_t lo = (uintptr_t)g->map, hi = lo + (size_t)g->size, a = (uintptr_t)p, b = a + n;
    if (a < lo || b > hi || b < a) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    a = (a + page - 1) / page * page;
    b = b / page * page;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

uint32_t llm_gguf_version(const llm_gguf *g) { return g->version; }
uint32_t llm_gguf_alignment(const llm_gguf *g) { return g->alignment; }
uint64_t llm_gguf_data_offset(const llm_gguf *g) { return g->data_start; }
uint64_t llm_gguf_file_size(const llm_gguf *g) { return g->size; }

/* ------------------------------------------------------------ metadata lookups */

int64_t llm_gguf_n_kv(const llm_gguf *g) { return g->n_kv; }

int64_t llm_gguf_find_key(const llm_gguf *g, const char *key) {
    const uint8_t *k = (const uint8_t *)key;
    uint64_t kl = strlen(key);
    int64_t lo = 0, hi = g->n_kv - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const kv_entry *e = g->kv_sorted[mid];
        int c = cmp_bytes(e->key, e->key_len, k, kl);
        if (c == 0) return e - g->kv;
        if (c < 0) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
}

llm_gguf_str llm_gguf_kv_key(const llm_gguf *g, int64_t i) {
    if (i < 0 || i >= g->n_kv) return (llm_gguf_str){"", 0};
    return (llm_gguf_str){(const char *)g->kv[i].key, g->kv[i].key_len};
}

int llm_gguf_kv_type(const llm_gguf *g, int64_t i) {
    return i < 0 || i >= g->n_kv ? -1 : (int)g->kv[i].type;
}

int llm_gguf_kv_elems(const llm_gguf *g, int64_t i, llm_gguf_arr *out) {
    if (i < 0 || i >= g->n_kv) return LLM_GGUF_ENOKEY;
    const kv_entry *e = &g->kv[i];
    if (e->type == LLM_GGUF_ARR)
        *out = (llm_gguf_arr){e->arr_type, e->arr_n, g->base + e->at, e->str_at, g->base};
    else /* a string's length field is at e->at, as a string array's str_at says */
        *out = (llm_gguf_arr){e->type, 1, g->base + e->at, e->type == LLM_GGUF_STR ? &e->at : NULL, g->base};
    return LLM_GGUF_OK;
}

/* An integer value as sign + magnitude-free pair: *neg = 1 with *s < 0, or
 * *neg = 0 with *u >= 0. Returns -1 if t is not an integer type. */
static int read_int(const uint8_t *p, uint32_t t, int *neg, int64_t *s, uint64_t *u) {
    int64_t v;
    switch (t) {
    case LLM_GGUF_U8:  *neg = 0; *u = p[0]; return 0;
    case LLM_GGUF_U16: *neg = 0; *u = ld16(p); return 0;
    case LLM_GGUF_U32: *neg = 0; *u = ld32(p); return 0;
    case LLM_GGUF_U64: *neg = 0; *u = ld64(p); return 0;
    case LLM_GGUF_I8:  v = (int8_t)p[0]; break;
    case LLM_GGUF_I16: v = (int16_t)ld16(p); break;
    case LLM_GGUF_I32: v = (int32_t)ld32(p); break;
    case LLM_GGUF_I64: v = (int64_t)ld64(p); break;
    default: return -1;
    }
    *neg = v < 0;
    if (v < 0) *s = v; else *u = (uint64_t)v;
    return 0;
}

static const kv_entry *find(const llm_gguf *g, const char *key) {
    int64_t i = llm_gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kv[i];
}

/* Integer lookup checked against [lo, hi] (signed bounds as int64, unsigned as uint64). */
static int get_int(const llm_gguf *g, const char *key, int64_t lo, uint64_t hi, int64_t *sv,
                   uint64_t *uv, int *neg) {
    const kv_entry *e = find(g, key);
    if (!e) return LLM_GGUF_ENOKEY;
    if (read_int(g->base + e->at, e->type, neg, sv, uv)) return LLM_GGUF_ETYPE;
    if (*neg ? *sv < lo : *uv > hi) return LLM_GGUF_ERANGE;
    return LLM_GGUF_OK;
}

int llm_gguf_get_u32(const llm_gguf *g, const char *key, uint32_t *out) {
    int64_t s; uint64_t u; int neg;
    int rc = get_int(g, key, 0, UINT32_MAX, &s, &u, &neg);
    if (rc == LLM_GGUF_OK) *out = (uint32_t)u;
    return rc;
}

int llm_gguf_get_i32(const llm_gguf *g, const char *key, int32_t *out) {
    int64_t s; uint64_t u; int neg;
    int rc = get_int(g, key, INT32_MIN, INT32_MAX, &s, &u, &neg);
    if (rc == LLM_GGUF_OK) *out = neg ? (int32_t)s : (int32_t)u;
    return rc;
}

int llm_gguf_get_u64(const llm_gguf *g, const char *key, uint64_t *out) {
    int64_t s; uint64_t u; int neg;
    int rc = get_int(g, key, 0, UINT64_MAX, &s, &u, &neg);
    if (rc == LLM_GGUF_OK) *out = u;
    return rc;
}

int llm_gguf_get_i64(const llm_gguf *g, const char *key, int64_t *out) {
    int64_t s; uint64_t u; int neg;
    int rc = get_int(g, key, INT64_MIN, INT64_MAX, &s, &u, &neg);
    if (rc == LLM_GGUF_OK) *out = neg ? s : (int64_t)u;
    return rc;
}

int llm_gguf_get_f64(const llm_gguf *g, const char *key, double *out) {
    const kv_entry *e = find(g, key);
    if (!e) return LLM_GGUF_ENOKEY;
    if (e->type == LLM_GGUF_F32) {
        uint32_t b = ld32(g->base + e->at);
        float f;
        memcpy(&f, &b, 4);
        *out = f;
    } else if (e->type == LLM_GGUF_F64) {
        uint64_t b = ld64(g->base + e->at);
        memcpy(out, &b, 8);
    } else {
        return LLM_GGUF_ETYPE;
    }
    return LLM_GGUF_OK;
}

int llm_gguf_get_f32(const llm_gguf *g, const char *key, float *out) {
    double d;
    int rc = llm_gguf_get_f64(g, key, &d);
    if (rc == LLM_GGUF_OK) *out = (float)d;
    return rc;
}

int llm_gguf_get_bool(const llm_gguf *g, const char *key, int *out) {
    const kv_entry *e = find(g, key);
    if (!e) return LLM_GGUF_ENOKEY;
    if (e->type != LLM_GGUF_BOOL) return LLM_GGUF_ETYPE;
    *out = g->base[e->at];
    return LLM_GGUF_OK;
}

int llm_gguf_get_str(const llm_gguf *g, const char *key, llm_gguf_str *out) {
    const kv_entry *e = find(g, key);
    if (!e) return LLM_GGUF_ENOKEY;
    if (e->type != LLM_GGUF_STR) return LLM_GGUF_ETYPE;
    out->len = ld64(g->base + e->at);
    out->ptr = (const char *)g->base + e->at + 8;
    return LLM_GGUF_OK;
}

int llm_gguf_get_arr(const llm_gguf *g, const char *key, llm_gguf_arr *out) {
    const kv_entry *e = find(g, key);
    if (!e) return LLM_GGUF_ENOKEY;
    if (e->type != LLM_GGUF_ARR) return LLM_GGUF_ETYPE;
    *out = (llm_gguf_arr){e->arr_type, e->arr_n, g->base + e->at, e->str_at, g->base};
    return LLM_GGUF_OK;
}

uint32_t llm_gguf_u32_or(const llm_gguf *g, const char *key, uint32_t dflt) {
    uint32_t v;
    return llm_gguf_get_u32(g, key, &v) == LLM_GGUF_OK ? v : dflt;
}
int32_t llm_gguf_i32_or(const llm_gguf *g, const char *key, int32_t dflt) {
    int32_t v;
    return llm_gguf_get_i32(g, key, &v) == LLM_GGUF_OK ? v : dflt;
}
uint64_t llm_gguf_u64_or(const llm_gguf *g, const char *key, uint64_t dflt) {
    uint64_t v;
    return llm_gguf_get_u64(g, key, &v) == LLM_GGUF_OK ? v : dflt;
}
float llm_gguf_f32_or(const llm_gguf *g, const char *key, float dflt) {
    float v;
    return llm_gguf_get_f32(g, key, &v) == LLM_GGUF_OK ? v : dflt;
}
int llm_gguf_bool_or(const llm_gguf *g, const char *key, int dflt) {
    int v;
    return llm_gguf_get_bool(g, key, &v) == LLM_GGUF_OK ? v : dflt;
}

/* ------------------------------------------------------------ array elements */

/* Element i of an integer or bool array as read_int gives it; -1 past the
 * end or for another type. */
static int arr_int(const llm_gguf_arr *a, uint64_t i, int *neg, int64_t *s, uint64_t *u) {
    if (i >= a->n || a->type == LLM_GGUF_STR) return -1;
    const uint8_t *p = a->data + i * value_size(a->type);
    if (a->type == LLM_GGUF_BOOL) return *neg = 0, *u = p[0], 0;
    return read_int(p, a->type, neg, s, u);
}

int64_t llm_gguf_arr_i64(const llm_gguf_arr *a, uint64_t i) {
    int neg; int64_t s; uint64_t u;
    if (arr_int(a, i, &neg, &s, &u)) return 0;
    return neg ? s : u > (uint64_t)INT64_MAX ? 0 : (int64_t)u;
}

double llm_gguf_arr_f64(const llm_gguf_arr *a, uint64_t i) {
    if (i >= a->n || a->type == LLM_GGUF_STR) return 0;
    const uint8_t *p = a->data + i * value_size(a->type);
    if (a->type == LLM_GGUF_F32) {
        uint32_t b = ld32(p);
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    if (a->type == LLM_GGUF_F64) {
        uint64_t b = ld64(p);
        double d;
        memcpy(&d, &b, 8);
        return d;
    }
    int neg; int64_t s; uint64_t u;
    if (read_int(p, a->type, &neg, &s, &u)) return 0;
    return neg ? (double)s : (double)u;
}

float llm_gguf_arr_f32(const llm_gguf_arr *a, uint64_t i) { return (float)llm_gguf_arr_f64(a, i); }

uint64_t llm_gguf_arr_u64(const llm_gguf_arr *a, uint64_t i) {
    int neg; int64_t s; uint64_t u;
    return arr_int(a, i, &neg, &s, &u) || neg ? 0 : u;
}

llm_gguf_str llm_gguf_arr_str(const llm_gguf_arr *a, uint64_t i) {
    if (i >= a->n || a->type != LLM_GGUF_STR || !a->str_at) return (llm_gguf_str){"", 0};
    const uint8_t *p = a->base + a->str_at[i];
    return (llm_gguf_str){(const char *)p + 8, ld64(p)};
}

int llm_gguf_str_eq(llm_gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

char *llm_gguf_str_copy(llm_gguf_str s, char *buf, size_t bufsize) {
    if (!bufsize) return buf;
    size_t n = s.len < bufsize - 1 ? (size_t)s.len : bufsize - 1;
    memcpy(buf, s.ptr, n);
    buf[n] = 0;
    return buf;
}

char *llm_gguf_str_dup(llm_gguf_str s) {
    if (s.len >= SIZE_MAX) return NULL;
    char *c = malloc((size_t)s.len + 1);
    return c ? llm_gguf_str_copy(s, c, (size_t)s.len + 1) : NULL;
}

/* ------------------------------------------------------------ tensors */

int64_t llm_gguf_n_tensors(const llm_gguf *g) { return g->n_tensors; }

const llm_gguf_tensor *llm_gguf_tensor_at(const llm_gguf *g, int64_t i) {
    return i < 0 || i >= g->n_tensors ? NULL : &g->tensors[i];
}

const llm_gguf_tensor *llm_gguf_find_tensor(const llm_gguf *g, const char *name) {
    int64_t lo = 0, hi = g->n_tensors - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->by_name[mid]->name, name);
        if (c == 0) return g->by_name[mid];
        if (c < 0) lo = mid + 1; else hi = mid - 1;
    }
    return NULL;
}
