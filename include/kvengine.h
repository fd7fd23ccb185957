/* kvengine.h - text generation from GGUF models: the public header of
 * libkvengine (beside kvcache.h, whose cache it runs on).
 *
 *     kve_model    a loaded GGUF file: weights, tokenizer, chat template.
 *                  Read-only once loaded; any thread may use it.
 *     kve_context  a model at work: a paged KV pool for n_seqs sequences and
 *                  one scheduler thread that batches every running request
 *                  into shared forward passes (continuous batching, prefix
 *                  reuse, preemption; the engine behind `kvcache serve`).
 *     kve_request  one generation submitted to a context: a prompt (text,
 *                  token ids or chat messages), sampling and stop settings;
 *                  its tokens and text come as they are made, through a
 *                  callback (on the scheduler thread) and/or by polling.
 *     kve_session  one sequence on a cache of its own, run on the caller's
 *                  thread: a conversation kept between calls, session files,
 *                  prefill and decode timed apart (see "sessions" below).
 *     kve_grammar  a grammar or JSON Schema compiled for a model's vocabulary.
 *
 *     kve_model *m;  kve_context *c;  kve_request *r;
 *     kve_model_load("model.gguf", &m, err, sizeof err);
 *     kve_context_params cp = kve_context_default_params();
 *     kve_context_create(m, &cp, &c, err, sizeof err);
 *     kve_request_params rp = kve_request_default_params();
 *     rp.prompt = "The capital of France is";
 *     kve_submit(c, &rp, &r, err, sizeof err);
 *     for (kve_output o; kve_request_poll(r, -1, &o) == KVE_OK;) {
 *         fwrite(o.text, 1, o.text_len, stdout);
 *         if (o.stop != KVE_STOP_NONE) break;
 *     }
 *     kve_request_free(r); kve_context_free(c); kve_model_free(m);
 *
 * Text rules. Output text is valid UTF-8: a character split across tokens
 * waits until it is complete. Stop strings are matched in that text; the
 * text before the earliest match is given, the match and what follows never
 * are. An end-of-generation token (end of turn) ends the request and is not
 * given as text.
 *
 * Greedy requests (temperature <= 0) give the same tokens alone or batched
 * with others, up to a rounding tie: a logit computed in another batch shape
 * may move in its last bits, and a greedy choice between two tokens whose
 * log-probabilities are that close (well under 0.01) can go the other way.
 *
 * Errors. Every call that can fail returns a kve_status (0 or negative);
 * kve_status_str() names it. kvcache.h's codes pass through with their
 * values. Each code says what state the failed call left:
 *
 *     nothing changed   the call had no effect: fix the argument, call again
 *     retry             nothing changed; the same call may succeed later
 *     ended             the request ended (KVE_STOP_ERROR): read why, free it
 *
 * Calls that build something (kve_model_load, kve_context_create,
 * kve_submit) also write one line into the caller's err buffer (err may be
 * NULL) saying what was wrong, with the numbers; on failure nothing is
 * allocated and *out is NULL.
 *
 * Threads. kve_submit, kve_request_poll, kve_request_cancel and
 * kve_request_free may be called from any thread, concurrently (a request is
 * polled by one thread at a time). The model functions (tokenize,
 * detokenize, chat template) may run anywhere at any time. */
#ifndef KVENGINE_H
#define KVENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the exported functions: libkvengine is built with
 * -fvisibility=hidden, so these and kvcache.h's KV_API ones are its ABI. */
#ifndef KVE_API
#if defined(__GNUC__)
#define KVE_API __attribute__((visibility("default")))
#else
#define KVE_API
#endif
#endif

typedef enum {
    KVE_OK = 0,
    /* kvcache.h's kv_status codes (-1 .. -17) with their values and meanings; from the
     * engine's calls: */
    KVE_ERR_NULL = KV_ERR_NULL,       /* a required pointer was NULL; nothing changed */
    KVE_ERR_NOMEM = KV_ERR_NOMEM,     /* allocation failed; nothing changed */
    KVE_ERR_IO = KV_ERR_IO,           /* a file could not be read; nothing changed */
    KVE_ERR_TOKEN = -100,     /* a token id outside [0, n_vocab); nothing changed */
    KVE_ERR_PARAM = -101,     /* a parameter out of range; nothing changed, err says which */
    KVE_ERR_MODEL = -102,     /* the file cannot be run as a model (not GGUF, an unknown
                               * architecture, a missing or misshapen tensor); nothing
                               * allocated, err says what */
    KVE_ERR_NONFINITE = -103, /* ended: the model's logits held NaN or infinity (bad weights
                               * or an overflow); nothing was sampled from them */
    KVE_ERR_QUEUE_FULL = -201, /* retry: too many requests are waiting; nothing queued */
    KVE_ERR_TOO_LARGE = -202,  /* the request can never fit the context or the KV pool (a
                                * prompt of n_ctx tokens or more); nothing queued */
    KVE_ERR_STOPPED = -203,    /* the context is being freed; nothing queued */
    KVE_ERR_TEMPLATE = -301,   /* chat messages for a model without a chat template this
                                * engine knows; nothing changed */
    KVE_ERR_TIMEOUT = -302,    /* kve_request_poll: nothing new within the time given; retry */
    KVE_ERR_SPACE = -303,      /* the output buffer is too small: nothing written, the size
                                * needed is given; call again with that much room */
} kve_status;

/* One sentence for any kve_status or kv_status code (never NULL). */
KVE_API const char *kve_status_str(int status);

/* Why a request ended. */
typedef enum {
    KVE_STOP_NONE = 0,   /* still generating */
    KVE_STOP_EOG,        /* the model ended its turn (end-of-generation token, not given) */
    KVE_STOP_STRING,     /* a stop string appeared; the text before it was given */
    KVE_STOP_LENGTH,     /* max_tokens generated */
    KVE_STOP_CONTEXT,    /* the sequence filled the context */
    KVE_STOP_CANCEL,     /* kve_request_cancel, or the context was freed */
    KVE_STOP_ERROR,      /* generation failed; kve_output.status and .error say why */
} kve_stop_reason;

/* "end of turn", "stop string", "token limit", "context full", "cancelled", "error". */
KVE_API const char *kve_stop_reason_str(kve_stop_reason r);

/* ---------------------------------------------------------------- model */

typedef struct kve_model kve_model;

