/* cli/chat.c - `kvcache chat`: an interactive conversation that keeps its KV
 * cache across turns. Each turn renders only what follows the messages the
 * cache already holds (llm_chat_render_continuation), so only the new user
 * turn is prefilled; the stats line after each reply says how many tokens
 * were new and how many were reused from the cache. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "../engine/model.h"
#include "../engine/sampler.h"

static void usage(void) {
    printf("usage: kvcache chat [-m MODEL.gguf] [--system TEXT] [-n N] [--temp T] [--top-k K] [--top-p P]\n"
           "                    [--seed S] [-t THREADS] [--ctx N] [--kv-type T]\n"
           "Reads one user message per line from stdin and streams each reply to stdout.\n"
           "The cache is kept across turns: only the new turn is prefilled. /reset starts over,\n"
           "/exit (or end of input) quits.\n\n"
           "  --system TEXT      system message (default: the chat template's)\n"
           "  -n, --tokens N     longest reply in tokens (default 512)\n"
           "  --temp T           temperature, 0: greedy (default 0.7)\n"
           "  --top-k K, --top-p P, --seed S   sampling, as in `kvcache generate`\n" CLI_MODEL_HELP);
}

typedef struct {
    llm_chat_msg *msgs;   /* [n] the conversation; contents owned (roles are literals) */
    int32_t n, cap;
    int32_t n_cached;     /* msgs[0..n_cached) are in the cache, up to their end-of-turn marker */
} conversation;

static int conv_add(conversation *cv, const char *role, const char *text) {
    if (cv->n == cv->cap) {
        int32_t cap = cv->cap ? 2 * cv->cap : 16;
        llm_chat_msg *nm = realloc(cv->msgs, sizeof *nm * (size_t)cap);
        if (!nm) return -1;
        cv->msgs = nm, cv->cap = cap;
    }
    char *dup = strdup(text);
    if (!dup) return -1;
    cv->msgs[cv->n++] = (llm_chat_msg){role, dup};
    return 0;
}

/* Back to just the system message (if any). */
static void conv_reset(conversation *cv, int keep_system) {
    int32_t keep = keep_system && cv->n > 0 && !strcmp(cv->msgs[0].role, "system") ? 1 : 0;
    for (int32_t i = keep; i < cv->n; i++) free((char *)cv->msgs[i].content);
    cv->n = keep;
    cv->n_cached = 0;
}

/* The text of the new turn: everything after what the cache holds. */
static char *render_new(const llm_model *m, const conversation *cv) {
    int32_t len = llm_chat_render_continuation(&m->chat, cv->msgs, cv->n, cv->n_cached, 1, NULL, 0);
    char *text = len < 0 && len != LLM_CHAT_ERR ? malloc((size_t)-len) : NULL;
    if (text && llm_chat_render_continuation(&m->chat, cv->msgs, cv->n, cv->n_cached, 1, text, -len) < 0) {
        free(text);
        text = NULL;
    }
    return text;
}

