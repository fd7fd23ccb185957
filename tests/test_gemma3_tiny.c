/* tests/test_gemma3_tiny.c - the engine's gemma3 architecture on tiny
 * random-weight models (tests/test_model_fixture.h: 6 layers, 5 of them with a
 * window of 8 positions, pages of 4) against the fixture's independent float64
 * forward: every position of a prompt longer than the window, cached decoding
 * that evicts window pages against recomputation, chunked prefill across the
 * window boundary, the window cache's memory staying flat, prefix reuse over
 * both cache groups (window pages reclaimed, a session's /reset), thread
 * counts, the Gemma chat format, and the loader's errors.
 *
 * Tolerance as in test_model_tiny.c: f32 against f64 over six layers agrees
 * to a few 1e-7 of the largest logit; we allow 1e-5. A wrong window bound, a
 * swapped RoPE base or layout, a missing QK-norm or post-norm, or SwiGLU for
 * GeGLU moves logits by far more (the tests below check some of these do). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "test_model_fixture.h"
#include "gguf_writer.h"
#include "../engine/model/arch.h"
#include "../engine/gen/session.h"

enum { N = 24, W = 8, PAGE = 4 };

static llm_context *make_ctx(const llm_model *m, int32_t threads, int32_t batch, kv_dtype kv) {
    llm_context_params p = llm_context_default_params();
    p.n_ctx = 256, p.n_threads = threads, p.kv_type = kv, p.n_batch = batch, p.page_size = PAGE;
    p.act_bits = 0; /* against a float64 oracle: the f32 products, as the oracle computes them */
    return fx_context(m, &p);
}

static void prompt(int32_t *t, int32_t n, int32_t salt) {
    t[0] = 2; /* <bos> */
    for (int32_t i = 1; i < n; i++) t[i] = FX_BYTE0 + (i * 37 + salt * 11) % 256;
}

/* max |a - b| / max |b| over n */
static double rel_diff(const float *a, const double *b, int64_t n) {
    double bmax, d = fx_max_diff(a, b, n, &bmax);
    return d / bmax;
}

static double rel_diff_f(const float *a, const float *b, int64_t n) {
    double d = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        d = e > d || isnan(e) ? e : d;
        mx = fmax(mx, fabs(b[i]));
    }
    return d / mx;
}

/* Every position's logits from one prefill (one pass of N rows, and chunks of
 * 5 rows, whose later chunks see window caches that already dropped pages)
 * against the f64 reference. */
