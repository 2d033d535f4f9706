// vela mkmodel: writes a synthetic model as GGUF (tools/mkmodel/mkmodel.h does the work).
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "gguf/quant.h"
#include "tools/args.h"
#include "tools/cmds.h"
#include "tools/common.h"
#include "tools/mkmodel/ftype.h"
#include "tools/mkmodel/mkmodel.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: vela mkmodel -o FILE [options]\n"
            "\n"
            "Writes a synthetic model (seeded random weights) that llama.cpp and vela can load.\n"
            "Flags after --preset override it, wherever --preset appears.\n"
            "\n");
    flags_help(out, &cli_flags, CLI_MKMODEL);
    fprintf(out, "\narchitectures (--arch):\n");
    for (int i = 0; i < MODEL_ARCH_COUNT; i++) {
        const struct arch *a = arch_get((enum model_arch)i);
        if (a)
            fprintf(out, "  %-12s %s\n", a->name, a->summary);
    }
    fprintf(out, "\nthe generated vocabulary: %d tokens (--n-vocab pads it)\n\npresets:\n",
            mkmodel_vocab_base_size());
    for (const struct mkmodel_preset_info *p = mkmodel_presets(); p->name; p++)
        fprintf(out, "  %-12s %s\n", p->name, p->summary);
    fprintf(out,
            "\nexample: vela mkmodel --preset llama2-7b --type q4_0 -o /tmp/7b-q4_0.gguf\n"
            "         vela mkmodel --preset qwen3-30b-a3b --mix q4_k_m -o /tmp/30b-a3b.gguf\n");
}

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "vela mkmodel: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see 'vela mkmodel --help')\n");
    va_end(ap);
    return 2;
}

struct progress_state {
    bool quiet;
    bool tty; // progress is shown on a terminal only
    int last_pct;
};

static void on_log(void *ctx, const char *msg) {
    const struct progress_state *ps = ctx;
    if (!ps->quiet)
        fprintf(stderr, "vela mkmodel: note: %s\n", msg);
}

static void on_progress(void *ctx, uint64_t done, uint64_t total) {
    struct progress_state *ps = ctx;
    if (ps->quiet || !ps->tty || total == 0)
        return;
    int pct = (int)(done * 100 / total);
    if (pct == ps->last_pct)
        return;
    ps->last_pct = pct;
    fprintf(stderr, "\rvela mkmodel: %3d%% (%.2f / %.2f GB)", pct, done / 1e9, total / 1e9);
    if (done == total)
        fprintf(stderr, "\n");
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// The preset (--preset NAME or --preset=NAME, wherever it appears) into
// cfg before the other flags, so that they override it. 0, or the exit
// status (printed).
static int apply_preset(struct mkmodel_config *cfg, int argc, char **argv) {
    const char *preset = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return 0; // the usage, whatever the preset
        if (!strcmp(argv[i], "--preset") && i + 1 < argc)
            preset = argv[++i];
        else if (!strncmp(argv[i], "--preset=", 9))
            preset = argv[i] + 9;
    }
    struct verr err = {0};
    if (preset && mkmodel_preset(cfg, preset, &err))
        return bad("%s", err.msg);
    return 0;
}

// Flags that exclude each other, or that would be silently dropped: 0 or
// the usage status (printed).
static int check_mkmodel_flags(const struct cli *c) {
    const struct mkmodel_config *cfg = &c->mk.cfg;
    if (c->mk.saw_type && c->mk.saw_mix)
        return bad("--type and --mix both set the base type; give one of them");
    if (c->mk.saw_rope_scale && cfg->rope_scaling == MKMODEL_ROPE_SCALING_NONE)
        return bad("--rope-scale needs --rope-scaling linear or yarn");
    if (c->mk.saw_yarn_ctx && cfg->rope_scaling != MKMODEL_ROPE_SCALING_YARN)
        return bad("--yarn-orig-ctx needs --rope-scaling yarn");
    if (c->mk.saw_freqs_opt && !cfg->rope_freqs)
        return bad("--rope-freqs-factor / --rope-freqs-orig-ctx need --rope-freqs");
    if (!c->mk.out)
        return bad("no output file: give -o FILE");
    return 0;
}

