/* tests/test_arch_tiny.c - the qwen2, qwen3 and phi3 architectures, and
 * llama with Mistral's sliding window, on tiny random-weight models
 * (tests/test_model_fixture.h) against the fixture's independent float64
 * forward: every position of a prompt (one pass and chunks of 5), cached
 * decoding against recomputation and against f64, thread counts, the ChatML
 * format, and the loader's errors.
 *
 * Tolerance as in test_model_tiny.c: f32 against f64 agrees to a few 1e-7 of
 * the largest logit; we allow 1e-5. A dropped bias, a missing QK-norm, the
 * interleaved RoPE layout for the split-half one or a window ignored move
 * logits by far more (the reference test below shows the oracle tells each
 * apart). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "test_model_fixture.h"
#include "gguf_writer.h"
#include "../engine/model/arch.h"

enum { N = 24, PAGE = 4 };

static llm_context *make_ctx(const llm_model *m, int32_t threads, int32_t batch, kv_dtype kv) {
    llm_context_params p = llm_context_default_params();
    p.n_ctx = 128, p.n_threads = threads, p.kv_type = kv, p.n_batch = batch, p.page_size = PAGE;
    p.act_bits = 0; /* against a float64 oracle: the f32 products, as the oracle computes them */
    return fx_context(m, &p);
}

static void prompt(int32_t *t, int32_t n, int32_t salt) {
    t[0] = 1; /* <|im_start|> */
    for (int32_t i = 1; i < n; i++) t[i] = FX_BYTE0 + (i * 37 + salt * 11) % 256;
}

/* max |a - b| / max |b| over n */
static double rel_diff(const float *a, const double *b, int64_t n) {
    double bmax, d = fx_max_diff(a, b, n, &bmax);
    return d / bmax;
}

/* Every position's logits from one prefill of N rows and from chunks of 5
 * against the f64 reference. */
