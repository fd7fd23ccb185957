/* engine/gen/tier.c - the prefix cache's disk tier (see tier.h): the writer
 * thread and its queue, the folder's index and LRU bound, lookups. */
#include "tier.h"
#include "../model/arch.h"
#include "policy.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char MAGIC[8] = {'K', 'V', 'C', 'T', 'I', 'E', 'R', '1'};
enum { VERSION = 1, HEADER = 56, PATH_MAX_LEN = 4096 };
/* pages waiting for the writer, at most (beyond: dropped, never a stall) */
#define QUEUE_BYTES ((size_t)64 << 20)

typedef struct job {
    struct job *next;
    uint32_t group;
    uint64_t hash;
    size_t size;
    unsigned char buf[]; /* the whole file, checksum last (filled by the writer) */
} job;

typedef struct {
    uint32_t group;
    uint64_t hash, size, stamp;
} entry;

typedef struct {
    llm_tier *t;
    uint32_t group;
} hook;

struct llm_tier {
    char dir[PATH_MAX_LEN];
    uint64_t max_bytes, fp;
    llm_context *c;
    int32_t n_groups, page_size;
    size_t page_bytes[LLM_MAX_GROUPS]; /* each group's, read once: the reader never touches a cache */
    hook hooks[LLM_MAX_GROUPS];
    pthread_mutex_t mu;
    pthread_cond_t wake, room;
    job *head, *tail;
    size_t queued;
    int stop, closing; /* closing: a spill waits for room instead of being dropped */
    pthread_t writer;
    entry *ents; /* the folder's files of this model: unordered, LRU by stamp */
    size_t n_ents, cap_ents;
    uint64_t clock;
    llm_tier_stats st;
    pthread_t reader;                /* reads loads (llm_tier_fetch), queued at rhead */
    pthread_cond_t rwake, rdone;
    struct llm_tier_load *rhead;
    void (*notify)(void *);          /* a load is ready */
    void *notify_user;
    int notifying;                   /* the reader is calling notify */
    int (*read_hook)(void *);        /* tests: before each load is read; nonzero fails it */
    void *read_hook_user;
};

/* ---------------------------------------------------------------- the format */

