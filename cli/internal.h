/* cli/internal.h - for the diagnostic subcommands that measure the engine's
 * insides (verify, info): a model and
 * context as the engine's internal headers have them. The user-facing
 * commands (generate, chat, tokenize, serve) use cli.h and kvengine.h alone. */
#ifndef KV_CLI_INTERNAL_H
#define KV_CLI_INTERNAL_H

#include "cli.h"
#include "../engine/model/model.h"

/* cli_open's checks and messages, for an llm_context of n_seqs sequences
 * (ctx 0: ctx_default, then the model's training context capped at 4096). */
int cli_load(const char *cmd, const cli_model_opts *o, int32_t n_seqs, int64_t ctx_default, llm_model **m,
             llm_context **c);
/* Tokenizes text (BOS/EOS as the model says when add_special; control tokens
 * written in it recognised only when parse_special) into a malloc'ed array of
 * *n_out ids; NULL on failure. */
int32_t *cli_tokenize(const llm_model *m, const char *text, int add_special, int parse_special, int32_t *n_out);

#endif
