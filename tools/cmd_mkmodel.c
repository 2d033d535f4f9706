// vela mkmodel: writes a synthetic model as GGUF (host/mkmodel.h does the work).
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
#include "tools/cmds.h"
#include "tools/mkmodel/ftype.h"
#include "tools/mkmodel/mkmodel.h"

// "--arch llama|qwen2|...", then one line per architecture with its summary:
// the registry's.
static void arch_usage(FILE *out) {
    char flag[128] = "--arch ";
    for (int i = 0, n = 0; i < MODEL_ARCH_COUNT; i++) {
        const struct arch *a = arch_get((enum model_arch)i);
        if (a)
            snprintf(flag + strlen(flag), sizeof flag - strlen(flag), "%s%s", n++ ? "|" : "",
                     a->name);
    }
    fprintf(out, "  %s\n%28sarchitecture (default llama):\n", flag, "");
    for (int i = 0; i < MODEL_ARCH_COUNT; i++) {
        const struct arch *a = arch_get((enum model_arch)i);
        if (a)
            fprintf(out, "%28s  %s: %s\n", "", a->name, a->summary);
    }
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: vela mkmodel -o FILE [options]\n"
            "\n"
            "Writes a synthetic model (seeded random weights) that llama.cpp and vela can load.\n"
            "Flags after --preset override it, wherever --preset appears.\n"
            "\n"
            "output:\n"
            "  -o, --output FILE         the GGUF file to write (required)\n"
            "  --preset NAME             start from a preset shape (see below)\n"
            "  --name STR                general.name (default vela-synthetic-<preset|arch>)\n"
            "  --seed N                  random seed (default 42); same seed, same bytes\n"
            "  --threads N               generating/quantizing threads (default: all CPUs, >= 2)\n"
            "  -q, --quiet               print nothing but errors\n"
            "\n"
            "shape:\n");
    arch_usage(out);
    fprintf(
        out,
        "  --n-embd N                embedding length (default 256)\n"
        "  --n-layer N               blocks (default 4)\n"
        "  --n-head N                attention heads (default 8)\n"
        "  --n-head-kv N             key/value heads, must divide --n-head (default 4)\n"
        "  --n-ff N                  feed-forward length (default 768)\n"
        "  --n-vocab N               vocabulary size; the generated vocabulary is padded to it\n"
        "                            (default and minimum: %d); ignored with --vocab\n"
        "  --ctx N                   context_length (default 2048)\n"
        "  --head-dim N              head dimension (default n_embd / n_head); writes\n"
        "                            attention.key_length/value_length when it differs\n"
        "  --n-rot N                 rope.dimension_count, even, <= head dim (default head dim;\n"
        "                            llama.cpp refuses other values: vela only)\n"
        "  --norm-eps F              RMS norm epsilon (default 1e-5 llama, 1e-6 qwen2)\n"
        "  --tied                    no output.weight: the head reuses token_embd\n"
        "  --untied                  write output.weight (default; undoes a preset's --tied)\n"
        "\n"
        "weight types (f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k iq4_nl\n"
        "iq4_xs; norms and biases are always f32):\n"
        "  --type T                  every matrix (default f32); a llama.cpp file type such as\n"
        "                            q4_k_m means --mix T\n"
        "  --type-embd T             token_embd.weight\n"
        "  --type-output T           output.weight (and token_embd when --tied)\n"
        "  --type-attn T             attn_q/k/v/output\n"
        "  --type-ffn T              ffn_gate/up/down\n"
        "  --mix FTYPE|none          llama-quantize's types for a llama.cpp file type: q4_k_m\n"
        "                            is q4_k, with q6_k for output.weight and for attn_v /\n"
        "                            ffn_down in about half the layers (also q2_k, q2_k_s,\n"
        "                            q3_k_s/m/l, q4_k_s, q5_k_s/m, q6_k, q4_0 ...: the head\n"
        "                            gets q6_k)\n"
        "  A row length the type's block does not divide falls back as llama.cpp's quantize\n"
        "  does (q4_k->q5_0, q5_k->q5_1, q6_k->q8_0, else f16), with a note.\n"
        "\n"
        "weight generation (matrices; norms and biases are always exact):\n"
        "  --exact-weights           N(0, s^2) floats (s = 1/sqrt(n_in) for most matrices),\n"
        "                            then quantized (ggml's reference quantizers for q8_0/q4_x/\n"
        "                            q5_x, vela's least-squares search for K-quants: ~1 us per\n"
        "                            weight, minutes for a 7B model); default up to 1e9 params\n"
        "  --fast-weights            random but valid blocks written directly: quant bits from\n"
        "                            the generator, scales set so that the values have mean 0\n"
        "                            and the same std s; f32/f16/bf16 from a 4096-level normal\n"
        "                            table (~1 ns per weight); default above 1e9 params\n"
        "  The two give different bytes for the same seed; each is deterministic.\n"
        "\n"
        "rope:\n"
        "  --rope-freq-base F        rope.freq_base (default 10000 llama, 1000000 qwen2)\n"
        "  --rope-scaling none|linear|yarn   rope.scaling.type (default none: no keys)\n"
        "  --rope-scale F            rope.scaling.factor, with --rope-scaling (default 1)\n"
        "  --yarn-orig-ctx N         rope.scaling.original_context_length (yarn; default --ctx)\n"
        "  --rope-freqs              add rope_freqs.weight with Llama 3.1's factors (llama)\n"
        "  --rope-freqs-factor F     their scale factor, with --rope-freqs (default 8)\n"
        "  --rope-freqs-orig-ctx N   their original context (default 8192)\n"
        "  --rope-freq-base-swa F    rope.freq_base_swa, the local layers' base (gemma3;\n"
        "                            default: not written, llama.cpp takes 10000)\n"
        "\n"
        "sliding window (gemma3):\n"
        "  --sliding-window N        attention.sliding_window: local layers see the last N\n"
        "                            positions (default: none, every layer global)\n"
        "  --swa-pattern N           attention.sliding_window_pattern: every N-th layer is\n"
        "                            global (default: not written, llama.cpp takes 6)\n"
        "\n"
        "tokenizer:\n"
        "  --vocab FILE              copy every tokenizer.* key from FILE (e.g. a\n"
        "                            ggml-vocab-*.gguf); n_vocab becomes its size\n"
        "  (default: a generated byte-level BPE vocabulary, gpt2 model, with merges of\n"
        "  frequent English pieces and <|begin_of_text|> / <|end_of_text|> as BOS / EOS)\n"
        "\n"
        "presets:\n",
        mkmodel_vocab_base_size());
    for (const struct mkmodel_preset_info *p = mkmodel_presets(); p->name; p++)
        fprintf(out, "  %-12s %s\n", p->name, p->summary);
    fprintf(out, "\nexample: vela mkmodel --preset llama2-7b --type q4_0 -o /tmp/7b-q4_0.gguf\n");
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

