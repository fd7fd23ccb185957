/* tests/test_tier.c - a tier below the pool: the library's spill listener
 * and page loads (kv_cache_set_spill, kv_seq_prefix_next, kv_seq_prefix_load,
 * kv_seq_prefix_skip for a window cache), and the engine's disk tier
 * (engine/gen/tier.h) on tiny models: pages written at close found again by a
 * new context, continued to the logits of a cold run and of the float64
 * reference; a damaged file a miss; the size bound; a model with full and
 * window layers resuming from its window's pages alone; the scheduler
 * decoding others while a request's pages load, a cancelled or failed load. */
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "test_model_fixture.h"
#include "gguf_writer.h"
#include "../engine/weights/quant.h"
#include "../engine/gen/tier.h"
#include "../engine/gen/scheduler.h"

enum { P = 4, D = 8 };

typedef struct {
    int n;
    kv_page_image img[16];
    int32_t tokens[16][P];
    double data[16][2 * P * D];
} spilled;

static void on_spill(void *user, const kv_page_image *img) {
    spilled *s = user;
    if (s->n == 16 || img->bytes != sizeof s->data[0] || img->n_tokens != P) {
        s->n = -100;
        return;
    }
    memcpy(s->tokens[s->n], img->tokens, sizeof s->tokens[0]);
    memcpy(s->data[s->n], img->data, img->bytes);
    s->img[s->n] = *img;
    s->img[s->n].tokens = s->tokens[s->n], s->img[s->n].data = s->data[s->n];
    s->n++;
}

static void kv_of(const int32_t *tokens, int32_t n, double *k, double *v) {
    uint64_t h = 99;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint64_t)(tokens[i] + 1)) * 1099511628211ull;
    test_rng r = {h};
    for (int i = 0; i < D; i++) k[i] = test_rng_uniform(&r), v[i] = test_rng_uniform(&r);
}

static void fill(kv_cache *c, int32_t seq, const int32_t *tokens, int32_t n) {
    CHECK_EQ_INT(kv_seq_reserve(c, seq, n, tokens), KV_OK);
    int32_t rows[2] = {0, n};
    kv_batch b = {.n_seqs = 1, .seqs = &seq, .row_start = rows};
    double k[64 * D], v[64 * D];
    for (int32_t i = 0; i < n; i++) kv_of(tokens, i + 1, k + i * D, v + i * D);
    CHECK_EQ_INT(kv_append_f64(c, 0, &b, k, v), KV_OK);
}

