/* cli/verify.c - `kvcache verify`: cached decoding against full recomputation on a real model, for each
 * cache policy.
 *
 *   full, window  Greedy decoding runs on the cache (each step projects one
 *                 token and attends over the cached K/V; window: every layer
 *                 sees only its last W positions, through window caches that
 *                 evict pages); then the whole sequence is recomputed with no
 *                 cache (dense attention over fresh f32 K/V, the same window)
 *                 in one causal pass, whose row t is exactly a full
 *                 recomputation of tokens 0..t. The two must give the same
 *                 next-token logits at every step.
 *   shift         cli/verify_policy.c: context shifts against a fresh pass over
 *   lookup        the kept tokens; prompt lookup and sessions on disk against
 *   session       plain decoding, token for token. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "verify.h"

#define DEFAULT_PROMPT "The history of the printing press begins"

static void usage(void) {
    printf("usage: kvcache verify [-m MODEL.gguf] [-p PROMPT] [-n 32] [--kv-type T] [--tol X] [-t N]\n"
           "                      [--policy full|window|shift|lookup|session] [--window W] [--keep N]\n"
           "                      [--draft-lookup N]\n"
           "Greedy decoding on the KV cache against full recomputation without a cache, side by\n"
           "side: the largest logit difference per step, relative to the largest |logit|.\n\n"
           "  --policy P         full (default): the cache as it is; window: every layer a sliding\n"
           "                     window of --window W (default 16) positions, against windowed\n"
           "                     recomputation; shift: decoding through context shifts in --ctx\n"
           "                     positions (default: the prompt + n/2), the kept keys against a fresh\n"
           "                     pass over the kept tokens at their new positions; lookup: --draft-lookup\n"
           "                     N (default 8) gives the tokens of plain greedy; session: a run saved\n"
           "                     half way and restored in a new context gives them too\n"
           "  -p, --prompt TEXT  prompt (default \"" DEFAULT_PROMPT "\")\n"
           "  -n, --tokens N     decode steps (default 32)\n"
           "  --kv-type T        K/V storage of the cached run (default f32; the recomputation\n"
           "                     always uses exact f32 K/V, so f16/bf16/q8 show their rounding)\n"
           "  --tol X            pass when every step's relative difference is <= X; default 1e-4\n"
           "                     for f32 K/V, and about 4x the storage's rounding otherwise:\n"
           "                     2e-3 f16, 1.5e-2 bf16, 1e-1 q8; plus 16 quantization steps of\n"
           "                     the integer activations (16/16383 at 16 bits, 16/127 at 8; none\n"
           "                     with --exact-matmul)\n" CLI_MODEL_HELP);
}

/* max |a - b| and max |b| over n */
static double max_diff(const float *a, const float *b, int32_t n, double *bmax) {
    double d = 0, mx = 0;
    for (int32_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        d = e > d || isnan(e) ? e : d;
        mx = fabs((double)b[i]) > mx ? fabs((double)b[i]) : mx;
    }
    *bmax = mx;
    return d;
}

