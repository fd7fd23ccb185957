/* tests/test_gemma3_real.c - the engine on the real Gemma 3 270M (the
 * pre-trained base model, Q4_K_M), fetched by `scripts/fetch-model.sh
 * gemma3-270m` when absent: what the file holds, its tokenizer against
 * SentencePiece's ids (tests/data/gemma3_cases.txt), greedy completions that
 * are coherent English and identical for 1 and 2 threads, cached decoding
 * equal to recomputation over 600+ positions while the window layers evict
 * their pages (and hold no more than the window and one chunk), and the
 * perplexity of tests/data/perplexity_en.txt at ctx 512 in its recorded
 * range. About 40 s on 2 cores. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "real_model.h"
#include "test.h"
#include "../engine/model/arch.h"
#include "../engine/gen/sampler.h"

#define GEMMA3_MODEL "models/gemma-3-270m-Q4_K_M.gguf"

static llm_model *gemma3(void) { return rm_load(GEMMA3_MODEL, "gemma3-270m"); }

TEST(gemma3_real_file_holds_what_the_issue_says) {
    llm_model *m = gemma3();
    if (!m) return;
    const llm_hparams *hp = &m->hp;
    CHECK(strcmp(llm_model_arch(m), "gemma3") == 0);
    CHECK(hp->n_layers == 18 && hp->dim == 640 && hp->n_heads == 4 && hp->n_kv_heads == 1);
    CHECK(hp->head_dim == 256 && hp->ffn_dim == 2048 && hp->ctx_train == 32768 && hp->n_vocab == 262144);
    CHECK(fabsf(hp->norm_eps - 1e-6f) < 1e-12f && hp->rope.theta == 1e6 && hp->rope.layout == KV_ROPE_NEOX);
    CHECK(m->tied_output);
    /* layers 5, 11, 17 global (group 0, base 1e6), the other 15 in the window group */
    CHECK_EQ_INT(m->n_groups, 2);
    CHECK(m->groups[0].n_layers == 3 && m->groups[0].window == 0);
    CHECK(m->groups[1].n_layers == 15 && m->groups[1].window == 512);
    for (int32_t l = 0; l < 18; l++) {
        int global = l % 6 == 5;
        CHECK_EQ_INT(m->lhp[l].group, global ? 0 : 1);
        CHECK_EQ_INT(m->lhp[l].window, global ? 0 : 512);
        CHECK(m->ropes[m->lhp[l].rope].params.theta == (global ? 1e6 : 1e4));
    }
    const llm_tokenizer *t = m->tok;
    CHECK_EQ_INT(llm_tokenizer_bos(t), 2);
    CHECK_EQ_INT(llm_tokenizer_find(t, "<start_of_turn>", 15), 105);
    CHECK_EQ_INT(llm_tokenizer_find(t, "<end_of_turn>", 13), 106);
    CHECK(llm_token_is_eog(t, 106) && llm_token_is_eog(t, 1));
    CHECK_EQ_INT(m->chat.kind, LLM_CHAT_GEMMA); /* no template in the file */
    llm_model_free(m);
}

/* llama.cpp's ids for the strings of tests/data/gen_tokenizer_refs.py and a few
 * more (scripts/tokenizer-fixtures.py), and detokenize(tokenize(s)) == s
 * (except for text holding a literal '▁', which SentencePiece reads as a
 * space). */
TEST(gemma3_real_tokenizer_matches_llama_cpp) {
    llm_model *m = gemma3();
    if (!m) return;
    FILE *f = fopen("tests/data/gemma3_cases.txt", "r");
    CHECK(f != NULL);
    static char line[1 << 15], text[1 << 14], back[1 << 15];
    static int32_t want[4096], got[4096];
    int cases = 0, bad = 0, bad_trip = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        char *p = line, *hex = strtok_r(p, " \n", &p);
        int n = (int)strtol(strtok_r(NULL, " \n", &p), NULL, 10);
        size_t len = 0;
        for (size_t i = 0; hex[0] != '-' && hex[i] && hex[i + 1]; i += 2) {
            char h[3] = {hex[i], hex[i + 1], 0};
            text[len++] = (char)strtol(h, NULL, 16);
        }
        for (int i = 0; i < n; i++) want[i] = (int32_t)strtol(strtok_r(NULL, " \n", &p), NULL, 10);
        int32_t k = llm_tokenize(m->tok, text, len, 0, 1, got, 4096);
        int ok = k == n;
        for (int i = 0; ok && i < k; i++) ok = got[i] == want[i];
        if (!ok && bad++ < 3) fprintf(stderr, "  '%.*s': %d ids, want %d\n", (int)len, text, (int)k, n);
        int32_t bl = llm_detokenize(m->tok, got, k, LLM_DETOK_SPECIAL, back, sizeof back);
        int literal = memmem(text, len, "\xe2\x96\x81", 3) != NULL;
        if (!literal && (bl != (int32_t)len || memcmp(back, text, len))) bad_trip++;
        cases++;
    }
    if (f) fclose(f);
    CHECK(cases >= 340);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(bad_trip, 0);
    llm_model_free(m);
}

/* A base model continues text: counting goes on, and a sentence about Paris
 * stays about France, with the same tokens for 1 and 2 threads. */
