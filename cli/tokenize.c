/* cli/tokenize.c - `kvcache tokenize`: the token ids and pieces a model sees
 * for a text, as llama.cpp's llama-tokenize shows them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(void) {
    printf("usage: kvcache tokenize -m MODEL (-p TEXT | -f FILE) [options]\n\n"
           "Prints the tokens of TEXT (or of FILE's exact bytes) for the model's vocabulary:\n"
           "one line per token, its id and its piece (control characters and bytes that are\n"
           "not UTF-8 escaped), or with --ids one line of ids.\n\n"
           "  -m, --model PATH   GGUF model (default $KVCACHE_MODEL or " CLI_DEFAULT_MODEL ")\n"
           "  -p, --prompt TEXT  the text\n"
           "  -f, --file FILE    the text is FILE's bytes\n"
           "  --ids              print only the ids, space-separated, on one line\n"
           "  --pieces           print id and piece per line (the default)\n"
           "  --special          recognise control tokens written in the text (\"<|im_start|>\");\n"
           "                     by default they are plain text, as message content is\n"
           "  --no-bos           add no BOS/EOS even where the model asks for them\n"
           "  --count            print the number of tokens last\n");
}

/* Writes bytes p [n] in single quotes, escaping quotes, backslashes, control
 * characters and bytes outside well-formed UTF-8 as \xNN. */
static void print_piece(const char *p, size_t n) {
    putchar('\'');
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        int ok = len > 0 && i + (size_t)len <= n && (len == 1 || c >= 0xC2);
        for (int k = 1; ok && k < len; k++) ok = ((unsigned char)p[i + k] & 0xC0) == 0x80;
        if (!ok) {
            printf("\\x%02X", c);
            i++;
        } else if (c == '\n') {
            fputs("\\n", stdout), i++;
        } else if (c == '\t') {
            fputs("\\t", stdout), i++;
        } else if (c == '\r') {
            fputs("\\r", stdout), i++;
        } else if (c == '\'' || c == '\\') {
            printf("\\%c", c), i++;
        } else if (c < 0x20 || c == 0x7F) {
            printf("\\x%02X", c), i++;
        } else {
            fwrite(p + i, 1, (size_t)len, stdout);
            i += len;
        }
    }
    putchar('\'');
}

int cmd_tokenize(int argc, char **argv) {
    cli_model_opts mo = cli_model_opts_default();
    const char *prompt = NULL, *file = NULL;
    int ids_only = 0, special = 0, no_bos = 0, count = 0;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) { usage(); return 0; }
        if (cli_opt_str(argc, argv, &i, "-m", "--model", &mo.model)) continue;
        if (cli_opt_str(argc, argv, &i, "-p", "--prompt", &prompt)) continue;
        if (cli_opt_str(argc, argv, &i, "-f", "--file", &file)) continue;
        if (!strcmp(argv[i], "--ids")) { ids_only = 1; continue; }
        if (!strcmp(argv[i], "--pieces")) { ids_only = 0; continue; }
        if (!strcmp(argv[i], "--special")) { special = 1; continue; }
        if (!strcmp(argv[i], "--no-bos")) { no_bos = 1; continue; }
        if (!strcmp(argv[i], "--count")) { count = 1; continue; }
        fprintf(stderr, "kvcache tokenize: unknown option '%s' (see --help)\n", argv[i]);
        return 2;
    }
    if (!prompt == !file) {
        fprintf(stderr, "kvcache tokenize: give the text with one of -p TEXT or -f FILE\n");
        return 2;
    }
    size_t len = prompt ? strlen(prompt) : 0;
    char *text = NULL;
    if (file && !(text = cli_read_file(file, &len))) {
        fprintf(stderr, "kvcache tokenize: cannot read %s: %s\n", file, strerror(errno));
        return 1;
    }
    if (len > INT32_MAX / 4) {
        fprintf(stderr, "kvcache tokenize: the text is %zu bytes; at most %d\n", len, INT32_MAX / 4);
        free(text);
        return 1;
    }
    kve_model *m;
    char err[512];
    if (kve_model_load(mo.model, &m, err, sizeof err) != KVE_OK) {
        fprintf(stderr, "kvcache tokenize: %s\n", err);
        free(text);
        return 1;
    }
    const char *src = prompt ? prompt : text;
    int32_t n = 0;
    int32_t *ids = cli_text_tokens(m, src, len, !no_bos, special, &n);
    int rc = 0;
    if (!ids) {
        fprintf(stderr, "kvcache tokenize: out of memory\n");
        rc = 1;
    } else if (ids_only) {
        for (int32_t i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)ids[i]);
        putchar('\n');
    } else {
        for (int32_t i = 0; i < n; i++) {
            size_t plen;
            const char *piece = kve_token_piece(m, ids[i], &plen);
            printf("%6d ", (int)ids[i]);
            print_piece(piece, plen);
            putchar('\n');
        }
    }
    if (!rc && count) printf("%d tokens\n", (int)n);
    free(ids);
    free(text);
    kve_model_free(m);
    return rc;
}
