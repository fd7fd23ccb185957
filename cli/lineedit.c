/* cli/lineedit.c - the lines `kvcache chat` reads: through libedit (Debian's
 * libedit-dev) when standard input is a terminal, for editing, history and a
 * Ctrl-C that discards the line; plain lines otherwise, so that a pipe or a
 * file is read as it is. Only the kvcache binary links libedit; the library
 * and the engine do not. */
#include <errno.h>
#include <histedit.h>
#include <langinfo.h>
#include <locale.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wchar.h>

#include "cli.h"

volatile sig_atomic_t cli_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    cli_interrupted = 1;
}

struct cli_lines {
    EditLine *el;      /* NULL: plain lines from stdin */
    History *hist;
    int cancelled;     /* Ctrl-C at the prompt: the line is discarded */
    char *buf;         /* plain mode's line */
    size_t cap;
};

static char *prompt(EditLine *el) {
    (void)el;
    return "> ";
}

/* Ctrl-C while editing: end the line, which cli_lines_read then discards. */
static unsigned char on_ctrl_c(EditLine *el, int ch) {
    (void)ch;
    struct cli_lines *l;
    el_get(el, EL_CLIENTDATA, &l);
    l->cancelled = 1;
    return CC_NEWLINE;
}

/* libedit's character source: a UTF-8 character from the terminal, or ^C
 * when SIGINT interrupted the read (a terminal that sends the signal instead
 * of the byte). 1: a character, 0: end of input, -1: error. */
static int read_char(EditLine *el, wchar_t *wc) {
    (void)el;
    mbstate_t ps;
    memset(&ps, 0, sizeof ps);
    for (;;) {
        /* wait in short polls: a SIGINT that lands outside the wait (while
         * libedit draws) is seen at the next poll instead of being lost */
        struct pollfd pfd = {.fd = 0, .events = POLLIN};
        while (!cli_interrupted && poll(&pfd, 1, 100) == 0) {}
        if (cli_interrupted) {
            cli_interrupted = 0;
            *wc = 3;
            return 1;
        }
        char ch;
        ssize_t n = read(0, &ch, 1);
        if (n == 0) return 0;
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        size_t r = mbrtowc(wc, &ch, 1, &ps);
        if (r == (size_t)-2) continue;                       /* more bytes to come */
        if (r == (size_t)-1) { memset(&ps, 0, sizeof ps); continue; } /* not UTF-8: dropped */
        return 1;
    }
}

cli_lines *cli_lines_open(void) {
    struct cli_lines *l = calloc(1, sizeof *l);
    if (!l || !isatty(0)) return l;
    /* libedit decodes input by the locale: UTF-8, as the models take it */
    if (!setlocale(LC_CTYPE, "") || strcmp(nl_langinfo(CODESET), "UTF-8")) setlocale(LC_CTYPE, "C.UTF-8");
    /* SIGINT sets cli_interrupted: a reply stops at its next token, a read
     * at the prompt returns (no SA_RESTART) */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    HistEvent ev;
    l->el = el_init("kvcache", stdin, stderr, stderr); /* stdout keeps only the replies */
    l->hist = history_init();
    if (!l->el || !l->hist) {
        if (l->el) el_end(l->el);
        if (l->hist) history_end(l->hist);
        l->el = NULL, l->hist = NULL;
        return l;
    }
    history(l->hist, &ev, H_SETSIZE, 1000);
    history(l->hist, &ev, H_SETUNIQUE, 1);
    el_set(l->el, EL_EDITOR, "emacs");
    el_set(l->el, EL_PROMPT, prompt);
    el_set(l->el, EL_HIST, history, l->hist);
    el_set(l->el, EL_CLIENTDATA, l);
    el_set(l->el, EL_GETCFN, read_char);
    el_set(l->el, EL_ADDFN, "kv-interrupt", "discard the line", on_ctrl_c);
    el_set(l->el, EL_BIND, "^C", "kv-interrupt", NULL);
    el_source(l->el, NULL); /* the user's ~/.editrc, if any */
    return l;
}

bool cli_lines_interactive(const cli_lines *l) { return l && l->el; }

int cli_lines_read(cli_lines *l, const char **line) {
    ssize_t got;
    if (!l->el) {
        if ((got = getline(&l->buf, &l->cap, stdin)) < 0) return 0;
    } else {
        int n = 0;
        l->cancelled = 0;
        const char *s = el_gets(l->el, &n);
        if (l->cancelled) {
            fputs("^C\n", stderr);
            return -1;
        }
        if (!s || n <= 0) {
            fputc('\n', stderr); /* Ctrl-D: the shell's prompt starts on a line of its own */
            return 0;
        }
        got = n;
        if (got + 1 > (ssize_t)l->cap) {
            char *nb = realloc(l->buf, (size_t)got + 1);
            if (!nb) return 0;
            l->buf = nb, l->cap = (size_t)got + 1;
        }
        memcpy(l->buf, s, (size_t)got + 1);
    }
    while (got > 0 && (l->buf[got - 1] == '\n' || l->buf[got - 1] == '\r')) l->buf[--got] = 0;
    if (l->el && got > 0) {
        HistEvent ev;
        history(l->hist, &ev, H_ENTER, l->buf);
    }
    *line = l->buf;
    return 1;
}

void cli_lines_close(cli_lines *l) {
    if (!l) return;
    if (l->el) el_end(l->el);
    if (l->hist) history_end(l->hist);
    if (l->el) signal(SIGINT, SIG_DFL);
    free(l->buf);
    free(l);
}
