// Placeholder until the subcommand lands; it fails loudly rather than pretend.
#include <stdio.h>

#include "tools/cmds.h"

int cmd_eval(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "vela eval: not implemented yet\n");
    return 1;
}
