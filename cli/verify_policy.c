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

/* K and V of session a against b at positions [from, to) of every layer
 * below `layers` of every cache: the worst row's relative difference. */
static double compare_kv(const kve_model *m, const kve_session *a, const kve_session *b, int32_t from, int32_t to,
                         int32_t layers) {
    const kve_model_shape sh = kve_model_get_shape(m);
    const int32_t row = sh.n_kv_heads * sh.head_dim;
    float *ka = malloc(sizeof(float) * (size_t)row * 4), *va = ka + row, *kb = va + row, *vb = kb + row;
    double worst = 0;
    for (int32_t g = 0, nl; ka && kve_session_cache_group(a, g, &nl, NULL, NULL) == KVE_OK; g++)
        for (int32_t l = 0; l < nl && l < layers; l++)
            for (int32_t p = from; p < to; p++) {
                if (kve_session_read_kv(a, g, l, p, 1, ka, va) || kve_session_read_kv(b, g, l, p, 1, kb, vb)) {
                    worst = INFINITY;
                    continue;
                }
                for (int32_t h = 0; h < sh.n_kv_heads; h++) {
                    size_t o = (size_t)h * (size_t)sh.head_dim;
                    double dk = rel_row(ka + o, kb + o, sh.head_dim), dv = rel_row(va + o, vb + o, sh.head_dim);
                    worst = fmax(worst, fmax(dk, dv));
                }
            }
    free(ka);
    return ka ? worst : INFINITY;
}

int verify_shift(const cli_model_opts *mo, const char *prompt, int64_t steps, int32_t keep, double tol) {
    kve_model *m;
    int rc = cli_load_model("verify", mo, &m);
    if (rc) return rc;
    int32_t n = 0, *p = cli_text_tokens(m, prompt, strlen(prompt), 1, 0, &n);
    int64_t n_ctx = mo->ctx ? mo->ctx : n + (steps / 2 > 8 ? steps / 2 : 8);
    cli_model_opts o = *mo;
    o.ctx = n_ctx;
    if (!p || n == 0) return fprintf(stderr, "kvcache verify: could not tokenize the prompt\n"), free(p), kve_model_free(m), 1;
    if (n >= n_ctx || keep + 2 >= n_ctx) {
        fprintf(stderr, "kvcache verify: --ctx %lld must exceed the prompt (%d tokens) and --keep + 2\n",
                (long long)n_ctx, (int)n);
        return free(p), kve_model_free(m), 2;
    }
    /* a: decoding through the shifts; b: the fresh pass over the kept tokens */
    kve_session *a = NULL, *b = NULL;
    if ((rc = cli_new_session("verify", &o, m, &a)) || (rc = cli_new_session("verify", &o, m, &b))) {
        kve_session_free(a);
        return free(p), kve_model_free(m), rc;
    }
    kv_dtype t = kve_session_get_params(a).kv_type;
    /* the fresh keys are rounded to the storage once, the moved ones twice
     * (stored, then re-encoded after the turn): about two units of it */
    if (tol < 0) tol = t == KV_F16 ? 2e-3 : t == KV_BF16 ? 1.6e-2 : t == KV_Q8 ? 3e-2 : 1e-5;
    const int32_t V = kve_model_n_vocab(m);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(n + steps + 1));
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    int32_t len = n, shifts = 0;
    double worst_first = 0, worst_sinks = 0;
    rc = 1;
    if (!toks || !la || !lb) goto done;
    memcpy(toks, p, sizeof(int32_t) * (size_t)n);
    printf("verify --policy shift: %s, %s K/V, context %lld, prompt %d tokens, %lld greedy steps, keep %d, "
           "tolerance %.1e (relative)\n", kve_model_name(m), kv_dtype_name(t), (long long)n_ctx, (int)n,
           (long long)steps, (int)keep, tol);
    printf("%5s %6s %6s  %22s %18s %22s\n", "shift", "at", "kept", "first layer vs fresh", "sinks, all layers",
           "next logits vs fresh");
    int st = kve_session_eval(a, toks, n, n - 1, la);
    for (int64_t k = 0; k < steps && st == KVE_OK; k++) {
        if (len + 1 > n_ctx) {
            int32_t drop;
            if ((st = kve_session_shift(a, keep, 0, &drop)) != KVE_OK) break;
            memmove(toks + keep, toks + keep + drop, sizeof(int32_t) * (size_t)(len - keep - drop));
            len -= drop, shifts++;
            /* the fresh pass over exactly the kept tokens */
            kve_session_reset(b);
            if ((st = kve_session_eval(b, toks, len, len - 1, lb)) != KVE_OK) break;
            double first = compare_kv(m, a, b, 0, len, 1), sinks = compare_kv(m, a, b, 0, keep, 1 << 30);
            double logit = rel_row(la, lb, V);
            worst_first = fmax(worst_first, first), worst_sinks = fmax(worst_sinks, sinks);
            printf("%5d %6lld %6d  %22.3e %18.3e %22.3e%s\n", (int)shifts, (long long)(n + k), (int)len, first, sinks,
                   logit, first <= tol && sinks <= tol ? "" : "  <- over tolerance");
        }
        int32_t next = cli_argmax(la, V);
        toks[len++] = next;
        st = kve_session_eval(a, &next, 1, 0, la);
    }
    if (st != KVE_OK) {
        fprintf(stderr, "kvcache verify: %s\n", kve_status_str(st));
        goto done;
    }
    int ok = shifts > 0 && worst_first <= tol && worst_sinks <= tol;
    printf("%d shifts; largest difference of the kept K/V from a fresh pass: first layer %.3e, sinks %.3e, "
           "tolerance %.1e: %s\n", (int)shifts, worst_first, worst_sinks, tol, ok ? "PASS" : "FAIL");
    if (!shifts) printf("(no shift happened: lower --ctx or raise -n)\n");
    rc = ok ? 0 : 1;
