// The layering check: reads every #include "..." line of the library and
// tool sources and fails on an include that points up the layer order or
// sideways into a folder the layer may not see (docs/architecture.md,
// "Layers"), and on a cycle among headers. Each failure names the file,
// the line and the rule.
//
// The order, bottom to top:
//   gguf -> host/ops (backend and transport interfaces) -> kv, host/backend,
//   cuda -> host/model -> host/forward -> host/split -> host/engine -> tools;
//   host/tokenizer and host/grammar stand on gguf alone (the sampler in
//   host/backend uses host/grammar).
// tests/ and bench/ may include anything and are not scanned.
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef VELA_SOURCE_DIR
#error "VELA_SOURCE_DIR must name the source tree"
#endif

// A folder and the folders its files may include (itself included).
struct layer {
    const char *dir;
    const char *may[14];
};

static const struct layer layers[] = {
    {"gguf", {"gguf"}},
    {"host/ops", {"gguf", "host/ops"}},
    {"host/tokenizer", {"gguf", "host/tokenizer"}},
    {"host/grammar", {"gguf", "host/grammar"}},
    {"kv", {"gguf", "host/ops", "kv"}},
    {"host/backend", {"gguf", "host/ops", "host/grammar", "host/backend"}},
    {"cuda", {"gguf", "host/ops", "cuda"}},
    {"host/model", {"gguf", "host/ops", "host/grammar", "host/backend", "host/model"}},
    {"host/forward",
     {"gguf", "host/ops", "host/grammar", "host/backend", "kv", "host/model", "host/forward"}},
    {"host/split",
     {"gguf", "host/ops", "host/grammar", "host/backend", "kv", "host/model", "host/forward",
      "host/split"}},
    {"host/engine",
     {"gguf", "host/ops", "host/grammar", "host/backend", "kv", "host/model", "host/forward",
      "host/split", "host/tokenizer", "host/engine"}},
    {"tools/mkmodel",
     {"gguf", "host/ops", "host/grammar", "host/backend", "host/model", "tools/mkmodel"}},
    {"tools",
     {"gguf", "host/ops", "host/grammar", "host/backend", "kv", "host/model", "host/forward",
      "host/split", "host/tokenizer", "host/engine", "tools/mkmodel", "tools/serve", "tools"}},
    {"tools/serve",
     {"gguf", "host/ops", "host/grammar", "host/backend", "kv", "host/model", "host/forward",
      "host/split", "host/tokenizer", "host/engine", "tools/serve"}},
};
#define N_LAYERS (sizeof layers / sizeof layers[0])

// The folder of a repository path ("host/model/model.h" -> "host/model"),
// into out.
static void dir_of(const char *path, char *out, size_t cap) {
    snprintf(out, cap, "%.*s", (int)(cap > 0 ? cap - 1 : 0), path);
    char *slash = strrchr(out, '/');
    if (slash)
        *slash = '\0';
    else
        out[0] = '\0';
}

static const struct layer *layer_of(const char *dir) {
    for (size_t i = 0; i < N_LAYERS; i++)
        if (!strcmp(layers[i].dir, dir))
            return &layers[i];
    return NULL;
}

static bool allowed(const struct layer *l, const char *dir) {
    for (int i = 0; i < 14 && l->may[i]; i++)
        if (!strcmp(l->may[i], dir))
            return true;
    return false;
}

// Every scanned file's includes: an edge list for the cycle searches.
#define MAX_FILES 512
#define MAX_INC 48
struct file {
    char path[512];
    char inc[MAX_INC][256];
    int n_inc;
};
static struct file files[MAX_FILES];
static int n_files;

static bool is_source(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && (!strcmp(dot, ".c") || !strcmp(dot, ".h") || !strcmp(dot, ".cu") ||
                   !strcmp(dot, ".cuh"));
}

// Reads rel's #include "..." lines into files[] and reports rule breaks into
// msgs (one per line); returns how many it found.
static int scan_file(const char *rel, char *msgs, size_t cap) {
    char full[1024];
    snprintf(full, sizeof full, "%s/%s", VELA_SOURCE_DIR, rel);
    FILE *fp = fopen(full, "r");
    cr_assert_not_null(fp, "cannot open %s", full);
    cr_assert_lt(n_files, MAX_FILES, "more than %d files: raise MAX_FILES", MAX_FILES);
    struct file *f = &files[n_files++];
    snprintf(f->path, sizeof f->path, "%s", rel);
    char dir[512];
    dir_of(rel, dir, sizeof dir);
    const struct layer *l = layer_of(dir);
    cr_assert_not_null(l, "%s: the folder '%s' is in no layer: add it to tests/test_layers.c", rel,
                       dir);
    char line[1024];
    int lineno = 0, bad = 0;
    while (fgets(line, sizeof line, fp)) {
        lineno++;
        const char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (strncmp(p, "#include \"", 10))
            continue;
        char target[256];
        if (sscanf(p + 10, "%255[^\"]", target) != 1)
            continue;
        if (!strchr(target, '/'))
            continue; // a generated or same-folder header named without a path
        if (f->n_inc < MAX_INC)
            snprintf(f->inc[f->n_inc++], sizeof f->inc[0], "%s", target);
        char tdir[256];
        dir_of(target, tdir, sizeof tdir);
        if (!allowed(l, tdir)) {
            size_t len = strlen(msgs);
            snprintf(msgs + len, cap - len, "%s:%d: includes %s: layer %s may not see %s\n", rel,
                     lineno, target, l->dir, tdir);
            bad++;
        }
    }
    fclose(fp);
    return bad;
}

