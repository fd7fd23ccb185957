/* engine/gguf/gguf.h - read-only GGUF reader (versions 2 and 3, little-endian).
 *
 * The format, in order (every integer little-endian, no padding between fields
 * unless stated):
 *
 *   header    "GGUF" (4 bytes) | u32 version | u64 tensor count | u64 KV count
 *   metadata  KV count times:  string key | u32 value type | value
 *             string = u64 byte length, then the bytes (no NUL, not NUL-terminated)
 *             value  = u8 i8 u16 i16 u32 i32 f32 bool(1 byte, 0 or 1) string
 *                      u64 i64 f64, or an array: u32 element type | u64 count |
 *                      the elements back to back (strings each with their length)
 *   tensors   tensor count times: string name | u32 n_dims | u64 dims[n_dims] |
 *             u32 ggml type | u64 offset of the data, relative to the data section
 *   padding   zeros up to the next multiple of the alignment
 *   data      tensor bytes; each tensor starts at a multiple of the alignment
 *
 * The alignment is the u32 `general.alignment` if present, else 32. dims[0] is
 * the contiguous dimension: a weight matrix with `rows` outputs of `n_in`
 * inputs has dims {n_in, rows} and its data is rows x llm_row_bytes(type, n_in).
 * Version 1 (32-bit counts) is not read; big-endian files are not recognised.
 *
 * Everything the reader returns points into the file's bytes (a read-only
 * mmap or the caller's buffer): valid until llm_gguf_close, never copied.
 * llm_gguf_open* checks every count, length, type, offset and size against the
 * file before returning, so later accesses need no bounds checks. */
#ifndef LLM_GGUF_H
#define LLM_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct llm_gguf llm_gguf;

/* Metadata value types (numbering fixed by the format). */
enum {
    LLM_GGUF_U8 = 0, LLM_GGUF_I8 = 1, LLM_GGUF_U16 = 2, LLM_GGUF_I16 = 3,
    LLM_GGUF_U32 = 4, LLM_GGUF_I32 = 5, LLM_GGUF_F32 = 6, LLM_GGUF_BOOL = 7,
    LLM_GGUF_STR = 8, LLM_GGUF_ARR = 9, LLM_GGUF_U64 = 10, LLM_GGUF_I64 = 11,
    LLM_GGUF_F64 = 12,
};

/* Return codes of the getters (llm_gguf_open* return 0, -1 or -2). */
enum {
    LLM_GGUF_OK = 0,
    LLM_GGUF_ENOKEY = -1,   /* no such key */
    LLM_GGUF_ETYPE = -2,    /* the value has another type */
    LLM_GGUF_ERANGE = -3,   /* an integer value does not fit the requested type */
};

#define LLM_GGUF_MAX_DIMS 4

/* A string inside the file: `len` bytes at `ptr`, not NUL-terminated. */
typedef struct {
    const char *ptr;   /* [len] bytes */
    uint64_t len;      /* byte count */
} llm_gguf_str;

/* A metadata array; read elements with llm_gguf_arr_*. */
typedef struct {
    uint32_t type;             /* element type, LLM_GGUF_U8..F64 (never ARR) */
    uint64_t n;                /* element count */
    const uint8_t *data;       /* first element's bytes in the file (unaligned) */
    const uint64_t *str_at;    /* STR arrays: [n] file offset of each element's length
                                  field, built at open; NULL for other types */
    const uint8_t *base;       /* start of the file, for str_at */
} llm_gguf_arr;

/* One tensor, as described by its info record; filled and checked at open. */
typedef struct {
    const char *name;          /* NUL-terminated copy owned by the llm_gguf */
    int type;                  /* ggml type number, one llm_type_supported() accepts (any the
                                  format defines with LLM_GGUF_ANY_TYPE) */
    int n_dims;                /* 1..4 */
    int64_t dims[LLM_GGUF_MAX_DIMS]; /* dims[0] contiguous; entries past n_dims are 1 */
    int64_t n_elements;        /* product of dims */
    uint64_t offset;           /* data offset within the data section */
    uint64_t n_bytes;          /* size of the data */
    const void *data;          /* [n_bytes] in the file; aligned only as the file says (a
                                  file may declare alignment 1), so read fields with memcpy
                                  or through llm_dequant_row / llm_matmul_rows */
} llm_gguf_tensor;

/* ---- opening ---------------------------------------------------------- */

/* Map the file at `path` read-only and parse it. On success *out is set and 0
 * returned; on failure -1 (the bytes are no valid GGUF file) or -2 (the file
 * cannot be opened or mapped, or is no regular file), *out = NULL, and err
 * (if errlen > 0) holds one line saying what is wrong and where. */
int llm_gguf_open(const char *path, llm_gguf **out, char *err, size_t errlen);
/* Parse `size` bytes at `data` without copying them; they must stay valid and
 * unchanged until llm_gguf_close. Same results as llm_gguf_open. */
int llm_gguf_open_memory(const void *data, size_t size, llm_gguf **out, char *err, size_t errlen);
/* The same with flags: LLM_GGUF_ANY_TYPE also accepts tensors of the types
 * the format defines but the engine does not read (IQ*, Q8_K, I8..I64, F64,
 * TQ*, MXFP4), their data bounds checked with the format's block sizes: for
 * inspecting a file (kvengine.h's kve_gguf_*), never for running it. */
