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

/* The last position's logits of tokens after the tier gave what it has:
 * *from_disk receives the positions it gave. */
static void continue_from_tier(const llm_model *m, const char *dir, uint64_t max_bytes, const int32_t *tokens,
                               float *logits, int32_t *from_disk, llm_tier_stats *st) {
    llm_context *c = tier_ctx(m);
    llm_tier *t = NULL;
    char err[256];
    *from_disk = -1;
    if (!c) return;
    CHECK_EQ_INT(llm_tier_open(dir, max_bytes, c, &t, err, sizeof err), LLM_OK);
    int32_t seq;
    CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
    *from_disk = llm_tier_extend(t, seq, tokens, N_TOK - 1);
    CHECK_EQ_INT(llm_eval(c, seq, tokens + *from_disk, N_TOK - *from_disk, 0, logits, NULL, NULL), LLM_OK);
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
    continue_from_tier(m, dir, 1 << 30, tokens, got, &from_disk, &st);
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
    continue_from_tier(m, dir, 1 << 30, tokens, got, &from_disk, &st);
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
    continue_from_tier(m, dir, (uint64_t)(2.5 * (double)one), tokens, got, &from_disk, &st);
    CHECK(count_files(dir) <= 2);
    CHECK(st.evictions >= 1);
    CHECK(memcmp(got, cold, sizeof(float) * (size_t)V) == 0);

    clear_dir(dir);
    free(cold), free(got), free(ref);
    llm_model_free(m);
    fx_free(&fx);
}