uint64_t llm_tier_checksum(const unsigned char *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001B3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

static void put(unsigned char **p, const void *v, size_t n) {
    memcpy(*p, v, n);
    *p += n;
}

static size_t file_size(int32_t n_tokens, size_t data_bytes) {
    return HEADER + sizeof(int32_t) * (size_t)n_tokens + data_bytes + sizeof(uint64_t);
}

int llm_tier_parse(const unsigned char *buf, size_t len, uint32_t group, uint64_t fingerprint, uint64_t hash,
                   uint64_t parent_hash, int has_parent, const int32_t *tokens, int32_t n_tokens, size_t data_bytes,
                   const unsigned char **data) {
    if (!buf || n_tokens < 0 || len < HEADER + sizeof(uint64_t)) return -1;
    if ((size_t)n_tokens > len / sizeof(int32_t) || data_bytes > len) return -1; /* file_size cannot wrap */
    uint32_t version, g, hp, nt;
    uint64_t fp, h, ph, db, sum;
    const unsigned char *p = buf + sizeof MAGIC;
    if (memcmp(buf, MAGIC, sizeof MAGIC)) return -1;
    memcpy(&version, p, 4), memcpy(&g, p + 4, 4), memcpy(&fp, p + 8, 8), memcpy(&h, p + 16, 8);
    memcpy(&ph, p + 24, 8), memcpy(&hp, p + 32, 4), memcpy(&nt, p + 36, 4), memcpy(&db, p + 40, 8);
    if (version != VERSION || g != group || fp != fingerprint || h != hash || ph != parent_hash ||
        hp != (uint32_t)(has_parent != 0) || nt != (uint32_t)n_tokens || db != data_bytes)
        return -1;
    if (len != file_size(n_tokens, data_bytes)) return -1;
    memcpy(&sum, buf + len - sizeof sum, sizeof sum);
    if (sum != llm_tier_checksum(buf, len - sizeof sum)) return -1;
    if (n_tokens && memcmp(buf + HEADER, tokens, sizeof(int32_t) * (size_t)n_tokens)) return -1;
    *data = buf + HEADER + sizeof(int32_t) * (size_t)n_tokens;
    return 0;
}

static void path_of(const llm_tier *t, uint32_t group, uint64_t hash, const char *suffix, char *out, size_t cap) {
    snprintf(out, cap, "%s/%016llx-%u-%016llx.kvp%s", t->dir, (unsigned long long)t->fp, (unsigned)group,
             (unsigned long long)hash, suffix);
}

/* ---------------------------------------------------------------- the index (under mu) */

static entry *lookup(llm_tier *t, uint32_t group, uint64_t hash) {
    for (size_t i = 0; i < t->n_ents; i++)
        if (t->ents[i].hash == hash && t->ents[i].group == group) return &t->ents[i];
    return NULL;
}

static void drop_entry(llm_tier *t, entry *e, int unlink_it) {
    if (unlink_it) {
        char path[PATH_MAX_LEN + 64];
        path_of(t, e->group, e->hash, "", path, sizeof path);
        unlink(path);
    }
    t->st.bytes -= e->size;
    t->st.entries--;
    *e = t->ents[--t->n_ents];
}

static int add_entry(llm_tier *t, uint32_t group, uint64_t hash, uint64_t size, uint64_t stamp) {
    if (t->n_ents == t->cap_ents) {
        size_t cap = t->cap_ents ? 2 * t->cap_ents : 256;
        entry *e = realloc(t->ents, cap * sizeof *e);
        if (!e) return -1;
        t->ents = e, t->cap_ents = cap;
    }
    t->ents[t->n_ents++] = (entry){.group = group, .hash = hash, .size = size, .stamp = stamp};
    t->st.bytes += size;
    t->st.entries++;
    return 0;
}

/* Removes least recently used files until `more` bytes fit. */
static void make_room(llm_tier *t, uint64_t more) {
    while (t->n_ents && t->st.bytes + more > t->max_bytes) {
        entry *old = &t->ents[0];
        for (size_t i = 1; i < t->n_ents; i++)
            if (t->ents[i].stamp < old->stamp) old = &t->ents[i];
        drop_entry(t, old, 1);
        t->st.evictions++;
    }
}

/* ---------------------------------------------------------------- writing */

static int write_file(const char *tmp, const char *path, const unsigned char *buf, size_t n) {
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
    }
    if (close(fd) != 0 || done != n || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

static void *writer_main(void *arg) {
    llm_tier *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->head && !t->stop) pthread_cond_wait(&t->wake, &t->mu);
        if (!t->head) break;
        job *j = t->head;
        t->head = j->next;
        if (!t->head) t->tail = NULL;
        int have = lookup(t, j->group, j->hash) != NULL || j->size > t->max_bytes;
        pthread_mutex_unlock(&t->mu);
        int ok = 1;
        char path[PATH_MAX_LEN + 64], tmp[PATH_MAX_LEN + 64];
        if (!have) {
            uint64_t sum = llm_tier_checksum(j->buf, j->size - sizeof sum);
            memcpy(j->buf + j->size - sizeof sum, &sum, sizeof sum);
            path_of(t, j->group, j->hash, "", path, sizeof path);
            path_of(t, j->group, j->hash, ".tmp", tmp, sizeof tmp);
            ok = write_file(tmp, path, j->buf, j->size) == 0;
        }
        pthread_mutex_lock(&t->mu);
        t->queued -= j->size;
        pthread_cond_signal(&t->room);
        if (!have && ok) {
            make_room(t, j->size);
            if (add_entry(t, j->group, j->hash, j->size, ++t->clock) == 0) {
                t->st.writes++, t->st.bytes_written += j->size;
            } else {
                unlink(path);
                t->st.dropped++;
            }
        } else if (!have) {
            t->st.dropped++;
        }
        free(j);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* The spill listener, on the scheduler's thread inside a reserve: a copy of
 * the page goes into the queue, or nowhere when the queue is full. */
static void on_spill(void *user, const kv_page_image *img) {
    const hook *hk = user;
    llm_tier *t = hk->t;
    size_t size = file_size(img->n_tokens, img->bytes);
    pthread_mutex_lock(&t->mu);
    int skip = lookup(t, hk->group, img->hash) != NULL;
    while (!skip && t->closing && t->queued && t->queued + size > QUEUE_BYTES) pthread_cond_wait(&t->room, &t->mu);
    int full = !skip && t->queued && t->queued + size > QUEUE_BYTES;
    if (full) t->st.dropped++;
    if (!skip && !full) t->queued += size;
    pthread_mutex_unlock(&t->mu);
    if (skip || full) return;
    job *j = malloc(sizeof *j + size);
    if (!j) {
        pthread_mutex_lock(&t->mu);
        t->queued -= size, t->st.dropped++;
        pthread_mutex_unlock(&t->mu);
        return;
    }
    *j = (job){.group = hk->group, .hash = img->hash, .size = size};
    uint32_t version = VERSION, g = hk->group, hp = img->has_parent != 0, nt = (uint32_t)img->n_tokens;
    uint64_t db = img->bytes;
    unsigned char *p = j->buf;
    put(&p, MAGIC, sizeof MAGIC), put(&p, &version, 4), put(&p, &g, 4), put(&p, &t->fp, 8);
    put(&p, &img->hash, 8), put(&p, &img->parent_hash, 8), put(&p, &hp, 4), put(&p, &nt, 4), put(&p, &db, 8);
    put(&p, img->tokens, sizeof(int32_t) * (size_t)img->n_tokens), put(&p, img->data, img->bytes);
    pthread_mutex_lock(&t->mu);
    if (t->tail) t->tail->next = j; else t->head = j;
    t->tail = j;
    pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->mu);
}

/* ---------------------------------------------------------------- open, close */

static void *reader_main(void *arg);

/* The files of this model already in the folder, oldest use first; a
 * temporary file a killed write left is removed. */
static int scan(llm_tier *t) {
    DIR *d = opendir(t->dir);
    if (!d) return -1;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%016llx-", (unsigned long long)t->fp);
    struct dirent *de;
    while ((de = readdir(d))) {
        unsigned g;
        unsigned long long h;
        char tail[8] = "";
        if (strncmp(de->d_name, prefix, strlen(prefix))) continue;
        if (sscanf(de->d_name + strlen(prefix), "%u-%16llx.kvp%7s", &g, &h, tail) < 2) continue;
        char path[PATH_MAX_LEN + 300];
        snprintf(path, sizeof path, "%s/%s", t->dir, de->d_name);
        if (!strcmp(tail, ".tmp")) {
            unlink(path);
            continue;
        }
        struct stat st;
        if (tail[0] || stat(path, &st) != 0 || !S_ISREG(st.st_mode) || lookup(t, g, h)) continue;
        /* stamps from modification times, in ns: a hit touches its file */
        uint64_t stamp = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
        if (add_entry(t, g, h, (uint64_t)st.st_size, stamp)) break;
    }
    closedir(d);
    /* from now on a stamp is a counter above every time seen */
    for (size_t i = 0; i < t->n_ents; i++)
        if (t->ents[i].stamp > t->clock) t->clock = t->ents[i].stamp;
    make_room(t, 0);
    return 0;
}

int llm_tier_open(const char *dir, uint64_t max_bytes, llm_context *c, llm_tier **out, char *err, size_t errlen) {
    *out = NULL;
    if (!dir || !*dir || strlen(dir) >= PATH_MAX_LEN - 64)
        return llm_errf(err, errlen, LLM_ERR_PARAM, "the cache folder needs a path of at most %d bytes", PATH_MAX_LEN - 64);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return llm_errf(err, errlen, LLM_ERR_PARAM, "%s: cannot make it: %s", dir, strerror(errno));
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || access(dir, R_OK | W_OK | X_OK) != 0)
        return llm_errf(err, errlen, LLM_ERR_PARAM, "%s: not a folder this process can read and write", dir);
    llm_tier *t = calloc(1, sizeof *t);
    if (!t) return llm_errf(err, errlen, LLM_ERR_NOMEM, "out of memory");
    snprintf(t->dir, sizeof t->dir, "%s", dir);
    llm_context_params cp = llm_context_get_params(c);
    const int32_t ids[2] = {(int32_t)cp.kv_type, cp.page_size};
    uint64_t fp = llm_model_fingerprint(llm_context_model(c));
    for (size_t i = 0; i < sizeof ids; i++) fp = (fp ^ ((const unsigned char *)ids)[i]) * 0x100000001B3ull;
    t->fp = fp, t->max_bytes = max_bytes, t->c = c, t->n_groups = llm_context_n_caches(c);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->wake, NULL);
    pthread_cond_init(&t->room, NULL);
    pthread_cond_init(&t->rwake, NULL);
    pthread_cond_init(&t->rdone, NULL);
    int started = 0;
    if (scan(t) == 0 && pthread_create(&t->writer, NULL, writer_main, t) == 0) {
        started = 1;
        if (pthread_create(&t->reader, NULL, reader_main, t) == 0) started = 2;
    }
    if (started < 2) {
        if (started) {
            pthread_mutex_lock(&t->mu);
            t->stop = 1;
            pthread_cond_signal(&t->wake);
            pthread_mutex_unlock(&t->mu);
            pthread_join(t->writer, NULL);
        }
        pthread_mutex_destroy(&t->mu);
        pthread_cond_destroy(&t->wake), pthread_cond_destroy(&t->room);
        pthread_cond_destroy(&t->rwake), pthread_cond_destroy(&t->rdone);
        free(t->ents), free(t);
        return llm_errf(err, errlen, LLM_ERR_PARAM, "%s: cannot read the folder or start its threads", dir);
    }
    t->page_size = kv_cache_get_params(llm_context_cache_at(c, 0)).page_size;
    for (int32_t g = 0; g < t->n_groups; g++) {
        t->page_bytes[g] = kv_cache_get_stats(llm_context_cache_at(c, g)).bytes_per_page;
        t->hooks[g] = (hook){.t = t, .group = (uint32_t)g};
        kv_cache_set_spill(llm_context_cache_at(c, g), on_spill, &t->hooks[g]);
    }
    *out = t;
    return LLM_OK;
}

