// Lines typed at a prompt, edited with libedit where the build has it (line_input.h).
#include "tools/line_input.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef VELA_HAVE_LIBEDIT
#include <histedit.h>
#include <langinfo.h>
#include <locale.h>
#include <wchar.h>
#endif

#define LINE_INPUT_HISTORY_MAX 1000 // lines kept in the session and its file

struct line_input {
    const char *prompt;
    volatile sig_atomic_t *interrupt;
    bool tty; // stdin is a terminal: a prompt, and reads that Ctrl-C ends
    char *buf;
    size_t cap;
#ifdef VELA_HAVE_LIBEDIT
    EditLine *el; // NULL: plain reads
    History *hist;
    char *history_path;
    mbstate_t mb; // a character's first bytes, read before the rest
#endif
};

// At a terminal: waits until stdin can be read (1) or *interrupt is set (0).
// Polling in short slices closes the window where the signal lands between
// a check of the flag and a blocking read, which would then wait on.
static int wait_readable(volatile sig_atomic_t *interrupt) {
    for (;;) {
        if (*interrupt)
            return 0;
        struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
        int r = poll(&p, 1, 100);
        if (r > 0 || (r < 0 && errno != EINTR))
            return 1; // input, its end, or an error the read reports
    }
}

static ssize_t chomp(char *s, ssize_t len) {
    while (len > 0 && (s[len - 1] == '\n' || s[len - 1] == '\r'))
        s[--len] = '\0';
    return len;
}

char *line_input_history_path(const char *name) {
    const char *state = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    const char *fmt = state && *state ? "%s/vela/%s" : "%s/.local/state/vela/%s";
    const char *base = state && *state ? state : home;
    if (!base || !*base)
        return NULL;
    size_t n = strlen(base) + strlen(name) + 32;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, fmt, base, name);
    return p;
}

#ifdef VELA_HAVE_LIBEDIT

const char *line_input_library(void) {
    return "libedit";
}

static char *prompt_of(EditLine *el) {
    struct line_input *li = NULL;
    el_get(el, EL_CLIENTDATA, &li);
    return (char *)li->prompt;
}

// libedit's reader: one character, waiting as wait_readable does so that
// Ctrl-C ends el_gets (-1); 0 at the end of the input.
static int read_char(EditLine *el, wchar_t *wc) {
    struct line_input *li = NULL;
    el_get(el, EL_CLIENTDATA, &li);
    for (;;) {
        if (!wait_readable(li->interrupt)) {
            errno = EINTR;
            return -1;
        }
        char b;
        ssize_t n = read(STDIN_FILENO, &b, 1);
        if (n == 0)
            return 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        size_t k = mbrtowc(wc, &b, 1, &li->mb);
        if (k == (size_t)-2)
            continue; // more bytes of this character to come
        if (k == (size_t)-1) {
            memset(&li->mb, 0, sizeof li->mb); // not in the locale's encoding: dropped
            continue;
        }
        return 1;
    }
}

// Every directory of path's parent, 0700 (the history is the user's alone).
static int make_parents(const char *path) {
    char *dir = strdup(path);
    if (!dir)
        return -1;
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(dir, 0700) && errno != EEXIST) {
                free(dir);
                return -1;
            }
            *p = '/';
        }
    free(dir);
    return 0;
}

static void history_save(struct line_input *li) {
    if (!li->history_path || make_parents(li->history_path))
        return;
    int fd = open(li->history_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "w");
    if (!f) {
        if (fd >= 0)
            close(fd);
        return;
    }
    HistEvent ev;
    history(li->hist, &ev, H_SAVE_FP, f);
    fclose(f);
}