static void check_against_reference(const fx_spec *spec, const char *what) {
    fx_model fx;
    if (fx_build(spec, &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    CHECK(strcmp(llm_model_arch(m), "gemma3") == 0);
    CHECK_EQ_INT(m->n_groups, 2);
    CHECK_EQ_INT(m->groups[0].window, 0);
    CHECK_EQ_INT(m->groups[1].window, W);
    int32_t toks[N];
    prompt(toks, N, (int32_t)spec->seed);
    llm_context_params p = llm_context_default_params();
    p.n_ctx = 256, p.n_threads = 2, p.kv_type = KV_F32, p.page_size = PAGE, p.act_bits = 0;
    fx_check_prefill(&fx, m, &p, toks, N, (const int32_t[]){64, 5}, 2, 1e-5, what);
    llm_model_free(m);
    fx_free(&fx);
}

#define GEMMA(...) (&(fx_spec){.arch = "gemma3", __VA_ARGS__})

TEST(gemma3_tiny_f32_matches_f64_reference) { check_against_reference(GEMMA(.type = GW_F32, .seed = 1), "F32"); }
TEST(gemma3_tiny_q8_0_matches_f64_reference) { check_against_reference(GEMMA(.type = GW_Q8_0, .seed = 2), "Q8_0"); }
TEST(gemma3_tiny_q4_k_matches_f64_reference) { check_against_reference(GEMMA(.type = GW_Q4_K, .seed = 3), "Q4_K"); }
TEST(gemma3_tiny_q5_0_matches_f64_reference) { check_against_reference(GEMMA(.type = GW_Q5_0, .seed = 13), "Q5_0"); }
/* GQA with two KV heads, and twelve layers (two global ones) */
TEST(gemma3_tiny_gqa_and_12_layers_match_f64_reference) {
    check_against_reference(GEMMA(.type = GW_F16, .seed = 4, .kv_heads = 2), "GQA");
    check_against_reference(GEMMA(.type = GW_Q8_0, .seed = 5, .layers = 12), "12 L");
}

/* The reference itself tells the pieces apart: the same weights with no
 * window (one more layer global) or with the Llama forward give other logits,
 * so agreeing with it means the engine did each piece. */
TEST(gemma3_tiny_reference_depends_on_window_and_architecture) {
    fx_model fx;
    if (fx_build(GEMMA(.type = GW_F32, .seed = 6), &fx)) return;
    const int32_t V = fx.vocab;
    int32_t toks[N];
    prompt(toks, N, 6);
    double *a = malloc(sizeof(double) * N * V), *b = malloc(sizeof(double) * N * V);
    fx_reference(&fx, toks, N, a);
    fx.s.window = N; /* sees everything */
    fx_reference(&fx, toks, N, b);
    double early = 0, late = 0, mx = 0;
    for (int32_t t = 0; t < N; t++)
        for (int32_t i = 0; i < V; i++) {
            double e = fabs(a[(size_t)t * V + i] - b[(size_t)t * V + i]);
            if (t < W) early = fmax(early, e);
            else late = fmax(late, e);
            mx = fmax(mx, fabs(a[(size_t)t * V + i]));
        }
    CHECK(early == 0);          /* positions inside the window see the same keys */
    CHECK(late > 1e-3 * mx);    /* later ones do not */
    fx.s.window = W;
    fx.gemma = 0;               /* the Llama forward over the same tensors */
    fx_reference(&fx, toks, N, b);
    CHECK(fabs(a[0] - b[0]) > 1e-3 * mx || fabs(a[V - 1] - b[V - 1]) > 1e-3 * mx);
    fx.gemma = 1;
    free(a), free(b);
    fx_free(&fx);
}

/* Decode 40 tokens one at a time after a 6-token prompt: each step's logits
 * against a dense recomputation (one pass, no cache) and the f64 reference;
 * meanwhile the window cache drops its old pages: it never holds more than
 * the window plus the new row, rounded out to pages. */
TEST(gemma3_tiny_cached_decode_equals_recompute_while_window_pages_are_evicted) {
    enum { P0 = 6, STEPS = 40 };
    fx_model fx;
    if (fx_build(GEMMA(.type = GW_Q8_0, .seed = 7), &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    const int32_t V = fx.vocab;
    llm_context *c = make_ctx(m, 2, 64, KV_F32);
    CHECK_EQ_INT(llm_context_n_caches(c), 2);
    kv_cache *global = llm_context_cache_at(c, 0), *local = llm_context_cache_at(c, 1);
    int32_t toks[P0 + STEPS + 1], n = P0, seq;
    prompt(toks, P0, 7);
    float *steps = malloc(sizeof(float) * (STEPS + 1) * V);
    CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
    CHECK_EQ_INT(llm_eval(c, seq, toks, n, 0, steps, NULL, NULL), LLM_OK);
    int32_t most_local = 0;
    for (int s = 0; s <= STEPS; s++) {
        float *lc = steps + (size_t)s * V;
        if (s > 0) CHECK_EQ_INT(llm_eval(c, seq, &toks[n - 1], 1, 0, lc, NULL, NULL), LLM_OK);
        kv_cache_stats gs = kv_cache_get_stats(global), ls = kv_cache_get_stats(local);
        CHECK_EQ_INT(gs.pages_used, (n + PAGE - 1) / PAGE);
        most_local = ls.pages_used > most_local ? ls.pages_used : most_local;
        int32_t best = FX_BYTE0;
        for (int32_t i = FX_BYTE0; i < V; i++) best = lc[i] > lc[best] ? i : best;
        toks[n++] = best;
    }
    /* W + 1 positions span at most ceil(W / P) + 1 pages */
    printf("     window cache: at most %d pages in use over %d positions\n", (int)most_local, (int)(n - 1));
    CHECK(most_local <= (W + PAGE - 1) / PAGE + 1);
    float *dense = malloc(sizeof(float) * (STEPS + 1) * V);
    CHECK_EQ_INT(llm_forward_dense(c, toks, n - 1, P0 - 1, dense), LLM_OK);
    double r = rel_diff_f(steps, dense, (int64_t)(STEPS + 1) * V);
    double *ref = malloc(sizeof(double) * (size_t)(n - 1) * V);
    fx_reference(&fx, toks, n - 1, ref);
    double rr = rel_diff(steps, ref + (size_t)(P0 - 1) * V, (int64_t)(STEPS + 1) * V);
    printf("     cached vs recomputed %.2e, vs f64 reference %.2e (relative)\n", r, rr);
    if (!(r <= 1e-4)) test_fail(__FILE__, __LINE__, "cached vs recomputed: %g", r);
    if (!(rr <= 1e-5)) test_fail(__FILE__, __LINE__, "cached vs f64: %g", rr);
    /* the keys before the window are gone: going back there is refused */
    CHECK_EQ_INT(llm_seq_truncate(c, seq, 2), LLM_ERR_WINDOW);
    free(steps), free(dense), free(ref);
    llm_context_free(c);
    llm_model_free(m);
    fx_free(&fx);
}

/* The memory check at the real model's window: W = 512, pages of 16,
 * a 1024-token prompt in chunks of 64, then 3072 tokens generated one at a
 * time. From the caches' statistics after every call: the global layers'
 * bytes grow with the sequence (every position kept), the window layers'
 * never pass 512 + one chunk positions' worth (plus the page partly covered
 * at each end). */
TEST(gemma3_tiny_window_layers_memory_stays_flat_over_4096_generated_tokens) {
    enum { WIN = 512, PG = 16, PROMPT = 1024, CHUNK = 64, TOTAL = 4096 };
    fx_model fx;
    if (fx_build(GEMMA(.type = GW_Q8_0, .seed = 12, .window = WIN, .dim = 64, .heads = 2, .ffn = 128),
                 &fx))
        return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    const int32_t V = fx.vocab;
    llm_context_params p = llm_context_default_params();
    p.n_ctx = TOTAL, p.n_threads = 2, p.n_batch = CHUNK, p.page_size = PG;
    llm_context *c = NULL;
    CHECK_EQ_INT(llm_context_create(m, &p, &c, NULL, 0), LLM_OK);
    if (!c) return llm_model_free(m), fx_free(&fx);
    kv_cache *global = llm_context_cache_at(c, 0), *local = llm_context_cache_at(c, 1);
    const uint64_t per_pos_local = kv_cache_get_stats(local).bytes_per_page / PG;
    const uint64_t per_pos_global = kv_cache_get_stats(global).bytes_per_page / PG;
    int32_t *toks = malloc(sizeof(int32_t) * TOTAL), seq, bad_global = 0;
    prompt(toks, PROMPT, 12);
    float *lg = malloc(sizeof(float) * V);
    uint64_t most_prefill = 0, most_decode = 0;
    CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
    for (int32_t n = 0; n < TOTAL;) {
        int32_t t = n < PROMPT ? CHUNK : 1;
        if (n >= PROMPT) {
            int32_t best = FX_BYTE0;
            for (int32_t i = FX_BYTE0; i < V; i++) best = lg[i] > lg[best] ? i : best;
            toks[n] = best;
        }
        if (llm_eval(c, seq, toks + n, t, 0, lg, NULL, NULL) != LLM_OK) {
            test_fail(__FILE__, __LINE__, "eval at %d", (int)n);
            break;
        }
        n += t;
        kv_cache_stats gs = kv_cache_get_stats(global), ls = kv_cache_get_stats(local);
        bad_global += gs.bytes_in_use != (uint64_t)((n + PG - 1) / PG) * PG * per_pos_global;
        uint64_t *most = n <= PROMPT ? &most_prefill : &most_decode;
        *most = ls.bytes_in_use > *most ? ls.bytes_in_use : *most;
    }
    printf("     window layers: at most %llu B in prefill (bound %llu), %llu B in decode (bound %llu); "
           "global layers: %llu B at %d tokens\n",
           (unsigned long long)most_prefill, (unsigned long long)((WIN + CHUNK + 2 * PG) * per_pos_local),
           (unsigned long long)most_decode, (unsigned long long)((WIN + 1 + 2 * PG) * per_pos_local),
           (unsigned long long)kv_cache_get_stats(global).bytes_in_use, (int)TOTAL);
    CHECK_EQ_INT(bad_global, 0);
    /* positions' worth, rounded out to whole pages at both ends */
    CHECK(most_prefill <= (uint64_t)(WIN + CHUNK + 2 * PG) * per_pos_local);
    CHECK(most_decode <= (uint64_t)(WIN + 1 + 2 * PG) * per_pos_local);
    CHECK(most_decode >= (uint64_t)WIN * per_pos_local); /* and the window really is kept */
    CHECK_EQ_INT(llm_seq_length(c, seq), TOTAL);
    free(toks), free(lg);
    llm_context_free(c);
    llm_model_free(m);
    fx_free(&fx);
}

/* no_window (`--no-window`): the window layers keep every position in a cache
 * sized as a full one; attention still sees only the window, so every logit
 * is the same, bit for bit, while the window group's memory grows with the
 * sequence instead of staying flat. */
TEST(gemma3_tiny_no_window_gives_the_same_logits_with_full_size_caches) {
    enum { LEN = 80 };
    fx_model fx;
    if (fx_build(GEMMA(.type = GW_Q8_0, .seed = 14), &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    const int32_t V = fx.vocab;
    int32_t toks[LEN];
    prompt(toks, LEN, 14);
    float *lg[2] = {malloc(sizeof(float) * LEN * V), malloc(sizeof(float) * LEN * V)};
    uint64_t local_bytes[2], global_bytes[2];
    for (int nw = 0; nw < 2; nw++) {
        llm_context_params p = llm_context_default_params();
        p.n_ctx = 256, p.n_threads = 2, p.n_batch = 16, p.page_size = PAGE, p.kv_type = KV_F16, p.no_window = nw;
        llm_context *c = NULL;
        CHECK_EQ_INT(llm_context_create(m, &p, &c, NULL, 0), LLM_OK);
        if (!c) break;
        int32_t seq;
        CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
        CHECK_EQ_INT(llm_eval(c, seq, toks, LEN, 1, lg[nw], NULL, NULL), LLM_OK);
        global_bytes[nw] = kv_cache_get_stats(llm_context_cache_at(c, 0)).bytes_in_use;
        local_bytes[nw] = kv_cache_get_stats(llm_context_cache_at(c, 1)).bytes_in_use;
        llm_context_free(c);
    }
    printf("     window group: %llu B with windows, %llu B with no_window; global group %llu B both\n",
           (unsigned long long)local_bytes[0], (unsigned long long)local_bytes[1], (unsigned long long)global_bytes[0]);
    CHECK(memcmp(lg[0], lg[1], sizeof(float) * LEN * V) == 0);
    CHECK(global_bytes[0] == global_bytes[1]);
    /* 5 window layers vs 1 global layer: no_window keeps 5x the global group's bytes */
    CHECK(local_bytes[1] == 5 * global_bytes[1]);
    CHECK(local_bytes[0] < local_bytes[1] / 2);
    llm_context_params bad = llm_context_default_params();
    bad.no_window = 2;
    llm_context *c = (llm_context *)1;
    char err[128] = "";
    CHECK_EQ_INT(llm_context_create(m, &bad, &c, err, sizeof err), LLM_ERR_PARAM);
    CHECK(c == NULL && strstr(err, "no_window") != NULL);
    free(lg[0]), free(lg[1]);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(gemma3_tiny_results_are_bit_identical_for_1_2_3_threads) {
    fx_model fx;
    if (fx_build(GEMMA(.type = GW_Q4_K, .seed = 8), &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    int32_t toks[60];
    prompt(toks, 60, 8);
    llm_context_params p = llm_context_default_params();
    p.n_ctx = 256, p.kv_type = KV_F16, p.n_batch = 16, p.page_size = PAGE, p.act_bits = 0;
    fx_check_threads(m, &p, toks, 60);
    llm_model_free(m);
    fx_free(&fx);
}

/* A pre-trained Gemma 3 file has no chat template: the Gemma turn format is
 * chosen from its vocabulary, the rendered prompt tokenizes into the turn
 * markers, and generating <end_of_turn> ends the turn. */
TEST(gemma3_tiny_without_template_takes_the_gemma_turn_format) {
    fx_model fx;
    if (fx_build(GEMMA(.type = GW_F32, .seed = 9), &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    const llm_chat_format *f = llm_model_chat(m);
    CHECK_EQ_INT(f->kind, LLM_CHAT_GEMMA);
    llm_chat_msg msgs[] = {{"system", "Be brief."}, {"user", "Hi"}};
    char text[256];
    int32_t n = llm_chat_render(f, msgs, 2, 1, text, sizeof text);
    CHECK(n > 0);
    CHECK(strcmp(text, "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n") == 0);
    const llm_tokenizer *tok = llm_model_tokenizer(m);
    int32_t ids[256];
    int32_t k = llm_tokenize(tok, text, (size_t)n, 1, 1, ids, 256);
    /* bos, three markers, one byte token per other byte (the space is '▁', 3 bytes) */
    CHECK(k == 1 + 3 + (n - 2 * 15 - 13) + 2);
    CHECK(ids[0] == 2 && ids[1] == FX_START_OF_TURN && ids[2] == FX_BYTE0 + 'u');
    int starts = 0, ends = 0;
    for (int32_t i = 0; i < k; i++) starts += ids[i] == FX_START_OF_TURN, ends += ids[i] == FX_END_OF_TURN;
    CHECK(starts == 2 && ends == 1);
    CHECK(llm_token_is_eog(tok, FX_END_OF_TURN) && llm_token_is_eog(tok, 1));
    CHECK(!llm_token_is_eog(tok, FX_START_OF_TURN));
    llm_model_free(m);
    fx_free(&fx);
}

TEST(gemma3_load_names_what_is_wrong) {
    fx_check_load_error(GEMMA(.type = GW_F32, .skip_tensor = "blk.3.attn_k_norm.weight"), "missing tensor blk.3.attn_k_norm.weight");
    fx_check_load_error(GEMMA(.type = GW_F32, .skip_tensor = "blk.5.post_ffw_norm.weight"), "blk.5.post_ffw_norm.weight");
    fx_check_load_error(GEMMA(.type = GW_F32, .untied = 1), "output.weight");
    fx_check_load_error(GEMMA(.type = GW_Q8_0, .bad_tensor = "blk.0.attn_q.weight"), "blk.0.attn_q.weight has shape");
}

/* Prefix reuse over both cache groups. One context (one sequence, batches
 * of 5): its window cache has 5 pages, (W + 5) / 4 + 1, so prefilling 40
 * tokens (10 pages) reclaims the 5 oldest evicted ones, blocks 0 .. 4, while
 * the full cache keeps all 10. A window group resumes at m from blocks
 * (m - W + 1) / 4 .. m / 4 - 1, so only m >= 28 can be served: the prompt
 * sharing 30 tokens resumes at 28 (and its logits equal the f64 reference
 * over the whole prompt), the one sharing 26 at 0, although the full group
 * alone holds 24. */
static llm_context *after_prefill(const llm_model *m, const int32_t *toks, int32_t n) {
    llm_context *c = make_ctx(m, 1, 5, KV_F32);
    int32_t seq;
    CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
    CHECK_EQ_INT(llm_eval(c, seq, toks, n, 0, NULL, NULL, NULL), LLM_OK);
    CHECK_EQ_INT(llm_seq_remove(c, seq), LLM_OK);
    return c;
}

TEST(gemma3_tiny_prefix_reuse_over_full_and_window_groups_equals_f64_reference) {
    enum { NA = 40, NB = 40 };
    fx_model fx;
    if (fx_build(GEMMA(.type = GW_F32, .seed = 8), &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    const int32_t V = fx.vocab;
    int32_t a[NA], b[NB];
    prompt(a, NA, 8);
    const int32_t shared[] = {30, 26, 40}, expect[] = {28, 0, 36};
    float *lg = malloc(sizeof(float) * NB * V);
    double *ref = malloc(sizeof(double) * NB * V);
    for (int k = 0; k < 3; k++) {
        prompt(b, NB, 9);
        memcpy(b, a, sizeof(int32_t) * (size_t)shared[k]);
        llm_context *c = after_prefill(m, a, NA);
        kv_cache *global = llm_context_cache_at(c, 0), *local = llm_context_cache_at(c, 1);
        CHECK_EQ_INT(kv_cache_get_stats(local).pages_cached, 5);   /* 5 of 10 reclaimed */
        CHECK_EQ_INT(kv_cache_get_stats(global).pages_cached, NA / PAGE);
        int32_t full_only, got, seq;
        CHECK_EQ_INT(kv_prefix_lookup(global, b, NB - 1, &full_only), KV_OK);
        CHECK_EQ_INT(full_only, (shared[k] < NB - 1 ? shared[k] : NB - 1) / PAGE * PAGE);
        CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
        CHECK_EQ_INT(llm_seq_prefix_match(c, seq, b, NB - 1, &got), LLM_OK);
        CHECK_EQ_INT(got, expect[k]);
        CHECK_EQ_INT(llm_seq_length(c, seq), got);
        /* the window cache holds only the pages of the last W positions */
        CHECK(kv_cache_get_stats(local).pages_used <= (W + PAGE - 1) / PAGE + 1);
        CHECK_EQ_INT(llm_eval(c, seq, b + got, NB - got, 1, lg, NULL, NULL), LLM_OK);
        fx_reference(&fx, b, NB, ref);
        double r = rel_diff(lg, ref + (size_t)got * V, (int64_t)(NB - got) * V);
        printf("     %d shared: resumed at %d (full group alone %d), vs f64 %.2e\n", (int)shared[k], (int)got,
               (int)full_only, r);
        if (!(r <= 1e-5)) test_fail(__FILE__, __LINE__, "after resuming at %d: %g from f64", (int)got, r);
        llm_context_free(c);
    }
    free(lg), free(ref);
    llm_model_free(m);
    fx_free(&fx);
}

/* `chat`'s loop: a session that starts over (/reset) resumes the same
 * prompt from the prefix cache in both groups (30 tokens: 28 reused, the
 * window's pages included), and generates what it generated the first time. */
TEST(gemma3_tiny_session_after_a_reset_resumes_from_the_prefix_cache) {
    enum { NP = 30, OUT = 8 };
    fx_model fx;
    if (fx_build(GEMMA(.type = GW_Q8_0, .seed = 10), &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    llm_context *c = make_ctx(m, 1, 64, KV_F32);
    llm_session *s;
    CHECK_EQ_INT(llm_session_create(c, &s), LLM_OK);
    int32_t toks[NP], first[NP + OUT], n1, n2;
    prompt(toks, NP, 10);
    llm_gen_params gp = llm_gen_default_params();
    gp.max_tokens = OUT, gp.sampler.temp = 0, gp.ignore_eog = 1;
    llm_gen_result res;
    CHECK_EQ_INT(llm_session_generate(s, toks, NP, &gp, &res), LLM_OK);
    CHECK_EQ_INT(res.n_reused, 0);
    const int32_t *held = llm_session_tokens(s, &n1);
    CHECK_EQ_INT(n1, NP + OUT);
    memcpy(first, held, sizeof(int32_t) * (size_t)n1);
    llm_session_reset(s);
    CHECK_EQ_INT(llm_session_generate(s, toks, NP, &gp, &res), LLM_OK);
    CHECK_EQ_INT(res.n_reused, 28);
    held = llm_session_tokens(s, &n2);
    CHECK(n2 == n1 && !memcmp(held, first, sizeof(int32_t) * (size_t)n1));
    llm_session_free(s);
    llm_context_free(c);
    llm_model_free(m);
    fx_free(&fx);
}
