// Tests describe runs with the command line's flags (struct args_model, as
// `vela run` parses them); the library takes plain configs. These give the
// configs for a flags struct, as the tools build them (tools/args.h).
#ifndef VELA_TESTS_ARGS_CONFIG_H
#define VELA_TESTS_ARGS_CONFIG_H

#include "tools/args.h"

// The load config of a. The result lives until the next call.
static inline const struct load_config *lc_of(const struct args_model *a) {
    static struct load_config lc;
    args_load_config(a, &lc);
    return &lc;
}

// The context config of a, with n_ctx cells when n_ctx > 0 (0: the flags').
// The result lives until the next call.
static inline const struct forward_config *ctx_of(const struct args_model *a, int n_ctx) {
    static struct forward_config c;
    args_ctx_config(a, &c);
    if (n_ctx > 0)
        c.n_ctx = n_ctx;
    return &c;
}

#endif
