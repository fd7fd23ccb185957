/* tests/test_gguf.c - the GGUF reader: what the writer writes comes back
 * unchanged, and every malformed file is refused with a message (never a
 * crash, never a read outside the buffer: inputs are copied into exact-size
 * heap blocks so the sanitizer build sees any overrun). */
#include "test.h"
#include "../engine/gguf/gguf.h"
#include "../engine/weights/quant.h"
#include "gguf_writer.h"
#include "kvengine.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers */

/* A file opened from an exact-size heap copy of some bytes. */
typedef struct {
    llm_gguf *g;      /* the reader, or NULL if opening failed */
    void *copy;       /* [n] the bytes it reads */
    int rc;           /* llm_gguf_open_memory's return */
    char err[512];    /* its message */
} opened;

static opened open_bytes(const void *p, size_t n) {
    opened o = {0};
    o.copy = malloc(n ? n : 1);
    if (n) memcpy(o.copy, p, n);
    o.rc = llm_gguf_open_memory(o.copy, n, &o.g, o.err, sizeof o.err);
    return o;
}

static void close_opened(opened *o) {
    llm_gguf_close(o->g);
    free(o->copy);
}

static unsigned char *finish(gw *w, size_t *n) {
    unsigned char *p = gw_to_memory(w, n);
    if (!p) test_fail(__FILE__, __LINE__, "writer: %s", gw_error(w) ? gw_error(w) : "?");
    gw_free(w);
    return p;
}

/* Opening must fail with a message containing `want`. */
#define CHECK_REFUSED(buf, n, want)                                                    \
    do {                                                                               \
        opened o_ = open_bytes(buf, n);                                                \
        if (o_.rc == 0 || o_.g != NULL || !o_.err[0] || !strstr(o_.err, want))         \
            test_fail(__FILE__, __LINE__, "expected refusal mentioning '%s', got rc %d: '%s'", \
                      want, o_.rc, o_.err);                                            \
        close_opened(&o_);                                                             \
    } while (0)

/* Offset of the first occurrence of a string's bytes in a buffer, or -1. */
static long find(const unsigned char *p, size_t n, const char *s) {
    size_t k = strlen(s);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(p + i, s, k) == 0) return (long)i;
    return -1;
}

static void poke32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i); }
static void poke64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i); }

/* A small valid file with metadata of several kinds and two tensors. */
static unsigned char *small_file(size_t *n) {
    gw *w = gw_new();
    static const char *const toks[] = {"a", "", "hello"};
    float f[4] = {1.5f, -2.0f, 0.25f, 8.0f};
    gw_add_str(w, "general.architecture", "llama");
    gw_add_u32(w, "llama.block_count", 2);
    gw_add_bool(w, "flag", 1);
    gw_add_f32(w, "eps", 1e-5f);
    gw_add_arr_str(w, "tokens", toks, 3);
    gw_add_arr_f32(w, "scores", f, 4);
    float v[64 * 2 + 5];
    for (int i = 0; i < 64 * 2 + 5; i++) v[i] = (float)(i % 13) - 6.0f;
    gw_add_tensor_f32(w, "w.q4", GW_Q4_0, 2, (int64_t[]){64, 2}, v);
    gw_add_tensor_f32(w, "b.f32", GW_F32, 1, (int64_t[]){5}, v + 128);
    return finish(w, n);
}

/* ------------------------------------------------------------ round trips */

