/* cli/chat.c - `kvcache chat`: an interactive conversation that keeps its KV
 * cache across turns. Each turn renders only what follows the messages the
 * cache already holds (kve_chat_tokenize), so only the new user turn is
 * prefilled; a kve_session (kvengine.h) generates the reply; the stats line after each reply says how many tokens were new and
 * how many were reused from the cache. A line of any length is one turn; a
 * turn too long for the context is refused whole and the conversation kept. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static void usage(void) {
    printf("usage: kvcache chat [-m MODEL.gguf] [--system TEXT] [--no-think] [-n N] [--temp T] [--top-k K] [--top-p P]\n"
           "                    [--min-p P] [--repeat-penalty R] [--repeat-last-n N] [--presence-penalty P]\n"
           "                    [--frequency-penalty F] [--stop TEXT]...\n"
           "                    [--seed S] [-t THREADS] [--ctx N] [--kv-type T]\n"
           "                    [--context-shift [--keep N]] [--session FILE]\n"
           "Reads one user message per line from stdin and streams each reply to stdout.\n"
           "The cache is kept across turns: only the new turn is prefilled. /reset starts over,\n"
           "/exit (or end of input) quits, /help lists the commands. On a terminal, lines can be\n"
           "edited and recalled (Up, Down; libedit), and Ctrl-C stops a reply, keeping the\n"
           "conversation.\n\n"
           "  --system TEXT      system message (default: the chat template's)\n"
           "  -n, --tokens N     longest reply in tokens (default 512)\n"
           CLI_THINK_HELP
           CLI_SAMPLE_HELP
           CLI_POLICY_HELP CLI_MODEL_HELP);
}

typedef struct {
    kve_chat_message *msgs; /* [n] the conversation; contents owned (roles are literals) */
    int32_t n, cap;
    int32_t n_cached;     /* msgs[0..n_cached) are in the cache, up to their end-of-turn marker */
} conversation;

static int conv_add(conversation *cv, const char *role, const char *text) {
    if (cv->n == cv->cap) {
        int32_t cap = cv->cap ? 2 * cv->cap : 16;
        kve_chat_message *nm = realloc(cv->msgs, sizeof *nm * (size_t)cap);
        if (!nm) return -1;
        cv->msgs = nm, cv->cap = cap;
    }
    char *dup = strdup(text);
    if (!dup) return -1;
    cv->msgs[cv->n++] = (kve_chat_message){role, dup};
    return 0;
}

/* Back to just the system message (if any). */
static void conv_reset(conversation *cv, int keep_system) {
    int32_t keep = keep_system && cv->n > 0 && !strcmp(cv->msgs[0].role, "system") ? 1 : 0;
    for (int32_t i = keep; i < cv->n; i++) free((char *)cv->msgs[i].content);
    cv->n = keep;
    cv->n_cached = 0;
}

/* The tokens of the new turn: everything after what the cache holds (BOS
 * first when it holds nothing), the template's markers as control tokens and
 * what the user typed as text. */
static int32_t *tokenize_new(const kve_model *m, const conversation *cv, int think, int32_t *n) {
    return cli_chat_ids(m, cv->msgs, cv->n, cv->n_cached, cv->n_cached == 0, think, n);
}

/* What a conversation runs on. */
typedef struct {
    kve_model *m;
    kve_session *s;
    conversation cv;
    int32_t *marker, n_marker;   /* [n_marker] the end-of-turn text's tokens */
    kve_generate_params gp;
    cli_policy_opts po;          /* --context-shift, --keep, --session */
    int think;                   /* --think 1, --no-think 0, neither -1 */
    char *reply;                 /* [reply_cap] this turn's reply text, NUL-terminated */
    size_t reply_len, reply_cap;
    int turn;
    bool session_refused;        /* --session FILE could not be restored: kept unless overwritten */
} chat_state;

/* on_token: Ctrl-C stops the reply (KVE_STOP_CANCEL); the turn is closed and kept. */
static int on_token(void *user, int32_t token) {
    (void)user, (void)token;
    return cli_interrupted != 0;
}

/* on_text: print the reply as it comes and keep it for the conversation. */
static int on_text(void *user, const char *text, size_t len) {
    chat_state *st = user;
    cli_print_text(NULL, text, len);
    if (st->reply_len + len + 1 > st->reply_cap) {
        size_t cap = 2 * (st->reply_len + len + 1);
        char *nr = realloc(st->reply, cap);
        if (!nr) return 1; /* out of memory: stop this reply */
        st->reply = nr, st->reply_cap = cap;
    }
    memcpy(st->reply + st->reply_len, text, len);
    st->reply[st->reply_len += len] = 0;
    return 0;
}

/* Tokens of the new turn, the user message `line` already added to the
 * conversation: what follows the cache, or, when that does not fit, the turn
 * alone in a new conversation. NULL with *refused set when even that does
 * not fit (the message is taken back out), NULL alone on failure. */
