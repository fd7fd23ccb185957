/* engine/model/model.c - loading a model: the architecture from
 * general.architecture (the table below), its hyperparameters and tensors
 * through its llm_arch (engine/arch_*.c), the tokenizer and chat format from
 * the `tokenizer.*` keys; the helpers architecture files load with; the
 * accessors programs read a model through. Contexts and the forward pass are
 * in context.c, the layer pieces in layers.c. */
#include "arch.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../weights/quant.h"
#include "../text/tokenizer_gguf.h"

/* ---------------------------------------------------------------- architectures */

static const llm_arch *const archs[] = {&llm_arch_llama, &llm_arch_gemma3, &llm_arch_qwen2, &llm_arch_qwen3,
                                        &llm_arch_phi3};

const llm_arch *llm_arch_find(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strlen(archs[i]->name) == len && !memcmp(archs[i]->name, name, len)) return archs[i];
    return NULL;
}

const char *llm_arch_names(void) {
    return "'llama': Llama, SmolLM2, TinyLlama, Mistral; 'gemma3': Gemma 3; 'qwen2': Qwen2, Qwen2.5; 'qwen3': Qwen3; "
           "'phi3': Phi-3 (4k context)";
}

static const llm_arch *arch_of(const llm_gguf *g, char *err, size_t errlen) {
    llm_gguf_str arch;
    if (llm_gguf_get_str(g, "general.architecture", &arch) != LLM_GGUF_OK) {
        llm_errf(err, errlen, LLM_ERR_MODEL, "missing general.architecture: not a model file?");
        return NULL;
    }
    const llm_arch *a = llm_arch_find(arch.ptr, (size_t)arch.len);
    if (!a) {
        char s[64];
        llm_errf(err, errlen, LLM_ERR_MODEL, "architecture '%s' is not supported (only %s)",
                 llm_gguf_str_copy(arch, s, sizeof s), llm_arch_names());
    }
    return a;
}

/* ---------------------------------------------------------------- hyperparameters */

/* A required positive count; limits keep every later product (rows x cols,
 * scratch sizes) far inside int64 and int32 where it matters. */
int llm_read_count(const llm_gguf *g, const char *key, int32_t lo, int32_t hi, int32_t *out, char *err,
                   size_t errlen) {
    uint32_t v;
    int rc = llm_gguf_get_u32(g, key, &v);
    if (rc == LLM_GGUF_ENOKEY) return llm_errf(err, errlen, LLM_ERR_MODEL, "missing metadata key %s", key);
    if (rc != LLM_GGUF_OK) return llm_errf(err, errlen, LLM_ERR_MODEL, "metadata key %s is not an unsigned integer", key);
    if (v < (uint32_t)lo || v > (uint32_t)hi)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "%s = %u is outside [%d, %d]", key, v, lo, hi);
    *out = (int32_t)v;
    return LLM_OK;
}

int llm_read_opt_count(const llm_gguf *g, const char *key, int32_t lo, int32_t hi, int32_t *out, char *err,
                       size_t errlen) {
    if (llm_gguf_find_key(g, key) < 0) return LLM_OK;
    return llm_read_count(g, key, lo, hi, out, err, errlen);
}