TEST(gguf_round_trip_preserves_every_metadata_type) {
    gw *w = gw_new();
    gw_add_u8(w, "u8", 250);
    gw_add_i8(w, "i8", -120);
    gw_add_u16(w, "u16", 65000);
    gw_add_i16(w, "i16", -32000);
    gw_add_u32(w, "u32", 4000000000u);
    gw_add_i32(w, "i32", -2000000000);
    gw_add_u64(w, "u64", 0xfedcba9876543210ull);
    gw_add_i64(w, "i64", -0x123456789abcdefll);
    gw_add_f32(w, "f32", 3.25f);
    gw_add_f64(w, "f64", -1.0 / 3.0);
    gw_add_bool(w, "yes", 1);
    gw_add_bool(w, "no", 0);
    gw_add_str(w, "str", "hello, world");
    gw_add_strn(w, "bin", "a\0b", 3);
    static const char *const strs[] = {"<s>", "", "\xe2\x96\x81the", "x y"};
    gw_add_arr_str(w, "arr.str", strs, 4);
    gw_add_arr_f32(w, "arr.f32", (float[]){0.5f, -1.5f, 1e30f}, 3);
    gw_add_arr_i32(w, "arr.i32", (int32_t[]){-1, 0, 2147483647}, 3);
    gw_add_arr_u32(w, "arr.u32", (uint32_t[]){7, 4000000000u}, 2);
    gw_add_arr(w, "arr.u8", GW_U8, 3, (uint8_t[]){1, 2, 255});
    gw_add_arr(w, "arr.i8", GW_I8, 2, (int8_t[]){-128, 127});
    gw_add_arr(w, "arr.u16", GW_U16, 2, (uint16_t[]){1, 65535});
    gw_add_arr(w, "arr.i16", GW_I16, 2, (int16_t[]){-32768, 5});
    gw_add_arr(w, "arr.u64", GW_U64, 2, (uint64_t[]){1, 0xffffffffffffffffull});
    gw_add_arr(w, "arr.i64", GW_I64, 2, (int64_t[]){INT64_MIN, 9});
    gw_add_arr(w, "arr.f64", GW_F64V, 2, (double[]){1e-300, -2.5});
    gw_add_arr(w, "arr.bool", GW_BOOL, 3, (uint8_t[]){1, 0, 1});
    gw_add_arr(w, "arr.empty", GW_I32, 0, NULL);
    size_t n;
    unsigned char *buf = finish(w, &n);
    opened o = open_bytes(buf, n);
    CHECK_EQ_INT(o.rc, 0);
    if (o.rc) { test_fail(__FILE__, __LINE__, "%s", o.err); close_opened(&o); free(buf); return; }
    llm_gguf *g = o.g;
    CHECK_EQ_INT(llm_gguf_version(g), 3);
    CHECK_EQ_INT(llm_gguf_n_kv(g), 27);
    CHECK_EQ_INT(llm_gguf_n_tensors(g), 0);
    uint32_t u32; int32_t i32; uint64_t u64; int64_t i64; float f; double d; int b;
    llm_gguf_str s;
    CHECK(llm_gguf_get_u32(g, "u8", &u32) == 0 && u32 == 250);
    CHECK(llm_gguf_get_i32(g, "i8", &i32) == 0 && i32 == -120);
    CHECK(llm_gguf_get_u32(g, "u16", &u32) == 0 && u32 == 65000);
    CHECK(llm_gguf_get_i32(g, "i16", &i32) == 0 && i32 == -32000);
    CHECK(llm_gguf_get_u32(g, "u32", &u32) == 0 && u32 == 4000000000u);
    CHECK(llm_gguf_get_i32(g, "i32", &i32) == 0 && i32 == -2000000000);
    CHECK(llm_gguf_get_u64(g, "u64", &u64) == 0 && u64 == 0xfedcba9876543210ull);
    CHECK(llm_gguf_get_i64(g, "i64", &i64) == 0 && i64 == -0x123456789abcdefll);
    CHECK(llm_gguf_get_f32(g, "f32", &f) == 0 && f == 3.25f);
    CHECK(llm_gguf_get_f64(g, "f64", &d) == 0 && d == -1.0 / 3.0);
    CHECK(llm_gguf_get_bool(g, "yes", &b) == 0 && b == 1);
    CHECK(llm_gguf_get_bool(g, "no", &b) == 0 && b == 0);
    CHECK(llm_gguf_get_str(g, "str", &s) == 0 && llm_gguf_str_eq(s, "hello, world"));
    CHECK(llm_gguf_get_str(g, "bin", &s) == 0 && s.len == 3 && memcmp(s.ptr, "a\0b", 3) == 0);
    char small[4];
    CHECK(strcmp(llm_gguf_str_copy(s, small, sizeof small), "a") == 0);   /* stops at the NUL */
    llm_gguf_arr a;
    CHECK(llm_gguf_get_arr(g, "arr.str", &a) == 0 && a.type == LLM_GGUF_STR && a.n == 4);
    for (int i = 0; i < 4; i++) CHECK(llm_gguf_str_eq(llm_gguf_arr_str(&a, (uint64_t)i), strs[i]));
    char *dup = llm_gguf_str_dup(llm_gguf_arr_str(&a, 2));
    CHECK(dup && strcmp(dup, strs[2]) == 0);
    free(dup);
    CHECK(llm_gguf_arr_str(&a, 4).len == 0);                               /* past the end */
    CHECK(llm_gguf_get_arr(g, "arr.f32", &a) == 0 && a.type == LLM_GGUF_F32 && a.n == 3);
    CHECK(llm_gguf_arr_f32(&a, 0) == 0.5f && llm_gguf_arr_f32(&a, 1) == -1.5f && llm_gguf_arr_f32(&a, 2) == 1e30f);
    CHECK(llm_gguf_get_arr(g, "arr.i32", &a) == 0 && a.type == LLM_GGUF_I32);
    CHECK(llm_gguf_arr_i64(&a, 0) == -1 && llm_gguf_arr_i64(&a, 2) == 2147483647);
    CHECK(llm_gguf_get_arr(g, "arr.u32", &a) == 0 && llm_gguf_arr_i64(&a, 1) == 4000000000ll);
    CHECK(llm_gguf_get_arr(g, "arr.u8", &a) == 0 && llm_gguf_arr_i64(&a, 2) == 255);
    CHECK(llm_gguf_get_arr(g, "arr.i8", &a) == 0 && llm_gguf_arr_i64(&a, 0) == -128);
    CHECK(llm_gguf_get_arr(g, "arr.u16", &a) == 0 && llm_gguf_arr_i64(&a, 1) == 65535);
    CHECK(llm_gguf_get_arr(g, "arr.i16", &a) == 0 && llm_gguf_arr_i64(&a, 0) == -32768);
    CHECK(llm_gguf_get_arr(g, "arr.u64", &a) == 0 && llm_gguf_arr_i64(&a, 1) == 0);  /* > INT64_MAX */
    CHECK(llm_gguf_arr_f64(&a, 1) == 18446744073709551615.0);
    CHECK(llm_gguf_get_arr(g, "arr.i64", &a) == 0 && llm_gguf_arr_i64(&a, 0) == INT64_MIN);
    CHECK(llm_gguf_get_arr(g, "arr.f64", &a) == 0 && llm_gguf_arr_f64(&a, 0) == 1e-300);
    CHECK(llm_gguf_get_arr(g, "arr.bool", &a) == 0 && a.type == LLM_GGUF_BOOL);
    CHECK(llm_gguf_arr_i64(&a, 0) == 1 && llm_gguf_arr_i64(&a, 1) == 0);
    CHECK(llm_gguf_get_arr(g, "arr.empty", &a) == 0 && a.n == 0 && llm_gguf_arr_i64(&a, 0) == 0);
    /* keys in file order, with their types */
    CHECK(llm_gguf_str_eq(llm_gguf_kv_key(g, 0), "u8") && llm_gguf_kv_type(g, 0) == LLM_GGUF_U8);
    CHECK(llm_gguf_kv_type(g, 14) == LLM_GGUF_ARR && llm_gguf_kv_type(g, 27) == -1);
    close_opened(&o);
    free(buf);
}

