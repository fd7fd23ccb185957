/* tests/gguf_writer.h - build GGUF v3 files for tests, in memory or on disk.
 *
 *     gw *w = gw_new();
 *     gw_add_str(w, "general.architecture", "llama");
 *     gw_add_u32(w, "llama.block_count", 2);
 *     gw_add_arr_str(w, "tokenizer.ggml.tokens", tokens, n_vocab);
 *     int64_t dims[2] = {n_embd, n_vocab};          // dims[0] is the row length
 *     gw_add_tensor_f32(w, "token_embd.weight", GW_Q8_0, 2, dims, values);
 *     if (gw_write_file(w, path) != 0) ... gw_error(w) says why
 *     gw_free(w);
 *
 * Values are copied when added; tensors are laid out in the order added, each
 * at the next multiple of the alignment. Quantized tensors are made with the
 * simple reference quantizers below (written from the format definitions,
 * independent of engine/weights/quant.c): valid blocks, not the most accurate ones.
 *
 * Errors (out of memory, a type that cannot hold the dims in
 * gw_add_tensor_f32, a missing tensor name) are sticky: later calls do nothing, gw_to_memory/gw_write_file fail, gw_error
 * returns the first message. The writer does not reject what the format
 * forbids (duplicate names, n_dims > 4, unknown types, odd offsets via
 * gw_set_tensor_offset) so tests can write malformed files on purpose. */
#ifndef GGUF_WRITER_H
#define GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

/* Tensor types (ggml numbering). */
enum { GW_F32 = 0, GW_F16 = 1, GW_Q4_0 = 2, GW_Q4_1 = 3, GW_Q5_0 = 6, GW_Q5_1 = 7, GW_Q8_0 = 8, GW_Q2_K = 10, GW_Q3_K = 11,
       GW_Q4_K = 12, GW_Q5_K = 13, GW_Q6_K = 14, GW_BF16 = 30 };

/* Metadata value types (GGUF numbering). */
enum { GW_U8 = 0, GW_I8 = 1, GW_U16 = 2, GW_I16 = 3, GW_U32 = 4, GW_I32 = 5,
       GW_F32V = 6, GW_BOOL = 7, GW_STR = 8, GW_ARR = 9, GW_U64 = 10, GW_I64 = 11,
       GW_F64V = 12 };

typedef struct gw gw;

gw *gw_new(void);                     /* NULL only when out of memory */
void gw_free(gw *w);                  /* NULL is fine */
const char *gw_error(const gw *w);    /* first error, or NULL */

/* Format knobs. The alignment is written as general.alignment (u32) when set;
 * without it readers assume 32. The version defaults to 3. */
void gw_set_alignment(gw *w, uint32_t alignment);
void gw_set_version(gw *w, uint32_t version);

/* Scalar metadata. */
void gw_add_u8(gw *w, const char *key, uint8_t v);
void gw_add_i8(gw *w, const char *key, int8_t v);
void gw_add_u16(gw *w, const char *key, uint16_t v);
void gw_add_i16(gw *w, const char *key, int16_t v);
void gw_add_u32(gw *w, const char *key, uint32_t v);
void gw_add_i32(gw *w, const char *key, int32_t v);
void gw_add_u64(gw *w, const char *key, uint64_t v);
void gw_add_i64(gw *w, const char *key, int64_t v);
void gw_add_f32(gw *w, const char *key, float v);
void gw_add_f64(gw *w, const char *key, double v);
void gw_add_bool(gw *w, const char *key, int v);
void gw_add_str(gw *w, const char *key, const char *s);
void gw_add_strn(gw *w, const char *key, const char *s, size_t len);   /* any bytes */

/* Arrays. gw_add_arr takes n elements of a fixed-size type laid out as in C
 * (uint8_t[], int32_t[], float[], double[], ...; bools as uint8_t 0/1). */
void gw_add_arr(gw *w, const char *key, int elem_type, uint64_t n, const void *values);
void gw_add_arr_str(gw *w, const char *key, const char *const *strs, uint64_t n);
void gw_add_arr_f32(gw *w, const char *key, const float *v, uint64_t n);
void gw_add_arr_i32(gw *w, const char *key, const int32_t *v, uint64_t n);
void gw_add_arr_u32(gw *w, const char *key, const uint32_t *v, uint64_t n);

/* A tensor from raw block bytes. nbytes is taken as given, unchecked, so a
 * test can write a size that does not match the dims (gw_tensor_bytes says
 * the right one). dims[0] is the contiguous dimension; n_dims may be 1..8. */
void gw_add_tensor(gw *w, const char *name, int type, int n_dims, const int64_t *dims,
                   const void *data, size_t nbytes);
/* A tensor from f32 values (product of dims of them), quantized to type. */
void gw_add_tensor_f32(gw *w, const char *name, int type, int n_dims, const int64_t *dims,
                       const float *values);
/* For malformed-file tests: write `offset` in the tensor's info instead of
 * where its data really goes. */
void gw_set_tensor_offset(gw *w, const char *name, uint64_t offset);

/* The file as a malloc'ed buffer (caller frees), or NULL on error. */
void *gw_to_memory(gw *w, size_t *size);
/* Write the file; 0 on success. */
int gw_write_file(gw *w, const char *path);

/* ---- reference format helpers (also for tests that build blocks) ---- */

/* Bytes of a tensor of the given type and dims (row = dims[0]); 0 if the type
 * is not one of the above or dims[0] is not a whole number of blocks. */
size_t gw_tensor_bytes(int type, int n_dims, const int64_t *dims);
/* Quantize n values (a whole number of blocks) into dst; 0 on success. */
int gw_quantize(int type, const float *src, void *dst, int64_t n);
/* Half and bfloat16 conversions: the project's one copy, kv_f32_to_f16,
 * kv_f16_to_f32, kv_f32_to_bf16 (checked against an f64 oracle for every half
 * in test_quant.c). */
#include "../src/half.h"

#endif