int llm_read_common_hparams(const llm_gguf *g, const char *prefix, llm_hparams *hp, char *err, size_t errlen) {
    memset(hp, 0, sizeof *hp);
    char k[8][96];
    static const char *const keys[8] = {"block_count", "embedding_length", "feed_forward_length",
                                        "attention.head_count", "attention.head_count_kv", "context_length",
                                        "attention.key_length", "attention.value_length"};
    for (int i = 0; i < 8; i++) snprintf(k[i], sizeof k[i], "%s.%s", prefix, keys[i]);
    if (llm_read_count(g, k[0], 1, 1024, &hp->n_layers, err, errlen) ||
        llm_read_count(g, k[1], 1, 1 << 16, &hp->dim, err, errlen) ||
        llm_read_count(g, k[2], 1, 1 << 18, &hp->ffn_dim, err, errlen) ||
        llm_read_count(g, k[3], 1, 1024, &hp->n_heads, err, errlen))
        return LLM_ERR_MODEL;
    hp->n_kv_heads = hp->n_heads;
    hp->ctx_train = 2048;
    if (llm_read_opt_count(g, k[4], 1, 1024, &hp->n_kv_heads, err, errlen) ||
        llm_read_opt_count(g, k[5], 1, INT32_MAX, &hp->ctx_train, err, errlen))
        return LLM_ERR_MODEL;
    if (hp->n_heads % hp->n_kv_heads)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "head_count %d is not a multiple of head_count_kv %d",
                        hp->n_heads, hp->n_kv_heads);
    /* head size: key_length when given (it may differ from D / H), else D / H */
    if (llm_gguf_find_key(g, k[6]) >= 0) {
        int32_t vl = -1;
        if (llm_read_count(g, k[6], 2, KV_MAX_HEAD_DIM, &hp->head_dim, err, errlen)) return LLM_ERR_MODEL;
        vl = hp->head_dim;
        if (llm_read_opt_count(g, k[7], 1, KV_MAX_HEAD_DIM, &vl, err, errlen)) return LLM_ERR_MODEL;
        if (vl != hp->head_dim)
            return llm_errf(err, errlen, LLM_ERR_MODEL, "value_length %d differs from key_length %d: not supported",
                            vl, hp->head_dim);
    } else {
        if (hp->dim % hp->n_heads)
            return llm_errf(err, errlen, LLM_ERR_MODEL, "embedding_length %d is not a multiple of head_count %d",
                            hp->dim, hp->n_heads);
        hp->head_dim = hp->dim / hp->n_heads;
    }
    if (hp->head_dim > KV_MAX_HEAD_DIM || hp->head_dim % 2)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "head size %d: must be even and at most %d", hp->head_dim,
                        KV_MAX_HEAD_DIM);
    char key[96];
    float eps;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", prefix);
    if (llm_gguf_get_f32(g, key, &eps) != LLM_GGUF_OK)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "missing %s (a float)", key);
    if (!(eps > 0 && eps < 1)) return llm_errf(err, errlen, LLM_ERR_MODEL, "layer_norm_rms_epsilon %g is not in (0, 1)", eps);
    hp->norm_eps = eps;

    hp->rope = kv_rope_default_params(hp->head_dim);
    float theta = 10000.0f;
    snprintf(key, sizeof key, "%s.rope.freq_base", prefix);
    if (llm_gguf_find_key(g, key) >= 0 && llm_gguf_get_f32(g, key, &theta) != LLM_GGUF_OK)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "%s is not a float", key);
    if (!(theta > 1)) return llm_errf(err, errlen, LLM_ERR_MODEL, "%s %g must be > 1", key, theta);
    hp->rope.theta = theta;
    int32_t rot = hp->head_dim;
    snprintf(key, sizeof key, "%s.rope.dimension_count", prefix);
    if (llm_read_opt_count(g, key, 2, hp->head_dim, &rot, err, errlen)) return LLM_ERR_MODEL;
    if (rot % 2) return llm_errf(err, errlen, LLM_ERR_MODEL, "%s %d is odd", key, rot);
    hp->rope.rot_dim = rot;
    llm_gguf_str st;
    snprintf(key, sizeof key, "%s.rope.scaling.type", prefix);
    if (llm_gguf_get_str(g, key, &st) == LLM_GGUF_OK && !llm_gguf_str_eq(st, "none")) {
        /* Llama 3.1 files say nothing here and carry rope_freqs.weight instead
         * (handled at load); linear and YaRN rescale positions, which the
         * library's RoPE does not do. */
        char s[32];
        snprintf(key, sizeof key, "%s.rope.scaling.factor", prefix);
        float factor = llm_gguf_f32_or(g, key, 1.0f);
        if (factor != 1.0f)
            return llm_errf(err, errlen, LLM_ERR_MODEL, "%s.rope.scaling.type '%s' (factor %g) is not supported",
                            prefix, llm_gguf_str_copy(st, s, sizeof s), factor);
    }
    kv_rope r;
    if (kv_rope_init(&r, &hp->rope) != KV_OK)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "RoPE parameters rejected by the library");

    hp->n_vocab = 0;
    llm_gguf_arr toks;
    if (llm_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks) == LLM_GGUF_OK) {
        if (toks.n == 0 || toks.n > (1u << 24))
            return llm_errf(err, errlen, LLM_ERR_MODEL, "tokenizer.ggml.tokens has %llu entries",
                            (unsigned long long)toks.n);
        hp->n_vocab = (int32_t)toks.n;
    } else {
        snprintf(key, sizeof key, "%s.vocab_size", prefix);
        if (llm_read_opt_count(g, key, 1, 1 << 24, &hp->n_vocab, err, errlen)) return LLM_ERR_MODEL;
    }
    return LLM_OK;
}