static int32_t *turn_tokens(chat_state *st, const char *line, int32_t *n_new, int *refused) {
    const int32_t n_ctx = kve_session_get_params(st->s).n_ctx, room = n_ctx - 1 - st->n_marker;
    int32_t n_held;
    kve_session_tokens(st->s, &n_held);
    int32_t *ids = tokenize_new(st->m, &st->cv, st->think, n_new);
    *refused = 0;
    if (!ids || n_held + *n_new <= room) return ids;
    if (st->po.context_shift && n_held + *n_new - room <= n_held - st->gp.n_keep) {
        /* no room: drop old turns after the kept positions (the system prompt) */
        int32_t drop;
        int rc = kve_session_shift(st->s, st->gp.n_keep, n_held + *n_new - room, &drop);
        if (rc == KVE_OK) {
            fprintf(stderr, "[context shift: dropped %d tokens after the first %d]\n", (int)drop, (int)st->gp.n_keep);
            return ids;
        }
        fprintf(stderr, "kvcache chat: context shift failed: %s\n", kve_status_str(rc));
    }
    /* no room after what the cache holds: the turn alone, as a new conversation */
    free(ids);
    conversation alone = st->cv;
    int32_t sys = alone.n > 1 && !strcmp(alone.msgs[0].role, "system") ? 1 : 0;
    kve_chat_message pair[2] = {alone.msgs[0], alone.msgs[alone.n - 1]};
    alone.msgs = sys ? pair : &pair[1], alone.n = sys + 1, alone.n_cached = 0;
    ids = tokenize_new(st->m, &alone, st->think, n_new);
    if (!ids) return NULL;
    if (*n_new > room) {
        fprintf(stderr, "kvcache chat: this message is %d tokens; the context holds %d (with room for a reply "
                        "and the end of turn: %d); not sent, the conversation is kept\n",
                (int)*n_new, (int)n_ctx, (int)room);
        free(ids);
        st->cv.n--;
        free((char *)st->cv.msgs[st->cv.n].content);
        *refused = 1;
        return NULL;
    }
    fprintf(stderr, "[context full at %d tokens: starting a new conversation]\n", (int)n_held);
    char *keep = strdup(line);
    conv_reset(&st->cv, 1);
    conv_add(&st->cv, "user", keep ? keep : "");
    free(keep);
    kve_session_reset(st->s);
    return ids;
}

/* One user line: its turn prefilled, the reply streamed, the turn closed in
 * the cache. 0, or 1 on a failure that ends the chat. */
static int chat_turn(chat_state *st, const char *line) {
    if (conv_add(&st->cv, "user", line)) return fprintf(stderr, "kvcache chat: out of memory\n"), 1;
    int32_t n_new = 0, n_held;
    int refused;
    int32_t *ids = turn_tokens(st, line, &n_new, &refused);
    if (!ids) {
        if (refused) return 0;
        fprintf(stderr, "kvcache chat: could not render or tokenize the turn\n");
        return 1;
    }
    /* the prompt: what the session holds, then the new turn */
    const int32_t *held = kve_session_tokens(st->s, &n_held);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)(n_held + n_new));
    if (!prompt) return free(ids), 1;
    memcpy(prompt, held, sizeof(int32_t) * (size_t)n_held);
    memcpy(prompt + n_held, ids, sizeof(int32_t) * (size_t)n_new);
    free(ids);
    st->reply_len = 0;
    st->reply[0] = 0;
    cli_interrupted = 0;
    if (st->po.session && st->turn == 0 && n_held == 0)
        cli_session_restore("chat", st->s, st->po.session, prompt, n_held + n_new, &st->session_refused);
    kve_generate_result res;
    st->gp.on_progress = n_new > 512 ? cli_progress : NULL, st->gp.progress_user = "prefill"; /* a pasted document */
    kve_session_generate(st->s, prompt, n_held + n_new, &st->gp, &res);
    free(prompt);
    printf("\n");
    fflush(stdout);
    if (res.stop == KVE_STOP_ERROR || res.status != KVE_OK) {
        fprintf(stderr, "kvcache chat: %s\n", res.message);
        return 1;
    }
    /* close the turn in the cache: the stop token the model chose, or the marker
     * (reserve kept room for it) */
    int rc = res.stop == KVE_STOP_EOG ? kve_session_feed(st->s, &res.eog_token, 1)
                                      : kve_session_feed(st->s, st->marker, st->n_marker);
    if (rc != KVE_OK) {
        fprintf(stderr, "kvcache chat: could not close the turn: %s\n", kve_status_str(rc));
        return 1;
    }
    conv_add(&st->cv, "assistant", st->reply);
    st->cv.n_cached = st->cv.n;
    st->turn++;
    int32_t prefilled = res.n_prompt - res.n_reused;
    fprintf(stderr, "[turn %d: prefilled %d new tokens (%d reused from the cache) in %.2f s, %.1f tokens/s; "
                    "reply %d tokens, %.1f tokens/s; cache %d/%d tokens]\n",
            st->turn, (int)prefilled, (int)res.n_reused, res.t_prefill,
            prefilled / (res.t_prefill > 0 ? res.t_prefill : 1e-9), (int)res.n_generated,
            res.n_generated / (res.t_decode > 0 ? res.t_decode : 1e-9),
            (int)kve_session_n_cached(st->s), (int)kve_session_get_params(st->s).n_ctx);
    if (res.stop == KVE_STOP_CONTEXT) fprintf(stderr, "[reply cut: %s]\n", res.message);
    if (res.stop == KVE_STOP_CANCEL) fprintf(stderr, "[reply stopped by Ctrl-C; the conversation goes on]\n");
    cli_interrupted = 0;
    if (res.n_shifts) fprintf(stderr, "[context shift during the reply: dropped %d tokens]\n", (int)res.n_discarded);
    if (st->po.session && cli_session_save("chat", st->s, &st->po, st->session_refused)) return 1;
    if (st->session_refused && !st->po.session_overwrite) st->po.session = NULL; /* said once; the file stays */
    return 0;
}