static void check_against_reference(const fx_spec *spec, const char *what) {
    fx_model fx;
    if (fx_build(spec, &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    CHECK(strcmp(llm_model_arch(m), spec->arch) == 0);
    CHECK_EQ_INT(m->n_groups, 1);
    CHECK_EQ_INT(m->groups[0].window, strcmp(spec->arch, "llama") ? 0 : spec->window);
    CHECK_EQ_INT(m->hp.head_dim, fx.head_dim);
    int32_t toks[N];
    prompt(toks, N, (int32_t)spec->seed);
    llm_context_params p = llm_context_default_params();
    p.n_ctx = 128, p.n_threads = 2, p.kv_type = KV_F32, p.page_size = PAGE, p.act_bits = 0;
    char label[64];
    snprintf(label, sizeof label, "%s %s", spec->arch, what);
    fx_check_prefill(&fx, m, &p, toks, N, (const int32_t[]){64, 5}, 2, 1e-5, label);
    llm_model_free(m);
    fx_free(&fx);
}

#define QWEN2(...) (&(fx_spec){.arch = "qwen2", __VA_ARGS__})
#define QWEN3(...) (&(fx_spec){.arch = "qwen3", __VA_ARGS__})
#define PHI3(...) (&(fx_spec){.arch = "phi3", __VA_ARGS__})
#define LLAMA(...) (&(fx_spec){.arch = "llama", __VA_ARGS__})
#define MISTRAL(...) (&(fx_spec){.arch = "llama", .window = 8, __VA_ARGS__})

TEST(qwen2_tiny_matches_f64_reference) {
    check_against_reference(QWEN2(.type = GW_F32, .seed = 1), "F32");
    check_against_reference(QWEN2(.type = GW_Q8_0, .seed = 2, .tied = 1), "Q8_0 tied");
    check_against_reference(QWEN2(.type = GW_Q4_K, .seed = 3, .kv_heads = 1), "Q4_K MQA");
}

/* head_dim 128 over D = 256 with 4 heads: q is 512 wide, twice D (as
 * Qwen3 0.6B: 16 x 128 over 1024) */
TEST(qwen3_tiny_matches_f64_reference) {
    check_against_reference(QWEN3(.type = GW_F32, .seed = 4), "F32");
    check_against_reference(QWEN3(.type = GW_Q8_0, .seed = 5, .head_dim = 128, .tied = 1), "Q8_0 d=128");
    check_against_reference(QWEN3(.type = GW_Q6_K, .seed = 6, .head_dim = 32, .heads = 8), "Q6_K d=32");
}

/* fused q/k/v and gate/up split into the Llama forward's matrices; the
 * window key phi3 files carry is not applied (as in llama.cpp) */
TEST(phi3_tiny_matches_f64_reference) {
    check_against_reference(PHI3(.type = GW_F32, .seed = 19), "F32");
    check_against_reference(PHI3(.type = GW_Q4_K, .seed = 20, .window = 8, .kv_heads = 4), "Q4_K MHA W");
    check_against_reference(PHI3(.type = GW_Q8_0, .seed = 21, .tied = 1, .rot_dim = 32), "Q8_0 r=32");
}

/* Mistral: the llama forward with every layer's window 8, a prompt of 24 */
TEST(llama_sliding_window_tiny_matches_f64_reference) {
    check_against_reference(MISTRAL(.type = GW_F32, .seed = 7), "F32 W=8");
    check_against_reference(&(fx_spec){.arch = "llama", .type = GW_Q4_0, .seed = 8, .window = 5}, "Q4_0 W=5");
}

/* llama files may carry q/k/v biases, all or some: each one present is added */
TEST(llama_tiny_optional_biases_match_f64_reference) {
    check_against_reference(&(fx_spec){.arch = "llama", .type = GW_F32, .seed = 24, .qkv_bias = 1}, "F32 biases");
    check_against_reference(&(fx_spec){.arch = "llama", .type = GW_Q8_0, .seed = 25, .qkv_bias = 1,
                                       .skip_tensor = "blk.1.attn_k.bias"}, "Q8_0 no bk 1");
}

/* sliding_window = 0 is the converters' "none": full attention */
TEST(llama_sliding_window_0_means_full_attention) {
    fx_model fx;
    if (fx_build(&(fx_spec){.arch = "llama", .type = GW_F32, .seed = 18, .window = -1}, &fx)) return;
    llm_model *m = fx_load(&fx);
    if (m) CHECK_EQ_INT(m->groups[0].window, 0);
    llm_model_free(m);
    fx_free(&fx);
}

/* The reference tells the pieces apart, so agreeing with it means the engine
 * did each: the same weights without the biases, without the QK-norms, with
 * the llama forward (interleaved RoPE, neither piece), or with no window give
 * other logits. */
static double ref_change(fx_model *fx, const int32_t *toks, double *a, double *b, void (*edit)(fx_model *, int)) {
    const int32_t V = fx->vocab;
    fx_reference(fx, toks, N, a);
    edit(fx, 1);
    fx_reference(fx, toks, N, b);
    edit(fx, 0);
    double d = 0, mx = 0;
    for (int64_t i = 0; i < (int64_t)N * V; i++) d = fmax(d, fabs(a[i] - b[i])), mx = fmax(mx, fabs(a[i]));
    return d / mx;
}

static double *saved[3];
static void no_bias(fx_model *fx, int on) {
    fx_layer *L = &fx->L[0];
    if (on) saved[0] = L->bq, saved[1] = L->bk, saved[2] = L->bv, L->bq = L->bk = L->bv = NULL;
    else L->bq = saved[0], L->bk = saved[1], L->bv = saved[2];
}
static void no_qk_norm(fx_model *fx, int on) { fx->qwen = on ? 2 : 3; } /* qwen2 with no biases: qwen3 less its norms */
static void as_llama(fx_model *fx, int on) { fx->qwen = on ? 0 : 3; }
static void no_window(fx_model *fx, int on) { fx->s.window = on ? 0 : 8; }

TEST(qwen_tiny_reference_depends_on_biases_qk_norm_rope_layout_and_window) {
    fx_model q2, q3, mi;
    if (fx_build(QWEN2(.type = GW_F32, .seed = 9), &q2)) return;
    if (fx_build(QWEN3(.type = GW_F32, .seed = 9), &q3)) return fx_free(&q2);
    if (fx_build(MISTRAL(.type = GW_F32, .seed = 9), &mi)) return fx_free(&q2), fx_free(&q3);
    int32_t toks[N];
    prompt(toks, N, 9);
    double *a = malloc(sizeof(double) * N * FX_VOCAB), *b = malloc(sizeof(double) * N * FX_VOCAB);
    double r_bias = ref_change(&q2, toks, a, b, no_bias), r_norm = ref_change(&q3, toks, a, b, no_qk_norm);
    double r_llama = ref_change(&q3, toks, a, b, as_llama), r_win = ref_change(&mi, toks, a, b, no_window);
    printf("     relative change: layer 0 biases %.2e, QK-norm %.2e, llama RoPE %.2e, window %.2e\n", r_bias, r_norm,
           r_llama, r_win);
    CHECK(r_bias > 1e-3 && r_norm > 1e-3 && r_llama > 1e-3 && r_win > 1e-3);
    free(a), free(b);
    fx_free(&q2), fx_free(&q3), fx_free(&mi);
}

/* Decode 30 tokens one at a time after a 5-token prompt: every step against
 * one dense recomputation and the whole run against f64. With the window,
 * the cache drops pages the window has passed. */
static void check_cached_equals_recompute(const fx_spec *spec) {
    enum { P0 = 5, STEPS = 30 };
    fx_model fx;
    if (fx_build(spec, &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    const int32_t V = fx.vocab;
    llm_context *c = make_ctx(m, 3, 64, KV_F32);
    int32_t toks[P0 + STEPS + 1], n = P0, seq, most_pages = 0;
    prompt(toks, P0, (int32_t)spec->seed);
    float *steps = malloc(sizeof(float) * (STEPS + 1) * V);
    CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
    CHECK_EQ_INT(llm_eval(c, seq, toks, n, 0, steps, NULL, NULL), LLM_OK);
    for (int s = 0; s <= STEPS; s++) {
        float *lc = steps + (size_t)s * V;
        if (s > 0) CHECK_EQ_INT(llm_eval(c, seq, &toks[n - 1], 1, 0, lc, NULL, NULL), LLM_OK);
        kv_cache_stats st = kv_cache_get_stats(llm_context_cache_at(c, 0));
        most_pages = st.pages_used > most_pages ? st.pages_used : most_pages;
        int32_t best = FX_BYTE0;
        for (int32_t i = FX_BYTE0; i < V; i++) best = lc[i] > lc[best] ? i : best;
        toks[n++] = best;
    }
    if (spec->window) CHECK(most_pages <= (spec->window + PAGE - 1) / PAGE + 1);
    float *dense = malloc(sizeof(float) * (STEPS + 1) * V);
    CHECK_EQ_INT(llm_forward_dense(c, toks, n - 1, P0 - 1, dense), LLM_OK);
    double r = 0, mx = 0;
    for (int64_t i = 0; i < (int64_t)(STEPS + 1) * V; i++)
        r = fmax(r, fabs((double)steps[i] - dense[i])), mx = fmax(mx, fabs(dense[i]));
    double *ref = malloc(sizeof(double) * (size_t)(n - 1) * V);
    fx_reference(&fx, toks, n - 1, ref);
    double rr = rel_diff(steps, ref + (size_t)(P0 - 1) * V, (int64_t)(STEPS + 1) * V);
    printf("     %-6s W=%d: cached vs recomputed %.2e, vs f64 reference %.2e (relative), at most %d pages\n",
           spec->arch, (int)spec->window, r / mx, rr, (int)most_pages);
    if (!(r <= 1e-4 * mx)) test_fail(__FILE__, __LINE__, "cached vs recomputed: %g", r / mx);
    if (!(rr <= 1e-5)) test_fail(__FILE__, __LINE__, "cached vs f64: %g", rr);
    free(steps), free(dense), free(ref);
    llm_context_free(c);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(qwen_tiny_cached_decode_equals_recompute_and_f64) {
    check_cached_equals_recompute(QWEN2(.type = GW_Q8_0, .seed = 10));
    check_cached_equals_recompute(QWEN3(.type = GW_Q4_K, .seed = 11, .head_dim = 128));
    check_cached_equals_recompute(MISTRAL(.type = GW_Q8_0, .seed = 12));
    check_cached_equals_recompute(PHI3(.type = GW_Q4_0, .seed = 22));
}

static void check_threads(const fx_spec *spec) {
    fx_model fx;
    if (fx_build(spec, &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    int32_t toks[60];
    prompt(toks, 60, 13);
    llm_context_params p = llm_context_default_params();
    p.n_ctx = 128, p.kv_type = KV_F16, p.n_batch = 16, p.page_size = PAGE, p.act_bits = 0;
    fx_check_threads(m, &p, toks, 60);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(qwen_tiny_results_are_bit_identical_for_1_2_3_threads) {
    check_threads(QWEN2(.type = GW_Q4_1, .seed = 14));
    check_threads(QWEN3(.type = GW_Q5_K, .seed = 15, .head_dim = 128));
    check_threads(MISTRAL(.type = GW_Q4_K, .seed = 16));
    check_threads(PHI3(.type = GW_Q6_K, .seed = 23));
}

/* The fixture's vocabulary carries a ChatML template, as Qwen files do. */
TEST(qwen_tiny_takes_chatml_from_its_template) {
    fx_model fx;
    if (fx_build(QWEN3(.type = GW_F32, .seed = 17), &fx)) return;
    llm_model *m = fx_load(&fx);
    if (m) CHECK_EQ_INT(llm_model_chat(m)->kind, LLM_CHAT_CHATML);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(qwen_load_names_what_is_wrong) {
    fx_check_load_error(QWEN2(.type = GW_F32, .skip_tensor = "blk.1.attn_k.bias"), "missing tensor blk.1.attn_k.bias");
    fx_check_load_error(QWEN2(.type = GW_F32, .bad_tensor = "blk.0.attn_v.bias"),
                        "tensor blk.0.attn_v.bias has shape [129], expected [128]");
    fx_check_load_error(QWEN3(.type = GW_F32, .skip_tensor = "blk.0.attn_q_norm.weight"),
                        "missing tensor blk.0.attn_q_norm.weight");
    fx_check_load_error(QWEN3(.type = GW_F32, .head_dim = 128, .bad_tensor = "blk.1.attn_k_norm.weight"),
                        "tensor blk.1.attn_k_norm.weight has shape [129], expected [128]");
    fx_check_load_error(QWEN3(.type = GW_Q8_0, .head_dim = 128, .bad_tensor = "blk.0.attn_output.weight"),
                        "tensor blk.0.attn_output.weight has shape [512, 257], expected [512, 256]");
    fx_check_load_error(QWEN3(.type = GW_F32, .rot_dim = 32), "rotates whole heads");
    fx_check_load_error(PHI3(.type = GW_Q8_0, .bad_tensor = "blk.1.attn_qkv.weight"),
                        "tensor blk.1.attn_qkv.weight has shape [256, 513], expected [256, 512]");
    fx_check_load_error(PHI3(.type = GW_F32, .bad_tensor = "blk.0.ffn_up.weight"),
                        "tensor blk.0.ffn_up.weight has shape [256, 1025], expected [256, 1024]");
    fx_check_load_error(PHI3(.type = GW_F32, .skip_tensor = "blk.0.attn_qkv.weight"), "missing tensor blk.0.attn_qkv.weight");
}

/* A tensor the architecture does not read would be weights left out: the
 * load is refused, naming it (and counting the others) */
TEST(arch_load_refuses_tensors_it_would_not_read) {
    fx_check_load_error(QWEN2(.type = GW_F32, .rope_freqs = 1),
                        "tensor rope_freqs.weight is not one the qwen2 architecture reads");
    fx_check_load_error(QWEN3(.type = GW_F32, .extra_tensor = "blk.0.attn_q.bias"),
                        "tensor blk.0.attn_q.bias is not one the qwen3 architecture reads");
    fx_check_load_error(LLAMA(.type = GW_F32, .extra_tensor = "blk.2.attn_norm.weight"),   /* 2 layers */
                        "tensor blk.2.attn_norm.weight is not one the llama architecture reads");
    fx_check_load_error(LLAMA(.type = GW_F32, .extra_tensor = "blk.01.attn_norm.weight"),
                        "tensor blk.01.attn_norm.weight is not one the llama architecture reads");
    fx_check_load_error(PHI3(.type = GW_F32, .extra_tensor = "blk.1.ffn_gate.weight"),
                        "tensor blk.1.ffn_gate.weight is not one the phi3 architecture reads");
    /* known to carry nothing the forward needs: loads */
    fx_model fx;
    if (fx_build(LLAMA(.type = GW_F32, .extra_tensor = "blk.1.attn_rot_embd.weight"), &fx)) return;
    llm_model *m = fx_load(&fx);
    CHECK(m != NULL);
    llm_model_free(m);
    fx_free(&fx);
}
