/* engine/gen/session_file.c - a sequence on disk with what it was made from.
 *
 * File layout (native little-endian):
 *     magic "KVCSESS1" | u32 version (1) | u32 kv_type | u64 model fingerprint |
 *     char model name [128] | i32 n_vocab | i32 n_tokens | i32 n_caches | i32 0 |
 *     i32 tokens [n_tokens] | u64 FNV-1a of every byte before it |
 *     for each cache of the context (one per layer group): the library's
 *     sequence (kv_seq_save_file: its own header and checksum)
 * The engine's header comes first so that a file for another model or K/V
 * type is refused with the reason before any K/V is read, and so that the
 * tokens can be compared with the new prompt before anything is restored. */
#include "policy.h"
#include "../model/arch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char MAGIC[8] = {'K', 'V', 'C', 'S', 'E', 'S', 'S', '1'};
enum { VERSION = 1, NAME_LEN = 128 };

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t kv_type;
    uint64_t fingerprint;
    char name[NAME_LEN];
    int32_t n_vocab;
    int32_t n_tokens;
    int32_t n_caches;   /* the library's sequences that follow: one per cache of the context */
    int32_t unused;
} file_header;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

static const uint64_t FNV0 = 0xCBF29CE484222325ull;

uint64_t llm_model_fingerprint(const llm_model *m) {
    const llm_hparams *hp = &m->hp;
    const int32_t shape[] = {hp->n_vocab, hp->dim, hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->head_dim,
                             hp->ffn_dim, hp->rope.rot_dim, (int32_t)hp->rope.layout, m->tok_embd.type,
                             m->output.type, m->n_groups, m->n_ropes};
    uint64_t h = fnv(FNV0, shape, sizeof shape);
    h = fnv(h, m->arch->name, strlen(m->arch->name));
    h = fnv(h, &hp->norm_eps, sizeof hp->norm_eps);
    for (int32_t i = 0; i < m->n_ropes; i++)
        h = fnv(h, m->ropes[i].inv_freq, sizeof(double) * (size_t)(m->ropes[i].params.rot_dim / 2));
    for (int32_t l = 0; l < hp->n_layers; l++) {
        h = fnv(h, &m->lhp[l], sizeof m->lhp[l]);
        const float *norms[2] = {m->layers[l].attn_norm, m->layers[l].ffn_norm};
        for (int k = 0; k < 2; k++)
            if (norms[k]) h = fnv(h, norms[k], sizeof(float) * (size_t)hp->dim);
    }
    h = fnv(h, &m->weight_bytes, sizeof m->weight_bytes);
    return fnv(h, m->output_norm, sizeof(float) * (size_t)hp->dim);
}

static int fail(char *err, size_t errlen, const char *msg, const char *path) {
    if (errlen) snprintf(err, errlen, "%s: %s", path, msg);
    return -1;
}

int llm_session_file_save(llm_context *c, int32_t seq, const int32_t *tokens, int32_t n, const char *path,
                          char *err, size_t errlen) {
    if (!c || !path || (n > 0 && !tokens) || n < 0) return fail(err, errlen, "bad arguments", path ? path : "");
    if (llm_seq_length(c, seq) != n) return fail(err, errlen, "the token ids do not match the sequence", path);
    const llm_model *m = llm_context_model(c);
    file_header h = {.version = VERSION, .kv_type = (uint32_t)llm_context_get_params(c).kv_type,
                     .fingerprint = llm_model_fingerprint(m), .n_vocab = m->hp.n_vocab, .n_tokens = n,
                     .n_caches = llm_context_n_caches(c)};
    memcpy(h.magic, MAGIC, sizeof MAGIC);
    snprintf(h.name, sizeof h.name, "%s", m->name);
    uint64_t sum = fnv(fnv(FNV0, &h, sizeof h), tokens, sizeof(int32_t) * (size_t)n);
    /* a temporary name of this writer's own in the same directory (mkstemp),
     * renamed over path when whole: readers see the old file or the new one,
     * and two writers of one path never write into each other's file */
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp) return fail(err, errlen, "path too long", path);
    struct stat st;   /* the rename would fail after the whole write, or replace a special file */
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return fail(err, errlen, S_ISDIR(st.st_mode) ? "is a directory, not a session file: not replaced"
                                                     : "is not a regular file (a FIFO, socket or device): not replaced",
                    path);
    int fd = mkstemp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        if (errlen) snprintf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        if (fd >= 0) close(fd), remove(tmp);
        return -1;
    }
    int ok = fwrite(&h, sizeof h, 1, f) == 1 && fwrite(tokens, sizeof(int32_t), (size_t)n, f) == (size_t)n &&
             fwrite(&sum, sizeof sum, 1, f) == 1;
    for (int32_t i = 0; ok && i < h.n_caches; i++) ok = kv_seq_save_file(llm_context_cache_at(c, i), seq, f) == KV_OK;
    int werr = ok ? 0 : errno;
    if (fclose(f) != 0 && ok) ok = 0, werr = errno;
    const char *step = "cannot write";
    if (ok && rename(tmp, path) != 0) ok = 0, werr = errno, step = "cannot rename the written file into place";
    if (!ok) {
        remove(tmp);
        if (errlen) snprintf(err, errlen, "%s: %s: %s", path, step, werr ? strerror(werr) : "I/O error");
        return -1;
    }
    return 0;
}

