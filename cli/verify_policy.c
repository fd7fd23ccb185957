/* cli/verify_policy.c - `kvcache verify` for the cache policies a generation
 * loop applies (engine/gen/policy.h):
 *
 *   shift    greedy decoding in a small context that shifts whenever it is
 *            full (keep --keep positions, drop half of the rest). After each
 *            shift, a fresh pass over exactly the kept tokens at their new
 *            positions runs in a second sequence, and what must be equal is
 *            compared: every cache's first layer for every kept position (its
 *            K/V depend on the token and its position only, so a moved key
 *            re-rotated in place must equal the key computed fresh there), and
 *            every layer for the kept sinks (they never saw what was dropped).
 *            Deeper layers of moved tokens are not compared: they were computed
 *            while the dropped tokens were visible, which is what a shift keeps
 *            (StreamingLLM); the next-token logits against the fresh pass are
 *            printed as that effect's size.
 *   lookup   greedy decoding with and without --draft-lookup N: the same
 *            tokens, with the acceptance rate and both times.
 *   session  greedy decoding in one go, against the same run stopped half
 *            way, saved to a file and restored into a new context.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "verify.h"
#include "../engine/model/model.h"
#include "../engine/gen/policy.h"
#include "../engine/gen/session.h"

/* The model, and a context of n_seqs sequences of n_ctx positions with the
 * options' K/V type and threads. 0, or an exit status after a message. */
static int open_ctx(const cli_model_opts *mo, int32_t n_seqs, int64_t n_ctx, llm_model **m, llm_context **c) {
    int rc = cli_load("verify", mo, n_seqs, n_ctx, m, c);
    return rc;
}

static void close_ctx(llm_model *m, llm_context *c) {
    llm_context_free(c);
    llm_model_free(m);
}

/* Largest |a - b| relative to the largest |b| over one row of n. */
static double rel_row(const float *a, const float *b, int32_t n) {
    double d = 0, mx = 0;
    for (int32_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        d = e > d || isnan(e) ? e : d;
        mx = fabs((double)b[i]) > mx ? fabs((double)b[i]) : mx;
    }
    return d / (mx > 0 ? mx : 1);
}

/* ---------------------------------------------------------------- shift */

/* K and V of sequence a against b at positions [from, to) of every layer
 * below `layers` of every cache: the worst row's relative difference. */
static double compare_kv(llm_context *c, int32_t a, int32_t b, int32_t from, int32_t to, int32_t layers) {
    const llm_hparams *hp = llm_model_hparams(llm_context_model(c));
    const int32_t row = hp->n_kv_heads * hp->head_dim;
    float *ka = malloc(sizeof(float) * (size_t)row * 4), *va = ka + row, *kb = va + row, *vb = kb + row;
    double worst = 0;
    for (int32_t g = 0; ka && g < llm_context_n_caches(c); g++) {
        kv_cache *cache = llm_context_cache_at(c, g);
        int32_t nl = kv_cache_get_params(cache).n_layers;
        for (int32_t l = 0; l < nl && l < layers; l++)
            for (int32_t p = from; p < to; p++) {
                if (kv_read_f32(cache, l, a, p, 1, ka, va) || kv_read_f32(cache, l, b, p, 1, kb, vb)) {
                    worst = INFINITY;
                    continue;
                }
                for (int32_t h = 0; h < hp->n_kv_heads; h++) {
                    size_t o = (size_t)h * (size_t)hp->head_dim;
                    double dk = rel_row(ka + o, kb + o, hp->head_dim), dv = rel_row(va + o, vb + o, hp->head_dim);
                    worst = fmax(worst, fmax(dk, dv));
                }
            }
    }
    free(ka);
    return ka ? worst : INFINITY;
}