void llm_tier_close(llm_tier *t) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->closing = 1;
    pthread_mutex_unlock(&t->mu);
    for (int32_t g = 0; g < t->n_groups; g++) {
        kv_cache *cache = llm_context_cache_at(t->c, g);
        kv_prefix_spill_all(cache);
        kv_cache_set_spill(cache, NULL, NULL);
    }
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_signal(&t->wake);
    pthread_cond_signal(&t->rwake);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->writer, NULL);
    pthread_join(t->reader, NULL);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->wake), pthread_cond_destroy(&t->room);
    pthread_cond_destroy(&t->rwake), pthread_cond_destroy(&t->rdone);
    free(t->ents);
    free(t);
}

llm_tier_stats llm_tier_get_stats(llm_tier *t) {
    pthread_mutex_lock(&t->mu);
    llm_tier_stats s = t->st;
    pthread_mutex_unlock(&t->mu);
    return s;
}

/* ---------------------------------------------------------------- reading */

/* A load: what a prompt needs from disk, read on the reader thread. Blocks
 * [0, nb) of tokens; for group g and block i, want[g*nb+i] says it is to be
 * read, buf[g*nb+i] holds the verified file once read (NULL: a miss). */
struct llm_tier_load {
    llm_tier *t;
    struct llm_tier_load *next; /* in the reader's queue */
    int32_t nb, n_groups;
    int32_t kmax;               /* the point planned: nothing past it is read */
    int ready, dropped;         /* under t->mu */
    int32_t *tokens;            /* [nb * P] */
    uint64_t *hash;             /* [n_groups * nb] the blocks' names in each group */
    unsigned char *want;        /* [n_groups * nb] */
    unsigned char **buf;        /* [n_groups * nb] */
    size_t *len;
};