int cmd_verify(int argc, char **argv) {
    cli_model_opts mo = cli_model_opts_default();
    const char *prompt = DEFAULT_PROMPT;
    int64_t steps = 32;
    double tol = -1;
    const char *policy = "full";
    int64_t window = 16, keep = 4, n_draft = 8;
    mo.kv_type = "f32";
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) { usage(); return 0; }
        if (cli_model_opt(argc, argv, &i, &mo)) continue;
        if (cli_opt_str(argc, argv, &i, "-p", "--prompt", &prompt)) continue;
        if (cli_opt_int(argc, argv, &i, "-n", "--tokens", &steps)) continue;
        if (cli_opt_f64(argc, argv, &i, NULL, "--tol", &tol)) continue;
        if (cli_opt_str(argc, argv, &i, NULL, "--policy", &policy)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--window", &window)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--keep", &keep)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--draft-lookup", &n_draft)) continue;
        fprintf(stderr, "kvcache verify: unknown option '%s' (see --help)\n", argv[i]);
        return 2;
    }
    if (!cli_range("verify", "-n", steps, 0, 1024, "decode steps compared") ||
        !cli_range("verify", "--window", window, 1, 1 << 24, "positions the forced window keeps") ||
        !cli_range("verify", "--keep", keep, 0, 1 << 24, "positions a context shift keeps") ||
        !cli_range("verify", "--draft-lookup", n_draft, 1, 64, "tokens drafted by prompt lookup"))
        return 2;
    if (tol < 0 && tol != -1) {
        fprintf(stderr, "kvcache verify: --tol %g is out of range: it takes 0 or more (the largest logit "
                        "difference allowed)\n", tol);
        return 2;
    }
    if (!strcmp(policy, "shift")) return verify_shift(&mo, prompt, steps, (int32_t)keep, tol);
    if (!strcmp(policy, "lookup")) return verify_lookup(&mo, prompt, steps, (int32_t)n_draft);
    if (!strcmp(policy, "session")) return verify_session(&mo, prompt, steps);
    if (!strcmp(policy, "window")) {
        mo.window = window;
    } else if (strcmp(policy, "full")) {
        fprintf(stderr, "kvcache verify: --policy must be full, window, shift, lookup or session (not '%s')\n", policy);
        return 2;
    }
    /* f32 K/V: both paths do the same f32 arithmetic up to summation order.
     * Rounded K/V: the difference is the storage's rounding (unit 2^-11 f16,
     * 2^-8 bf16, 1/254 of a row's range for q8) carried through the layers;
     * the defaults are about 4x what SmolLM2 shows. */
    const int default_tol = tol < 0;
    if (default_tol) {
        kv_dtype t = KV_F32;
        kv_dtype_parse(mo.kv_type, &t);
        tol = t == KV_F16 ? 2e-3 : t == KV_BF16 ? 1.5e-2 : t == KV_Q8 ? 1e-1 : 1e-4;
    }
    kve_model *m;
    kve_session *s;
    /* the session must hold the prompt and every step; the prompt's length
     * is not known before the model is loaded, so allow generously */
    cli_model_opts o = mo;
    o.ctx = mo.ctx ? mo.ctx : (int64_t)strlen(prompt) + steps + 2;
    int rc = cli_open("verify", &o, &m, &s);
    if (rc) return rc;
    /* Integer activations (int16 by default): a last-bit difference between
     * the paths (attention sums in another order) can move a product input
     * across a rounding boundary, one quantization step (1/16383 of its
     * block's max; 1/127 at 8 bits), carried through the layers, so 16 steps
     * go on top of the K/V's bound. */
    const kve_session_params sp = kve_session_get_params(s);
    if (default_tol && sp.act_bits) tol += 16.0 / (sp.act_bits == 8 ? 127 : 16383);
    const int32_t V = kve_model_n_vocab(m);
    int32_t n = 0, *ids = cli_text_tokens(m, prompt, strlen(prompt), 1, 0, &n);
    int32_t *all = ids ? realloc(ids, sizeof(int32_t) * (size_t)(n + steps + 1)) : NULL;
    /* both runs' logits for every step: [steps + 1][V] each */
    float *lc = malloc(sizeof(float) * (size_t)V * (size_t)(steps + 1));
    float *lf = malloc(sizeof(float) * (size_t)V * (size_t)(steps + 1));
    rc = 1;
    if (!all || !lc || !lf || n == 0) {
        fprintf(stderr, "kvcache verify: could not tokenize the prompt (or it is empty), or out of memory\n");
        free(all ? all : ids);
        goto done;
    }
    ids = all;
    const int32_t n_prompt = n;
    printf("verify: %s, %s K/V, prompt %d tokens, %lld greedy steps, tolerance %.1e (relative)\n", kve_model_name(m),
           kv_dtype_name(sp.kv_type), (int)n, (long long)steps, tol);
    if (o.window)
        printf("policy window: every layer sees its last %lld positions, on window caches that evict pages\n",
               (long long)o.window);
    /* cached: the prompt in one pass, then one new token per step */
    int st = kve_session_eval(s, ids, n, n - 1, lc);
    for (int64_t k = 0; k <= steps && st == KVE_OK; k++) {
        float *l = lc + (size_t)k * (size_t)V;
        if (k > 0) st = kve_session_eval(s, &ids[n - 1], 1, 0, l);
        if (st == KVE_OK) ids[n++] = cli_argmax(l, V);
    }
    /* recomputed: every position at once, no cache */
    if (st == KVE_OK) st = kve_session_eval_reference(s, ids, n - 1, n_prompt - 1, lf);
    if (st != KVE_OK) {
        fprintf(stderr, "kvcache verify: %s\n", kve_status_str(st));
        free(ids);
        goto done;
    }
    printf("%5s %6s %7s  %-18s %12s %12s\n", "step", "pos", "token", "text", "max|diff|", "relative");
    double worst = 0;
    for (int64_t k = 0; k <= steps; k++) {
        const float *a = lc + (size_t)k * (size_t)V, *b = lf + (size_t)k * (size_t)V;
        double bmax, d = max_diff(a, b, V, &bmax), rel = d / (bmax > 0 ? bmax : 1);
        worst = rel > worst || isnan(rel) ? rel : worst;
        int32_t next = ids[n_prompt + k];
        size_t pn = 0;
        const char *piece = kve_token_piece(m, next, &pn);
        char shown[17];
        int j = 0;
        for (size_t c = 0; piece && c < pn && piece[c] && j < 16; c++)
            shown[j++] = (piece[c] == '\n' || piece[c] == '\t') ? ' ' : piece[c];
        shown[j] = 0;
        printf("%5lld %6d %7d  %-18s %12.3e %12.3e%s\n", (long long)k, (int)(n_prompt - 1 + k), (int)next, shown, d,
               rel, rel <= tol ? "" : "  <- over tolerance");
    }
    printf("largest relative difference %.3e over %lld steps, tolerance %.1e: %s\n", worst, (long long)steps + 1, tol,
           worst <= tol ? "PASS" : "FAIL");
    rc = worst <= tol ? 0 : 1;
    free(ids);
done:
    free(lc), free(lf);
    kve_session_free(s);
    kve_model_free(m);
    return rc;
}