TEST(gguf_getters_convert_integers_only_when_the_value_fits) {
    gw *w = gw_new();
    gw_add_u64(w, "big", 5000000000ull);
    gw_add_i32(w, "neg", -5);
    gw_add_u8(w, "small", 7);
    gw_add_str(w, "name", "x");
    gw_add_f64(w, "pi", 3.5);
    size_t n;
    unsigned char *buf = finish(w, &n);
    opened o = open_bytes(buf, n);
    llm_gguf *g = o.g;
    CHECK(g != NULL);
    if (!g) { close_opened(&o); free(buf); return; }
    uint32_t u32 = 99; int32_t i32; uint64_t u64; int64_t i64; float f; int b; llm_gguf_str s; llm_gguf_arr a;
    CHECK_EQ_INT(llm_gguf_get_u32(g, "big", &u32), LLM_GGUF_ERANGE);
    CHECK_EQ_INT(u32, 99);                                   /* untouched on error */
    CHECK(llm_gguf_get_u64(g, "big", &u64) == 0 && u64 == 5000000000ull);
    CHECK(llm_gguf_get_i64(g, "big", &i64) == 0 && i64 == 5000000000ll);
    CHECK_EQ_INT(llm_gguf_get_u32(g, "neg", &u32), LLM_GGUF_ERANGE);
    CHECK_EQ_INT(llm_gguf_get_u64(g, "neg", &u64), LLM_GGUF_ERANGE);
    CHECK(llm_gguf_get_i64(g, "neg", &i64) == 0 && i64 == -5);
    CHECK(llm_gguf_get_i32(g, "small", &i32) == 0 && i32 == 7);
    CHECK_EQ_INT(llm_gguf_get_u32(g, "name", &u32), LLM_GGUF_ETYPE);
    CHECK_EQ_INT(llm_gguf_get_f32(g, "small", &f), LLM_GGUF_ETYPE);
    CHECK(llm_gguf_get_f32(g, "pi", &f) == 0 && f == 3.5f);
    CHECK_EQ_INT(llm_gguf_get_bool(g, "small", &b), LLM_GGUF_ETYPE);
    CHECK_EQ_INT(llm_gguf_get_str(g, "pi", &s), LLM_GGUF_ETYPE);
    CHECK_EQ_INT(llm_gguf_get_arr(g, "name", &a), LLM_GGUF_ETYPE);
    CHECK_EQ_INT(llm_gguf_get_u32(g, "missing", &u32), LLM_GGUF_ENOKEY);
    CHECK_EQ_INT(llm_gguf_find_key(g, "missing"), -1);
    CHECK_EQ_INT(llm_gguf_find_key(g, "nam"), -1);           /* prefixes are not matches */
    CHECK_EQ_INT(llm_gguf_u32_or(g, "big", 11), 11);
    CHECK_EQ_INT(llm_gguf_u32_or(g, "small", 11), 7);
    CHECK_EQ_INT(llm_gguf_i32_or(g, "neg", 0), -5);
    CHECK_EQ_INT(llm_gguf_u64_or(g, "nope", 3), 3);
    CHECK(llm_gguf_f32_or(g, "name", 2.5f) == 2.5f);
    CHECK_EQ_INT(llm_gguf_bool_or(g, "nope", 1), 1);
    close_opened(&o);
    free(buf);
}

TEST(gguf_round_trip_preserves_every_tensor_type_and_aligns_its_data) {
    static const int types[] = {GW_F32, GW_F16, GW_BF16, GW_Q4_0, GW_Q4_1, GW_Q8_0, GW_Q4_K, GW_Q5_K, GW_Q6_K,
                                GW_Q5_0, GW_Q5_1, GW_Q2_K, GW_Q3_K};
    /* the worst absolute error each reference quantizer may make, per unit of max|x|
     * (Q4_0, Q5_0: one step d = max/8, max/16 where -max clamps to the last level) */
    static const double tol[] = {0, 1e-3, 8e-3, 1.0 / 8, 1.0 / 10, 1.0 / 200, 1.0 / 5, 1.0 / 10, 1.0 / 10,
                                 1.0 / 15, 1.0 / 25,   /* Q5_1: half a step of range / 31 <= max / 31 */
                                 1.0 / 2,              /* Q2_K: half a step of range / 3, and the min's rounding */
                                 1.0 / 4};             /* Q3_K: half a step of max / 4, and the scale's rounding */
    test_rng r = {11};
    enum { NT = sizeof types / sizeof types[0] };
    int64_t dims[NT][4];
    float *vals[NT];
    unsigned char *blocks[NT];
    gw *w = gw_new();
    gw_add_str(w, "general.architecture", "test");
    for (int t = 0; t < NT; t++) {
        int64_t be = llm_type_block_elems(types[t]);
        int nd = 1 + t % 4;
        for (int d = 0; d < 4; d++) dims[t][d] = d == 0 ? (be == 1 ? 7 : 2 * be) : (d < nd ? 2 + d : 1);
        int64_t n = dims[t][0] * dims[t][1] * dims[t][2] * dims[t][3];
        vals[t] = malloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) vals[t][i] = (float)test_rng_normal(&r);
        size_t nb = gw_tensor_bytes(types[t], nd, dims[t]);
        blocks[t] = malloc(nb);
        CHECK(gw_quantize(types[t], vals[t], blocks[t], n) == 0);
        char name[32];
        snprintf(name, sizeof name, "t%d.%s", t, llm_type_name(types[t]));
        gw_add_tensor_f32(w, name, types[t], nd, dims[t], vals[t]);
    }
    size_t n;
    unsigned char *buf = finish(w, &n);
    opened o = open_bytes(buf, n);
    CHECK_EQ_INT(o.rc, 0);
    for (int t = 0; t < NT && o.g; t++) {
        const llm_gguf_tensor *T = llm_gguf_tensor_at(o.g, t);
        CHECK(T != NULL);
        if (!T) continue;
        char name[32];
        snprintf(name, sizeof name, "t%d.%s", t, llm_type_name(types[t]));
        CHECK(strcmp(T->name, name) == 0 && llm_gguf_find_tensor(o.g, name) == T);
        CHECK_EQ_INT(T->type, types[t]);
        CHECK_EQ_INT(T->n_dims, 1 + t % 4);
        for (int d = 0; d < 4; d++) CHECK_EQ_INT(T->dims[d], dims[t][d]);
        int64_t ne = dims[t][0] * dims[t][1] * dims[t][2] * dims[t][3];
        CHECK_EQ_INT(T->n_elements, ne);
        size_t nb = gw_tensor_bytes(types[t], T->n_dims, dims[t]);
        CHECK_EQ_INT(T->n_bytes, nb);
        CHECK(memcmp(T->data, blocks[t], nb) == 0);
        CHECK_EQ_INT(((const unsigned char *)T->data - (const unsigned char *)o.copy) % 32, 0);
        /* decoded values are the originals up to the format's precision */
        float *y = malloc((size_t)ne * sizeof *y);
        int64_t rb = llm_row_bytes(T->type, T->dims[0]);
        for (int64_t row = 0; row < ne / T->dims[0]; row++)
            CHECK(llm_dequant_row(T->type, (const char *)T->data + row * rb, y + row * T->dims[0], T->dims[0]) == 0);
        double amax = 0, worst = 0;
        for (int64_t i = 0; i < ne; i++) { amax = fmax(amax, fabs(vals[t][i])); worst = fmax(worst, fabs(y[i] - vals[t][i])); }
        if (!(worst <= tol[t] * amax))
            test_fail(__FILE__, __LINE__, "%s: decoded values off by %g (max|x| %g)", name, worst, amax);
        free(y);
    }
    close_opened(&o);
    free(buf);
    for (int t = 0; t < NT; t++) { free(vals[t]); free(blocks[t]); }
}

