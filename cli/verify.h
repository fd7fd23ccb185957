/* cli/verify.h - `kvcache verify --policy shift|lookup|session`
 * (cli/verify_policy.c); full and window are cli/verify.c. Each returns the
 * exit status: 0 PASS, 1 FAIL or a run-time failure. */
#ifndef KV_CLI_VERIFY_H
#define KV_CLI_VERIFY_H

#include <stdint.h>

#include "cli.h"

/* tol < 0: the K/V type's default. */
int verify_shift(const cli_model_opts *mo, const char *prompt, int64_t steps, int32_t keep, double tol);
int verify_lookup(const cli_model_opts *mo, const char *prompt, int64_t steps, int32_t n_draft);
int verify_session(const cli_model_opts *mo, const char *prompt, int64_t steps);

#endif
