/* tests/fuzz/fuzz_gguf.c - libFuzzer target for the GGUF reader.
 *
 * Opens the input with llm_gguf_open_memory; when the reader accepts it,
 * calls every getter on every key, reads every array element (up to a cap),
 * looks every tensor up by index and by name, checks that its data lies
 * inside the input, and decodes / multiplies its first rows; then the same
 * bytes through kvengine.h's inspector: every entry, every array element (up
 * to a cap), every tensor, the lookups and the hyperparameters, which must
 * agree with the reader's. A refusal must come with a message. Any crash,
 * sanitizer report or trap is a bug.
 *
 *   make fuzz (or: clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
 *       tests/fuzz/fuzz_gguf.c build-asan/libkvengine.a build-asan/libkvcache.a \
 *       -lm -lpthread -o /tmp/fuzz_gguf)
 *   /tmp/fuzz_gguf -max_total_time=60 tests/fuzz/corpus_gguf
 *
 * (add -march=native to fuzz the SIMD decoders instead of the scalar ones) */
#include "../../engine/gguf/gguf.h"
#include "../../engine/weights/quant.h"
#include "kvengine.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(c) do { if (!(c)) __builtin_trap(); } while (0)

static volatile double sink;   /* keeps the reads from being optimized away */

static void exercise_key(const llm_gguf *g, int64_t i) {
    llm_gguf_str k = llm_gguf_kv_key(g, i);
    char key[256];
    if (k.len >= sizeof key || memchr(k.ptr, 0, (size_t)k.len)) return;   /* not a C string */
    llm_gguf_str_copy(k, key, sizeof key);
    REQUIRE(llm_gguf_find_key(g, key) == i);
    uint32_t u32; int32_t i32; uint64_t u64; int64_t i64; float f; double d; int b;
    llm_gguf_str s; llm_gguf_arr a;
    int hits = 0;
    hits += llm_gguf_get_u32(g, key, &u32) == 0;
    hits += llm_gguf_get_i32(g, key, &i32) == 0;
    hits += llm_gguf_get_u64(g, key, &u64) == 0;
    hits += llm_gguf_get_i64(g, key, &i64) == 0;
    hits += llm_gguf_get_f32(g, key, &f) == 0;
    hits += llm_gguf_get_f64(g, key, &d) == 0;
    hits += llm_gguf_get_bool(g, key, &b) == 0;
    sink += llm_gguf_u32_or(g, key, 1) + llm_gguf_i32_or(g, key, 2) + (double)llm_gguf_u64_or(g, key, 3) +
            llm_gguf_f32_or(g, key, 4) + llm_gguf_bool_or(g, key, 5);
    if (llm_gguf_get_str(g, key, &s) == 0) {
        hits++;
        char *c = llm_gguf_str_dup(s);
        if (c) { sink += (double)strlen(c); free(c); }
        sink += llm_gguf_str_eq(s, "llama");
    }
    if (llm_gguf_get_arr(g, key, &a) == 0) {
        hits++;
        REQUIRE(a.type != LLM_GGUF_ARR && a.type <= LLM_GGUF_F64);
        for (uint64_t e = 0; e < a.n && e < 4096; e++) {
            llm_gguf_str es = llm_gguf_arr_str(&a, e);
            sink += (double)llm_gguf_arr_i64(&a, e) + llm_gguf_arr_f64(&a, e) + llm_gguf_arr_f32(&a, e);
            if (es.len) sink += (unsigned char)es.ptr[0] + (unsigned char)es.ptr[es.len - 1];
        }
        sink += llm_gguf_arr_str(&a, a.n).len + (double)llm_gguf_arr_i64(&a, a.n);
    }
    REQUIRE(hits > 0);   /* every value type has at least one getter */
}

static void exercise_tensor(const llm_gguf *g, const uint8_t *data, size_t size, int64_t i) {
    const llm_gguf_tensor *t = llm_gguf_tensor_at(g, i);
    REQUIRE(t != NULL);
    REQUIRE(llm_gguf_find_tensor(g, t->name) == t);
    REQUIRE(t->n_dims >= 1 && t->n_dims <= 4 && llm_type_supported(t->type));
    const uint8_t *p = t->data;
    REQUIRE(p >= data && (size_t)(p - data) <= size && t->n_bytes <= size - (size_t)(p - data));
    int64_t rb = llm_row_bytes(t->type, t->dims[0]);
    REQUIRE(rb >= 0);
    int64_t n = t->dims[0], rows = n ? t->n_elements / n : 0;
    REQUIRE((uint64_t)(rb * rows) == t->n_bytes);
    if (n <= 0 || rows <= 0 || n > (1 << 16)) return;
    int64_t use = rows < 3 ? rows : 3;
    float *y = malloc((size_t)n * sizeof *y);
    float *x = calloc((size_t)(n * 2), sizeof *x);
    float out[6];
    if (!y || !x) { free(y); free(x); return; }
    for (int64_t r = 0; r < use; r++) {
        REQUIRE(llm_dequant_row(t->type, p + r * rb, y, n) == 0);
        sink += y[0] + y[n - 1];
    }
    for (int64_t k = 0; k < 2 * n; k++) x[k] = (float)(k % 7) - 3.0f;
    sink += llm_vec_dot(t->type, p, x, n);
    llm_matmul_rows(t->type, p, n, 0, use, x, 2, out, 3);
    sink += out[0];
    free(y);
    free(x);
}