/* Loads a GGUF file (Llama, Qwen 2/3, Phi 3, Gemma 3 architectures; see
 * docs/ENGINE_API.md). KVE_OK, KVE_ERR_MODEL or KVE_ERR_NOMEM. */
KVE_API int kve_model_load(const char *path, kve_model **out, char *err, size_t errlen);
/* Frees m; every context made from it must be freed first. */
KVE_API void kve_model_free(kve_model *m);

KVE_API int32_t kve_model_n_vocab(const kve_model *m);
KVE_API int32_t kve_model_n_ctx_train(const kve_model *m);    /* the context it was trained for */
KVE_API const char *kve_model_name(const kve_model *m);        /* general.name, or the file name */
KVE_API int kve_model_has_chat_template(const kve_model *m);   /* 1: chat messages are accepted */
KVE_API int32_t kve_model_bos(const kve_model *m);             /* the beginning-of-sequence id, or -1 */

/* The shape that sizes the cache and the bytes a token reads. */
typedef struct {
    int32_t n_layers;
    int32_t dim;             /* embedding width */
    int32_t n_heads;         /* query heads */
    int32_t n_kv_heads;      /* K/V heads the cache stores (fewer than n_heads: GQA/MQA) */
    int32_t head_dim;
    int32_t ffn_dim;
    int32_t n_groups;        /* cache groups: layers that share an attention window share one
                              * (kve_model_group) */
    uint64_t weight_bytes;   /* bytes of every tensor in the file */
    uint64_t packed_bytes;   /* bytes of the copy the engine repacks matrices into for its
                              * kernels (0: none; KVCACHE_PACK=0 turns it off) */
    uint64_t streamed_bytes; /* bytes a decoded token's matrix products read: every layer's
                              * projections and the output, each in its packed copy if it has
                              * one (the floor of decode is this plus the K/V it attends, over
                              * the memory's bandwidth) */
} kve_model_shape;

/* Zeros for m NULL. */
KVE_API kve_model_shape kve_model_get_shape(const kve_model *m);
/* Cache group g in [0, n_groups): its layer count and window (0: full
 * attention) into the pointers (either may be NULL). KVE_OK, KVE_ERR_PARAM
 * for g out of range (nothing written), KVE_ERR_NULL. */
KVE_API int kve_model_group(const kve_model *m, int32_t g, int32_t *n_layers, int32_t *window);
/* The instruction set the weight products run on, chosen once per process
 * from the CPU: "scalar", "avx2", "avx512" or "avx512vnni" (KVCACHE_SIMD and
 * KVCACHE_NO_VNNI may lower it). */
KVE_API const char *kve_kernels(void);

/* The "out of room" rule of the three calls below: *n_out (or *len) is always
 * set to the size of the whole result; when it does not fit in cap, nothing
 * is written and KVE_ERR_SPACE is returned (call again with that much room;
 * out may be NULL with cap 0 to ask for the size). */

/* Token ids of text[0..len) into out[0..cap), *n_out of them: add_special
 * adds BOS as the model asks; parse_special reads control tokens written in
 * the text ("<|im_end|>") as such, else they are plain text. KVE_OK,
 * KVE_ERR_SPACE, KVE_ERR_NULL, KVE_ERR_NOMEM. Any bytes tokenize. */
KVE_API int kve_tokenize(const kve_model *m, const char *text, size_t len, int add_special, int parse_special,
                         int32_t *out, int32_t cap, int32_t *n_out);
/* The text of ids[0..n) (control tokens as their text when render_special),
 * NUL-terminated into out[0..cap), *len bytes before the NUL. KVE_OK,
 * KVE_ERR_SPACE, KVE_ERR_TOKEN (an id outside the vocabulary; *len 0),
 * KVE_ERR_NULL. */
KVE_API int kve_detokenize(const kve_model *m, const int32_t *ids, int32_t n, int render_special, char *out,
                           size_t cap, size_t *len);

/* One chat message. */
typedef struct {
    const char *role;     /* "system", "user", "assistant" */
    const char *content;  /* NUL-terminated text */
} kve_chat_message;

/* The model's chat template applied to msgs[0..n) (add_assistant: ending
 * with the header that opens the assistant's turn), NUL-terminated into
 * out[0..cap), *len bytes before the NUL. KVE_OK, KVE_ERR_SPACE,
 * KVE_ERR_TEMPLATE (the model has none this engine knows), KVE_ERR_PARAM (no
 * message, or one without role or content), KVE_ERR_NULL. */
KVE_API int kve_chat_apply(const kve_model *m, const kve_chat_message *msgs, int32_t n, int add_assistant, char *out,
                           size_t cap, size_t *len);
/* kve_chat_apply with the template's enable_thinking switch (Qwen3's): -1 the
 * template's default, 0 false (the assistant's turn opens with an empty think
 * block), 1 true. 0 or 1 for a template without the switch is
 * KVE_ERR_TEMPLATE, any other value KVE_ERR_PARAM. */
KVE_API int kve_chat_apply_ex(const kve_model *m, const kve_chat_message *msgs, int32_t n, int add_assistant,
                              int enable_thinking, char *out, size_t cap, size_t *len);
/* The tokens of the template applied to msgs[0..n) from message n_prev on:
 * what a cache that holds msgs[0..n_prev), each closed by its end-of-turn
 * marker (kve_chat_turn_end), needs next (n_prev 0: the whole conversation,
 * BOS first when add_bos). The template's markers are control tokens, the
 * contents plain text; enable_thinking as kve_chat_apply_ex takes it. Into
 * out[0..cap) by the "out of room" rule, *n_out ids. KVE_OK, KVE_ERR_SPACE,
 * KVE_ERR_TEMPLATE (no template, or a thinking switch the template lacks),
 * KVE_ERR_PARAM (no message, one without role or content, n_prev outside
 * [0, n], enable_thinking outside [-1, 1]), KVE_ERR_NULL, KVE_ERR_NOMEM. */
KVE_API int kve_chat_tokenize(const kve_model *m, const kve_chat_message *msgs, int32_t n, int32_t n_prev,
                              int add_assistant, int add_bos, int enable_thinking, int32_t *out, int32_t cap,
                              int32_t *n_out);
/* The text that closes a turn in the model's template ("<|im_end|>",
 * "<end_of_turn>", ...); "" for a model without a template. */