enum { LLM_GGUF_ANY_TYPE = 1 };
int llm_gguf_open_ex(const char *path, int flags, llm_gguf **out, char *err, size_t errlen);
int llm_gguf_open_memory_ex(const void *data, size_t size, int flags, llm_gguf **out, char *err, size_t errlen);
/* Free everything; unmap if llm_gguf_open mapped the file. NULL is fine. */
void llm_gguf_close(llm_gguf *g);
/* The pages wholly inside [p, p + n) of a file opened by llm_gguf_open are
 * given back to the kernel (madvise MADV_DONTNEED on the read-only private
 * mapping): they read the same afterwards, from the page cache or the file,
 * but stop counting in the process's memory until touched again. A no-op
 * for a caller's buffer (llm_gguf_open_memory). */
void llm_gguf_release(const llm_gguf *g, const void *p, size_t n);

uint32_t llm_gguf_version(const llm_gguf *g);
uint32_t llm_gguf_alignment(const llm_gguf *g);
uint64_t llm_gguf_data_offset(const llm_gguf *g);   /* file offset of the data section */
uint64_t llm_gguf_file_size(const llm_gguf *g);

/* ---- metadata ---------------------------------------------------------- */

int64_t llm_gguf_n_kv(const llm_gguf *g);
/* Index of `key` (keys are unique), or -1. */
int64_t llm_gguf_find_key(const llm_gguf *g, const char *key);
llm_gguf_str llm_gguf_kv_key(const llm_gguf *g, int64_t i);   /* {"", 0} if i is out of range */
int llm_gguf_kv_type(const llm_gguf *g, int64_t i);           /* value type, or -1 */
/* Entry i's value as an array: an array as it is, any other value as an
 * array of one element of its type (read with llm_gguf_arr_*). LLM_GGUF_OK,
 * or LLM_GGUF_ENOKEY for i out of range (*out untouched). */
int llm_gguf_kv_elems(const llm_gguf *g, int64_t i, llm_gguf_arr *out);

/* Typed getters: LLM_GGUF_OK and *out set, or an LLM_GGUF_E* code and *out
 * untouched. The integer getters accept any integer type whose value fits
 * (the spec lets writers pick u32 or u64 for counts); f32 and f64 accept
 * either float type; bool and string want exactly that type. */
int llm_gguf_get_u32(const llm_gguf *g, const char *key, uint32_t *out);
int llm_gguf_get_i32(const llm_gguf *g, const char *key, int32_t *out);
int llm_gguf_get_u64(const llm_gguf *g, const char *key, uint64_t *out);
int llm_gguf_get_i64(const llm_gguf *g, const char *key, int64_t *out);
int llm_gguf_get_f32(const llm_gguf *g, const char *key, float *out);
int llm_gguf_get_f64(const llm_gguf *g, const char *key, double *out);
int llm_gguf_get_bool(const llm_gguf *g, const char *key, int *out);
int llm_gguf_get_str(const llm_gguf *g, const char *key, llm_gguf_str *out);
int llm_gguf_get_arr(const llm_gguf *g, const char *key, llm_gguf_arr *out);

/* The same, returning `dflt` when the key is missing or has a wrong type. */
uint32_t llm_gguf_u32_or(const llm_gguf *g, const char *key, uint32_t dflt);
int32_t  llm_gguf_i32_or(const llm_gguf *g, const char *key, int32_t dflt);
uint64_t llm_gguf_u64_or(const llm_gguf *g, const char *key, uint64_t dflt);
float    llm_gguf_f32_or(const llm_gguf *g, const char *key, float dflt);
int      llm_gguf_bool_or(const llm_gguf *g, const char *key, int dflt);

/* Array elements. An index past the end or a type that cannot convert gives
 * 0 (or an empty string); check a.type and a.n once, then loop.
 * _i64: any integer type (u64 values above INT64_MAX give 0); bool gives 0/1.
 * _f64/_f32: either float type, or any integer type converted. */
int64_t      llm_gguf_arr_i64(const llm_gguf_arr *a, uint64_t i);
double       llm_gguf_arr_f64(const llm_gguf_arr *a, uint64_t i);
float        llm_gguf_arr_f32(const llm_gguf_arr *a, uint64_t i);
/* _u64: any integer type (negative values give 0); bool gives 0/1. */
uint64_t     llm_gguf_arr_u64(const llm_gguf_arr *a, uint64_t i);
llm_gguf_str llm_gguf_arr_str(const llm_gguf_arr *a, uint64_t i);

/* String helpers: compare with a C string; copy into buf as a C string,
 * truncating to bufsize-1 bytes (returns buf); or malloc a NUL-terminated
 * copy (NULL on out-of-memory). */
int   llm_gguf_str_eq(llm_gguf_str s, const char *c);
char *llm_gguf_str_copy(llm_gguf_str s, char *buf, size_t bufsize);
char *llm_gguf_str_dup(llm_gguf_str s);

/* A value's type name: "u32", "string", "array", ... ("?" if unknown). */
const char *llm_gguf_type_name(int vtype);

/* ---- tensors ----------------------------------------------------------- */

int64_t llm_gguf_n_tensors(const llm_gguf *g);
/* Tensor i in file order, or NULL if i is out of range. */
const llm_gguf_tensor *llm_gguf_tensor_at(const llm_gguf *g, int64_t i);
/* Tensor by exact name (names are unique), or NULL. O(log n). */
const llm_gguf_tensor *llm_gguf_find_tensor(const llm_gguf *g, const char *name);

#endif
