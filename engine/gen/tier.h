/* engine/gen/tier.h - a disk tier under the prefix cache: the named pages the
 * pool reclaims (and, at close, every named page) are written to a folder,
 * one file per page, content-addressed by the page's chained name, its cache
 * group and the model's fingerprint; a prompt that misses in RAM finds them
 * there again, also after a restart.
 *
 * Every cache group has its pages there (a model with full and window
 * layers: a prompt resumes at the longest point every group serves, a full
 * group from all pages before it, a window group from those of its window).
 * Writes run on the tier's writer thread: the scheduler only copies the page
 * into a bounded queue (full: the page is dropped, counted; at close the
 * spills wait for room instead). Reads run on its reader thread: the
 * scheduler plans a load (llm_tier_fetch), lets the request wait while
 * others decode, and applies it when it is ready (llm_tier_apply). The folder is bounded (LRU by last use,
 * kept across restarts as the files' modification times). Every file is
 * checked as untrusted input: its header against what was asked, its size,
 * and a checksum of all of it; a file that fails is a miss (and removed),
 * never wrong K/V.
 *
 * File layout (native little-endian):
 *     magic "KVCTIER1" | u32 version (1) | u32 group | u64 model fingerprint |
 *     u64 hash | u64 parent hash | u32 has_parent | u32 n_tokens |
 *     u64 data bytes | i32 tokens [n_tokens] | data [data bytes] |
 *     u64 checksum of every byte before it */
#ifndef LLM_TIER_H
#define LLM_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "../model/model.h"

typedef struct llm_tier llm_tier;

typedef struct {
    uint64_t hits;           /* pages read back into the pool */
    uint64_t loads;          /* loads planned (llm_tier_fetch) */
    uint64_t misses;         /* lookups that found no usable file */
    uint64_t damaged;        /* of those, files that failed a check (removed) */
    uint64_t bytes_read;
    uint64_t writes;         /* pages written */
    uint64_t bytes_written;
    uint64_t dropped;        /* pages not written: the queue was full or a write failed */
    uint64_t evictions;      /* files removed to stay within the size */
    uint64_t entries;        /* files held now */
    uint64_t bytes;          /* their size */
} llm_tier_stats;

/* Opens (makes if missing) dir for c's caches, keeping at most max_bytes of
 * pages, and hooks every cache's reclaimed pages (kv_cache_set_spill). Files
 * of other models stay untouched and uncounted. 0, or an llm_status with a
 * message in err. */
int llm_tier_open(const char *dir, uint64_t max_bytes, llm_context *c, llm_tier **out, char *err, size_t errlen);
/* Writes every named page of c's caches not yet on disk, waits for the
 * writer, unhooks the caches and frees the tier. Call after the last step. */
void llm_tier_close(llm_tier *t);
/* A load: the pages on disk a prompt needs, read on the tier's thread. */
typedef struct llm_tier_load llm_tier_load;
/* On the thread that owns the context: plans the longest point every group
 * can resume tokens [n] at from RAM and the files on disk, and queues the
 * reads of the files that takes. NULL when the disk adds nothing to what RAM
 * serves (or out of memory). */
llm_tier_load *llm_tier_fetch(llm_tier *t, const int32_t *tokens, int32_t n);
/* Whether its reads are done (any thread). */
int llm_tier_ready(const llm_tier_load *l);
/* On the thread that owns the context, a ready load for tokens [n], seq
 * empty in every group: matches RAM and appends the loaded pages in each
 * group, so that seq resumes at the longest point every group serves now
 * (pages that turned out missing or damaged lower it; at worst RAM's match
 * alone). Returns the positions matched and frees the load. */
int32_t llm_tier_apply(llm_tier_load *l, int32_t seq, const int32_t *tokens, int32_t n);
/* Gives up a load, ready or not (freed now, or by the reader when done). */
void llm_tier_drop(llm_tier_load *l);
/* Fetch, wait, apply, on an empty seq: the positions matched. */
int32_t llm_tier_extend(llm_tier *t, int32_t seq, const int32_t *tokens, int32_t n);
/* fn(user) runs on the reader thread each time a load is ready (NULL: none). */
void llm_tier_set_notify(llm_tier *t, void (*fn)(void *user), void *user);
/* Tests: fn(user) runs on the reader thread before each load is read, and
 * may block; nonzero fails the load (every page then a miss, kept on disk). */
void llm_tier_set_read_hook(llm_tier *t, int (*fn)(void *user), void *user);
llm_tier_stats llm_tier_get_stats(llm_tier *t);

/* Checks one file's bytes against what a lookup asked for: 0 when it holds
 * the page named hash (after parent_hash, has_parent) of this group and
 * model, with these tokens [n_tokens] and data_bytes of K/V, *data then
 * pointing into buf; -1 otherwise. Bounds-checked for any buf (fuzzed). */
int llm_tier_parse(const unsigned char *buf, size_t len, uint32_t group, uint64_t fingerprint, uint64_t hash,
                   uint64_t parent_hash, int has_parent, const int32_t *tokens, int32_t n_tokens, size_t data_bytes,
                   const unsigned char **data);

/* The checksum a file ends with, of its bytes p [n] before it. */
uint64_t llm_tier_checksum(const unsigned char *p, size_t n);

#endif
