// Subcommands of the `vela` binary. Each returns the process exit status
// (0 ok, 1 runtime error, 2 usage error: README, "Exit status";
// tools/common.h TOOLS_EXIT_*) and prints its own messages.
#ifndef VELA_TOOLS_CMDS_H
#define VELA_TOOLS_CMDS_H

int cmd_gguf(int argc, char **argv);     // tools/cmd_gguf.c
int cmd_mkmodel(int argc, char **argv);  // tools/cmd_mkmodel.c
int cmd_quantize(int argc, char **argv); // tools/cmd_quantize.c
int cmd_tokenize(int argc, char **argv); // tools/cmd_tokenize.c
int cmd_run(int argc, char **argv);      // tools/cmd_run.c
int cmd_eval(int argc, char **argv);     // tools/cmd_eval.c
int cmd_bench(int argc, char **argv);    // tools/cmd_bench.c
int cmd_serve(int argc, char **argv);    // tools/cmd_serve.c
int cmd_chat(int argc, char **argv);     // tools/cmd_chat.c

#endif