KVE_API const char *kve_chat_turn_end(const kve_model *m);
/* How the model's family writes tool calls (docs/SERVER.md, "Tools"). */
typedef enum {
    KVE_TOOLS_HERMES = 0,   /* ChatML and the templates without tools: <tool_call> JSON </tool_call>,
                             * results in user turns */
    KVE_TOOLS_LLAMA3,       /* Llama 3.1: a bare JSON object with "parameters", results as
                             * "ipython" turns */
} kve_tool_style;
KVE_API kve_tool_style kve_model_tool_style(const kve_model *m);
/* The system message the template writes when a conversation has none ("" when
 * it writes none). */
KVE_API const char *kve_chat_default_system(const kve_model *m);
/* The bytes token id stands for (a control token: its text), *len of them,
 * not NUL-terminated, valid while m is loaded; a piece may end inside a UTF-8
 * character. NULL with *len 0 for an id outside [0, n_vocab). */
KVE_API const char *kve_token_piece(const kve_model *m, int32_t id, size_t *len);

/* ---------------------------------------------------------------- GGUF files */

/* A GGUF file read for inspection: its metadata and tensor table, without
 * loading a model, so that files the engine cannot run (an unknown
 * architecture, a tensor type it does not read, a missing tensor) can be
 * read too. Every count, length, type, offset and size is checked against
 * the file at open; what the calls below give points into the read-only
 * mapped file or the kve_gguf and stays valid until kve_gguf_close. One kve_gguf may be read from several threads.
 *
 *     kve_gguf *g;
 *     kve_gguf_open("model.gguf", &g, err, sizeof err);
 *     kve_gguf_kv kv;  kve_gguf_value v;
 *     for (int64_t i = 0; kve_gguf_kv_at(g, i, &kv) == KVE_OK; i++)
 *         for (uint64_t e = 0; e < kv.n; e++) kve_gguf_value_at(g, i, e, &v);
 *     kve_gguf_tensor t;
 *     for (int64_t i = 0; kve_gguf_tensor_at(g, i, &t) == KVE_OK; i++) ...
 *     kve_gguf_close(g); */

typedef struct kve_gguf kve_gguf;

/* Maps the file at path read-only and checks it. KVE_OK with *out;
 * KVE_ERR_IO (the file cannot be opened or read; err says why), KVE_ERR_MODEL
 * (not a GGUF file of version 2 or 3, a count, length, offset or size the
 * file cannot hold, a value type or tensor type the format does not define;
 * err says what and where), KVE_ERR_NOMEM, KVE_ERR_NULL; *out NULL on failure.
 * Tensors of types the engine does not run (IQ2_XXS, ...) are listed too. */
KVE_API int kve_gguf_open(const char *path, kve_gguf **out, char *err, size_t errlen);
/* The same over data[0..size), which must stay valid and unchanged until
 * kve_gguf_close (nothing is copied). */
KVE_API int kve_gguf_open_memory(const void *data, size_t size, kve_gguf **out, char *err, size_t errlen);
KVE_API void kve_gguf_close(kve_gguf *g);

typedef struct {
    uint32_t version;      /* 2 or 3 */
    uint32_t alignment;    /* of the tensor data (general.alignment, else 32) */
    uint64_t data_offset;  /* file offset of the data section */
    uint64_t file_size;    /* bytes */
    int64_t n_kv;          /* metadata entries */
    int64_t n_tensors;
} kve_gguf_info;

/* Zeros for g NULL. */
KVE_API kve_gguf_info kve_gguf_get_info(const kve_gguf *g);

/* Metadata value types, numbered as the format numbers them. */
typedef enum {
    KVE_GGUF_U8 = 0, KVE_GGUF_I8 = 1, KVE_GGUF_U16 = 2, KVE_GGUF_I16 = 3, KVE_GGUF_U32 = 4, KVE_GGUF_I32 = 5,
    KVE_GGUF_F32 = 6, KVE_GGUF_BOOL = 7, KVE_GGUF_STRING = 8, KVE_GGUF_ARRAY = 9, KVE_GGUF_U64 = 10,
    KVE_GGUF_I64 = 11, KVE_GGUF_F64 = 12,
} kve_gguf_type;

/* "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array",
 * "u64", "i64", "f64"; "?" for any other number. */
KVE_API const char *kve_gguf_type_name(int type);

/* One metadata entry. */
typedef struct {
    const char *key;       /* NUL-terminated (a key holding a NUL byte reads shorter than key_len) */
    size_t key_len;        /* its bytes in the file */
    int type;              /* kve_gguf_type; KVE_GGUF_ARRAY: elem_type and n say what it holds */
    int elem_type;         /* an array's element type (never KVE_GGUF_ARRAY); else type */
    uint64_t n;            /* an array's element count; else 1 */
} kve_gguf_kv;

/* Entry i in file order into *out. KVE_OK; KVE_ERR_PARAM for i outside
 * [0, n_kv) (nothing written); KVE_ERR_NULL. */
KVE_API int kve_gguf_kv_at(const kve_gguf *g, int64_t i, kve_gguf_kv *out);
/* The index of key (keys are unique), or -1 (also for g or key NULL). */
KVE_API int64_t kve_gguf_find_key(const kve_gguf *g, const char *key);

/* One value: a scalar entry's, or one element of an array entry's. */
typedef struct {
    int type;              /* kve_gguf_type of this value (never KVE_GGUF_ARRAY) */
    int64_t i;             /* integers and bool (0/1): the value if it fits an int64_t, else 0 */
    uint64_t u;            /* integers and bool: the value if it is not negative, else 0 */
    double f;              /* every number and bool: the value as a double */
    const char *str;       /* strings: [len] bytes in the file, not NUL-terminated, any bytes
                            * (the format asks for UTF-8 but nothing checks it); else NULL */
    size_t len;
} kve_gguf_value;

/* Entry i's value (elem 0), or element elem of an array entry, into *out.
 * KVE_OK; KVE_ERR_PARAM for i outside [0, n_kv) or elem outside [0, n)
 * (nothing written); KVE_ERR_NULL. */
KVE_API int kve_gguf_value_at(const kve_gguf *g, int64_t i, uint64_t elem, kve_gguf_value *out);

enum { KVE_GGUF_MAX_DIMS = 4 };

