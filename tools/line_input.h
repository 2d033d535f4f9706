// Lines typed at `vela chat`'s prompt: with line editing and history where
// the build has libedit (Debian's libedit-dev, BSD-licensed; CMake links it
// only when it finds it) and both stdin and stdout are terminals, plain
// reads otherwise (pipes, files, tests: one line per read, no prompt).
//
// With libedit: emacs keys and arrows, Up / Down walk through the lines sent
// earlier in the session, and the history is kept in a file (loaded at the
// start, written after each line, mode 0600) unless the path is NULL.
#ifndef VELA_TOOLS_LINE_INPUT_H
#define VELA_TOOLS_LINE_INPUT_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct line_input;

// "libedit" or NULL: what this build edits lines with.
const char *line_input_library(void);

// Where the history is kept: $XDG_STATE_HOME/vela/NAME, else
// $HOME/.local/state/vela/NAME; NULL when neither variable is set.
// The caller frees it.
char *line_input_history_path(const char *name);

// Reads from stdin. prompt: shown before each line at a terminal.
// history_path: NULL for none. *interrupt: set by the caller's SIGINT
// handler (installed without SA_RESTART); it ends a read. Returns NULL when
// out of memory.
struct line_input *line_input_open(const char *prompt, const char *history_path,
                                   volatile sig_atomic_t *interrupt);

// One line, without its line end, in *line (valid until the next call):
// its length, -1 at the end of the input, -2 when *interrupt was set while
// waiting (the line typed so far is dropped; the caller clears the flag).
ssize_t line_input_read(struct line_input *li, const char **line);

// A line sent: into the session's history and its file (no-op without libedit).
void line_input_remember(struct line_input *li, const char *line);

// Whether lines are edited (libedit at a terminal).
bool line_input_editing(const struct line_input *li);

void line_input_close(struct line_input *li);

#endif