static void load_free(llm_tier_load *l) {
    if (!l) return;
    for (int32_t i = 0; l->buf && i < l->n_groups * l->nb; i++) free(l->buf[i]);
    free(l->tokens), free(l->hash), free(l->want), free(l->buf), free(l->len), free(l);
}

/* First block a window group still needs for a query at pos (0: full group). */
static int32_t first_block(const kv_cache_params *kp, int32_t pos) {
    if (kp->window == 0 || kp->no_evict) return 0;
    int64_t lowest = (int64_t)pos - kp->window + 1;
    return lowest <= 0 ? 0 : (int32_t)(lowest / kp->page_size);
}

/* Whether group g can resume at k, with ram its own longest match <= k in
 * RAM: every block it needs past that held in `have` (want on disk, or
 * staged). A full group needs blocks [ram, k), a window group those of its
 * window at k past ram. */
typedef int (*have_fn)(const llm_tier_load *l, int32_t g, int32_t block);

static int group_reaches(llm_tier *t, const llm_tier_load *l, int32_t g, int32_t k, int32_t ram, have_fn have) {
    kv_cache_params kp = kv_cache_get_params(llm_context_cache_at(t->c, g));
    const int32_t P = kp.page_size;
    int32_t from = first_block(&kp, k);
    if (from < ram / P) from = ram / P;
    for (int32_t i = from; i < k / P; i++)
        if (!have(l, g, i)) return 0;
    return 1;
}