int llm_hparams_read(const llm_gguf *g, llm_hparams *hp, char *err, size_t errlen) {
    memset(hp, 0, sizeof *hp);
    const llm_arch *a = arch_of(g, err, errlen);
    return a ? a->read_hparams(g, hp, err, errlen) : LLM_ERR_MODEL;
}

/* ---------------------------------------------------------------- tensors */

static void shape_str(const llm_gguf_tensor *t, char *buf, size_t n) {
    int k = snprintf(buf, n, "[");
    for (int i = 0; i < t->n_dims && k < (int)n; i++)
        k += snprintf(buf + k, n - (size_t)k, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
    if (k < (int)n) snprintf(buf + k, n - (size_t)k, "]");
}

int llm_load_matrix(const llm_gguf *g, const char *name, int64_t rows, int64_t cols, llm_matrix *out,
                    char *err, size_t errlen) {
    const llm_gguf_tensor *t = llm_gguf_find_tensor(g, name);
    if (!t) return llm_errf(err, errlen, LLM_ERR_MODEL, "missing tensor %s", name);
    char s[96];
    shape_str(t, s, sizeof s);
    if (t->n_dims > 2 || t->dims[0] != cols || t->dims[1] != rows)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "tensor %s has shape %s, expected [%lld, %lld]", name, s,
                        (long long)cols, (long long)rows);
    if (!llm_type_supported(t->type) || llm_row_bytes(t->type, cols) <= 0)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "tensor %s: type %s cannot hold rows of %lld", name,
                        llm_type_name(t->type) ? llm_type_name(t->type) : "?", (long long)cols);
    *out = (llm_matrix){.type = t->type, .data = t->data, .rows = rows, .cols = cols};
    return LLM_OK;
}

int llm_load_vector(const llm_gguf *g, const char *name, int64_t n, float *dst, char *err, size_t errlen) {
    const llm_gguf_tensor *t = llm_gguf_find_tensor(g, name);
    if (!t) return llm_errf(err, errlen, LLM_ERR_MODEL, "missing tensor %s", name);
    char s[96];
    shape_str(t, s, sizeof s);
    if (t->dims[0] != n || t->n_elements != n)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "tensor %s has shape %s, expected [%lld]", name, s, (long long)n);
    if (llm_dequant_row(t->type, t->data, dst, n) != 0)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "tensor %s: type %s cannot be decoded", name,
                        llm_type_name(t->type) ? llm_type_name(t->type) : "?");
    return LLM_OK;
}

/* Llama 3.1 files carry the scaled frequencies as rope_freqs.weight: one
 * divisor per rotated pair, applied to the plain theta frequencies. */
int llm_load_rope(llm_model *m, int32_t i, const kv_rope_params *params, int use_freqs, char *err,
                  size_t errlen) {
    kv_rope *r = &m->ropes[i];
    if (kv_rope_init(r, params) != KV_OK) return llm_errf(err, errlen, LLM_ERR_MODEL, "bad RoPE parameters");
    if (m->n_ropes < i + 1) m->n_ropes = i + 1;
    const llm_gguf_tensor *t = llm_gguf_find_tensor(m->gguf, "rope_freqs.weight");
    if (!t || !use_freqs) return LLM_OK;
    int32_t half = params->rot_dim / 2;
    float f[KV_MAX_HEAD_DIM / 2];
    if (llm_load_vector(m->gguf, "rope_freqs.weight", half, f, err, errlen)) return LLM_ERR_MODEL;
    for (int32_t k = 0; k < half; k++) {
        if (!(f[k] > 0))
            return llm_errf(err, errlen, LLM_ERR_MODEL, "rope_freqs.weight[%d] = %g is not positive", (int)k, f[k]);
        r->inv_freq[k] /= f[k];
    }
    m->rope_freqs_used = 1;
    return LLM_OK;
}