int cmd_chat(int argc, char **argv) {
    cli_model_opts mo = cli_model_opts_default();
    const char *system = NULL;
    cli_sample_opts so = cli_sample_opts_default(512);
    cli_policy_opts po = cli_policy_opts_default();
    int think = -1;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) { usage(); return 0; }
        if (cli_model_opt(argc, argv, &i, &mo)) continue;
        if (cli_policy_opt(argc, argv, &i, &po, false)) continue;
        if (cli_opt_str(argc, argv, &i, NULL, "--system", &system)) continue;
        if (cli_think_opt(argv[i], &think)) continue;
        if (cli_sample_opt(argc, argv, &i, &so)) continue;
        fprintf(stderr, "kvcache chat: unknown option '%s' (see --help)\n", argv[i]);
        return 2;
    }
    if (cli_sample_check("chat", &so, 1)) return 2;
    if (cli_policy_check("chat", &po)) return 2;
    chat_state st = {.po = po, .think = think};
    int rc = cli_open("chat", &mo, &st.m, &st.s);
    if (rc) return rc;
    if (!kve_model_has_chat_template(st.m)) {
        fprintf(stderr, "kvcache chat: the model has no chat template this engine knows\n");
        kve_session_free(st.s), kve_model_free(st.m);
        return 1;
    }
    if ((rc = cli_think_check("chat", st.m, think))) {
        kve_session_free(st.s), kve_model_free(st.m);
        return rc;
    }
    kve_grammar *rules = NULL;
    if (cli_grammar_load("chat", &so, st.m, &rules)) {   /* each reply a document of it */
        kve_session_free(st.s), kve_model_free(st.m);
        return 1;
    }
    st.gp = cli_generate_params(&so);
    st.gp.grammar = rules;
    st.gp.on_text = on_text, st.gp.on_token = on_token, st.gp.user = &st;
    st.gp.context_shift = po.context_shift;
    st.gp.n_keep = po.keep >= 0 ? (int32_t)po.keep : cli_chat_prefix_tokens(st.m, system, think);
    if (st.gp.n_keep < 4) st.gp.n_keep = 4; /* the sinks: at least 4 (StreamingLLM) */
    const char *end = kve_chat_turn_end(st.m);
    st.marker = cli_text_tokens(st.m, end, strlen(end), 0, 1, &st.n_marker);
    st.gp.reserve = st.n_marker;
    st.reply_cap = 4096;
    st.reply = malloc(st.reply_cap);
    if (!st.marker || !st.reply) {
        fprintf(stderr, "kvcache chat: %s\n", kve_status_str(KVE_ERR_NOMEM));
        free(st.marker), free(st.reply), kve_session_free(st.s), kve_model_free(st.m);
        kve_grammar_free(rules);
        return 1;
    }
    if (system) conv_add(&st.cv, "system", system);
    cli_lines *in = cli_lines_open();
    if (!in) {
        fprintf(stderr, "kvcache chat: out of memory\n");
        rc = 1;
    } else if (cli_lines_interactive(in)) {
        fprintf(stderr, "kvcache chat: %s, %d-token context. Type a message and Enter; /help lists the commands,\n"
                        "Ctrl-C stops a reply, Ctrl-D or /exit quits.\n",
                kve_model_name(st.m), (int)kve_session_get_params(st.s).n_ctx);
    }
    const char *line;
    for (int got; in && (got = cli_lines_read(in, &line)) != 0;) {
        if (got < 0 || !line[0]) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/help")) {
            fprintf(stderr, "  /reset   start a new conversation (the system message stays)\n"
                            "  /exit    quit (also /quit, or Ctrl-D)\n"
                            "  /help    this list\n"
                            "  Ctrl-C stops a reply and keeps the conversation; Up and Down recall lines.\n");
            continue;
        }
        if (!strcmp(line, "/reset")) {
            conv_reset(&st.cv, 1);
            kve_session_reset(st.s);
            fprintf(stderr, "[new conversation]\n");
            continue;
        }
        if ((rc = chat_turn(&st, line)) != 0) break;
    }
    cli_lines_close(in);
    conv_reset(&st.cv, 0);
    free(st.cv.msgs), free(st.reply), free(st.marker);
    kve_grammar_free(rules);
    kve_session_free(st.s);
    kve_model_free(st.m);
    return rc;
}