int verify_shift(const cli_model_opts *mo, const char *prompt, int64_t steps, int32_t keep, double tol) {
    llm_model *m;
    llm_context *c;
    /* a first context only to count the prompt's tokens */
    int rc = open_ctx(mo, 1, 64, &m, &c);
    if (rc) return rc;
    int32_t n = 0, *p = cli_tokenize(m, prompt, 1, 0, &n);
    llm_context_free(c);
    int64_t n_ctx = mo->ctx ? mo->ctx : n + (steps / 2 > 8 ? steps / 2 : 8);
    cli_model_opts o = *mo;
    o.ctx = n_ctx;
    llm_model_free(m);
    if (!p || n == 0) return fprintf(stderr, "kvcache verify: could not tokenize the prompt\n"), free(p), 1;
    if (n >= n_ctx || keep + 2 >= n_ctx) {
        fprintf(stderr, "kvcache verify: --ctx %lld must exceed the prompt (%d tokens) and --keep + 2\n",
                (long long)n_ctx, (int)n);
        return free(p), 2;
    }
    if ((rc = open_ctx(&o, 2, n_ctx, &m, &c))) return free(p), rc;
    kv_dtype t = llm_context_get_params(c).kv_type;
    /* the fresh keys are rounded to the storage once, the moved ones twice
     * (stored, then re-encoded after the turn): about two units of it */
    if (tol < 0) tol = t == KV_F16 ? 2e-3 : t == KV_BF16 ? 1.6e-2 : t == KV_Q8 ? 3e-2 : 1e-5;
    const int32_t V = llm_model_n_vocab(m);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(n + steps + 1));
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    int32_t a = -1, b = -1, len = n, shifts = 0;
    double worst_first = 0, worst_sinks = 0;
    rc = 1;
    if (!toks || !la || !lb || llm_seq_new(c, &a) != LLM_OK) goto done;
    memcpy(toks, p, sizeof(int32_t) * (size_t)n);
    printf("verify --policy shift: %s, %s K/V, context %lld, prompt %d tokens, %lld greedy steps, keep %d, "
           "tolerance %.1e (relative)\n", llm_model_name(m), kv_dtype_name(t), (long long)n_ctx, (int)n,
           (long long)steps, (int)keep, tol);
    printf("%5s %6s %6s  %22s %18s %22s\n", "shift", "at", "kept", "first layer vs fresh", "sinks, all layers",
           "next logits vs fresh");
    int st = llm_eval(c, a, toks, n, 0, la, NULL, NULL);
    for (int64_t s = 0; s < steps && st == LLM_OK; s++) {
        if (len + 1 > n_ctx) {
            int32_t drop = llm_shift_discard(len, keep);
            if ((st = llm_context_shift(c, a, keep, drop)) != LLM_OK) break;
            memmove(toks + keep, toks + keep + drop, sizeof(int32_t) * (size_t)(len - keep - drop));
            len -= drop, shifts++;
            /* the fresh pass over exactly the kept tokens, in sequence b */
            if ((st = llm_seq_new(c, &b)) != LLM_OK || (st = llm_eval(c, b, toks, len, 0, lb, NULL, NULL)) != LLM_OK)
                break;
            double first = compare_kv(c, a, b, 0, len, 1), sinks = compare_kv(c, a, b, 0, keep, 1 << 30);
            double logit = rel_row(la, lb, V);
            llm_seq_remove(c, b), b = -1;
            worst_first = fmax(worst_first, first), worst_sinks = fmax(worst_sinks, sinks);
            printf("%5d %6lld %6d  %22.3e %18.3e %22.3e%s\n", (int)shifts, (long long)(n + s), (int)len, first, sinks,
                   logit, first <= tol && sinks <= tol ? "" : "  <- over tolerance");
        }
        int32_t next = llm_argmax(la, V);
        toks[len++] = next;
        st = llm_eval(c, a, &next, 1, 0, la, NULL, NULL);
    }
    if (st != LLM_OK) {
        fprintf(stderr, "kvcache verify: %s\n", llm_status_str(st));
        goto done;
    }
    int ok = shifts > 0 && worst_first <= tol && worst_sinks <= tol;
    printf("%d shifts; largest difference of the kept K/V from a fresh pass: first layer %.3e, sinks %.3e, "
           "tolerance %.1e: %s\n", (int)shifts, worst_first, worst_sinks, tol, ok ? "PASS" : "FAIL");
    if (!shifts) printf("(no shift happened: lower --ctx or raise -n)\n");
    rc = ok ? 0 : 1;