int llm_layers_one_group(llm_model *m, int32_t window) {
    m->lhp = calloc((size_t)m->hp.n_layers, sizeof *m->lhp);
    if (!m->lhp) return LLM_ERR_NOMEM;
    for (int32_t l = 0; l < m->hp.n_layers; l++)
        m->lhp[l] = (llm_layer_hparams){.group = 0, .group_layer = l, .window = window};
    m->n_groups = 1;
    m->groups[0] = (llm_cache_group){.n_layers = m->hp.n_layers, .window = window};
    return LLM_OK;
}

void llm_matrix_split(llm_matrix *whole, int64_t at, llm_matrix *rest) {
    *rest = *whole;
    rest->data = (const uint8_t *)whole->data + (size_t)at * (size_t)llm_row_bytes(whole->type, whole->cols);
    rest->rows = whole->rows - at;
    whole->rows = at;
}

static int64_t size_of(const llm_hparams *hp, llm_size s) {
    switch (s) {
    case LLM_SZ_D: return hp->dim;
    case LLM_SZ_HEAD: return hp->head_dim;
    case LLM_SZ_Q: return (int64_t)hp->n_heads * hp->head_dim;
    case LLM_SZ_KV: return (int64_t)hp->n_kv_heads * hp->head_dim;
    case LLM_SZ_F: return hp->ffn_dim;
    case LLM_SZ_QKV: return (int64_t)(hp->n_heads + 2 * hp->n_kv_heads) * hp->head_dim;
    case LLM_SZ_2F: return 2 * (int64_t)hp->ffn_dim;
    case LLM_SZ_NONE: break;
    }
    return 0;
}

/* Layer l's entries of the table; vectors decoded into norms onwards. */
static int load_layer(llm_model *m, int32_t l, const llm_tensor_desc *table, int n, float *norms, char *err,
                      size_t errlen) {
    char *w = (char *)&m->layers[l];
    for (int i = 0; i < n; i++) {
        const llm_tensor_desc *t = &table[i];
        char name[96];
        snprintf(name, sizeof name, "blk.%d.%s", (int)l, t->suffix);
        const int64_t rows = size_of(&m->hp, t->rows), cols = size_of(&m->hp, t->cols);
        if (t->optional && !llm_gguf_find_tensor(m->gguf, name)) continue;
        if (t->cols == LLM_SZ_NONE) {
            if (llm_load_vector(m->gguf, name, rows, norms, err, errlen)) return LLM_ERR_MODEL;
            const float *v = norms;
            memcpy(w + t->field, &v, sizeof v);
            norms += rows;
        } else if (llm_load_matrix(m->gguf, name, rows, cols, (llm_matrix *)(void *)(w + t->field), err, errlen)) {
            return LLM_ERR_MODEL;
        }
    }
    return LLM_OK;
}

int llm_load_layers(llm_model *m, const llm_tensor_desc *table, int n, char *err, size_t errlen) {
    const llm_hparams *hp = &m->hp;
    m->table = table, m->n_table = n;
    uint64_t per_layer = 0;   /* floats of the layer's vectors, optional ones included */
    for (int i = 0; i < n; i++)
        if (table[i].cols == LLM_SZ_NONE) per_layer += (uint64_t)size_of(hp, table[i].rows);
    const uint64_t floats = per_layer * (uint64_t)hp->n_layers + (uint64_t)hp->dim;
    /* the vectors are in the file at >= half a byte per element: a header
     * claiming more cannot be right, and must not make us allocate */
    if (floats / 2 > llm_gguf_file_size(m->gguf))
        return llm_errf(err, errlen, LLM_ERR_MODEL, "the file (%llu bytes) is too small for %d layers of width %d",
                        (unsigned long long)llm_gguf_file_size(m->gguf), (int)hp->n_layers, (int)hp->dim);
    m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
    m->norms = malloc(sizeof(float) * (size_t)floats);
    if (!m->layers || !m->norms) return llm_errf(err, errlen, LLM_ERR_NOMEM, "out of memory");
    for (int32_t l = 0; l < hp->n_layers; l++)
        if (load_layer(m, l, table, n, m->norms + (size_t)per_layer * (size_t)l, err, errlen)) return LLM_ERR_MODEL;
    float *onorm = m->norms + (size_t)per_layer * (size_t)hp->n_layers;
    if (llm_load_vector(m->gguf, "output_norm.weight", hp->dim, onorm, err, errlen)) return LLM_ERR_MODEL;
    m->output_norm = onorm;
    return LLM_OK;
}