/* One tensor of the table. */
typedef struct {
    const char *name;        /* NUL-terminated */
    int32_t type;            /* the ggml type number */
    const char *type_name;   /* "F32", "F16", "Q4_K", ... */
    int32_t n_dims;          /* 1 .. KVE_GGUF_MAX_DIMS */
    int64_t dims[KVE_GGUF_MAX_DIMS];   /* dims[0] the contiguous one; 1 past n_dims */
    uint64_t offset;         /* of its data in the data section (the file offset is
                              * data_offset + offset) */
    uint64_t n_bytes;        /* of its data */
} kve_gguf_tensor;

/* Tensor i in file order into *out. KVE_OK; KVE_ERR_PARAM for i outside
 * [0, n_tensors) (nothing written); KVE_ERR_NULL. */
KVE_API int kve_gguf_tensor_at(const kve_gguf *g, int64_t i, kve_gguf_tensor *out);
/* The index of the tensor named name, or -1 (also for g or name NULL). */
KVE_API int64_t kve_gguf_find_tensor(const kve_gguf *g, const char *name);

/* The hyperparameters the engine reads from a file's metadata (the
 * <arch>.* keys of an architecture it knows). */
typedef struct {
    int32_t n_vocab;         /* tokens in the vocabulary */
    int32_t dim;             /* embedding width */
    int32_t n_layers;
    int32_t n_heads;         /* query heads */
    int32_t n_kv_heads;      /* K/V heads (fewer than n_heads: GQA/MQA) */
    int32_t head_dim;
    int32_t ffn_dim;
    int32_t ctx_train;       /* the context it was trained for */
    float norm_eps;          /* RMSNorm epsilon */
    kv_rope_params rope;     /* of the full-attention layers when layers differ */
} kve_hparams;

/* g's hyperparameters into *out, as kve_model_load would read them (no
 * tensor is looked at). KVE_OK; KVE_ERR_MODEL (an architecture the engine
 * does not know, a missing or out-of-range hyperparameter; err says which,
 * nothing written); KVE_ERR_NULL. */
KVE_API int kve_gguf_hparams(const kve_gguf *g, kve_hparams *out, char *err, size_t errlen);

/* ---------------------------------------------------------------- grammars */

typedef struct kve_grammar kve_grammar;

/* A grammar every generated text must be a document of: GBNF-like rules
 * (json_schema 0) or a JSON Schema (1), text[0..len), compiled for m's
 * vocabulary (docs/GRAMMAR.md). KVE_OK with *out; KVE_ERR_PARAM (err says what
 * is wrong and where), KVE_ERR_NULL or KVE_ERR_NOMEM with *out NULL. One
 * grammar may serve any number of generations of m, several at once (each
 * keeps its own state); free it before m. */
KVE_API int kve_grammar_parse(const kve_model *m, const char *text, size_t len, int json_schema, kve_grammar **out,
                              char *err, size_t errlen);
KVE_API void kve_grammar_free(kve_grammar *g);
/* Whether text[0..len) compiles as kve_grammar_parse would take it, without a
 * model (a request checked before one is loaded). KVE_OK, or KVE_ERR_PARAM
 * with err saying what is wrong and where; KVE_ERR_NOMEM. */
KVE_API int kve_grammar_check(const char *text, size_t len, int json_schema, char *err, size_t errlen);
/* A grammar for a reply that is one call of one of n functions: head, then
 * the JSON object {"name": NAME, ARGS_KEY: ARGUMENTS} where ARGUMENTS is a
 * document of that function's parameter schema (JSON Schema text), then tail (the model family's call format: Hermes' "<tool_call>\n"
 * and "\n</tool_call>" with "arguments", Llama 3.1's "" and "" with
 * "parameters"). names [n], schemas [n], n in [1, 64]. KVE_OK with *out;
 * KVE_ERR_PARAM (err names the function and what is wrong), KVE_ERR_NULL or
 * KVE_ERR_NOMEM with *out NULL. */
KVE_API int kve_grammar_tool_calls(const kve_model *m, int32_t n, const char *const *names,
                                   const char *const *schemas, const char *head, const char *args_key,
                                   const char *tail, kve_grammar **out, char *err, size_t errlen);

/* ---------------------------------------------------------------- context */

typedef struct {
    int32_t n_ctx;        /* positions one request may hold (prompt and output); 0: the
                           * model's training context, at most 4096 */
    int32_t n_seqs;       /* requests decoded together; more wait their turn (default 8) */
    int32_t n_threads;    /* threads for the forward pass; 0: one per core (default) */
    int32_t n_batch;      /* rows one forward pass takes at most (default 512) */
    kv_dtype kv_type;     /* K/V storage: KV_F32, KV_F16 (default), KV_BF16, KV_Q8 */
    int32_t n_pages;      /* KV pool pages; 0: room for n_seqs full contexts (default) */
    int32_t max_waiting;  /* kve_submit refuses (KVE_ERR_QUEUE_FULL) past this many waiting
                           * requests (default 256) */
} kve_context_params;

KVE_API kve_context_params kve_context_default_params(void);

typedef struct kve_context kve_context;

/* A context for m, its scheduler thread started. KVE_OK, KVE_ERR_PARAM
 * (err names the field), KVE_ERR_NOMEM. */
KVE_API int kve_context_create(const kve_model *m, const kve_context_params *p, kve_context **out, char *err,
                               size_t errlen);
/* Ends every request still running (KVE_STOP_CANCEL), stops the thread,
 * frees. Requests not freed yet stay readable until kve_request_free. */
KVE_API void kve_context_free(kve_context *c);
KVE_API kve_context_params kve_context_get_params(const kve_context *c);   /* n_ctx, n_threads resolved */

/* What a context may do beyond kve_context_params: the cache policies, the
 * disk tier, prefix-cache events (the settings of `kvcache serve`). Start
 * from kve_context_default_options(): size says how much of the struct the
 * caller knows, so fields can be added at its end. */
