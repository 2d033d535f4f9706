// Load progress on stderr (see progress.h).
#include "tools/progress.h"

#include <stdio.h>
#include <unistd.h>

#define BAR_WIDTH 30

void load_progress_init(struct load_progress *p, const char *prog, bool quiet) {
    p->prog = prog;
    p->what = "loading";
    p->quiet = quiet;
    p->tty = isatty(STDERR_FILENO) != 0;
    p->last = -1;
}

// "512.0/2048.0 MiB" below 1 GiB of total, "1.2/2.9 GiB" above.
static void format_bytes(char *buf, size_t cap, uint64_t done, uint64_t total) {
    const bool big = total >= (1ull << 30);
    const double unit = big ? (double)(1ull << 30) : (double)(1ull << 20);
    snprintf(buf, cap, "%.1f/%.1f %s", (double)done / unit, (double)total / unit,
             big ? "GiB" : "MiB");
}

void load_progress_update(void *user, uint64_t done, uint64_t total) {
    struct load_progress *p = user;
    if (p->quiet || total == 0)
        return;
    if (done > total)
        done = total;
    const int pct = (int)(done * 100 / total);
    if (!p->tty) {
        // Plain lines for logs: each quarter once, the end always.
        const int q = pct / 25;
        if (q == p->last || (q == 0 && done < total))
            return;
        p->last = q;
        char sz[64];
        format_bytes(sz, sizeof sz, done, total);
        fprintf(stderr, "%s: %s %3d%% (%s)\n", p->prog, p->what, pct, sz);
        return;
    }
    if (pct == p->last && done < total)
        return;
    p->last = pct;
    char bar[BAR_WIDTH + 1];
    const int fill = (int)(done * BAR_WIDTH / total);
    for (int i = 0; i < BAR_WIDTH; i++)
        bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[BAR_WIDTH] = 0;
    char sz[64];
    format_bytes(sz, sizeof sz, done, total);
    fprintf(stderr, "\r%s [%s] %3d%% %s", p->what, bar, pct, sz);
    if (done == total)
        fprintf(stderr, "\n");
    fflush(stderr);
}