/* Reads and checks the engine's header and tokens [*n] (malloc'ed); 0, or -1
 * with the reason. */
static int read_header(llm_context *c, FILE *f, const char *path, file_header *h, int32_t **tokens, char *err,
                       size_t errlen) {
    const llm_model *m = llm_context_model(c);
    *tokens = NULL;
    if (fread(h, sizeof *h, 1, f) != 1 || memcmp(h->magic, MAGIC, sizeof MAGIC) != 0)
        return fail(err, errlen, "not a session file", path);
    if (h->version != VERSION) return fail(err, errlen, "a session file of another version", path);
    h->name[NAME_LEN - 1] = 0;
    if (h->fingerprint != llm_model_fingerprint(m) || h->n_vocab != m->hp.n_vocab) {
        if (errlen && strcmp(h->name, m->name))
            snprintf(err, errlen, "%s: made for another model ('%s'), not '%s'", path, h->name, m->name);
        else if (errlen)   /* the names agree: another file of that model (another quantization, another build) */
            snprintf(err, errlen, "%s: made for another model named '%s' too (other weights or vocabulary)", path,
                     h->name);
        return -1;
    }
    kv_dtype want = llm_context_get_params(c).kv_type;
    if (h->kv_type != (uint32_t)want) {
        if (errlen)
            snprintf(err, errlen, "%s: made with K/V type %s, this run uses %s", path,
                     kv_dtype_name((kv_dtype)h->kv_type), kv_dtype_name(want));
        return -1;
    }
    int32_t n_ctx = llm_context_get_params(c).n_ctx;
    if (h->n_tokens < 0) return fail(err, errlen, "corrupt (token count)", path);
    if (h->n_tokens > n_ctx) {
        if (errlen) snprintf(err, errlen, "%s: holds %d tokens, more than this context's %d", path, (int)h->n_tokens, (int)n_ctx);
        return -1;
    }
    int32_t *t = malloc(sizeof(int32_t) * (size_t)(h->n_tokens ? h->n_tokens : 1));
    uint64_t sum;
    if (!t) return fail(err, errlen, "out of memory", path);
    if (fread(t, sizeof(int32_t), (size_t)h->n_tokens, f) != (size_t)h->n_tokens || fread(&sum, sizeof sum, 1, f) != 1) {
        free(t);
        return fail(err, errlen, "truncated", path);
    }
    if (sum != fnv(fnv(FNV0, h, sizeof *h), t, sizeof(int32_t) * (size_t)h->n_tokens)) {
        free(t);
        return fail(err, errlen, "corrupt (header checksum)", path);
    }
    for (int32_t i = 0; i < h->n_tokens; i++)
        if (t[i] < 0 || t[i] >= m->hp.n_vocab) {
            free(t);
            return fail(err, errlen, "corrupt (a token id outside the vocabulary)", path);
        }
    *tokens = t;
    return 0;
}

/* Opens path and checks its header (*h) against c; *common: how many of its
 * tokens begin prompt [n_prompt] (at most n_prompt - 1). Returns the stream
 * just after the engine's header (the library's sequences follow), or NULL
 * with the reason (*missing: 1 when there is no such file). */