typedef struct {
    size_t size;               /* sizeof(kve_context_options) */
    int32_t act_bits;          /* weight products on 16-bit or 8-bit integer activations, 0 on f32;
                                * -1: the engine's choice (default) */
    int32_t no_window;         /* 1: sliding-window layers keep every position (default 0) */
    int32_t context_shift;     /* 1: a sequence that fills n_ctx keeps its first n_keep positions,
                                * drops half of the rest and goes on (a request with max_tokens < 0
                                * then ends after n_ctx tokens, KVE_STOP_LENGTH); 0: it ends with
                                * KVE_STOP_CONTEXT (default) */
    int32_t n_keep;            /* positions a shift keeps; fewer than 4 count as 4 */
    int32_t draft_lookup;      /* 0 .. KVE_MAX_DRAFT: greedy requests decode by prompt lookup, up to
                                * this many drafts verified in one pass (the same tokens); 0: off */
    int32_t no_prefix;         /* 1: never reuse cached pages of earlier prompts (default 0) */
    const char *cache_dir;     /* a disk tier under the prefix cache (made if missing): reclaimed
                                * pages, and at kve_context_free every cached one, are kept there and
                                * read back for prompts that continue them, across restarts; NULL: off */
    uint64_t cache_disk_size;  /* bytes the tier keeps at most (default 1 GiB) */
    kv_prefix_listener on_prefix;  /* the prefix cache's changes (kvcache.h), on the scheduler
                                    * thread; NULL: none */
    void *prefix_user;
    void (*log)(void *user, const char *line);   /* one line about each session file restored or
                                                  * saved, on the scheduler thread; NULL: silent */
    void *log_user;
} kve_context_options;

/* act_bits -1, no shift (n_keep 4), no drafts, prefix reuse on, no disk tier
 * (its size 1 GiB), no listener, no log. */
KVE_API kve_context_options kve_context_default_options(void);
/* kve_context_create with options (NULL: the defaults). KVE_ERR_PARAM names
 * the field out of range (or an options size larger than this library
 * knows); KVE_ERR_IO when cache_dir cannot be made or read (err says why);
 * nothing allocated on failure. */
KVE_API int kve_context_create_ex(const kve_model *m, const kve_context_params *p, const kve_context_options *o,
                                  kve_context **out, char *err, size_t errlen);
/* Ends every running request (KVE_STOP_CANCEL) and refuses new ones
 * (KVE_ERR_STOPPED); requests stay readable, the context usable for reading
 * its stats until kve_context_free. The listener is called no more. */
KVE_API void kve_context_stop(kve_context *c);

/* A context's counters, taken at the end of its last step. */
typedef struct {
    size_t size;                        /* set to sizeof(kve_context_stats) before the call */
    int32_t running, waiting;           /* requests */
    int32_t pages_total, pages_used, pages_free, pages_cached;   /* KV pool pages (cached: kept only
                                                                  * for the prefix cache) */
    int32_t page_size;                  /* positions a page holds */
    uint64_t prefix_queries, prefix_hits;   /* prompt tokens looked up in the prefix cache, found */
    uint64_t prompt_tokens, generation_tokens;
    uint64_t preemptions, prefill_waits, disk_waits, steps, rows, shifts;
    uint64_t drafted, accepted;         /* prompt-lookup drafts verified, taken */
    uint64_t session_restores, session_restored, session_refused, session_saves, session_save_failures;
    double session_seconds;             /* scheduler-thread time in session file I/O */
    int32_t disk_on;                    /* a disk tier is open; the disk_* below count */
    uint64_t disk_hits, disk_misses, disk_damaged, disk_bytes_read, disk_writes, disk_bytes_written;
    uint64_t disk_dropped, disk_evictions, disk_entries, disk_bytes;
} kve_context_stats;

/* Fills *st (st->size bytes of it). KVE_OK; KVE_ERR_NULL; KVE_ERR_PARAM for a
 * size of 0 or beyond this library's struct (nothing written). */
KVE_API int kve_context_get_stats(const kve_context *c, kve_context_stats *st);
/* Removes the temporary files that session saves killed before their rename
 * left in dir (NAME.kvs.XXXXXX); their count, or -1 with err saying why. */
KVE_API int kve_session_dir_clean(const char *dir, char *err, size_t errlen);

/* ---------------------------------------------------------------- requests */

enum { KVE_MAX_STOPS = 8, KVE_MAX_TOP = 20, KVE_MAX_DRAFT = 64 /* kve_generate_params.draft_lookup */ };

typedef struct kve_request kve_request;

/* What a callback receives: one per token, then one with stop set. */
typedef struct {
    int32_t token;         /* the token, or -1 (the last event) */
    const char *text;      /* [text_len] text now safe to show; may be empty */
    size_t text_len;
    float logprob;         /* log p(token) under the model, with top_logprobs >= 0 */
    kve_stop_reason stop;  /* KVE_STOP_NONE, or why the request ended (the last event) */
    /* with kve_submit_ex: */
    int32_t choice;              /* 0 .. n_choices-1: each choice has its token events, then one
                                  * with stop set */
    int32_t n_top;               /* alternatives, with top_logprobs > 0 */
    const int32_t *top_ids;      /* [n_top] best first */
    const float *top_logprobs;   /* [n_top] */
    int32_t n_prompt, n_cached;  /* prompt tokens, of those reused (from the prefix cache or the
                                  * session file) */
    int32_t n_generated;         /* this choice's tokens so far */
    int status;                  /* with KVE_STOP_ERROR: the cause */
    const char *error;           /* with KVE_STOP_ERROR: what happened; else NULL */
} kve_event;

/* Called on the context's scheduler thread, in order; it must not block for
 * long (every request waits for it) and must not call kve_request_free. */
typedef void (*kve_event_fn)(void *user, const kve_event *ev);

typedef struct {
    /* the prompt: exactly one of */
    const char *prompt;                  /* text (tokenized with BOS, control tokens as text) */
    const int32_t *tokens;               /* [n_tokens] token ids (copied) */
    int32_t n_tokens;
    const kve_chat_message *messages;    /* [n_messages]: the chat template applied, the
                                          * assistant's turn opened */
    int32_t n_messages;
    /* generation */
    int32_t max_tokens;        /* tokens to generate at most, >= 1 (default 128); < 0: until the
                                * context is full */
    float temperature;         /* <= 0: greedy (default 0.8) */
    int32_t top_k;             /* 0: all (default 40) */
    float top_p;               /* (0, 1], 1: all (default 0.95) */
    float min_p;               /* [0, 1], 0: off (default) */
    float repeat_penalty;      /* 0 or 1: off (default 1) */
    float presence_penalty;    /* OpenAI's, [-2, 2] (default 0) */
    float frequency_penalty;   /* OpenAI's, [-2, 2] (default 0) */
    uint64_t random_state;     /* the sampling stream: one value, one sequence of draws
                                * (default 1) */
    const char *const *stops;  /* [n_stops] stop strings, at most KVE_MAX_STOPS, none empty */
    int32_t n_stops;
    int32_t top_logprobs;      /* < 0: no log-probabilities (default); 0 .. KVE_MAX_TOP: the
                                * token's and that many alternatives' */
    kve_event_fn on_event;     /* or NULL: poll */
    void *user;
    int32_t enable_thinking;   /* with messages: the template's enable_thinking switch, as
                                * kve_chat_apply_ex takes it (default -1: the template's) */
} kve_request_params;