static bool parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

static bool parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (*s == '-')
        return false;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end)
        return false;
    *out = v;
    return true;
}

static bool parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

static bool parse_type(const char *s, int *out) {
    int t = ggml_type_from_name(s);
    if (t < 0)
        return false;
    *out = t;
    return true;
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

// Flags whose value must be checked against others after parsing.
static struct { bool n_vocab, rope_scale, yarn_ctx, freqs_opt; } saw;

// The int field a positive-integer flag sets (and where to mark it given), or NULL.
static int *int_flag(struct mkmodel_config *c, const char *f, bool **seen) {
    static const struct {
        const char *name;
        size_t off;
        bool *seen;
    } t[] = {
        {"--n-embd", offsetof(struct mkmodel_config, n_embd), NULL},
        {"--n-layer", offsetof(struct mkmodel_config, n_layer), NULL},
        {"--n-head", offsetof(struct mkmodel_config, n_head), NULL},
        {"--n-head-kv", offsetof(struct mkmodel_config, n_head_kv), NULL},
        {"--n-ff", offsetof(struct mkmodel_config, n_ff), NULL},
        {"--n-vocab", offsetof(struct mkmodel_config, n_vocab), &saw.n_vocab},
        {"--ctx", offsetof(struct mkmodel_config, n_ctx), NULL},
        {"--head-dim", offsetof(struct mkmodel_config, head_dim), NULL},
        {"--n-rot", offsetof(struct mkmodel_config, n_rot), NULL},
        {"--yarn-orig-ctx", offsetof(struct mkmodel_config, yarn_orig_ctx), &saw.yarn_ctx},
        {"--rope-freqs-orig-ctx", offsetof(struct mkmodel_config, rope_freqs_orig_ctx),
         &saw.freqs_opt},
        {"--sliding-window", offsetof(struct mkmodel_config, sliding_window), NULL},
        {"--swa-pattern", offsetof(struct mkmodel_config, swa_pattern), NULL},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(f, t[i].name)) {
            *seen = t[i].seen;
            return (int *)((char *)c + t[i].off);
        }
    return NULL;
}

// The float field a positive-number flag sets, or NULL.
static float *float_flag(struct mkmodel_config *c, const char *f, bool **seen) {
    *seen = NULL;
    if (!strcmp(f, "--norm-eps"))
        return &c->norm_eps;
    if (!strcmp(f, "--rope-freq-base"))
        return &c->rope_freq_base;
    if (!strcmp(f, "--rope-freq-base-swa"))
        return &c->rope_freq_base_swa;
    if (!strcmp(f, "--rope-scale")) {
        *seen = &saw.rope_scale;
        return &c->rope_scale;
    }
    if (!strcmp(f, "--rope-freqs-factor")) {
        *seen = &saw.freqs_opt;
        return &c->rope_freqs_factor;
    }
    return NULL;
}

int cmd_mkmodel(int argc, char **argv) {
    memset(&saw, 0, sizeof saw);
    struct mkmodel_config cfg;
    mkmodel_config_default(&cfg);
    const char *out = NULL, *preset = NULL;
    bool quiet = false, saw_type = false, saw_mix = false;

    // The preset first, so every other flag overrides it wherever it appears.
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--preset") && i + 1 < argc)
            preset = argv[++i];
        else if (!strncmp(argv[i], "--preset=", 9))
            preset = argv[i] + 9;
    }
    if (preset) {
        struct verr err = {0};
        if (mkmodel_preset(&cfg, preset, &err))
            return bad("%s", err.msg);
    }

    for (int i = 1; i < argc; i++) {
        char flag[64];
        const char *arg = argv[i], *val = NULL;
        const char *eq = !strncmp(arg, "--", 2) ? strchr(arg, '=') : NULL;
        if (eq) {
            size_t n = (size_t)(eq - arg);
            if (n >= sizeof flag)
                return bad("unknown flag '%s'", arg);
            memcpy(flag, arg, n);
            flag[n] = '\0';
            val = eq + 1;
        } else {
            snprintf(flag, sizeof flag, "%s", arg);
        }
        const char *f = flag;
#define IS(name) (!strcmp(f, name))
        // Flags without a value.
        if (IS("--tied") || IS("--untied") || IS("--rope-freqs") || IS("-q") || IS("--quiet") ||
            IS("--fast-weights") || IS("--exact-weights")) {
            if (val)
                return bad("%s takes no value", f);
            if (IS("--fast-weights"))
                cfg.weights = MKMODEL_WEIGHTS_FAST;
            else if (IS("--exact-weights"))
                cfg.weights = MKMODEL_WEIGHTS_EXACT;
            else if (IS("--tied"))
                cfg.tied = true;
            else if (IS("--untied"))
                cfg.tied = false;
            else if (IS("--rope-freqs"))
                cfg.rope_freqs = true;
            else
                quiet = true;
            continue;
        }
        if (!val) {
            if (i + 1 >= argc) {
                if (!strncmp(f, "-", 1))
                    return bad("%s needs a value", f);
                return bad("unexpected argument '%s'", f);
            }
            val = argv[++i];
        }
        int *ip;
        float *fp;
        bool *seen = NULL;
        if (f[0] != '-') {
            return bad("unexpected argument '%s'", f);
        } else if (IS("-o") || IS("--output")) {
            out = val;
        } else if (IS("--preset")) {
            // applied above
        } else if (IS("--name")) {
            if (strlen(val) >= sizeof cfg.name)
                return bad("--name: longer than %zu bytes", sizeof cfg.name - 1);
            snprintf(cfg.name, sizeof cfg.name, "%s", val);
        } else if (IS("--seed")) {
            if (!parse_u64(val, &cfg.seed))
                return bad("--seed '%s': not an unsigned 64-bit integer", val);
        } else if (IS("--threads")) {
            if (!parse_int(val, 0, 64, &cfg.n_threads))
                return bad("--threads '%s': not an integer in [0, 64]", val);
        } else if (IS("--arch")) {
            const struct arch *a = arch_find(val);
            char names[256];
            if (!a)
                return bad("--arch '%s': unknown architecture (%s)", val,
                           arch_names(names, sizeof names));
            cfg.arch = (enum mkmodel_arch)a->id;
        } else if ((ip = int_flag(&cfg, f, &seen)) != NULL) {
            int iv;
            if (!parse_int(val, 1, INT_MAX, &iv))
                return bad("%s '%s': not a positive integer", f, val);
            *ip = iv;
            if (seen)
                *seen = true;
        } else if ((fp = float_flag(&cfg, f, &seen)) != NULL) {
            float fv;
            if (!parse_float(val, &fv) || !(fv > 0))
                return bad("%s '%s': not a positive number", f, val);
            *fp = fv;
            if (seen)
                *seen = true;
        } else if (IS("--rope-scaling")) {
            if (!strcmp(val, "none"))
                cfg.rope_scaling = MKMODEL_ROPE_SCALING_NONE;
            else if (!strcmp(val, "linear"))
                cfg.rope_scaling = MKMODEL_ROPE_SCALING_LINEAR;
            else if (!strcmp(val, "yarn"))
                cfg.rope_scaling = MKMODEL_ROPE_SCALING_YARN;
            else
                return bad("--rope-scaling '%s': unknown (none, linear, yarn)", val);
        } else if (IS("--mix")) {
            const struct ftype_info *ft = ftype_find(val);
            char names[256];
            if (strcasecmp(val, "none") && !ft)
                return bad("--mix '%s': unknown (none, %s)", val, ftype_names(names, sizeof names));
            cfg.mix = ft ? ft->id : MKMODEL_MIX_NONE;
            saw_mix = cfg.mix != MKMODEL_MIX_NONE;
        } else if (IS("--type")) {
            // A weight type (q4_k: every matrix Q4_K), else a llama.cpp file
            // type (q4_k_m: --mix q4_k_m).
            int t;
            const struct ftype_info *ft = NULL;
            if (parse_type(val, &t)) {
                cfg.type = (enum ggml_type)t;
                cfg.mix = MKMODEL_MIX_NONE;
                saw_type = true;
            } else if ((ft = ftype_find(val))) {
                cfg.mix = ft->id;
            } else {
                return bad("--type '%s': unknown type", val);
            }
        } else if (IS("--type-embd") || IS("--type-output") || IS("--type-attn") ||
                   IS("--type-ffn")) {
            int t;
            if (!parse_type(val, &t))
                return bad("%s '%s': unknown type", f, val);
            if (IS("--type-embd"))
                cfg.type_embd = t;
            else if (IS("--type-output"))
                cfg.type_output = t;
            else if (IS("--type-attn"))
                cfg.type_attn = t;
            else
                cfg.type_ffn = t;
        } else if (IS("--vocab")) {
            cfg.vocab_path = val;
        } else {
            return bad("unknown flag '%s'", f);
        }
#undef IS
    }
    if (saw_type && saw_mix)
        return bad("--type and --mix both set the base type; give one of them");
    // Flags that would be silently dropped are refused instead.
    if (saw.rope_scale && cfg.rope_scaling == MKMODEL_ROPE_SCALING_NONE)
        return bad("--rope-scale needs --rope-scaling linear or yarn");
    if (saw.yarn_ctx && cfg.rope_scaling != MKMODEL_ROPE_SCALING_YARN)
        return bad("--yarn-orig-ctx needs --rope-scaling yarn");
    if (saw.freqs_opt && !cfg.rope_freqs)
        return bad("--rope-freqs-factor / --rope-freqs-orig-ctx need --rope-freqs");
    if (!out)
        return bad("no output file: give -o FILE");

    struct progress_state ps = {quiet, isatty(STDERR_FILENO) != 0, -1};
    cfg.log = on_log;
    cfg.progress = on_progress;
    cfg.cb_ctx = &ps;

    struct verr err = {0};
    struct mkmodel_config r;
    if (mkmodel_resolve(&cfg, &r, &err)) {
        fprintf(stderr, "vela mkmodel: %s\n", err.msg);
        // Everything resolve checks is a flag's value (a --vocab file that
        // cannot be read included); only running out of memory is not.
        return err.code == VERR_NOMEM ? 1 : 2;
    }
    if (cfg.vocab_path && saw.n_vocab && cfg.n_vocab != r.n_vocab && !quiet)
        fprintf(stderr, "vela mkmodel: note: --vocab %s has %d tokens; --n-vocab %d ignored\n",
                cfg.vocab_path, r.n_vocab, cfg.n_vocab);
    // The library's own note about n_vocab is for library callers; the tool
    // printed its own above (only when the user gave --n-vocab).
    if (cfg.vocab_path)
        cfg.n_vocab = 0;

    double t0 = now_s();
    if (mkmodel_write(&cfg, out, &err)) {
        fprintf(stderr, "vela mkmodel: %s\n", err.msg);
        return 1;
    }
    double dt = now_s() - t0;
    if (!quiet) {
        FILE *fp = fopen(out, "rb");
        long long size = -1;
        if (fp && fseek(fp, 0, SEEK_END) == 0)
            size = ftell(fp);
        if (fp)
            fclose(fp);
        char types[64];
        if (r.mix != MKMODEL_MIX_NONE)
            snprintf(types, sizeof types, "%s", ftype_by_id(r.mix)->name);
        else
            snprintf(types, sizeof types, "%s", ggml_type_name(r.type));
        double params = (double)mkmodel_count_params(&r);
        char psz[32], fsz[32];
        if (params >= 1e9)
            snprintf(psz, sizeof psz, "%.2fB", params / 1e9);
        else
            snprintf(psz, sizeof psz, "%.2fM", params / 1e6);
        if (size >= 1000000000LL)
            snprintf(fsz, sizeof fsz, "%.2f GB", size / 1e9);
        else
            snprintf(fsz, sizeof fsz, "%.2f MB", size / 1e6);
        printf("wrote %s: %s '%s', %d layers, n_embd %d, %d/%d heads (dim %d), n_ff %d, "
               "n_vocab %d%s, %s (%s weights), %s params, %s in %.2f s (%.0f MB/s, %d threads)\n",
               out, arch_get((enum model_arch)r.arch)->name, r.name, r.n_layer, r.n_embd, r.n_head,
               r.n_head_kv, r.head_dim, r.n_ff, r.n_vocab, r.tied ? ", tied" : "", types,
               r.weights == MKMODEL_WEIGHTS_FAST ? "fast" : "exact", psz, fsz, dt,
               dt > 0 ? size / 1e6 / dt : 0.0, r.n_threads);
    }
    return 0;
}