TEST(tier_reclaimed_pages_leave_through_the_spill_listener_and_load_back_exactly) {
    kv_cache_params p = kv_cache_default_params();
    p.head_dim = D, p.dtype = KV_F64, p.page_size = P, p.n_pages = 8, p.max_seqs = 2;
    kv_cache *c = NULL;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    if (!c) return;
    spilled sp = {0};
    kv_cache_set_spill(c, on_spill, &sp);
    int32_t toks[32], a, b;
    for (int i = 0; i < 32; i++) toks[i] = (i * 7) % 5;
    CHECK_EQ_INT(kv_seq_new(c, &a), KV_OK);
    fill(c, a, toks, 12);
    CHECK_EQ_INT(kv_seq_remove(c, a), KV_OK); /* 3 named pages, cached */
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_cached, 3);
    CHECK_EQ_INT(sp.n, 0);
    CHECK_EQ_INT(kv_prefix_spill_all(c), KV_OK); /* every named page, nothing changed */
    CHECK_EQ_INT(sp.n, 3);
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_cached, 3);
    sp.n = 0;
    /* 7 pages for b: the 5 free ones, then the two least recently used cached */
    int32_t other[28];
    for (int i = 0; i < 28; i++) other[i] = 9;
    CHECK_EQ_INT(kv_seq_new(c, &b), KV_OK);
    fill(c, b, other, 28);
    CHECK_EQ_INT(sp.n, 2);
    CHECK_EQ_INT(kv_seq_remove(c, b), KV_OK);
    kv_cache_set_spill(c, NULL, NULL);
    /* what a new sequence asks for is what left */
    int32_t s;
    uint64_t h, ph;
    int hp;
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    int32_t matched = -1;
    CHECK_EQ_INT(kv_seq_prefix_match(c, s, toks, 12, &matched), KV_OK);
    CHECK_EQ_INT(matched, 0);
    for (int i = 0; i < 2 && sp.n == 2; i++) {
        CHECK_EQ_INT(kv_seq_prefix_next(c, s, toks + i * P, &h, &ph, &hp), KV_OK);
        CHECK(h == sp.img[i].hash && ph == sp.img[i].parent_hash && hp == sp.img[i].has_parent);
        CHECK(memcmp(sp.img[i].tokens, toks + i * P, sizeof(int32_t) * P) == 0);
        kv_cache_stats before = kv_cache_get_stats(c);
        /* refusals change nothing */
        CHECK_EQ_INT(kv_seq_prefix_load(c, s, toks + i * P, sp.img[i].data, sp.img[i].bytes - 1), KV_ERR_SHAPE);
        int32_t neg[P] = {1, -1, 2, 3};
        CHECK_EQ_INT(kv_seq_prefix_load(c, s, neg, sp.img[i].data, sp.img[i].bytes), KV_ERR_SHAPE);
        CHECK_EQ_INT(kv_cache_get_stats(c).pages_used, before.pages_used);
        CHECK_EQ_INT(kv_seq_prefix_load(c, s, toks + i * P, sp.img[i].data, sp.img[i].bytes), KV_OK);
        CHECK_EQ_INT(kv_cache_get_stats(c).pages_used, before.pages_used + 1);
    }
    CHECK_EQ_INT(kv_seq_length(c, s), 2 * P);
    double k[D], v[D], ek[D], ev[D];
    for (int32_t pos = 0; pos < 2 * P; pos++) {
        CHECK_EQ_INT(kv_read_f64(c, 0, s, pos, 1, k, v), KV_OK);
        kv_of(toks, pos + 1, ek, ev);
        CHECK(memcmp(k, ek, sizeof k) == 0 && memcmp(v, ev, sizeof v) == 0);
    }
    /* the loaded pages are named: another sequence finds them in RAM */
    int32_t s2;
    CHECK_EQ_INT(kv_seq_remove(c, s), KV_OK);
    CHECK_EQ_INT(kv_seq_new(c, &s2), KV_OK);
    CHECK_EQ_INT(kv_seq_prefix_match(c, s2, toks, 12, &matched), KV_OK);
    CHECK_EQ_INT(matched, 2 * P);
    /* not on a page boundary: refused; a skip only in a window cache */
    CHECK_EQ_INT(kv_seq_prefix_skip(c, s2, toks, 3 * P), KV_ERR_WINDOW);
    CHECK_EQ_INT(kv_seq_reserve(c, s2, 1, NULL), KV_OK);
    CHECK_EQ_INT(kv_seq_prefix_next(c, s2, toks, &h, &ph, &hp), KV_ERR_LENGTH);
    kv_cache_free(c);
}

/* A window cache (W = 8, pages of 4) resumes at 24 from the pages of blocks
 * 4 and 5 alone: a new cache skips to 16, loads those two pages, reads back
 * exactly what was written, and finds them again in RAM (the first one
 * chained from a block it never held). */
