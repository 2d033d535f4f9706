// Placeholder until the subcommand lands; it fails loudly rather than pretend.
#include <stdio.h>

#include "tools/cmds.h"

int cmd_tokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "vela tokenize: not implemented yet\n");
    return 1;
}