static FILE *open_checked(llm_context *c, const char *path, const int32_t *prompt, int32_t n_prompt,
                          file_header *h, int32_t *common, int *missing, char *err, size_t errlen) {
    /* Without blocking: opening a FIFO for reading would wait for a writer.
     * Anything but a regular file is refused before a byte is read. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    *missing = fd < 0 && errno == ENOENT;
    if (fd < 0) {
        if (errlen) snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    FILE *f = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? fdopen(fd, "rb") : NULL;
    if (!f) {
        if (errlen)
            snprintf(err, errlen, "%s: %s", path,
                     fstat(fd, &st) ? strerror(errno) : S_ISDIR(st.st_mode) ? "is a directory, not a session file"
                     : S_ISREG(st.st_mode) ? "out of memory" : "is not a regular file (a FIFO, socket or device)");
        close(fd);
        return NULL;
    }
    int32_t *tokens;
    if (read_header(c, f, path, h, &tokens, err, errlen)) {
        fclose(f);
        return NULL;
    }
    int32_t k = 0;
    while (k < h->n_tokens && k < n_prompt - 1 && tokens[k] == prompt[k]) k++;
    free(tokens);
    if (k == 0) {
        fclose(f);
        fail(err, errlen, "shares no prefix with this prompt", path);
        return NULL;
    }
    *common = k;
    return f;
}

int llm_session_file_peek(llm_context *c, const char *path, const int32_t *prompt, int32_t n_prompt,
                          int32_t *n_common, int32_t *n_file, char *err, size_t errlen) {
    if (n_common) *n_common = 0;
    if (n_file) *n_file = 0;
    if (!c || !path || !n_common || (n_prompt > 0 && !prompt)) return fail(err, errlen, "bad arguments", path ? path : "");
    file_header h;
    int missing;
    FILE *f = open_checked(c, path, prompt, n_prompt, &h, n_common, &missing, err, errlen);
    if (!f) return missing ? 1 : -1;
    fclose(f);
    if (n_file) *n_file = h.n_tokens;
    return 0;
}

int llm_session_file_load(llm_context *c, const char *path, const int32_t *prompt, int32_t n_prompt,
                          int32_t *seq, int32_t *n_restored, char *err, size_t errlen) {
    if (seq) *seq = -1;
    if (n_restored) *n_restored = 0;
    if (!c || !path || !seq || !n_restored || (n_prompt > 0 && !prompt)) return fail(err, errlen, "bad arguments", path ? path : "");
    file_header h;
    int32_t common = 0;
    int missing;
    FILE *f = open_checked(c, path, prompt, n_prompt, &h, &common, &missing, err, errlen);
    if (!f) return -1;
    /* one sequence per cache, which must get the same id in each */
    int32_t got[LLM_MAX_GROUPS], n_got = 0, rc = KV_OK;
    const char *why = h.n_caches != llm_context_n_caches(c) ? "made for another cache layout" : NULL;
    for (int32_t i = 0; !why && i < h.n_caches; i++) {
        rc = kv_seq_restore_file(llm_context_cache_at(c, i), f, &got[i]);
        if (rc == KV_OK) n_got++;
        why = rc == KV_ERR_FORMAT ? "corrupt or truncated K/V"
              : rc == KV_ERR_MISMATCH ? "made for another cache configuration"
              : rc ? kv_status_str(rc)
              : got[i] != got[0] ? "the sequence slots of the caches differ"
              : kv_seq_length(llm_context_cache_at(c, i), got[i]) != h.n_tokens ? "corrupt (the K/V hold another number of tokens)"
              : NULL;
    }
    if (!why && fgetc(f) != EOF) why = "corrupt (bytes after the end)";
    fclose(f);
    int32_t s = n_got ? got[0] : -1;
    if (!why && (rc = llm_seq_truncate(c, s, common)) != LLM_OK) why = llm_status_str(rc);
    if (why) {
        for (int32_t i = 0; i < n_got; i++) { /* emptied first, so that no page is offered to the prefix cache */
            kv_seq_truncate(llm_context_cache_at(c, i), got[i], 0);
            kv_seq_remove(llm_context_cache_at(c, i), got[i]);
        }
        return fail(err, errlen, why, path);
    }
    *seq = s;
    *n_restored = common;
    return 0;
}

/* A name llm_session_file_save's mkstemp makes: "NAME.kvs." and 6 letters
 * or digits. */
static int is_temp_name(const char *name) {
    size_t n = strlen(name);
    if (n < 12 || memcmp(name + n - 11, ".kvs.", 5)) return 0;
    for (size_t i = n - 6; i < n; i++)
        if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= 'A' && name[i] <= 'Z') || (name[i] >= '0' && name[i] <= '9')))
            return 0;
    return 1;
}

int llm_session_dir_clean(const char *dir, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errlen) snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    int removed = 0;
    for (struct dirent *de; (de = readdir(d));) {
        struct stat st;
        if (!is_temp_name(de->d_name) || fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
            continue;
        removed += unlinkat(dirfd(d), de->d_name, 0) == 0;
    }
    closedir(d);
    return removed;
}