// Edits lines only where a person types and sees them.
static int open_editor(struct line_input *li, const char *history_path) {
    if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO))
        return 0;
    // libedit reads and shows characters through the C library's multibyte
    // functions: the user's locale, or UTF-8 where that is not UTF-8 (the
    // model's text is UTF-8). LC_CTYPE only; numbers are printed as before.
    if (!setlocale(LC_CTYPE, "") || strcmp(nl_langinfo(CODESET), "UTF-8"))
        setlocale(LC_CTYPE, "C.UTF-8");
    if (!(li->hist = history_init()))
        return -1;
    HistEvent ev;
    history(li->hist, &ev, H_SETSIZE, LINE_INPUT_HISTORY_MAX);
    history(li->hist, &ev, H_SETUNIQUE, 1);
    if (history_path) {
        if (!(li->history_path = strdup(history_path)))
            return -1;
        history(li->hist, &ev, H_LOAD, li->history_path); // none yet: an empty history
    }
    if (!(li->el = el_init("vela", stdin, stdout, stderr)))
        return -1;
    el_set(li->el, EL_CLIENTDATA, li);
    el_set(li->el, EL_EDITOR, "emacs");
    el_set(li->el, EL_PROMPT, prompt_of);
    el_set(li->el, EL_HIST, history, li->hist);
    el_set(li->el, EL_GETCFN, read_char);
    el_source(li->el, NULL); // the user's ~/.editrc, as other libedit programs
    return 0;
}

static ssize_t read_edited(struct line_input *li, const char **line) {
    int n = 0;
    memset(&li->mb, 0, sizeof li->mb);
    const char *s = el_gets(li->el, &n);
    if (!s && *li->interrupt) {
        el_reset(li->el); // the line typed so far is dropped
        return -2;
    }
    if (!s || n <= 0)
        return -1;
    if ((size_t)n + 1 > li->cap) {
        char *b = realloc(li->buf, (size_t)n + 1);
        if (!b)
            return -1;
        li->buf = b;
        li->cap = (size_t)n + 1;
    }
    memcpy(li->buf, s, (size_t)n + 1);
    *line = li->buf;
    return chomp(li->buf, n);
}

void line_input_remember(struct line_input *li, const char *line) {
    if (!li->el || !*line)
        return;
    HistEvent ev;
    history(li->hist, &ev, H_ENTER, line);
    history_save(li);
}

bool line_input_editing(const struct line_input *li) {
    return li->el != NULL;
}

#else // plain reads only

const char *line_input_library(void) {
    return NULL;
}

void line_input_remember(struct line_input *li, const char *line) {
    (void)li;
    (void)line;
}

bool line_input_editing(const struct line_input *li) {
    (void)li;
    return false;
}

#endif

struct line_input *line_input_open(const char *prompt, const char *history_path,
                                   volatile sig_atomic_t *interrupt) {
    struct line_input *li = calloc(1, sizeof *li);
    if (!li)
        return NULL;
    li->prompt = prompt;
    li->interrupt = interrupt;
    li->tty = isatty(STDIN_FILENO);
#ifdef VELA_HAVE_LIBEDIT
    if (open_editor(li, history_path)) {
        line_input_close(li);
        return NULL;
    }
#else
    (void)history_path;
#endif
    return li;
}

ssize_t line_input_read(struct line_input *li, const char **line) {
#ifdef VELA_HAVE_LIBEDIT
    if (li->el)
        return read_edited(li, line);
#endif
    if (li->tty) {
        printf("%s", li->prompt);
        fflush(stdout);
    }
    errno = 0;
    // A terminal hands over one line per read, so nothing waits in stdin's
    // buffer when it is polled; piped input is read as it comes.
    ssize_t len =
        li->tty && !wait_readable(li->interrupt) ? -1 : getline(&li->buf, &li->cap, stdin);
    if (len < 0 && *li->interrupt) {
        clearerr(stdin);
        return -2;
    }
    if (len < 0)
        return -1;
    *line = li->buf;
    return chomp(li->buf, len);
}

void line_input_close(struct line_input *li) {
    if (!li)
        return;
#ifdef VELA_HAVE_LIBEDIT
    if (li->el)
        el_end(li->el);
    if (li->hist)
        history_end(li->hist);
    free(li->history_path);
#endif
    free(li->buf);
    free(li);
}