// Scans every source file directly in each layer's folder.
static int scan_tree(char *msgs, size_t cap) {
    int bad = 0;
    n_files = 0;
    for (size_t i = 0; i < N_LAYERS; i++) {
        char full[512];
        snprintf(full, sizeof full, "%s/%s", VELA_SOURCE_DIR, layers[i].dir);
        DIR *d = opendir(full);
        cr_assert_not_null(d, "cannot open %s", full);
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!is_source(e->d_name))
                continue;
            char rel[512];
            snprintf(rel, sizeof rel, "%s/%s", layers[i].dir, e->d_name);
            bad += scan_file(rel, msgs, cap);
        }
        closedir(d);
    }
    return bad;
}

static int find_file(const char *path) {
    for (int i = 0; i < n_files; i++)
        if (!strcmp(files[i].path, path))
            return i;
    return -1;
}

// The cycle a depth-first search found: the stack from w's entry up to
// depth, then w again ("a -> b -> a").
static void write_chain(char *out, size_t cap, const int *stack, int depth, int w,
                        const char *(*name)(int)) {
    size_t len = 0;
    int from = depth;
    while (from > 0 && stack[from] != w)
        from--;
    for (int i = from; i <= depth; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s -> ", name(stack[i]));
    snprintf(out + len, cap - len, "%s", name(w));
}

static const char *file_name(int i) {
    return files[i].path;
}

// Depth-first search over header includes: state 1 = on the stack, 2 = done.
// On a cycle, writes the chain into out and returns true.
static bool dfs(int v, int *state, int *stack, int depth, char *out, size_t cap) {
    state[v] = 1;
    stack[depth] = v;
    for (int k = 0; k < files[v].n_inc; k++) {
        int w = find_file(files[v].inc[k]);
        if (w < 0)
            continue;
        if (state[w] == 1) {
            write_chain(out, cap, stack, depth, w, file_name);
            return true;
        }
        if (state[w] == 0 && dfs(w, state, stack, depth + 1, out, cap))
            return true;
    }
    state[v] = 2;
    return false;
}

Test(layers, no_include_points_up_or_sideways) {
    static char msgs[1 << 16];
    msgs[0] = '\0';
    int bad = scan_tree(msgs, sizeof msgs);
    cr_assert_gt(n_files, 50, "only %d files scanned: is VELA_SOURCE_DIR right?", n_files);
    cr_assert_eq(bad, 0, "%d include(s) against the layer order:\n%s", bad, msgs);
}

Test(layers, no_include_cycle) {
    static char msgs[1 << 16];
    msgs[0] = '\0';
    scan_tree(msgs, sizeof msgs);
    static int state[MAX_FILES], stack[MAX_FILES];
    memset(state, 0, sizeof state);
    char chain[4096] = "";
    for (int v = 0; v < n_files; v++)
        if (state[v] == 0 && dfs(v, state, stack, 0, chain, sizeof chain))
            cr_assert_fail("include cycle: %s", chain);
}

// --- file cycles: a module is a .c and its .h (or .cu and .cuh) of one
// path; module A depends on B when a file of A includes a header of B. A
// cycle of modules (a.c calls b.c, b.c calls a.c, through their headers)
// means neither can be read or tested without the other.

#define MAX_MODULES MAX_FILES
static char modules[MAX_MODULES][512];
static int n_modules;
static bool module_edge[MAX_MODULES][MAX_MODULES];

// The module of a path: the path without its extension.
static void module_of(const char *path, char *out, size_t cap) {
    snprintf(out, cap, "%.*s", (int)(cap > 0 ? cap - 1 : 0), path);
    char *dot = strrchr(out, '.');
    if (dot && !strchr(dot, '/'))
        *dot = '\0';
}

static int module_find(const char *name) {
    for (int i = 0; i < n_modules; i++)
        if (!strcmp(modules[i], name))
            return i;
    return -1;
}

// Modules and their edges from files[] (the headers a file includes that
// are in the tree).
static void modules_build(void) {
    n_modules = 0;
    memset(module_edge, 0, sizeof module_edge);
    char name[512];
    for (int i = 0; i < n_files; i++) {
        module_of(files[i].path, name, sizeof name);
        if (module_find(name) < 0)
            snprintf(modules[n_modules++], sizeof modules[0], "%s", name);
    }
    for (int i = 0; i < n_files; i++) {
        module_of(files[i].path, name, sizeof name);
        const int a = module_find(name);
        for (int k = 0; k < files[i].n_inc; k++) {
            if (find_file(files[i].inc[k]) < 0)
                continue;
            module_of(files[i].inc[k], name, sizeof name);
            const int b = module_find(name);
            if (b >= 0 && b != a)
                module_edge[a][b] = true;
        }
    }
}

static const char *module_name(int i) {
    return modules[i];
}

static bool module_dfs(int v, int *state, int *stack, int depth, char *out, size_t cap) {
    state[v] = 1;
    stack[depth] = v;
    for (int w = 0; w < n_modules; w++) {
        if (!module_edge[v][w])
            continue;
        if (state[w] == 1) {
            write_chain(out, cap, stack, depth, w, module_name);
            return true;
        }
        if (state[w] == 0 && module_dfs(w, state, stack, depth + 1, out, cap))
            return true;
    }
    state[v] = 2;
    return false;
}

// Every cycle's chain, one per line; returns how many starting modules found one.
static int module_cycles(char *out, size_t cap) {
    static int state[MAX_MODULES], stack[MAX_MODULES];
    memset(state, 0, sizeof state);
    int n = 0;
    out[0] = '\0';
    for (int v = 0; v < n_modules; v++) {
        char chain[4096] = "";
        if (state[v] == 0 && module_dfs(v, state, stack, 0, chain, sizeof chain)) {
            size_t len = strlen(out);
            snprintf(out + len, cap - len, "%s\n", chain);
            n++;
            // the modules left on the stack stay grey: reset them for the next start
            for (int i = 0; i < n_modules; i++)
                if (state[i] == 1)
                    state[i] = 2;
        }
    }
    return n;
}

Test(layers, no_file_cycle) {
    static char msgs[1 << 16];
    msgs[0] = '\0';
    scan_tree(msgs, sizeof msgs);
    modules_build();
    static char cycles[1 << 16];
    int n = module_cycles(cycles, sizeof cycles);
    cr_assert_eq(n, 0, "%d file cycle(s) (a .c/.h pair is one file here):\n%s", n, cycles);
}

// The check can fail: a file of the forward layer including the engine, a
// two-header cycle and a two-file cycle are all reported (on a copy of the
// rules, no files).
Test(layers, the_rules_catch_an_upward_include) {
    const struct layer *fwd = layer_of("host/forward");
    cr_assert_not_null(fwd);
    cr_assert(!allowed(fwd, "host/engine"), "forward may not see the engine");
    cr_assert(!allowed(fwd, "host/split"), "forward may not see the split layer");
    cr_assert(!allowed(layer_of("kv"), "host/backend"), "kv sees the interface only");
    cr_assert(!allowed(layer_of("host/tokenizer"), "host/ops"), "the tokenizer stands on gguf");
    cr_assert(!allowed(layer_of("host/grammar"), "host/tokenizer"), "the grammar stands on gguf");
    cr_assert(allowed(layer_of("host/engine"), "host/forward"));

    n_files = 2;
    memset(files, 0, 2 * sizeof files[0]);
    snprintf(files[0].path, sizeof files[0].path, "a/x.h");
    snprintf(files[0].inc[0], sizeof files[0].inc[0], "a/y.h");
    files[0].n_inc = 1;
    snprintf(files[1].path, sizeof files[1].path, "a/y.h");
    snprintf(files[1].inc[0], sizeof files[1].inc[0], "a/x.h");
    files[1].n_inc = 1;
    int state[2] = {0}, stack[2];
    char chain[256] = "";
    cr_assert(dfs(0, state, stack, 0, chain, sizeof chain));
    cr_assert_str_eq(chain, "a/x.h -> a/y.h -> a/x.h");

    // a.c includes b.h, b.c includes a.h: no header cycle, a file cycle.
    n_files = 4;
    memset(files, 0, 4 * sizeof files[0]);
    const char *paths[4] = {"m/a.c", "m/a.h", "m/b.c", "m/b.h"};
    for (int i = 0; i < 4; i++)
        snprintf(files[i].path, sizeof files[i].path, "%s", paths[i]);
    snprintf(files[0].inc[0], sizeof files[0].inc[0], "m/b.h");
    files[0].n_inc = 1;
    snprintf(files[2].inc[0], sizeof files[2].inc[0], "m/a.h");
    files[2].n_inc = 1;
    modules_build();
    cr_assert_eq(n_modules, 2);
    static char cycles[1024];
    cr_assert_eq(module_cycles(cycles, sizeof cycles), 1);
    cr_assert_str_eq(cycles, "m/a -> m/b -> m/a\n");
}