TEST(tier_window_cache_resumes_from_its_window_pages_alone) {
    kv_cache_params p = kv_cache_default_params();
    p.head_dim = D, p.dtype = KV_F64, p.page_size = P, p.n_pages = 16, p.max_seqs = 2, p.window = 8;
    kv_cache *c = NULL, *c2 = NULL;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    CHECK_EQ_INT(kv_cache_create(&p, &c2), KV_OK);
    if (!c || !c2) return;
    spilled sp = {0};
    int32_t toks[24], a, s, s3;
    for (int i = 0; i < 24; i++) toks[i] = (i * 5 + 1) % 7;
    CHECK_EQ_INT(kv_seq_new(c, &a), KV_OK);
    for (int i = 0; i < 24; i += P) { /* a page at a time, so the window evicts */
        CHECK_EQ_INT(kv_seq_reserve(c, a, P, toks + i), KV_OK);
        int32_t rows[2] = {0, P};
        kv_batch b = {.n_seqs = 1, .seqs = &a, .row_start = rows};
        double k[P * D], v[P * D];
        for (int32_t j = 0; j < P; j++) kv_of(toks, i + j + 1, k + j * D, v + j * D);
        CHECK_EQ_INT(kv_append_f64(c, 0, &b, k, v), KV_OK);
    }
    CHECK_EQ_INT(kv_seq_remove(c, a), KV_OK);
    kv_cache_set_spill(c, on_spill, &sp);
    CHECK_EQ_INT(kv_prefix_spill_all(c), KV_OK);
    CHECK_EQ_INT(sp.n, 6); /* every page was named, also those the window evicted */
    uint64_t hashes[6];
    CHECK_EQ_INT(kv_prefix_hashes(c2, toks, 24, hashes), KV_OK);
    const kv_page_image *img[6] = {0};
    for (int i = 0; i < sp.n && sp.n > 0; i++)
        for (int b = 0; b < 6; b++)
            if (sp.img[i].hash == hashes[b]) img[b] = &sp.img[i];
    for (int b = 0; b < 6; b++) CHECK(img[b] != NULL && img[b]->has_parent == (b > 0));
    if (!img[4] || !img[5]) return;
    CHECK_EQ_INT(kv_seq_new(c2, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_prefix_skip(c2, s, toks, 15), KV_ERR_LENGTH);
    CHECK_EQ_INT(kv_seq_prefix_skip(c2, s, toks, 16), KV_OK);
    CHECK_EQ_INT(kv_seq_length(c2, s), 16);
    CHECK_EQ_INT(kv_cache_get_stats(c2).pages_used, 0);
    uint64_t h, ph;
    int hp;
    CHECK_EQ_INT(kv_seq_prefix_next(c2, s, toks + 16, &h, &ph, &hp), KV_OK);
    CHECK(h == hashes[4] && ph == hashes[3] && hp == 1);
    CHECK_EQ_INT(kv_seq_prefix_load(c2, s, toks + 16, img[4]->data, img[4]->bytes), KV_OK);
    CHECK_EQ_INT(kv_seq_prefix_load(c2, s, toks + 20, img[5]->data, img[5]->bytes), KV_OK);
    CHECK_EQ_INT(kv_seq_length(c2, s), 24);
    CHECK_EQ_INT(kv_cache_get_stats(c2).pages_used, 2);
    double k[D], v[D], ek[D], ev[D];
    for (int32_t pos = 16; pos < 24; pos++) {
        CHECK_EQ_INT(kv_read_f64(c2, 0, s, pos, 1, k, v), KV_OK);
        kv_of(toks, pos + 1, ek, ev);
        CHECK(memcmp(k, ek, sizeof k) == 0 && memcmp(v, ev, sizeof v) == 0);
    }
    /* the next step's window: attending at 24 needs nothing below 16 */
    CHECK_EQ_INT(kv_seq_reserve(c2, s, 1, NULL), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c2, s), KV_OK);
    CHECK_EQ_INT(kv_seq_new(c2, &s3), KV_OK);
    int32_t matched = -1;
    CHECK_EQ_INT(kv_seq_prefix_match(c2, s3, toks, 24, &matched), KV_OK);
    CHECK_EQ_INT(matched, 24);
    kv_cache_set_spill(c, NULL, NULL);
    kv_cache_free(c);
    kv_cache_free(c2);
}

