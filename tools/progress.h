// The load progress of `vela run` / `vela eval` on stderr: a bar redrawn in
// place on a terminal ("loading [=====>    ]  43% 1.2/2.9 GiB"), a few plain
// lines otherwise (every 25%), nothing with --no-progress. The library
// reports bytes through model_progress_fn (host/model/model.h); this draws them.
// `vela quantize` draws its written bytes the same way ("quantizing [...").
#ifndef VELA_TOOLS_PROGRESS_H
#define VELA_TOOLS_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

struct load_progress {
    const char *prog; // "vela run": prefixes the plain lines
    const char *what; // "loading" (load_progress_init's), or e.g. "quantizing"
    bool quiet;
    bool tty;
    int last; // last percentage (tty) or quarter (plain lines) drawn; -1: none
};

void load_progress_init(struct load_progress *p, const char *prog, bool quiet);
// A model_progress_fn; user is a struct load_progress.
void load_progress_update(void *user, uint64_t done, uint64_t total);

#endif
