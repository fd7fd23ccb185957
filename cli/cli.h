/* cli/cli.h - the `kvcache` command: one entry point per subcommand, and the
 * small helpers they share for options and timing. */
#ifndef KV_CLI_H
#define KV_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* Each subcommand gets argv after its own name; returns the exit status. */
int cmd_demo(int argc, char **argv);

/* Seconds on a monotonic clock. */
double cli_now(void);

/* Option parsing: `--name VALUE` or `-n VALUE`. Returns true and advances *i
 * when argv[*i] matches; exits with a message when the value is missing or
 * malformed (the CLI may exit; the library never does). */
bool cli_opt_str(int argc, char **argv, int *i, const char *s, const char *l, const char **out);
bool cli_opt_int(int argc, char **argv, int *i, const char *s, const char *l, int64_t *out);
bool cli_opt_f64(int argc, char **argv, int *i, const char *s, const char *l, double *out);
bool cli_is_help(const char *arg);

#endif