/* 1 if `name` is a tensor m's architecture reads (or may ignore) */
static int tensor_known(const llm_model *m, const char *name) {
    static const char *const top[] = {"token_embd.weight", "output.weight", "output_norm.weight"};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (!strcmp(name, top[i])) return 1;
    if (!strcmp(name, "rope_freqs.weight")) return m->rope_freqs_used;
    if (strncmp(name, "blk.", 4) != 0) return 0;
    const char *p = name + 4;
    int64_t l = 0;
    if (!(*p >= '0' && *p <= '9') || (*p == '0' && p[1] != '.')) return 0;   /* as load_layer names them */
    while (*p >= '0' && *p <= '9' && l < INT32_MAX) l = l * 10 + (*p++ - '0');
    if (*p != '.' || l >= m->hp.n_layers) return 0;
    const char *suffix = p + 1;
    if (!strcmp(suffix, "attn_rot_embd.weight")) return 1;
    for (int i = 0; i < m->n_table; i++)
        if (!strcmp(suffix, m->table[i].suffix)) return 1;
    return 0;
}

int llm_check_tensors(const llm_model *m, char *err, size_t errlen) {
    const int64_t n = llm_gguf_n_tensors(m->gguf);
    int64_t unknown = 0;
    const char *first = NULL;
    for (int64_t i = 0; i < n; i++) {
        const char *name = llm_gguf_tensor_at(m->gguf, i)->name;
        if (!tensor_known(m, name) && !unknown++) first = name;
    }
    if (!unknown) return LLM_OK;
    if (unknown == 1)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "tensor %s is not one the %s architecture reads", first,
                        m->arch->name);
    return llm_errf(err, errlen, LLM_ERR_MODEL, "tensor %s and %lld more are not ones the %s architecture reads",
                    first, (long long)(unknown - 1), m->arch->name);
}

/* ---------------------------------------------------------------- tokenizer */

static int load_tokenizer(llm_model *m, char *err, size_t errlen) {
    llm_vocab_desc v;
    int rc = llm_vocab_desc_read(m->gguf, &v, err, errlen);
    if (rc != LLM_OK) return rc;
    char terr[200];
    if (llm_tokenizer_create(&v.desc, &m->tok, terr, sizeof terr) != 0)
        rc = llm_errf(err, errlen, LLM_ERR_MODEL, "tokenizer: %s", terr);
    llm_vocab_desc_free(&v);
    return rc;
}

static void load_chat_format(llm_model *m) {
    llm_gguf_str t;
    char bos[64] = "<s>", eos[64] = "</s>";
    int32_t len, b = llm_tokenizer_bos(m->tok), e = llm_tokenizer_eos(m->tok);
    const char *p;
    if (b >= 0 && (p = llm_token_piece(m->tok, b, &len)) && len < (int32_t)sizeof bos)
        memcpy(bos, p, (size_t)len), bos[len] = 0;
    if (e >= 0 && (p = llm_token_piece(m->tok, e, &len)) && len < (int32_t)sizeof eos)
        memcpy(eos, p, (size_t)len), eos[len] = 0;
    if (llm_gguf_get_str(m->gguf, "tokenizer.chat_template", &t) == LLM_GGUF_OK) {
        char *tmpl = llm_gguf_str_dup(t);
        int rc = tmpl ? llm_chat_format_from_template(tmpl, bos, eos, &m->chat) : -1;
        free(tmpl);
        if (rc == 0) return;
    }
    llm_chat_format_from_vocab(m->tok, &m->chat);
}

/* ---------------------------------------------------------------- the model */

int llm_model_load(const char *path, llm_model **out, char *err, size_t errlen) {
    *out = NULL;
    llm_gguf *g;
    char gerr[256];
    if (llm_gguf_open(path, &g, gerr, sizeof gerr) != 0) return llm_errf(err, errlen, LLM_ERR_MODEL, "%s", gerr);
    const char *slash = strrchr(path, '/');
    return llm_model_from_gguf(g, slash ? slash + 1 : path, out, err, errlen);
}