/* ---------------------------------------------------------------- the engine's disk tier */

enum { N_TOK = 70, PAGE = 16 };

static llm_context *tier_ctx(const llm_model *m) {
    llm_context_params p = llm_context_default_params();
    p.n_ctx = 128, p.n_threads = 1, p.kv_type = KV_F32, p.n_batch = 64, p.n_seqs = 2, p.page_size = PAGE;
    p.act_bits = LLM_ACT_F32;
    return fx_context(m, &p);
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".kvp") != NULL;
    if (d) closedir(d);
    return n;
}

static void clear_dir(const char *dir) {
    DIR *d = opendir(dir);
    char path[512];
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.') snprintf(path, sizeof path, "%s/%s", dir, e->d_name), unlink(path);
    if (d) closedir(d);
    rmdir(dir);
}

/* On c (freed here), the last position's logits of tokens [n] after the
 * tier gave what it has: *from_disk receives the positions it gave. */
static void continue_from_tier(llm_context *c, const char *dir, uint64_t max_bytes, const int32_t *tokens, int32_t n,
                               float *logits, int32_t *from_disk, llm_tier_stats *st) {
    llm_tier *t = NULL;
    char err[256];
    *from_disk = -1;
    if (!c) return;
    CHECK_EQ_INT(llm_tier_open(dir, max_bytes, c, &t, err, sizeof err), LLM_OK);
    int32_t seq;
    CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
    *from_disk = llm_tier_extend(t, seq, tokens, n - 1);
    CHECK_EQ_INT(llm_eval(c, seq, tokens + *from_disk, n - *from_disk, 0, logits, NULL, NULL), LLM_OK);
    *st = llm_tier_get_stats(t);
    llm_tier_close(t);
    llm_context_free(c);
}

