/* engine/gen/scheduler_session.c - session files in the scheduler (see
 * scheduler.h, "sessions"): the restore at a request's first admission, when
 * the file reaches further into the prompt than the prefix cache by enough to
 * be worth reading, and the save when its choice 0 ends. Both run on the
 * scheduler thread, between forward passes, and log one line each. */
#include "sched_records.h"
#include "policy.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sched_log(llm_sched *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sched_log(llm_sched *s, const char *fmt, ...) {
    if (!s->p.log) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    s->p.log(s->p.log_user, line);
}

/* A restore reads (and checksums, twice) the whole file, whatever it shares
 * with the prompt: on SmolLM2 (f16 K/V, 23 KB a position, 2 shared cores) a
 * file of ~1,000 positions took 100-110 ms, a prefill of as many 7-10 s, so
 * a file position costs under 1/60 of a prefilled token. The file is read
 * only when the tokens it gives beyond the prefix cache's match are worth it
 * with a margin: at least n_file / SESSION_READ_RATIO of them. Across
 * restarts (an empty prefix cache) it always is; in one process, after a
 * turn whose full pages the prefix cache kept, the file reaches less than a
 * page further, and one of more than 32 x 15 positions is not read. */
enum { SESSION_READ_RATIO = 32 };

/* At the first admission of a request naming a session, choice 0 holds the
 * prefix cache's match (ch->n_cached). When the file's tokens begin the
 * prompt further (read from its header alone) by enough, the sequence is
 * given up and the file restored into a new one; a file that cannot be used
 * leaves the prompt to the prefix cache (matched again: the pages given up
 * stay cached, once the caller places choice 0 again). need: pages the
 * admission counted on. Returns 0, or 1 when choice 0 has no sequence. */
int llm_sched_session_restore(llm_sched *s, sched_req *r, int32_t need) {
    sched_seq *ch = &r->ch[0];
    char err[320];
    int32_t common = 0, n_file = 0;
    if (ch->n_tokens < 2) return 0;   /* one token is prefilled anyway: nothing a file could give */
    const double t0 = now_s();
    int rc = llm_session_file_peek(s->c, r->session, ch->tokens, ch->n_tokens, &common, &n_file, err, sizeof err);
    if (rc == 1) return 0;   /* no file yet: the session's first request */
    if (rc != 0) {
        sched_log(s, "session file ignored, the prompt runs without it: %s", err);
        s->st.session_refused++;
    } else if (common > ch->n_cached && (int64_t)(common - ch->n_cached) * SESSION_READ_RATIO >= n_file) {
        /* the restore holds every page of the file until it is cut to the
         * common prefix; with others running, only from room that is spare */
        kv_cache_stats cs = llm_context_stats(s->c);
        if (s->n_running > 0 && cs.pages_free + cs.pages_cached < pages_for(n_file, s->page_size) + need + s->n_pages / 100 + 1) {
            sched_log(s, "session file %s ignored: the KV pool has no room to read its %d tokens now", r->session,
                      (int)n_file);
            s->st.session_refused++;
        } else {
            llm_seq_remove(s->c, ch->seq);
            ch->seq = -1, ch->n_cached = 0;
            int32_t seq = -1, got = 0;
            if (llm_session_file_load(s->c, r->session, ch->tokens, ch->n_tokens, &seq, &got, err, sizeof err) == 0) {
                ch->seq = seq, ch->n_cached = got, r->n_restored = got;
                s->st.session_restores++, s->st.session_restored += (uint64_t)got;
                sched_log(s, "session file %s: restored %d of %d prompt tokens (file of %d) in %.1f ms", r->session,
                          (int)got, (int)ch->n_tokens, (int)n_file, 1e3 * (now_s() - t0));
            } else {
                sched_log(s, "session file ignored, the prompt runs without it: %s", err);
                s->st.session_refused++;
                s->st.session_seconds += now_s() - t0;
                return 1;   /* choice 0 gave up its sequence: the caller places it again */
            }
        }
    } else {
        sched_log(s, "session file %s not read: the prefix cache holds %d of the %d prompt tokens it gives", r->session,
                  (int)ch->n_cached, (int)common);
    }
    s->st.session_seconds += now_s() - t0;
    return 0;
}

/* Saves what choice 0's cache holds of its tokens to the request's session
 * file (before its pages go): the fed tokens, at most all it knows. */
void llm_sched_session_save(llm_sched *s, sched_req *r, sched_seq *ch) {
    const double t0 = now_s();
    const int32_t n = ch->n_cached < ch->n_tokens ? ch->n_cached : ch->n_tokens;
    char err[320];
    if (ch->shifted) {
        sched_log(s, "session file %s not saved: the sequence context-shifted (its kept K/V were computed over "
                     "tokens it dropped)", r->session);
        s->st.session_save_failures++;
        return;
    }
    if (n < 1) return;
    if (llm_seq_length(s->c, ch->seq) != n && llm_seq_truncate(s->c, ch->seq, n) != LLM_OK) {
        sched_log(s, "session file %s not saved: the sequence could not be cut to its %d tokens", r->session, (int)n);
        s->st.session_save_failures++;
        return;
    }
    if (llm_session_file_save(s->c, ch->seq, ch->tokens, n, r->session, err, sizeof err) != 0) {
        sched_log(s, "session file not saved: %s", err);
        s->st.session_save_failures++;
    } else {
        s->st.session_saves++;
        sched_log(s, "session file %s: saved %d tokens in %.1f ms", r->session, (int)n, 1e3 * (now_s() - t0));
    }
    s->st.session_seconds += now_s() - t0;
}