TEST(gemma3_real_greedy_completion_is_coherent_and_identical_for_1_2_threads) {
    llm_model *m = gemma3();
    if (!m) return;
    static const char *const prompts[2] = {"One, two, three, four,", "Paris is the capital and largest city of"};
    static const char *const expect[2][2] = {{"five, six, seven", "eight"}, {"France", " the "}};
    for (int p = 0; p < 2; p++) {
        int32_t ids[64], n = llm_tokenize(m->tok, prompts[p], strlen(prompts[p]), 1, 0, ids, 64), out[2][16], k[2];
        CHECK(n > 3 && ids[0] == 2);
        for (int t = 1; t <= 2; t++) {
            llm_context *c = rm_context(m, t, 256, 64, KV_F16);
            k[t - 1] = rm_greedy(c, ids, n, 16, out[t - 1]);
            llm_context_free(c);
        }
        CHECK(k[0] == 16 && k[1] == 16 && memcmp(out[0], out[1], sizeof out[0]) == 0);
        char text[512];
        CHECK(llm_detokenize(m->tok, out[0], k[0], 0, text, sizeof text) > 0);
        printf("     %s|%s\n", prompts[p], text);
        CHECK(strstr(text, expect[p][0]) != NULL && strstr(text, expect[p][1]) != NULL);
    }
    llm_model_free(m);
}

/* `kvcache verify`'s check past the window: the text's ~600 tokens fed in
 * chunks of 128, then 40 greedy steps one at a time, all on the cache, each
 * step's logits against one dense pass (no cache: by causality its row t is a
 * full recomputation of tokens 0..t; only the rows from the last prompt token
 * on are projected onto the 262,144-token vocabulary, which keeps this
 * fast). From position 512 on the window layers evict pages: the window
 * cache then holds no more than the window plus one chunk (plus the pages at
 * each end), the full cache every position. */
TEST(gemma3_real_cached_equals_recomputed_past_the_window_with_evicted_pages) {
    llm_model *m = gemma3();
    if (!m) return;
    enum { CHUNK = 128, STEPS = 40, P = 16 };
    static int32_t ids[4096];
    int32_t n = rm_text_tokens(m, ids, 4096 - STEPS);
    CHECK(n >= 560);
    const int32_t V = m->hp.n_vocab, total = n + STEPS;
    float *cached = malloc(sizeof(float) * (size_t)V * (STEPS + 1)), *dense = malloc(sizeof(float) * (size_t)V * (STEPS + 1));
    llm_context *c = rm_context_act(m, 2, 1024, CHUNK, KV_F32, 0); /* the cache alone: f32 products */
    kv_cache *global = llm_context_cache_at(c, 0), *local = llm_context_cache_at(c, 1);
    int32_t seq, most_local = 0;
    CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
    for (int32_t done = 0; done < n; done += CHUNK) {
        int32_t t = n - done < CHUNK ? n - done : CHUNK;
        CHECK_EQ_INT(llm_eval(c, seq, ids + done, t, 0, cached, NULL, NULL), LLM_OK);
        most_local = fmax(most_local, kv_cache_get_stats(local).pages_used);
    }
    for (int32_t s = 0; s < STEPS; s++) {
        ids[n + s] = llm_argmax(cached + (size_t)s * V, V);
        CHECK_EQ_INT(llm_eval(c, seq, ids + n + s, 1, 0, cached + (size_t)(s + 1) * V, NULL, NULL), LLM_OK);
        most_local = fmax(most_local, kv_cache_get_stats(local).pages_used);
    }
    kv_cache_stats gs = kv_cache_get_stats(global), ls = kv_cache_get_stats(local);
    printf("     %d positions: full cache %d pages, window cache %d now, at most %d\n", (int)total,
           (int)gs.pages_used, (int)ls.pages_used, (int)most_local);
    CHECK_EQ_INT(gs.pages_used, (total + P - 1) / P);
    CHECK(ls.pages_used < gs.pages_used);                  /* pages were evicted */
    CHECK(most_local <= (512 + CHUNK + P - 1) / P + 1);    /* window + one chunk */
    CHECK_EQ_INT(llm_forward_dense(c, ids, total, n - 1, dense), LLM_OK);
    double worst = rm_worst_row_diff(cached, dense, STEPS + 1, V);
    printf("     largest relative logit difference over the %d steps at positions %d..%d: %.3g\n", STEPS + 1,
           (int)n - 1, (int)total - 1, worst);
    if (!(worst <= 1e-4)) test_fail(__FILE__, __LINE__, "cached vs recomputed: %g", worst);
    free(cached), free(dense);
    llm_context_free(c);
    llm_model_free(m);
}

/* llama.cpp's method (tests/real_model.h). Recorded at ctx 512 (1 window,
 * 255 scored tokens): f16 K/V 13.82. The range allows other kernels'
 * rounding and fails for a broken model. */
TEST(gemma3_real_perplexity_at_ctx_512_is_in_its_recorded_range) {
    llm_model *m = gemma3();
    if (!m) return;
    static int32_t ids[4096];
    int32_t n = rm_text_tokens(m, ids, 4096);
    CHECK(n >= 512);
    int64_t scored;
    double ppl = rm_perplexity(m, ids, n, 512, KV_F16, &scored);
    printf("     %d tokens, %d scored: ppl %.4f\n", (int)n, (int)scored, ppl);
    CHECK(isfinite(ppl) && ppl > 12 && ppl < 16);
    llm_model_free(m);
}