TEST(tier_pages_written_at_close_continue_a_new_context_to_the_cold_logits) {
    fx_model fx;
    if (fx_build(&(fx_spec){.type = GW_F32, .seed = 21}, &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    const int32_t V = llm_model_n_vocab(m);
    int32_t tokens[N_TOK];
    test_rng r = {5};
    for (int i = 0; i < N_TOK; i++) tokens[i] = test_rng_int(&r, 3, V - 1);
    char dir[] = "/tmp/kvcache_tier_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    float *cold = malloc(sizeof(float) * (size_t)V), *got = malloc(sizeof(float) * (size_t)V);
    double *ref = malloc(sizeof(double) * (size_t)V * N_TOK);

    /* a first context computes the prompt; closing its tier writes the named pages */
    llm_context *c = tier_ctx(m);
    llm_tier *t = NULL;
    char err[256];
    CHECK_EQ_INT(llm_tier_open(dir, 1 << 30, c, &t, err, sizeof err), LLM_OK);
    int32_t seq;
    CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
    CHECK_EQ_INT(llm_eval(c, seq, tokens, N_TOK, 0, cold, NULL, NULL), LLM_OK);
    CHECK_EQ_INT(llm_seq_remove(c, seq), LLM_OK);
    llm_tier_close(t);
    llm_context_free(c);
    CHECK_EQ_INT(count_files(dir), N_TOK / PAGE);

    /* a new context finds them: every full page of the first N_TOK - 1 tokens */
    int32_t from_disk;
    llm_tier_stats st;
    continue_from_tier(tier_ctx(m), dir, 1 << 30, tokens, N_TOK, got, &from_disk, &st);
    CHECK_EQ_INT(from_disk, (N_TOK - 1) / PAGE * PAGE);
    CHECK_EQ_INT(st.hits, (N_TOK - 1) / PAGE);
    CHECK_EQ_INT(st.entries, N_TOK / PAGE);
    CHECK(memcmp(got, cold, sizeof(float) * (size_t)V) == 0);
    fx_reference(&fx, tokens, N_TOK, ref);
    double bmax, diff = fx_max_diff(got, ref + (size_t)(N_TOK - 1) * V, V, &bmax);
    CHECK(diff <= 1e-3 * (bmax > 1 ? bmax : 1));

    /* a damaged file is a miss: the chain stops before it, the logits stay */
    DIR *d = opendir(dir);
    char victim[512] = "";
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strstr(e->d_name, ".kvp")) continue;
        snprintf(victim, sizeof victim, "%s/%s", dir, e->d_name);
        FILE *f = fopen(victim, "rb");
        int32_t first_tok = -1;
        if (f && fseek(f, 56, SEEK_SET) == 0 && fread(&first_tok, 4, 1, f) == 1 && first_tok == tokens[2 * PAGE]) {
            fclose(f);
            break; /* the third page */
        }
        if (f) fclose(f);
        victim[0] = 0;
    }
    if (d) closedir(d);
    CHECK(victim[0] != 0);
    FILE *f = fopen(victim, "r+b");
    if (f) {
        fseek(f, 100, SEEK_SET);
        int ch = fgetc(f);
        fseek(f, 100, SEEK_SET);
        fputc(ch ^ 1, f);
        fclose(f);
    }
    continue_from_tier(tier_ctx(m), dir, 1 << 30, tokens, N_TOK, got, &from_disk, &st);
    CHECK_EQ_INT(from_disk, 2 * PAGE);
    CHECK_EQ_INT(st.damaged, 1);
    CHECK(memcmp(got, cold, sizeof(float) * (size_t)V) == 0);

    /* the size bound: a tier of two pages' files keeps two, the most recently used */
    FILE *any = NULL;
    long one = 0;
    d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strstr(e->d_name, ".kvp")) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if ((any = fopen(path, "rb"))) fseek(any, 0, SEEK_END), one = ftell(any), fclose(any);
        }
    if (d) closedir(d);
    continue_from_tier(tier_ctx(m), dir, (uint64_t)(2.5 * (double)one), tokens, N_TOK, got, &from_disk, &st);
    CHECK(count_files(dir) <= 2);
    CHECK(st.evictions >= 1);
    CHECK(memcmp(got, cold, sizeof(float) * (size_t)V) == 0);

    clear_dir(dir);
    free(cold), free(got), free(ref);
    llm_model_free(m);
    fx_free(&fx);
}

/* ---------------------------------------------------------------- full and window layers */

enum { HN = 40, HW = 8, HPAGE = 4 };

static llm_context *hybrid_ctx(const llm_model *m) {
    llm_context_params p = llm_context_default_params();
    p.n_ctx = 128, p.n_threads = 1, p.kv_type = KV_F32, p.n_batch = 64, p.n_seqs = 2, p.page_size = HPAGE;
    p.act_bits = 0; /* against the float64 oracle */
    return fx_context(m, &p);
}

static void hybrid_prompt(int32_t *t, int32_t n, int32_t salt) {
    t[0] = 2; /* <bos> */
    for (int32_t i = 1; i < n; i++) t[i] = FX_BYTE0 + (i * 37 + salt * 11) % 256;
}

/* The file a group keeps for the block of tokens named hash (its path in out). */
static int tier_file(const char *dir, int32_t group, uint64_t hash, char *out, size_t cap) {
    char tail[64];
    snprintf(tail, sizeof tail, "-%d-%016llx.kvp", (int)group, (unsigned long long)hash);
    DIR *d = opendir(dir);
    int found = 0;
    for (struct dirent *e; d && !found && (e = readdir(d));) {
        size_t n = strlen(e->d_name), k = strlen(tail);
        if (n > k && !strcmp(e->d_name + n - k, tail)) snprintf(out, cap, "%s/%s", dir, e->d_name), found = 1;
    }
    if (d) closedir(d);
    return found;
}

/* Writes the prompt's pages of both groups to dir (a context that computed
 * it, its tier closed); returns the tokens. */
