// Pieces the commands share: parsing their command line with the flag
// table, the exit statuses, reading a prompt file, warnings.
#ifndef VELA_TOOLS_COMMON_H
#define VELA_TOOLS_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "host/backend/sampler.h"
#include "tools/args.h"

// Parses the command line of `vela NAME` (cmd: its CLI_* bit) into c,
// which holds the defaults (cli_defaults, and whatever the command set
// before): the environment's VELA_ARG_* values, then argv[1..argc), with up
// to max_pos arguments that are not flags (c->pos). Returns -1 to go on, or
// the exit status: 0 when -h / --help printed `usage` to stdout, 2 when a
// usage error was printed ("vela NAME: message").
int tools_parse(const char *name, unsigned cmd, void (*usage)(FILE *), struct cli *c, int argc,
                char **argv, int max_pos);

// Exit statuses of every subcommand (README, "Exit status"): 0 success;
// 1 a runtime error (the model, a file, the device, generation); 2 a usage
// error found from the command line alone (an unknown flag, a bad value,
// flags that exclude each other, no model and no default model).
enum { TOOLS_EXIT_OK = 0, TOOLS_EXIT_RUNTIME = 1, TOOLS_EXIT_USAGE = 2 };

// A whole file in a NUL-terminated malloc'd buffer of *len_out bytes (the
// NUL not counted); NULL when it cannot be opened or memory runs out.
char *tools_read_file(const char *path, size_t *len_out);

struct engine;
struct grammar_vocab;
// The command line's grammar (c->grammar, GBNF) for the samplers of engine
// e: builds the model's token trie into *vocab (free it with
// grammar_vocab_free after the last sampler) and parses the grammar against
// it into sp->grammar / sp->grammar_vocab (grammar_free after the last
// sampler_create). No grammar: nothing. Returns 0, or prints "vela CMD:
// message" and returns TOOLS_EXIT_RUNTIME (a grammar that does not parse is
// TOOLS_EXIT_USAGE).
int tools_grammar_attach(const char *cmd, const struct cli *c, const struct engine *e,
                         struct sampler_params *sp, struct grammar_vocab **vocab);

// A sampler seed that replays: seed itself, or a random one for
// SAMPLER_SEED_RANDOM (never the sentinel).
uint32_t tools_seed_resolve(uint32_t seed);

// Warns on stderr ("vela CMD: warning: ...") when the context each
// sequence gets (n_ctx_seq cells) is larger than the model's trained context
// n_ctx_train and nothing extends the positions (RoPE scaling flags,
// --self-extend, or `extended`: the command's own, e.g. --grp-attn-n):
// past n_ctx_train the model meets positions it was never trained on.
// Returns 1 when it warned.
int tools_warn_ctx(const char *cmd, const struct args_model *am, int n_ctx_seq, int n_ctx_train,
                   bool extended);

// Speculative decoding from the flags, before the model opens: -md without
// --spec-type means draft; draft without -md, or -md with another type, is
// a usage error (printed as "vela CMD: message", returns TOOLS_EXIT_USAGE).
int tools_spec_resolve(const char *cmd, struct cli *c);
// The logits rows per decode a context of n_seq sequences needs when each
// may verify its drafts (c->gp.spec): n_seq * (draft max + 1), at most
// n_batch; n_seq without speculation.
int tools_spec_outputs(const struct cli *c, int n_seq, int n_batch);
// With -md: opens the draft model beside e (the CPU backend for -ngld 0,
// else e's; a sequence per slot of n_seq, each at least the cells its
// drafts need) and attaches it (host/engine/draft.h). Prints "vela CMD:
// message" and returns TOOLS_EXIT_RUNTIME when it fails.
int tools_draft_open(const char *cmd, const struct cli *c, struct engine *e, int n_seq);

#endif