// The line that says what was written (r: the resolved config) and how fast.
static void say_written(const char *out, const struct mkmodel_config *r, double dt) {
    FILE *fp = fopen(out, "rb");
    long long size = -1;
    if (fp && fseek(fp, 0, SEEK_END) == 0)
        size = ftell(fp);
    if (fp)
        fclose(fp);
    char types[64];
    if (r->mix != MKMODEL_MIX_NONE)
        snprintf(types, sizeof types, "%s", ftype_by_id(r->mix)->name);
    else
        snprintf(types, sizeof types, "%s", ggml_type_name(r->type));
    double params = (double)mkmodel_count_params(r);
    char psz[32], fsz[32];
    if (params >= 1e9)
        snprintf(psz, sizeof psz, "%.2fB", params / 1e9);
    else
        snprintf(psz, sizeof psz, "%.2fM", params / 1e6);
    if (size >= 1000000000LL)
        snprintf(fsz, sizeof fsz, "%.2f GB", size / 1e9);
    else
        snprintf(fsz, sizeof fsz, "%.2f MB", size / 1e6);
    char experts[96] = "";
    if (r->n_expert > 0)
        snprintf(experts, sizeof experts, ", %d experts (%d used) of ff %d%s", r->n_expert,
                 r->n_expert_used, r->n_ff_exp, r->n_ff_shexp ? " + a shared one" : "");
    printf("wrote %s: %s '%s', %d layers, n_embd %d, %d/%d heads (dim %d), n_ff %d%s, "
           "n_vocab %d%s, %s (%s weights), %s params, %s in %.2f s (%.0f MB/s, %d threads)\n",
           out, arch_get((enum model_arch)r->arch)->name, r->name, r->n_layer, r->n_embd, r->n_head,
           r->n_head_kv, r->head_dim, r->n_ff, experts, r->n_vocab, r->tied ? ", tied" : "", types,
           r->weights == MKMODEL_WEIGHTS_FAST ? "fast" : "exact", psz, fsz, dt,
           dt > 0 ? size / 1e6 / dt : 0.0, r->n_threads);
}

int cmd_mkmodel(int argc, char **argv) {
    static struct cli c; // large: off the stack
    cli_defaults(&c);
    int st = apply_preset(&c.mk.cfg, argc, argv);
    if (st)
        return st;
    st = tools_parse("mkmodel", CLI_MKMODEL, usage, &c, argc, argv, 0);
    if (st >= 0)
        return st;
    if ((st = check_mkmodel_flags(&c)))
        return st;
    struct mkmodel_config *cfg = &c.mk.cfg;
    const bool quiet = c.mk.quiet;
    struct progress_state ps = {quiet, isatty(STDERR_FILENO) != 0, -1};
    cfg->log = on_log;
    cfg->progress = on_progress;
    cfg->cb_ctx = &ps;

    struct verr err = {0};
    struct mkmodel_config r;
    if (mkmodel_resolve(cfg, &r, &err)) {
        fprintf(stderr, "vela mkmodel: %s\n", err.msg);
        // Everything resolve checks is a flag's value (a --vocab file that
        // cannot be read included); only running out of memory is not.
        return err.code == VERR_NOMEM ? 1 : 2;
    }
    if (cfg->vocab_path && c.mk.saw_n_vocab && cfg->n_vocab != r.n_vocab && !quiet)
        fprintf(stderr, "vela mkmodel: note: --vocab %s has %d tokens; --n-vocab %d ignored\n",
                cfg->vocab_path, r.n_vocab, cfg->n_vocab);
    // The library's own note about n_vocab is for library callers; the tool
    // printed its own above (only when the user gave --n-vocab).
    if (cfg->vocab_path)
        cfg->n_vocab = 0;

    double t0 = now_s();
    if (mkmodel_write(cfg, c.mk.out, &err)) {
        fprintf(stderr, "vela mkmodel: %s\n", err.msg);
        return 1;
    }
    if (!quiet)
        say_written(c.mk.out, &r, now_s() - t0);
    return 0;
}