static void hybrid_write(const llm_model *m, const char *dir, const int32_t *tokens) {
    llm_context *c = hybrid_ctx(m);
    llm_tier *t = NULL;
    char err[256];
    if (!c) return;
    CHECK_EQ_INT(llm_tier_open(dir, 1 << 30, c, &t, err, sizeof err), LLM_OK);
    int32_t seq;
    CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
    CHECK_EQ_INT(llm_eval(c, seq, tokens, HN, 0, NULL, NULL, NULL), LLM_OK);
    CHECK_EQ_INT(llm_seq_remove(c, seq), LLM_OK);
    llm_tier_close(t);
    llm_context_free(c);
}

/* Gemma 3's layout in small (five window layers of W = 8 to a global one,
 * pages of 4): after a restart a 40-token prompt resumes at 36 from every
 * page of the full group and the window group's blocks 7 and 8 alone, and
 * continues to the float64 reference's logits; a damaged window page is a
 * miss (the logits stay), after which the prompt resumes where the window's
 * intact pages allow. */
TEST(tier_hybrid_model_resumes_from_full_and_window_pages_to_the_reference) {
    fx_model fx;
    if (fx_build(&(fx_spec){.arch = "gemma3", .type = GW_F32, .seed = 33, .window = HW}, &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    const int32_t V = llm_model_n_vocab(m);
    int32_t tokens[HN];
    hybrid_prompt(tokens, HN, 3);
    char dir[] = "/tmp/kvcache_tier_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    float *got = malloc(sizeof(float) * (size_t)V);
    double *ref = malloc(sizeof(double) * (size_t)V * HN);
    fx_reference(&fx, tokens, HN, ref);
    const double *want = ref + (size_t)(HN - 1) * V;

    hybrid_write(m, dir, tokens);
    CHECK_EQ_INT(count_files(dir), 2 * (HN / HPAGE)); /* every page of both groups */
    int32_t from_disk;
    llm_tier_stats st;
    double bmax;
    continue_from_tier(hybrid_ctx(m), dir, 1 << 30, tokens, HN, got, &from_disk, &st);
    CHECK_EQ_INT(from_disk, 36);
    CHECK_EQ_INT(st.hits, 9 + 2); /* blocks 0..8 of the full group, 7 and 8 of the window group */
    CHECK(fx_max_diff(got, want, V, &bmax) <= 1e-5 * bmax);

    /* the window group's block 8 damaged */
    llm_context *c = hybrid_ctx(m);
    uint64_t hashes[HN / HPAGE];
    char victim[600] = "";
    if (c) {
        CHECK_EQ_INT(llm_context_n_caches(c), 2);
        CHECK_EQ_INT(kv_cache_get_params(llm_context_cache_at(c, 1)).window, HW);
        CHECK_EQ_INT(kv_prefix_hashes(llm_context_cache_at(c, 1), tokens, HN, hashes), KV_OK);
        CHECK(tier_file(dir, 1, hashes[8], victim, sizeof victim));
        llm_context_free(c);
    }
    FILE *f = victim[0] ? fopen(victim, "r+b") : NULL;
    CHECK(f != NULL);
    if (f) {
        fseek(f, 120, SEEK_SET);
        int ch = fgetc(f);
        fseek(f, 120, SEEK_SET);
        fputc(ch ^ 4, f);
        fclose(f);
    }
    continue_from_tier(hybrid_ctx(m), dir, 1 << 30, tokens, HN, got, &from_disk, &st);
    CHECK(from_disk < 36);
    CHECK_EQ_INT(st.damaged, 1);
    CHECK(fx_max_diff(got, want, V, &bmax) <= 1e-5 * bmax);
    /* the damaged file is gone: 32 is served by window blocks 6 and 7 */
    continue_from_tier(hybrid_ctx(m), dir, 1 << 30, tokens, HN, got, &from_disk, &st);
    CHECK_EQ_INT(from_disk, 32);
    CHECK_EQ_INT(st.damaged, 0);
    CHECK(fx_max_diff(got, want, V, &bmax) <= 1e-5 * bmax);

    clear_dir(dir);
    free(got), free(ref);
    llm_model_free(m);
    fx_free(&fx);
}

/* ---------------------------------------------------------------- reads off the scheduler's thread */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int entered, release, fail;
} gate;

/* The read hook: says it was entered, then holds the load until released. */
static int gate_hook(void *user) {
    gate *g = user;
    pthread_mutex_lock(&g->mu);
    g->entered++;
    pthread_cond_broadcast(&g->cv);
    while (!g->release) pthread_cond_wait(&g->cv, &g->mu);
    int fail = g->fail;
    pthread_mutex_unlock(&g->mu);
    return fail;
}

static int gate_wait_entered(gate *g) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 20;
    pthread_mutex_lock(&g->mu);
    while (!g->entered && pthread_cond_timedwait(&g->cv, &g->mu, &until) == 0) {}
    int e = g->entered;
    pthread_mutex_unlock(&g->mu);
    return e;
}