/* Group g's longest point <= k that RAM serves. */
static int32_t ram_match(llm_tier *t, int32_t g, const int32_t *tokens, int32_t k) {
    int32_t got = 0;
    if (kv_prefix_lookup(llm_context_cache_at(t->c, g), tokens, k, &got)) got = 0;
    return got;
}

/* The longest point every group reaches, from above, no lower than floor
 * (where the next candidate is floor itself: RAM alone). */
static int32_t reach(llm_tier *t, const llm_tier_load *l, const int32_t *tokens, int32_t floor, have_fn have) {
    const int32_t P = t->page_size;
    for (int32_t k = l->kmax / P * P; k > floor; k -= P) {
        int ok = 1;
        for (int32_t g = 0; g < t->n_groups && ok; g++) ok = group_reaches(t, l, g, k, ram_match(t, g, tokens, k), have);
        if (ok) return k;
    }
    return floor;
}

static int on_disk(const llm_tier_load *l, int32_t g, int32_t i) {
    return l->want[(size_t)g * (size_t)l->nb + (size_t)i];
}

static int staged(const llm_tier_load *l, int32_t g, int32_t i) {
    return l->buf[(size_t)g * (size_t)l->nb + (size_t)i] != NULL;
}

/* Reads one file whole (malloc'd), or NULL. */
static unsigned char *read_file(llm_tier *t, uint32_t group, uint64_t hash, size_t *len) {
    char path[PATH_MAX_LEN + 64];
    path_of(t, group, hash, "", path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat st;
    unsigned char *b = NULL;
    size_t n = 0;
    if (fstat(fd, &st) == 0 && st.st_size > 0 && (uint64_t)st.st_size <= t->max_bytes &&
        (b = malloc((size_t)st.st_size))) {
        size_t want = (size_t)st.st_size;
        while (n < want) {
            ssize_t r = read(fd, b + n, want - n);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            n += (size_t)r;
        }
        if (n != want) free(b), b = NULL;
    }
    if (b) futimens(fd, NULL); /* its last use, kept across restarts */
    close(fd);
    *len = n;
    return b;
}

/* On the reader thread: every wanted file, verified; a file missing or
 * damaged is left out (and a damaged one removed). */
static void read_load(llm_tier *t, llm_tier_load *l) {
    const int32_t P = t->page_size;
    int fail = t->read_hook && t->read_hook(t->read_hook_user);
    for (int32_t g = 0; g < l->n_groups; g++) {
        const size_t page_bytes = t->page_bytes[g];
        for (int32_t i = 0; i < l->nb; i++) {
            size_t at = (size_t)g * (size_t)l->nb + (size_t)i, len = 0;
            if (!l->want[at]) continue;
            uint64_t h = l->hash[at], ph = i > 0 ? l->hash[at - 1] : 0;
            unsigned char *b = fail ? NULL : read_file(t, (uint32_t)g, h, &len);
            const unsigned char *data = NULL;
            int bad = b && llm_tier_parse(b, len, (uint32_t)g, t->fp, h, ph, i > 0, l->tokens + (size_t)i * P, P,
                                          page_bytes, &data) != 0;
            pthread_mutex_lock(&t->mu);
            if (!b || bad) {
                entry *e = lookup(t, (uint32_t)g, h);
                t->st.misses++, t->st.damaged += bad;
                if (e && (bad || !fail)) drop_entry(t, e, bad); /* gone (evicted, removed by hand) or damaged */
            } else {
                entry *e = lookup(t, (uint32_t)g, h);
                if (e) e->stamp = ++t->clock;   /* the LRU order of this run */
                t->st.bytes_read += len;
            }
            pthread_mutex_unlock(&t->mu);
            if (bad) free(b), b = NULL;
            l->buf[at] = b, l->len[at] = len;
        }
    }
}

static void *reader_main(void *arg) {
    llm_tier *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->rhead && !t->stop) pthread_cond_wait(&t->rwake, &t->mu);
        if (!t->rhead) break;
        llm_tier_load *l = t->rhead;
        t->rhead = l->next;
        pthread_mutex_unlock(&t->mu);
        read_load(t, l);
        pthread_mutex_lock(&t->mu);
        l->ready = 1;
        if (l->dropped) {
            load_free(l);
            continue;
        }
        pthread_cond_broadcast(&t->rdone);
        if (t->notify) {   /* the scheduler's wake-up takes its own lock, never this one's */
            void (*fn)(void *) = t->notify;
            void *user = t->notify_user;
            t->notifying = 1;
            pthread_mutex_unlock(&t->mu);
            fn(user);
            pthread_mutex_lock(&t->mu);
            t->notifying = 0;
            pthread_cond_broadcast(&t->rdone);
        }
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

llm_tier_load *llm_tier_fetch(llm_tier *t, const int32_t *tokens, int32_t n) {
    if (!t || !tokens || n <= 0) return NULL;
    const int32_t P = t->page_size;
    int32_t nb = n / P, G = t->n_groups;
    if (nb == 0) return NULL;
    size_t cells = (size_t)G * (size_t)nb;
    llm_tier_load *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    *l = (llm_tier_load){.t = t, .nb = nb, .n_groups = G, .kmax = nb * P};
    l->tokens = malloc(sizeof(int32_t) * (size_t)nb * (size_t)P);
    l->hash = malloc(sizeof(uint64_t) * cells);
    l->want = calloc(cells, 1), l->buf = calloc(cells, sizeof *l->buf), l->len = calloc(cells, sizeof *l->len);
    if (!l->tokens || !l->hash || !l->want || !l->buf || !l->len) return load_free(l), NULL;
    memcpy(l->tokens, tokens, sizeof(int32_t) * (size_t)nb * (size_t)P);
    for (int32_t g = 0; g < G; g++)
        if (kv_prefix_hashes(llm_context_cache_at(t->c, g), tokens, nb * P, l->hash + (size_t)g * nb))
            return load_free(l), NULL;
    int32_t ram = 0;
    if (llm_prefix_lookup(t->c, tokens, nb * P, &ram)) ram = 0;
    int any = 0;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < cells; i++) any |= l->want[i] = lookup(t, (uint32_t)(i / (size_t)nb), l->hash[i]) != NULL;
    pthread_mutex_unlock(&t->mu);
    int32_t k = any ? reach(t, l, tokens, ram, on_disk) : 0;
    if (k <= ram) return load_free(l), NULL;
    /* read only what the point k takes: each group's blocks past its RAM match */
    for (int32_t g = 0; g < G; g++) {
        kv_cache_params kp = kv_cache_get_params(llm_context_cache_at(t->c, g));
        int32_t from = first_block(&kp, k), got = ram_match(t, g, tokens, k);
        if (from < got / P) from = got / P;
        for (int32_t i = 0; i < nb; i++) l->want[(size_t)g * nb + i] &= i >= from && i < k / P;
    }
    l->kmax = k;
    pthread_mutex_lock(&t->mu);
    t->st.loads++;
    llm_tier_load **pp = &t->rhead;
    while (*pp) pp = &(*pp)->next;
    *pp = l;
    pthread_cond_signal(&t->rwake);
    pthread_mutex_unlock(&t->mu);
    return l;
}

