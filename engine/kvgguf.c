/* engine/kvgguf.c - the public API's GGUF inspector (include/kvengine.h,
 * "GGUF files"): the reader of engine/gguf behind an opaque handle, with
 * NUL-terminated copies of the keys, and the hyperparameters as the model
 * loader reads them. */
#include "kvengine.h"

#include "gguf/gguf.h"
#include "model/model.h"
#include "status.h"
#include "weights/quant.h"

#include <stdlib.h>
#include <string.h>

_Static_assert((int)KVE_GGUF_U8 == (int)LLM_GGUF_U8 && (int)KVE_GGUF_STRING == (int)LLM_GGUF_STR &&
                   (int)KVE_GGUF_ARRAY == (int)LLM_GGUF_ARR && (int)KVE_GGUF_F64 == (int)LLM_GGUF_F64 &&
                   (int)KVE_GGUF_MAX_DIMS == LLM_GGUF_MAX_DIMS,
               "the format's numbering");

struct kve_gguf {
    llm_gguf *g;
    char **keys;   /* [n_kv] NUL-terminated copies, into one block at keys[0] */
};

/* Wraps an open reader (taken over: closed on failure). */
static int wrap(llm_gguf *r, kve_gguf **out, char *err, size_t errlen) {
    const int64_t n = llm_gguf_n_kv(r);
    size_t bytes = 1;
    for (int64_t i = 0; i < n; i++) bytes += (size_t)llm_gguf_kv_key(r, i).len + 1;   /* within the file */
    kve_gguf *g = calloc(1, sizeof *g);
    char **keys = g ? malloc(sizeof *keys * (size_t)(n ? n : 1)) : NULL;
    char *block = keys ? malloc(bytes) : NULL;
    if (!block) {
        free(keys), free(g);
        llm_gguf_close(r);
        return llm_errf(err, errlen, KVE_ERR_NOMEM, "out of memory for %lld metadata keys", (long long)n);
    }
    for (int64_t i = 0; i < n; i++) {
        llm_gguf_str k = llm_gguf_kv_key(r, i);
        keys[i] = llm_gguf_str_copy(k, block, (size_t)k.len + 1);
        block += k.len + 1;
    }
    if (!n) keys[0] = block;
    g->g = r, g->keys = keys;
    *out = g;
    return KVE_OK;
}

int kve_gguf_open(const char *path, kve_gguf **out, char *err, size_t errlen) {
    if (!out) return llm_errf(err, errlen, KVE_ERR_NULL, "missing argument");
    *out = NULL;
    if (!path) return llm_errf(err, errlen, KVE_ERR_NULL, "no path");
    llm_gguf *r;
    int rc = llm_gguf_open_ex(path, LLM_GGUF_ANY_TYPE, &r, err, errlen);
    if (rc) return rc == -2 ? KVE_ERR_IO : KVE_ERR_MODEL;
    return wrap(r, out, err, errlen);
}

int kve_gguf_open_memory(const void *data, size_t size, kve_gguf **out, char *err, size_t errlen) {
    if (!out) return llm_errf(err, errlen, KVE_ERR_NULL, "missing argument");
    *out = NULL;
    if (!data && size) return llm_errf(err, errlen, KVE_ERR_NULL, "no data");
    llm_gguf *r;
    if (llm_gguf_open_memory_ex(data, size, LLM_GGUF_ANY_TYPE, &r, err, errlen)) return KVE_ERR_MODEL;
    return wrap(r, out, err, errlen);
}

void kve_gguf_close(kve_gguf *g) {
    if (!g) return;
    free(g->keys[0]);
    free(g->keys);
    llm_gguf_close(g->g);
    free(g);
}

kve_gguf_info kve_gguf_get_info(const kve_gguf *g) {
    if (!g) return (kve_gguf_info){0};
    return (kve_gguf_info){.version = llm_gguf_version(g->g), .alignment = llm_gguf_alignment(g->g),
                           .data_offset = llm_gguf_data_offset(g->g), .file_size = llm_gguf_file_size(g->g),
                           .n_kv = llm_gguf_n_kv(g->g), .n_tensors = llm_gguf_n_tensors(g->g)};
}

const char *kve_gguf_type_name(int type) { return llm_gguf_type_name(type); }

int kve_gguf_kv_at(const kve_gguf *g, int64_t i, kve_gguf_kv *out) {
    if (!g || !out) return KVE_ERR_NULL;
    llm_gguf_arr a;
    if (llm_gguf_kv_elems(g->g, i, &a) != LLM_GGUF_OK) return KVE_ERR_PARAM;
    *out = (kve_gguf_kv){.key = g->keys[i], .key_len = (size_t)llm_gguf_kv_key(g->g, i).len,
                         .type = llm_gguf_kv_type(g->g, i), .elem_type = (int)a.type, .n = a.n};
    return KVE_OK;
}

int64_t kve_gguf_find_key(const kve_gguf *g, const char *key) {
    return g && key ? llm_gguf_find_key(g->g, key) : -1;
}

int kve_gguf_value_at(const kve_gguf *g, int64_t i, uint64_t elem, kve_gguf_value *out) {
    if (!g || !out) return KVE_ERR_NULL;
    llm_gguf_arr a;
    if (llm_gguf_kv_elems(g->g, i, &a) != LLM_GGUF_OK || elem >= a.n) return KVE_ERR_PARAM;
    kve_gguf_value v = {.type = (int)a.type};
    if (a.type == LLM_GGUF_STR) {
        llm_gguf_str s = llm_gguf_arr_str(&a, elem);
        v.str = s.ptr, v.len = (size_t)s.len;
    } else {
        v.f = llm_gguf_arr_f64(&a, elem);
        if (a.type != LLM_GGUF_F32 && a.type != LLM_GGUF_F64) {
            v.i = llm_gguf_arr_i64(&a, elem);
            v.u = llm_gguf_arr_u64(&a, elem);
        }
    }
    *out = v;
    return KVE_OK;
}

int kve_gguf_tensor_at(const kve_gguf *g, int64_t i, kve_gguf_tensor *out) {
    if (!g || !out) return KVE_ERR_NULL;
    const llm_gguf_tensor *t = llm_gguf_tensor_at(g->g, i);
    if (!t) return KVE_ERR_PARAM;
    kve_gguf_tensor o = {.name = t->name, .type = t->type, .type_name = llm_type_name(t->type),
                         .n_dims = t->n_dims, .offset = t->offset, .n_bytes = t->n_bytes};
    memcpy(o.dims, t->dims, sizeof o.dims);
    *out = o;
    return KVE_OK;
}

int64_t kve_gguf_find_tensor(const kve_gguf *g, const char *name) {
    const llm_gguf_tensor *t = g && name ? llm_gguf_find_tensor(g->g, name) : NULL;
    return t ? t - llm_gguf_tensor_at(g->g, 0) : -1;
}

int kve_gguf_hparams(const kve_gguf *g, kve_hparams *out, char *err, size_t errlen) {
    if (!g || !out) return llm_errf(err, errlen, KVE_ERR_NULL, "missing argument");
    llm_hparams hp;
    int rc = llm_hparams_read(g->g, &hp, err, errlen);
    if (rc != LLM_OK) return rc;
    *out = (kve_hparams){.n_vocab = hp.n_vocab, .dim = hp.dim, .n_layers = hp.n_layers, .n_heads = hp.n_heads,
                         .n_kv_heads = hp.n_kv_heads, .head_dim = hp.head_dim, .ffn_dim = hp.ffn_dim,
                         .ctx_train = hp.ctx_train, .norm_eps = hp.norm_eps, .rope = hp.rope};
    return KVE_OK;
}