static void gate_open(gate *g, int fail) {
    pthread_mutex_lock(&g->mu);
    g->release = 1, g->fail = fail;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

typedef struct {
    int32_t tokens[64], n, cached, done;
    llm_stop_reason finish;
} outcome;

static void on_outcome(void *user, const llm_sched_event *ev) {
    outcome *o = user;
    if (ev->done) {
        o->done = 1, o->cached = ev->n_cached;
        return;
    }
    if (ev->token >= 0 && o->n < 64) o->tokens[o->n++] = ev->token;
    if (ev->finish != LLM_STOP_NONE) o->finish = ev->finish;
}

static llm_sched_request greedy(const int32_t *prompt, int32_t n, int32_t max_tokens, outcome *o) {
    llm_sched_request r = {.prompt = prompt, .n_prompt = n, .n_choices = 1, .max_tokens = max_tokens,
                           .sampler = llm_sampler_default_params(), .top_logprobs = -1, .cb = on_outcome, .user = o};
    r.sampler.temp = 0;
    return r;
}

/* Steps until o is done (the load readies on the tier's thread meanwhile). */
static void step_until_done(llm_sched *s, const outcome *o) {
    for (int i = 0; i < 20000 && !o->done; i++)
        if (llm_sched_step(s) == 0) nanosleep(&(struct timespec){0, 1000000}, NULL);
}

enum { HOLD_OK, HOLD_FAIL, HOLD_CANCEL };

/* On a new context over dir: request b decodes; request a, whose prompt is
 * on disk, waits while its load is held at the gate, and b's decoding goes
 * on meanwhile; then the load is let go (read or failed) or a is cancelled. */
static void held_load(const llm_model *m, const char *dir, const int32_t *pa, const int32_t *pb, int mode,
                      outcome *a, outcome *b) {
    llm_context *c = hybrid_ctx(m);
    llm_tier *t = NULL;
    llm_sched *s = NULL;
    char err[256];
    gate g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    if (!c) return;
    CHECK_EQ_INT(llm_tier_open(dir, 1 << 30, c, &t, err, sizeof err), LLM_OK);
    if (!t) return llm_context_free(c);
    llm_tier_set_read_hook(t, gate_hook, &g);
    llm_sched_params sp = llm_sched_default_params();
    sp.tier = t;
    CHECK_EQ_INT(llm_sched_create(c, &sp, &s), LLM_OK);
    if (!s) return llm_tier_close(t), llm_context_free(c);
    llm_sched_request rb = greedy(pb, 6, 40, b), ra = greedy(pa, HN, 4, a);
    uint64_t ida;
    CHECK_EQ_INT(llm_sched_submit(s, &rb, NULL, NULL, 0), 0);
    for (int i = 0; i < 3; i++) llm_sched_step(s);
    CHECK_EQ_INT(llm_sched_submit(s, &ra, &ida, NULL, 0), 0);
    llm_sched_step(s);
    CHECK(gate_wait_entered(&g));
    int32_t before = b->n;
    for (int i = 0; i < 5; i++) CHECK(llm_sched_step(s) > 0);   /* b decodes while a's pages load */
    CHECK_EQ_INT(b->n, before + 5);
    CHECK_EQ_INT(a->n, 0);
    llm_sched_stats st = llm_sched_get_stats(s);
    CHECK_EQ_INT(st.running, 1);
    CHECK_EQ_INT(st.waiting, 1);
    CHECK_EQ_INT(st.disk_waits, 1);
    if (mode == HOLD_CANCEL) {
        llm_sched_cancel(s, ida);
        llm_sched_step(s);
        CHECK(a->done && a->finish == LLM_STOP_CANCEL);
    }
    gate_open(&g, mode == HOLD_FAIL);
    step_until_done(s, a);
    step_until_done(s, b);
    CHECK(a->done && b->done);
    st = llm_sched_get_stats(s);
    CHECK_EQ_INT(st.pages_used, 0);
    llm_sched_free(s);
    llm_tier_close(t);   /* after the reader let go of a cancelled load */
    llm_context_free(c);
}

/* The scheduler reads a request's pages on the tier's thread: another
 * request decodes step after step while they load; once read, the request
 * resumes from them with the greedy tokens of a run without the tier; a
 * failed load prefills cold to the same tokens; a request cancelled while
 * its load is held ends at once, and the load is freed when the reader lets
 * go of it (the ASan run sees no leak). */
TEST(tier_scheduler_decodes_others_while_a_prompt_loads_from_disk) {
    fx_model fx;
    if (fx_build(&(fx_spec){.arch = "gemma3", .type = GW_F32, .seed = 34, .window = HW}, &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    int32_t pa[HN], pb[6];
    hybrid_prompt(pa, HN, 5);
    hybrid_prompt(pb, 6, 9);
    /* the reference: the same two requests without a tier */
    outcome ca = {0}, cb = {0};
    llm_context *c = hybrid_ctx(m);
    llm_sched *s = NULL;
    if (c && llm_sched_create(c, NULL, &s) == LLM_OK) {
        llm_sched_request ra = greedy(pa, HN, 4, &ca), rb = greedy(pb, 6, 40, &cb);
        CHECK_EQ_INT(llm_sched_submit(s, &ra, NULL, NULL, 0), 0);
        CHECK_EQ_INT(llm_sched_submit(s, &rb, NULL, NULL, 0), 0);
        step_until_done(s, &ca);
        step_until_done(s, &cb);
        llm_sched_free(s);
    }
    llm_context_free(c);
    CHECK_EQ_INT(ca.n, 4);
    CHECK_EQ_INT(ca.cached, 0);

    for (int mode = HOLD_OK; mode <= HOLD_CANCEL; mode++) {   /* each on a folder holding a's prompt alone */
        char dir[] = "/tmp/kvcache_tier_XXXXXX";
        CHECK(mkdtemp(dir) != NULL);
        hybrid_write(m, dir, pa);
        outcome a = {0}, b = {0};
        held_load(m, dir, pa, pb, mode, &a, &b);
        clear_dir(dir);
        CHECK(b.n == cb.n && memcmp(b.tokens, cb.tokens, sizeof(int32_t) * (size_t)cb.n) == 0);
        if (mode == HOLD_CANCEL) continue;
        CHECK_EQ_INT(a.cached, mode == HOLD_OK ? 36 : 0);
        CHECK(a.n == ca.n && memcmp(a.tokens, ca.tokens, sizeof(int32_t) * (size_t)ca.n) == 0);
    }
    llm_model_free(m);
    fx_free(&fx);
}