/* max_tokens 128, temperature 0.8, top_k 40, top_p 0.95, min_p 0, no
 * penalties, random_state 1, no stops, no log-probabilities, no callback,
 * enable_thinking -1. */
KVE_API kve_request_params kve_request_default_params(void);

/* Queues a request on c. KVE_OK with *out; or, nothing queued and *out NULL:
 * KVE_ERR_PARAM (no prompt or more than one, bad sampling or stop settings;
 * err says which), KVE_ERR_TEMPLATE, KVE_ERR_TOKEN, KVE_ERR_TOO_LARGE,
 * KVE_ERR_QUEUE_FULL, KVE_ERR_STOPPED, KVE_ERR_NOMEM. */
KVE_API int kve_submit(kve_context *c, const kve_request_params *p, kve_request **out, char *err, size_t errlen);

/* A bias added to one token's logit: -100 bans it, 100 all but forces it. */
typedef struct {
    int32_t token;
    float bias;             /* [-100, 100] */
} kve_logit_bias;

/* What a request may ask beyond kve_request_params. Start from
 * kve_request_default_options(); size as in kve_context_options. */
typedef struct {
    size_t size;                       /* sizeof(kve_request_options) */
    int32_t n_choices;                 /* 1 .. KVE_MAX_CHOICES replies to one prompt (one prefill, the
                                        * sequence forked), choice i sampling with random_state + i;
                                        * each choice's events carry its index (default 1) */
    int32_t repeat_last_n;             /* repeat_penalty's window, prompt included; -1: all (default 64) */
    const kve_logit_bias *logit_bias;  /* [n_logit_bias] (copied), ids in the vocabulary */
    int32_t n_logit_bias;
    const kve_grammar *grammar;        /* every choice is a document of it (kept alive by the caller
                                        * until kve_request_free), or NULL */
    int32_t json_object;               /* 1: every choice is one JSON object (no grammar with it) */
    int32_t callback_only;             /* 1: events go to on_event alone, nothing is kept for
                                        * kve_request_poll (which gives only the end), as with
                                        * n_choices > 1; 0 (default) */
    const char *session_file;          /* a session file (path, copied): at first admission the
                                        * longest prefix of the prompt it holds is restored when that
                                        * reaches further than the prefix cache; when choice 0 ends (not
                                        * cancelled, failed or shifted) its sequence is saved there.
                                        * A file that cannot be used is ignored (logged). NULL: none */
} kve_request_options;

enum { KVE_MAX_CHOICES = 16 };

/* n_choices 1, repeat_last_n 64, no bias, no grammar, polling on, no session
 * file. */
KVE_API kve_request_options kve_request_default_options(void);
/* kve_submit with options (NULL: the defaults). With n_choices > 1 or
 * callback_only the callback carries the tokens and kve_request_poll gives no
 * text or tokens, only the end (stop set once every choice has ended: choice
 * 0's reason) and the counts. Refusals as kve_submit's, nothing queued:
 * KVE_ERR_PARAM also for n_choices, repeat_last_n, a bias value, a grammar
 * with json_object, an options size beyond this library's; KVE_ERR_TOKEN for
 * a bias id outside the vocabulary. */
KVE_API int kve_submit_ex(kve_context *c, const kve_request_params *p, const kve_request_options *o,
                          kve_request **out, char *err, size_t errlen);

/* What kve_request_poll gives: the output made since the last poll. Every
 * pointer is valid until the next poll or free of the request. */
typedef struct {
    const char *text;             /* [text_len] new text (valid UTF-8) */
    size_t text_len;
    const int32_t *tokens;        /* [n_tokens] new tokens */
    int32_t n_tokens;
    const float *logprobs;        /* [n_tokens] with top_logprobs >= 0, else NULL */
    const int32_t *top_ids;       /* [n_tokens][n_top] alternatives, best first, or NULL */
    const float *top_logprobs;    /* [n_tokens][n_top] */
    int32_t n_top;
    kve_stop_reason stop;         /* KVE_STOP_NONE: still running */
    int status;                   /* with KVE_STOP_ERROR: the cause (KVE_ERR_NONFINITE, ...) */
    const char *error;            /* with KVE_STOP_ERROR: what happened; else "" */
    int32_t n_prompt;             /* prompt tokens */
    int32_t n_cached;             /* of those, reused from earlier requests (not prefilled) */
    int32_t n_generated;          /* tokens generated so far (an end-of-turn token not counted) */
} kve_output;

/* Waits up to timeout_ms (< 0: as long as it takes; 0: not at all) until r
 * has output not polled yet or has ended, and gives it. KVE_OK (out filled;
 * out->stop says whether it ended: later polls then give nothing new and
 * the same stop), KVE_ERR_TIMEOUT (out filled with nothing new), KVE_ERR_NULL. */
KVE_API int kve_request_poll(kve_request *r, int timeout_ms, kve_output *out);
/* Ends r at the next step (KVE_STOP_CANCEL) unless it has ended. */
KVE_API void kve_request_cancel(kve_request *r);
/* Cancels r if it is running, waits until the scheduler lets it go, frees it. */
KVE_API void kve_request_free(kve_request *r);

/* ---------------------------------------------------------------- sessions */

/* A kve_session is one sequence on a cache of its own, run on the caller's
 * thread (no scheduler, nothing shared): a conversation that keeps its cache
 * between calls, so each turn prefills only what is new; session files; a
 * context shift when full; prompt-lookup drafts; prefill and decode timed
 * apart. `kvcache generate` and `kvcache chat` run on it. Calls on one
 * session are made by one thread at a time; sessions of one model may run
 * on several threads at once.
 *
 *     kve_session *s;
 *     kve_session_params sp = kve_session_default_params();
 *     kve_session_create(m, &sp, &s, err, sizeof err);
 *     kve_generate_params gp = kve_generate_default_params();
 *     gp.on_text = print, gp.temperature = 0;
 *     kve_generate_result res;
 *     kve_session_generate(s, ids, n_ids, &gp, &res);   // the next turn: the whole
 *     kve_session_free(s);                               // conversation again; what
 *                                                        // the cache holds is kept */