TEST(gguf_tensors_are_found_by_name_among_many) {
    gw *w = gw_new();
    float v[32] = {0};
    for (int i = 0; i < 60; i++) {
        char name[32];
        snprintf(name, sizeof name, "blk.%d.w", (i * 37) % 60);   /* added out of order */
        v[0] = (float)((i * 37) % 60);
        gw_add_tensor_f32(w, name, GW_F32, 1, (int64_t[]){32}, v);
    }
    size_t n;
    unsigned char *buf = finish(w, &n);
    opened o = open_bytes(buf, n);
    CHECK_EQ_INT(o.rc, 0);
    for (int i = 0; i < 60 && o.g; i++) {
        char name[32];
        snprintf(name, sizeof name, "blk.%d.w", i);
        const llm_gguf_tensor *t = llm_gguf_find_tensor(o.g, name);
        CHECK(t && strcmp(t->name, name) == 0 && ((const float *)t->data)[0] == (float)i);
    }
    if (o.g) {
        CHECK(llm_gguf_find_tensor(o.g, "blk.60.w") == NULL);
        CHECK(llm_gguf_find_tensor(o.g, "blk.1") == NULL);
        CHECK(llm_gguf_tensor_at(o.g, 60) == NULL && llm_gguf_tensor_at(o.g, -1) == NULL);
    }
    close_opened(&o);
    free(buf);
}

TEST(gguf_reads_version_2_and_an_empty_file_with_no_entries) {
    gw *w = gw_new();
    gw_set_version(w, 2);
    gw_add_u32(w, "x", 5);
    size_t n;
    unsigned char *buf = finish(w, &n);
    opened o = open_bytes(buf, n);
    CHECK(o.rc == 0 && llm_gguf_version(o.g) == 2 && llm_gguf_u32_or(o.g, "x", 0) == 5);
    close_opened(&o);
    free(buf);
    buf = finish(gw_new(), &n);
    CHECK_EQ_INT(n, 24);
    o = open_bytes(buf, n);
    CHECK(o.rc == 0 && llm_gguf_n_kv(o.g) == 0 && llm_gguf_n_tensors(o.g) == 0);
    close_opened(&o);
    free(buf);
}

TEST(gguf_alignment_key_sets_where_tensor_data_may_start) {
    static const uint32_t aligns[] = {1, 8, 64, 4096};
    for (int k = 0; k < 4; k++) {
        gw *w = gw_new();
        gw_set_alignment(w, aligns[k]);
        float v[3] = {1, 2, 3};
        gw_add_tensor_f32(w, "a", GW_F32, 1, (int64_t[]){3}, v);
        gw_add_tensor_f32(w, "b", GW_F32, 1, (int64_t[]){3}, v);
        size_t n;
        unsigned char *buf = finish(w, &n);
        opened o = open_bytes(buf, n);
        CHECK_EQ_INT(o.rc, 0);
        if (o.g) {
            CHECK_EQ_INT(llm_gguf_alignment(o.g), aligns[k]);
            CHECK_EQ_INT(llm_gguf_data_offset(o.g) % aligns[k], 0);
            const llm_gguf_tensor *b = llm_gguf_find_tensor(o.g, "b");
            float third = 0;   /* with alignment 1 the floats may sit at odd addresses */
            if (b) memcpy(&third, (const char *)b->data + 8, 4);
            CHECK(b && b->offset % aligns[k] == 0 && third == 3.0f);
        }
        close_opened(&o);
        free(buf);
    }
}

