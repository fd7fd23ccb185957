/* engine/model.c - loading a Llama-architecture GGUF file: hyperparameters
 * from the `llama.*` keys, every tensor found and its shape and type checked,
 * norm vectors decoded, RoPE frequencies set up, the tokenizer and chat
 * format built from the `tokenizer.*` keys. The forward pass is in
 * forward.c. */
#include "model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

/* ---------------------------------------------------------------- errors */

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

const char *llm_status_str(int status) {
    if (status == LLM_ERR_TOKEN) return "a token id is outside the vocabulary";
    return kv_status_str(status);
}

/* ---------------------------------------------------------------- hyperparameters */

/* A required positive count under llama.*; limits keep every later product
 * (rows x cols, scratch sizes) far inside int64 and int32 where it matters. */
static int need_count(const llm_gguf *g, const char *key, int32_t lo, int32_t hi, int32_t *out,
                      char *err, size_t errlen) {
    uint32_t v;
    int rc = llm_gguf_get_u32(g, key, &v);
    if (rc == LLM_GGUF_ENOKEY) return fail(err, errlen, "missing metadata key %s", key);
    if (rc != LLM_GGUF_OK) return fail(err, errlen, "metadata key %s is not an unsigned integer", key);
    if (v < (uint32_t)lo || v > (uint32_t)hi)
        return fail(err, errlen, "%s = %u is outside [%d, %d]", key, v, lo, hi);
    *out = (int32_t)v;
    return 0;
}

/* An optional count: *out keeps its default when the key is absent. */
static int opt_count(const llm_gguf *g, const char *key, int32_t lo, int32_t hi, int32_t *out,
                     char *err, size_t errlen) {
    if (llm_gguf_find_key(g, key) < 0) return 0;
    return need_count(g, key, lo, hi, out, err, errlen);
}

