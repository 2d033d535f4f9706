// vela: one binary, many subcommands.
#include <stdio.h>
#include <string.h>

#include "tools/args.h"
#include "tools/cmds.h"

#include "vela_commit.h" // generated at build time (cmake/vela_commit.cmake)

struct subcommand {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
};

static const struct subcommand subcommands[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"eval", cmd_eval, "evaluate tokens and write logits for every position"},
    {"tokenize", cmd_tokenize, "tokenize text with a model's vocabulary"},
    {"gguf", cmd_gguf, "inspect GGUF files (dump)"},
    {"mkmodel", cmd_mkmodel, "write a synthetic model as GGUF"},
    {"quantize", cmd_quantize, "rewrite a GGUF model with its weights in another type"},
    {"bench", cmd_bench, "measure prompt and generation throughput"},
    {"chat", cmd_chat, "chat with the model in the terminal"},
    {"serve", cmd_serve, "serve the model over HTTP (OpenAI API)"},
};

static void print_usage(FILE *out) {
    fprintf(out, "usage: vela COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(out, "  %-10s %s\n", subcommands[i].name, subcommands[i].summary);
    fprintf(out, "\n'vela COMMAND --help' lists the options of a command.\n");
}

int main(int argc, char **argv) {
    // Under mpirun, ranks other than 0 serve their pipeline stage (host/split/mpi.h).
    int worker_status = 0;
    if (args_mpi_worker(argc, argv, &worker_status))
        return worker_status;
    if (argc < 2) {
        print_usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        print_usage(stdout);
        return 0;
    }
    if (!strcmp(name, "--version")) {
        printf("vela %s\n", VELA_COMMIT);
        return 0;
    }
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (!strcmp(name, subcommands[i].name))
            return subcommands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "vela: unknown command '%s'\n", name);
    print_usage(stderr);
    return 2;
}