int llm_tier_ready(const llm_tier_load *l) {
    if (!l) return 1;
    pthread_mutex_lock(&l->t->mu);
    int r = l->ready;
    pthread_mutex_unlock(&l->t->mu);
    return r;
}

void llm_tier_drop(llm_tier_load *l) {
    if (!l) return;
    llm_tier *t = l->t;
    pthread_mutex_lock(&t->mu);
    int mine = l->ready;   /* else the reader frees it when done */
    l->dropped = 1;
    pthread_mutex_unlock(&t->mu);
    if (mine) load_free(l);
}

int32_t llm_tier_apply(llm_tier_load *l, int32_t seq, const int32_t *tokens, int32_t n) {
    llm_tier *t = l ? l->t : NULL;
    llm_context *c = t ? t->c : NULL;
    int32_t m = 0, k = 0, loaded = 0;
    if (!l) return 0;
    const int32_t P = t->page_size;
    if (!tokens || n < 0 || llm_prefix_lookup(c, tokens, n, &m)) goto ram_only;
    if (l->kmax <= n && !memcmp(tokens, l->tokens, sizeof(int32_t) * (size_t)l->kmax))
        k = reach(t, l, tokens, m, staged);
    if (k <= m) goto ram_only;
    for (int32_t g = 0; g < t->n_groups; g++) {
        kv_cache *cache = llm_context_cache_at(c, g);
        kv_cache_params kp = kv_cache_get_params(cache);
        const size_t page_bytes = t->page_bytes[g];
        int32_t got = 0, from = first_block(&kp, k);
        if (kv_seq_prefix_match(cache, seq, tokens, k, &got)) goto undo;
        if (from > got / P && kv_seq_prefix_skip(cache, seq, tokens, from * P)) goto undo;
        for (int32_t i = from > got / P ? from : got / P; i < k / P; i++) {
            const unsigned char *b = l->buf[(size_t)g * (size_t)l->nb + (size_t)i];
            if (!b || kv_seq_prefix_load(cache, seq, tokens + (size_t)i * P, b + HEADER + sizeof(int32_t) * (size_t)P,
                                         page_bytes))
                goto undo;
            loaded++;
        }
    }
    pthread_mutex_lock(&t->mu);
    t->st.hits += (uint64_t)loaded;
    pthread_mutex_unlock(&t->mu);
    llm_tier_drop(l);
    return k;
undo:
    for (int32_t g = 0; g < t->n_groups; g++) kv_seq_truncate(llm_context_cache_at(c, g), seq, 0);
ram_only:
    llm_tier_drop(l);
    if (!tokens || llm_seq_prefix_match(c, seq, tokens, n, &m) != LLM_OK) m = 0;
    return m;
}

int32_t llm_tier_extend(llm_tier *t, int32_t seq, const int32_t *tokens, int32_t n) {
    int32_t m = 0;
    llm_tier_load *l = t ? llm_tier_fetch(t, tokens, n) : NULL;
    if (!l) return tokens && n > 0 && llm_seq_prefix_match(t ? t->c : NULL, seq, tokens, n, &m) == LLM_OK ? m : 0;
    pthread_mutex_lock(&t->mu);
    while (!l->ready) pthread_cond_wait(&t->rdone, &t->mu);
    pthread_mutex_unlock(&t->mu);
    return llm_tier_apply(l, seq, tokens, n);
}

void llm_tier_set_notify(llm_tier *t, void (*fn)(void *user), void *user) {
    pthread_mutex_lock(&t->mu);
    while (t->notifying) pthread_cond_wait(&t->rdone, &t->mu);   /* the old listener is not running */
    t->notify = fn, t->notify_user = user;
    pthread_mutex_unlock(&t->mu);
}

void llm_tier_set_read_hook(llm_tier *t, int (*fn)(void *user), void *user) {
    pthread_mutex_lock(&t->mu);
    t->read_hook = fn, t->read_hook_user = user;
    pthread_mutex_unlock(&t->mu);
}