/* Every matrix of a packed type gets its rows in groups of 8 (quant.h,
 * llm_pack_rows), the form integer-activation products read fastest, in one
 * allocation instead of the mapped pages. Unless KVCACHE_PACK=0; without
 * the memory the products read the mapped rows, with the same results. */
enum { PER_LAYER = 7 };

/* The matrices every token's forward pass multiplies, [n_layers * PER_LAYER + 1]:
 * each layer's projections, then the output (slots a layer lacks: no rows) */
static llm_matrix *product_matrix(llm_model *m, size_t i) {
    if (i == (size_t)m->hp.n_layers * PER_LAYER) return &m->output;
    llm_layer_weights *w = &m->layers[i / PER_LAYER];
    llm_matrix *mine[PER_LAYER] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
    return mine[i % PER_LAYER];
}

uint64_t llm_model_streamed_bytes(const llm_model *m) {
    uint64_t bytes = 0;
    for (size_t i = 0; i <= (size_t)m->hp.n_layers * PER_LAYER; i++) {
        const llm_matrix *w = product_matrix((llm_model *)m, i);
        if (w->rows > 0)
            bytes += w->packed ? (uint64_t)llm_packed_bytes(w->type, w->rows, w->cols)
                               : (uint64_t)w->rows * (uint64_t)llm_row_bytes(w->type, w->cols);
    }
    return bytes;
}

/* Bytes of a product matrix pack_weights copies as it is: one the integer
 * products read (llm_type_int8) and that has no packed layout; 0 else */
static uint64_t plain_copy_bytes(const llm_matrix *w) {
    if (w->rows <= 0 || !llm_type_int8(w->type) || llm_packed_bytes(w->type, w->rows, w->cols)) return 0;
    const int64_t rb = llm_row_bytes(w->type, w->cols);
    return rb > 0 ? (uint64_t)w->rows * (uint64_t)rb : 0;
}

static void pack_weights(llm_model *m) {
    const char *env = getenv("KVCACHE_PACK");
    if (env && !strcmp(env, "0")) return;
    size_t n = (size_t)m->hp.n_layers * PER_LAYER + 1;
    llm_matrix **all = malloc(n * sizeof *all);
    if (!all) return;
    for (size_t i = 0; i < n; i++) all[i] = product_matrix(m, i);
    uint64_t bytes = 0, copied = 0;
    for (size_t i = 0; i < n; i++) {
        bytes += (uint64_t)llm_packed_bytes(all[i]->type, all[i]->rows, all[i]->cols);
        copied += plain_copy_bytes(all[i]);
    }
    /* in 2 MiB pages where the kernel gives them (transparent huge pages on
     * madvise): 512 times fewer page faults to fill it, TLB misses to stream
     * it. The integer products' matrices that are not packed (Q5_K, Q3_K)
     * are copied there as they are, for the same TLB misses (the file's
     * mapping has 4 KB pages; figures in docs/PERFORMANCE.md). */
    const size_t huge = (size_t)2 << 20;
    const uint64_t all_bytes = bytes + copied;
    void *mem = all_bytes && all_bytes < SIZE_MAX - huge
                    ? aligned_alloc(huge, (size_t)(all_bytes + huge - 1) / huge * huge)
                    : NULL;
#ifdef MADV_HUGEPAGE
    if (mem) madvise(mem, (size_t)(all_bytes + huge - 1) / huge * huge, MADV_HUGEPAGE);
#endif
    if (mem) {
        uint8_t *p = mem;
        for (size_t i = 0; i < n; i++) {
            llm_matrix *w = all[i];
            const int64_t b = llm_packed_bytes(w->type, w->rows, w->cols), c = (int64_t)plain_copy_bytes(w);
            const void *mapped = w->data;
            if (b && llm_pack_rows(w->type, w->data, w->rows, w->cols, p) == 0) {
                w->packed = p;
                p += b;
            } else if (c) {
                memcpy(p, w->data, (size_t)c);
                w->data = p;
                p += c;
            } else {
                continue;
            }
            /* the mapped rows are read again only by f32 products and
             * embedding lookups, which fault in what they need */
            llm_gguf_release(m->gguf, mapped, (size_t)(w->rows * llm_row_bytes(w->type, w->cols)));
        }
        m->packed = mem, m->packed_bytes = bytes;
    }
    free(all);
}