int cmd_chat(int argc, char **argv) {
    cli_model_opts mo = cli_model_opts_default();
    const char *system = NULL;
    int64_t n_gen = 512, top_k = 40, seed = 1;
    double temp = 0.7, top_p = 0.95;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) { usage(); return 0; }
        if (cli_model_opt(argc, argv, &i, &mo)) continue;
        if (cli_opt_str(argc, argv, &i, NULL, "--system", &system)) continue;
        if (cli_opt_int(argc, argv, &i, "-n", "--tokens", &n_gen)) continue;
        if (cli_opt_f64(argc, argv, &i, NULL, "--temp", &temp)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--top-k", &top_k)) continue;
        if (cli_opt_f64(argc, argv, &i, NULL, "--top-p", &top_p)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--seed", &seed)) continue;
        fprintf(stderr, "kvcache chat: unknown option '%s' (see --help)\n", argv[i]);
        return 2;
    }
    if (n_gen < 1 || n_gen > (1 << 24) || temp < 0 || top_k < 0 || top_k > INT32_MAX || !(top_p > 0 && top_p <= 1)) {
        fprintf(stderr, "kvcache chat: need -n >= 1, --temp >= 0, --top-k >= 0, 0 < --top-p <= 1\n");
        return 2;
    }
    llm_model *m;
    llm_context *c;
    int rc = cli_load("chat", &mo, 1, 0, &m, &c);
    if (rc) return rc;
    if (m->chat.kind == LLM_CHAT_UNKNOWN) {
        fprintf(stderr, "kvcache chat: the model has no chat template this engine knows\n");
        llm_context_free(c), llm_model_free(m);
        return 1;
    }
    llm_sampler_params sp = {.temp = (float)temp, .top_k = (int32_t)top_k, .top_p = (float)top_p,
                             .seed = (uint64_t)seed};
    llm_sampler smp;
    float *logits = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    if (!logits || llm_sampler_init(&smp, &sp, m->hp.n_vocab)) {
        fprintf(stderr, "kvcache chat: out of memory\n");
        free(logits), llm_context_free(c), llm_model_free(m);
        return 1;
    }
    kv_cache *cache = llm_context_cache(c);
    const int32_t n_ctx = llm_context_get_params(c).n_ctx;
    int32_t seq;
    kv_seq_new(cache, &seq);
    conversation cv = {0};
    if (system) conv_add(&cv, "system", system);
    int interactive = isatty(0), turn = 0;
    size_t reply_cap = 4096;
    char *reply = malloc(reply_cap), line[8192];
    rc = 0;
    for (;;) {
        if (interactive) fprintf(stderr, "> "), fflush(stderr);
        if (!fgets(line, sizeof line, stdin)) break;
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0]) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            conv_reset(&cv, 1);
            kv_seq_truncate(cache, seq, 0);
            fprintf(stderr, "[new conversation]\n");
            continue;
        }
        conv_add(&cv, "user", line);
        char *text = render_new(m, &cv);
        int32_t n_new = 0, *ids = text ? cli_tokenize(m, text, cv.n_cached == 0, &n_new) : NULL;
        free(text);
        int32_t cached = kv_seq_length(cache, seq);
        if (ids && cached + n_new + 1 > n_ctx) { /* no room for this turn: start over with it alone */
            fprintf(stderr, "[context full at %d tokens: starting a new conversation]\n", (int)cached);
            char *keep = strdup(line);
            conv_reset(&cv, 1);
            kv_seq_truncate(cache, seq, 0);
            conv_add(&cv, "user", keep ? keep : "");
            free(keep), free(ids);
            text = render_new(m, &cv);
            ids = text ? cli_tokenize(m, text, 1, &n_new) : NULL;
            free(text);
            cached = 0;
            if (ids && n_new + 1 > n_ctx) {
                fprintf(stderr, "kvcache chat: this message alone is %d tokens; the context holds %d\n",
                        (int)n_new, (int)n_ctx);
                free(ids);
                cv.n--;
                free((char *)cv.msgs[cv.n].content);
                continue;
            }
        }
        if (!ids) {
            fprintf(stderr, "kvcache chat: could not render or tokenize the turn\n");
            rc = 1;
            break;
        }
        double t0 = cli_now();
        int st = llm_eval(c, seq, ids, n_new, 0, logits, n_new > 1024 ? cli_progress : NULL, "prefill");
        double t_prefill = cli_now() - t0;
        free(ids);
        /* reply: stream until end of turn, the token limit or a full context */
        size_t rlen = 0;
        int32_t generated = 0, eog = -1;
        t0 = cli_now();
        while (st == KV_OK && generated < n_gen && kv_seq_length(cache, seq) < n_ctx - 1) {
            int32_t next = llm_sample(&smp, logits);
            if (llm_token_is_eog(m->tok, next)) {
                eog = next;
                break;
            }
            cli_emit(m, next);
            char piece[256];
            int32_t pn = llm_token_to_piece(m->tok, next, 0, piece, sizeof piece);
            if (pn > 0) {
                if (rlen + (size_t)pn + 1 > reply_cap) {
                    char *nr = realloc(reply, reply_cap = 2 * (rlen + (size_t)pn + 1));
                    if (!nr) break;
                    reply = nr;
                }
                memcpy(reply + rlen, piece, (size_t)pn);
                rlen += (size_t)pn;
            }
            generated++;
            st = llm_eval(c, seq, &next, 1, 0, logits, NULL, NULL);
        }
        double t_decode = cli_now() - t0;
        printf("\n");
        fflush(stdout);
        reply[rlen] = 0;
        /* close the turn in the cache: the stop token the model chose, or the marker */
        if (st == KV_OK && eog >= 0) {
            st = llm_eval(c, seq, &eog, 1, 0, NULL, NULL, NULL);
        } else if (st == KV_OK) {
            int32_t ne = 0, *end = cli_tokenize(m, llm_chat_turn_end(&m->chat), 0, &ne);
            st = end && kv_seq_length(cache, seq) + ne <= n_ctx ? llm_eval(c, seq, end, ne, 0, NULL, NULL, NULL)
                                                                 : KV_ERR_CAPACITY;
            free(end);
        }
        conv_add(&cv, "assistant", reply);
        cv.n_cached = cv.n;
        turn++;
        fprintf(stderr, "[turn %d: prefilled %d new tokens (%d reused from the cache) in %.2f s, %.1f tokens/s; "
                        "reply %d tokens, %.1f tokens/s; cache %d/%d tokens]\n",
                turn, (int)n_new, (int)cached, t_prefill, n_new / (t_prefill > 0 ? t_prefill : 1e-9), (int)generated,
                generated / (t_decode > 0 ? t_decode : 1e-9), (int)kv_seq_length(cache, seq), (int)n_ctx);
        if (st != KV_OK) { /* a full context: the next turn starts over */
            fprintf(stderr, "[context full: the next message starts a new conversation]\n");
            conv_reset(&cv, 1);
            kv_seq_truncate(cache, seq, 0);
        }
    }
    conv_reset(&cv, 0);
    free(cv.msgs), free(reply), free(logits);
    llm_sampler_free(&smp);
    llm_context_free(c);
    llm_model_free(m);
    return rc;
}