/* The public inspector over the same bytes. It reads tensor types the
 * engine does not, so it accepts what the reader accepted (r: the reader's
 * view, to agree with) and perhaps more (r NULL: a refusal comes with a
 * message; what it accepts must lie inside the input). */
static void exercise_inspector(const llm_gguf *r, const uint8_t *data, size_t size) {
    kve_gguf *g = NULL;
    char err[256] = "";
    int rc = kve_gguf_open_memory(data, size, &g, err, sizeof err);
    if (!r && rc != KVE_OK) {
        REQUIRE(rc == KVE_ERR_MODEL && !g && err[0]);
        return;
    }
    REQUIRE(rc == KVE_OK && g);
    kve_gguf_info in = kve_gguf_get_info(g);
    REQUIRE(in.file_size == size && (in.n_tensors == 0 || in.data_offset <= size));
    REQUIRE(!r || (in.n_kv == llm_gguf_n_kv(r) && in.n_tensors == llm_gguf_n_tensors(r)));
    kve_gguf_kv kv;
    kve_gguf_value v;
    int64_t i = 0;
    for (; kve_gguf_kv_at(g, i, &kv) == KVE_OK; i++) {
        REQUIRE(kv.key && strlen(kv.key) <= kv.key_len && (!r || kv.type == llm_gguf_kv_type(r, i)));
        REQUIRE(kv.type == KVE_GGUF_ARRAY ? kv.elem_type != KVE_GGUF_ARRAY : kv.n == 1 && kv.elem_type == kv.type);
        if (strlen(kv.key) == kv.key_len) REQUIRE(kve_gguf_find_key(g, kv.key) == i);
        for (uint64_t e = 0; e < kv.n && e < 4096; e++) {
            REQUIRE(kve_gguf_value_at(g, i, e, &v) == KVE_OK && v.type == kv.elem_type);
            if (v.type == KVE_GGUF_STRING) {
                const uint8_t *p = (const uint8_t *)v.str;
                REQUIRE(p >= data && (size_t)(p - data) <= size && v.len <= size - (size_t)(p - data));
                if (v.len) sink += p[0] + p[v.len - 1];
            } else {
                sink += v.f + (double)v.i + (double)v.u;
            }
        }
        REQUIRE(kve_gguf_value_at(g, i, kv.n, &v) == KVE_ERR_PARAM);
    }
    REQUIRE(i == in.n_kv);
    kve_gguf_tensor t;
    for (i = 0; kve_gguf_tensor_at(g, i, &t) == KVE_OK; i++) {
        const llm_gguf_tensor *rt = r ? llm_gguf_tensor_at(r, i) : NULL;
        REQUIRE(!rt || (!strcmp(t.name, rt->name) && t.n_bytes == rt->n_bytes && t.offset == rt->offset));
        REQUIRE(t.type_name && t.offset <= size - in.data_offset && t.n_bytes <= size - in.data_offset - t.offset);
        REQUIRE(kve_gguf_find_tensor(g, t.name) == i);
    }
    REQUIRE(i == in.n_tensors);
    kve_hparams hp;
    if (kve_gguf_hparams(g, &hp, err, sizeof err) == KVE_OK)
        sink += hp.n_layers + hp.dim + hp.rope.theta;
    else
        REQUIRE(err[0] != 0);
    kve_gguf_close(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    llm_gguf *g = NULL;
    char err[512];
    err[0] = 0;
    if (llm_gguf_open_memory(data, size, &g, err, sizeof err) != 0) {
        REQUIRE(g == NULL && err[0] != 0);
        exercise_inspector(NULL, data, size);
        return 0;
    }
    REQUIRE(llm_gguf_version(g) == 2 || llm_gguf_version(g) == 3);
    uint32_t al = llm_gguf_alignment(g);
    REQUIRE(al && !(al & (al - 1)));
    for (int64_t i = 0; i < llm_gguf_n_kv(g); i++) exercise_key(g, i);
    sink += llm_gguf_kv_type(g, -1) + llm_gguf_kv_type(g, llm_gguf_n_kv(g));
    for (int64_t i = 0; i < llm_gguf_n_tensors(g); i++) exercise_tensor(g, data, size, i);
    REQUIRE(llm_gguf_tensor_at(g, llm_gguf_n_tensors(g)) == NULL);
    REQUIRE(llm_gguf_find_tensor(g, "\x01no such tensor") == NULL);
    exercise_inspector(g, data, size);
    llm_gguf_close(g);
    return 0;
}