done:
    free(toks), free(la), free(lb), free(p);
    kve_session_free(a), kve_session_free(b);
    kve_model_free(m);
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

/* Greedy tokens of one generation on s after prompt [n] (what s holds
 * reused as far as it matches): max tokens (end-of-generation ignored, so
 * every run goes the distance). */
static kve_generate_result greedy(kve_session *s, const int32_t *prompt, int32_t n, int32_t max, int32_t n_draft,
                                  tokens *out) {
    kve_generate_params gp = kve_generate_default_params();
    gp.max_tokens = max, gp.temperature = 0, gp.ignore_eog = 1, gp.draft_lookup = n_draft;
    gp.on_token = keep_token, gp.user = out;
    kve_generate_result res;
    kve_session_generate(s, prompt, n, &gp, &res);
    return res;
}

static int same(const tokens *a, const int32_t *b, int32_t n) {
    return a->n == n && !memcmp(a->toks, b, sizeof(int32_t) * (size_t)n);
}

int verify_lookup(const cli_model_opts *mo, const char *prompt, int64_t steps, int32_t n_draft) {
    kve_model *m;
    kve_session *s;
    cli_model_opts o = *mo;
    o.ctx = mo->ctx ? mo->ctx : (int64_t)strlen(prompt) + steps + 2;
    int rc = cli_open("verify", &o, &m, &s);
    if (rc) return rc;
    int32_t n = 0, *p = cli_text_tokens(m, prompt, strlen(prompt), 1, 0, &n);
    tokens a = {malloc(sizeof(int32_t) * (size_t)(steps + 1)), 0, (int32_t)steps};
    tokens b = {malloc(sizeof(int32_t) * (size_t)(steps + 1)), 0, (int32_t)steps};
    rc = 1;
    if (p && n > 0 && a.toks && b.toks) {
        kve_generate_result ra = greedy(s, p, n, (int32_t)steps, 0, &a);
        kve_session_reset(s);
        kve_generate_result rb = greedy(s, p, n, (int32_t)steps, n_draft, &b);
        if (ra.status != KVE_OK || rb.status != KVE_OK) {
            fprintf(stderr, "kvcache verify: %s\n", ra.status != KVE_OK ? ra.message : rb.message);
        } else {
            int ok = same(&a, b.toks, b.n);
            int32_t first = 0;
            while (first < a.n && first < b.n && a.toks[first] == b.toks[first]) first++;
            printf("verify --policy lookup: %s, %s K/V, prompt %d tokens, %d greedy tokens\n", kve_model_name(m),
                   kv_dtype_name(kve_session_get_params(s).kv_type), (int)n, (int)a.n);
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
    kve_session_free(s);
    kve_model_free(m);
    return rc;
}

int verify_session(const cli_model_opts *mo, const char *prompt, int64_t steps) {
    kve_model *m;
    kve_session *s, *s2 = NULL;
    cli_model_opts o = *mo;
    o.ctx = mo->ctx ? mo->ctx : (int64_t)strlen(prompt) + steps + 2;
    int rc = cli_open("verify", &o, &m, &s);
    if (rc) return rc;
    char path[64];
    snprintf(path, sizeof path, "/tmp/kvcache_verify_session_%d", (int)getpid());
    int32_t n = 0, *p = cli_text_tokens(m, prompt, strlen(prompt), 1, 0, &n), half = (int32_t)(steps / 2);
    tokens all = {malloc(sizeof(int32_t) * (size_t)(steps + 1)), 0, (int32_t)steps};
    tokens first = {malloc(sizeof(int32_t) * (size_t)(steps + 1)), 0, half};
    tokens rest = {malloc(sizeof(int32_t) * (size_t)(steps + 1)), 0, (int32_t)steps - half};
    int32_t *p2 = malloc(sizeof(int32_t) * (size_t)(n + steps + 1)), restored = 0;
    char err[512] = "";
    const kve_session_params sp = kve_session_get_params(s);
    rc = 1;
    if (!p || n == 0 || !all.toks || !first.toks || !rest.toks || !p2 || half < 1) {
        fprintf(stderr, "kvcache verify: could not tokenize the prompt, out of memory, or -n < 2\n");
        goto done;
    }
    kve_generate_result r0 = greedy(s, p, n, (int32_t)steps, 0, &all);
    kve_session_reset(s);
    kve_generate_result r1 = greedy(s, p, n, half, 0, &first);
    if (r0.status != KVE_OK || r1.status != KVE_OK) {
        fprintf(stderr, "kvcache verify: %s\n", r0.status != KVE_OK ? r0.message : r1.message);
        goto done;
    }
    if (kve_session_save(s, path, err, sizeof err) != KVE_OK) {
        fprintf(stderr, "kvcache verify: %s\n", err);
        goto done;
    }
    /* a new session, as a later run would have */
    if (kve_session_create(m, &sp, &s2, err, sizeof err) != KVE_OK) {
        fprintf(stderr, "kvcache verify: %s\n", err);
        goto done;
    }
    memcpy(p2, p, sizeof(int32_t) * (size_t)n);
    memcpy(p2 + n, first.toks, sizeof(int32_t) * (size_t)first.n);
    if (kve_session_load(s2, path, p2, n + first.n, &restored, err, sizeof err) != KVE_OK) {
        fprintf(stderr, "kvcache verify: the session did not restore: %s\n", err);
        goto done;
    }
    kve_generate_result r2 = greedy(s2, p2, n + first.n, (int32_t)steps - half, 0, &rest);
    int ok = r2.status == KVE_OK && same(&first, all.toks, half) && same(&rest, all.toks + half, (int32_t)steps - half);
    printf("verify --policy session: %s, %s K/V, prompt %d tokens, %d greedy tokens in one run\n", kve_model_name(m),
           kv_dtype_name(sp.kv_type), (int)n, (int)all.n);
    printf("  first %d tokens, saved (%d positions); restored %d in a new context, prefilled %d, generated %d more\n",
           (int)first.n, (int)kve_session_n_cached(s), (int)restored, (int)(n + first.n - restored), (int)rest.n);
    printf("tokens %s the uninterrupted run: %s\n", ok ? "equal" : "differ from", ok ? "PASS" : "FAIL");
    rc = ok ? 0 : 1;
done:
    remove(path);
    kve_session_free(s), kve_session_free(s2);
    free(p), free(p2), free(all.toks), free(first.toks), free(rest.toks);
    kve_model_free(m);
    return rc;
}