done:
    if (b >= 0) llm_seq_remove(c, b);
    free(toks), free(la), free(lb), free(p);
    close_ctx(m, c);
    return rc;
}

/* ---------------------------------------------------------------- lookup and session */

typedef struct {
    int32_t *toks;  /* [cap] */
    int32_t n, cap;
} tokens;

static int keep_token(void *user, int32_t token) {
    tokens *t = user;
    if (t->n < t->cap) t->toks[t->n++] = token;
    return 0;
}

/* Greedy tokens of one generation on a fresh session of c after prompt [n]:
 * max tokens (end-of-generation ignored, so both runs go the distance). */
static llm_gen_result greedy(llm_context *c, const int32_t *prompt, int32_t n, int32_t max, int32_t n_draft, tokens *out,
                             llm_session **keep) {
    llm_gen_params gp = llm_gen_default_params();
    gp.max_tokens = max, gp.sampler.temp = 0, gp.ignore_eog = 1, gp.draft_lookup = n_draft;
    gp.on_token = keep_token, gp.user = out;
    llm_gen_result res = {.reason = LLM_STOP_ERROR, .status = LLM_ERR_NOMEM};
    llm_session *s = keep && *keep ? *keep : NULL;
    if (!s && llm_session_create(c, &s) != LLM_OK) return res;
    llm_session_generate(s, prompt, n, &gp, &res);
    if (keep) *keep = s;
    else llm_session_free(s);
    return res;
}

static int same(const tokens *a, const int32_t *b, int32_t n) {
    return a->n == n && !memcmp(a->toks, b, sizeof(int32_t) * (size_t)n);
}

int verify_lookup(const cli_model_opts *mo, const char *prompt, int64_t steps, int32_t n_draft) {
    llm_model *m;
    llm_context *c;
    int rc = open_ctx(mo, 1, mo->ctx ? mo->ctx : (int64_t)strlen(prompt) + steps + 2, &m, &c);
    if (rc) return rc;
    int32_t n = 0, *p = cli_tokenize(m, prompt, 1, 0, &n);
    tokens a = {malloc(sizeof(int32_t) * (size_t)(steps + 1)), 0, (int32_t)steps};
    tokens b = {malloc(sizeof(int32_t) * (size_t)(steps + 1)), 0, (int32_t)steps};
    rc = 1;
    if (p && n > 0 && a.toks && b.toks) {
        llm_gen_result ra = greedy(c, p, n, (int32_t)steps, 0, &a, NULL);
        llm_gen_result rb = greedy(c, p, n, (int32_t)steps, n_draft, &b, NULL);
        if (ra.status != LLM_OK || rb.status != LLM_OK) {
            fprintf(stderr, "kvcache verify: %s\n", ra.status != LLM_OK ? ra.message : rb.message);
        } else {
            int ok = same(&a, b.toks, b.n);
            int32_t first = 0;
            while (first < a.n && first < b.n && a.toks[first] == b.toks[first]) first++;
            printf("verify --policy lookup: %s, %s K/V, prompt %d tokens, %d greedy tokens\n", llm_model_name(m),
                   kv_dtype_name(llm_context_get_params(c).kv_type), (int)n, (int)a.n);
            printf("  plain:            %.3f s (%.1f tokens/s), %d forward passes\n", ra.t_decode,
                   ra.n_generated / (ra.t_decode > 0 ? ra.t_decode : 1e-9), (int)ra.n_passes);
            printf("  --draft-lookup %d: %.3f s (%.1f tokens/s), %d forward passes; %d of %d drafted accepted (%.1f%%)\n",
                   (int)n_draft, rb.t_decode, rb.n_generated / (rb.t_decode > 0 ? rb.t_decode : 1e-9), (int)rb.n_passes,
                   (int)rb.n_accepted, (int)rb.n_drafted, rb.n_drafted ? 100.0 * rb.n_accepted / rb.n_drafted : 0.0);
            printf("tokens %s plain greedy%s: %s\n", ok ? "equal" : "differ from", ok ? "" : " (first difference below)",
                   ok ? "PASS" : "FAIL");
            if (!ok) printf("  first difference at token %d\n", (int)first);
            rc = ok ? 0 : 1;
        }
    } else {
        fprintf(stderr, "kvcache verify: could not tokenize the prompt, or out of memory\n");
    }
    free(p), free(a.toks), free(b.toks);
    close_ctx(m, c);
    return rc;
}