typedef struct {
    int32_t n_ctx;       /* positions the sequence may hold; 0: the model's training context,
                          * at most 4096 (default) */
    int32_t n_threads;   /* threads for the forward pass; 0: one per core (default) */
    int32_t n_batch;     /* prompt rows one forward pass takes at most (default 256) */
    kv_dtype kv_type;    /* K/V storage: KV_F32, KV_F16 (default), KV_BF16, KV_Q8 */
    int32_t act_bits;    /* weight products on 16-bit or 8-bit integer activations, 0: on f32
                          * (the reference); -1: the engine's choice (default) */
    int32_t no_window;   /* 1: sliding-window layers keep every position (same results, for
                          * comparing memory); 0: default */
} kve_session_params;

KVE_API kve_session_params kve_session_default_params(void);

typedef struct kve_session kve_session;

/* A session for m with an empty sequence. KVE_OK; KVE_ERR_PARAM (err names
 * the field), KVE_ERR_NOMEM (err says how much the cache needed), KVE_ERR_NULL;
 * nothing allocated on failure. m outlives it. */
KVE_API int kve_session_create(const kve_model *m, const kve_session_params *p, kve_session **out, char *err,
                               size_t errlen);
KVE_API void kve_session_free(kve_session *s);
KVE_API kve_session_params kve_session_get_params(const kve_session *s);   /* n_ctx, n_threads resolved */

/* What a session may do beyond kve_session_params. Start from
 * kve_session_default_options(); size as in kve_context_options (fields are
 * added at the end; an older caller's shorter struct keeps the defaults of
 * the fields it lacks). */
typedef struct {
    size_t size;          /* sizeof(kve_session_options) */
    int32_t window;       /* > 0: layers without a window of their own attend to their last
                           * `window` positions only, through window caches that evict pages (a
                           * sliding window forced on any model, to test those caches: `kvcache
                           * verify --policy window`); 0: the model's own windows (default) */
} kve_session_options;

/* window 0. */
KVE_API kve_session_options kve_session_default_options(void);
/* kve_session_create with options (NULL: the defaults). KVE_ERR_PARAM also
 * for a negative window or an options size this library does not know (err
 * says which). */
KVE_API int kve_session_create_ex(const kve_model *m, const kve_session_params *p, const kve_session_options *o,
                                  kve_session **out, char *err, size_t errlen);

/* Called with prefill progress: rows done of total (done == total at the end). */
typedef void (*kve_progress_fn)(void *user, int64_t done, int64_t total);

typedef struct {
    int32_t max_tokens;        /* tokens to generate at most (default 128); < 0: until another
                                * stop; 0: prefill only */
    float temperature;         /* <= 0: greedy (default 0.8) */
    int32_t top_k;             /* 0: all (default 40) */
    float top_p;               /* (0, 1], 1: all (default 0.95) */
    float min_p;               /* [0, 1], 0: off (default) */
    float repeat_penalty;      /* > 0; 1: off (default) */
    int32_t repeat_last_n;     /* its window in tokens, prompt included; -1: all (default 64) */
    float presence_penalty;    /* OpenAI's, [-2, 2] (default 0) */
    float frequency_penalty;   /* OpenAI's, [-2, 2] (default 0) */
    uint64_t random_state;     /* the sampling stream (default 1) */
    const char *const *stops;  /* [n_stops] stop strings, at most KVE_MAX_STOPS, none empty */
    int32_t n_stops;
    const kve_grammar *grammar; /* the reply is a document of it, or NULL (default) */
    int32_t reserve;           /* positions kept free after the reply, for an end-of-turn marker
                                * fed after it (kve_session_feed); default 0 */
    int32_t context_shift;     /* 1: a full context keeps its first n_keep positions, drops half
                                * of the rest and goes on; 0: a full context stops (default) */
    int32_t n_keep;            /* positions a shift keeps (the system prompt); fewer than 4
                                * count as 4 */
    int32_t draft_lookup;      /* N in 1 .. KVE_MAX_DRAFT: prompt-lookup speculative decoding,
                                * up to N tokens proposed from the prompt and output, verified in
                                * one pass; the same tokens as without it. 0: off (default) */
    int (*on_token)(void *user, int32_t token);                  /* each token, before its text;
                                                                  * nonzero stops (KVE_STOP_CANCEL) */
    int (*on_text)(void *user, const char *text, size_t len);    /* text as it is safe to show (the
                                                                  * text rules above); nonzero stops */
    void *user;
    kve_progress_fn on_progress;   /* prefill progress, or NULL */
    void *progress_user;
    int32_t ignore_eog;        /* 1: end-of-turn tokens are generated like any other, only the
                                * other stops end (benchmarks); 0: they stop (default) */
} kve_generate_params;

/* max_tokens 128, temperature 0.8, top_k 40, top_p 0.95, min_p 0, no
 * penalties (repeat window 64), random_state 1, no stops, no grammar, no
 * reserve, no shift, no drafts, no callbacks. */
KVE_API kve_generate_params kve_generate_default_params(void);

typedef struct {
    kve_stop_reason stop;
    int status;                     /* KVE_OK, or the error behind KVE_STOP_ERROR */
    int32_t n_prompt;               /* prompt tokens given */
    int32_t n_reused;               /* of those, already in the cache (not prefilled) */
    int32_t n_generated;            /* tokens generated (an end-of-turn token not counted) */
    int32_t eog_token;              /* with KVE_STOP_EOG: that token (not in the sequence); else -1 */
    double t_prefill, t_decode;     /* seconds */
    int32_t n_shifts, n_discarded;  /* context shifts made, and the positions they dropped */
    int32_t n_passes;               /* forward passes while decoding */
    int32_t n_drafted, n_accepted;  /* draft tokens verified, and of those accepted */
    char message[192];              /* with KVE_STOP_ERROR or KVE_STOP_CONTEXT: what happened */
} kve_generate_result;