TEST(gguf_open_maps_a_file_and_reports_missing_ones) {
    char path[] = "/tmp/kvcache_test_gguf_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    size_t n;
    unsigned char *buf = small_file(&n);
    gw *w = gw_new();
    gw_add_str(w, "general.architecture", "llama");
    gw_add_tensor_f32(w, "t", GW_Q8_0, 1, (int64_t[]){32}, (float[32]){1, 2, 3});
    CHECK(gw_write_file(w, path) == 0);
    gw_free(w);
    llm_gguf *g = NULL;
    char err[512] = "";
    CHECK(llm_gguf_open(path, &g, err, sizeof err) == 0);
    if (g) {
        llm_gguf_str s;
        CHECK(llm_gguf_get_str(g, "general.architecture", &s) == 0 && llm_gguf_str_eq(s, "llama"));
        const llm_gguf_tensor *t = llm_gguf_find_tensor(g, "t");
        float y[32];
        CHECK(t && llm_dequant_row(t->type, t->data, y, 32) == 0 && fabsf(y[2] - 3.0f) < 0.02f);
        llm_gguf_close(g);
    }
    FILE *f = fopen(path, "wb");   /* a broken file: the message names the path */
    if (f) { fwrite(buf, 1, n / 2, f); fclose(f); }
    CHECK(llm_gguf_open(path, &g, err, sizeof err) != 0 && g == NULL && strstr(err, path));
    unlink(path);
    CHECK(llm_gguf_open(path, &g, err, sizeof err) != 0 && g == NULL && strstr(err, "cannot open"));
    CHECK(llm_gguf_open("/tmp", &g, err, sizeof err) != 0 && strstr(err, "not a regular file"));
    free(buf);
}

/* issue 10.6: a FIFO (or any file that is not regular) is refused at once;
 * open() without O_NONBLOCK used to wait forever for a writer. The open runs
 * in a child so that a hang fails the test after 5 s instead of stalling it. */