int llm_hparams_read(const llm_gguf *g, llm_hparams *hp, char *err, size_t errlen) {
    memset(hp, 0, sizeof *hp);
    llm_gguf_str arch;
    if (llm_gguf_get_str(g, "general.architecture", &arch) != LLM_GGUF_OK)
        return fail(err, errlen, "missing general.architecture: not a model file?");
    if (!llm_gguf_str_eq(arch, "llama")) {
        char a[64];
        return fail(err, errlen, "architecture '%s' is not supported (only 'llama': Llama, SmolLM2, TinyLlama)",
                    llm_gguf_str_copy(arch, a, sizeof a));
    }
    if (need_count(g, "llama.block_count", 1, 1024, &hp->n_layers, err, errlen) ||
        need_count(g, "llama.embedding_length", 1, 1 << 16, &hp->dim, err, errlen) ||
        need_count(g, "llama.feed_forward_length", 1, 1 << 18, &hp->ffn_dim, err, errlen) ||
        need_count(g, "llama.attention.head_count", 1, 1024, &hp->n_heads, err, errlen))
        return -1;
    hp->n_kv_heads = hp->n_heads;
    hp->ctx_train = 2048;
    if (opt_count(g, "llama.attention.head_count_kv", 1, 1024, &hp->n_kv_heads, err, errlen) ||
        opt_count(g, "llama.context_length", 1, INT32_MAX, &hp->ctx_train, err, errlen))
        return -1;
    if (hp->n_heads % hp->n_kv_heads)
        return fail(err, errlen, "head_count %d is not a multiple of head_count_kv %d", hp->n_heads,
                    hp->n_kv_heads);
    /* head size: key_length when given (it may differ from D / H), else D / H */
    if (llm_gguf_find_key(g, "llama.attention.key_length") >= 0) {
        int32_t vl = -1;
        if (need_count(g, "llama.attention.key_length", 2, KV_MAX_HEAD_DIM, &hp->head_dim, err, errlen))
            return -1;
        vl = hp->head_dim;
        if (opt_count(g, "llama.attention.value_length", 1, KV_MAX_HEAD_DIM, &vl, err, errlen)) return -1;
        if (vl != hp->head_dim)
            return fail(err, errlen, "value_length %d differs from key_length %d: not supported", vl, hp->head_dim);
    } else {
        if (hp->dim % hp->n_heads)
            return fail(err, errlen, "embedding_length %d is not a multiple of head_count %d", hp->dim, hp->n_heads);
        hp->head_dim = hp->dim / hp->n_heads;
    }
    if (hp->head_dim > KV_MAX_HEAD_DIM || hp->head_dim % 2)
        return fail(err, errlen, "head size %d: must be even and at most %d", hp->head_dim, KV_MAX_HEAD_DIM);
    float eps;
    if (llm_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps) != LLM_GGUF_OK)
        return fail(err, errlen, "missing llama.attention.layer_norm_rms_epsilon (a float)");
    if (!(eps > 0 && eps < 1)) return fail(err, errlen, "layer_norm_rms_epsilon %g is not in (0, 1)", eps);
    hp->norm_eps = eps;

    hp->rope = kv_rope_default_params(hp->head_dim);
    hp->rope.layout = KV_ROPE_INTERLEAVED; /* GGUF llama: adjacent pairs (see model.h) */
    float theta = 10000.0f;
    if (llm_gguf_find_key(g, "llama.rope.freq_base") >= 0 &&
        llm_gguf_get_f32(g, "llama.rope.freq_base", &theta) != LLM_GGUF_OK)
        return fail(err, errlen, "llama.rope.freq_base is not a float");
    if (!(theta > 1)) return fail(err, errlen, "llama.rope.freq_base %g must be > 1", theta);
    hp->rope.theta = theta;
    int32_t rot = hp->head_dim;
    if (opt_count(g, "llama.rope.dimension_count", 2, hp->head_dim, &rot, err, errlen)) return -1;
    if (rot % 2) return fail(err, errlen, "llama.rope.dimension_count %d is odd", rot);
    hp->rope.rot_dim = rot;
    llm_gguf_str st;
    if (llm_gguf_get_str(g, "llama.rope.scaling.type", &st) == LLM_GGUF_OK && !llm_gguf_str_eq(st, "none")) {
        /* Llama 3.1 files say nothing here and carry rope_freqs.weight instead
         * (handled at load); linear and YaRN rescale positions, which the
         * library's RoPE does not do. */
        char s[32];
        float factor = llm_gguf_f32_or(g, "llama.rope.scaling.factor", 1.0f);
        if (factor != 1.0f)
            return fail(err, errlen, "rope scaling '%s' (factor %g) is not supported",
                        llm_gguf_str_copy(st, s, sizeof s), factor);
    }
    kv_rope r;
    if (kv_rope_init(&r, &hp->rope) != KV_OK) return fail(err, errlen, "RoPE parameters rejected by the library");

    hp->n_vocab = 0;
    llm_gguf_arr toks;
    if (llm_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks) == LLM_GGUF_OK) {
        if (toks.n == 0 || toks.n > (1u << 24)) return fail(err, errlen, "tokenizer.ggml.tokens has %llu entries",
                                                             (unsigned long long)toks.n);
        hp->n_vocab = (int32_t)toks.n;
    } else {
        if (opt_count(g, "llama.vocab_size", 1, 1 << 24, &hp->n_vocab, err, errlen)) return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- tensors */

static void shape_str(const llm_gguf_tensor *t, char *buf, size_t n) {
    int k = snprintf(buf, n, "[");
    for (int i = 0; i < t->n_dims && k < (int)n; i++)
        k += snprintf(buf + k, n - (size_t)k, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
    if (k < (int)n) snprintf(buf + k, n - (size_t)k, "]");
}

/* The tensor `name` as a rows x cols matrix (GGUF dims {cols, rows}). */
static int get_matrix(const llm_gguf *g, const char *name, int64_t rows, int64_t cols, llm_matrix *out,
                      char *err, size_t errlen) {
    const llm_gguf_tensor *t = llm_gguf_find_tensor(g, name);
    if (!t) return fail(err, errlen, "missing tensor %s", name);
    char s[96];
    shape_str(t, s, sizeof s);
    if (t->n_dims > 2 || t->dims[0] != cols || t->dims[1] != rows)
        return fail(err, errlen, "tensor %s has shape %s, expected [%lld, %lld]", name, s, (long long)cols,
                    (long long)rows);
    if (!llm_type_supported(t->type) || llm_row_bytes(t->type, cols) <= 0)
        return fail(err, errlen, "tensor %s: type %s cannot hold rows of %lld", name,
                    llm_type_name(t->type) ? llm_type_name(t->type) : "?", (long long)cols);
    *out = (llm_matrix){.type = t->type, .data = t->data, .rows = rows, .cols = cols};
    return 0;
}

/* The vector `name` of n elements, decoded to f32 into dst. */
static int get_vector(const llm_gguf *g, const char *name, int64_t n, float *dst, char *err, size_t errlen) {
    const llm_gguf_tensor *t = llm_gguf_find_tensor(g, name);
    if (!t) return fail(err, errlen, "missing tensor %s", name);
    char s[96];
    shape_str(t, s, sizeof s);
    if (t->dims[0] != n || t->n_elements != n)
        return fail(err, errlen, "tensor %s has shape %s, expected [%lld]", name, s, (long long)n);
    if (llm_dequant_row(t->type, t->data, dst, n) != 0)
        return fail(err, errlen, "tensor %s: type %s cannot be decoded", name,
                    llm_type_name(t->type) ? llm_type_name(t->type) : "?");
    return 0;
}

static int load_layer(llm_model *m, int32_t l, float *norms, char *err, size_t errlen) {
    const llm_hparams *hp = &m->hp;
    llm_layer_weights *w = &m->layers[l];
    int64_t D = hp->dim, qd = (int64_t)hp->n_heads * hp->head_dim, kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    char n[9][64];
    static const char *const suffix[9] = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                          "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"};
    for (int i = 0; i < 9; i++) snprintf(n[i], sizeof n[i], "blk.%d.%s.weight", (int)l, suffix[i]);
    if (get_vector(m->gguf, n[0], D, norms, err, errlen) ||
        get_matrix(m->gguf, n[1], qd, D, &w->wq, err, errlen) ||
        get_matrix(m->gguf, n[2], kvd, D, &w->wk, err, errlen) ||
        get_matrix(m->gguf, n[3], kvd, D, &w->wv, err, errlen) ||
        get_matrix(m->gguf, n[4], D, qd, &w->wo, err, errlen) ||
        get_vector(m->gguf, n[5], D, norms + D, err, errlen) ||
        get_matrix(m->gguf, n[6], hp->ffn_dim, D, &w->w_gate, err, errlen) ||
        get_matrix(m->gguf, n[7], hp->ffn_dim, D, &w->w_up, err, errlen) ||
        get_matrix(m->gguf, n[8], D, hp->ffn_dim, &w->w_down, err, errlen))
        return -1;
    w->attn_norm = norms;
    w->ffn_norm = norms + D;
    return 0;
}

/* Llama 3.1 files carry the scaled frequencies as rope_freqs.weight: one
 * divisor per rotated pair, applied to the plain theta frequencies. */
static int load_rope(llm_model *m, char *err, size_t errlen) {
    if (kv_rope_init(&m->rope, &m->hp.rope) != KV_OK) return fail(err, errlen, "bad RoPE parameters");
    const llm_gguf_tensor *t = llm_gguf_find_tensor(m->gguf, "rope_freqs.weight");
    if (!t) return 0;
    int32_t half = m->hp.rope.rot_dim / 2;
    float f[KV_MAX_HEAD_DIM / 2];
    if (get_vector(m->gguf, "rope_freqs.weight", half, f, err, errlen)) return -1;
    for (int32_t k = 0; k < half; k++) {
        if (!(f[k] > 0)) return fail(err, errlen, "rope_freqs.weight[%d] = %g is not positive", (int)k, f[k]);
        m->rope.inv_freq[k] /= f[k];
    }
    return 0;
}

/* ---------------------------------------------------------------- tokenizer */

static int load_tokenizer(llm_model *m, char *err, size_t errlen) {
    const llm_gguf *g = m->gguf;
    llm_gguf_str model_s, pre_s;
    llm_gguf_arr toks, merges, scores, types;
    if (llm_gguf_get_str(g, "tokenizer.ggml.model", &model_s) != LLM_GGUF_OK)
        return fail(err, errlen, "missing tokenizer.ggml.model");
    if (llm_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks) != LLM_GGUF_OK || toks.type != LLM_GGUF_STR)
        return fail(err, errlen, "missing tokenizer.ggml.tokens (an array of strings)");
    int has_merges = llm_gguf_get_arr(g, "tokenizer.ggml.merges", &merges) == LLM_GGUF_OK;
    int has_scores = llm_gguf_get_arr(g, "tokenizer.ggml.scores", &scores) == LLM_GGUF_OK;
    int has_types = llm_gguf_get_arr(g, "tokenizer.ggml.token_type", &types) == LLM_GGUF_OK;
    if (has_merges && (merges.type != LLM_GGUF_STR || merges.n > (1u << 24)))
        return fail(err, errlen, "tokenizer.ggml.merges is not an array of strings");
    if (has_scores && (scores.n != toks.n || (scores.type != LLM_GGUF_F32 && scores.type != LLM_GGUF_F64)))
        return fail(err, errlen, "tokenizer.ggml.scores: want %llu floats", (unsigned long long)toks.n);
    if (has_types && (types.n != toks.n || types.type == LLM_GGUF_STR || types.type >= LLM_GGUF_F32))
        return fail(err, errlen, "tokenizer.ggml.token_type: want %llu integers", (unsigned long long)toks.n);

    int32_t nv = (int32_t)toks.n, nm = has_merges ? (int32_t)merges.n : 0;
    const char **tk = malloc(sizeof *tk * (size_t)nv);
    int32_t *tl = malloc(sizeof *tl * (size_t)nv), *tt = has_types ? malloc(sizeof *tt * (size_t)nv) : NULL;
    float *sc = has_scores ? malloc(sizeof *sc * (size_t)nv) : NULL;
    const char **mg = malloc(sizeof *mg * (size_t)(nm ? nm : 1));
    int32_t *ml = malloc(sizeof *ml * (size_t)(nm ? nm : 1));
    char model[32], pre[64];
    int rc = -1;
    if (!tk || !tl || !mg || !ml || (has_types && !tt) || (has_scores && !sc)) {
        fail(err, errlen, "out of memory reading the vocabulary");
        goto done;
    }
    for (int32_t i = 0; i < nv; i++) {
        llm_gguf_str s = llm_gguf_arr_str(&toks, (uint64_t)i);
        if (s.len > 1024) {
            fail(err, errlen, "token %d is %llu bytes long", (int)i, (unsigned long long)s.len);
            goto done;
        }
        tk[i] = s.ptr, tl[i] = (int32_t)s.len;
        if (tt) tt[i] = (int32_t)llm_gguf_arr_i64(&types, (uint64_t)i);
        if (sc) sc[i] = llm_gguf_arr_f32(&scores, (uint64_t)i);
    }
    for (int32_t i = 0; i < nm; i++) {
        llm_gguf_str s = llm_gguf_arr_str(&merges, (uint64_t)i);
        if (s.len > 2048) {
            fail(err, errlen, "merge %d is %llu bytes long", (int)i, (unsigned long long)s.len);
            goto done;
        }
        mg[i] = s.ptr, ml[i] = (int32_t)s.len;
    }
    llm_tokenizer_desc d = llm_tokenizer_desc_default();
    d.model = llm_gguf_str_copy(model_s, model, sizeof model);
    d.pre = llm_gguf_get_str(g, "tokenizer.ggml.pre", &pre_s) == LLM_GGUF_OK ? llm_gguf_str_copy(pre_s, pre, sizeof pre)
                                                                             : NULL;
    d.n_vocab = nv, d.tokens = tk, d.token_len = tl, d.scores = sc, d.token_type = tt;
    d.n_merges = nm, d.merges = mg, d.merge_len = ml;
    d.bos_id = llm_gguf_i32_or(g, "tokenizer.ggml.bos_token_id", -1);
    d.eos_id = llm_gguf_i32_or(g, "tokenizer.ggml.eos_token_id", -1);
    d.unk_id = llm_gguf_i32_or(g, "tokenizer.ggml.unknown_token_id", -1);
    d.pad_id = llm_gguf_i32_or(g, "tokenizer.ggml.padding_token_id", -1);
    /* SentencePiece vocabularies start with BOS unless told otherwise; BPE ones do not */
    d.add_bos = llm_gguf_bool_or(g, "tokenizer.ggml.add_bos_token", strcmp(model, "llama") == 0);
    d.add_eos = llm_gguf_bool_or(g, "tokenizer.ggml.add_eos_token", 0);
    d.add_space_prefix = llm_gguf_bool_or(g, "tokenizer.ggml.add_space_prefix", -1);
    char terr[200];
    if (llm_tokenizer_create(&d, &m->tok, terr, sizeof terr) != 0) {
        fail(err, errlen, "tokenizer: %s", terr);
        goto done;
    }
    rc = 0;
done:
    free(tk), free(tl), free(tt), free(sc), free(mg), free(ml);
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
    if (llm_gguf_open(path, &g, gerr, sizeof gerr) != 0) return fail(err, errlen, "%s", gerr);
    const char *slash = strrchr(path, '/');
    return llm_model_from_gguf(g, slash ? slash + 1 : path, out, err, errlen);
}