/* Makes the sequence hold tokens[0..n) (n >= 1), then generates after them
 * until a stop, which *res reports: the longest common prefix with what the
 * sequence held is kept (not prefilled again), the rest prefilled. The
 * sequence then holds the prompt and every generated token; the cache holds
 * all of them but perhaps the last (fed by the next generate or feed).
 * Returns res->status: KVE_OK for every stop but KVE_STOP_ERROR; or, nothing
 * changed: KV_ERR_CAPACITY (a prompt that leaves no room to generate, stop
 * KVE_STOP_CONTEXT, res->message says the numbers), KVE_ERR_TOKEN or
 * KVE_ERR_PARAM (stop KVE_STOP_ERROR, res->message says which setting); or
 * the failure behind KVE_STOP_ERROR (KVE_ERR_NONFINITE: nothing was sampled
 * from the bad logits), the sequence then holding the prompt and the tokens
 * made before the failure. */
KVE_API int kve_session_generate(kve_session *s, const int32_t *tokens, int32_t n, const kve_generate_params *p,
                                 kve_generate_result *res);
/* Appends tokens[0..n) through the model without sampling (an end-of-turn
 * marker after a reply). All or nothing: KVE_OK, KV_ERR_CAPACITY (no room),
 * KVE_ERR_TOKEN, KVE_ERR_NULL. */
KVE_API int kve_session_feed(kve_session *s, const int32_t *tokens, int32_t n);
/* kve_session_feed that also returns the model's scores: the logits of the
 * token after each of tokens[first..n), n_vocab floats per token, row after
 * row into logits[(n - first) * n_vocab] (first == n: none, logits may then
 * be NULL). For scoring text (perplexity, log-likelihoods of a continuation).
 * The logits are as the model made them: NaN or infinity are not checked.
 * All or nothing: KVE_OK, KV_ERR_CAPACITY (no room), KVE_ERR_TOKEN,
 * KVE_ERR_PARAM (n < 0, first outside [0, n]), KVE_ERR_NULL. */
KVE_API int kve_session_eval(kve_session *s, const int32_t *tokens, int32_t n, int32_t first, float *logits);
/* The reference kve_session_eval is checked against: the logits of the
 * token after each of tokens[first..n) for tokens[0..n) at positions 0..n-1,
 * computed with no cache at all, in one causal pass with dense attention over
 * fresh f32 K/V (the session's windows, threads and act_bits as they are).
 * Row t is what a full recomputation of tokens[0..t] gives, so one call
 * checks every step of a cached decode. Into logits[(n - first) * n_vocab]
 * (first == n: none, logits may be NULL). The session's sequence and cache
 * are not used or changed. KVE_OK, KVE_ERR_PARAM (n outside [0, n_ctx],
 * first outside [0, n]), KVE_ERR_TOKEN, KVE_ERR_NOMEM, KVE_ERR_NULL. */
KVE_API int kve_session_eval_reference(kve_session *s, const int32_t *tokens, int32_t n, int32_t first,
                                       float *logits);
/* A context shift now: keeps the first n_keep cached positions and drops
 * after them half of the rest, or n_min if that is more (what the next
 * prompt needs), at most all of the rest; *n_dropped positions. KVE_OK;
 * KVE_ERR_PARAM (n_keep past what the cache holds, n_min past what follows
 * it), KVE_ERR_NULL, or the cache's error, each with nothing changed. */
KVE_API int kve_session_shift(kve_session *s, int32_t n_keep, int32_t n_min, int32_t *n_dropped);
/* Keeps the first n tokens the sequence holds (0 <= n <= what it holds):
 * KVE_OK, KVE_ERR_PARAM (nothing changed), KVE_ERR_NULL. A sliding-window
 * cache that has evicted positions a cut back to n needs cannot keep them:
 * the sequence is then emptied (kve_session_tokens says which happened).
 * The positions cut stay findable in the prefix cache: a later generation
 * from an empty sequence may resume from them. */
KVE_API int kve_session_truncate(kve_session *s, int32_t n);
/* Forgets everything: the sequence is empty. */
KVE_API void kve_session_reset(kve_session *s);
/* Empties the prefix cache: no later generation resumes from positions cut
 * before (to measure a prefill, or to free what it held). */
KVE_API void kve_session_clear_prefixes(kve_session *s);
/* The tokens the sequence holds, [*n] (valid until the next call on s). */
KVE_API const int32_t *kve_session_tokens(const kve_session *s, int32_t *n);
/* Of those, the ones in the cache. */
KVE_API int32_t kve_session_n_cached(const kve_session *s);
/* Writes the cached tokens and their K/V to path. KVE_OK, or KV_ERR_IO with
 * err saying why (nothing changed in s). */
KVE_API int kve_session_save(const kve_session *s, const char *path, char *err, size_t errlen);
/* Empties s, then restores from path the longest common prefix of the
 * file's tokens and prompt[0..n) (at most n - 1: one token is left to
 * prefill for its logits); *n_restored positions. KVE_OK, or KV_ERR_IO with
 * err saying why (missing, corrupt, another model or K/V type, nothing in
 * common): s is then empty and usable. */
KVE_API int kve_session_load(kve_session *s, const char *path, const int32_t *prompt, int32_t n, int32_t *n_restored,
                             char *err, size_t errlen);
/* The cache's occupancy, all layers together. */
KVE_API kv_cache_stats kve_session_cache_stats(const kve_session *s);
/* Cache group g (0 ..): models with sliding-window layers (Gemma 3) keep one
 * cache per window size. Its layers, window (0: full attention; a forced
 * window, kve_session_options.window, included) and occupancy, into the
 * pointers (each may be NULL); KVE_OK, KVE_ERR_PARAM past the last group
 * (nothing written), KVE_ERR_NULL. */
KVE_API int kve_session_cache_group(const kve_session *s, int32_t g, int32_t *n_layers, int32_t *window,
                                    kv_cache_stats *stats);
/* The K and V the cache holds for cached positions [pos, pos + n) of layer
 * `layer` (0 .. its n_layers - 1) of cache group g, decoded to f32 from the
 * K/V type: n rows of n_kv_heads * head_dim floats into each of k and v.
 * KVE_OK; KVE_ERR_PARAM (g or layer out of range, a position not cached or
 * already evicted by a sliding window; nothing written), KVE_ERR_NULL. */
KVE_API int kve_session_read_kv(const kve_session *s, int32_t g, int32_t layer, int32_t pos, int32_t n, float *k,
                                float *v);

#ifdef __cplusplus
}
#endif

#endif
