// vela quantize: command line of tools/quantize.h.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/types.h"
#include "tools/cmds.h"
#include "tools/progress.h"
#include "tools/quantize.h"

static void usage(FILE *out) {
    char names[256];
    fprintf(
        out,
        "usage: vela quantize [options] INPUT.gguf OUTPUT.gguf TYPE\n"
        "\n"
        "Writes INPUT with its weight matrices in the types llama.cpp's llama-quantize\n"
        "gives the file type TYPE (a name or llama.cpp's number; case does not matter):\n"
        "  %s\n"
        "(Q3_K, Q4_K and Q5_K mean Q3_K_M, Q4_K_M and Q5_K_M, as in llama-quantize.)\n"
        "The matrices take TYPE's base type, output.weight Q6_K (Q8_0 stays Q8_0), and\n"
        "the K-quant mixes give attn_v / ffn_down / attn_output of some layers more bits,\n"
        "by llama.cpp's rules. Matrices whose rows do not fit a type's blocks get\n"
        "llama.cpp's fallback type (Q4_K -> Q5_0, ...); norms, biases and every metadata\n"
        "key are copied as they are.\n"
        "Quantizers: vela's own (K-quants: least-squares scale search), not bit-identical\n"
        "to llama.cpp's; the legacy types are.\n"
        "\n"
        "options:\n"
        "  --pure                      every matrix in TYPE's base type (no mix, no Q6_K head)\n"
        "  --leave-output-tensor       output.weight as it is\n"
        "  --token-embedding-type T    token_embd.weight in T (a weight type: q8_0, f16, ...)\n"
        "  --output-tensor-type T      output.weight in T\n"
        "  --allow-requantize          convert tensors that are already quantized (each\n"
        "                              such tensor is decoded and encoded again: precision\n"
        "                              is lost twice)\n"
        "  -t, --threads N             converting threads (default: the physical cores)\n"
        "  -q, --quiet                 print nothing but errors\n"
        "  -h, --help                  this help\n"
        "\n"
        "Exit status: 0, 1 (the conversion failed: nothing is left at OUTPUT), 2 (usage).\n",
        ftype_names(names, sizeof names));
}

static int bad(const char *msg, const char *arg) {
    fprintf(stderr, "vela quantize: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    fprintf(stderr, "(vela quantize --help for usage)\n");
    return 2;
}

static int type_arg(const char *s, int *out) {
    *out = ggml_type_from_name(s);
    return *out >= 0;
}

int cmd_quantize(int argc, char **argv) {
    struct quantize_opts o = {.type_embd = -1, .type_output = -1};
    const char *pos[3];
    int n_pos = 0;
    bool quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--allow-requantize")) {
            o.allow_requantize = true;
        } else if (!strcmp(a, "--pure")) {
            o.pure = true;
        } else if (!strcmp(a, "--leave-output-tensor")) {
            o.keep_output = true;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = true;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            char *end = NULL;
            const long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : -1;
            if (i + 1 >= argc || *end != '\0' || v < 1 || v > 1024)
                return bad("--threads needs a number from 1 to 1024",
                           i + 1 < argc ? argv[i + 1] : NULL);
            o.n_threads = (int)v;
            i++;
        } else if (!strcmp(a, "--token-embedding-type") || !strcmp(a, "--output-tensor-type")) {
            if (i + 1 >= argc)
                return bad("missing value after", a);
            int *dst = !strcmp(a, "--token-embedding-type") ? &o.type_embd : &o.type_output;
            if (!type_arg(argv[++i], dst))
                return bad("unknown type", argv[i]);
        } else if (a[0] == '-' && a[1] != '\0') {
            return bad("unknown option", a);
        } else if (n_pos < 3) {
            pos[n_pos++] = a;
        } else {
            return bad("too many arguments", a);
        }
    }
    if (n_pos < 3)
        return bad("need INPUT.gguf OUTPUT.gguf TYPE", NULL);
    if (!(o.ftype = ftype_find(pos[2]))) {
        char names[256], msg[400];
        snprintf(msg, sizeof msg, "unknown file type '%s' (known: %s)", pos[2],
                 ftype_names(names, sizeof names));
        return bad(msg, NULL);
    }
    if (o.keep_output && o.type_output >= 0)
        return bad("--leave-output-tensor and --output-tensor-type both set output.weight; "
                   "give one of them",
                   NULL);
    o.in = pos[0];
    o.out = pos[1];
    struct load_progress lp;
    load_progress_init(&lp, "vela quantize", quiet);
    lp.what = "quantizing";
    o.progress = load_progress_update;
    o.progress_user = &lp;
    struct quantize_stats st;
    struct verr err = {0};
    if (quantize_file(&o, &st, &err)) {
        fprintf(stderr, "vela quantize: %s\n", err.msg);
        return 1;
    }
    if (!quiet) {
        char types[512] = "";
        for (int t = 0; t < GGML_TYPE_COUNT; t++)
            if (st.n_of_type[t]) {
                const size_t k = strlen(types);
                snprintf(types + k, sizeof types - k, "%s%s %d", k ? ", " : "",
                         ggml_type_name((uint32_t)t), st.n_of_type[t]);
            }
        fprintf(stderr,
                "vela quantize: %s (%s%s): %d tensors, %d converted (%d to a fallback type), %d "
                "copied; %.2f MiB -> %.2f MiB\n"
                "vela quantize: types: %s\n",
                o.out, o.ftype->name, o.pure ? ", pure" : "", st.n_tensors, st.n_converted,
                st.n_fallback, st.n_copied, (double)st.bytes_in / 1048576.0,
                (double)st.bytes_out / 1048576.0, types);
    }
    return 0;
}