int llm_model_from_gguf(llm_gguf *g, const char *name, llm_model **out, char *err, size_t errlen) {
    *out = NULL;
    llm_model *m = calloc(1, sizeof *m);
    if (!m) {
        llm_gguf_close(g);
        return fail(err, errlen, "out of memory");
    }
    m->gguf = g;
    llm_hparams *hp = &m->hp;
    if (llm_hparams_read(m->gguf, hp, err, errlen)) goto fail;
    int64_t D = hp->dim;
    /* the 2L + 1 norm vectors are in the file at >= half a byte per element:
     * a header claiming more cannot be right, and must not make us allocate */
    if ((uint64_t)D * (uint64_t)(2 * hp->n_layers + 1) / 2 > llm_gguf_file_size(g)) {
        fail(err, errlen, "the file (%llu bytes) is too small for %d layers of width %d",
             (unsigned long long)llm_gguf_file_size(g), (int)hp->n_layers, (int)D);
        goto fail;
    }
    m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
    m->norms = malloc(sizeof(float) * (size_t)D * (size_t)(2 * hp->n_layers + 1));
    if (!m->layers || !m->norms) {
        fail(err, errlen, "out of memory");
        goto fail;
    }
    const llm_gguf_tensor *emb = llm_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!emb) {
        fail(err, errlen, "missing tensor token_embd.weight");
        goto fail;
    }
    if (hp->n_vocab == 0) hp->n_vocab = (int32_t)(emb->dims[1] > 0 && emb->dims[1] < (1 << 24) ? emb->dims[1] : 0);
    if (get_matrix(m->gguf, "token_embd.weight", hp->n_vocab, D, &m->tok_embd, err, errlen)) goto fail;
    for (int32_t l = 0; l < hp->n_layers; l++)
        if (load_layer(m, l, m->norms + (size_t)2 * l * D, err, errlen)) goto fail;
    float *onorm = m->norms + (size_t)2 * hp->n_layers * D;
    if (get_vector(m->gguf, "output_norm.weight", D, onorm, err, errlen)) goto fail;
    m->output_norm = onorm;
    if (llm_gguf_find_tensor(m->gguf, "output.weight")) {
        if (get_matrix(m->gguf, "output.weight", hp->n_vocab, D, &m->output, err, errlen)) goto fail;
    } else {
        m->output = m->tok_embd;
        m->tied_output = 1;
    }
    if (load_rope(m, err, errlen) || load_tokenizer(m, err, errlen)) goto fail;
    if (llm_tokenizer_n_vocab(m->tok) != hp->n_vocab) {
        fail(err, errlen, "the tokenizer has %d tokens but token_embd.weight has %d rows",
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
    return 0;
fail:
    llm_model_free(m);
    return -1;
}

void llm_model_free(llm_model *m) {
    if (!m) return;
    llm_tokenizer_free(m->tok);
    free(m->layers);
    free(m->norms);
    llm_gguf_close(m->gguf);
    free(m);
}