int llm_model_from_gguf(llm_gguf *g, const char *name, llm_model **out, char *err, size_t errlen) {
    *out = NULL;
    llm_model *m = calloc(1, sizeof *m);
    if (!m) {
        llm_gguf_close(g);
        return llm_errf(err, errlen, LLM_ERR_NOMEM, "out of memory");
    }
    m->gguf = g;
    llm_hparams *hp = &m->hp;
    int rc = LLM_ERR_MODEL;
    if (!(m->arch = arch_of(g, err, errlen)) || m->arch->read_hparams(g, hp, err, errlen)) goto fail;
    const llm_gguf_tensor *emb = llm_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!emb) {
        llm_errf(err, errlen, LLM_ERR_MODEL, "missing tensor token_embd.weight");
        goto fail;
    }
    if (hp->n_vocab == 0) hp->n_vocab = (int32_t)(emb->dims[1] > 0 && emb->dims[1] < (1 << 24) ? emb->dims[1] : 0);
    if (llm_load_matrix(m->gguf, "token_embd.weight", hp->n_vocab, hp->dim, &m->tok_embd, err, errlen)) goto fail;
    if (llm_gguf_find_tensor(m->gguf, "output.weight")) {
        if (llm_load_matrix(m->gguf, "output.weight", hp->n_vocab, hp->dim, &m->output, err, errlen)) goto fail;
    } else {
        m->output = m->tok_embd;
        m->tied_output = 1;
    }
    if ((rc = m->arch->load(m, err, errlen)) != LLM_OK) goto fail;
    rc = LLM_ERR_MODEL;
    if (llm_check_tensors(m, err, errlen)) goto fail;
    pack_weights(m);
    rc = LLM_ERR_MODEL;
    if (load_tokenizer(m, err, errlen)) goto fail;
    if (llm_tokenizer_n_vocab(m->tok) != hp->n_vocab) {
        llm_errf(err, errlen, LLM_ERR_MODEL, "the tokenizer has %d tokens but token_embd.weight has %d rows",
                 (int)llm_tokenizer_n_vocab(m->tok), (int)hp->n_vocab);
        goto fail;
    }
    load_chat_format(m);
    for (int64_t i = 0; i < llm_gguf_n_tensors(m->gguf); i++) m->weight_bytes += llm_gguf_tensor_at(m->gguf, i)->n_bytes;
    llm_gguf_str gname;
    if (llm_gguf_get_str(m->gguf, "general.name", &gname) == LLM_GGUF_OK)
        llm_gguf_str_copy(gname, m->name, sizeof m->name);
    else
        snprintf(m->name, sizeof m->name, "%s", name ? name : "model");
    *out = m;
    return LLM_OK;
fail:
    llm_model_free(m);
    return rc;
}

void llm_model_free(llm_model *m) {
    if (!m) return;
    llm_tokenizer_free(m->tok);
    free(m->layers);
    free(m->lhp);
    free(m->norms);
    free(m->packed);
    llm_gguf_close(m->gguf);
    free(m);
}

/* ---------------------------------------------------------------- accessors */

const llm_hparams *llm_model_hparams(const llm_model *m) { return &m->hp; }
const llm_tokenizer *llm_model_tokenizer(const llm_model *m) { return m->tok; }
const llm_chat_format *llm_model_chat(const llm_model *m) { return &m->chat; }
const char *llm_model_name(const llm_model *m) { return m->name; }
const char *llm_model_arch(const llm_model *m) { return m->arch->name; }
uint64_t llm_model_weight_bytes(const llm_model *m) { return m->weight_bytes; }
uint64_t llm_model_packed_bytes(const llm_model *m) { return m->packed ? m->packed_bytes : 0; }
int32_t llm_model_n_vocab(const llm_model *m) { return m->hp.n_vocab; }
int32_t llm_model_n_groups(const llm_model *m) { return m->n_groups; }

int llm_model_group(const llm_model *m, int32_t g, int32_t *n_layers, int32_t *window) {
    if (!m || g < 0 || g >= m->n_groups) return LLM_ERR_SHAPE;
    if (n_layers) *n_layers = m->groups[g].n_layers;
    if (window) *window = m->groups[g].window;
    return LLM_OK;
}