int verify_session(const cli_model_opts *mo, const char *prompt, int64_t steps) {
    llm_model *m;
    llm_context *c, *c2 = NULL;
    int64_t n_ctx = mo->ctx ? mo->ctx : (int64_t)strlen(prompt) + steps + 2;
    int rc = open_ctx(mo, 1, n_ctx, &m, &c);
    if (rc) return rc;
    char path[64];
    snprintf(path, sizeof path, "/tmp/kvcache_verify_session_%d", (int)getpid());
    int32_t n = 0, *p = cli_tokenize(m, prompt, 1, 0, &n), half = (int32_t)(steps / 2);
    tokens all = {malloc(sizeof(int32_t) * (size_t)(steps + 1)), 0, (int32_t)steps};
    tokens first = {malloc(sizeof(int32_t) * (size_t)(steps + 1)), 0, half};
    tokens rest = {malloc(sizeof(int32_t) * (size_t)(steps + 1)), 0, (int32_t)steps - half};
    int32_t *p2 = malloc(sizeof(int32_t) * (size_t)(n + steps + 1)), restored = 0;
    llm_session *s = NULL, *s2 = NULL;
    char err[512] = "";
    rc = 1;
    if (!p || n == 0 || !all.toks || !first.toks || !rest.toks || !p2 || half < 1) {
        fprintf(stderr, "kvcache verify: could not tokenize the prompt, out of memory, or -n < 2\n");
        goto done;
    }
    llm_gen_result r0 = greedy(c, p, n, (int32_t)steps, 0, &all, NULL);
    llm_gen_result r1 = greedy(c, p, n, half, 0, &first, &s);
    if (r0.status != LLM_OK || r1.status != LLM_OK || !s) {
        fprintf(stderr, "kvcache verify: %s\n", r0.status != LLM_OK ? r0.message : r1.message);
        goto done;
    }
    if (llm_session_save(s, path, err, sizeof err) != LLM_OK) {
        fprintf(stderr, "kvcache verify: %s\n", err);
        goto done;
    }
    /* a new context, as a later run would have */
    char e2[256];
    llm_context_params cp = llm_context_get_params(c);
    if (llm_context_create(m, &cp, &c2, e2, sizeof e2) != LLM_OK || llm_session_create(c2, &s2) != LLM_OK) {
        fprintf(stderr, "kvcache verify: %s\n", e2);
        goto done;
    }
    memcpy(p2, p, sizeof(int32_t) * (size_t)n);
    memcpy(p2 + n, first.toks, sizeof(int32_t) * (size_t)first.n);
    if (llm_session_load(s2, path, p2, n + first.n, &restored, err, sizeof err) != LLM_OK) {
        fprintf(stderr, "kvcache verify: the session did not restore: %s\n", err);
        goto done;
    }
    llm_gen_result r2 = greedy(c2, p2, n + first.n, (int32_t)steps - half, 0, &rest, &s2);
    int ok = r2.status == LLM_OK && same(&first, all.toks, half) && same(&rest, all.toks + half, (int32_t)steps - half);
    printf("verify --policy session: %s, %s K/V, prompt %d tokens, %d greedy tokens in one run\n", llm_model_name(m),
           kv_dtype_name(cp.kv_type), (int)n, (int)all.n);
    printf("  first %d tokens, saved (%d positions); restored %d in a new context, prefilled %d, generated %d more\n",
           (int)first.n, (int)llm_session_n_cached(s), (int)restored, (int)(n + first.n - restored), (int)rest.n);
    printf("tokens %s the uninterrupted run: %s\n", ok ? "equal" : "differ from", ok ? "PASS" : "FAIL");
    rc = ok ? 0 : 1;
done:
    remove(path);
    llm_session_free(s), llm_session_free(s2);
    llm_context_free(c2);
    free(p), free(p2), free(all.toks), free(first.toks), free(rest.toks);
    close_ctx(m, c);
    return rc;
}
