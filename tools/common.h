// Pieces the model-running commands (run, eval, bench) share: the head of
// their flag loops, the unknown-option message, reading a prompt file.
#ifndef VELA_TOOLS_COMMON_H
#define VELA_TOOLS_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "host/backend/sampler.h"
#include "tools/args.h"

enum tools_flag {
    TOOLS_FLAG_OWN = 0, // not a shared flag: the command's own, or unknown
    TOOLS_FLAG_TAKEN,   // consumed with its value, *i advanced
    TOOLS_FLAG_EXIT,    // -h printed usage, or a bad value was reported: exit *status
};                      // *status is 0 but for TOOLS_FLAG_EXIT after a bad value

// Offers argv[*i] to -h/--help, the model flags and, when sp is not NULL, the
// sampler flags. A bad value is printed as "vela CMD: message" (status 2);
// help goes to stdout through `usage` (status 0).
enum tools_flag tools_flag_shared(const char *cmd, void (*usage)(FILE *), struct args_model *am,
                                  struct sampler_params *sp, int argc, char **argv, int *i,
                                  int *status);

// Exit statuses of every subcommand (README, "Exit status"): 0 success;
// 1 a runtime error (the model, a file, the device, generation); 2 a usage
// error found from the command line alone (an unknown flag, a bad value,
// flags that exclude each other, no model and no default model).
enum { TOOLS_EXIT_OK = 0, TOOLS_EXIT_RUNTIME = 1, TOOLS_EXIT_USAGE = 2 };

// Prints "vela CMD: unknown option 'ARG' (see 'vela CMD --help')"; returns 2.
int tools_unknown_option(const char *cmd, const char *arg);

// A whole file in a NUL-terminated malloc'd buffer of *len_out bytes (the
// NUL not counted); NULL when it cannot be opened or memory runs out.
char *tools_read_file(const char *path, size_t *len_out);

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

#endif
