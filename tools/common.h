// Pieces the model-running commands (run, eval, bench) share: the head of
// their flag loops, the unknown-option message, reading a prompt file.
#ifndef VELA_TOOLS_COMMON_H
#define VELA_TOOLS_COMMON_H

#include <stddef.h>
#include <stdio.h>

#include "tools/args.h"
#include "host/backend/sampler.h"

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

// Prints "vela CMD: unknown option 'ARG' (see 'vela CMD --help')"; returns 2.
int tools_unknown_option(const char *cmd, const char *arg);

// A whole file in a NUL-terminated malloc'd buffer of *len_out bytes (the
// NUL not counted); NULL when it cannot be opened or memory runs out.
char *tools_read_file(const char *path, size_t *len_out);

#endif