TEST(gguf_a_fifo_is_refused_at_once_not_waited_on) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/kvcache_test_fifo_%d", (int)getpid());
    unlink(path);
    CHECK(mkfifo(path, 0600) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        llm_gguf *g = NULL;
        char err[512] = "";
        int rc = llm_gguf_open(path, &g, err, sizeof err);
        _exit(rc != 0 && g == NULL && strstr(err, "not a regular file") && strstr(err, path) ? 0 : 1);
    }
    int status = -1, waited = 0;
    while (pid > 0 && waited < 500 && waitpid(pid, &status, WNOHANG) == 0) {
        usleep(10000);
        waited++;
    }
    if (pid > 0 && waited == 500) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        test_fail(__FILE__, __LINE__, "llm_gguf_open on a FIFO still blocked after 5 s");
    } else {
        CHECK(pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    unlink(path);
}

/* ------------------------------------------------------------ malformed files */

TEST(gguf_every_truncation_of_a_valid_file_is_refused_with_a_message) {
    size_t n;
    unsigned char *buf = small_file(&n);
    opened whole = open_bytes(buf, n);
    CHECK_EQ_INT(whole.rc, 0);
    close_opened(&whole);
    for (size_t len = 0; len < n; len++) {
        opened o = open_bytes(buf, len);
        if (o.rc == 0 || o.g || !o.err[0]) {
            test_fail(__FILE__, __LINE__, "prefix of %zu of %zu bytes: rc %d, message '%s'", len, n, o.rc, o.err);
            close_opened(&o);
            break;
        }
        close_opened(&o);
    }
    free(buf);
}

TEST(gguf_bad_magic_and_unsupported_versions_are_refused) {
    size_t n;
    unsigned char *buf = small_file(&n);
    buf[0] = 'X';
    CHECK_REFUSED(buf, n, "magic");
    buf[0] = 'G';
    static const uint32_t bad[] = {0, 1, 4, 0x03000000};
    for (int i = 0; i < 4; i++) {
        poke32(buf + 4, bad[i]);
        CHECK_REFUSED(buf, n, "version");
    }
    CHECK_REFUSED(NULL, 0, "magic");
    free(buf);
}

TEST(gguf_huge_counts_fail_fast_without_huge_allocations) {
    size_t n;
    unsigned char *buf = small_file(&n);
    static const uint64_t huge[] = {1ull << 62, UINT64_MAX, 1000000};
    for (int i = 0; i < 3; i++) {
        unsigned char *c = malloc(n);
        memcpy(c, buf, n);
        poke64(c + 8, huge[i]);                    /* tensor count */
        CHECK_REFUSED(c, n, "tensor count");
        memcpy(c, buf, n);
        poke64(c + 16, huge[i]);                   /* metadata count */
        CHECK_REFUSED(c, n, "metadata count");
        free(c);
    }
    free(buf);
}

TEST(gguf_huge_string_and_array_lengths_are_refused) {
    size_t n;
    unsigned char *buf = small_file(&n);
    long k = find(buf, n, "general.architecture");
    poke64(buf + k - 8, 1ull << 63);               /* a key's length */
    CHECK_REFUSED(buf, n, "past end of file");
    free(buf);
    buf = small_file(&n);
    k = find(buf, n, "llama");                     /* a string value's length */
    poke64(buf + k - 8, UINT64_MAX - 3);
    CHECK_REFUSED(buf, n, "past end of file");
    free(buf);
    buf = small_file(&n);
    k = find(buf, n, "tokens");                    /* a string array's count */
    poke64(buf + k + 6 + 4 + 4, 1ull << 61);
    CHECK_REFUSED(buf, n, "array of");
    free(buf);
    buf = small_file(&n);
    k = find(buf, n, "scores");                    /* a float array's count */
    poke64(buf + k + 6 + 4 + 4, (1ull << 62) + 1);
    CHECK_REFUSED(buf, n, "array of");
    free(buf);
    buf = small_file(&n);
    k = find(buf, n, "w.q4");                      /* a tensor name's length */
    poke64(buf + k - 8, 1ull << 40);
    CHECK_REFUSED(buf, n, "past end of file");
    free(buf);
}

TEST(gguf_tensor_data_past_the_end_is_refused_naming_the_tensor) {
    gw *w = gw_new();
    gw_add_tensor_f32(w, "blk.0.attn_q.weight", GW_F32, 1, (int64_t[]){8}, (float[8]){0});
    gw_set_tensor_offset(w, "blk.0.attn_q.weight", 1 << 20);
    size_t n;
    unsigned char *buf = finish(w, &n);
    CHECK_REFUSED(buf, n, "tensor 'blk.0.attn_q.weight': data [offset 1048576, size 32] runs past end");
    free(buf);
    w = gw_new();                                  /* an offset near 2^64: no wrap-around */
    gw_add_tensor_f32(w, "t", GW_F32, 1, (int64_t[]){8}, (float[8]){0});
    gw_set_tensor_offset(w, "t", UINT64_MAX - 31);
    buf = finish(w, &n);
    CHECK_REFUSED(buf, n, "runs past end");
    free(buf);
}

TEST(gguf_overlapping_tensors_are_refused) {
    gw *w = gw_new();
    float v[16] = {0};
    gw_add_tensor_f32(w, "a", GW_F32, 1, (int64_t[]){16}, v);
    gw_add_tensor_f32(w, "b", GW_F32, 1, (int64_t[]){8}, v);
    gw_add_tensor_f32(w, "c", GW_F32, 1, (int64_t[]){8}, v);
    gw_set_tensor_offset(w, "c", 32);              /* inside a's 64 bytes */
    size_t n;
    unsigned char *buf = finish(w, &n);
    CHECK_REFUSED(buf, n, "overlap");
    free(buf);
}

TEST(gguf_unknown_and_unsupported_tensor_types_are_refused) {
    unsigned char raw[64] = {0};
    gw *w = gw_new();
    gw_add_tensor(w, "odd", 99, 1, (int64_t[]){32}, raw, 32);
    size_t n;
    unsigned char *buf = finish(w, &n);
    CHECK_REFUSED(buf, n, "tensor 'odd': unknown type 99");
    free(buf);
    w = gw_new();
    gw_add_tensor(w, "iq2", 16, 1, (int64_t[]){256}, raw, 64);
    buf = finish(w, &n);
    CHECK_REFUSED(buf, n, "unsupported type 16 (IQ2_XXS)");
    free(buf);
}

TEST(gguf_unknown_value_types_nested_arrays_and_bad_bools_are_refused) {
    size_t n;
    unsigned char *buf = small_file(&n);
    long k = find(buf, n, "llama.block_count");
    poke32(buf + k + 17, 13);                      /* the value type after the key */
    CHECK_REFUSED(buf, n, "unknown value type 13");
    free(buf);
    buf = small_file(&n);
    k = find(buf, n, "scores");
    poke32(buf + k + 6 + 4, 9);                    /* the element type: array of arrays */
    CHECK_REFUSED(buf, n, "nested arrays");
    poke32(buf + k + 6 + 4, 77);
    CHECK_REFUSED(buf, n, "unknown array element type 77");
    free(buf);
    buf = small_file(&n);
    k = find(buf, n, "flag");
    buf[k + 4 + 4] = 2;                            /* a bool that is neither 0 nor 1 */
    CHECK_REFUSED(buf, n, "bool");
    free(buf);
}

TEST(gguf_n_dims_outside_1_to_4_is_refused) {
    float v[64] = {0};
    for (int nd = 5; nd <= 6; nd++) {
        gw *w = gw_new();
        int64_t dims[8] = {2, 2, 2, 2, 2, 2, 1, 1};
        gw_add_tensor(w, "t", GW_F32, nd, dims, v, 4u << nd);
        size_t n;
        unsigned char *buf = finish(w, &n);
        CHECK_REFUSED(buf, n, "n_dims");
        free(buf);
    }
    size_t n;
    unsigned char *buf = small_file(&n);
    long k = find(buf, n, "b.f32");
    poke32(buf + k + 5, 0);
    CHECK_REFUSED(buf, n, "n_dims is 0");
    free(buf);
}

TEST(gguf_misaligned_tensor_offsets_are_refused) {
    gw *w = gw_new();
    float v[8] = {0};
    gw_add_tensor_f32(w, "a", GW_F32, 1, (int64_t[]){8}, v);
    gw_set_tensor_offset(w, "a", 8);
    size_t n;
    unsigned char *buf = finish(w, &n);
    CHECK_REFUSED(buf, n, "not a multiple of the alignment 32");
    free(buf);
}

TEST(gguf_duplicate_tensor_names_and_keys_are_refused) {
    gw *w = gw_new();
    float v[8] = {0};
    gw_add_tensor_f32(w, "same", GW_F32, 1, (int64_t[]){8}, v);
    gw_add_tensor_f32(w, "other", GW_F32, 1, (int64_t[]){8}, v);
    gw_add_tensor_f32(w, "same", GW_F32, 1, (int64_t[]){8}, v);
    size_t n;
    unsigned char *buf = finish(w, &n);
    CHECK_REFUSED(buf, n, "tensor name 'same' appears more than once");
    free(buf);
    w = gw_new();
    gw_add_u32(w, "k", 1);
    gw_add_str(w, "k", "again");
    buf = finish(w, &n);
    CHECK_REFUSED(buf, n, "metadata key 'k' appears more than once");
    free(buf);
}

TEST(gguf_alignment_must_be_a_u32_power_of_two) {
    static const uint32_t bad[] = {0, 3, 48, 0x80000001u};
    for (int i = 0; i < 4; i++) {
        gw *w = gw_new();
        gw_add_u32(w, "general.alignment", bad[i]);
        size_t n;
        unsigned char *buf = finish(w, &n);
        CHECK_REFUSED(buf, n, "power of two");
        free(buf);
    }
    gw *w = gw_new();
    gw_add_u64(w, "general.alignment", 32);
    size_t n;
    unsigned char *buf = finish(w, &n);
    CHECK_REFUSED(buf, n, "expected u32");
    free(buf);
}

TEST(gguf_dims_that_overflow_or_split_a_block_are_refused) {
    unsigned char raw[64] = {0};
    gw *w = gw_new();
    gw_add_tensor(w, "big", GW_F32, 3, (int64_t[]){1ll << 32, 1ll << 32, 4}, raw, 4);
    size_t n;
    unsigned char *buf = finish(w, &n);
    CHECK_REFUSED(buf, n, "overflows");
    free(buf);
    w = gw_new();                                  /* elements fit in 63 bits, bytes do not */
    gw_add_tensor(w, "bytes", GW_F32, 2, (int64_t[]){1ll << 31, 1ll << 31}, raw, 4);
    buf = finish(w, &n);
    CHECK_REFUSED(buf, n, "overflows");
    free(buf);
    w = gw_new();
    gw_add_tensor(w, "neg", GW_F32, 1, (int64_t[]){-4}, raw, 4);
    buf = finish(w, &n);
    CHECK_REFUSED(buf, n, "too large");
    free(buf);
    w = gw_new();
    gw_add_tensor(w, "part", GW_Q4_0, 1, (int64_t[]){48}, raw, 18 + 9);
    buf = finish(w, &n);
    CHECK_REFUSED(buf, n, "not a multiple of the Q4_0 block size 32");
    free(buf);
}

TEST(gguf_tensor_names_with_nul_bytes_are_refused) {
    size_t n;
    unsigned char *buf = small_file(&n);
    long k = find(buf, n, "w.q4");
    buf[k + 1] = 0;
    CHECK_REFUSED(buf, n, "NUL");
    free(buf);
}

/* ------------------------------------------------------------ robustness */

/* Touch everything an opened file offers, as a model loader would. */
static double exercise(const llm_gguf *g) {
    double acc = 0;
    for (int64_t i = 0; i < llm_gguf_n_kv(g); i++) {
        llm_gguf_str k = llm_gguf_kv_key(g, i);
        char key[128];
        llm_gguf_str_copy(k, key, sizeof key);
        uint32_t u; float f; llm_gguf_str s; llm_gguf_arr a;
        if (llm_gguf_get_u32(g, key, &u) == 0) acc += u;
        if (llm_gguf_get_f32(g, key, &f) == 0) acc += f;
        if (llm_gguf_get_str(g, key, &s) == 0) acc += s.len;
        if (llm_gguf_get_arr(g, key, &a) == 0)
            for (uint64_t e = 0; e < a.n && e < 50; e++)
                acc += llm_gguf_arr_f64(&a, e) + (double)llm_gguf_arr_str(&a, e).len;
    }
    for (int64_t i = 0; i < llm_gguf_n_tensors(g); i++) {
        const llm_gguf_tensor *t = llm_gguf_tensor_at(g, i);
        acc += llm_gguf_find_tensor(g, t->name) == t;
        if (t->dims[0] > 0 && t->dims[0] <= 4096 && t->n_bytes > 0) {
            float y[4096];
            if (llm_dequant_row(t->type, t->data, y, t->dims[0]) == 0) acc += y[0];
        }
    }
    return acc;
}

TEST(gguf_random_corruption_never_crashes_or_overreads) {
    size_t n;
    unsigned char *buf = small_file(&n);
    test_rng r = {12};
    int opened_ok = 0;
    for (int it = 0; it < 3000; it++) {
        unsigned char *c = malloc(n);
        memcpy(c, buf, n);
        int flips = test_rng_int(&r, 1, 4);
        for (int f = 0; f < flips; f++) {
            size_t at = (size_t)test_rng_int(&r, 0, (int)n - 1);
            c[at] = test_rng_int(&r, 0, 3) == 0 ? 0xff : (uint8_t)test_rng_u64(&r);
        }
        size_t len = test_rng_int(&r, 0, 5) == 0 ? (size_t)test_rng_int(&r, 0, (int)n) : n;
        opened o = open_bytes(c, len);
        if (o.rc == 0) { opened_ok++; (void)exercise(o.g); }
        else if (!o.err[0]) { CHECK(o.err[0]); }
        close_opened(&o);
        free(c);
    }
    CHECK(opened_ok > 0);   /* some mutations land in tensor data and stay valid */
    free(buf);
}

/* kvengine.h's inspector gives, through the handle alone, every entry's key,
 * type and value (scalars and each array element, every integer width at its
 * extremes, strings with NUL bytes) and every tensor's type, shape, offset
 * and size, as the test's writer wrote them; out-of-range indices and NULLs
 * are refused by name; a damaged file is refused with the reader's message,
 * a missing one as an I/O failure; a file without an architecture has no
 * hyperparameters. */
TEST(gguf_inspector_gives_every_entry_value_and_tensor) {
    gw *w = gw_new();
    static const char *const strs[] = {"a", "", "hello"};
    gw_add_str(w, "general.architecture", "llama");
    gw_add_u64(w, "u64", 0xfedcba9876543210ull);
    gw_add_i64(w, "i64", -0x123456789abcdefll);
    gw_add_i8(w, "i8", -120);
    gw_add_f32(w, "f32", 3.25f);
    gw_add_bool(w, "yes", 1);
    gw_add_strn(w, "bin", "a\0b", 3);
    gw_add_arr_str(w, "tokens", strs, 3);
    gw_add_arr(w, "arr.u64", GW_U64, 2, (uint64_t[]){1, 0xffffffffffffffffull});
    gw_add_arr(w, "arr.i16", GW_I16, 2, (int16_t[]){-32768, 5});
    gw_add_arr(w, "arr.f64", GW_F64V, 2, (double[]){1e-300, -2.5});
    gw_add_arr(w, "arr.empty", GW_I32, 0, NULL);
    float v[64 * 2 + 5];
    for (int i = 0; i < 64 * 2 + 5; i++) v[i] = (float)(i % 13) - 6.0f;
    gw_add_tensor_f32(w, "w.q4", GW_Q4_0, 2, (int64_t[]){64, 2}, v);
    gw_add_tensor_f32(w, "b.f32", GW_F32, 1, (int64_t[]){5}, v + 128);
    size_t n;
    unsigned char *buf = finish(w, &n);
    kve_gguf *g = NULL;
    char err[512] = "";
    CHECK_EQ_INT(kve_gguf_open_memory(buf, n, &g, err, sizeof err), KVE_OK);
    if (!g) { test_fail(__FILE__, __LINE__, "%s", err); free(buf); return; }
    kve_gguf_info in = kve_gguf_get_info(g);
    CHECK(in.version == 3 && in.n_kv == 12 && in.n_tensors == 2 && in.alignment == 32 && in.file_size == n);
    kve_gguf_kv kv;
    kve_gguf_value x;
    CHECK_EQ_INT(kve_gguf_kv_at(g, 0, &kv), KVE_OK);
    CHECK(!strcmp(kv.key, "general.architecture") && kv.key_len == 20 && kv.type == KVE_GGUF_STRING && kv.n == 1);
    CHECK(kve_gguf_value_at(g, 0, 0, &x) == KVE_OK && x.len == 5 && !memcmp(x.str, "llama", 5));
    CHECK(kve_gguf_value_at(g, 1, 0, &x) == KVE_OK && x.type == KVE_GGUF_U64 && x.u == 0xfedcba9876543210ull &&
          x.i == 0 && x.f == (double)0xfedcba9876543210ull);
    CHECK(kve_gguf_value_at(g, 2, 0, &x) == KVE_OK && x.i == -0x123456789abcdefll && x.u == 0);
    CHECK(kve_gguf_value_at(g, 3, 0, &x) == KVE_OK && x.type == KVE_GGUF_I8 && x.i == -120 && x.f == -120);
    CHECK(kve_gguf_value_at(g, 4, 0, &x) == KVE_OK && x.f == 3.25 && x.i == 0 && !x.str);
    CHECK(kve_gguf_value_at(g, 5, 0, &x) == KVE_OK && x.type == KVE_GGUF_BOOL && x.i == 1 && x.u == 1);
    CHECK(kve_gguf_value_at(g, 6, 0, &x) == KVE_OK && x.len == 3 && !memcmp(x.str, "a\0b", 3));
    CHECK(kve_gguf_kv_at(g, 7, &kv) == KVE_OK && kv.type == KVE_GGUF_ARRAY && kv.elem_type == KVE_GGUF_STRING &&
          kv.n == 3 && !strcmp(kv.key, "tokens"));
    for (uint64_t e = 0; e < 3; e++)
        CHECK(kve_gguf_value_at(g, 7, e, &x) == KVE_OK && x.len == strlen(strs[e]) && !memcmp(x.str, strs[e], x.len));
    CHECK(kve_gguf_value_at(g, 8, 1, &x) == KVE_OK && x.u == 0xffffffffffffffffull && x.i == 0);
    CHECK(kve_gguf_value_at(g, 9, 0, &x) == KVE_OK && x.type == KVE_GGUF_I16 && x.i == -32768);
    CHECK(kve_gguf_value_at(g, 10, 0, &x) == KVE_OK && x.f == 1e-300);
    CHECK(kve_gguf_kv_at(g, 11, &kv) == KVE_OK && kv.n == 0 && kv.elem_type == KVE_GGUF_I32);
    CHECK_EQ_INT(kve_gguf_value_at(g, 11, 0, &x), KVE_ERR_PARAM);   /* an empty array has no element 0 */
    CHECK_EQ_INT(kve_gguf_value_at(g, 7, 3, &x), KVE_ERR_PARAM);
    CHECK_EQ_INT(kve_gguf_kv_at(g, 12, &kv), KVE_ERR_PARAM);
    CHECK_EQ_INT(kve_gguf_kv_at(g, -1, &kv), KVE_ERR_PARAM);
    CHECK_EQ_INT(kve_gguf_kv_at(g, 0, NULL), KVE_ERR_NULL);
    CHECK(kve_gguf_find_key(g, "arr.f64") == 10 && kve_gguf_find_key(g, "nope") == -1 &&
          kve_gguf_find_key(g, NULL) == -1);
    CHECK(!strcmp(kve_gguf_type_name(KVE_GGUF_ARRAY), "array") && !strcmp(kve_gguf_type_name(99), "?"));
    kve_gguf_tensor t;
    CHECK_EQ_INT(kve_gguf_tensor_at(g, 0, &t), KVE_OK);
    CHECK(!strcmp(t.name, "w.q4") && t.type == GW_Q4_0 && !strcmp(t.type_name, "Q4_0") && t.n_dims == 2 &&
          t.dims[0] == 64 && t.dims[1] == 2 && t.dims[2] == 1 && t.offset == 0 && t.n_bytes == 2 * 2 * 18);
    CHECK_EQ_INT(kve_gguf_tensor_at(g, 1, &t), KVE_OK);
    CHECK(!strcmp(t.name, "b.f32") && !strcmp(t.type_name, "F32") && t.n_bytes == 20 && t.offset == 96);
    CHECK_EQ_INT(kve_gguf_tensor_at(g, 2, &t), KVE_ERR_PARAM);
    CHECK(kve_gguf_find_tensor(g, "b.f32") == 1 && kve_gguf_find_tensor(g, "x") == -1);
    kve_hparams hp;
    CHECK_EQ_INT(kve_gguf_hparams(g, &hp, err, sizeof err), KVE_ERR_MODEL);   /* llama without its keys */
    CHECK(strstr(err, "llama.") != NULL);
    kve_gguf_close(g);
    /* damaged: the tensor data cut short */
    CHECK_EQ_INT(kve_gguf_open_memory(buf, n - 120, &g, err, sizeof err), KVE_ERR_MODEL);
    CHECK(g == NULL && strstr(err, "tensor") != NULL);
    CHECK_EQ_INT(kve_gguf_open_memory(NULL, 4, &g, err, sizeof err), KVE_ERR_NULL);
    CHECK_EQ_INT(kve_gguf_open("/nonexistent/x.gguf", &g, err, sizeof err), KVE_ERR_IO);
    CHECK(strstr(err, "/nonexistent/x.gguf") && strstr(err, "No such file"));
    free(buf);
}
