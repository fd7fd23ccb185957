/* src/kvtype.h - the storage types of K and V as one table of traits, the
 * library's only description of a type: the page layout, the file format,
 * the price of a token, the row conversions and the kernels' instantiations
 * all derive from a type's row. A new type is a line in KV_TYPES (or
 * KV_KERNEL_TYPES_WITH), its store_<name> and load_<name> in src/dtype.c,
 * and, for the SIMD kernels, its element loads in each src/simd_*.c: the
 * per-ISA hooks (load_rows, load8 / load16), which every kernel takes with
 * the type a compile-time constant. */
#ifndef KV_KVTYPE_H
#define KV_KVTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"

/* A scale block of a whole row: one f32 per (token, head). */
#define KV_ROW INT32_MAX

/* The table: X(A, enum, name, bits per element, elements per f32 scale) for
 * every type the SIMD kernels read. The scale is 0 for an unscaled type,
 * KV_ROW for one per row, else one per that many elements of a row; the
 * scales lie apart from the rows (at a page slice's or a file record's end).
 * A 4-bit type with a scale per 32 elements would read X(A, KV_Q4, q4, 4,
 * 32); the decode kernels apply one scale per row (ks[j], vs[j]), so such a
 * type brings kernels that apply its blocks' scales. */
#define KV_KERNEL_TYPES_WITH(X, A)                                                                           \
    X(A, KV_F32, f32, 32, 0) X(A, KV_F16, f16, 16, 0) X(A, KV_BF16, bf16, 16, 0) X(A, KV_Q8, q8, 8, KV_ROW)
/* The same as X(enum, name, bits, scale). */
#define KV_KERNEL_TYPES(X) KV_KERNEL_TYPES_WITH(KV_APPLY_, X)
#define KV_APPLY_(X, ...) X(__VA_ARGS__)
/* Every type: those and KV_F64, the float64 reference's alone. */
#define KV_TYPES(X) X(KV_F64, f64, 64, 0) KV_KERNEL_TYPES(X)

typedef struct {
    const char *name;    /* kv_dtype_name; kv_dtype_parse takes it */
    int32_t bits;        /* per element */
    int32_t scale_block; /* elements per f32 scale: 0 none, KV_ROW one per row */
    /* n floats stored at dst, the row's scales (if any) into *scale; and
     * back, with the row's scales at scale (NULL when unscaled) */
    void (*store_row)(void *dst, float *scale, const float *src, int32_t n);
    void (*load_row)(const void *src, const float *scale, float *dst, int32_t n);
} kv_type_traits;

/* The row of t, or NULL when t is no type. */
const kv_type_traits *kv_type(kv_dtype t);

/* Bytes of a stored row of n elements (rounded up to a byte), and the f32
 * scales that go with it (0 for an unscaled type). */
size_t kv_type_row_bytes(const kv_type_traits *tt, int32_t n);
int32_t kv_type_row_scales(const kv_type_traits *tt, int32_t n);

/* Whether t computes in f64 (the *_f64 calls) rather than f32. */
static inline bool kv_type_f64(kv_dtype t) { return t == KV_F64; }

/* Bytes of one stored element of a kernel type, a compile-time constant
 * where t is (the kernels' rows are whole bytes an element). */
static inline int32_t kv_elem_bytes(kv_dtype t) {
#define KV_ELEM_BYTES_(T, name, bits, scale) \
    case T: return (bits) / 8;
    switch (t) { KV_TYPES(KV_ELEM_BYTES_) default: return 0; }
#undef KV_ELEM_BYTES_
}

/* Stores n floats as `dtype` at dst (a scaled type: its scales at scale). */
void kv_store_row(kv_dtype dtype, void *dst, float *scale, const float *src, int32_t n);
/* Loads n elements of `dtype` as floats (scale: the row's scales, or NULL). */
void kv_load_row(kv_dtype dtype, const void *src, const float *scale, float *dst, int32_t n);

#endif
